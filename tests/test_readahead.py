"""Reading ahead in a xorb for small files read in the order they were packed (``read.readahead``)."""

from __future__ import annotations

import itertools
from dataclasses import replace
from types import SimpleNamespace
from typing import cast

import pytest

from xetfs.base.settings import READ_AHEAD_FIRST, READ_AHEAD_XORBS, KiB, MiB
from xetfs.format.xorb import XorbLayout
from xetfs.read.loader import Loader
from xetfs.read.readahead import ReadAhead
from xetfs.read.runs import Run, RunStore
from xetfs.storage.store import Store

pytestmark = pytest.mark.unit


def layout_of(sizes: list[int]) -> XorbLayout:
    ends = tuple(itertools.accumulate(sizes))
    return XorbLayout(None, ends, ends, None)


class Reads:
    """Reads of whole terms of one layout's xorbs, one chunk range each, as the reader makes them: it asks
    ``ReadAhead.stretch`` first, and the stretch it gets is loaded at once here (``hold``); a read whose
    chunks no run has then loads them, which moves the xorb's mark (``ReadAhead.loaded``)."""

    def __init__(self, loader: Loader, runs: RunStore, layout: XorbLayout) -> None:
        self.ahead = ReadAhead(runs.vacant_until, loader.run_stop, loader.run_bytes)
        self.loader, self.runs, self.layout = loader, runs, layout

    def __call__(self, xorb: bytes, first: int, stop: int, whole: bool = True) -> tuple[int, int] | None:
        due = self.ahead.stretch(xorb, self.layout, first, stop) if whole else None
        if due is not None:
            self.hold(xorb, *due)
        if self.runs.vacant(xorb, first, stop):
            self.ahead.loaded(xorb, stop)
            for a, b in self.loader.cut(self.layout, first, stop):
                self.hold(xorb, a, b)
        return due

    def hold(self, xorb: bytes, first: int, stop: int) -> None:
        data = memoryview(bytearray(self.layout.range_size(first, stop)))
        run = Run(xorb, first, stop, self.layout.unpacked_start(first), data)
        self.runs.put(xorb, first, stop, ([run], {}))
        self.runs.release([run])


def test_a_read_that_goes_on_where_the_last_read_of_its_xorb_ended_has_the_chunks_after_it_read_ahead() -> None:
    """A read of a whole term whose chunks start where the last read's load of the same xorb ended has the
    chunks after them that no run or load has read ahead (the next small files, in the order they were
    packed).  Anywhere else, and for a read of part of a term (a larger file, which has its own prefetch),
    nothing is read ahead; a prefetch moves no mark."""
    store = cast(Store, SimpleNamespace(local=False, chunk_limit=lambda _x, _s, limit: limit))
    runs = RunStore(1 << 20)
    loader = Loader(store, runs, shared=lambda _: False, run_bytes=1000, fetch_width=8)
    layout = layout_of([100] * 50)
    read = Reads(loader, runs, layout)
    xorb, other = b"x" * 32, b"y" * 32
    assert not read.ahead.goes_on(xorb, layout, 5, 6)
    assert read(xorb, 5, 6) is None  # the xorb's first read
    assert read.ahead.goes_on(xorb, layout, 6, 7) and not read.ahead.goes_on(xorb, layout, 7, 8)
    assert not read.ahead.goes_on(other, layout, 6, 7)  # (each xorb has its own mark)
    assert read(xorb, 6, 7) == (7, 17)  # goes on: up to a run of 1000 bytes
    assert read(xorb, 30, 31) is None  # a jump
    assert read(other, 31, 32) is None
    read.hold(xorb, 40, 42)  # (a prefetch: no mark)
    read.hold(xorb, 35, 36)
    assert read(xorb, 31, 32) == (32, 35)  # a held run bounds what is read ahead
    assert read(xorb, 48, 49) is None and read(xorb, 49, 50) is None  # the xorb's last chunk: nothing after it
    assert read(other, 32, 33, whole=False) is None  # part of a term: nothing read ahead...
    assert read(other, 33, 34) == (34, 44)  # ...but it moves the mark
    read.hold(xorb, 0, 5)
    read.hold(xorb, 17, 30)
    assert not read.ahead.goes_on(xorb, layout, 4, 17)  # nothing after it to read: the chunks are held


def test_stretches_read_ahead_start_small_and_double_up_to_a_run_from_half_way_through_the_last() -> None:
    """The first stretch read ahead in a xorb takes ``READ_AHEAD_FIRST`` bytes; a read half way into a stretch
    has the next one read, twice as wide, up to a run; a disk-cache entry bounds one as it bounds a run
    (``Store.chunk_limit``).  After a jump, a read that goes on has a small stretch read, and the next read
    the next stretch, as wide as they had come to be."""
    entry_end = 150  # (as if a disk-cache entry ended before chunk 150)
    store = cast(Store, SimpleNamespace(local=False, chunk_limit=lambda _x, s, limit: min(limit, max(s + 1, entry_end)
                                        if s < entry_end else limit)))  # fmt: skip
    runs = RunStore(1 << 30)
    loader = Loader(store, runs, shared=lambda _: False, run_bytes=4 * MiB, fetch_width=8)
    chunk = 64 * KiB
    xorb = b"x" * 32
    layout = replace(layout_of([chunk] * 600), xorb_hash=xorb)  # (the disk cache is asked of a named xorb)
    read = Reads(loader, runs, layout)
    got = {first: due for first in range(300) if (due := read(xorb, first, first + 1)) is not None}
    f = READ_AHEAD_FIRST // chunk  # (4)
    assert got == {
        1: (2, 2 + f), 4: (6, 14), 10: (14, 30), 22: (30, 62), 46: (62, 126), 94: (126, 150),
        138: (150, 214), 182: (214, 278), 246: (278, 342),
    }, got  # fmt: skip
    assert read(xorb, 450, 451) is None  # a jump...
    assert read(xorb, 451, 452) == (452, 452 + f)  # ...then a small stretch...
    assert read(xorb, 452, 453) == (456, 520)  # ...and the next read has the next one, 64 chunks wide
    fresh = b"z" * 32
    assert read(fresh, 0, 1) is None
    assert read(fresh, 1, 2) == (2, 2 + f)  # (each xorb its own)
    assert read(fresh, 4, 8) == (8, 16)  # a file past the stretch's end: the next starts after its chunks


def test_the_last_reads_of_a_bounded_number_of_xorbs_are_remembered() -> None:
    store = cast(Store, SimpleNamespace(local=False, chunk_limit=lambda _x, _s, limit: limit))
    runs = RunStore(1 << 20)
    loader = Loader(store, runs, shared=lambda _: False, run_bytes=1000, fetch_width=8)
    layout = layout_of([100] * 10)
    read = Reads(loader, runs, layout)
    for k in range(READ_AHEAD_XORBS + 5):
        read(k.to_bytes(32, "big"), 0, 1)
        read(k.to_bytes(32, "big"), 1, 2)
    assert len(read.ahead._marks) <= READ_AHEAD_XORBS and len(read.ahead._stretches) <= READ_AHEAD_XORBS
