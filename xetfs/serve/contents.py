"""The store as the server reads it: catalogue, file index, and verified bytes.

The server's one door to the store and the read path.  Everything the
routes need goes through four calls of a ``Snapshot``: ``entry`` (a file by
Xet hash), ``terms`` (its terms), ``chunks`` (the serialized bytes of chunks
``[first, stop)`` of a xorb, each chunk decoded and checked against its
hash before they are returned) and ``read`` (decoded, verified bytes of a
file, from ``Reader``).  Nothing here is copied from the mount: layouts and
file reads come from ``Reader``, raw chunks from the store's
``read_chunks`` and the checks from ``format.xorb.check_run``.

``Contents`` holds the current snapshot and replaces it when the store
changes (a pack added shards or rewrote the catalogue), so new repos appear
without a restart.  A store is looked at again at most every ``rescan``
seconds (by default ``SERVE_RESCAN`` for a directory, ``SERVE_REMOTE_RESCAN``
for a URL) and when a lookup misses (for a URL, at most every
``SERVE_RESCAN`` seconds).  A look at a directory compares its shard names and
catalogue file; a timed look at a URL fetches its catalogue, so that a branch
a push moved is served; both load the store again only if those changed.  A
miss on a URL loads it again (a push may have added any object).  A snapshot
is immutable, so a request keeps the one it started with.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import trio

from xetfs.base import hashes
from xetfs.base.errors import XetfsError
from xetfs.base.settings import IO_TIMEOUT, SERVE_CACHE_SIZE, SERVE_REMOTE_RESCAN, SERVE_RESCAN
from xetfs.format.xorb import check_run
from xetfs.read.loader import threaded_io
from xetfs.read.reader import Reader
from xetfs.serve.reconstruction import Term
from xetfs.storage.catalogue import CATALOGUE_NAME, MAX_CATALOGUE_BYTES, Catalogue, find_catalogue, store_catalogue
from xetfs.storage.index import FileEntry, Index
from xetfs.storage.indexer import load_index
from xetfs.storage.layout import find_root
from xetfs.storage.objects import is_url
from xetfs.storage.store import Store

log = logging.getLogger("xetfs.serve")


@dataclass(frozen=True)
class Snapshot:
    """One consistent view of the store."""

    store: Store
    index: Index
    catalogue: Catalogue
    reader: Reader

    def entry(self, xet_hash: str) -> FileEntry | None:
        """The file whose Xet hash (hex) is ``xet_hash``, or None."""
        return self.index.get(hashes.from_hex(xet_hash)) if hashes.is_hex(xet_hash) else None

    def terms(self, entry: FileEntry) -> list[Term]:
        return [Term(x, first, stop, size) for x, first, stop, size in self.index.terms_of(entry)]

    async def chunks(self, xorb: bytes, first: int, stop: int) -> bytes:
        """Serialized chunks ``[first, stop)`` of ``xorb`` (headers included, as stored), all checked.

        Raises the read path's errors: ``IntegrityError`` for a chunk whose
        bytes do not hash to its recorded hash, ``FormatError`` for one that
        does not decode, ``MissingObjectError``, ``ObjectReadError`` or
        ``StoreError``.
        """
        layout = await self.reader.layout(xorb)
        start, end = layout.phys_start(first), layout.phys_ends[stop - 1]
        store = self.store

        def read_and_check() -> bytes:
            data = store.read_chunks(xorb, start, end, first, stop)
            for problem in check_run(data, xorb, layout, first, stop):
                if problem is not None:
                    raise problem
            return data if isinstance(data, bytes) else bytes(data)  # (a remote store's bytes come as a view)

        return await trio.to_thread.run_sync(read_and_check)

    async def read(self, entry: FileEntry, offset: int, size: int) -> bytes:
        """Decoded bytes ``[offset, offset + size)`` of a file, verified (``Reader.read``), as a copy."""
        return bytes(await self.reader.read(entry, offset, size))


@dataclass(frozen=True)
class _Loaded:
    store: Store
    index: Index
    catalogue: Catalogue


class Contents:
    """The current ``Snapshot`` of the store at ``location`` (a directory or a store URL)."""

    def __init__(
        self,
        location: str,
        open_store: Callable[[str], Store],
        *,
        rescan: float | None = None,
        io_timeout: float = IO_TIMEOUT,
    ) -> None:
        self.location = location
        self._open_store = open_store
        self._remote = is_url(location)
        self._rescan = rescan if rescan is not None else SERVE_REMOTE_RESCAN if self._remote else SERVE_RESCAN
        self._io_timeout = io_timeout
        self._lock = trio.Lock()
        self._signature: object = None
        # When the last look at the store started: time.time(), the clock signed URLs are dated by.
        self._looked = time.time()
        self._snapshot = self._make(self._load())

    def _load(self) -> _Loaded:
        """Open the store, index its shards and read its catalogue (blocking; the reader is made by the caller's
        thread in ``_make``)."""
        signature = self._local_signature()
        store = self._open_store(self.location)
        if self._remote:
            signature = self._remote_signature(store)
        index = load_index(store).index
        catalogue = self._catalogue(store)
        for warning in catalogue.warnings:
            log.warning("catalogue: %s", warning)
        self._signature = signature
        return _Loaded(store, index, catalogue)

    def _make(self, loaded: _Loaded) -> Snapshot:
        reader = Reader(loaded.index, loaded.store, cache_size=SERVE_CACHE_SIZE, io=threaded_io(self._io_timeout))
        return Snapshot(loaded.store, loaded.index, loaded.catalogue, reader)

    def _catalogue(self, store: Store) -> Catalogue:
        return store_catalogue(store) or Catalogue()

    def _remote_signature(self, store: Store) -> object:
        """What changes when a push moves a branch of a remote store: its catalogue's bytes (fetched)."""
        return store.read_meta(CATALOGUE_NAME, limit=MAX_CATALOGUE_BYTES)

    def _local_signature(self) -> object:
        """What changes when a pack adds to a local store: the catalogue file and the shard names."""
        if self._remote:
            return None
        path = find_catalogue(Path(self.location))
        st = path.stat() if path is not None else None
        shards = sorted(os.listdir(find_root(Path(self.location)) / "shards"))
        return (st.st_mtime_ns, st.st_size, st.st_ino) if st else None, shards

    async def snapshot(self, *, missed: bool = False) -> Snapshot:
        """The current snapshot, after looking at the store again when that is due (see the module docstring):
        ``missed`` says the caller did not find what it looked for."""
        now = time.time()
        since = now - self._looked
        if not 0 <= since < self._rescan:  # (a clock set back: due too)
            return await self.looked_at_since(now, missed=missed)
        if missed and not (self._remote and 0 <= since < SERVE_RESCAN):
            return await self.looked_at_since(now, missed=True)
        return self._snapshot

    async def looked_at_since(self, when: float, *, missed: bool = True) -> Snapshot:
        """A snapshot from a look at the store that started at ``when`` (``time.time()``) or later: the store
        is looked at again unless such a look happened already.

        Also for a signed xorb URL naming a xorb the snapshot does not know,
        with ``when`` the latest time it can have been signed: signed after
        this process last looked (by another server process, after a pack),
        the xorb may be new; signed before, it is not in the store.
        """
        async with self._lock:
            if self._looked < when:
                loaded = await trio.to_thread.run_sync(self._refresh, missed)
                if loaded is not None:
                    old, self._snapshot = self._snapshot, self._make(loaded)
                    old.store.close()  # (its open files; a read in progress holds its own descriptor)
                    if len(loaded.index) != len(old.index) or loaded.catalogue != old.catalogue:
                        log.info("store %s changed: %d files, %d repos", _shown(self.location),
                                 len(loaded.index), len(loaded.catalogue.repos))  # fmt: skip
        return self._snapshot

    def _refresh(self, missed: bool) -> _Loaded | None:
        """A new snapshot when the store changed, else None (blocking).  A remote store that ``missed``
        something is taken to have changed; otherwise its catalogue says."""
        started = time.time()
        try:
            if self._remote:
                if not missed and self._remote_signature(self._snapshot.store) == self._signature:
                    return None
            elif self._local_signature() == self._signature:
                return None
            return self._load()
        except (XetfsError, OSError) as exc:
            log.warning("store %s: cannot load it again, serving what was loaded: %s", _shown(self.location), exc)
            return None
        finally:
            self._looked = started


def _shown(location: str) -> str:
    from xetfs.storage.objects import public_url

    return public_url(location) if is_url(location) else os.fspath(location)
