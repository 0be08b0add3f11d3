"""A byte-bounded LRU with single-flight loading (trio), for xorb layouts.

``LoadingCache`` knows nothing about xorbs: it maps hashable keys to values
whose size in bytes its ``getsizeof`` says, holds at most ``capacity`` bytes
(``cachetools.LRUCache``), and loads misses through a callable it is given.
Concurrent lookups of a key that is being loaded wait for that one load
instead of starting their own.  A load that fails with one of the errors it
is told to ``remember`` fails again at once for ``BAD_LAYOUT_SECONDS`` (of
the last ``BAD_LAYOUTS_KEPT`` keys): readers and the kernel retry a failed
read at once, and loading a layout again may mean reading and hashing a
whole xorb.  Statistics are counted here, at the lookup site: every lookup
is exactly one hit or one miss.

Single-threaded: call only from the trio thread that owns it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import Generic, TypeVar

import trio
from cachetools import LRUCache, TTLCache

from xetfs.base.settings import BAD_LAYOUT_SECONDS, BAD_LAYOUTS_KEPT
from xetfs.base.stats import LayoutCounters

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LoadingCache(Generic[K, V]):
    def __init__(
        self, capacity: int, getsizeof: Callable[[V], int], counters: LayoutCounters | None = None,
        *, remember: tuple[type[Exception], ...] = (),
    ) -> None:  # fmt: skip
        """``getsizeof``: the bytes a value counts for against ``capacity``; ``remember``: the errors of a load
        that its key fails with again at once, for a while."""
        self.capacity = max(0, capacity)
        self.counters = counters or LayoutCounters()
        self.counters.capacity_bytes = self.capacity
        self._getsizeof = getsizeof
        self._lru: LRUCache[K, V] = LRUCache(max(1, self.capacity), getsizeof=getsizeof)
        # Keys being loaded: the load's end, set once it is over, and what it made of the key by then (its
        # value or exception; nothing: the loading task was cancelled, look again).
        self._flights: dict[K, tuple[trio.Event, list[V | Exception]]] = {}
        self._remember = remember
        self._failed: TTLCache[K, Exception] = TTLCache(maxsize=BAD_LAYOUTS_KEPT, ttl=BAD_LAYOUT_SECONDS)

    def __contains__(self, key: K) -> bool:
        return key in self._lru

    def peek_all(self, keys: Sequence[K]) -> list[V] | None:
        """The cached values of ``keys`` in order (one hit each, now the most recently used) if
        all are cached, else None: nothing is loaded or counted, and the caller looks them up with
        ``get`` then, which counts each lookup once."""
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

    async def get(self, key: K, load: Callable[[K], Awaitable[V]]) -> V:
        """The value of ``key``; a miss is loaded with ``load(key)``.

        A lookup of a key that is being loaded waits for that load and shares
        its outcome: its value (a hit, counted in ``joined`` too) or its
        exception (a miss; against a stuck store, one timeout for all rather
        than one each).  When the loading task is cancelled instead, the
        waiters look again (one of them loads, the others wait for it).
        No value is kept for a failed load: a later lookup loads afresh,
        unless the error is one to ``remember`` (then it fails again at once
        for a while).
        """
        c = self.counters
        while True:
            value = self._lru.get(key)
            if value is not None:
                c.hits += 1
                return value
            flight = self._flights.get(key)
            if flight is None:
                c.misses += 1
                return await self._load(key, load)
            done, outcome = flight
            await done.wait()
            if outcome:  # (else the loading task was cancelled: look again)
                (got,) = outcome
                if isinstance(got, Exception):
                    c.misses += 1
                    raise got
                c.hits += 1
                c.joined += 1
                return got

    async def _load(self, key: K, load: Callable[[K], Awaitable[V]]) -> V:
        done, outcome = flight = trio.Event(), list[V | Exception]()
        self._flights[key] = flight
        try:
            failed = self._failed.get(key)
            if failed is not None:
                raise failed.with_traceback(None)
            try:
                value = await load(key)
            except self._remember as exc:
                self._failed[key] = exc
                raise
            self._store(key, value)
            self._sync()
            outcome.append(value)
            return value
        except Exception as exc:
            outcome[:] = [exc]
            raise
        finally:
            if self._flights.get(key) is flight:
                del self._flights[key]
            done.set()
