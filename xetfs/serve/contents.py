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
without a restart.  A directory is looked at by the first request after
``rescan`` seconds (by default ``SERVE_RESCAN``): the look compares its shard
names and catalogue file, and the request waits for it (it is quick).  A URL
is looked at every ``rescan`` seconds (by default ``SERVE_REMOTE_RESCAN``) by
a task of its own (``watch``), requests or none, so that a branch a push moved
is served within about that long of the push even by a process that was idle
then: the look asks the server itself for its catalogue's tag (a HEAD:
``ObjectSource.tag``), fetches the catalogue only when the tag changed, and
loads the store again if the catalogue did; requests go on meanwhile, and a
look that fails is said once until the server answers.  A
request that misses something loads a directory's changes, or the whole of a
URL's store (a push may have added any object; at most every
``SERVE_RESCAN`` seconds), first.  A snapshot is immutable, so a request keeps
the one it started with.
"""

from __future__ import annotations

import hashlib
import logging
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import trio

from xetfs.base import hashes
from xetfs.base.errors import MissingObjectError, XetfsError
from xetfs.base.settings import IO_TIMEOUT, SERVE_CACHE_SIZE, SERVE_REMOTE_RESCAN, SERVE_RESCAN
from xetfs.format.xorb import check_run
from xetfs.read.loader import threaded_io
from xetfs.read.reader import Reader
from xetfs.serve.reconstruction import Term
from xetfs.storage.catalogue import (
    CATALOGUE_NAME,
    MAX_CATALOGUE_BYTES,
    Catalogue,
    dump_catalogue,
    find_catalogue,
    parse_catalogue,
    store_catalogue,
)
from xetfs.storage.diskcache import from_server
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
    version: str = ""  # a digest of the catalogue served (``/health``: which processes serve the same)

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
        # Times are time.time(), the clock signed URLs are dated by.  ``_known``: the snapshot holds everything
        # the store held when a look started then (a load, or a local look that found nothing changed).
        # ``_looked``: when the last look at a local store, or load of any store, started.
        self._known = self._looked = time.time()
        self._unreachable = False  # the last timed look could not fetch the catalogue (said once)
        self._catalogue_tag: str | None = None  # the server's tag of the catalogue loaded (remote stores)
        self._snapshot = self._make(self._load())

    def _load(self) -> _Loaded:
        """Open the store, index its shards and read its catalogue (blocking; the reader is made by the caller's
        thread in ``_make``)."""
        started = time.time()
        signature = self._local_signature()
        store = self._open_store(self.location)
        index = load_index(store).index
        tag = None
        if self._remote:
            tag = self._tag(store)  # (taken first: a change after it is seen by the next look)
            data = self._remote_catalogue(store)
            signature = _digest(data)
            catalogue = (
                Catalogue() if data is None else parse_catalogue(data, source=f"{store.location}/{CATALOGUE_NAME}")
            )
        else:
            catalogue = store_catalogue(store) or Catalogue()
        for warning in catalogue.warnings:
            log.warning("catalogue: %s", warning)
        self._signature, self._catalogue_tag = signature, tag  # (only for a load that succeeded)
        self._known = max(self._known, started)
        return _Loaded(store, index, catalogue)

    def _make(self, loaded: _Loaded) -> Snapshot:
        reader = Reader(loaded.index, loaded.store, cache_size=SERVE_CACHE_SIZE, io=threaded_io(self._io_timeout),
                        hung_for=None if loaded.store.local else self._io_timeout)  # fmt: skip
        version = hashlib.blake2b(dump_catalogue(loaded.catalogue), digest_size=8).hexdigest()
        return Snapshot(loaded.store, loaded.index, loaded.catalogue, reader, version)

    @staticmethod
    def _remote_catalogue(store: Store, *, server_only: bool = False) -> bytes | None:
        """The catalogue of a remote store, fetched (None if it has none).  With ``server_only``, from the
        server itself, never a copy in the disk cache (a timed look must not take an old copy for news)."""
        source = from_server(store.source) if server_only else store.source
        try:
            return source.read(store.meta_place(CATALOGUE_NAME), limit=MAX_CATALOGUE_BYTES, fresh=True)
        except MissingObjectError:
            return None

    @staticmethod
    def _tag(store: Store) -> str | None:
        """The server's tag of a remote store's catalogue (``ObjectSource.tag``), or None if it has none or
        cannot say now."""
        try:
            return from_server(store.source).tag(store.meta_place(CATALOGUE_NAME))
        except (XetfsError, OSError):
            return None

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
        ``missed`` says the caller did not find what it looked for.  A remote store's timed looks are
        ``watch``'s: no request waits for them."""
        now = time.time()
        if self._remote:
            if missed and not 0 <= now - self._known < SERVE_RESCAN:
                return await self.looked_at_since(now)
            return self._snapshot
        if missed or not 0 <= now - self._looked < self._rescan:  # (a clock set back: due too)
            return await self.looked_at_since(now)
        return self._snapshot

    async def looked_at_since(self, when: float) -> Snapshot:
        """A snapshot that holds everything the store held at ``when`` (``time.time()``): the store is loaded
        again unless a load (or, for a local store, a look) started at ``when`` or later.

        Also for a signed xorb URL naming a xorb the snapshot does not know,
        with ``when`` the latest time it can have been signed: signed after
        this process last loaded (by another server process, after a pack),
        the xorb may be new; signed before, it is not in the store.
        """
        async with self._lock:
            if self._known < when:
                self._install(await trio.to_thread.run_sync(self._refresh))
        return self._snapshot

    async def watch(self) -> None:
        """Look at a remote store's catalogue every ``rescan`` seconds, for as long as the server runs (a task of
        its own: ``_timed_look``).  Returns at once for a local store, which requests look at."""
        if not self._remote:
            return
        # (the first look at a random point of the first period: the processes of a server start together, and
        # would otherwise look, and load again after a push, all at once)
        await trio.sleep(self._rescan * random.uniform(0.5, 1.0))
        while True:
            await self._timed_look()
            await trio.sleep(self._rescan)

    async def _timed_look(self) -> None:
        """Fetch a remote store's catalogue, and load the store again if it changed (a push moved a branch)."""
        try:
            if await trio.to_thread.run_sync(self._catalogue_changed, abandon_on_cancel=True):  # (not under the lock)
                async with self._lock:
                    self._install(await trio.to_thread.run_sync(self._refresh, abandon_on_cancel=True))
        except Exception:  # (the watch goes on: the server serves what it has)
            log.exception("store %s: looking at its catalogue failed", _shown(self.location))

    def _catalogue_changed(self) -> bool:
        """Whether a remote store's catalogue differs from the one loaded: asked by its tag (no body), then,
        when the tag is new, fetched and compared."""
        store = self._snapshot.store
        tag = self._tag(store)
        if tag is not None and tag == self._catalogue_tag and not self._unreachable:
            return False
        try:
            data = self._remote_catalogue(store, server_only=True)
        except (XetfsError, OSError) as exc:
            if not self._unreachable:
                log.warning("store %s: cannot fetch its catalogue, serving what was loaded (said once until it "
                            "answers): %s", _shown(self.location), exc)  # fmt: skip
            self._unreachable = True
            return False
        if self._unreachable:
            log.info("store %s: its catalogue answers again", _shown(self.location))
        self._unreachable = False
        if _digest(data) != self._signature:
            return True
        self._catalogue_tag = tag  # (rewritten, same bytes: the next look needs no fetch)
        return False

    def _install(self, loaded: _Loaded | None) -> None:
        if loaded is None:
            return
        old, self._snapshot = self._snapshot, self._make(loaded)
        old.store.close()  # (its open files; a read in progress holds its own descriptor)
        if len(loaded.index) != len(old.index) or loaded.catalogue != old.catalogue:
            log.info("store %s changed: %d files, %d repos", _shown(self.location),
                     len(loaded.index), len(loaded.catalogue.repos))  # fmt: skip

    def _refresh(self) -> _Loaded | None:
        """A new snapshot when the store may have changed, else None (blocking): a local store is compared
        with what was loaded; a remote one is loaded again."""
        started = time.time()
        try:
            if not self._remote and self._local_signature() == self._signature:
                self._known = max(self._known, started)
                return None
            return self._load()
        except (XetfsError, OSError) as exc:
            log.warning("store %s: cannot load it again, serving what was loaded: %s", _shown(self.location), exc)
            return None
        finally:
            self._looked = max(self._looked, started)


def _digest(catalogue: bytes | None) -> bytes | None:
    """What a remote store's signature keeps of its catalogue."""
    return None if catalogue is None else hashlib.blake2b(catalogue, digest_size=32).digest()


def _shown(location: str) -> str:
    from xetfs.storage.objects import public_url

    return public_url(location) if is_url(location) else os.fspath(location)
