"""Read sessions: how each open file is read, and the prefetch that follows its readers (no FUSE).

A front end (the FUSE adapter, or any other) opens a session per file it
serves and asks for bytes of it; the sessions decide the rest, the same for
every front end:

* the read policy of the file (``policy.Session``), over all its open
  handles, since the kernel's page cache is per file: several readers of one
  file send one sequence of requests;
* prefetch: a window decoded ahead of a sequential reader, in a background
  task, at most ``PREFETCH_TASKS`` windows of one file at once, and a new
  window only while the windows being decoded over all files add up to less
  than ``room`` (twice what one file may have, so that a file whose windows
  stall, as a store that hangs until ``--io-timeout``, leaves room for the
  others);
* read-through: a sequential reader's bytes stay in the kernel's page cache
  (``keep_cache``), so its runs may be evicted first once read;
* a read the store failed (it hung until ``--io-timeout``, could not be
  reached, or refused) fails again at once for ``DOWN_SECONDS`` when the
  bytes that failed are asked again: the kernel asks again at once for the
  page at the reader's position, and would otherwise wait out a hung store
  twice, and count the failure twice.

A read is two calls, so that reads of held bytes (the commonest request)
cost no coroutine: ``read_now`` answers at once or says the read must wait,
and ``read_rest`` finishes it.  Runs on the reader's trio thread.
"""

from __future__ import annotations

import logging
from collections import deque

import trio

from xetfs.base.errors import StoreError, StoreTimeoutError, XetfsError
from xetfs.base.settings import (
    DOWN_SECONDS,
    FAILED_READS_KEPT,
    MIN_CACHE_FOR_PREFETCH,
    PREFETCH_FILES_KEPT,
    PREFETCH_MAXIMUM,
    PREFETCH_TASKS,
    SLOW_REQUEST,
    SLOW_SAMPLE,
)
from xetfs.read.policy import Session
from xetfs.read.reader import Reader
from xetfs.read.runs import room_to_read_ahead
from xetfs.storage.index import FileEntry

log = logging.getLogger(__name__)


class Sessions:
    """The read sessions of one front end, by a key of its own for each file (an inode, say)."""

    def __init__(self, reader: Reader, *, prefetch: bool, prefetch_max: int, keep_cache: bool) -> None:
        """``prefetch``: decode ahead of sequential readers (only with a cache of at least
        ``MIN_CACHE_FOR_PREFETCH``); ``prefetch_max``: how far ahead at most, for a store whose requests
        are slow to answer (``slow_store``; others: at most ``PREFETCH_MAXIMUM``); ``keep_cache``:
        the front end's reader keeps what it read (the kernel's page cache), so runs read through go first."""
        self.reader = reader
        self.prefetch_max = prefetch_max
        self.near_max = min(prefetch_max, PREFETCH_MAXIMUM)
        self._waits = (0, 0.0)  # range requests answered, and their waits, when ``slow_store`` last decided
        self._slow = False
        self.keep_cache = keep_cache
        self.prefetch = prefetch and room_to_read_ahead(reader.runs.capacity)
        if prefetch and not self.prefetch:
            log.info("prefetch off: the cache is smaller than %d MiB", MIN_CACHE_FOR_PREFETCH >> 20)
        self.room = 2 * PREFETCH_TASKS * prefetch_max  # prefetch windows being decoded, over all files, at most
        self._sessions: dict[int, Session] = {}
        # By open file: the last reads the store failed (``read_rest``): file bytes [start, stop), when
        # (``trio.current_time``), and the error's kind and message.
        self._failed: dict[Session, deque[tuple[int, int, float, type[XetfsError], str]]] = {}
        self._tail_first: dict[int, bool] = {}  # per file read before: whether its first read took its tail
        self._nursery: trio.Nursery | None = None
        self._tasks = 0  # prefetch tasks a file may have running (none until ``start``)
        self._prefetch_bytes = 0  # of the windows being decoded

    @property
    def prefetch_bytes(self) -> int:
        """Bytes of the prefetch windows being decoded now, over all files."""
        return self._prefetch_bytes

    def start(self, nursery: trio.Nursery) -> None:
        """Prefetch from now on, in tasks of ``nursery``."""
        self._nursery = nursery
        self._tasks = PREFETCH_TASKS if self.prefetch else 0

    def open(self, key: int, entry: FileEntry) -> Session:
        """The session of file ``key`` (a new one if no handle is open on it); ``close`` it once per open."""
        session = self._sessions.get(key)
        if session is None:
            session = Session(entry, key, maximum=self.maximum(), tail_first=self._tail_first.get(key))
            self._sessions[key] = session
        session.opens += 1
        return session

    def close(self, session: Session) -> None:
        """One of the session's handles is closed: the last one ends it."""
        session.opens -= 1
        if session.opens == 0:
            del self._sessions[session.key]
            self._failed.pop(session, None)
            self._remember(session.key, session.tail_first)

    def maximum(self) -> int:
        """How far ahead of a reader prefetch may run now: ``prefetch_max`` while the store is slow to answer."""
        if self.prefetch_max > self.near_max and self.slow_store():
            return self.prefetch_max
        return self.near_max

    def slow_store(self) -> bool:
        """Whether the store's range requests wait ``SLOW_REQUEST`` or more for their answers, on average:
        a remote store far away (a local one makes none).  Decided again once ``SLOW_SAMPLE`` more have
        been answered, from those alone, so that it follows a server whose answers slow down or speed up."""
        r = self.reader.remote
        ranges, waited = r.ranges - self._waits[0], r.wait_s - self._waits[1]
        if ranges >= SLOW_SAMPLE:
            self._slow = waited >= SLOW_REQUEST * ranges
            self._waits = (r.ranges, r.wait_s)
        return self._slow

    def _remember(self, key: int, tail_first: bool | None) -> None:
        """Keep how file ``key`` was first read for its next session (of the last ``PREFETCH_FILES_KEPT``)."""
        if tail_first is None:
            return
        self._tail_first.pop(key, None)
        self._tail_first[key] = tail_first
        if len(self._tail_first) > PREFETCH_FILES_KEPT:
            del self._tail_first[next(iter(self._tail_first))]

    def read_now(self, session: Session, off: int, size: int) -> tuple[bytes | memoryview | None, bool]:
        """Bytes ``[off, off + size)`` of the file if held now (else None: ``read_rest`` them), and whether
        the read is read-through.  Starts the prefetch the policy asks for.

        A view of a run's memory (perhaps shared) is valid until the next await.
        """
        entry = session.entry
        if not session.watches(off, size):
            # A small read that continues nothing: the policy decides nothing for it, only remembers it
            # if it needs a load (random reads of cached bytes, the commonest request, end at once).
            data = self.reader.read_now(entry, off, size)
            if data is None:
                session.on_read(off, size)
            return data, False
        busy = session.prefetch_tasks >= self._tasks or self._prefetch_bytes >= self.room
        session.maximum = self.maximum()
        sequential, window = session.on_read(off, size, busy)
        if window is not None and self._nursery is not None:
            session.prefetch_tasks += 1
            self._prefetch_bytes += window[1]
            self._nursery.start_soon(self._prefetch, session, *window)
        through = sequential and self.keep_cache
        return self.reader.read_now(entry, off, size, through), through

    async def read_rest(self, session: Session, off: int, size: int, through: bool) -> bytes | memoryview:
        """``read_now`` for bytes it did not have: raises what ``Reader.read`` raises."""
        failed = self._failed.get(session)
        if failed:
            _fail_again(failed, off)
        try:
            return await self.reader.read_rest(session.entry, off, size, read_through=through)
        except (StoreError, StoreTimeoutError) as exc:
            start, stop = exc.file_range or (off, off + size)  # (the bytes of the xorb that failed, if known)
            # (The kernel's reads of a file fail together: the ones it had in flight, ahead of the reader.)
            failed = self._failed.setdefault(session, deque(maxlen=FAILED_READS_KEPT))
            failed.append((start, stop, trio.current_time(), type(exc), str(exc)))
            raise

    async def _prefetch(self, session: Session, offset: int, length: int) -> None:
        try:
            await self.reader.prefetch(session.entry, offset, length)
        except Exception:
            log.exception("prefetch of file %s failed", session.entry.hex)
        finally:
            session.prefetch_tasks -= 1
            self._prefetch_bytes -= length


def _fail_again(failed: deque[tuple[int, int, float, type[XetfsError], str]], off: int) -> None:
    """Raise again the error of a read from ``off`` that the store failed less than ``DOWN_SECONDS`` ago."""
    now = trio.current_time()
    while failed and now - failed[0][2] >= DOWN_SECONDS:
        failed.popleft()
    for start, stop, _, kind, message in failed:
        if start <= off < stop:
            raise kind(f"{message} (failed again at once: it failed less than {DOWN_SECONDS:g} s ago)")
