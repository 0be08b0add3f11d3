"""The one store of decoded bytes: runs of verified chunks, shared by every reader (trio).

A ``Run`` holds the decoded chunks ``[first, stop)`` of one xorb back to
back, in memory it owns: a slot of the decode workers' shared memory
(written by a worker, or by the daemon when none can take the job), or a
daemon buffer for small runs and for runs decoded while every slot is in
use.  Runs are shared by every open file
and by every file whose terms use those chunks.  For each xorb the store
keeps its runs, and the loads in progress, in chunk order without overlap,
so ``get`` can tell which runs cover a chunk range and where the gaps are.
A gap is loaded once: the range is cut into pieces (the caller's ``cut``),
each registered as a ``Load`` before it starts, and readers that need the
same chunks wait for that load.

The store is the one owner of decoded memory.  All decoded bytes count
against one limit, ``capacity``.  Which run goes first is
``order.EvictionOrder``'s: runs a sequential reader has had all of
(``read_along``: the kernel's page cache serves those bytes now), then the
least recently used.  A run a read is using is pinned and never evicted;
``release`` unpins it.  An evicted run gives its slot back at once
(``slots.Slot.release``), and its extents go from the memo of which run
holds which file bytes (``extents``, which the store keeps); nothing waits
for the garbage collector.  A load takes the slots it decodes into from the
store (``take_slots``), which evicts runs for them when none is free: the
slots of read-through runs whose xorb no other term uses are reused before
new shared memory is touched, which costs far more.

Single-threaded: call only from the trio thread that owns it.
"""

from __future__ import annotations

import bisect
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from operator import attrgetter

import trio

from xetfs.base.errors import XetfsError
from xetfs.base.settings import MIN_CACHE_FOR_PREFETCH
from xetfs.base.stats import CacheCounters, PrefetchCounters
from xetfs.read.extents import Extents
from xetfs.read.order import EvictionOrder
from xetfs.read.slots import Slot, Slots, release_all


@dataclass(eq=False, slots=True)
class Run:
    """Decoded chunks ``[first, stop)`` of a xorb: its decoded bytes ``[lo, hi)``, in ``data``."""

    xorb_hash: bytes
    first: int
    stop: int
    lo: int
    data: memoryview  # reads slice it
    slot: Slot | None = None  # the shared-memory slot ``data`` lies in, if any
    held: bool = True  # its bytes may be read; False once evicted (its memory is given back)
    pins: int = 0  # reads using it now
    prefetched: bool = False  # loaded by prefetch and not read yet
    private: bool = False  # no other term uses its xorb: once read through, nobody will ask for it again
    recent: bool = False  # hit since it took its place in the LRU order (``EvictionOrder.mark``)
    had: list[tuple[int, int]] = field(default_factory=list)  # what sequential reads have had of it (``read_along``)

    @property
    def hi(self) -> int:
        return self.lo + len(self.data)

    def view(self, lo: int, hi: int) -> memoryview:
        """Decoded xorb bytes ``[lo, hi)`` (clipped to the run); valid until the next await."""
        return self.data[max(lo, self.lo) - self.lo : min(hi, self.hi) - self.lo]


@dataclass(eq=False)
class Load:
    """Chunks ``[first, stop)`` of a xorb being loaded; waiters wait for ``done``.

    Once ``done`` is set, ``runs`` and ``errors`` say what the load made of its chunks: a chunk in
    neither was not loaded (the loading task went away), and its waiters look again.
    """

    first: int
    stop: int
    done: trio.Event = field(default_factory=trio.Event)
    runs: list[Run] = field(default_factory=list)
    errors: Mapping[int, Exception] = field(default_factory=dict)  # chunk index -> what stopped it
    waiters: int = 0  # ``get`` calls that will take its runs (the one loading it included, if any)


# What a loader made of chunks: runs for those that decoded, in order, and by chunk index the error of each
# that did not.
Loaded = tuple[list[Run], dict[int, XetfsError]]
Cut = Callable[[int, int], Sequence[tuple[int, int]]]
Spawn = Callable[..., object]  # starts a task: a nursery's ``start_soon``, say
LoadFn = Callable[[int, int], Awaitable[Loaded]]
Entry = Run | Load
_FIRST = attrgetter("first")  # entries of a xorb are kept sorted by it


def room_to_read_ahead(capacity: int) -> bool:
    """Whether a cache of ``capacity`` bytes is large enough to read ahead of readers (prefetch, read-ahead in a
    xorb): what is read ahead must stay until it is read."""
    return capacity >= MIN_CACHE_FOR_PREFETCH


class RunStore:
    def __init__(self, capacity: int, slots: Slots | None = None) -> None:
        """``slots``: the shared memory that loads take slots of (``take_slots``), if there are decode workers."""
        self.capacity = max(0, capacity)
        self.extents = Extents()
        self._slots = slots
        self._xorbs: dict[bytes, list[Entry]] = {}  # per xorb, by first chunk, never overlapping
        self._order = EvictionOrder()  # every held run
        self._c = CacheCounters(capacity_bytes=self.capacity)
        self._p = PrefetchCounters()

    def statistics(self) -> CacheCounters:
        """A snapshot of the cache counters."""
        return replace(self._c)

    def prefetch_statistics(self) -> PrefetchCounters:
        """A snapshot of the prefetch counters (requests are counted by the reader)."""
        return replace(self._p)

    # -- lookups ----------------------------------------------------------

    async def get(
        self, xorb_hash: bytes, first: int, stop: int, cut: Cut, load: LoadFn, *, prefetch: bool = False
    ) -> list[Run]:
        """Runs covering chunks ``[first, stop)``, in order; gaps are loaded with ``cut`` and ``load``.

        A read (not ``prefetch``) gets its runs pinned and must ``release``
        them; each chunk counts as one hit or one miss.  Raises the error of
        the first chunk in the range that failed to load (waiters of a load
        share its verdict).  With ``prefetch``, nothing is pinned or counted
        as a lookup, and no error is raised.
        """
        have: dict[int, Run] = {}  # by first chunk: runs pinned for this call
        counted = False
        try:
            while True:
                entries, gaps = self._cover(xorb_hash, first, stop)
                waits = []
                for entry in entries:
                    if isinstance(entry, Run):
                        if entry.first not in have:
                            have[entry.first] = self._use(entry, first, stop, prefetch, counted)
                    else:
                        waits.append(entry)
                        if not counted and not prefetch:
                            n = _overlap(entry, first, stop)
                            self._c.hits += n
                            self._c.joined += n
                pieces = [piece for lo, hi in gaps for piece in cut(lo, hi)]  # (all cut before any is registered)
                new = [self._register(xorb_hash, a, b) for a, b in pieces]
                if not prefetch and not counted:  # a later pass loads chunks already counted as hits
                    self._c.misses += sum(_overlap(ld, first, stop) for ld in new)
                counted = True
                if not waits and not new:
                    break
                flights = [*new, *waits]
                for ld in flights:
                    ld.waiters += 1
                try:
                    if len(flights) == 1:  # the common case, without a nursery's cost
                        await (self._load(xorb_hash, new[0], load, prefetch) if new else waits[0].done.wait())
                    else:
                        async with trio.open_nursery() as nursery:
                            for ld in new:
                                nursery.start_soon(self._load, xorb_hash, ld, load, prefetch)
                            for ld in waits:
                                nursery.start_soon(ld.done.wait)
                    self._take_loaded(flights, have, first, stop, prefetch)
                finally:
                    for ld in flights:
                        self._leave(ld)
                if prefetch or _covered(have, first, stop):
                    break
        except BaseException:
            if not prefetch:
                self.release(have.values())
            raise
        if prefetch:
            return []
        return [have[k] for k in sorted(have)]

    def get_soon(self, xorb_hash: bytes, first: int, stop: int, cut: Cut, load: LoadFn, spawn: Spawn) -> None:
        """``get`` as a prefetch, in tasks that ``spawn`` starts, its loads registered now: reads join them."""
        for a, b in [piece for lo, hi in self._cover(xorb_hash, first, stop)[1] for piece in cut(lo, hi)]:
            spawn(self._load, xorb_hash, self._register(xorb_hash, a, b), load, True)

    def held(self, xorb_hash: bytes, first: int, stop: int) -> list[Run] | None:
        """The held runs covering chunks ``[first, stop)``, in order, or None if any chunk is not held.

        Nothing is counted or pinned: a read that serves them before its next
        await calls ``served``.  The way reads of cached bytes avoid ``get``'s cost.
        """
        entries, gaps = self._cover(xorb_hash, first, stop)
        runs = [e for e in entries if isinstance(e, Run)]
        return runs if not gaps and len(runs) == len(entries) else None

    def vacant(self, xorb_hash: bytes, first: int, stop: int) -> bool:
        """Whether no run or load has any of chunks ``[first, stop)``: ``put`` may take them."""
        return self.vacant_until(xorb_hash, first, stop) == stop

    def vacant_until(self, xorb_hash: bytes, first: int, limit: int) -> int:
        """Where the chunks from ``first`` on that no run or load has end, at most ``limit``."""
        entries = self._xorbs.get(xorb_hash) or []
        at = bisect.bisect_right(entries, first, key=_FIRST)  # entries from here on start after ``first``
        if at and entries[at - 1].stop > first:
            return first
        return min(limit, entries[at].first) if at < len(entries) else limit

    def put(self, xorb_hash: bytes, first: int, stop: int, loaded: Loaded) -> list[Run]:
        """Hold what a read loaded at once, with no await in between, for chunks ``[first, stop)``, which were
        ``vacant``: ``get`` without its single flight, for small reads (``Loader.load_now``).  Each chunk counts
        as one miss.  The runs come back pinned, as from ``get``: ``release`` them.  Raises the error of the
        first chunk that failed to load; the runs of the others are held all the same."""
        runs, errors = loaded
        self._c.misses += stop - first
        entries = self._xorbs.setdefault(xorb_hash, [])
        for run in runs:
            bisect.insort(entries, run, key=_FIRST)
            self._hold(run)
        if not entries:
            del self._xorbs[xorb_hash]
        if errors:
            self._evict_to(self.capacity)
            raise errors[min(errors)]
        for run in runs:
            run.pins += 1
        return runs

    def served(self, runs: Sequence[Run], first: int, stop: int) -> None:
        """A read served chunks ``[first, stop)`` from ``runs`` (from ``held``): count the hits."""
        for run in runs:
            self.hit(run, _overlap(run, first, stop))

    def hit(self, run: Run, chunks: int) -> None:
        """A read served ``chunks`` chunks from ``run``, held, before its next await (``EvictionOrder.mark``)."""
        self._c.hits += chunks
        if run.prefetched:
            run.prefetched = False
            self._p.hits += run.stop - run.first
        self._order.mark(run)

    def release(self, runs: Iterable[Run]) -> None:
        """A read is done with ``runs`` (from ``get``); evict past capacity."""
        for run in runs:
            run.pins -= 1
        self._evict_to(self.capacity)

    def read_along(self, run: Run, lo: int, hi: int) -> bool:
        """A sequential reader had decoded bytes ``[lo, hi)`` of ``run``; True once such reads have had
        all of it, and it is evicted first (``EvictionOrder.read_along``)."""
        return self._order.read_along(run, lo, hi)

    def take_slots(self, sizes: Sequence[int]) -> list[Slot] | None:
        """A slot for a run of each of ``sizes`` bytes, or None (and none taken) if not enough can be had.  For
        each, in order: a free slot in memory; the slot of a private run read through (its memory is warm,
        nobody else will read those chunks, and the page cache has them); a slot never used (new memory costs
        far more); the slot of the least useful run no read is using."""
        slots, order, taken = self._slots, self._order, list[Slot]()
        if slots is None:
            return None
        for size in sizes:
            slot = slots.take(size, fresh=False)
            if slot is None and (run := order.first_read(_warm_and_private)) is not None:
                self._evict(run)
                slot = slots.take(size, fresh=False)
            if slot is None:
                slot = slots.take(size)
            if slot is None and (run := order.least_used(_in_a_slot)) is not None:
                self._evict(run)
                slot = slots.take(size)
            if slot is None:
                release_all(taken)
                return None
            taken.append(slot)
        return taken

    def clear(self) -> None:
        """Evict every run (before the slots go away)."""
        for run in self._order:
            self._evict(run)

    # -- internals ----------------------------------------------------------

    def _take_loaded(self, flights: list[Load], have: dict[int, Run], first: int, stop: int, prefetch: bool) -> None:
        """``get``'s part once ``flights`` are over: add the runs they made for chunks ``[first, stop)`` to
        ``have`` (pinned, for a read); raise the error of the first of those chunks that failed (not for
        ``prefetch``).  A cancelled load made nothing: the next pass looks again, and may load it itself."""
        for ld in flights:
            failed = [i for i in sorted(ld.errors) if first <= i < stop]
            if failed and not prefetch:
                raise ld.errors[failed[0]]
            for run in ld.runs:
                if run.first not in have and run.first < stop and run.stop > first:
                    have[run.first] = self._use(run, first, stop, prefetch, True)  # counted: as a miss or a hit

    def _use(self, run: Run, first: int, stop: int, prefetch: bool, counted: bool) -> Run:
        if prefetch:
            return run
        run.pins += 1
        self.hit(run, 0 if counted else _overlap(run, first, stop))
        self._order.touch(run)
        return run

    def _cover(self, xorb_hash: bytes, first: int, stop: int) -> tuple[list[Entry], list[tuple[int, int]]]:
        """The entries overlapping chunks ``[first, stop)`` and the gaps between them, in order."""
        entries = self._xorbs.get(xorb_hash, [])
        at = max(0, bisect.bisect_right(entries, first, key=_FIRST) - 1)
        found: list[Entry] = []
        gaps = []
        pos = first
        for entry in entries[at:]:
            if entry.first >= stop:
                break
            if entry.stop <= pos:
                continue
            if entry.first > pos:
                gaps.append((pos, entry.first))
            found.append(entry)
            pos = entry.stop
        if pos < stop:
            gaps.append((pos, stop))
        return found, gaps

    def _register(self, xorb_hash: bytes, first: int, stop: int) -> Load:
        entries = self._xorbs.setdefault(xorb_hash, [])
        ld = Load(first, stop)
        bisect.insort(entries, ld, key=_FIRST)
        self._c.loading += stop - first
        return ld

    async def _load(self, xorb_hash: bytes, ld: Load, load: LoadFn, prefetch: bool) -> None:
        try:
            ld.runs, ld.errors = await load(ld.first, ld.stop)
        except Exception as exc:  # (the reads that need the chunks raise it, not the task that loads them)
            ld.errors = dict.fromkeys(range(ld.first, ld.stop), exc)
        else:
            if prefetch:  # what prefetch decoded: not a load cancelled or failed
                self._p.chunks += sum(run.stop - run.first for run in ld.runs)
        finally:
            entries = self._xorbs[xorb_hash]  # holds ``ld`` until here, so it was never dropped
            # The runs lie within the load's chunks, in order: they take its place.
            at = _index(entries, ld)
            entries[at : at + 1] = ld.runs
            for run in ld.runs:
                run.prefetched = prefetch
                run.pins += 1  # for its waiters, until the last of them has taken what it needs (``_leave``)
                self._hold(run)
            if not entries:
                del self._xorbs[xorb_hash]
            self._c.loading -= ld.stop - ld.first
            ld.done.set()
            if not ld.waiters:  # (a load of ``get_soon`` that no read joined)
                self.release(ld.runs)

    def _leave(self, ld: Load) -> None:
        """A ``get`` is done with a load it waited for: the last one unpins its runs."""
        ld.waiters -= 1
        if ld.waiters == 0:  # (then the load is over: the ``get`` that runs it is a waiter until it ends)
            self.release(ld.runs)

    def _hold(self, run: Run) -> None:
        self._order.add(run)
        c = self._c
        c.bytes += len(run.data)
        c.shared_bytes += len(run.data) if run.slot is not None else 0
        c.runs += 1
        c.chunks += run.stop - run.first

    def _evict_to(self, limit: int) -> None:
        """Evict unpinned runs (read-through ones first, then least recently used) until ``limit`` bytes are held."""
        while self._c.bytes > limit:
            victim = self._order.least_used(lambda r: not r.pins)
            if victim is None:
                return  # the rest is in use
            self._evict(victim)

    def _evict(self, run: Run) -> None:
        c = self._c
        c.evictions += 1
        if self._order.remove(run):
            c.evicted_read += 1
        c.bytes -= len(run.data)
        if run.slot is not None:
            c.shared_bytes -= len(run.data)
        c.runs -= 1
        c.chunks -= run.stop - run.first
        entries = self._xorbs[run.xorb_hash]
        del entries[_index(entries, run)]
        if not entries:
            del self._xorbs[run.xorb_hash]
        run.held = False
        run.data = memoryview(b"")
        self.extents.forget(run)
        if run.slot is not None:
            slot, run.slot = run.slot, None
            slot.release()


def _warm_and_private(run: Run) -> bool:
    """A run in a slot that no read uses and no other term's xorb shares (``take_slots``, among runs read through)."""
    return run.private and run.slot is not None and not run.pins


def _in_a_slot(run: Run) -> bool:
    """A run in a slot that no read uses."""
    return run.slot is not None and not run.pins


def _covered(have: dict[int, Run], first: int, stop: int) -> bool:
    """Whether the runs in ``have`` cover chunks ``[first, stop)`` without a gap."""
    pos = first
    for k in sorted(have):
        run = have[k]
        if run.first > pos:
            return False
        pos = max(pos, run.stop)
    return pos >= stop


def _index(entries: list[Entry], entry: Entry) -> int:
    """Where ``entry`` is in ``entries`` (sorted by first chunk, never overlapping), found by bisection."""
    at = bisect.bisect_left(entries, entry.first, key=_FIRST)
    while entries[at] is not entry:  # (first chunks are unique: entries never overlap, none is empty)
        at += 1
    return at


def _overlap(entry: Entry, first: int, stop: int) -> int:
    return max(0, min(entry.stop, stop) - max(entry.first, first))
