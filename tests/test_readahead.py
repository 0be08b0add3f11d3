"""The per-handle sequential detector (xetfs.readahead)."""

from __future__ import annotations

import itertools
import random

from xetfs.readahead import Readahead

MiB = 1024 * 1024
SIZE = 1024 * MiB


def test_first_read_and_random_reads_prefetch_nothing() -> None:
    ra = Readahead(initial=2 * MiB, maximum=16 * MiB)
    assert ra.on_read(0, MiB, SIZE) is None
    rng = random.Random(1)
    for _ in range(1000):
        assert ra.on_read(rng.randrange(SIZE // 4096) * 4096 + 1, 4096, SIZE) is None


def test_sequential_reads_prefetch_ahead_with_a_growing_window() -> None:
    ra = Readahead(initial=2 * MiB, maximum=16 * MiB)
    ra.on_read(0, MiB, SIZE)
    asked: list[tuple[int, int]] = []
    for k in range(1, 64):
        got = ra.on_read(k * MiB, MiB, SIZE)
        if got:
            asked.append(got)
    # Contiguous, never overlapping, always ahead of the reader, bounded window.
    for (a_off, a_len), (b_off, _) in itertools.pairwise(asked):
        assert a_off + a_len == b_off
    assert asked[0][0] == 2 * MiB
    assert max(length for _, length in asked) <= 16 * MiB
    assert asked[-1][0] + asked[-1][1] <= 64 * MiB + 16 * MiB


def test_a_seek_resets_the_window() -> None:
    ra = Readahead(initial=2 * MiB, maximum=16 * MiB)
    for k in range(10):
        ra.on_read(k * MiB, MiB, SIZE)
    assert ra.window == 16 * MiB
    assert ra.on_read(500 * MiB, MiB, SIZE) is None
    assert ra.window == 0
    got = ra.on_read(501 * MiB, MiB, SIZE)
    assert got == (502 * MiB, 2 * MiB)


def test_busy_reads_are_recorded_and_the_gap_is_asked_for_later() -> None:
    ra = Readahead(initial=2 * MiB, maximum=16 * MiB)
    ra.on_read(0, MiB, SIZE)
    first = ra.on_read(MiB, MiB, SIZE)
    assert first == (2 * MiB, 2 * MiB)
    for k in range(2, 3):
        assert ra.on_read(k * MiB, MiB, SIZE, busy=True) is None
    got = ra.on_read(3 * MiB, MiB, SIZE)
    assert got is not None
    assert got[0] == 4 * MiB  # the window refused while busy is asked for now
    for k in range(4, 12):
        ra.on_read(k * MiB, MiB, SIZE, busy=True)
    got = ra.on_read(12 * MiB, MiB, SIZE)
    assert got is not None and got[0] == 13 * MiB  # the reader overtook it: start at the reader


def test_never_past_the_end_of_the_file() -> None:
    ra = Readahead(initial=2 * MiB, maximum=16 * MiB)
    size = 5 * MiB + 7
    ra.on_read(0, MiB, size)
    ends = []
    for k in range(1, 6):
        got = ra.on_read(k * MiB, min(MiB, size - k * MiB), size)
        if got:
            ends.append(got[0] + got[1])
    assert ends and max(ends) == size
