"""Decode worker processes (xetfs/read/pool.py, xetfs/read/decode_worker.py).

The pool must give exactly what decoding in the daemon gives (bytes and
errors, message for message), hand its slots back whatever happens to the
job's caller, and cost speed, never a read, when a worker dies.
"""

from __future__ import annotations

import os
import random
import select
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from helpers import writer
from helpers.served import run_served
from helpers.writer import StoreBuilder

from xetfs.base.errors import (
    IntegrityError,
    MissingObjectError,
    ServerUnreachableError,
    StoreTimeoutError,
    XetfsError,
    XorbFormatError,
)
from xetfs.base.settings import WORKER_RESTARTS
from xetfs.base.stats import WorkerCounters
from xetfs.format.shard import parse_shard
from xetfs.format.xorb import ChunkRun, chunk_run, decode_run
from xetfs.read.decode_worker import Job, Setup, Worker, WorkerError, encode_frame
from xetfs.read.pool import DecodePool, WorkerLost, _Pending
from xetfs.read.reader import Reader
from xetfs.read.slots import Slot, Slots
from xetfs.storage import index
from xetfs.storage.objects import RemoteOptions, scatter
from xetfs.storage.store import ChunkSource, Store

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def pool() -> Iterator[DecodePool]:
    p = DecodePool(2, slots=12, slot_size=64 * 1024)
    p.min_job_bytes = p.min_slot_run = 0
    run_served(p.start, p.wait_ready)
    assert p.usable is False  # nobody collects results outside a trio run
    yield p
    p.close()


def _store(
    root: Path, size: int = 40_000, *, xorb_footer: bool = True, schemes: tuple[int, ...] = (0, 1, 2)
) -> tuple[Store, bytes, bytes]:
    """A one-xorb store holding one file of chunks of 1000 bytes, stored raw, LZ4 and BG4 in turn."""
    rng = random.Random(7)
    content = rng.randbytes(size // 2) + bytes(rng.choice(b"xy") for _ in range(size - size // 2))
    b = StoreBuilder(root, xorb_footer=xorb_footer)
    file_hash = b.add_file(content, chunk_size=1000, scheme=list(schemes))
    b.finish()
    (xorb_hash,) = b.xorbs
    return Store.open(root), file_hash, xorb_hash


@dataclass(frozen=True)
class OneDecoded:
    """The ``Result`` of a job of one part: its chunks' sizes or errors, and the bytes read."""

    sizes: list[int | WorkerError]
    read_bytes: int


async def decode_one(pool: DecodePool, slot: Slot, path: str, xorb_hash: bytes, chunks: ChunkRun) -> OneDecoded:
    """``pool.decode`` of one run of the local xorb file at ``path`` into ``slot``."""
    done = await pool.decode(ChunkSource("", path), xorb_hash, [(slot, chunks)])
    (sizes,) = done.sizes
    return OneDecoded(sizes, done.read_bytes)


def _run(pool: DecodePool, body: Callable[[], Awaitable[Any]]) -> Any:
    return run_served(pool.start, body)


def _decode(pool: DecodePool, path: str, xorb_hash: bytes, chunks: ChunkRun) -> tuple[int, list[Any]]:
    """``pool.decode`` into a slot of its own: the bytes read, and each chunk copied out of shared memory (or its
    error); the slot is free again after."""

    async def decode() -> tuple[int, list[Any]]:
        slot = pool.slots.take(chunks.unpacked[-1] - chunks.unpacked[0])
        assert slot is not None
        try:
            done = await decode_one(pool, slot, path, xorb_hash, chunks)
            at, got = 0, list[bytes | XetfsError]()
            for size in done.sizes:
                if isinstance(size, int):
                    got.append(bytes(slot.view(at + size)[at:]))
                    at += size
                else:
                    got.append(size.error())
            return done.read_bytes, got
        finally:
            slot.release()

    result: tuple[int, list[Any]] = _run(pool, decode)
    return result


def _free_slots(pool: DecodePool) -> int:
    return pool.statistics().free_slots


def test_workers_decode_what_the_daemon_decodes(tmp_path: Path, pool: DecodePool) -> None:
    store, _, xorb_hash = _store(tmp_path)
    layout = store.load_layout(xorb_hash)
    path = str(store.xorb_path(xorb_hash))
    for start, stop in [(0, 1), (0, 40), (5, 37), (39, 40)]:
        data = store.read_xorb(xorb_hash, layout.phys_start(start), layout.phys_ends[stop - 1])
        expected = decode_run(data, xorb_hash, layout, start, stop, verify=True)
        chunks = chunk_run(layout, start, stop, verify=True)
        read_bytes, got = _decode(pool, path, xorb_hash, chunks)
        assert read_bytes == len(data)
        assert got == expected


@pytest.mark.parametrize("kind", [StoreTimeoutError, ServerUnreachableError, MissingObjectError, IntegrityError])
def test_an_error_crosses_from_a_worker_as_its_own_class(kind: type[XetfsError]) -> None:
    back = WorkerError.of(kind("fake://store: what went wrong")).error()
    assert type(back) is kind and str(back) == "fake://store: what went wrong"


def test_errors_come_back_as_the_daemon_would_raise_them(tmp_path: Path, pool: DecodePool) -> None:
    store, _, xorb_hash = _store(tmp_path)
    layout = store.load_layout(xorb_hash)
    path = store.xorb_path(xorb_hash)
    path.chmod(0o644)
    raw = bytearray(path.read_bytes())
    raw[layout.phys_start(3) + 20] ^= 0xFF  # chunk 3's payload
    path.write_bytes(bytes(raw))
    data = store.read_xorb(xorb_hash, 0, layout.phys_ends[5])
    expected = decode_run(data, xorb_hash, layout, 0, 6, verify=True)
    chunks = chunk_run(layout, 0, 6, verify=True)
    _, got = _decode(pool, str(path), xorb_hash, chunks)
    assert [type(c) for c in got] == [type(c) for c in expected]
    assert isinstance(got[3], XetfsError) and type(got[3]) is type(expected[3])
    assert str(got[3]) == str(expected[3])
    assert got[:3] == expected[:3] and got[4:] == expected[4:]

    os.truncate(path, layout.phys_ends[2])
    _, got = _decode(pool, str(path), xorb_hash, chunks)
    assert all(isinstance(c, XetfsError) for c in got)
    assert "truncated" in str(got[0]) and "reading chunks [0, 6)" in str(got[0])


@pytest.mark.parametrize("verify", [True, False], ids=["verified", "unverified"])
@pytest.mark.parametrize("damage", ["none", "payload", "scheme", "length", "truncated", "truncated payload"])
def test_raw_chunks_read_straight_into_the_slot_decode_and_fail_as_in_the_daemon(
    tmp_path: Path, pool: DecodePool, damage: str, verify: bool
) -> None:
    """Runs of raw chunks are read straight into the slot and checked there; whatever is wrong with them,
    the worker reports what decoding in the daemon reports, message for message."""
    store, _, xorb_hash = _store(tmp_path, schemes=(0,))
    layout = store.load_layout(xorb_hash)
    path = store.xorb_path(xorb_hash)
    path.chmod(0o644)
    raw = bytearray(path.read_bytes())
    header = layout.phys_start(3)  # chunk 3's header
    if damage == "payload":
        raw[header + 8 + 20] ^= 0xFF
    elif damage == "scheme":
        raw[header + 4] = 1  # says LZ4: a payload of raw bytes is no LZ4 frame
    elif damage == "length":  # a raw chunk of 999 bytes by its header (both lengths), 1000 by the footer
        raw[header : header + 8] = struct.pack("<II", 999 << 8, 999 << 8)
    elif damage == "truncated":
        del raw[layout.phys_ends[2] + 5 :]  # in chunk 3's header
    elif damage == "truncated payload":
        del raw[layout.phys_ends[3] - 5 :]  # in chunk 3's payload
    path.write_bytes(bytes(raw))
    for start, stop in [(0, 1), (0, 6), (2, 4), (2, 40)]:  # (2, 4): chunk 3 is the run's last
        data = store.read_xorb(xorb_hash, layout.phys_start(start), min(layout.phys_ends[stop - 1], len(raw)))
        chunks = chunk_run(layout, start, stop, verify=verify)
        read_bytes, got = _decode(pool, str(path), xorb_hash, chunks)
        if damage.startswith("truncated") and stop > 3:
            assert all(isinstance(c, XorbFormatError) and "truncated" in str(c) for c in got)
            continue
        expected = decode_run(data, xorb_hash, layout, start, stop, verify=verify)
        assert read_bytes == len(data)
        assert [type(c) for c in got] == [type(c) for c in expected]
        assert [str(c) if isinstance(c, XetfsError) else c for c in got] == [
            str(c) if isinstance(c, XetfsError) else c for c in expected
        ], (damage, start, stop)
        hurt = damage != "none" and (damage != "payload" or verify)  # (an unverified damaged payload goes unnoticed)
        assert any(isinstance(c, XetfsError) for c in got) == (hurt and start <= 3 < stop)


class _Fetches:
    """An object source over one xorb's bytes, for ``Worker`` alone: it counts the range reads."""

    location = "fake://store"

    def __init__(self, data: bytes, answers: int = 1 << 30) -> None:
        self.data = data
        self.answers = answers  # range reads answered; those after fail
        self.ranges: list[tuple[int, int, int]] = []  # (start, end, parts)

    def read_range_into(self, name: str, start: int, end: int, parts: Sequence[memoryview]) -> None:
        self.ranges.append((start, end, len(parts)))
        if len(self.ranges) > self.answers:
            raise ServerUnreachableError("fake://store: server unreachable")
        scatter(self.data[start:end], parts)


@pytest.mark.parametrize("verify", [True, False], ids=["verified", "unverified"])
@pytest.mark.parametrize("damage", ["none", "payload", "scheme", "length"])
@pytest.mark.parametrize("schemes", [(0,), (0, 1, 2)], ids=["raw", "mixed"])
def test_fetched_chunks_land_in_their_slots_and_fail_as_in_the_daemon(
    tmp_path: Path, damage: str, verify: bool, schemes: tuple[int, ...]
) -> None:
    """A remote job's raw chunks are fetched with their payloads straight into the slots (headers aside),
    other chunks as stored bytes; either way each slot holds what the daemon decodes, a damaged chunk
    fails with the daemon's message (its stored bytes fetched once more to say why), and only a job whose
    chunks all verify is kept in the disk cache, byte for byte as stored."""
    store, _, xorb_hash = _store(tmp_path, schemes=schemes)
    layout = store.load_layout(xorb_hash)
    raw = bytearray(store.xorb_path(xorb_hash).read_bytes())
    header = layout.phys_start(3)  # chunk 3's header
    if damage == "payload":
        raw[header + 8 + 20] ^= 0xFF
    elif damage == "scheme" and schemes == (0,):
        raw[header + 4] = 1  # says LZ4: a payload of raw bytes is no LZ4 frame
    elif damage == "length":  # a chunk of 999 bytes by its header (both lengths), 1000 by the footer
        raw[header : header + 8] = struct.pack("<II", 999 << 8, 999 << 8)
    slot_size = 8000
    worker = Worker(memoryview(bytearray(slot_size * 2)), slot_size, Setup(None, str(tmp_path)))
    source = worker.source = _Fetches(bytes(raw))  # type: ignore[assignment]
    entry = tmp_path / "entry"
    parts = ((0, chunk_run(layout, 0, 6, verify=verify)), (1, chunk_run(layout, 6, 12, verify=verify)))
    job = Job(1, ChunkSource("xorb", cache_to=str(entry)), xorb_hash, parts)
    result = worker.decode(job, worker.fetch(job))
    stored = bytes(raw[layout.phys_start(0) : layout.phys_ends[11]])
    expected = [decode_run(stored, xorb_hash, layout, 0, 6, verify=verify),
                decode_run(stored[layout.phys_start(6) :], xorb_hash, layout, 6, 12, verify=verify)]  # fmt: skip
    got = [[s.error() if isinstance(s, WorkerError) else s for s in sizes] for sizes in result.sizes]
    assert [[str(c) if isinstance(c, XetfsError) else len(c) for c in run] for run in expected] == [
        [str(c) if isinstance(c, XetfsError) else c for c in run] for run in got
    ]
    hurt = damage != "none" and (damage != "payload" or verify) and (damage != "scheme" or schemes == (0,))
    for (slot, _), run in zip(parts, expected, strict=True):
        at = 0
        for chunk in run if damage == "none" else run[:3]:  # (in a damaged first run, chunk 3 on may be wrong)
            assert isinstance(chunk, bytes) and bytes(worker.shared[slot * slot_size + at :][: len(chunk)]) == chunk
            at += len(chunk)
    in_place = schemes == (0,)  # (by the footer: a header that says otherwise is found once fetched)
    assert source.ranges[0] == (layout.phys_start(0), layout.phys_ends[11], 24 if in_place else 1)
    assert len(source.ranges) == (2 if hurt and in_place else 1)
    assert result.read_bytes == len(stored)
    if hurt:
        assert result.cached == 0 and not entry.exists()
    else:
        assert result.cached == len(stored) and entry.read_bytes() == stored


def test_a_chunk_that_fails_in_place_is_an_integrity_error_even_if_it_cannot_be_fetched_again(
    tmp_path: Path,
) -> None:
    """When the fetch that would say which chunk failed fails itself, the reads get an integrity error that
    says so, not the network's error."""
    store, _, xorb_hash = _store(tmp_path, schemes=(0,))
    layout = store.load_layout(xorb_hash)
    raw = bytearray(store.xorb_path(xorb_hash).read_bytes())
    raw[layout.phys_start(3) + 8 + 20] ^= 0xFF
    worker = Worker(memoryview(bytearray(8000)), 8000, Setup(None, None))
    worker.source = _Fetches(bytes(raw), answers=1)  # type: ignore[assignment]
    job = Job(1, ChunkSource("xorb"), xorb_hash, ((0, chunk_run(layout, 0, 6, verify=True)),))
    (sizes,) = worker.decode(job, worker.fetch(job)).sizes
    errors = [s.error() for s in sizes if isinstance(s, WorkerError)]
    assert len(errors) == 6 and all(isinstance(e, IntegrityError) for e in errors)
    assert "a chunk failed its check, and fetching them again to say which failed too" in str(errors[0])
    assert "server unreachable" in str(errors[0]) and "chunks [0, 6)" in str(errors[0])


def test_a_fetched_run_with_a_compressed_chunk_as_long_as_its_data_is_served_but_not_kept(tmp_path: Path) -> None:
    """A run whose chunks are all as long stored as decoded, one of them LZ4 all the same, is fetched in place
    and decoded there; since its slot then no longer holds the stored bytes, nothing goes to the disk cache."""
    content = b"r" * 1000 + writer.lz4_as_long_as_its_data(1000) + bytes(range(250)) * 4
    b = StoreBuilder(tmp_path, xorb_footer=True)
    b.add_file(content, chunk_size=1000, scheme=[0, 1, 0])
    b.finish()
    store = Store.open(tmp_path)
    (xorb_hash,) = b.xorbs
    layout = store.load_layout(xorb_hash)
    run = chunk_run(layout, 0, 3, verify=True)
    assert run.stored_raw_sized()
    worker = Worker(memoryview(bytearray(4096)), 4096, Setup(None, str(tmp_path)))
    source = worker.source = _Fetches(store.xorb_path(xorb_hash).read_bytes())  # type: ignore[assignment]
    job = Job(1, ChunkSource("xorb", cache_to=str(tmp_path / "entry")), xorb_hash, ((0, run),))
    result = worker.decode(job, worker.fetch(job))
    assert result.sizes == [[1000, 1000, 1000]] and bytes(worker.shared[:3000]) == content
    assert source.ranges == [(0, layout.phys_ends[2], 6)]  # one request, in place
    assert result.cached == 0 and not (tmp_path / "entry").exists()


def test_a_cancelled_caller_does_not_lose_its_slot(tmp_path: Path, pool: DecodePool) -> None:
    """A caller that gives up while its job decodes leaves the slot to the pool, which frees it once the
    worker is done with it (never earlier: the worker may still be writing there)."""
    store, _, xorb_hash = _store(tmp_path)
    layout = store.load_layout(xorb_hash)
    path = str(store.xorb_path(xorb_hash))
    chunks = chunk_run(layout, 0, 40, verify=True)
    total = _free_slots(pool)

    async def decode_and_keep() -> None:
        slot = pool.slots.take(chunks.unpacked[-1] - chunks.unpacked[0])
        assert slot is not None
        await decode_one(pool, slot, path, xorb_hash, chunks)  # cancelled before it returns: no release here
        slot.release()

    async def body() -> None:
        for _ in range(3):
            first = pool._next_id
            async with trio.open_nursery() as nursery:
                for _ in range(pool.capacity):
                    nursery.start_soon(decode_and_keep)
                with trio.fail_after(20):
                    while pool._next_id < first + pool.capacity:  # until every job is sent
                        await trio.sleep(0)
                nursery.cancel_scope.cancel()  # the callers give up, most while their job is decoding
            with trio.fail_after(20):
                while _free_slots(pool) < total:  # every abandoned job's slot comes back
                    await trio.sleep(0.01)

    _run(pool, body)
    assert _free_slots(pool) == total


def test_a_dead_worker_costs_speed_not_reads_and_is_started_again(tmp_path: Path, pool: DecodePool) -> None:
    """Workers killed (by the out-of-memory killer, say): the jobs that meet them are decoded in the daemon,
    and the pool starts others in their place, which decode the next reads."""
    store, file_hash, _ = _store(tmp_path)
    shards = [parse_shard(store.read_shard(f), where=f.name) for f in store.shard_files()]
    idx = index.build(shards)
    entry = idx.get(file_hash)
    assert entry is not None
    expected = b"".join(bytes(c) for c in _whole_file(store, idx, file_hash))

    for worker in pool._workers:
        os.kill(worker.process.pid, signal.SIGKILL)
        worker.process.wait()

    reader = Reader(idx, store, pool=pool, cache_size=0)

    async def body() -> tuple[bytes, int, bytes]:
        first = bytes(await reader.read(entry, 0, entry.size))  # the jobs meet the dead workers
        fallbacks = reader.statistics().decode.worker_fallbacks
        with trio.fail_after(30):
            while not (pool.usable and pool.statistics().alive == 2):  # started again
                await trio.sleep(0.02)
        return first, fallbacks, bytes(await reader.read(entry, 0, entry.size))  # (nothing kept: decoded again)

    first, fallbacks, second = _run(pool, body)
    assert first == second == expected
    s = reader.statistics()
    assert fallbacks >= 1 and s.decode.in_workers > 0 and s.decode.worker_fallbacks == fallbacks
    assert (s.workers.lost, s.workers.alive, s.workers.hung) == (2, 2, 0)
    assert sorted(map(id, pool._spawned)) == sorted(map(id, pool._workers))  # (the dead ones ended, pipes closed)
    reader.runs.clear()
    assert _free_slots(pool) == pool.statistics().slots  # no slot kept by the jobs that met dead workers


def test_workers_that_keep_dying_are_not_started_again(pool: DecodePool, caplog: pytest.LogCaptureFixture) -> None:
    """Past ``WORKER_RESTARTS`` deaths within ``WORKER_RESTARTS_WINDOW``, a worker that dies stays dead (the
    daemon decodes its work): a worker that cannot run is not started over and over."""

    async def body() -> None:
        for death in range(1, WORKER_RESTARTS + 2):
            worker = pool._workers[0]
            os.kill(worker.process.pid, signal.SIGKILL)
            with trio.fail_after(30):
                # (until the new worker is in its place and ready: the dead one counts as lost first)
                while pool.statistics().lost < death or (
                    death <= WORKER_RESTARTS and (pool._workers[0] is worker or not pool._workers[0].ready)
                ):
                    await trio.sleep(0.02)

    _run(pool, body)
    s = pool.statistics()
    assert (s.lost, s.alive) == (WORKER_RESTARTS + 1, 1)  # (the other worker was not touched)
    number = pool._workers[0].number
    assert f"decode worker {number} is not started again: {WORKER_RESTARTS + 1} workers died within" in caplog.text


def _whole_file(store: Store, idx: index.Index, file_hash: bytes) -> list[bytes | memoryview]:
    entry = idx.get(file_hash)
    assert entry is not None
    reader = Reader(idx, store)
    return [trio.run(reader.read, entry, 0, entry.size)]


def test_workers_start_with_the_first_run_and_say_when_ready() -> None:
    pool = DecodePool(2)
    try:
        assert pool.statistics().alive == 0 and not pool.usable

        async def body() -> bool:
            await pool.wait_ready()
            return pool.usable

        assert run_served(pool.start, body)
        assert pool.statistics().alive == 2
        run_served(pool.start, pool.wait_ready)  # a second run: no new workers
        assert pool.statistics().alive == 2
    finally:
        pool.close()


def test_a_worker_for_a_remote_store_is_ready_with_its_http_client_loaded() -> None:
    """A worker says it is ready only once its remote source is set up, HTTP client loaded (``ssl`` with it):
    the first fetch does not wait for the import.  A worker for a local store never loads it."""

    def loaded(pool: DecodePool) -> list[bool]:
        return ["/_ssl." in Path(f"/proc/{w.process.pid}/maps").read_text() for w in pool._workers]

    async def all_ready(pool: DecodePool) -> None:
        with trio.fail_after(30):
            while not (pool._workers and all(w.ready for w in pool._workers)):
                await trio.sleep(0.01)

    remote = DecodePool(2, setup=Setup(("http://127.0.0.1:9/store", RemoteOptions()), None))
    local = DecodePool(1)
    try:
        run_served(remote.start, lambda: all_ready(remote))
        assert remote.statistics().alive == 2 and loaded(remote) == [True, True]
        run_served(local.start, lambda: all_ready(local))
        assert loaded(local) == [False]
    finally:
        remote.close()
        local.close()


def test_close_ends_the_workers() -> None:
    pool = DecodePool(2)
    run_served(pool.start, pool.wait_ready)
    processes = [w.process for w in pool._workers]
    pool.close()
    assert all(p.poll() is not None for p in processes)


def test_workers_that_do_not_end_are_killed_together_when_the_pool_closes() -> None:
    """Workers that do not end when their input closes (stopped here, as one stuck in a read of a frozen
    store) are killed after a moment, all at once: closing takes about as long for three as for one."""
    pool = DecodePool(3)
    run_served(pool.start, pool.wait_ready)
    processes = [w.process for w in pool._workers]
    for p in processes:
        os.kill(p.pid, signal.SIGSTOP)
    began = time.monotonic()
    pool.close(timeout=2.0)
    took = time.monotonic() - began
    assert all(p.poll() == -signal.SIGKILL for p in processes), [p.poll() for p in processes]
    assert took < 1.5, f"closing took {took:.2f} s"  # (one at a time, each after its own 2 s: 6 s)


def test_integrity_errors_keep_their_class(tmp_path: Path, pool: DecodePool) -> None:
    store, _, xorb_hash = _store(tmp_path, size=5000)
    layout = store.load_layout(xorb_hash)
    chunks = chunk_run(layout, 0, 5, verify=True)._replace(hashes=b"\x01" * 32 * 5)
    _, got = _decode(pool, str(store.xorb_path(xorb_hash)), xorb_hash, chunks)
    assert all(isinstance(c, IntegrityError) for c in got)
    assert "chunk 0 at byte 0 of the xorb" in str(got[0]) and "footer says 0101" in str(got[0])


@pytest.mark.parametrize("xorb_footer", [True, False], ids=["footer", "footerless"])
def test_workers_check_layouts_as_the_daemon_does(tmp_path: Path, pool: DecodePool, xorb_footer: bool) -> None:
    store, _, xorb_hash = _store(tmp_path, xorb_footer=xorb_footer)
    path = str(store.xorb_path(xorb_hash))
    got = _run(pool, lambda: pool.layout(path, xorb_hash))
    assert got == store.load_layout(xorb_hash)
    assert got.chunk_hashes is not None and len(got.chunk_hashes) == 40


def _daemon_error(store: Store, xorb_hash: bytes) -> XetfsError:
    with pytest.raises(XetfsError) as caught:
        Store.open(store.location).load_layout(xorb_hash)  # a new Store: no descriptor opened before the damage
    return caught.value


def _worker_error(pool: DecodePool, path: str, xorb_hash: bytes) -> XetfsError:
    with pytest.raises(XetfsError) as caught:
        _run(pool, lambda: pool.layout(path, xorb_hash))
    return caught.value


def test_layout_errors_come_back_as_the_daemon_would_raise_them(tmp_path: Path, pool: DecodePool) -> None:
    store, _, xorb_hash = _store(tmp_path)
    layout = store.load_layout(xorb_hash)
    path = store.xorb_path(xorb_hash)
    path.chmod(0o644)
    raw = path.read_bytes()
    footer = layout.phys_ends[-1]
    damage = {
        footer + 8: IntegrityError,  # the footer's own xorb hash names another xorb
        footer + 41: XorbFormatError,  # the hashes section's ident
        footer + 52 + 32 * 7: IntegrityError,  # a chunk hash: the Merkle root is not the name
    }
    messages = {}
    for offset, cls in damage.items():
        broken = bytearray(raw)
        broken[offset] ^= 0x55
        path.write_bytes(bytes(broken))
        copy = tmp_path / f"copy-{offset}"  # workers keep descriptors open: each case gets its own file
        copy.write_bytes(bytes(broken))
        expected = _daemon_error(store, xorb_hash)
        got = _worker_error(pool, str(copy), xorb_hash)
        assert type(expected) is cls and type(got) is cls, offset
        assert str(got) == str(expected), offset
        messages[offset] = str(got)
    assert f"the chunk hashes in its footer (offset {footer + 52}) aggregate to" in messages[footer + 52 + 32 * 7]

    missing = _worker_error(pool, str(tmp_path / "gone"), xorb_hash)
    assert isinstance(missing, MissingObjectError) and "cannot open" in str(missing)


def test_runs_held_in_shared_memory_never_block_or_corrupt_reads(tmp_path: Path) -> None:
    """A few slots in all and a cache that could keep every chunk: new jobs take the slots of runs
    no read is using (or decode in the daemon when every slot is in use), while concurrent reads
    spanning several xorbs pin runs of all of them."""
    rng = random.Random(11)
    content = rng.randbytes(150_000) + bytes(rng.choice(b"abc") for _ in range(150_000))
    b = StoreBuilder(tmp_path, max_xorb_chunks=40)
    file_hash = b.add_file(content, chunk_size=1000, scheme=[0, 1, 2])
    b.finish()
    assert len(b.xorbs) >= 5
    store = Store.open(tmp_path)
    idx = index.build([parse_shard(store.read_shard(f), where=f.name) for f in store.shard_files()])
    entry = idx.get(file_hash)
    assert entry is not None
    pool = DecodePool(1, slots=4, slot_size=16 * 1024)
    pool.min_job_bytes = pool.min_slot_run = 0
    slots = pool.statistics().slots
    reader = Reader(idx, store, pool=pool, cache_size=1 << 30)
    ranges = [(o, rng.randrange(1, 120_000)) for o in (rng.randrange(len(content)) for _ in range(60))]

    async def body() -> None:
        await pool.wait_ready()
        got: dict[int, bytes] = {}

        async def read(i: int, offset: int, size: int) -> None:
            got[i] = bytes(await reader.read(entry, offset, size))

        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                for i, (offset, size) in enumerate(ranges):
                    nursery.start_soon(read, i, offset, size)
        for i, (offset, size) in enumerate(ranges):
            assert got[i] == content[offset : offset + size], (offset, size)
        assert bytes(await reader.read(entry, 0, len(content))) == content

    try:
        run_served(reader.start, body)
        s = reader.statistics()
        assert s.decode.in_workers > 0 and s.decode.worker_fallbacks == 0
        assert s.cache.evictions > 0  # runs gave up their slots
        assert s.cache.shared_bytes <= slots * 16 * 1024
        reader.runs.clear()
        assert _free_slots(pool) == slots  # no slot lost
    finally:
        reader.close()


def test_a_read_inside_one_run_is_a_view_of_it(tmp_path: Path, pool: DecodePool) -> None:
    """Zero copy: a read inside one run decoded by a worker is handed on as a view of shared memory."""
    store, file_hash, _ = _store(tmp_path)
    idx = index.build([parse_shard(store.read_shard(f), where=f.name) for f in store.shard_files()])
    entry = idx.get(file_hash)
    assert entry is not None
    reader = Reader(idx, store, pool=pool, cache_size=1 << 20)
    whole = b"".join(bytes(c) for c in _whole_file(store, idx, file_hash))

    async def body() -> None:
        await reader.read(entry, 0, 8000)  # chunks 0..7 in one job: one run in a slot
        for offset, size in [(100, 10), (1500, 3000)]:
            got = await reader.read(entry, offset, size)
            assert isinstance(got, memoryview) and bytes(got) == whole[offset : offset + size]

    try:
        _run(pool, body)
        assert reader.statistics().cache.shared_bytes == 8000
    finally:
        reader.runs.clear()


@pytest.mark.parametrize("corrupt", [False, True])
def test_without_a_ready_worker_the_daemon_decodes_into_slots(tmp_path: Path, corrupt: bool) -> None:
    """Before a worker is ready (or after one is lost), a run worth a slot is decoded by the daemon into a
    slot, not into its own memory: the runs workers would have held take no more memory than theirs.  A
    chunk that fails costs only its bytes, and every slot is free again after."""
    store, file_hash, xorb_hash = _store(tmp_path)
    idx = index.build([parse_shard(store.read_shard(f), where=f.name) for f in store.shard_files()])
    entry = idx.get(file_hash)
    assert entry is not None
    whole = b"".join(bytes(c) for c in _whole_file(store, idx, file_hash))
    bad = 20  # chunk 20 lies in file bytes [20,000, 21,000)
    if corrupt:
        layout, path = store.load_layout(xorb_hash), store.xorb_path(xorb_hash)
        store.close()
        path.chmod(0o644)
        data = bytearray(path.read_bytes())
        data[layout.phys_ends[bad] - 10] ^= 0x01  # in the chunk's payload
        path.write_bytes(bytes(data))
        store = Store.open(tmp_path)
    pool = DecodePool(1, slots=6, slot_size=64 * 1024)  # never started: no worker will be ready
    pool.min_job_bytes = pool.min_slot_run = 0
    reader = Reader(idx, store, pool=pool, cache_size=1 << 20)

    async def body() -> None:
        got = await reader.read(entry, 0, 8000)  # chunks 0..7: one run, in a slot
        assert isinstance(got, memoryview) and bytes(got) == whole[:8000]
        assert reader.statistics().cache.shared_bytes == 8000
        if corrupt:
            with pytest.raises(IntegrityError):
                await reader.read(entry, 16_000, 8000)
            assert bytes(await reader.read(entry, 16_000, 4000)) == whole[16_000:20_000]  # the rest of its run
        else:
            assert bytes(await reader.read(entry, 0, entry.size)) == whole

    try:
        trio.run(body)
        s = reader.statistics()
        assert s.decode.in_workers == 0
        # Corrupt: runs of chunks 0..7 and 16..23 but chunk 20, whose good chunks were copied out of the slot.
        assert (s.decode.chunks, s.cache.shared_bytes) == ((15, 8000) if corrupt else (40, 40_000))
        reader.runs.clear()
        assert _free_slots(pool) == pool.statistics().slots
    finally:
        reader.close()
        store.close()


def test_a_worker_that_dies_after_sending_a_result_is_lost_cleanly(tmp_path: Path) -> None:
    """A result left in the pipe by a worker that then died, read after the worker was taken for lost
    (a job sent to it met a closed pipe): the daemon goes on, the job's caller decodes it itself."""
    store, _, xorb_hash = _store(tmp_path)
    path = str(store.xorb_path(xorb_hash))
    chunks = chunk_run(store.load_layout(xorb_hash), 0, 4, verify=True)
    pool = DecodePool(1, slots=8, slot_size=64 * 1024)
    pool.min_job_bytes = pool.min_slot_run = 0

    async def body() -> _Pending:
        await pool.wait_ready()
        (worker,) = pool._workers
        # A job sent with no checkpoint until its result is in the pipe: the collector cannot have read it.
        taken = [pool.slots.take(4000) for _ in range(2)]
        assert taken[0] is not None and taken[1] is not None
        first = _Pending((taken[0],), trio.current_time())
        worker.pending[999] = first
        job = Job(999, ChunkSource("", path), xorb_hash, ((taken[0].index, chunks),))
        pool._send(worker, encode_frame(job))
        assert select.select([worker.results_fd], [], [], 10)[0]
        worker.process.send_signal(signal.SIGKILL)
        worker.process.wait()
        with pytest.raises(WorkerLost):  # the next job meets the closed pipe: the worker is lost
            await decode_one(pool, taken[1], path, xorb_hash, chunks)
        with trio.fail_after(10):  # the collector reads the leftover result, then ends: nothing may fail
            while worker.collecting:
                await trio.sleep(0.01)
        return first

    try:
        first = _run(pool, body)
    finally:
        pool.close()
    assert first.done.is_set() and first.result is None  # its caller would decode it itself
    assert pool.statistics().lost == 1


WRITE_STORM = """
import sys, trio
from xetfs.format.xorb import chunk_run
from xetfs.read.pool import DecodePool
from xetfs.storage.store import ChunkSource, Store

store = Store.open(sys.argv[1])
xorbs = sorted(store.xorb_hashes())
layouts = {x: store.load_layout(x) for x in xorbs}
pool = DecodePool(1, slots=80, slot_size=64 * 1024)
pool.min_job_bytes = pool.min_slot_run = 0

async def main() -> None:
    async with trio.open_nursery() as nursery:
        pool.start(nursery)
        await pool.wait_ready()

        async def decode(k: int) -> None:
            x = xorbs[k % len(xorbs)]
            first = (k * 32) % (layouts[x].num_chunks - 32)
            slot = pool.slots.take(64 * 1024)
            assert slot is not None
            chunks = chunk_run(layouts[x], first, first + 32, verify=True)
            await pool.decode(ChunkSource("", str(store.xorb_path(x))), x, [(slot, chunks)])
            slot.release()

        async with trio.open_nursery() as jobs:
            for x in xorbs:  # large results (about 190 KB each), then a burst of jobs in one go
                jobs.start_soon(pool.layout, str(store.xorb_path(x)), x)
            await trio.sleep(0)
            for k in range(70):
                jobs.start_soon(decode, k)
        nursery.cancel_scope.cancel()

try:
    trio.run(main)
finally:
    pool.close()
print("done")
"""


def test_a_burst_of_jobs_while_a_worker_sends_large_results_does_not_stop_the_daemon(tmp_path: Path) -> None:
    """Layout results larger than a pipe, then more jobs than the worker's input pipe holds, all at
    once: the daemon must keep reading results while it waits to send (a blocking write would stop
    it for good; the child process is then killed by the timeout and the test fails)."""
    b = StoreBuilder(tmp_path / "store", max_xorb_chunks=4096)
    b.add_file(random.Random(3).randbytes(2 * 4096 * 200), chunk_size=200)  # two xorbs of 4,096 chunks
    b.finish()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", WRITE_STORM, str(tmp_path / "store")], capture_output=True,
                          text=True, timeout=60, env=env, check=False)  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip() == "done", done.stderr[-3000:]


def test_a_slot_keeps_in_memory_only_the_run_it_holds() -> None:
    """A run in a slot is counted by its length: past the pool's allowance, a slot that held a longer
    run gives back the rest."""
    slot_size = 256 * 1024
    pool = DecodePool(1, slots=4, slot_size=slot_size)
    pool.slots.spare_bytes = 0  # no excess allowed (the default allows a few slots' worth)

    def resident() -> int:
        return os.fstat(pool.slots.memfd).st_blocks * 512

    try:
        slot = pool.slots.take(slot_size)
        assert slot is not None
        slot.view(slot_size)[:] = b"\x01" * slot_size  # a sequential reader's full run
        assert resident() == slot_size
        slot.release()
        again = pool.slots.take(10_000, fresh=False)  # the same slot, warm, for a short run
        assert again is not None and again.index == slot.index
        assert resident() == 12 * 1024  # 10,000 bytes: three pages
        again.view(10_000)[:] = b"\x02" * 10_000
        assert bytes(again.view(10_000)) == b"\x02" * 10_000
        again.release()
        last = pool.slots.take(slot_size, fresh=False)  # a longer run: nothing to give back
        assert last is not None and last.index == slot.index
        assert resident() == 12 * 1024
    finally:
        pool.close()


def test_a_slot_given_back_twice_is_free_once() -> None:
    """A lease is released once: a second release (two clean-ups of one owner meeting), even after another
    lease took the same slot, does not put it on the free list again, where two runs would then share it.
    A fenced lease is given back only when unfenced."""
    slots = Slots(3, 64 * 1024, keep=3, spare_bytes=0, counters=WorkerCounters())
    try:
        first = slots.take(1000)
        assert first is not None
        first.release()
        first.release()
        assert slots.free_count == 3
        taken = [slots.take(1000) for _ in range(3)]
        assert sorted(s.index for s in taken if s is not None) == [0, 1, 2] and slots.take(1000) is None
        first.release()  # a stale lease on a slot another lease holds now
        assert slots.free_count == 0 and slots.take(1000) is None
        fenced = taken[0]
        assert fenced is not None
        fenced.fence()
        fenced.release()
        assert slots.free_count == 0
        fenced.unfence()
        assert slots.free_count == 1
        fenced.unfence()
        fenced.release()
        assert slots.free_count == 1
    finally:
        slots.close()


def test_jobs_left_unsent_when_a_run_ends_are_sent_in_the_next(tmp_path: Path) -> None:
    """A trio run that ends while job frames wait for a full pipe (its worker stopped): the next
    run sends them, so those jobs finish and their slots come back."""
    b = StoreBuilder(tmp_path / "store", max_xorb_chunks=1024)
    b.add_file(random.Random(1).randbytes(1024 * 200), chunk_size=200)
    b.finish()
    store = Store.open(tmp_path / "store")
    (xorb_hash,) = store.xorb_hashes()
    layout = store.load_layout(xorb_hash)
    path = str(store.xorb_path(xorb_hash))
    chunks = chunk_run(layout, 0, 64, verify=True)
    size = layout.range_size(0, 64)
    jobs = 300
    pool = DecodePool(1, slots=jobs + 10, slot_size=64 * 1024)
    pool.min_job_bytes = pool.min_slot_run = 0

    async def one() -> None:
        slot = pool.slots.take(size)
        assert slot is not None
        await decode_one(pool, slot, path, xorb_hash, chunks)
        slot.release()

    async def first_run() -> None:
        await pool.wait_ready()
        pool._workers[0].process.send_signal(signal.SIGSTOP)  # its input pipe fills
        async with trio.open_nursery() as nursery:
            for _ in range(jobs):
                nursery.start_soon(one)
            await trio.testing.wait_all_tasks_blocked()
            assert pool._workers[0].unsent  # more than the pipe takes
            nursery.cancel_scope.cancel()  # the run ends; the jobs are abandoned, not lost

    async def second_run() -> None:
        with trio.fail_after(30):
            while pool._workers[0].pending:
                await trio.sleep(0.01)

    try:
        run_served(pool.start, first_run)
        pool._workers[0].process.send_signal(signal.SIGCONT)
        run_served(pool.start, second_run)
        assert not pool._workers[0].unsent
        assert pool.statistics().free_slots == pool.statistics().slots  # every abandoned slot came back
    finally:
        pool.close()


def test_a_job_that_never_ends_times_out_and_its_worker_is_replaced(tmp_path: Path) -> None:
    """A store read that never returns (here: opening a FIFO nobody writes to) fails with
    ``StoreTimeoutError`` soon after ``job_timeout``, found by the pool's one watchdog; the worker is
    killed and replaced, and the next job decodes."""
    store, _, xorb_hash = _store(tmp_path / "store")
    chunks = chunk_run(store.load_layout(xorb_hash), 0, 4, verify=True)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    p = DecodePool(1, slots=12, slot_size=64 * 1024, job_timeout=0.5)
    p.min_job_bytes = p.min_slot_run = 0

    async def body() -> tuple[float, list[int | WorkerError], WorkerCounters]:
        await p.wait_ready()
        slot = p.slots.take(64 * 1024)
        assert slot is not None
        start = trio.current_time()
        with pytest.raises(StoreTimeoutError, match=r"took more than 0\.5 s \(decode worker 0 stopped and replaced\)"):
            await p.decode(ChunkSource("", str(fifo)), xorb_hash, [(slot, chunks)])
        took = trio.current_time() - start
        with trio.fail_after(30):  # the replacement starts in a thread, then says it is ready
            while not p.usable:
                await trio.sleep(0.01)
        again = p.slots.take(64 * 1024)
        assert again is not None
        done = await p.decode(ChunkSource("", str(store.xorb_path(xorb_hash))), xorb_hash, [(again, chunks)])
        return took, done.sizes[0], p.statistics()

    try:
        took, sizes, stats = run_served(p.start, body)
    finally:
        p.close()
    assert 0.5 <= took < 5.0, took  # the watchdog looks every eighth of a second here (never: 30 s)
    assert sizes == [1000] * 4
    assert (stats.hung, stats.lost, stats.alive) == (1, 1, 1)
