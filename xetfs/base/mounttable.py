"""The kernel's table of mounts, read from /proc/self/mountinfo (never through a mount).

A stat() of a FUSE mount point whose daemon is not running, or is hung,
would block; the table answers at once.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

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


def xetfs_source(path: str) -> str | None:
    """The store a xetfs mount at ``path`` (an absolute path, as the table gives it) mounts, or None."""
    return next((source for point, _, kind, source in mounts() if point == path and kind == XETFS_FS_TYPE), None)
