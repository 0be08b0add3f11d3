"""How one file is being read, and what to decode ahead of it (pure; no FUSE, no I/O).

A ``Session`` is one file being read, over all its open handles (the
kernel's page cache is per file).  ``Session.on_read`` is told every read of
the file that reaches the daemon and answers whether the read continues a
sequential stream (its runs may then be evicted first once read, since the
kernel's page cache serves those bytes), and which range, if any, to
prefetch.

One file may be read as several sequential streams at once: a loader that
takes tensors in name order through ``mmap`` reads two or three regions of the
file in turn (safetensors groups tensors by dtype), a parquet reader several
column chunks, several processes at different places. So, like ZFS's
prefetcher, a session keeps up to ``max_streams`` streams, most recently used
first. A read that starts where a stream's reads ended continues it. The
kernel sends a sequential reader's requests several at a time and they may
arrive out of order, and a page fault in a mapped file asks for the pages
around it before the reads in front of it have come, so once a stream is
prefetching, any read from its start to ``slack`` past its front, or to the
end of what it has prefetched, belongs to it.

Any other read shorter than ``small`` is only remembered, among the last
``max_singles`` such reads, and a read that starts where one of those ended
makes the two a new stream; a longer read starts a stream at once (it may be
a sequential reader's first).  A new stream takes the place of the least
recently used stream that has covered no more than the read that makes it,
or else of the stream that has covered the fewest bytes.  So small random
reads, the most common reads of all, cost a few dict lookups and never end
a sequential reader's stream, however many another process makes.  Two
streams that come to end at the same offset (two readers in step) become
one.

The caller may leave out reads that cached bytes answer unless ``watches``
says otherwise: a small read that continues no stream and no remembered
read, while no stream is prefetching, can only be remembered.  So a random
reader's small reads of cached bytes, the commonest request of all, skip the
policy.  The price: a small-block sequential reader that starts in cached
bytes (other than at the file's first read, which is always told) is seen
only from its first read of bytes not cached on (every read after that one
continues it, cached or not), so its prefetch starts 64 reads later than it
would have; larger reads are always told.

A stream prefetches once it has covered ``min_stream`` bytes, so that two
small random reads that happen to be adjacent decode nothing ahead. Its window
then doubles on every read up to ``maximum``, and is topped up once half of it
has been consumed.

Readers of formats with the index at the end read the file's tail first:
parquet and zip readers read the footer or the central directory, then the
column chunks or members they need, and skip the rest.  The streams of a
file whose first read took its last byte (other than a stream from offset
0: a zip reader's members) prefetch no further ahead than ``1 / jump_share``
of the bytes they have read themselves (the bytes they jumped over do not
count), and nothing until that is a first window: what such a stream decodes
past the place where its reader stops or jumps is at most that share of what
it read.  Every other reader gets the wide window: a loader that reads the
header at 0, then its regions; ``cat``, ``dd skip=``, ``tail -c``; a reader
whose first pages are in the page cache already (the policy sees only the
reads that reach the mount), wherever its first seen read is.  The first
read is the file's, not the open handle's: a reader may open the file for
its footer, close it, and open it again for the column chunks, so the
caller hands ``tail_first`` on to the file's next session.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from xetfs.base.settings import (
    PREFETCH_INITIAL,
    PREFETCH_JUMP_SHARE,
    PREFETCH_MAXIMUM,
    PREFETCH_MIN_STREAM,
    PREFETCH_SINGLES,
    PREFETCH_SLACK,
    PREFETCH_SMALL,
    PREFETCH_STREAMS,
)
from xetfs.storage.index import FileEntry

# What ``Session.on_read`` answers: whether the read continues a sequential stream, and the range
# ``(offset, length)`` to decode ahead, or None.  The answers without a range are shared.
RANDOM: tuple[bool, None] = (False, None)
SEQUENTIAL: tuple[bool, None] = (True, None)


@dataclass(slots=True, eq=False)  # (compared by identity: two streams may be alike)
class Stream:
    start: int  # where its first read began
    front: int  # where its furthest read ended
    window: int = 0  # prefetch window, 0 until it has covered min_stream bytes
    ahead_end: int = 0  # everything before this has been asked for
    read: int = 0  # bytes its reads took it forward by (not the bytes it jumped over)

    def reach(self, slack: int) -> int:
        """How far ahead a read still belongs to the stream: within ``slack`` of its front, or in what it prefetched.

        (Once it prefetches, any read from its start up to here belongs to it.)
        """
        return max(self.front + slack, self.ahead_end)


@dataclass(eq=False)  # (compared by identity: one per file being read)
class Session:
    """How one file is being read, over all its open handles: its sequential streams, what to decode ahead of
    them, and the handles and prefetch tasks it has (``sessions.Sessions`` keeps one per file)."""

    entry: FileEntry
    key: int = 0  # the front end's key for the file (an inode, say)
    opens: int = 0  # handles open on the file
    prefetch_tasks: int = 0  # prefetch tasks running for the file
    initial: int = PREFETCH_INITIAL
    maximum: int = PREFETCH_MAXIMUM
    slack: int = PREFETCH_SLACK
    min_stream: int = PREFETCH_MIN_STREAM
    max_streams: int = PREFETCH_STREAMS
    max_singles: int = PREFETCH_SINGLES
    small: int = PREFETCH_SMALL  # reads shorter than this that continue nothing are singles
    jump_share: int = PREFETCH_JUMP_SHARE  # a reader that jumps prefetches 1/this of what it read
    streams: list[Stream] = field(default_factory=list)  # most recently used first
    # Where each stream's reads end (one stream per offset: two that meet become one), and where the
    # last reads that continued no stream began, by where they ended.
    _fronts: dict[int, Stream] = field(default_factory=dict)
    _singles: dict[int, int] = field(default_factory=dict)
    _prefetching: int = 0  # streams with a window: only those take reads that do not follow on exactly
    # Whether the file's first read took its last byte (None before it); given by the caller for a file read
    # before, by a session since closed (a reader may open the file for its footer, then again for the rest).
    tail_first: bool | None = None

    @property
    def fronts(self) -> Mapping[int, Stream]:
        """Where each stream's reads end -> that stream (a read-only view)."""
        return MappingProxyType(self._fronts)

    @property
    def prefetching(self) -> int:
        """The streams with a prefetch window."""
        return self._prefetching

    @property
    def singles(self) -> int:
        """The reads that continued no stream, remembered now (at most ``max_singles``)."""
        return len(self._singles)

    def on_read(self, offset: int, length: int, busy: bool = False) -> tuple[bool, tuple[int, int] | None]:
        """Record a read: whether it continues a sequential stream, and the range ``(offset, length)`` to
        prefetch, or None.  ``busy`` says enough prefetches are running, for the file or over all files
        (ask for nothing now)."""
        if not length:
            return RANDOM
        file_size = self.entry.size
        if self.tail_first is None:
            self.tail_first = offset + length >= file_size > 0
        end = offset + length
        stream = self._fronts.get(offset)
        if stream is None and self._prefetching:
            stream = self._near(offset)
        if stream is None:
            singles = self._singles
            start = singles.pop(offset, None)
            if start is None:
                if length < self.small:
                    singles.pop(end, None)  # (a read made again is the latest)
                    singles[end] = offset
                    if len(singles) > self.max_singles:
                        del singles[next(iter(singles))]  # the oldest
                else:  # a larger read may be a sequential reader's first: a stream at once
                    stream = self._start(offset, length)
                    stream.read = length
                    self._advance(stream, end)
                return RANDOM
            stream = self._start(start, length)
            stream.read = offset - start  # the remembered read's bytes
        elif stream is not self.streams[0]:
            self.streams.remove(stream)
            self.streams.insert(0, stream)
        if end > stream.front:
            stream.read += end - max(offset, stream.front)
            self._advance(stream, end)
        if stream.front - stream.start < self.min_stream:
            return RANDOM
        if not stream.window:
            self._prefetching += 1
        stream.window = min(self.maximum, max(self.initial, stream.window * 2))
        window = self.ahead(stream)
        start = max(stream.ahead_end, stream.front)
        stop = min(file_size, stream.front + window)
        # Top the window up only once half of it has been consumed.
        if not window or stop <= start or busy or (stop - start < window // 2 and stop < file_size):
            return SEQUENTIAL
        stream.ahead_end = stop
        return True, (start, stop - start)

    def ahead(self, stream: Stream) -> int:
        """How far ahead of its front ``stream`` may prefetch now: its window, or for a stream of a reader that
        read the file's tail first and did not start at 0, no more than ``1 / jump_share`` of what it has read,
        and nothing until that is a first window."""
        if stream.start == 0 or not self.tail_first:
            return stream.window
        share = stream.read // self.jump_share
        return min(stream.window, share) if share >= min(self.initial, self.maximum) else 0

    def watches(self, offset: int, length: int) -> bool:
        """Whether ``on_read`` may answer more than ``RANDOM``: the read may start or continue a stream,
        or a stream of the file is prefetching (its window and drop-behind follow every read).

        A read it does not watch, a small one that continues no stream and no remembered read, gets
        no prefetch and is not sequential: ``on_read`` would only remember it, and the caller may
        leave that out when cached bytes answer the read.  The file's first read is always watched:
        it says whether the reader reads the tail first.
        """
        if self.tail_first is None or self._prefetching > 0 or length >= self.small:
            return True
        return offset in self._fronts or offset in self._singles

    def _near(self, offset: int) -> Stream | None:
        """The prefetching stream (most recently used first) a read at ``offset`` lies in, if any."""
        for stream in self.streams:
            if stream.window and stream.start <= offset <= stream.reach(self.slack):
                return stream
        return None

    def _advance(self, stream: Stream, front: int) -> None:
        fronts = self._fronts
        if fronts.get(stream.front) is stream:
            del fronts[stream.front]
        stream.front = front
        other = fronts.get(front)
        if other is not None and other is not stream:
            # Two streams end here now (two readers in step): one stream from here on, or the other
            # could never be continued again.
            self.streams.remove(other)
            if other.window:
                self._prefetching -= 1 if stream.window else 0
                stream.window = max(stream.window, other.window)
            stream.start = min(stream.start, other.start)
            stream.ahead_end = max(stream.ahead_end, other.ahead_end)
            stream.read += other.read
        fronts[front] = stream

    def _start(self, start: int, length: int) -> Stream:
        """A new stream from ``start``, first, for a read of ``length`` (which then advances it)."""
        streams = self.streams
        if len(streams) >= self.max_streams:
            # The least recently used stream no longer than this read gives way, else the one that has
            # covered the fewest bytes (the least recently used of those).
            at = least = -1
            for i in range(len(streams) - 1, -1, -1):
                covered = streams[i].front - streams[i].start
                if covered <= length:
                    at = i
                    break
                if least < 0 or covered < least:
                    at, least = i, covered
            gone = streams.pop(at)
            if gone.window:
                self._prefetching -= 1
            if self._fronts.get(gone.front) is gone:
                del self._fronts[gone.front]
        stream = Stream(start, start)
        streams.insert(0, stream)
        return stream
