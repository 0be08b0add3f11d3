#!/usr/bin/env python3
"""The ceiling: a trivial read-only pyfuse3 filesystem that serves files from memory.

    scripts/ceiling_fs.py MOUNTPOINT FILE [FILE ...] [--direct-io] [--read-ahead KB]
    scripts/ceiling_fs.py MOUNTPOINT --dir DIR [...]

Every FILE (or every regular file of DIR, such as thousands of small
files, with ``--dir``) is mapped into memory once (``mmap`` with ``MAP_POPULATE``, so the
bytes are resident before the mount answers) and shown at the root of the
mount under its base name.  A read returns a ``memoryview`` slice of the
mapping: no decoding, no hashing, no copy in Python.  This is what FUSE in
Python can do with zero work per request, and the benchmark compares xetfs
with it.

It mounts with the same options as ``xetfs mount``: the same libfuse mount
options (pyfuse3's defaults plus ``ro``), ``keep_cache`` on open (or
``direct_io`` with ``--direct-io``), ``flush`` answered with ``ENOSYS`` (so
the kernel never sends it again), 1 MiB ``st_blksize``, long attribute and
entry timeouts, and the kernel read-ahead of the mount raised through
``/sys/class/bdi/<dev>/read_ahead_kb`` once FUSE INIT is done (INIT resets
it), the device found via ``/proc/self/mountinfo`` (the same steps as
``xetfs.fuse.mount``).

It runs in the foreground until SIGINT/SIGTERM (then unmounts) and prints
``ready`` on stdout once it serves.  Standalone: it does not import xetfs.
"""

from __future__ import annotations

import argparse
import errno
import mmap
import os
import re
import signal
import stat
import sys
from pathlib import Path
from typing import Any

import pyfuse3
import trio

BLOCK_SIZE = 1024 * 1024
TIMEOUT = 3600.0
ROOT = pyfuse3.ROOT_INODE


class CeilingFS(pyfuse3.Operations):
    supports_dot_lookup = True
    enable_writeback_cache = False

    def __init__(self, files: list[tuple[bytes, memoryview]], direct_io: bool) -> None:
        super().__init__()
        self.direct_io = direct_io
        self.names = {name: ROOT + 1 + i for i, (name, _) in enumerate(files)}
        self.data = {ROOT + 1 + i: view for i, (_, view) in enumerate(files)}
        self.order = sorted(self.names)
        self.mtime_ns = 0

    def _attrs(self, inode: int) -> pyfuse3.EntryAttributes:
        a = pyfuse3.EntryAttributes()
        a.st_ino = inode
        a.entry_timeout = a.attr_timeout = TIMEOUT
        if inode == ROOT:
            a.st_mode, a.st_nlink, size = stat.S_IFDIR | 0o555, 2, 0
        elif inode in self.data:
            a.st_mode, a.st_nlink, size = stat.S_IFREG | 0o444, 1, len(self.data[inode])
        else:
            raise pyfuse3.FUSEError(errno.ENOENT)
        a.st_uid, a.st_gid = os.getuid(), os.getgid()
        a.st_size = size
        a.st_blksize = BLOCK_SIZE
        a.st_blocks = (size + 511) // 512
        a.st_atime_ns = a.st_mtime_ns = a.st_ctime_ns = self.mtime_ns
        return a

    async def getattr(self, inode: int, ctx: Any = None) -> pyfuse3.EntryAttributes:
        return self._attrs(inode)

    async def lookup(self, parent_inode: int, name: bytes, ctx: Any = None) -> pyfuse3.EntryAttributes:
        if parent_inode != ROOT:
            raise pyfuse3.FUSEError(errno.ENOENT)
        if name in (b".", b".."):
            return self._attrs(ROOT)
        inode = self.names.get(name)
        if inode is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self._attrs(inode)

    async def opendir(self, inode: int, ctx: Any) -> int:
        if inode != ROOT:
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        return inode

    async def readdir(self, fh: int, start_id: int, token: Any) -> None:
        for i in range(start_id, len(self.order)):
            name = self.order[i]
            if not pyfuse3.readdir_reply(token, name, self._attrs(self.names[name]), i + 1):
                break

    async def releasedir(self, fh: int) -> None:
        pass

    async def open(self, inode: int, flags: int, ctx: Any) -> pyfuse3.FileInfo:
        if inode not in self.data:
            raise pyfuse3.FUSEError(errno.EISDIR if inode == ROOT else errno.ENOENT)
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND | os.O_CREAT):
            raise pyfuse3.FUSEError(errno.EROFS)
        return pyfuse3.FileInfo(fh=inode, direct_io=self.direct_io, keep_cache=not self.direct_io)

    async def read(self, fh: int, off: int, size: int) -> memoryview:  # type: ignore[override]
        return self.data[fh][off : off + size]

    async def release(self, fh: int) -> None:
        pass

    async def flush(self, fh: int) -> None:
        # As xetfs: ENOSYS tells the kernel never to send a flush again (one round trip less per close).
        raise pyfuse3.FUSEError(errno.ENOSYS)

    async def forget(self, inode_list: Any) -> None:
        pass


def set_read_ahead(mountpoint: str, kb: int) -> str:
    """Raise the mount's kernel read-ahead; returns a note for the log.

    Call it after FUSE INIT.  The device number comes from /proc/self/mountinfo.
    """
    device = None
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        for line in f:
            fields = line.split()
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4]) if len(fields) > 4 else ""
            if point == mountpoint:
                device = fields[2]
    if device is None:
        return f"read-ahead: {mountpoint} not in mountinfo"
    try:
        Path(f"/sys/class/bdi/{device}/read_ahead_kb").write_text(f"{kb}\n")
    except OSError as exc:
        return f"could not set read-ahead to {kb} KiB: {exc.strerror}"
    return f"read-ahead of {mountpoint} ({device}) set to {kb} KiB"


async def serve(mountpoint: str, read_ahead_kb: int) -> None:
    async with trio.open_nursery() as nursery:

        async def watch() -> None:
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
                async for _ in signals:
                    pyfuse3.terminate()
                    nursery.cancel_scope.cancel()
                    return

        async def when_answering() -> None:
            # A stat() from a worker thread is answered only after FUSE INIT,
            # which resets the read-ahead: set it afterwards (as xetfs does).
            await trio.to_thread.run_sync(os.stat, mountpoint, abandon_on_cancel=True)
            print(set_read_ahead(mountpoint, read_ahead_kb), file=sys.stderr, flush=True)
            print("ready", flush=True)

        nursery.start_soon(watch)
        nursery.start_soon(when_answering)
        await pyfuse3.main()
        nursery.cancel_scope.cancel()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("mountpoint")
    p.add_argument("files", nargs="*", help="files to serve (by base name)")
    p.add_argument("--dir", type=Path, help="also serve every regular file of DIR (not its subdirectories)")
    p.add_argument("--direct-io", action="store_true", help="open files with direct_io instead of keep_cache")
    p.add_argument("--read-ahead", type=int, default=1024, metavar="KB", help="kernel read-ahead (default 1024)")
    args = p.parse_args(argv)
    paths = list(args.files)
    if args.dir is not None:
        paths += sorted(str(e.path) for e in os.scandir(args.dir) if e.is_file(follow_symlinks=False))
    if not paths:
        p.error("no file to serve (give FILE or --dir)")

    files = []
    for path in paths:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                view = memoryview(b"")
            else:
                mapping = mmap.mmap(f.fileno(), size, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE, prot=mmap.PROT_READ)
                view = memoryview(mapping)
        files.append((os.path.basename(path).encode(), view))
    mountpoint = os.path.realpath(args.mountpoint)
    fs = CeilingFS(files, args.direct_io)
    options = set(pyfuse3.default_options) | {"ro", "fsname=ceiling", "subtype=ceiling"}
    pyfuse3.init(fs, mountpoint, options)
    try:
        trio.run(serve, mountpoint, args.read_ahead)
    finally:
        pyfuse3.close(unmount=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
