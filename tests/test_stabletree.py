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
