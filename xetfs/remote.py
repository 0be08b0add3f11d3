"""Remote stores: a store directory behind a URL, read through an ``objects.ObjectSource``.

The store has the same layout as a local one (``store.py``), with its
objects named by their path under the URL.  HTTP servers cannot list a
directory, so a store served over HTTP carries a listing,
``xetfs-listing.json`` at its top (written by ``xetfs pack`` and ``xetfs
publish``): every object's path and size.  Object stores that can list
(S3, GCS, Azure) are listed directly; the listing file is not needed there.

``RemoteStore`` gives the index, the reader and ``verify`` what a local
``Store`` gives them (``store.StoreLike``).  Its one I/O seam for xorb
bytes is ``read_chunks(xorb, start, end, first, stop)``: a range request
for the raw serialized chunks ``[first, stop)``, whose byte offsets come
from the xorb's footer (read once per xorb with one request for its tail).
Nothing above it knows where the bytes came from; every chunk is verified
there as usual.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from xetfs import hashes
from xetfs.diskcache import CachedSource, DiskCache, default_dir
from xetfs.errors import MissingObjectError, ShardFormatError, StoreError, XorbFormatError
from xetfs.format.shard import MAGIC as SHARD_MAGIC
from xetfs.format.xorb import XorbLayout
from xetfs.objects import ObjectSource, ObstoreSource, RemoteOptions, is_url
from xetfs.stats import RemoteCounters
from xetfs.store import MAX_SHARD_BYTES, ShardFile, Store, StoreLike, find_root, layout_from, replace_file

log = logging.getLogger(__name__)

LISTING_NAME = "xetfs-listing.json"
LISTING_FORMAT = "xetfs-listing"
MAX_LISTING_BYTES = 256 * 1024 * 1024
MAX_META_BYTES = 64 * 1024 * 1024  # a manifest or catalogue file
TAIL_BYTES = 128 * 1024  # a xorb's footer is read with one request for this much of its end
_ROOTS = ("xet/xorbs", "xorbs", "")  # where shards/ and xorbs/ may be, as in store.find_root
_XORB_NAME = re.compile(r"(?:default\.)?([0-9a-f]{64})(?:\.xorb)?")
_SHARD_NAME = re.compile(r"[0-9a-f]{64}\.mdb")
_SKIP_DIRS = {"shard-cache"}  # hf_xet's local caches, not part of the store


@dataclass(frozen=True)
class Listing:
    """Every object of a store: ``(path, size)``, paths relative to the store's top."""

    objects: tuple[tuple[str, int], ...]
    mtime: float = 0.0

    def root(self) -> str:
        """The directory (relative to the top, ``""`` for the top) that holds ``shards/`` (or, in a store
        without shards, ``xorbs/``; the index judges such a store)."""
        names = {name for name, _ in self.objects}
        for kind in ("shards", "xorbs"):
            for root in _ROOTS:
                prefix = f"{root}/{kind}/" if root else f"{kind}/"
                if any(n.startswith(prefix) for n in names):
                    return root
        return ""

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


def local_listing(top: Path) -> Listing:
    """The listing of the store directory ``top``: every regular file under it (not hidden, not caches)."""
    find_root(top)  # refuses a directory that is not a store
    objects = []
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d not in _SKIP_DIRS)
        for name in sorted(filenames):
            path = Path(dirpath, name)
            rel = path.relative_to(top).as_posix()
            if name.startswith(".") or rel == LISTING_NAME or not path.is_file():
                continue
            objects.append((rel, path.stat().st_size))
    return Listing(tuple(objects), top.stat().st_mtime)


def publish(top: str | os.PathLike[str]) -> tuple[Path, Listing]:
    """Write (atomically) or refresh ``TOP/xetfs-listing.json`` for the store directory ``top``."""
    top_dir = Path(top)
    listing = local_listing(top_dir)
    path = top_dir / LISTING_NAME
    try:
        replace_file(path, listing.dump())
    except OSError as exc:
        raise StoreError(f"{path}: cannot write the listing: {exc.strerror}") from None
    return path, listing


def load_listing(source: ObjectSource) -> Listing:
    """The store's listing: listed by the service when it can, else its ``xetfs-listing.json``."""
    listed = source.list("")
    if listed is not None:
        mtime = max((t for *_, t in listed), default=0.0)
        return Listing(tuple((n, s) for n, s, _ in listed), mtime)
    try:
        data = source.read(LISTING_NAME, limit=MAX_LISTING_BYTES, fresh=True)
    except MissingObjectError:
        raise StoreError(
            f"store {source.location}: no {LISTING_NAME} (an HTTP server cannot list directories: "
            f"run 'xetfs publish DIR' on the store directory before serving it)"
        ) from None
    return Listing.parse(data, where=f"{source.location}/{LISTING_NAME}")


class RemoteStore:
    """Read-only access to a store behind a URL (``store.StoreLike``); thread-safe."""

    def __init__(self, source: ObjectSource, listing: Listing) -> None:
        self.source = source
        self.mtime = listing.mtime
        self._root = listing.root()
        base = f"{self._root}/" if self._root else ""
        self._objects = dict(listing.objects)
        self._shards = sorted(
            n[len(base) + 7 :] for n in self._objects if n.startswith(base + "shards/")
            and _SHARD_NAME.fullmatch(n[len(base) + 7 :])
        )  # fmt: skip
        self._xorbs: dict[bytes, tuple[str, int]] = {}
        for name, size in self._objects.items():
            m = _XORB_NAME.fullmatch(name[len(base) + 6 :]) if name.startswith(base + "xorbs/") else None
            if m:
                self._xorbs.setdefault(hashes.from_hex(m.group(1)), (name, size))
        if isinstance(source, CachedSource):
            source.sizes.update(self._xorbs.values())

    @classmethod
    def open(
        cls,
        url: str,
        options: RemoteOptions | None = None,
        *,
        cache: DiskCache | None = None,
        counters: RemoteCounters | None = None,
    ) -> RemoteStore:
        source: ObjectSource = ObstoreSource(url, options or RemoteOptions(), counters)
        if cache is not None:
            source = CachedSource(source, cache)
        try:
            return cls(source, load_listing(source))
        except StoreError as exc:
            if str(exc).startswith(("store ", source.location)):
                raise
            raise StoreError(f"store {source.location}: {exc}") from None

    @property
    def location(self) -> str:
        return self.source.location

    # -- shards and metadata -------------------------------------------------

    def shard_files(self) -> list[ShardFile]:
        base = f"{self._root}/shards" if self._root else "shards"
        return [ShardFile(name, Path(base, name)) for name in self._shards]

    def read_shard(self, shard: ShardFile) -> bytes:
        data = self.source.read(shard.path.as_posix(), limit=MAX_SHARD_BYTES)
        if not data.startswith(SHARD_MAGIC):
            raise ShardFormatError(f"shard {shard.name}: bad shard magic at offset 0")
        return data

    def read_meta(self, name: str) -> bytes | None:
        """The small file ``name`` (a manifest, a catalogue) at the store's top, or None if it has none."""
        if name not in self._objects:
            return None
        try:
            return self.source.read(name, limit=MAX_META_BYTES, fresh=True)
        except MissingObjectError:
            return None

    # -- xorbs -----------------------------------------------------------------

    def has_xorb(self, xorb_hash: bytes) -> bool:
        return xorb_hash in self._xorbs

    def xorb_hashes(self) -> Iterator[bytes]:
        return iter(self._xorbs)

    def xorb_size(self, xorb_hash: bytes) -> int:
        return self._xorb(xorb_hash)[1]

    def xorb_path(self, xorb_hash: bytes) -> Path:
        raise StoreError(f"xorb {hashes.to_hex(xorb_hash)}: in a remote store, it has no local file")

    def read_xorb(self, xorb_hash: bytes, start: int, end: int) -> bytes:
        name, size = self._xorb(xorb_hash)
        if end > size:
            where = f"xorb {hashes.to_hex(xorb_hash)}"
            raise XorbFormatError(f"{where}: truncated: wanted bytes [{start}, {end}), file ends at {size}")
        return self.source.read_range(name, start, end)

    def read_chunks(self, xorb_hash: bytes, start: int, end: int, first: int, stop: int) -> bytes:
        try:
            return self.read_xorb(xorb_hash, start, end)
        except XorbFormatError as exc:
            raise XorbFormatError(f"{exc} (reading chunks [{first}, {stop}))") from None

    def load_layout(self, xorb_hash: bytes) -> XorbLayout:
        name, size = self._xorb(xorb_hash)
        tail_at = max(0, size - TAIL_BYTES)
        tail = self.source.read_range(name, tail_at, size) if size else b""

        def read(start: int, end: int) -> bytes:
            if start >= tail_at:
                return tail[start - tail_at : end - tail_at]
            return self.read_xorb(xorb_hash, start, end)

        return layout_from(read, size, xorb_hash)

    def close(self) -> None:
        pass

    def _xorb(self, xorb_hash: bytes) -> tuple[str, int]:
        try:
            return self._xorbs[xorb_hash]
        except KeyError:
            raise MissingObjectError(f"xorb {hashes.to_hex(xorb_hash)}: not in the store") from None


def open_store(
    location: str,
    *,
    io_timeout: float = 30.0,
    headers: Sequence[str] = (),
    cache_dir: Path | None = None,
    disk_cache_size: int = 0,
    counters: RemoteCounters | None = None,
) -> StoreLike:
    """The store at ``location``: a directory (``Store``), or a URL (``RemoteStore``).

    A remote store's reads give up after ``io_timeout`` seconds, send
    ``headers`` (``NAME: VALUE``, besides those of the environment), and go
    through the disk cache at ``cache_dir`` (default ``diskcache.default_dir()``)
    unless ``disk_cache_size`` is 0.
    """
    if not is_url(location):
        return Store.open(location)
    options = RemoteOptions.for_timeout(io_timeout, list(headers))
    cache = None
    if disk_cache_size:
        cache = DiskCache((cache_dir or default_dir()).absolute(), disk_cache_size, counters)
        log.info("disk cache: %s, %d bytes at most", cache.directory, disk_cache_size)
    return RemoteStore.open(location, options, cache=cache, counters=counters)
