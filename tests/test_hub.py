"""Hugging Face cache in, Hugging Face cache out, through hf_xet and a real mount with the real clients.

The cache is written by huggingface_hub's own cache-writing functions
(``hub_cache.py``).  Packs run ``python -m xetfs pack`` in a child process
(hf_xet starts threads, and mount tests fork); every client call runs in a
child process of its own (``hub_clients.py``) with ``HF_HUB_CACHE`` pointing
at the original cache or at the mount, offline, and the two reports must be
equal.
"""

from __future__ import annotations

import functools
import json
import os
import random
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import hub_cache
from helpers.damage import damage_one_file
from helpers.hub import Imported, clients, diff, xetfs
from helpers.mounting import force_unmount, is_mounted, mounted
from helpers.oracle import REPO_ROOT, hf_xet_env
from helpers.processes import kill_when

from xetfs.base import hashes
from xetfs.base.errors import CatalogueError
from xetfs.base.exitstatus import ExitStatus
from xetfs.storage.catalogue import CATALOGUE_NAME, load_catalogue
from xetfs.storage.indexer import load_index
from xetfs.storage.store import Store
from xetfs.write.pack import locked

fuse = pytest.mark.fuse
SUMMARY = re.compile(
    r"imported (\d+) repos?, (\d+) revisions?, (\d+) files? into .*: (\d+) files? read \((\d+) bytes?"
    r"(?:; \d+ unchanged, not read again)?\) -> "
    r"(-?\d+) store bytes? added(?: \(read / added: ([\d.]+)x"
    r"(?:, dedup and compression|: no dedup or compression gain|: the shard and xorb footers outweigh so few "
    r"bytes)\))?; (.*)"
)


def summary(proc: subprocess.CompletedProcess[str]) -> re.Match[str]:
    m = SUMMARY.search(proc.stdout)
    assert m is not None, proc.stdout
    return m


def hf_cache_ls(cache: Path, tmp: Path) -> list[dict[str, Any]]:
    """``hf cache ls --revisions --json`` with the paths made relative and the clock left out."""
    env = dict(os.environ, HF_HUB_CACHE=str(cache), HF_HOME=str(tmp / "hf_home"), NO_COLOR="1")
    hf = Path(sys.executable).with_name("hf")
    proc = subprocess.run([str(hf), "cache", "ls", "--revisions", "--json"], capture_output=True, text=True,
                          env=env, timeout=60, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    for row in rows:
        row.pop("last_modified")
        row["snapshot_path"] = str(Path(row["snapshot_path"]).relative_to(cache))
    assert rows
    return list(rows)


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> Imported:
    tmp = tmp_path_factory.mktemp("hub")
    spec = hub_cache.make_hub_cache(tmp / "cache")
    for i, blob in enumerate(sorted(spec.root.glob("*/blobs/*"))):  # (distinct times, long past: a mount shows them)
        os.utime(blob, ns=(BLOB_TIME_NS + i * 1_000_000_123,) * 2)
    store = tmp / "store"
    return Imported(spec, store, tmp, xetfs(tmp, "pack", "--hub-cache", spec.root, store, "--no-progress"))


BLOB_TIME_NS = 1_600_000_000_000_000_000  # 2020-09-13


@pytest.mark.integration
def test_import_summary_and_dedup(imported: Imported) -> None:
    assert imported.pack.stderr == ""
    m = summary(imported.pack)
    repos, revisions, files, new, cache_bytes, store_bytes = map(int, m.groups()[:6])
    assert (repos, revisions, files) == (2, 4, 3 * 6 + 3)
    assert m.group(8) == "nothing skipped"
    blobs = {p for r in imported.spec.root.iterdir() for p in (r / "blobs").iterdir()}
    assert new == len(blobs) + 1  # every blob, and the dataset's tree listing
    assert (
        cache_bytes
        == sum(p.stat().st_size for p in blobs)
        + (imported.spec.root / "datasets--acme--tiny-data" / "trees" / f"{imported.spec.dataset_commit}.json")
        .stat()
        .st_size
    )
    # Three revisions that differ in one tensor each add little more than one copy.
    dataset_bytes = sum(len(v) for (repo, _, _), v in imported.spec.files.items() if repo == hub_cache.DATASET)
    model_store_bytes = store_bytes - dataset_bytes
    assert model_store_bytes < 1.4 * imported.spec.tensor_bytes, (model_store_bytes, imported.spec.tensor_bytes)
    assert float(m.group(7)) > 2.0


@pytest.mark.integration
def test_running_again_adds_nothing(imported: Imported) -> None:
    before = (imported.store / CATALOGUE_NAME).read_bytes()
    m = summary(xetfs(imported.tmp, "pack", "--hub-cache", imported.spec.root, imported.store, "--no-progress"))
    assert m.group(4) == "0" and m.group(6) == "0"
    assert (imported.store / CATALOGUE_NAME).read_bytes() == before


@pytest.mark.integration
def test_ls_lists_repos_and_revisions(imported: Imported) -> None:
    c1, c2, c3 = imported.spec.model_commits
    text = xetfs(imported.tmp, "ls", imported.store).stdout
    assert "model    acme/tiny-bert  (3 revisions)" in text and "dataset  acme/tiny-data  (1 revision)" in text
    assert re.search(rf"{c2}\s+6 files\s+\d+ bytes  refs: refs/pr/1", text)
    doc = json.loads(xetfs(imported.tmp, "ls", imported.store, "--json").stdout)
    model = next(r for r in doc["repos"] if r["id"] == hub_cache.MODEL)
    assert {r["commit"]: r["refs"] for r in model["revisions"]} == {c1: ["v1.0"], c2: ["refs/pr/1"], c3: ["main"]}
    assert all(r["files"] == 6 and r["noExist"] == 3 for r in model["revisions"])
    files = xetfs(imported.tmp, "ls", imported.store, "--files").stdout.splitlines()
    assert len(files) == len(set(load_catalogue(imported.store / CATALOGUE_NAME).blob_index().values())) + 1


@pytest.mark.integration
def test_ls_says_what_the_store_lacks_as_a_mount_does(imported: Imported, tmp_path: Path) -> None:
    """A blob whose file the store lacks (here: named wrong in the catalogue) and a bad shard: ``ls`` warns of
    both on the terminal, and counts the revisions' files the mount leaves out."""
    store = tmp_path / "store"
    shutil.copytree(imported.store, store)
    doc = json.loads((store / CATALOGUE_NAME).read_bytes())
    model = next(r for r in doc["repos"] if r["id"] == hub_cache.MODEL)
    commit = model["refs"]["main"]
    lost = model["revisions"][commit]["files"]["config.json"]
    model["blobs"][lost]["xetHash"] = "0" * 64
    (store / CATALOGUE_NAME).write_text(json.dumps(doc))
    shard = sorted(p for p in store.rglob("*.mdb") if p.parent.name == "shards")[0]
    (shard.parent / ("f" * 64 + ".mdb")).write_bytes(shard.read_bytes()[:-100])  # cut short, and misnamed
    proc = xetfs(tmp_path, "ls", store)
    assert "skipping" in proc.stderr and "f" * 64 in proc.stderr, proc.stderr
    assert f"first missing: blob {lost}" in proc.stderr, proc.stderr
    uses = sum(blob == lost for blob in model["revisions"][commit]["files"].values())
    assert re.search(rf"{commit}\s+6 files .*refs: main  \({uses} not in the store: left out\)", proc.stdout), (
        proc.stdout
    )
    doc = json.loads(xetfs(tmp_path, "ls", store, "--json").stdout)
    revisions = next(r for r in doc["repos"] if r["id"] == hub_cache.MODEL)["revisions"]
    assert {r["commit"]: r["notInStore"] for r in revisions}[commit] == uses


@fuse
def test_the_mount_is_the_cache_for_every_client(imported: Imported) -> None:
    cache = imported.spec.root
    expected = clients(cache, imported.tmp)
    expected_ls = hf_cache_ls(cache, imported.tmp)
    with mounted(imported.store) as m:
        assert diff(cache, m.path) == ""
        folder = m.path / "models--acme--tiny-bert"
        c1, c2, c3 = imported.spec.model_commits
        assert (folder / "refs" / "main").read_bytes() == c3.encode()
        assert (folder / "refs" / "refs" / "pr" / "1").read_bytes() == c2.encode()
        for path in (folder / "snapshots").rglob("*"):
            if not path.is_dir():
                assert path.is_symlink()
                assert os.readlink(path) == os.readlink(cache / path.relative_to(m.path))
        assert (folder / ".no_exist" / c1 / "nested" / "absent.txt").stat().st_size == 0
        for blob in cache.glob("*/blobs/*"):  # a blob shows the time its file had in the cache, on every node
            assert os.stat(m.path / blob.relative_to(cache)).st_mtime_ns == blob.stat().st_mtime_ns, blob
        got = clients(m.path, imported.tmp)
        got_ls = hf_cache_ls(m.path, imported.tmp)
        stats = m.stats()
    assert got["scan_cache_dir"]["warnings"] == []  # the hidden .xetfs is not taken for a repo
    assert got == expected
    assert got_ls == expected_ls
    assert expected["AutoConfig"] == ["BertConfig", 32, 12]
    assert expected["try_to_load_from_cache"]["main"][1] is True  # the .no_exist marker is honoured
    assert len(expected["safe_open"]) == 8
    assert stats["errors"] == {k: 0 for k in stats["errors"]}


@fuse
def test_a_read_only_store_mounts_and_lists(imported: Imported, tmp_path: Path) -> None:
    view = tmp_path / "ro"
    view.mkdir()
    if subprocess.run(["mount", "--bind", str(imported.store), str(view)], check=False).returncode != 0:
        pytest.skip("cannot make bind mounts here")
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(view)], check=True)
        assert "acme/tiny-bert" in xetfs(tmp_path, "ls", view).stdout
        with mounted(view) as m:
            assert diff(imported.spec.root, m.path) == ""
    finally:
        subprocess.run(["umount", str(view)], check=False)


@fuse
def test_bad_input_is_named_and_the_rest_imports(imported: Imported, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    shutil.copytree(imported.spec.root, cache, symlinks=True)
    folder = cache / "models--acme--tiny-bert"
    c1, _c2, c3 = imported.spec.model_commits
    snap = folder / "snapshots" / c3
    (folder / "blobs" / ("f" * 64 + ".incomplete")).write_bytes(b"partial")
    (snap / "broken.bin").symlink_to("../../blobs/" + "e" * 64)
    (folder / "refs" / "gone").write_text("9" * 40)
    # A blob whose bytes do not match its name (damaged, or changed after the download).
    readme = Path(os.path.realpath(folder / "snapshots" / c1 / "README.md"))
    readme.write_bytes(b"# tampered\n")
    strict = xetfs(tmp_path, "pack", "--hub-cache", cache, tmp_path / "store", "--no-progress", "--strict",
                   check=False)  # fmt: skip
    assert strict.returncode == ExitStatus.ERROR, strict.stderr
    assert (
        strict.stderr.splitlines()[-1] == "xetfs: error: --strict: 3 items skipped (see the warnings); nothing recorded"
    )
    assert not (tmp_path / "store" / CATALOGUE_NAME).exists()  # (refused after the scan, before any upload)
    proc = xetfs(tmp_path, "pack", "--hub-cache", cache, tmp_path / "store", "--no-progress", check=False)
    assert proc.returncode == ExitStatus.SKIPPED, proc.stderr
    warnings = proc.stderr.splitlines()
    assert (
        f"xetfs: warning: skipping {folder / 'blobs' / ('f' * 64 + '.incomplete')}: a partial download (.incomplete)"
        in warnings
    )
    assert f"xetfs: warning: skipping {snap / 'broken.bin'}: broken symlink, blob {'e' * 64} is missing" in warnings
    assert (
        f"xetfs: warning: skipping ref {folder / 'refs' / 'gone'}: its commit {'9' * 40} has no snapshot in the cache"
        in warnings
    )
    assert any(
        w.startswith(f"xetfs: warning: skipping {readme}: its content does not match its name") for w in warnings
    )
    assert len(warnings) == 4
    m = summary(proc)
    assert m.group(8) == (
        "skipped 4 (1 blob whose content does not match its name, 1 broken symlink, 1 partial download, "
        "1 ref without a snapshot)"
    )
    # The tampered blob was caught before its upload: none of its bytes went into the store.
    tampered = hashes.file_hash([(hashes.chunk_hash(b"# tampered\n"), 11)])
    assert tampered not in load_index(Store.open(tmp_path / "store")).index.files
    with mounted(tmp_path / "store") as mnt:
        out = diff(cache, mnt.path).splitlines()
        model = mnt.path / "models--acme--tiny-bert"
        assert not (model / "snapshots" / c1 / "README.md").exists()
        assert (model / "snapshots" / c1 / "config.json").read_bytes() == imported.spec.files[
            (hub_cache.MODEL, c1, "config.json")
        ]
    only_in_cache = sorted(line for line in out if line.startswith(f"Only in {cache}"))
    assert only_in_cache == sorted([
        f"Only in {folder / 'blobs'}: {'f' * 64}.incomplete",
        f"Only in {folder / 'blobs'}: {readme.name}",
        f"Only in {folder / 'refs'}: gone",
        f"Only in {snap}: broken.bin",
        f"Only in {folder / 'snapshots' / c1}: README.md",
    ]), out  # fmt: skip


@fuse
def test_pack_killed_at_random_points_then_run_again(tmp_path: Path) -> None:
    """Killed at random points of its writing (measured in bytes in the store, not in time), packs leave
    a catalogue that reads or none, and a last pack completes the store."""
    spec = hub_cache.make_hub_cache(tmp_path / "cache", floats=256 * 1024)
    store = tmp_path / "store"
    cmd = [sys.executable, "-m", "xetfs", "pack", "--hub-cache", str(spec.root), str(store), "--no-progress"]
    env = hf_xet_env(tmp_path / "hf_xet")

    def written(root: Path) -> int:
        return sum(p.stat().st_size for p in root.rglob("*") if p.is_file()) if root.exists() else 0

    reference = tmp_path / "reference"  # what a whole pack writes
    assert subprocess.run([*cmd[:-2], str(reference), "--no-progress"], cwd=REPO_ROOT, env=env,
                          capture_output=True, check=False).returncode == 0  # fmt: skip
    total = written(reference)

    def reached(target: int) -> bool:
        return written(store) >= target

    rng = random.Random(15)
    killed = 0
    for _ in range(6):
        target = written(store) + int(rng.uniform(0.02, 0.9) * (total - written(store)))
        proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if kill_when(proc, functools.partial(reached, target)):
            killed += 1
        path = store / CATALOGUE_NAME
        if path.exists():
            try:
                load_catalogue(path)
            except CatalogueError as exc:  # pragma: no cover - the failure this test is for
                pytest.fail(f"catalogue unreadable after a kill: {exc}")
        if proc.returncode == 0:
            shutil.rmtree(store)  # it finished: start over, to kill it again elsewhere
    assert killed >= 3
    summary(xetfs(tmp_path, "pack", "--hub-cache", spec.root, store, "--no-progress"))
    assert xetfs(tmp_path, "verify", store).returncode == 0
    with mounted(store) as m:
        assert diff(spec.root, m.path) == ""


@fuse
def test_a_directory_as_a_revision_and_the_layouts(imported: Imported, tmp_path: Path) -> None:
    c3 = imported.spec.model_commits[2]
    src = tmp_path / "src"
    shutil.copytree(imported.spec.root / "models--acme--tiny-bert" / "snapshots" / c3, src)  # follows the symlinks
    store = tmp_path / "store"
    xetfs(tmp_path, "pack", src, store, "--no-progress")  # the named tree
    one = xetfs(tmp_path, "pack", src, store, "--repo", "me/copy", "--no-progress").stdout
    again = xetfs(tmp_path, "pack", src, store, "--repo", "me/copy", "--revision", "v2", "--no-progress").stdout
    commit = one.split(" = ")[1].split(";")[0]
    assert re.fullmatch(r"[0-9a-f]{40}", commit) and f"me/copy v2 = {commit};" in again  # same tree, same id
    given = "ab" * 20
    xetfs(tmp_path, "pack", src, store, "--repo", "me/tagged", "--repo-type", "dataset", "--commit", given,
          "--no-progress")  # fmt: skip
    # A pack that moves a ref the store has says so (here a branch set back to an earlier commit).
    moved = xetfs(tmp_path, "pack", src, store, "--repo", "me/tagged", "--repo-type", "dataset", "--commit",
                  "cd" * 20, "--no-progress").stdout  # fmt: skip
    assert moved.rstrip().endswith(f"; 1 ref moved: dataset me/tagged: main {given[:8]} -> {'cd' * 4}"), moved
    back = xetfs(tmp_path, "pack", src, store, "--repo", "me/tagged", "--repo-type", "dataset", "--commit", given,
                 "--no-progress").stdout  # fmt: skip
    assert back.rstrip().endswith(f"; 1 ref moved: dataset me/tagged: main {'cd' * 4} -> {given[:8]}"), back
    assert "moved" not in again
    with mounted(store) as m:
        folder = m.path / "models--me--copy"
        assert sorted(os.listdir(folder / "refs")) == ["main", "v2"]
        assert (folder / "refs" / "v2").read_bytes() == commit.encode()
        for name in ("model.safetensors", "config.json", "notes/training.txt"):
            link = os.readlink(folder / "snapshots" / commit / name)
            assert link == os.readlink(imported.spec.root / "models--acme--tiny-bert" / "snapshots" / c3 / name)
        assert (m.path / "datasets--me--tagged" / "refs" / "main").read_bytes() == given.encode()
        assert diff(src, folder / "snapshots" / commit) == ""
    with mounted(store, "--layout", "names") as m:
        assert sorted(os.listdir(m.path)) == sorted(os.listdir(src))
        assert diff(src, m.path) == ""


@fuse
def test_concurrent_packs_into_one_store_take_turns_and_keep_both(imported: Imported, tmp_path: Path) -> None:
    """hf_xet cannot write one store from two processes at once: packs wait for the store's lock."""
    store = tmp_path / "store"
    store.mkdir()
    env = hf_xet_env(tmp_path / "hf_xet")
    errs = [tmp_path / f"err{i}" for i in range(2)]
    with locked(store, print):  # both packs start while the lock is held, so both must wait
        procs = []
        for repo, err in zip((hub_cache.MODEL, hub_cache.DATASET), errs, strict=True):
            cmd = [sys.executable, "-m", "xetfs", "pack", "--hub-cache", str(imported.spec.root), str(store),
                   "--repo", repo, "--no-progress"]  # fmt: skip
            with open(err, "wb") as f:
                procs.append(subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=f))
        deadline = time.monotonic() + 60
        while not all(b"waiting for it to finish" in e.read_bytes() for e in errs):
            assert time.monotonic() < deadline, [e.read_text() for e in errs]
            assert all(p.poll() is None for p in procs), [e.read_text() for e in errs]
            time.sleep(0.05)
    for p, err in zip(procs, errs, strict=True):
        assert p.wait(120) == 0, err.read_text()
    cat = load_catalogue(store / CATALOGUE_NAME)
    assert [r.id for r in cat.repos] == [hub_cache.DATASET, hub_cache.MODEL]
    assert cat.repos[1].refs["main"] == imported.spec.model_commits[2]
    with mounted(store) as m:
        assert diff(imported.spec.root, m.path) == ""


@pytest.mark.integration
def test_verify_checks_the_catalogue_against_the_store(imported: Imported, tmp_path: Path) -> None:
    assert "OK:" in xetfs(tmp_path, "verify", imported.store).stdout
    store = tmp_path / "store"
    shutil.copytree(imported.store, store)
    doc = json.loads((store / CATALOGUE_NAME).read_bytes())
    model = next(r for r in doc["repos"] if r["id"] == hub_cache.MODEL)
    big = sorted(name for name in model["blobs"] if len(name) == 64)
    small = sorted(name for name in model["blobs"] if len(name) == 40)
    model["blobs"][big[0]]["xetHash"] = model["blobs"][big[1]]["xetHash"]  # another file under this sha256 name
    model["blobs"][small[0]]["size"] += 1
    model["blobs"][small[1]]["xetHash"] = "0" * 64
    (store / CATALOGUE_NAME).write_text(json.dumps(doc))
    proc = xetfs(tmp_path, "verify", store, check=False)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    problems = [line for line in proc.stdout.splitlines() if line.startswith("PROBLEM:")]
    assert len(problems) == 3, problems
    text = "\n".join(problems)
    assert f"blob {big[0]}: the store's file" in text and f"has sha256 {big[1]}" in text
    assert f"blob {small[0]}: " in text and "bytes in the catalogue" in text
    assert f"blob {small[1]}: file {'0' * 64} (snapshots/" in text and "is not in the store" in text
    (store / CATALOGUE_NAME).write_text("{broken")  # a catalogue that cannot be read: one problem, the rest checked
    proc = xetfs(tmp_path, "verify", store, check=False)
    assert proc.returncode == 3 and f"PROBLEM: catalogue {store / CATALOGUE_NAME}" in proc.stdout, proc.stdout
    assert proc.stdout.splitlines()[-1].startswith("1 problem: "), proc.stdout


CHANGING_PACK = """
import sys
from pathlib import Path
import xetfs.write.hubpack as hubpack
from xetfs.commands.cli import main

victim = Path(sys.argv[1]).resolve()
read = hubpack.digest_file


def digest_then_change(path):
    digests = read(path)
    if Path(path).resolve() == victim:  # a writer gets in between our read and hf_xet's
        Path(path).write_bytes(b"rewritten while xetfs was reading it\\n")
    return digests


hubpack.digest_file = digest_then_change
sys.exit(main(sys.argv[2:]))
"""


@fuse
def test_a_file_changed_while_being_read_is_left_out(imported: Imported, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    shutil.copytree(imported.spec.root, cache, symlinks=True)
    c1 = imported.spec.model_commits[0]
    snap = cache / "models--acme--tiny-bert" / "snapshots" / c1
    victim = Path(os.path.realpath(snap / "notes" / "training.txt"))
    store = tmp_path / "store"
    proc = subprocess.run(
        [sys.executable, "-c", CHANGING_PACK, str(victim), "pack", "--hub-cache", str(cache), str(store),
         "--no-progress"],
        capture_output=True, text=True, cwd=REPO_ROOT, env=hf_xet_env(tmp_path / "hf_xet"), timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == ExitStatus.SKIPPED, proc.stderr
    assert proc.stderr == f"xetfs: warning: skipping {victim}: changed while being read\n"
    assert summary(proc).group(8) == "skipped 1 (1 file changed while read)"
    with mounted(store) as m:
        assert not (m.path / snap.relative_to(cache) / "notes" / "training.txt").exists()
        assert (m.path / snap.relative_to(cache) / "README.md").read_bytes() == (snap / "README.md").read_bytes()


@fuse
def test_a_damaged_blob_is_logged_by_the_snapshot_path_a_program_opened(imported: Imported, tmp_path: Path) -> None:
    """A program opens ``snapshots/<commit>/model.safetensors``; the kernel resolves the symlink and the daemon
    sees the blob. The failed read's log line names the snapshot path, and the blob."""
    store = tmp_path / "store"
    shutil.copytree(imported.store, store)
    (repo,) = [r for r in load_catalogue(store / CATALOGUE_NAME).repos if r.id == hub_cache.MODEL]
    commit = repo.refs["main"]
    blob = repo.revisions[commit].files["model.safetensors"]
    damage_one_file(store, repo.blobs[blob].xet_hash)
    with mounted(store, allow_errors=True) as m:
        path = m.path / repo.folder / "snapshots" / commit / "model.safetensors"
        with pytest.raises(OSError):
            path.read_bytes()
        line = next(line for line in m.log().splitlines() if "read of " in line)
    assert f"read of {repo.folder}/snapshots/{commit}/model.safetensors (blob {blob}) (file " in line, line


@fuse
def test_catalogue_warnings_reach_the_mounting_terminal(imported: Imported, tmp_path: Path) -> None:
    store = tmp_path / "store"
    shutil.copytree(imported.store, store)
    doc = json.loads((store / CATALOGUE_NAME).read_bytes())
    model = next(r for r in doc["repos"] if r["id"] == hub_cache.MODEL)
    lost = sorted(name for name in model["blobs"] if len(name) == 40)[0]
    model["blobs"][lost]["xetHash"] = "0" * 64  # a file the store does not have
    model["refs"]["../escape"] = imported.spec.model_commits[0]
    (store / CATALOGUE_NAME).write_text(json.dumps(doc))
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    log = tmp_path / "daemon.log"
    proc = xetfs(tmp_path, "mount", store, mnt, "--log-file", log)
    try:
        lines = proc.stderr.splitlines()
        assert any("catalogue" in line and "'../escape'" in line for line in lines), lines
        gone = f"model {hub_cache.MODEL}: 1 blob of {len(model['blobs'])} not in the store, left out with the "
        assert any(gone in line and f"first missing: blob {lost} (file {'0' * 64})" in line for line in lines), lines
        assert lines[-1].startswith(f"xetfs: mounted {store} at {mnt} with "), lines
        assert re.search(r"with \d+ warnings \(log: ", lines[-1]), lines
        assert not (mnt / "models--acme--tiny-bert" / "blobs" / lost).exists()
        assert (mnt / "models--acme--tiny-bert" / "refs" / "main").exists()
    finally:
        xetfs(tmp_path, "umount", mnt, check=False)
        if is_mounted(mnt):
            force_unmount(mnt)
    assert not is_mounted(mnt)


@fuse
def test_layout_names_on_a_store_without_a_manifest_says_so_on_the_terminal(imported: Imported, tmp_path: Path) -> None:
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    proc = xetfs(tmp_path, "mount", imported.store, mnt, "--layout", "names", "--log-file", tmp_path / "daemon.log")
    try:
        lines = proc.stderr.splitlines()
        assert any(
            "--layout names:" in line
            and "has no xetfs-manifest.json: files are shown by hash" in line
            and f"its {CATALOGUE_NAME} names them: --layout hub" in line
            for line in lines
        ), lines
        assert all(re.fullmatch(r"[0-9a-f]{64}", name) for name in os.listdir(mnt))
    finally:
        xetfs(tmp_path, "umount", mnt, check=False)
        if is_mounted(mnt):
            force_unmount(mnt)
    assert not is_mounted(mnt)
