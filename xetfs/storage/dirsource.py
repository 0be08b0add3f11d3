"""A store directory on this machine as an object source (``objects.ObjectSource``).

Objects are the files under the store's top, named by their path relative
to it.  ``local_path`` hands each one's file to whoever reads it, so that
the store and its decode workers read local xorbs with ``pread`` and
``preadv``, never through a copy.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

from xetfs.base.errors import MissingObjectError, StoreError
from xetfs.storage.layout import HF_XET_OWN, SHARD_NAME, XORB_NAME, Listing, find_root, store_top
from xetfs.storage.objects import RemoteOptions, scatter, settled


class DirSource:
    """The files of one store directory.  Thread-safe (every call opens what it reads)."""

    def __init__(self, top: Path, root: Path) -> None:
        """``top``: the directory object names are relative to; ``root``: the one holding ``shards/``."""
        self.top = top
        self.root = root
        self.location = str(top)

    @classmethod
    def open(cls, path: Path) -> DirSource:
        """The store given as ``path`` (``DIR``, ``DIR/xet`` or ``DIR/xet/xorbs``); ``StoreError`` if it is none."""
        root = find_root(path)
        return cls(store_top(path), root)

    def listing(self) -> Listing:
        """The objects a store reads: the shards in ``shards/``, the xorbs in ``xorbs/``, and the files of each
        directory from the top down to the one that holds them (where ``pack`` keeps its files), without the
        files hf_xet keeps for itself there (``HF_XET_OWN``: side files, its index)."""
        objects: list[tuple[str, int]] = []
        rel = self.root.relative_to(self.top).as_posix()
        rel = "" if rel == "." else rel
        dirs = [self.top]
        for part in rel.split("/") if rel else ():
            dirs.append(dirs[-1] / part)
        for directory in dirs:
            objects += self._files(directory, lambda name: not HF_XET_OWN.fullmatch(name))
        objects += self._files(self.root / "shards", SHARD_NAME.fullmatch)
        objects += self._files(self.root / "xorbs", XORB_NAME.fullmatch)
        # When the store last changed: pack adds shards, and renames its files into these directories.
        return Listing(tuple(objects), max(_mtime(d) for d in (*dirs, self.root / "shards")))

    def _files(self, directory: Path, wanted: Callable[[str], object]) -> list[tuple[str, int]]:
        out = []
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise StoreError(f"store {self.location}: cannot list {directory}: {exc.strerror}") from None
        for entry in entries:
            if entry.name.startswith(".") or not wanted(entry.name) or not entry.is_file():
                continue
            try:
                size = entry.stat().st_size
            except OSError:
                continue
            out.append((Path(entry.path).relative_to(self.top).as_posix(), size))
        return out

    # -- ObjectSource --------------------------------------------------------

    def local_path(self, name: str) -> str | None:
        # (a string join, not a Path: every read of a local store asks, and pathlib costs microseconds)
        return f"{self.location}/{name}" if name else self.location

    def worker_setup(self) -> tuple[str, RemoteOptions] | None:
        return None

    def read(self, name: str, *, limit: int, fresh: bool = False) -> bytes:
        path = self.top / name
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size > limit:
                    raise StoreError(f"{path}: {size} bytes, more than the {limit} allowed")
                return f.read()
        except FileNotFoundError:
            raise MissingObjectError(f"{path}: not found") from None
        except OSError as exc:
            raise StoreError(f"{path}: cannot read: {exc.strerror}") from None

    def read_range(self, name: str, start: int, end: int) -> bytes:
        from xetfs.storage.layout import read_range

        path = self.top / name
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise MissingObjectError(f"{path}: not found") from None
        except OSError as exc:
            raise StoreError(f"{path}: cannot open: {exc.strerror}") from None
        try:
            return read_range(fd, start, end, where=str(path))
        finally:
            os.close(fd)

    def read_range_into(self, name: str, start: int, end: int, parts: Sequence[memoryview]) -> None:
        scatter(self.read_range(name, start, end), parts)

    def tag(self, name: str) -> str | None:
        try:
            st = os.stat(self.top / name)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StoreError(f"{self.top / name}: cannot stat: {exc.strerror}") from None
        return settled(f"{st.st_ino} {st.st_size} {st.st_mtime_ns}", st.st_mtime)

    def list(self, prefix: str) -> list[tuple[str, int, float]] | None:
        """The objects of ``listing`` under ``prefix`` (their times: the listing's); the shards directory's
        prefix scans that directory alone."""
        shards = self.root / "shards"
        if prefix and self.top / prefix.rstrip("/") == shards:
            return [(name, size, _mtime(shards)) for name, size in self._files(shards, SHARD_NAME.fullmatch)]
        listing = self.listing()
        return [(name, size, listing.mtime) for name, size in listing.objects if name.startswith(prefix)]


def _mtime(directory: Path) -> float:
    try:
        return directory.stat().st_mtime
    except OSError:
        return 0.0
