"""The layout of a store: which objects it has and where, the same for every source (docs/format.md section 4).

* what hf_xet writes for ``local://DIR``: ``DIR/xet/xorbs/{xorbs,shards}``,
  given as ``DIR``, ``DIR/xet`` or ``DIR/xet/xorbs``;
* a flat layout: ``DIR/xorbs`` and ``DIR/shards``.

Xorbs are named ``default.<hex>``, ``<hex>`` or ``<hex>.xorb``; shards
``<hex>.mdb``.  ``Listing`` is every object of a store, as a directory or a
bucket lists it or as ``LISTING_NAME`` records it for an HTTP server.  Also
the file helpers that both ``store`` and ``dirsource`` use: ``read_range``
and ``replace_file``.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import TypeVar

from xetfs.base import hashes
from xetfs.base.errors import ObjectReadError, StoreError, XorbFormatError
from xetfs.base.mounttable import force_hint, within, xetfs_source
from xetfs.base.settings import DAEMON_TIMEOUT

XORB_NAME = re.compile(r"(?:default\.)?([0-9a-f]{64})(?:\.xorb)?")
SHARD_NAME = re.compile(r"[0-9a-f]{64}\.mdb")
# What hf_xet keeps for itself in a store: side files (``.tagset``, ``.gctag`` of deleted objects, ``.mdb_temp``
# being written) and its index of chunks (``global_dedup_lookup.redb``): no object of the store.
HF_XET_OWN = re.compile(r".*\.(?:tagset|gctag|mdb_temp|redb)")
ROOTS = ("xet/xorbs", "xorbs", "")  # where shards/ and xorbs/ may lie, relative to the store's top
MAX_LISTING_BYTES = 256 * 1024 * 1024
LISTING_NAME = "xetfs-listing.json"
LISTING_FORMAT = "xetfs-listing"


@dataclass(frozen=True)
class Listing:
    """Every object of a store: ``(path, size)``, paths relative to the store's top, ``/``-separated.

    A directory is listed by ``dirsource.DirSource``, a bucket by its service;
    an HTTP server cannot list, so a store it serves carries its listing in
    ``LISTING_NAME`` (``dump``, ``parse``), written by ``xetfs publish``.
    """

    objects: tuple[tuple[str, int], ...]
    mtime: float = 0.0

    def dump(self) -> bytes:
        doc = {"format": LISTING_FORMAT, "version": 1, "mtime": self.mtime, "objects": [list(o) for o in self.objects]}
        return json.dumps(doc, indent=0).encode()

    @classmethod
    def parse(cls, data: bytes, *, where: str) -> Listing:
        try:
            doc = json.loads(data)
            if doc.get("format") != LISTING_FORMAT or doc.get("version") != 1:
                raise ValueError("not a version 1 xetfs listing")
            objects = tuple((str(n), int(s)) for n, s in doc["objects"])
            mtime = float(doc.get("mtime", 0.0))
            bad = next((n for n, s in objects if s < 0), None)
            if bad is not None:
                raise ValueError(f"object {bad[:200]!r} has a negative size")
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise StoreError(f"{where}: not a usable listing: {exc}") from None
        return cls(objects, mtime)

    def root(self) -> str:
        """The directory (relative to the top, ``""`` for the top) that holds ``shards/`` (or, in a store
        without shards, ``xorbs/``; the index judges such a store)."""
        found = self.store_root()
        return "" if found is None else found

    def store_root(self) -> str | None:
        """``root``, or None when no object lies in a ``shards/`` or ``xorbs/`` at one of the ``ROOTS``."""
        names = [name for name, _ in self.objects]
        for kind in ("shards", "xorbs"):
            for root in ROOTS:
                prefix = f"{root}/{kind}/" if root else f"{kind}/"
                if any(n.startswith(prefix) for n in names):
                    return root
        return None


def check_listed(listing: Listing, location: str) -> None:
    """Raise ``StoreError`` unless a bucket's listing at ``location`` is a store's: some objects in a ``shards/``
    or ``xorbs/`` at one of the ``ROOTS``, or a store's own listing (``LISTING_NAME``: an empty store that
    ``xetfs push`` wrote).  A bucket has no directories: a mistyped prefix is told from an empty store only so."""
    names = [name for name, _ in listing.objects]
    if not names:
        raise StoreError(f"store {location}: no objects there (is the bucket or the prefix mistyped?)")
    if listing.store_root() is not None or LISTING_NAME in names:
        return
    kinds = ("shards/", "xorbs/")
    looked = ", ".join(f"{r}/" for r in ROOTS if r) + " and the top"
    deeper = next((n.rsplit(f"/{k}", 1)[0] for n in names for k in kinds if f"/{k}" in n), None)
    if deeper is not None:
        for root in ROOTS[:-1]:
            if deeper == root or deeper.endswith("/" + root):
                deeper = deeper[: -len(root)].rstrip("/")
                break
        if deeper:
            raise StoreError(f"store {location}: no shards/ or xorbs/ found (looked in {looked}); "
                             f"there is a store at {location}/{deeper}")  # fmt: skip
    raise StoreError(f"store {location}: no shards/ or xorbs/ found (looked in {looked}): not a store")


def find_root(path: Path) -> Path:
    """The directory that holds ``xorbs/`` and ``shards/`` for a store directory at ``path``.

    It is looked for within ``DAEMON_TIMEOUT``: ``path`` may lie on a mount
    whose daemon (or server) is stopped or hung, and a look would wait for
    it for good.
    """
    answered, root = within(DAEMON_TIMEOUT, lambda: _find_root(path))
    if answered and root is not None:
        return root
    source = _xetfs_source(path)
    if source is not None:
        raise StoreError(f"store {path}: this is a xetfs mount of {source}, whose daemon does not answer (it is "
                         f"stopped or hung): give that store instead; {force_hint(path)}")  # fmt: skip
    raise StoreError(f"store {path}: no answer within {DAEMON_TIMEOUT:g} s: it lies on a mount whose daemon or "
                     "server does not answer (stopped or hung)")  # fmt: skip


def _find_root(path: Path) -> Path:
    try:
        if not path.exists():
            raise StoreError(f"store {path}: no such directory")
        if not path.is_dir():
            raise StoreError(f"store {path}: not a directory")
        for rel in ROOTS:
            root = path / rel
            if (root / "shards").is_dir():
                return root
    except OSError as exc:  # (a mount whose daemon died: "Transport endpoint is not connected")
        _mount_given(path)
        raise StoreError(f"store {path}: {exc.strerror or exc}") from None
    # A xetfs mount may show a store's files (a mount of a mirror's directory), so the table is asked last.
    _mount_given(path)
    looked = ", ".join(str(path / r) for r in ROOTS)
    hint = f"; to make a store of the files there: xetfs pack {path} STORE" if _has_files(path) else ""
    raise StoreError(f"store {path}: no shards/ directory found (looked in {looked}){hint}")


def _xetfs_source(path: Path) -> str | None:
    """The store the xetfs mount at ``path`` shows, if ``path`` is a xetfs mount point."""
    return xetfs_source(os.path.abspath(path))


def _mount_given(path: Path) -> None:
    """Raise ``StoreError`` if ``path`` is a xetfs mount point (which was given where its store belongs)."""
    source = _xetfs_source(path)
    if source is not None:
        raise StoreError(f"store {path}: this is a xetfs mount of {source}: give that store instead, or read the "
                         f"files under {path}")  # fmt: skip


def _has_files(path: Path, depth: int = 1) -> bool:
    """Whether a directory holds a regular file among its first entries (its own, or ``depth`` levels down)."""
    with contextlib.suppress(OSError), os.scandir(path) as entries:
        for entry in itertools.islice(entries, 64):
            if entry.is_file() or (depth and entry.is_dir() and _has_files(Path(entry.path), depth - 1)):
                return True
    return False


P = TypeVar("P", bound=PurePath)


def shard_name_problem(name: str, data: bytes) -> str | None:
    """What is wrong with the shard file ``name`` whose bytes are ``data``, or None: a shard is named by the hash
    of its bytes (docs/format.md section 1.7), and a flipped bit in a hash it records leaves it parseable."""
    actual = hashes.to_hex(hashes.chunk_hash(data))
    return None if name == f"{actual}.mdb" else f"its content hashes to {actual}, not to its name"


def store_top(path: P) -> P:
    """The top of the store given as ``path``: ``DIR`` for ``DIR``, ``DIR/xet`` or ``DIR/xet/xorbs`` (where
    ``pack`` keeps its files beside an hf_xet layout); a directory's path, or a URL's."""
    if path.name == "xet":
        return path.parent
    if path.name == "xorbs" and path.parent.name == "xet":
        return path.parent.parent
    return path


def find_beside(store_dir: Path, name: str) -> Path | None:
    """The file ``name`` that ``pack`` keeps beside the store given as ``store_dir``, or None.

    Looks in ``store_dir`` itself and, when ``store_dir`` is the inner
    ``DIR/xet`` or ``DIR/xet/xorbs`` of an hf_xet layout, in ``DIR`` (where
    ``pack`` writes it).
    """
    for directory in (store_dir, store_top(store_dir)):
        path = directory / name
        if path.is_file():
            return path
    return None


def replace_file(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically and durably: a reader, or a crash, sees the old file or the new one.

    For the files ``pack`` keeps beside a store (names, listing, Hub catalogue).
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        with contextlib.suppress(OSError):  # some filesystems refuse to sync a directory: the file is in place
            dir_fd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
    finally:
        tmp.unlink(missing_ok=True)


def read_range(fd: int, start: int, end: int, *, where: str) -> bytes:
    """Bytes ``[start, end)`` of an open object file; a short read is a format error, a failed one
    (a disk I/O error) an ``ObjectReadError``."""
    try:
        data = os.pread(fd, end - start, start)
    except OSError as exc:
        raise ObjectReadError(f"{where}: read of [{start}, {end}) failed: {exc.strerror}") from None
    if len(data) != end - start:
        raise XorbFormatError(f"{where}: truncated: wanted bytes [{start}, {end}), file ends at {start + len(data)}")
    return data
