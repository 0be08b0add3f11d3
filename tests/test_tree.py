"""The filesystem model: layout, lookups, listings, inodes and link counts."""

from __future__ import annotations

import hashlib
import json
import random
import time
import tracemalloc

import pytest
from helpers.oracle import OracleStore
from helpers.trees import check_invariants, entry, make_index, resolve, walk

from xetfs.base import hashes
from xetfs.names.tree import (
    BY_HASH_INODE,
    BY_SHA256_INODE,
    FIRST_FILE_INODE,
    ROOT_INODE,
    STATS_INODE,
    XETFS_INODE,
    Kind,
    Node,
    Tree,
    build_tree,
)
from xetfs.storage.index import FileEntry, Index
from xetfs.storage.indexer import load_index
from xetfs.storage.manifest import Manifest, ManifestFile, parse_manifest
from xetfs.storage.store import Store

pytestmark = pytest.mark.unit


def mfile(path: str, e: FileEntry, size: int | None = None, sha256: str | None = None) -> ManifestFile:
    return ManifestFile(tuple(path.split("/")), e.file_hash, size, sha256)


def manifest(*files: ManifestFile, dirs: tuple[tuple[str, ...], ...] = ()) -> Manifest:
    return Manifest(files, dirs, ())


def listing(tree: Tree, inode: int) -> list[bytes]:
    return [name for name, _ in tree.children(inode)]


A, B, C = entry(1, 100), entry(2, 200), entry(3, 0, sha256=None)


# -- without a manifest --------------------------------------------------------


def test_without_manifest_files_are_named_by_hash() -> None:
    tree, warnings = build_tree(make_index(A, B, C), None)
    assert warnings == []
    assert listing(tree, ROOT_INODE) == sorted(e.hex.encode() for e in (A, B, C))
    for e in (A, B, C):
        node = tree.lookup(ROOT_INODE, e.hex.encode())
        assert node is not None and node.kind is Kind.FILE and node.entry is e
        assert node.nlink == 1  # the names in .xetfs are not counted
    check_invariants(tree)


def test_xetfs_layout() -> None:
    tree, _ = build_tree(make_index(A, B, C), None)
    xetfs = tree.lookup(ROOT_INODE, b".xetfs")
    assert xetfs == Node(XETFS_INODE, Kind.DIR, None, 4)
    assert listing(tree, XETFS_INODE) == [b"by-hash", b"by-sha256", b"stats"]
    assert tree.lookup(XETFS_INODE, b"stats") == Node(STATS_INODE, Kind.STATS, None, 1)
    assert listing(tree, BY_HASH_INODE) == sorted(e.hex.encode() for e in (A, B, C))
    assert listing(tree, BY_SHA256_INODE) == sorted(e.sha256.encode() for e in (A, B) if e.sha256)
    by_sha = tree.lookup(BY_SHA256_INODE, (A.sha256 or "").encode())
    assert by_sha is not None and by_sha.entry is A
    assert by_sha == tree.lookup(BY_HASH_INODE, A.hex.encode()) == tree.lookup(ROOT_INODE, A.hex.encode())
    assert tree.parent_of(BY_HASH_INODE) == XETFS_INODE
    assert tree.parent_of(XETFS_INODE) == ROOT_INODE
    assert tree.parent_of(ROOT_INODE) == ROOT_INODE


def test_an_empty_index() -> None:
    tree, warnings = build_tree(Index(), None)
    assert warnings == [] and listing(tree, ROOT_INODE) == []
    assert tree.lookup(ROOT_INODE, b".xetfs") == Node(XETFS_INODE, Kind.DIR, None, 4)
    assert tree.files == 0 and tree.dirs == 4 and tree.inode_count == 5
    check_invariants(tree)


def test_equal_sha256_first_file_in_inode_order_wins() -> None:
    sha = hashlib.sha256(b"same").hexdigest()
    x, y = entry(10, sha256=sha), entry(11, sha256=sha)
    tree, _ = build_tree(make_index(x, y), None)
    assert listing(tree, BY_SHA256_INODE) == [sha.encode()]
    first = min((x, y), key=lambda e: e.file_hash)
    node = tree.lookup(BY_SHA256_INODE, sha.encode())
    assert node is not None and node.entry is first and node.nlink == 1
    check_invariants(tree)


# -- with a manifest -----------------------------------------------------------


def test_named_tree() -> None:
    m = manifest(
        mfile("models/a.bin", A),
        mfile("models/sub/b.bin", B),
        mfile("README", C),
        dirs=(("empty",), ("models", "sub")),
    )
    tree, warnings = build_tree(make_index(A, B, C), m)
    assert warnings == []
    assert listing(tree, ROOT_INODE) == [b"README", b"empty", b"models"]
    node = resolve(tree, "models/sub/b.bin")
    assert node is not None and node.entry is B and node.kind is Kind.FILE
    empty = resolve(tree, "empty")
    assert empty is not None and empty.kind is Kind.DIR and tree.children(empty.inode) == []
    models = resolve(tree, "models")
    assert models is not None and models.nlink == 3
    root = tree.get(ROOT_INODE)
    assert root == Node(ROOT_INODE, Kind.DIR, None, 2 + 2)  # empty, models (the hidden .xetfs is not counted)
    assert tree.files == 3
    paths = check_invariants(tree)
    assert {p for p in paths if not p.startswith(".xetfs")} == {
        "README",
        "empty",
        "models",
        "models/a.bin",
        "models/sub",
        "models/sub/b.bin",
    }


def test_children_are_sorted_by_bytes() -> None:
    names = ["b", "B", "a", "ä", "a.txt", "a-b", "Z", "日本", "~", "a b"]
    m = manifest(*(mfile(n, A) for n in names))
    tree, _ = build_tree(make_index(A), m)
    expected = sorted(n.encode() for n in names)
    assert listing(tree, ROOT_INODE) == expected
    assert [name for name, _ in tree.iter_children(ROOT_INODE, 3)] == expected[3:]
    assert list(tree.iter_children(ROOT_INODE, len(expected))) == []
    assert tree.num_children(ROOT_INODE) == len(expected)


def test_hard_links_share_one_inode() -> None:
    m = manifest(mfile("a", A), mfile("dir/also-a", A), mfile("dir/again", A), mfile("b", B))
    tree, _ = build_tree(make_index(A, B), m)
    nodes = [resolve(tree, p) for p in ("a", "dir/also-a", "dir/again")]
    nodes += [tree.lookup(BY_HASH_INODE, A.hex.encode()), tree.lookup(BY_SHA256_INODE, (A.sha256 or "").encode())]
    assert len({n.inode for n in nodes if n}) == 1
    assert all(n is not None and n.nlink == 3 for n in nodes)  # the three names outside .xetfs
    b = resolve(tree, "b")
    assert b is not None and b.nlink == 1
    check_invariants(tree)


def test_unicode_names() -> None:
    nfc, nfd = "caf\u00e9", "cafe\u0301"
    listing_json = [{"path": nfc, "xetHash": A.hex}, {"path": f"{nfd}/日本.bin", "xetHash": B.hex}]
    m = parse_manifest(json.dumps(listing_json).encode(), source="m")
    tree, _ = build_tree(make_index(A, B), m)
    a = tree.lookup(ROOT_INODE, nfc.encode())
    assert a is not None and a.entry is A
    b = resolve(tree, f"{nfd}/日本.bin")
    assert b is not None and b.entry is B
    assert tree.lookup(ROOT_INODE, b"cafe") is None


def test_unknown_hash_is_skipped_with_a_warning() -> None:
    m = manifest(mfile("here", A), mfile("d/gone", B))
    tree, warnings = build_tree(make_index(A), m)
    assert resolve(tree, "d/gone") is None
    assert resolve(tree, "d") is None  # no directory is made for a skipped file
    assert len(warnings) == 1 and "'d/gone'" in warnings[0] and B.hex in warnings[0]


def test_a_directory_whose_files_the_store_lacks_goes_with_them() -> None:
    """pack records every directory; one left with none of its named files (a bad shard's) is left out, unless
    something else is in it, and one that was empty when packed stays."""
    m = manifest(
        mfile("gone/a", B), mfile("gone/deep/b", B), mfile("half/a", A), mfile("half/b", B), mfile("sub/x/a", B),
        dirs=(("gone",), ("gone", "deep"), ("half",), ("empty",), ("sub",), ("sub", "x"), ("sub", "kept")),
    )  # fmt: skip
    tree, warnings = build_tree(make_index(A), m)
    assert listing(tree, ROOT_INODE) == [b"empty", b"half", b"sub"]
    assert resolve(tree, "half/a") is not None and resolve(tree, "half/b") is None
    sub = resolve(tree, "sub")
    assert sub is not None and listing(tree, sub.inode) == [b"kept"]  # (an empty directory of the source stays)
    assert warnings == [f"manifest: 4 of the 5 files named are not in the store (a bad or lost shard's?); the first: "
                        f"'gone/a' (file {B.hex}): left out"]  # fmt: skip


def test_store_size_wins_over_the_manifest() -> None:
    tree, warnings = build_tree(make_index(A), manifest(mfile("a", A, size=99), mfile("b", A, size=A.size)))
    node = resolve(tree, "a")
    assert node is not None and node.entry is A
    assert len(warnings) == 1 and "'a'" in warnings[0] and "99" in warnings[0] and str(A.size) in warnings[0]


def test_sha256_disagreement_is_reported() -> None:
    _, warnings = build_tree(make_index(A), manifest(mfile("a", A, sha256="0" * 64)))
    assert len(warnings) == 1 and "sha256" in warnings[0] and (A.sha256 or "") in warnings[0]


def test_manifest_entries_under_xetfs_are_dropped() -> None:
    m = manifest(mfile(".xetfs/by-hash/x", A), mfile(".xetfs", B), mfile("ok", A), dirs=((".xetfs", "d"),))
    tree, warnings = build_tree(make_index(A, B), m)
    assert listing(tree, XETFS_INODE) == [b"by-hash", b"by-sha256", b"stats"]
    assert listing(tree, ROOT_INODE) == [b"ok"]
    assert len(warnings) == 1 and "3 entries" in warnings[0] and ".xetfs" in warnings[0]
    check_invariants(tree)


def test_conflicts_in_a_hand_made_manifest_are_skipped() -> None:
    m = manifest(mfile("a", A), mfile("a/b", B), mfile("c", A), mfile("c", B), mfile("c", A))
    tree, warnings = build_tree(make_index(A, B), m)
    a, c = resolve(tree, "a"), resolve(tree, "c")
    assert a is not None and a.entry is A and c is not None and c.entry is A
    assert len(warnings) == 2
    check_invariants(tree)


def test_lookup_misses_return_none() -> None:
    tree, _ = build_tree(make_index(A), manifest(mfile("d/a", A)))
    a = resolve(tree, "d/a")
    assert a is not None
    assert tree.lookup(ROOT_INODE, b"nope") is None
    assert tree.lookup(ROOT_INODE, b"") is None
    assert tree.lookup(a.inode, b"x") is None  # a file is no directory
    assert tree.lookup(10**9, b"d") is None
    assert tree.lookup(BY_HASH_INODE, A.hex.upper().encode()) is None
    assert tree.get(0) is None and tree.get(10**9) is None and tree.get(-1) is None
    assert tree.children(a.inode) == [] and tree.children(10**9) == []
    with pytest.raises(KeyError):
        tree.parent_of(a.inode)


def test_dot_and_dotdot() -> None:
    tree, _ = build_tree(make_index(A), manifest(mfile("d/e/a", A)))
    e = resolve(tree, "d/e")
    d = resolve(tree, "d")
    assert e is not None and d is not None
    assert tree.lookup(e.inode, b".") == e
    assert tree.lookup(e.inode, b"..") == d
    assert tree.lookup(ROOT_INODE, b"..") == tree.get(ROOT_INODE)
    assert b"." not in listing(tree, e.inode) and b".." not in listing(tree, e.inode)


# -- stability -----------------------------------------------------------------


def test_inodes_are_stable_across_builds() -> None:
    entries = [entry(i, i) for i in range(50)]
    files = [mfile(f"d{i % 7}/s{i % 3}/f{i}", e) for i, e in enumerate(entries)]
    files += [mfile(f"links/l{i}", e) for i, e in enumerate(entries[:10])]
    dirs = (("x", "y"), ("d1", "new"))
    first, _ = build_tree(make_index(*entries), manifest(*files, dirs=dirs))
    rng = random.Random(4)
    rng.shuffle(entries)
    rng.shuffle(files)
    second, _ = build_tree(make_index(*entries), manifest(*files, dirs=dirs[::-1]))
    assert {p: n.inode for p, n in walk(first).items()} == {p: n.inode for p, n in walk(second).items()}
    check_invariants(second)


def test_file_inodes_do_not_depend_on_the_manifest() -> None:
    index = make_index(A, B, C)
    plain, _ = build_tree(index, None)
    named, _ = build_tree(index, manifest(mfile("z/y/x", B), dirs=(("q",),)))
    for e in (A, B, C):
        p, n = plain.lookup(BY_HASH_INODE, e.hex.encode()), named.lookup(BY_HASH_INODE, e.hex.encode())
        assert p is not None and n is not None and p.inode == n.inode
        assert FIRST_FILE_INODE <= p.inode < FIRST_FILE_INODE + 3


# -- scale ---------------------------------------------------------------------

N = 100_000


def test_a_hundred_thousand_files_are_cheap() -> None:
    entries = [entry(i, i) for i in range(N)]
    index = make_index(*entries)
    m = manifest(*(mfile(f"d{i % 300:03d}/sub/file-{i:06d}.bin", e) for i, e in enumerate(entries)))
    tracemalloc.start()
    try:
        started = time.perf_counter()
        tree, warnings = build_tree(index, m)
        elapsed = time.perf_counter() - started
        kept, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert warnings == [] and tree.files == N
    assert kept / N < 400, f"{kept / N:.0f} bytes per file"  # about 300 measured
    assert elapsed < 30, f"{elapsed:.1f} s"  # about 1.5 s under tracemalloc; a guard against quadratic work
    node = resolve(tree, "d123/sub/file-000123.bin")
    assert node is not None and node.entry is entries[123] and node.nlink == 1
    assert len(tree.children(BY_HASH_INODE)) == N


# -- a real store --------------------------------------------------------------


def test_tree_of_an_hf_xet_store(basic_store: OracleStore) -> None:
    index = load_index(Store.open(basic_store.path)).index
    tree, warnings = build_tree(index, None)
    assert warnings == []
    for f in basic_store.files:
        node = tree.lookup(ROOT_INODE, f.hash.encode())
        assert node is not None and node.entry is not None
        assert node.entry.size == f.size and hashes.to_hex(node.entry.file_hash) == f.hash
        by_sha = tree.lookup(BY_SHA256_INODE, hashlib.sha256(f.read()).hexdigest().encode())
        assert by_sha == node
    assert tree.files == len(basic_store.unique())
    check_invariants(tree)


def test_name_of_gives_a_path_outside_xetfs() -> None:
    m = manifest(mfile("models/sub/b.bin", B), mfile("models/also-b", B), mfile("日本/c", C))
    tree, _ = build_tree(make_index(A, B, C), m)
    b = resolve(tree, "models/sub/b.bin")
    c = resolve(tree, "日本/c")
    assert b is not None and c is not None
    assert tree.name_of(b.inode) in {"models/sub/b.bin", "models/also-b"}
    assert tree.name_of(c.inode) == "日本/c"
    a = tree.lookup(BY_HASH_INODE, A.hex.encode())  # in the store, not in the manifest
    assert a is not None and tree.name_of(a.inode) is None
    assert tree.name_of(STATS_INODE) is None

    by_hash, _ = build_tree(make_index(A), None)
    a = by_hash.lookup(ROOT_INODE, A.hex.encode())
    assert a is not None and by_hash.name_of(a.inode) == A.hex
