"""Writing one disk-cache entry: whole or not at all, and from decode workers past the page cache.

An entry goes to a temporary file that is renamed into place, so a reader
sees a whole entry or none, and a write that fails leaves nothing behind.

A decode worker (``direct=True``) writes the whole 4 KiB blocks of an entry
with ``O_DIRECT``, gathered into one page-aligned buffer of its own; the last
partial block is an ordinary write.  Those bytes then take no page-cache
memory: the page cache already holds the decoded file the reader asked for,
and the raw bytes are for a later mount.  A direct write lasts as long as the
disk takes, so a worker whose direct writes, judged ``DIRECT_IO_WINDOW``
bytes at a time, ran slower than ``DIRECT_IO_MIN_RATE`` writes the next
``DIRECT_IO_RETRY`` bytes as usual (on a disk slower than the network, the
page cache must absorb a fill), then tries again.  One that the file system
refused, or that failed otherwise (but for a full disk), ends ``O_DIRECT``
for the process.  The daemon's own entries (footers, and the runs it decodes
itself when no worker can) are ordinary writes: it writes them on its event
loop, where a direct write would wait for the disk.
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

from xetfs.base.settings import (
    DIRECT_IO_ALIGN,
    DIRECT_IO_MIN_RATE,
    DIRECT_IO_RETRY,
    DIRECT_IO_WINDOW,
    IOV_MAX,
    MAX_RUN_BYTES,
)
from xetfs.format.chunk import Buffer


def make_dir(path: Path) -> None:
    """``mkdir -p path``.  A directory root makes takes the owner of the one it is made in: a disk cache of
    another user (a mount by root with ``--cache-dir`` in a home directory) stays one that user can write."""
    if path.is_dir():
        return
    make_dir(path.parent)
    try:
        path.mkdir()
    except FileExistsError:
        if path.is_dir():  # (another process made it meanwhile)
            return
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(path)) from None
    if os.geteuid() == 0:
        parent = path.parent.stat()
        if parent.st_uid != 0:
            os.chown(path, parent.st_uid, parent.st_gid)


def write_entry(path: str, parts: Sequence[Buffer], tmp_dir: Path, *, direct: bool = False) -> int | OSError:
    """Write ``parts``, one after the other, to ``path`` atomically (a temporary file in ``tmp_dir``,
    renamed); its size, or the error that stopped it.  A worker that read chunks in place passes their
    headers and payloads as they lie.  With ``direct``, the whole blocks go with ``O_DIRECT`` while this
    process may use it."""
    target = Path(path)
    tmp = tmp_dir / f"{os.getpid()}-{threading.get_ident()}-{target.parent.name[:16]}-{target.name}"
    views = [memoryview(part).cast("B") for part in parts]
    try:
        make_dir(target.parent)
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
        self.refused = False  # a direct write was refused or failed: none again in this process
        self.slow = False  # the last window of direct writes ran slower than DIRECT_IO_MIN_RATE
        self._window = (0, 0.0)  # bytes written with O_DIRECT since the last judgement, and the seconds they took
        self._as_usual = 0  # bytes written as usual since the disk was found slow
        self._view: memoryview | None = None
        self._lock = threading.Lock()

    @property
    def on(self) -> bool:
        return not (self.refused or self.slow)

    def write(self, fd: int, views: list[memoryview]) -> int:
        """Write the whole blocks of ``views`` to the new file ``fd`` with ``O_DIRECT``: the bytes written.
        0 when none were, and ``fd`` is at its start, its flags unchanged (some blocks may have gone)."""
        size = sum(len(view) for view in views) // DIRECT_IO_ALIGN * DIRECT_IO_ALIGN
        if self.refused or not 0 < size <= MAX_RUN_BYTES or not self._lock.acquire(blocking=False):
            return 0
        try:
            if self.slow:
                if self._as_usual < DIRECT_IO_RETRY:
                    self._as_usual += size
                    return 0
                self.slow, self._as_usual = False, 0  # (and judged again)
            return self._write(fd, views, size)
        finally:
            self._lock.release()

    def _write(self, fd: int, views: list[memoryview], size: int) -> int:
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
            self.refused = True  # (an alignment, a file system without it, a failure): the rest as usual
            os.lseek(fd, 0, os.SEEK_SET)  # (the ordinary write covers whatever went)
            return 0
        return size

    def _buffer(self) -> memoryview:
        if self._view is None:
            self._view = memoryview(mmap.mmap(-1, MAX_RUN_BYTES, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS))
        return self._view

    def _timed(self, size: int, seconds: float) -> None:
        """Judge the disk once a window of direct writes is done: their time includes this process's own
        waits (its other threads hold the interpreter for milliseconds), which a window evens out."""
        written, took = self._window[0] + size, self._window[1] + seconds
        if written < DIRECT_IO_WINDOW:
            self._window = (written, took)
            return
        self._window = (0, 0.0)
        self.slow = written < took * DIRECT_IO_MIN_RATE


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
