"""Bytes decoded for sequential readers (xetfs/stream.py and the reader's stream path).

A stream must give exactly the file's bytes for reads in any order and of
any size, decode each chunk once for a sequential reader, let go of what was
read, stay within its byte budget, and leave a bad chunk to the ordinary path
(which reports it) without failing its neighbours.
"""

from __future__ import annotations

import random
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from helpers.served import run_served
from helpers.writer import StoreBuilder

from xetfs import index
from xetfs.errors import IntegrityError, MissingObjectError
from xetfs.format.shard import parse_shard
from xetfs.format.xorb import chunk_specs
from xetfs.index import FileEntry
from xetfs.pool import DecodePool, SharedChunk, _Lease
from xetfs.reader import Reader
from xetfs.stats import StreamCounters
from xetfs.store import Store
from xetfs.stream import Budget, Segment, Stream

CHUNK = 1000


@pytest.fixture
def pool() -> Iterator[DecodePool]:
    p = DecodePool(2, slots_per_worker=2, slot_size=64 * 1024, held_slots=4)
    p.min_job_bytes = 0
    yield p
    p.close()


def _store(root: Path) -> tuple[Store, index.Index, dict[bytes, bytes]]:
    """Files over several xorbs of 1000-byte raw, LZ4 and BG4 chunks; one made of terms that repeat and go back."""
    rng = random.Random(11)
    b = StoreBuilder(root, max_xorb_chunks=70)
    big = rng.randbytes(90 * CHUNK) + bytes(rng.choice(b"abc") for _ in range(110 * CHUNK + 321))
    contents = {b.add_file(big, chunk_size=CHUNK, scheme=[0, 1, 2]): big}
    b.seal_xorb()
    x0, x1 = list(b.xorbs)[:2]
    pieces = [(x1, 10, 40), (x0, 5, 30), (x1, 10, 40), (x0, 60, 70), (x0, 0, 3)]
    contents[b.add_file_from_terms(pieces)] = b.content_of_terms(pieces)
    b.finish()
    store = Store.open(root)
    shards = [parse_shard(store.read_shard(f), where=f.name) for f in store.shard_files()]
    return store, index.build(shards), contents


def _entry(idx: index.Index, file_hash: bytes) -> FileEntry:
    entry = idx.get(file_hash)
    assert entry is not None
    return entry


def _streamed(pool: DecodePool, store: Store, idx: index.Index) -> tuple[Reader, Stream]:
    """A reader with workers and a 64 MiB cache, and a stream of its own."""
    reader = Reader(idx, store, pool=pool, cache_size=64 << 20)
    stream = reader.stream()
    assert stream is not None
    return reader, stream


def _read_all(reader: Reader, stream: Stream, entry: FileEntry, block: int) -> bytes:
    """A sequential reader: ``block``-sized reads, two at a time and finishing out of order (as the kernel's)."""

    async def body() -> bytes:
        await reader.wait_for_workers()
        out: dict[int, bytes] = {}

        async def one(offset: int, delay: float) -> None:
            await trio.sleep(delay)
            out[offset] = bytes(await reader.read(entry, offset, block, drop_behind=True, stream=stream))

        for first in range(0, entry.size, 2 * block):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(one, first, 0.001)  # the earlier request finishes last
                if first + block < entry.size:
                    nursery.start_soon(one, first + block, 0)
            await reader.prefetch(entry, first + 2 * block, 4 * block, stream)
        return b"".join(out[k] for k in sorted(out))

    return run_served(reader.start, body)


@pytest.mark.parametrize("block", [CHUNK * 16, 4096, 12_345, 100_000])
def test_sequential_reads_in_any_block_size_get_the_files_bytes_decoding_each_chunk_once(
    tmp_path: Path, pool: DecodePool, block: int
) -> None:
    store, idx, contents = _store(tmp_path)
    for file_hash, content in contents.items():
        reader, stream = _streamed(pool, store, idx)
        entry = _entry(idx, file_hash)
        assert _read_all(reader, stream, entry, block) == content
        s = reader.stats
        assert s.cache.misses == 0  # every byte came through the stream
        assert s.stream.chunks == s.decode.chunks == s.decode.in_workers
        chunks = sum(entry.stops[i] - entry.starts[i] for i in range(entry.num_terms))
        assert s.decode.chunks == chunks  # each term's chunks once: none twice for the same reader
        assert not stream.segments and s.stream.bytes == 0  # all read, all let go
        assert s.stream.read_chunks == chunks and s.stream.evicted == s.stream.unread == 0


def test_a_bad_chunk_fails_only_the_reads_that_need_it(tmp_path: Path, pool: DecodePool) -> None:
    store, idx, contents = _store(tmp_path)
    file_hash, content = next(iter(contents.items()))
    entry = _entry(idx, file_hash)
    xorb_hash = idx.locate(entry, 0, 1)[0].xorb_hash
    layout = store.load_layout(xorb_hash)
    path = store.xorb_path(xorb_hash)
    path.chmod(0o644)
    raw = bytearray(path.read_bytes())
    raw[layout.phys_start(20) + 20] ^= 0xFF  # chunk 20 (raw bytes): bytes [20000, 21000) of the file
    path.write_bytes(bytes(raw))
    reader, stream = _streamed(pool, store, idx)

    async def body() -> None:
        await reader.wait_for_workers()
        block = 4000
        for offset in range(0, 40_000, block):
            if offset <= 20 * CHUNK < offset + block:
                with pytest.raises(IntegrityError, match="chunk 20"):
                    await reader.read(entry, offset, block, drop_behind=True, stream=stream)
            else:
                got = await reader.read(entry, offset, block, drop_behind=True, stream=stream)
                assert bytes(got) == content[offset : offset + block]
            await reader.prefetch(entry, offset + block, 3 * block, stream)

    run_served(reader.start, body)
    assert reader.stats.errors.integrity == 1


def test_decode_whole_gives_the_run_as_one_piece_or_its_error(tmp_path: Path, pool: DecodePool) -> None:
    store, idx, contents = _store(tmp_path)
    file_hash, content = next(iter(contents.items()))
    xorb_hash = idx.locate(_entry(idx, file_hash), 0, 1)[0].xorb_hash
    layout = store.load_layout(xorb_hash)
    path = store.xorb_path(xorb_hash)
    specs = chunk_specs(layout, 3, 40, verify=True)

    async def whole() -> bytes:
        await pool.wait_ready()
        _, data = await pool.decode_whole(str(path), xorb_hash, specs)
        return bytes(data.data)

    assert run_served(pool.start, whole) == content[3 * CHUNK : 40 * CHUNK]
    path.chmod(0o644)
    raw = bytearray(path.read_bytes())
    raw[layout.phys_start(30) + 20] ^= 0xFF
    path.write_bytes(bytes(raw))
    free = len(pool._free)
    with pytest.raises(IntegrityError, match="chunk 30"):
        run_served(pool.start, whole)
    assert len(pool._free) == free  # the failed run's slot is free again


def _segment(start: int, data: bytes, budget: Budget, *, ready: bool = True) -> tuple[Segment, bytes]:
    segment = Segment(start, start + len(data), chunks=1, unread=len(data))
    budget.plan([segment])
    if ready:
        chunk = SharedChunk(memoryview(data), _Lease())
        budget.settle(segment, chunk)
        segment.done.set()
        segment._keep = chunk  # type: ignore[attr-defined]  # the budget may let go of it
    return segment, data


def test_take_joins_segments_waits_for_decoding_ones_and_lets_go_of_what_was_read() -> None:
    budget = Budget(1 << 20)
    stream = Stream(budget)
    a, da = _segment(0, b"a" * 100, budget)
    b, db = _segment(100, b"b" * 100, budget, ready=False)
    stream.add([a, b])

    async def body() -> None:
        async def finish_b() -> None:
            await trio.sleep(0.01)
            budget.settle(b, SharedChunk(memoryview(db), _Lease()))
            b.done.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(finish_b)
            got = await stream.take(150, 50)  # waits for b
            assert got is not None and bytes(got[0]) == db[50:] and got[1] == 0  # b half read
        got = await stream.take(50, 100)
        assert got is not None and bytes(got[0]) == da[50:] + db[:50]
        assert got[1] == 1 and list(stream.segments) == [a]  # b is read to its end and let go
        assert await stream.take(0, 300) is None  # past the stream's end: not all here

    trio.run(body)
    assert budget.counters.read_chunks == 1 and budget.counters.bytes == 100


def test_take_leaves_gaps_and_failed_segments_to_the_ordinary_path() -> None:
    budget = Budget(1 << 20)
    stream = Stream(budget)
    failed = Segment(300, 400, chunks=1, unread=100)
    failed.done.set()
    stream.add([_segment(0, b"a" * 100, budget)[0], _segment(200, b"c" * 100, budget)[0], failed])

    async def body() -> None:
        assert await stream.take(50, 200) is None  # bytes [100, 200) were never decoded
        assert await stream.take(250, 100) is None  # bytes [300, 400) failed
        got = await stream.take(200, 100)
        assert got is not None and bytes(got[0]) == b"c" * 100

    trio.run(body)


def test_the_budget_lets_go_of_the_oldest_segments_and_counts_why() -> None:
    counters = StreamCounters()
    budget = Budget(250, counters)
    stream = Stream(budget)
    segments = [_segment(i * 100, bytes([i]) * 100, budget)[0] for i in range(3)]
    stream.add(segments)
    assert segments[0].data is None and counters.evicted == 1  # 300 bytes > 250: the oldest went
    assert counters.bytes == 200 and counters.runs == 3
    stream.restart()  # the reader moved elsewhere: two held runs let go unread
    assert counters.unread == 2 and counters.bytes == 0 and not stream.segments
    late, _ = _segment(0, b"x" * 10, budget, ready=False)
    late.dropped = True
    budget.settle(late, SharedChunk(memoryview(b"x" * 10), _Lease()))
    assert late.data is None and counters.unread == 3  # decoded after its stream let go: not held


def test_a_stream_holds_no_shared_memory_once_let_go(tmp_path: Path, pool: DecodePool) -> None:
    store, idx, contents = _store(tmp_path)
    file_hash, content = next(iter(contents.items()))
    entry = _entry(idx, file_hash)
    reader, stream = _streamed(pool, store, idx)

    async def body() -> None:
        await reader.wait_for_workers()
        await reader.prefetch(entry, 0, 60_000, stream)
        got = await reader.read(entry, 0, 1000, drop_behind=True, stream=stream)
        assert bytes(got) == content[:1000]
        held = [weakref.ref(s.data) for s in stream.segments if s.data is not None]
        assert held and reader.stats.stream.bytes > 0
        stream.restart()  # as when the file is closed
        assert all(ref() is None for ref in held)
        assert reader.stats.stream.bytes == 0

    run_served(reader.start, body)
    assert len(pool._free) == pool._slot_count  # every slot is free again


def test_missing_parts_fall_between_segments() -> None:
    budget = Budget(1 << 20)
    stream = Stream(budget)
    stream.add([_segment(300, b"c" * 100, budget)[0]])
    stream.add([_segment(100, b"a" * 100, budget)[0]])  # added out of order: kept in file order
    assert [s.start for s in stream.segments] == [100, 300]
    assert stream.missing(50, 450) == [(50, 100), (200, 300), (400, 450)]
    assert stream.missing(120, 180) == []
    assert stream.missing(150, 350) == [(200, 300)]
    assert (stream.start, stream.end) == (100, 400)


def test_reads_near_a_stream_decode_only_their_own_chunks(tmp_path: Path, pool: DecodePool) -> None:
    """A reader that jumps about near its stream (mmap faults, say) decodes what it reads, not the bytes between."""
    store, idx, contents = _store(tmp_path)
    file_hash, content = next(iter(contents.items()))
    entry = _entry(idx, file_hash)
    reader, stream = _streamed(pool, store, idx)
    reads = [(0, 4000), (50_000, 4000), (120_000, 4000), (10_000, 4000)]

    async def body() -> None:
        await reader.wait_for_workers()
        for offset, size in reads:
            got = await reader.read(entry, offset, size, stream=stream)
            assert bytes(got) == content[offset : offset + size]

    run_served(reader.start, body)
    assert reader.stats.decode.chunks == 16  # chunks 0-3, 50-53, 120-123 and 10-13, each once
    assert reader.stats.cache.misses == 0


def test_prefetch_plans_only_what_the_budget_has_room_for(tmp_path: Path, pool: DecodePool) -> None:
    store, idx, contents = _store(tmp_path)
    file_hash, content = next(iter(contents.items()))
    entry = _entry(idx, file_hash)
    reader = Reader(idx, store, pool=pool, cache_size=64 << 20)
    reader._stream_budget = Budget(20_000, reader.stats.stream)
    stream = reader.stream()
    assert stream is not None

    async def body() -> None:
        await reader.wait_for_workers()
        await reader.prefetch(entry, 0, 150_000, stream)
        planned = sum(s.end - s.start for s in stream.segments)
        assert 20_000 <= planned < 20_000 + 16 * CHUNK  # up to the room, rounded up to whole chunks
        assert reader.stats.stream.evicted == 0
        await reader.prefetch(entry, planned, 150_000, stream)  # no room left: nothing more
        assert sum(s.end - s.start for s in stream.segments) == planned
        got = await reader.read(entry, 0, 60_000, drop_behind=True, stream=stream)  # a read plans what it needs
        assert bytes(got) == content[:60_000]

    run_served(reader.start, body)


def test_a_plan_that_fails_part_way_leaves_nothing_to_wait_for(tmp_path: Path, pool: DecodePool) -> None:
    """Runs planned before a later part of the range failed to plan (its xorb is gone) are never
    decoded; they must count as failed, or the read would wait for them forever."""
    store, idx, contents = _store(tmp_path)
    file_hash, content = next(iter(contents.items()))
    entry = _entry(idx, file_hash)
    first, second = (p.xorb_hash for p in idx.locate(entry, 0, 200 * CHUNK)[:2])
    reader, stream = _streamed(pool, store, idx)

    async def body() -> None:
        await reader.wait_for_workers()
        # Chunks 20-24 of xorb 1, not read whole: the run stays in the stream.
        got = await reader.read(entry, 20 * CHUNK + 500, 4000, stream=stream)
        assert bytes(got) == content[20 * CHUNK + 500 : 24 * CHUNK + 500]
        assert [(s.start, s.end) for s in stream.segments] == [(20 * CHUNK, 25 * CHUNK)]
        store.xorb_path(second).unlink()
        with trio.fail_after(20), pytest.raises(MissingObjectError):
            # Plans chunks [10, 20) of xorb 1, then fails on xorb 2 while planning [25, 100).
            await reader.read(entry, 10 * CHUNK, 90 * CHUNK, stream=stream)
        with trio.fail_after(20):
            got = await reader.read(entry, 10 * CHUNK, 10 * CHUNK, stream=stream)
        assert bytes(got) == content[10 * CHUNK : 20 * CHUNK]

    assert first != second
    run_served(reader.start, body)


def test_prefetch_takes_the_room_of_segments_nobody_read_for_seconds() -> None:
    now = [100.0]
    budget = Budget(250, clock=lambda: now[0])
    stream = Stream(budget)
    idle = [_segment(i * 100, bytes([i]) * 100, budget)[0] for i in range(2)]
    stream.add(idle)
    assert budget.room(50) == 50  # enough room: nobody is let go
    assert budget.room(100) == 50 and idle[0].data is not None  # held for less than IDLE: kept
    now[0] += 6
    assert budget.room(100) == 150  # the oldest idle segment made room, and no more went than needed
    assert idle[0].data is None and idle[1].data is not None and budget.counters.evicted == 1
