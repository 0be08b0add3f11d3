"""The read policy of a file (xetfs.read.policy): sequential detection and the prefetch window.

``Session.on_read`` answers ``(sequential, window)``: whether the read continues a stream, and the range
``(offset, length)`` to prefetch, or None.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Awaitable, Callable
from types import SimpleNamespace
from typing import cast

import pytest
import trio
import trio.testing

from xetfs.base.errors import StoreError, StoreTimeoutError
from xetfs.base.settings import DOWN_SECONDS, FAILED_READS_KEPT, PREFETCH_MAXIMUM, SLOW_REQUEST, SLOW_SAMPLE
from xetfs.base.stats import RemoteCounters
from xetfs.read.policy import Session
from xetfs.read.reader import Reader
from xetfs.read.sessions import Sessions
from xetfs.storage.index import FileEntry

pytestmark = pytest.mark.unit

MiB = 1024 * 1024
SIZE = 1024 * MiB


def file(size: int = SIZE) -> FileEntry:
    """A file of ``size`` bytes, as the policy sees it (it looks at nothing else)."""
    return cast(FileEntry, SimpleNamespace(size=size))


def policy(size: int = SIZE) -> Session:
    return Session(file(size), initial=2 * MiB, maximum=16 * MiB, slack=4 * MiB)


def prefetch_of(p: Session, offset: int, length: int, busy: bool = False) -> tuple[int, int] | None:
    """Tell ``p`` of a read: the range it asks to prefetch, if any."""
    return p.on_read(offset, length, busy)[1]


def is_sequential(p: Session, offset: int, length: int) -> bool:
    """Tell ``p`` of a read: whether it continues a sequential stream."""
    return p.on_read(offset, length)[0]


def test_first_read_and_random_reads_prefetch_nothing() -> None:
    p = policy()
    sequential, window = p.on_read(0, MiB)
    assert not sequential and window is None
    rng = random.Random(1)
    for _ in range(1000):
        sequential, window = p.on_read(rng.randrange(SIZE // 4096) * 4096 + 1, 4096)
        assert window is None and not sequential


def test_small_random_reads_near_each_other_are_not_a_stream() -> None:
    p = policy()
    for off in (10 * MiB, 10 * MiB + 8192, 10 * MiB - 4096, 10 * MiB + 65536):
        assert prefetch_of(p, off, 4096) is None


def test_sequential_reads_prefetch_ahead_with_a_growing_window() -> None:
    p = policy()
    p.on_read(0, MiB)
    asked: list[tuple[int, int]] = []
    for k in range(1, 64):
        sequential, window = p.on_read(k * MiB, MiB)
        assert sequential
        if window:
            asked.append(window)
    # Contiguous, never overlapping, always ahead of the reader, bounded window.
    for (a_off, a_len), (b_off, _) in itertools.pairwise(asked):
        assert a_off + a_len == b_off
    assert asked[0][0] == 2 * MiB
    assert max(length for _, length in asked) <= 16 * MiB
    assert asked[-1][0] + asked[-1][1] <= 64 * MiB + 16 * MiB


def test_reads_that_arrive_out_of_order_stay_in_the_stream() -> None:
    p = policy()
    p.on_read(0, MiB)
    p.on_read(MiB, MiB)
    for off in (3 * MiB, 2 * MiB, 5 * MiB, 4 * MiB):
        assert is_sequential(p, off, MiB), off
    assert len(p.streams) == 1 and p.streams[0].front == 6 * MiB


def test_a_seek_starts_a_new_stream_that_prefetches_once_it_is_sequential() -> None:
    p = policy()
    for k in range(10):
        p.on_read(k * MiB, MiB)
    sequential, window = p.on_read(500 * MiB, MiB)
    assert not sequential and window is None
    assert prefetch_of(p, 501 * MiB, MiB) == (502 * MiB, 2 * MiB)


def test_interleaved_streams_each_keep_their_window() -> None:
    # A loader taking tensors in name order through mmap: two regions of the file (one per dtype), in turn.
    p = policy()
    fronts = [0, 600 * MiB]
    asked: dict[int, list[tuple[int, int]]] = {0: [], 1: []}
    for _ in range(12):
        for i in (0, 1):
            _, window = p.on_read(fronts[i], MiB)
            fronts[i] += MiB
            if window:
                asked[i].append(window)
    for i, base in ((0, 0), (1, 600 * MiB)):
        assert asked[i] and asked[i][0][0] == base + 2 * MiB
        for (a_off, a_len), (b_off, _) in itertools.pairwise(asked[i]):
            assert a_off + a_len == b_off  # each stream's windows follow on: nothing asked twice
        assert asked[i][-1][0] + asked[i][-1][1] >= fronts[i] + 8 * MiB  # well ahead of the reader
    assert [s.window for s in p.streams] == [16 * MiB, 16 * MiB]  # each grew as for one reader


def test_the_least_recently_used_stream_gives_way() -> None:
    p = Session(file(), max_streams=2)
    p.on_read(0, MiB)
    p.on_read(100 * MiB, MiB)
    p.on_read(200 * MiB, MiB)  # a third stream: the one at 0 is forgotten
    assert is_sequential(p, 101 * MiB, MiB)
    assert not is_sequential(p, MiB, MiB)
    assert len(p.streams) == 2


def test_adjacent_small_reads_do_not_prefetch() -> None:
    p = policy()
    for k in range(16):  # 64 KiB read in 4 KiB pieces: a stream, but shorter than min_stream
        assert prefetch_of(p, k * 4096, 4096) is None


def test_busy_reads_are_recorded_and_the_gap_is_asked_for_later() -> None:
    p = policy()
    p.on_read(0, MiB)
    assert prefetch_of(p, MiB, MiB) == (2 * MiB, 2 * MiB)
    assert prefetch_of(p, 2 * MiB, MiB, busy=True) is None
    got = prefetch_of(p, 3 * MiB, MiB)
    assert got is not None and got[0] == 4 * MiB  # the window refused while busy is asked for now
    for k in range(4, 12):
        p.on_read(k * MiB, MiB, busy=True)
    got = prefetch_of(p, 12 * MiB, MiB)
    assert got is not None and got[0] == 13 * MiB  # the reader overtook it: start at the reader


def test_never_past_the_end_of_the_file() -> None:
    size = 5 * MiB + 7
    p = policy(size)
    p.on_read(0, MiB)
    ends = []
    for k in range(1, 6):
        got = prefetch_of(p, k * MiB, min(MiB, size - k * MiB))
        if got:
            ends.append(got[0] + got[1])
    assert ends and max(ends) == size


def test_a_read_inside_what_a_stream_prefetched_stays_in_it() -> None:
    # A page fault ahead of a loader's position asks for the pages around it before the reads in between.
    p = policy()
    for k in range(6):
        p.on_read(k * MiB, MiB)
    (stream,) = p.streams
    assert stream.ahead_end >= 14 * MiB and stream.window == 16 * MiB
    assert is_sequential(p, 13 * MiB, MiB)  # 7 MiB ahead of the front: beyond the slack
    assert is_sequential(p, 6 * MiB, MiB)  # the reads in between still belong to it
    assert len(p.streams) == 1 and p.streams[0].window == 16 * MiB


def test_another_readers_random_reads_do_not_end_a_sequential_stream() -> None:
    # One process reads the file sequentially while another reads it at random: one policy for both.
    p = policy()
    rng = random.Random(3)
    prefetched = sequential = 0
    for k in range(200):
        seq, window = p.on_read(k * 128 * 1024, 128 * 1024)
        prefetched += window is not None
        sequential += seq
        for _ in range(20):
            assert prefetch_of(p, rng.randrange(SIZE // 2, SIZE) // 4096 * 4096, 4096) is None
    assert sequential >= 195 and prefetched >= 5
    assert len(p.streams) <= 8


def test_a_reader_that_skips_ahead_inside_its_window_keeps_prefetching() -> None:
    p = policy()
    for k in range(8):
        p.on_read(k * MiB, MiB)
    (stream,) = p.streams
    ahead = stream.ahead_end
    assert ahead >= 20 * MiB
    sequential, _ = p.on_read(15 * MiB, MiB)  # 7 MiB ahead (the page cache had the rest): still this stream
    assert sequential and p.streams[0] is stream and stream.front == 16 * MiB
    got = [prefetch_of(p, k * MiB, MiB) for k in range(16, 24)]
    assert any(g is not None for g in got)  # the window is topped up from the new front


def test_streams_stay_distinct_and_their_index_stays_true_under_any_mix_of_reads() -> None:
    # Two random reads at one offset make two alike streams; continuing one must not touch the other.
    rng = random.Random(7)
    p = policy()
    for step in range(20_000):
        kind = rng.random()
        if kind < 0.5:
            off = rng.randrange(64) * 4096  # few offsets: alike streams, reads at their fronts
        elif kind < 0.8:
            s = rng.choice(p.streams) if p.streams else None
            off = s.front if s else 0
        else:
            off = rng.randrange(SIZE // MiB) * MiB
        p.on_read(off, rng.choice((4096, 65536, MiB)))
        if step % 97 == 0 or step > 19_900:
            assert len({id(s) for s in p.streams}) == len(p.streams) <= 8
            for front, s in p.fronts.items():
                assert s.front == front and any(s is t for t in p.streams)
            assert p.prefetching == sum(1 for s in p.streams if s.window)
            assert p.singles <= p.max_singles


def test_random_reads_never_take_the_place_of_a_stream() -> None:
    # Small random reads are only remembered; a stream that has covered more (a sequential reader's) stays.
    p = policy()
    p.on_read(0, 128 * 1024)
    rng = random.Random(5)
    for _ in range(100):
        p.on_read(rng.randrange(SIZE // 2, SIZE) // 4096 * 4096, 4096)
    p.on_read(128 * 1024, 128 * 1024)
    assert p.streams[0].start == 0 and p.streams[0].front == 256 * 1024  # it went on
    assert len(p.streams) == 1 and p.singles <= p.max_singles


def first_prefetch(p: Session, reads: list[tuple[bool, int, int]]) -> int | None:
    """Which of the sequential reader's reads (the ones marked True) first got a prefetch window."""
    n = 0
    for mine, off, length in reads:
        _, window = p.on_read(off, length)
        n += mine
        if mine and window is not None:
            return n
    return None


def test_readers_in_step_make_one_stream_that_prefetches() -> None:
    # Two or three readers of one file with --direct-io, at the same offsets in turn.
    for readers in (2, 3):
        reads = [(r == 0, off, 4096) for off in range(0, 4 * MiB, 4096) for r in range(readers)]
        assert first_prefetch(policy(), reads) == 64, readers  # 256 KiB covered, as for one reader
    p = policy()
    first_prefetch(p, [(r == 0, off, 16384) for off in range(0, MiB, 16384) for r in range(2)])
    assert len(p.streams) == 1


def test_a_small_block_reader_keeps_its_stream_among_larger_random_reads() -> None:
    # 4 KiB sequential reads, with other processes' 128 KiB random reads in between.
    rng = random.Random(11)
    for between in (1, 3):
        reads: list[tuple[bool, int, int]] = []
        for off in range(0, 4 * MiB, 4096):
            reads.append((True, off, 4096))
            reads += [(False, rng.randrange(SIZE // 2, SIZE) // 4096 * 4096, 128 * 1024) for _ in range(between)]
        assert first_prefetch(policy(), reads) == 64, between


CHUNK = 64 * 1024


def told_reads(p: Session, reads: list[tuple[int, int]], cached: set[int]) -> list[int | None]:
    """Drive ``p`` as ``fs.read`` does: a read of cached bytes (by 64 KiB chunk) is told only if ``watches``.

    Returns, per read, the prefetch length decided (0 for none), or None if the policy was not told.
    """
    out: list[int | None] = []
    for off, length in reads:
        chunks = set(range(off // CHUNK, (off + length - 1) // CHUNK + 1))
        if chunks <= cached and not p.watches(off, length):
            out.append(None)
            continue
        _, window = p.on_read(off, length)
        cached |= chunks
        out.append(window[1] if window else 0)
    return out


def test_reads_of_cached_bytes_that_continue_nothing_are_left_out() -> None:
    p = policy()
    assert p.watches(0, 4096)  # the file's first read is always told: does the reader start at the beginning?
    p.on_read(8192, 4096)
    assert not p.watches(0, 4096) and not p.watches(4096, 4096) and p.watches(0, 64 * 1024)
    assert p.watches(12288, 4096) and not p.watches(16384, 4096)  # continues the read remembered
    rng = random.Random(3)
    cached = set(range(SIZE // CHUNK))
    reads = [(rng.randrange(SIZE // 4096) * 4096, 4096) for _ in range(2000)]
    told = told_reads(p, reads, cached)
    assert told.count(None) >= 1990  # only those that by chance start where a remembered read ended


def test_a_small_block_reader_is_seen_though_most_of_its_reads_are_cached() -> None:
    # 4 KiB reads: sixteen of each 64 KiB chunk are answered by the chunk the first one loaded.
    reads = [(off, 4096) for off in range(0, 4 * MiB, 4096)]
    told = told_reads(policy(), reads, set())
    assert None not in told  # every read after the first continues one that was told
    first = next(i for i, t in enumerate(told) if t)
    assert first == 63  # 256 KiB covered, as when told of every read
    # Starting at the beginning in bytes already cached: the file's first read is told, so seen from it.
    told = told_reads(policy(), reads, set(range(16)))  # the first MiB cached
    assert None not in told and told.index(next(t for t in told if t)) == 63
    # Starting elsewhere in bytes already cached: seen from its first read of bytes that are not.
    p = policy()
    p.on_read(0, 4096)  # the file's first read, at its beginning
    base = 64 * MiB
    later = [(base + off, length) for off, length in reads]
    told = told_reads(p, later, set(range(base // CHUNK, base // CHUNK + 16)))  # its first MiB cached
    assert told[:256] == [None] * 256
    assert told.index(next(t for t in told if t)) == 256 + 63
    assert all(p.watches(off, 4096) for off in range(0, SIZE, 8 * MiB))  # it prefetches: every read is told


def test_larger_reads_are_told_though_cached() -> None:
    # Kernel read-ahead sizes: a sequential reader that starts in cached bytes prefetches as soon as if
    # the policy were told of every read.
    for block in (128 * 1024, MiB):
        reads = [(off, block) for off in range(0, 32 * MiB, block)]
        told = told_reads(policy(), reads, set(range(8 * MiB // CHUNK)))  # the first 8 MiB cached
        assert None not in told
        assert next(i for i, t in enumerate(told) if t) == 1, block


def test_a_read_it_does_not_watch_gets_no_decision() -> None:
    # What fs.read leaves out (a read not watched, answered by cached bytes) could never have prefetched or
    # been sequential, whatever the policy's state: random mixes of sequential, random and adjacent reads.
    rng = random.Random(9)
    for _ in range(20):
        p = policy()
        off = 0
        for _ in range(2000):
            kind = rng.random()
            if kind < 0.4:
                off += rng.choice((4096, 65536, MiB))  # sequential from the last read
                length = rng.choice((4096, 65536, MiB))
            elif kind < 0.6:
                off, length = rng.randrange(SIZE // 4096) * 4096, rng.choice((4096, 8192, 65536))
            else:
                off, length = off + 4096, 4096
            watched = p.watches(off, length)
            sequential, window = p.on_read(off, length)
            if not watched:
                assert window is None and not sequential, (off, length)


def test_a_small_read_made_again_is_remembered_as_the_latest() -> None:
    p = policy()
    first = 100 * MiB
    p.on_read(first, 4096)
    for k in range(1, p.max_singles):  # the remembered reads are full
        p.on_read(k * 7 * MiB + 12345, 4096)
    p.on_read(first, 4096)  # the first again: now the latest
    p.on_read(999 * MiB, 4096)  # one more: the oldest other read goes, not the first
    assert not p.streams
    p.on_read(first + 4096, 4096)  # it continues the first: the two are a stream
    assert [(s.start, s.front) for s in p.streams] == [(first, first + 8192)]


# A parquet file as the bench writes it: row groups of seven column chunks (sizes in bytes), the footer at the end.
COLUMN_CHUNKS = {"id": 3_631_391, "ts": 6_985_351, "category": 633_955, "value": 6_985_347, "score": 3_922_559,
                 "flag": 107_042, "word": 1_653_457}  # fmt: skip
PROJECTION = ("ts", "category", "value", "score", "flag")  # the query's columns: id and word are skipped


def parquet_layout(row_groups: int) -> tuple[list[tuple[str, int, int]], int]:
    """(column, start, end) of every column chunk, in file order, and the file's size (footer included)."""
    chunks, at = [], 4  # after the magic
    for _ in range(row_groups):
        for name, size in COLUMN_CHUNKS.items():
            chunks.append((name, at, at + size))
            at += size
    return chunks, at + 256 * 1024


def pieces(start: int, end: int, block: int = MiB) -> list[tuple[int, int]]:
    """A range as the kernel asks for it: ``block`` at a time."""
    return [(off, min(block, end - off)) for off in range(start, end, block)]


def windows(p: Session, reads: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The windows ``p`` asks for over ``reads``."""
    return [window for off, length in reads if (window := prefetch_of(p, off, length))]


def prefetched_in(p: Session, reads: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The windows ``p`` asks for over ``reads`` (after the footer, read first as every parquet reader does)."""
    size = p.entry.size
    p.on_read(size - 256 * 1024, 256 * 1024)
    return windows(p, reads)


def round_robin(streams: list[list[tuple[int, int]]]) -> list[tuple[int, int]]:
    """The reads of several readers at once, one of each in turn."""
    return [read for step in itertools.zip_longest(*streams) for read in step if read is not None]


def test_a_projection_that_jumps_between_column_chunks_prefetches_nothing_it_skips() -> None:
    chunks, size = parquet_layout(12)
    wanted = [(start, end) for name, start, end in chunks if name in PROJECTION]
    # duckdb: a reader per column chunk, a few at once; pyarrow: one coalesced range per row group, all at once.
    per_chunk = round_robin([[read for s, e in wanted[i::3] for read in pieces(s, e)] for i in range(3)])
    groups = [(wanted[i][0], wanted[i + len(PROJECTION) - 1][1]) for i in range(0, len(wanted), len(PROJECTION))]
    coalesced = round_robin([pieces(s, e) for s, e in groups])
    skipped = [(start, end) for name, start, end in chunks if name not in PROJECTION]
    for reads in (per_chunk, coalesced):
        asked = prefetched_in(policy(size), reads)
        for off, length in asked:
            assert not any(off < e and s < off + length for s, e in skipped), (off, length)
        assert sum(length for _, length in asked) <= sum(length for _, length in reads) // 16


def test_a_long_stream_of_a_reader_that_jumps_prefetches_a_sixteenth_of_what_it_read() -> None:
    # A reader that read the footer first, then 512 MiB from the middle of the file: its window opens slowly.
    p = policy()
    asked = prefetched_in(p, pieces(100 * MiB, 612 * MiB))
    assert asked and asked[0][0] >= 100 * MiB + 32 * MiB  # nothing before 32 MiB read (2 MiB = 1/16 of it)
    for off, length in asked:
        assert off + length - 100 * MiB <= (off - 100 * MiB) * 17 // 16 + MiB  # at most 1/16 of what was read ahead
    assert max(length for _, length in asked) <= 16 * MiB and p.streams[0].window == 16 * MiB


def test_the_window_still_opens_wide_for_a_reader_that_starts_at_the_beginning() -> None:
    # A zip reader (a pytorch checkpoint): the central directory at the end first, then its members from offset 0.
    p = policy()
    asked = prefetched_in(p, pieces(0, 64 * MiB))
    assert asked[0] == (2 * MiB, 2 * MiB) and p.streams[0].window == 16 * MiB
    assert asked[-1][0] + asked[-1][1] >= 64 * MiB + 8 * MiB  # well ahead of the reader
    # A loader: the header at 0, then a region in the middle of the file: a wide window there too.
    p = policy()
    p.on_read(0, 64 * 1024)
    got = windows(p, pieces(300 * MiB, 340 * MiB))
    assert got[0] == (302 * MiB, 2 * MiB) and p.streams[0].window == 16 * MiB


def test_a_window_smaller_than_the_first_still_prefetches() -> None:
    # A small --cache-size makes the largest window smaller than the first one: prefetch still runs.
    p = Session(file(), initial=2 * MiB, maximum=MiB)
    asked = windows(p, pieces(0, 8 * MiB))
    assert asked and all(length <= MiB for _, length in asked)


def wide_from(p: Session, start: int, end: int) -> list[tuple[int, int]]:
    """The windows ``p`` asks for over a sequential read of ``[start, end)``."""
    return windows(p, pieces(start, end))


def test_a_reader_that_did_not_read_the_tail_first_gets_the_wide_window_wherever_it_reads() -> None:
    # dd skip=, tail -c: the first read is in the middle, and every read since continues it.
    p = policy()
    got = wide_from(p, 100 * MiB, 140 * MiB)
    assert got[0] == (102 * MiB, 2 * MiB) and p.streams[0].window == 16 * MiB
    # cat of a file whose first and middle pages are in the page cache: the mount sees reads from 100 MiB,
    # then from 300 MiB (the pages between were cached); both get the wide window at once.
    p = policy()
    wide_from(p, 100 * MiB, 120 * MiB)
    assert wide_from(p, 300 * MiB, 310 * MiB)[0] == (302 * MiB, 2 * MiB)
    # A loader whose header is cached: two regions read in turn, each with the wide window.
    p = policy()
    first = windows(p, pieces(500 * MiB, 504 * MiB))
    second = windows(p, pieces(900 * MiB, 904 * MiB))
    assert (502 * MiB, 2 * MiB) in first and (902 * MiB, 2 * MiB) in second
    # The first two reads of dd skip= arriving in the other order change nothing.
    p = policy()
    p.on_read(100 * MiB + 128 * 1024, 128 * 1024)
    p.on_read(100 * MiB, 128 * 1024)
    got = wide_from(p, 100 * MiB + 256 * 1024, 140 * MiB)
    assert got[0][0] < 102 * MiB and p.streams[0].window == 16 * MiB
    assert max(off + length for off, length in got) >= 140 * MiB + 8 * MiB  # well ahead of the reader


def test_how_a_file_was_first_read_outlives_its_handles() -> None:
    """A reader that opens the file for its footer, closes it, and opens it again for the column chunks:
    the second handle's session knows the file's first read took its tail (``Sessions`` keeps it)."""
    reader = cast(Reader, SimpleNamespace(runs=SimpleNamespace(capacity=1 << 30)))
    sessions = Sessions(reader, prefetch=True, prefetch_max=16 * MiB, keep_cache=True)
    footer = sessions.open(7, file())
    footer.on_read(SIZE - 256 * 1024, 256 * 1024)
    sessions.close(footer)
    again = sessions.open(7, file())
    assert again is not footer and again.tail_first is True
    assert not windows(again, pieces(100 * MiB, 120 * MiB))
    assert sessions.open(8, file()).tail_first is None  # another file: nothing known


def test_a_store_slow_to_answer_gets_the_deep_window_and_a_near_one_the_local_window() -> None:
    """A remote store whose range requests wait ``SLOW_REQUEST`` or more for their answers, on average over
    the last ``SLOW_SAMPLE`` or more, is read with windows up to ``prefetch_max``; a near one (loopback, a
    LAN) with a local store's, which holds less memory.  The choice follows the server, read after read."""
    remote = RemoteCounters()
    fake = SimpleNamespace(runs=SimpleNamespace(capacity=1 << 30), remote=remote, read_now=lambda *a: b"")
    sessions = Sessions(cast(Reader, fake), prefetch=True, prefetch_max=64 * MiB, keep_cache=True)

    def answered(count: int, wait: float) -> None:
        remote.ranges += count
        remote.wait_s += count * wait

    def widest(session: Session, start: int) -> int:
        widest = 0
        for off in range(start, start + 200 * MiB, MiB):
            sessions.read_now(session, off, MiB)
            widest = max(widest, session.streams[0].window if session.streams else 0)
        return widest

    assert sessions.maximum() == PREFETCH_MAXIMUM  # nothing answered yet
    answered(SLOW_SAMPLE - 1, 1.0)
    assert sessions.maximum() == PREFETCH_MAXIMUM  # too few to say
    answered(1, 1.0)
    assert sessions.maximum() == 64 * MiB
    answered(100, SLOW_REQUEST / 2)  # the same server, now answering at once: only these count
    assert sessions.maximum() == PREFETCH_MAXIMUM
    answered(SLOW_SAMPLE, SLOW_REQUEST * 2)
    session = sessions.open(1, file())
    assert widest(session, 0) == 64 * MiB
    answered(SLOW_SAMPLE, SLOW_REQUEST / 10)
    assert widest(session, 200 * MiB) == PREFETCH_MAXIMUM
    local = Sessions(cast(Reader, fake), prefetch=True, prefetch_max=PREFETCH_MAXIMUM, keep_cache=True)
    answered(SLOW_SAMPLE, 1.0)
    assert local.maximum() == PREFETCH_MAXIMUM  # a local store's bound is never passed


def _sessions_over(read_rest: Callable[..., Awaitable[bytes]], size: int) -> tuple[Sessions, Session]:
    """Sessions over a reader whose reads the store answers with ``read_rest``, and a file of ``size`` bytes
    opened in them."""
    fake = SimpleNamespace(runs=SimpleNamespace(capacity=1 << 30), remote=RemoteCounters(),
                           read_rest=read_rest)  # fmt: skip
    sessions = Sessions(cast(Reader, fake), prefetch=False, prefetch_max=PREFETCH_MAXIMUM, keep_cache=True)
    return sessions, sessions.open(1, file(size))


def test_a_read_the_store_failed_fails_again_at_once_for_a_while() -> None:
    """The kernel asks again at once for the first page of a failed read: a read the store failed (it hung,
    here) fails at once, with an error of the same kind, when its bytes are asked again within
    ``DOWN_SECONDS``; other bytes, and the same ones later, are read again."""
    asked: list[int] = []

    async def read_rest(entry: FileEntry, off: int, size: int, read_through: bool) -> bytes:
        asked.append(off)
        if off < 4096:
            await trio.sleep(3)  # (the store hangs until the time bound)
            raise StoreTimeoutError("xorb 00ab chunks [0, 4): store read took more than 3 s")
        if off >= 512 * 1024:
            raise StoreError("http://127.0.0.1:9/xet/xorbs/xorbs/00ab: server unreachable")
        return b"x" * size

    sessions, session = _sessions_over(read_rest, 1 << 20)

    async def main() -> None:
        with pytest.raises(StoreTimeoutError):
            await sessions.read_rest(session, 0, 128 * 1024, False)
        with pytest.raises(StoreTimeoutError, match="failed again at once"):
            await sessions.read_rest(session, 0, 4096, False)  # the kernel's retry: no second wait
        assert asked == [0]
        assert await sessions.read_rest(session, 256 * 1024, 4096, False) == b"x" * 4096
        await trio.sleep(DOWN_SECONDS)
        with pytest.raises(StoreTimeoutError, match=r"more than 3 s$"):
            await sessions.read_rest(session, 0, 4096, False)
        assert asked == [0, 256 * 1024, 0]
        with pytest.raises(StoreError):
            await sessions.read_rest(session, 512 * 1024, 128 * 1024, False)
        with pytest.raises(StoreError, match=r"unreachable \(failed again at once"):
            await sessions.read_rest(session, 512 * 1024, 4096, False)
        assert asked == [0, 256 * 1024, 0, 512 * 1024]

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_reads_the_store_failed_together_each_fail_again_at_once() -> None:
    """The kernel has several reads of a file in flight (the reader's and its read-ahead); a hung store
    fails them together, in any order: the retry of each fails at once, not only the last one's."""
    asked: list[int] = []

    async def read_rest(entry: FileEntry, off: int, size: int, read_through: bool) -> bytes:
        asked.append(off)
        await trio.sleep(3 if off == 0 else 2 + off / MiB / 100)  # (in order of offset, the read at 0 last)
        raise StoreTimeoutError(f"bytes [{off}, {off + size}): store read took more than 3 s")

    sessions, session = _sessions_over(read_rest, 1 << 30)
    offsets = [k * MiB for k in range(FAILED_READS_KEPT + 4)]  # (the last FAILED_READS_KEPT to fail are kept)

    async def fails(off: int) -> None:
        with pytest.raises(StoreTimeoutError):
            await sessions.read_rest(session, off, MiB, False)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            for off in offsets:
                nursery.start_soon(fails, off)
        for off in (0, offsets[-1] + 4096, offsets[5]):
            with pytest.raises(StoreTimeoutError, match="failed again at once"):
                await sessions.read_rest(session, off, 4096, False)
        assert sorted(asked) == offsets
        with pytest.raises(StoreTimeoutError, match=r"more than 3 s$"):
            await sessions.read_rest(session, offsets[4], 4096, False)  # (one of the first to fail: forgotten)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_only_the_bytes_that_failed_fail_again() -> None:
    """A read across two xorbs, one on a hung store: its retry of a page of the other xorb is read again
    (the reader names the bytes that failed, ``XetfsError.file_range``), and a file's failures end with it."""
    asked: list[int] = []

    async def read_rest(entry: FileEntry, off: int, size: int, read_through: bool) -> bytes:
        asked.append(off)
        if off < MiB:
            exc = StoreTimeoutError("xorb 00ab chunks [0, 16): store read took more than 3 s")
            exc.file_range = (0, 512 * 1024)  # (the span in the first xorb; the rest is in another)
            raise exc
        return b"x" * size

    sessions, session = _sessions_over(read_rest, 1 << 30)

    async def main() -> None:
        with pytest.raises(StoreTimeoutError):
            await sessions.read_rest(session, 0, MiB, False)
        with pytest.raises(StoreTimeoutError, match="failed again at once"):
            await sessions.read_rest(session, 4096, 4096, False)
        with pytest.raises(StoreTimeoutError, match=r"more than 3 s$"):
            await sessions.read_rest(session, 512 * 1024, 4096, False)  # (in the other xorb: asked again)
        assert asked == [0, 512 * 1024]
        sessions.close(session)
        again = sessions.open(1, file(1 << 30))
        with pytest.raises(StoreTimeoutError, match=r"more than 3 s$"):
            await sessions.read_rest(again, 4096, 4096, False)  # (a new open: its reads are its own)
        assert asked == [0, 512 * 1024, 4096]

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
