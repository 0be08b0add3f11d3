"""The kernel's table of mounts, read from /proc/self/mountinfo (never through a mount).

A stat() of a FUSE mount point whose daemon is not running, or is hung,
would block; the table answers at once.  What must look through such a
mount point asks with ``within``, which gives up after a while.
"""

from __future__ import annotations

import os
import re
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from typing import TypeVar

XETFS_FS_TYPE = "fuse.xetfs"  # what the table shows for a xetfs mount (``subtype=xetfs``)


def mounts() -> Iterator[tuple[str, str, str, str]]:
    """``(mount point, major:minor, filesystem type, source)`` of every mount."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
            lines = f.read().splitlines()
    except OSError:
        return
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, after = left.split(), right.split()
        # Space, tab, newline and backslash appear as octal escapes (\040 ...).
        yield _unescape(fields[4]), fields[2], after[0], _unescape(after[1]) if len(after) > 1 else ""


def _unescape(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def mount_at(path: str) -> tuple[str, str, str] | None:
    """``(major:minor, filesystem type, source)`` of the mount at ``path`` (an absolute path, as the table gives
    it), or None; the last one if several are stacked there (the one a path lookup sees)."""
    found = None
    for point, device, kind, source in mounts():
        if point == path:
            found = (device, kind, source)
    return found


def fs_type(path: str) -> str:
    """The type of the filesystem holding the absolute ``path`` (the longest mount point above it), or ""."""
    best, kind = "", ""
    for point, _, fstype, _ in mounts():
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, fstype
    return kind


def xetfs_source(path: str) -> str | None:
    """The store a xetfs mount at ``path`` (an absolute path, as the table gives it) mounts, or None."""
    found = mount_at(path)
    if found is None or found[1] != XETFS_FS_TYPE:
        return None
    source = found[2]
    return source if "://" in source else urllib.parse.unquote(source)  # (its non-ASCII, as the mount wrote it)


T = TypeVar("T")


def within(seconds: float, call: Callable[[], T]) -> tuple[bool, T | None]:
    """``(True, call())``, or ``(False, None)`` if ``call`` takes longer than ``seconds``: a call that may look
    through a hung mount.  It raises what ``call`` raises; one that hangs is left behind in a daemon thread
    (a FUSE request's wait ends when the process does)."""
    out: list[T] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            out.append(call())
        except BaseException as exc:  # (raised again in the caller's thread)
            failed.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if failed:
        raise failed[0]
    return (True, out[0]) if out else (False, None)


def force_hint(mountpoint: object) -> str:
    """How to end a mount whose daemon does not answer (``--force`` needs root)."""
    way = f"'xetfs umount --force {mountpoint}' fails its pending reads and unmounts it"
    return way if os.geteuid() == 0 else f"as root, {way}"
