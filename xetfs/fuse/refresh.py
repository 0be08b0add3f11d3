"""Refreshing a live mount: what was added to its store since it was mounted, without a remount.

A pack (or a push) adds shards, xorbs, and perhaps a new catalogue or
names manifest to a store; a mount reads them only when it refreshes
(``xetfs refresh MNT`` sends its daemon ``SIGUSR1``; ``--refresh-every S``
refreshes on a timer).  A refresh:

1. lists the store again, from the server itself for a remote store (never
   a cached listing), reads and parses the new shards and indexes them into
   a copy of the index, reads the catalogue or manifest again and builds the
   tree again: all in a thread, with nothing of the live mount changed, so
   that a refresh that fails (the server is down) leaves the mount as it
   was, and says why.  A bad new shard is skipped with a warning, as a
   mount skips one (said once; each refresh reads it again, so that a
   repaired one is taken in).  A refresh that finds no new shard,
   and the catalogue and manifest as the last one found them (``tag``: an
   ETag, or a file's identity, asked without the body), stops there, having
   listed only the store's ``shards/`` (a bucket, a directory) or asked the
   listing's tag (HTTP): many nodes refreshing often cost the server a few
   small requests each, not the catalogue and every xorb's name;
2. then, on the daemon's thread, puts the new index and tree in place
   (``stabletree.renumber``: inodes the kernel knows keep their numbers) and
   asks the kernel to forget what the change made wrong: directory entries,
   attributes, the bytes of a ref that moved.  Those requests run in
   threads or pyfuse3's queue, never blocking the daemon.

Files already open keep reading what they read: a read session holds its
file's entry, and the store only grows.  A file no name shows any more is
still read through open handles and by hash (``.xetfs/by-hash``).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import pyfuse3
import trio

from xetfs.base.errors import FormatError, IntegrityError, ServerUnreachableError, XetfsError
from xetfs.base.messages import plural
from xetfs.base.settings import REFRESH_FAILURES_QUIET
from xetfs.base.stats import RefreshCounters
from xetfs.names.stabletree import Changes, TreeLike, renumber
from xetfs.storage.catalogue import CATALOGUE_NAME
from xetfs.storage.diskcache import from_server
from xetfs.storage.index import Index
from xetfs.storage.indexer import read_shard
from xetfs.storage.layout import SHARD_NAME
from xetfs.storage.manifest import MANIFEST_NAME
from xetfs.storage.objects import ObjectSource
from xetfs.storage.remote import listing_if_changed
from xetfs.storage.store import Store

log = logging.getLogger(__name__)

TREE_FROM = (CATALOGUE_NAME, MANIFEST_NAME)  # the store's files a mount's tree is built from


@dataclass(frozen=True)
class _Update:
    index: Index
    tree: TreeLike
    changes: Changes
    shards: int
    shard_names: frozenset[str]
    tags: dict[str, str | None]  # of the files the tree was built from, as taken before it was built


class Refresher:
    """Refreshes of one mount: ``refresh`` is safe to call at any time from the daemon's trio thread."""

    def __init__(
        self,
        fs: RefreshTarget,
        store: Store,
        build_tree: Callable[[Index], TreeLike],
        tree_from: tuple[str, ...] | None = TREE_FROM,
    ) -> None:
        """``fs``: what serves the index and tree, and holds the counters; ``build_tree``: the mount's tree
        of an index (its layout, catalogue or names read afresh from the store), which may raise
        ``XetfsError``; ``tree_from``: the store's files it reads, or None where it reads others too
        (``--names FILE``): then every refresh builds it again."""
        self.fs = fs
        self.store = store
        self.build_tree = build_tree
        self._tree_from = tree_from
        self._tags: dict[str, str | None] | None = None  # of those files, at the last refresh put in place
        self._listing_tag: str | None = None  # of an HTTP store's listing, when last read
        # Shards the mount has taken in: those it found when it started (a bad one among them was skipped
        # then, with a warning), and those a refresh indexed.  Only a refresh that is put in place adds here,
        # so the shards of one that failed are read again by the next.
        self._indexed = {shard.name for shard in store.shard_files()}
        self._lock = trio.Lock()
        self._bad: set[str] = set()  # new shards found bad and skipped (each said once)
        self._failing = 0  # refreshes failed in a row
        self._failure_logged = 0.0  # when the last of them was logged (``time.monotonic``)

    async def refresh(self) -> None:
        """Load what was added to the store; a failure is logged and counted, never raised."""
        async with self._lock:
            try:
                update = await trio.to_thread.run_sync(self._prepare, self.fs.current_index(), self.fs.current_tree())
            except ServerUnreachableError as exc:  # (its first request may be for a file the store does not have)
                self._failed(f"the store's server cannot be reached ({exc})")
                return
            except (XetfsError, OSError) as exc:
                self._failed(str(exc))
                return
            except Exception as exc:  # a bug: the mount goes on as it was, and the log has the traceback
                log.exception("refresh failed")
                self._failed(f"internal error: {exc!r}")
                return
            c = self.fs.refresh
            if self._failing:
                log.warning(
                    "refresh works again, after %s", plural(self._failing, "failed refresh", "failed refreshes")
                )
                self._failing = 0
            if update is None:
                c.refreshes += 1
                c.unchanged += 1
                c.last_refresh = int(time.time())
                self.fs.refresh_error = ""
                log.info("refreshed: no change (no new shard; catalogue and manifest as they were)")
                return
            files = len(update.index) - len(self.fs.current_index())
            self.fs.replace(update.index, update.tree)
            self._indexed |= update.shard_names
            self._tags = update.tags
            c.refreshes += 1
            c.last_refresh = int(time.time())
            c.files_added += files
            c.shards_added += update.shards
            c.names_added += update.changes.added
            self.fs.refresh_error = ""
            log.info("refreshed: %d new shards, %d new files, %d new names", update.shards, files,
                     update.changes.added)  # fmt: skip
            await _invalidate(update.changes)

    def _failed(self, reason: str) -> None:
        """Count a failed refresh; log the first of a run of them, then one every ``REFRESH_FAILURES_QUIET``
        seconds (``--refresh-every 1`` against a server that is down would log every second)."""
        self.fs.refresh.failures += 1
        self.fs.refresh.last_failure = int(time.time())
        self.fs.refresh_error = reason
        self._failing += 1
        now = time.monotonic()
        if self._failing == 1 or now - self._failure_logged >= REFRESH_FAILURES_QUIET:
            again = (
                f" ({plural(self._failing, 'failed refresh', 'failed refreshes')} in a row)"
                if self._failing > 1
                else ""
            )
            log.warning("refresh failed, the mount is as it was%s: %s", again, reason)
            self._failure_logged = now

    def _prepare(self, index: Index, tree: TreeLike) -> _Update | None:
        """The new index and tree, or None if nothing changed (in a thread; nothing the mount serves changes
        here: the store only learns of more objects, which nothing reads until the new index names them)."""
        server = from_server(self.store.source)
        # (Tags first: a change after them is seen by the next refresh.)
        tags = {name: server.tag(self.store.meta_place(name)) for name in self._tree_from or ()}
        same = self._tree_from is not None and tags == self._tags
        if same and not self._may_have_new_shards(server):
            return None
        listing, self._listing_tag = listing_if_changed(self.store.source, self._listing_tag)
        if listing is not None:
            self.store.add(listing)
        new = [f for f in self.store.shard_files() if f.name not in self._indexed]
        if not new and same:
            return None
        shards = {}
        for f in new:
            try:
                shards[f.name] = read_shard(self.store, f)
            except (FormatError, IntegrityError) as exc:  # (a server that fails is not skipped: the refresh fails)
                if f.name not in self._bad:
                    log.warning("refresh: skipping %s (read again by every refresh)", exc)
                    self._bad.add(f.name)
        grown = index.copy()
        for shard in shards.values():
            grown.add_shard(shard)
        stable, changes = renumber(tree, self.build_tree(grown))
        return _Update(grown, stable, changes, len(shards), frozenset(shards), tags)

    def _may_have_new_shards(self, server: ObjectSource) -> bool:
        """False when a listing of the store's shards alone (a bucket's, a directory's) names none this mount
        lacks: xorbs a push added are read only once a shard names them, so the whole listing can wait.
        True where the source cannot list (HTTP: ``listing_if_changed`` asks the listing's tag), and for a store
        with no shard yet (where its shards will lie is not known)."""
        if not self._indexed:
            return True
        prefix = self.store.shard_prefix()
        listed = server.list(prefix)
        if listed is None:
            return True
        names = (name[len(prefix) :] for name, _, _ in listed if name.startswith(prefix))
        return any(SHARD_NAME.fullmatch(n) and n not in self._indexed for n in names)  # (in shards/ itself)


class RefreshTarget(Protocol):
    """What a refresh changes: the served index and tree (``fs.XetFS``), and where it counts."""

    refresh: RefreshCounters
    refresh_error: str

    def current_index(self) -> Index: ...

    def current_tree(self) -> TreeLike: ...

    def replace(self, index: Index, tree: TreeLike) -> None: ...


async def _invalidate(changes: Changes) -> None:
    """Ask the kernel to forget what ``changes`` made wrong, without ever blocking the daemon's thread."""
    for parent, name in changes.entries:
        pyfuse3.invalidate_entry_async(parent, name, ignore_enoent=True)
    inodes = [(inode, True) for inode in (*changes.directories, *changes.attributes)]
    inodes += [(inode, False) for inode in changes.contents]
    if inodes:
        await trio.to_thread.run_sync(_forget, inodes, abandon_on_cancel=True)


def _forget(inodes: list[tuple[int, bool]]) -> None:
    for inode, attr_only in inodes:
        with contextlib.suppress(OSError):  # ENOENT: the kernel does not have it cached, nothing to forget
            pyfuse3.invalidate_inode(inode, attr_only)
