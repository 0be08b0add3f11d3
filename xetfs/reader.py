"""The verified read path: file bytes from index, cache, store and decoder.

``Reader.read(entry, offset, size)`` returns exactly those bytes of a file.
It maps the range to term slices (``Index.locate``), each slice to chunks of
a xorb (``chunk_span``), takes the chunks from the cache and loads the
missing ones: adjacent chunks of one xorb are read with one ``pread``, every
decoded chunk is checked against its hash from the xorb footer (which is
itself tied to the xorb's name) before it is cached or returned.

Runs on one trio thread.  Blocking store reads go through ``io``, which may
run them inline (fastest) or in a worker thread with a time bound.  With a
``DecodePool``, runs big enough to be worth a process round trip are read
and decoded by worker processes instead, several at a time.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import trio

from xetfs import hashes
from xetfs.cache import Loader, LoadingCache
from xetfs.errors import IntegrityError, MissingObjectError, StoreError, StoreTimeoutError, XetfsError
from xetfs.format.xorb import ChunkSpec, XorbLayout, chunk_specs, decode_run
from xetfs.index import FileEntry, Index, chunk_span
from xetfs.pool import DecodePool, SharedChunk, WorkerLost
from xetfs.stats import CacheCounters, Stats
from xetfs.store import StoreLike
from xetfs.stream import Budget, Segment, Stream

T = TypeVar("T")
ChunkKey = tuple[bytes, int]
Chunk = bytes | SharedChunk  # a decoded chunk: in the daemon's memory, or still where its worker wrote it
Io = Callable[..., Awaitable[Any]]

DEFAULT_CACHE_SIZE = 512 * 1024 * 1024
LAYOUT_CACHE_SIZE = 32 * 1024 * 1024
MAX_RUN_BYTES = 8 * 1024 * 1024  # one pread covers at most this much of a xorb
PREFETCH_BATCH = 16  # chunks (about 1 MiB) decoded per prefetch step
MIN_STREAM_BUDGET = 32 * 1024 * 1024


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


class Reader:
    def __init__(
        self,
        index: Index,
        store: StoreLike,
        *,
        cache_size: int = DEFAULT_CACHE_SIZE,
        stats: Stats | None = None,
        verify: bool = True,
        io: Io = inline_io,
        pool: DecodePool | None = None,
        fetch_width: int = 1,
        prefetch_batch: int = PREFETCH_BATCH,
    ) -> None:
        """``fetch_width``: without decode workers, how many prefetch batches load at once, and
        ``prefetch_batch``: chunks per batch (one store read).  A remote store's reads wait on the
        network: several larger ones are in flight."""
        self.index = index
        self.store = store
        self.stats = stats or Stats()
        self.verify = verify
        self._io = io
        self._pool = pool
        self._fetch_width = fetch_width
        self._prefetch_batch = prefetch_batch
        # A run must fit a worker's slot; without workers only MAX_RUN_BYTES bounds it.
        self._max_run_decoded = pool.slot_size if pool else sys.maxsize
        self.cache: LoadingCache[ChunkKey, Chunk] = LoadingCache(cache_size, self.stats.cache, self.stats.prefetch)
        self._layouts: LoadingCache[bytes, _Sized] = LoadingCache(LAYOUT_CACHE_SIZE, CacheCounters())
        # Bytes decoded for sequential readers are held apart from the cache: a quarter of its size more
        # (at least a few prefetch windows), none when the cache is off.
        capacity = self.cache.capacity
        self._stream_budget = Budget(max(capacity // 4, MIN_STREAM_BUDGET) if capacity else 0, self.stats.stream)

    # -- public API ---------------------------------------------------------

    def start(self, nursery: trio.Nursery) -> None:
        """Start background work (collecting worker results) in ``nursery``."""
        if self._pool is not None:
            self._pool.start(nursery)

    async def wait_for_workers(self) -> None:
        """After ``start``: wait until decode workers take jobs, or none will (at once without a pool)."""
        if self._pool is not None:
            await self._pool.wait_ready()

    def close(self) -> None:
        """Stop the decode workers, if any."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    async def read(
        self, entry: FileEntry, offset: int, size: int, *, drop_behind: bool = False, stream: Stream | None = None
    ) -> bytes | memoryview:
        """Bytes ``[offset, offset + size)`` of ``entry``, clipped at end of file.

        With ``drop_behind`` (a sequential reader whose bytes the kernel
        keeps in its page cache), chunks read to their end leave the cache
        at once: a streamed file then recycles a few MiB of memory instead
        of filling the whole cache with bytes nobody asks for again.

        With ``stream`` (that reader's ``Stream``) and decode workers, the
        parts of the range the stream lacks are decoded into it, and the
        bytes are taken from there.  They may come back as a view of shared
        memory: copy it or hand it on before the next await.

        Raises ``IntegrityError``, ``MissingObjectError``, ``FormatError`` or
        ``StoreTimeoutError``; each is counted in ``stats.errors``.
        """
        pool = self._ready_pool() if stream is not None else None
        if stream is not None and pool is not None and offset < entry.size:
            size = min(size, entry.size - offset)
            with contextlib.suppress(XetfsError):  # the ordinary path below meets it again, and reports it
                await self._stream_ahead(pool, stream, entry, offset, size, prefetch=False)
            taken = await stream.take(offset, size)
            if taken is not None:
                data, chunks = taken
                self.stats.prefetch.hits += chunks
                return data
        finished: list[ChunkKey] | None = [] if drop_behind else None
        try:
            pieces = await self._collect(entry, offset, size, prefetch=False, finished=finished)
        except XetfsError as exc:
            self._count_error(exc)
            raise
        # From here to the copy, no await: a chunk in shared memory may be
        # detached and its slot reused at any await (pool.SharedChunk).
        parts = [memoryview(c.data if isinstance(c, SharedChunk) else c)[skip : skip + n] for c, skip, n in pieces]
        data = parts[0] if len(parts) == 1 and isinstance(pieces[0][0], bytes) else b"".join(parts)
        if finished:
            self.cache.discard(finished)
        return data

    def stream(self) -> Stream | None:
        """A new ``Stream`` for one open file (sharing this reader's budget), or None without decode workers."""
        if self._pool is None or not self._stream_budget.limit:
            return None
        return Stream(self._stream_budget)

    @property
    def prefetch_tasks(self) -> int:
        """How many prefetches of one file may run at once.

        Without workers one at a time (they would only take turns on this
        thread); with workers a new window may start while the last one's
        final batches are decoding, so the workers never run dry.
        """
        return 2 if self._ready_pool() else 1

    async def prefetch(self, entry: FileEntry, offset: int, size: int, stream: Stream | None = None) -> None:
        """Load the chunks under ``[offset, offset + size)`` into the cache; errors are ignored.

        They will be met, counted and reported by the read that needs the
        bytes.  With ``stream`` and decode workers, the chunks go into the
        stream as whole runs instead: those it lacks, not behind its reads,
        as far as its byte budget has room.
        """
        pool = self._ready_pool()
        if stream is not None and pool is None and self._pool is not None and self._pool.starting:
            return  # the stream's reads will be decoded once the workers are up; not twice by prefetch now
        self.stats.prefetch.requests += 1
        with contextlib.suppress(XetfsError):
            if stream is None or pool is None:
                await self._collect(entry, offset, size, prefetch=True)
            else:
                await self._stream_ahead(pool, stream, entry, offset, size, prefetch=True)

    async def layout(self, xorb_hash: bytes) -> XorbLayout:
        """The verified layout of a xorb (cached)."""
        (sized,) = await self._layouts.get_many([xorb_hash], self._load_layouts)
        return sized.layout

    # -- internals ----------------------------------------------------------

    def _ready_pool(self) -> DecodePool | None:
        """The decode pool, if it can take jobs now."""
        return self._pool if self._pool is not None and self._pool.usable else None

    async def _collect(
        self, entry: FileEntry, offset: int, size: int, *, prefetch: bool, finished: list[ChunkKey] | None = None
    ) -> list[tuple[Chunk, int, int]]:
        """``(chunk, skip, length)`` for each piece of ``[offset, offset + size)`` (with ``prefetch``: just load them).

        ``finished`` collects the keys of the chunks this range reads up to their end.
        """
        parts: list[tuple[Chunk, int, int]] = []
        for piece in self.index.locate(entry, offset, size):
            layout = await self.layout(piece.xorb_hash)
            span = chunk_span(piece, layout)
            keys = [(span.xorb_hash, i) for i in range(span.start, span.stop)]

            async def load(
                missing: Sequence[ChunkKey], layout: XorbLayout = layout
            ) -> dict[ChunkKey, Chunk | Exception]:
                return await self._load_chunks(missing, layout)

            if prefetch:
                await self._prefetch_batches(keys, load)
                continue
            chunks = await self.cache.get_many(keys, load)
            skip, left = span.skip, span.length
            for key, chunk in zip(keys, chunks, strict=True):
                if skip >= len(chunk):
                    skip -= len(chunk)
                    continue
                take = min(left, len(chunk) - skip)
                parts.append((chunk, skip, take))
                if finished is not None and skip + take == len(chunk):
                    finished.append(key)
                left -= take
                skip = 0
                if not left:
                    break
        return parts

    async def _prefetch_batches(self, keys: list[ChunkKey], load: Loader[ChunkKey, Chunk]) -> None:
        """Load ``keys`` in small batches, each its own load, in order.

        A reader that catches up waits for the batch holding its chunk, not
        for the whole window.  With workers, as many batches are in flight
        as the pool has slots (without, ``fetch_width``), handed out in file order.
        """
        step = self._prefetch_batch
        batches = [keys[i : i + step] for i in range(0, len(keys), step)]
        pool = self._ready_pool()
        if pool is None and self._fetch_width <= 1:
            for batch in batches:
                await self.cache.prefetch(batch, load)
                await trio.lowlevel.checkpoint()
            return
        in_flight = trio.Semaphore(pool.capacity if pool is not None else self._fetch_width)

        async def one(batch: list[ChunkKey]) -> None:
            try:
                with contextlib.suppress(XetfsError):
                    await self.cache.prefetch(batch, load)
            finally:
                in_flight.release()

        async with trio.open_nursery() as nursery:
            for batch in batches:
                await in_flight.acquire()
                nursery.start_soon(one, batch)

    async def _stream_ahead(
        self, pool: DecodePool, stream: Stream, entry: FileEntry, offset: int, size: int, *, prefetch: bool
    ) -> None:
        """Decode the chunks under ``[offset, offset + size)`` of ``entry`` that ``stream`` lacks into it.

        Returns once those segments are decoded (or failed).
        """
        jobs: list[tuple[Segment, str, bytes, list[ChunkSpec]]] = []
        started = 0

        async def one(segment: Segment, path: str, xorb_hash: bytes, specs: list[ChunkSpec]) -> None:
            data = None
            try:
                read_bytes, data = await pool.decode_whole(path, xorb_hash, specs)
            except (XetfsError, WorkerLost):
                pass  # the read of these bytes goes the ordinary way, and reports the error
            else:
                self._count_decoded(read_bytes, segment.chunks, len(data))
                self.stats.decode.in_workers += segment.chunks
                if prefetch:
                    self.stats.prefetch.chunks += segment.chunks
            finally:
                stream.budget.settle(segment, data)
                segment.done.set()
                in_flight.release()

        try:
            async with stream.planning:
                if not stream.near(offset):
                    stream.restart()
                # Only what this read (or prefetch) asks for: a read that arrived ahead of
                # others leaves them a gap, which they fill themselves.  Prefetch never goes
                # behind the reads (what lies there was read already, or a read is on its
                # way) and plans only what the budget has room for.
                start = max(offset, stream.read_to) if prefetch else offset
                room = stream.budget.room(offset + size - start) if prefetch else offset + size - start
                for lo, hi in stream.missing(start, offset + size):
                    if room <= 0:
                        break
                    planned = await self._plan(entry, lo, min(hi, lo + room))
                    segments = [segment for segment, *_ in planned]
                    stream.add(segments)
                    stream.budget.plan(segments)
                    room -= sum(s.end - s.start for s in segments)
                    jobs += planned
            in_flight = trio.Semaphore(pool.capacity)
            async with trio.open_nursery() as nursery:
                for job in jobs:
                    await in_flight.acquire()
                    nursery.start_soon(one, *job)
                    started += 1
        finally:
            # Segments planned but never started (a later piece failed to plan, or this was
            # cancelled) count as failed, so no read waits for them.
            for segment, *_ in jobs[started:]:
                stream.budget.settle(segment, None)
                segment.done.set()

    async def _plan(self, entry: FileEntry, lo: int, hi: int) -> list[tuple[Segment, str, bytes, list[ChunkSpec]]]:
        """Segments (and their decode jobs) for the whole chunks under ``[lo, hi)`` of ``entry``, in file order."""
        planned = []
        for piece in self.index.locate(entry, lo, hi - lo):
            layout = await self.layout(piece.xorb_hash)
            span = chunk_span(piece, layout)
            path = str(self.store.xorb_path(span.xorb_hash))
            # The span's first chunk starts ``skip`` bytes before the piece.
            at = entry.term_start(piece.term) + piece.offset - span.skip
            first = span.start
            while first < span.stop:
                stop = self._run_stop(layout, first, span.stop, PREFETCH_BATCH)
                end = at + layout.range_size(first, stop)
                segment = Segment(at, end, stop - first, unread=end - at)
                planned.append((segment, path, span.xorb_hash, chunk_specs(layout, first, stop, verify=self.verify)))
                at, first = end, stop
        return planned

    def _run_stop(self, layout: XorbLayout, start: int, limit: int, most: int = sys.maxsize) -> int:
        """Where a run of adjacent chunks from ``start`` ends: before ``limit``, at most ``most`` chunks,
        one ``pread`` of at most ``MAX_RUN_BYTES`` and decoding to at most a job's slot (at least one chunk)."""
        end = min(limit, start + most)
        stop = start + 1
        while (
            stop < end
            and layout.phys_ends[stop] - layout.phys_start(start) <= MAX_RUN_BYTES
            and layout.range_size(start, stop + 1) <= self._max_run_decoded
        ):
            stop += 1
        return stop

    async def _load_layouts(self, keys: Sequence[bytes]) -> dict[bytes, _Sized]:
        out = {}
        for xorb_hash in keys:
            out[xorb_hash] = _Sized(await self._load_layout(xorb_hash))
            self.stats.store.layouts += 1
        return out

    async def _load_layout(self, xorb_hash: bytes) -> XorbLayout:
        """Read and check a layout, in a decode worker when one is ready (it takes milliseconds)."""
        pool = self._ready_pool()
        if pool is not None:
            try:
                layout = await pool.layout(str(self.store.xorb_path(xorb_hash)), xorb_hash)
            except WorkerLost:
                self.stats.decode.worker_fallbacks += 1
            else:
                self.stats.decode.layouts_in_workers += 1
                return layout
        loaded: XorbLayout = await self._io(self.store.load_layout, xorb_hash)
        return loaded

    async def _load_chunks(self, keys: Sequence[ChunkKey], layout: XorbLayout) -> dict[ChunkKey, Chunk | Exception]:
        """Read and decode the given chunks of one xorb, one pread per run of adjacent chunks.

        Each key maps to its bytes or to the error that stopped it: a bad
        chunk fails only itself, a failed read only its run.
        """
        out: dict[ChunkKey, Chunk | Exception] = {}
        xorb_hash = keys[0][0]
        indices = sorted(i for _, i in keys)
        group_start = prev = indices[0]
        for i in [*indices[1:], -1]:
            if i == prev + 1:
                prev = i
                continue
            start = group_start  # chunks [group_start, prev] are adjacent: read them in runs
            while start <= prev:
                stop = self._run_stop(layout, start, prev + 1)
                try:
                    run = await self._load_run(xorb_hash, layout, start, stop)
                except XetfsError as exc:
                    out.update(((xorb_hash, k), exc) for k in range(start, stop))
                else:
                    self._count_run(run)
                    out.update(((xorb_hash, k), chunk) for k, chunk in enumerate(run.chunks, start))
                start = stop
            group_start = prev = i
        return out

    async def _load_run(self, xorb_hash: bytes, layout: XorbLayout, start: int, stop: int) -> _Run:
        pool = self._ready_pool()
        if pool is not None and layout.range_size(start, stop) >= pool.min_job_bytes:
            specs = chunk_specs(layout, start, stop, verify=self.verify)
            try:
                read_bytes, chunks = await pool.decode(str(self.store.xorb_path(xorb_hash)), xorb_hash, specs)
            except WorkerLost:
                self.stats.decode.worker_fallbacks += 1
            else:
                self.stats.decode.in_workers += sum(not isinstance(c, XetfsError) for c in chunks)
                return _Run(read_bytes, chunks)
        phys = (layout.phys_start(start), layout.phys_ends[stop - 1])
        data = await self._io(self.store.read_chunks, xorb_hash, *phys, start, stop)
        return _Run(len(data), decode_run(data, xorb_hash, layout, start, stop, verify=self.verify))

    def _count_run(self, run: _Run) -> None:
        decoded = [c for c in run.chunks if not isinstance(c, Exception)]
        self._count_decoded(run.read_bytes, len(decoded), sum(len(c) for c in decoded))

    def _count_decoded(self, read_bytes: int, chunks: int, size: int) -> None:
        """Count one read from the store that decoded ``chunks`` chunks (``size`` bytes)."""
        self.stats.store.reads += 1
        self.stats.store.bytes += read_bytes
        self.stats.decode.chunks += chunks
        self.stats.decode.bytes += size

    def _count_error(self, exc: XetfsError) -> None:
        errors = self.stats.errors
        if isinstance(exc, IntegrityError):
            errors.integrity += 1
        elif isinstance(exc, MissingObjectError):
            errors.missing += 1
        elif isinstance(exc, StoreTimeoutError):
            errors.timeout += 1
        elif isinstance(exc, StoreError):
            self.stats.remote.failed_reads += 1
        else:
            errors.format += 1


class _Run:
    """What reading one run of adjacent chunks produced."""

    __slots__ = ("chunks", "read_bytes")

    def __init__(self, read_bytes: int, chunks: Sequence[Chunk | XetfsError]) -> None:
        self.read_bytes = read_bytes
        self.chunks = chunks


class _Sized:
    """A layout with a ``len`` that approximates its memory, for the byte-bounded cache."""

    __slots__ = ("layout",)

    def __init__(self, layout: XorbLayout) -> None:
        self.layout = layout

    def __len__(self) -> int:
        return 200 + 150 * self.layout.num_chunks
