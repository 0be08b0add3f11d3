"""Chunks of a xorb as verified runs: where xorb bytes are read and decoded for the read path.

``Loader.load(xorb, layout, first, stop)`` reads chunks ``[first, stop)`` of
a xorb, decodes them and checks every chunk against its hash from the xorb
footer (itself tied to the xorb's name) before it becomes part of a run
(``runs.Run``).  Where the bytes come from is the store's answer
(``Store.chunk_source``): a local file (the xorb, or a disk-cache entry of a
remote store) or a fetch from the store's source, the same for every store.
Ranges worth a process round trip are read, decoded and verified into slots
of shared memory (``slots.Slots``) by a decode worker (``pool.DecodePool``),
or by the daemon while no worker can take them (starting, or lost); small
ones, and any when every slot is in use, into the daemon's memory.
``Loader.layout`` reads and checks a xorb's layout, ``Loader.run_stop``
says where a run ends, and ``Loader.cut`` cuts a range into runs.

Blocking store reads in the daemon go through ``io``, which may run them
inline (fastest) or in a worker thread with a time bound.  A remote store's
fetches go through a circuit breaker (``breaker``), so that a hung server
does not cost every read ``--io-timeout``.  Runs on one trio thread.
"""

from __future__ import annotations

import contextlib
from bisect import bisect_right
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import replace
from functools import partial
from itertools import repeat
from typing import Any, TypeVar

import trio

from xetfs.base import hashes
from xetfs.base.errors import StoreTimeoutError, XetfsError
from xetfs.base.settings import (
    MAX_RUN_BYTES,
    RUN_BYTES,
    RUN_TAIL_SHARE,
    STORE_READ_THREADS,
    WORKER_FETCHES,
)
from xetfs.base.stats import DecodeCounters, RemoteCounters, StoreCounters, WorkerCounters
from xetfs.format.chunk import Buffer
from xetfs.format.xorb import ChunkRun, XorbLayout, chunk_run, decode_chunks, decode_runs_into
from xetfs.read.breaker import StoreBreaker
from xetfs.read.pool import DecodePool, WorkerLost
from xetfs.read.runs import Loaded, Run, RunStore
from xetfs.read.slots import Slot, release_all
from xetfs.storage.index import Index
from xetfs.storage.store import ChunkSource, Store

T = TypeVar("T")
Io = Callable[..., Awaitable[Any]]


async def inline_io(fn: Callable[..., T], *args: Any) -> T:
    """Run a store call on the calling thread (page-cached local files)."""
    return fn(*args)


def threaded_io(timeout: float) -> Io:
    """Run each store call in a worker thread; give up after ``timeout`` seconds.

    The threads are limited apart from trio's default: reads stuck on a hung
    store keep theirs until they return, and must not leave none for other work
    (starting a worker, a refresh).
    """
    limiter = trio.CapacityLimiter(STORE_READ_THREADS)

    async def run(fn: Callable[..., T], *args: Any) -> T:
        with trio.move_on_after(timeout):
            return await trio.to_thread.run_sync(fn, *args, abandon_on_cancel=True, limiter=limiter)
        raise StoreTimeoutError(f"{_describe_call(args)}: store read took more than {timeout:g} s")

    return run


def _describe_call(args: tuple[Any, ...]) -> str:
    """``xorb <hex> chunks [a, b)`` from a store call's arguments, as far as they tell."""
    xorb = next((a for a in args if isinstance(a, bytes) and len(a) == hashes.HASH_SIZE), None)
    ints = [a for a in args if isinstance(a, int)]
    where = f"xorb {hashes.to_hex(xorb)}" if xorb else "store"
    return f"{where} chunks [{ints[-2]}, {ints[-1]})" if len(ints) >= 2 else where


class Loader:
    """Loads of chunk ranges and layouts of the store's xorbs, with the counters of that work."""

    def __init__(
        self,
        store: Store,
        runs: RunStore,
        *,
        shared: Callable[[bytes], bool],
        io: Io = inline_io,
        pool: DecodePool | None = None,
        run_bytes: int = RUN_BYTES,
        fetch_width: int | None = None,
        remote: RemoteCounters | None = None,
        hung_for: float | None = None,
    ) -> None:
        """``runs``: the store of runs, whose slots may be taken back for a job; ``shared``: whether
        other terms use a xorb; ``run_bytes``: decoded bytes per store read (with decode workers
        and a local store, a slot: a local read costs the same in any size); ``fetch_width``:
        the daemon's own store reads in flight at most (None: no bound); ``remote``: a remote
        store's counters, to which the workers' fetches are added; ``hung_for``: how long a remote store's
        fetches fail at once after one ran out of time (``breaker``; None: never)."""
        self.store = store
        self._runs = runs
        self._shared = shared
        self._io = io
        self._inline = io is inline_io  # store reads never wait: small loads are done at once (``load_now``)
        self._pool = pool
        self.run_bytes = pool.slot_size if pool is not None and store.local else run_bytes  # (of a run, at most)
        self._fetches = trio.CapacityLimiter(fetch_width) if fetch_width else None
        # Remote jobs in flight at most: what the workers fetch at once, so that a job's time bound
        # (``DecodePool.job_timeout``) is spent on its own fetch, not waiting behind others.
        self._remote_jobs = trio.CapacityLimiter(pool.worker_count * WORKER_FETCHES) if pool is not None else None
        self._remote = remote or RemoteCounters()
        self._breaker = StoreBreaker(hung_for, self._remote) if hung_for is not None else None
        self._decode = DecodeCounters()
        self._store = StoreCounters()

    def replace_index(self, index: Index) -> None:
        """Ask ``index`` from now on whether other terms use a xorb (a refresh added terms)."""
        self._shared = index.shared

    def statistics(self) -> tuple[DecodeCounters, StoreCounters, WorkerCounters]:
        workers = self._pool.statistics() if self._pool is not None else WorkerCounters()
        return replace(self._decode), replace(self._store), workers

    def start(self, nursery: trio.Nursery) -> None:
        """Start background work (collecting worker results) in ``nursery``."""
        if self._pool is not None:
            self._pool.start(nursery)

    async def wait_for_workers(self) -> None:
        """After ``start``: wait until decode workers take jobs, or none will (at once without a pool)."""
        if self._pool is not None:
            await self._pool.wait_ready()

    def close(self) -> None:
        """Stop the decode workers, if any (after the runs in their slots are gone)."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def _ready_pool(self) -> DecodePool | None:
        """The decode pool, if it can take jobs now."""
        return self._pool if self._pool is not None and self._pool.usable else None

    def run_stop(self, layout: XorbLayout, start: int, limit: int) -> int:
        """Where a run from chunk ``start`` ends: before ``limit``, within one disk-cache entry or none,
        one store read of at most ``MAX_RUN_BYTES``, decoding to at most a run's bytes (at least one chunk).

        Where every store read is a request (``fetch_width``), a run also takes in the chunks left before
        ``limit`` when they decode to less than ``1 / RUN_TAIL_SHARE`` of a run: the last chunks of a prefetch
        window, which would otherwise be a request of their own (a fifth more requests per GiB).
        """
        if layout.xorb_hash is not None:
            limit = self.store.chunk_limit(layout.xorb_hash, start, limit)
        # The chunks from ``start + 1`` on whose ends stay within both bounds (the ends grow: two bisections).
        by_read = bisect_right(layout.phys_ends, layout.phys_start(start) + MAX_RUN_BYTES, start + 1, limit)
        stop = bisect_right(layout.unpacked_ends, layout.unpacked_start(start) + self.run_bytes, start + 1, by_read)
        if (
            self._fetches is not None
            and stop < limit
            and layout.range_size(stop, limit) < self.run_bytes // RUN_TAIL_SHARE
            and layout.phys_ends[limit - 1] - layout.phys_start(start) <= MAX_RUN_BYTES
        ):
            stop = limit
        return stop

    def cut(self, layout: XorbLayout, lo: int, hi: int) -> list[tuple[int, int]]:
        """Chunks ``[lo, hi)``, which no run or load has, as store reads (``run_stop``): ``(first, stop)`` each."""
        pieces = []
        while lo < hi:
            pieces.append((lo, end := self.run_stop(layout, lo, hi)))
            lo = end
        return pieces

    async def load(self, xorb_hash: bytes, layout: XorbLayout, first: int, stop: int) -> Loaded:
        """Read, decode and verify chunks ``[first, stop)`` (one store read): in a worker if worth it, else here.

        The bytes come from where the store says (``Store.chunk_source``): a
        local file, a disk-cache entry, or a fetch, kept in the disk cache once
        verified.  A disk-cache entry whose chunks fail their check is dropped,
        and the chunks are fetched again.
        """
        src = self.store.chunk_source(xorb_hash, layout, first, stop)
        try:
            loaded = await self._fetching(src.path is None, self._load_from, src, xorb_hash, layout, first, stop)
        except XetfsError as exc:
            if src.entry is None:
                raise
            reason = str(exc)
        else:
            runs, errors = loaded
            if src.entry is None or not errors:
                return loaded
            reason = str(next(iter(errors.values())))
            self._free(runs)
        assert self.store.chunks is not None
        self.store.chunks.drop(xorb_hash, src.entry, reason)
        src = self.store.chunk_source(xorb_hash, layout, first, stop)
        return await self._fetching(src.path is None, self._load_from, src, xorb_hash, layout, first, stop)

    async def _fetching(self, fetch: bool, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """``await fn(*args)``; a ``fetch`` from a remote store through its breaker (``breaker``)."""
        if fetch and self._breaker is not None:
            return await self._breaker.fetch(_describe_call(args), fn, *args)
        return await fn(*args)

    async def _load_from(self, src: ChunkSource, xorb_hash: bytes, layout: XorbLayout, first: int, stop: int) -> Loaded:
        """``load`` from ``src``.

        A range worth a process round trip is decoded into slots (one per
        slot's worth of its chunks), by a worker, or here when no worker is
        ready yet or one was lost, so that the daemon's memory does not grow
        with runs that workers would have held; with every slot in use (runs
        that reads are using, jobs in flight), it is decoded into the daemon's
        memory rather than wait.  A run shorter than ``min_slot_run`` is copied
        out of its slot into the daemon's memory once decoded: a held run fills
        at least a quarter of its slot, and the cache fills before the slots
        run out (``pool.slots_for``).
        """
        pool = self._pool
        parts = _parts(layout, first, stop, pool.slot_size if pool is not None else None)
        slots = None
        if pool is not None and layout.range_size(first, stop) >= pool.min_job_bytes:
            slots = self._runs.take_slots([layout.range_size(a, b) for a, b in parts])
        if pool is None or slots is None:
            return await self._here(src, xorb_hash, layout, first, stop)
        jobs = [(slot, chunk_run(layout, a, b, verify=True)) for slot, (a, b) in zip(slots, parts, strict=True)]
        try:
            sizes = await self._in_worker(pool, src, xorb_hash, first, stop, jobs) if pool.usable else None
        except WorkerLost:  # stopped while it might still write into the slots (fenced): decode elsewhere
            return await self._here(src, xorb_hash, layout, first, stop)
        if sizes is None:  # no worker ready yet, or it was lost: decode here, into the slots
            try:
                data = await self._read(src, xorb_hash, layout, first, stop)
                outs = [(run, slot.view(run.unpacked[-1] - run.unpacked[0])) for slot, run in jobs]
                sizes = decode_runs_into(data, xorb_hash, outs)
            except BaseException:
                release_all(slots)
                raise
            self._count(len(memoryview(data)), *_decoded(sizes))
            if all(_all_decoded(part) for part in sizes):
                self._keep(src, xorb_hash, first, stop, data)
        runs: list[Run] = []
        errors: dict[int, XetfsError] = {}
        for slot, (a, b), part in zip(slots, parts, sizes, strict=True):
            part_runs, part_errors = _slot_runs(pool, self._shared, slot, xorb_hash, layout, a, b, part)
            runs += part_runs
            errors.update(part_errors)
        return runs, errors

    def load_now(self, xorb_hash: bytes, layout: XorbLayout, first: int, stop: int) -> Loaded | None:
        """``load`` with no await, where it would not wait anyway: chunks ``[first, stop)`` too few for a
        worker, in a local file read inline (a local store on a local disk).  None where it would wait:
        run ``load`` then.

        A small file's read needs only this: none of ``load``'s tasks, events and coroutines.
        """
        if not self._inline or (self._pool is not None and layout.range_size(first, stop) >= self._pool.min_job_bytes):
            return None
        data = self.store.read_local(xorb_hash, layout.phys_start(first), layout.phys_ends[stop - 1], first, stop)
        if data is None:  # a remote store: fetched, or read from the disk cache (whose entries may fail)
            return None
        return _runs(xorb_hash, layout, first, self._decode_here(xorb_hash, layout, first, stop, data))

    async def _here(self, src: ChunkSource, xorb_hash: bytes, layout: XorbLayout, first: int, stop: int) -> Loaded:
        """Read and decode chunks ``[first, stop)`` into the daemon's memory."""
        data = await self._read(src, xorb_hash, layout, first, stop)
        decoded = self._decode_here(xorb_hash, layout, first, stop, data)
        if all(not isinstance(c, XetfsError) for c in decoded):
            self._keep(src, xorb_hash, first, stop, data)
        return _runs(xorb_hash, layout, first, decoded)

    def _decode_here(
        self, xorb_hash: bytes, layout: XorbLayout, first: int, stop: int, data: Buffer
    ) -> list[Buffer | XetfsError]:
        """Chunks ``[first, stop)`` decoded and verified from their serialized bytes ``data``, in the daemon."""
        decoded = decode_chunks(data, xorb_hash, chunk_run(layout, first, stop, verify=True))
        sizes = [len(memoryview(c)) for c in decoded if not isinstance(c, XetfsError)]
        self._count(len(memoryview(data)), len(sizes), sum(sizes))
        return decoded

    def _free(self, runs: Sequence[Run]) -> None:
        """Give back the slots of runs that were loaded but will not be kept."""
        for run in runs:
            if run.slot is not None:
                run.slot.release()

    def _keep(self, src: ChunkSource, xorb_hash: bytes, first: int, stop: int, data: Buffer) -> None:
        """Keep fetched bytes whose chunks all verified in the disk cache, where ``src`` says."""
        if src.cache_to is not None and self.store.chunks is not None:
            self.store.chunks.put(xorb_hash, first, stop, data)

    async def _in_worker(
        self, pool: DecodePool, src: ChunkSource, xorb_hash: bytes, first: int, stop: int,
        jobs: list[tuple[Slot, ChunkRun]],
    ) -> list[list[int | XetfsError]] | None:  # fmt: skip
        """Decode in a worker into the jobs' slots: per part and chunk its size or error; None if the worker
        was lost (the slots are still the caller's).  Raises ``WorkerLost`` if the slots were fenced (the
        caller decodes elsewhere).  If cancelled, the pool frees the slots once the worker is done."""
        sent = False
        try:
            async with _within(self._remote_jobs if src.path is None else None):
                sent = True  # (from here on the pool frees the slots of a job its caller gave up)
                decoded = await pool.decode(src, xorb_hash, jobs)
        except WorkerLost as lost:
            self._decode.worker_fallbacks += 1
            if lost.fenced:
                raise
            return None
        except BaseException:
            if not sent:  # cancelled while waiting for a turn: the slots are still the caller's
                release_all(slot for slot, _ in jobs)
            raise
        sizes: list[list[int | XetfsError]] = [
            part if _all_decoded(part) else [s if isinstance(s, int) else s.error() for s in part]  # type: ignore[misc]
            for part in decoded.sizes
        ]
        chunks, nbytes = _decoded(sizes)
        self._decode.in_workers += chunks
        self._count(decoded.read_bytes, chunks, nbytes)
        if decoded.fetched is not None:  # (the daemon's own fetches add to the same counters, in threads)
            self._remote.add(decoded.fetched)
        if decoded.cached and self.store.chunks is not None:
            cached = decoded.cached
            self.store.chunks.added(xorb_hash, first, stop, cached if isinstance(cached, int) else OSError(*cached))
        return sizes

    async def _read(self, src: ChunkSource, xorb_hash: bytes, layout: XorbLayout, first: int, stop: int) -> Buffer:
        """The serialized chunks ``[first, stop)`` of a xorb, from ``src`` (``io``, within ``fetch_width``)."""
        phys = (layout.phys_start(first), layout.phys_ends[stop - 1])
        async with _within(self._fetches):
            data: Buffer = await self._io(self.store.read_source, xorb_hash, src, *phys, first, stop)
        return data

    def _count(self, read_bytes: int, chunks: int, nbytes: int) -> None:
        """Count one store read that decoded ``chunks`` chunks of ``nbytes`` bytes (``_decoded``); a
        worker's job that read nothing (its xorb would not open) is no store read."""
        if not read_bytes:
            return
        self._store.reads += 1
        self._store.bytes += read_bytes
        self._decode.runs += 1
        self._decode.chunks += chunks
        self._decode.bytes += nbytes

    async def layout(self, xorb_hash: bytes) -> XorbLayout:
        """Read and check a xorb's layout, in a decode worker when one is ready (it takes milliseconds)."""
        pool = self._ready_pool()
        path = self.store.xorb_file(xorb_hash)
        if pool is not None and path is not None:  # (a remote xorb's layout: one fetch of its tail, in a thread)
            try:
                layout = await pool.layout(path, xorb_hash)
            except WorkerLost:
                self._decode.worker_fallbacks += 1
            else:
                self._decode.layouts_in_workers += 1
                self._store.layouts += 1
                return layout
        if path is None:  # a remote xorb: a footer the disk cache keeps needs no request (read even while the
            # store is taken for hung); a fetch of its tail goes through the breaker
            cached: XorbLayout | None = None
            if self.store.chunks is not None:
                cached = await self._io(self.store.cached_layout, xorb_hash)
            fetch = partial(self.store.load_layout, cached=False)
            loaded = cached if cached is not None else await self._fetching(True, self._io, fetch, xorb_hash)
        else:
            loaded = await self._io(self.store.load_layout, xorb_hash)
        self._store.layouts += 1
        return loaded


def _within(limiter: trio.CapacityLimiter | None) -> contextlib.AbstractAsyncContextManager[Any]:
    """``async with`` it: within the limiter, or with no limit when there is none."""
    return limiter if limiter is not None else contextlib.nullcontext()


def _runs(xorb_hash: bytes, layout: XorbLayout, first: int, chunks: Sequence[Buffer | XetfsError]) -> Loaded:
    """Runs of the adjacent chunks that decoded (from chunk ``first`` on), and the errors of those that did not."""
    runs: list[Run] = []
    errors: dict[int, XetfsError] = {}
    start, pieces = first, list[Buffer]()
    for i, chunk in enumerate([*chunks, None], first):
        if isinstance(chunk, XetfsError) or chunk is None:
            if pieces:
                runs.append(Run(xorb_hash, start, i, layout.unpacked_start(start), memoryview(b"".join(pieces))))
            if chunk is not None:
                errors[i] = chunk
            start, pieces = i + 1, []
        else:
            pieces.append(chunk)
    return runs, errors


def _slot_runs(
    pool: DecodePool, shared: Callable[[bytes], bool], slot: Slot, xorb_hash: bytes, layout: XorbLayout, a: int,
    b: int, sizes: Sequence[int | XetfsError],
) -> Loaded:  # fmt: skip
    """What chunks ``[a, b)``, decoded into ``slot`` (``sizes``: per chunk its size or error), make;
    ``shared``: whether other terms use a xorb (a run of one no other term uses is private)."""
    size = layout.range_size(a, b)
    if _all_decoded(sizes):
        if size < pool.min_slot_run:  # a short run would hold a whole slot: it moves to the daemon
            data = bytes(slot.view(size))
            slot.release()
            return [Run(xorb_hash, a, b, layout.unpacked_start(a), memoryview(data))], {}
        run = Run(xorb_hash, a, b, layout.unpacked_start(a), slot.view(size), slot)
        run.private = not shared(xorb_hash)
        return [run], {}
    # Some chunk failed: keep the others in the daemon's memory, and give the slot back.
    pieces: list[Buffer | XetfsError] = []
    at = 0
    for s in sizes:
        pieces.append(bytes(slot.view(at + s)[at:]) if isinstance(s, int) else s)
        at += s if isinstance(s, int) else 0
    slot.release()
    return _runs(xorb_hash, layout, a, pieces)


def _parts(layout: XorbLayout, first: int, stop: int, slot_size: int | None) -> list[tuple[int, int]]:
    """Chunks ``[first, stop)`` cut into pieces of ``slot_size`` at most (at least a chunk each); without
    slots (None), one piece."""
    if slot_size is None:
        return [(first, stop)]
    parts = []
    ends = layout.unpacked_ends
    while first < stop:
        # the chunks from ``first`` on that end within ``slot_size`` of its start, and at least ``first`` itself
        end = max(first + 1, bisect_right(ends, layout.unpacked_start(first) + slot_size, first, stop))
        parts.append((first, end))
        first = end
    return parts


def _all_decoded(sizes: Iterable[object]) -> bool:
    """Whether every chunk of a job decoded (its sizes hold no error).  Without a Python step per chunk:
    the daemon runs this on every chunk a worker decodes."""
    return all(map(isinstance, sizes, repeat(int)))


def _decoded(parts: Sequence[Sequence[int | XetfsError]]) -> tuple[int, int]:
    """The chunks that decoded, and their bytes, from per-part sizes or errors."""
    chunks = nbytes = 0
    for part in parts:
        ok = part if _all_decoded(part) else [s for s in part if isinstance(s, int)]
        chunks += len(ok)
        nbytes += sum(ok)  # type: ignore[arg-type]
    return chunks, nbytes
