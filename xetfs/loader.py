"""Chunks of a xorb as verified runs: the one place xorb bytes are read and decoded.

``Loader.load(xorb, layout, first, stop)`` reads chunks ``[first, stop)`` of
a xorb, decodes them and checks every chunk against its hash from the xorb
footer (itself tied to the xorb's name) before it becomes part of a run
(``runs.Run``).  Ranges worth a process round trip are read, decoded and
verified into a slot of shared memory (``pool.DecodePool``) by a decode
worker, or by the daemon while no worker can take them (starting, or lost),
so that the daemon's memory does not fill with runs a worker would have
held; small ones, and any when every slot is in use, into the daemon's
memory.  The daemon decodes from one read of the serialized chunks
(``Store.read_chunks``, the I/O seam).  ``Loader.layout`` reads and checks
a xorb's layout the same way, and ``Loader.run_stop`` says where a run
ends: one slot (2 MiB) at most, or ``run_bytes`` without decode workers.

Blocking store reads go through ``io``, which may run them inline (fastest)
or in a worker thread with a time bound.  Runs on one trio thread.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Any, TypeVar

import trio

from xetfs import hashes
from xetfs.errors import StoreTimeoutError, XetfsError
from xetfs.format.chunk import Buffer
from xetfs.format.xorb import ChunkRun, XorbLayout, chunk_run, decode_chunks, decode_chunks_into
from xetfs.pool import DecodePool, WorkerLost
from xetfs.runs import Loaded, Run, RunStore
from xetfs.stats import DecodeCounters, StoreCounters, WorkerCounters
from xetfs.store import StoreLike

T = TypeVar("T")
Io = Callable[..., Awaitable[Any]]

RUN_BYTES = 1024 * 1024  # decoded bytes per run at most (without workers; with them, a slot)
MAX_RUN_BYTES = 8 * 1024 * 1024  # one store read covers at most this much of a xorb


async def inline_io(fn: Callable[..., T], *args: Any) -> T:
    """Run a store call on the calling thread (page-cached local files)."""
    return fn(*args)


def threaded_io(timeout: float) -> Io:
    """Run each store call in a worker thread; give up after ``timeout`` seconds."""

    async def run(fn: Callable[..., T], *args: Any) -> T:
        with trio.move_on_after(timeout):
            return await trio.to_thread.run_sync(fn, *args, abandon_on_cancel=True)
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
        store: StoreLike,
        runs: RunStore,
        *,
        shared: Callable[[bytes], bool],
        verify: bool = True,
        io: Io = inline_io,
        pool: DecodePool | None = None,
        run_bytes: int = RUN_BYTES,
        fetch_width: int | None = None,
    ) -> None:
        """``runs``: the store of runs, whose slots may be taken back for a job; ``shared``: whether
        other terms use a xorb; ``run_bytes``: decoded bytes per run without decode workers (with
        them, a slot); ``fetch_width``: store reads in flight at most (None: no bound)."""
        self.store = store
        self.verify = verify
        self._runs = runs
        self._shared = shared
        self._io = io
        self._pool = pool
        self._run_bytes = pool.slot_size if pool else run_bytes
        self._fetches = trio.CapacityLimiter(fetch_width) if fetch_width else None
        self._decode = DecodeCounters()
        self._store = StoreCounters()

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
        """Where a run from chunk ``start`` ends: before ``limit``, one store read of at most
        ``MAX_RUN_BYTES``, decoding to at most a run's bytes (at least one chunk)."""
        stop = start + 1
        while (
            stop < limit
            and layout.phys_ends[stop] - layout.phys_start(start) <= MAX_RUN_BYTES
            and layout.range_size(start, stop + 1) <= self._run_bytes
        ):
            stop += 1
        return stop

    async def load(self, xorb_hash: bytes, layout: XorbLayout, first: int, stop: int) -> Loaded:
        """Read, decode and verify chunks ``[first, stop)``: in a worker if worth it, else here.

        A range worth a slot is decoded into one even here (no worker ready yet, or one was
        lost), so the daemon's memory does not grow with runs that workers would have held;
        with every slot in use (runs that reads are using, jobs in flight), it is decoded into
        the daemon's memory rather than wait.  A run shorter than half a slot is copied out of
        its slot into the daemon's memory once decoded: held runs never leave most of a slot
        unused (``pool.slots_for``).
        """
        chunks = chunk_run(layout, first, stop, verify=self.verify)
        pool = self._pool
        size = layout.range_size(first, stop)
        slot = None
        if pool is not None and pool.min_job_bytes <= size <= pool.slot_size:
            slot = self._take_slot(pool, size)
        if pool is None or slot is None:
            data = await self._read(xorb_hash, layout, first, stop)
            decoded = decode_chunks(data, xorb_hash, chunks.specs())
            self._count(len(data), decoded)
            return _runs(xorb_hash, layout, first, decoded)
        sizes = await self._in_worker(pool, slot, xorb_hash, chunks) if pool.usable else None
        if sizes is None:  # no worker ready yet, or it was lost: decode here, into the slot
            try:
                data = await self._read(xorb_hash, layout, first, stop)
                sizes = decode_chunks_into(data, xorb_hash, chunks.specs(), pool.view(slot, size))
            except BaseException:
                pool.free_slot(slot)
                raise
            self._count(len(data), sizes)
        if all(isinstance(s, int) for s in sizes):
            if size < pool.min_slot_run:  # a short run would hold a whole slot: it moves to the daemon
                data = bytes(pool.view(slot, size))
                pool.free_slot(slot)
                return Loaded([Run(xorb_hash, first, stop, layout.unpacked_start(first), memoryview(data))], {})
            run = Run(xorb_hash, first, stop, layout.unpacked_start(first), pool.view(slot, size), slot)
            run.private = not self._shared(xorb_hash)
            return Loaded([run], {})
        # Some chunk failed: keep the others in the daemon's memory, and give the slot back.
        pieces: list[Buffer | XetfsError] = []
        at = 0
        for s in sizes:
            pieces.append(bytes(pool.view(slot, at + s)[at:]) if isinstance(s, int) else s)
            at += s if isinstance(s, int) else 0
        pool.free_slot(slot)
        return _runs(xorb_hash, layout, first, pieces)

    async def _in_worker(
        self, pool: DecodePool, slot: int, xorb_hash: bytes, chunks: ChunkRun
    ) -> list[int | XetfsError] | None:
        """Decode in a worker into ``slot``: per chunk its size or error; None if the worker was lost
        (the slot is still the caller's).  If cancelled, the pool frees the slot once the worker is
        done; if the xorb is missing, it is freed here."""
        try:
            path = str(self.store.xorb_path(xorb_hash))
        except XetfsError:
            pool.free_slot(slot)
            raise
        try:
            decoded = await pool.decode(slot, path, xorb_hash, chunks)
        except WorkerLost:
            self._decode.worker_fallbacks += 1
            return None
        sizes = [s if isinstance(s, int) else s.error() for s in decoded.sizes]
        self._decode.in_workers += sum(isinstance(s, int) for s in sizes)
        self._count(decoded.read_bytes, sizes)
        return sizes

    async def _read(self, xorb_hash: bytes, layout: XorbLayout, first: int, stop: int) -> Buffer:
        """The serialized chunks ``[first, stop)`` of a xorb, from the store (``io``, within ``fetch_width``)."""
        phys = (layout.phys_start(first), layout.phys_ends[stop - 1])
        if self._fetches is None:
            data: Buffer = await self._io(self.store.read_chunks, xorb_hash, *phys, first, stop)
            return data
        async with self._fetches:
            fetched: Buffer = await self._io(self.store.read_chunks, xorb_hash, *phys, first, stop)
            return fetched

    def _take_slot(self, pool: DecodePool, size: int) -> int | None:
        """A free slot, or None if every slot is in use.

        In order: a free slot already in memory; the slot of a private run a sequential reader
        has read through; a slot never used (touching new memory costs far more than reusing);
        the slot of the least useful run no read is using.
        """
        slot = pool.take_slot(size, fresh=False)
        if slot is None and self._runs.recycle_slot():
            slot = pool.take_slot(size, fresh=False)
        if slot is None:
            slot = pool.take_slot(size)
        if slot is None and self._runs.free_a_slot():
            slot = pool.take_slot(size)
        return slot

    def _count(self, read_bytes: int, chunks: Sequence[Buffer | int | XetfsError]) -> None:
        """Count one store read that decoded ``chunks`` (bytes, sizes or errors); a worker's job that
        read nothing (its xorb would not open) is no store read."""
        if not read_bytes:
            return
        self._store.reads += 1
        self._store.bytes += read_bytes
        self._decode.runs += 1
        for c in chunks:
            if not isinstance(c, XetfsError):
                self._decode.chunks += 1
                self._decode.bytes += c if isinstance(c, int) else len(memoryview(c))

    async def layout(self, xorb_hash: bytes) -> XorbLayout:
        """Read and check a xorb's layout, in a decode worker when one is ready (it takes milliseconds)."""
        pool = self._ready_pool()
        if pool is not None:
            try:
                layout = await pool.layout(str(self.store.xorb_path(xorb_hash)), xorb_hash)
            except WorkerLost:
                self._decode.worker_fallbacks += 1
            else:
                self._decode.layouts_in_workers += 1
                self._store.layouts += 1
                return layout
        loaded: XorbLayout = await self._io(self.store.load_layout, xorb_hash)
        self._store.layouts += 1
        return loaded


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
    return Loaded(runs, errors)
