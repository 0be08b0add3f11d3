"""Where a store's objects live, and the only module that opens store files.

The read path takes xorb bytes from here through one seam: ``load_layout``
(a xorb's checked footer) and ``read_chunks`` (the raw serialized chunks
``[first, stop)``, headers included, as they lie in the xorb).  Nothing above
it assumes a local file; ``xorb_path`` is offered to decode workers, which
read local xorbs themselves.

A store is a directory.  Accepted layouts (docs/format.md section 4):

* what hf_xet writes for ``local://DIR``: ``DIR/xet/xorbs/{xorbs,shards}``,
  given as ``DIR``, ``DIR/xet`` or ``DIR/xet/xorbs``;
* a flat layout: ``DIR/xorbs`` and ``DIR/shards``.

Xorbs are named ``default.<hex>``, ``<hex>`` or ``<hex>.xorb``; shards
``<hex>.mdb``.  Everything else (``.tagset`` sidecars, temp files, the redb
index, ``shard-cache/``) is ignored.  Files are opened read-only.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from cachetools import LRUCache

from xetfs import hashes
from xetfs.errors import (
    IntegrityError,
    MissingObjectError,
    ObjectReadError,
    ShardFormatError,
    StoreError,
    XetfsError,
    XorbFormatError,
)
from xetfs.format.shard import MAGIC as SHARD_MAGIC
from xetfs.format.xorb import HASHES_AT, XorbLayout, decode_run, footer_length, parse_footer, walk_headers_with

_XORB_NAME = re.compile(r"(?:default\.)?([0-9a-f]{64})(?:\.xorb)?")
_SHARD_NAME = re.compile(r"[0-9a-f]{64}\.mdb")
_CANDIDATES = ("xet/xorbs", "xorbs", ".")
MAX_OPEN_FILES = 64
MAX_SHARD_BYTES = 1 << 30  # builders aim at 64 MiB


@dataclass(frozen=True, slots=True)
class ShardFile:
    name: str
    path: Path


class StoreLike(Protocol):
    """What the index, the reader and ``verify`` need from a store: ``Store`` (a directory) or
    ``remote.RemoteStore`` (a URL).  Every method may be called from worker threads."""

    mtime: float

    @property
    def location(self) -> str:
        """Where the store is, for messages (a directory or a URL without secrets)."""
        ...

    def shard_files(self) -> list[ShardFile]: ...

    def read_shard(self, shard: ShardFile) -> bytes: ...

    def has_xorb(self, xorb_hash: bytes) -> bool: ...

    def xorb_hashes(self) -> Iterator[bytes]: ...

    def xorb_size(self, xorb_hash: bytes) -> int: ...

    def xorb_path(self, xorb_hash: bytes) -> Path:
        """The xorb's local file, for decode workers; a remote store has none (``StoreError``)."""
        ...

    def read_xorb(self, xorb_hash: bytes, start: int, end: int) -> bytes: ...

    def read_chunks(self, xorb_hash: bytes, start: int, end: int, first: int, stop: int) -> bytes: ...

    def load_layout(self, xorb_hash: bytes) -> XorbLayout: ...

    def close(self) -> None: ...


def find_root(path: Path) -> Path:
    """The directory that holds ``xorbs/`` and ``shards/`` for a store at ``path``."""
    if not path.exists():
        raise StoreError(f"store {path}: no such directory")
    if not path.is_dir():
        raise StoreError(f"store {path}: not a directory")
    for rel in _CANDIDATES:
        root = path / rel
        if (root / "shards").is_dir():
            return root
    raise StoreError(
        f"store {path}: no shards/ directory found (looked in {', '.join(str(path / r) for r in _CANDIDATES)})"
    )


def find_beside(store_dir: Path, name: str) -> Path | None:
    """The file ``name`` that ``pack`` keeps beside the store given as ``store_dir``, or None.

    Looks in ``store_dir`` itself and, when ``store_dir`` is the inner
    ``DIR/xet`` or ``DIR/xet/xorbs`` of an hf_xet layout, in ``DIR`` (where
    ``pack`` writes it).
    """
    candidates = [store_dir]
    if store_dir.name == "xet":
        candidates.append(store_dir.parent)
    elif store_dir.name == "xorbs" and store_dir.parent.name == "xet":
        candidates.append(store_dir.parent.parent)
    for directory in candidates:
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


class Store:
    """Read-only access to the shards and xorbs of one store directory.

    Thread-safe: ``read_xorb`` may be called from worker threads.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self._xorbs: dict[bytes, Path] = {}
        xorb_dir = root / "xorbs"
        if xorb_dir.is_dir():
            for entry in os.scandir(xorb_dir):
                m = _XORB_NAME.fullmatch(entry.name)
                if m and entry.is_file():
                    self._xorbs.setdefault(hashes.from_hex(m.group(1)), Path(entry.path))
        self._files = OpenFiles(MAX_OPEN_FILES)
        self._lock = threading.Lock()
        self.mtime = root.stat().st_mtime

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> Store:
        return cls(find_root(Path(path)))

    @property
    def location(self) -> str:
        return str(self.root)

    # -- shards -----------------------------------------------------------

    def shard_files(self) -> list[ShardFile]:
        shard_dir = self.root / "shards"
        names = sorted(e.name for e in os.scandir(shard_dir) if _SHARD_NAME.fullmatch(e.name) and e.is_file())
        return [ShardFile(name, shard_dir / name) for name in names]

    def read_shard(self, shard: ShardFile) -> bytes:
        """A shard's bytes; refuses, before reading it all, a file too large or without the shard magic."""
        try:
            with open(shard.path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size > MAX_SHARD_BYTES:
                    raise ShardFormatError(f"shard {shard.name}: {size} bytes, more than the {MAX_SHARD_BYTES} allowed")
                head = f.read(len(SHARD_MAGIC))
                if head != SHARD_MAGIC:
                    raise ShardFormatError(f"shard {shard.name}: bad shard magic at offset 0")
                return head + f.read()
        except OSError as exc:
            raise StoreError(f"shard {shard.name}: cannot read: {exc.strerror}") from None

    # -- xorbs ------------------------------------------------------------

    def has_xorb(self, xorb_hash: bytes) -> bool:
        return xorb_hash in self._xorbs

    def xorb_hashes(self) -> Iterator[bytes]:
        return iter(self._xorbs)

    def xorb_size(self, xorb_hash: bytes) -> int:
        try:
            return self.xorb_path(xorb_hash).stat().st_size
        except OSError as exc:
            raise MissingObjectError(f"xorb {hashes.to_hex(xorb_hash)}: cannot stat: {exc.strerror}") from None

    def xorb_path(self, xorb_hash: bytes) -> Path:
        try:
            return self._xorbs[xorb_hash]
        except KeyError:
            raise MissingObjectError(f"xorb {hashes.to_hex(xorb_hash)}: not in the store") from None

    @contextlib.contextmanager
    def _open(self, xorb_hash: bytes) -> Iterator[int]:
        """A descriptor of the xorb's file for one read, its own: reads run in threads with threaded
        I/O, and a slow one must keep its file while others push it out of the open-file cache
        (which closes it, and the number may be reused for another file)."""
        with self._lock:
            cached = self._files.fd(str(self.xorb_path(xorb_hash)), xorb_hash)
            try:
                fd = os.dup(cached)
            except OSError as exc:
                raise ObjectReadError(f"xorb {hashes.to_hex(xorb_hash)}: cannot open: {exc.strerror}") from None
        try:
            yield fd
        finally:
            os.close(fd)

    def read_xorb(self, xorb_hash: bytes, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of a xorb file; a short read is a format error."""
        with self._open(xorb_hash) as fd:
            return read_range(fd, start, end, where=f"xorb {hashes.to_hex(xorb_hash)}")

    def read_chunks(self, xorb_hash: bytes, start: int, end: int, first: int, stop: int) -> bytes:
        """Bytes ``[start, end)`` of a xorb file, which hold its chunks ``[first, stop)``."""
        with self._open(xorb_hash) as fd:
            return read_chunk_run(fd, start, end, first, stop, where=f"xorb {hashes.to_hex(xorb_hash)}")

    def load_layout(self, xorb_hash: bytes) -> XorbLayout:
        """Read and check a xorb's layout (``read_layout``)."""
        with self._open(xorb_hash) as fd:
            return read_layout(fd, xorb_hash)

    def close(self) -> None:
        with self._lock:
            self._files.clear()


def open_xorb(path: str | os.PathLike[str], xorb_hash: bytes) -> int:
    """A read-only descriptor of the xorb file at ``path``: ``MissingObjectError`` if there is no such
    file, ``ObjectReadError`` if it cannot be opened (no permission, too many open files)."""
    try:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise MissingObjectError(f"xorb {hashes.to_hex(xorb_hash)}: cannot open: no such file") from None
    except OSError as exc:
        raise ObjectReadError(f"xorb {hashes.to_hex(xorb_hash)}: cannot open: {exc.strerror}") from None


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


def read_chunk_run(fd: int, start: int, end: int, first: int, stop: int, *, where: str) -> bytes:
    """Bytes ``[start, end)`` of a xorb file, its chunks ``[first, stop)``; a failure names the chunks."""
    try:
        return read_range(fd, start, end, where=where)
    except (XorbFormatError, ObjectReadError) as exc:
        raise type(exc)(f"{exc} (reading chunks [{first}, {stop}))") from None


def read_layout(fd: int, xorb_hash: bytes) -> XorbLayout:
    """Read and check the layout of the xorb open as ``fd`` (``layout_from``)."""
    where = f"xorb {hashes.to_hex(xorb_hash)}"
    return layout_from(lambda start, end: read_range(fd, start, end, where=where), os.fstat(fd).st_size, xorb_hash)


def layout_from(read: Callable[[int, int], bytes], size: int, xorb_hash: bytes) -> XorbLayout:
    """Read and check the layout of a xorb of ``size`` bytes; ``read(start, end)`` gives its bytes.

    Chunk hashes are tied to the xorb's name.  With a footer: the footer's
    xorb hash and the Merkle root of its chunk hashes must both equal
    ``xorb_hash``.  Without one: the chunk headers are walked, every chunk is
    decoded and hashed, and the root checked.
    """
    where = f"xorb {hashes.to_hex(xorb_hash)}"
    length = footer_length(read(size - 4, size), size) if size >= 4 else None
    if length is not None:
        footer_at = size - length - 4
        footer = read(footer_at, size)
        if footer.startswith(b"XETBLOB"):
            layout = parse_footer(footer, size, where=where)
            if layout.xorb_hash != xorb_hash:
                raise IntegrityError(
                    f"{where}: footer at offset {footer_at} names xorb {hashes.to_hex(layout.xorb_hash or b'')}"
                )
            at = footer_at + HASHES_AT
            return _checked(layout, xorb_hash, f"{where}: the chunk hashes in its footer (offset {at})")
    return _checked(_walk(read, xorb_hash, size, where), xorb_hash, f"{where}: the hashes of its chunks")


def _walk(read: Callable[[int, int], bytes], xorb_hash: bytes, size: int, where: str) -> XorbLayout:
    """Layout of a footer-less xorb: walk its headers, hash every chunk (docs/format.md 2.5).

    Reads one chunk at a time, so memory stays bounded by the chunk size
    limit whatever the file claims.
    """
    bare = walk_headers_with(read, size, where=where)
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


class OpenFiles(LRUCache[str, int]):
    """Open xorb descriptors by path, the least recently used closed when full (the daemon's and each worker's)."""

    def fd(self, path: str, xorb_hash: bytes) -> int:
        fd = self.get(path)
        if fd is None:
            fd = self[path] = open_xorb(path, xorb_hash)
        return fd

    def popitem(self) -> tuple[str, int]:
        key, fd = super().popitem()
        os.close(fd)
        return key, fd

    def clear(self) -> None:
        while self:
            self.popitem()
