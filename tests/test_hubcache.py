"""Reading a huggingface_hub cache: layout, blob names, and every kind of bad input (no hf_xet, no FUSE)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers import hub_cache

from xetfs.storage.catalogue import Catalogue, Content
from xetfs.write.hubcache import (
    CachedFile,
    CachedRepo,
    CachedRevision,
    default_cache_dir,
    digest_file,
    is_lfs_path,
    parse_repo_folder,
    scan_cache,
)
from xetfs.write.hubpack import Job, Stored, _catalogue, _check, _plan_jobs, _rounds, derive_commit

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> hub_cache.CacheSpec:
    return hub_cache.make_hub_cache(tmp_path_factory.mktemp("hub") / "cache", floats=4096)


def test_folder_names() -> None:
    assert parse_repo_folder("models--org--name") == ("model", "org/name")
    assert parse_repo_folder("datasets--name") == ("dataset", "name")
    assert parse_repo_folder("spaces--o--app") == ("space", "o/app")
    for bad in (".locks", "version.txt", "models--", "kernels--a--b", "models--a--b--c", "model--a"):
        assert parse_repo_folder(bad) is None, bad


def test_default_cache_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "a"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    assert default_cache_dir() == tmp_path / "a"
    monkeypatch.delenv("HF_HUB_CACHE")
    assert default_cache_dir() == tmp_path / "home" / "hub"
    monkeypatch.delenv("HF_HOME")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "huggingface" / "hub"


def test_blob_naming_rule(tmp_path: Path) -> None:
    assert is_lfs_path("model.safetensors", 10) and is_lfs_path("data/x.parquet", 10)
    assert is_lfs_path("big.json", 10 * 1024 * 1024) and not is_lfs_path("config.json", 1000)
    f = tmp_path / "hello"
    f.write_bytes(b"hello\n")
    d = digest_file(f)
    assert d.git_sha1 == "ce013625030ba8dba906f756967f9e9ca394464a"  # git hash-object of "hello\n"
    assert d.sha256 == "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03"
    assert derive_commit({"a": "1" * 40, "b/c": "2" * 64}) == derive_commit({"b/c": "2" * 64, "a": "1" * 40})
    assert derive_commit({"a": "1" * 40}) != derive_commit({"a2": "1" * 40})


def test_scan_reads_every_repo_revision_ref_and_marker(cache: hub_cache.CacheSpec) -> None:
    warnings: list[str] = []
    repos = scan_cache(cache.root, warn=warnings.append)
    assert warnings == []
    assert [(r.type, r.id) for r in repos] == [("dataset", hub_cache.DATASET), ("model", hub_cache.MODEL)]
    data, model = repos
    c1, c2, c3 = cache.model_commits
    assert model.refs == {"main": c3, "v1.0": c1, "refs/pr/1": c2}
    assert set(model.revisions) == {c1, c2, c3}
    rev = model.revisions[c3]
    assert sorted(f.path for f in rev.files) == sorted(p for (r, c, p) in cache.files if r == model.id and c == c3)
    for f in rev.files:
        assert f.blob is not None and f.local == model.folder / "blobs" / f.blob
        assert f.local.read_bytes() == cache.files[(model.id, c3, f.path)]
    assert rev.no_exist == ["adapter_config.json", "generation_config.json", "nested/absent.txt"]
    assert data.revisions[cache.dataset_commit].tree is not None
    assert scan_cache(cache.root, ["acme/tiny-data"], warn=warnings.append)[0].id == "acme/tiny-data"
    scan_cache(cache.root, ["acme/absent"], warn=warnings.append)
    assert warnings == [f"{cache.root}: no repo 'acme/absent' in the cache"]


def test_bad_input_is_named_and_skipped(cache: hub_cache.CacheSpec, tmp_path: Path) -> None:
    import shutil

    root = tmp_path / "cache"
    shutil.copytree(cache.root, root, symlinks=True)
    folder = root / "models--acme--tiny-bert"
    _c1, _c2, c3 = cache.model_commits
    snap = folder / "snapshots" / c3
    (folder / "blobs" / ("f" * 64 + ".incomplete")).write_bytes(b"partial")
    (snap / "broken.bin").symlink_to("../../blobs/" + "e" * 64)
    (snap / "outside.txt").symlink_to("/etc/hostname")
    (folder / "refs" / "gone").write_text("9" * 40)
    (folder / "refs" / "garbage").write_text("not a commit")
    real = snap / "notes" / "training.txt"
    data = real.read_bytes()
    real.unlink()
    real.write_bytes(data)  # a cache copied with symlinks followed: a regular file in the snapshot
    warnings: list[str] = []
    repos = scan_cache(root, warn=warnings.append)
    text = "\n".join(warnings)
    assert "partial download (.incomplete)" in text and "f" * 64 + ".incomplete" in text
    assert f"{snap / 'broken.bin'}: broken symlink, blob {'e' * 64} is missing" in text
    assert f"{snap / 'outside.txt'}: the symlink points outside the repo's blobs" in text
    assert f"skipping ref {folder / 'refs' / 'gone'}: its commit {'9' * 40} has no snapshot" in text
    assert f"skipping ref {folder / 'refs' / 'garbage'}: does not hold a 40-hex commit" in text
    assert len(warnings) == 5
    model = repos[1]
    assert set(model.refs) == {"main", "v1.0", "refs/pr/1"}
    files = {f.path: f for f in model.revisions[c3].files}
    assert "broken.bin" not in files and "outside.txt" not in files
    assert files["notes/training.txt"].blob is None and files["notes/training.txt"].local == real
    assert len(files) == 6


def test_blobs_in_the_shared_store_are_read_through_their_links(cache: hub_cache.CacheSpec, tmp_path: Path) -> None:
    """huggingface_hub 1.32 and later keep a file fetched through Xet in ``<cache>/blobs/<2 hex>/<xet hash>`` and
    make the repo's blob a relative symlink to it.  Such a blob is read through its link; a link elsewhere, or to a file
    the shared store lacks, is named and skipped with the snapshot files that use it."""
    import shutil

    root = tmp_path / "cache"
    shutil.copytree(cache.root, root, symlinks=True)
    folder = root / "models--acme--tiny-bert"
    blobs = sorted(p for p in (folder / "blobs").iterdir() if len(p.name) == 64)
    assert len(blobs) >= 3
    moved, elsewhere, lost = blobs[:3]
    for i, blob in enumerate((moved, elsewhere, lost)):
        xet = f"{i + 1:x}" * 64
        place = root / "blobs" / xet[:2] / xet
        place.parent.mkdir(parents=True, exist_ok=True)
        blob.rename(place)
        blob.symlink_to(os.path.relpath(place, blob.parent))
    elsewhere.unlink()
    elsewhere.symlink_to(os.path.relpath(root / "blobs" / "22" / ("2" * 64), tmp_path / "x"))  # (not the store)
    (root / "blobs" / "33" / ("3" * 64)).unlink()
    (root / "blobs" / "44").mkdir()
    warnings: list[str] = []
    repos = scan_cache(root, warn=warnings.append)
    text = "\n".join(warnings)
    assert f"skipping {elsewhere}: a symlink, not into the cache's shared store of Xet files" in text, text
    assert f"skipping {lost}: its file in the cache's shared store is missing" in text, text
    model = next(r for r in repos if r.id == hub_cache.MODEL)
    assert set(model.blobs) == {p.name for p in (folder / "blobs").iterdir()} - {elsewhere.name, lost.name}
    assert model.blobs[moved.name].read_bytes() == (root / "blobs" / "11" / ("1" * 64)).read_bytes()
    used = {f.blob for rev in model.revisions.values() for f in rev.files}
    assert moved.name in used and elsewhere.name not in used and lost.name not in used
    assert [r.type for r in repos].count("model") == 1  # (the shared store is not a repo)
    assert "broken symlink" not in text and f"its blob {lost.name} was skipped (see above)" in text, text
    # The same cache named another way (a ``..`` in its path): the same blobs.
    again = scan_cache(tmp_path / "cache" / ".." / "cache", warn=lambda _: None)
    assert set(next(r for r in again if r.id == hub_cache.MODEL).blobs) == set(model.blobs)


def test_checks_after_upload(tmp_path: Path) -> None:
    f = tmp_path / "f.json"
    f.write_bytes(b"hello\n")
    d = digest_file(f)
    st = os.stat(f)
    stamp = (st.st_size, st.st_mtime_ns, st.st_ino)
    content = Content("a" * 64, 6)
    warnings: list[str] = []
    ok = _check(Job(f, d.git_sha1), stamp, d, d.sha256, content, warnings.append)
    assert ok is not None and ok.blob == d.git_sha1 and warnings == []
    by_rule = _check(Job(f, None, lfs=True), stamp, None, d.sha256, content, warnings.append)
    assert by_rule is not None and by_rule.blob == d.sha256
    assert _check(Job(f, "0" * 40), stamp, d, d.sha256, content, warnings.append) is None
    assert _check(Job(f, "0" * 64), stamp, None, d.sha256, content, warnings.append) is None
    stored = "; its bytes are in the store, named by no file"
    assert warnings[-2:] == [f"skipping {f}: its content does not match its name (sha {d.git_sha1}){stored}",
                             f"skipping {f}: its content does not match its name (sha {d.sha256}){stored}"]  # fmt: skip
    # Our read and hf_xet's saw different bytes, or the file's stat changed in between.
    assert _check(Job(f, d.git_sha1), stamp, d, "1" * 64, content, warnings.append) is None
    f.write_bytes(b"hello, changed\n")
    assert _check(Job(f, d.git_sha1), stamp, d, d.sha256, content, warnings.append) is None
    assert warnings[-2:] == [f"skipping {f}: changed while being read"] * 2


def test_versions_of_one_file_go_into_separate_rounds() -> None:
    big = 2 * 1024 * 1024
    files = [("model.safetensors", big), ("config.json", 10), ("model.safetensors", big),
             ("other.bin", big), ("model.safetensors", big), ("", big)]  # fmt: skip
    assert _rounds(files) == [0, 0, 1, 0, 2, 0]


def test_blobs_are_packed_in_the_order_of_their_paths(tmp_path: Path) -> None:
    """Small files read by name (``cat dir/*``) lie side by side in the store, whatever their blobs' names:
    main's files by path, then another revision's new ones, then blobs no revision names."""
    main, old = "1" * 40, "2" * 40
    names = {"a/0.json": "f" * 40, "a/1.json": "0" * 40, "a/2.json": "9" * 40, "b.txt": "3" * 40}
    files = [CachedFile(path, blob, tmp_path / blob) for path, blob in sorted(names.items())]
    files.append(CachedFile("z.txt", None, tmp_path / "z.txt"))  # a file of a dereferenced snapshot
    older = [CachedFile("a/0.json", "e" * 40, tmp_path / "e"), files[3], CachedFile("y.txt", None, tmp_path / "y.txt")]
    for plain in ("y.txt", "z.txt"):
        (tmp_path / plain).write_text(plain)
    blobs = {blob: tmp_path / blob for blob in sorted([*names.values(), "e" * 40, "7" * 40])}
    repo = CachedRepo("dataset", "acme/data", tmp_path, {"v1": old, "main": main},
                      {old: CachedRevision(old, older), main: CachedRevision(main, files)}, blobs)  # fmt: skip
    jobs = _plan_jobs([repo], Catalogue())
    assert [job.blob for job in jobs if job.blob is not None] == ["f" * 40, "0" * 40, "9" * 40, "3" * 40, "e" * 40,
                                                                   "7" * 40]  # fmt: skip
    assert [job.local.name for job in jobs if job.blob is None] == ["z.txt", "y.txt"]  # main's snapshot first


def test_a_revision_or_repo_with_nothing_imported_is_left_out_with_a_warning(tmp_path: Path) -> None:
    blob = "a" * 40
    good, bad = "1" * 40, "2" * 40
    kept = CachedRepo("model", "acme/kept", tmp_path, {"main": good, "old": bad}, {
        good: CachedRevision(good, [CachedFile("config.json", blob, tmp_path / "c")]),
        bad: CachedRevision(bad, [CachedFile("README.md", "b" * 40, tmp_path / "r")]),
    }, {blob: tmp_path / "c", "b" * 40: tmp_path / "r"})  # fmt: skip
    gone = CachedRepo("dataset", "acme/gone", tmp_path, {"main": bad}, {
        bad: CachedRevision(bad, [CachedFile("data.csv", "c" * 40, tmp_path / "d")]),
    }, {"c" * 40: tmp_path / "d"})  # fmt: skip
    stored = {tmp_path / "c": Stored(blob, Content("e" * 64, 3))}  # the other two blobs failed their checks
    warnings: list[str] = []
    new = _catalogue([kept, gone], Catalogue(), stored, warnings.append)
    assert [r.id for r in new.repos] == ["acme/kept"]
    assert set(new.repos[0].revisions) == {good} and new.repos[0].refs == {"main": good}
    assert warnings == [
        f"model acme/kept: skipping revision {bad}: none of its files was imported",
        f"dataset acme/gone: skipping revision {bad}: none of its files was imported",
        "dataset acme/gone: not imported: no revision has a file that was",
    ]
