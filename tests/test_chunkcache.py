"""The disk cache of chunk ranges (xetfs/storage/chunkcache.py), alone and under the read path of a remote store.

The read path runs over a store whose source fetches every xorb byte range
it is asked for and counts them (a fake ``ObjectSource`` over a directory
written by the test writer, with no local files to offer), so that what is
fetched twice, or fetched again after damage, is counted exactly.  The same
is counted at the server, with nginx and real mounts, in test_remote_sources.py.
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import pytest
from helpers import oracle
from helpers.served import run_served
from helpers.writer import StoreBuilder

from xetfs.base import hashes
from xetfs.base.errors import StoreError
from xetfs.base.settings import DISK_CACHE_RESCAN_SECONDS, META_EVICTION_GRACE
from xetfs.base.stats import RemoteCounters
from xetfs.format.shard import parse_shard
from xetfs.read.reader import Reader
from xetfs.storage import index
from xetfs.storage.chunkcache import ChunkCache
from xetfs.storage.dirsource import DirSource
from xetfs.storage.diskcache import DiskCache
from xetfs.storage.objects import RemoteOptions
from xetfs.storage.store import Store

pytestmark = pytest.mark.unit

X = bytes(range(32))


def test_entries_are_found_by_the_chunks_they_hold_and_cut_ranges(tmp_path: Path) -> None:
    cache = ChunkCache(DiskCache(tmp_path, 1 << 20))
    cache.put(X, 10, 20, b"a" * 100)
    cache.put(X, 30, 35, b"b" * 50)
    assert cache.find(X, 12, 18) is not None and cache.find(X, 10, 20) is not None
    assert cache.find(X, 5, 12) is None and cache.find(X, 19, 21) is None
    assert cache.limit(X, 0, 100) == 10  # up to the next entry
    assert cache.limit(X, 12, 100) == 20  # to the end of the entry holding it
    assert cache.limit(X, 20, 25) == 25 and cache.limit(X, 20, 100) == 30
    assert cache.limit(X, 36, 100) == 100
    again = ChunkCache(DiskCache(tmp_path, 1 << 20))  # a restart, or another mount: found on disk
    entry = again.find(X, 31, 33)
    assert entry is not None and Path(again.target(X, *entry)).read_bytes() == b"b" * 50
    again.drop(X, entry, "test")
    assert again.find(X, 31, 33) is None and again.disk.counters.disk_corrupt == 1
    counters = again.disk.counters
    assert counters.disk_hits == 1 and counters.disk_misses == 1


def test_a_mount_sees_the_entries_another_mount_wrote_after_it_looked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two mounts share a cache directory: one that listed a xorb's entries before the other wrote more
    finds those before it would fetch (and cut its ranges along them), so the chunks are not fetched again
    into an overlapping entry.  It reads the directory again once per ``DISK_CACHE_RESCAN_SECONDS`` at most."""
    now = [0.0]
    monkeypatch.setattr("xetfs.storage.chunkcache.time.monotonic", lambda: now[0])
    mine, other = ChunkCache(DiskCache(tmp_path, 1 << 20)), ChunkCache(DiskCache(tmp_path, 1 << 20))
    mine.put(X, 0, 10, b"a" * 100)
    assert mine.find(X, 2, 4) is not None and mine.limit(X, 10, 100) == 100  # nothing after chunk 10, yet
    other.put(X, 10, 40, b"b" * 300)
    other.put(X, 60, 70, b"c" * 100)
    assert mine.limit(X, 10, 100) == 100  # (read less than DISK_CACHE_RESCAN_SECONDS ago)
    now[0] += DISK_CACHE_RESCAN_SECONDS
    assert mine.limit(X, 10, 100) == 40  # the other mount's entry: the range is cut along it
    assert mine.limit(X, 40, 100) == 60
    found = mine.find(X, 12, 30)
    assert found == (10, 40) and Path(mine.target(X, *found)).read_bytes() == b"b" * 300
    assert mine.disk.counters.disk_misses == 0


def test_entries_count_against_the_bound_and_eviction_forgets_them(tmp_path: Path) -> None:
    disk = DiskCache(tmp_path, 10_000)
    cache = ChunkCache(disk)
    for i in range(8):
        cache.put(X, 10 * i, 10 * i + 10, bytes([i]) * 1500)
    assert disk.counters.disk_evictions > 0 and disk.counters.disk_bytes <= 10_000
    on_disk = sum(p.stat().st_size for p in (tmp_path / "chunks").rglob("*") if p.is_file())
    assert on_disk <= 10_000
    assert cache.find(X, 0, 10) is None  # the oldest went first, and the index knows it
    assert cache.find(X, 70, 80) is not None


@pytest.mark.parametrize(("days", "kept"), [(1, True), (31, False)])
def test_eviction_takes_chunk_ranges_before_the_objects_a_mount_needs(tmp_path: Path, days: int, kept: bool) -> None:
    """A listing, a manifest and a shard, touched only when a mount starts (``days`` ago), outlast chunk
    ranges used since; unless they are a month older than those (a store not mounted again)."""
    disk = DiskCache(tmp_path, 10_000)
    then = time.time() - days * 86400
    for i in range(3):
        disk.put(f"meta{i}", bytes([i]) * 500)
        os.utime(disk.entry_path(f"meta{i}"), (then + i, then + i))
    cache = ChunkCache(disk)
    for i in range(8):
        cache.put(X, 10 * i, 10 * i + 10, bytes([i]) * 1500)
    assert disk.counters.disk_evictions > 0 and disk.counters.disk_bytes <= 10_000
    assert [disk.get(f"meta{i}") == bytes([i]) * 500 for i in range(3)] == [kept] * 3
    assert ChunkCache(disk).find(X, 70, 80) is not None and ChunkCache(disk).find(X, 0, 10) is None


def test_a_cache_too_small_for_what_a_mount_needs_says_so_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    disk = DiskCache(tmp_path, 5_000)
    for i in range(6):  # shards of 1,000 bytes: 6,000 bytes, over 90 % of the bound
        disk.put(f"shard{i}", bytes([i]) * 1000)
    said = [r for r in caplog.records if "a mount with the server down may not start" in r.getMessage()]
    assert len(said) == 1 and said[0].levelname == "WARNING", caplog.text


def test_disk_bytes_never_go_below_zero_when_two_mounts_share_a_cache(tmp_path: Path) -> None:
    a, b = DiskCache(tmp_path, 1 << 20), DiskCache(tmp_path, 1 << 20)
    ChunkCache(a).put(X, 0, 10, b"a" * 5000)  # (b counted the cache before this entry was written)
    chunks = ChunkCache(b)
    entry = chunks.find(X, 0, 10)
    assert entry is not None
    chunks.drop(X, entry, "a chunk failed its check")
    assert b.counters.disk_bytes == 0


def test_disk_bytes_count_what_the_cache_holds(tmp_path: Path) -> None:
    def on_disk() -> int:
        return sum(p.stat().st_size for p in tmp_path.rglob("*") if p.is_file() and p.parent != tmp_path / "tmp")

    disk = DiskCache(tmp_path, 1 << 20)
    cache = ChunkCache(disk)
    for _ in range(3):  # every mount fetches the listing afresh and keeps it again
        disk.put("listing", b"x" * 700)
    cache.put(X, 0, 10, b"a" * 4000)
    cache.put(X, 0, 10, b"a" * 4000)  # (two workers wrote the same range)
    assert disk.counters.disk_bytes == on_disk()
    entry = cache.find(X, 0, 10)
    assert entry is not None
    cache.drop(X, entry, "a chunk failed its check")
    assert disk.counters.disk_bytes == on_disk()
    cache.put(X, 0, 10, b"a" * 4000)  # fetched again
    assert disk.counters.disk_bytes == on_disk() == DiskCache(tmp_path, 1 << 20).counters.disk_bytes


def test_a_bound_larger_than_the_file_system_is_said_at_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    DiskCache(tmp_path, 1 << 60)
    (record,) = [r for r in caplog.records if "more than its file system holds" in r.getMessage()]
    assert record.levelname == "WARNING" and str(tmp_path) in record.getMessage()
    assert "(--disk-cache-size, 1048576.0 TiB)" in record.getMessage(), record.getMessage()  # (a size, not MiB)


def test_an_old_format_cache_is_removed_with_one_message(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    old = tmp_path / "v1" / "ab"
    old.mkdir(parents=True)
    (old / "entry").write_bytes(b"x" * 100)
    DiskCache(tmp_path, 1 << 20)
    assert not (tmp_path / "v1").exists()
    assert [r.getMessage() for r in caplog.records if "older format" in r.getMessage()]
    caplog.clear()
    DiskCache(tmp_path, 1 << 20)
    assert not caplog.records


class FetchingSource(DirSource):
    """A store directory read as a remote store is: every xorb range is fetched (and counted), none is a
    local file."""

    def __init__(self, top: Path, root: Path) -> None:
        super().__init__(top, root)
        self.fetched: list[tuple[str, int, int]] = []

    def local_path(self, name: str) -> str | None:
        return None

    def worker_setup(self) -> tuple[str, RemoteOptions] | None:
        return None

    def read_range(self, name: str, start: int, end: int) -> bytes:
        self.fetched.append((name, start, end))
        return super().read_range(name, start, end)


def _remote_like(root: Path, cache_dir: Path) -> tuple[Store, FetchingSource]:
    plain = DirSource.open(root)
    source = FetchingSource(plain.top, plain.root)
    return Store(source, source.listing(), ChunkCache(DiskCache(cache_dir, 1 << 30, RemoteCounters()))), source


def _read_all(store: Store) -> dict[bytes, bytes]:
    shards = [parse_shard(store.read_shard(f), where=f.name) for f in store.shard_files()]
    idx = index.build(shards)
    reader = Reader(idx, store, cache_size=0)  # every read goes to the store

    async def body() -> dict[bytes, bytes]:
        out = {}
        for entry in idx:
            parts = []
            for offset in range(0, entry.size, 300_000):  # reads of other sizes than the runs
                parts.append(bytes(await reader.read(entry, offset, 300_000)))
            out[entry.file_hash] = b"".join(parts)
        return out

    result: dict[bytes, bytes] = run_served(reader.start, body)
    return result


@pytest.fixture
def built(tmp_path: Path) -> tuple[StoreBuilder, dict[bytes, bytes]]:
    b = StoreBuilder(tmp_path / "store", max_xorb_chunks=64)
    rng = random.Random(5)
    files = {}
    for size in (3_000_000, 700_000, 90_000):
        content = rng.randbytes(size)
        files[b.add_file(content, chunk_size=40_000, scheme=[0, 1])] = content
    b.finish()
    return b, files


def _overlaps(fetched: list[tuple[str, int, int]]) -> int:
    """Bytes fetched more than once."""
    seen: dict[str, set[int]] = {}
    twice = 0
    for name, start, end in fetched:
        have = seen.setdefault(name, set())
        twice += sum(1 for b in range(start, end) if b in have)
        have.update(range(start, end))
    return twice


def test_no_range_is_fetched_twice_and_a_full_cache_fetches_nothing(
    built: tuple[StoreBuilder, dict[bytes, bytes]], tmp_path: Path
) -> None:
    b, files = built
    store, source = _remote_like(b.root, tmp_path / "cache")
    assert _read_all(store) == files
    xorb_bytes = sum(p.stat().st_size for p in b.xorb_paths.values())
    fetched = sum(end - start for _, start, end in source.fetched)
    assert _overlaps(source.fetched) == 0, source.fetched
    assert fetched <= xorb_bytes, (fetched, xorb_bytes)
    # Another mount of the same cache: layouts, chunks, everything from the disk.
    again, source2 = _remote_like(b.root, tmp_path / "cache")
    assert _read_all(again) == files
    assert source2.fetched == []


def test_a_damaged_entry_is_dropped_and_only_its_range_fetched_again(
    built: tuple[StoreBuilder, dict[bytes, bytes]], tmp_path: Path
) -> None:
    b, files = built
    store, _ = _remote_like(b.root, tmp_path / "cache")
    assert _read_all(store) == files
    entries = sorted(p for p in (tmp_path / "cache" / "chunks").rglob("*") if p.is_file())
    bad = entries[len(entries) // 2]
    oracle.flip_byte(bad, bad.stat().st_size // 2)
    again, source = _remote_like(b.root, tmp_path / "cache")
    assert _read_all(again) == files
    first, stop = (int(n) for n in bad.name.split("-"))
    layout = Store.open(b.root).load_layout(hashes.from_hex(bad.parent.name))
    assert [(s, e) for _, s, e in source.fetched] == [(layout.phys_start(first), layout.phys_ends[stop - 1])]
    assert again.chunks is not None and again.chunks.disk.counters.disk_corrupt == 1


def test_the_disk_cache_page_states_the_grace_of_meta_entries() -> None:
    text = " ".join((Path(__file__).parents[1] / "docs" / "remote.md").read_text().split())
    assert f"counts as used {META_EVICTION_GRACE / 86400:g} days later than it was" in text


def test_a_damaged_entry_that_cannot_be_deleted_is_not_used_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cache this user cannot write in: an entry that failed its check stays on disk, and is not found
    again (the read fetches its chunks) until its file changes; its bytes are counted once."""
    cache = ChunkCache(DiskCache(tmp_path, 1 << 20))
    cache.put(X, 0, 10, b"a" * 100)
    entry = cache.find(X, 0, 10)
    assert entry == (0, 10)
    clock = iter(range(10, 10**6, 10))
    monkeypatch.setattr("xetfs.storage.chunkcache.time.monotonic", lambda: next(clock))  # (a new read each time)
    monkeypatch.setattr(os, "unlink", lambda path: (_ for _ in ()).throw(PermissionError(13, "Permission denied")))
    cache.drop(X, entry, "a chunk failed its check")
    assert cache.find(X, 0, 10) is None and cache.limit(X, 0, 20) == 20
    path = Path(cache.target(X, 0, 10))
    path.write_bytes(b"b" * 100)  # another process wrote it again
    os.utime(path, ns=(1, 1))
    assert cache.find(X, 0, 10) == (0, 10)


def test_a_damaged_small_object_in_the_disk_cache_is_named_with_what_is_wrong(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A ``meta/`` entry that fails its own check says which object it held and what is wrong with it."""
    disk = DiskCache(tmp_path, 1 << 20)
    shard, footer = "http://mirror\0object\0shards/a.mdb", f"xorb-footer\0{'ab' * 32}"
    disk.put(shard, b"shard bytes")
    disk.put(footer, b"footer bytes")
    path = disk.entry_path(shard)
    damaged = bytearray(path.read_bytes())
    damaged[-1] ^= 1
    path.write_bytes(bytes(damaged))
    assert disk.get(shard) is None and not path.exists()
    disk.put(shard, b"shard bytes")
    path.write_bytes(disk.entry_path(footer).read_bytes())  # another object's entry in its place
    assert disk.get(shard) is None
    disk.put(shard, b"shard bytes")
    path.write_bytes(path.read_bytes()[:20])
    assert disk.get(shard) is None and disk.get(footer) == b"footer bytes"
    lines = [r.getMessage() for r in caplog.records]
    assert [line.split(") ")[1] for line in lines] == [
        "has bytes that do not match their hash (damaged); dropped, fetching it again",
        "is another object's entry; dropped, fetching it again",
        "is cut short: 20 bytes, not even its 80-byte header; dropped, fetching it again",
    ]
    assert all(line.startswith("disk cache: the copy of shards/a.mdb of http://mirror (entry ") for line in lines)
    assert disk.counters.disk_corrupt == 3


def test_a_disk_cache_that_cannot_be_made_says_what_to_do(tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(
        StoreError,
        match=r"disk cache .*/file/cache: cannot create it \(Not a directory\): give "
        r"a --cache-dir this user can write, or --disk-cache-size 0 to use none",
    ):
        DiskCache(tmp_path / "file" / "cache", 1 << 20)
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "meta").write_bytes(b"")  # (root may write anywhere: a file where a directory goes)
    with pytest.raises(StoreError, match=r"disk cache .*/cache: cannot write in it \(Not a directory\)"):
        DiskCache(tmp_path / "cache", 1 << 20)


def test_directories_root_makes_in_another_users_cache_stay_that_users(tmp_path: Path) -> None:
    """A mount by root with --cache-dir in a user's directory: what root makes there belongs to that user,
    who can then write entries, and evict them."""
    if os.geteuid() != 0:
        pytest.skip("needs root")
    top = tmp_path / "home"
    top.mkdir()
    os.chown(top, 65534, 65534)
    cache = ChunkCache(DiskCache(top / "xetfs" / "cache", 1 << 20))
    cache.put(X, 0, 10, b"a" * 100)
    cache.disk.put("http://mirror\0object\0shards/a.mdb", b"shard")
    made = [p for p in (top / "xetfs").rglob("*") if p.is_dir()] + [top / "xetfs"]
    assert len(made) >= 6 and all(p.stat().st_uid == 65534 for p in made), [(p, p.stat().st_uid) for p in made]
