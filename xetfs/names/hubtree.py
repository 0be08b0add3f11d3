"""The Hub cache layout of a store with a catalogue: what huggingface_hub would have written.  No FUSE.

For every repo of the catalogue, at the root::

    models--org--name/blobs/<blob name>              the file (a hard link per repo of the store file)
    models--org--name/refs/<ref>                     the commit, 40 hex digits, no newline
    models--org--name/snapshots/<commit>/<path>      symlink ../../blobs/<blob name> (one ../ more per directory)
    models--org--name/.no_exist/<commit>/<path>      empty file
    models--org--name/trees/<commit>.json            the tree listing, when it was imported

plus ``.xetfs/`` as in every layout.  A blob whose Xet file the store lacks
is left out with a warning, and so are the snapshot entries that need it;
names that collide (a path that is a file in one place and a directory in
another) keep the first and warn about the rest.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from xetfs.base.messages import plural
from xetfs.names.stabletree import TreeLike
from xetfs.names.tree import Kind, Pending, Tree, TreeBuilder
from xetfs.storage.catalogue import Catalogue, Repo
from xetfs.storage.index import Index
from xetfs.storage.manifest import WarningLog

_EMPTY = b""


def build_hub_tree(index: Index, catalogue: Catalogue) -> tuple[Tree, list[str]]:
    """The Hub cache layout of ``catalogue`` over the files of ``index``, and warnings about what was left out."""
    builder = TreeBuilder(index)
    root: Pending = {}
    for repo in catalogue.repos:
        root[repo.folder.encode()] = _repo(repo, builder)
    return builder.finish(root)


def _repo(repo: Repo, builder: TreeBuilder) -> Pending:
    log = builder.log
    where = f"catalogue: {repo.type} {repo.id}"
    folder: Pending = {b"blobs": {}, b"refs": {}, b"snapshots": {}}
    present: set[str] = set()
    missing: list[str] = []  # blobs whose file the store lacks (a skipped shard's files, say)
    for name, content in repo.blobs.items():
        inode = builder.by_hash.get(content.xet_hash.encode())
        if inode is None:
            missing.append(f"blob {name} (file {content.xet_hash})")
            continue
        entry = builder.entries[inode - builder.first_file_inode]
        if entry.size != content.size:
            log.add("size", f"{where}: blob {name}: {content.size} bytes in the catalogue, {entry.size} in the store")
        _place(folder, ("blobs", name), functools.partial(builder.link, inode), where, log)
        present.add(name)
        if content.mtime_ns is not None:  # (the latest, when several blobs name one file: as a manifest's names)
            i = inode - builder.first_file_inode
            builder.mtimes[i] = max(builder.mtimes[i], content.mtime_ns)
    for ref, commit in repo.refs.items():
        ref_file = functools.partial(builder.add, Kind.DATA, commit.encode())
        _place(folder, ("refs", *ref.split("/")), ref_file, where, log)
    lost: list[str] = []  # snapshot files whose blob is missing
    for commit, rev in repo.revisions.items():
        for path, blob in rev.files.items():
            if blob not in present:
                lost.append(f"{commit}/{path}")
                continue
            parts = tuple(path.split("/"))
            target = "../" * (len(parts) + 1) + "blobs/" + blob
            link = functools.partial(builder.add, Kind.SYMLINK, target.encode())
            _place(folder, ("snapshots", commit, *parts), link, where, log)
        for path in rev.no_exist:
            marker = functools.partial(builder.add, Kind.DATA, _EMPTY)
            _place(folder, (".no_exist", commit, *path.split("/")), marker, where, log)
        if rev.tree is not None:
            inode = builder.by_hash.get(rev.tree.xet_hash.encode())
            if inode is None:
                log.add("missing", f"{where}: trees/{commit}.json (file {rev.tree.xet_hash}) is not in the store")
            else:
                _place(folder, ("trees", f"{commit}.json"), functools.partial(builder.link, inode), where, log)
    if missing:
        # One line for the repo: a shard skipped takes thousands of files with it, and one cause is one line.
        what = f"{plural(len(missing), 'blob')} of {len(repo.blobs)} not in the store"
        if lost:
            files = f"left out with the {plural(len(lost), 'snapshot file')} naming them ({lost[0]}"
            files += ", ...)" if len(lost) > 1 else ")"
        else:
            files = "left out (no snapshot file names them)"
        log.add("missing", f"{where}: {what}, {files}; first missing: {missing[0]}")
    return folder


def _place(top: Pending, parts: tuple[str, ...], make: Callable[[], int], where: str, log: WarningLog) -> None:
    """Name the inode ``make()`` gives ``parts`` below ``top``, making directories.

    When something is in the way: a warning, and ``make`` is not called (inodes stay dense).
    """
    node = top
    for part in parts[:-1]:
        child = node.setdefault(part.encode(), {})
        if not isinstance(child, dict):
            log.add("conflict", f"{where}: {'/'.join(parts)}: {part!r} is a file; left out")
            return
        node = child
    name = parts[-1].encode()
    if name in node:
        log.add("conflict", f"{where}: {'/'.join(parts)}: the name is taken; left out")
        return
    node[name] = make()


def opened_as(tree: TreeLike, name: str) -> str:
    """``name``, and for a Hub blob the snapshot path that names it: what a program opened, for messages (the
    kernel resolves the symlink before the daemon sees the read)."""
    link = tree.link_to(name) if "/blobs/" in name else None
    return f"{link} (blob {name.rpartition('/')[2]})" if link else name
