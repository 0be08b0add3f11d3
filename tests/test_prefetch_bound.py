"""Prefetch over many files at once stays within a bound (``XetFS.read`` driven directly, no FUSE).

Each file may have two prefetch windows decoding; over all files, a new
window starts only while those being decoded add up to less than two
windows' worth.  So what prefetch pins beyond ``--cache-size`` does not grow
with the number of files read at once.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
import trio
from helpers.writer import StoreBuilder

from xetfs import fs as fs_module
from xetfs import hashes
from xetfs.mount import MountConfig, build_fs
from xetfs.runs import Run, RunStore
from xetfs.tree import BY_HASH_INODE

MiB = 1024 * 1024
CACHE = 8 * MiB  # prefetch windows of a quarter of it: 2 MiB
FILES = 24
FILE_SIZE = 4 * MiB
BLOCK = 128 * 1024


def test_prefetch_in_flight_is_bounded_over_all_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(5)
    b = StoreBuilder(tmp_path)
    contents = {}
    for _ in range(FILES):
        data = rng.randbytes(FILE_SIZE)
        contents[b.add_file(data, chunk_size=64 * 1024)] = data
    b.finish()
    monkeypatch.setattr(fs_module, "MIN_CACHE_FOR_PREFETCH", CACHE)
    peak = [0]
    hold = RunStore._hold

    def tracking_hold(self: RunStore, run: Run) -> None:
        hold(self, run)
        peak[0] = max(peak[0], self.statistics().bytes)

    monkeypatch.setattr(RunStore, "_hold", tracking_hold)
    # Store reads in threads (as on a network filesystem): loads of many windows overlap.
    fs = build_fs(MountConfig(store=tmp_path, mountpoint=Path("/nonexistent"), cache_size=CACHE, workers=0,
                              io_mode="thread"))  # fmt: skip
    window = fs.options.prefetch_max
    assert window == 2 * MiB

    async def read_file(file_hash: bytes) -> None:
        attrs = await fs.lookup(BY_HASH_INODE, hashes.to_hex(file_hash).encode())
        handle = await fs.open(attrs.st_ino, os.O_RDONLY, None)
        got = bytearray()
        while data := await fs.read(handle.fh, len(got), BLOCK):
            got += data
        await fs.release(handle.fh)
        assert bytes(got) == contents[file_hash]

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            fs.start_background(nursery)
            async with trio.open_nursery() as readers:
                for file_hash in contents:
                    readers.start_soon(read_file, file_hash)
            nursery.cancel_scope.cancel()

    try:
        trio.run(main)
    finally:
        fs.reader.close()
    prefetched = fs.reader.statistics().prefetch.chunks
    assert prefetched > 0  # prefetch did run
    # Beyond the cache: the windows being decoded (two windows' worth, plus the one that started last)
    # and a little for the reads in progress.  Without the bound over all files, 20-30 MiB.
    assert peak[0] <= CACHE + 3 * window + 2 * MiB, f"{peak[0] / MiB:.1f} MiB held at the peak"
