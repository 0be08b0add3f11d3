"""Fake indexes for tests of the filesystem model, and the invariants every tree must keep."""

from __future__ import annotations

import hashlib
from array import array
from collections import Counter

from xetfs.names.tree import ROOT_INODE, XETFS_INODE, Kind, Node, Tree
from xetfs.storage.index import FileEntry, Index

_NO_TERMS = array("I")


_NO_ENDS = array("Q")


def entry(seed: int, size: int = 10, sha256: str | None = "") -> FileEntry:
    """A file of a fake index: hash derived from ``seed``; ``sha256=""`` derives one too."""
    file_hash = hashlib.sha256(b"file %d" % seed).digest()
    if sha256 == "":
        sha256 = hashlib.sha256(b"content %d" % seed).hexdigest()
    return FileEntry(file_hash, size, sha256, _NO_TERMS, _NO_TERMS, _NO_TERMS, _NO_ENDS)


def make_index(*entries: FileEntry) -> Index:
    index = Index()
    for e in entries:
        index.files[e.file_hash] = e
    return index


def resolve(tree: Tree, path: str) -> Node | None:
    node = tree.get(ROOT_INODE)
    for part in path.split("/"):
        if node is None:
            return None
        node = tree.lookup(node.inode, part.encode())
    return node


def walk(tree: Tree) -> dict[str, Node]:
    """Every path of the tree -> its node, checking parents on the way; the hidden ``.xetfs`` too."""
    out: dict[str, Node] = {".xetfs": Node(XETFS_INODE, Kind.DIR, None, 4)}
    stack = [("", ROOT_INODE), (".xetfs/", XETFS_INODE)]
    while stack:
        prefix, inode = stack.pop()
        for name, node in tree.children(inode):
            path = prefix + name.decode()
            out[path] = node
            if node.kind is Kind.DIR:
                assert tree.parent_of(node.inode) == inode
                stack.append((path + "/", node.inode))
    return out


def check_invariants(tree: Tree) -> dict[str, Node]:
    """nlink counts a file's names outside .xetfs (at least 1) and 2 + listed subdirectories of a directory.

    Inodes are dense.
    """
    paths = walk(tree)
    links = Counter(n.inode for p, n in paths.items() if n.kind is not Kind.DIR and not p.startswith(".xetfs/"))
    for node in paths.values():
        if node.kind is Kind.DIR:
            subdirs = sum(1 for _, c in tree.children(node.inode) if c.kind is Kind.DIR)
            assert node.nlink == 2 + subdirs
        else:
            assert node.nlink == max(links[node.inode], 1)
        assert tree.get(node.inode) == node
    root = tree.get(ROOT_INODE)
    assert root is not None and root.nlink == 2 + sum(1 for _, c in tree.children(ROOT_INODE) if c.kind is Kind.DIR)
    inodes = {n.inode for n in paths.values()} | {ROOT_INODE}
    assert inodes == set(range(1, tree.inode_count + 1))
    assert tree.files == len({n.inode for n in paths.values() if n.kind is Kind.FILE})
    assert tree.dirs == 1 + sum(1 for n in paths.values() if n.kind is Kind.DIR)
    return paths
