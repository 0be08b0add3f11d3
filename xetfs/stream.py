"""Bytes decoded for one sequential reader, kept as whole runs (trio).

A sequential reader's chunks are read once, in order, and the kernel keeps
the bytes in its page cache; putting each chunk through the chunk cache
(store, look up, drop) costs the daemon more than the reply itself.  A
``Stream`` holds what was decoded for one open file instead, as
``Segment``s: a run of adjacent chunks of one term, decoded by a worker into
shared memory where its chunks lie one after another, so the run is a range
of file bytes as it is.  The reader (``Reader._stream_ahead``) plans the
parts of a read's range, or a prefetch window's, that no segment holds;
segments hold whole chunks, so no chunk is decoded twice.  The read waits
for its segments and is served from them; anything else (a gap, a failed
run) goes the ordinary way through the chunk cache, which also reports the
error.

The kernel sends a sequential reader's requests several at a time, and they
may finish out of order, so a segment is let go once its bytes have all been
read, not when a read passes it; segments far behind the reads go too (a
stream that starts mid-chunk never reads its first segment whole).  All
streams together hold at most a ``Budget`` of bytes: prefetch plans only what
fits, and past it the oldest segments are let go unread (their bytes are then
read the ordinary way).
"""

from __future__ import annotations

import bisect
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

import trio

from xetfs.pool import SharedChunk
from xetfs.stats import StreamCounters

BEHIND = 32 * 1024 * 1024  # segments ending this far before a read are let go, read or not
IDLE = 5.0  # seconds: a segment held this long belongs to a reader that stopped; prefetch may take its room
NEAR = 16 * 1024 * 1024  # a read this close to the stream's bytes is part of it (the kernel sends several)


@dataclass(eq=False)
class Segment:
    """File bytes ``[start, end)``: ``chunks`` chunks, decoding until ``done`` is set."""

    start: int
    end: int
    chunks: int
    unread: int  # bytes nobody has read yet
    data: SharedChunk | None = None  # set once decoded and verified; None if that failed or it was let go
    done: trio.Event = field(default_factory=trio.Event)
    dropped: bool = False  # its stream let go of it


class Budget:
    """The decoded bytes that all streams together may hold.

    Prefetch plans only what fits (``room``: the limit less what is held and
    what is still decoding); when that is short, segments held for ``IDLE``
    seconds are let go first (a reader that stopped must not starve the
    others).  A read
    plans what it needs regardless, and past ``limit`` the oldest held
    segments are let go.
    """

    def __init__(
        self, limit: int, counters: StreamCounters | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.limit = limit
        self.counters = counters or StreamCounters()
        self.counters.limit_bytes = limit
        self._clock = clock
        self._held: OrderedDict[Segment, tuple[int, float]] = OrderedDict()  # size and when held, oldest first
        self._decoding = 0  # bytes of planned segments not settled yet

    def room(self, wanted: int) -> int:
        """Bytes prefetch may plan now; to make room for ``wanted``, idle segments are let go first."""
        idle_before = self._clock() - IDLE
        while (
            self.limit - self.counters.bytes - self._decoding < wanted
            and self._held
            and next(iter(self._held.values()))[1] < idle_before
        ):
            self._evict()
        return self.limit - self.counters.bytes - self._decoding

    def plan(self, segments: list[Segment]) -> None:
        self._decoding += sum(s.end - s.start for s in segments)

    def settle(self, segment: Segment, data: SharedChunk | None) -> None:
        """``segment`` is decoded (``data``) or failed (None); hold its bytes, letting go of the oldest if need be."""
        self._decoding -= segment.end - segment.start
        if data is None:
            return
        c = self.counters
        c.runs += 1
        c.chunks += segment.chunks
        if segment.dropped:
            c.unread += 1
            return
        segment.data = data
        self._held[segment] = (len(data), self._clock())
        c.bytes += len(data)
        while c.bytes > self.limit and self._held:
            self._evict()

    def _evict(self) -> None:
        oldest, (size, _) = self._held.popitem(last=False)
        oldest.data = None
        self.counters.bytes -= size
        self.counters.evicted += 1

    def release(self, segment: Segment) -> None:
        """``segment``'s stream let go of it (read to its end, or not)."""
        segment.dropped = True
        held = self._held.pop(segment, None)
        if held is None:
            return
        self.counters.bytes -= held[0]
        if segment.unread > 0:
            self.counters.unread += 1
        else:
            self.counters.read_chunks += segment.chunks


class Stream:
    def __init__(self, budget: Budget) -> None:
        self.budget = budget
        self.segments: list[Segment] = []  # in file order, not overlapping; gaps are bytes not planned (or read)
        self.start = self.end = 0  # the span planned since the last restart (read bytes included)
        self.empty = True  # nothing planned since the last restart
        self.read_to = 0  # the furthest byte a read has taken: prefetch need not go behind it
        self.planning = trio.Lock()  # one plan at a time: segments never overlap

    def near(self, offset: int) -> bool:
        """Whether a read at ``offset`` belongs to this stream (even if it arrived out of order)."""
        return not self.empty and self.start - NEAR <= offset <= self.end + NEAR

    def restart(self) -> None:
        """Let go of every segment: the reader has moved elsewhere."""
        for segment in self.segments:
            self.budget.release(segment)
        self.segments.clear()
        self.start = self.end = self.read_to = 0
        self.empty = True

    def missing(self, lo: int, hi: int) -> list[tuple[int, int]]:
        """The parts of ``[lo, hi)`` that no segment holds, in order.

        Segments hold whole chunks, so the parts between two segments start
        and end on chunk boundaries: planning them never decodes a chunk twice.
        """
        parts = []
        pos = lo
        for segment in self.segments:
            if segment.end <= pos:
                continue
            if segment.start >= hi:
                break
            if segment.start > pos:
                parts.append((pos, segment.start))
            pos = segment.end
        if pos < hi:
            parts.append((pos, hi))
        return parts

    def add(self, segments: list[Segment]) -> None:
        """Add segments that overlap none of the stream's."""
        if not segments:
            return
        at = bisect.bisect_left([s.start for s in self.segments], segments[0].start)
        self.segments[at:at] = segments
        if self.empty:
            self.start, self.end, self.empty = segments[0].start, segments[-1].end, False
        else:
            self.start, self.end = min(self.start, segments[0].start), max(self.end, segments[-1].end)

    async def take(self, offset: int, size: int) -> tuple[bytes | memoryview, int] | None:
        """Bytes ``[offset, offset + size)`` and how many chunks this read finished, or None if not all are here.

        Waits for segments still decoding.  Bytes from a single segment come
        back as a view of shared memory: hand it on (to the FUSE reply) with
        no ``await`` in between.
        """
        end = offset + size
        while True:
            parts: list[tuple[Segment, SharedChunk, int, int]] = []
            pending = None
            pos = offset
            for segment in self.segments:
                if segment.end <= pos:
                    continue
                if segment.start > pos:
                    break  # a gap
                if not segment.done.is_set():
                    pending = segment
                    break
                if segment.data is None:
                    break  # it failed: the ordinary path reads (and reports) it
                take = min(end, segment.end) - pos
                parts.append((segment, segment.data, pos - segment.start, take))
                pos += take
                if pos >= end:
                    break
            if pending is None:
                break
            await pending.done.wait()
        self._forget_before(offset - BEHIND)
        if pos < end:
            return None
        # No await from here: the views must not outlive this step (pool.SharedChunk).
        self.read_to = max(self.read_to, end)
        views = [memoryview(data.data)[skip : skip + n] for _, data, skip, n in parts]
        data = views[0] if len(views) == 1 else b"".join(views)
        finished = 0
        for segment, _, _, n in parts:
            segment.unread -= n
            if segment.unread <= 0:
                finished += segment.chunks
                self.segments.remove(segment)
                self.budget.release(segment)
        return data, finished

    def _forget_before(self, offset: int) -> None:
        while self.segments and self.segments[0].end <= offset:
            self.budget.release(self.segments.pop(0))
