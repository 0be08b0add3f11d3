"""Command-line options for remote stores, shared by ``mount``, ``ls``, ``cat`` and ``verify``."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from xetfs.diskcache import DEFAULT_SIZE, DiskCache, default_dir
from xetfs.objects import HEADERS_ENV, TOKEN_ENV, RemoteOptions, is_url
from xetfs.stats import RemoteCounters
from xetfs.store import StoreLike


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


def disk_cache(args: argparse.Namespace, counters: RemoteCounters | None = None) -> DiskCache | None:
    if not args.disk_cache_size:
        return None
    return DiskCache((args.cache_dir or default_dir()).absolute(), args.disk_cache_size, counters)


def open_location(args: argparse.Namespace, counters: RemoteCounters | None = None) -> StoreLike:
    """The store named by ``args.store``: a directory, or a URL opened with the remote options."""
    from xetfs.remote import open_store

    if not is_url(args.store):
        return open_store(args.store)
    options = RemoteOptions.for_timeout(float(args.io_timeout), args.headers)
    return open_store(args.store, options, cache=disk_cache(args, counters), counters=counters)


def headers_env(args: argparse.Namespace) -> dict[str, str]:
    """Environment for a child process that must send ``--header`` values (never in its argv)."""
    lines = [*args.headers, *os.environ.get(HEADERS_ENV, "").splitlines()]
    return {HEADERS_ENV: "\n".join(line for line in lines if line.strip())} if lines else {}
