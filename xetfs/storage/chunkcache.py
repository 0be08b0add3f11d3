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
  file renamed into place, so a reader sees a whole entry or none.  It is
  written with ``O_DIRECT`` where the file system takes it: its bytes go to
  the disk without entering the page cache, which holds the decoded file
  already (page-cache memory for bytes nobody reads soon was most of what
  filling the cache cost).  Ranges
  are cut along the entries a xorb has (``limit``), so no chunk is fetched
  into two entries.
* The bytes of all entries count against the bound of the ``DiskCache``
  they live in, with its least-recently-used eviction; a full disk drops
  the write, never the read.

Thread-safe; several processes (mounts, decode workers) may write entries.
"""

from __future__ import annotations

import bisect
import contextlib
import errno
import fcntl
import logging
import mmap
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from xetfs.base import hashes
from xetfs.base.settings import BOUNCE_BUFFERS_KEPT, DIRECT_IO_ALIGN, IOV_MAX, MAX_RUN_BYTES
from xetfs.format.chunk import Buffer
from xetfs.format.xorb import XorbLayout, check_run
from xetfs.storage.diskcache import DiskCache

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CachedRange:
    """A disk-cache entry: chunks ``[first, stop)`` of a xorb, in the file ``path`` from the first chunk's header on."""

    first: int
    stop: int
    path: str


class ChunkCache:
    """Entries of chunk ranges under ``disk.directory / "chunks"``, bounded with the rest of ``disk``."""

    def __init__(self, disk: DiskCache) -> None:
        self.disk = disk
        self.directory = disk.directory / "chunks"
        self.tmp = disk.tmp
        self._known: dict[bytes, list[tuple[int, int]]] = {}  # per xorb: its entries, sorted
        self._generation = disk.generation
        self._lock = threading.Lock()

    # -- lookups -----------------------------------------------------------

    def find(self, xorb_hash: bytes, first: int, stop: int) -> CachedRange | None:
        """The entry holding chunks ``[first, stop)`` (counted as a hit, and touched), or None (a miss)."""
        for a, b in self._entries(xorb_hash):
            if a <= first and stop <= b:
                path = self._path(xorb_hash, a, b)
                with contextlib.suppress(OSError):
                    os.utime(path)  # least recently used goes first
                self.disk.count(hits=1)
                return CachedRange(a, b, str(path))
        self.disk.count(misses=1)
        return None

    def limit(self, xorb_hash: bytes, first: int, stop: int) -> int:
        """Where a range from chunk ``first`` must end, at ``stop`` at most, so that it lies within one
        entry or in none: the end of the entry holding ``first``, else the start of the next entry."""
        for a, b in self._entries(xorb_hash):
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
        """Take note of an entry written by ``write_entry`` (here or in a decode worker): its size, or why not."""
        if isinstance(written, OSError):
            self.disk.write_failed(written)
            return
        with self._lock:
            entries = self._known.setdefault(xorb_hash, [])
            if (first, stop) not in entries:
                bisect.insort(entries, (first, stop))
        self.disk.account(written)

    def drop(self, xorb_hash: bytes, entry: CachedRange, reason: str) -> None:
        """Delete an entry that failed its check, or forget one that is gone (another mount evicted it);
        the next read fetches the range again."""
        with self._lock:
            entries = self._known.get(xorb_hash, [])
            with contextlib.suppress(ValueError):
                entries.remove((entry.first, entry.stop))
        if not os.path.exists(entry.path):
            self.disk.count(misses=1)  # evicted: a miss, not damage
            return
        log.warning("disk cache: chunks [%d, %d) of xorb %s: %s; dropped, fetching them again", entry.first,
                    entry.stop, hashes.to_hex(xorb_hash), reason)  # fmt: skip
        with contextlib.suppress(OSError):
            os.unlink(entry.path)
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

    def _entries(self, xorb_hash: bytes) -> list[tuple[int, int]]:
        """The xorb's entries: read from its directory the first time (other processes may have written
        some), and again after an eviction."""
        with self._lock:
            if self._generation != self.disk.generation:
                self._known.clear()
                self._generation = self.disk.generation
            entries = self._known.get(xorb_hash)
            if entries is None:
                entries = self._known[xorb_hash] = self._scan(xorb_hash)
            return list(entries)

    def _scan(self, xorb_hash: bytes) -> list[tuple[int, int]]:
        found = []
        with contextlib.suppress(OSError):
            for entry in os.scandir(self.directory / hashes.to_hex(xorb_hash)):
                first, sep, stop = entry.name.partition("-")
                if sep and first.isdigit() and stop.isdigit() and int(first) < int(stop):
                    found.append((int(first), int(stop)))
        return sorted(found)

    def _path(self, xorb_hash: bytes, first: int, stop: int) -> Path:
        return self.directory / hashes.to_hex(xorb_hash) / f"{first}-{stop}"


def write_entry(path: str, parts: Sequence[Buffer], tmp_dir: Path) -> int | OSError:
    """Write ``parts``, one after the other, to ``path`` atomically (a temporary file in ``tmp_dir``,
    renamed); its size, or the error that stopped it.  For the daemon and the decode workers alike: a
    worker that read chunks in place passes their headers and payloads as they lie.

    The whole blocks go with ``O_DIRECT``, gathered into an aligned buffer; the last partial block, or
    everything where the file system refuses ``O_DIRECT`` (tmpfs), is an ordinary write."""
    target = Path(path)
    tmp = tmp_dir / f"{os.getpid()}-{threading.get_ident()}-{target.parent.name[:16]}-{target.name}"
    views = [memoryview(part).cast("B") for part in parts]
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd = _create(tmp)
        try:
            done = _write_direct(fd, views)
            _write_all(fd, list(_after(views, done)))
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        return exc
    return sum(len(view) for view in views)


def _create(tmp: Path) -> int:
    """A new file for writing, with ``O_DIRECT`` if its file system takes it."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
    if _bounce.direct:
        try:
            return os.open(tmp, flags | os.O_DIRECT, 0o666)
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
    return os.open(tmp, flags, 0o666)


def _write_direct(fd: int, views: list[memoryview]) -> int:
    """Write the whole blocks of ``views`` to ``fd`` if it was opened with ``O_DIRECT``, then turn that
    off for the rest: the bytes written (0 when a write was refused: the file is empty again)."""
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    if not flags & os.O_DIRECT:
        return 0
    size = sum(len(view) for view in views) // DIRECT_IO_ALIGN * DIRECT_IO_ALIGN
    try:
        if size:
            with _bounce.taken(size) as buffer:
                pos = 0
                for view in views:
                    n = min(len(view), size - pos)
                    buffer[pos : pos + n] = view[:n]
                    pos += n
                    if pos == size:
                        break
                _write_all(fd, [buffer[:size]])
    except OSError as exc:
        if exc.errno != errno.EINVAL:  # (an alignment this file system does not take: write it as usual)
            raise
        _bounce.direct = False
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        size = 0
    fcntl.fcntl(fd, fcntl.F_SETFL, flags & ~os.O_DIRECT)
    return size


def _after(views: list[memoryview], skip: int) -> Iterator[memoryview]:
    """``views`` without their first ``skip`` bytes."""
    for view in views:
        if skip < len(view):
            yield view[skip:]
        skip = max(0, skip - len(view))


class _Bounce:
    """The page-aligned buffers ``O_DIRECT`` writes gather their bytes in, reused (a fresh buffer's pages
    cost as much to touch as the page cache they save), a few per process; and whether to try at all."""

    def __init__(self) -> None:
        self.direct = True  # False once a write with O_DIRECT was refused
        self._spare: list[mmap.mmap] = []
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def taken(self, size: int) -> Iterator[memoryview]:
        with self._lock:
            fits = [buf for buf in self._spare if len(buf) >= size]  # (largest first)
            if fits:
                self._spare.remove(fits[-1])
        buf = fits[-1] if fits else mmap.mmap(-1, max(size, MAX_RUN_BYTES))  # (pages are touched as used)
        view = memoryview(buf)
        try:
            yield view
        finally:
            view.release()
            if len(buf) <= MAX_RUN_BYTES:
                with self._lock:  # the largest are kept; the others go with their last reference
                    self._spare = sorted([*self._spare, buf], key=len, reverse=True)[:BOUNCE_BUFFERS_KEPT]


_bounce = _Bounce()


def _write_all(fd: int, views: list[memoryview]) -> None:
    """Write ``views`` to ``fd``, one after the other: ``writev`` a batch at a time, and after a short
    write (should a file system make one) the rest one by one."""
    for at in range(0, len(views), IOV_MAX):
        batch = views[at : at + IOV_MAX]
        written = os.writev(fd, batch)
        for view in batch:
            if written >= len(view):
                written -= len(view)
                continue
            rest, written = view[written:], 0
            while rest:
                n = os.write(fd, rest)
                if n <= 0:
                    raise OSError(errno.EIO, "the file system took no bytes")
                rest = rest[n:]
