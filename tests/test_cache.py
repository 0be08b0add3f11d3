"""LoadingCache (xetfs/read/cache.py) through its statistics, with a counting fake
loader.  Concurrency is made deterministic with trio events and
``trio.testing.wait_all_tasks_blocked`` (never sleeps).
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Sequence
from functools import partial

import pytest
import trio
import trio.testing
from cachetools import TTLCache

from xetfs.base.settings import BAD_LAYOUT_SECONDS
from xetfs.base.stats import LayoutCounters
from xetfs.read.cache import LoadingCache

pytestmark = pytest.mark.unit


def value_of(key: int) -> bytes:
    """The value a key loads to: ``key % 7 + 1`` copies of one byte (sizes 1..7)."""
    return bytes([key % 256]) * (key % 7 + 1)


class Boom(Exception):
    pass


class FakeLoader:
    """Counts calls (the keys loaded, in order); can hold every call until ``release()`` and fail on demand."""

    def __init__(self, *, gated: bool = False) -> None:
        self.calls: list[int] = []
        self.gate = trio.Event()
        if not gated:
            self.gate.set()
        self.started = trio.Event()
        self.fail_next = 0

    def release(self) -> None:
        self.gate.set()

    async def __call__(self, key: int) -> bytes:
        self.calls.append(key)
        self.started.set()
        await self.gate.wait()
        if self.fail_next:
            self.fail_next -= 1
            raise Boom(f"cannot load {key}")
        return value_of(key)


async def get_all(cache: LoadingCache[int, bytes], keys: Sequence[int], load: FakeLoader) -> list[bytes]:
    """``cache.get`` of each key in turn."""
    return [await cache.get(key, load) for key in keys]


def _cache(capacity: int) -> LoadingCache[int, bytes]:
    return LoadingCache(capacity, len, LayoutCounters())


def _check_invariants(cache: LoadingCache[int, bytes], lookups: int) -> None:
    c = cache.counters
    assert c.hits + c.misses == lookups
    assert c.bytes == cache.size <= cache.capacity
    assert c.entries == len(cache.keys())
    assert cache.size == sum(len(value_of(k)) for k in cache.keys())  # noqa: SIM118 (a list, not a dict)


# -- basics ------------------------------------------------------------------------


def test_hits_misses_and_values() -> None:
    async def main() -> None:
        cache = _cache(1000)
        load = FakeLoader()
        assert await get_all(cache, [1, 2, 3], load) == [value_of(1), value_of(2), value_of(3)]
        assert load.calls == [1, 2, 3]
        assert await get_all(cache, [3, 4, 1], load) == [value_of(3), value_of(4), value_of(1)]
        assert load.calls == [1, 2, 3, 4]
        assert (cache.counters.hits, cache.counters.misses) == (2, 4)
        assert await get_all(cache, [], load) == []
        assert cache.counters.capacity_bytes == 1000
        assert 2 in cache and 99 not in cache
        _check_invariants(cache, 6)

    trio.run(main)


@pytest.mark.parametrize("capacity", [0, 1, 7, 20, 64, 1000])
@pytest.mark.parametrize("seed", range(4))
def test_random_workload_against_a_model(capacity: int, seed: int) -> None:
    """Byte bound after every step, LRU order, hit/miss/eviction counts equal a model LRU."""
    rng = random.Random(seed * 1000 + capacity)

    async def main() -> None:
        cache = _cache(capacity)
        load = FakeLoader()
        model: OrderedDict[int, int] = OrderedDict()  # key -> size, least recently used first
        hits = misses = evictions = lookups = 0
        for _ in range(300):
            keys = rng.sample(range(40), rng.randint(0, 6))
            missing = []
            for k in keys:  # (looked up one after the other: a load may evict a key looked up before it)
                lookups += 1
                if k in model:
                    hits += 1
                    model.move_to_end(k)
                    continue
                misses += 1
                missing.append(k)
                size = len(value_of(k))
                if capacity and size <= capacity:
                    while sum(model.values()) + size > capacity:
                        model.popitem(last=False)
                        evictions += 1
                    model[k] = size
            before = len(load.calls)
            assert await get_all(cache, keys, load) == [value_of(k) for k in keys]
            assert load.calls[before:] == missing
            assert sorted(cache.keys()) == sorted(model)
            c = cache.counters
            assert (c.hits, c.misses, c.evictions) == (hits, misses, evictions)
            _check_invariants(cache, lookups)

    trio.run(main)


def test_lru_evicts_least_recently_used() -> None:
    async def main() -> None:
        # keys 0, 7, 14, 21 all load to 1 byte; room for three
        cache = _cache(3)
        load = FakeLoader()
        await get_all(cache, [0, 7, 14], load)
        await get_all(cache, [0], load)  # touch 0: now 7 is the oldest
        await get_all(cache, [21], load)
        assert 7 not in cache and {0, 14, 21} <= set(cache.keys())
        assert cache.counters.evictions == 1
        await get_all(cache, [28], load)  # then 14
        assert 14 not in cache and {0, 21, 28} <= set(cache.keys())
        await get_all(cache, [7], load)  # reloaded; evicts 0, untouched since
        assert load.calls == [0, 7, 14, 21, 28, 7]
        assert set(cache.keys()) == {21, 28, 7}
        assert cache.counters.evictions == 3
        _check_invariants(cache, 7)

    trio.run(main)


def test_membership_test_does_not_touch() -> None:
    async def main() -> None:
        cache = _cache(2)
        load = FakeLoader()
        await get_all(cache, [0, 7], load)
        assert 0 in cache
        await get_all(cache, [14], load)
        assert 0 not in cache and set(cache.keys()) == {7, 14}

    trio.run(main)


def test_capacity_zero_retains_nothing() -> None:
    async def main() -> None:
        cache = _cache(0)
        load = FakeLoader()
        for _ in range(3):
            assert await get_all(cache, [1, 2], load) == [value_of(1), value_of(2)]
        assert load.calls == [1, 2] * 3
        assert cache.keys() == [] and cache.size == 0
        assert (cache.counters.hits, cache.counters.misses, cache.counters.evictions) == (0, 6, 0)
        _check_invariants(cache, 6)

    trio.run(main)


def test_negative_capacity_is_zero() -> None:
    async def main() -> None:
        cache = _cache(-5)
        assert cache.capacity == 0
        assert await get_all(cache, [3], FakeLoader()) == [value_of(3)]
        assert cache.size == 0

    trio.run(main)


def test_value_larger_than_capacity_is_returned_not_kept() -> None:
    async def main() -> None:
        cache = _cache(4)
        load = FakeLoader()
        await get_all(cache, [0, 1], load)  # 1 + 2 bytes
        assert await get_all(cache, [6], load) == [value_of(6)]  # 7 bytes > capacity
        assert cache.keys() == [0, 1]  # nothing evicted for it
        assert cache.counters.evictions == 0
        _check_invariants(cache, 3)

    trio.run(main)


# -- failures ------------------------------------------------------------------------


def test_loader_failure_propagates_and_nothing_is_cached() -> None:
    async def main() -> None:
        cache = _cache(100)
        load = FakeLoader()
        load.fail_next = 1
        with pytest.raises(Boom):
            await cache.get(1, load)
        assert cache.keys() == []
        assert await get_all(cache, [1, 2], load) == [value_of(1), value_of(2)]  # no stale flight left
        assert load.calls == [1, 1, 2]
        _check_invariants(cache, 3)

    trio.run(main)


def test_a_remembered_failure_fails_again_at_once_until_it_expires(monkeypatch: pytest.MonkeyPatch) -> None:
    """A load that fails with an error the cache is told to remember (a layout that failed its check) is not
    tried again for ``BAD_LAYOUT_SECONDS``: the lookups fail at once, each a miss; other keys load."""
    now = [0.0]
    monkeypatch.setattr("xetfs.read.cache.TTLCache", partial(TTLCache, timer=lambda: now[0]))

    async def main() -> None:
        cache: LoadingCache[int, bytes] = LoadingCache(100, len, LayoutCounters(), remember=(Boom,))
        load = FakeLoader()
        load.fail_next = 1
        for _ in range(3):
            with pytest.raises(Boom, match="cannot load 1"):
                await cache.get(1, load)
        assert await cache.get(2, load) == value_of(2)
        assert load.calls == [1, 2]
        _check_invariants(cache, 4)
        now[0] += BAD_LAYOUT_SECONDS
        assert await cache.get(1, load) == value_of(1)
        assert load.calls == [1, 2, 1]

    trio.run(main)


# -- single flight ---------------------------------------------------------------------


@pytest.mark.parametrize("waiters", [1, 2, 10])
def test_single_flight(waiters: int) -> None:
    async def main() -> None:
        cache = _cache(1000)
        load = FakeLoader(gated=True)
        results: list[bytes] = []

        async def ask() -> None:
            results.append(await cache.get(5, load))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(ask)
            await load.started.wait()
            for _ in range(waiters):
                nursery.start_soon(ask)
            await trio.testing.wait_all_tasks_blocked()
            assert load.calls == [5]  # the others are waiting, not loading
            load.release()
        assert load.calls == [5]
        assert results == [value_of(5)] * (waiters + 1)
        c = cache.counters
        assert (c.misses, c.hits, c.joined) == (1, waiters, waiters)
        _check_invariants(cache, waiters + 1)

    trio.run(main)


def test_single_flight_per_key() -> None:
    """A lookup of another key while one loads is not held up by it, and loads its own."""

    async def main() -> None:
        cache = _cache(1000)
        slow = FakeLoader(gated=True)
        got: dict[str, bytes] = {}

        async def ask(name: str, key: int, load: FakeLoader) -> None:
            got[name] = await cache.get(key, load)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(ask, "a", 1, slow)
            await slow.started.wait()
            other = FakeLoader()
            await ask("b", 2, other)  # answered while 1 still loads
            assert got == {"b": value_of(2)} and other.calls == [2]
            nursery.start_soon(ask, "c", 1, other)  # joins the load of 1
            await trio.testing.wait_all_tasks_blocked()
            slow.release()
        assert got == {"a": value_of(1), "b": value_of(2), "c": value_of(1)}
        assert slow.calls == [1] and other.calls == [2]
        c = cache.counters
        assert (c.misses, c.hits, c.joined) == (2, 1, 1)

    trio.run(main)


def test_failed_load_is_shared_with_its_waiters_then_retried_later() -> None:
    """Waiters of a failed load get its error at once (one load, not one per waiter)."""

    async def main() -> None:
        cache = _cache(1000)
        load = FakeLoader(gated=True)
        load.fail_next = 1
        outcome: dict[str, object] = {}

        async def attempt(name: str) -> None:
            try:
                outcome[name] = await cache.get(8, load)
            except Boom as exc:
                outcome[name] = exc

        async with trio.open_nursery() as nursery:
            nursery.start_soon(attempt, "first")
            await load.started.wait()
            for k in range(5):
                nursery.start_soon(attempt, f"w{k}")
            await trio.testing.wait_all_tasks_blocked()
            load.release()
        assert all(isinstance(outcome[n], Boom) for n in ["first", *(f"w{k}" for k in range(5))])
        assert load.calls == [8]
        c = cache.counters
        assert (c.hits, c.misses, c.joined) == (0, 6, 0)  # the waiters shared the failure: no join counted
        assert 8 not in cache
        assert await cache.get(8, load) == value_of(8)  # nothing failed was kept
        assert load.calls == [8, 8]

    trio.run(main)


def test_cancelling_the_loader_task_lets_waiters_retry() -> None:
    async def main() -> None:
        cache = _cache(1000)
        load = FakeLoader(gated=True)
        values: list[bytes] = []
        loading = trio.CancelScope()

        async def first() -> None:
            with loading:
                await cache.get(9, load)

        async def waiter() -> None:
            values.append(await cache.get(9, load))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(first)
            await load.started.wait()
            nursery.start_soon(waiter)
            await trio.testing.wait_all_tasks_blocked()
            assert cache.counters.joined == 0  # counted when the load it waits for succeeds
            loading.cancel()  # the loading task gives up; the waiter must not
            await trio.testing.wait_all_tasks_blocked()
            load.release()
        assert loading.cancelled_caught
        assert values == [value_of(9)]
        assert load.calls == [9, 9]
        assert 9 in cache
        c = cache.counters
        assert (c.hits, c.misses, c.joined) == (0, 2, 0)  # the waiter's lookup counts once: its own load

    trio.run(main)


def test_peek_all_counts_hits_only_when_all_are_cached_and_leaves_the_rest_to_get() -> None:
    cache = _cache(1000)

    async def body() -> None:
        assert cache.peek_all([8]) is None
        await cache.get(8, FakeLoader())  # one miss
        assert cache.peek_all([8, 9]) is None  # 9 is not cached: nothing counted
        assert await get_all(cache, [8, 9], FakeLoader()) == [value_of(8), value_of(9)]  # a hit, a miss
        assert cache.peek_all([9, 8]) == [value_of(9), value_of(8)]  # two hits

    trio.run(body)
    c = cache.counters
    assert (c.hits, c.misses, c.entries) == (3, 2, 2)
