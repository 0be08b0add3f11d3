#!/usr/bin/env python3
"""Drive xetfs' read path the way the kernel does, without FUSE, and report its cost.

    .venv/bin/python scripts/profile_read.py STORE FILE_HASH [--workers N] [--block 1M] [--cprofile 30]

Builds the same filesystem object ``xetfs mount`` serves (index, cache,
decode workers) and reads one file from start to end in ``--block`` reads
through ``XetFS.open``/``XetFS.read``, so sequential detection, prefetch and
drop-behind run as under a mount.  With ``--random``, every block of the file
once in a random order (as fio's ``randread`` does), twice: a cold pass, then
a cached one.  Prints the throughput, the time per read and the CPU time of
this process (the daemon's share) and of the decode workers; with
``--cprofile N`` also the N functions with the most own time in the daemon
(of the last pass).

What it leaves out is the kernel's side: the copy of every reply into the
page cache and the reader's own copy.  Use it to see where the daemon's
Python time goes; use ``scripts/bench.py`` for how fast a mount is.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import random
import sys
import time
from pathlib import Path

import pyfuse3
import trio

from xetfs.base.errors import XetfsError
from xetfs.base.hashes import is_hex
from xetfs.fuse.launch import MountConfig
from xetfs.fuse.mount import build_fs
from xetfs.names.tree import BY_HASH_INODE

UNITS = {"K": 1024, "M": 1024**2}


def parse_block(text: str) -> int:
    unit = UNITS.get(text[-1:].upper(), 1)
    return int(text[:-1] if unit > 1 else text) * unit


def page_in(store: Path) -> None:
    """Read every store file once, as the benchmark does: xorbs come from the page cache."""
    for path in store.rglob("*"):
        if path.is_file():
            with path.open("rb") as f:
                while f.read(1 << 24):
                    pass


def children_cpu() -> float:
    """CPU seconds used so far by this process's children (the decode workers)."""
    ticks = 0
    for children in Path("/proc/self/task").glob("*/children"):
        for pid in children.read_text().split():
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")


async def read_all(args: argparse.Namespace) -> None:
    fs = build_fs(MountConfig(store=args.store, mountpoint=Path("/nonexistent"), workers=args.workers))
    profile = cProfile.Profile() if args.cprofile else None
    try:
        async with trio.open_nursery() as nursery:
            fs.start_background(nursery)
            fs.reader.start(nursery)
            await fs.reader.wait_for_workers()
            try:
                attrs = await fs.lookup(BY_HASH_INODE, args.file_hash.lower().encode())
            except pyfuse3.FUSEError:
                raise SystemExit(f"no file with hash {args.file_hash} in {args.store}") from None
            handle = await fs.open(attrs.st_ino, os.O_RDONLY, None)
            if args.random:
                offsets = list(range(0, attrs.st_size, args.block))
                random.Random(args.seed).shuffle(offsets)
                passes: list[tuple[str, list[int] | None]] = [("cold", offsets), ("cached", offsets)]
            else:
                passes = [("sequential", None)]
            for name, order in passes:
                if profile:
                    profile.clear()
                wall, cpu, workers = time.perf_counter(), time.process_time(), children_cpu()
                if profile:
                    profile.enable()
                total = reads = 0
                if order is None:
                    while data := await fs.read(handle.fh, total, args.block):
                        total += len(data)
                        reads += 1
                else:
                    for offset in order:
                        total += len(await fs.read(handle.fh, offset, args.block))
                    reads = len(order)
                if profile:
                    profile.disable()
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                workers = children_cpu() - workers
                gib = total / 2**30
                print(
                    f"{name}: {reads} reads of {args.block} bytes, {total / wall / 1e9:.2f} GB/s ({wall:.3f} s, "
                    f"{wall / reads * 1e6:.1f} us a read); CPU per GiB: daemon {cpu / gib:.3f} s, "
                    f"decode workers {workers / gib:.3f} s"
                )
            nursery.cancel_scope.cancel()
    finally:
        fs.reader.close()
    if profile:
        pstats.Stats(profile).sort_stats("tottime").print_stats(args.cprofile)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("store", type=Path)
    p.add_argument("file_hash", help="the file's xet hash (as under .xetfs/by-hash)")
    p.add_argument("--workers", type=int, help="decode worker processes (default: as xetfs mount; 0: none)")
    p.add_argument("--block", type=parse_block, default=1024**2, help="bytes per read (default 1M, as the kernel asks)")
    p.add_argument("--random", action="store_true", help="every block once in a random order, cold then cached")
    p.add_argument("--seed", type=int, default=1, help="seed of the random order")
    p.add_argument("--cprofile", type=int, default=0, metavar="N", help="print the N costliest functions")
    args = p.parse_args()
    if not is_hex(args.file_hash):
        p.error("FILE_HASH must be 64 hex digits")
    page_in(args.store)
    try:
        trio.run(read_all, args)
    except XetfsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
