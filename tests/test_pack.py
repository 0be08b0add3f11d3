"""``xetfs pack``: naming, walking, manifest merging, and real packs with hf_xet.

hf_xet starts a tokio runtime with worker threads, and FUSE tests fork this
process later, so real packs run ``python -m xetfs pack`` in a child process.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import hub_cache
from helpers.mounting import wait_until
from helpers.oracle import CliRunner, hf_xet_env, run_xetfs

from xetfs.base import hashes
from xetfs.base.errors import ManifestError, XetfsError
from xetfs.base.exitstatus import ExitStatus
from xetfs.base.settings import RACY_SECONDS
from xetfs.commands.pack import PackUsageError, add_pack_parser, cmd_pack, pack_targets
from xetfs.names.tree import ROOT_INODE, build_tree
from xetfs.storage.index import EMPTY_SHA256
from xetfs.storage.indexer import load_index
from xetfs.storage.manifest import Entry, Manifest, ManifestFile
from xetfs.storage.store import Store
from xetfs.write.pack import (
    MANIFEST_NAME,
    REDB_INDEX,
    find_manifest,
    load_manifest,
    merge,
    plan_pack,
    read_over_added,
    store_bytes,
    upload,
)

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parent.parent

CONTENT = {
    "a.txt": b"hello\n",
    "empty.bin": b"",
    "sub/r.bin": bytes(range(256)) * 40,
    "sub/ünï cödé.txt": "grüße\n".encode(),
    "sub/deep/日本.bin": b"x" * 5000,
}


def make_tree(root: Path, files: dict[str, bytes] = CONTENT, empty_dirs: tuple[str, ...] = ("sub/nothing",)) -> Path:
    for name, data in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    for d in empty_dirs:
        (root / d).mkdir(parents=True, exist_ok=True)
    return root


def ignore(message: str) -> None:
    """A ``warn`` callback that drops the warning."""


def names(paths: list[tuple[str, ...]]) -> list[str]:
    return ["/".join(p) for p in paths]


# -- planning (no hf_xet) ------------------------------------------------------


def test_a_single_directory_contributes_its_contents(tmp_path: Path) -> None:
    src = make_tree(tmp_path / "src")
    plan = plan_pack([src], tmp_path / "store", ignore)
    assert names([f.path for f in plan.files]) == [
        "a.txt",
        "empty.bin",
        "sub/r.bin",
        "sub/ünï cödé.txt",
        "sub/deep/日本.bin",
    ]
    assert names(plan.directories) == ["sub", "sub/deep", "sub/nothing"]
    assert all(f.local.is_absolute() and f.local.read_bytes() == CONTENT["/".join(f.path)] for f in plan.files)


def test_several_sources_contribute_their_names(tmp_path: Path) -> None:
    src = make_tree(tmp_path / "src")
    plan = plan_pack([src / "sub", src / "a.txt"], tmp_path / "store", ignore)
    assert names([f.path for f in plan.files]) == [
        "sub/r.bin",
        "sub/ünï cödé.txt",
        "sub/deep/日本.bin",
        "a.txt",
    ]
    assert names(plan.directories) == ["sub", "sub/deep", "sub/nothing"]


def test_dot_is_named_after_the_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make_tree(tmp_path / "proj", {"x": b"1"}, ())
    make_tree(tmp_path / "other", {"y": b"2"}, ())
    monkeypatch.chdir(tmp_path / "proj")
    plan = plan_pack([Path("."), Path("../other/")], tmp_path / "store", ignore)
    assert names([f.path for f in plan.files]) == ["proj/x", "other/y"]


def test_symlinks_and_special_files_are_skipped(tmp_path: Path) -> None:
    src = make_tree(tmp_path / "src", {"real": b"r"}, ())
    (src / "to-outside").symlink_to("/etc/hostname")
    (src / "to-dir").symlink_to(tmp_path)
    (src / "dangling").symlink_to(tmp_path / "nowhere")
    os.mkfifo(src / "fifo")
    warnings: list[str] = []
    plan = plan_pack([src], tmp_path / "store", warnings.append)
    assert names([f.path for f in plan.files]) == ["real"] and plan.directories == []
    assert sorted(warnings) == sorted(
        [
            f"skipping symlink {src / 'dangling'}",
            f"skipping {src / 'fifo'}: not a regular file",
            f"skipping symlink {src / 'to-dir'}",
            f"skipping symlink {src / 'to-outside'}",
        ]
    )


def test_a_symlink_named_on_the_command_line_is_followed(tmp_path: Path) -> None:
    make_tree(tmp_path, {"target.bin": b"t"}, ())
    (tmp_path / "link.bin").symlink_to(tmp_path / "target.bin")
    plan = plan_pack([tmp_path / "link.bin"], tmp_path / "store", ignore)
    assert [f.path for f in plan.files] == [("link.bin",)]


def test_names_that_are_not_utf8_are_skipped(tmp_path: Path) -> None:
    src = make_tree(tmp_path / "src", {"ok": b"1"}, ())
    with open(os.path.join(os.fsencode(src), b"bad\xff.bin"), "wb") as f:
        f.write(b"2")
    warnings: list[str] = []
    plan = plan_pack([src], tmp_path / "store", warnings.append)
    assert [f.path for f in plan.files] == [("ok",)]
    assert len(warnings) == 1 and "not valid Unicode" in warnings[0]


def test_the_store_inside_a_source_is_skipped(tmp_path: Path) -> None:
    src = make_tree(tmp_path / "src", {"a": b"1", "store/xet/junk": b"2"}, ())
    warnings: list[str] = []
    plan = plan_pack([src], src / "store", warnings.append)
    assert [f.path for f in plan.files] == [("a",)]
    assert warnings == [f"skipping {src / 'store'}: it is the destination store"]
    with pytest.raises(XetfsError, match="is the destination store"):
        plan_pack([src / "store"], src / "store", ignore)


def test_duplicate_names_are_an_error(tmp_path: Path) -> None:
    make_tree(tmp_path / "one", {"x.bin": b"1"}, ())
    make_tree(tmp_path / "two", {"x.bin": b"2"}, ())
    with pytest.raises(XetfsError, match=r"two sources would both be named 'x\.bin'"):
        plan_pack([tmp_path / "one" / "x.bin", tmp_path / "two" / "x.bin"], tmp_path / "store", ignore)
    with pytest.raises(XetfsError, match="both be named"):
        plan_pack([tmp_path / "one" / "x.bin", tmp_path / "one" / "x.bin"], tmp_path / "store", ignore)
    make_tree(tmp_path / "a" / "one", {"y": b"1", "x.bin": b"3"}, ())
    with pytest.raises(XetfsError, match=r"'one/x\.bin'"):
        plan_pack([tmp_path / "one", tmp_path / "a" / "one"], tmp_path / "store", ignore)


def test_a_file_and_a_directory_with_one_name_are_an_error(tmp_path: Path) -> None:
    make_tree(tmp_path / "d" / "x", {"inner": b"1"}, ())
    make_tree(tmp_path / "f", {"x": b"2"}, ())
    with pytest.raises(XetfsError, match="would be both a file"):
        plan_pack([tmp_path / "d" / "x", tmp_path / "f" / "x"], tmp_path / "store", ignore)


def test_skipped_paths_are_counted(tmp_path: Path) -> None:
    """What ``pack`` exits with and ``--strict`` refuses: every skipped path, not the destination store."""
    src = make_tree(tmp_path / "src", {"real": b"r", "store/xet/junk": b"2"}, ())
    (src / "link").symlink_to(src / "real")
    with open(os.path.join(os.fsencode(src), b"bad\xff.bin"), "wb") as f:
        f.write(b"2")
    os.mkfifo(src / "fifo")
    plan = plan_pack([src], src / "store", ignore)
    assert sorted(p.name for p in plan.skipped) == sorted(["link", "fifo", os.fsdecode(b"bad\xff.bin")])
    assert plan.all_links == []
    # Links beside subdirectories only, whose files are regular ones: not a snapshot, no hint.
    top = make_tree(tmp_path / "top", {"data/a.json": b"a", "data/deep/b.json": b"b"}, ())
    (top / "latest").symlink_to(top / "data" / "a.json")
    plan = plan_pack([top], tmp_path / "store", ignore)
    assert plan.all_links == [] and [p.name for p in plan.skipped] == ["latest"]


def test_follow_symlinks_packs_what_links_point_to(tmp_path: Path) -> None:
    outside = make_tree(tmp_path / "outside", {"w.bin": b"w", "d/inner.txt": b"i"}, ())
    src = make_tree(tmp_path / "src", {"real": b"r"}, ())
    (src / "file-link").symlink_to(outside / "w.bin")
    (src / "dir-link").symlink_to(outside / "d")
    (src / "loop").symlink_to(src)
    (src / "dangling").symlink_to(tmp_path / "nowhere")
    warnings: list[str] = []
    plan = plan_pack([src], tmp_path / "store", warnings.append, follow_symlinks=True)
    assert sorted(names([f.path for f in plan.files])) == ["dir-link/inner.txt", "file-link", "real"]
    assert names(plan.directories) == ["dir-link"]
    by_name = {f.path: f for f in plan.files}
    assert by_name[("file-link",)].mtime_ns == (outside / "w.bin").stat().st_mtime_ns  # the target's, not the link's
    assert sorted(p.name for p in plan.skipped) == ["dangling", "loop"]
    assert sorted(warnings) == [
        f"skipping symlink {src / 'dangling'}: it points to nothing (dangling)",
        f"skipping symlink {src / 'loop'}: it points to {src}, which holds it (a loop)",
    ]


def test_a_directory_of_symlinks_gets_a_hint(tmp_path: Path) -> None:
    """A huggingface_hub snapshot (written by huggingface_hub itself): every entry is a link into blobs/."""
    spec = hub_cache.make_hub_cache(tmp_path / "cache", floats=16)
    snapshot = next((tmp_path / "cache").glob("models--*/snapshots/*"))
    assert all(p.is_symlink() or p.is_dir() for p in snapshot.rglob("*"))  # (subdirectories are real)
    with pytest.raises(XetfsError, match="nothing to pack") as caught:
        plan_pack([snapshot], tmp_path / "store", ignore)
    message = str(caught.value)
    assert f"every file in {snapshot} (and 1 other directory) is a symlink" in message
    assert "--hub-cache" in message and "--follow-symlinks" in message
    plan = plan_pack([snapshot], tmp_path / "store", ignore, follow_symlinks=True)
    assert plan.all_links == [] and len(plan.files) == sum(p.is_symlink() for p in snapshot.rglob("*"))
    assert spec.model_commits  # (the cache is the one the hub tests use)


def test_missing_source_and_nothing_to_pack(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        plan_pack([tmp_path / "missing"], tmp_path / "store", ignore)
    (tmp_path / "empty" / "dir").mkdir(parents=True)
    with pytest.raises(XetfsError, match="nothing to pack"):
        plan_pack([tmp_path / "empty"], tmp_path / "store", ignore)


def test_upload_without_hf_xet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "hf_xet", None)  # makes ``import hf_xet`` fail
    with pytest.raises(XetfsError, match=r"install xetfs\[pack\]"):
        upload([tmp_path / "x"], tmp_path / "store")


# -- the manifest ----------------------------------------------------------------


def test_find_manifest(tmp_path: Path) -> None:
    store = tmp_path / "store"
    (store / "xet" / "xorbs" / "shards").mkdir(parents=True)
    assert find_manifest(store) is None
    (store / MANIFEST_NAME).write_text("[]")
    for given in (store, store / "xet", store / "xet" / "xorbs"):
        assert find_manifest(given) == store / MANIFEST_NAME
    assert find_manifest(store / "xet" / "xorbs" / "shards") is None
    (store / "xet" / MANIFEST_NAME).write_text("[]")
    assert find_manifest(store / "xet") == store / "xet" / MANIFEST_NAME


def test_load_manifest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / MANIFEST_NAME
    path.write_text("[1]")
    assert len(load_manifest(path).warnings) == 1
    monkeypatch.setattr("xetfs.storage.manifest.MAX_MANIFEST_BYTES", 2)
    with pytest.raises(ManifestError, match="3 bytes, the limit is 2"):
        load_manifest(path)
    with pytest.raises(FileNotFoundError):
        load_manifest(tmp_path / "missing.json")


H1, H2, H3 = (hashlib.sha256(bytes([i])).digest() for i in range(3))


def test_merge_replaces_same_paths_and_drops_conflicts() -> None:
    old = Manifest(
        (
            ManifestFile(("keep",), H1, 1, None),
            ManifestFile(("same",), H1, 1, None),
            ManifestFile(("x",), H1, 1, None),
        ),
        (("old-dir",), ("y",)),
        (),
    )
    new: list[Entry] = [ManifestFile(("same",), H2, 2, None), ManifestFile(("x", "inner"), H3, 3, None), ("y",)]
    merged, messages, changes = merge(new, old, source=MANIFEST_NAME)
    assert {f.name: f.xet_hash for f in merged.files} == {"same": H2, "x/inner": H3, "keep": H1}
    assert set(merged.directories) == {("y",), ("old-dir",)}
    assert changes == (1, 0)  # ("same" names other bytes; "x" is dropped for "x/inner", with a warning)
    assert any("'x'" in m and "dropped" in m for m in messages)
    assert merge(new, None, source="m")[1:] == ([], (0, 0))
    only, messages, changes = merge(new, old, source=MANIFEST_NAME, replace=True)
    assert {f.name for f in only.files} == {"same", "x/inner"} and set(only.directories) == {("y",)}
    assert changes == (1, 2) and messages == []  # ("keep" and "x" are no longer named)


def test_pack_parser() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()

    def add_common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--debug", action="store_true")

    add_pack_parser(sub, add_common)
    args = parser.parse_args(["pack", "a", "b/", "STORE", "--no-progress"])
    assert pack_targets(args) == (["a", "b/"], "STORE", None) and args.no_progress
    assert args.func is cmd_pack and args.debug is False
    with pytest.raises(PackUsageError):
        pack_targets(parser.parse_args(["pack", "STORE"]))


def test_pack_parser_hub_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    add_pack_parser(parser.add_subparsers(), lambda p: None)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert pack_targets(parser.parse_args(["pack", "--hub-cache", "STORE"])) == ([], "STORE", tmp_path / "hub")
    assert pack_targets(parser.parse_args(["pack", "STORE", "--hub-cache"])) == ([], "STORE", tmp_path / "hub")
    args = parser.parse_args(["pack", "--hub-cache", "DIR", "STORE", "--repo", "a/b", "--repo", "c"])
    assert pack_targets(args) == ([], "STORE", Path("DIR")) and args.repo == ["a/b", "c"]
    for bad in (["pack", "--hub-cache", "DIR", "S1", "S2"], ["pack", "--hub-cache"]):
        with pytest.raises(PackUsageError):
            pack_targets(parser.parse_args(bad))
    follow = parser.parse_args(["pack", "--hub-cache", str(tmp_path / "hub"), "STORE", "--follow-symlinks"])
    with pytest.raises(PackUsageError, match=r"--follow-symlinks and --reread go with pack SRC\.\.\. STORE"):
        cmd_pack(follow)  # (a cache's snapshots are links by design: --hub-cache reads them as such)


# -- real packs (hf_xet in a child process) ----------------------------------------


def run_pack(tmp_path: Path, *args: object) -> subprocess.CompletedProcess[str]:
    env = hf_xet_env(tmp_path / "hf_xet")
    return subprocess.run(
        [sys.executable, "-m", "xetfs", "pack", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env=env,
        timeout=300,
        check=False,
    )


def read_manifest(store: Path) -> dict[str, dict[str, object]]:
    return {e["path"]: e for e in json.loads((store / MANIFEST_NAME).read_bytes())}


def test_pack_a_tree_then_list_it(tmp_path: Path, cli: CliRunner) -> None:
    src = make_tree(tmp_path / "src")
    (src / "link").symlink_to(src / "a.txt")
    store = tmp_path / "store"
    proc = run_pack(tmp_path, src, store)
    assert proc.returncode == 4, proc.stderr  # complete but for the skipped link (ExitStatus.SKIPPED)
    total = sum(map(len, CONTENT.values()))
    n = len(CONTENT)
    added = store_bytes(store)
    assert proc.stdout == (
        f"packed {n} files ({total} bytes) into {store}: {added} store bytes added{read_over_added(total, added)}; "
        f"{store / MANIFEST_NAME} names {n} files; skipped 1 path (see the warnings)\n"
    )
    assert proc.stderr == f"xetfs: warning: skipping symlink {src / 'link'}\n"

    entries = read_manifest(store)
    assert set(entries) == set(CONTENT) | {"sub", "sub/deep", "sub/nothing"}
    index = load_index(Store.open(store)).index
    for name, data in CONTENT.items():
        e = entries[name]
        sha = hashlib.sha256(data).hexdigest()
        assert e["type"] == "file" and e["size"] == len(data) and e["lfs"] == {"oid": sha, "size": len(data)}
        assert isinstance(e["xetHash"], str)
        stored = index.get(hashes.from_hex(e["xetHash"]))
        assert stored is not None and stored.size == len(data) and stored.sha256 == sha
    assert entries["empty.bin"]["lfs"] == {"oid": EMPTY_SHA256, "size": 0}
    assert entries["sub/nothing"] == {"type": "directory", "path": "sub/nothing"}

    listed = cli("ls", store)
    assert listed.returncode == 0
    assert {line.split()[0] for line in listed.stdout.decode().splitlines()} == {
        e["xetHash"] for e in entries.values() if e["type"] == "file"
    }

    tree, warnings = build_tree(index, load_manifest(store / MANIFEST_NAME))
    assert warnings == []
    sub = tree.lookup(ROOT_INODE, b"sub")
    assert sub is not None
    node = tree.lookup(sub.inode, "ünï cödé.txt".encode())
    assert node is not None and node.entry is not None and node.entry.hex == entries["sub/ünï cödé.txt"]["xetHash"]
    cat = cli("cat", store, node.entry.hex)
    assert cat.stdout == CONTENT["sub/ünï cödé.txt"]


def test_packing_again_merges_the_manifest(tmp_path: Path) -> None:
    first = make_tree(tmp_path / "first", {"a": b"one", "b": b"bee"}, ())
    second = make_tree(tmp_path / "second", {"a": b"two"}, ())
    store = tmp_path / "store"
    assert run_pack(tmp_path, first, store).returncode == 0
    before = read_manifest(store)
    proc = run_pack(tmp_path, second / "a", tmp_path / "first" / "b", store)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    # ("b" is as it was: read again only if it changed less than RACY_SECONDS before the first pack, as here)
    assert re.search(r"names 2 files \((1 unchanged, not read again, )?1 with new bytes\)\n$", proc.stdout), proc.stdout
    after = read_manifest(store)
    assert set(after) == {"a", "b"}
    assert after["b"] == before["b"] and after["a"] != before["a"]
    assert after["a"]["lfs"] == {"oid": hashlib.sha256(b"two").hexdigest(), "size": 3}
    assert len(load_index(Store.open(store)).index) == 3  # both versions of "a" stay in the store


def settled(*paths: Path) -> None:
    """Wait until every file in ``paths`` last changed ``RACY_SECONDS`` ago: a pack trusts its stamp only then."""

    def changed() -> int:
        return max(max(st.st_mtime_ns, st.st_ctime_ns) for st in map(os.stat, paths))

    wait_until(lambda: time.time_ns() - changed() > RACY_SECONDS * 1e9, RACY_SECONDS + 30, "the files to settle")


def test_packing_again_reads_only_what_changed(tmp_path: Path) -> None:
    src = make_tree(tmp_path / "src", {"a": b"one" * 1000, "b": b"bee", "sub/c": b"sea"}, ())
    files = [src / "a", src / "b", src / "sub" / "c"]
    store = tmp_path / "store"

    def pack(*more: str) -> str:
        proc = run_pack(tmp_path, src, store, *more)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    assert pack().startswith("packed 3 files (3006 bytes)")
    assert pack().startswith("packed 3 files"), "files that changed within RACY_SECONDS of their stamp: read again"
    settled(*files)
    assert pack().startswith("packed 3 files"), "stamped settled now"
    first = read_manifest(store)
    again = pack()
    assert again.startswith(f"packed 0 files (0 bytes) into {store}: 0 store bytes added; "), again
    assert again.endswith("names 3 files (3 unchanged, not read again)\n") and read_manifest(store) == first
    # Rewritten with its size and modification time kept (tar, cp -p, rsync -t): its change time tells.
    kept = os.stat(src / "b")
    (src / "b").write_bytes(b"BEE")
    os.utime(src / "b", ns=(kept.st_atime_ns, kept.st_mtime_ns))
    rewritten = pack()
    assert rewritten.startswith("packed 1 file (3 bytes)") and "2 unchanged" in rewritten, rewritten
    assert read_manifest(store)["b"]["lfs"] == {"oid": hashlib.sha256(b"BEE").hexdigest(), "size": 3}
    # Replaced by another file of the same size and time: another inode.
    (src / "new-c").write_bytes(b"SEA")
    os.utime(src / "new-c", ns=(1, os.stat(src / "sub" / "c").st_mtime_ns))
    os.replace(src / "new-c", src / "sub" / "c")
    settled(*files)
    replaced = pack()
    assert replaced.startswith("packed 2 files (6 bytes)") and "1 unchanged" in replaced, replaced  # (b: racy)
    assert read_manifest(store)["sub/c"]["lfs"] == {"oid": hashlib.sha256(b"SEA").hexdigest(), "size": 3}
    # The store lost the bytes (every shard gone): read again, with a warning; --reread: every file.
    assert pack().startswith("packed 0 files")
    for shard in list(store.rglob("*.mdb")):
        shard.unlink()
    lost = run_pack(tmp_path, src, store)
    assert lost.returncode == 0 and lost.stdout.startswith("packed 3 files (3006 bytes)"), lost.stdout
    assert lost.stderr.startswith("xetfs: warning: every file is read again: the store's shards cannot tell what "
                                  "it holds: "), lost.stderr  # fmt: skip
    assert pack().startswith("packed 0 files")
    reread = pack("--reread")
    assert reread.startswith("packed 3 files (3006 bytes)") and "unchanged" not in reread, reread
    assert run_xetfs("verify", store).returncode == 0
    # The state forgets files deleted from a source it walks, and keeps those of other sources.
    other = make_tree(tmp_path / "other", {"o": b"oh"}, ())
    assert run_pack(tmp_path, other, store).returncode == 0
    (src / "b").unlink()
    pack()
    state = json.loads((store / ".xetfs-pack-state.json").read_bytes())["files"]
    assert sorted(state) == sorted(str(p) for p in (src / "a", src / "sub" / "c", other / "o")), sorted(state)
    # Xorbs gone while the shards list them: the files are read again, and the pack says they do not read.
    for xorb in list((store / "xet" / "xorbs" / "xorbs").iterdir()):
        xorb.unlink()
    gone = run_pack(tmp_path, src, store)
    assert gone.returncode == 0 and gone.stdout.startswith("packed 2 files"), gone.stdout
    warned = sorted(line.split(":")[2].strip() for line in gone.stderr.splitlines())
    assert warned == ["a", "sub/c"] and "a pack does not write a xorb again while a shard lists it" in gone.stderr


def test_a_revision_packed_again_reads_only_what_changed(tmp_path: Path) -> None:
    src = make_tree(tmp_path / "src", {"config.json": b"{}", "model.safetensors": b"w" * 5000}, ())
    settled(src / "config.json", src / "model.safetensors")
    store = tmp_path / "store"
    first = run_pack(tmp_path, src, store, "--repo", "org/name")
    assert first.returncode == 0 and "2 files read" in first.stdout, first.stdout + first.stderr
    again = run_pack(tmp_path, src, store, "--repo", "org/name")
    assert again.stdout.split(";")[0] == first.stdout.split(";")[0], again.stdout  # the same commit
    assert "0 files read (0 bytes; 2 unchanged, not read again)" in again.stdout, again.stdout
    (src / "config.json").write_bytes(b'{"a": 1}')
    changed = run_pack(tmp_path, src, store, "--repo", "org/name")
    assert "1 file read (8 bytes; 1 unchanged, not read again)" in changed.stdout, changed.stdout
    assert changed.stdout.split(";")[0] != first.stdout.split(";")[0], changed.stdout


def test_packing_again_with_replace_drops_the_names_of_deleted_files(tmp_path: Path) -> None:
    src = make_tree(tmp_path / "src", {"a": b"one", "b": b"bee", "sub/c": b"sea"}, ())
    store = tmp_path / "store"
    assert run_pack(tmp_path, src, store).returncode == 0
    (src / "b").unlink()
    (src / "a").write_bytes(b"two")
    kept = run_pack(tmp_path, src, store)  # (without --replace: "b" stays named)
    assert kept.returncode == 0 and set(read_manifest(store)) == {"a", "b", "sub", "sub/c"}, kept.stdout
    replaced = run_pack(tmp_path, src, store, "--replace")
    assert replaced.returncode == 0, replaced.stderr
    assert re.search(r"names 2 files \((\d unchanged, not read again, )?1 removed\)\n$", replaced.stdout), (
        replaced.stdout
    )
    assert set(read_manifest(store)) == {"a", "sub", "sub/c"}
    refused = run_pack(tmp_path, src, store, "--replace", "--repo", "org/name")
    assert refused.returncode != 0 and "--replace goes with pack SRC... STORE" in refused.stderr


def test_pack_errors_are_one_line(tmp_path: Path) -> None:
    make_tree(tmp_path / "one", {"x": b"1"}, ())
    make_tree(tmp_path / "two", {"x": b"2"}, ())
    (tmp_path / "file").write_bytes(b"")
    cases = [
        ((tmp_path / "missing", tmp_path / "store"), f"{tmp_path / 'missing'}: No such file or directory"),
        ((tmp_path / "one", tmp_path / "file"), "exists and is not a directory"),
        ((tmp_path / "one" / "x", tmp_path / "two" / "x", tmp_path / "store"), "would both be named 'x'"),
    ]
    for args, message in cases:
        proc = run_pack(tmp_path, *args)
        assert proc.returncode == 1
        assert proc.stdout == "" and proc.stderr.startswith("xetfs: error: ") and message in proc.stderr
        assert proc.stderr.count("\n") == 1
    assert not (tmp_path / "store").exists()  # nothing was uploaded


def test_strict_refuses_skips_and_the_exit_status_tells_them(tmp_path: Path) -> None:
    """``--strict`` fails before anything is uploaded; without it, skipped files give ``ExitStatus.SKIPPED``."""
    src = make_tree(tmp_path / "src", {"one.txt": b"1"}, ())
    with open(os.path.join(os.fsencode(src), b"bad\xff.bin"), "wb") as f:
        f.write(b"2")
    store = tmp_path / "store"
    strict = run_pack(tmp_path, src, store, "--strict")
    assert strict.returncode == ExitStatus.ERROR, strict.stderr
    assert strict.stderr.splitlines()[-1] == (
        "xetfs: error: --strict: 1 path skipped (see the warnings); nothing recorded"
    )
    assert not store.exists()  # nothing uploaded
    loose = run_pack(tmp_path, src, store)
    assert loose.returncode == ExitStatus.SKIPPED and int(ExitStatus.SKIPPED) == 4, loose.stderr
    assert loose.stdout.endswith(f"; {store / MANIFEST_NAME} names 1 file; skipped 1 path (see the warnings)\n")
    assert set(read_manifest(store)) == {"one.txt"}
    clean = run_pack(tmp_path, src / "one.txt", store, "--strict")
    assert clean.returncode == 0 and "skipped" not in clean.stdout, clean.stderr


def test_follow_symlinks_and_the_hint_through_the_command(tmp_path: Path) -> None:
    outside = make_tree(tmp_path / "outside", {"w.bin": b"weights", "c.json": b"{}"}, ())
    links = tmp_path / "links"
    links.mkdir()
    for name in ("w.bin", "c.json"):
        (links / name).symlink_to(outside / name)
    store = tmp_path / "store"
    refused = run_pack(tmp_path, links, store)
    assert refused.returncode == 1
    assert "nothing to pack" in refused.stderr and "--hub-cache" in refused.stderr
    assert "--follow-symlinks" in refused.stderr
    followed = run_pack(tmp_path, links, store, "--follow-symlinks", "--strict")
    assert followed.returncode == 0, followed.stderr
    entries = read_manifest(store)
    assert set(entries) == {"w.bin", "c.json"}
    assert entries["w.bin"]["lfs"] == {"oid": hashlib.sha256(b"weights").hexdigest(), "size": 7}
    # A directory of links beside real files: the pack goes on, and the hint is a warning.
    mixed = make_tree(tmp_path / "mixed", {"own.txt": b"own"}, ())
    (mixed / "snapshot").mkdir()
    (mixed / "snapshot" / "w.bin").symlink_to(outside / "w.bin")
    hinted = run_pack(tmp_path, mixed, tmp_path / "store2")
    assert hinted.returncode == 4, hinted.stderr
    assert f"xetfs: warning: every file in {mixed / 'snapshot'} is a symlink" in hinted.stderr
    assert "--follow-symlinks" in hinted.stderr


def test_a_broken_manifest_stops_the_pack(tmp_path: Path) -> None:
    make_tree(tmp_path / "one", {"x": b"1"}, ())
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / MANIFEST_NAME).write_text("{not json")
    proc = run_pack(tmp_path, tmp_path / "one", tmp_path / "store")
    assert proc.returncode == 1 and "not valid JSON" in proc.stderr
    assert (tmp_path / "store" / MANIFEST_NAME).read_text() == "{not json"
    assert not (tmp_path / "store" / "xet").exists()


PROGRESS_SCRIPT = """
import sys
from pathlib import Path
from xetfs.write.pack import upload
[info] = upload([Path(sys.argv[1])], Path(sys.argv[2]), progress=True)
print(info.size)
"""


def test_upload_progress_bar(tmp_path: Path) -> None:
    data = make_tree(tmp_path / "src", {"r.bin": bytes(range(256)) * 400}, ()) / "r.bin"
    env = hf_xet_env(tmp_path / "hf_xet")
    proc = subprocess.run(
        [sys.executable, "-W", "error", "-c", PROGRESS_SCRIPT, str(data), str(tmp_path / "store")],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env=env,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "102400\n"
    assert "pack: 100%" in proc.stderr and "100k/100k" in proc.stderr


def test_a_damaged_hf_xet_index_is_replaced(tmp_path: Path, cli: CliRunner) -> None:
    """A pack killed while hf_xet writes its redb index leaves it unreadable: the next pack removes it and goes on."""
    make_tree(tmp_path / "one", {"a": os.urandom(300_000)}, ())
    make_tree(tmp_path / "two", {"b": os.urandom(200_000)}, ())
    store = tmp_path / "store"
    assert run_pack(tmp_path, tmp_path / "one" / "a", store).returncode == 0
    index = store / "xet" / "xorbs" / REDB_INDEX
    assert index.is_file()
    index.write_bytes(b"\x00garbage" * 512)
    proc = run_pack(tmp_path, tmp_path / "two" / "b", store)
    assert proc.returncode == 0, proc.stderr
    assert f"{index}: hf_xet cannot open its index" in proc.stderr
    assert set(read_manifest(store)) == {"a", "b"}
    assert cli("verify", store).returncode == 0


def test_the_summary_words_what_read_over_added_means() -> None:
    assert read_over_added(300, 100) == " (read / added: 3.00x, dedup and compression)"
    assert read_over_added(1000, 1010) == " (read / added: 0.99x: no dedup or compression gain)"
    assert read_over_added(288, 1329) == " (read / added: 0.22x: the shard and xorb footers outweigh so few bytes)"
    assert read_over_added(0, 100) == read_over_added(100, 0) == ""


def test_the_pack_state_keeps_only_what_a_read_saw_whole(tmp_path: Path) -> None:
    """``remember`` records a file only if it was the same file before and after the read; a file whose
    modification time lies in the future still settles (by its change time)."""
    from xetfs.write.packstate import Known, Stamp, load_state, remember, save_state, stamp_of

    path = tmp_path / "f"
    path.write_bytes(b"v1")
    state: dict[str, Known] = {}
    known = Known(Stamp(0, 0, 0, 0, 0, 0), "a" * 64, "b" * 64)
    before = stamp_of(path)
    remember(state, path, before, "a" * 64, "b" * 64)
    assert state[str(path)].stamp == before and state[str(path)].xet_hash == "a" * 64
    (tmp_path / "g").write_bytes(b"v2")
    os.replace(tmp_path / "g", path)  # another file took its place during the read
    remember(state, path, before, "a" * 64, "b" * 64)
    assert str(path) not in state
    remember(state, tmp_path / "gone", None, "a" * 64, "b" * 64)
    assert state == {}
    racy = int(RACY_SECONDS * 1e9)
    assert Stamp(2, time.time_ns() + 10**12, 0, 1, 1, racy).settled and not Stamp(2, 0, racy, 1, 1, racy).settled
    bad = {"format": "xetfs-pack-state", "version": 1, "files": {"/x": [1, "2", 3, 4, 5, 6, "a" * 64, None, None]}}
    (tmp_path / ".xetfs-pack-state.json").write_text(json.dumps(bad))
    assert load_state(tmp_path) == {}  # (a value of the wrong type: the entry is dropped, nothing raises)
    save_state(tmp_path, {"/y": known})
    assert load_state(tmp_path) == {"/y": known}
