"""The shared on-disk cache of remote stores, and the object source that uses it for small objects.

``DiskCache`` is a directory, bounded by bytes with least-recently-used
eviction over everything in it, that several mounts (processes) may share
and that survives restarts.  It holds two kinds of entries:

* ranges of xorb chunks, raw, as ``chunkcache.ChunkCache`` writes them:
  checked by the chunk hashes every decode verifies;
* whole small objects (shards, listings, manifests, catalogues) under
  ``meta/``, which chunk hashes do not cover: each carries the blake3 hash
  of its key and of its bytes, checked on every read, so a torn or
  corrupted entry is deleted, counts as a miss and is fetched again.

For both:

* an entry is written to a temporary file and renamed into place, so a
  reader sees a whole entry or none;
* a hit touches the entry's mtime, and eviction (under an ``flock`` of the
  cache, so two mounts do not evict at once) deletes the oldest entries
  until the cache is back below 90 % of its size; a ``meta/`` entry counts
  as used ``META_EVICTION_GRACE`` (30 days) later than it was, so chunk
  ranges go first: a mount needs those entries to start, and to find its
  cached chunks, when the server is down (and they are a small share of a
  cache), while the entries of a store not mounted for a month still go;
  each mount counts the whole
  cache again whenever it wrote a twentieth of its size, so the bound holds
  for all the mounts that share it;
* a write that fails (a full disk) is dropped and counted, and the oldest
  tenth of the cache is deleted to make room; the fetched bytes are still
  served.

Entries of an older format (a ``v1/`` directory of 1 MiB byte blocks) are
removed when the cache is opened, with one message.

``CachedSource`` wraps an ``objects.ObjectSource``: whole objects (shards)
are cached by name, and ``fresh`` objects (listings, manifests) are asked of
the server first and served from the cache only when it cannot answer.
Byte ranges pass through: the read path caches chunk ranges itself.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import shutil
import struct
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import blake3

from xetfs.base.errors import ServerUnreachableError, StoreError, StoreTimeoutError
from xetfs.base.messages import human_size
from xetfs.base.settings import (
    DISK_CACHE_LOW_WATER,
    DISK_CACHE_RECOUNT_SHARE,
    META_EVICTION_GRACE,
    STALE_TMP_SECONDS,
    user_home,
)
from xetfs.base.stats import RemoteCounters
from xetfs.storage.entryfile import make_dir
from xetfs.storage.objects import ObjectSource, RemoteOptions

log = logging.getLogger(__name__)

_MAGIC = b"XETFSC1\n"
_HEADER = struct.Struct("<8sQ32s32s")  # magic, payload length, blake3(key), blake3(payload)


def default_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or user_home() / ".cache") / "xetfs"


class DiskCache:
    """Byte-bounded entries under ``directory``; thread-safe, and safe to share between processes."""

    def __init__(self, directory: Path, capacity: int, counters: RemoteCounters | None = None) -> None:
        self.directory = directory
        self.capacity = capacity
        self.counters = counters or RemoteCounters()
        self._entries = directory / "meta"
        self._chunks = directory / "chunks"
        self.tmp = directory / "tmp"
        self.generation = 0  # counts evictions: what a process knows of the entries may be stale after one
        self._lock = threading.Lock()
        self._warned = False
        self._meta_warned = False
        self._since_scan = 0  # bytes this process wrote since it last counted the whole cache
        try:
            for made in (self._entries, self._chunks, self.tmp):
                make_dir(made)
        except OSError as exc:
            what = "cannot write in it" if directory.is_dir() else "cannot create it"
            raise StoreError(f"disk cache {directory}: {what} ({exc.strerror}): give a --cache-dir this user "
                             f"can write, or --disk-cache-size 0 to use none") from None  # fmt: skip
        self._remove_old_format()
        self._clean_tmp()
        self._check_room()
        self._total = sum(size for _, size, _, _ in self._scan())
        self.counters.disk_bytes = self._total

    # -- entries -----------------------------------------------------------

    def get(self, key: str) -> bytes | None:
        """The bytes stored under ``key``, or None (absent, or failed its check and deleted)."""
        path = self._path(key)
        try:
            with open(path, "rb") as f:
                blob = f.read()
        except OSError:
            self.count(misses=1)
            return None
        data, problem = self._check(blob, key)
        if data is None:
            log.warning("disk cache: the copy of %s (entry %s) %s; dropped, fetching it again", _describe(key), path,
                        problem)  # fmt: skip
            self.delete(path)
            self.count(misses=1, corrupt=1)
            return None
        with contextlib.suppress(OSError):
            os.utime(path)  # least recently used goes first
        self.count(hits=1)
        return data

    def put(self, key: str, data: bytes) -> None:
        """Store ``data`` under ``key`` (atomically); a failure is counted and logged once, never raised."""
        if len(data) + _HEADER.size > self.capacity:
            return
        header = _HEADER.pack(_MAGIC, len(data), _key_hash(key), blake3.blake3(data).digest())
        path = self._path(key)
        tmp = self.tmp / f"{os.getpid()}-{threading.get_ident()}-{path.name}"
        replaced = size_of(path)  # (a listing or a manifest is fetched afresh and kept again by every mount)
        try:
            make_dir(path.parent)
            with open(tmp, "wb") as f:
                f.write(header)
                f.write(data)
            os.replace(tmp, path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink()
            self.write_failed(exc)
            return
        self.account(len(header) + len(data) - replaced)

    def write_failed(self, exc: OSError) -> None:
        """An entry could not be written: count it, say so once, and make room if the disk is full."""
        with self._lock:
            self.counters.disk_write_errors += 1
            warned, self._warned = self._warned, True
        full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
        if not warned:
            then = "deleting the least recently used to make room" if full else "counting the next in disk_write_errors"
            log.warning("disk cache %s: an entry could not be written (%s), its bytes were served anyway; %s",
                        self.directory, exc.strerror, then)  # fmt: skip
        if full:
            self.evict(shrink=True)  # make room for the next ones (not for EACCES or EROFS)

    def delete(self, path: Path | str) -> None:
        """Delete the entry ``path`` (one that failed its check), and count its bytes out."""
        size = size_of(path)
        with contextlib.suppress(OSError):
            os.unlink(path)
            self.account(-size)

    def account(self, size: int) -> None:
        """The cache grew by ``size`` bytes (an entry written by this process or a decode worker of its own;
        less, or negative, for one that replaced or deleted another)."""
        with self._lock:
            self._total = max(0, self._total + size)  # (an entry another mount wrote since the last count: not in it)
            self._since_scan += max(0, size)
            self.counters.disk_bytes = self._total
            # Other mounts write too: count the whole cache again after a share of it was written here.
            due = self._total > self.capacity or self._since_scan > self.capacity // DISK_CACHE_RECOUNT_SHARE
        if due:
            self.evict()

    def evict(self, *, shrink: bool = False) -> None:
        """Count the whole cache, and delete the least recently used entries (``meta/`` ones counted as used
        ``META_EVICTION_GRACE`` later) until it is below 90 % of its size (with ``shrink``, also below 90 % of
        what it holds now: the disk is full).

        Under an exclusive ``flock``: another mount that is evicting at the
        same time waits, then finds less to do.
        """
        try:
            lock = os.open(self.directory / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError:
            return
        try:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX)
            except OSError as exc:  # (ENOLCK: a filesystem without locks) eviction waits for the next write
                log.debug("disk cache %s: cannot lock it to evict: %s", self.directory, exc.strerror)
                return
            entries = sorted(self._scan(), key=lambda e: e[2] + META_EVICTION_GRACE * e[3])  # least recent first
            total = sum(size for _, size, _, _ in entries)
            target = min(self.capacity, total if shrink else self.capacity) * DISK_CACHE_LOW_WATER
            meta = sum(size for _, size, _, in_meta in entries if in_meta)
            if meta > target and not self._meta_warned:
                self._meta_warned = True
                log.warning("disk cache %s: the listings, manifests, shards and footers it holds (%s) are more "
                            "than its bound leaves room for: a mount with the server down may not start; give it a "
                            "larger --disk-cache-size", self.directory, human_size(meta))  # fmt: skip
            evicted = 0
            for path, size, _, _ in entries:
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
                self.generation += evicted > 0
        finally:
            os.close(lock)

    def entry_path(self, key: str) -> Path:
        """The file that holds ``key``'s entry (it may not exist); its mtime is its last use."""
        return self._path(key)

    # -- internals ---------------------------------------------------------

    def _path(self, key: str) -> Path:
        name = _key_hash(key).hex()
        return self._entries / name[:2] / name

    @staticmethod
    def _check(blob: bytes, key: str) -> tuple[bytes | None, str]:
        """The bytes of the entry ``blob`` of ``key``, or None and what is wrong with it."""
        if len(blob) < _HEADER.size:
            return None, f"is cut short: {len(blob)} bytes, not even its {_HEADER.size}-byte header"
        magic, length, key_hash, data_hash = _HEADER.unpack_from(blob)
        data = blob[_HEADER.size :]
        if magic != _MAGIC:
            return None, "does not start with an entry header"
        if key_hash != _key_hash(key):
            return None, "is another object's entry"
        if length != len(data):
            return None, f"holds {len(data)} bytes where its header says {length}"
        if blake3.blake3(data).digest() != data_hash:
            return None, "has bytes that do not match their hash (damaged)"
        return data, ""

    def _scan(self) -> list[tuple[Path, int, float, bool]]:
        """``(path, size, mtime, in meta/)`` of every entry (each lies in a subdirectory of ``meta/`` or
        ``chunks/``)."""
        out = []
        for top in (self._entries, self._chunks):
            with contextlib.suppress(OSError):
                for sub in os.scandir(top):
                    with contextlib.suppress(OSError):
                        for entry in os.scandir(sub.path):
                            with contextlib.suppress(OSError):
                                st = entry.stat()
                                out.append((Path(entry.path), st.st_size, st.st_mtime, top is self._entries))
        return out

    def _remove_old_format(self) -> None:
        old = self.directory / "v1"
        if old.is_dir():
            shutil.rmtree(old, ignore_errors=True)
            log.warning("disk cache %s: removed the entries of an older format (v1/); they are fetched again",
                        self.directory)  # fmt: skip

    def _check_room(self) -> None:
        """Warn when the bound is more than the cache's file system holds: the disk fills before it."""
        try:
            st = os.statvfs(self.directory)
        except OSError:
            return
        size = st.f_blocks * st.f_frsize
        if 0 < size < self.capacity:
            log.warning("disk cache %s: its bound (--disk-cache-size, %s) is more than its file system holds "
                        "(%s): when the disk fills, the least recently used entries are deleted", self.directory,
                        human_size(self.capacity), human_size(size))  # fmt: skip

    def _clean_tmp(self) -> None:
        now = time.time()
        with contextlib.suppress(OSError):
            for entry in os.scandir(self.tmp):
                with contextlib.suppress(OSError):
                    if now - entry.stat().st_mtime > STALE_TMP_SECONDS:
                        os.unlink(entry.path)

    def count(self, *, hits: int = 0, misses: int = 0, corrupt: int = 0) -> None:
        with self._lock:
            self.counters.disk_hits += hits
            self.counters.disk_misses += misses
            self.counters.disk_corrupt += corrupt


def _no_copy(exc: StoreError | StoreTimeoutError, directory: Path, what: str) -> StoreError | StoreTimeoutError:
    """``exc``, saying the disk cache had no good copy (none, or one that failed its check) when the server
    could not be reached or timed out (a refusal or a limit says enough)."""
    offline = isinstance(exc, (ServerUnreachableError, StoreTimeoutError))
    return type(exc)(f"{exc}; the disk cache {directory} has no good copy {what}") if offline else exc


def from_server(source: ObjectSource) -> ObjectSource:
    """``source`` answered by the server itself, never from a copy: what it reads still goes into the disk
    cache, if one is in between, so that a later mount with the server down finds it (a refresh's listing)."""
    return CachedSource(source.inner, source.cache, fallback=False) if isinstance(source, CachedSource) else source


def size_of(path: Path | str) -> int:
    """The size of the file ``path``; 0 if there is none."""
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def _describe(key: str) -> str:
    """What an entry's ``key`` names, for messages: an object of a store, its listing, or a xorb's footer."""
    parts = key.split("\0")
    if len(parts) == 3 and parts[1] == "object":
        return f"{parts[2]} of {parts[0]}"
    if len(parts) == 3 and parts[1] == "list":
        return f"the listing of {parts[0]}" + (f" ({parts[2]})" if parts[2] else "")
    if len(parts) == 2 and parts[0] == "xorb-footer":
        return f"the footer of xorb {parts[1]}"
    return repr(key)


def _key_hash(key: str) -> bytes:
    return blake3.blake3(key.encode()).digest()


class CachedSource:
    """An ``ObjectSource`` that keeps the whole objects it fetches from ``inner`` in a ``DiskCache``.

    Byte ranges pass through uncached (the read path keeps chunk ranges in a
    ``chunkcache.ChunkCache`` of the same cache).
    """

    def __init__(self, inner: ObjectSource, cache: DiskCache, *, fallback: bool = True) -> None:
        """``fallback``: copies in the cache stand in for a server that cannot be reached (else never read)."""
        self.inner = inner
        self.cache = cache
        self.location = inner.location
        self.fallback = fallback

    def read(self, name: str, *, limit: int, fresh: bool = False) -> bytes:
        key = f"{self.location}\0object\0{name}"
        if fresh or not self.fallback:
            try:
                data = self.inner.read(name, limit=limit, fresh=fresh)
            except (ServerUnreachableError, StoreTimeoutError) as exc:  # (a refusal is said: wrong credentials)
                cached = self.cache.get(key) if self.fallback else None
                if cached is None:
                    raise _no_copy(exc, self.cache.directory, "of it") if self.fallback else exc from None
                log.warning("%s; using the copy in the disk cache", exc)
                return cached
            self.cache.put(key, data)
            return data
        cached = self.cache.get(key)
        if cached is not None:
            return cached
        try:
            data = self.inner.read(name, limit=limit)
        except (StoreError, StoreTimeoutError) as exc:
            raise _no_copy(exc, self.cache.directory, "of it") from None
        self.cache.put(key, data)
        return data

    def read_range(self, name: str, start: int, end: int) -> bytes | memoryview:
        return self.inner.read_range(name, start, end)

    def read_range_into(self, name: str, start: int, end: int, parts: Sequence[memoryview]) -> None:
        self.inner.read_range_into(name, start, end, parts)

    def local_path(self, name: str) -> str | None:
        return None

    def worker_setup(self) -> tuple[str, RemoteOptions] | None:
        return self.inner.worker_setup()

    def tag(self, name: str) -> str | None:
        return self.inner.tag(name)  # (the server's: a tag only tells whether to read again, fresh)

    def list(self, prefix: str) -> list[tuple[str, int, float]] | None:
        key = f"{self.location}\0list\0{prefix}"
        try:
            names = self.inner.list(prefix)
        except (ServerUnreachableError, StoreTimeoutError) as exc:
            if not self.fallback:
                raise
            cached = self.cache.get(key)
            if cached is None:
                raise _no_copy(exc, self.cache.directory, "of the listing") from None
            log.warning("%s; using the listing in the disk cache", exc)
            return [(str(n), int(s), float(t)) for n, s, t in json.loads(cached)]
        if names is not None:
            self.cache.put(key, json.dumps(names).encode())
        return names
