"""Reading ahead in a xorb, for small files read in the order they were packed (pure: no I/O).

A read of every chunk of its file's term (a small file read whole) whose
chunks start where the last read's load of the same xorb ended
(``goes_on``) has the chunks after them that no run or load has read in the
background, as a prefetch: ``READ_AHEAD_FIRST`` decoded bytes, a stretch.
Once the reads are half way into a stretch, the next one is read, twice as
wide, up to one store read.  Small files read in the order they were packed
then find their chunks decoded, and cost a store read every few dozen
files, not one each: a request fewer each on a remote store, and on a local
one a run decoded by a worker while the reader reads the files before it,
rather than each file decoded by the daemon on its way to the reader
(``Loader.load_now``).  The read that starts a stretch waits for its own
chunks only.  The stretch and its width are kept across reads that do not
go on: files packed a little out of order, or two kinds of files packed
apart and read in turn, do not start them again.  A larger file, read in
parts, has its own prefetch (``policy``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from xetfs.base.settings import READ_AHEAD_FIRST, READ_AHEAD_XORBS
from xetfs.format.xorb import XorbLayout

T = TypeVar("T")


class ReadAhead:
    """Where the reads of each xorb are, and what to read ahead of them."""

    def __init__(
        self,
        vacant_until: Callable[[bytes, int, int], int],
        run_stop: Callable[[XorbLayout, int, int], int],
        run_bytes: int,
    ) -> None:
        """``vacant_until(xorb, first, limit)``: where the chunks from ``first`` on that no run or load has end
        (``RunStore.vacant_until``); ``run_stop(layout, start, limit)``: where a store read from ``start`` ends
        (``Loader.run_stop``); ``run_bytes``: the decoded bytes of a run at most."""
        self._vacant_until = vacant_until
        self._run_stop = run_stop
        self._run_bytes = run_bytes
        # By xorb: the chunk after the last one a read's load took; the end of the last stretch read ahead, the
        # chunk from which reads have the next one read, and the next one's width.
        self._marks: dict[bytes, int] = {}
        self._stretches: dict[bytes, tuple[int, int, int]] = {}

    def loaded(self, xorb_hash: bytes, stop: int) -> None:
        """A read (not a prefetch) loaded chunks of the xorb up to ``stop``: where the next one goes on."""
        _remember(self._marks, xorb_hash, stop)

    def goes_on(self, xorb_hash: bytes, layout: XorbLayout, first: int, stop: int) -> bool:
        """Whether a read of chunks ``[first, stop)`` starts where the last read's load of the xorb ended, with
        chunks after it that no run or load has."""
        after = min(stop + 1, layout.num_chunks)
        return self._marks.get(xorb_hash) == first and self._vacant_until(xorb_hash, stop, after) > stop

    def stretch(self, xorb_hash: bytes, layout: XorbLayout, first: int, stop: int) -> tuple[int, int] | None:
        """The chunks to read ahead for a read of a whole term, chunks ``[first, stop)``, or None.  Asked
        before the read loads its own chunks."""
        last = self._stretches.get(xorb_hash)
        if self.goes_on(xorb_hash, layout, first, stop):
            # A first stretch, small: the next read waits for little.  Reads that went on before have the next
            # stretch (as wide as theirs had come to be) read from the next read on.
            start, width, wider = stop, READ_AHEAD_FIRST, last[2] if last else 2 * READ_AHEAD_FIRST
            at_once = last is not None
        elif last is not None and last[1] <= first < last[0]:  # (from after the read's own chunks: they are its)
            start, width, wider, at_once = max(last[0], stop), last[2], min(2 * last[2], self._run_bytes), False
        else:
            return None
        to = start
        if start < layout.num_chunks:
            reach = min(layout.num_chunks, max(start + 1, layout.chunk_at(layout.unpacked_start(start) + width)))
            to = self._vacant_until(xorb_hash, start, self._run_stop(layout, start, reach))
        if to <= start:  # (held already, or the xorb's end: nothing more from this stretch)
            if last is not None:
                self._stretches[xorb_hash] = (last[0], last[0], last[2])
            return None
        half = max(start, layout.chunk_at((layout.unpacked_start(start) + layout.unpacked_start(to)) // 2))
        _remember(self._stretches, xorb_hash, (to, start if at_once else half, wider))
        return start, to


def _remember(marks: dict[bytes, T], xorb_hash: bytes, mark: T) -> None:
    """Keep ``mark`` for a xorb, of ``READ_AHEAD_XORBS`` xorbs at most (then forget them all)."""
    if len(marks) >= READ_AHEAD_XORBS and xorb_hash not in marks:
        marks.clear()
    marks[xorb_hash] = mark
