"""A byte-bounded LRU with single-flight loading (trio).

``LoadingCache`` knows nothing about xorbs: it maps hashable keys to byte
buffers, holds at most ``capacity`` bytes (``cachetools.LRUCache`` with
``getsizeof=len``), and loads misses through a callable it is given.
Concurrent lookups of a key that is being loaded wait for that one load
instead of starting their own.  Statistics are counted here, at the lookup
site: every lookup is exactly one hit or one miss.

Single-threaded: call only from the trio thread that owns it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Hashable, Sequence, Sized
from typing import Generic, TypeVar

import trio
from cachetools import LRUCache

from xetfs.stats import CacheCounters, PrefetchCounters

K = TypeVar("K", bound=Hashable)
V = TypeVar("V", bound=Sized)

Loader = Callable[[Sequence[K]], Awaitable[dict[K, V]]]


class _Flight(Generic[K, V]):
    """One load in progress; waiters read its result once ``done`` is set."""

    def __init__(self) -> None:
        self.done = trio.Event()
        self.values: dict[K, V] = {}
        self.failed = False


class _Lru(LRUCache[K, V]):
    def __init__(self, capacity: int, on_evict: Callable[[K, V], None]) -> None:
        super().__init__(maxsize=capacity, getsizeof=len)
        self._on_evict: Callable[[K, V], None] = on_evict

    def popitem(self) -> tuple[K, V]:
        key, value = super().popitem()
        self._on_evict(key, value)
        return key, value


class LoadingCache(Generic[K, V]):
    def __init__(
        self,
        capacity: int,
        counters: CacheCounters | None = None,
        prefetch_counters: PrefetchCounters | None = None,
    ) -> None:
        self.capacity = max(0, capacity)
        self.counters = counters or CacheCounters()
        self.counters.capacity_bytes = self.capacity
        self.prefetch_counters = prefetch_counters or PrefetchCounters()
        self._lru: _Lru[K, V] = _Lru(max(1, self.capacity), self._evicted)
        self._flights: dict[K, _Flight[K, V]] = {}
        self._prefetched: set[K] = set()

    def _evicted(self, key: K, value: V) -> None:
        self.counters.evictions += 1
        self._prefetched.discard(key)

    def __contains__(self, key: K) -> bool:
        return key in self._lru

    def keys(self) -> list[K]:
        """The cached keys (in no particular order)."""
        return list(self._lru.keys())

    @property
    def size(self) -> int:
        return int(self._lru.currsize)

    def _store(self, key: K, value: V, *, prefetched: bool) -> None:
        if self.capacity and len(value) <= self.capacity:
            self._lru[key] = value
            if prefetched:
                self._prefetched.add(key)
        self._sync()

    def _sync(self) -> None:
        self.counters.bytes = int(self._lru.currsize)
        self.counters.entries = len(self._lru)

    async def get_many(self, keys: Sequence[K], load: Loader[K, V]) -> list[V]:
        """Values for ``keys`` in order; misses are loaded with one call of ``load``.

        ``load`` receives the missing keys (in the order given) and returns a
        value for each.  An exception from ``load`` propagates to this caller;
        lookups that were waiting for that load look again (one of them loads,
        the others wait for it), so a cancelled or failed load is retried
        once per waiter at most.

        A lookup that waits for another request's load counts as a hit (and
        in ``joined``) once that load has succeeded.
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
                if key in self._prefetched:
                    self._prefetched.discard(key)
                    self.prefetch_counters.hits += 1
            elif key in self._flights:
                c.joined += 1
                waits.append((key, self._flights[key]))
            else:
                c.misses += 1
                missing.append(key)
        if missing:
            found.update(await self._load(missing, load, prefetched=False))
        for key, flight in waits:
            await flight.done.wait()
            if flight.failed or key not in flight.values:
                # The load we waited for failed or was cancelled: look again.
                (found[key],) = await self.get_many([key], load)
            else:
                c.hits += 1
                found[key] = flight.values[key]
                if key in self._prefetched:
                    self._prefetched.discard(key)
                    self.prefetch_counters.hits += 1
        return [found[key] for key in keys]

    async def prefetch(self, keys: Sequence[K], load: Loader[K, V]) -> int:
        """Load the keys that are neither cached nor loading; returns how many were loaded.

        Keys already present are not counted as lookups.
        """
        missing = [k for k in keys if k not in self._lru and k not in self._flights]
        if not missing:
            return 0
        self.counters.misses += len(missing)
        self.prefetch_counters.chunks += len(missing)
        await self._load(missing, load, prefetched=True)
        return len(missing)

    async def _load(self, keys: list[K], load: Loader[K, V], *, prefetched: bool) -> dict[K, V]:
        flight: _Flight[K, V] = _Flight()
        for key in keys:
            self._flights[key] = flight
        try:
            values = await load(keys)
            flight.values = values
            for key in keys:
                self._store(key, values[key], prefetched=prefetched)
            return values
        except BaseException:
            flight.failed = True
            raise
        finally:
            for key in keys:
                if self._flights.get(key) is flight:
                    del self._flights[key]
            flight.done.set()
