"""The Hub cache layout of a catalogue as a tree: symlinks, refs, markers, hard links, what is left out."""

from __future__ import annotations

import pytest
from helpers.trees import check_invariants, entry, make_index, resolve

from xetfs.base import hashes
from xetfs.commands.verify import audit_catalogue
from xetfs.names.hubtree import build_hub_tree
from xetfs.names.tree import ROOT_INODE, Kind
from xetfs.storage.catalogue import Catalogue, Content, Repo, Revision
from xetfs.storage.index import FileEntry

pytestmark = pytest.mark.unit

C1, C2 = "1" * 40, "2" * 40
A, B, T = entry(1, 100), entry(2, 200), entry(3, 30)
SHA = "c" * 64
SHA1 = "d" * 40
MISSING = "e" * 64


def content(e: object) -> Content:
    return Content(hashes.to_hex(e.file_hash), e.size)  # type: ignore[attr-defined]


def catalogue() -> Catalogue:
    blobs = {SHA: content(A), SHA1: content(B), MISSING: Content("f" * 64, 5)}
    rev1 = Revision({"model.safetensors": SHA, "sub/deep/config.json": SHA1, "gone.bin": MISSING},
                    ("adapter_config.json", "x/y.txt"), content(T))  # fmt: skip
    rev2 = Revision({"model.safetensors": SHA})
    model = Repo("model", "org/name", {"main": C2, "refs/pr/1": C1}, blobs, {C1: rev1, C2: rev2})
    data = Repo("dataset", "solo", {"main": C1}, {SHA1: content(B)}, {C1: Revision({"train.csv": SHA1})})
    return Catalogue((data, model))


def test_the_layout_huggingface_hub_writes() -> None:
    tree, warnings = build_hub_tree(make_index(A, B, T), catalogue())
    paths = check_invariants(tree)
    m = "models--org--name"
    assert [name for name, _ in tree.children(ROOT_INODE)] == [b"datasets--solo", m.encode()]  # .xetfs: hidden
    assert sorted(n.decode() for n, _ in tree.children(resolve(tree, m).inode)) == [  # type: ignore[union-attr]
        ".no_exist", "blobs", "refs", "snapshots", "trees",
    ]  # fmt: skip
    assert paths[f"{m}/refs/main"].kind is Kind.DATA and paths[f"{m}/refs/main"].data == C2.encode()
    assert paths[f"{m}/refs/refs/pr/1"].data == C1.encode()
    link = paths[f"{m}/snapshots/{C1}/model.safetensors"]
    assert link.kind is Kind.SYMLINK and link.data == f"../../blobs/{SHA}".encode()
    assert paths[f"{m}/snapshots/{C1}/sub/deep/config.json"].data == f"../../../../blobs/{SHA1}".encode()
    assert paths[f"{m}/blobs/{SHA}"].entry is tree.get(paths[f"{m}/blobs/{SHA}"].inode).entry  # type: ignore[union-attr]
    assert paths[f"{m}/blobs/{SHA}"].entry.file_hash == A.file_hash  # type: ignore[union-attr]
    assert paths[f"{m}/.no_exist/{C1}/x/y.txt"].kind is Kind.DATA and paths[f"{m}/.no_exist/{C1}/x/y.txt"].data == b""
    assert paths[f"{m}/trees/{C1}.json"].entry.file_hash == T.file_hash  # type: ignore[union-attr]
    # One store file, a blob in two repos: two hard links (.xetfs/by-hash and by-sha256 are not counted).
    assert paths[f"datasets--solo/blobs/{SHA1}"].inode == paths[f"{m}/blobs/{SHA1}"].inode
    assert paths[f"{m}/blobs/{SHA1}"].nlink == 2
    # The blob the store lacks is left out, with the file that needs it.
    assert f"{m}/blobs/{MISSING}" not in paths and f"{m}/snapshots/{C1}/gone.bin" not in paths
    # One line says it: the blob, and the snapshot file left out with it.
    (warning,) = warnings
    assert f"{m.replace('models--', 'model ').replace('--', '/')}: 1 blob of 3 not in the store" in warning
    assert f"({C1}/gone.bin)" in warning and f"first missing: blob {MISSING}" in warning, warning


def test_collisions_keep_the_first_and_inodes_stay_dense() -> None:
    rev = Revision({"a": SHA, "a/b": SHA1}, ("a",))
    cat = Catalogue((Repo("model", "x", {"main": C1}, {SHA: content(A), SHA1: content(B)}, {C1: rev}),))
    tree, warnings = build_hub_tree(make_index(A, B), cat)
    paths = check_invariants(tree)
    assert paths[f"models--x/snapshots/{C1}/a"].kind is Kind.SYMLINK
    assert warnings == [f"catalogue: model x: snapshots/{C1}/a/b: 'a' is a file; left out"]


def test_verify_says_a_repos_missing_blobs_in_one_line() -> None:
    """One blob whose file the store lacks is named; many (a skipped shard's) are one line, with the first."""

    def missing(*files: FileEntry) -> list[str]:
        return [p for p in audit_catalogue(catalogue(), make_index(*files)) if "not in the store" in p]

    assert missing(A, B, T) == [f"catalogue: model org/name: blob {MISSING}: file {'f' * 64} "
                                f"(snapshots/{C1}/gone.bin) is not in the store"]  # fmt: skip
    problems = missing(B, T)  # A's blob is gone too
    assert problems == [f"catalogue: model org/name: the files of 2 blobs of 3 are not in the store; the first: "
                        f"blob {SHA}: file {hashes.to_hex(A.file_hash)} (snapshots/{C1}/model.safetensors, and 1 "
                        f"more)"], problems  # fmt: skip


def test_a_blob_is_found_by_the_snapshot_path_that_names_it() -> None:
    """For messages: a program opens a snapshot path, the kernel resolves the symlink, and the daemon sees
    only the blob; ``link_to`` gives a name the program used back."""
    tree, _ = build_hub_tree(make_index(A, B, T), catalogue())
    m = "models--org--name"
    snapshots = {f"{m}/snapshots/{c}/model.safetensors" for c in (C1, C2)}
    assert tree.link_to(f"{m}/blobs/{SHA}") in snapshots
    assert tree.link_to(f"{m}/blobs/{SHA1}") == f"{m}/snapshots/{C1}/sub/deep/config.json"
    assert tree.link_to(f"datasets--solo/blobs/{SHA1}") == f"datasets--solo/snapshots/{C1}/train.csv"
    assert tree.link_to(f"{m}/trees/{C1}.json") is None  # (no symlink names it)
