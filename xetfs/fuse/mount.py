"""The mount daemon: it builds the filesystem, mounts it, serves until unmounted, and handles signals.

``xetfs mount`` runs it in a child process and returns once the child says
the mount answers (``launch``); with ``--foreground`` the same code runs in
this process.  The daemon unmounts cleanly on SIGINT,
SIGTERM or SIGHUP, and exits 130 after SIGINT (Ctrl-C), else 0.  A
foreground mount started by hand says on stderr when it answers.  pyfuse3
keeps global state, so there is one mount per process.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import urllib.parse
from pathlib import Path

import pyfuse3
import trio

from xetfs.base.errors import XetfsError, describe
from xetfs.base.exitstatus import ExitStatus
from xetfs.base.malloc import keep_freed_memory
from xetfs.base.mounttable import fs_type
from xetfs.base.settings import (
    JOB_TIMEOUT_MARGIN,
    PREFETCH_CACHE_SHARE,
    PREFETCH_MAXIMUM,
    REMOTE_FETCH_WIDTH,
    REMOTE_PREFETCH,
    REMOTE_RUN_BYTES,
    RUN_BYTES,
)
from xetfs.base.stats import RemoteCounters
from xetfs.fuse.fs import FsOptions, XetFS
from xetfs.fuse.launch import (
    FUSE_FLAGS,
    MountConfig,
    check_mountpoint,
    choose_layout,
    mounted_device,
    report,
    send_warnings,
)
from xetfs.fuse.refresh import TREE_FROM, Refresher
from xetfs.names.hubtree import build_hub_tree
from xetfs.names.tree import Tree, build_tree
from xetfs.read.decode_worker import Setup
from xetfs.read.loader import inline_io, threaded_io
from xetfs.read.pool import DecodePool, default_workers, slots_for
from xetfs.read.reader import Reader
from xetfs.storage.catalogue import CATALOGUE_NAME
from xetfs.storage.index import Index
from xetfs.storage.indexer import load_index
from xetfs.storage.manifest import MANIFEST_NAME, Manifest, load_manifest, store_manifest
from xetfs.storage.objects import is_url, public_url
from xetfs.storage.remote import open_store
from xetfs.storage.store import Store

log = logging.getLogger(__name__)


def _build_tree(config: MountConfig, store: Store, index: Index) -> Tree:
    layout, catalogue = choose_layout(config, store)
    log.info("layout: %s", layout)
    if catalogue is not None:
        for warning in catalogue.warnings:
            log.warning("catalogue: %s", warning)
        tree, warnings = build_hub_tree(index, catalogue)
    else:
        manifest = _load_manifest(config, store) if layout == "names" else None
        for warning in manifest.warnings if manifest else ():
            log.warning("names: %s", warning)
        if config.layout == "names" and manifest is None:
            hub = store.meta_path(CATALOGUE_NAME) is not None
            log.warning("--layout names: %s has no %s: files are shown by hash%s", store.location, MANIFEST_NAME,
                        f" (its {CATALOGUE_NAME} names them: --layout hub)" if hub else "")  # fmt: skip
        tree, warnings = build_tree(index, manifest)
    for warning in warnings:
        log.warning("names: %s", warning)
    return tree


def _load_manifest(config: MountConfig, store: Store) -> Manifest | None:
    if config.names is not None:
        return load_manifest(config.names)
    return store_manifest(store)


def build_fs(config: MountConfig) -> XetFS:
    """Open the store, index it and assemble the filesystem (no FUSE yet)."""
    remote_counters = RemoteCounters()
    store = open_store(os.fspath(config.store), io_timeout=config.io_timeout, headers=config.headers,
                       cache_dir=config.cache_dir, disk_cache_size=config.disk_cache_size,
                       counters=remote_counters)  # fmt: skip
    remote = not store.local
    loaded = load_index(store, strict=config.strict)
    tree = _build_tree(config, store, loaded.index)
    # A remote store is read in the daemon's threads (obstore releases the GIL), many requests at once.
    threaded = remote or choose_io_mode(config.io_mode, Path(config.store)) == "thread"
    io = threaded_io(config.io_timeout) if threaded else inline_io
    log.info("store reads: %s", f"worker threads, {config.io_timeout:g} s bound" if threaded else "inline")
    pool = _decode_pool(config, store, threaded)
    reader = Reader(
        loaded.index, store, cache_size=config.cache_size, io=io, pool=pool, remote=remote_counters,
        fetch_width=REMOTE_FETCH_WIDTH if remote else None, run_bytes=REMOTE_RUN_BYTES if remote else RUN_BYTES,
        read_ahead=config.prefetch, hung_for=config.io_timeout if remote else None,
    )  # fmt: skip
    counters = loaded.counters()
    if counters.shards == 0 and counters.shards_skipped == 0:
        log.warning("store %s has no shards: the mount shows no files", store.location)
    log.info(
        "indexed %d files, %d terms, %d xorbs from %d shards (%d skipped)",
        counters.files, counters.terms, counters.xorbs, counters.shards, counters.shards_skipped,
    )  # fmt: skip
    options = FsOptions(
        uid=os.getuid() if config.uid is None else config.uid,
        gid=os.getgid() if config.gid is None else config.gid,
        direct_io=config.direct_io,
        mtime_ns=int(store.mtime * 1e9),
        prefetch=config.prefetch,
        prefetch_max=min(REMOTE_PREFETCH if remote else PREFETCH_MAXIMUM, config.cache_size // PREFETCH_CACHE_SHARE),
    )
    return XetFS(tree, reader, options, counters)


def _decode_pool(config: MountConfig, store: Store, threaded: bool) -> DecodePool | None:
    """Worker processes for decoding, for every store, unless asked for none.

    Workers read a local store's files themselves, and fetch from a remote
    store's source (its URL and options reach them over their input).  Where
    reads may stall (``threaded``: a remote store, a network filesystem), a
    worker whose job takes longer than ``--io-timeout`` is stopped and
    replaced, and the read fails.
    """
    workers = default_workers() if config.workers is None else config.workers
    if workers <= 0:
        log.info("decoding in the daemon")
        return None
    log.info("decoding in %d worker processes", workers)
    chunks = store.chunks
    setup = Setup(store.source.worker_setup(), str(chunks.tmp) if chunks is not None else None)
    return DecodePool(workers, slots=slots_for(config.cache_size, workers), setup=setup,
                      job_timeout=_job_timeout(config, store, threaded))  # fmt: skip


def _job_timeout(config: MountConfig, store: Store, threaded: bool) -> float | None:
    """How long a decode job may take before its worker is taken for hung: ``--io-timeout`` where a read
    of the store may hang (a network filesystem); a little more for a remote store, whose fetches end by
    themselves within it; no bound for a local disk, read inline as by the daemon."""
    if not threaded:
        return None
    return config.io_timeout if store.local else config.io_timeout + JOB_TIMEOUT_MARGIN


# Filesystems whose reads can stall indefinitely (network, FUSE, cluster).
REMOTE_FS_TYPES = ("nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "ceph", "glusterfs", "lustre",
                   "afs", "davfs", "sshfs", "gpfs", "beegfs", "fuse")  # fmt: skip


def choose_io_mode(mode: str, store_root: Path) -> str:
    """``inline`` for local disks (no thread hop per read); ``thread`` where reads may hang."""
    if mode != "auto":
        return mode
    kind = fs_type(str(store_root))
    return "thread" if kind.split(".")[0] in REMOTE_FS_TYPES else "inline"


def fuse_options(config: MountConfig) -> set[str]:
    """FUSE mount options: read-only, type ``fuse.xetfs``, and the store as the source ``mount`` shows."""
    location = os.fspath(config.store)
    source = public_url(location) if is_url(location) else os.path.abspath(location)
    source = source.replace("\\", "\\\\").replace(",", "\\,")  # (libfuse splits options at commas)
    source = "".join(c if c.isascii() and c != "%" else urllib.parse.quote(c) for c in source)  # (pyfuse3: ASCII)
    opts = set(pyfuse3.default_options) | {"ro", f"fsname={source}", "subtype=xetfs"}
    opts |= config.options & {"allow_other", "allow_root", *FUSE_FLAGS}
    return opts


def set_read_ahead(mountpoint: Path, kb: int) -> None:
    """Raise the kernel's read-ahead for this mount (bigger FUSE requests); root only.

    Call it after FUSE INIT (which resets it).  The device number comes from
    /proc/self/mountinfo, not from a stat() that would go through the mount.
    """
    device = mounted_device(str(mountpoint))
    if device is None:
        log.debug("read-ahead: %s not found in mountinfo", mountpoint)
        return
    try:
        Path(f"/sys/class/bdi/{device}/read_ahead_kb").write_text(f"{kb}\n")
        log.debug("read-ahead of %s set to %d KiB", mountpoint, kb)
    except OSError as exc:
        log.info("could not set read-ahead to %d KiB: %s", kb, exc.strerror)


class _Collect(logging.Handler):
    """Keeps the messages of warnings logged while the filesystem is built, for the mounting terminal."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _interrupted_reply(record: logging.LogRecord) -> bool:
    """pyfuse3 logs a reply the kernel no longer waits for as an error: ``fuse_reply_* failed with No such file
    or directory`` (ENOENT: the request was interrupted, or the mount detached under it).  Nothing is lost
    (the reader is gone), so it is a debug line."""
    if "fuse_reply_* failed with No such file or directory" not in record.getMessage():
        return True
    record.levelno, record.levelname = logging.DEBUG, "DEBUG"
    return logging.getLogger().isEnabledFor(logging.DEBUG)


def run_daemon(config: MountConfig, ready_fd: int | None = None) -> int:
    """Mount and serve until unmounted or signalled; ``ExitStatus.INTERRUPTED`` after SIGINT, else ``OK``.

    Reports on ``ready_fd``: one ``warning: ...`` line per warning logged
    while mounting (at most ``MAX_REPORTED_WARNINGS``, then one for the rest), a
    ``warnings: N`` line with their number, then ``ok`` or ``error: ...``.
    """
    keep_freed_memory()
    logging.getLogger("pyfuse3").addFilter(_interrupted_reply)
    fs: XetFS | None = None
    collect = _Collect()
    logging.getLogger("xetfs").addHandler(collect)
    try:
        check_mountpoint(config.mountpoint, nonempty="nonempty" in config.options)
        fs = build_fs(config)
        pyfuse3.init(fs, str(config.mountpoint), fuse_options(config))
    except (XetfsError, OSError, RuntimeError) as exc:
        if fs is not None:
            fs.reader.close()
        report(ready_fd, f"error: {describe(exc)}")
        raise
    finally:
        logging.getLogger("xetfs").removeHandler(collect)
    send_warnings(ready_fd, collect.messages)
    try:
        signals = trio.run(_serve, fs, config, ready_fd)
    finally:
        pyfuse3.close(unmount=True)
        fs.reader.close()
        log.info("unmounted %s", config.mountpoint)
    return ExitStatus.INTERRUPTED if signal.SIGINT in signals else ExitStatus.OK


async def _serve(fs: XetFS, config: MountConfig, ready_fd: int | None) -> list[int]:
    """Serve until unmounted or signalled; returns the signal that ended it (``[]`` for an unmount)."""
    signals: list[int] = []
    refresher = _refresher(fs, config)
    async with trio.open_nursery() as nursery:
        fs.start_background(nursery)
        nursery.start_soon(_watch_signals, nursery, signals, refresher)
        if config.refresh_every:
            nursery.start_soon(_refresh_every, refresher, config.refresh_every)
        nursery.start_soon(_when_answering, fs, config, ready_fd, nursery)
        await pyfuse3.main()
        nursery.cancel_scope.cancel()
    return signals


async def _when_answering(fs: XetFS, config: MountConfig, ready_fd: int | None, nursery: trio.Nursery) -> None:
    """Once the kernel has finished FUSE INIT, tune read-ahead, report readiness, start the decode workers.

    A stat() of the mountpoint from a worker thread is answered only after
    INIT, which also resets the mount's read-ahead: setting it earlier is lost.
    The workers start last so that their start-up does not delay the mount;
    until they are ready the daemon decodes by itself.
    """
    await trio.to_thread.run_sync(os.stat, config.mountpoint, abandon_on_cancel=True)
    set_read_ahead(config.mountpoint, config.read_ahead_kb)
    report(ready_fd, "ok")
    if ready_fd is None:  # a foreground mount: the one line saying it can be used
        store = public_url(str(config.store)) if is_url(str(config.store)) else config.store
        print(f"xetfs: mounted {store} at {config.mountpoint}", file=sys.stderr, flush=True)
    log.info("serving %s", config.mountpoint)
    fs.reader.start(nursery)


async def _watch_signals(nursery: trio.Nursery, received: list[int], refresher: Refresher) -> None:
    """SIGINT, SIGTERM and SIGHUP unmount; SIGUSR1 (``xetfs refresh``) refreshes."""
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1) as signals:
        async for signum in signals:
            if signum == signal.SIGUSR1:
                log.info("received SIGUSR1, refreshing")
                nursery.start_soon(refresher.refresh)
                continue
            received.append(signum)
            log.info("received %s, unmounting", signal.Signals(signum).name)
            pyfuse3.terminate()
            nursery.cancel_scope.cancel()
            return


def _refresher(fs: XetFS, config: MountConfig) -> Refresher:
    store = fs.reader.store
    tree_from = TREE_FROM if config.names is None else None  # (a --names file is read by every refresh)
    return Refresher(fs, store, lambda index: _build_tree(config, store, index), tree_from)


async def _refresh_every(refresher: Refresher, seconds: float) -> None:
    while True:
        await trio.sleep(seconds)
        await refresher.refresh()
