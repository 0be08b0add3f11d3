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

from xetfs.base import hashes, settings
from xetfs.fuse.fs import XetFS
from xetfs.fuse.launch import MountConfig
from xetfs.fuse.mount import build_fs
from xetfs.names.tree import BY_HASH_INODE
from xetfs.read import runs as runs_module
from xetfs.read.runs import Run, RunStore
from xetfs.storage.index import FileEntry

pytestmark = pytest.mark.integration

MiB = 1024 * 1024
CACHE = 8 * MiB  # prefetch windows of a quarter of it: 2 MiB
FILES = 32
FILE_SIZE = 4 * MiB
BLOCK = 128 * 1024


async def read_from_start(fs: XetFS, file_hash: bytes, size: int) -> bytes:
    """The first ``size`` bytes of a file, read as a sequential reader does, ``BLOCK`` at a time, with a
    checkpoint after each read so that prefetch tasks and other readers run."""
    attrs = await fs.lookup(BY_HASH_INODE, hashes.to_hex(file_hash).encode())
    handle = await fs.open(attrs.st_ino, os.O_RDONLY, None)
    got = bytearray()
    while len(got) < size and (data := await fs.read(handle.fh, len(got), min(BLOCK, size - len(got)))):
        got += data
        await trio.sleep(0)
    await fs.release(handle.fh)
    return bytes(got)


def test_prefetch_in_flight_is_bounded_over_all_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(5)
    b = StoreBuilder(tmp_path)
    contents = {}
    for _ in range(FILES):
        data = rng.randbytes(FILE_SIZE)
        contents[b.add_file(data, chunk_size=64 * 1024)] = data
    b.finish()
    monkeypatch.setattr(runs_module, "MIN_CACHE_FOR_PREFETCH", CACHE)
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
        assert await read_from_start(fs, file_hash, FILE_SIZE) == contents[file_hash]

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
    # Beyond the cache: the windows being decoded (four windows' worth, plus the one that started last)
    # and a little for the reads in progress.  About 12 MiB; without the bound over all files, 24-30.
    assert peak[0] <= CACHE + 5 * window + 2 * MiB, f"{peak[0] / MiB:.1f} MiB held at the peak"


def test_a_file_whose_prefetch_stalls_leaves_room_for_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store read that hangs (until --io-timeout) holds both of a file's prefetch tasks: other files
    still get prefetch."""
    rng = random.Random(6)
    b = StoreBuilder(tmp_path)
    stuck, other = b.add_file(rng.randbytes(8 * MiB), chunk_size=64 * 1024), b.add_file(rng.randbytes(4 * MiB))
    b.finish()
    cache = 4 * MiB
    monkeypatch.setattr(runs_module, "MIN_CACHE_FOR_PREFETCH", cache)
    fs = build_fs(MountConfig(store=tmp_path, mountpoint=Path("/nonexistent"), cache_size=cache, workers=0))
    assert fs.options.prefetch_max == 1 * MiB
    prefetch = fs.reader.prefetch
    asked: list[tuple[bytes, int]] = []

    async def stalling(entry: FileEntry, offset: int, size: int) -> None:
        asked.append((entry.file_hash, size))
        if entry.file_hash == stuck and offset >= 2 * MiB:
            await trio.sleep_forever()
        await prefetch(entry, offset, size)

    monkeypatch.setattr(fs.reader, "prefetch", stalling)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            fs.start_background(nursery)
            await read_from_start(fs, stuck, 6 * MiB)
            stalled = [size for file_hash, size in asked[-settings.PREFETCH_TASKS :] if file_hash == stuck]
            assert len(stalled) == settings.PREFETCH_TASKS  # both stuck
            assert fs.sessions.prefetch_bytes == sum(stalled)
            await read_from_start(fs, other, 4 * MiB)
            nursery.cancel_scope.cancel()

    try:
        trio.run(main)
    finally:
        fs.reader.close()
    assert any(file_hash == other for file_hash, _ in asked)
