"""A byte-bounded LRU with single-flight loading (trio), for xorb layouts.

``LoadingCache`` knows nothing about xorbs: it maps hashable keys to sized
values, holds at most ``capacity`` bytes (``cachetools.LRUCache`` with
``getsizeof=len``), and loads misses through a callable it is given.
Concurrent lookups of a key that is being loaded wait for that one load
instead of starting their own.  Statistics are counted here, at the lookup
site: every lookup is exactly one hit or one miss.

Single-threaded: call only from the trio thread that owns it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Hashable, Mapping, Sequence, Sized
from typing import Generic, TypeVar

import trio
from cachetools import LRUCache

from xetfs.base.stats import LayoutCounters

K = TypeVar("K", bound=Hashable)
V = TypeVar("V", bound=Sized)

# A loader returns, for each key it was given, the value or the exception
# that stopped that key (so one bad chunk does not fail its neighbours).
Loader = Callable[[Sequence[K]], Awaitable[Mapping[K, V | Exception]]]


class _Flight(Generic[K, V]):
    """One load in progress; waiters read its result once ``done`` is set."""

    def __init__(self) -> None:
        self.done = trio.Event()
        self.values: Mapping[K, V | Exception] = {}
        self.error: BaseException | None = None  # the loader itself raised


def _value(outcome: V | Exception) -> V:
    if isinstance(outcome, Exception):
        raise outcome
    return outcome


class _Lru(LRUCache[K, V]):
    def __init__(self, capacity: int, on_evict: Callable[[K, V], None]) -> None:
        super().__init__(maxsize=capacity, getsizeof=len)
        self._on_evict: Callable[[K, V], None] = on_evict

    def popitem(self) -> tuple[K, V]:
        key, value = super().popitem()
        self._on_evict(key, value)
        return key, value


class LoadingCache(Generic[K, V]):
    def __init__(self, capacity: int, counters: LayoutCounters | None = None) -> None:
        self.capacity = max(0, capacity)
        self.counters = counters or LayoutCounters()
        self.counters.capacity_bytes = self.capacity
        self._lru: _Lru[K, V] = _Lru(max(1, self.capacity), self._evicted)
        self._flights: dict[K, _Flight[K, V]] = {}

    def _evicted(self, key: K, value: V) -> None:
        self.counters.evictions += 1

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
        if self.capacity and len(value) <= self.capacity:
            self._lru[key] = value

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
        waits: list[tuple[K, _Flight[K, V]]] = []
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
        for key, flight in waits:
            await flight.done.wait()
            outcome = flight.values.get(key, flight.error)
            if isinstance(outcome, Exception):
                # Waiters share the verdict rather than each trying again
                # (against a stuck store that would be one timeout each).
                c.misses += 1
                raise outcome
            if outcome is None or isinstance(outcome, BaseException):
                # The loading task was cancelled: look again (one of us loads).
                (found[key],) = await self.get_many([key], load)
            else:
                c.hits += 1
                c.joined += 1
                found[key] = outcome
        return [found[key] for key in keys]

    async def _load(self, keys: list[K], load: Loader[K, V]) -> Mapping[K, V | Exception]:
        flight: _Flight[K, V] = _Flight()
        for key in keys:
            self._flights[key] = flight
        try:
            values = await load(keys)
            flight.values = values
            for key in keys:
                value = values[key]
                if not isinstance(value, Exception):
                    self._store(key, value)
            self._sync()
            return values
        except BaseException as exc:
            flight.error = exc
            raise
        finally:
            for key in keys:
                if self._flights.get(key) is flight:
                    del self._flights[key]
            flight.done.set()
