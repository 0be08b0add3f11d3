"""The store index: ``Index.locate`` and ``chunk_range`` against a brute-force
model, duplicate files across shards, and the cross-object checks.
"""

from __future__ import annotations

import hashlib
import itertools
import random
from array import array

import pytest
from helpers import writer
from helpers.writer import FileSpec, TermSpec, XorbSpec
from hypothesis import given, settings
from hypothesis import strategies as st

from xetfs.base import hashes
from xetfs.base.errors import IntegrityError, MissingObjectError
from xetfs.format.shard import Shard, parse_shard
from xetfs.format.xorb import XorbLayout
from xetfs.storage import index
from xetfs.storage.index import FileEntry, Index, TermSlice, chunk_range

pytestmark = pytest.mark.unit

PROPERTY = settings(max_examples=250, deadline=None, derandomize=True)


def _h(i: int) -> bytes:
    return hashes.chunk_hash(b"index-test-%d" % i)


def _shard(files: list[FileSpec], xorbs: list[XorbSpec] | None = None, *, sha256: bool = True) -> Shard:
    _, data = writer.build_shard(files, xorbs or [], sha256=sha256)
    return parse_shard(data, where="index test")


def _file(sizes: list[int], file_id: int = 1, xorbs: int = 3) -> FileSpec:
    """A file whose term ``i`` has ``sizes[i]`` bytes, cycling over a few xorbs."""
    terms = tuple(TermSpec(_h(1000 + i % xorbs), i, i + 1, size) for i, size in enumerate(sizes))
    return FileSpec(_h(file_id), terms, hashlib.sha256(b"%d" % file_id).digest())


def _entry(sizes: list[int]) -> tuple[Index, FileEntry]:
    idx = index.build([_shard([_file(sizes)])])
    entry = idx.get(_h(1))
    assert entry is not None
    return idx, entry


def _model_locate(sizes: list[int], offset: int, size: int) -> list[tuple[int, int, int]]:
    """``(term, offset in term, length)`` for every term overlapping ``[offset, offset + size)``."""
    out = []
    end = offset + size
    for i, (a, b) in enumerate(itertools.pairwise([0, *itertools.accumulate(sizes)])):
        lo, hi = max(a, offset), min(b, end)
        if lo < hi:
            out.append((i, lo - a, hi - lo))
    return out


def _check_locate(idx: Index, entry: FileEntry, sizes: list[int], offset: int, size: int) -> None:
    pieces = idx.locate(entry, offset, size)
    assert [(p.term, p.offset, p.length) for p in pieces] == _model_locate(sizes, offset, size)
    for p in pieces:
        assert p.term_size == sizes[p.term]
        assert p.xorb_hash == _h(1000 + p.term % 3)
        assert (p.start, p.stop) == (p.term, p.term + 1)
    assert sum(p.length for p in pieces) == max(0, min(offset + size, sum(sizes)) - offset)


# -- FileEntry ------------------------------------------------------------------


def test_entry_fields() -> None:
    idx, entry = _entry([5, 7, 1])
    assert entry.size == 13
    assert entry.num_terms == 3
    assert list(entry.ends) == [5, 12, 13]
    assert [entry.term_start(i) for i in range(3)] == [0, 5, 12]
    assert entry.hex == hashes.to_hex(_h(1))
    assert entry.sha256 == hashlib.sha256(b"1").hexdigest()
    assert list(idx.terms_of(entry)) == [(_h(1000), 0, 1, 5), (_h(1001), 1, 2, 7), (_h(1002), 2, 3, 1)]
    assert idx.terms == 3 and idx.shards == 1 and len(idx) == 1
    assert list(idx) == [entry]
    assert idx.get(_h(2)) is None


def test_sha256_absent_and_empty_file() -> None:
    idx = index.build([_shard([_file([3], 1)], sha256=False)])
    entry = idx.get(_h(1))
    assert entry is not None and entry.sha256 is None
    empty = FileSpec(hashes.ZERO_HASH, ())  # hf_xet records zeros for an empty file's sha256
    entry = index.build([_shard([empty])]).get(hashes.ZERO_HASH)
    assert entry is not None
    assert entry.size == 0 and entry.num_terms == 0
    assert entry.sha256 == hashlib.sha256(b"").hexdigest()
    real = FileSpec(hashes.ZERO_HASH, (), hashlib.sha256(b"").digest())  # upload_bytes records the real one
    entry = index.build([_shard([real])]).get(hashes.ZERO_HASH)
    assert entry is not None and entry.sha256 == hashlib.sha256(b"").hexdigest()


def test_same_file_in_two_shards_counted_once() -> None:
    first = _file([4, 4], 1)
    second = FileSpec(first.file_hash, (TermSpec(_h(2000), 0, 1, 8),), first.sha256)  # first one wins
    other = _file([9], 2)
    idx = index.build([_shard([first]), _shard([second, other])])
    assert len(idx) == 2
    assert idx.shards == 2
    assert idx.terms == 3  # 2 + 1: the duplicate is not indexed again
    entry = idx.get(first.file_hash)
    assert entry is not None and entry.num_terms == 2
    assert [t[0] for t in idx.terms_of(entry)] == [_h(1000), _h(1001)]


def test_xorbs_listed_and_referenced() -> None:
    listed = XorbSpec(_h(3000), (_h(1),), (5,))
    idx = index.build([_shard([_file([1, 2], 1)], [listed])])
    assert idx.listed_xorbs == {_h(3000)}
    assert idx.all_xorbs == {_h(3000), _h(1000), _h(1001)}
    assert idx.xorbs == [_h(1000), _h(1001)]


def test_xorb_ids_shared_between_files() -> None:
    idx = index.build([_shard([_file([1, 2, 3], 1), _file([4, 5], 2)])])
    assert sorted(idx.xorbs) == sorted({_h(1000), _h(1001), _h(1002)})


# -- locate -----------------------------------------------------------------------


def test_locate_examples() -> None:
    idx, entry = _entry([5, 7, 1])
    loc = idx.locate
    assert loc(entry, 0, 13) == [
        TermSlice(0, _h(1000), 0, 1, 5, 0, 5),
        TermSlice(1, _h(1001), 1, 2, 7, 0, 7),
        TermSlice(2, _h(1002), 2, 3, 1, 0, 1),
    ]
    assert loc(entry, 3, 4) == [TermSlice(0, _h(1000), 0, 1, 5, 3, 2), TermSlice(1, _h(1001), 1, 2, 7, 0, 2)]
    assert loc(entry, 5, 7) == [TermSlice(1, _h(1001), 1, 2, 7, 0, 7)]  # exactly one term
    assert loc(entry, 12, 100) == [TermSlice(2, _h(1002), 2, 3, 1, 0, 1)]  # clipped at EOF
    assert loc(entry, 4, 1) == [TermSlice(0, _h(1000), 0, 1, 5, 4, 1)]  # last byte of a term
    assert loc(entry, 5, 1) == [TermSlice(1, _h(1001), 1, 2, 7, 0, 1)]  # first byte of the next


@pytest.mark.parametrize(("offset", "size"), [(0, 0), (5, 0), (13, 0), (13, 1), (14, 5), (10**12, 10**12)])
def test_locate_empty_results(offset: int, size: int) -> None:
    idx, entry = _entry([5, 7, 1])
    assert idx.locate(entry, offset, size) == []


def test_locate_empty_file() -> None:
    idx = index.build([_shard([FileSpec(hashes.ZERO_HASH, ())])])
    entry = idx.get(hashes.ZERO_HASH)
    assert entry is not None
    assert idx.locate(entry, 0, 4096) == []


def test_locate_every_range_of_a_small_file() -> None:
    sizes = [3, 1, 4, 1, 5]
    idx, entry = _entry(sizes)
    for offset in range(16):
        for size in range(17):
            _check_locate(idx, entry, sizes, offset, size)


def test_locate_random() -> None:
    rng = random.Random(11)
    for _ in range(200):
        sizes = [rng.choice([1, 2, rng.randint(1, 100), rng.randint(1, 70000)]) for _ in range(rng.randint(1, 40))]
        idx, entry = _entry(sizes)
        total = sum(sizes)
        for _ in range(20):
            offset = rng.randint(0, total + 10)
            size = rng.choice([0, 1, rng.randint(1, 100), rng.randint(0, total + 10)])
            _check_locate(idx, entry, sizes, offset, size)


@PROPERTY
@given(
    sizes=st.lists(st.integers(1, 2**20), min_size=1, max_size=30),
    offset_frac=st.floats(0, 1.2),
    size=st.integers(0, 2**22),
)
def test_locate_property(sizes: list[int], offset_frac: float, size: int) -> None:
    idx, entry = _entry(sizes)
    _check_locate(idx, entry, sizes, int(sum(sizes) * offset_frac), size)


def test_locate_large_offsets() -> None:
    # file sizes beyond 4 GiB: terms are u32, the file is not
    sizes = [2**32 - 1] * 3
    idx, entry = _entry(sizes)
    assert entry.size == 3 * (2**32 - 1)
    _check_locate(idx, entry, sizes, 2**32 + 5, 2**32)


# -- chunk_range ------------------------------------------------------------------


def _layout(sizes: list[int]) -> XorbLayout:
    ends = tuple(itertools.accumulate(sizes))
    return XorbLayout(_h(1000), tuple(10 * (i + 1) for i in range(len(sizes))), ends, None)


def _model_range(sizes: list[int], start: int, offset: int, length: int) -> tuple[int, int]:
    """``(first chunk, stop chunk)`` by listing the chunk of every byte."""
    owner = [i for i, size in enumerate(sizes) for _ in range(size)]
    base = sum(sizes[:start])
    lo, hi = base + offset, base + offset + length
    first, last = owner[lo], owner[hi - 1]
    return first, last + 1


def _piece(
    sizes: list[int], start: int, stop: int, offset: int, length: int, term_size: int | None = None
) -> TermSlice:
    size = sum(sizes[start:stop]) if term_size is None else term_size
    return TermSlice(0, _h(1000), start, stop, size, offset, length)


def test_chunk_range_examples() -> None:
    sizes = [10, 5, 1, 7]
    layout = _layout(sizes)
    assert chunk_range(_piece(sizes, 0, 4, 0, 23), layout) == (0, 4)
    assert chunk_range(_piece(sizes, 1, 3, 0, 6), layout) == (1, 3)
    assert chunk_range(_piece(sizes, 1, 4, 4, 2), layout) == (1, 3)  # mid-chunk, crosses
    assert chunk_range(_piece(sizes, 3, 4, 6, 1), layout) == (3, 4)  # last byte
    assert chunk_range(_piece(sizes, 0, 1, 9, 1), layout) == (0, 1)


def test_chunk_range_random() -> None:
    rng = random.Random(12)
    for _ in range(300):
        sizes = [rng.randint(1, 40) for _ in range(rng.randint(1, 25))]
        layout = _layout(sizes)
        start = rng.randrange(len(sizes))
        stop = rng.randint(start + 1, len(sizes))
        term_size = sum(sizes[start:stop])
        offset = rng.randrange(term_size)
        length = rng.randint(1, term_size - offset)
        first, end = chunk_range(_piece(sizes, start, stop, offset, length), layout)
        assert (first, end) == _model_range(sizes, start, offset, length)
        assert start <= first < end <= stop


def test_locate_then_chunk_range_covers_the_file() -> None:
    # A file of several multi-chunk terms over one xorb: the slices' chunks hold the bytes.
    rng = random.Random(13)
    chunk_sizes = [rng.randint(1, 30) for _ in range(20)]
    xorb_bytes = bytes(rng.randrange(256) for _ in range(sum(chunk_sizes)))
    starts = [0, *itertools.accumulate(chunk_sizes)]
    ranges = [(0, 5), (3, 9), (9, 20), (0, 1), (19, 20), (7, 8)]
    terms = tuple(TermSpec(_h(1000), a, b, starts[b] - starts[a]) for a, b in ranges)
    content = b"".join(xorb_bytes[starts[a] : starts[b]] for a, b in ranges)
    idx = index.build([_shard([FileSpec(_h(1), terms)])])
    entry = idx.get(_h(1))
    assert entry is not None and entry.size == len(content)
    layout = _layout(chunk_sizes)
    for _ in range(200):
        offset = rng.randrange(len(content))
        size = rng.randint(0, len(content))
        got = b""
        for piece in idx.locate(entry, offset, size):
            first, stop = chunk_range(piece, layout)
            lo = starts[piece.start] + piece.offset  # the slice's first byte in the xorb's decoded bytes
            assert starts[first] <= lo and lo + piece.length <= starts[stop]
            got += xorb_bytes[lo : lo + piece.length]
        assert got == content[offset : offset + size]


@pytest.mark.parametrize(("start", "stop", "chunks"), [(0, 5, 4), (3, 5, 4), (4, 5, 4), (0, 2**32 - 1, 4)])
def test_chunk_range_beyond_xorb(start: int, stop: int, chunks: int) -> None:
    layout = _layout([3] * chunks)
    with pytest.raises(MissingObjectError, match=f"has {chunks}"):
        chunk_range(TermSlice(0, _h(1000), start, stop, 3, 0, 1), layout)


@pytest.mark.parametrize("delta", [-1, 1, 1000])
def test_term_size_mismatch(delta: int) -> None:
    sizes = [10, 5, 1, 7]
    layout = _layout(sizes)
    with pytest.raises(IntegrityError, match="the shard says"):
        chunk_range(_piece(sizes, 1, 3, 0, 1, term_size=6 + delta), layout)


def test_num_chunks_counts_each_chunk_of_a_xorb_once() -> None:
    """Terms may repeat or overlap chunks of one xorb (repeated content): ``ls`` and ``stats MNT FILE`` count
    distinct chunks, the most a read of the whole file needs to decode."""

    def entry(ranges: list[tuple[int, int, int]]) -> FileEntry:
        ids, starts, stops = (array("q", [r[i] for r in ranges]) for i in range(3))
        return FileEntry(b"\0" * 32, 0, None, ids, starts, stops, array("q", range(len(ranges))))

    assert entry([]).num_chunks == 0
    assert entry([(0, 0, 10), (0, 5, 12), (1, 0, 3)]).num_chunks == 15
    assert entry([(0, 4, 6), (0, 0, 10), (0, 4, 6)]).num_chunks == 10
    assert entry([(2, 7, 9), (2, 0, 3), (2, 3, 7)]).num_chunks == 9
