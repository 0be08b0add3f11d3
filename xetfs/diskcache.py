"""The shared on-disk cache of remote stores' bytes, and the object source that uses it.

``DiskCache`` keeps entries (shards, listings, blocks of xorbs) as files in
one directory, bounded by bytes with least-recently-used eviction.  Several
mounts (processes) may share it, and it survives restarts:

* an entry is written to a temporary file and renamed into place, so a
  reader sees a whole entry or none;
* every entry carries the blake3 hash of its key and of its bytes, checked
  on every read: a torn, truncated or corrupted entry is deleted and counts
  as a miss, so it is fetched again and never served;
* a hit touches the entry's mtime, and eviction (under an ``flock`` of the
  cache, so two mounts do not evict at once) deletes the oldest entries
  until the cache is back below 90 % of its size; each mount counts the
  whole cache again whenever it wrote a twentieth of its size, so the
  bound holds for all the mounts that share it;
* a write that fails (a full disk) is dropped and counted, and the oldest
  tenth of the cache is deleted to make room; the fetched bytes are still
  served.

The bytes of an entry are checked again above the cache like any other
(chunk hashes, Merkle roots): the entry hash only decides whether to use it.

``CachedSource`` wraps an ``objects.ObjectSource``: xorb bytes are cached
in aligned blocks of ``BLOCK`` bytes, whole objects (shards) by name, and
``fresh`` objects (listings, manifests) are asked of the server first and
served from the cache only when it cannot answer.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import struct
import threading
import time
from pathlib import Path

import blake3

from xetfs.errors import MissingObjectError, StoreError, StoreTimeoutError
from xetfs.objects import ObjectSource
from xetfs.stats import RemoteCounters

log = logging.getLogger(__name__)

BLOCK = 1024 * 1024
DEFAULT_SIZE = 10 * 1024**3
_MAGIC = b"XETFSC1\n"
_HEADER = struct.Struct("<8sQ32s32s")  # magic, payload length, blake3(key), blake3(payload)
_STALE_TMP = 3600.0  # seconds after which a temporary file is a crashed writer's
_LOW_WATER = 0.9


def default_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "xetfs"


class DiskCache:
    """Byte-bounded entries under ``directory``; thread-safe, and safe to share between processes."""

    def __init__(self, directory: Path, capacity: int, counters: RemoteCounters | None = None) -> None:
        self.directory = directory
        self.capacity = capacity
        self.counters = counters or RemoteCounters()
        self._entries = directory / "v1"
        self._tmp = directory / "tmp"
        self._lock = threading.Lock()
        self._warned = False
        self._since_scan = 0  # bytes this process wrote since it last counted the whole cache
        try:
            self._entries.mkdir(parents=True, exist_ok=True)
            self._tmp.mkdir(exist_ok=True)
        except OSError as exc:
            raise StoreError(f"disk cache {directory}: cannot create it: {exc.strerror}") from None
        self._clean_tmp()
        self._total = sum(size for _, size, _ in self._scan())
        self.counters.disk_bytes = self._total

    # -- entries -----------------------------------------------------------

    def get(self, key: str) -> bytes | None:
        """The bytes stored under ``key``, or None (absent, or failed its check and deleted)."""
        path = self._path(key)
        try:
            with open(path, "rb") as f:
                blob = f.read()
        except OSError:
            self._count(misses=1)
            return None
        data = self._check(blob, key)
        if data is None:
            log.warning("disk cache: entry %s failed its check; dropped, fetching again", path.name)
            with contextlib.suppress(OSError):
                path.unlink()
            self._count(misses=1, corrupt=1)
            return None
        with contextlib.suppress(OSError):
            os.utime(path)  # least recently used goes first
        self._count(hits=1)
        return data

    def put(self, key: str, data: bytes) -> None:
        """Store ``data`` under ``key`` (atomically); a failure is counted and logged once, never raised."""
        if len(data) + _HEADER.size > self.capacity:
            return
        header = _HEADER.pack(_MAGIC, len(data), _key_hash(key), blake3.blake3(data).digest())
        path = self._path(key)
        tmp = self._tmp / f"{os.getpid()}-{threading.get_ident()}-{path.name}"
        try:
            path.parent.mkdir(exist_ok=True)
            with open(tmp, "wb") as f:
                f.write(header)
                f.write(data)
            os.replace(tmp, path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink()
            with self._lock:
                self.counters.disk_write_errors += 1
                warned, self._warned = self._warned, True
            if not warned:
                log.warning("disk cache %s: cannot write entries (%s); serving without caching", self.directory,
                            exc.strerror)  # fmt: skip
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                self.evict(shrink=True)  # a full disk: make room for the next ones (not for EACCES or EROFS)
            return
        size = len(header) + len(data)
        with self._lock:
            self._total += size
            self._since_scan += size
            self.counters.disk_bytes = self._total
            # Other mounts write too: count the whole cache again after a twentieth of it was written here.
            due = self._total > self.capacity or self._since_scan > self.capacity // 20
        if due:
            self.evict()

    def evict(self, *, shrink: bool = False) -> None:
        """Count the whole cache, and delete the least recently used entries until it is below 90 % of
        its size (with ``shrink``, also below 90 % of what it holds now: the disk is full).

        Under an exclusive ``flock``: another mount that is evicting at the
        same time waits, then finds less to do.
        """
        try:
            lock = os.open(self.directory / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError:
            return
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            entries = sorted(self._scan(), key=lambda e: e[2])
            total = sum(size for _, size, _ in entries)
            target = min(self.capacity, total if shrink else self.capacity) * _LOW_WATER
            evicted = 0
            for path, size, _ in entries:
                if total <= target:
                    break
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                    evicted += 1
                total -= size
            with self._lock:
                self._total = total
                self._since_scan = 0
                self.counters.disk_bytes = total
                self.counters.disk_evictions += evicted
        finally:
            os.close(lock)

    # -- internals ---------------------------------------------------------

    def _path(self, key: str) -> Path:
        name = _key_hash(key).hex()
        return self._entries / name[:2] / name

    @staticmethod
    def _check(blob: bytes, key: str) -> bytes | None:
        if len(blob) < _HEADER.size:
            return None
        magic, length, key_hash, data_hash = _HEADER.unpack_from(blob)
        data = blob[_HEADER.size :]
        if magic != _MAGIC or length != len(data) or key_hash != _key_hash(key):
            return None
        return data if blake3.blake3(data).digest() == data_hash else None

    def _scan(self) -> list[tuple[Path, int, float]]:
        """``(path, size, mtime)`` of every entry."""
        out = []
        with contextlib.suppress(OSError):
            for sub in os.scandir(self._entries):
                with contextlib.suppress(OSError):
                    for entry in os.scandir(sub.path):
                        with contextlib.suppress(OSError):
                            st = entry.stat()
                            out.append((Path(entry.path), st.st_size, st.st_mtime))
        return out

    def _clean_tmp(self) -> None:
        now = time.time()
        with contextlib.suppress(OSError):
            for entry in os.scandir(self._tmp):
                with contextlib.suppress(OSError):
                    if now - entry.stat().st_mtime > _STALE_TMP:
                        os.unlink(entry.path)

    def _count(self, *, hits: int = 0, misses: int = 0, corrupt: int = 0) -> None:
        with self._lock:
            self.counters.disk_hits += hits
            self.counters.disk_misses += misses
            self.counters.disk_corrupt += corrupt


def _key_hash(key: str) -> bytes:
    return blake3.blake3(key.encode()).digest()


class CachedSource:
    """An ``ObjectSource`` that keeps what it fetches from ``inner`` in a ``DiskCache``.

    ``sizes`` (object name -> size, filled by the store from its listing)
    lets xorb ranges be cached as whole aligned blocks; ranges of objects of
    unknown size pass through uncached.
    """

    def __init__(self, inner: ObjectSource, cache: DiskCache, block: int = BLOCK) -> None:
        self.inner = inner
        self.cache = cache
        self.block = block
        self.location = inner.location
        self.sizes: dict[str, int] = {}

    def read(self, name: str, *, limit: int, fresh: bool = False) -> bytes:
        key = f"{self.location}\0object\0{name}"
        if fresh:
            try:
                data = self.inner.read(name, limit=limit, fresh=True)
            except MissingObjectError:
                raise
            except (StoreError, StoreTimeoutError):
                cached = self.cache.get(key)
                if cached is None:
                    raise
                log.warning("%s/%s: server did not answer; using the copy in the disk cache", self.location, name)
                return cached
            self.cache.put(key, data)
            return data
        cached = self.cache.get(key)
        if cached is not None:
            return cached
        data = self.inner.read(name, limit=limit)
        self.cache.put(key, data)
        return data

    def read_range(self, name: str, start: int, end: int) -> bytes:
        size = self.sizes.get(name)
        if size is None or end > size or start >= end:
            return self.inner.read_range(name, start, end)
        first, last = start // self.block, (end - 1) // self.block
        blocks: dict[int, bytes] = {}
        missing = []
        for b in range(first, last + 1):
            data = self.cache.get(self._block_key(name, b))
            if data is not None and len(data) == self._block_size(b, size):
                blocks[b] = data
            else:
                missing.append(b)
        for lo, hi in _spans(missing):  # adjacent missing blocks: one request
            at = lo * self.block
            data = self.inner.read_range(name, at, min(size, (hi + 1) * self.block))
            for b in range(lo, hi + 1):
                piece = data[(b - lo) * self.block : (b - lo + 1) * self.block]
                blocks[b] = piece
                self.cache.put(self._block_key(name, b), piece)
        joined = b"".join(blocks[b] for b in range(first, last + 1))
        skip = start - first * self.block
        return joined[skip : skip + end - start]

    def list(self, prefix: str) -> list[tuple[str, int, float]] | None:
        key = f"{self.location}\0list\0{prefix}"
        try:
            names = self.inner.list(prefix)
        except (StoreError, StoreTimeoutError):
            cached = self.cache.get(key)
            if cached is None:
                raise
            log.warning("%s: server did not answer; using the listing in the disk cache", self.location)
            return [(str(n), int(s), float(t)) for n, s, t in json.loads(cached)]
        if names is not None:
            self.cache.put(key, json.dumps(names).encode())
        return names

    def _block_key(self, name: str, block: int) -> str:
        return f"{self.location}\0block{self.block}\0{name}\0{block}"

    def _block_size(self, block: int, size: int) -> int:
        return min(self.block, size - block * self.block)


def _spans(blocks: list[int]) -> list[tuple[int, int]]:
    """Runs of consecutive numbers in sorted ``blocks``, as ``(first, last)``."""
    spans: list[tuple[int, int]] = []
    for b in blocks:
        if spans and spans[-1][1] == b - 1:
            spans[-1] = (spans[-1][0], b)
        else:
            spans.append((b, b))
    return spans
