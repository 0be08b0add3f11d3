"""Which held run goes first (xetfs/read/order.py), on its own: runs made by hand, no store."""

from __future__ import annotations

import pytest

from xetfs.read.order import EvictionOrder
from xetfs.read.runs import Run

pytestmark = pytest.mark.unit


def run(first: int, size: int = 100) -> Run:
    return Run(b"x" * 32, first, first + 1, first * size, memoryview(bytes(size)))


def anything(_: Run) -> bool:
    return True


def ordered(count: int) -> tuple[EvictionOrder, list[Run]]:
    """An order of ``count`` runs (of 100 bytes each, one after another), added oldest first."""
    order = EvictionOrder()
    runs = [run(k) for k in range(count)]
    for r in runs:
        order.add(r)
    return order, runs


def test_least_used_passes_over_a_marked_run_once_and_moves_it_back() -> None:
    order, (a, b, c) = ordered(3)
    order.mark(a)  # a read of held bytes: a is only marked
    assert order.least_used(anything) is b
    assert not a.recent  # and moved behind c
    for expected in (b, c, a):
        assert order.least_used(anything) is expected
        assert order.remove(expected) is False


def test_a_marked_run_is_taken_when_no_other_is_wanted() -> None:
    order, (a, _) = ordered(2)
    order.mark(a)
    assert order.least_used(lambda r: r is a) is a


def test_touch_moves_a_run_to_the_back_at_once() -> None:
    order, (a, b) = ordered(2)
    order.touch(a)
    assert list(order) == [b, a]


def test_read_along_merges_what_reads_had_in_any_order() -> None:
    order, (a, _) = ordered(2)  # a holds decoded bytes [0, 100)
    assert not order.read_along(a, 50, 100)
    assert not order.read_along(a, 0, 30)
    assert not order.read_along(a, 0, 30)  # bytes had twice count once
    assert a.had == [(0, 30), (50, 100)]
    assert order.read_along(a, 20, 60)
    assert order.least_used(anything) is a  # read through: first, though b is older in the LRU order
    assert order.remove(a) is True


def test_read_along_clips_to_the_run() -> None:
    order, (_, a) = ordered(2)  # a holds bytes [100, 200)
    assert not order.read_along(a, 0, 100)  # none of its bytes
    assert order.read_along(a, 50, 250)


def test_a_read_through_run_used_again_goes_back_to_the_lru_order_and_starts_afresh() -> None:
    order, (a, b) = ordered(2)
    order.read_through(a)
    a.had = [(0, 100)]
    order.mark(a)  # another file's read uses it
    assert a.had == [] and not a.recent
    assert list(order) == [b, a]
    assert order.first_read(anything) is None
    assert order.remove(a) is False


def test_an_evicted_run_is_never_read_through() -> None:
    order, (a,) = ordered(1)
    order.remove(a)
    a.held = False
    order.read_through(a)
    assert list(order) == []
