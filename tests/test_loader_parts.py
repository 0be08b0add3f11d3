"""How the loader cuts a job into slots, and counts what a worker decoded (xetfs/read/loader.py)."""

from __future__ import annotations

import itertools
import random
from dataclasses import replace
from types import SimpleNamespace
from typing import cast

import pytest

from xetfs.base.errors import IntegrityError
from xetfs.base.settings import MAX_RUN_BYTES, READ_AHEAD_FIRST, READ_AHEAD_XORBS, KiB, MiB
from xetfs.format.xorb import XorbLayout
from xetfs.read.loader import Loader, _all_decoded, _decoded, _parts
from xetfs.read.runs import Run, RunStore
from xetfs.storage.store import Store

pytestmark = pytest.mark.unit


def layout_of(sizes: list[int]) -> XorbLayout:
    ends = tuple(itertools.accumulate(sizes))
    return XorbLayout(None, ends, ends, None)


def parts_one_by_one(layout: XorbLayout, first: int, stop: int, slot: int) -> list[tuple[int, int]]:
    """The rule, a chunk at a time: each piece takes chunks while they fit in ``slot``, and at least one."""
    parts = []
    while first < stop:
        end = first + 1
        while end < stop and layout.range_size(first, end + 1) <= slot:
            end += 1
        parts.append((first, end))
        first = end
    return parts


def test_parts_fill_each_slot_and_take_at_least_a_chunk() -> None:
    layout = layout_of([60, 60, 60, 200, 10, 10])
    assert _parts(layout, 0, 6, 128) == [(0, 2), (2, 3), (3, 4), (4, 6)]  # the 200-byte chunk alone
    assert _parts(layout, 1, 5, 1000) == [(1, 5)]
    assert _parts(layout, 0, 6, None) == [(0, 6)]


def test_parts_agree_with_the_rule_on_random_layouts() -> None:
    rng = random.Random(7)
    for _ in range(2000):
        sizes = [rng.choice([1, 100, 4096, 65536, rng.randint(1, 200_000)]) for _ in range(rng.randint(1, 50))]
        layout = layout_of(sizes)
        first = rng.randrange(len(sizes))
        stop = rng.randint(first + 1, len(sizes))
        slot = rng.choice([1, 4096, 65536, 2 * 1024 * 1024, rng.randint(1, 500_000)])
        assert _parts(layout, first, stop, slot) == parts_one_by_one(layout, first, stop, slot)


def test_decoded_counts_only_the_chunks_that_decoded() -> None:
    bad = IntegrityError("chunk 1 does not match its hash")
    assert _all_decoded([3, 4]) and _all_decoded([])
    assert not _all_decoded([3, bad])
    assert _decoded([[1, 2], [3, bad, 4]]) == (4, 10)
    assert _decoded([]) == (0, 0)


def cuts(loader: Loader, layout: XorbLayout, first: int, stop: int) -> list[tuple[int, int]]:
    """Chunks ``[first, stop)`` cut into runs as a prefetch's gap is cut (``Loader.cut``: no read-ahead)."""
    return loader.cut(b"x" * 32, layout, first, stop, read=False)


def test_where_each_read_is_a_request_a_run_takes_in_a_small_remainder() -> None:
    """A prefetch window's last chunks join the run before them rather than be a request of their own, when
    they decode to less than an eighth of a run and the store read stays within ``MAX_RUN_BYTES``; a local
    store, whose reads cost the same in any size, keeps runs of a slot at most."""
    store = cast(Store, SimpleNamespace(local=False))
    runs = cast(RunStore, SimpleNamespace())
    remote = Loader(store, runs, shared=lambda _: False, run_bytes=1000, fetch_width=8)
    local = Loader(store, runs, shared=lambda _: False, run_bytes=1000)
    small_tail, large_tail = layout_of([100] * 21), layout_of([100] * 22)
    assert cuts(remote, small_tail, 0, 21) == [(0, 10), (10, 21)]
    assert cuts(local, small_tail, 0, 21) == [(0, 10), (10, 20), (20, 21)]
    assert cuts(remote, large_tail, 0, 22) == [(0, 10), (10, 20), (20, 22)]  # 200 bytes: an eighth or more
    widest = Loader(store, runs, shared=lambda _: False, run_bytes=MAX_RUN_BYTES, fetch_width=8)
    at_the_bound = layout_of([MAX_RUN_BYTES // 4] * 4 + [1000])
    assert cuts(widest, at_the_bound, 0, 5) == [(0, 4), (4, 5)]  # one read would pass MAX_RUN_BYTES


def test_a_read_that_goes_on_where_the_last_read_of_its_xorb_ended_takes_in_a_run() -> None:
    """A read of a whole term whose chunks start where the last read's load of the same xorb ended takes in
    the chunks after them that no run or load has (the next small files, in the order they were packed), on a
    remote store as on a local one.  Anywhere else, and for a read of part of a term (a larger file, which has
    its own prefetch), a read loads just its chunks; a prefetch neither reads ahead nor moves the mark."""
    store = cast(Store, SimpleNamespace(local=False, chunk_limit=lambda _x, _s, limit: limit))
    runs = RunStore(1 << 20)
    remote = Loader(store, runs, shared=lambda _: False, run_bytes=1000, fetch_width=8)
    layout = layout_of([100] * 50)
    xorb, other = b"x" * 32, b"y" * 32

    def read(loader: Loader, x: bytes, lo: int, hi: int, ahead: bool = True) -> list[tuple[int, int]]:
        return loader.cut(x, layout, lo, hi, read=True, ahead=ahead)

    assert read(remote, xorb, 5, 6) == [(5, 6)]  # the xorb's first read: its chunk
    assert read(remote, xorb, 6, 7) == [(6, 16)]  # goes on: up to a run of 1000 bytes
    assert read(remote, xorb, 30, 31) == [(30, 31)]  # a jump: its chunk only
    assert read(remote, other, 31, 32) == [(31, 32)]  # (each xorb has its own mark)
    assert remote.cut(xorb, layout, 40, 42, read=False) == [(40, 42)]  # a prefetch: no read-ahead...
    held = Run(xorb, 35, 36, 3500, memoryview(bytearray(100)))
    runs.put(xorb, 35, 36, ([held], {}))
    runs.release([held])
    assert read(remote, xorb, 31, 32) == [(31, 35)]  # ...nor a mark; a held run bounds the read-ahead
    assert read(remote, xorb, 48, 49) == [(48, 49)]
    assert read(remote, xorb, 49, 50) == [(49, 50)]  # the xorb's last chunk: nothing after it
    assert read(remote, other, 32, 33, ahead=False) == [(32, 33)]  # part of a term: its chunks only...
    assert read(remote, other, 33, 34) == [(33, 43)]  # ...but it moves the mark
    assert remote.statistics()[1].read_ahead == 9 + 3 + 9
    local = Loader(store, RunStore(1 << 20), shared=lambda _: False, run_bytes=1000)
    assert not local.goes_on(xorb, layout, 5, 6)
    assert read(local, xorb, 5, 6) == [(5, 6)]
    assert local.goes_on(xorb, layout, 6, 7) and not local.goes_on(xorb, layout, 7, 8)
    assert not local.goes_on(other, layout, 6, 7)
    assert read(local, xorb, 6, 7) == [(6, 7), (7, 16)]  # (a local store reads ahead apart: see below)
    assert read(local, xorb, 16, 17) == [(16, 17), (17, 26)]
    tail = Run(xorb, 48, 50, 4800, memoryview(bytearray(200)))
    local._runs.put(xorb, 48, 50, ([tail], {}))
    local._runs.release([tail])
    assert local.goes_on(xorb, layout, 26, 27)
    assert not local.goes_on(xorb, layout, 26, 48)  # nothing after it to read: the chunks are held
    assert not local.goes_on(xorb, layout, 26, 50)  # (nor after the xorb's last chunk)


def test_read_ahead_starts_small_and_doubles_up_to_a_run_within_a_disk_cache_entry() -> None:
    """The first read-ahead in a xorb takes ``READ_AHEAD_FIRST`` bytes, each read that goes on twice as many,
    up to a run, kept across a read that does not go on.  A disk-cache entry bounds it as it bounds a run
    (``Store.chunk_limit``)."""
    entry_end = 150  # (as if a disk-cache entry ended before chunk 150)
    store = cast(Store, SimpleNamespace(local=False, chunk_limit=lambda _x, s, limit: min(limit, max(s + 1, entry_end)
                                        if s < entry_end else limit)))  # fmt: skip
    loader = Loader(store, RunStore(1 << 30), shared=lambda _: False, run_bytes=4 * MiB, fetch_width=8)
    chunk = 64 * KiB
    xorb = b"x" * 32
    layout = replace(layout_of([chunk] * 300), xorb_hash=xorb)  # (the disk cache is asked of a named xorb)
    got, lo = [], 0
    for _ in range(8):
        (piece,) = loader.cut(xorb, layout, lo, lo + 1, read=True, ahead=True)
        got.append(piece[1] - piece[0])
        lo = piece[1]
    first = READ_AHEAD_FIRST // chunk
    assert got == [1, first, 2 * first, 4 * first, 8 * first, 16 * first, 150 - 125, 64], got
    assert loader.cut(xorb, layout, 230, 231, read=True, ahead=True) == [(230, 231)]  # a jump: its chunk only...
    assert loader.cut(xorb, layout, 231, 232, read=True, ahead=True) == [(231, 295)]  # ...and the width is kept
    fresh = b"z" * 32
    assert loader.cut(fresh, layout, 0, 1, read=True, ahead=True) == [(0, 1)]
    assert loader.cut(fresh, layout, 1, 2, read=True, ahead=True) == [(1, 1 + first)]  # (each xorb its own)


def test_the_loader_remembers_the_last_read_of_a_bounded_number_of_xorbs() -> None:
    store = cast(Store, SimpleNamespace(local=False, chunk_limit=lambda _x, _s, limit: limit))
    loader = Loader(store, RunStore(1 << 20), shared=lambda _: False, run_bytes=1000, fetch_width=8)
    layout = layout_of([100] * 10)
    for k in range(READ_AHEAD_XORBS + 5):
        loader.cut(k.to_bytes(32, "big"), layout, 0, 1, read=True, ahead=True)
    assert len(loader._read_ends) <= READ_AHEAD_XORBS


def test_where_the_chunks_no_run_or_load_has_end() -> None:
    runs = RunStore(1 << 20)
    xorb = b"x" * 32
    assert runs.vacant_until(xorb, 3, 10) == 10  # nothing held
    held = Run(xorb, 5, 7, 500, memoryview(bytearray(200)))
    runs.put(xorb, 5, 7, ([held], {}))
    assert [runs.vacant_until(xorb, first, 10) for first in (3, 4, 5, 6, 7, 8)] == [5, 5, 5, 6, 10, 10]
    assert runs.vacant_until(xorb, 0, 4) == 4
