"""A byte-bounded LRU with single-flight loading (trio), for xorb layouts.

``LoadingCache`` knows nothing about xorbs: it maps hashable keys to values
whose size in bytes its ``getsizeof`` says, holds at most ``capacity`` bytes
(``cachetools.LRUCache``), and loads misses through a callable it is given.
Concurrent lookups of a key that is being loaded wait for that one load
instead of starting their own.  Statistics are counted here, at the lookup
site: every lookup is exactly one hit or one miss.

Single-threaded: call only from the trio thread that owns it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Hashable, Mapping, Sequence
from typing import Generic, TypeVar

import trio
from cachetools import LRUCache

from xetfs.base.stats import LayoutCounters

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

# A loader returns, for each key it was given, the value or the exception
# that stopped that key (so one bad chunk does not fail its neighbours).
Loader = Callable[[Sequence[K]], Awaitable[Mapping[K, V | Exception]]]


def _value(outcome: V | Exception) -> V:
    if isinstance(outcome, Exception):
        raise outcome
    return outcome


class LoadingCache(Generic[K, V]):
    def __init__(self, capacity: int, getsizeof: Callable[[V], int], counters: LayoutCounters | None = None) -> None:
        """``getsizeof``: the bytes a value counts for against ``capacity``."""
        self.capacity = max(0, capacity)
        self.counters = counters or LayoutCounters()
        self.counters.capacity_bytes = self.capacity
        self._getsizeof = getsizeof
        self._lru: LRUCache[K, V] = LRUCache(max(1, self.capacity), getsizeof=getsizeof)
        # Keys being loaded: the load's end, set once it is over, and what it made of each of its keys by
        # then (shared by the load's keys; a key left out: the loading task went away, look again).
        self._flights: dict[K, tuple[trio.Event, dict[K, V | Exception]]] = {}

    def __contains__(self, key: K) -> bool:
        return key in self._lru

    def peek_all(self, keys: Sequence[K]) -> list[V] | None:
        """The cached values of ``keys`` in order (one hit each, now the most recently used) if
        all are cached, else None: nothing is loaded or counted, and the caller looks them up with
        ``get_many`` then, which counts each lookup once."""
        values = []
        for key in keys:
            value = self._lru.get(key)
            if value is None:
                return None
            values.append(value)
        self.counters.hits += len(values)
        return values

    def keys(self) -> list[K]:
        """The cached keys (in no particular order)."""
        return list(self._lru.keys())

    @property
    def size(self) -> int:
        return int(self._lru.currsize)

    def _store(self, key: K, value: V) -> None:
        """Cache ``value`` if it fits at all; count the entries it pushes out."""
        if not self.capacity or self._getsizeof(value) > self.capacity:
            return
        before = len(self._lru) - (key in self._lru)
        self._lru[key] = value
        self.counters.evictions += before + 1 - len(self._lru)

    def _sync(self) -> None:
        self.counters.bytes = int(self._lru.currsize)
        self.counters.entries = len(self._lru)

    async def get_many(self, keys: Sequence[K], load: Loader[K, V]) -> list[V]:
        """Values for ``keys`` in order; misses are loaded with one call of ``load``.

        ``load`` receives the missing keys (in the order given) and returns a
        value or an exception for each.  The exception of a key (or one that
        ``load`` raised) propagates to this caller and to every lookup that
        was waiting for that key; when the loading task is cancelled instead,
        the waiters look again (one of them loads, the others wait for it).
        Nothing failed is cached: a later lookup loads afresh.

        A lookup that waits for another request's load counts as a hit (and
        in ``joined``) once that load has succeeded, as a miss if it failed.
        """
        found: dict[K, V] = {}
        missing: list[K] = []
        waits: list[tuple[K, tuple[trio.Event, dict[K, V | Exception]]]] = []
        c = self.counters
        for key in keys:
            value = self._lru.get(key)
            if value is not None:
                c.hits += 1
                found[key] = value
            elif key in self._flights:
                waits.append((key, self._flights[key]))
            else:
                c.misses += 1
                missing.append(key)
        if missing:
            loaded = await self._load(missing, load)
            for key in missing:
                found[key] = _value(loaded[key])
        for key, (done, outcomes) in waits:
            await done.wait()
            outcome = outcomes.get(key)
            if outcome is None:
                # The loading task was cancelled: look again (one of us loads).
                (found[key],) = await self.get_many([key], load)
            elif isinstance(outcome, Exception):
                # Waiters share the verdict rather than each trying again
                # (against a stuck store that would be one timeout each).
                c.misses += 1
                raise outcome
            else:
                c.hits += 1
                c.joined += 1
                found[key] = outcome
        return [found[key] for key in keys]

    async def _load(self, keys: list[K], load: Loader[K, V]) -> Mapping[K, V | Exception]:
        done, outcomes = flight = trio.Event(), dict[K, V | Exception]()
        for key in keys:
            self._flights[key] = flight
        try:
            outcomes.update(await load(keys))
            for key in keys:
                value = outcomes[key]
                if not isinstance(value, Exception):
                    self._store(key, value)
            self._sync()
            return outcomes
        except Exception as exc:
            for key in keys:
                outcomes.setdefault(key, exc)  # (a key the loader answered keeps its answer)
            raise
        finally:
            for key in keys:
                if self._flights.get(key) is flight:
                    del self._flights[key]
            done.set()
