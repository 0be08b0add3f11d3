"""Which held run has which bytes of a file: a memo that lets a read of cached bytes skip the lookups.

A read through the store (``reader.Reader``) maps file bytes to terms, terms
to xorb chunks, and chunks to runs.  For bytes that a run already held, all
that work gives the same answer again and again, and for small random reads
it is most of the daemon's cost.  So the reader remembers, per file, the file
ranges each run it served covers (``Extent``: within one term, so file and
decoded xorb offsets differ by a constant), and a later read that lies inside
one extent, or inside extents that follow on from each other, whose runs are
still held is answered from them directly.  A file's extents are kept sorted
(a bisection finds one); small ones, the runs of small random reads, are
also found by page, with one dict lookup: a random read of cached bytes is
the commonest request there is, and the bisection's walk over the file's
extents was a good part of its cost.

Extents are only a shortcut: a run's extents are dropped when the store of
runs evicts the run (``forget``), so they are bounded by what the store of runs holds and
never outlive the layouts they refer to; a read the extents do not answer
takes the full path.  At most ``limit`` extents and ``page_limit`` page
entries are kept; past either the memo starts afresh.

Pure bookkeeping: no I/O, no trio.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING

from xetfs.base.settings import EXTENTS_LIMIT, PAGED_MAX
from xetfs.format.xorb import XorbLayout

if TYPE_CHECKING:
    from xetfs.read.runs import Run  # (the store of runs keeps the extents of its runs)

PAGE = 4096


@dataclass(slots=True)
class Extent:
    """File bytes ``[start, stop)`` are decoded bytes ``[start + delta, stop + delta)`` of ``run``'s xorb."""

    start: int
    stop: int
    delta: int
    run: Run
    layout: XorbLayout  # of the run's xorb: which chunks a read touches


def _pages(extent: Extent) -> range:
    """The pages whose first byte ``extent`` holds, if it is small enough to be found by page."""
    if extent.stop - extent.start > PAGED_MAX:
        return range(0)
    return range((extent.start + PAGE - 1) // PAGE, (extent.stop - 1) // PAGE + 1)


class Extents:
    def __init__(self, limit: int = EXTENTS_LIMIT, page_limit: int | None = None) -> None:
        """At most ``limit`` extents and ``page_limit`` page entries (default: 16 per extent, a 64 KiB
        run's worth) are kept; past either, the memo starts afresh."""
        self.limit = limit
        self.page_limit = 16 * limit if page_limit is None else page_limit
        # By file hash, for the files with extents: their extents in file order and where each starts; and
        # by page number, the small extent holding the page's first byte.
        self._extents: dict[bytes, list[Extent]] = {}
        self._starts: dict[bytes, list[int]] = {}
        self._pages: dict[bytes, dict[int, Extent]] = {}
        self._by_run: dict[Run, list[tuple[bytes, Extent]]] = {}
        self._count = 0
        self._paged = 0  # page entries over all files

    def __len__(self) -> int:
        return self._count

    @property
    def paged(self) -> int:
        """Page entries over all files (at most ``page_limit``)."""
        return self._paged

    def pages(self, file_hash: bytes) -> Mapping[int, Extent]:
        """Page number -> the small extent holding that page's first byte, for one file (a read-only view)."""
        return MappingProxyType(self._pages.get(file_hash, {}))

    def find(self, file_hash: bytes, start: int, stop: int) -> Extent | None:
        """The extent holding all of file bytes ``[start, stop)`` with its run still held, if any."""
        pages = self._pages.get(file_hash)
        if pages is None:
            return None
        # A small read of a small run's bytes: one lookup, no bisection.  The extent found holds the
        # first byte of the page ``start`` lies in, so it starts at or before ``start``.
        extent = pages.get(start // PAGE)
        if extent is None or extent.stop <= start:
            i = bisect.bisect_right(self._starts[file_hash], start) - 1
            if i < 0:
                return None
            extent = self._extents[file_hash][i]
        if stop > extent.stop or not extent.run.held:  # (an evicted run's are forgotten)
            return None
        return extent

    def cover(self, file_hash: bytes, start: int, stop: int) -> list[Extent] | None:
        """Extents that follow on from each other and together hold all of ``[start, stop)``, with their
        runs still held, if any (``find`` for a read that runs on into the next run or term)."""
        extents = self._extents.get(file_hash)
        if extents is None:
            return None
        i = bisect.bisect_right(self._starts[file_hash], start) - 1
        if i < 0 or start >= extents[i].stop:
            return None
        found = []
        pos = start
        for j in range(i, len(extents)):  # (not a slice: that would copy the rest of the file's extents)
            extent = extents[j]
            if extent.start > pos or not extent.run.held:
                return None
            found.append(extent)
            pos = extent.stop
            if pos >= stop:
                return found
        return None

    def add(self, file_hash: bytes, extent: Extent) -> None:
        """Remember ``extent``; extents of the file it overlaps (older runs of those bytes) go."""
        if extent.start >= extent.stop:
            return
        if self._count >= self.limit or self._paged >= self.page_limit:
            for memo in (self._extents, self._starts, self._pages, self._by_run):
                memo.clear()
            self._count = self._paged = 0
        extents = self._extents.setdefault(file_hash, [])
        starts = self._starts.setdefault(file_hash, [])
        pages = self._pages.setdefault(file_hash, {})
        lo = bisect.bisect_right(starts, extent.start) - 1
        if lo < 0 or extents[lo].stop <= extent.start:
            lo += 1
        hi = bisect.bisect_left(starts, extent.stop, lo)
        for old in extents[lo:hi]:
            self._unlink(file_hash, old)
            self._paged -= _unpage(pages, old)
        self._count += 1 - (hi - lo)
        starts[lo:hi] = [extent.start]
        extents[lo:hi] = [extent]
        new_pages = _pages(extent)
        for page in new_pages:
            pages[page] = extent
        self._paged += len(new_pages)
        self._by_run.setdefault(extent.run, []).append((file_hash, extent))

    def forget(self, run: Run) -> None:
        """Drop the extents of ``run`` (it was evicted)."""
        for file_hash, extent in self._by_run.pop(run, ()):
            starts, extents = self._starts[file_hash], self._extents[file_hash]
            i = bisect.bisect_left(starts, extent.start)
            if i < len(extents) and extents[i] is extent:
                del starts[i], extents[i]
                self._paged -= _unpage(self._pages[file_hash], extent)
                self._count -= 1
                if not starts:
                    del self._starts[file_hash], self._extents[file_hash], self._pages[file_hash]

    def _unlink(self, file_hash: bytes, extent: Extent) -> None:
        """Take an extent that is being replaced out of its run's list."""
        mine = self._by_run.get(extent.run)
        if mine is not None:
            mine[:] = [(h, e) for h, e in mine if e is not extent]
            if not mine:
                del self._by_run[extent.run]


def _unpage(pages: dict[int, Extent], extent: Extent) -> int:
    """Drop the page entries of ``extent`` (from its file's ``pages``), which is going; how many there were."""
    dropped = 0
    for page in _pages(extent):
        if pages.get(page) is extent:  # (always, as extents never overlap: a check, not a case)
            del pages[page]
            dropped += 1
    return dropped
