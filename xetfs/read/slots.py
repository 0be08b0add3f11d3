"""The shared memory decoded runs live in: slots of one memory file (daemon side).

``Slots`` owns one ``memfd`` cut into slots of ``slot_size`` bytes; the
daemon maps it, and so does every decode worker (``decode_worker``), which
decodes straight into the slots of its jobs.  Taking a slot (``take``) gives
a ``Slot``: a lease on it, which its holder owns while the run decoded there
is held, and gives back with ``release`` when the run is evicted.  A lease
is released once: releasing it again does nothing, even after another lease
took the same slot.  A slot a killed worker may still write into is fenced
(``Slot.fence``): its release does nothing until that process is gone
(``Slot.unfence`` releases it then).  The pages of free slots beyond the few
worth keeping are returned to the system (``_trim``).  Runs on one trio
thread.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from collections.abc import Iterable
from dataclasses import dataclass

from xetfs.base.stats import WorkerCounters


@dataclass(eq=False, slots=True)
class Slot:
    """A lease on slot ``index`` of ``owner``: taken by ``Slots.take``, given back by ``release``."""

    index: int
    owner: Slots
    released: bool = False
    fenced: bool = False  # a killed worker may still write into it: not given back until ``unfence``

    def view(self, length: int) -> memoryview:
        """The first ``length`` bytes of the slot."""
        return self.owner.view(self.index, length)

    def release(self) -> None:
        """Give the slot back (the first time, unless fenced; later calls do nothing).  Whoever held a run
        there must not use its bytes after the next await."""
        if not (self.released or self.fenced):
            self.released = True
            self.owner.give_back(self.index)

    def fence(self) -> None:
        """Keep the slot from being given back: a killed process may still write into it."""
        self.fenced = True

    def unfence(self) -> None:
        """The process that could write into the slot is gone: release it if it is fenced."""
        if self.fenced:
            self.fenced = False
            self.release()


def release_all(slots: Iterable[Slot]) -> None:
    """``release`` each of ``slots`` (fenced ones stay until unfenced)."""
    for slot in slots:
        slot.release()


class Slots:
    """``count`` slots of ``slot_size`` bytes of shared memory, and which of them are free."""

    def __init__(self, count: int, slot_size: int, *, keep: int, spare_bytes: int, counters: WorkerCounters) -> None:
        """``keep``: free slots whose pages are kept (the rest are returned to the system); ``spare_bytes``:
        the pages slots in use may keep past their runs, over all of them (``take``); ``counters``: the
        pool's, to which returned slots are added."""
        self.count = count
        self.slot_size = slot_size
        self.keep = keep
        self.spare_bytes = spare_bytes  # what ``_spare_used`` may reach
        self._counters = counters
        self.memfd = os.memfd_create("xetfs-decode", os.MFD_CLOEXEC)
        os.ftruncate(self.memfd, count * slot_size)
        self._shared = mmap.mmap(self.memfd, count * slot_size)
        self._view = memoryview(self._shared)
        self._touched: list[int] = []  # free slots whose pages are still in memory (reused first)
        self._fresh = list(range(count - 1, -1, -1))  # free slots without pages
        self._resident = [0] * count  # per slot, the bytes from its start that may have pages
        self._extra = [0] * count  # per slot in use, its pages past the run it holds
        self._spare_used = 0  # their sum
        self._taken = bytearray(count)  # 1 for a slot in use (fenced ones too)

    @property
    def free_count(self) -> int:
        """How many slots hold no run (fenced ones are not free)."""
        return len(self._touched) + len(self._fresh)

    def take(self, size: int, *, fresh: bool = True) -> Slot | None:
        """A free slot for a run of ``size`` bytes: one whose pages are in memory, else (with
        ``fresh``) one without; None if there is none.

        A run in a slot is counted by its length, but the slot keeps the pages of a longer run
        held there before.  That excess is allowed up to ``spare_bytes`` over all slots in use;
        past it, the slot's pages past ``size`` are given back (giving back at every turn would
        cost more: the pages are touched afresh when the slot next holds a longer run).
        """
        self._trim()
        if self._touched:
            slot = self._touched.pop()
        elif fresh and self._fresh:
            slot = self._fresh.pop()
        else:
            return None
        keep = min(-(-size // mmap.PAGESIZE) * mmap.PAGESIZE, self.slot_size)
        extra = max(0, self._resident[slot] - keep)
        if extra and self._spare_used + extra > self.spare_bytes:
            self._shared.madvise(mmap.MADV_REMOVE, slot * self.slot_size + keep, extra)
            self._resident[slot], extra = keep, 0
        self._resident[slot] = max(self._resident[slot], keep)
        self._extra[slot] = extra
        self._spare_used += extra
        self._taken[slot] = 1
        return Slot(slot, self)

    def give_back(self, slot: int) -> None:
        """Make slot ``slot`` free (``Slot.release``: once per lease)."""
        if not self._taken[slot]:
            return
        self._taken[slot] = 0
        self._spare_used -= self._extra[slot]
        self._extra[slot] = 0
        self._touched.append(slot)

    def view(self, slot: int, length: int) -> memoryview:
        """The first ``length`` bytes of ``slot``."""
        base = slot * self.slot_size
        return self._view[base : base + length]

    def _trim(self) -> None:
        """Return the pages of free slots beyond the few worth keeping to the system.

        Done here, when a slot is taken, never in ``give_back``: a view of a freed
        slot may still be on its way into a reply until the next await.
        """
        while len(self._touched) > self.keep:
            slot = self._touched.pop(0)
            self._shared.madvise(mmap.MADV_REMOVE, slot * self.slot_size, self.slot_size)
            self._resident[slot] = 0
            self._fresh.append(slot)
            self._counters.slots_returned += 1

    def close(self) -> None:
        """Unmap the slots and close the memory file (after the processes that map it are stopped)."""
        with contextlib.suppress(BufferError):  # a view still held elsewhere: the mapping goes with it
            self._view.release()
            self._shared.close()
        os.close(self.memfd)
