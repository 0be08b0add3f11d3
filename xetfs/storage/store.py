"""The store: shards, xorbs and the small files beside them, over one object source.

A store is a directory of objects laid out as below, on this machine, on a
web server or in a bucket.  ``Store`` is the same for all of them: where the
bytes come from is its ``source`` (``objects.ObjectSource``: ``DirSource``
for a directory, ``ObstoreSource`` for a URL), and which objects exist is its
``Listing``.  The layout rules live once, in ``layout`` (docs/format.md section 4):

* what hf_xet writes for ``local://DIR``: ``DIR/xet/xorbs/{xorbs,shards}``,
  given as ``DIR``, ``DIR/xet`` or ``DIR/xet/xorbs``;
* a flat layout: ``DIR/xorbs`` and ``DIR/shards``.

Xorbs are named ``default.<hex>``, ``<hex>`` or ``<hex>.xorb``; shards
``<hex>.mdb``.  Everything else (``.tagset`` sidecars, temp files, the redb
index, ``shard-cache/``) is ignored.  The files ``pack`` writes (names,
catalogue, listing) lie beside ``shards/`` or above it (``read_meta``).

The read path takes xorb bytes from here: ``load_layout`` (a xorb's checked
footer), ``chunk_source`` (where the stored chunks ``[first, stop)`` lie: a
local file, a disk-cache entry, or the source, with what a decode worker
needs to read them itself) and ``read_source`` (their stored bytes, headers
included, for the daemon's own decoding).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from xetfs.base import hashes
from xetfs.base.errors import (
    IntegrityError,
    MissingObjectError,
    ObjectReadError,
    ShardFormatError,
    StoreError,
    XetfsError,
    XorbFormatError,
)
from xetfs.base.settings import MAX_OPEN_FILES, TAIL_BYTES
from xetfs.format.chunk import Buffer
from xetfs.format.shard import MAGIC as SHARD_MAGIC
from xetfs.format.xorb import HASHES_AT, XorbLayout, decode_run, footer_length, parse_footer, walk_headers_with
from xetfs.storage.layout import SHARD_NAME, XORB_NAME, Listing, read_range
from xetfs.storage.objects import ObjectSource

if TYPE_CHECKING:
    from xetfs.storage.chunkcache import ChunkCache

MAX_SHARD_BYTES = 1 << 30  # builders aim at 64 MiB


@dataclass(frozen=True, slots=True)
class ShardFile:
    name: str
    path: Path  # relative to the store's top


def _footer_key(xorb_hash: bytes) -> str:
    """The disk-cache key of a xorb's footer (by content: the same for every store that has the xorb)."""
    return f"xorb-footer\0{hashes.to_hex(xorb_hash)}"


class ChunkSource(NamedTuple):  # a tuple: one goes with every decode job
    """Where the serialized chunks of one read of a xorb come from (``Store.chunk_source``).

    Either a file on this machine (``path``: the xorb itself, or a disk-cache
    entry that starts at xorb offset ``base``), read with ``pread``, or the
    object ``name`` of the store's source, fetched; then, with ``cache_to``,
    the fetched bytes are kept there once their chunks are verified.
    """

    name: str  # the xorb's object name in the store's source
    path: str | None = None
    base: int = 0
    cache_to: str | None = None
    entry: tuple[int, int] | None = None  # the chunks of the disk-cache entry ``path`` is (dropped if one fails)


class Store:
    """Read-only access to the shards, xorbs and small files of one store, wherever its objects lie.

    ``source`` gives the objects' bytes (``objects.ObjectSource``: a directory
    here, an HTTP server or a bucket); ``listing`` names them.  Everything
    above is the same for every source.  Thread-safe.
    """

    def __init__(self, source: ObjectSource, listing: Listing, chunks: ChunkCache | None = None) -> None:
        self.source = source
        self.chunks = chunks
        self.mtime = listing.mtime
        self._root = listing.root()
        self._objects = dict(listing.objects)
        self._shards: list[str] = []
        self._xorbs: dict[bytes, tuple[str, int]] = {}
        self._take(self._objects.items())
        self._files: dict[str, int] = {}  # open xorb descriptors by path (``xorb_fd``)
        self._lock = threading.Lock()

    def _take(self, objects: Iterable[tuple[str, int]]) -> None:
        """Know the shards and xorbs among ``objects`` (those under the store's root)."""
        base = f"{self._root}/" if self._root else ""
        shard_dir = self.shard_prefix()
        objects = list(objects)
        names = [n[len(shard_dir) :] for n, _ in objects if n.startswith(shard_dir)]
        for name, size in objects:
            m = XORB_NAME.fullmatch(name[len(base) + 6 :]) if name.startswith(base + "xorbs/") else None
            if m:
                self._xorbs.setdefault(hashes.from_hex(m.group(1)), (name, size))
        self._shards = sorted({*self._shards, *(n for n in names if SHARD_NAME.fullmatch(n))})

    def add(self, listing: Listing) -> list[ShardFile]:
        """Take in the objects ``listing`` names that this store did not know (a store only grows: nothing is
        forgotten), and return the shards among them.  For a refresh of a live mount; any thread."""
        known = set(self._shards)
        new = [(name, size) for name, size in listing.objects if name not in self._objects]
        with self._lock:
            self._objects.update(new)
            self.mtime = max(self.mtime, listing.mtime)
            if not self._shards and not self._xorbs:  # an empty store: where its shards lie is known only now
                self._root = Listing(tuple(self._objects.items())).root()
                new = list(self._objects.items())
            self._take(new)
        return [s for s in self.shard_files() if s.name not in known]

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> Store:
        """The store directory at ``path`` (``DIR``, ``DIR/xet`` or ``DIR/xet/xorbs``)."""
        from xetfs.storage.dirsource import DirSource

        source = DirSource.open(Path(path))
        return cls(source, source.listing())

    @property
    def location(self) -> str:
        """Where the store is, for messages (a directory, or a URL without secrets)."""
        return self.source.location

    @property
    def local(self) -> bool:
        """Whether the store's objects are files on this machine."""
        return self.source.local_path("") is not None

    # -- shards and small files ----------------------------------------------

    def shard_files(self) -> list[ShardFile]:
        prefix = self.shard_prefix()
        return [ShardFile(name, Path(prefix + name)) for name in self._shards]

    def shard_prefix(self) -> str:
        """Where the store's shards are, as a prefix of object names (``.../shards/``)."""
        return f"{self._root}/shards/" if self._root else "shards/"

    def read_shard(self, shard: ShardFile, *, fresh: bool = False) -> bytes:
        """A shard's bytes; refuses one too large or without the shard magic.  ``fresh``: from the server itself
        first, not a copy in the disk cache (``ObjectSource.read``)."""
        data = self.source.read(shard.path.as_posix(), limit=MAX_SHARD_BYTES, fresh=fresh)
        if not data.startswith(SHARD_MAGIC):
            raise ShardFormatError(f"shard {shard.name}: bad shard magic at offset 0")
        return data

    def read_meta(self, name: str, *, limit: int) -> bytes | None:
        """The small file ``name`` (a manifest, a catalogue) beside the store's objects, or None
        (``meta_path``); refused if larger than ``limit`` bytes."""
        path = self.meta_path(name)
        if path is None:
            return None
        try:
            return self.source.read(path, limit=limit, fresh=True)
        except MissingObjectError:
            return None

    def meta_path(self, name: str) -> str | None:
        """Where the store has the small file ``name``, or None: beside ``shards/``, else in the nearest
        directory above it, up to the store's top (where ``pack`` writes it)."""
        parts = self._root.split("/") if self._root else []
        for depth in range(len(parts), -1, -1):
            path = "/".join([*parts[:depth], name])
            if path in self._objects:
                return path
        return None

    def meta_place(self, name: str) -> str:
        """``meta_path``, or where the small file ``name`` would be: the store's top, where pack and push
        write it (for asking a server about a file that may have appeared)."""
        return self.meta_path(name) or name

    # -- xorbs ------------------------------------------------------------

    def has_xorb(self, xorb_hash: bytes) -> bool:
        return xorb_hash in self._xorbs

    def xorb_hashes(self) -> Iterator[bytes]:
        return iter(self._xorbs)

    def xorb_size(self, xorb_hash: bytes) -> int:
        return self._xorb(xorb_hash)[1]

    def xorb_name(self, xorb_hash: bytes) -> str:
        """The xorb's object name in the source."""
        return self._xorb(xorb_hash)[0]

    def xorb_file(self, xorb_hash: bytes) -> str | None:
        """The xorb's file on this machine, which decode workers may read themselves; None for a remote store."""
        return self.source.local_path(self._xorb(xorb_hash)[0])

    def xorb_path(self, xorb_hash: bytes) -> Path:
        """The xorb's local file; ``StoreError`` for a remote store."""
        path = self.xorb_file(xorb_hash)
        if path is None:
            raise StoreError(f"xorb {hashes.to_hex(xorb_hash)}: in a remote store, it has no local file")
        return Path(path)

    def read_xorb(self, xorb_hash: bytes, start: int, end: int) -> Buffer:
        """Bytes ``[start, end)`` of a xorb from its source (never from a disk cache); a short one is a format error."""
        name, size = self._xorb(xorb_hash)
        where = f"xorb {hashes.to_hex(xorb_hash)}"
        if end > size:
            raise XorbFormatError(f"{where}: truncated: wanted bytes [{start}, {end}), file ends at {size}")
        path = self.source.local_path(name)
        if path is None:
            buffer = bytearray(end - start)
            self.source.read_range_into(name, start, end, [memoryview(buffer)])
            return buffer
        with self._open(path, xorb_hash) as fd:
            return read_range(fd, start, end, where=where)

    def read_local(self, xorb_hash: bytes, start: int, end: int, first: int, stop: int) -> Buffer | None:
        """``read_chunks`` of a local xorb on the calling thread, with the cached descriptor; None for a
        remote store.  For small reads done inline (a local disk): a descriptor of their own
        (``_open``) costs more than their read.  A read that fails is made again by ``read_chunks``,
        which raises what it finds."""
        name, size = self._xorb(xorb_hash)
        path = self.source.local_path(name)
        if path is None:
            return None
        if end <= size:
            with self._lock:  # (nothing closes the cached descriptor while the lock is held)
                try:
                    data = os.pread(xorb_fd(self._files, path, xorb_hash), end - start, start)
                except OSError:
                    data = b""
            if len(data) == end - start:
                return data
        return self.read_chunks(xorb_hash, start, end, first, stop)

    def read_chunks(self, xorb_hash: bytes, start: int, end: int, first: int, stop: int) -> Buffer:
        """Bytes ``[start, end)`` of a xorb, which hold its chunks ``[first, stop)``; a failure names the chunks."""
        try:
            return self.read_xorb(xorb_hash, start, end)
        except (XorbFormatError, ObjectReadError) as exc:
            raise _naming_chunks(exc, first, stop) from None

    # -- chunk ranges, through the disk cache ----------------------------------

    def chunk_limit(self, xorb_hash: bytes, first: int, stop: int) -> int:
        """Where a read of chunks from ``first`` must end (``stop`` at most), to lie within one disk-cache
        entry or in none."""
        return stop if self.chunks is None else self.chunks.limit(xorb_hash, first, stop)

    def chunk_source(self, xorb_hash: bytes, layout: XorbLayout, first: int, stop: int) -> ChunkSource:
        """Where to read chunks ``[first, stop)`` from: the local xorb, a disk-cache entry, or the source
        (to be kept in the disk cache, if there is one)."""
        name = self.xorb_name(xorb_hash)
        path = self.source.local_path(name)
        if path is not None:
            return ChunkSource(name, path)
        if self.chunks is None:
            return ChunkSource(name)
        entry = self.chunks.find(xorb_hash, first, stop)
        if entry is not None:
            return ChunkSource(name, self.chunks.target(xorb_hash, *entry), layout.phys_start(entry[0]), entry=entry)
        return ChunkSource(name, cache_to=self.chunks.target(xorb_hash, first, stop))

    def read_source(self, xorb_hash: bytes, src: ChunkSource, start: int, end: int, first: int, stop: int) -> Buffer:
        """Bytes ``[start, end)`` of a xorb (its chunks ``[first, stop)``) from ``src``."""
        if src.entry is None:
            return self.read_chunks(xorb_hash, start, end, first, stop)
        where = f"xorb {hashes.to_hex(xorb_hash)} (disk cache entry {src.path})"
        try:
            fd = os.open(src.path or "", os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise ObjectReadError(f"{where}: cannot open: {exc.strerror}") from None
        try:
            return read_chunk_run(fd, start - src.base, end - src.base, first, stop, where=where)
        finally:
            os.close(fd)

    def load_layout(self, xorb_hash: bytes, *, cached: bool = True) -> XorbLayout:
        """Read and check a xorb's layout (``layout_from``); with ``cached``, from a footer the disk cache
        keeps, if it has one (``cached_layout``).

        A remote xorb's tail is fetched with one request (a second one for
        the rest of a footer longer than ``TAIL_BYTES``: a xorb of thousands
        of small chunks).  Where a disk cache is on, its footer is kept there
        (a restart with the server down still finds the layout), and so are
        the chunks the tail holds whole, so that a read of them later fetches
        nothing again.
        """
        name, size = self._xorb(xorb_hash)
        if self.source.local_path(name) is not None:
            return layout_from(lambda s, e: self.read_xorb(xorb_hash, s, e), size, xorb_hash)
        if self.chunks is not None and cached:
            layout = self._cached_layout(xorb_hash, size)
            if layout is not None:
                return layout
        tail_at = max(0, size - TAIL_BYTES)
        tail: Buffer = self.read_xorb(xorb_hash, tail_at, size) if size else b""

        def read(start: int, end: int) -> Buffer:
            nonlocal tail, tail_at
            if start < tail_at < end:  # a footer longer than the tail: fetch the rest of it, once, and hold it
                tail, tail_at = bytes(self.read_xorb(xorb_hash, start, tail_at)) + bytes(tail), start
            return self._from_tail(xorb_hash, tail, tail_at, start, end)

        layout = layout_from(read, size, xorb_hash)
        if self.chunks is not None:
            data_end = layout.phys_ends[-1] if layout.num_chunks else 0
            if data_end >= tail_at and data_end < size:
                self.chunks.disk.put(_footer_key(xorb_hash), bytes(memoryview(tail)[data_end - tail_at :]))
            with contextlib.suppress(XetfsError):  # (only a saving: the read of those chunks fetches them then)
                self.chunks.keep_tail(layout, tail_at, tail, lambda s, e: self.read_xorb(xorb_hash, s, e))
        return layout

    def cached_layout(self, xorb_hash: bytes) -> XorbLayout | None:
        """A remote xorb's layout from a footer kept in the disk cache (no request), or None."""
        if self.chunks is None:
            return None
        return self._cached_layout(xorb_hash, self._xorb(xorb_hash)[1])

    def _cached_layout(self, xorb_hash: bytes, size: int) -> XorbLayout | None:
        """The layout from a footer kept in the disk cache, checked as ever; None if there is none (or it fails)."""
        assert self.chunks is not None
        footer = self.chunks.disk.get(_footer_key(xorb_hash))
        if footer is None or len(footer) > size:
            return None
        try:
            return layout_from(lambda s, e: self._from_tail(xorb_hash, footer, size - len(footer), s, e), size,
                               xorb_hash)  # fmt: skip
        except XetfsError:
            return None

    def _from_tail(self, xorb_hash: bytes, tail: Buffer, tail_at: int, start: int, end: int) -> Buffer:
        """Bytes ``[start, end)`` of a xorb: from ``tail`` (its bytes from ``tail_at`` on) where it has them."""
        if start >= tail_at:
            return memoryview(tail)[start - tail_at : end - tail_at]
        return self.read_xorb(xorb_hash, start, end)

    def close(self) -> None:
        with self._lock:
            for fd in self._files.values():
                os.close(fd)
            self._files.clear()

    @contextlib.contextmanager
    def _open(self, path: str, xorb_hash: bytes) -> Iterator[int]:
        """A descriptor of a local xorb file for one read, its own: reads may run in threads, and a slow
        one must keep its file while others push it out of the open-file cache (which closes it)."""
        with self._lock:
            cached = xorb_fd(self._files, path, xorb_hash)
            try:
                fd = os.dup(cached)
            except OSError as exc:
                raise ObjectReadError(f"xorb {hashes.to_hex(xorb_hash)}: cannot open: {exc.strerror}") from None
        try:
            yield fd
        finally:
            os.close(fd)

    def _xorb(self, xorb_hash: bytes) -> tuple[str, int]:
        try:
            return self._xorbs[xorb_hash]
        except KeyError:
            raise MissingObjectError(f"xorb {hashes.to_hex(xorb_hash)}: not in the store") from None


def open_xorb(path: str | os.PathLike[str], xorb_hash: bytes) -> int:
    """A read-only descriptor of the xorb file at ``path``: ``MissingObjectError`` if there is no such
    file, ``ObjectReadError`` if it cannot be opened (no permission, too many open files)."""
    try:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise MissingObjectError(f"xorb {hashes.to_hex(xorb_hash)}: cannot open: no such file") from None
    except OSError as exc:
        raise ObjectReadError(f"xorb {hashes.to_hex(xorb_hash)}: cannot open: {exc.strerror}") from None


def xorb_fd(files: dict[str, int], path: str, xorb_hash: bytes) -> int:
    """A descriptor of the xorb file at ``path`` from ``files`` (open descriptors by path, the least recently
    used first), opened (``open_xorb``) and added if it is not there; past ``MAX_OPEN_FILES`` the least
    recently used is closed.  The daemon's store and each worker keep their own ``files``."""
    fd = files.pop(path, None)
    if fd is None:
        fd = open_xorb(path, xorb_hash)
        if len(files) >= MAX_OPEN_FILES:
            os.close(files.pop(next(iter(files))))
    files[path] = fd
    return fd


def read_chunk_run(fd: int, start: int, end: int, first: int, stop: int, *, where: str) -> bytes:
    """Bytes ``[start, end)`` of a xorb file, its chunks ``[first, stop)``; a failure names the chunks."""
    try:
        return read_range(fd, start, end, where=where)
    except (XorbFormatError, ObjectReadError) as exc:
        raise _naming_chunks(exc, first, stop) from None


def _naming_chunks(exc: XorbFormatError | ObjectReadError, first: int, stop: int) -> XetfsError:
    """``exc`` of a read of a xorb's bytes, saying which chunks the read was for."""
    return type(exc)(f"{exc} (reading chunks [{first}, {stop}))")


def read_layout(fd: int, xorb_hash: bytes) -> XorbLayout:
    """Read and check the layout of the xorb open as ``fd`` (``layout_from``)."""
    where = f"xorb {hashes.to_hex(xorb_hash)}"
    return layout_from(lambda start, end: read_range(fd, start, end, where=where), os.fstat(fd).st_size, xorb_hash)


def layout_from(read: Callable[[int, int], Buffer], size: int, xorb_hash: bytes) -> XorbLayout:
    """Read and check the layout of a xorb of ``size`` bytes; ``read(start, end)`` gives its bytes.

    Chunk hashes are tied to the xorb's name.  With a footer: the footer's
    xorb hash and the Merkle root of its chunk hashes must both equal
    ``xorb_hash``.  Without one: the chunk headers are walked, every chunk is
    decoded and hashed, and the root checked.
    """
    where = f"xorb {hashes.to_hex(xorb_hash)}"
    length = footer_length(bytes(read(size - 4, size)), size) if size >= 4 else None
    if length is not None:
        footer_at = size - length - 4
        footer = bytes(read(footer_at, size))
        if footer.startswith(b"XETBLOB"):
            layout = parse_footer(footer, size, where=where)
            if layout.xorb_hash != xorb_hash:
                raise IntegrityError(
                    f"{where}: footer at offset {footer_at} names xorb {hashes.to_hex(layout.xorb_hash or b'')}"
                )
            at = footer_at + HASHES_AT
            return _checked(layout, xorb_hash, f"{where}: the chunk hashes in its footer (offset {at})")
    return _checked(_walk(read, xorb_hash, size, where), xorb_hash, f"{where}: the hashes of its chunks")


def _walk(read: Callable[[int, int], Buffer], xorb_hash: bytes, size: int, where: str) -> XorbLayout:
    """Layout of a footer-less xorb: walk its headers, hash every chunk (docs/format.md section 2.5).

    Reads one chunk at a time, so memory stays bounded by the chunk size
    limit whatever the file claims.
    """
    bare = walk_headers_with(lambda s, e: bytes(read(s, e)), size, where=where)
    chunk_hashes = []
    for i in range(bare.num_chunks):
        data = read(bare.phys_start(i), bare.phys_ends[i])
        (decoded,) = decode_run(data, xorb_hash, bare, i, i + 1, verify=False)
        if isinstance(decoded, XetfsError):
            raise decoded
        chunk_hashes.append(hashes.chunk_hash(decoded))
    return XorbLayout(xorb_hash, bare.phys_ends, bare.unpacked_ends, tuple(chunk_hashes))


def _checked(layout: XorbLayout, xorb_hash: bytes, what: str) -> XorbLayout:
    """``layout`` if its chunk hashes (``what``: where they came from) aggregate to ``xorb_hash``."""
    root = hashes.xorb_hash(zip(layout.chunk_hashes or (), _sizes(layout), strict=True))
    if root != xorb_hash:
        raise IntegrityError(f"{what} aggregate to {hashes.to_hex(root)}, not to the xorb's name")
    return layout


def _sizes(layout: XorbLayout) -> Iterator[int]:
    prev = 0
    for end in layout.unpacked_ends:
        yield end - prev
        prev = end
