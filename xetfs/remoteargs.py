"""Command-line options for remote stores, shared by ``mount``, ``ls``, ``cat`` and ``verify``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from xetfs.diskcache import DEFAULT_SIZE
from xetfs.objects import HEADERS_ENV, TOKEN_ENV, header_lines
from xetfs.stats import RemoteCounters
from xetfs.store import Store


def add_remote_args(p: argparse.ArgumentParser, *, io_timeout: bool = True) -> None:
    from xetfs.cli import parse_size

    p.add_argument("--header", dest="headers", action="append", default=[], metavar="'NAME: VALUE'",
                   help=f"extra HTTP header for a remote store (also from ${HEADERS_ENV}, one per line; "
                        f"a bearer token from ${TOKEN_ENV})")  # fmt: skip
    p.add_argument("--cache-dir", type=Path, default=None,
                   help="shared on-disk cache of remote stores (default $XDG_CACHE_HOME/xetfs)")  # fmt: skip
    p.add_argument("--disk-cache-size", type=parse_size, default=DEFAULT_SIZE,
                   help="bound of the on-disk cache, e.g. 10G; 0 turns it off (default 10G)")  # fmt: skip
    if io_timeout:
        p.add_argument("--io-timeout", type=float, default=30.0, metavar="SECONDS",
                       help="a remote read that takes longer fails (default 30)")  # fmt: skip


def open_location(args: argparse.Namespace, counters: RemoteCounters | None = None) -> Store:
    """The store named by ``args.store``: a directory, or a URL opened with the remote options.

    Says on stderr where what it reads of a remote store is cached, when it is.
    """
    from xetfs.remote import open_store

    store = open_store(args.store, io_timeout=float(args.io_timeout), headers=args.headers, cache_dir=args.cache_dir,
                       disk_cache_size=args.disk_cache_size, counters=counters)  # fmt: skip
    if store.chunks is not None:
        print(f"xetfs: note: keeping what is read of {store.location} in the disk cache {store.chunks.disk.directory} "
              "(--disk-cache-size 0 to keep nothing)", file=sys.stderr)  # fmt: skip
    return store


def headers_env(args: argparse.Namespace) -> dict[str, str]:
    """Environment for a child process that must send ``--header`` values (never in its argv)."""
    lines = header_lines(args.headers)
    return {HEADERS_ENV: "\n".join(lines)} if lines else {}
