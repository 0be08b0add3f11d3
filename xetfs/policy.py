"""How one open file is read, and what to decode ahead of it (pure; no FUSE, no I/O).

``ReadPolicy.on_read`` is told every read of one handle and answers with a
``Decision``: whether the read continues a sequential stream (its runs may
then be evicted first once read, since the kernel's page cache serves those
bytes), and which range, if any, to prefetch.  A handle that keeps reading
where it left off gets a prefetch window ahead of it that doubles on every
sequential read up to ``maximum``.  The kernel sends a sequential reader's
requests several at a time, and they may arrive out of order, so once a
stream is going a read within ``slack`` of its front still belongs to it.  A
read elsewhere starts over and prefetches nothing, so random access never
triggers background decoding; the window it had shrinks rather than
vanishes, since loaders that take tensors in name order jump about a file
and then read on sequentially.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_INITIAL = 2 * 1024 * 1024
DEFAULT_MAXIMUM = 16 * 1024 * 1024
DEFAULT_SLACK = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Decision:
    sequential: bool  # the read continues a sequential stream
    prefetch: tuple[int, int] | None = None  # (offset, length) to decode ahead


@dataclass
class ReadPolicy:
    initial: int = DEFAULT_INITIAL
    maximum: int = DEFAULT_MAXIMUM
    slack: int = DEFAULT_SLACK
    front: int = -1  # where the stream's furthest read ended (-1: no read yet)
    window: int = 0  # prefetch window, 0 while the reads are not sequential
    ahead_end: int = 0  # everything before this has been asked for

    def on_read(self, offset: int, length: int, file_size: int, *, busy: bool = False) -> Decision:
        """Record a read; ``busy`` says a prefetch of this handle is still running (ask for nothing now)."""
        end = offset + length
        in_stream = self.window > 0 and self.front - self.slack <= offset <= self.front + self.slack
        if length == 0 or not (offset == self.front or in_stream):
            self.window //= 4  # a jump: the next sequential read regrows the window from here
            self.front = self.ahead_end = end
            return Decision(False)
        self.front = max(self.front, end)
        self.window = min(self.maximum, max(self.initial, self.window * 2))
        start = max(self.ahead_end, self.front)
        stop = min(file_size, self.front + self.window)
        # Top the window up only once half of it has been consumed.
        if stop <= start or busy or (stop - start < self.window // 2 and stop < file_size):
            return Decision(True)
        self.ahead_end = stop
        return Decision(True, (start, stop - start))
