"""stabletree.renumber: a tree built again keeps the inode numbers the kernel knows (unit tests, no FUSE)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from helpers.writer import StoreBuilder

from xetfs.base import hashes
from xetfs.format.shard import parse_shard
from xetfs.names.stabletree import renumber
from xetfs.names.tree import ROOT_INODE, build_tree
from xetfs.storage import index
from xetfs.storage.store import Store

pytestmark = pytest.mark.unit


def _index(root: Path) -> index.Index:
    store = Store.open(root)
    return index.build([parse_shard(store.read_shard(f), where=f.name) for f in store.shard_files()])


def test_known_nodes_keep_their_numbers_new_ones_come_after_and_changes_are_named(tmp_path: Path) -> None:
    rng = random.Random(3)
    b = StoreBuilder(tmp_path)
    a_hash, b_hash = b.add_file(rng.randbytes(5000)), b.add_file(rng.randbytes(7000))
    b.finish()
    old, _ = build_tree(_index(tmp_path), None)
    c_hash = b.add_file(rng.randbytes(100))  # a smaller hash may sort before the others: new dense numbers
    b.finish()
    new, _ = build_tree(_index(tmp_path), None)
    stable, changes = renumber(old, new)
    for h in (a_hash, b_hash):
        before = old.lookup(ROOT_INODE, hashes.to_hex(h).encode())
        after = stable.lookup(ROOT_INODE, hashes.to_hex(h).encode())
        assert before is not None and after is not None and after.inode == before.inode
        assert stable.get(before.inode) == after
    added = stable.lookup(ROOT_INODE, hashes.to_hex(c_hash).encode())
    assert added is not None and added.inode > max(n.inode for _, n in old.children(ROOT_INODE))
    assert changes.added == 1
    assert ROOT_INODE in changes.directories  # the root lists one more file: its attributes change
    assert changes.entries == []  # no name was removed or now names another inode
    assert [n for n, _ in stable.children(ROOT_INODE)] == [n for n, _ in new.children(ROOT_INODE)]
    again, more = renumber(stable, new)  # a second refresh with nothing new
    assert more.added == 0 and more.directories == []
    assert again.lookup(ROOT_INODE, hashes.to_hex(c_hash).encode()) == added


def test_link_counts_that_change_are_named_and_a_gone_directory_keeps_a_parent(tmp_path: Path) -> None:
    import json

    from xetfs.storage.manifest import parse_manifest

    rng = random.Random(4)
    b = StoreBuilder(tmp_path)
    a_hash = b.add_file(rng.randbytes(3000))
    b.finish()
    idx = _index(tmp_path)
    entry = idx.get(a_hash)
    assert entry is not None

    def names(*paths: str) -> bytes:
        rows = [{"type": "file", "path": p, "size": entry.size, "xetHash": hashes.to_hex(a_hash)} for p in paths]
        return json.dumps(rows).encode()

    old, _ = build_tree(idx, parse_manifest(names("a/x", "c/z"), source="old"))
    new, _ = build_tree(idx, parse_manifest(names("a/x", "b/y"), source="new"))
    gone_dir = old.lookup(ROOT_INODE, b"c")
    file_before = old.lookup(old.lookup(ROOT_INODE, b"a").inode, b"x")  # type: ignore[union-attr]
    assert gone_dir is not None and file_before is not None
    stable, changes = renumber(old, new)
    file_after = stable.lookup(stable.lookup(ROOT_INODE, b"b").inode, b"y")  # type: ignore[union-attr]
    assert file_after is not None and file_after.inode == file_before.inode  # one file, one inode
    assert stable.lookup(ROOT_INODE, b"c") is None
    assert stable.get(gone_dir.inode) is not None  # an open handle still finds it by number
    assert stable.parent_of(gone_dir.inode) == ROOT_INODE
    assert (ROOT_INODE, b"c") in changes.entries and ROOT_INODE in changes.directories
    once, _ = build_tree(idx, parse_manifest(names("a/x"), source="once"))
    _, more = renumber(once, new)  # the file gains a name: its link count changes
    node = once.lookup(once.lookup(ROOT_INODE, b"a").inode, b"x")  # type: ignore[union-attr]
    assert node is not None and node.inode in more.attributes
