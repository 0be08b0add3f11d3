"""The local store (xetfs/storage/store.py): reads of xorb files from several threads at once.

With threaded I/O (``--io-mode thread``, and stores on network file systems)
reads run in threads, and the store keeps a bounded cache of open xorb files:
one read may be slow while others open enough files to close the descriptor it
is reading from.
"""

from __future__ import annotations

import os
import random
import threading
import time
from pathlib import Path

import pytest
from helpers.writer import StoreBuilder

from xetfs.base import settings
from xetfs.base.errors import ObjectReadError
from xetfs.storage import store as store_module
from xetfs.storage.store import Store

pytestmark = pytest.mark.unit


def test_a_slow_read_keeps_its_file_while_other_reads_close_cached_descriptors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    n = settings.MAX_OPEN_FILES + 8
    b = StoreBuilder(tmp_path / "store", max_xorb_chunks=1)
    b.add_file(random.Random(5).randbytes(1000 * n), chunk_size=1000)  # one xorb per chunk
    b.finish()
    store = Store.open(tmp_path / "store")
    xorbs = sorted(store.xorb_hashes())
    assert len(xorbs) == n
    slow, others = xorbs[0], xorbs[1:]
    size = store.xorb_path(slow).stat().st_size
    expected = store.xorb_path(slow).read_bytes()

    real_pread = os.pread
    reading, go_on = threading.Event(), threading.Event()

    def pread(fd: int, length: int, offset: int) -> bytes:
        if threading.current_thread().name == "slow":
            reading.set()
            go_on.wait(30)  # a network file system taking its time
        return real_pread(fd, length, offset)

    monkeypatch.setattr(os, "pread", pread)
    got: list[bytes | Exception] = []

    def slow_read() -> None:
        try:
            got.append(bytes(store.read_xorb(slow, 0, size)))
        except Exception as exc:
            got.append(exc)

    thread = threading.Thread(target=slow_read, name="slow")
    thread.start()
    assert reading.wait(30)
    for xorb in others:  # enough other files that the slow read's descriptor leaves the cache
        store.read_xorb(xorb, 0, 8)
    go_on.set()
    thread.join(30)
    assert got == [expected]
    store.close()


def test_a_failed_read_of_chunks_names_them_and_keeps_its_kind(tmp_path: Path) -> None:
    fd = os.open(tmp_path, os.O_RDONLY)  # a directory: opens, but reading it fails (EISDIR)
    try:
        with pytest.raises(ObjectReadError, match=r"xorb x: read of \[0, 10\) failed: .* \(reading chunks \[3, 5\)\)"):
            store_module.read_chunk_run(fd, 0, 10, 3, 5, where="xorb x")
    finally:
        os.close(fd)


def test_the_listing_leaves_out_what_hf_xet_keeps_for_itself(tmp_path: Path) -> None:
    """Side files and hf_xet's index are no objects of the store: not listed (so not pushed or published)."""
    from xetfs.storage.dirsource import DirSource

    b = StoreBuilder(tmp_path / "store")
    b.add_file(random.Random(6).randbytes(5000), chunk_size=1000)
    b.finish()
    base = tmp_path / "store" / "xet" / "xorbs"
    before = dict(DirSource.open(tmp_path / "store").listing().objects)
    (xorb,) = (p for p in (base / "xorbs").iterdir())
    (shard,) = (p for p in (base / "shards").iterdir())
    side = [xorb.with_name(xorb.name + ".tagset"), shard.with_name(shard.name + ".tagset"), base / "x.redb"]
    for own in [*side, base / "shards" / "notes.txt", base / "xorbs" / "x.gctag"]:
        own.write_bytes(b"x")
    (tmp_path / "store" / "README.md").write_bytes(b"kept")  # a file of the store's own, beside it
    after = dict(DirSource.open(tmp_path / "store").listing().objects)
    assert after == {**before, "README.md": 4}
    assert {f"xet/xorbs/xorbs/{xorb.name}", f"xet/xorbs/shards/{shard.name}"} <= set(after)


def test_an_empty_store_learns_where_its_shards_are_from_a_later_listing(tmp_path: Path) -> None:
    """An empty store (in a bucket: its listing alone) knows no root; the first listing with shards says where
    they are, so a refresh after a push in hf_xet's layout finds them."""
    from xetfs.storage.dirsource import DirSource
    from xetfs.storage.layout import Listing

    tmp_path.joinpath("shards").mkdir()
    store = Store(DirSource(tmp_path, tmp_path), Listing((("xetfs-listing.json", 40),)))
    shard, xorb = "a" * 64 + ".mdb", "b" * 64
    new = store.add(Listing(((f"xet/xorbs/shards/{shard}", 500), (f"xet/xorbs/xorbs/default.{xorb}", 9000)), 5.0))
    assert [s.name for s in new] == [shard] and store.shard_prefix() == "xet/xorbs/shards/"
    assert list(store.xorb_hashes()) == [bytes.fromhex(xorb)] and store.mtime == 5.0


def test_a_tag_is_trusted_once_the_object_has_settled_and_the_listing_dates_the_last_change(tmp_path: Path) -> None:
    from xetfs.base.settings import TAG_SETTLE_SECONDS
    from xetfs.storage.dirsource import DirSource

    b = StoreBuilder(tmp_path / "store")
    b.add_file(random.Random(7).randbytes(3000), chunk_size=1000)
    b.finish()
    top = tmp_path / "store"
    source = DirSource.open(top)
    (top / "meta.json").write_text("{}")
    assert source.tag("meta.json") != source.tag("meta.json")  # just written: it may change again unseen
    past = time.time() - 10 * TAG_SETTLE_SECONDS
    for path in [top, *top.rglob("*")]:
        os.utime(path, (past, past))
    assert source.tag("meta.json") == source.tag("meta.json") and source.tag("absent.json") is None
    assert source.listing().mtime == past
    (top / "new.json").write_text("{}")  # a file pack renames into the top: the store changed now
    assert source.listing().mtime > past + 5 * TAG_SETTLE_SECONDS
