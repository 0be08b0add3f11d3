"""How the loader cuts a job into slots, and counts what a worker decoded (xetfs/read/loader.py)."""

from __future__ import annotations

import itertools
import random
from types import SimpleNamespace
from typing import cast

import pytest

from xetfs.base.errors import IntegrityError
from xetfs.base.settings import MAX_RUN_BYTES
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
    """Chunks ``[first, stop)`` cut into runs as a gap is cut (``Loader.cut``)."""
    return loader.cut(layout, first, stop)


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


def test_run_stop_agrees_with_the_rule_a_chunk_at_a_time() -> None:
    """``run_stop`` bisects; the rule it keeps: take chunk after chunk while the store read stays within
    ``MAX_RUN_BYTES`` and the run's decoded bytes within a run (at least one chunk)."""
    store = cast(Store, SimpleNamespace(local=True))
    rng = random.Random(11)
    for _ in range(2000):
        sizes = [rng.choice([1, 100, 4096, 65536, rng.randint(1, 3_000_000)]) for _ in range(rng.randint(1, 60))]
        packed = [max(1, int(n * rng.choice([0.3, 0.5, 1.0, 1.01]))) for n in sizes]
        layout = XorbLayout(None, tuple(itertools.accumulate(packed)), tuple(itertools.accumulate(sizes)), None)
        run_bytes = rng.choice([1, 65536, 1 << 20, 4 << 20, rng.randint(1, 10_000_000)])
        loader = Loader(store, cast(RunStore, SimpleNamespace()), shared=lambda _: False, run_bytes=run_bytes)
        start = rng.randrange(len(sizes))
        limit = rng.randint(start + 1, len(sizes))
        stop = start + 1
        while (stop < limit and layout.phys_ends[stop] - layout.phys_start(start) <= MAX_RUN_BYTES
               and layout.range_size(start, stop + 1) <= run_bytes):  # fmt: skip
            stop += 1
        assert loader.run_stop(layout, start, limit) == stop


def test_where_the_chunks_no_run_or_load_has_end() -> None:
    runs = RunStore(1 << 20)
    xorb = b"x" * 32
    assert runs.vacant_until(xorb, 3, 10) == 10  # nothing held
    held = Run(xorb, 5, 7, 500, memoryview(bytearray(200)))
    runs.put(xorb, 5, 7, ([held], {}))
    assert [runs.vacant_until(xorb, first, 10) for first in (3, 4, 5, 6, 7, 8)] == [5, 5, 5, 6, 10, 10]
    assert runs.vacant_until(xorb, 0, 4) == 4
