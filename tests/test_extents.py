"""The per-file memo of which run holds which file bytes (xetfs/read/extents.py)."""

from __future__ import annotations

import random

import pytest

from xetfs.base.settings import PAGED_MAX
from xetfs.format.xorb import XorbLayout
from xetfs.read.extents import PAGE, Extent, Extents
from xetfs.read.runs import Run

pytestmark = pytest.mark.unit

F = b"f" * 32
G = b"g" * 32
LAYOUT = XorbLayout(b"x" * 32, (108, 216, 324), (100, 200, 300), None)


def extent(start: int, stop: int, delta: int = 0, held: bool = True) -> Extent:
    run = Run(b"x" * 32, 0, 3, 0, memoryview(bytes(300)))
    run.held = held
    return Extent(start, stop, delta, run, LAYOUT)


def test_finds_only_an_extent_that_holds_the_whole_range() -> None:
    ex = Extents()
    e = extent(100, 200)
    ex.add(F, e)
    assert ex.find(F, 100, 200) is e
    assert ex.find(F, 150, 160) is e
    assert ex.find(F, 150, 201) is None  # runs past it
    assert ex.find(F, 99, 120) is None  # starts before it
    assert ex.find(F, 200, 210) is None
    assert ex.find(G, 150, 160) is None  # another file


def test_an_evicted_runs_extents_are_forgotten_and_never_served() -> None:
    ex = Extents()
    e1, e2 = extent(0, 100), extent(100, 200)
    shared = extent(500, 600)
    shared.run = e1.run  # one run's bytes under two ranges of a file (two terms), and in another file
    ex.add(F, e1)
    ex.add(F, e2)
    ex.add(F, shared)
    ex.add(G, Extent(0, 100, 0, e1.run, e1.layout))
    assert len(ex) == 4
    e1.run.held = False
    assert ex.find(F, 10, 20) is None  # evicted: never served, even before it is forgotten
    ex.forget(e1.run)
    assert len(ex) == 1 and ex.find(F, 150, 160) is e2
    assert ex.find(G, 10, 20) is None and ex.find(F, 510, 520) is None
    ex.forget(e1.run)  # twice: nothing left to drop
    assert len(ex) == 1


def test_a_new_extent_replaces_those_it_overlaps() -> None:
    ex = Extents()
    for a in (0, 100, 200, 300):
        ex.add(F, extent(a, a + 100))
    new = extent(150, 250, delta=7)  # a newer run of bytes two older extents had
    ex.add(F, new)
    assert len(ex) == 3
    assert ex.find(F, 160, 240) is new
    assert ex.find(F, 10, 20) is not None and ex.find(F, 310, 320) is not None
    assert ex.find(F, 110, 120) is None  # the overlapped ones are gone
    ex.add(F, extent(5, 5))  # empty: ignored
    assert len(ex) == 3
    ex.forget(new.run)
    assert len(ex) == 2  # the replaced ones are not counted twice


def test_past_the_limit_it_starts_afresh() -> None:
    ex = Extents(limit=4)
    for a in range(4):
        ex.add(F, extent(a * 10, a * 10 + 10))
    assert len(ex) == 4
    ex.add(G, extent(0, 10))
    assert len(ex) == 1
    assert ex.find(F, 0, 5) is None and ex.find(G, 0, 5) is not None


def test_past_the_page_limit_it_starts_afresh() -> None:
    ex = Extents(limit=100, page_limit=20)
    for a in range(3):
        ex.add(F, extent(a * 8 * PAGE, (a + 1) * 8 * PAGE))  # 8 pages each: 24 entries
    assert len(ex) == 3 and ex.find(F, 0, PAGE) is not None
    ex.add(F, extent(100 * PAGE, 101 * PAGE))
    assert len(ex) == 1 and ex.find(F, 0, PAGE) is None and ex.find(F, 100 * PAGE, 101 * PAGE) is not None


def test_a_read_at_the_end_of_the_extent_its_page_starts_in_finds_the_next() -> None:
    ex = Extents()
    first, second = extent(0, 5000), extent(5000, 9000)  # page 1 (4096-8191) starts in the first
    ex.add(F, first)
    ex.add(F, second)
    assert ex.find(F, 5000, 5100) is second and ex.find(F, 4096, 4200) is first
    assert ex.find(F, 4900, 5100) is None  # across the two: ``cover``'s work


def test_a_range_across_extents_is_covered_only_by_ones_that_follow_on_and_are_held() -> None:
    ex = Extents()
    parts = [extent(0, 100), extent(100, 250, delta=5), extent(250, 300), extent(400, 500)]
    for e in parts:
        ex.add(F, e)
    assert ex.find(F, 90, 110) is None  # find: one extent only
    assert ex.cover(F, 90, 110) == parts[:2]
    assert ex.cover(F, 0, 300) == parts[:3]
    assert ex.cover(F, 120, 130) == [parts[1]]
    assert ex.cover(F, 290, 410) is None  # a gap at 300-400
    assert ex.cover(F, 250, 301) is None  # runs past the last one
    assert ex.cover(F, 300, 310) is None and ex.cover(G, 0, 10) is None
    parts[1].run.held = False
    assert ex.cover(F, 90, 110) is None  # an evicted run in the middle: never served


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("limit", [12, 65536])
def test_find_by_page_or_by_bisection_agrees_with_a_model(seed: int, limit: int) -> None:
    """Small extents are also found by page: whatever is added, replaced, evicted or forgotten (or the
    memo starts afresh at its limits), ``find`` answers as a search of the extents a model keeps, and
    no page leads to an extent that is gone."""
    rng = random.Random(seed)
    ex = Extents(limit=limit, page_limit=8 * limit)
    model: list[Extent] = []  # the file's extents now (never overlapping)
    for _ in range(400):
        action = rng.random()
        if action < 0.6 or not model:
            start = rng.randrange(0, 64 * PAGE, rng.choice([1, 512, PAGE]))
            size = rng.choice([rng.randrange(1, 3 * PAGE), rng.randrange(PAGE, PAGED_MAX + 1), 2 * PAGED_MAX])
            new = extent(start, start + size)
            if len(ex) >= ex.limit or ex.paged >= ex.page_limit:
                model = []  # the memo starts afresh
            model = [e for e in model if e.stop <= new.start or e.start >= new.stop] + [new]
            ex.add(F, new)
        elif action < 0.8:
            gone = rng.choice(model)
            model.remove(gone)
            ex.forget(gone.run)
        else:
            rng.choice(model).run.held = False  # evicted, not forgotten yet: never served
        edges = [p for e in model for p in (e.start, e.stop - 1, e.stop)]  # where off-by-ones show
        for i in range(30):
            start = rng.choice(edges) if i % 3 == 0 and edges else rng.randrange(0, 70 * PAGE, rng.choice([1, PAGE]))
            stop = start + rng.choice([1, 100, PAGE])
            want = next((e for e in model if e.start <= start and stop <= e.stop and e.run.held), None)
            assert ex.find(F, start, stop) is want, (start, stop)
        pages = ex.pages(F)
        assert all(e in model for e in pages.values())
        assert all(e.stop - e.start <= PAGED_MAX for e in pages.values())
        assert ex.paged == len(pages) and len(ex) == len(model)
