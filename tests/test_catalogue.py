"""The Hub catalogue: format round trip, bad entries, merging, atomic replacement, concurrent writers."""

from __future__ import annotations

import json
import multiprocessing
import os
from pathlib import Path

import pytest

from xetfs.base.errors import CatalogueError
from xetfs.storage.catalogue import (
    CATALOGUE_NAME,
    Catalogue,
    Content,
    Repo,
    Revision,
    dump_catalogue,
    find_catalogue,
    load_catalogue,
    merge,
    parse_catalogue,
    repo_folder,
    update_catalogue,
    write_catalogue,
)
from xetfs.write.pack import locked

pytestmark = pytest.mark.unit

C1, C2, C3 = "1" * 40, "2" * 40, "3" * 40
X1, X2 = "a" * 64, "b" * 64
SHA256 = "c" * 64
SHA1 = "d" * 40


def repo(repo_id: str = "org/name", commit: str = C1, ref: str = "main") -> Repo:
    blobs = {SHA256: Content(X1, 100), SHA1: Content(X2, 7)}
    rev = Revision({"model.safetensors": SHA256, "sub/config.json": SHA1}, ("adapter_config.json",), Content(X2, 7))
    return Repo("model", repo_id, {ref: commit}, blobs, {commit: rev})


def test_round_trip() -> None:
    cat = Catalogue((repo("a/b"), Repo("dataset", "x", {}, {}, {C2: Revision({}, ("gone.txt",))})))
    back = parse_catalogue(dump_catalogue(cat), source="t")
    assert back.warnings == ()
    assert dump_catalogue(back) == dump_catalogue(cat)
    assert back.repo("model", "a/b") == cat.repos[0]
    assert [r.folder for r in back.repos] == ["datasets--x", "models--a--b"]
    assert repo_folder("space", "org/app") == "spaces--org--app"


@pytest.mark.parametrize(
    "data, message",
    [
        (b"{", "not valid JSON"),
        (b"[]", "not a xetfs-hub document"),
        (b'{"format": "xetfs-hub", "version": 99, "repos": []}', "version 99"),
        (b'{"format": "xetfs-hub", "version": 1, "repos": {}}', "'repos' is not a list"),
    ],
)
def test_unusable_documents_raise(data: bytes, message: str) -> None:
    with pytest.raises(CatalogueError, match=message):
        parse_catalogue(data, source="t")


def test_bad_entries_are_dropped_with_a_warning_naming_them() -> None:
    doc = json.loads(dump_catalogue(Catalogue((repo(),))))
    r = doc["repos"][0]
    r["blobs"]["not-a-hash"] = {"xetHash": X1, "size": 1}
    r["revisions"][C1]["files"]["../escape"] = SHA1
    r["revisions"][C1]["files"]["lost.bin"] = "e" * 64  # blob not in blobs
    r["revisions"]["nothex"] = {"files": {}}
    r["refs"]["dangling"] = C3
    doc["repos"].append({"type": "model", "id": "../../etc"})
    cat = parse_catalogue(json.dumps(doc).encode(), source="t")
    text = "\n".join(cat.warnings)
    for name in ("not-a-hash", "../escape", "lost.bin", "nothex", "dangling", "../../etc"):
        assert name in text
    (good,) = cat.repos
    assert set(good.revisions[C1].files) == {"model.safetensors", "sub/config.json"}
    assert good.refs == {"main": C1}


def test_merge_moves_refs_and_unites_revisions() -> None:
    old = Catalogue((repo(commit=C1),))
    new = Catalogue((repo(commit=C2), repo("other/one")))
    merged = merge(old, new)
    r = merged.repo("model", "org/name")
    assert r is not None and r.refs == {"main": C2} and set(r.revisions) == {C1, C2}
    assert merged.repo("model", "other/one") is not None
    extra = Repo("model", "org/name", {}, {SHA1: Content(X2, 7)}, {C1: Revision({"more.json": SHA1})})
    r = merge(merged, Catalogue((extra,))).repo("model", "org/name")
    assert r is not None and set(r.revisions[C1].files) == {"model.safetensors", "sub/config.json", "more.json"}


def test_a_blob_keeps_the_time_first_recorded_for_it() -> None:
    def with_time(ns: int | None) -> Catalogue:
        return Catalogue((Repo("model", "org/name", {}, {SHA1: Content(X2, 7, ns)}, {}),))

    def time_of(cat: Catalogue) -> int | None:
        r = cat.repo("model", "org/name")
        assert r is not None
        return r.blobs[SHA1].mtime_ns

    first, later = 1_600_000_000_123_456_789, 1_700_000_000_000_000_000
    assert time_of(merge(with_time(first), with_time(later))) == first  # (a pack of the same bytes, later)
    assert time_of(merge(with_time(None), with_time(later))) == later  # (a catalogue that had no time)
    assert time_of(merge(with_time(first), with_time(None))) == first
    back = parse_catalogue(dump_catalogue(with_time(first)), source="t")
    assert time_of(back) == first and b'"mtime": "2020-09-13T12:26:40.123456789Z"' in dump_catalogue(back)
    assert b'"mtime"' not in dump_catalogue(with_time(None))
    bad = dump_catalogue(with_time(first)).replace(b"2020-09-13T12:26:40.123456789Z", b"yesterday")
    parsed = parse_catalogue(bad, source="t")
    assert time_of(parsed) is None
    said = f"catalogue t: repo 0 (model org/name): blob {SHA1!r}: mtime 'yesterday' is not a time; the store's time"
    assert parsed.warnings == (said + " is shown",), parsed.warnings


def test_write_is_atomic_and_load_needs_no_write_access(tmp_path: Path) -> None:
    path = tmp_path / CATALOGUE_NAME
    write_catalogue(path, Catalogue((repo(),)))
    # A writer that dies before its rename leaves its temporary file, never a half-written catalogue.
    (tmp_path / f".{CATALOGUE_NAME}.999.tmp").write_bytes(dump_catalogue(Catalogue((repo("x/y"),)))[:50])
    (tmp_path / "xet").mkdir()
    before = sorted(os.listdir(tmp_path))
    assert find_catalogue(tmp_path) == path
    assert find_catalogue(tmp_path / "xet") == path
    assert find_catalogue(tmp_path / "xet" / "other") is None
    loaded = load_catalogue(path)
    assert [r.id for r in loaded.repos] == ["org/name"]
    assert sorted(os.listdir(tmp_path)) == before  # reading creates nothing: no lock, no temporary file


def _writer(store: str, first: int) -> None:
    for k in range(first, first + 10):
        with locked(Path(store), print):
            update_catalogue(Path(store), Catalogue((repo(f"org/repo{k}"),)))


def test_concurrent_writers_keep_every_repo(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), i * 10)) for i in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    cat = load_catalogue(tmp_path / CATALOGUE_NAME)
    assert sorted(r.id for r in cat.repos) == sorted(f"org/repo{k}" for k in range(30))


def test_a_broken_catalogue_is_not_overwritten(tmp_path: Path) -> None:
    (tmp_path / CATALOGUE_NAME).write_bytes(b"{broken")
    with pytest.raises(CatalogueError):
        update_catalogue(tmp_path, Catalogue((repo(),)))
    assert (tmp_path / CATALOGUE_NAME).read_bytes() == b"{broken"
