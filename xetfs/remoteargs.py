"""Command-line options for remote stores, shared by ``mount``, ``ls``, ``cat`` and ``verify``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from xetfs import settings
from xetfs.objects import HEADERS_ENV, TOKEN_ENV
from xetfs.stats import RemoteCounters
from xetfs.store import Store


def add_remote_args(p: argparse.ArgumentParser, *, io_timeout: bool = True) -> None:
    from xetfs.cli import parse_size

    p.add_argument("--header", dest="headers", action="append", default=[], metavar="'NAME: VALUE'",
                   help=f"extra HTTP header for a remote store (also from ${HEADERS_ENV}, one per line; "
                        f"a bearer token from ${TOKEN_ENV})")  # fmt: skip
    p.add_argument("--cache-dir", type=Path, default=None,
                   help="shared on-disk cache of remote stores (default $XDG_CACHE_HOME/xetfs)")  # fmt: skip
    p.add_argument("--disk-cache-size", type=parse_size, default=settings.DISK_CACHE_SIZE,
                   help="bound of the on-disk cache, e.g. 10G; 0 turns it off "
                        f"(default {size_text(settings.DISK_CACHE_SIZE)})")  # fmt: skip
    if io_timeout:
        p.add_argument("--io-timeout", type=float, default=settings.IO_TIMEOUT, metavar="SECONDS",
                       help=f"a remote read that takes longer fails (default {settings.IO_TIMEOUT:g})")  # fmt: skip


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


def size_text(n: int) -> str:
    """``n`` bytes as a size the options take: ``512M``, ``10G``, ``1M`` (the largest unit it is a whole number of)."""
    for unit, scale in (("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n and n % scale == 0:
            return f"{n // scale}{unit}"
    return str(n)
