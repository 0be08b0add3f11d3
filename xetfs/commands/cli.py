"""The ``xetfs`` command line: argument parsing, logging, exit codes.

Each sub-command is a small function that assembles the parts.  Every
deliberate error (``XetfsError``) and every ``OSError`` becomes one line on
stderr and a non-zero exit status; ``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import functools
import io
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from xetfs import __version__
from xetfs.base import hashes
from xetfs.base.errors import XetfsError, describe
from xetfs.base.exitstatus import ExitStatus
from xetfs.base.messages import UserFormatter, plural, print_error, print_warning
from xetfs.base.settings import CAT_BLOCK, CAT_CACHE_SIZE
from xetfs.commands.args import UsageError, parse_size
from xetfs.commands.mountopts import option_table
from xetfs.storage.catalogue import Catalogue
from xetfs.storage.index import FileEntry, Index
from xetfs.storage.indexer import load_index
from xetfs.storage.manifest import Manifest, format_mtime, not_in_store
from xetfs.storage.objects import is_url
from xetfs.storage.store import Store

log = logging.getLogger("xetfs")

EXIT_OK = ExitStatus.OK
EXIT_ERROR = ExitStatus.ERROR
EXIT_USAGE = ExitStatus.USAGE
EXIT_PROBLEMS = ExitStatus.PROBLEMS
EXIT_BROKEN_PIPE = ExitStatus.BROKEN_PIPE

Command = Callable[[argparse.Namespace], int]


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--debug", action="store_true", help="show tracebacks and debug logging")
    p.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"],
                   help="least severe messages to log (default: warning)")  # fmt: skip


class _Version(argparse.Action):
    """``--version``: the version and the installation that runs (``mount -t`` may run another checkout), on one
    line (argparse's own version action wraps long lines)."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, **kw: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kw)

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        print(f"xetfs {__version__} ({Path(__file__).resolve().parent.parent})")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="xetfs",
        description="Read Hugging Face Xet storage as plain files.  'xetfs STORE MNT -o OPTIONS' (the form "
        "'mount -t fuse.xetfs' and /etc/fstab run) is 'xetfs mount STORE MNT -o OPTIONS'.",
    )
    parser.add_argument("--version", action=_Version, help="show the version, and where this xetfs is installed")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    from xetfs.commands.args import add_remote_args

    p = sub.add_parser("ls", help="list the repos and revisions of a store (its files when it has no catalogue)")
    p.add_argument("store", help="store directory or URL (http(s)://, s3://, gs://, az://)")
    add_remote_args(p)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--files", action="store_true",
                   help="list the store's files even when it has a catalogue: hash, size, sha256, terms, chunks "
                        "(distinct), and mtime and path when the store names them")  # fmt: skip
    p.set_defaults(func=cmd_ls)

    p = sub.add_parser("cat", help="write a file's bytes to stdout")
    p.add_argument("store", help="store directory or URL")
    add_remote_args(p)
    p.add_argument("hash", metavar="FILE",
                   help="the file's path in the store's names, or its xet hash (a unique prefix of at least 8 "
                        "digits is enough)")  # fmt: skip
    p.add_argument("--offset", type=parse_size, default=0, help="first byte to write")
    p.add_argument("--length", type=parse_size, default=None, help="bytes to write (default: to the end)")
    p.set_defaults(func=cmd_cat)

    p = sub.add_parser("verify", help="audit a whole store: every shard, xorb, chunk and file")
    p.add_argument("store", help="store directory or URL")
    add_remote_args(p)
    p.add_argument("--use-cache", action="store_true",
                   help="a remote store: read through the disk cache, auditing it too (by default every byte "
                        "comes from the server)")  # fmt: skip
    p.add_argument("--no-progress", action="store_true", help="no progress bar even on a terminal")
    p.set_defaults(func=cmd_verify)

    from xetfs.commands import mount  # mount, umount, stats, publish, pack, push

    mount.register(sub, _add_common)
    from xetfs.commands.serve import add_serve_parser

    add_serve_parser(sub, _add_common)
    for choice in sub.choices.values():
        if not any(a.dest == "debug" for a in choice._actions):
            _add_common(choice)
    sub.choices["mount"].set_defaults(o_names=sorted(option_table(sub.choices["mount"])))  # (for messages)
    return parser


def setup_logging(level: str, debug: bool, stream: Any = None) -> None:
    """Log to ``stream`` (stderr) as ``xetfs: warning: ...``, the style of every message to the user."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(UserFormatter())
    logging.basicConfig(level=logging.DEBUG if debug else getattr(logging, level.upper()), handlers=[handler],
                        force=True)  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    from xetfs.commands.mountopts import expand_mount_argv, helper_argv

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    words = helper_argv(sys.argv[1:] if argv is None else [str(a) for a in argv], list(sub.choices))
    try:
        words = expand_mount_argv(words, parser)
    except argparse.ArgumentTypeError as exc:
        sub.choices["mount"].error(str(exc))
    args = parser.parse_args(words)
    setup_logging(args.log_level, args.debug)
    try:
        if getattr(args, "credentials", None):  # before anything reads the environment (a mount's daemon inherits it)
            from xetfs.commands.credentials import load_credentials

            load_credentials(args.credentials)
        result: int = args.func(args)
        sys.stdout.flush()
        return result
    except KeyboardInterrupt:
        return ExitStatus.INTERRUPTED
    except BrokenPipeError:
        # The consumer (e.g. ``head``) stopped reading: the output is incomplete, so not a success.
        # (A command whose status says more, like ``verify`` finding damage, returns that itself.)
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except (XetfsError, OSError, UsageError) as exc:
        if args.debug:
            raise
        print_error(describe(exc))
        return EXIT_USAGE if isinstance(exc, UsageError) else EXIT_ERROR


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so that flushing it at exit cannot fail again."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


# -- store helpers -------------------------------------------------------------


def open_index(args: argparse.Namespace) -> tuple[Store, Index]:
    from xetfs.commands.args import open_location

    store = open_location(args)
    return store, load_index(store).index


def find_file(index: Index, text: str, names: Callable[[], Manifest | None] = lambda: None) -> FileEntry:
    """The file whose xet hash is ``text`` or, alone, starts with it (at least 8 hex digits), or the one the
    store's names (``names()``) give the path ``text``.  Text that could be either (a file named by a hash)
    must not mean two files; ``./`` before it makes it a path."""
    key = text.lower()
    if hashes.is_hex(key) and (entry := index.get(hashes.from_hex(key))) is not None:
        return entry  # (a whole xet hash: no need of the names)
    hexadecimal = len(key) >= 8 and all(c in "0123456789abcdef" for c in key)
    found = [e for e in index if e.hex.startswith(key)] if hexadecimal and not hashes.is_hex(key) else []
    by_hash = found[0] if len(found) == 1 else None
    manifest = names()
    path = text.removeprefix("./")
    named = next((f for f in manifest.files if f.name == path), None) if manifest is not None else None
    by_name = index.get(named.xet_hash) if named is not None else None
    if named is not None and by_name is None:
        raise UsageError(f"{path}: its file {hashes.to_hex(named.xet_hash)} is not in the store")
    if by_hash is not None and by_name is not None and by_hash is not by_name:
        raise UsageError(f"{text!r} is a path of the store's names and the hash (or its start) of another file: "
                         f"give ./{path} for the path, or the whole hash")  # fmt: skip
    if by_hash is not None or by_name is not None:
        return by_hash or by_name  # type: ignore[return-value]
    if hashes.is_hex(key):
        raise UsageError(f"no file with hash {key} in the store")
    if hexadecimal:
        raise UsageError(f"{len(found)} files have a hash starting with {key}")
    paths = ", nor a path the store's names give" if manifest is not None else " (the store has no names)"
    raise UsageError(f"not a file hash or a hash prefix of at least 8 hex digits{paths}: {text!r}")


# -- commands ------------------------------------------------------------------


def cmd_ls(args: argparse.Namespace) -> int:
    """The repos and revisions of the store's Hub catalogue, when it has one (and not ``--files``).

    Otherwise one row per file, or, when the store has names, one per name
    (then the files no name refers to): hash, size, sha256, terms, chunks
    (distinct chunks: what ``xetfs stats MNT FILE`` measures decoding
    against), then mtime and path.  A row is a dict, so that more columns
    can join without breaking readers of ``--json``; the text form prints
    its values in order, the path last.
    """
    from xetfs.commands.args import open_location
    from xetfs.storage.catalogue import store_catalogue
    from xetfs.storage.manifest import store_manifest

    store = open_location(args)
    catalogue = None if args.files else store_catalogue(store)
    index = load_index(store).index
    if catalogue is not None:
        return _ls_catalogue(catalogue, index, as_json=args.json)
    manifest = store_manifest(store)
    rows: list[dict[str, Any]] = []
    if manifest is None:
        rows = [_ls_row(e) for e in sorted(index, key=lambda e: e.hex)]
    else:
        for warning in manifest.warnings:
            log.warning("names: %s", warning)
        named: set[bytes] = set()
        missing = []
        for f in sorted(manifest.files, key=lambda f: f.path):
            entry = index.get(f.xet_hash)
            if entry is None:
                missing.append(f)
                continue
            named.add(f.xet_hash)
            rows.append(_ls_row(entry, f.name, f.mtime_ns))
        if missing:
            log.warning("names: %s: left out", not_in_store(missing, len(manifest.files)))
        rows += [_ls_row(e, None, None) for e in sorted(index, key=lambda e: e.hex) if e.file_hash not in named]
    if args.json:
        json.dump(rows, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return EXIT_OK
    named_rows = manifest is not None
    if sys.stdout.isatty():  # (a header for a person; none for a pipe or a file, whose readers count columns)
        cells = [f"{'xet hash':<64}", f"{'size':>14}", f"{'sha256':<64}", "terms", f"{'chunks':>7}"]
        print("  ".join(cells + ([f"{'mtime':<20}", "path"] if named_rows else [])))
    for row in rows:
        cells = [row["hash"], f"{row['size']:>14}", f"{row['sha256'] or '-':<64}", f"{row['terms']:>5}",
                 f"{row['chunks']:>7}"]  # fmt: skip
        if named_rows:  # the time to the second
            mtime = row["mtime"]
            cells += [f"{mtime.partition('.')[0].removesuffix('Z') + 'Z' if mtime else '-':<20}", row["path"] or "-"]
        print("  ".join(cells))
    return EXIT_OK


def _ls_catalogue(catalogue: Catalogue, index: Index, *, as_json: bool) -> int:
    """Repos and revisions of a store's catalogue: one line per repo, one per revision below it.

    A revision's files whose blob the store lacks (a skipped shard's, say)
    are counted apart (``files`` and ``bytes`` are the catalogue's), and the
    warnings a mount would print about them are printed.
    """
    from xetfs.names.hubtree import build_hub_tree

    for warning in [*catalogue.warnings, *build_hub_tree(index, catalogue)[1]]:
        print_warning(warning)
    rows: list[dict[str, Any]] = []
    for repo in catalogue.repos:
        absent = {name for name, blob in repo.blobs.items() if index.get(hashes.from_hex(blob.xet_hash)) is None}
        revisions: list[dict[str, Any]] = []
        for commit in sorted(repo.revisions):
            rev = repo.revisions[commit]
            revisions.append({
                "commit": commit,
                "refs": sorted(ref for ref, c in repo.refs.items() if c == commit),
                "files": len(rev.files),
                "bytes": sum(repo.blobs[b].size for b in rev.files.values()),
                "noExist": len(rev.no_exist),
                "notInStore": sum(blob in absent for blob in rev.files.values()),
            })  # fmt: skip
        rows.append({"type": repo.type, "id": repo.id, "folder": repo.folder, "revisions": revisions})
    if as_json:
        json.dump({"repos": rows}, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return EXIT_OK
    for row in rows:
        print(f"{row['type']:<8} {row['id']}  ({plural(len(row['revisions']), 'revision')})")
        for r in row["revisions"]:
            refs = ", ".join(r["refs"]) or "-"
            files, size = plural(r["files"], "file"), plural(r["bytes"], "byte")
            left_out = f"  ({r['notInStore']} not in the store: left out)" if r["notInStore"] else ""
            print(f"  {r['commit']}  {files:>12}  {size:>20}  refs: {refs}{left_out}")
    return EXIT_OK


def _ls_row(e: FileEntry, *named: Any) -> dict[str, Any]:
    """``xetfs ls``'s row for ``e``; with ``named`` = ``(path or None, mtime_ns or None)`` also those columns."""
    row: dict[str, Any] = {"hash": e.hex, "size": e.size, "sha256": e.sha256, "terms": e.num_terms,
                           "chunks": e.num_chunks}  # fmt: skip
    if named:
        path, mtime_ns = named
        row["path"] = path
        row["mtime"] = None if mtime_ns is None else format_mtime(mtime_ns)
    return row


def cmd_cat(args: argparse.Namespace) -> int:
    import trio

    from xetfs.read.reader import Reader
    from xetfs.storage.manifest import store_manifest

    store, index = open_index(args)

    def names() -> Manifest | None:
        try:
            return store_manifest(store)
        except XetfsError as exc:  # (a broken manifest costs the paths, not the hashes)
            print_warning(str(exc))
            return None

    entry = find_file(index, args.hash, names)
    end = entry.size if args.length is None else min(entry.size, args.offset + args.length)
    reader = Reader(index, store, cache_size=CAT_CACHE_SIZE)
    write = _stdout_writer()

    async def run() -> None:
        for offset in range(args.offset, end, CAT_BLOCK):
            write(await reader.read(entry, offset, min(CAT_BLOCK, end - offset)))

    trio.run(run)
    sys.stdout.buffer.flush()
    return EXIT_OK


def _stdout_writer() -> Callable[[bytes | memoryview], None]:
    """A function writing all of its bytes to stdout; a closed pipe raises ``BrokenPipeError``.

    Straight to the file descriptor when there is one: a buffered stream can
    end a large write early when the reader goes away, without an error, and
    the rest would be lost silently.
    """
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, io.UnsupportedOperation):  # not a file (captured output)

        def write_buffered(data: bytes | memoryview) -> None:
            sys.stdout.buffer.write(data)

        return write_buffered
    sys.stdout.flush()

    def write_all(data: bytes | memoryview) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]

    return write_all


def cmd_verify(args: argparse.Namespace) -> int:
    import trio

    from xetfs.commands.args import open_location
    from xetfs.commands.verify import audit
    from xetfs.storage.catalogue import store_catalogue
    from xetfs.storage.manifest import store_manifest

    if is_url(args.store) and not args.use_cache:
        args.disk_cache_size = 0  # the server's bytes, not the disk cache's
    store = open_location(args)
    show = sys.stderr.isatty() and not args.no_progress
    from tqdm import tqdm

    broken = []  # (a broken manifest or catalogue is a problem of the store; the files are checked all the same)
    try:
        catalogue = store_catalogue(store)
    except XetfsError as exc:
        catalogue = None
        broken.append(str(exc))
    try:
        manifest = store_manifest(store)
    except XetfsError as exc:
        manifest = None
        broken.append(str(exc))
    with tqdm(total=0, unit="B", unit_scale=True, unit_divisor=1024, disable=not show, desc="verify") as bar:
        report = trio.run(functools.partial(audit, store, bar, manifest=manifest, catalogue=catalogue))
    report.problems += broken
    status = EXIT_OK if report.ok else EXIT_PROBLEMS
    try:
        for problem in report.problems:
            print(f"PROBLEM: {problem}")
        if report.unlisted_xorbs:
            print(f"note: {plural(report.unlisted_xorbs, 'xorb')} no shard lists (a bad or lost shard's, or a pack's "
                  "stopped before it wrote its shard): no file needs them")  # fmt: skip
        summary = "OK" if report.ok else plural(len(report.problems), "problem")
        print(
            f"{summary}: {plural(report.shards, 'shard')}, {plural(report.xorbs, 'xorb')}, "
            f"{plural(report.chunks, 'chunk')}, {plural(report.files, 'file')}, "
            f"{plural(report.bytes_checked, 'file byte')} checked"
        )
        sys.stdout.flush()
    except BrokenPipeError:
        # Damage stays damage when nobody reads the report (``verify | head``).
        if report.ok:
            raise
        _silence_stdout()
    return status
