"""Command-line arguments shared by the sub-commands: sizes, usage errors, and the options of remote stores
(``mount``, ``ls``, ``cat``, ``verify``, ``serve``)."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from pathlib import Path

from xetfs.base import settings
from xetfs.base.stats import RemoteCounters
from xetfs.storage.objects import HEADERS_ENV, TOKEN_ENV
from xetfs.storage.store import Store


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


def seconds(text: str) -> float:
    """A time in seconds, more than 0 (``--io-timeout``)."""
    return _seconds(text, "more than 0", lambda value: value > 0)


def interval(text: str) -> float:
    """A time in seconds, 0 or more (``--refresh-every``: 0 is never)."""
    return _seconds(text, "0 or more", lambda value: value >= 0)


def _seconds(text: str, usable: str, ok: Callable[[float], bool]) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not math.isfinite(value) or not ok(value):
        raise argparse.ArgumentTypeError(f"not a usable time: {text!r} (seconds, {usable})")
    return value


def whole(low: int, high: int) -> Callable[[str], int]:
    """An argument type: a whole number from ``low`` to ``high``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is out of range ({low} to {high})")
        return value

    return parse


def up_to(most: int, least: int = 0) -> Callable[[str], int]:
    """An argument type: a size (``parse_size``) of at most ``most`` bytes, and at least ``least``."""

    def parse(text: str) -> int:
        value = parse_size(text)
        if value > most:
            raise argparse.ArgumentTypeError(f"{text} is more than {size_text(most)}")
        if value < least:
            raise argparse.ArgumentTypeError(f"{text} is less than {size_text(least)}")
        return value

    return parse


def add_credentials_arg(p: argparse.ArgumentParser) -> None:
    """``--credentials FILE``, which ``cli.main`` loads into the environment before the command runs."""
    p.add_argument("--credentials", type=Path, metavar="FILE",
                   help="environment variables for remote stores and buckets (AWS_ACCESS_KEY_ID=..., one per "
                        "line) from FILE, as for mounts from /etc/fstab; refused if others may read it")  # fmt: skip


def add_remote_args(p: argparse.ArgumentParser, *, io_timeout: bool = True) -> None:
    add_credentials_arg(p)
    p.add_argument("--header", dest="headers", action="append", default=[], metavar="'NAME: VALUE'",
                   help=f"extra HTTP header for a remote store (also from ${HEADERS_ENV}, one per line; "
                        f"a bearer token from ${TOKEN_ENV})")  # fmt: skip
    p.add_argument("--cache-dir", type=Path, default=None,
                   help="shared on-disk cache of remote stores (default $XDG_CACHE_HOME/xetfs)")  # fmt: skip
    p.add_argument("--disk-cache-size", type=parse_size, default=settings.DISK_CACHE_SIZE,
                   help="bound of the on-disk cache, e.g. 10G; 0 turns it off "
                        f"(default {size_text(settings.DISK_CACHE_SIZE)})")  # fmt: skip
    if io_timeout:
        p.add_argument("--io-timeout", type=seconds, default=settings.IO_TIMEOUT, metavar="SECONDS",
                       help=f"a remote read that takes longer fails (default {settings.IO_TIMEOUT:g})")  # fmt: skip


def open_location(args: argparse.Namespace, counters: RemoteCounters | None = None, *, note: bool = True) -> Store:
    """The store named by ``args.store``: a directory, or a URL opened with the remote options.

    Says on stderr (with ``note``) where what it reads of a remote store is cached, when it is.
    """
    from xetfs.storage.remote import open_store

    store = open_store(args.store, io_timeout=float(args.io_timeout), headers=args.headers, cache_dir=args.cache_dir,
                       disk_cache_size=args.disk_cache_size, counters=counters)  # fmt: skip
    if store.chunks is not None and note:
        print(f"xetfs: note: keeping what is read of {store.location} in the disk cache {store.chunks.disk.directory} "
              "(--disk-cache-size 0 to keep nothing)", file=sys.stderr)  # fmt: skip
    return store


def size_text(n: int) -> str:
    """``n`` bytes as a size the options take: ``512M``, ``10G``, ``1M`` (the largest unit it is a whole number of)."""
    for unit, scale in (("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n and n % scale == 0:
            return f"{n // scale}{unit}"
    return str(n)
