"""The pyfuse3 adapter: the only module that speaks FUSE and knows errno.

Requests are translated to calls on the tree (names, attributes) and the
reader (bytes).  Handlers never let an exception other than ``FUSEError``
escape — pyfuse3 would take the mount down — so every handler that calls
into them runs under ``_guard``, except the three a reader sends for every
file (``lookup``, ``open``, ``read``), which catch what they call themselves
(``release``, ``forget``, ``flush`` and the write stubs call nothing that
raises); ``_fuse_error``
is the one place that maps errors to errno: unknown names are ``ENOENT``,
corrupt or missing data ``EIO``, every write ``EROFS``.  A failed read is
logged once per file, failure and object (a xorb, or a chunk of it) for
``REPEATS_QUIET`` seconds (the kernel asks again, in other sizes, and a
reader goes on at the next offsets, which a missing xorb fails alike) and
counted in stats; other failed requests are logged each time.
"""

from __future__ import annotations

import errno
import functools
import json
import logging
import os
import stat
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, ParamSpec, TypeVar

import pyfuse3
import trio
from cachetools import TTLCache

from xetfs.base.errors import XetfsError
from xetfs.base.settings import (
    BLOCK_SIZE,
    ENTRY_TIMEOUT,
    FAILED_READS_LOGGED,
    NAMES_KEPT,
    PREFETCH_MAXIMUM,
    REPEATS_QUIET,
)
from xetfs.base.stats import IndexCounters, ReadCounters, RefreshCounters, document
from xetfs.names.hubtree import opened_as
from xetfs.names.stabletree import TreeLike
from xetfs.names.tree import Kind, Node
from xetfs.read.policy import Session
from xetfs.read.reader import Reader
from xetfs.read.sessions import Sessions
from xetfs.storage.index import Index

log = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")

# A file's decode counters as JSON, for ``xetfs stats MNT FILE``.
FILE_STATS_XATTR = b"user.xetfs.stats"


@dataclass(frozen=True)
class FsOptions:
    uid: int = field(default_factory=os.getuid)
    gid: int = field(default_factory=os.getgid)
    direct_io: bool = False
    mtime_ns: int = 0
    prefetch: bool = True
    prefetch_max: int = PREFETCH_MAXIMUM  # how far ahead of a sequential reader prefetch may go


def _xattrs(node: Node) -> dict[bytes, bytes]:
    """The extended attributes of ``node`` besides ``FILE_STATS_XATTR``: a file's hash, its terms and its sha256
    (when its shard records one).  Read by name; ``listxattr`` lists none (``XetFS.listxattr``)."""
    entry = node.entry
    if node.kind is not Kind.FILE or entry is None:
        return {}
    out = {b"user.xet.hash": entry.hex.encode(), b"user.xet.terms": str(entry.num_terms).encode()}
    if entry.sha256:
        out[b"user.xet.sha256"] = entry.sha256.encode()
    return out


# The keys of ``FILE_STATS_XATTR``, and what each says (``docs/stats.md`` lists them).
FILE_STATS_KEYS = {
    "hash": "the file's xet hash (hex)",
    "size": "its size in bytes",
    "chunks": "its distinct chunks",
    "decoded_chunks": "chunks decoded by reads and prefetch of this file (a chunk decoded for another file that "
    "shares it counts for that one)",
    "decoded_bytes": "their decoded bytes",
}


def _file_stats(reader: Reader, node: Node) -> bytes | None:
    """``FILE_STATS_XATTR`` of ``node``: its size and distinct chunks, and what its reads decoded (JSON)."""
    entry = node.entry
    if node.kind is not Kind.FILE or entry is None:
        return None
    decoded = reader.file_statistics(entry.file_hash)
    values = (entry.hex, entry.size, entry.num_chunks, decoded.chunks, decoded.bytes)
    return json.dumps(dict(zip(FILE_STATS_KEYS, values, strict=True))).encode()


def _fuse_error(op: str, exc: Exception) -> pyfuse3.FUSEError:
    """The FUSEError an exception from operation ``op`` becomes (the errno mapping lives here), logged."""
    if isinstance(exc, pyfuse3.FUSEError):
        return exc
    if isinstance(exc, XetfsError):
        log.error("%s: %s", op, exc)
        return pyfuse3.FUSEError(errno.EIO)
    if isinstance(exc, OSError):
        log.error("%s: %s", op, exc)
        return pyfuse3.FUSEError(exc.errno or errno.EIO)
    log.exception("unexpected error in %s", op)
    return pyfuse3.FUSEError(errno.EIO)


def _guard(fn: Callable[P, Coroutine[Any, Any, R]]) -> Callable[P, Coroutine[Any, Any, R]]:
    """Turn every exception into a FUSEError (``_fuse_error``)."""

    @functools.wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return await fn(*args, **kwargs)
        except Exception as exc:
            raise _fuse_error(fn.__name__, exc) from None

    return wrapper


class _ReadOnly(pyfuse3.Operations):
    """Every way of writing is refused (``EROFS``); nothing is ever dirty."""

    async def setattr(self, inode: int, attr: Any, fields: Any, fh: int | None, ctx: Any) -> Any:
        raise pyfuse3.FUSEError(errno.EROFS)

    async def mknod(self, parent_inode: int, name: bytes, mode: int, rdev: int, ctx: Any) -> Any:
        raise pyfuse3.FUSEError(errno.EROFS)

    async def mkdir(self, parent_inode: int, name: bytes, mode: int, ctx: Any) -> Any:
        raise pyfuse3.FUSEError(errno.EROFS)

    async def unlink(self, parent_inode: int, name: bytes, ctx: Any) -> None:
        raise pyfuse3.FUSEError(errno.EROFS)

    async def rmdir(self, parent_inode: int, name: bytes, ctx: Any) -> None:
        raise pyfuse3.FUSEError(errno.EROFS)

    async def symlink(self, parent_inode: int, name: bytes, target: bytes, ctx: Any) -> Any:
        raise pyfuse3.FUSEError(errno.EROFS)

    async def rename(self, parent_old: int, name_old: bytes, parent_new: int, name_new: bytes, flags: int,
                     ctx: Any) -> None:  # fmt: skip
        raise pyfuse3.FUSEError(errno.EROFS)

    async def link(self, inode: int, new_parent: int, new_name: bytes, ctx: Any) -> Any:
        raise pyfuse3.FUSEError(errno.EROFS)

    async def create(self, parent_inode: int, name: bytes, mode: int, flags: int, ctx: Any) -> Any:
        raise pyfuse3.FUSEError(errno.EROFS)

    async def write(self, fh: int, off: int, buf: bytes) -> int:
        raise pyfuse3.FUSEError(errno.EROFS)

    async def setxattr(self, inode: int, name: bytes, value: bytes, ctx: Any) -> None:
        raise pyfuse3.FUSEError(errno.EROFS)

    async def removexattr(self, inode: int, name: bytes, ctx: Any) -> None:
        raise pyfuse3.FUSEError(errno.EROFS)

    async def fsync(self, fh: int, datasync: bool) -> None:
        pass  # nothing is ever dirty

    async def fsyncdir(self, fh: int, datasync: bool) -> None:
        pass


class XetFS(_ReadOnly):
    """A read-only view of one store: ``tree`` gives the names, ``reader`` the bytes."""

    supports_dot_lookup = True
    enable_writeback_cache = False

    def __init__(
        self, tree: TreeLike, reader: Reader, options: FsOptions | None = None,
        index_counters: IndexCounters | None = None,
    ) -> None:  # fmt: skip
        super().__init__()
        self.tree = tree
        self.reader = reader
        self.index_counters = index_counters or IndexCounters()
        self._reads = ReadCounters()
        self._started = time.time()
        self.options = options or FsOptions()
        self._handles: dict[int, Session] = {}  # the read session of each open file of the store
        self._snapshots: dict[int, bytes] = {}  # the bytes fixed at open of each other open file (stats, a Hub ref)
        self._names: dict[int, str] = {}  # inode -> a path, for messages about failing files
        self._failures_logged: TTLCache[str, None] = TTLCache(maxsize=FAILED_READS_LOGGED, ttl=REPEATS_QUIET)
        self._total_bytes = sum(e.size for e in reader.index)  # for statfs; the store only grows (``replace``)
        self.refresh = RefreshCounters()  # counted by the daemon's refresher (refresh.Refresher)
        self.refresh_error = ""  # why the last refresh failed ("" after one that did not)
        self._next_fh = 1
        self._stats_handles: set[int] = set()  # open handles of .xetfs/stats
        self._stats_latest: bytes | None = None  # the document taken at the latest open of .xetfs/stats
        # The kernel's page cache keeps what was read, unless --direct-io.
        self.sessions = Sessions(reader, prefetch=self.options.prefetch, prefetch_max=self.options.prefetch_max,
                                 keep_cache=not self.options.direct_io)  # fmt: skip

    # -- a refresh (refresh.Refresher) ---------------------------------------

    def current_index(self) -> Index:
        return self.reader.index

    def current_tree(self) -> TreeLike:
        return self.tree

    def replace(self, index: Index, tree: TreeLike) -> None:
        """Serve ``index`` and ``tree`` from now on: the same files and more, inodes the kernel knows kept."""
        self.reader.replace_index(index)
        self.tree = tree
        self._total_bytes = sum(e.size for e in index)
        self._names.clear()
        c = self.index_counters
        c.files, c.terms, c.xorbs, c.shards = len(index), index.terms, len(index.all_xorbs), index.shards

    def start_background(self, nursery: trio.Nursery) -> None:
        """Give the filesystem a nursery for readahead tasks."""
        self.sessions.start(nursery)

    # -- names and attributes ---------------------------------------------

    def _node(self, inode: int) -> Node:
        node = self.tree.get(inode)
        if node is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return node

    def _attrs(self, node: Node) -> pyfuse3.EntryAttributes:
        a = pyfuse3.EntryAttributes()
        a.st_ino = node.inode
        a.generation = 0
        a.entry_timeout = ENTRY_TIMEOUT
        a.attr_timeout = ENTRY_TIMEOUT
        if node.kind is Kind.DIR:
            a.st_mode = stat.S_IFDIR | 0o555
            size = 0
        elif node.kind is Kind.STATS:
            a.st_mode = stat.S_IFREG | 0o444
            a.attr_timeout = 0
            size = len(self._stats_for_attrs())
        elif node.kind is Kind.SYMLINK:
            a.st_mode = stat.S_IFLNK | 0o777
            size = len(node.data)
        elif node.kind is Kind.DATA:
            a.st_mode = stat.S_IFREG | 0o444
            size = len(node.data)
        else:
            a.st_mode = stat.S_IFREG | 0o444
            size = node.entry.size if node.entry else 0
        a.st_nlink = node.nlink
        a.st_uid = self.options.uid
        a.st_gid = self.options.gid
        a.st_size = size
        a.st_blksize = BLOCK_SIZE
        a.st_blocks = (size + 511) // 512
        mtime = self.options.mtime_ns if node.mtime_ns is None else node.mtime_ns
        a.st_atime_ns = a.st_mtime_ns = a.st_ctime_ns = mtime
        return a

    def _stats_for_attrs(self) -> bytes:
        """The stats document whose size ``getattr`` reports.

        While a reader holds ``.xetfs/stats`` open, the one taken at the latest
        open (an ``fstat`` after ``open`` matches the bytes that reader gets);
        otherwise a fresh one.
        """
        if not self._stats_handles or self._stats_latest is None:
            self._stats_latest = self.stats_document()
        return self._stats_latest

    async def lookup(self, parent_inode: int, name: bytes, ctx: Any = None) -> pyfuse3.EntryAttributes:
        # Not @_guard, as ``read``: one lookup per file a reader opens.
        try:
            if name == b".":
                return self._attrs(self._node(parent_inode))
            if name == b"..":
                return self._attrs(self._node(self.tree.parent_of(parent_inode)))
            node = self.tree.lookup(parent_inode, name)
            if node is None:
                raise pyfuse3.FUSEError(errno.ENOENT)
            return self._attrs(node)
        except Exception as exc:
            raise _fuse_error("lookup", exc) from None

    @_guard
    async def getattr(self, inode: int, ctx: Any = None) -> pyfuse3.EntryAttributes:
        return self._attrs(self._node(inode))

    @_guard
    async def readlink(self, inode: int, ctx: Any) -> bytes:
        node = self._node(inode)
        if node.kind is not Kind.SYMLINK:
            raise pyfuse3.FUSEError(errno.EINVAL)
        return node.data

    async def forget(self, inode_list: Any) -> None:
        pass  # every inode lives as long as the mount

    @_guard
    async def opendir(self, inode: int, ctx: Any) -> int:
        if self._node(inode).kind is not Kind.DIR:
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        return inode

    @_guard
    async def readdir(self, fh: int, start_id: int, token: Any) -> None:
        # Offsets 0 and 1 are "." and ".."; child k follows at offset k + 2.
        dots = ((b".", fh), (b"..", self.tree.parent_of(fh)))
        for i in range(start_id, 2):
            name, inode = dots[i]
            if not pyfuse3.readdir_reply(token, name, self._attrs(self._node(inode)), i + 1):
                return
        first = max(start_id - 2, 0)
        for k, (name, node) in enumerate(self.tree.iter_children(fh, first), first):
            if not pyfuse3.readdir_reply(token, name, self._attrs(node), k + 3):
                break

    async def releasedir(self, fh: int) -> None:
        pass

    @_guard
    async def statfs(self, ctx: Any) -> pyfuse3.StatvfsData:
        s = pyfuse3.StatvfsData()
        s.f_bsize = BLOCK_SIZE
        s.f_frsize = 4096
        s.f_blocks = (self._total_bytes + 4095) // 4096
        s.f_bfree = s.f_bavail = 0
        s.f_files = self.tree.inode_count
        s.f_ffree = s.f_favail = 0
        s.f_namemax = 255
        return s

    # -- extended attributes ---------------------------------------------

    @_guard
    async def getxattr(self, inode: int, name: bytes, ctx: Any) -> bytes:
        if not name.startswith(b"user."):
            # Only the user namespace is kept.  "Not supported", not "no such attribute": ``ls -l`` (coreutils
            # 9.1) asks every file for security.selinux and system.posix_acl_access, and stops asking a file
            # system that says it has neither (two round trips per file otherwise, most of an ``ls -lR``).
            raise pyfuse3.FUSEError(errno.EOPNOTSUPP)
        node = self._node(inode)
        value = _file_stats(self.reader, node) if name == FILE_STATS_XATTR else _xattrs(node).get(name)
        if value is None:
            raise pyfuse3.FUSEError(pyfuse3.ENOATTR)
        return value

    @_guard
    async def listxattr(self, inode: int, ctx: Any) -> list[bytes]:
        # None listed, though ``getxattr`` answers them by name: ``cp -a``, ``rsync -X`` and ``tar --xattrs``
        # copy what is listed, and a copy, once edited, would carry a hash that is no longer its own (and
        # getting each one costs two round trips per file copied).  An empty list, not ENOSYS: that would
        # spare this round trip too, but ``tar --xattrs`` warns for every file then, and ``getfattr -d`` fails.
        self._node(inode)
        return []

    # -- reading -------------------------------------------------------------

    async def open(self, inode: int, flags: int, ctx: Any) -> pyfuse3.FileInfo:
        # Not @_guard, as ``read``: one open per file a reader reads.
        try:
            return self._open(inode, flags)
        except Exception as exc:
            raise _fuse_error("open", exc) from None

    def _open(self, inode: int, flags: int) -> pyfuse3.FileInfo:
        node = self._node(inode)
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND | os.O_CREAT):
            raise pyfuse3.FUSEError(errno.EROFS)
        if node.kind is Kind.DIR:
            raise pyfuse3.FUSEError(errno.EISDIR)
        fh = self._next_fh
        self._next_fh += 1
        if node.kind is Kind.STATS:
            # One document per open: the size and the bytes a reader sees never change under it.
            self._snapshots[fh] = self._stats_latest = self.stats_document()
            self._stats_handles.add(fh)
            return pyfuse3.FileInfo(fh=fh, direct_io=True, keep_cache=False)
        if node.kind is Kind.DATA:  # bytes held by the tree (a Hub ref): served like the stats snapshot
            # A refresh may move a ref, and a handle opened before it still reads the old bytes: through the
            # page cache, that read would give them to handles opened after it.
            self._snapshots[fh] = node.data
            return pyfuse3.FileInfo(fh=fh, direct_io=True, keep_cache=False)
        if node.entry is None:
            raise pyfuse3.FUSEError(errno.EIO)
        self._handles[fh] = self.sessions.open(inode, node.entry)
        direct = self.options.direct_io
        return pyfuse3.FileInfo(fh=fh, direct_io=direct, keep_cache=not direct)

    # pyfuse3 replies with any buffer (PyObject_GetBuffer): a memoryview saves a copy.  A view
    # of the workers' shared memory is valid until the next await; pyfuse3 copies it into the
    # reply as soon as this returns, so nothing after the reader's read may await.
    async def read(self, fh: int, off: int, size: int) -> bytes | memoryview:  # type: ignore[override]
        # Not @_guard: the hot path spares itself the wrapper's coroutine, and maps errors the same way.
        try:
            session = self._handles.get(fh)
            if session is None:
                snapshot = self._snapshots.get(fh)
                if snapshot is None:
                    raise pyfuse3.FUSEError(errno.EBADF)
                return snapshot[off : off + size]
            self._reads.requests += 1
            data, through = self.sessions.read_now(session, off, size)
            if data is None:
                try:
                    data = await self.sessions.read_rest(session, off, size, through)
                except XetfsError as exc:
                    self._log_failed_read(session, off, size, exc)
                    raise pyfuse3.FUSEError(errno.EIO) from None
            self._reads.bytes += len(data)
            return data
        except Exception as exc:
            raise _fuse_error("read", exc) from None

    def _log_failed_read(self, session: Session, off: int, size: int, exc: XetfsError) -> None:
        """Log a failed read, once in ``REPEATS_QUIET`` seconds for the same file, kind of failure and object:
        the kernel and readers try a failed read again, in other sizes, and go on at other offsets that the same
        damage fails (each try is counted in ``errors``).  The object is what the message names before its first
        ``": "`` (``xorb <hash>``, or ``xorb <hash> chunk <i> at byte <n> of the xorb``): a missing or cut xorb
        is one failure, each damaged chunk another.  A read failed at once, "not requested" of a store taken for
        hung or down, is logged once for all files: the store's state is the one failure."""
        unasked = ": not requested: " in str(exc)  # (a store taken for hung or down: said once for all files)
        key = f"{'store' if unasked else session.key} {type(exc).__name__} {'' if unasked else str(exc).split(': ')[0]}"
        if key not in self._failures_logged:
            self._failures_logged[key] = None
            alike = "reads of any file failing so" if unasked else "reads of this file failing alike"
            log.error("read of %s at file offset %d (%d bytes) failed: %s (%s are not logged for %g s)",
                      self._describe(session), off, size, exc, alike, REPEATS_QUIET)  # fmt: skip

    def _describe(self, session: Session) -> str:
        """``path (file <hex>)`` for messages, or ``file <hex>`` when the file has no other name."""
        inode, entry = session.key, session.entry
        name = self._names.get(inode)
        if name is None:
            if len(self._names) >= NAMES_KEPT:
                self._names.clear()
            name = self._names[inode] = opened_as(self.tree, self.tree.name_of(inode) or "")
        return f"{name} (file {entry.hex})" if name and name != entry.hex else f"file {entry.hex}"

    async def release(self, fh: int) -> None:
        session = self._handles.pop(fh, None)
        if session is not None:
            self.sessions.close(session)
        else:
            self._snapshots.pop(fh, None)
            self._stats_handles.discard(fh)

    async def flush(self, fh: int) -> None:
        # Nothing to flush in a read-only filesystem: ENOSYS tells the kernel never to ask again, which
        # spares every close() of a file a round trip.
        raise pyfuse3.FUSEError(errno.ENOSYS)

    @_guard
    async def access(self, inode: int, mode: int, ctx: Any) -> bool:
        self._node(inode)
        return not mode & os.W_OK

    def stats_document(self) -> bytes:
        """The live counters as JSON (``.xetfs/stats``)."""
        r = self.reader.statistics()
        groups = {"reads": self._reads, "cache": r.cache, "layouts": r.layouts, "decode": r.decode, "store": r.store,
                  "prefetch": r.prefetch, "workers": r.workers, "errors": r.errors, "index": self.index_counters,
                  "remote": r.remote, "refresh": self.refresh}  # fmt: skip
        doc = document(groups, self._started)
        doc["pid"] = os.getpid()  # (``xetfs refresh`` signals it)
        doc["refresh_error"] = self.refresh_error
        return (json.dumps(doc, indent=2) + "\n").encode()
