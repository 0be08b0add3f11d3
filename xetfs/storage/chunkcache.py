"""The disk cache of xorb chunk ranges: what a remote store's reads fetched, kept as local files.

An entry holds the serialized chunks ``[first, stop)`` of one xorb, exactly
as they lie in the xorb (headers included), in a file of its own:
``DIR/chunks/<xorb hash>/<first>-<stop>``.  Its key is the xorb's content
hash, so every store that has the xorb shares it.  The unit is what the
decoder reads, so to a decoder (a worker or the daemon) an entry reads like
a local xorb file: the same ``pread``, from another offset.

* An entry is checked by the chunk hashes that every decode verifies
  anyway, and only by them: no second hash.  A chunk that fails its check
  drops the entry, and the range is fetched again (``Loader``).
* An entry is written once, after its chunks were verified, to a temporary
  file renamed into place, so a reader sees a whole entry or none
  (``entryfile``: a decode worker's writes bypass the page cache).  Ranges
  are cut along the entries a xorb has (``limit``), so no chunk is fetched
  into two entries.  Other mounts sharing the directory write entries too:
  a xorb's entries are read from its directory again before a range of it
  is fetched (a chunk no entry known holds; once per
  ``DISK_CACHE_RESCAN_SECONDS`` at most), so that a mount uses what another
  fetched meanwhile.  Two mounts that fetch the same chunks at the same
  moment both fetch them.  An entry dropped because its chunks failed, and
  that could not be deleted (a cache this user cannot write), is not used
  again by this process while its file stays as it was.
* The bytes of all entries count against the bound of the ``DiskCache``
  they live in, with its least-recently-used eviction; a full disk drops
  the write, never the read.

Thread-safe; several processes (mounts, decode workers) may write entries.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from xetfs.base import hashes
from xetfs.base.settings import DISK_CACHE_RESCAN_SECONDS
from xetfs.format.chunk import Buffer
from xetfs.format.xorb import XorbLayout, check_run
from xetfs.storage.diskcache import DiskCache
from xetfs.storage.entryfile import write_entry

log = logging.getLogger(__name__)


class ChunkCache:
    """Entries of chunk ranges under ``disk.directory / "chunks"``, bounded with the rest of ``disk``."""

    def __init__(self, disk: DiskCache) -> None:
        self.disk = disk
        self.directory = disk.directory / "chunks"
        self.tmp = disk.tmp
        self._known: dict[bytes, list[tuple[int, int]]] = {}  # per xorb: its entries, sorted
        self._scanned: dict[bytes, float] = {}  # per xorb: when its directory was last read (``time.monotonic``)
        self._mine: set[tuple[bytes, int, int]] = set()  # entries this process wrote, counted in the cache's bytes
        self._dropped: dict[str, tuple[int, int]] = {}  # entries dropped but not deleted: their mtime and size
        self._generation = disk.generation
        self._lock = threading.Lock()

    # -- lookups -----------------------------------------------------------

    def find(self, xorb_hash: bytes, first: int, stop: int) -> tuple[int, int] | None:
        """The chunks of the entry holding chunks ``[first, stop)`` (counted as a hit, and touched; its file is
        ``target`` of them), or None (a miss: no entry has them, even read from the directory again)."""
        for a, b in self._entries(xorb_hash, holding=(first, stop)):
            if a <= first and stop <= b:
                with contextlib.suppress(OSError):
                    os.utime(self._path(xorb_hash, a, b))  # least recently used goes first
                self.disk.count(hits=1)
                return a, b
        self.disk.count(misses=1)
        return None

    def limit(self, xorb_hash: bytes, first: int, stop: int) -> int:
        """Where a range from chunk ``first`` must end, at ``stop`` at most, so that it lies within one
        entry or in none: the end of the entry holding ``first``, else the start of the next entry (the
        xorb's entries read from its directory again, for a chunk no entry known holds)."""
        for a, b in self._entries(xorb_hash, holding=(first, first + 1)):
            if a <= first < b:
                return min(stop, b)
            if first < a:
                return min(stop, a)
        return stop

    def target(self, xorb_hash: bytes, first: int, stop: int) -> str:
        """Where the entry for chunks ``[first, stop)`` goes (``write_entry`` puts it there)."""
        return str(self._path(xorb_hash, first, stop))

    # -- changes -----------------------------------------------------------

    def put(self, xorb_hash: bytes, first: int, stop: int, data: Buffer) -> None:
        """Keep ``data``, the verified serialized chunks ``[first, stop)``; a failure is counted, never raised."""
        self.added(xorb_hash, first, stop, write_entry(self.target(xorb_hash, first, stop), [data], self.tmp))

    def added(self, xorb_hash: bytes, first: int, stop: int, written: int | OSError) -> None:
        """Take note of an entry written by ``write_entry`` (here or in a decode worker): its size, or why not.
        Its bytes are counted unless this process wrote the same entry before (two workers fetched the same
        chunks); one that replaced another process's entry counts twice until the cache is counted again."""
        if isinstance(written, OSError):
            self.disk.write_failed(written)
            return
        with self._lock:
            entries = self._known.setdefault(xorb_hash, [])
            if (first, stop) not in entries:
                bisect.insort(entries, (first, stop))
            counted = (xorb_hash, first, stop) in self._mine
            self._mine.add((xorb_hash, first, stop))
        if not counted:
            self.disk.account(written)

    def drop(self, xorb_hash: bytes, entry: tuple[int, int], reason: str) -> None:
        """Delete the entry of chunks ``entry`` (``find``) that failed its check, or forget one that is gone
        (another mount evicted it); the next read fetches the range again."""
        with self._lock:
            entries = self._known.get(xorb_hash, [])
            with contextlib.suppress(ValueError):
                entries.remove(entry)
            self._mine.discard((xorb_hash, *entry))  # (its bytes are counted out: written again, counted again)
        path = self._path(xorb_hash, *entry)
        if not path.exists():
            self.disk.count(misses=1)  # evicted: a miss, not damage
            return
        log.warning("disk cache: chunks [%d, %d) of xorb %s: %s; dropped, fetching them again", *entry,
                    hashes.to_hex(xorb_hash), reason)  # fmt: skip
        self.disk.delete(path)
        with contextlib.suppress(OSError):  # still there (not ours to delete): not used again while it is as it was
            stat = path.stat()
            with self._lock:
                self._dropped[str(path)] = (stat.st_mtime_ns, stat.st_size)
        self.disk.count(corrupt=1)

    def keep_tail(self, layout: XorbLayout, tail_at: int, tail: Buffer, head: Callable[[int, int], Buffer]) -> None:
        """Keep the chunks that ``tail`` (xorb bytes from ``tail_at`` to its end, fetched for the footer)
        holds, where no entry has them yet: a read of those chunks then fetches nothing again.  The chunk
        that ``tail_at`` cuts is completed with ``head(start, tail_at)`` (its first bytes, fetched), so
        that no byte of it is fetched twice."""
        xorb_hash = layout.xorb_hash
        n = layout.num_chunks
        if xorb_hash is None or not n or layout.phys_ends[-1] <= tail_at:
            return
        first = layout.chunk_at_phys(tail_at)
        if any(a <= first < b for a, b in self._entries(xorb_hash)):
            return
        stop = self.limit(xorb_hash, first, n)
        start, end = layout.phys_start(first), layout.phys_ends[stop - 1]
        piece = memoryview(tail)[max(start, tail_at) - tail_at : end - tail_at]
        data = piece if start >= tail_at else bytes(head(start, tail_at)) + piece
        if all(problem is None for problem in check_run(data, xorb_hash, layout, first, stop)):  # kept verified
            self.put(xorb_hash, first, stop, data)

    # -- internals ---------------------------------------------------------

    def _entries(self, xorb_hash: bytes, *, holding: tuple[int, int] | None = None) -> list[tuple[int, int]]:
        """The xorb's entries: read from its directory the first time, again after an eviction, and when no
        entry known holds the chunks ``holding`` (other processes write entries too)."""
        with self._lock:
            if self._generation != self.disk.generation:
                self._known.clear()
                self._mine.clear()
                self._generation = self.disk.generation
            entries = self._known.get(xorb_hash)
            now = time.monotonic()
            fresh = holding is not None and not any(a <= holding[0] and holding[1] <= b for a, b in entries or ())
            if entries is None or (fresh and now - self._scanned.get(xorb_hash, 0.0) >= DISK_CACHE_RESCAN_SECONDS):
                entries = self._known[xorb_hash] = self._scan(xorb_hash)
                self._scanned[xorb_hash] = now
            return list(entries)

    def _scan(self, xorb_hash: bytes) -> list[tuple[int, int]]:
        found = []
        with contextlib.suppress(OSError):
            for entry in os.scandir(self.directory / hashes.to_hex(xorb_hash)):
                first, sep, stop = entry.name.partition("-")
                if sep and first.isdigit() and stop.isdigit() and int(first) < int(stop) and not self._bad(entry):
                    found.append((int(first), int(stop)))
        return sorted(found)

    def _bad(self, entry: os.DirEntry[str]) -> bool:
        """Whether ``entry`` is one this process dropped, and could not delete, unchanged since."""
        dropped = self._dropped.get(entry.path)
        if dropped is None:
            return False
        with contextlib.suppress(OSError):
            stat = entry.stat()
            if (stat.st_mtime_ns, stat.st_size) == dropped:
                return True
        del self._dropped[entry.path]
        return False

    def _path(self, xorb_hash: bytes, first: int, stop: int) -> Path:
        return self.directory / hashes.to_hex(xorb_hash) / f"{first}-{stop}"
