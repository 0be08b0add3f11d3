"""Sub-commands of the FUSE side: mount, umount, stats, publish (and it registers pack and push)."""

from __future__ import annotations

import argparse
import dataclasses
import errno
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xetfs.base import settings
from xetfs.base.errors import XetfsError
from xetfs.base.messages import human_size, plural, print_warning
from xetfs.base.mounttable import force_hint, within, xetfs_source
from xetfs.base.settings import DAEMON_TIMEOUT
from xetfs.commands.statsview import format_stats, summarize_stats
from xetfs.fuse.daemonlog import LogFile
from xetfs.storage.store import Store

if TYPE_CHECKING:
    from xetfs.fuse.launch import MountConfig

# The FUSE modules (pyfuse3) are imported by the commands that need them, so
# that ``xetfs ls`` and friends start fast and work without FUSE.

STATS_PATH = ".xetfs/stats"
ID_MOST = 2**32 - 2  # the largest uid or gid (2**32 - 1 stands for none)


def register(sub: Any, add_common: Callable[[argparse.ArgumentParser], None]) -> None:
    """Add the mount-related sub-commands to ``sub``."""
    from xetfs.commands.args import add_remote_args

    p = sub.add_parser("mount", help="mount a store as a read-only filesystem")
    p.add_argument("store", help="store directory or URL (http(s)://, s3://, gs://, az://)")
    add_remote_args(p, io_timeout=False)
    p.add_argument("mountpoint", help="an empty directory")
    p.add_argument("-f", "--foreground", action="store_true",
                   help="stay attached, log to stderr, say 'xetfs: mounted STORE at MOUNTPOINT' once the mount "
                        "answers; Ctrl-C unmounts and exits 130")  # fmt: skip
    p.add_argument("-o", dest="options", action="append", default=[], metavar="OPT[,OPT]",
                   help="mount options: every long option below but --foreground as NAME=VALUE or NAME "
                        "(-o cache_size=2G,workers=4,no_prefetch), FUSE's allow_other, allow_root, nonempty, "
                        "nodev, nosuid, noexec; mount(8)'s generic ones (defaults, rw, _netdev, nofail, "
                        "x-systemd.*, ...) are ignored")  # fmt: skip
    _add_view_options(p)
    _add_cache_options(p)
    _add_tree_options(p)
    _add_io_options(p)
    _add_daemon_options(p)
    p.set_defaults(func=cmd_mount)  # (and o_names, the -o names of its options, once they are all there)

    _add_admin_parsers(sub)

    from xetfs.commands.pack import add_pack_parser

    add_pack_parser(sub, add_common)

    from xetfs.commands.push import add_push_parser

    add_push_parser(sub)


def _add_view_options(p: argparse.ArgumentParser) -> None:
    """``mount``'s options of how files look to the kernel: owner, group, direct I/O."""
    from xetfs.commands.args import whole

    p.add_argument("--uid", type=whole(0, ID_MOST), help="owner shown for every file (default: yours)")
    p.add_argument("--gid", type=whole(0, ID_MOST), help="group shown for every file (default: yours)")
    p.add_argument("--direct-io", action="store_true", help="bypass the kernel page cache")


def _add_cache_options(p: argparse.ArgumentParser) -> None:
    """``mount``'s options of what is kept and read ahead."""
    from xetfs.commands.args import parse_size, size_text, up_to

    p.add_argument("--cache-size", type=parse_size, default=settings.CACHE_SIZE,
                   help="decoded chunks kept, shared memory included, e.g. 512M, 2G; 0 keeps nothing "
                        f"beyond the reads in progress (default {size_text(settings.CACHE_SIZE)})")  # fmt: skip
    p.add_argument("--read-ahead", type=up_to(settings.MOST_READ_AHEAD, settings.LEAST_READ_AHEAD),
                   default=settings.READ_AHEAD,
                   help=f"kernel read-ahead for the mount (default {size_text(settings.READ_AHEAD)}; from "
                        f"{size_text(settings.LEAST_READ_AHEAD)} to {size_text(settings.MOST_READ_AHEAD)}, "
                        "in whole KiB, rounded down; needs root)")  # fmt: skip
    p.add_argument("--no-prefetch", dest="prefetch", action="store_false",
                   help="decode no chunks before a read asks for them")  # fmt: skip


def _add_tree_options(p: argparse.ArgumentParser) -> None:
    """``mount``'s options of which names the mount shows."""
    from xetfs.fuse.launch import LAYOUTS

    p.add_argument("--names", type=Path, help="names manifest (Hub tree-listing JSON)")
    p.add_argument("--layout", choices=LAYOUTS, default=settings.LAYOUT,
                   help="what the root shows: the huggingface_hub cache layout of the store's catalogue (hub), "
                        "the named tree (names) or files by hash; auto: hub when there is a catalogue and "
                        "no --names, else names when there is a manifest, else hash")  # fmt: skip
    p.add_argument("--strict", action="store_true", help="refuse to mount if any shard is bad")


def _add_io_options(p: argparse.ArgumentParser) -> None:
    """``mount``'s options of how the store is read: threads, time bound, decode workers, refreshes."""
    from xetfs.commands.args import interval, seconds, whole

    p.add_argument("--io-mode", choices=["auto", "inline", "thread"], default=settings.IO_MODE,
                   help="read the store inline (fastest) or in worker threads with a time bound; "
                        "auto: threads when the store is on a network or FUSE filesystem")  # fmt: skip
    p.add_argument("--io-timeout", type=seconds, default=settings.IO_TIMEOUT, metavar="SECONDS",
                   help="with threaded or remote store reads, fail a read that takes longer with EIO "
                        f"(default {settings.IO_TIMEOUT:g})")  # fmt: skip
    p.add_argument("--workers", type=whole(0, settings.MOST_WORKERS), default=None, metavar="N",
                   help=f"decode worker processes (default: one per CPU, up to {settings.MAX_WORKERS}; "
                        f"0: decode in the daemon; at most {settings.MOST_WORKERS})")  # fmt: skip
    p.add_argument("--refresh-every", type=interval, default=None, metavar="SECONDS",
                   help="load what was added to the store every SECONDS, as xetfs refresh does (default, or 0: "
                        "only when asked)")  # fmt: skip


def _add_daemon_options(p: argparse.ArgumentParser) -> None:
    """``mount``'s options of the daemon: its log file, and the hidden ones the mount passes to it."""
    p.add_argument("--log-file", type=Path,
                   help="daemon log (default: ~/.local/state/xetfs/<mountpoint>.log, which is removed again "
                        "when the mount ends cleanly with nothing logged at warning or above; a file given "
                        "here is kept)")  # fmt: skip
    p.add_argument("--ready-fd", type=int, help=argparse.SUPPRESS)
    p.add_argument("--config-fd", type=int, help=argparse.SUPPRESS)  # the daemon's MountConfig (daemonconfig)
    p.add_argument("--drop-clean-log", action="store_true", help=argparse.SUPPRESS)  # the default log file


def _add_admin_parsers(sub: Any) -> None:
    """Add ``refresh``, ``umount``, ``stats`` and ``publish``: the sub-commands about a mount or a store
    that is already there."""
    from xetfs.commands.args import seconds

    p = sub.add_parser("refresh", help="make a live mount load what was added to its store since it was mounted")
    p.add_argument("mountpoint", help="where the store is mounted (the mount's owner or root)")
    p.add_argument("--timeout", type=seconds, default=settings.REFRESH_TIMEOUT, metavar="SECONDS",
                   help=f"how long to wait for the refresh to end (default {settings.REFRESH_TIMEOUT:g})")  # fmt: skip
    p.set_defaults(func=cmd_refresh)

    p = sub.add_parser("umount", help="unmount a xetfs mount")
    p.add_argument("mountpoint", help="where the store is mounted")
    p.add_argument("-z", "--lazy", action="store_true", help="lazy unmount (detach now, clean up when unused)")
    p.add_argument("--force", action="store_true",
                   help="abort the FUSE connection first (hung daemon; root); unmounts non-xetfs mounts")  # fmt: skip
    p.set_defaults(func=cmd_umount)

    p = sub.add_parser("stats", help="show the live counters of a mount, or one file's amplification")
    p.add_argument("mountpoint", help="where the store is mounted")
    p.add_argument("file", nargs="?",
                   help="a file of the mount (a path to it, or one relative to MOUNTPOINT): its chunk count and "
                        "what reads of it decoded, over its size and chunks (amplification)")  # fmt: skip
    p.add_argument("--all", action="store_true", help="every counter, one section per group (default: a summary)")
    p.add_argument("--json", action="store_true", help="print the raw JSON")
    p.set_defaults(func=cmd_stats)

    p = sub.add_parser(
        "publish",
        help="write or refresh the listing a store needs to be served over HTTP "
        "where it is (push writes it too, into the copy)",
    )
    p.add_argument("store", help="store directory")
    p.set_defaults(func=cmd_publish)


def _fuse_options(args: argparse.Namespace) -> frozenset[str]:
    """The FUSE options of the ``-o`` lists; an unknown one is a usage error."""
    from xetfs.commands.args import UsageError
    from xetfs.fuse.launch import MountError, parse_options

    try:
        return parse_options(args.options, also=getattr(args, "o_names", ()))
    except MountError as exc:
        raise UsageError(str(exc)) from None


def _config(args: argparse.Namespace) -> MountConfig:
    """The mount's configuration from its command line: each field of ``MountConfig`` from the option of
    its name, those below made absolute or converted."""
    from xetfs.fuse.launch import MountConfig
    from xetfs.storage.objects import is_url

    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(MountConfig) if hasattr(args, f.name)}
    return MountConfig(**{
        **values,
        "store": args.store if is_url(args.store) else str(Path(args.store).resolve()),
        "mountpoint": Path(args.mountpoint).resolve(),
        "options": _fuse_options(args),
        "names": args.names.resolve() if args.names else None,
        "read_ahead_kb": args.read_ahead // settings.KiB,
        "cache_dir": args.cache_dir.absolute() if args.cache_dir else None,
        "headers": tuple(args.headers),
    })  # fmt: skip


def _warn_of_waste(config: MountConfig) -> None:
    """Say so when the mount asks for more decode workers than it has CPUs, or a cache larger than memory."""
    cpus = settings.usable_cpus()
    if config.workers is not None and config.workers > cpus:
        print_warning(f"--workers {config.workers}: more decode workers than CPUs ({cpus}) add processes and "
                      "memory, not speed")  # fmt: skip
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if config.cache_size > memory:
        print_warning(f"--cache-size {human_size(config.cache_size)}: more than this machine's memory "
                      f"({human_size(memory)})")  # fmt: skip


def daemon_argv(args: argparse.Namespace, config: MountConfig) -> list[str]:
    """The daemon's command line: what it serves, where, and how it logs; the configuration itself goes
    on a pipe (``daemonconfig``), so nothing here spells a mount option or holds a secret."""
    from xetfs.fuse.launch import python_argv
    from xetfs.storage.objects import is_url, public_url

    store = public_url(str(config.store)) if is_url(str(config.store)) else str(config.store)
    argv = [*python_argv(), "mount", store, str(config.mountpoint), "--log-level", args.log_level]
    return argv + (["--debug"] if args.debug else []) + ([] if args.log_file else ["--drop-clean-log"])


def cmd_mount(args: argparse.Namespace) -> int:
    from xetfs.fuse.launch import check_mountpoint, choose_layout, default_log_file, spawn_daemon
    from xetfs.storage.manifest import load_manifest

    if args.config_fd is not None:  # the daemon that xetfs mount started: its whole configuration
        from xetfs.fuse.daemonconfig import read_config

        config = read_config(args.config_fd)
    else:
        config = _config(args)
        _warn_of_waste(config)
    if args.foreground:
        from xetfs.fuse.mount import run_daemon

        handler = None
        if args.log_file:
            handler = LogFile(args.log_file)
            handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
            logging.getLogger().handlers[:] = [handler]
        status = run_daemon(config, args.ready_fd)  # (raises when the mount failed: the log stays)
        if handler is not None and args.drop_clean_log:
            handler.drop_if_clean()
        return status
    # Check what can be checked here, so the usual mistakes fail fast and plainly.
    from xetfs.fuse.daemonconfig import dump_config
    from xetfs.storage.objects import is_url, public_url

    if not is_url(str(config.store)):
        choose_layout(config, Store.open(config.store))  # (reads and checks the catalogue, if it shows one)
    if config.names is not None:
        load_manifest(config.names)
    check_mountpoint(config.mountpoint, nonempty="nonempty" in config.options)
    log_file = (args.log_file or default_log_file(config.mountpoint)).resolve()
    warnings, n = spawn_daemon(daemon_argv(args, config), config.mountpoint, log_file, dump_config(config))
    for warning in warnings:
        print_warning(warning)
    count = f" with {plural(n, 'warning')}" if n else ""
    shown = public_url(str(config.store)) if is_url(str(config.store)) else config.store
    print(f"xetfs: mounted {shown} at {config.mountpoint}{count} (log: {log_file})", file=sys.stderr)
    return 0


def cmd_publish(args: argparse.Namespace) -> int:
    from xetfs.storage.remote import publish

    path, listing = publish(args.store)
    print(f"xetfs: wrote {path}: {plural(len(listing.objects), 'object')}", file=sys.stderr)
    return 0


def cmd_umount(args: argparse.Namespace) -> int:
    from xetfs.fuse.launch import unmount

    unmount(Path(args.mountpoint), lazy=args.lazy, force=args.force)
    return 0


def cmd_refresh(args: argparse.Namespace) -> int:
    """Signal the mount's daemon (``SIGUSR1``; only its owner or root may) and wait for the refresh to end."""
    mountpoint = Path(args.mountpoint)
    before = _stats_doc(mountpoint)
    if "refresh" not in before:
        raise XetfsError(f"{mountpoint}: this mount cannot refresh (its daemon is older)")
    done = before["refresh"]["refreshes"] + before["refresh"]["failures"]
    try:
        os.kill(int(before["pid"]), signal.SIGUSR1)
    except PermissionError:
        raise XetfsError(f"{mountpoint}: only the mount's owner or root may refresh it") from None
    except ProcessLookupError:
        raise XetfsError(f"{mountpoint}: its daemon is gone (xetfs umount {mountpoint})") from None
    deadline = time.monotonic() + args.timeout
    while True:
        doc = _stats_doc(mountpoint)
        r = doc["refresh"]
        if r["refreshes"] + r["failures"] > done:
            break
        if time.monotonic() > deadline:
            raise XetfsError(f"{mountpoint}: the refresh did not end within {args.timeout:g} s")
        time.sleep(0.05)
    if r["last_failure"] >= r["last_refresh"] and r["failures"] > before["refresh"]["failures"]:
        raise XetfsError(f"{mountpoint}: refresh failed, the mount is as it was: {doc['refresh_error']}")
    files = r["files_added"] - before["refresh"]["files_added"]
    shards = r["shards_added"] - before["refresh"]["shards_added"]
    if r.get("unchanged", 0) > before["refresh"].get("unchanged", 0) and shards == files == 0:
        print(f"refreshed {mountpoint}: no change", file=sys.stderr)
        return 0
    names = r.get("names_added", 0) - before["refresh"].get("names_added", 0)
    if shards == files == 0:  # (the catalogue or names changed, or their tags could not vouch that they had not)
        added = f"{plural(names, 'new name')}" if names else "no new name"
        print(f"refreshed {mountpoint}: no new shard or file, {added}; the names were read again, so a ref or "
              "path that changed shows now", file=sys.stderr)  # fmt: skip
        return 0
    print(f"refreshed {mountpoint}: {plural(shards, 'new shard')}, {plural(files, 'new file')}, "
          f"{plural(names, 'new name')}", file=sys.stderr)  # fmt: skip
    return 0


def _stats_doc(mountpoint: Path) -> dict[str, Any]:
    """The mount's ``.xetfs/stats`` document; ``XetfsError`` if it is not a xetfs mount, a stale one, or one
    whose daemon does not answer within ``DAEMON_TIMEOUT`` (a read of the document would wait for good)."""
    try:
        answered, data = within(DAEMON_TIMEOUT, (mountpoint / STATS_PATH).read_bytes)
        if not answered or data is None:
            raise XetfsError(f"{mountpoint}: the mount's daemon does not answer (waited {DAEMON_TIMEOUT:g} s): it "
                             f"is stopped or hung; {force_hint(mountpoint)}")  # fmt: skip
        doc: dict[str, Any] = json.loads(data)
    except FileNotFoundError:
        if not mountpoint.is_dir():
            raise XetfsError(f"{mountpoint}: no such directory") from None
        raise XetfsError(f"{mountpoint}: not a xetfs mount (no {STATS_PATH})") from None
    except OSError as exc:
        if exc.errno != errno.ENOTCONN:
            raise
        raise XetfsError(f"{mountpoint}: a stale mount, whose daemon is gone (clean it with: xetfs umount "
                         f"{mountpoint})") from None  # fmt: skip
    return doc


def cmd_stats(args: argparse.Namespace) -> int:
    if args.file is not None and args.all:
        from xetfs.commands.args import UsageError

        raise UsageError("--all goes with MNT alone (a file's counters are all shown)")
    if args.file is not None:
        return _file_stats(Path(args.mountpoint), Path(args.file), as_json=args.json)
    doc = _stats_doc(Path(args.mountpoint))
    if args.json:
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    if args.all:
        print(format_stats(doc))
        return 0
    print(summarize_stats(doc, args.mountpoint, xetfs_source(os.path.abspath(args.mountpoint))))
    return 0


FILE_STATS_XATTR = "user.xetfs.stats"  # (as fs.FILE_STATS_XATTR; fs needs pyfuse3 to import)


# What ``xetfs stats MNT FILE --json`` adds to the file's counters (``fs.FILE_STATS_KEYS``).
AMPLIFICATION_KEYS = {
    "bytes_amplification": "decoded_bytes / size (null for an empty file)",
    "chunks_amplification": "decoded_chunks / chunks (null for an empty file)",
}


def _file_stats(mountpoint: Path, file: Path, *, as_json: bool) -> int:
    """``xetfs stats MNT FILE``: the file's decode counters and amplification.

    ``FILE`` is a path under ``MNT`` (absolute, or from the working directory, as a shell completes it), or
    one relative to ``MNT``.
    """
    _stats_doc(mountpoint)  # (a xetfs mount, whose daemon answers)
    answered, found = within(DAEMON_TIMEOUT, lambda: _file_doc(mountpoint, file))
    if not answered or found is None:
        raise XetfsError(f"{mountpoint}: the mount's daemon does not answer (waited {DAEMON_TIMEOUT:g} s): it is "
                         f"stopped or hung; {force_hint(mountpoint)}")  # fmt: skip
    path, doc = found
    size, chunks = doc["size"], doc["chunks"]
    doc["bytes_amplification"] = round(doc["decoded_bytes"] / size, 4) if size else None  # (AMPLIFICATION_KEYS)
    doc["chunks_amplification"] = round(doc["decoded_chunks"] / chunks, 4) if chunks else None
    if as_json:
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0

    def ratio(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}x"

    print(f"{'file':<22}{path}  ({doc['hash']})")
    print(f"{'size':<22}{plural(size, 'byte')}, {plural(chunks, 'chunk')}")
    print(f"{'decoded':<22}{plural(doc['decoded_bytes'], 'byte')}, {plural(doc['decoded_chunks'], 'chunk')}")
    print(f"{'amplification':<22}{ratio(doc['bytes_amplification'])} of its bytes, "
          f"{ratio(doc['chunks_amplification'])} of its chunks")  # fmt: skip
    if doc["decoded_chunks"] < chunks:
        print(f"{'':<22}(a chunk counts for the file whose read decoded it: not counted here are chunks this "
              f"file shares with files read before it, and chunks not read yet)")  # fmt: skip
    return 0


def _file_doc(mountpoint: Path, file: Path) -> tuple[Path, dict[str, Any]]:
    """The file's path, and its counters from its ``FILE_STATS_XATTR``: ``file`` as ``_file_stats`` takes it."""
    path = file if file.is_absolute() else mountpoint / file
    here = Path(os.path.abspath(file))  # (from the working directory; not resolved: Hub snapshots are symlinks)
    under = Path(os.path.realpath(here.parent)).is_relative_to(os.path.realpath(mountpoint))
    if not file.is_absolute() and os.path.lexists(here) and under:
        path = here
    try:
        doc: dict[str, Any] = json.loads(os.getxattr(path, FILE_STATS_XATTR))
        return path, doc
    except FileNotFoundError:
        raise XetfsError(f"{path}: no such file") from None
    except OSError as exc:
        if exc.errno not in (errno.ENODATA, errno.ENOTSUP):
            raise
        if exc.errno == errno.ENODATA and path.is_file():  # (a file of the mount that holds no chunks)
            raise XetfsError(f"{path}: not a file of the store (a Hub ref, or the mount's own stats, has no chunks "
                             "to count)") from None  # fmt: skip
        raise XetfsError(f"{path}: not a file of the xetfs mount {mountpoint}") from None
