"""The verified read path: file bytes from index, layouts, runs and decoder.

``Reader.read(entry, offset, size)`` returns exactly those bytes of a file,
in two steps a front end may take apart: ``read_now``, at once if earlier
reads found where the bytes are, and else ``read_rest``.
It maps the range to term slices (``Index.locate``), each slice to chunks of
a xorb (``chunk_range``), and takes the chunks from the store of decoded runs
(``runs.RunStore``), which loads the gaps through ``loader.Loader``: read,
decode and verify every chunk before it is kept or served, in a decode
worker or in the daemon.  Reads of bytes that held runs have are answered
from a memo of which run holds which file bytes (``extents.Extents``, kept
by the store of runs).

The range a read or a prefetch window asks for is what is decoded: gaps are
cut into runs of at most one slot (``Loader.run_stop``), so a sequential
reader's prefetch gets runs of that size and a small random read only the
chunks it touches.  Runs on one trio thread.
"""

from __future__ import annotations

import contextlib
from bisect import bisect_right
from dataclasses import dataclass, replace
from functools import partial

import trio

from xetfs.base.errors import (
    FormatError,
    IntegrityError,
    MissingObjectError,
    ObjectReadError,
    StoreError,
    StoreTimeoutError,
    XetfsError,
)
from xetfs.base.settings import CACHE_SIZE, LAYOUT_CACHE_SIZE, RUN_BYTES
from xetfs.base.stats import (
    CacheCounters,
    DecodeCounters,
    ErrorCounters,
    FileCounters,
    LayoutCounters,
    PrefetchCounters,
    RemoteCounters,
    StoreCounters,
    WorkerCounters,
)
from xetfs.format.xorb import XorbLayout
from xetfs.read.cache import LoadingCache
from xetfs.read.extents import Extent
from xetfs.read.loader import Io, Loader, inline_io
from xetfs.read.pool import DecodePool
from xetfs.read.readahead import ReadAhead
from xetfs.read.runs import Loaded, Run, RunStore, room_to_read_ahead
from xetfs.storage.index import FileEntry, Index, TermSlice, chunk_range
from xetfs.storage.store import Store

# One part of a read, within one term: the term slice, its xorb's layout, and the chunks under it.
_Span = tuple[TermSlice, XorbLayout, int, int]


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
        store: Store,
        *,
        cache_size: int = CACHE_SIZE,
        io: Io = inline_io,
        pool: DecodePool | None = None,
        run_bytes: int = RUN_BYTES,
        fetch_width: int | None = None,
        remote: RemoteCounters | None = None,
        read_ahead: bool = True,
        hung_for: float | None = None,
    ) -> None:
        """``run_bytes``: decoded bytes per store read (a local store with decode workers: a slot); ``fetch_width``:
        store reads in flight at most (None: no bound); ``remote``: the remote store's counters, where reads
        failed by the server are counted.  A remote store's reads wait on the network: several larger ones
        are in flight.  ``read_ahead``: small files read in pack order read ahead in their xorb (``readahead``);
        ``hung_for``: a remote store's ``--io-timeout`` (``Loader``: fetches fail at once for that long after one
        ran out of time)."""
        self.index = index
        self._remote = remote or RemoteCounters()
        self.runs = RunStore(cache_size, pool.slots if pool else None)
        self._extents = self.runs.extents
        self._read_ahead = read_ahead and room_to_read_ahead(cache_size)
        self._loader = Loader(store, self.runs, shared=index.shared, io=io, pool=pool,
                              run_bytes=run_bytes, fetch_width=fetch_width, remote=self._remote,
                              hung_for=hung_for)  # fmt: skip
        self._ahead = ReadAhead(self.runs.vacant_until, self._loader.run_stop, self._loader.run_bytes)
        # A layout that failed its check fails again at once for a while: checking a xorb without a footer
        # means reading and hashing all of it.
        self._layouts: LoadingCache[bytes, XorbLayout] = LoadingCache(
            LAYOUT_CACHE_SIZE, _layout_size, remember=(FormatError, IntegrityError)
        )
        self._errors = ErrorCounters()
        self._prefetch_requests = 0
        self._files: dict[bytes, FileCounters] = {}  # by file hash: what its reads decoded
        self._nursery: trio.Nursery | None = None  # (reading ahead, from ``start`` on; else in system tasks)

    @property
    def store(self) -> Store:
        return self._loader.store

    @property
    def remote(self) -> RemoteCounters:
        """The remote store's counters, live (``statistics`` gives a copy)."""
        return self._remote

    def replace_index(self, index: Index) -> None:
        """Read files of ``index`` from now on: a copy of the current one with more shards (a refresh)."""
        self.index = index
        self._loader.replace_index(index)

    def statistics(self) -> ReaderStatistics:
        prefetch = replace(self.runs.prefetch_statistics(), requests=self._prefetch_requests)
        decode, store, workers = self._loader.statistics()
        cache, errors = self.runs.statistics(), replace(self._errors)
        layouts = replace(self._layouts.counters)
        return ReaderStatistics(cache, layouts, decode, store, prefetch, errors, workers, replace(self._remote))

    def file_statistics(self, file_hash: bytes) -> FileCounters:
        """What reads and prefetch of the file ``file_hash`` decoded so far (a copy)."""
        return replace(self._files.get(file_hash) or FileCounters())

    # -- public API ---------------------------------------------------------

    def start(self, nursery: trio.Nursery) -> None:
        """Start background work (collecting worker results, reading ahead) in ``nursery``."""
        self._loader.start(nursery)
        self._nursery = nursery

    async def wait_for_workers(self) -> None:
        """After ``start``: wait until decode workers take jobs, or none will (at once without a pool)."""
        await self._loader.wait_for_workers()

    def close(self) -> None:
        """Let go of every run and stop the decode workers, if any."""
        self.runs.clear()
        self._loader.close()

    async def read(self, entry: FileEntry, offset: int, size: int, *, read_through: bool = False) -> bytes | memoryview:
        """Bytes ``[offset, offset + size)`` of ``entry``, clipped at end of file.

        Bytes from a single run come back as a view of its memory (perhaps
        shared memory): copy it or hand it on before the next await.  With
        ``read_through`` (a sequential reader whose bytes the kernel keeps in
        its page cache), runs read to their end are evicted before others.

        Raises ``IntegrityError``, ``MissingObjectError``, ``FormatError``,
        ``ObjectReadError``, ``StoreTimeoutError`` or (a remote store's server)
        ``StoreError``; each is counted (``errors``, ``remote.failed_reads``).
        """
        data = self.read_now(entry, offset, size, read_through)
        if data is not None:
            return data
        return await self.read_rest(entry, offset, size, read_through=read_through)

    async def read_rest(
        self, entry: FileEntry, offset: int, size: int, *, read_through: bool = False
    ) -> bytes | memoryview:
        """``read`` by the full path: for bytes ``read_now`` did not answer (the caller asked it first)."""
        held: list[list[Run]] = []
        try:
            # Bytes the store holds are served at once: no await, nothing pinned or loaded.
            spans = self._spans_now(entry, offset, size)
            if spans is not None:
                self._read_ahead_of(spans)
                now = self._load_now(entry, spans)  # a small read of chunks nobody has: at once
                if now is not None:
                    held.append(now)
                    return self._join(entry, spans, held, read_through)
                found = self._held(spans)
                if found is not None:
                    for (_, _, first, stop), runs in zip(spans, found, strict=True):
                        self.runs.served(runs, first, stop)
                    return self._join(entry, spans, found, read_through)
            else:
                spans = await self._spans(entry, offset, size)
                self._read_ahead_of(spans)
            for piece, layout, first, stop in spans:
                try:
                    held.append(
                        await self._get(layout, piece.xorb_hash, first, stop, prefetch=False, file_hash=entry.file_hash)
                    )
                except XetfsError as exc:
                    at = entry.term_start(piece.term) + piece.offset
                    exc.file_range = (at, at + piece.length)
                    raise
            # From here to the return, no await: a run released below may be evicted and its slot reused.
            return self._join(entry, spans, held, read_through)
        except XetfsError as exc:
            _count_error(self._errors, self._remote, exc)
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
        run = extent.run
        if run.stop - run.first == 1:  # (a small random read's run, most often)
            chunks = 1
        else:
            ends = extent.layout.unpacked_ends
            first = last = bisect_right(ends, lo, run.first, run.stop - 1)  # (among the run's chunks only)
            while ends[last] < hi:  # (a small read touches one chunk: no second bisection)
                last += 1
            chunks = last + 1 - first
        self.runs.hit(run, chunks)
        if read_through:
            self.runs.read_along(run, lo, hi)
        return run.data[lo - run.lo : hi - run.lo]  # the extent lies within the run

    async def prefetch(self, entry: FileEntry, offset: int, size: int) -> None:
        """Load the chunks under ``[offset, offset + size)`` that no run holds; errors are ignored (the read
        that needs the bytes meets, counts and reports them)."""
        self._prefetch_requests += 1
        with contextlib.suppress(XetfsError):
            for piece, layout, first, stop in await self._spans(entry, offset, size):
                await self._get(layout, piece.xorb_hash, first, stop, prefetch=True, file_hash=entry.file_hash)

    async def layout(self, xorb_hash: bytes) -> XorbLayout:
        """The verified layout of a xorb (cached)."""
        return await self._layouts.get(xorb_hash, self._loader.layout)

    # -- internals ----------------------------------------------------------

    async def _spans(self, entry: FileEntry, offset: int, size: int) -> list[_Span]:
        """The chunks of each xorb under file bytes ``[offset, offset + size)``, with the xorbs' layouts."""
        spans = []
        for piece in self.index.locate(entry, offset, size):
            layout = await self.layout(piece.xorb_hash)
            spans.append((piece, layout, *chunk_range(piece, layout)))
        return spans

    def _spans_now(self, entry: FileEntry, offset: int, size: int) -> list[_Span] | None:
        """``_spans`` without waiting: None if a layout is not cached."""
        pieces = self.index.locate(entry, offset, size)
        layouts = self._layouts.peek_all([piece.xorb_hash for piece in pieces])
        if layouts is None:
            return None
        return [(piece, layout, *chunk_range(piece, layout)) for piece, layout in zip(pieces, layouts, strict=True)]

    def _held(self, spans: list[_Span]) -> list[list[Run]] | None:
        """The held runs for every span, or None if some chunk is not held."""
        found = []
        for piece, _, first, stop in spans:
            runs = self.runs.held(piece.xorb_hash, first, stop)
            if runs is None:
                return None
            found.append(runs)
        return found

    def _join(
        self, entry: FileEntry, spans: list[_Span], runs: list[list[Run]], read_through: bool
    ) -> bytes | memoryview:
        """The bytes of ``spans`` from their ``runs`` (a view when one run has them all); remember the extents."""
        parts = []
        for (piece, layout, _, _), span_runs in zip(spans, runs, strict=True):
            term_lo = layout.unpacked_start(piece.start)  # the term is decoded xorb bytes [term_lo, term_hi)
            term_hi = term_lo + piece.term_size
            lo = term_lo + piece.offset  # the span is [lo, hi) (within its chunks: ``chunk_range``)
            hi = lo + piece.length
            delta = term_lo - entry.term_start(piece.term)  # decoded xorb offset minus file offset, in the term
            for run in span_runs:
                parts.append(run.view(lo, hi))
                if not (read_through and self.runs.read_along(run, lo, hi)):  # (else the page cache has it all)
                    a, b = max(run.lo, term_lo), min(run.hi, term_hi)
                    self._extents.add(entry.file_hash, Extent(a - delta, b - delta, delta, run, layout))
        if not parts:
            return b""
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def _get(
        self, layout: XorbLayout, xorb_hash: bytes, first: int, stop: int, *, prefetch: bool, file_hash: bytes
    ) -> list[Run]:
        def cut(lo: int, hi: int) -> list[tuple[int, int]]:
            if not prefetch:
                self._ahead.loaded(xorb_hash, hi)
            return self._loader.cut(layout, lo, hi)

        async def load(lo: int, hi: int) -> Loaded:
            loaded = await self._loader.load(xorb_hash, layout, lo, hi)
            self._tally(file_hash, loaded, layout, first, stop)
            return loaded

        return await self.runs.get(xorb_hash, first, stop, cut, load, prefetch=prefetch)

    def _read_ahead_of(self, spans: list[_Span]) -> None:
        """For a read of a small file (every chunk of one term), have the chunks its xorb's readers will want
        next read in the background (``ReadAhead.stretch``): a prefetch, counted as one."""
        if len(spans) == 1 and self._read_ahead:
            piece, layout, first, stop = spans[0]
            x = piece.xorb_hash
            due = self._ahead.stretch(x, layout, first, stop) if _whole_term(piece, first, stop) else None
            if due is not None:  # (other files' chunks: counted for no file, as ``_tally`` says)
                self._prefetch_requests += 1
                cut, load = partial(self._loader.cut, layout), partial(self._loader.load, x, layout)
                spawn = self._nursery.start_soon if self._nursery else trio.lowlevel.spawn_system_task  # (cat, serve)
                self.runs.get_soon(x, *due, cut, load, spawn)

    def _load_now(self, entry: FileEntry, spans: list[_Span]) -> list[Run] | None:
        """The runs of a read of one span that no run or load has any chunk of, loaded at once and pinned
        (``Loader.load_now``: a small read of a local store); None if the read must wait (``_get``)."""
        if len(spans) != 1:
            return None
        piece, layout, first, stop = spans[0]
        if not self.runs.vacant(piece.xorb_hash, first, stop):
            return None
        if self._loader.run_stop(layout, first, stop) < stop:  # more than one store read
            return None
        loaded = self._loader.load_now(piece.xorb_hash, layout, first, stop)
        if loaded is None:
            return None
        self._ahead.loaded(piece.xorb_hash, stop)
        self._tally(entry.file_hash, loaded, layout, first, stop)
        return self.runs.put(piece.xorb_hash, first, stop, loaded)

    def _tally(self, file_hash: bytes, loaded: Loaded, layout: XorbLayout, first: int, stop: int) -> None:
        """Count what a read of the file ``file_hash`` loaded of chunks ``[first, stop)`` (the file whose read
        loads a chunk is the one it is counted for; chunks read ahead in the background, for no file)."""
        tally = self._files.get(file_hash) or self._files.setdefault(file_hash, FileCounters())
        for run in loaded[0]:
            a, b = max(first, run.first), min(stop, run.stop)
            if a < b:
                tally.chunks += b - a
                tally.bytes += layout.range_size(a, b)


def _count_error(errors: ErrorCounters, remote: RemoteCounters, exc: XetfsError) -> None:
    """Count a failed read by its error's kind."""
    if isinstance(exc, IntegrityError):
        errors.integrity += 1
    elif isinstance(exc, MissingObjectError):
        errors.missing += 1
    elif isinstance(exc, StoreTimeoutError):
        errors.timeout += 1
    elif isinstance(exc, ObjectReadError):
        errors.io += 1
    elif isinstance(exc, StoreError):
        remote.failed_reads += 1  # the server could not be reached, or refused
    else:
        errors.format += 1


def _layout_size(layout: XorbLayout) -> int:
    """About the memory a layout takes, for the byte-bounded cache of layouts."""
    return 200 + 150 * layout.num_chunks


def _whole_term(piece: TermSlice, first: int, stop: int) -> bool:
    """Whether a read's chunks ``[first, stop)`` are every chunk of its term (a small file read whole, say):
    then it may read ahead in the xorb (``readahead``)."""
    return first == piece.start and stop == piece.stop
