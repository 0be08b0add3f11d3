"""The verified read path: file bytes from index, layouts, runs and decoder.

``Reader.read(entry, offset, size)`` returns exactly those bytes of a file.
It maps the range to term slices (``Index.locate``), each slice to chunks of
a xorb (``chunk_span``), and takes the chunks from the store of decoded runs
(``runs.RunStore``), which loads the gaps through ``_load``: one read of the
run's serialized chunks from the store (``Store.read_chunks``, the I/O seam),
then decode and verify every chunk against its hash from the xorb footer
(itself tied to the xorb's name) before it is kept or served.  Runs worth a
process round trip are read, decoded and verified by a worker process into
shared memory instead (``pool.DecodePool``); small ones in the daemon.

The range a read or a prefetch window asks for is what is decoded: gaps are
cut into runs of at most one slot (2 MiB; 1 MiB when decoding in the daemon), so a
sequential reader's prefetch gets runs of that size and a small random read
only the chunks it touches.

Runs on one trio thread.  Blocking store reads go through ``io``, which may
run them inline (fastest) or in a worker thread with a time bound.
"""

from __future__ import annotations

import contextlib
from bisect import bisect_right
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, NamedTuple, TypeVar

import trio

from xetfs import hashes
from xetfs.cache import LoadingCache
from xetfs.errors import IntegrityError, MissingObjectError, StoreError, StoreTimeoutError, XetfsError
from xetfs.extents import Extent, Extents
from xetfs.format.chunk import Buffer
from xetfs.format.xorb import XorbLayout, chunk_specs, decode_chunks
from xetfs.index import ChunkSpan, FileEntry, Index, TermSlice, chunk_span
from xetfs.pool import DecodePool, WorkerLost
from xetfs.runs import Loaded, Run, RunStore
from xetfs.stats import (
    CacheCounters,
    DecodeCounters,
    ErrorCounters,
    LayoutCounters,
    PrefetchCounters,
    RemoteCounters,
    StoreCounters,
    WorkerCounters,
)
from xetfs.store import StoreLike

T = TypeVar("T")
Io = Callable[..., Awaitable[Any]]

DEFAULT_CACHE_SIZE = 512 * 1024 * 1024
LAYOUT_CACHE_SIZE = 32 * 1024 * 1024
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


class Span(NamedTuple):
    """The chunks of one xorb under part of a read, and where that part's term lies in the xorb."""

    layout: XorbLayout
    chunks: ChunkSpan
    delta: int  # decoded xorb offset minus file offset, within the term
    term_lo: int  # the term is decoded xorb bytes [term_lo, term_hi)
    term_hi: int


@dataclass(frozen=True)
class ReaderStatistics:
    """Snapshots of the counters of the read path, by group (as in ``.xetfs/stats``)."""

    cache: CacheCounters
    layouts: LayoutCounters
    decode: DecodeCounters
    store: StoreCounters
    prefetch: PrefetchCounters
    errors: ErrorCounters
    workers: WorkerCounters
    remote: RemoteCounters


class Reader:
    def __init__(
        self,
        index: Index,
        store: StoreLike,
        *,
        cache_size: int = DEFAULT_CACHE_SIZE,
        verify: bool = True,
        io: Io = inline_io,
        pool: DecodePool | None = None,
        run_bytes: int = RUN_BYTES,
        fetch_width: int | None = None,
        remote: RemoteCounters | None = None,
    ) -> None:
        """``run_bytes``: decoded bytes per run without decode workers (with them, a slot);
        ``fetch_width``: store reads in flight at most (None: no bound); ``remote``: the remote
        store's counters, where reads failed by the server are counted.  A remote store's reads
        wait on the network: several larger ones are in flight."""
        self.index = index
        self.store = store
        self.verify = verify
        self._io = io
        self._pool = pool
        self._run_bytes = pool.slot_size if pool else run_bytes
        self._fetches = trio.CapacityLimiter(fetch_width) if fetch_width else None
        self._remote = remote or RemoteCounters()
        self._extents = Extents()
        self.runs = RunStore(cache_size, pool.free_slot if pool else None, self._extents.forget)
        self._layouts: LoadingCache[bytes, _Sized] = LoadingCache(LAYOUT_CACHE_SIZE)
        self._decode = DecodeCounters()
        self._store = StoreCounters()
        self._errors = ErrorCounters()
        self._prefetch_requests = 0

    def statistics(self) -> ReaderStatistics:
        prefetch = replace(self.runs.prefetch_statistics(), requests=self._prefetch_requests)
        workers = self._pool.statistics() if self._pool is not None else WorkerCounters()
        cache = self.runs.statistics()
        decode, store, errors = replace(self._decode), replace(self._store), replace(self._errors)
        layouts = replace(self._layouts.counters)
        return ReaderStatistics(cache, layouts, decode, store, prefetch, errors, workers, replace(self._remote))

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
        """Let go of every run and stop the decode workers, if any."""
        self.runs.clear()
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    async def read(self, entry: FileEntry, offset: int, size: int, *, read_through: bool = False) -> bytes | memoryview:
        """Bytes ``[offset, offset + size)`` of ``entry``, clipped at end of file.

        Bytes from a single run come back as a view of its memory (perhaps
        shared memory): copy it or hand it on before the next await.  With
        ``read_through`` (a sequential reader whose bytes the kernel keeps in
        its page cache), runs read to their end are evicted before others.

        Raises ``IntegrityError``, ``MissingObjectError``, ``FormatError`` or
        ``StoreTimeoutError``; each is counted in the ``errors`` statistics.
        """
        data = self.read_now(entry, offset, size, read_through)
        if data is not None:
            return data
        held: list[list[Run]] = []
        try:
            # Bytes the store holds are served at once: no await, nothing pinned or loaded.
            spans = self._spans_now(entry, offset, size)
            found = self._held(spans) if spans is not None else None
            if spans is not None and found is not None:
                for span, runs in zip(spans, found, strict=True):
                    self.runs.served(runs, span.chunks.start, span.chunks.stop)
                return self._join(entry, spans, found, read_through)
            if spans is None:
                spans = await self._spans(entry, offset, size)
            for span in spans:
                c = span.chunks
                held.append(await self._get(span.layout, c.xorb_hash, c.start, c.stop, prefetch=False))
            # From here to the return, no await: a run released below may be evicted and its slot reused.
            return self._join(entry, spans, held, read_through)
        except XetfsError as exc:
            self._count_error(exc)
            raise
        finally:
            for runs in held:
                self.runs.release(runs)

    def read_now(
        self, entry: FileEntry, offset: int, size: int, read_through: bool = False
    ) -> bytes | memoryview | None:
        """``read`` for bytes that held runs have and earlier reads found (``extents``): at once, or None.

        The common case of reads of cached bytes, with no lookups at all.
        """
        end = offset + size
        if end > entry.size:
            end = entry.size
        if offset >= end:
            return None
        extent = self._extents.find(entry.file_hash, offset, end)
        if extent is not None:
            return self._serve(extent, offset, end, read_through)
        extents = self._extents.cover(entry.file_hash, offset, end)  # a read across runs or terms
        if extents is None:
            return None
        return b"".join([self._serve(e, max(offset, e.start), min(end, e.stop), read_through) for e in extents])

    def _serve(self, extent: Extent, start: int, stop: int, read_through: bool) -> memoryview:
        """File bytes ``[start, stop)``, which ``extent`` holds; count the chunks as hits."""
        lo, hi = start + extent.delta, stop + extent.delta
        run, ends = extent.run, extent.layout.unpacked_ends
        first = last = bisect_right(ends, lo, run.first, run.stop - 1)  # (among the run's chunks only)
        while ends[last] < hi:  # (a small read touches one chunk: no second bisection)
            last += 1
        self.runs.hit(run, last + 1 - first)
        if read_through and run.hi <= hi:
            self.runs.read_through(run)
        return run.data[lo - run.lo : hi - run.lo]  # the extent lies within the run

    async def prefetch(self, entry: FileEntry, offset: int, size: int) -> None:
        """Load the chunks under ``[offset, offset + size)`` that no run holds; errors are ignored.

        They will be met, counted and reported by the read that needs the
        bytes.
        """
        self._prefetch_requests += 1
        with contextlib.suppress(XetfsError):
            for span in await self._spans(entry, offset, size):
                c = span.chunks
                await self._get(span.layout, c.xorb_hash, c.start, c.stop, prefetch=True)

    async def layout(self, xorb_hash: bytes) -> XorbLayout:
        """The verified layout of a xorb (cached)."""
        (sized,) = await self._layouts.get_many([xorb_hash], self._load_layouts)
        return sized.layout

    # -- internals ----------------------------------------------------------

    def _ready_pool(self) -> DecodePool | None:
        """The decode pool, if it can take jobs now."""
        return self._pool if self._pool is not None and self._pool.usable else None

    async def _spans(self, entry: FileEntry, offset: int, size: int) -> list[Span]:
        """The chunks of each xorb under file bytes ``[offset, offset + size)``, with the xorbs' layouts."""
        spans = []
        pos = offset
        for piece in self.index.locate(entry, offset, size):
            spans.append(_span(piece, await self.layout(piece.xorb_hash), pos))
            pos += piece.length
        return spans

    def _spans_now(self, entry: FileEntry, offset: int, size: int) -> list[Span] | None:
        """``_spans`` without waiting: None if a layout is not cached."""
        spans = []
        pos = offset
        for piece in self.index.locate(entry, offset, size):
            sized = self._layouts.peek(piece.xorb_hash)
            if sized is None:
                return None
            spans.append(_span(piece, sized.layout, pos))
            pos += piece.length
        return spans

    def _held(self, spans: list[Span]) -> list[list[Run]] | None:
        """The held runs for every span, or None if some chunk is not held."""
        found = []
        for span in spans:
            runs = self.runs.held(span.chunks.xorb_hash, span.chunks.start, span.chunks.stop)
            if runs is None:
                return None
            found.append(runs)
        return found

    def _join(
        self, entry: FileEntry, spans: list[Span], runs: list[list[Run]], read_through: bool
    ) -> bytes | memoryview:
        """The bytes of ``spans`` from their ``runs`` (a view when one run has them all); remember the extents."""
        parts = []
        for span, span_runs in zip(spans, runs, strict=True):
            c = span.chunks
            lo = span.layout.unpacked_start(c.start) + c.skip
            hi = lo + c.length
            for run in span_runs:
                parts.append(run.view(lo, hi))
                if read_through and run.hi <= hi:
                    self.runs.read_through(run)  # a sequential reader is done with it: no extent
                else:
                    a, b = max(run.lo, span.term_lo), min(run.hi, span.term_hi)
                    self._extents.add(entry.file_hash, Extent(a - span.delta, b - span.delta, span.delta, run,
                                                              span.layout))  # fmt: skip
        if not parts:
            return b""
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def _get(self, layout: XorbLayout, xorb_hash: bytes, first: int, stop: int, *, prefetch: bool) -> list[Run]:
        def cut(lo: int, hi: int) -> list[tuple[int, int]]:
            pieces = []
            while lo < hi:
                end = self._run_stop(layout, lo, hi)
                pieces.append((lo, end))
                lo = end
            return pieces

        async def load(lo: int, hi: int) -> Loaded:
            return await self._load(xorb_hash, layout, lo, hi)

        return await self.runs.get(xorb_hash, first, stop, cut, load, prefetch=prefetch)

    def _run_stop(self, layout: XorbLayout, start: int, limit: int) -> int:
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

    async def _load(self, xorb_hash: bytes, layout: XorbLayout, first: int, stop: int) -> Loaded:
        """Read, decode and verify chunks ``[first, stop)``: in a worker if worth it, else here."""
        pool = self._ready_pool()
        size = layout.range_size(first, stop)
        # With every slot in use (runs that reads are using, jobs in flight), decode here rather than wait.
        slot = self._take_slot(pool) if pool is not None and pool.min_job_bytes <= size <= pool.slot_size else None
        if pool is not None and slot is not None:
            try:
                path = str(self.store.xorb_path(xorb_hash))
                decoded = await pool.decode(slot, path, xorb_hash, chunk_specs(layout, first, stop, verify=self.verify))
            except (WorkerLost, XetfsError) as exc:
                pool.free_slot(slot)
                if isinstance(exc, XetfsError):
                    raise
                self._decode.worker_fallbacks += 1
            else:
                sizes = [s if isinstance(s, int) else s.error() for s in decoded.sizes]
                self._decode.in_workers += sum(isinstance(s, int) for s in sizes)
                self._count(decoded.read_bytes, sizes)
                if all(isinstance(s, int) for s in sizes):
                    run = Run(xorb_hash, first, stop, layout.unpacked_start(first), pool.view(slot, size), slot)
                    run.private = not self.index.shared(xorb_hash)
                    return Loaded([run], {})
                # Some chunk failed: keep the others in the daemon's memory, and give the slot back.
                pieces, at = [], 0
                for s in sizes:
                    pieces.append(bytes(pool.view(slot, at + s)[at:]) if isinstance(s, int) else s)
                    at += s if isinstance(s, int) else 0
                pool.free_slot(slot)
                return _runs(xorb_hash, layout, first, pieces)
        phys = (layout.phys_start(first), layout.phys_ends[stop - 1])
        if self._fetches is None:
            data = await self._io(self.store.read_chunks, xorb_hash, *phys, first, stop)
        else:
            async with self._fetches:
                data = await self._io(self.store.read_chunks, xorb_hash, *phys, first, stop)
        chunks = decode_chunks(data, xorb_hash, chunk_specs(layout, first, stop, verify=self.verify))
        self._count(len(data), chunks)
        return _runs(xorb_hash, layout, first, chunks)

    def _take_slot(self, pool: DecodePool) -> int | None:
        """A free slot, or None if every slot is in use.

        In order: a free slot already in memory; the slot of a private run a sequential reader
        has read through; a slot never used (touching new memory costs far more than reusing);
        the slot of the least useful run no read is using.
        """
        slot = pool.take_slot(fresh=False)
        if slot is None and self.runs.recycle_slot():
            slot = pool.take_slot(fresh=False)
        if slot is None:
            slot = pool.take_slot()
        if slot is None and self.runs.free_a_slot():
            slot = pool.take_slot()
        return slot

    def _count(self, read_bytes: int, chunks: Sequence[Buffer | int | XetfsError]) -> None:
        """Count one store read that decoded ``chunks`` (bytes, sizes or errors)."""
        self._store.reads += 1
        self._store.bytes += read_bytes
        self._decode.runs += 1
        for c in chunks:
            if not isinstance(c, XetfsError):
                self._decode.chunks += 1
                self._decode.bytes += c if isinstance(c, int) else len(memoryview(c))

    def _count_error(self, exc: XetfsError) -> None:
        errors = self._errors
        if isinstance(exc, IntegrityError):
            errors.integrity += 1
        elif isinstance(exc, MissingObjectError):
            errors.missing += 1
        elif isinstance(exc, StoreTimeoutError):
            errors.timeout += 1
        elif isinstance(exc, StoreError):
            self._remote.failed_reads += 1  # the server could not be reached, or refused
        else:
            errors.format += 1

    async def _load_layouts(self, keys: Sequence[bytes]) -> dict[bytes, _Sized]:
        out = {}
        for xorb_hash in keys:
            out[xorb_hash] = _Sized(await self._load_layout(xorb_hash))
            self._store.layouts += 1
        return out

    async def _load_layout(self, xorb_hash: bytes) -> XorbLayout:
        """Read and check a layout, in a decode worker when one is ready (it takes milliseconds)."""
        pool = self._ready_pool()
        if pool is not None:
            try:
                layout = await pool.layout(str(self.store.xorb_path(xorb_hash)), xorb_hash)
            except WorkerLost:
                self._decode.worker_fallbacks += 1
            else:
                self._decode.layouts_in_workers += 1
                return layout
        loaded: XorbLayout = await self._io(self.store.load_layout, xorb_hash)
        return loaded


def _span(piece: TermSlice, layout: XorbLayout, pos: int) -> Span:
    """The span of a term slice that starts at file offset ``pos``."""
    term_lo = layout.unpacked_start(piece.start)
    return Span(layout, chunk_span(piece, layout), term_lo + piece.offset - pos, term_lo, term_lo + piece.term_size)


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


class _Sized:
    """A layout with a ``len`` that approximates its memory, for the byte-bounded cache."""

    __slots__ = ("layout",)

    def __init__(self, layout: XorbLayout) -> None:
        self.layout = layout

    def __len__(self) -> int:
        return 200 + 150 * self.layout.num_chunks
