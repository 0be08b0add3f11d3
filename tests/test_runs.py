"""The store of decoded runs (xetfs/read/runs.py) with a counting fake loader.

Chunk ``i`` of every xorb decodes to 10 bytes of ``i % 256``; a run's bytes
are its chunks back to back.  Concurrency is made deterministic with trio
events and ``trio.testing.wait_all_tasks_blocked`` (never sleeps).
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterator, Sequence

import pytest
import trio
import trio.testing
from helpers.served import holds

from xetfs.base.errors import IntegrityError, XetfsError
from xetfs.base.stats import WorkerCounters
from xetfs.read.runs import Loaded, Run, RunStore
from xetfs.read.slots import Slot, Slots

pytestmark = pytest.mark.unit

X = b"x" * 32
CHUNK = 10


def chunk_bytes(i: int) -> bytes:
    return bytes([i % 256]) * CHUNK


def cut_by(n: int) -> Callable[[int, int], list[tuple[int, int]]]:
    """Pieces of at most ``n`` chunks."""
    return lambda lo, hi: [(a, min(a + n, hi)) for a in range(lo, hi, n)]


class FakeLoader:
    """Counts calls; may hold them until ``gate`` is set, fail chunks in ``bad``, or put each run in a slot
    of ``slots`` (``leases``: in the order of the runs)."""

    def __init__(self, *, gated: bool = False, bad: Sequence[int] = (), slots: Slots | None = None) -> None:
        self.calls: list[tuple[int, int]] = []
        self.gate = trio.Event()
        if not gated:
            self.gate.set()
        self.bad = set(bad)
        self.slots = slots
        self.leases: list[Slot] = []

    def freed(self) -> list[int]:
        """The runs (by their order) whose slots were given back."""
        return [i for i, lease in enumerate(self.leases) if lease.released]

    async def __call__(self, first: int, stop: int) -> Loaded:
        self.calls.append((first, stop))
        await self.gate.wait()
        runs: list[Run] = []
        errors: dict[int, XetfsError] = {}
        start = first
        for i in range(first, stop + 1):
            if i == stop or i in self.bad:
                if start < i:
                    data = b"".join(chunk_bytes(k) for k in range(start, i))
                    slot = self.slots.take(len(data)) if self.slots is not None else None
                    if slot is not None:
                        self.leases.append(slot)
                    runs.append(Run(X, start, i, start * CHUNK, memoryview(data), slot))
                if i in self.bad:
                    errors[i] = IntegrityError(f"chunk {i} is bad")
                start = i + 1
        return runs, errors


def run(fn: Callable[[], Awaitable[object]]) -> object:
    return trio.run(fn)


@pytest.fixture
def slots() -> Iterator[Slots]:
    s = Slots(8, 4096, keep=8, spare_bytes=0, counters=WorkerCounters())
    yield s
    s.close()


def evict_for_a_slot(store: RunStore, slots: Slots) -> bool:
    """``store.take_slots`` of one slot when none is free: whether it found one (evicting a run for it); the
    slot is given back at once, as are the free ones taken out of the way."""
    spare = []
    while (lease := slots.take(1)) is not None:
        spare.append(lease)
    got = store.take_slots([1])
    for lease in spare + (got or []):
        lease.release()
    return got is not None


async def read(store: RunStore, first: int, stop: int, load: FakeLoader, n: int = 4) -> bytes:
    """Chunks ``[first, stop)`` joined, as a reader takes them (pinned, then released)."""
    runs = await store.get(X, first, stop, cut_by(n), load)
    try:
        return b"".join(bytes(r.view(first * CHUNK, stop * CHUNK)) for r in runs)
    finally:
        store.release(runs)


def expected(first: int, stop: int) -> bytes:
    return b"".join(chunk_bytes(i) for i in range(first, stop))


def test_gaps_are_loaded_once_in_pieces_and_then_hit() -> None:
    store, load = RunStore(10_000), FakeLoader()

    async def body() -> None:
        assert await read(store, 3, 6, load) == expected(3, 6)
        assert await read(store, 0, 12, load) == expected(0, 12)  # gaps [0, 3) and [6, 12): the latter in two pieces
        assert sorted(load.calls) == [(0, 3), (3, 6), (6, 10), (10, 12)]
        assert await read(store, 2, 11, load) == expected(2, 11)
        assert len(load.calls) == 4

    run(body)
    c = store.statistics()
    assert (c.misses, c.hits) == (12, 3 + 9)
    assert (c.runs, c.chunks, c.bytes) == (4, 12, 120)


def test_concurrent_readers_wait_for_one_load() -> None:
    store, load = RunStore(10_000), FakeLoader(gated=True)
    got: list[bytes] = []

    async def body() -> None:
        async def one(first: int, stop: int) -> None:
            got.append(await read(store, first, stop, load, n=100))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(one, 0, 8)
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(one, 2, 10)  # chunks 2-7 are loading: it waits for them, loads 8-9
            nursery.start_soon(one, 4, 6)
            await trio.testing.wait_all_tasks_blocked()
            load.gate.set()

    run(body)
    assert sorted(got) == sorted([expected(0, 8), expected(2, 10), expected(4, 6)])
    assert load.calls == [(0, 8), (8, 10)]
    c = store.statistics()
    assert c.joined == 6 + 2 and c.misses == 10 and c.hits == 8


def test_loading_counts_the_chunks_in_flight_until_their_load_ends_however_it_ends() -> None:
    """``loading`` is what a poll of the stats needs to know that nothing is still coming: the chunks of
    the loads in flight, whether they then succeed, fail or are cancelled."""
    store, load = RunStore(10_000), FakeLoader(gated=True, bad=[9])
    seen: list[int] = []

    async def body() -> None:
        async def reader(first: int, stop: int) -> None:
            with contextlib.suppress(XetfsError):
                await read(store, first, stop, load, n=100)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader, 0, 6)
            nursery.start_soon(reader, 8, 10)  # chunk 9 fails
            await trio.testing.wait_all_tasks_blocked()
            seen.append(store.statistics().loading)
            load.gate.set()
        seen.append(store.statistics().loading)
        load.gate = trio.Event()  # held again: the next load is cancelled while in flight
        with trio.move_on_after(0.01) as scope:
            await read(store, 20, 24, load, n=100)
        assert scope.cancelled_caught
        seen.append(store.statistics().loading)

    run(body)
    assert seen == [6 + 2, 0, 0]


def test_a_bad_chunk_fails_only_the_reads_that_need_it_and_is_not_kept() -> None:
    store, load = RunStore(10_000), FakeLoader(gated=True, bad=[5])
    outcomes: dict[str, object] = {}

    async def body() -> None:
        async def one(name: str, first: int, stop: int) -> None:
            try:
                outcomes[name] = await read(store, first, stop, load, n=100)
            except IntegrityError as exc:
                outcomes[name] = exc

        async with trio.open_nursery() as nursery:
            nursery.start_soon(one, "loader", 0, 10)
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(one, "waiter", 4, 6)  # shares the verdict: no second load
            nursery.start_soon(one, "neighbour", 6, 9)
            await trio.testing.wait_all_tasks_blocked()
            load.gate.set()
        assert len(load.calls) == 1
        assert await read(store, 0, 5, load) == expected(0, 5)
        with pytest.raises(IntegrityError):
            await read(store, 5, 6, load)  # tried again, and fails again
        assert load.calls[1:] == [(5, 6)]

    run(body)
    assert isinstance(outcomes["loader"], IntegrityError) and isinstance(outcomes["waiter"], IntegrityError)
    assert outcomes["neighbour"] == expected(6, 9)
    assert not holds(store, X, 5) and holds(store, X, 4) and holds(store, X, 6)


def test_a_cancelled_load_lets_its_waiters_load_it() -> None:
    store, load = RunStore(10_000), FakeLoader(gated=True)
    got: list[bytes] = []

    async def body() -> None:
        async with trio.open_nursery() as outer:
            with trio.CancelScope() as scope:
                outer.start_soon(lambda: waiter())
                async with trio.open_nursery() as inner:
                    inner.start_soon(read, store, 0, 4, load)
                    await trio.testing.wait_all_tasks_blocked()
                    scope.cancel()
            await trio.testing.wait_all_tasks_blocked()
            load.gate.set()

    async def waiter() -> None:
        await trio.testing.wait_all_tasks_blocked()
        got.append(await read(store, 0, 4, load))

    run(body)
    assert got == [expected(0, 4)]
    assert load.calls == [(0, 4), (0, 4)]


def test_lru_with_runs_read_through_evicted_first_and_slots_freed_at_once(slots: Slots) -> None:
    store, load = RunStore(40 * CHUNK, slots), FakeLoader(slots=slots)

    async def body() -> None:
        for first in (0, 10, 20, 30):  # four runs of 10 chunks fill the store
            await read(store, first, first + 10, load, n=10)
        runs = await store.get(X, 10, 20, cut_by(10), load)
        store.read_along(runs[0], runs[0].lo, runs[0].hi)  # the page cache serves these now
        store.release(runs)
        await read(store, 0, 10, load, n=10)  # 0-9 are the most recently used now
        await read(store, 40, 50, load, n=10)  # evicts 10-19 (read through) before 20-29 (oldest)
        assert not holds(store, X, 10) and holds(store, X, 20) and load.freed() == [1]
        await read(store, 50, 60, load, n=10)  # then the least recently used
        assert not holds(store, X, 20) and load.freed() == [1, 2]
        assert not runs[0].held and bytes(runs[0].data) == b""

    run(body)
    c = store.statistics()
    assert (c.evictions, c.evicted_read) == (2, 1)
    assert c.bytes == c.shared_bytes == 40 * CHUNK


def test_runs_served_from_cached_bytes_move_back_when_eviction_reaches_them(slots: Slots) -> None:
    """``hit`` (a read of cached bytes, as ``Reader`` serves one) only marks a run; eviction passes marked
    runs over once, moving them to the back, and finds a run to free when every run is marked."""
    store, load = RunStore(30 * CHUNK, slots), FakeLoader(slots=slots)

    async def body() -> None:
        runs = []
        for first in (0, 10, 20, 30):  # runs of 10 chunks in slots 0-3; the fourth evicts the oldest
            got = await store.get(X, first, first + 10, cut_by(10), load)
            store.release(got)
            runs += got
            if first == 20:
                store.hit(runs[0], 1)  # 0-9 served again from cached bytes: the oldest is 10-19 now
        assert load.freed() == [1] and holds(store, X, 0) and not runs[0].recent
        for i in (2, 3, 0):  # every run held is marked: LRU order 20-29, 30-39, 0-9
            store.hit(runs[i], 1)
        assert evict_for_a_slot(store, slots) and load.freed() == [1, 2]
        assert evict_for_a_slot(store, slots) and load.freed() == [1, 2, 3]

    run(body)
    c = store.statistics()
    assert c.evictions == 3 and c.hits == 4


def test_eviction_never_takes_a_pinned_run_marked_or_read_through(slots: Slots) -> None:
    store, load = RunStore(10_000, slots), FakeLoader(slots=slots)

    async def body() -> None:
        a = await store.get(X, 0, 10, cut_by(10), load)  # pinned: a read is using it (slot 0)
        b = await store.get(X, 10, 20, cut_by(10), load)
        store.release(b)
        store.hit(a[0], 1)
        store.hit(b[0], 1)  # both marked: the fallback must still pass over the pinned one
        assert evict_for_a_slot(store, slots) and load.freed() == [1] and a[0].held
        c = await store.get(X, 20, 30, cut_by(10), load)
        store.release(c)
        store.read_along(a[0], a[0].lo, a[0].hi)  # read through, and still pinned
        assert evict_for_a_slot(store, slots) and load.freed() == [1, 2] and a[0].held
        assert not evict_for_a_slot(store, slots)
        store.release(a)
        assert evict_for_a_slot(store, slots) and load.freed() == [0, 1, 2]

    run(body)


def test_pinned_runs_are_not_evicted_and_capacity_zero_keeps_nothing() -> None:
    store, load = RunStore(0), FakeLoader()

    async def body() -> None:
        runs = await store.get(X, 0, 4, cut_by(2), load)
        assert [r.held for r in runs] == [True, True]  # pinned: kept while the read uses them
        assert await read(store, 4, 6, load) == expected(4, 6)
        assert all(r.held for r in runs)
        store.release(runs)
        assert not any(r.held for r in runs)

    run(body)
    c = store.statistics()
    assert (c.bytes, c.runs) == (0, 0)


def test_prefetch_pins_nothing_and_counts_its_hits_once() -> None:
    store, load = RunStore(10_000), FakeLoader()

    async def body() -> None:
        assert await store.get(X, 0, 8, cut_by(4), load, prefetch=True) == []
        assert await read(store, 0, 2, load) == expected(0, 2)
        assert await read(store, 1, 3, load) == expected(1, 3)
        assert await read(store, 0, 8, load) == expected(0, 8)

    run(body)
    p = store.prefetch_statistics()
    assert (p.chunks, p.hits) == (8, 8)  # two runs of 4, each counted once when first read
    c = store.statistics()
    assert c.misses == 0 and c.hits == 2 + 2 + 8


def test_a_slot_is_taken_from_an_unpinned_run_when_none_is_free(slots: Slots) -> None:
    store, load = RunStore(10_000, slots), FakeLoader(slots=slots)

    async def body() -> None:
        pinned = await store.get(X, 0, 4, cut_by(4), load)
        await read(store, 4, 8, load)
        assert evict_for_a_slot(store, slots) and load.freed() == [1]
        assert not evict_for_a_slot(store, slots)  # the other is pinned
        store.release(pinned)
        assert evict_for_a_slot(store, slots) and load.freed() == [0, 1]

    run(body)


def test_a_private_run_read_through_gives_its_slot_first(slots: Slots) -> None:
    """With no free slot in memory, the slot of a run read through whose xorb no other term uses goes first,
    before a fresh slot and before the eviction order's first (a run read through earlier, but shared)."""
    store, load = RunStore(10_000, slots), FakeLoader(slots=slots)

    async def body() -> None:
        runs = []
        for first in (0, 4, 8):
            (run,) = await store.get(X, first, first + 4, cut_by(4), load)
            runs.append(run)
        runs[0].private = runs[1].private = True
        store.read_along(runs[2], runs[2].lo, runs[2].hi)  # read through first, but its xorb is used by other terms
        store.read_along(runs[1], runs[1].lo, runs[1].hi)
        store.release(runs)
        got = store.take_slots([1])  # fresh slots are there, but a warm one is had first
        assert got is not None and load.freed() == [1]
        (taken,) = got
        assert taken.index == load.leases[1].index
        taken.release()
        assert evict_for_a_slot(store, slots) and load.freed() == [1, 2]  # then the eviction order

    run(body)


def test_a_run_stays_pinned_until_every_waiter_of_its_load_has_it() -> None:
    # One reader loads chunks 0-4 and reads them through at once; another waited for the same load.
    # The run's slot must not be recycled before the second reader has taken the run.
    slots = Slots(1, 4096, keep=1, spare_bytes=0, counters=WorkerCounters())  # (one: its run's)
    store, load = RunStore(10_000, slots), FakeLoader(gated=True, slots=slots)
    got: list[bytes] = []
    recycled: list[bool] = []

    async def body() -> None:
        async def first_reader() -> None:
            runs = await store.get(X, 0, 4, cut_by(4), load)
            runs[0].private = True
            store.read_along(runs[0], runs[0].lo, runs[0].hi)
            store.release(runs)
            recycled.append(evict_for_a_slot(store, slots))  # the waiter has not run yet

        async def waiter() -> None:
            got.append(await read(store, 0, 4, load))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(first_reader)
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(waiter)
            await trio.testing.wait_all_tasks_blocked()
            load.gate.set()

    run(body)
    assert recycled == [False] and got == [expected(0, 4)]
    assert load.calls == [(0, 4)]  # loaded once
    # The waiter used the run after it was read through: it is back in the LRU order, no longer first to go.
    assert evict_for_a_slot(store, slots) and load.freed() == [0]
    assert store.statistics().evicted_read == 0  # evicted as the least recently used, not as read through
    slots.close()


def test_a_run_read_through_and_used_again_goes_back_to_the_lru_order(slots: Slots) -> None:
    """A run read through but then used again (a random read, from another file, or where the page cache let
    go) is not evicted first any more: the read moves it back to the end of the LRU order, and its record of
    what sequential reads had starts afresh; a read through ``get`` does the same."""
    store, load = RunStore(30 * CHUNK, slots), FakeLoader(slots=slots)

    async def body() -> None:
        runs = []
        for first in (0, 10, 20):  # slots 0-2 fill the store
            got = await store.get(X, first, first + 10, cut_by(10), load)
            store.release(got)
            runs += got
        assert store.read_along(runs[2], runs[2].lo, runs[2].hi)  # 20-29 read through
        store.hit(runs[2], 1)  # and read again: back to the LRU order, after 0-9 and 10-19
        assert runs[2].had == []
        await read(store, 30, 40, load, n=10)  # evicts the oldest, 0-9, not 20-29
        assert load.freed() == [0] and holds(store, X, 20)
        assert store.read_along(runs[1], runs[1].lo, runs[1].hi)  # 10-19 read through
        again = await store.get(X, 10, 20, cut_by(10), load)  # a read through ``get``: back in the order
        store.release(again)
        await read(store, 40, 50, load, n=10)  # evicts the least recently used: 20-29
        assert load.freed() == [0, 2] and holds(store, X, 10) and holds(store, X, 30)

    run(body)
    assert store.statistics().evicted_read == 0


def test_put_holds_what_a_read_loaded_at_once_pinned_and_counts_misses() -> None:
    store, load = RunStore(10_000), FakeLoader(gated=True)

    async def body() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(read, store, 4, 8, load)  # a load in flight: not vacant
            await trio.testing.wait_all_tasks_blocked()
            assert not store.vacant(X, 6, 7) and not store.vacant(X, 0, 5)
            assert store.vacant(X, 0, 4) and store.vacant(X, 8, 12) and store.vacant(b"y" * 32, 4, 8)
            loaded = await FakeLoader()(0, 4)
            runs = store.put(X, 0, 4, loaded)
            assert [(r.first, r.stop, r.pins) for r in runs] == [(0, 4, 1)]
            store.release(runs)
            load.gate.set()
        assert not store.vacant(X, 3, 4)
        assert await read(store, 0, 8, load) == expected(0, 8)  # both held: no other load
        assert load.calls == [(4, 8)]

    run(body)
    c = store.statistics()
    assert (c.misses, c.hits, c.runs) == (8, 8, 2)


def test_put_raises_the_first_bad_chunk_and_keeps_the_others() -> None:
    store = RunStore(10_000)

    async def body() -> None:
        loaded = await FakeLoader(bad=[2, 3])(0, 5)
        with pytest.raises(IntegrityError, match="chunk 2"):
            store.put(X, 0, 5, loaded)

    run(body)
    assert [holds(store, X, i) for i in range(5)] == [True, True, False, False, True]
    assert store.vacant(X, 2, 4)
    assert all(run.pins == 0 for run in store._order)


def test_loads_started_soon_are_joined_by_reads_and_leave_no_pin() -> None:
    """``get_soon``: its loads are registered at once (a read that comes first joins them, and loads nothing
    itself); once done, their runs are held unpinned, joined or not; cancelled, they leave nothing behind."""
    store, load = RunStore(10_000), FakeLoader(gated=True)

    async def body() -> None:
        async with trio.open_nursery() as nursery:
            store.get_soon(X, 0, 8, cut_by(4), load, nursery.start_soon)
            assert store.statistics().loading == 8 and not store.vacant(X, 0, 1)  # (registered before any task ran)
            got: list[bytes] = []

            async def reader() -> None:
                got.append(await read(store, 1, 3, load))

            nursery.start_soon(reader)
            await trio.testing.wait_all_tasks_blocked()
            load.gate.set()
        assert got == [expected(1, 3)] and sorted(load.calls) == [(0, 4), (4, 8)]  # (the read loaded nothing)
        c = store.statistics()
        assert (c.hits, c.misses, c.joined, c.loading, c.chunks) == (2, 0, 2, 0, 8)
        assert all(r.pins == 0 for r in store.held(X, 0, 8) or ()), "a run left pinned"
        assert store.prefetch_statistics().chunks == 8

    run(body)
    cancelled = RunStore(10_000)

    async def cancel() -> None:
        async with trio.open_nursery() as nursery:
            cancelled.get_soon(X, 0, 8, cut_by(4), FakeLoader(gated=True), nursery.start_soon)
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()  # (at unmount)

    run(cancel)
    c = cancelled.statistics()
    assert (c.loading, c.runs) == (0, 0) and cancelled.vacant(X, 0, 8)
