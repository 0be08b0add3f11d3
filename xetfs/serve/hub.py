"""What the Hub API answers about the catalogue's repos: revisions, files, tree listings.  Pure.

Conventions of the Hub that huggingface_hub relies on:

* a revision is a 40-hex commit, a ref of the repo (``main``, ``v1.0``,
  ``refs/pr/1``), or a ref spelled ``refs/heads/<branch>`` or
  ``refs/tags/<tag>``;
* a blob named by a sha256 is an LFS file (served through Xet), one named
  by a git blob sha1 a regular file (served as a plain body).  Every file
  of a xetfs store has a Xet hash, so the blob name decides, not the hash;
* a tree entry's ``oid`` is the git blob id: for a regular file its blob
  name, for an LFS file the id of its pointer file, which is computed here.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass

from xetfs.storage.catalogue import Content, Repo, is_commit

PREFIXES = {"model": "", "dataset": "datasets/", "space": "spaces/"}
API_TYPES = {"models": "model", "datasets": "dataset", "spaces": "space"}


@dataclass(frozen=True, slots=True)
class File:
    """A file of a revision: its path, blob name and the store's content."""

    path: str
    blob: str
    content: Content

    @property
    def is_lfs(self) -> bool:
        return len(self.blob) == 64

    def git_blob(self) -> tuple[str, int | None]:
        """The id of the blob git keeps for the file (an LFS file's is its pointer's), and the pointer's size
        (None for a regular file)."""
        if not self.is_lfs:
            return self.blob, None
        pointer = lfs_pointer(self.blob, self.content.size)
        return git_blob_id(pointer), len(pointer)

    def tree_entry(self) -> dict[str, object]:
        """The file's entry in a tree listing (``RepoFile`` in huggingface_hub)."""
        oid, pointer_size = self.git_blob()
        entry: dict[str, object] = {"type": "file", "path": self.path, "size": self.content.size, "oid": oid}
        if pointer_size is not None:
            entry["lfs"] = {"oid": self.blob, "size": self.content.size, "pointerSize": pointer_size}
            entry["xetHash"] = self.content.xet_hash
        return entry

    def sibling(self) -> dict[str, object]:
        """The file in a repo's revision info with ``blobs`` (``RepoSibling`` in huggingface_hub)."""
        oid, pointer_size = self.git_blob()
        out: dict[str, object] = {"rfilename": self.path, "size": self.content.size, "blobId": oid}
        if pointer_size is not None:
            out["lfs"] = {"sha256": self.blob, "size": self.content.size, "pointerSize": pointer_size}
        return out


def path_entry(repo: Repo, commit: str, path: str) -> dict[str, object] | None:
    """The tree entry of ``path`` in the commit: a file's, a directory's, or None."""
    file = find_file(repo, commit, path)
    if file is not None:
        return file.tree_entry()
    if path and is_directory(repo, commit, path):
        return {"type": "directory", "path": path, "oid": folder_id(path, commit), "size": 0}
    return None


def lfs_pointer(sha256: str, size: int) -> bytes:
    """The git-lfs pointer file of an LFS object."""
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def folder_id(path: str, commit: str) -> str:
    """A stable 40-hex id for a directory of a commit (the store keeps no git trees)."""
    return hashlib.sha1(f"tree {commit} {path}".encode()).hexdigest()


def resolve(repo: Repo, revision: str) -> str | None:
    """The commit ``revision`` names in ``repo``, or None."""
    if is_commit(revision) and revision in repo.revisions:
        return revision
    for name in (revision, revision.removeprefix("refs/heads/"), revision.removeprefix("refs/tags/")):
        commit = repo.refs.get(name)
        if commit is not None:
            return commit
    return None


def find_file(repo: Repo, commit: str, path: str) -> File | None:
    blob = repo.revisions[commit].files.get(path)
    if blob is None:
        return None
    return File(path, blob, repo.blobs[blob])


def is_directory(repo: Repo, commit: str, path: str) -> bool:
    """Whether ``path`` is a directory of the commit ("" is the root, always one)."""
    if not path:
        return True
    prefix = path + "/"
    return any(p.startswith(prefix) for p in repo.revisions[commit].files)


def tree(repo: Repo, commit: str, path: str, *, recursive: bool) -> Iterator[dict[str, object]]:
    """The tree listing under directory ``path`` of the commit: directories and files, sorted by path.

    Without ``recursive``: the direct children only.  The caller checks that
    ``path`` is a directory (``is_directory``).
    """
    prefix = path + "/" if path else ""
    files = repo.revisions[commit].files
    dirs: set[str] = set()
    names: list[str] = []
    for p in files:
        if not p.startswith(prefix):
            continue
        rest = p[len(prefix) :].split("/")
        for depth in range(1, len(rest) if recursive else min(2, len(rest))):
            dirs.add(prefix + "/".join(rest[:depth]))
        if recursive or len(rest) == 1:
            names.append(p)
    rows = [(d, True) for d in dirs] + [(n, False) for n in names]
    for p, is_dir in sorted(rows):
        if is_dir:
            yield {"type": "directory", "path": p, "oid": folder_id(p, commit), "size": 0}
        else:
            blob = files[p]
            yield File(p, blob, repo.blobs[blob]).tree_entry()
