"""Mounting: checks, the daemon's life cycle, signals, and unmounting.

``xetfs mount`` runs the filesystem in a child process (the daemon) and
returns once the child says the mount answers; with ``--foreground`` the
same code runs in this process.  The daemon unmounts cleanly on SIGINT,
SIGTERM or SIGHUP, and exits 130 after SIGINT (Ctrl-C), else 0.  A
foreground mount started by hand says on stderr when it answers.  pyfuse3
keeps global state, so there is one mount per process.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pyfuse3
import trio

from xetfs.base.errors import XetfsError, describe
from xetfs.base.exitstatus import ExitStatus
from xetfs.base.malloc import keep_freed_memory
from xetfs.base.messages import plural
from xetfs.base.settings import (
    CACHE_SIZE,
    DISK_CACHE_SIZE,
    FAILED_DAEMON_EXIT,
    IO_MODE,
    IO_TIMEOUT,
    JOB_TIMEOUT_MARGIN,
    LAYOUT,
    MAX_REPORTED_WARNINGS,
    PREFETCH_CACHE_SHARE,
    PREFETCH_MAXIMUM,
    READ_AHEAD,
    READY_TIMEOUT,
    REMOTE_FETCH_WIDTH,
    REMOTE_PREFETCH,
    REMOTE_RUN_BYTES,
    RUN_BYTES,
    KiB,
    user_home,
)
from xetfs.base.stats import RemoteCounters
from xetfs.fuse.fs import FsOptions, XetFS
from xetfs.fuse.refresh import TREE_FROM, Refresher
from xetfs.names.hubtree import build_hub_tree
from xetfs.names.tree import Tree, build_tree
from xetfs.read.decode_worker import Setup
from xetfs.read.loader import inline_io, threaded_io
from xetfs.read.pool import DecodePool, default_workers, slots_for
from xetfs.read.reader import Reader
from xetfs.storage.catalogue import CATALOGUE_NAME, Catalogue, store_catalogue
from xetfs.storage.index import Index
from xetfs.storage.indexer import load_index
from xetfs.storage.manifest import MANIFEST_NAME, Manifest, load_manifest, store_manifest
from xetfs.storage.objects import is_url, public_url
from xetfs.storage.remote import open_store
from xetfs.storage.store import Store

log = logging.getLogger(__name__)

FUSE_FLAGS = {"nodev", "nosuid", "noexec"}  # given to FUSE as they are (mount(8) passes them for "user")
KNOWN_OPTIONS = {"allow_other", "allow_root", "nonempty", "ro", "default_permissions", *FUSE_FLAGS}


class MountError(XetfsError):
    """The filesystem could not be mounted (bad mountpoint, no FUSE, ...)."""


@dataclass(frozen=True)
class MountConfig:
    store: str | Path  # a directory (absolute) or a URL
    mountpoint: Path
    options: frozenset[str] = frozenset()
    uid: int | None = None
    gid: int | None = None
    direct_io: bool = False
    cache_size: int = CACHE_SIZE
    names: Path | None = None
    read_ahead_kb: int = READ_AHEAD // KiB
    strict: bool = False
    prefetch: bool = True
    io_mode: str = IO_MODE  # "inline", "thread" or "auto" (thread on network/FUSE filesystems)
    io_timeout: float = IO_TIMEOUT
    workers: int | None = None  # decode worker processes; None: one per CPU
    layout: str = LAYOUT  # "hub", "names", "hash" or "auto" (see choose_layout)
    cache_dir: Path | None = None  # disk cache of remote stores; None: the default
    disk_cache_size: int = DISK_CACHE_SIZE
    headers: tuple[str, ...] = ()  # for a remote store: extra header lines (the environment adds more)
    refresh_every: float | None = None  # seconds between refreshes of the live mount; None: only when asked


def parse_options(values: list[str], also: Iterable[str] = ()) -> frozenset[str]:
    """The FUSE options of ``-o`` lists (``also``: the xetfs options ``-o`` takes too, for the message)."""
    opts = {o.strip() for v in values for o in v.split(",") if o.strip()}
    unknown = opts - KNOWN_OPTIONS
    if unknown:
        more = f"; xetfs: {', '.join(also)}" if also else ""
        raise MountError(f"unknown mount option(s): {', '.join(sorted(unknown))} "
                         f"(known: {', '.join(sorted(KNOWN_OPTIONS))}{more})")  # fmt: skip
    return frozenset(opts)


def check_mountpoint(mountpoint: Path, *, nonempty: bool) -> None:
    """Refuse a mountpoint that is missing, not a directory, mounted or (by default) not empty."""
    try:
        if os.path.ismount(mountpoint):
            with os.scandir(mountpoint):  # (a dead FUSE daemon's mount fails here: its attributes may be cached)
                pass
            raise MountError(f"{mountpoint}: already a mount point (unmount it first: xetfs umount {mountpoint})")
        if not mountpoint.exists():
            raise MountError(f"{mountpoint}: no such directory (create it first: mkdir {mountpoint})")
        if not mountpoint.is_dir():
            raise MountError(f"{mountpoint}: not a directory")
        if not nonempty and any(os.scandir(mountpoint)):
            raise MountError(f"{mountpoint}: directory is not empty (use -o nonempty to mount over it anyway)")
    except OSError as exc:
        if exc.errno in (107, 103):  # ENOTCONN / ECONNABORTED: a dead FUSE daemon's mount
            raise MountError(
                f"{mountpoint}: a stale FUSE mount is in the way (clean it with: xetfs umount {mountpoint})"
            ) from None
        raise MountError(f"{mountpoint}: {exc.strerror}") from None
    if not os.path.exists("/dev/fuse"):
        raise MountError("FUSE is not available on this machine (no /dev/fuse; install fuse3)")


LAYOUTS = ("auto", "hub", "names", "hash")


def choose_layout(config: MountConfig, store: Store) -> tuple[str, Catalogue | None]:
    """The layout to show, and the catalogue it comes from for ``hub``.

    ``auto``: the Hub cache layout when the store has a catalogue and no
    ``--names`` was given, else the named tree (``names``: by hash when there
    is no manifest).  Raises ``MountError`` for ``hub`` without a catalogue.
    """
    wanted = config.layout == "hub" or (config.layout == "auto" and config.names is None)
    catalogue = store_catalogue(store) if wanted else None
    if config.layout == "hub" and catalogue is None:
        raise MountError(f"--layout hub: {store.location} has no {CATALOGUE_NAME} (import with xetfs pack --hub-cache)")
    if catalogue is not None:
        return "hub", catalogue
    return ("hash" if config.layout == "hash" else "names"), None


def _build_tree(config: MountConfig, store: Store, index: Index) -> Tree:
    layout, catalogue = choose_layout(config, store)
    log.info("layout: %s", layout)
    if catalogue is not None:
        for warning in catalogue.warnings:
            log.warning("catalogue: %s", warning)
        tree, warnings = build_hub_tree(index, catalogue)
    else:
        manifest = _load_manifest(config, store) if layout == "names" else None
        for warning in manifest.warnings if manifest else ():
            log.warning("names: %s", warning)
        if config.layout == "names" and manifest is None:
            hub = store.meta_path(CATALOGUE_NAME) is not None
            log.warning("--layout names: %s has no %s: files are shown by hash%s", store.location, MANIFEST_NAME,
                        f" (its {CATALOGUE_NAME} names them: --layout hub)" if hub else "")  # fmt: skip
        tree, warnings = build_tree(index, manifest)
    for warning in warnings:
        log.warning("names: %s", warning)
    return tree


def _load_manifest(config: MountConfig, store: Store) -> Manifest | None:
    if config.names is not None:
        return load_manifest(config.names)
    return store_manifest(store)


def build_fs(config: MountConfig) -> XetFS:
    """Open the store, index it and assemble the filesystem (no FUSE yet)."""
    remote_counters = RemoteCounters()
    store = open_store(os.fspath(config.store), io_timeout=config.io_timeout, headers=config.headers,
                       cache_dir=config.cache_dir, disk_cache_size=config.disk_cache_size,
                       counters=remote_counters)  # fmt: skip
    remote = not store.local
    loaded = load_index(store, strict=config.strict)
    tree = _build_tree(config, store, loaded.index)
    # A remote store is read in the daemon's threads (obstore releases the GIL), many requests at once.
    threaded = remote or choose_io_mode(config.io_mode, Path(config.store)) == "thread"
    io = threaded_io(config.io_timeout) if threaded else inline_io
    log.info("store reads: %s", f"worker threads, {config.io_timeout:g} s bound" if threaded else "inline")
    pool = _decode_pool(config, store, threaded)
    reader = Reader(
        loaded.index, store, cache_size=config.cache_size, io=io, pool=pool, remote=remote_counters,
        fetch_width=REMOTE_FETCH_WIDTH if remote else None, run_bytes=REMOTE_RUN_BYTES if remote else RUN_BYTES,
        read_ahead=config.prefetch,
    )  # fmt: skip
    counters = loaded.counters()
    if counters.shards == 0 and counters.shards_skipped == 0:
        log.warning("store %s has no shards: the mount shows no files", store.location)
    log.info(
        "indexed %d files, %d terms, %d xorbs from %d shards (%d skipped)",
        counters.files, counters.terms, counters.xorbs, counters.shards, counters.shards_skipped,
    )  # fmt: skip
    options = FsOptions(
        uid=os.getuid() if config.uid is None else config.uid,
        gid=os.getgid() if config.gid is None else config.gid,
        direct_io=config.direct_io,
        mtime_ns=int(store.mtime * 1e9),
        prefetch=config.prefetch,
        prefetch_max=min(REMOTE_PREFETCH if remote else PREFETCH_MAXIMUM, config.cache_size // PREFETCH_CACHE_SHARE),
    )
    return XetFS(tree, reader, options, counters)


def _decode_pool(config: MountConfig, store: Store, threaded: bool) -> DecodePool | None:
    """Worker processes for decoding, for every store, unless asked for none.

    Workers read a local store's files themselves, and fetch from a remote
    store's source (its URL and options reach them over their input).  Where
    reads may stall (``threaded``: a remote store, a network filesystem), a
    worker whose job takes longer than ``--io-timeout`` is stopped and
    replaced, and the read fails.
    """
    workers = default_workers() if config.workers is None else config.workers
    if workers <= 0:
        log.info("decoding in the daemon")
        return None
    log.info("decoding in %d worker processes", workers)
    chunks = store.chunks
    setup = Setup(store.source.worker_setup(), str(chunks.tmp) if chunks is not None else None)
    return DecodePool(workers, slots=slots_for(config.cache_size, workers), setup=setup,
                      job_timeout=_job_timeout(config, store, threaded))  # fmt: skip


def _job_timeout(config: MountConfig, store: Store, threaded: bool) -> float | None:
    """How long a decode job may take before its worker is taken for hung: ``--io-timeout`` where a read
    of the store may hang (a network filesystem); a little more for a remote store, whose fetches end by
    themselves within it; no bound for a local disk, read inline as by the daemon."""
    if not threaded:
        return None
    return config.io_timeout if store.local else config.io_timeout + JOB_TIMEOUT_MARGIN


# Filesystems whose reads can stall indefinitely (network, FUSE, cluster).
REMOTE_FS_TYPES = ("nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "ceph", "glusterfs", "lustre",
                   "afs", "davfs", "sshfs", "gpfs", "beegfs", "fuse")  # fmt: skip


def fs_type(path: Path) -> str:
    """The type of the filesystem holding ``path`` (longest mountinfo prefix), or ""."""
    target = str(path)
    best, kind = "", ""
    for point, _device, fstype in _mounts():
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, fstype
    return kind


def choose_io_mode(mode: str, store_root: Path) -> str:
    """``inline`` for local disks (no thread hop per read); ``thread`` where reads may hang."""
    if mode != "auto":
        return mode
    kind = fs_type(store_root)
    return "thread" if kind.split(".")[0] in REMOTE_FS_TYPES else "inline"


def fuse_options(config: MountConfig) -> set[str]:
    """FUSE mount options: read-only, type ``fuse.xetfs``, and the store as the source ``mount`` shows."""
    location = os.fspath(config.store)
    source = public_url(location) if is_url(location) else os.path.abspath(location)
    source = source.replace("\\", "\\\\").replace(",", "\\,")  # (libfuse splits options at commas)
    source = "".join(c if c.isascii() else urllib.parse.quote(c) for c in source)  # (pyfuse3 takes ASCII)
    opts = set(pyfuse3.default_options) | {"ro", f"fsname={source}", "subtype=xetfs"}
    opts |= config.options & {"allow_other", "allow_root", *FUSE_FLAGS}
    return opts


def set_read_ahead(mountpoint: Path, kb: int) -> None:
    """Raise the kernel's read-ahead for this mount (bigger FUSE requests); root only.

    Call it after FUSE INIT (which resets it).  The device number comes from
    /proc/self/mountinfo, not from a stat() that would go through the mount.
    """
    device = _mounted_device(str(mountpoint))
    if device is None:
        log.debug("read-ahead: %s not found in mountinfo", mountpoint)
        return
    try:
        Path(f"/sys/class/bdi/{device}/read_ahead_kb").write_text(f"{kb}\n")
        log.debug("read-ahead of %s set to %d KiB", mountpoint, kb)
    except OSError as exc:
        log.info("could not set read-ahead to %d KiB: %s", kb, exc.strerror)


class _Collect(logging.Handler):
    """Keeps the messages of warnings logged while the filesystem is built, for the mounting terminal."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def run_daemon(config: MountConfig, ready_fd: int | None = None) -> int:
    """Mount and serve until unmounted or signalled; ``ExitStatus.INTERRUPTED`` after SIGINT, else ``OK``.

    Reports on ``ready_fd``: one ``warning: ...`` line per warning logged
    while mounting (at most ``MAX_REPORTED_WARNINGS``, then one for the rest), a
    ``warnings: N`` line with their number, then ``ok`` or ``error: ...``.
    """
    keep_freed_memory()
    fs: XetFS | None = None
    collect = _Collect()
    logging.getLogger("xetfs").addHandler(collect)
    try:
        check_mountpoint(config.mountpoint, nonempty="nonempty" in config.options)
        fs = build_fs(config)
        pyfuse3.init(fs, str(config.mountpoint), fuse_options(config))
    except (XetfsError, OSError, RuntimeError) as exc:
        if fs is not None:
            fs.reader.close()
        _report(ready_fd, f"error: {describe(exc)}")
        raise
    finally:
        logging.getLogger("xetfs").removeHandler(collect)
    _send_warnings(ready_fd, collect.messages)
    try:
        signals = trio.run(_serve, fs, config, ready_fd)
    finally:
        pyfuse3.close(unmount=True)
        fs.reader.close()
        log.info("unmounted %s", config.mountpoint)
    return ExitStatus.INTERRUPTED if signal.SIGINT in signals else ExitStatus.OK


async def _serve(fs: XetFS, config: MountConfig, ready_fd: int | None) -> list[int]:
    """Serve until unmounted or signalled; returns the signal that ended it (``[]`` for an unmount)."""
    signals: list[int] = []
    refresher = _refresher(fs, config)
    async with trio.open_nursery() as nursery:
        fs.start_background(nursery)
        nursery.start_soon(_watch_signals, nursery, signals, refresher)
        if config.refresh_every:
            nursery.start_soon(_refresh_every, refresher, config.refresh_every)
        nursery.start_soon(_when_answering, fs, config, ready_fd, nursery)
        await pyfuse3.main()
        nursery.cancel_scope.cancel()
    return signals


async def _when_answering(fs: XetFS, config: MountConfig, ready_fd: int | None, nursery: trio.Nursery) -> None:
    """Once the kernel has finished FUSE INIT, tune read-ahead, report readiness, start the decode workers.

    A stat() of the mountpoint from a worker thread is answered only after
    INIT, which also resets the mount's read-ahead: setting it earlier is lost.
    The workers start last so that their start-up does not delay the mount;
    until they are ready the daemon decodes by itself.
    """
    await trio.to_thread.run_sync(os.stat, config.mountpoint, abandon_on_cancel=True)
    set_read_ahead(config.mountpoint, config.read_ahead_kb)
    _report(ready_fd, "ok")
    if ready_fd is None:  # a foreground mount: the one line saying it can be used
        store = public_url(str(config.store)) if is_url(str(config.store)) else config.store
        print(f"xetfs: mounted {store} at {config.mountpoint}", file=sys.stderr, flush=True)
    log.info("serving %s", config.mountpoint)
    fs.reader.start(nursery)


async def _watch_signals(nursery: trio.Nursery, received: list[int], refresher: Refresher) -> None:
    """SIGINT, SIGTERM and SIGHUP unmount; SIGUSR1 (``xetfs refresh``) refreshes."""
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1) as signals:
        async for signum in signals:
            if signum == signal.SIGUSR1:
                log.info("received SIGUSR1, refreshing")
                nursery.start_soon(refresher.refresh)
                continue
            received.append(signum)
            log.info("received %s, unmounting", signal.Signals(signum).name)
            pyfuse3.terminate()
            nursery.cancel_scope.cancel()
            return


def _refresher(fs: XetFS, config: MountConfig) -> Refresher:
    store = fs.reader.store
    tree_from = TREE_FROM if config.names is None else None  # (a --names file is read by every refresh)
    return Refresher(fs, store, lambda index: _build_tree(config, store, index), tree_from)


async def _refresh_every(refresher: Refresher, seconds: float) -> None:
    while True:
        await trio.sleep(seconds)
        await refresher.refresh()


def _warnings_in(messages: list[str]) -> int:
    """How many warnings ``messages`` stand for: a closing line of a ``WarningLog``, "... and N more <kind>
    warnings", stands for N."""
    return sum(int(m.group(1)) if (m := re.search(r"\.\.\. and (\d+) more ", line)) else 1 for line in messages)


def _send_warnings(fd: int | None, messages: list[str]) -> None:
    """Pass warnings to the waiting ``xetfs mount``, one line each (the log has them all)."""
    if fd is None:
        return
    shown = messages[:MAX_REPORTED_WARNINGS]
    lines = [f"warning: {m}".replace("\n", " ") for m in shown]
    count = _warnings_in(messages)
    if count > _warnings_in(shown):
        lines.append(f"warning: ... and {plural(count - _warnings_in(shown), 'more warning')} (see the log)")
    with contextlib.suppress(OSError):
        os.write(fd, "".join(f"{line}\n" for line in [*lines, f"warnings: {count}"]).encode())


def _report(fd: int | None, message: str) -> None:
    """Send the final line (``ok`` or ``error: ...``) and close ``fd``."""
    if fd is None:
        return
    with contextlib.suppress(OSError):
        os.write(fd, message.encode() + b"\n")
        os.close(fd)


def spawn_daemon(
    argv: list[str], mountpoint: Path, log_file: Path, config: bytes, env: dict[str, str] | None = None
) -> tuple[list[str], int]:
    """Start the daemon (``argv`` + ``--foreground --ready-fd N --config-fd M``) and wait until it serves.

    ``config`` (``daemonconfig.dump_config``) reaches the daemon on a pipe, fd
    ``M``, and ``env`` is added to its environment: secrets go there, never
    into ``argv``.  Returns the daemon's warnings to show (a long
    list ends with a line for the rest) and their number.  Raises
    ``MountError`` with the daemon's own message when it fails.
    """
    read_fd, write_fd = os.pipe()
    config_fd, config_out = os.pipe()
    log_file.parent.mkdir(parents=True, exist_ok=True)
    new_log = not log_file.exists()
    with open(log_file, "ab") as log_out:
        before = log_out.tell()
        child = subprocess.Popen(
            [*argv, "--foreground", "--ready-fd", str(write_fd), "--config-fd", str(config_fd),
             "--log-file", str(log_file)],
            stdin=subprocess.DEVNULL,
            stdout=log_out,
            stderr=log_out,
            pass_fds=(write_fd, config_fd),
            start_new_session=True,
            cwd="/",
            env={**os.environ, **(env or {})},
        )  # fmt: skip
    os.close(write_fd)
    os.close(config_fd)
    with contextlib.suppress(BrokenPipeError), open(config_out, "wb") as out:  # (a dead daemon: reported below)
        out.write(config)
    lines = _read_report(read_fd, child, READY_TIMEOUT).splitlines()
    warnings = [line.removeprefix("warning: ") for line in lines if line.startswith("warning: ")]
    counts = [int(line.split()[1]) for line in lines if re.fullmatch(r"warnings: \d+", line)]
    message = lines[-1] if lines and not lines[-1].startswith("warning") else ""
    if message != "ok":
        with contextlib.suppress(ProcessLookupError):
            child.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired, OSError):
            child.wait(FAILED_DAEMON_EXIT)
            if message and new_log and log_file.stat().st_size == 0:  # (it said why on the pipe, and nothing else)
                log_file.unlink()
        detail = message.removeprefix("error: ") if message else f"the daemon exited (see {log_file})"
        raise MountError(detail + _fuse_said(log_file, before))
    return warnings, counts[-1] if counts else len(warnings)


def _fuse_said(log_file: Path, start: int) -> str:
    """What libfuse or fusermount3 wrote to the daemon's stderr (its log) from ``start`` on, as `` (...)``: why a
    mount was refused (no access to /dev/fuse, allow_other not allowed), which pyfuse3's error does not say."""
    try:
        with open(log_file, "rb") as f:
            f.seek(start)
            text = f.read(64 * 1024).decode(errors="replace")
    except OSError:
        return ""
    said = [line.strip() for line in text.splitlines() if re.match(r"(fuse|fusermount3?):", line.strip())]
    return f" ({'; '.join(dict.fromkeys(said))})" if said else ""


def _read_report(fd: int, child: subprocess.Popen[bytes], timeout: float) -> str:
    """What the daemon wrote on the report pipe up to and including its final line (or EOF)."""
    deadline = time.monotonic() + timeout
    chunks = []
    with os.fdopen(fd, "rb", buffering=0) as pipe:
        os.set_blocking(fd, False)
        while time.monotonic() < deadline:
            try:
                data = pipe.read(4096)
            except BlockingIOError:
                data = None
            if data:
                chunks.append(data)
                last = b"".join(chunks).rstrip(b"\n").rpartition(b"\n")[2]
                if data.endswith(b"\n") and not last.startswith(b"warning"):
                    break
            elif data == b"":  # EOF: the daemon closed the pipe or died
                break
            if child.poll() is not None and not data:
                break
            select.select([fd], [], [], 0.05)
        else:
            return f"error: the daemon did not report within {timeout:g} s"
    return b"".join(chunks).decode(errors="replace").strip()


XETFS_FS_TYPE = "fuse.xetfs"  # what mountinfo shows for our mounts (``subtype=xetfs``)
FUSECTL = Path("/sys/fs/fuse/connections")


def unmount(mountpoint: Path, *, lazy: bool = False, force: bool = False) -> None:
    """Unmount with fusermount3 (or umount), refusing paths that are not mounted.

    Anything but a xetfs mount is refused unless ``force``.  ``force`` first
    aborts the FUSE connection of a FUSE mount (root only), which fails every
    pending and future request at once: the way out of a hung daemon.
    """
    path = os.path.abspath(mountpoint)  # no syscalls: the mount may be hung
    found = next(((device, kind) for point, device, kind in _mounts() if point == path), None)
    if found is None:  # (the kernel's table names real paths: resolve the parent's symlinks, never the mount's)
        path = os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))
        found = next(((device, kind) for point, device, kind in _mounts() if point == path), None)
    if found is None:
        shown = str(mountpoint) if os.path.isabs(mountpoint) else f"{mountpoint} ({path})"
        raise MountError(f"{shown}: not mounted")
    device, kind = found
    if kind != XETFS_FS_TYPE and not force:
        hint = "; use --force to unmount it anyway" if kind.split(".")[0] == "fuse" else ""
        raise MountError(f"{mountpoint}: not a xetfs mount (it is {kind}){hint}")
    if force:
        if kind.split(".")[0] == "fuse":
            _abort_connection(device)
        lazy = True
    tool = shutil.which("fusermount3") or shutil.which("fusermount")
    cmd = [tool, "-u", *(["-z"] if lazy else []), path] if tool else ["umount", *(["-l"] if lazy else []), path]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode != 0 and os.geteuid() == 0 and tool:
        result = subprocess.run(
            ["umount", *(["-l"] if lazy else []), path], capture_output=True, text=True, check=False
        )
    if result.returncode != 0:
        hint = "" if lazy else f" (try: xetfs umount -z {mountpoint}, or --force for a hung daemon)"
        raise MountError(f"{mountpoint}: unmount failed: {result.stderr.strip() or result.returncode}{hint}")


def _abort_connection(device: str) -> None:
    """Abort the FUSE connection of the mount on ``device`` through fusectl, mounting fusectl if root needs it."""
    minor = device.partition(":")[2]
    if os.geteuid() != 0:
        raise MountError(f"cannot abort FUSE connection {minor}: --force needs root")
    if not any(point == str(FUSECTL) for point, _, _ in _mounts()):
        _mount_fusectl()
    abort = FUSECTL / minor / "abort"
    try:
        abort.write_text("1\n")
    except OSError as exc:
        raise MountError(f"cannot abort FUSE connection {minor}: {abort}: {exc.strerror}") from None


def _mount_fusectl() -> None:
    """Mount the FUSE control filesystem at ``FUSECTL`` (root only)."""
    cmd = ["mount", "-t", "fusectl", "fusectl", str(FUSECTL)]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise MountError(
            f"cannot abort a FUSE connection: the fusectl filesystem is not mounted at {FUSECTL}, "
            f"and '{' '.join(cmd)}' failed: {result.stderr.strip() or result.returncode}"
        )
    log.info("mounted fusectl at %s", FUSECTL)


def _mounted_device(path: str) -> str | None:
    """``major:minor`` of the mount at ``path``, or None."""
    return next((device for point, device, _ in _mounts() if point == path), None)


def _mounts() -> Iterator[tuple[str, str, str]]:
    """``(mount point, major:minor, filesystem type)`` of every mount, from /proc/self/mountinfo.

    Read from the kernel's table, never through a mount: a stat() of a FUSE
    mountpoint whose loop is not running (or is hung) would block.
    """
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
            lines = f.read().splitlines()
    except OSError:
        return
    for line in lines:
        left, _, right = line.partition(" - ")
        fields = left.split()
        # Space, tab, newline and backslash appear as octal escapes (\040 ...).
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
        yield point, fields[2], right.split()[0]


def default_log_file(mountpoint: Path) -> Path:
    base = Path(os.environ.get("XDG_STATE_HOME") or user_home() / ".local" / "state") / "xetfs"
    name = str(mountpoint.resolve()).strip("/").replace("/", "_") or "root"
    return base / f"{name}.log"


def python_argv() -> list[str]:
    return [sys.executable, "-m", "xetfs"]
