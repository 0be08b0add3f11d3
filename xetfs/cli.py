"""The ``xetfs`` command line: argument parsing, logging, exit codes.

Each sub-command is a small function that assembles the parts.  Every
deliberate error (``XetfsError``) and every ``OSError`` becomes one line on
stderr and a non-zero exit status; ``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import trio

from xetfs import __version__, hashes
from xetfs.catalogue import Catalogue
from xetfs.errors import XetfsError, describe
from xetfs.index import FileEntry, Index
from xetfs.indexer import load_index
from xetfs.reader import Reader
from xetfs.store import Store

log = logging.getLogger("xetfs")

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_PROBLEMS = 3  # ``verify`` found damage

Command = Callable[[argparse.Namespace], int]


class UsageError(Exception):
    """Bad arguments that argparse could not catch (exit status 2)."""


def parse_size(text: str) -> int:
    """``512M``, ``2G``, ``1.5GiB``, ``0`` -> bytes (binary units)."""
    units = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    t = text.strip().lower().removesuffix("ib").removesuffix("b")
    unit = t[-1:] if t[-1:] in units else ""
    number = t[: len(t) - len(unit)]
    try:
        value = int(number) if number.isdigit() else float(number)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (try 512M or 2G)") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"not a usable size: {text!r} (try 512M or 2G)")
    return int(value * units[unit])


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--debug", action="store_true", help="show tracebacks and debug logging")
    p.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="xetfs", description="Read Hugging Face Xet storage as plain files.")
    parser.add_argument("--version", action="version", version=f"xetfs {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("ls", help="list the repos and revisions of a store (its files when it has no catalogue)")
    p.add_argument("store", help="store directory")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--files", action="store_true", help="list the store's files even when it has a catalogue")
    p.set_defaults(func=cmd_ls)

    p = sub.add_parser("cat", help="write a file's bytes to stdout")
    p.add_argument("store", help="store directory")
    p.add_argument("hash", help="xet hash of the file (a unique prefix of at least 8 digits is enough)")
    p.add_argument("--offset", type=parse_size, default=0, help="first byte to write")
    p.add_argument("--length", type=parse_size, default=None, help="bytes to write (default: to the end)")
    p.set_defaults(func=cmd_cat)

    p = sub.add_parser("verify", help="audit a whole store offline")
    p.add_argument("store", help="store directory")
    p.add_argument("--no-progress", action="store_true", help="no progress bar even on a terminal")
    p.set_defaults(func=cmd_verify)

    from xetfs import commands  # mount, umount, stats, pack

    commands.register(sub, _add_common)
    for choice in sub.choices.values():
        if not any(a.dest == "debug" for a in choice._actions):
            _add_common(choice)
    return parser


def setup_logging(level: str, debug: bool, stream: Any = None) -> None:
    logging.basicConfig(
        level=logging.DEBUG if debug else getattr(logging, level.upper()),
        format="xetfs: %(levelname)s: %(message)s",
        stream=stream or sys.stderr,
        force=True,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    setup_logging(args.log_level, args.debug)
    try:
        result: int = args.func(args)
        sys.stdout.flush()
        return result
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The consumer (e.g. ``head``) stopped reading: not an error.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except (XetfsError, OSError, UsageError) as exc:
        if args.debug:
            raise
        print(f"xetfs: error: {describe(exc)}", file=sys.stderr)
        return EXIT_USAGE if isinstance(exc, UsageError) else EXIT_ERROR


# -- store helpers -------------------------------------------------------------


def open_index(path: str) -> tuple[Store, Index]:
    store = Store.open(path)
    return store, load_index(store).index


def find_file(index: Index, text: str) -> FileEntry:
    """The file whose xet hash is ``text`` or starts with it (at least 8 digits)."""
    key = text.lower()
    if hashes.is_hex(key):
        entry = index.get(hashes.from_hex(key))
        if entry is None:
            raise UsageError(f"no file with hash {key} in the store")
        return entry
    if len(key) < 8 or any(c not in "0123456789abcdef" for c in key):
        raise UsageError(f"not a file hash or a hash prefix of at least 8 hex digits: {text!r}")
    found = [e for e in index if e.hex.startswith(key)]
    if len(found) != 1:
        raise UsageError(f"{len(found)} files have a hash starting with {key}")
    return found[0]


# -- commands ------------------------------------------------------------------


def cmd_ls(args: argparse.Namespace) -> int:
    from xetfs.catalogue import find_catalogue, load_catalogue

    path = None if args.files else find_catalogue(Path(args.store))
    if path is not None:
        Store.open(args.store)
        return _ls_catalogue(load_catalogue(path), as_json=args.json)
    _, index = open_index(args.store)
    entries = sorted(index, key=lambda e: e.hex)
    if args.json:
        rows = [{"hash": e.hex, "size": e.size, "sha256": e.sha256, "terms": e.num_terms} for e in entries]
        json.dump(rows, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return EXIT_OK
    for e in entries:
        print(f"{e.hex}  {e.size:>14}  {e.sha256 or '-':<64}  {e.num_terms}")
    return EXIT_OK


def _ls_catalogue(catalogue: Catalogue, *, as_json: bool) -> int:
    """Repos and revisions of a store's catalogue: one line per repo, one per revision below it."""
    for warning in catalogue.warnings:
        print(f"xetfs: warning: {warning}", file=sys.stderr)
    rows: list[dict[str, Any]] = []
    for repo in catalogue.repos:
        revisions: list[dict[str, Any]] = []
        for commit in sorted(repo.revisions):
            rev = repo.revisions[commit]
            revisions.append({
                "commit": commit,
                "refs": sorted(ref for ref, c in repo.refs.items() if c == commit),
                "files": len(rev.files),
                "bytes": sum(repo.blobs[b].size for b in rev.files.values()),
                "noExist": len(rev.no_exist),
            })  # fmt: skip
        rows.append({"type": repo.type, "id": repo.id, "folder": repo.folder, "revisions": revisions})
    if as_json:
        json.dump({"repos": rows}, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return EXIT_OK
    for row in rows:
        print(f"{row['type']:<8} {row['id']}  ({len(row['revisions'])} revisions)")
        for r in row["revisions"]:
            refs = ", ".join(r["refs"]) or "-"
            print(f"  {r['commit']}  {r['files']:>6} files  {r['bytes']:>14} bytes  refs: {refs}")
    return EXIT_OK


CAT_BLOCK = 8 * 1024 * 1024


def cmd_cat(args: argparse.Namespace) -> int:
    store, index = open_index(args.store)
    entry = find_file(index, args.hash)
    end = entry.size if args.length is None else min(entry.size, args.offset + args.length)
    reader = Reader(index, store, cache_size=64 * 1024 * 1024)
    out = sys.stdout.buffer

    async def run() -> None:
        for offset in range(args.offset, end, CAT_BLOCK):
            out.write(await reader.read(entry, offset, min(CAT_BLOCK, end - offset)))

    trio.run(run)
    out.flush()
    return EXIT_OK


def cmd_verify(args: argparse.Namespace) -> int:
    from xetfs.catalogue import find_catalogue, load_catalogue
    from xetfs.verify import audit, audit_catalogue

    store = Store.open(args.store)
    show = sys.stderr.isatty() and not args.no_progress
    from tqdm import tqdm

    with tqdm(total=0, unit="B", unit_scale=True, unit_divisor=1024, disable=not show, desc="verify") as bar:
        report = trio.run(audit, store, bar)
    catalogue = find_catalogue(Path(args.store))
    if catalogue is not None:
        report.problems += audit_catalogue(load_catalogue(catalogue), load_index(store).index)
    for problem in report.problems:
        print(f"PROBLEM: {problem}")
    status = "OK" if report.ok else f"{len(report.problems)} problem(s)"
    print(
        f"{status}: {report.shards} shards, {report.xorbs} xorbs, {report.chunks} chunks, "
        f"{report.files} files, {report.bytes_checked} file bytes checked"
    )
    return EXIT_OK if report.ok else EXIT_PROBLEMS
