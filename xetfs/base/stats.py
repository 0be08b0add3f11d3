"""Counters of a mount, each group owned by the component where its events happen.

A component keeps its group as plain integers bumped at the site of the
event, and hands out copies (``statistics()``): the run store its cache
counters, the reader its decodes, store reads, prefetch requests and
errors, the pool its workers, the filesystem its requests.  ``document``
puts the copies together as the JSON of ``.xetfs/stats``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, ClassVar


@dataclass
class CacheCounters:
    """The store of decoded runs (``runs.RunStore``); hits and misses count chunk lookups by reads.  A chunk
    that prefetch decoded before a read asked for it counts as a hit: a first read of a file that prefetch kept
    ahead of shows a high hit ratio."""

    capacity_bytes: int = 0  # the bound of decoded bytes held (--cache-size)
    bytes: int = 0  # decoded bytes held now, shared memory included
    shared_bytes: int = 0  # of those, in decode workers' shared memory
    runs: int = 0  # runs held now
    chunks: int = 0  # chunks in those runs
    hits: int = 0  # chunks a read found held, or loading for another request
    misses: int = 0  # chunks a read had to load itself
    joined: int = 0  # of the hits, chunks another request was loading
    loading: int = 0  # chunks being loaded now, for reads and prefetch (not yet in ``chunks``)
    evictions: int = 0  # runs let go to stay within capacity, or to give their slot to a new run
    evicted_read: int = 0  # of those, runs a sequential reader had read through (let go first)


@dataclass
class LayoutCounters:
    """The cache of verified xorb layouts (``cache.LoadingCache``); each lookup is one hit or one miss."""

    capacity_bytes: int = 0  # the bound of this cache (32 MiB)
    bytes: int = 0  # held now (estimated)
    entries: int = 0  # layouts held now
    hits: int = 0  # lookups that found the layout held, or loading for another request
    misses: int = 0  # lookups that loaded the layout (footer and chunk hashes, tied to the xorb's name)
    joined: int = 0  # of the hits, layouts another request was loading
    evictions: int = 0  # layouts let go to stay within capacity


@dataclass
class PrefetchCounters:
    """Decoding ahead of sequential readers (the reader and the run store), and of small files read in the order
    they were packed (``read.readahead``); all 0 with ``--no-prefetch``."""

    requests: int = 0  # prefetch windows asked for (a stretch of a xorb read ahead of small files is one)
    chunks: int = 0  # chunks decoded for them
    hits: int = 0  # of those, chunks a read later used (a prefetched run counts whole at its first read)


@dataclass
class DecodeCounters:
    """Chunks decoded and verified (the loader), in the daemon or in decode workers."""

    chunks: int = 0  # chunks decoded and verified
    bytes: int = 0  # their decoded bytes
    runs: int = 0  # store reads decoded (one run of adjacent chunks each)
    in_workers: int = 0  # chunks decoded by a worker process
    layouts_in_workers: int = 0  # xorb layouts read and checked by a worker process
    worker_fallbacks: int = 0  # jobs done in the daemon because their worker was lost


@dataclass
class StoreCounters:
    """Reads of the store's xorb files or objects (the loader)."""

    reads: int = 0  # reads of xorb chunk bytes
    bytes: int = 0  # their size
    layouts: int = 0  # xorb footers loaded


@dataclass
class WorkerCounters:
    """The decode worker processes and their shared-memory slots (the decode pool)."""

    workers: int = 0  # started
    alive: int = 0  # still running
    slots: int = 0  # shared-memory slots (one run each; address space: only runs held use memory, in --cache-size)
    slot_bytes: int = 0  # the size of one slot
    free_slots: int = 0  # slots holding no run
    jobs: int = 0  # decode jobs done
    layout_jobs: int = 0  # xorb layout jobs done
    lost: int = 0  # workers that died (or were stopped)
    hung: int = 0  # of those, workers stopped because a job took longer than --io-timeout
    slots_returned: int = 0  # free slots whose pages were given back to the system


@dataclass
class ReadCounters:
    """FUSE read requests of files (the filesystem)."""

    requests: int = 0  # read requests of files
    bytes: int = 0  # bytes returned


@dataclass
class ErrorCounters:
    """Read requests that failed with EIO, by cause (the reader); a remote server out of reach counts in ``remote``.

    The kernel asks again for a page whose read failed, so one failed read by a program often counts twice
    here, while the log says each failure once.
    """

    integrity: int = 0  # a hash did not match
    missing: int = 0  # an object the file needs is not in the store
    format: int = 0  # malformed data
    timeout: int = 0  # a store read took longer than --io-timeout
    io: int = 0  # a store file could not be opened or read (no permission, a disk I/O error)


@dataclass
class RemoteCounters:
    """Requests to a remote store, and its on-disk cache (zero for a local store)."""

    # The request counters (``REQUESTS``) are added to from several threads: under this lock.
    lock: ClassVar[threading.Lock] = threading.Lock()

    requests: int = 0  # sent, retries included
    bytes: int = 0  # received
    retries: int = 0  # requests sent again after a failure
    errors: int = 0  # failed requests (some were retried); "not found" is an answer, not one of them
    in_flight: int = 0  # calls waiting for the server now
    ranges: int = 0  # range requests answered
    wait_s: float = 0.0  # seconds those waited for their answers to start, summed (through obstore: to their end)
    disk_hits: int = 0  # entries found in the disk cache (this mount's own too: a xorb's tail, kept with its footer)
    disk_misses: int = 0  # entries the disk cache did not have (fetched from the server)
    disk_bytes: int = 0  # held in the disk cache, as this mount last counted it
    disk_evictions: int = 0  # entries this mount deleted to keep the disk cache within its bound
    disk_corrupt: int = 0  # entries that failed their check: dropped and fetched again
    disk_write_errors: int = 0  # entries not written (a full disk, say); their bytes were served anyway
    failed_reads: int = 0  # reads that failed with EIO because the server could not be reached or refused
    hung: int = 0  # times the store was taken for hung: a fetch ran out of time, and none answered meanwhile
    not_requested: int = 0  # fetches failed at once meanwhile, not asked of the store (their reads count as timeouts)

    REQUESTS: ClassVar[tuple[str, ...]] = ("requests", "bytes", "retries", "errors", "ranges", "wait_s")

    def add(self, other: RemoteCounters) -> None:
        """Add the request counters of ``other`` (what a decode worker's fetches cost) to these."""
        with self.lock:
            for name in self.REQUESTS:
                setattr(self, name, getattr(self, name) + getattr(other, name))

    def since(self, before: RemoteCounters) -> RemoteCounters:
        """The request counters added since ``before``, a copy of these taken earlier."""
        return RemoteCounters(**{name: getattr(self, name) - getattr(before, name) for name in self.REQUESTS})


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
    """What the mount indexed when it started (the indexer)."""

    files: int = 0  # files in the index
    terms: int = 0  # their terms (xorb chunk ranges)
    xorbs: int = 0  # xorbs a term refers to or a shard's CAS section lists
    shards: int = 0  # shards indexed
    shards_skipped: int = 0  # bad shards skipped with a warning (--strict refuses them instead)


@dataclass
class RefreshCounters:
    """Refreshes of the live mount (``xetfs refresh``, ``--refresh-every``): what they added, when, how many failed."""

    refreshes: int = 0  # refreshes done (whether or not the store had changed)
    unchanged: int = 0  # of those, refreshes that found no new shard, and the catalogue and manifest as they were
    failures: int = 0  # refreshes that failed and left the mount as it was (the reason: ``refresh_error``)
    files_added: int = 0  # files the refreshes added to the index
    names_added: int = 0  # names the refreshes added to the tree (a Hub store's new repo or revision: its files' names)
    shards_added: int = 0  # shards the refreshes indexed
    last_refresh: int = 0  # when the last refresh was done (Unix time, seconds), 0 if never
    last_failure: int = 0  # when the last refresh failed (Unix time, seconds), 0 if never


# The groups of ``.xetfs/stats``, by name, in the document's order (``fs.XetFS.stats_document``).
GROUPS: dict[str, type] = {
    "reads": ReadCounters,
    "cache": CacheCounters,
    "layouts": LayoutCounters,
    "decode": DecodeCounters,
    "store": StoreCounters,
    "prefetch": PrefetchCounters,
    "workers": WorkerCounters,
    "errors": ErrorCounters,
    "index": IndexCounters,
    "remote": RemoteCounters,
    "refresh": RefreshCounters,
}


def document(groups: Mapping[str, Any], started: float) -> dict[str, Any]:
    """The stats document: each counter group as a mapping, and the uptime."""
    out: dict[str, Any] = {name: asdict(group) for name, group in groups.items()}
    out["uptime_seconds"] = round(time.time() - started, 3)
    return out
