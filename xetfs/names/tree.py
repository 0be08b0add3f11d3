"""The filesystem model: names, inodes and link counts.  No FUSE, no errno.

Layout::

    /                       the manifest's named tree, or (without a manifest)
                            every file of the store named by its xet hex hash,
                            or the Hub cache layout of a catalogue (hubtree.py,
                            with symlinks and small data files)
    /.xetfs/                hidden: found by name, never listed in the root
    /.xetfs/by-hash/<xet hex>        every file of the store
    /.xetfs/by-sha256/<sha256 hex>   every file whose shard records a SHA-256
    /.xetfs/stats                    the live statistics (``Kind.STATS``)

Contract:

* One inode per distinct file: every name of a file is a hard link to it.
  ``nlink`` counts only the names outside ``/.xetfs`` (at least 1), so tools
  that walk the tree (``tar``, ``cp -a``, ``rsync -H``, ``du``) see the links
  of the named tree alone, as they would without the hidden directory.  A
  directory's ``nlink`` is 2 + its listed subdirectories.
* ``/.xetfs`` is like ZFS's ``.zfs`` under ``snapdir=hidden``: ``lookup``
  finds it, ``iter_children`` of the root does not list it.
* A file's modification time is the latest ``mtime`` its manifest names
  give it, or None (the mount shows the store's).
* Inodes are dense and deterministic, so they survive a remount of the same
  store and manifest: the fixed inodes below, then the files in the order
  they were packed (by the xorb and chunk where each starts, then its hash;
  independent of the manifest), then the manifest's directories in sorted
  path order.
* Names are bytes (the UTF-8 form of the manifest's text); each directory
  keeps them sorted, so ``lookup`` is a bisection and listings come in
  name order.  Per file the model holds its names and one link count: about
  three hundred bytes with a manifest.
* A ``Tree`` is immutable once built; any thread may read it.
"""

from __future__ import annotations

import enum
import posixpath
from array import array
from bisect import bisect_left
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from xetfs.base.messages import plural
from xetfs.storage.index import FileEntry, Index
from xetfs.storage.manifest import Manifest, ManifestFile, WarningLog, not_in_store

ROOT_INODE = 1  # == pyfuse3.ROOT_INODE
XETFS_INODE = 2
BY_HASH_INODE = 3
BY_SHA256_INODE = 4
STATS_INODE = 5
FIRST_FILE_INODE = 6

XETFS_NAME = ".xetfs"
BY_HASH_NAME = "by-hash"
BY_SHA256_NAME = "by-sha256"
STATS_NAME = "stats"
_XETFS_BYTES = XETFS_NAME.encode()


class Kind(enum.Enum):
    DIR = "dir"
    FILE = "file"  # a file of the store (``entry``)
    STATS = "stats"
    SYMLINK = "symlink"  # ``data`` is the target
    DATA = "data"  # a small file whose bytes are ``data`` (a Hub ref, a ``.no_exist`` marker)


@dataclass(frozen=True, slots=True)
class Node:
    """What an inode is.  ``entry`` is set for ``Kind.FILE`` nodes only, ``data`` for symlinks and data files."""

    inode: int
    kind: Kind
    entry: FileEntry | None
    nlink: int
    mtime_ns: int | None = None  # a file's own modification time, when its names give one
    data: bytes = b""  # a symlink's target, a data file's bytes


@dataclass(frozen=True, slots=True)
class _Dir:
    """A directory: ``names`` sorted, ``inodes[i]`` is the inode named ``names[i]``."""

    parent: int
    names: list[bytes]
    inodes: array[int]
    nlink: int


_STATS_NODE = Node(STATS_INODE, Kind.STATS, None, 1)
_NO_MTIME = -1  # in ``Tree._mtimes``: the manifest gives none


class Tree:
    """The immutable name tree of one mount.  Build it with ``build_tree``."""

    def __init__(
        self,
        entries: list[FileEntry],
        nlinks: array[int],
        dirs: dict[int, _Dir],
        mtimes: array[int] | None = None,
        extras: list[Node] | None = None,
    ) -> None:
        """``entries[i]`` has inode ``FIRST_FILE_INODE + i``, ``nlinks[i]`` names and mtime ``mtimes[i]`` (ns).

        ``extras`` are symlinks and data files, with the inodes right after the files'.
        """
        self._entries = entries
        self._nlinks = nlinks
        self._dirs = dirs
        self._mtimes = mtimes if mtimes is not None else array("q", [_NO_MTIME]) * len(entries)
        self._extras = extras or []

    def get(self, inode: int) -> Node | None:
        """The node of ``inode``, or None when there is no such inode."""
        d = self._dirs.get(inode)
        if d is not None:
            return Node(inode, Kind.DIR, None, d.nlink)
        i = inode - FIRST_FILE_INODE
        if 0 <= i < len(self._entries):
            mtime = self._mtimes[i]
            return Node(inode, Kind.FILE, self._entries[i], self._nlinks[i], None if mtime == _NO_MTIME else mtime)
        if inode == STATS_INODE:
            return _STATS_NODE
        k = i - len(self._entries)
        if 0 <= k < len(self._extras):
            return self._extras[k]
        return None

    def lookup(self, parent: int, name: bytes) -> Node | None:
        """The node named ``name`` in directory ``parent``; None when absent or ``parent`` is no directory.

        ``.`` and ``..`` resolve to the directory and its parent; ``.xetfs`` in
        the root to the hidden directory.
        """
        d = self._dirs.get(parent)
        if d is None:
            return None
        if name == b".":
            return self.get(parent)
        if name == b"..":
            return self.get(d.parent)
        if parent == ROOT_INODE and name == _XETFS_BYTES:
            return self.get(XETFS_INODE)
        i = bisect_left(d.names, name)
        if i < len(d.names) and d.names[i] == name:
            return self.get(d.inodes[i])
        return None

    def iter_children(self, parent: int, start: int = 0) -> Iterator[tuple[bytes, Node]]:
        """``(name, node)`` for the entries of ``parent`` from position ``start`` on, in name order.

        Positions are stable (the tree never changes), so ``start`` can serve
        as a readdir offset.  Nothing for a non-directory; no ``.``/``..``,
        and no hidden ``.xetfs`` in the root.
        """
        d = self._dirs.get(parent)
        if d is None:
            return
        for i in range(max(start, 0), len(d.names)):
            node = self.get(d.inodes[i])
            assert node is not None  # every inode in a directory was built with the tree
            yield d.names[i], node

    def children(self, parent: int) -> list[tuple[bytes, Node]]:
        """All entries of directory ``parent`` sorted by name; ``[]`` for a non-directory."""
        return list(self.iter_children(parent))

    def num_children(self, parent: int) -> int:
        """How many entries ``parent`` lists (0 for a non-directory)."""
        d = self._dirs.get(parent)
        return 0 if d is None else len(d.names)

    def parent_of(self, inode: int) -> int:
        """The parent of directory ``inode`` (the root is its own parent).

        Raises ``KeyError`` when ``inode`` is not a directory: a file may have
        several parents.
        """
        return self._dirs[inode].parent

    def is_dir(self, inode: int) -> bool:
        return inode in self._dirs

    def name_of(self, inode: int) -> str | None:
        """One path of ``inode`` outside ``/.xetfs`` (``a/b/c``), or None if it has none.

        A scan of every directory: meant for messages about a file, not for
        the read path.  With several names, the first directory built wins.
        """
        for dir_inode, d in self._dirs.items():
            if dir_inode in (XETFS_INODE, BY_HASH_INODE, BY_SHA256_INODE) or inode not in d.inodes:
                continue
            parts = [d.names[d.inodes.index(inode)]]
            while dir_inode != ROOT_INODE:
                parent = self._dirs[d.parent]
                parts.append(parent.names[parent.inodes.index(dir_inode)])
                dir_inode, d = d.parent, parent
            return b"/".join(reversed(parts)).decode("utf-8", "replace")
        return None

    def link_to(self, path: str) -> str | None:
        """One path of a symlink that points at ``path`` (``a/blobs/x``), or None: the name a program opened a Hub
        blob by (``a/snapshots/<commit>/model.safetensors``), which the kernel resolved before the daemon saw it.
        A scan, for messages, as ``name_of``."""
        base = path.rpartition("/")[2]
        for node in self._extras:
            if node.kind is not Kind.SYMLINK or not node.data.endswith(b"/" + base.encode()):
                continue
            link = self.name_of(node.inode)
            target = posixpath.normpath(posixpath.join(posixpath.dirname(link or ""), node.data.decode()))
            if link is not None and target == path:
                return link
        return None

    @property
    def files(self) -> int:
        """Number of file inodes (one per file of the store)."""
        return len(self._entries)

    @property
    def dirs(self) -> int:
        """Number of directory inodes, the root and ``.xetfs`` included."""
        return len(self._dirs)

    @property
    def inode_count(self) -> int:
        """Number of inodes: directories, files, symlinks, data files and the stats file."""
        return len(self._dirs) + len(self._entries) + len(self._extras) + 1


# -- building ------------------------------------------------------------------

# A directory under construction: name -> subdirectory or inode of a leaf.
_Pending = dict[bytes, "_Pending | int"]
Pending = _Pending  # for layouts built elsewhere (hubtree.py)


def build_tree(index: Index, manifest: Manifest | None) -> tuple[Tree, list[str]]:
    """The tree of ``index`` named by ``manifest`` (or by hash), and warnings about skipped names.

    Manifest files whose hash the store lacks, names under a top-level
    ``.xetfs`` and name conflicts are skipped with a warning; a manifest size
    or SHA-256 that disagrees with the store is reported (the store wins).
    """
    builder = TreeBuilder(index)
    if manifest is None:
        named: _Pending = {}
        for name, inode in builder.by_hash.items():
            named[name] = builder.link(inode)
    else:
        named = _named(manifest, builder.entries, builder.nlinks, builder.mtimes, builder.log)
    return builder.finish(named)


class TreeBuilder:
    """The parts every layout shares: file inodes, the hidden ``.xetfs/``, link counts, mtimes, warnings.

    A layout builds a pending tree of names whose leaves are inodes from
    ``link`` (a store file) or ``add`` (a symlink or data file), then calls
    ``finish`` once.
    """

    def __init__(self, index: Index) -> None:
        self.entries = sorted(index, key=_pack_order(index))
        self.nlinks = array("I", [0]) * len(self.entries)
        self.mtimes = array("q", [_NO_MTIME]) * len(self.entries)
        self.by_hash, self.by_sha256 = _hash_names(self.entries)
        self.log = WarningLog()
        self.first_file_inode = FIRST_FILE_INODE
        self._extras: list[Node] = []

    def link(self, inode: int) -> int:
        """Count one more name of file ``inode`` (from ``by_hash``); returns ``inode``."""
        self.nlinks[inode - FIRST_FILE_INODE] += 1
        return inode

    def add(self, kind: Kind, data: bytes) -> int:
        """A new symlink (``data`` its target) or data file; returns its inode."""
        inode = FIRST_FILE_INODE + len(self.entries) + len(self._extras)
        self._extras.append(Node(inode, kind, None, 1, data=data))
        return inode

    def finish(self, named: _Pending) -> tuple[Tree, list[str]]:
        """The tree with ``named`` at the root (``.xetfs/`` is found there by name), and the warnings."""
        for i, n in enumerate(self.nlinks):
            if n == 0:  # only in .xetfs, which is not counted: still one link
                self.nlinks[i] = 1
        dirs: dict[int, _Dir] = {
            XETFS_INODE: _freeze_leaves(
                ROOT_INODE,
                {
                    BY_HASH_NAME.encode(): BY_HASH_INODE,
                    BY_SHA256_NAME.encode(): BY_SHA256_INODE,
                    STATS_NAME.encode(): STATS_INODE,
                },
                subdirs=2,
            ),
            BY_HASH_INODE: _freeze_leaves(XETFS_INODE, self.by_hash),
            BY_SHA256_INODE: _freeze_leaves(XETFS_INODE, self.by_sha256),
        }
        _freeze_tree(named, dirs, first_inode=FIRST_FILE_INODE + len(self.entries) + len(self._extras))
        return Tree(self.entries, self.nlinks, dirs, self.mtimes, self._extras), self.log.lines()


def _pack_order(index: Index) -> Callable[[FileEntry], tuple[bytes, int, bytes]]:
    """The key that orders files by where their first chunk lies (its xorb, the chunk), then their hash: files
    numbered in this order are read in the order they were packed by tools that read a directory in inode
    order (``cp -r``), so that a read's read-ahead serves the next small files (``read.readahead``)."""
    xorbs = index.xorbs

    def key(e: FileEntry) -> tuple[bytes, int, bytes]:
        return (xorbs[e.xorb_ids[0]], e.starts[0], e.file_hash) if e.ends else (b"", 0, e.file_hash)

    return key


def _hash_names(entries: list[FileEntry]) -> tuple[dict[bytes, int], dict[bytes, int]]:
    """The entries of ``by-hash`` and ``by-sha256`` (links that ``nlink`` does not count)."""
    by_hash: dict[bytes, int] = {}
    by_sha256: dict[bytes, int] = {}
    for i, entry in enumerate(entries):
        by_hash[entry.hex.encode()] = FIRST_FILE_INODE + i
        sha = None if entry.sha256 is None else entry.sha256.encode()
        if sha is not None and sha not in by_sha256:  # equal SHA-256s: the first file in inode order wins
            by_sha256[sha] = FIRST_FILE_INODE + i
    return by_hash, by_sha256


def _freeze_leaves(parent: int, leaves: dict[bytes, int], subdirs: int = 0) -> _Dir:
    """A directory whose entries all have inodes already (``subdirs`` of them directories)."""
    names = sorted(leaves)
    return _Dir(parent, names, array("Q", map(leaves.__getitem__, names)), 2 + subdirs)


def _freeze_tree(root: _Pending, dirs: dict[int, _Dir], first_inode: int) -> None:
    """Give every pending directory under ``root`` an inode (sorted, depth first) and add it to ``dirs``.

    Leaves that are inodes of directories already in ``dirs`` count as subdirectories.
    """
    next_inode = first_inode
    stack: list[tuple[int, int, _Pending]] = [(ROOT_INODE, ROOT_INODE, root)]
    while stack:
        inode, parent, pending = stack.pop()
        names = sorted(pending)
        inodes = array("Q")
        subdirs = 0
        below: list[tuple[int, int, _Pending]] = []
        for name in names:
            child = pending[name]
            if isinstance(child, dict):
                child_inode, next_inode = next_inode, next_inode + 1
                below.append((child_inode, inode, child))
            else:
                child_inode = child
            if isinstance(child, dict) or child_inode in dirs:
                subdirs += 1
            inodes.append(child_inode)
        dirs[inode] = _Dir(parent, names, inodes, 2 + subdirs)
        stack.extend(reversed(below))


def _named(
    manifest: Manifest, entries: list[FileEntry], nlinks: array[int], mtimes: array[int], log: WarningLog
) -> _Pending:
    """The manifest's names as a pending tree whose leaves are file inodes.

    Counts links in ``nlinks`` and keeps each file's latest ``mtime`` in ``mtimes``.
    """
    ranks = {entry.file_hash: i for i, entry in enumerate(entries)}
    root: _Pending = {}
    reserved = 0
    missing: list[ManifestFile] = []
    for f in manifest.files:
        if f.path[0] == XETFS_NAME:
            reserved += 1
            continue
        i = ranks.get(f.xet_hash)
        if i is None:
            missing.append(f)
            continue
        _check_claims(f, entries[i], log)
        parent = _descend(root, f.path[:-1], f, log)
        if parent is not None and _link(parent, f, FIRST_FILE_INODE + i, log):
            nlinks[i] += 1
            if f.mtime_ns is not None:
                mtimes[i] = max(mtimes[i], f.mtime_ns)
    # A directory whose named files the store lacks is left out with them, unless something else is in it.
    lost = {f.path[:k] for f in missing for k in range(1, len(f.path))}
    for parts in manifest.directories:
        if parts[0] == XETFS_NAME:
            reserved += 1
        elif parts not in lost or _pending_at(root, parts) is not None:
            _descend(root, parts, "/".join(parts), log)
    if missing:
        log.add("missing", f"manifest: {not_in_store(missing, len(manifest.files))}: left out")
    if reserved:
        skipped = plural(reserved, "entry")
        log.add("reserved", f"manifest: {skipped} under the reserved name {XETFS_NAME!r} skipped")
    return root


def _check_claims(f: ManifestFile, entry: FileEntry, log: WarningLog) -> None:
    if f.size is not None and f.size != entry.size:
        log.add(
            "size",
            f"manifest: {f.name!r}: size {f.size} in the manifest, {entry.size} in the store (using the store's)",
        )
    if f.sha256 is not None and entry.sha256 is not None and f.sha256 != entry.sha256:
        log.add(
            "sha256",
            f"manifest: {f.name!r}: sha256 {f.sha256} in the manifest, {entry.sha256} in the store",
        )


def _descend(root: _Pending, parts: tuple[str, ...], what: ManifestFile | str, log: WarningLog) -> _Pending | None:
    """Directory ``parts`` of the pending tree, created as needed; None if a file is in the way."""
    node = root
    for part in parts:
        child = node.setdefault(part.encode("utf-8"), {})
        if not isinstance(child, dict):
            name = what.name if isinstance(what, ManifestFile) else what
            log.add("conflict", f"manifest: {name!r}: {part!r} is a file in another entry; skipped")
            return None
        node = child
    return node


def _pending_at(root: _Pending, parts: tuple[str, ...]) -> _Pending | int | None:
    """What the pending tree holds at ``parts``, or None."""
    node: _Pending | int | None = root
    for part in parts:
        node = node.get(part.encode("utf-8")) if isinstance(node, dict) else None
    return node


def _link(parent: _Pending, f: ManifestFile, inode: int, log: WarningLog) -> bool:
    """Name ``inode`` ``f.path[-1]`` in ``parent``; False (with a warning) if the name is taken."""
    name = f.path[-1].encode("utf-8")
    existing = parent.get(name)
    if existing is None:
        parent[name] = inode
        return True
    if existing == inode:
        return False  # the same name twice: one link
    log.add("conflict", f"manifest: {f.name!r}: the name is taken by another entry; skipped")
    return False
