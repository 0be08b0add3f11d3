"""Which held run the store of decoded runs (``runs.RunStore``) evicts first.

Runs a sequential reader has had all of go first, oldest first: the kernel's
page cache serves their bytes now (``read_along``).  The rest go least
recently used first, as a clock approximates it: a read of held bytes only
marks its run (``mark``), and the order catches up when eviction reaches it
(``least_used``); a read that loads something moves its runs back at once
(``touch``).  A read-through run that is used again goes back to the LRU
order (``mark``).

Pure: no I/O, no trio.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from xetfs.read.runs import Run


class EvictionOrder:
    def __init__(self) -> None:
        self._lru: OrderedDict[Run, None] = OrderedDict()  # least recently used first
        self._read: OrderedDict[Run, None] = OrderedDict()  # read through, evicted before the rest

    def __iter__(self) -> Iterator[Run]:
        """Every run, in the order eviction would take them if none were marked (a copy)."""
        return iter([*self._read, *self._lru])

    def add(self, run: Run) -> None:
        """A run just loaded: the back of the LRU order."""
        self._lru[run] = None

    def remove(self, run: Run) -> bool:
        """Take ``run`` out (it is evicted); True if it had been read through."""
        if run in self._read:
            del self._read[run]
            return True
        del self._lru[run]
        return False

    def touch(self, run: Run) -> None:
        """A read that loads something uses ``run``: it pays for far more than this, so to the back now."""
        run.recent = False
        if run in self._lru:
            self._lru.move_to_end(run)

    def mark(self, run: Run) -> None:
        """A read served bytes of ``run``: the least a read of cached bytes can do is mark it, and
        ``least_used`` moves it back when it gets there.  A read-through run goes back to the LRU
        order at once (``_revive``)."""
        if run in self._read:  # used again (another file, or bytes the page cache let go of)
            self._revive(run)
        else:
            run.recent = True

    def read_along(self, run: Run, lo: int, hi: int) -> bool:
        """A sequential reader had decoded bytes ``[lo, hi)`` of ``run`` (clipped to it); True once such
        reads, together, have had all its bytes: the kernel's page cache holds them now (``read_through``).

        The run keeps the ranges they had, merged (``Run.had``, a few at most), so bytes read twice
        count once and reads may come in any order.  A run whose first bytes lie before where the
        reader started, or past the end of its term, is never read through unless another sequential
        read has those bytes: the page cache does not hold them.
        """
        lo, hi = max(lo, run.lo), min(hi, run.hi)
        if lo >= hi:
            return False
        merged: list[tuple[int, int]] = []
        for a, b in sorted([*run.had, (lo, hi)]):
            if merged and a <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], b))
            else:
                merged.append((a, b))
        run.had = merged
        if merged != [(run.lo, run.hi)]:
            return False
        self.read_through(run)
        return True

    def read_through(self, run: Run) -> None:
        """Sequential reads have had all of ``run``: the page cache serves it now, evict it first."""
        if run.held and run not in self._read:
            self._lru.pop(run, None)
            self._read[run] = None
            run.recent = False  # (runs read through are never marked: a hit takes one back out)

    def first_read(self, wanted: Callable[[Run], bool]) -> Run | None:
        """The oldest read-through run ``wanted`` accepts."""
        return next((run for run in self._read if wanted(run)), None)

    def least_used(self, wanted: Callable[[Run], bool]) -> Run | None:
        """The first run ``wanted`` accepts: read-through runs first, then the least recently used.

        Marked runs met on the way go to the back, unmarked, and are passed
        over this time, unless no other run is wanted: then the oldest of
        them that is.
        """
        found = self.first_read(wanted)
        if found is not None:
            return found
        recent = []
        for run in self._lru:
            if run.recent:
                recent.append(run)
            elif wanted(run):
                found = run
                break
        for run in recent:
            run.recent = False
            self._lru.move_to_end(run)
        if found is None:  # all the others were unwanted: the oldest of those moved back
            found = next((run for run in recent if wanted(run)), None)
        return found

    def _revive(self, run: Run) -> None:
        """A read-through run is used again: back to the end of the LRU order, before the read that
        uses it records what it had, so what sequential reads had of it starts afresh with that read
        (another file's page cache has none of the rest)."""
        del self._read[run]
        run.recent = False
        run.had = []
        self._lru[run] = None
