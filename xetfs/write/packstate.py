"""What earlier packs on this machine read: a file a pack does not read again is the one they read.

``STORE/.xetfs-pack-state.json`` records, by the absolute path of each source
file a pack read, the stamp the file had when the pack looked at it (size,
modification time, change time, inode and device, and when the stamp was
taken) and what the pack learnt of its bytes (xet hash, SHA-256, and the blob
name a ``--repo`` pack gave it).  A later pack takes a file as it is when its
stamp is the same now, when the stamp was taken ``RACY_SECONDS`` or more after
the file last changed, and when the store still lists its bytes.

* The change time cannot be set by ``tar``, ``cp -p`` or ``rsync -t``, which
  keep a rewritten file's modification time; a file replaced by another has
  another inode.  A store moved to another machine has other inodes and
  devices: there every file is read again.
* A change in the same clock tick as the stamp would leave the stamp as it
  was (git's "racy clean" files): a file changed less than ``RACY_SECONDS``
  before its stamp was taken is read again next time.

The file is this machine's alone: it names local paths, and neither the
listing nor ``push`` carries it.  Written atomically under the pack lock; a
file that cannot be read is ignored (every file is read again).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from xetfs.base import hashes
from xetfs.base.settings import RACY_SECONDS
from xetfs.storage.catalogue import is_blob_name
from xetfs.storage.layout import replace_file

STATE_NAME = ".xetfs-pack-state.json"
FORMAT = "xetfs-pack-state"


@dataclass(frozen=True, slots=True)
class Stamp:
    """What a source file's ``stat`` said, and when (``taken_ns``, wall clock)."""

    size: int
    mtime_ns: int
    ctime_ns: int
    ino: int
    dev: int
    taken_ns: int

    @classmethod
    def of(cls, st: os.stat_result) -> Stamp:
        return cls(st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev, time.time_ns())

    def same_file(self, other: Stamp) -> bool:
        """Whether ``other`` stamps the file as it was at this stamp (the times of taking aside)."""
        return (self.size, self.mtime_ns, self.ctime_ns, self.ino, self.dev) == (
            other.size, other.mtime_ns, other.ctime_ns, other.ino, other.dev
        )  # fmt: skip

    @property
    def settled(self) -> bool:
        """Whether the file had not changed for ``RACY_SECONDS`` when the stamp was taken (by its change time:
        every write sets it, and no tool can set it back, as they can the modification time)."""
        return self.taken_ns - self.ctime_ns >= RACY_SECONDS * 1_000_000_000


@dataclass(frozen=True, slots=True)
class Known:
    """A file an earlier pack read: its stamp then, and its bytes' xet hash (hex), SHA-256, blob name."""

    stamp: Stamp
    xet_hash: str
    sha256: str | None = None
    blob: str | None = None

    def still(self, now: Stamp) -> bool:
        """Whether the file stamped ``now`` may be taken to hold the bytes read then."""
        return self.stamp.settled and self.stamp.same_file(now)


def stamp_of(path: Path) -> Stamp | None:
    """``path``'s stamp now (following a symlink, as a pack reads it), or None if it cannot be had."""
    try:
        return Stamp.of(os.stat(path))
    except OSError:
        return None


def remember(state: dict[str, Known], path: Path, before: Stamp | None, xet_hash: str, sha256: str | None,
             blob: str | None = None) -> None:  # fmt: skip
    """Record what a pack learnt of ``path`` from a read between ``before`` (its stamp just before the read)
    and now, if the file was the same all along; else forget it (it changed, or another took its place,
    while it was read: the next pack reads it again)."""
    after = stamp_of(path)
    if before is not None and after is not None and before.same_file(after):
        state[str(path)] = Known(before, xet_hash, sha256, blob)
    else:
        state.pop(str(path), None)


def load_state(store_dir: Path) -> dict[str, Known]:
    """The store's pack state, by source path; empty if there is none or it cannot be read."""
    try:
        doc = json.loads((store_dir / STATE_NAME).read_bytes())
        if doc.get("format") != FORMAT or doc.get("version") != 1:
            return {}
        out = {}
        for path, (size, mtime, ctime, ino, dev, taken, xet, sha256, blob) in doc["files"].items():
            numbers = (size, mtime, ctime, ino, dev, taken)
            names_ok = all(v is None or (isinstance(v, str) and is_blob_name(v)) for v in (sha256, blob))
            if all(type(v) is int for v in numbers) and isinstance(xet, str) and hashes.is_hex(xet) and names_ok:
                out[path] = Known(Stamp(size, mtime, ctime, ino, dev, taken), xet, sha256, blob)
        return out
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return {}


def forget_gone(state: dict[str, Known], sources: Sequence[Path], seen: Iterable[Path]) -> None:
    """Drop the entries of files below ``sources`` (directories a pack walked) that it did not see: deleted or
    moved since, so that the state does not grow with every file ever packed."""
    tops = [f"{s.absolute()}/" for s in sources]  # (as a pack names its sources: not resolved)
    kept = {str(p) for p in seen}
    for path in [p for p in state if p not in kept and any(p.startswith(t) for t in tops)]:
        del state[path]


def save_state(store_dir: Path, state: Mapping[str, Known]) -> None:
    """Write the pack state atomically (the caller holds the pack lock)."""
    files = {
        path: [k.stamp.size, k.stamp.mtime_ns, k.stamp.ctime_ns, k.stamp.ino, k.stamp.dev, k.stamp.taken_ns,
               k.xet_hash, k.sha256, k.blob]
        for path, k in sorted(state.items())
    }  # fmt: skip
    doc = {"format": FORMAT, "version": 1, "files": files}
    replace_file(store_dir / STATE_NAME, json.dumps(doc, separators=(",", ":")).encode() + b"\n")
