"""Opening a store by location, and publishing a store directory for plain HTTP servers.

``open_store`` gives the one ``store.Store`` for a directory or a URL: a URL
is read through an ``objects.ObstoreSource`` (HTTP(S), S3, GCS, Azure),
with the disk cache (``diskcache``, ``chunkcache``) in between unless it is
turned off.  An HTTP server cannot list a directory, so a store it serves
carries a listing, ``xetfs-listing.json`` at its top (written by ``xetfs
pack`` and ``xetfs publish``): every object's path and size.  Object stores
that can list are listed directly.
"""

from __future__ import annotations

import logging
import os
import urllib.parse
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path, PurePosixPath

from xetfs.base.errors import (
    MissingObjectError,
    NoRangeRequestsError,
    ServerUnreachableError,
    StoreError,
    StoreTimeoutError,
    XetfsError,
)
from xetfs.base.settings import IO_TIMEOUT, PROBE_TIMEOUT
from xetfs.base.stats import RemoteCounters
from xetfs.storage.catalogue import CATALOGUE_NAME
from xetfs.storage.chunkcache import ChunkCache
from xetfs.storage.dirsource import DirSource
from xetfs.storage.diskcache import CachedSource, DiskCache, default_dir, from_server
from xetfs.storage.layout import LISTING_NAME, MAX_LISTING_BYTES, Listing, check_listed, replace_file, store_top
from xetfs.storage.manifest import MANIFEST_NAME
from xetfs.storage.objects import ObjectSource, ObstoreSource, RemoteOptions, is_url, public_url
from xetfs.storage.store import Store

log = logging.getLogger(__name__)


def local_listing(top: Path) -> Listing:
    """The listing of the store directory ``top``, as a remote store reads it (without the listing itself)."""
    source = DirSource.open(top)
    listing = source.listing()
    return Listing(tuple(o for o in listing.objects if o[0] != LISTING_NAME), listing.mtime)


def publish(top: str | os.PathLike[str]) -> tuple[Path, Listing]:
    """Write (atomically) or refresh ``TOP/xetfs-listing.json`` for the store directory ``top``."""
    top_dir = Path(top)
    listing = local_listing(top_dir)
    path = DirSource.open(top_dir).top / LISTING_NAME
    try:
        replace_file(path, listing.dump())
    except OSError as exc:
        raise StoreError(f"{path}: cannot write the listing: {exc.strerror}") from None
    return path, listing


def load_listing(source: ObjectSource) -> Listing:
    """The store's listing: listed by the service when it can, else its ``xetfs-listing.json``."""
    listed = _list(source)
    if listed is not None:
        return _listed(listed, source.location)
    return _listing_file(source)


def listing_if_changed(source: ObjectSource, tag: str | None) -> tuple[Listing | None, str | None]:
    """``load_listing`` from the server itself (a refresh must not take an old listing for a new one; the new
    one is kept in the disk cache, if any), or None where it cannot have changed: an HTTP store's
    ``LISTING_NAME`` whose ``ObjectSource.tag`` is still ``tag``.  With that tag (None for a store that
    lists itself, which is listed every time)."""
    server = from_server(source)
    listed = _list(server)
    if listed is not None:
        return _listed(listed, source.location), None
    now = server.tag(LISTING_NAME)
    if now is not None and now == tag:
        return None, tag
    return _listing_file(server), now


def _list(source: ObjectSource) -> list[tuple[str, int, float]] | None:
    """Every object the service lists (None: it cannot list); a bucket or container that is not there is a
    ``StoreError`` that says so."""
    try:
        return source.list("")
    except MissingObjectError:
        raise StoreError(f"store {source.location}: no such bucket or container (is it mistyped?)") from None


def _listed(listed: list[tuple[str, int, float]], location: str) -> Listing:
    """The listing of what a service listed (checked, for a bucket: ``check_listed``)."""
    mtime = max((t for *_, t in listed), default=0.0)
    listing = Listing(tuple((n, s) for n, s, _ in listed), mtime)
    if is_url(location):  # (a directory's listing is checked when it is opened: ``find_root``)
        check_listed(listing, location)
    return listing


def _listing_file(source: ObjectSource) -> Listing:
    """The store's ``LISTING_NAME`` (an HTTP server cannot list)."""
    try:
        data = source.read(LISTING_NAME, limit=MAX_LISTING_BYTES, fresh=True)
    except MissingObjectError:
        raise StoreError(
            f"store {source.location}: no {LISTING_NAME} there: is the URL mistyped? (an HTTP server cannot "
            f"list directories: a store it serves needs its listing, which 'xetfs publish DIR' writes)"
        ) from None
    return Listing.parse(data, where=f"{source.location}/{LISTING_NAME}")


def open_remote(
    url: str,
    options: RemoteOptions | None = None,
    *,
    cache: DiskCache | None = None,
    counters: RemoteCounters | None = None,
) -> Store:
    """The store at ``url``, read through ``cache`` when one is given."""
    options = options or RemoteOptions()
    source: ObjectSource = ObstoreSource(url, options, counters)
    if cache is not None:
        source = CachedSource(source, cache)
    try:
        listing = load_listing(source)
    except (ServerUnreachableError, StoreTimeoutError):
        raise
    except StoreError as exc:
        _refuse_xet_folders(url, options)  # (over HTTP, the listing is at the store's top)
        if str(exc).startswith(("store ", source.location)):
            raise
        raise StoreError(f"store {source.location}: {exc}") from None
    store = Store(source, listing, ChunkCache(cache) if cache is not None else None)
    if store.meta_path(CATALOGUE_NAME) is None and store.meta_path(MANIFEST_NAME) is None:
        _refuse_xet_folders(url, options)
    if urllib.parse.urlsplit(url).scheme in ("http", "https"):
        _warn_without_ranges(ObstoreSource(url, _quick(options, deadline=0.0)), store)  # (a deadline of 0: one try)
    return store


def _quick(options: RemoteOptions, *, deadline: float = PROBE_TIMEOUT) -> RemoteOptions:
    """``options`` for a probe: an answer within ``PROBE_TIMEOUT``, tried again until ``deadline``, or none."""
    return replace(options, deadline=min(options.deadline, deadline),
                   request_timeout=min(options.request_timeout, PROBE_TIMEOUT))  # fmt: skip


def _warn_without_ranges(server: ObstoreSource, store: Store) -> None:
    """Say so when the web server sends a whole object for a range request (Python's ``http.server``, say): the
    listing and the shards, read whole, make a mount, but no xorb can be read from it.  One request, for the
    first byte of a shard, tried once and answered within ``PROBE_TIMEOUT`` or not at all; any other failure is
    left to the reads that meet it."""
    shards = store.shard_files()
    if not shards:
        return
    try:
        server.read_range(shards[0].path.as_posix(), 0, 1)  # (a shard, read whole anyway: no xorb byte twice)
    except NoRangeRequestsError as exc:
        log.warning("%s; only what the disk cache holds can be read", exc)
    except XetfsError:
        pass


def _refuse_xet_folders(url: str, options: RemoteOptions) -> None:
    """Refuse ``url`` when it names the xet folders of a store (``TOP/xet`` or ``TOP/xet/xorbs``, hf_xet's layout)
    and ``TOP`` holds the store's catalogue or names manifest: mounted, ``url`` would show bare hashes.  Asked
    only of such URLs with no names of their own (a ``HEAD`` each, given ``PROBE_TIMEOUT`` at most): one that
    cannot be answered refuses nothing."""
    parts = urllib.parse.urlsplit(url)
    path = PurePosixPath(parts.path or "/")
    if store_top(path) == path:
        return
    top = urllib.parse.urlunsplit(parts._replace(path=str(store_top(path)).rstrip("/")))
    source = ObstoreSource(top, _quick(options))
    if source.exists(CATALOGUE_NAME) or source.exists(MANIFEST_NAME):
        raise StoreError(f"store {public_url(url)}: these are the xet folders of the store {public_url(top)}, whose "
                         f"names (its catalogue or manifest) lie at its top: give {public_url(top)}")  # fmt: skip


def open_store(
    location: str,
    *,
    io_timeout: float = IO_TIMEOUT,
    headers: Sequence[str] = (),
    cache_dir: Path | None = None,
    disk_cache_size: int,
    counters: RemoteCounters | None = None,
) -> Store:
    """The store at ``location``: a directory, or a URL.

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
    return open_remote(location, options, cache=cache, counters=counters)
