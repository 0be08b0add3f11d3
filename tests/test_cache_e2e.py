"""The store of decoded runs end to end: real mounts of hf_xet stores, judged by ``.xetfs/stats``.

Most tests mount with ``--direct-io``, so each ``pread`` reaches the daemon
(the kernel page cache never answers a re-read), and assert on the
difference of the counters before and after each step.  Expected numbers
come from the store itself, through the oracle's own reader of shards and
xorbs (``oracle.file_chunks``): which ``(xorb, chunk)`` pairs a byte range
touches, and how big each decoded chunk is.

Counting rules used throughout (xetfs/read/reader.py, xetfs/read/runs.py):

* a FUSE read request looks up every chunk under each term slice it covers:
  one lookup per overlapping ``ChunkLoc``, each exactly one hit or miss;
* every miss is decoded, and so is every chunk prefetch loads (counted in
  ``prefetch.chunks``, not as a lookup), so with a cache big enough for the
  data, decodes == distinct chunks touched;
* a ``pread`` of at most 64 KiB (or a single byte) is one FUSE request with
  ``--direct-io``; the tests check ``reads.requests`` before relying on it.

Exact counts use ``--no-prefetch``; the prefetch tests wait until the
counters settle before reading them.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import random
import re
import shutil
import threading
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from helpers import oracle
from helpers.amplification import loaded
from helpers.mounting import Mount, memory, mounted, wait_until
from helpers.oracle import ChunkLoc, CliRunner, OracleFile, OracleStore

pytestmark = pytest.mark.fuse

MiB = 1024 * 1024
SMALL_READ = 64 * 1024  # one FUSE request per pread with --direct-io
SETTLE_DEADLINE = 10.0
RSS_OVERHEAD = 100 * MiB

Pair = tuple[str, int]  # (xorb hex, chunk index)

# -- the store ------------------------------------------------------------------------

BASE_SIZE = 20_000_000
ORIG_SIZE = 6_000_000


def _edited(orig: bytes) -> bytes:
    """A small edit of ``orig``: 100 bytes overwritten at 1.5 MB, 5000 inserted at 4 MB."""
    out = bytearray(orig)
    out[1_500_000:1_500_100] = oracle.random_bytes(100, 31)
    return bytes(out[:4_000_000]) + oracle.random_bytes(5_000, 32) + bytes(out[4_000_000:])


@pytest.fixture(scope="module")
def cache_store(tmp_path_factory: pytest.TempPathFactory) -> OracleStore:
    """``base.bin`` (20 MB random), ``orig.bin`` (6 MB random) and, in a second upload
    call (so it is deduplicated against the first), ``edited.bin``: a small edit of ``orig.bin``."""
    orig = oracle.random_bytes(ORIG_SIZE, 30)
    files = {"base.bin": oracle.random_bytes(BASE_SIZE, 29), "orig.bin": orig, "edited.bin": _edited(orig)}
    return oracle.make_store(tmp_path_factory.mktemp("cache-e2e"), files, [["base.bin", "orig.bin"], ["edited.bin"]])


# -- helpers --------------------------------------------------------------------------


def delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, dict[str, int]]:
    """``after - before`` for every counter group (gauges too: bytes, entries)."""
    return {
        group: {k: after[group][k] - v for k, v in values.items()}
        for group, values in before.items()
        if isinstance(values, dict)
    }


@contextmanager
def step(mount: Mount) -> Iterator[dict[str, Any]]:
    """Counters before and after the block: ``d["delta"]`` and ``d["after"]`` are filled on exit."""
    out: dict[str, Any] = {"before": mount.stats()}
    yield out
    out["after"] = mount.stats()
    out["delta"] = delta(out["before"], out["after"])
    check_bounds(out["after"])


def check_bounds(s: dict[str, Any]) -> None:
    """Invariants that hold at every moment."""
    c = s["cache"]
    assert c["bytes"] <= c["capacity_bytes"] or c["capacity_bytes"] == 0, c
    assert c["bytes"] >= 0 and c["runs"] >= 0 and c["chunks"] >= c["runs"], c
    assert 0 <= c["shared_bytes"] <= c["bytes"], c
    if c["capacity_bytes"] == 0:
        assert (c["bytes"], c["runs"]) == (0, 0), c


def settled(mount: Mount) -> dict[str, Any]:
    """The counters once background prefetch is done (polled, with a deadline).

    Prefetch counts its chunks when a load ends and its decodes when the
    worker is done, so "settled" is: no load in flight (a load's runs stay
    pinned, and may hold the cache over its bound, until every load its
    request waits for has ended), every miss and every prefetched chunk
    decoded, and nothing changed since the previous poll.
    """
    keys = ("cache", "decode", "prefetch", "store")
    last: list[dict[str, Any]] = [mount.stats()]

    def quiet() -> bool:
        now = mount.stats()
        same = all(now[k] == last[0][k] for k in keys)
        last[0] = now
        return same and loaded(now) == now["decode"]["chunks"] and now["cache"]["loading"] == 0

    wait_until(quiet, SETTLE_DEADLINE, "the counters to settle", mount.proc, mount.log_path)
    return last[0]


def chunks_of(store: OracleStore, f: OracleFile) -> list[ChunkLoc]:
    return oracle.file_chunks(store, f.hash)


def overlapping(chunks: Sequence[ChunkLoc], offset: int, length: int) -> list[ChunkLoc]:
    end = offset + length
    return [c for c in chunks if c.start < end and c.end > offset]


def pairs(chunks: Iterable[ChunkLoc]) -> set[Pair]:
    return {(c.xorb, c.chunk) for c in chunks}


def lookups(chunks: Sequence[ChunkLoc], reads: Iterable[tuple[int, int]]) -> int:
    """Cache lookups made by these reads, one FUSE request each."""
    return sum(len(overlapping(chunks, off, n)) for off, n in reads)


def touched(chunks: Sequence[ChunkLoc], reads: Iterable[tuple[int, int]]) -> set[Pair]:
    return {p for off, n in reads for p in pairs(overlapping(chunks, off, n))}


def decoded_size(chunks: Iterable[ChunkLoc], wanted: set[Pair]) -> int:
    sizes = {(c.xorb, c.chunk): c.end - c.start for c in chunks}
    return sum(sizes[p] for p in wanted)


def spans(start: int, end: int, size: int) -> list[tuple[int, int]]:
    return [(off, min(size, end - off)) for off in range(start, end, size)]


def pread_all(path: Path, reads: Sequence[tuple[int, int]], expected: bytes) -> None:
    """``pread`` each ``(offset, length)`` through one handle and compare with the original bytes."""
    fd = os.open(path, os.O_RDONLY)
    try:
        for off, n in reads:
            got = os.pread(fd, n, off)
            assert got == expected[off : off + n], f"wrong bytes at [{off}, {off + n})"
    finally:
        os.close(fd)


def stream_sha256(path: Path, block: int = MiB) -> str:
    h = hashlib.sha256()
    buf = bytearray(block)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            h.update(memoryview(buf)[:n])
    return h.hexdigest()


# -- hits and misses ------------------------------------------------------------------


def test_first_read_misses_second_read_hits(cache_store: OracleStore) -> None:
    f = cache_store["base.bin"]
    data = f.read()
    chunks = chunks_of(cache_store, f)
    reads = spans(1_000_000, 3_500_000, SMALL_READ)
    want = touched(chunks, reads)
    n_lookups = lookups(chunks, reads)
    assert n_lookups > len(want) > 10  # some chunks span two requests: their second lookup is a hit

    with mounted(cache_store.path, "--direct-io", "--no-prefetch", "--cache-size", "64M") as m:
        path = m / f.hash
        with step(m) as first:
            pread_all(path, reads, data)
        d = first["delta"]
        assert d["reads"] == {"requests": len(reads), "bytes": sum(n for _, n in reads)}
        assert d["cache"]["misses"] == len(want)
        assert d["decode"]["chunks"] == d["cache"]["misses"]
        assert d["decode"]["bytes"] == decoded_size(chunks, want)
        assert d["cache"]["hits"] + d["cache"]["misses"] == n_lookups
        assert d["cache"]["evictions"] == 0
        assert first["after"]["cache"]["chunks"] == len(want)
        assert first["after"]["cache"]["bytes"] == decoded_size(chunks, want)
        assert d["store"]["reads"] >= 1
        assert d["prefetch"] == {"requests": 0, "chunks": 0, "hits": 0}

        with step(m) as second:
            pread_all(path, reads, data)
        d = second["delta"]
        assert d["cache"]["hits"] == n_lookups
        assert d["cache"]["misses"] == 0
        assert (d["decode"]["chunks"], d["decode"]["bytes"]) == (0, 0)
        assert d["store"]["reads"] == 0 and d["store"]["bytes"] == 0
        assert second["after"]["cache"]["chunks"] == len(want)
        assert second["after"]["errors"] == first["before"]["errors"]


def test_first_read_with_prefetch_decodes_each_miss_once(cache_store: OracleStore) -> None:
    """With prefetch on, each chunk is decoded once, by a read's miss or by prefetch; then a re-read is all hits."""
    f = cache_store["base.bin"]
    n_chunks = len(pairs(chunks_of(cache_store, f)))
    with mounted(cache_store.path, "--direct-io", "--cache-size", "128M") as m:
        before = m.stats()
        assert stream_sha256(m / f.hash) == f.sha256
        after = settled(m)
        d = delta(before, after)
        assert d["cache"]["misses"] + d["prefetch"]["chunks"] == d["decode"]["chunks"] == n_chunks
        assert d["decode"]["bytes"] == f.size

        with step(m) as again:
            assert stream_sha256(m / f.hash) == f.sha256
        d = again["delta"]
        assert d["cache"]["misses"] == 0 and d["decode"]["chunks"] == 0
        assert d["cache"]["hits"] >= n_chunks


# -- deduplication --------------------------------------------------------------------

DEDUP_CASES = [
    # (store fixture, files read first, file read last)
    ("cache_store", ["orig.bin"], "edited.bin"),
    ("multi_store", ["a.bin"], "b.bin"),
    ("multi_store", ["a.bin", "b.bin"], "d.bin"),  # d also reuses chunks of c.txt, which is never read
]


@pytest.mark.parametrize(("fixture", "first", "last"), DEDUP_CASES, ids=[c[2] for c in DEDUP_CASES])
def test_shared_chunks_are_decoded_once(
    fixture: str, first: list[str], last: str, request: pytest.FixtureRequest
) -> None:
    store: OracleStore = request.getfixturevalue(fixture)
    seen: set[Pair] = set()
    for name in first:
        seen |= pairs(chunks_of(store, store[name]))
    target = store[last]
    target_pairs = pairs(chunks_of(store, target))
    new = target_pairs - seen
    # A real test: most of the file is shared, some of it is not.
    assert 0 < len(new) < len(target_pairs) / 2, (len(new), len(target_pairs))

    with mounted(store.path, "--direct-io", "--no-prefetch") as m:
        for name in first:
            assert stream_sha256(m / store[name].hash) == store[name].sha256
        with step(m) as s:
            assert stream_sha256(m / target.hash) == target.sha256
        d = s["delta"]
        assert d["decode"]["chunks"] == len(new)
        assert d["cache"]["misses"] == len(new)
        assert d["decode"]["bytes"] == decoded_size(chunks_of(store, target), new)
        assert d["cache"]["hits"] >= len(target_pairs) - len(new)


# -- eviction -------------------------------------------------------------------------


def test_eviction_is_lru_and_bounded(cache_store: OracleStore) -> None:
    f = cache_store["base.bin"]
    data = f.read()
    chunks = chunks_of(cache_store, f)
    capacity = 4 * MiB
    stream = spans(0, f.size, 256 * 1024)

    with mounted(cache_store.path, "--direct-io", "--no-prefetch", "--cache-size", "4M") as m:
        path = m / f.hash
        start = m.stats()
        assert start["cache"]["capacity_bytes"] == capacity

        # 1. Stream the file (5x the cache), checking the bound after every read.
        fd = os.open(path, os.O_RDONLY)
        try:
            for off, n in stream:
                assert os.pread(fd, n, off) == data[off : off + n]
                check_bounds(m.stats())
        finally:
            os.close(fd)
        s = m.stats()
        d = delta(start, s)
        assert d["cache"]["misses"] == d["decode"]["chunks"] == len(chunks)  # each chunk once
        assert d["cache"]["evictions"] > 0
        assert capacity - 2 * 256 * 1024 <= s["cache"]["bytes"] <= capacity  # full, give or take a run

        # 2. The cache holds the most recently read runs: the end of the file, not its start.
        last, first = chunks[-1], chunks[0]
        with step(m) as probe:
            pread_all(path, [(last.start, 1)], data)
        assert probe["delta"]["cache"]["hits"] == 1
        assert probe["delta"]["cache"]["misses"] == probe["delta"]["decode"]["chunks"] == 0
        with step(m) as probe:
            pread_all(path, [(first.start, 1)], data)
        assert probe["delta"]["cache"]["misses"] == probe["delta"]["decode"]["chunks"] == 1

        # 3. A range touched often survives a stream through the rest of the file: chunk 0 was
        # just loaded (probe above); re-reading it after every step keeps it the most recently
        # used, so it is never evicted, although it is soon the oldest run (FIFO would drop it).
        hot = (0, 4096)
        with step(m) as phase:
            fd = os.open(path, os.O_RDONLY)
            try:
                for off, n in spans(MiB, f.size, 256 * 1024):
                    assert os.pread(fd, n, off) == data[off : off + n]
                    with step(m) as touch:
                        assert os.pread(fd, hot[1], hot[0]) == data[: hot[1]]
                    assert touch["delta"]["cache"]["misses"] == touch["delta"]["decode"]["chunks"] == 0, off
            finally:
                os.close(fd)
        assert phase["delta"]["cache"]["evictions"] > 0
        with step(m) as probe:
            pread_all(path, [hot], data)
        assert probe["delta"]["cache"]["misses"] == probe["delta"]["decode"]["chunks"] == 0
        assert probe["delta"]["cache"]["hits"] == len(overlapping(chunks, *hot))
        # ... while the chunk at 1 MB, read once at the start of that stream, is gone.
        with step(m) as probe:
            pread_all(path, [(MiB, 1)], data)
        assert probe["delta"]["cache"]["misses"] == probe["delta"]["decode"]["chunks"] == 1


# -- no cache -------------------------------------------------------------------------


def test_cache_size_zero_decodes_every_read(cache_store: OracleStore) -> None:
    f = cache_store["base.bin"]
    data = f.read()
    chunks = chunks_of(cache_store, f)
    passes = [
        spans(2_000_000, 4_000_000, SMALL_READ),
        spans(2_000_000, 4_000_000, SMALL_READ),  # the same again: nothing was kept
        [(off, 1) for off in range(2_000_000, 2_300_000, 10_000)],  # many reads of few chunks
    ]
    with mounted(cache_store.path, "--direct-io", "--cache-size", "0") as m:
        assert m.stats()["cache"]["capacity_bytes"] == 0
        for reads in passes:
            expected = lookups(chunks, reads)
            with step(m) as s:
                pread_all(m / f.hash, reads, data)
            d = s["delta"]
            assert d["reads"]["requests"] == len(reads)
            assert d["decode"]["chunks"] == d["cache"]["misses"] == expected
            assert d["cache"]["hits"] == 0
            assert (s["after"]["cache"]["runs"], s["after"]["cache"]["bytes"]) == (0, 0)
        with step(m) as s:
            assert stream_sha256(m / f.hash) == f.sha256
        assert s["delta"]["decode"]["chunks"] >= len(chunks)
        assert s["delta"]["prefetch"]["chunks"] == 0
        assert (s["after"]["cache"]["runs"], s["after"]["cache"]["bytes"]) == (0, 0)


# -- concurrency ----------------------------------------------------------------------

READERS = 8


@pytest.mark.parametrize("io", ["inline", "thread"], ids=["inline-io", "threaded-io"])
def test_concurrent_readers_decode_each_chunk_once(cache_store: OracleStore, io: str) -> None:
    """Eight threads read the same 4 MB in lockstep.  With store reads in worker threads the
    daemon serves several requests at once, so lookups meet loads in flight and must join them."""
    f = cache_store["base.bin"]
    data = f.read()
    chunks = chunks_of(cache_store, f)
    reads = spans(5_000_000, 9_000_000, SMALL_READ)
    want = touched(chunks, reads)
    barrier = threading.Barrier(READERS)

    def reader(path: Path) -> bytes:
        fd = os.open(path, os.O_RDONLY)
        try:
            barrier.wait(timeout=30)
            return b"".join(os.pread(fd, n, off) for off, n in reads)
        finally:
            os.close(fd)

    with mounted(cache_store.path, "--direct-io", "--no-prefetch", "--io-mode", io) as m:
        with step(m) as s, ThreadPoolExecutor(READERS) as pool:
            results = list(pool.map(reader, [m / f.hash] * READERS))
        expected = data[5_000_000:9_000_000]
        assert all(r == expected for r in results)
        d = s["delta"]
        assert d["reads"]["requests"] == READERS * len(reads)
        assert d["decode"]["chunks"] == len(want)
        assert d["cache"]["misses"] == len(want)
        # Every lookup is one hit or one miss (a lookup that joined another's load is a hit).
        assert d["cache"]["hits"] + d["cache"]["misses"] == READERS * lookups(chunks, reads)
        assert d["cache"]["joined"] <= d["cache"]["hits"]
        if io == "thread":
            # Otherwise the single-flight path was not exercised at all (inline reads never overlap).
            assert d["cache"]["joined"] > 0, d["cache"]


# -- prefetch -------------------------------------------------------------------------


def test_sequential_read_is_served_by_prefetch(big_store: OracleStore) -> None:
    """A sequential reader (1 MiB reads) finds almost every chunk prefetched, and little is
    prefetched in vain.

    Only the first reads (before the window opens) may miss, so >= 90 % of the chunks must be
    prefetch hits (99 % is typical).  A window that comes due while the handle's previous
    prefetch is still running must be asked for later, not forgotten: forgetting it costs
    20-40 % of the hits, depending on timing.
    """
    f = big_store["big.bin"]
    n_chunks = len(pairs(chunks_of(big_store, f)))
    with mounted(big_store.path, "--direct-io", "--cache-size", "256M") as m:
        before = m.stats()
        assert stream_sha256(m / f.hash, MiB) == f.sha256
        after = settled(m)
        check_bounds(after)
        d = delta(before, after)
        p = d["prefetch"]
        assert d["decode"]["chunks"] == n_chunks  # the cache holds the whole file: each chunk once
        wasted = p["chunks"] - p["hits"]
        assert 0 <= wasted <= n_chunks // 20, p  # prefetched but never read: < 5 %
        assert p["hits"] >= 0.9 * n_chunks, f"only {p['hits']} of {n_chunks} chunks were prefetch hits: {p}"


def test_streaming_through_the_page_cache_decodes_once_in_runs(big_store: OracleStore) -> None:
    """Without --direct-io the kernel keeps what a sequential reader got (keep_cache).  Its chunks
    are decoded once, mostly by prefetch into slot-sized runs in the workers' shared memory; the file
    is the only user of its xorbs, so runs read through give their slots to the next runs, and a
    few dozen MiB of shared memory serve the whole file."""
    f = big_store["big.bin"]
    n_chunks = len(pairs(chunks_of(big_store, f)))
    with mounted(big_store.path, "--cache-size", "512M") as m:
        m.wait_for_workers()  # a read before they are up decodes in the daemon
        before = m.stats()
        assert stream_sha256(m / f.hash, MiB) == f.sha256
        after = settled(m)
        check_bounds(after)
        d = delta(before, after)
        assert d["decode"]["chunks"] == n_chunks  # nothing decoded twice
        assert d["prefetch"]["hits"] >= 0.9 * n_chunks, d["prefetch"]
        w = after["workers"]
        runs = f.size / w["slot_bytes"]
        # Runs of about a slot, and a short one where a prefetch window's last chunks do not fill one (a window
        # topped up by 8 MiB is two 4 MiB runs and a few chunks).
        assert d["decode"]["runs"] <= 1.6 * runs + 8, d["decode"]
        assert d["cache"]["evictions"] == d["cache"]["evicted_read"] > 0.5 * runs, d["cache"]
        assert (w["slots"] - w["free_slots"]) * w["slot_bytes"] <= 64 * MiB, w  # slots in use or touched
        with step(m) as again:
            assert stream_sha256(m / f.hash, MiB) == f.sha256  # the re-read comes from the page cache
        # (The kernel may reclaim a few clean pages of the file meanwhile, as it did in one run of many:
        # 25 chunks' worth. Those are read again; much more would be the page cache not kept.)
        assert again["delta"]["decode"]["chunks"] <= 0.05 * n_chunks, again["delta"]["decode"]


def test_a_bad_chunk_in_a_stream_fails_only_its_reads(big_store: OracleStore, tmp_path: Path) -> None:
    """Through the page cache, a sequential reader meets EIO at the bad chunk, with every byte
    before it right; reading on from after it works; the error is counted and names the file."""
    f = big_store["big.bin"]
    locs = chunks_of(big_store, f)
    bad = locs[len(locs) // 2]
    copy = tmp_path / "store"
    shutil.copytree(big_store.path, copy, copy_function=os.link)  # 290 MB: link, then copy the xorb we break
    xorb = copy / big_store.xorb_path(bad.xorb).relative_to(big_store.path)
    xorb.unlink()
    shutil.copyfile(big_store.xorb_path(bad.xorb), xorb)
    chunk = oracle.xorb_chunks(xorb)[bad.chunk]
    oracle.flip_byte(xorb, chunk.payload_start + 100)
    block = MiB
    with mounted(copy, "--cache-size", "512M", allow_errors=True) as m, f.path.open("rb") as src:
        m.wait_for_workers()
        with open(m / f.hash, "rb", buffering=0) as mine:
            offset = 0
            while offset + block <= bad.start:
                assert mine.read(block) == src.read(block), offset
                offset += block
            with pytest.raises(OSError) as err:  # the block holding the bad chunk (or the readahead's)
                while mine.read(block):
                    pass
            assert err.value.errno == errno.EIO
        after = (bad.end // block + 1) * block
        with open(m / f.hash, "rb", buffering=0) as mine:
            mine.seek(after)
            src.seek(after)
            while data := mine.read(block):
                assert data == src.read(block), mine.tell()
        assert m.stats()["errors"]["integrity"] >= 1
        assert f"chunk {bad.chunk}" in m.log() and f.hash in m.log()


def test_parallel_sequential_readers_over_the_cache_still_read_right(big_store: OracleStore) -> None:
    """Four sequential readers of a 144 MB file with a 64 MiB cache: their prefetch windows and
    runs compete for it, runs read through go first, and every byte is right."""
    f = big_store["big.bin"]
    quarter = f.size // 4
    with mounted(big_store.path, "--cache-size", "64M") as m, f.path.open("rb") as src:
        m.wait_for_workers()
        expected = [hashlib.sha256(src.read(quarter)).hexdigest() for _ in range(4)]

        def read_quarter(k: int) -> str:
            h = hashlib.sha256()
            with open(m / f.hash, "rb", buffering=0) as mine:
                mine.seek(k * quarter)
                left = quarter
                while left:
                    data = mine.read(min(MiB, left))
                    assert data
                    h.update(data)
                    left -= len(data)
            return h.hexdigest()

        with ThreadPoolExecutor(4) as pool:
            assert list(pool.map(read_quarter, range(4))) == expected
        peak = memory(m.proc.pid)["VmHWM"]
        assert peak <= 64 * MiB + RSS_OVERHEAD, f"VmHWM {peak / MiB:.0f} MiB"  # cache + fixed
        s = settled(m)
        check_bounds(s)
        assert s["cache"]["evicted_read"] > 0, s["cache"]


def test_direct_io_keeps_everything_in_the_cache(big_store: OracleStore) -> None:
    f = big_store["big.bin"]
    with mounted(big_store.path, "--direct-io", "--cache-size", "512M") as m:
        assert stream_sha256(m / f.hash, MiB) == f.sha256
        s = settled(m)
        assert s["cache"]["evictions"] == s["cache"]["evicted_read"] == 0  # no page cache: nothing is read through
        assert s["cache"]["bytes"] == f.size


def test_random_reads_do_not_prefetch(big_store: OracleStore) -> None:
    f = big_store["big.bin"]
    chunks = chunks_of(big_store, f)
    rng = random.Random(7)
    reads = [(rng.randrange(0, f.size - 4096), 4096) for _ in range(400)]
    with f.path.open("rb") as src:
        expected = {off: (src.seek(off), src.read(n))[1] for off, n in reads}
    with mounted(big_store.path, "--direct-io", "--cache-size", "256M") as m:
        before = m.stats()
        fd = os.open(m / f.hash, os.O_RDONLY)
        try:
            for off, n in reads:
                assert os.pread(fd, n, off) == expected[off]
        finally:
            os.close(fd)
        d = delta(before, settled(m))
        n_touched = len(touched(chunks, reads))
        assert d["prefetch"]["chunks"] <= n_touched // 20, (d["prefetch"], n_touched)
        assert d["decode"]["chunks"] <= n_touched + n_touched // 20


# -- memory ---------------------------------------------------------------------------


@pytest.mark.parametrize("cache_size", [16, 64], ids=["16M-no-prefetch", "64M-prefetch"])
def test_daemon_memory_stays_bounded(big_store: OracleStore, cache_size: int) -> None:
    """Reading 2 x 144 MB through a small cache: the daemon's RSS stays under cache + 100 MiB."""
    f = big_store["big.bin"]
    limit = cache_size * MiB + RSS_OVERHEAD
    with mounted(big_store.path, "--direct-io", "--cache-size", f"{cache_size}M") as m:
        pid = m.proc.pid
        samples = [memory(pid)]
        for _ in range(2):
            h = hashlib.sha256()
            buf = bytearray(MiB)
            with open(m / f.hash, "rb", buffering=0) as src:
                while n := src.readinto(buf):
                    h.update(memoryview(buf)[:n])
                    if src.tell() % (16 * MiB) < MiB:
                        samples.append(memory(pid))
                        assert samples[-1]["VmRSS"] <= limit, samples[-1]
            assert h.hexdigest() == f.sha256
            s = settled(m)
            check_bounds(s)
            samples.append(memory(pid))
        assert s["cache"]["evictions"] > 0
        if cache_size >= 64:  # big enough for xetfs to prefetch: the prefetch path's memory is measured too
            assert s["prefetch"]["requests"] > 0, s["prefetch"]
        peak = max(x["VmHWM"] for x in samples)
        assert peak <= limit, f"VmHWM {peak / MiB:.0f} MiB > {limit / MiB:.0f} MiB"


# -- the stats command ----------------------------------------------------------------

REQUIRED = {
    "cache": {"capacity_bytes", "bytes", "runs", "hits", "misses", "evictions"},
    "decode": {"chunks", "bytes"},
    "store": {"reads", "bytes"},
    "reads": {"requests", "bytes"},
    "prefetch": {"chunks", "hits"},
    "errors": {"integrity", "missing", "format", "io"},
    "index": {"files", "terms", "xorbs", "shards", "shards_skipped"},
}


def parse_table(text: str) -> dict[str, dict[str, str]]:
    """``xetfs stats`` output -> group -> key -> value as shown (without the human-readable size)."""
    out: dict[str, dict[str, str]] = {}
    group: dict[str, str] = {}
    for line in text.splitlines():
        if line.endswith(":") and not line.startswith(" "):
            group = out.setdefault(line[:-1], {})
        elif line.startswith("  "):
            key, value, *_human = re.split(r"\s{2,}", line.strip())
            group[key] = value
    return out


def test_stats_command_shows_required_keys(multi_store: OracleStore, cli: CliRunner) -> None:
    f = multi_store["b.bin"]
    data = f.read()
    chunks = chunks_of(multi_store, f)
    reads = spans(0, f.size, SMALL_READ)
    terms = oracle.store_terms(multi_store)
    with mounted(multi_store.path, "--direct-io", "--no-prefetch") as m:
        pread_all(m / f.hash, reads, data)
        pread_all(m / f.hash, reads[:5], data)  # some hits

        result = cli("stats", m.path, "--json")
        assert result.returncode == 0, result.stderr
        doc = json.loads(result.stdout)
        for group, keys in REQUIRED.items():
            assert keys <= set(doc[group]), (group, sorted(doc[group]))
            assert all(isinstance(doc[group][k], int) and doc[group][k] >= 0 for k in keys), doc[group]
        cache = doc["cache"]
        assert cache["hits"] + cache["misses"] == lookups(chunks, reads) + lookups(chunks, reads[:5])
        assert cache["misses"] == doc["decode"]["chunks"] == len(pairs(chunks))
        assert doc["reads"]["requests"] == len(reads) + 5
        assert all(v == 0 for v in doc["errors"].values()), doc["errors"]
        hashes = {x.hash for x in multi_store.files}
        index = {
            "files": len(hashes),
            "terms": sum(len(terms[h]) for h in hashes),
            "xorbs": len(multi_store.xorb_paths()),
            "shards": len(multi_store.shard_paths()),
            "shards_skipped": 0,
        }
        assert {k: doc["index"][k] for k in index} == index
        # The live file agrees with the command (nothing was read in between).
        live = m.stats()
        assert {g: live[g] for g in REQUIRED} == {g: doc[g] for g in REQUIRED}

        result = cli("stats", "--all", m.path)
        assert result.returncode == 0, result.stderr
        table = parse_table(result.stdout.decode())
        for group, keys in REQUIRED.items():
            for key in keys:
                assert table[group][key] == f"{doc[group][key]:,}", (group, key, table[group])
        ratio = cache["hits"] / (cache["hits"] + cache["misses"])
        assert table["cache"]["hit ratio"] == f"{ratio:.1%}"
        assert table["remote"]["wait_s"] == "0.000"  # (seconds, as floats: to the millisecond)


def test_stats_names_what_is_wrong_with_its_argument(cli: CliRunner, tmp_path: Path) -> None:
    missing = cli("stats", tmp_path / "nope")
    assert missing.returncode == 1
    assert missing.stderr == f"xetfs: error: {tmp_path / 'nope'}: no such directory\n"
    plain = cli("stats", tmp_path)
    assert plain.returncode == 1
    assert plain.stderr == f"xetfs: error: {tmp_path}: not a xetfs mount (no .xetfs/stats)\n"
