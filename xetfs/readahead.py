"""Sequential-read detection for one open file (pure).

A handle that keeps reading where it left off gets a prefetch window ahead
of it that doubles on every sequential read up to ``maximum``; a seek resets
the window and prefetches nothing, so random access never triggers a storm
of background decoding.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_INITIAL = 2 * 1024 * 1024
DEFAULT_MAXIMUM = 16 * 1024 * 1024


@dataclass
class Readahead:
    initial: int = DEFAULT_INITIAL
    maximum: int = DEFAULT_MAXIMUM
    next_offset: int = -1
    window: int = 0
    ahead_end: int = 0  # everything before this has been asked for

    def on_read(self, offset: int, length: int, file_size: int, *, busy: bool = False) -> tuple[int, int] | None:
        """Record a read; return ``(offset, length)`` to prefetch, or None.

        ``busy`` says a prefetch is still running: the read is recorded but
        nothing new is handed out, so the next call asks for the whole gap.
        """
        sequential = offset == self.next_offset
        self.next_offset = offset + length
        if not sequential or length == 0:
            self.window = 0
            self.ahead_end = self.next_offset
            return None
        self.window = min(self.maximum, max(self.initial, self.window * 2))
        start = max(self.ahead_end, self.next_offset)
        end = min(file_size, self.next_offset + self.window)
        # Top the window up only once half of it has been consumed.
        if end - start < self.window // 2 and end < file_size:
            return None
        if end <= start or busy:
            return None
        self.ahead_end = end
        return start, end - start
