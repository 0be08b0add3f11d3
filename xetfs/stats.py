"""Live counters of a mount or reader, and their frozen snapshot.

Counters are plain integers bumped at the site where the event happens
(the cache counts its own hits and misses, the reader its decodes).  A
``Snapshot`` is an immutable nested mapping, ready for JSON.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any


@dataclass
class CacheCounters:
    capacity_bytes: int = 0
    bytes: int = 0
    entries: int = 0
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    joined: int = 0  # lookups that waited for another request's load (counted as hits too)
    dropped: int = 0  # entries let go once a sequential read had passed them (not evictions)


@dataclass
class DecodeCounters:
    chunks: int = 0
    bytes: int = 0
    in_workers: int = 0  # of those chunks, decoded by a worker process
    layouts_in_workers: int = 0  # xorb layouts read and checked by a worker process
    worker_fallbacks: int = 0  # runs decoded in the daemon because their worker was lost


@dataclass
class StoreCounters:
    reads: int = 0
    bytes: int = 0
    layouts: int = 0  # xorb footers loaded
    timeouts: int = 0


@dataclass
class ReadCounters:
    requests: int = 0
    bytes: int = 0


@dataclass
class PrefetchCounters:
    requests: int = 0
    chunks: int = 0
    hits: int = 0


@dataclass
class StreamCounters:
    """Runs decoded for sequential readers and held apart from the cache (``stream.Budget``)."""

    limit_bytes: int = 0
    bytes: int = 0  # held now
    runs: int = 0  # decoded and held
    chunks: int = 0  # in those runs
    read_chunks: int = 0  # of those, in runs read to their end
    evicted: int = 0  # runs let go unread to stay within the limit, or held unread for seconds
    unread: int = 0  # runs let go unread because their reader moved elsewhere or closed the file


@dataclass
class ErrorCounters:
    integrity: int = 0
    missing: int = 0
    format: int = 0
    timeout: int = 0


@dataclass
class RemoteCounters:
    """Requests to a remote store, and its on-disk cache (zero for a local store)."""

    requests: int = 0  # sent, retries included
    bytes: int = 0  # received
    retries: int = 0
    errors: int = 0  # failed requests (some were retried)
    in_flight: int = 0  # calls waiting for the server now
    disk_hits: int = 0
    disk_misses: int = 0
    disk_bytes: int = 0  # held in the disk cache, as this mount last counted it
    disk_evictions: int = 0
    disk_corrupt: int = 0  # entries that failed their check: dropped and fetched again
    disk_write_errors: int = 0  # entries not written (a full disk, say); their bytes were served anyway
    failed_reads: int = 0  # reads that failed with EIO because the server could not be reached or refused


@dataclass
class IndexCounters:
    files: int = 0
    terms: int = 0
    xorbs: int = 0
    shards: int = 0
    shards_skipped: int = 0


@dataclass
class Stats:
    cache: CacheCounters = field(default_factory=CacheCounters)
    decode: DecodeCounters = field(default_factory=DecodeCounters)
    store: StoreCounters = field(default_factory=StoreCounters)
    reads: ReadCounters = field(default_factory=ReadCounters)
    prefetch: PrefetchCounters = field(default_factory=PrefetchCounters)
    stream: StreamCounters = field(default_factory=StreamCounters)
    errors: ErrorCounters = field(default_factory=ErrorCounters)
    index: IndexCounters = field(default_factory=IndexCounters)
    remote: RemoteCounters = field(default_factory=RemoteCounters)
    started: float = field(default_factory=time.time)

    def snapshot(self) -> Snapshot:
        groups: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "started":
                continue
            groups[f.name] = MappingProxyType({g.name: getattr(value, g.name) for g in fields(value)})
        groups["uptime_seconds"] = round(time.time() - self.started, 3)
        return Snapshot(MappingProxyType(groups))


@dataclass(frozen=True)
class Snapshot:
    """An immutable copy of the counters at one moment."""

    groups: MappingProxyType[str, Any]

    def __getitem__(self, key: str) -> Any:
        return self.groups[key]

    def to_dict(self) -> dict[str, Any]:
        return {k: dict(v) if isinstance(v, MappingProxyType) else v for k, v in self.groups.items()}
