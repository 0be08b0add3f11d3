"""A tree built again (a refresh of the mount) under the inode numbers the kernel already knows.

``Tree`` numbers its inodes densely from what it holds, so a tree built
again from a store that grew numbers them differently.  The kernel must not
see that: an inode it was handed keeps meaning the same thing while the
mount lives.  ``renumber(old, new)`` gives ``new`` a ``StableTree`` face: a
node keeps its old number when it is the same thing (a file by its content
hash, a directory, symlink or data file by its path); what is new gets
numbers after the highest one in use.  A node that is gone stays reachable
by its number (``getattr`` of an open file, say), never by name.

It also says what the kernel has cached that the change makes wrong
(``Changes``): directories whose entries changed (their attributes, and the
names removed or now naming another inode) and data files and symlinks
whose bytes changed (a ref that moved to another commit).  No FUSE here.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Protocol

from xetfs.names.tree import ROOT_INODE, XETFS_INODE, XETFS_NAME, Kind, Node

Identity = tuple[str, object]  # ("file", hash) or ("path", (kind, (name, ...))): what a node is, across builds


class TreeLike(Protocol):
    """What the FUSE adapter reads of a tree: ``tree.Tree`` or a ``StableTree``."""

    def get(self, inode: int) -> Node | None: ...

    def lookup(self, parent: int, name: bytes) -> Node | None: ...

    def iter_children(self, parent: int, start: int = 0) -> Iterator[tuple[bytes, Node]]: ...

    def children(self, parent: int) -> list[tuple[bytes, Node]]: ...

    def num_children(self, parent: int) -> int: ...

    def parent_of(self, inode: int) -> int: ...

    def is_dir(self, inode: int) -> bool: ...

    def name_of(self, inode: int) -> str | None: ...

    def link_to(self, path: str) -> str | None: ...

    @property
    def files(self) -> int: ...

    @property
    def dirs(self) -> int: ...

    @property
    def inode_count(self) -> int: ...


@dataclass
class Changes:
    """What the kernel may have cached that a new tree makes wrong (inodes as the kernel knows them)."""

    directories: list[int] = field(default_factory=list)  # their entries changed: attributes to forget
    entries: list[tuple[int, bytes]] = field(default_factory=list)  # (directory, name): gone, or another inode
    contents: list[int] = field(default_factory=list)  # data files and symlinks whose bytes changed
    attributes: list[int] = field(default_factory=list)  # other nodes whose attributes changed (link count, mtime)
    added: int = 0  # nodes the new tree has that the old one had not


class StableTree:
    """``inner`` under stable inode numbers: ``outer`` maps them to ``inner``'s, ``inward`` back."""

    def __init__(self, inner: TreeLike, inward: dict[int, int], outer: dict[int, int], gone: dict[int, Node]) -> None:
        self.inner = inner
        self._inward = inward  # stable -> inner
        self._outer = outer  # inner -> stable
        self._gone = gone  # stable numbers of nodes the tree no longer has

    def _out(self, node: Node | None) -> Node | None:
        return None if node is None else replace(node, inode=self._outer[node.inode])

    def get(self, inode: int) -> Node | None:
        inner = self._inward.get(inode)
        if inner is None:
            return self._gone.get(inode)
        return self._out(self.inner.get(inner))

    def lookup(self, parent: int, name: bytes) -> Node | None:
        inner = self._inward.get(parent)
        return None if inner is None else self._out(self.inner.lookup(inner, name))

    def iter_children(self, parent: int, start: int = 0) -> Iterator[tuple[bytes, Node]]:
        inner = self._inward.get(parent)
        if inner is None:
            return
        for name, node in self.inner.iter_children(inner, start):
            yield name, replace(node, inode=self._outer[node.inode])

    def children(self, parent: int) -> list[tuple[bytes, Node]]:
        return list(self.iter_children(parent))

    def num_children(self, parent: int) -> int:
        inner = self._inward.get(parent)
        return 0 if inner is None else self.inner.num_children(inner)

    def parent_of(self, inode: int) -> int:
        inner = self._inward.get(inode)
        if inner is None:  # a directory the tree no longer has, still open: the root is its parent now
            if inode in self._gone:
                return ROOT_INODE
            raise KeyError(inode)
        return self._outer[self.inner.parent_of(inner)]

    def is_dir(self, inode: int) -> bool:
        inner = self._inward.get(inode)
        return inner is not None and self.inner.is_dir(inner)

    def name_of(self, inode: int) -> str | None:
        inner = self._inward.get(inode)
        return None if inner is None else self.inner.name_of(inner)

    def link_to(self, path: str) -> str | None:
        return self.inner.link_to(path)  # (paths, not inodes: the same in both)

    @property
    def files(self) -> int:
        return self.inner.files

    @property
    def dirs(self) -> int:
        return self.inner.dirs

    @property
    def inode_count(self) -> int:
        return self.inner.inode_count

    @property
    def highest(self) -> int:
        """The highest stable number handed out."""
        return max(max(self._inward, default=0), max(self._gone, default=0))


def _walk(tree: TreeLike) -> dict[Identity, tuple[int, Node]]:
    """Every node of ``tree`` by identity, with its inode: from the root, the hidden ``.xetfs`` included."""
    found: dict[Identity, tuple[int, Node]] = {}
    root = tree.get(ROOT_INODE)
    assert root is not None
    found[("path", (Kind.DIR.value, ()))] = (ROOT_INODE, root)
    todo: list[tuple[int, tuple[bytes, ...]]] = [(ROOT_INODE, ())]
    hidden = tree.get(XETFS_INODE)
    if hidden is not None:
        found[("path", (Kind.DIR.value, (XETFS_NAME.encode(),)))] = (XETFS_INODE, hidden)
        todo.append((XETFS_INODE, (XETFS_NAME.encode(),)))
    while todo:
        inode, path = todo.pop()
        for name, node in tree.iter_children(inode):
            here = (*path, name)
            key: Identity = (
                ("file", node.entry.file_hash)
                if node.kind is Kind.FILE and node.entry
                else ("path", (node.kind.value, here))
            )  # (a path that changes kind is another node)
            found.setdefault(key, (node.inode, node))
            if node.kind is Kind.DIR:
                todo.append((node.inode, here))
    return found


def _entries(tree: TreeLike, inode: int) -> dict[bytes, int]:
    return {name: node.inode for name, node in tree.iter_children(inode)}


def renumber(old: TreeLike, new: TreeLike) -> tuple[StableTree, Changes]:
    """``new`` under ``old``'s inode numbers where it holds the same nodes, and what changed for the kernel.

    Two walks of the trees: meant for a refresh, not for the read path.
    """
    before, after = _walk(old), _walk(new)
    inward: dict[int, int] = {}
    outer: dict[int, int] = {}
    highest = max(inode for inode, _ in before.values())
    if isinstance(old, StableTree):
        highest = max(highest, old.highest)
    changes = Changes()
    for key, (inner, node) in after.items():
        known = before.get(key)
        if known is None:
            highest += 1
            stable = highest
            changes.added += 1
        else:
            stable = known[0]
            old_node = known[1]
            if node.kind in (Kind.DATA, Kind.SYMLINK) and node.data != old_node.data:
                changes.contents.append(stable)
            elif (node.nlink, node.mtime_ns) != (old_node.nlink, old_node.mtime_ns):  # (a file named once more, say)
                changes.attributes.append(stable)
        inward[stable], outer[inner] = inner, stable
    gone = {stable: node for key, (stable, node) in before.items() if key not in after and stable not in inward}
    if isinstance(old, StableTree):
        gone.update({k: v for k, v in old._gone.items() if k not in inward})
    stable_tree = StableTree(new, inward, outer, gone)
    for key, (stable, node) in before.items():
        if node.kind is not Kind.DIR or key not in after:
            continue
        was = _entries(old, stable)
        now = {name: outer[inode] for name, inode in _entries(new, inward[stable]).items()}
        if was != now:
            changes.directories.append(stable)
            changes.entries += [(stable, name) for name, inode in was.items() if now.get(name) != inode]
    return stable_tree, changes
