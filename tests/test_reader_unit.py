"""Reader (xetfs/read/reader.py) over stores written by the test writer.

Every read is compared with the original bytes; store reads, cache hits and
error counts are checked through ``Reader.statistics``.  Every test runs twice:
decoding in the reader's own thread, and in worker processes (a
``DecodePool`` that takes every run, however small).
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from helpers import writer
from helpers.served import holds, run_served
from helpers.writer import FileSpec, StoreBuilder, TermSpec

from xetfs.base import hashes
from xetfs.base.errors import IntegrityError, MissingObjectError, ObjectReadError, XorbFormatError
from xetfs.base.settings import MIN_SLOT_RUN, MiB
from xetfs.format.shard import parse_shard
from xetfs.format.xorb import decode_run
from xetfs.read import loader as loader_module
from xetfs.read.pool import DecodePool, slots_for
from xetfs.read.reader import Reader
from xetfs.storage import index
from xetfs.storage.index import FileEntry, Index
from xetfs.storage.store import Store

pytestmark = pytest.mark.unit

_pool: DecodePool | None = None  # set by the ``decoding`` fixture


@pytest.fixture(scope="module")
def shared_pool() -> Iterator[DecodePool]:
    pool = DecodePool(2)
    pool.min_job_bytes = pool.min_slot_run = 0  # every run goes to a worker, and stays in its slot
    run_served(pool.start, pool.wait_ready)
    yield pool
    pool.close()


@pytest.fixture(autouse=True, params=["daemon", "workers"])
def decoding(request: pytest.FixtureRequest) -> Iterator[str]:
    global _pool
    _pool = request.getfixturevalue("shared_pool") if request.param == "workers" else None
    yield request.param
    _pool = None


@contextmanager
def opened(root: Path, **options: object) -> Iterator[tuple[Index, Reader]]:
    """Index every shard of the store at ``root`` and wrap it in a Reader."""
    store = Store.open(root)
    try:
        shards = [parse_shard(store.read_shard(f), where=f.name) for f in store.shard_files()]
        idx = index.build(shards)
        reader = Reader(idx, store, **{"pool": _pool, **options})  # type: ignore[arg-type]
        try:
            yield idx, reader
        finally:
            reader.runs.clear()  # the shared pool's slots are free again for the next test
    finally:
        store.close()


def running(reader: Reader, call: str, *args: object, **kwargs: object) -> Any:
    """``reader.<call>(*args)`` in a trio run where the reader's workers (if any) are served."""
    return run_served(reader.start, lambda: getattr(reader, call)(*args, **kwargs))


def read(idx: Index, reader: Reader, file_hash: bytes, offset: int = 0, size: int = 1 << 40) -> bytes:
    entry = idx.get(file_hash)
    assert entry is not None, hashes.to_hex(file_hash)
    data = running(reader, "read", entry, offset, size)
    assert isinstance(data, bytes | memoryview)
    return bytes(data)


def read_in_turn(idx: Index, reader: Reader, files: list[bytes]) -> list[bytes]:
    """Each file read whole, one after the other, in one trio run."""

    async def reads() -> list[bytes]:
        out = []
        for fh in files:
            entry = idx.get(fh)
            assert entry is not None
            out.append(bytes(await reader.read(entry, 0, entry.size)))
        return out

    return run_served(reader.start, reads)


def check_ranges(idx: Index, reader: Reader, file_hash: bytes, content: bytes, seed: int, count: int = 40) -> None:
    """Whole file, boundary cases and random sub-ranges equal ``content``."""
    assert read(idx, reader, file_hash) == content
    n = len(content)
    rng = random.Random(seed)
    cases = [(0, 0), (0, 1), (n, 1), (n + 5, 10), (max(n - 1, 0), 10), (0, n)]
    cases += [(rng.randint(0, n), rng.choice([1, 7, rng.randint(0, n + 3)])) for _ in range(count)]
    for offset, size in cases:
        assert read(idx, reader, file_hash, offset, size) == content[offset : offset + size], (offset, size)


def _content(rng: random.Random, n: int) -> bytes:
    """Half random, half compressible bytes, so all three schemes shrink some chunks."""
    half = n // 2
    return rng.randbytes(half) + bytes(rng.choice(b"ab\n") for _ in range(n - half))


# -- round trips -------------------------------------------------------------------


@pytest.mark.parametrize(("layout", "suffix"), [("hf_xet", ""), ("flat", ""), ("flat", ".xorb")])
def test_mixed_schemes(tmp_path: Path, layout: writer.Layout, suffix: str) -> None:
    rng = random.Random(1)
    b = StoreBuilder(tmp_path, layout, xorb_suffix=suffix)
    files = {}
    for size in [1, 2, 5, 4096, 70_000, 300_001]:
        content = _content(rng, size)
        files[b.add_file(content, chunk_size=rng.choice([1000, 4099, 65536]), scheme=[0, 1, 2])] = content
    b.finish()
    assert len(b.xorbs) == 1
    assert set(b.xorbs[next(iter(b.xorbs))].schemes) == {0, 1, 2}
    with opened(tmp_path) as (idx, reader):
        assert len(idx) == len(files)
        for i, (fh, content) in enumerate(files.items()):
            check_ranges(idx, reader, fh, content, seed=i)
        assert reader.statistics().errors.integrity == reader.statistics().errors.format == 0


@pytest.mark.parametrize("scheme", [0, 1, 2])
def test_bg4_all_remainders(tmp_path: Path, scheme: int) -> None:
    rng = random.Random(2)
    b = StoreBuilder(tmp_path)
    content = _content(rng, 4 * 1000 + 6)
    fh = b.add_file(content, boundaries=[1001, 2003, 3006, 4006], scheme=scheme)  # chunk sizes mod 4 = 1, 2, 3, 0, 2
    b.finish()
    with opened(tmp_path) as (idx, reader):
        check_ranges(idx, reader, fh, content, seed=3)


def test_footerless_xorbs(tmp_path: Path) -> None:
    rng = random.Random(4)
    b = StoreBuilder(tmp_path, xorb_footer=False, max_xorb_chunks=7)
    files = {}
    for size in [1, 3000, 50_000]:
        content = _content(rng, size)
        files[b.add_file(content, chunk_size=2048, scheme=[2, 1, 0])] = content
    b.finish()
    assert len(b.xorbs) > 1 and not any(x.has_footer for x in b.xorbs.values())
    with opened(tmp_path) as (idx, reader):
        for i, (fh, content) in enumerate(files.items()):
            check_ranges(idx, reader, fh, content, seed=i)


def test_some_xorbs_with_footer_some_without(tmp_path: Path) -> None:
    rng = random.Random(5)
    b = StoreBuilder(tmp_path)
    a = _content(rng, 10_000)
    fa = b.add_file(a, chunk_size=1000, scheme=1)
    b.seal_xorb(footer=False)
    c = _content(rng, 10_000)
    fc = b.add_file(c, chunk_size=1000, scheme=2)
    b.finish()
    assert sorted(x.has_footer for x in b.xorbs.values()) == [False, True]
    with opened(tmp_path) as (idx, reader):
        check_ranges(idx, reader, fa, a, seed=1)
        check_ranges(idx, reader, fc, c, seed=2)


def test_terms_cross_xorbs(tmp_path: Path) -> None:
    rng = random.Random(6)
    b = StoreBuilder(tmp_path, max_xorb_chunks=5)
    content = _content(rng, 23 * 1000 + 17)
    fh = b.add_file(content, chunk_size=1000, scheme=[0, 1, 2, 1])
    b.finish()
    spec = b.files[fh]
    assert len(spec.terms) == 5 and len({t.xorb_hash for t in spec.terms}) == 5
    with opened(tmp_path) as (idx, reader):
        check_ranges(idx, reader, fh, content, seed=6, count=80)


def test_many_small_terms(tmp_path: Path) -> None:
    rng = random.Random(7)
    b = StoreBuilder(tmp_path)
    content = _content(rng, 5000)
    fh = b.add_file(content, chunk_size=50, chunks_per_term=1, scheme=1)
    b.finish()
    assert len(b.files[fh].terms) == 100
    with opened(tmp_path) as (idx, reader):
        check_ranges(idx, reader, fh, content, seed=7, count=80)


def test_terms_referencing_other_shards(tmp_path: Path) -> None:
    rng = random.Random(8)
    b = StoreBuilder(tmp_path)
    a = _content(rng, 9000)
    fa = b.add_file(a, chunk_size=1000, scheme=[0, 2])
    b.flush_shard()  # shard 1: file a and its xorb
    xa = b.files[fa].terms[0].xorb_hash
    c = _content(rng, 3000)
    fc = b.add_file(c, chunk_size=1000, scheme=1)
    b.flush_shard(cas=False)  # shard 2: file c, its xorb's CAS record deferred
    xc = b.files[fc].terms[0].xorb_hash
    # a file made of pieces of both xorbs, backwards and overlapping, in shard 3
    pieces = [(xc, 1, 3), (xa, 4, 9), (xa, 0, 5), (xc, 0, 1), (xa, 8, 9)]
    fm = b.add_file_from_terms(pieces)
    mixed = b.content_of_terms(pieces)
    b.relist(fa)  # file a is listed again (a re-upload)
    b.finish(cas=False)  # xorb c is described in no shard at all
    assert len(b.shard_paths) == 3
    with opened(tmp_path) as (idx, reader):
        assert len(idx) == 3 and idx.shards == 3
        assert xc not in idx.listed_xorbs and xa in idx.listed_xorbs
        check_ranges(idx, reader, fa, a, seed=1)
        check_ranges(idx, reader, fc, c, seed=2)
        check_ranges(idx, reader, fm, mixed, seed=3, count=80)


def test_empty_and_one_byte_files(tmp_path: Path) -> None:
    b = StoreBuilder(tmp_path)
    empty = b.add_file(b"")
    one = b.add_file(b"A")
    b.finish()
    assert empty == hashes.ZERO_HASH
    assert hashes.to_hex(one) == "ec75277e0d6c72c675f77d6c7385cd327acb970e20173d0fe7ece9466e3cb44d"
    with opened(tmp_path) as (idx, reader):
        assert read(idx, reader, empty) == b""
        assert read(idx, reader, empty, 5, 5) == b""
        check_ranges(idx, reader, one, b"A", seed=0)
        entry = idx.get(empty)
        assert entry is not None and entry.size == 0


# -- store reads and the cache ----------------------------------------------------


def test_adjacent_chunks_are_one_store_read(tmp_path: Path) -> None:
    rng = random.Random(9)
    b = StoreBuilder(tmp_path)
    content = _content(rng, 10_000)
    fh = b.add_file(content, chunk_size=1000, scheme=[0, 1])
    b.finish()
    with opened(tmp_path) as (idx, reader):
        assert read(idx, reader, fh) == content
        s = reader.statistics()
        assert s.store.reads == 1
        assert s.store.layouts == 1
        (built,) = b.xorbs.values()
        assert s.store.bytes == built.phys_ends[-1]  # the chunk section, in one pread
        assert (s.cache.misses, s.cache.hits) == (10, 0)
        assert s.decode.chunks == 10 and s.decode.bytes == 10_000
        assert (s.layouts.misses, s.layouts.entries) == (1, 1)
        assert read(idx, reader, fh) == content  # all from the cache
        s = reader.statistics()
        assert s.store.reads == 1
        assert (s.cache.misses, s.cache.hits) == (10, 10)
        assert (s.layouts.misses, s.layouts.hits) == (1, 0)  # served from the run's extent: no lookup at all


def test_a_small_read_of_a_local_store_is_loaded_at_once(
    tmp_path: Path, decoding: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once its layout is held, a read too small for a worker is read, decoded and verified with no await
    (``Loader.load_now``): ``RunStore.get``, its loads and their events are not used; counted as ever."""
    rng = random.Random(21)
    b = StoreBuilder(tmp_path)
    first, second, third = (_content(rng, 3000) for _ in range(3))
    fh1 = b.add_file(first, chunk_size=1000)
    b.add_file(second, chunk_size=1000)
    fh3 = b.add_file(third, chunk_size=1000)
    b.finish()
    with opened(tmp_path) as (idx, reader):
        assert read(idx, reader, fh1) == first  # loads the layout: through ``get``
        gets: list[object] = []
        real_get = reader.runs.get

        def get(*args: Any, **kwargs: Any) -> Any:
            gets.append(args)
            return real_get(*args, **kwargs)

        monkeypatch.setattr(reader.runs, "get", get)
        assert read(idx, reader, fh3, 500, 2000) == third[500:2500]  # (not where fh1's read ended)
        assert len(gets) == (0 if decoding == "daemon" else 1)  # (the workers fixture sends every run to one)
        s = reader.statistics()
        assert (s.cache.misses, s.cache.hits, s.store.reads, s.prefetch.requests) == (6, 0, 2, 0)
        assert reader.file_statistics(fh3).chunks == 3
        assert read(idx, reader, fh3) == third  # every chunk held
        assert reader.statistics().store.reads == 2


def test_small_files_read_in_the_order_they_were_packed_read_ahead_on_a_local_store(tmp_path: Path) -> None:
    """A small file read whole where the last read of its xorb ended (the next file, in pack order) has the
    chunks after it read in the background, one run for the files that follow, which their reads then join or
    find held (``read.readahead``).  Each file's stats count the chunks its own read loaded."""
    rng = random.Random(22)
    b = StoreBuilder(tmp_path)
    contents = [_content(rng, 3000) for _ in range(6)]
    files = [b.add_file(c, chunk_size=1000) for c in contents]
    b.finish()
    with opened(tmp_path) as (idx, reader):
        assert read_in_turn(idx, reader, files) == contents  # (in one trio run: what is read ahead runs meanwhile)
        s = reader.statistics()
        assert (s.store.reads, s.prefetch.requests, s.prefetch.chunks, s.prefetch.hits) == (3, 1, 12, 12), s
        assert [reader.file_statistics(fh).chunks for fh in files] == [3, 3, 0, 0, 0, 0]
    for options in ({"read_ahead": False}, {"cache_size": 32 * MiB}):  # (``--no-prefetch``, a cache under 64 MiB)
        with opened(tmp_path, **options) as (idx, reader):
            for fh, content in zip(files, contents, strict=True):
                assert read(idx, reader, fh) == content
            s = reader.statistics()
            assert (s.store.reads, s.prefetch.requests, s.decode.chunks) == (6, 0, 18), (options, s)


def test_each_layout_lookup_counts_once(tmp_path: Path) -> None:
    """A read across two xorbs, one layout held and one not: one hit and one miss, not the held one
    counted again when the other is looked up."""
    rng = random.Random(19)
    b = StoreBuilder(tmp_path, max_xorb_chunks=4)
    content = _content(rng, 8000)
    fh = b.add_file(content, chunk_size=1000)  # chunks 0-3 in one xorb, 4-7 in another: two terms
    b.finish()
    with opened(tmp_path) as (idx, reader):
        assert read(idx, reader, fh, 0, 100) == content[:100]  # the first xorb's layout: a miss
        assert read(idx, reader, fh, 3900, 200) == content[3900:4100]  # held, then the second's
        s = reader.statistics()
        assert (s.layouts.hits, s.layouts.misses) == (1, 2)


def test_partly_cached_range_needs_one_read_per_gap(tmp_path: Path) -> None:
    rng = random.Random(10)
    b = StoreBuilder(tmp_path)
    content = _content(rng, 10_000)
    fh = b.add_file(content, chunk_size=1000)
    b.finish()
    with opened(tmp_path) as (idx, reader):
        assert read(idx, reader, fh, 3500, 2000) == content[3500:5500]  # chunks 3, 4, 5
        assert reader.statistics().store.reads == 1
        assert read(idx, reader, fh) == content  # chunks 0-2 and 6-9 are two runs
        assert reader.statistics().store.reads == 3
        assert reader.statistics().cache.hits == 3


def test_long_runs_are_split(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # scheme 0 chunks of 1000 bytes take 1008 bytes on disk; allow two per pread
    monkeypatch.setattr(loader_module, "MAX_RUN_BYTES", 2500)
    content = random.Random(15).randbytes(10_000)
    b = StoreBuilder(tmp_path)
    fh = b.add_file(content, chunk_size=1000)
    b.finish()
    with opened(tmp_path) as (idx, reader):
        assert read(idx, reader, fh) == content
        assert reader.statistics().store.reads == 5
        assert reader.statistics().store.bytes == 10 * 1008


def test_small_cache_still_reads_correctly(tmp_path: Path) -> None:
    rng = random.Random(11)
    b = StoreBuilder(tmp_path)
    content = _content(rng, 20_000)
    fh = b.add_file(content, chunk_size=1000, scheme=[1, 2])
    b.finish()
    with opened(tmp_path, cache_size=2500) as (idx, reader):
        check_ranges(idx, reader, fh, content, seed=11)
        assert reader.statistics().cache.bytes <= 2500
        assert reader.statistics().cache.evictions > 0


def test_prefetch_then_read(tmp_path: Path) -> None:
    rng = random.Random(12)
    b = StoreBuilder(tmp_path)
    content = _content(rng, 8000)
    fh = b.add_file(content, chunk_size=1000)
    b.finish()
    with opened(tmp_path) as (idx, reader):
        entry = idx.get(fh)
        assert entry is not None
        running(reader, "prefetch", entry, 0, 4000)
        assert reader.statistics().prefetch.requests == 1
        assert reader.statistics().prefetch.chunks == 4
        assert read(idx, reader, fh, 0, 8000) == content
        assert reader.statistics().prefetch.hits == 4
        assert reader.statistics().store.reads == 2


# -- errors -------------------------------------------------------------------------


def _corrupt(path: Path, offset: int) -> None:
    path.chmod(0o644)
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("footer", [True, False])
def test_corrupted_chunk(tmp_path: Path, footer: bool) -> None:
    rng = random.Random(13)
    b = StoreBuilder(tmp_path, xorb_footer=footer)
    content = _content(rng, 10_000)
    fh = b.add_file(content, chunk_size=1000)  # scheme 0: a flipped byte decodes fine, the hash catches it
    b.finish()
    ((xorb_hash, built),) = b.xorbs.items()
    start, _ = built.payload_range(4)
    _corrupt(b.xorb_paths[xorb_hash], start + 10)
    with opened(tmp_path) as (idx, reader):
        with pytest.raises(IntegrityError):
            read(idx, reader, fh, 4000, 1000)
        assert reader.statistics().errors.integrity == 1
        with pytest.raises(IntegrityError):
            read(idx, reader, fh)
        assert reader.statistics().errors.integrity == 2
        if footer:  # the footer's hashes are intact: only chunk 4 is unreadable
            assert read(idx, reader, fh, 0, 4000) == content[:4000]
            assert read(idx, reader, fh, 5000, 5000) == content[5000:]
            assert not holds(reader.runs, xorb_hash, 4) and holds(reader.runs, xorb_hash, 3)
        else:  # the xorb's name no longer matches its chunks: all of it is refused
            with pytest.raises(IntegrityError):
                read(idx, reader, fh, 0, 1)


def test_the_flipped_byte_still_decodes_only_the_hash_check_catches_it(tmp_path: Path) -> None:
    """The control of the corruption tests: the damage they make decodes to other bytes of the right size, with
    no error, so that only the check against the chunk's hash can refuse it."""
    b = StoreBuilder(tmp_path)
    b.add_file(bytes(3000), chunk_size=1000)
    b.finish()
    ((xorb_hash, built),) = b.xorbs.items()
    _corrupt(b.xorb_paths[xorb_hash], built.payload_range(1)[0])
    store = Store.open(tmp_path)
    layout = store.load_layout(xorb_hash)
    data = b.xorb_paths[xorb_hash].read_bytes()[: layout.phys_ends[-1]]
    unchecked = decode_run(data, xorb_hash, layout, 0, layout.num_chunks, verify=False)
    chunks = [c for c in unchecked if isinstance(c, bytes) and len(c) == 1000]
    assert len(chunks) == 3 and b"".join(chunks) != bytes(3000)
    checked = decode_run(data, xorb_hash, layout, 0, layout.num_chunks, verify=True)
    assert [type(c) for c in checked] == [bytes, IntegrityError, bytes]
    store.close()


def test_missing_xorb(tmp_path: Path) -> None:
    b = StoreBuilder(tmp_path, max_xorb_chunks=2)
    content = random.Random(14).randbytes(5000)
    fh = b.add_file(content, chunk_size=1024)
    b.finish()
    second = b.files[fh].terms[1].xorb_hash
    b.xorb_paths[second].unlink()
    with opened(tmp_path) as (idx, reader):
        assert read(idx, reader, fh, 0, 2048) == content[:2048]
        with pytest.raises(MissingObjectError):
            read(idx, reader, fh, 2048, 1)
        assert reader.statistics().errors.missing == 1


def _store_with_terms(root: Path, terms_for: str) -> tuple[bytes, bytes]:
    """A store with one 4-chunk xorb and one file whose term is deliberately wrong."""
    b = StoreBuilder(root)
    b.add_file(bytes(range(100)) * 40, chunk_size=1000)
    b.finish()
    (xorb_hash,) = b.xorbs
    term = {
        "size": TermSpec(xorb_hash, 0, 2, 2001),
        "range": TermSpec(xorb_hash, 3, 5, 2000),
    }[terms_for]
    spec = FileSpec(hashes.chunk_hash(b"a file"), (term,))
    shard_hash, data = writer.build_shard([spec], [], verification=False)
    (b.shard_dir / f"{hashes.to_hex(shard_hash)}.mdb").write_bytes(data)
    return spec.file_hash, xorb_hash


def test_term_size_mismatch(tmp_path: Path) -> None:
    fh, _ = _store_with_terms(tmp_path, "size")
    with opened(tmp_path) as (idx, reader):
        with pytest.raises(IntegrityError):
            read(idx, reader, fh)
        assert reader.statistics().errors.integrity == 1


def test_chunk_range_beyond_xorb(tmp_path: Path) -> None:
    fh, _ = _store_with_terms(tmp_path, "range")
    with opened(tmp_path) as (idx, reader):
        with pytest.raises(MissingObjectError):
            read(idx, reader, fh)
        assert reader.statistics().errors.missing == 1


def test_chunk_header_disagreeing_with_footer_is_a_xorb_format_error(tmp_path: Path) -> None:
    """docs/format.md 8: header values must agree with the footer's deltas, else XorbFormatError.

    reader.py ``_load_run`` raises the base ``FormatError`` here instead.
    """
    b = StoreBuilder(tmp_path)
    fh = b.add_file(b"x" * 3000, chunk_size=1000, scheme=1)
    b.finish()
    ((xorb_hash, built),) = b.xorbs.items()
    path = b.xorb_paths[xorb_hash]
    path.chmod(0o644)
    data = bytearray(path.read_bytes())
    header_at = built.phys_start(1)
    data[header_at + 5 : header_at + 8] = (999).to_bytes(3, "little")  # uncompressed length 1000 -> 999
    path.write_bytes(bytes(data))
    with opened(tmp_path) as (idx, reader):
        assert read(idx, reader, fh, 0, 1000) == b"x" * 1000
        with pytest.raises(XorbFormatError):
            read(idx, reader, fh, 1000, 1)
        assert reader.statistics().errors.format == 1


def _sequential(reader: Reader, entry: FileEntry, start: int, stop: int) -> bytes:
    """A sequential reader's reads of ``[start, stop)``, 1000 bytes each (its page cache keeps them)."""
    return b"".join(
        bytes(running(reader, "read", entry, offset, 1000, read_through=True)) for offset in range(start, stop, 1000)
    )


def _three_files_in_one_xorb(
    tmp_path: Path, seed: int, g: list[tuple[int, int]]
) -> tuple[bytes, bytes, bytes, bytes, bytes, bytes]:
    """Files f (4000 bytes), k and h (2000 each), chunks of 1000 bytes in one xorb, and g made of that
    xorb's chunk ranges ``g``: f's content, and the hashes of f, k, h, g and the xorb."""
    rng = random.Random(seed)
    b = StoreBuilder(tmp_path)
    content = _content(rng, 4000)
    f = b.add_file(content, chunk_size=1000, scheme=0)
    k = b.add_file(_content(rng, 2000), chunk_size=1000, scheme=0)
    h = b.add_file(_content(rng, 2000), chunk_size=1000, scheme=0)
    b.flush_shard()
    x = b.files[f].terms[0].xorb_hash
    gh = b.add_file_from_terms([(x, start, stop) for start, stop in g])
    b.finish()
    return content, f, k, h, gh, x


def test_a_store_read_that_fails_in_what_a_read_reads_ahead_fails_only_the_files_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bad sector in the next file's bytes: the file whose read read ahead is served (the chunks it reads
    ahead are a store read of their own), and the next file's read fails with the store's error."""
    rng = random.Random(24)
    b = StoreBuilder(tmp_path)
    contents = [_content(rng, 3000) for _ in range(4)]
    files = [b.add_file(c, chunk_size=1000) for c in contents]
    b.finish()
    with opened(tmp_path, pool=None) as (idx, reader):  # (the daemon's store reads: a worker reads the file itself)
        store = reader.store
        real_source, real_local = store.read_source, store.read_local

        def bad_sector(xorb_hash: bytes, start: int, end: int, stop: int) -> None:
            if stop > 6:  # (files[2] and after)
                raise ObjectReadError(f"xorb {hashes.to_hex(xorb_hash)} bytes [{start}, {end}): I/O error")

        def read_source(xorb_hash: bytes, src: Any, start: int, end: int, first: int, stop: int) -> Any:
            bad_sector(xorb_hash, start, end, stop)
            return real_source(xorb_hash, src, start, end, first, stop)

        def read_local(xorb_hash: bytes, start: int, end: int, first: int, stop: int) -> Any:
            bad_sector(xorb_hash, start, end, stop)
            return real_local(xorb_hash, start, end, first, stop)

        monkeypatch.setattr(store, "read_source", read_source)
        monkeypatch.setattr(store, "read_local", read_local)
        assert read(idx, reader, files[0]) == contents[0]
        assert read(idx, reader, files[1]) == contents[1]  # reads ahead into files[2] and [3]
        assert reader.statistics().prefetch.requests == 1
        with pytest.raises(ObjectReadError, match="I/O error"):
            read(idx, reader, files[2])
        monkeypatch.setattr(store, "read_source", real_source)
        monkeypatch.setattr(store, "read_local", real_local)
        assert read(idx, reader, files[3]) == contents[3]  # (nothing bad was kept)


def test_runs_read_through_are_evicted_first(tmp_path: Path) -> None:
    rng = random.Random(16)
    b = StoreBuilder(tmp_path)
    content = _content(rng, 10_000)
    fh = b.add_file(content, chunk_size=1000, scheme=[0, 1, 2])
    b.finish()
    with opened(tmp_path, cache_size=4000) as (idx, reader):
        entry = idx.get(fh)
        assert entry is not None
        assert read(idx, reader, fh, 0, 2000) == content[:2000]  # a run of chunks 0-1, read at random
        assert _sequential(reader, entry, 2000, 10_000) == content[2000:]  # one chunk per read
        s = reader.statistics()
        assert s.cache.bytes <= 4000
        # Chunks 2-7 at least (8 and 9 fit); with workers, also any run read through whose slot a later
        # run reused (depending on which slots earlier tests left in memory).  Never chunks 0-1.
        assert s.cache.evictions == s.cache.evicted_read >= 6
        reads = s.store.reads
        assert read(idx, reader, fh, 0, 2000) == content[:2000]
        assert reader.statistics().store.reads == reads  # chunks 0-1 were kept


def test_a_run_counts_as_read_through_only_once_sequential_reads_had_all_of_it(tmp_path: Path) -> None:
    """A sequential reader that starts inside a run leaves its head out of the page cache: that run
    is not evicted first, and a later read of its head needs no store read."""
    rng = random.Random(17)
    b = StoreBuilder(tmp_path)
    content = _content(rng, 10_000)
    fh = b.add_file(content, chunk_size=1000, scheme=[0, 1, 2])
    b.finish()
    with opened(tmp_path, cache_size=4000) as (idx, reader):
        entry = idx.get(fh)
        assert entry is not None
        # Starts inside chunk 1: chunks 1-2 are one run.
        assert _sequential(reader, entry, 1500, 10_000) == content[1500:]
        s = reader.statistics()
        assert s.cache.evicted_read == s.cache.evictions > 0
        reads = s.store.reads
        assert read(idx, reader, fh, 1000, 500) == content[1000:1500]  # the head nobody read yet
        assert reader.statistics().store.reads == reads


def test_bytes_read_twice_do_not_make_a_run_read_through(tmp_path: Path) -> None:
    """A file that repeats the head of a run: sequential reads have its head twice and its tail not at
    all, and the run must stay in the LRU order, not go first, so that its tail is not decoded again."""
    content, f, k, h, g, _ = _three_files_in_one_xorb(tmp_path, 18, [(0, 2), (0, 4)])  # g: chunks 0-1, then 0-3
    with opened(tmp_path, cache_size=7000) as (idx, reader):
        ge = idx.get(g)
        assert ge is not None
        read(idx, reader, k)  # the oldest run
        assert read(idx, reader, f, 0, 4000) == content  # one run of chunks 0-3
        _sequential(reader, ge, 0, 4000)  # g's first 4000 bytes: chunks 0-1 twice
        read(idx, reader, h)  # past the cache's size: one run goes
        reads = reader.statistics().store.reads
        tail = running(reader, "read", ge, 4000, 2000, read_through=True)
        assert bytes(tail) == content[2000:]
        assert reader.statistics().store.reads == reads  # chunks 2-3 were still held


def test_a_second_file_reading_a_run_read_through_has_its_own_reads_counted(tmp_path: Path) -> None:
    """File f reads a run through; file g (the same chunks, then more) reads it sequentially too, with an
    eviction in between: once g has had all of it, it is read through again and goes first."""
    content, f, k, h, g, x = _three_files_in_one_xorb(tmp_path, 19, [(0, 4), (4, 5)])  # g: f's bytes, then chunk 4
    with opened(tmp_path, cache_size=7000) as (idx, reader):
        fe, ge = idx.get(f), idx.get(g)
        assert fe is not None and ge is not None
        read(idx, reader, k, 0, 1000)  # a random reader's run: chunk 4
        assert read(idx, reader, f, 0, 4000) == content  # one run of chunks 0-3
        _sequential(reader, fe, 0, 4000)  # f reads it through
        _sequential(reader, ge, 0, 1000)  # g starts on it: back in the LRU order
        read(idx, reader, h)  # past the cache's size: the oldest run (chunk 4) goes, not the one g reads
        assert reader.statistics().cache.evicted_read == 0
        _sequential(reader, ge, 1000, 4000)  # g has had all of it now
        read(idx, reader, k, 1000, 1000)  # past the cache's size again: the run g read through goes first
        s = reader.statistics()
        assert s.cache.evicted_read == 1 and not holds(reader.runs, x, 0) and holds(reader.runs, x, 6)


def test_a_read_across_two_held_runs_is_served_from_their_extents(tmp_path: Path) -> None:
    rng = random.Random(22)
    b = StoreBuilder(tmp_path)
    content = _content(rng, 8_000)
    fh = b.add_file(content, chunk_size=1000, scheme=[0])
    b.finish()
    with opened(tmp_path) as (idx, reader):
        entry = idx.get(fh)
        assert entry is not None
        assert read(idx, reader, fh, 0, 3000) == content[:3000]  # one run of chunks 0-2
        assert read(idx, reader, fh, 3000, 3000) == content[3000:6000]  # and one of chunks 3-5
        s = reader.statistics()
        assert reader.read_now(entry, 2990, 4000) is None  # past the second run: the full path
        got = reader.read_now(entry, 2990, 20)
        assert got is not None and bytes(got) == content[2990:3010]
        got = reader.read_now(entry, 500, 5000)
        assert got is not None and bytes(got) == content[500:5500]
        after = reader.statistics()
        assert after.store.reads == s.store.reads
        assert after.cache.hits == s.cache.hits + 2 + 6  # chunks 2 and 3, then 0 to 5


def test_small_reads_of_held_bytes_are_served_from_extents_and_stay_right_after_eviction(tmp_path: Path) -> None:
    # Two files sharing a xorb's chunks: extents are per file, runs are shared.
    rng = random.Random(21)
    b = StoreBuilder(tmp_path)
    content = _content(rng, 12_000)
    fh = b.add_file(content, chunk_size=1000, scheme=[0, 1, 2])
    b.finish()
    with opened(tmp_path, cache_size=5000) as (idx, reader):
        entry = idx.get(fh)
        assert entry is not None
        assert read(idx, reader, fh, 0, 4000) == content[:4000]  # loads chunks 0-3 as one run
        reads, hits = reader.statistics().store.reads, reader.statistics().cache.hits
        for offset, size in [(0, 10), (999, 2), (1500, 1000), (3990, 10), (2000, 2000)]:
            assert bytes(reader.read_now(entry, offset, size) or b"?") == content[offset : offset + size]
        s = reader.statistics()
        assert s.store.reads == reads  # nothing loaded
        assert s.cache.hits == hits + 1 + 2 + 2 + 1 + 2  # each chunk a read touched, once
        assert reader.read_now(entry, 3990, 20) is None  # runs past the run: the full path
        check_ranges(idx, reader, fh, content, seed=21)  # evicts and reloads through a 5000-byte cache
        assert reader.statistics().cache.evictions > 0
        served = 0
        for offset in range(0, 12_000, 700):  # whatever extents remain answer only for runs still held
            got = reader.read_now(entry, offset, 50)
            assert got is None or bytes(got) == content[offset : offset + 50]
            served += got is not None
        assert 0 < served < 18  # some runs were evicted, some are held


def test_prefetch_counts_the_chunks_it_decoded_and_a_failed_job_no_store_read(tmp_path: Path) -> None:
    """``prefetch.chunks`` counts what prefetch decoded, not what it asked for; and a run of a xorb
    cut short, whose read fails, decodes nothing and is no store read."""
    rng = random.Random(21)
    b = StoreBuilder(tmp_path, max_xorb_chunks=10)
    content = _content(rng, 20_000)
    fh = b.add_file(content, chunk_size=1000)  # two xorbs of ten chunks
    b.finish()
    (first, built), (second, _) = b.xorbs.items()  # in the order they were written
    _corrupt(b.xorb_paths[first], built.payload_range(3)[0] + 10)  # chunk 3 of the first xorb fails
    with opened(tmp_path, run_bytes=10_000) as (idx, reader):
        entry = idx.get(fh)
        assert entry is not None
        running(reader, "prefetch", entry, 0, 10_000)
        s = reader.statistics()
        assert (s.prefetch.requests, s.prefetch.chunks) == (1, 9)  # not chunk 3
        assert s.decode.chunks == 9
        running(reader, "layout", second)  # held, then its file is cut short
        b.xorb_paths[second].chmod(0o644)
        os.truncate(b.xorb_paths[second], 100)
        running(reader, "prefetch", entry, 10_000, 10_000)
        s = reader.statistics()
        assert (s.prefetch.requests, s.prefetch.chunks) == (2, 9)
        assert (s.store.reads, s.decode.runs, s.decode.chunks) == (1, 1, 9)


@pytest.mark.parametrize("damage", ["directory", "symlink loop"])
def test_a_store_file_that_cannot_be_read_is_an_io_error(tmp_path: Path, damage: str) -> None:
    """Not a missing object, not malformed data: the file is there but cannot be opened or read."""
    b = StoreBuilder(tmp_path)
    fh = b.add_file(_content(random.Random(23), 5000), chunk_size=1000)
    b.finish()
    (path,) = b.xorb_paths.values()
    with opened(tmp_path) as (idx, reader):
        path.chmod(0o644)
        path.unlink()
        if damage == "directory":
            path.mkdir()  # opens, but reading it fails (EISDIR)
        else:
            path.symlink_to(path)  # cannot be opened (ELOOP)
        with pytest.raises(ObjectReadError, match=r"cannot open|failed"):
            read(idx, reader, fh)
        e = reader.statistics().errors
        assert (e.io, e.missing, e.format, e.integrity) == (1, 0, 0, 0)


@pytest.mark.parametrize(("piece", "pieces", "cache"), [(256 << 10, 20, 8 << 20), (1088 << 10, 58, 64 << 20)])
def test_random_reads_of_runs_shorter_than_a_slot_keep_the_whole_cache(
    tmp_path: Path, piece: int, pieces: int, cache: int
) -> None:
    """Runs shorter than a slot: runs under ``min_slot_run`` (half a slot, at most 1 MiB) move to the daemon's
    memory, longer ones keep their slots, and there are slots enough for the cache to fill with them.  So nothing is
    evicted while the data fits, and each piece is decoded once."""
    content = random.Random(1).randbytes(pieces * piece)  # fits in the cache
    b = StoreBuilder(tmp_path)
    fh = b.add_file(content, chunk_size=64 << 10)
    b.finish()
    pool = DecodePool(1, slots=slots_for(cache, 1))  # never started: the daemon decodes into the slots
    order = list(range(pieces))
    random.Random(2).shuffle(order)
    store = Store.open(tmp_path)
    try:
        idx = index.build([parse_shard(store.read_shard(f), where=f.name) for f in store.shard_files()])
        reader = Reader(idx, store, cache_size=cache, pool=pool)
        for k in order * 2:
            assert read(idx, reader, fh, k * piece, piece) == content[k * piece : (k + 1) * piece]
        s = reader.statistics()
        reader.runs.clear()
        assert pool.min_slot_run == MIN_SLOT_RUN == 1 << 20  # (whatever the slot size above 2 MiB)
        in_slots = pieces * piece if piece >= 1 << 20 else 0
        assert (s.store.reads, s.cache.evictions, s.cache.bytes, s.cache.shared_bytes) == (
            pieces,
            0,
            pieces * piece,
            in_slots,
        )
    finally:
        pool.close()
        store.close()


def test_a_layout_that_fails_its_check_is_not_checked_again_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A footer-less xorb with a damaged chunk: its layout (read and hash every chunk) fails, and the
    kernel's retries and the reader's own fail at once, without reading the xorb again."""
    rng = random.Random(4)
    b = StoreBuilder(tmp_path)
    bad = b.add_file(rng.randbytes(1 << 20), chunk_size=64 * 1024)
    b.seal_xorb(footer=False)
    good_content = rng.randbytes(1 << 20)
    good = b.add_file(good_content, chunk_size=64 * 1024)
    b.finish()
    path = b.xorb_paths[next(h for h, x in b.xorbs.items() if not x.has_footer)]
    path.chmod(0o644)
    data = bytearray(path.read_bytes())
    data[-100] ^= 1  # in the last chunk's payload
    path.write_bytes(bytes(data))
    calls = []
    layout = loader_module.Loader.layout

    async def counting(self: loader_module.Loader, xorb_hash: bytes) -> object:
        calls.append(xorb_hash)
        return await layout(self, xorb_hash)

    monkeypatch.setattr(loader_module.Loader, "layout", counting)
    with opened(tmp_path) as (idx, reader):
        for _ in range(3):
            with pytest.raises(IntegrityError):
                read(idx, reader, bad, 0, 4096)
        assert read(idx, reader, good) == good_content  # other xorbs are not affected
        assert reader.statistics().errors.integrity == 3
    assert len([c for c in calls if c != b.files[good].terms[0].xorb_hash]) == 1
