"""Writing one disk-cache entry: whole or not at all, and from decode workers past the page cache.

An entry goes to a temporary file that is renamed into place, so a reader
sees a whole entry or none, and a write that fails leaves nothing behind.

A decode worker (``direct=True``) writes the whole 4 KiB blocks of an entry
with ``O_DIRECT``, gathered into one page-aligned buffer of its own; the last
partial block is an ordinary write.  Those bytes then take no page-cache
memory: the page cache already holds the decoded file the reader asked for,
and the raw bytes are for a later mount.  A direct write lasts as long as the
disk takes, so a worker stops using them (until it exits) when the file
system refuses one, or when ``DIRECT_IO_SLOW_WRITES`` in a row ran slower
than ``DIRECT_IO_MIN_RATE``: on a disk slower than the network, the page
cache must absorb a fill.  The daemon's own entries are small, and written
on its event loop, which must never wait for a disk: they are ordinary
writes.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import mmap
import os
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from xetfs.base.settings import DIRECT_IO_ALIGN, DIRECT_IO_MIN_RATE, DIRECT_IO_SLOW_WRITES, IOV_MAX, MAX_RUN_BYTES, MiB
from xetfs.format.chunk import Buffer


def write_entry(path: str, parts: Sequence[Buffer], tmp_dir: Path, *, direct: bool = False) -> int | OSError:
    """Write ``parts``, one after the other, to ``path`` atomically (a temporary file in ``tmp_dir``,
    renamed); its size, or the error that stopped it.  A worker that read chunks in place passes their
    headers and payloads as they lie.  With ``direct``, the whole blocks go with ``O_DIRECT`` while this
    process may use it."""
    target = Path(path)
    tmp = tmp_dir / f"{os.getpid()}-{threading.get_ident()}-{target.parent.name[:16]}-{target.name}"
    views = [memoryview(part).cast("B") for part in parts]
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666)
        try:
            done = _direct.write(fd, views) if direct else 0
            _write_all(fd, list(_after(views, done)))
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        return exc
    return sum(len(view) for view in views)


class _Direct:
    """This process's direct writes: whether to make them, and the aligned buffer they gather bytes in
    (mapped once at a run's largest size, its pages touched as used: a fresh buffer's pages would cost as
    much to touch as the page cache they save).  One write at a time; another meanwhile writes as usual."""

    def __init__(self) -> None:
        self.on = True
        self._view: memoryview | None = None
        self._slow = 0  # direct writes in a row that ran slower than DIRECT_IO_MIN_RATE
        self._lock = threading.Lock()

    def write(self, fd: int, views: list[memoryview]) -> int:
        """Write the whole blocks of ``views`` to the new file ``fd`` with ``O_DIRECT``: the bytes written.
        0 when none were, and ``fd`` is at its start, its flags unchanged (some blocks may have gone)."""
        size = sum(len(view) for view in views) // DIRECT_IO_ALIGN * DIRECT_IO_ALIGN
        if not (self.on and 0 < size <= MAX_RUN_BYTES) or not self._lock.acquire(blocking=False):
            return 0
        try:
            flags = fcntl.fcntl(fd, fcntl.F_GETFL)
            fcntl.fcntl(fd, fcntl.F_SETFL, flags | os.O_DIRECT)  # (EINVAL: this file system has no O_DIRECT)
            try:
                buffer = self._buffer()
                pos = 0
                for view in views:
                    n = min(len(view), size - pos)
                    buffer[pos : pos + n] = view[:n]
                    pos += n
                    if pos == size:
                        break
                began = time.monotonic()
                _write_all(fd, [buffer[:size]])
                self._timed(size, time.monotonic() - began)
            finally:
                fcntl.fcntl(fd, fcntl.F_SETFL, flags)
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise  # (as an ordinary write would have been refused)
            self.on = False  # refused (an alignment or a file system without it): the rest as usual
            os.lseek(fd, 0, os.SEEK_SET)  # (the ordinary write covers whatever went)
            return 0
        finally:
            self._lock.release()
        return size

    def _buffer(self) -> memoryview:
        if self._view is None:
            self._view = memoryview(mmap.mmap(-1, MAX_RUN_BYTES, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS))
        return self._view

    def _timed(self, size: int, seconds: float) -> None:
        if size < MiB:  # (too short to time a disk by)
            return
        self._slow = self._slow + 1 if size < seconds * DIRECT_IO_MIN_RATE else 0
        if self._slow >= DIRECT_IO_SLOW_WRITES:
            self.on = False


_direct = _Direct()


def _after(views: list[memoryview], skip: int) -> Iterator[memoryview]:
    """``views`` without their first ``skip`` bytes."""
    for view in views:
        if skip < len(view):
            yield view[skip:]
        skip = max(0, skip - len(view))


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
