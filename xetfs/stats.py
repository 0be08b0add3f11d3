"""Counters of a mount, each group owned by the component where its events happen.

A component keeps its group as plain integers bumped at the site of the
event, and hands out copies (``statistics()``): the run store its cache
counters, the reader its decodes, store reads, prefetch requests and
errors, the pool its workers, the filesystem its requests.  ``document``
puts the copies together as the JSON of ``.xetfs/stats``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any


@dataclass
class CacheCounters:
    """The store of decoded runs (``runs.RunStore``); hits and misses count chunk lookups by reads."""

    capacity_bytes: int = 0
    bytes: int = 0  # decoded bytes held now, shared memory included
    shared_bytes: int = 0  # of those, in decode workers' shared memory
    runs: int = 0  # runs held now
    chunks: int = 0  # chunks in those runs
    hits: int = 0  # chunks a read found held, or loading for another request
    misses: int = 0  # chunks a read had to load itself
    joined: int = 0  # of the hits, chunks another request was loading
    evictions: int = 0  # runs let go to stay within capacity (or to free a slot)
    evicted_read: int = 0  # of those, runs a sequential reader had read through (let go first)


@dataclass
class LayoutCounters:
    """The cache of verified xorb layouts (``cache.LoadingCache``); each lookup is one hit or one miss."""

    capacity_bytes: int = 0
    bytes: int = 0  # held now (estimated)
    entries: int = 0  # layouts held now
    hits: int = 0
    misses: int = 0
    joined: int = 0  # of the hits, layouts another request was loading
    evictions: int = 0


@dataclass
class PrefetchCounters:
    requests: int = 0  # prefetch windows asked for
    chunks: int = 0  # chunks decoded for them
    hits: int = 0  # of those, chunks a read later used


@dataclass
class DecodeCounters:
    chunks: int = 0
    bytes: int = 0
    runs: int = 0  # store reads decoded (one run of adjacent chunks each)
    in_workers: int = 0  # chunks decoded by a worker process
    layouts_in_workers: int = 0  # xorb layouts read and checked by a worker process
    worker_fallbacks: int = 0  # jobs done in the daemon because their worker was lost


@dataclass
class StoreCounters:
    reads: int = 0
    bytes: int = 0
    layouts: int = 0  # xorb footers loaded


@dataclass
class WorkerCounters:
    workers: int = 0  # started
    alive: int = 0
    slots: int = 0  # shared-memory slots
    slot_bytes: int = 0
    free_slots: int = 0
    jobs: int = 0  # decode jobs done
    layout_jobs: int = 0
    lost: int = 0  # workers that died
    slots_returned: int = 0  # free slots whose pages were given back to the system


@dataclass
class ReadCounters:
    requests: int = 0
    bytes: int = 0


@dataclass
class ErrorCounters:
    integrity: int = 0
    missing: int = 0
    format: int = 0
    timeout: int = 0
    io: int = 0


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
class FileCounters:
    """What reads and prefetch of one file decoded (``Reader.file_statistics``); not part of ``.xetfs/stats``.

    A chunk is counted for the file whose read or prefetch loaded it, once
    per load (a chunk loaded again after eviction counts again).
    """

    chunks: int = 0  # chunks decoded
    bytes: int = 0  # decoded bytes


@dataclass
class IndexCounters:
    files: int = 0
    terms: int = 0
    xorbs: int = 0
    shards: int = 0
    shards_skipped: int = 0


def document(groups: Mapping[str, Any], started: float) -> dict[str, Any]:
    """The stats document: each counter group as a mapping, and the uptime."""
    out: dict[str, Any] = {name: asdict(group) for name, group in groups.items()}
    out["uptime_seconds"] = round(time.time() - started, 3)
    return out
