"""The names manifest: which path names which Xet file.

Owns the manifest format and its validation; pure (bytes in, frozen records
out, and back).  The format is the JSON list the Hugging Face Hub returns for
a repository tree (``GET /api/models/<repo>/tree/<rev>?recursive=true``), so a
listing saved from the Hub works as is::

    [{"type": "file", "path": "dir/a.bin", "size": 123, "oid": "<git sha1>",
      "xetHash": "<64 hex>", "lfs": {"oid": "<sha256 hex>", "size": 123, "pointerSize": 134}},
     {"type": "directory", "path": "dir", "oid": "...", "size": 0}]

One field of our own, which a Hub listing simply lacks: ``"mtime"``, the
source file's modification time as UTC ISO 8601 with up to nine fractional
digits (``"2024-05-01T12:00:00.123456789Z"``), written by ``xetfs pack``.

Contract:

* Only input that is not a JSON list at all (bad JSON, another JSON type, too
  big, nested too deeply) raises ``ManifestError``.  A bad *entry* is dropped
  with a warning that names it, and the rest is used.
* Dropped entries: files without ``xetHash`` (small files kept in git), bad
  hashes, unsafe paths (absolute, ``.``/``..``/empty components, NUL, a
  component over 255 UTF-8 bytes, a path over 4096 bytes, text that is not
  valid Unicode), and conflicts with an *earlier* entry: the same file path
  with another hash, or a path that is a file in one entry and a directory
  (or a directory's ancestor) in another.
* Names are kept exactly as given (no Unicode normalisation).
* Warnings are capped at ``MAX_WARNINGS_PER_KIND`` per kind, plus one line
  counting the rest.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xetfs.base import hashes
from xetfs.base.errors import FormatError, ManifestError
from xetfs.base.messages import plural
from xetfs.base.settings import SHOWN_CHARS

if TYPE_CHECKING:
    from xetfs.storage.store import Store

MANIFEST_NAME = "xetfs-manifest.json"  # where a store keeps its names (``pack`` writes it)
MAX_MANIFEST_BYTES = 512 * 1024 * 1024
MAX_NAME_BYTES = 255  # NAME_MAX of Linux file systems
MAX_PATH_BYTES = 4096  # PATH_MAX: longer paths are unusable by ordinary tools
MAX_WARNINGS_PER_KIND = 20

PathParts = tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ManifestFile:
    """One file name: ``path`` components, the raw 32-byte Xet file hash, and the manifest's claims."""

    path: PathParts
    xet_hash: bytes
    size: int | None  # what the manifest says; the store's size wins
    sha256: str | None  # lowercase hex, from ``lfs.oid``
    mtime_ns: int | None = None  # the source file's modification time (ns since the epoch), from ``mtime``

    @property
    def name(self) -> str:
        """The path as written in the manifest (``/``-separated)."""
        return "/".join(self.path)


@dataclass(frozen=True, slots=True)
class Manifest:
    """The usable entries of a manifest, in input order, and why the others were dropped."""

    files: tuple[ManifestFile, ...]
    directories: tuple[PathParts, ...]  # explicit directory entries (parents of files are implied)
    warnings: tuple[str, ...]


Entry = ManifestFile | PathParts  # a file, or a directory given by its components


class WarningLog:
    """Warnings, at most ``limit`` per kind; the rest are counted in one closing line per kind."""

    def __init__(self, limit: int = MAX_WARNINGS_PER_KIND) -> None:
        self._limit = limit
        self._lines: list[str] = []
        self._counts: dict[str, int] = {}

    def add(self, kind: str, message: str) -> None:
        n = self._counts.get(kind, 0) + 1
        self._counts[kind] = n
        if n <= self._limit:
            self._lines.append(message)

    def lines(self) -> list[str]:
        """All kept warnings, then ``"... and N more <kind> warnings"`` for each kind over the limit."""
        more = [
            f"... and {plural(n - self._limit, f'more {kind} warning')}"
            for kind, n in self._counts.items()
            if n > self._limit
        ]
        return self._lines + more


def not_in_store(missing: Sequence[ManifestFile], total: int) -> str:
    """What to say of the named files whose bytes the store lacks (``missing``, of ``total`` named): one
    line however many (a bad shard takes thousands), naming the first."""
    first = f"{missing[0].name!r} (file {hashes.to_hex(missing[0].xet_hash)})"
    if len(missing) == 1:
        return f"{first} is not in the store"
    return (
        f"{len(missing)} of the {total} files named are not in the store (a bad or lost shard's?); the first: {first}"
    )


# -- paths ---------------------------------------------------------------------


def path_problem(path: str) -> str | None:
    """Why ``path`` (a ``/``-separated relative path) is unsafe as a name, or None when it is fine."""
    if "\0" in path:
        return "NUL character in the path"
    if path.startswith("/"):
        return "absolute path"
    try:
        size = len(path.encode("utf-8"))
    except UnicodeEncodeError:
        return "not valid Unicode (unpaired surrogate)"
    if size > MAX_PATH_BYTES:
        return f"path of {size} bytes, the limit is {MAX_PATH_BYTES}"
    for part in path.split("/"):
        if part == "":
            return "empty path component"
        if part in (".", ".."):
            return f"'{part}' component"
        if len(part.encode("utf-8")) > MAX_NAME_BYTES:
            return f"component of {len(part.encode('utf-8'))} bytes, the limit is {MAX_NAME_BYTES}"
    return None


def _show(value: object) -> str:
    """``value`` as a message quotes it: its ``repr``, cut to ``SHOWN_CHARS``."""
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 3] + "..."


# -- parsing -------------------------------------------------------------------


def parse_json(data: bytes, *, what: str, limit: int, error: type[FormatError]) -> Any:
    """The JSON value of ``data`` (``what`` names it in messages); ``error`` when too big, too deep or not JSON."""
    if len(data) > limit:
        raise error(f"{what}: {len(data)} bytes, the limit is {limit}")
    try:
        return json.loads(data)
    except RecursionError:
        raise error(f"{what}: JSON nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, too many digits
        raise error(f"{what}: not valid JSON: {exc}") from None


def parse_manifest(data: bytes, *, source: str) -> Manifest:
    """Parse a manifest (Hub tree-listing JSON) read from ``source`` (named in messages).

    Raises ``ManifestError`` only when ``data`` is not usable as a whole.
    """
    doc = parse_json(data, what=f"manifest {source}", limit=MAX_MANIFEST_BYTES, error=ManifestError)
    if not isinstance(doc, list):
        raise ManifestError(f"manifest {source}: expected a JSON list of entries, found a {type(doc).__name__}")
    log = WarningLog()
    entries: list[tuple[str, Entry]] = []
    for i, item in enumerate(doc):
        where = f"manifest {source}: entry {i}"
        entry = _entry(item, where, log)
        if entry is not None:
            entries.append((f"{where} ({_show(_join(entry))})", entry))
    return _combine(entries, log)


def _join(entry: Entry) -> str:
    return entry.name if isinstance(entry, ManifestFile) else "/".join(entry)


def _entry(item: Any, where: str, log: WarningLog) -> Entry | None:
    """The entry described by one JSON value, or None (with a warning) when it cannot be used."""
    if not isinstance(item, dict):
        log.add("invalid", f"{where}: not a JSON object: {_show(item)}; skipped")
        return None
    path = item.get("path")
    if not isinstance(path, str):
        log.add("invalid", f"{where}: 'path' is not a string: {_show(path)}; skipped")
        return None
    where = f"{where} ({_show(path)})"
    problem = path_problem(path)
    if problem is not None:
        log.add("unsafe", f"{where}: unsafe name: {problem}; skipped")
        return None
    parts = tuple(path.split("/"))
    kind = item.get("type", "file")
    if kind == "directory":
        return parts
    if kind != "file":
        log.add("invalid", f"{where}: unknown type {_show(kind)}; skipped")
        return None
    return _file(item, parts, where, log)


def _file(item: dict[str, Any], parts: PathParts, where: str, log: WarningLog) -> ManifestFile | None:
    xet = item.get("xetHash")
    if xet is None:
        log.add("no-xet", f"{where}: no xetHash (a small file kept in git, not in Xet storage); skipped")
        return None
    if not isinstance(xet, str) or not hashes.is_hex(xet):
        log.add("invalid", f"{where}: xetHash is not 64 hex digits: {_show(xet)}; skipped")
        return None
    size = item.get("size")
    if size is not None and (type(size) is not int or size < 0):
        log.add("invalid", f"{where}: size is not a byte count: {_show(size)}; ignored")
        size = None
    mtime = item.get("mtime")
    mtime_ns = None if mtime is None else parse_mtime(mtime)
    if mtime is not None and mtime_ns is None:
        log.add("invalid", f"{where}: mtime is not a UTC ISO 8601 time: {_show(mtime)}; ignored")
    return ManifestFile(parts, hashes.from_hex(xet), size, _sha256(item.get("lfs"), where, log), mtime_ns)


_MTIME = re.compile(r"(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})(?:\.(\d{1,9}))?(?:Z|\+00:00)")


def parse_mtime(value: object) -> int | None:
    """``"2024-05-01T12:00:00.5Z"`` -> nanoseconds since the epoch.

    None when ``value`` is not such a time, or one that 64-bit nanoseconds cannot hold.
    """
    m = _MTIME.fullmatch(value) if isinstance(value, str) else None
    if m is None:
        return None
    try:
        seconds = datetime.strptime(m[1], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC).timestamp()
    except ValueError:
        return None
    ns = int(seconds) * 1_000_000_000 + int((m[2] or "0").ljust(9, "0"))
    return ns if -(2**63) <= ns < 2**63 else None  # what st_mtime_ns can hold (years 1677 to 2262)


def format_mtime(ns: int) -> str:
    """Nanoseconds since the epoch -> ``"2024-05-01T12:00:00.123456789Z"`` (no fraction when whole)."""
    seconds, fraction = divmod(ns, 1_000_000_000)
    text = datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{text}.{fraction:09d}Z" if fraction else f"{text}Z"


def _sha256(lfs: Any, where: str, log: WarningLog) -> str | None:
    if lfs is None:
        return None
    oid = lfs.get("oid") if isinstance(lfs, dict) else None
    if not isinstance(oid, str) or not hashes.is_hex(oid):
        log.add("invalid", f"{where}: lfs.oid is not a sha256 hex digest: {_show(oid)}; ignored")
        return None
    return oid.lower()


# -- conflicts -----------------------------------------------------------------

# The name tree of the accepted entries: a directory maps a component to a
# subdirectory (dict) or a file (ManifestFile).
_Dir = dict[str, "_Dir | ManifestFile"]


def combine(entries: Iterable[Entry], *, source: str) -> Manifest:
    """Validated entries in priority order -> a conflict-free ``Manifest``.

    The first entry for a path wins; a later entry that conflicts with it
    (another hash for the same file path, a file where a directory is or the
    reverse) is dropped with a warning.  Paths are assumed valid (see
    ``path_problem``); ``source`` names the manifest in warnings.
    """
    log = WarningLog()
    return _combine(((f"manifest {source}: {_show(_join(e))}", e) for e in entries), log)


def _combine(entries: Iterable[tuple[str, Entry]], log: WarningLog) -> Manifest:
    root: _Dir = {}
    files: list[ManifestFile] = []
    dirs: list[PathParts] = []
    seen_dirs: set[PathParts] = set()
    for where, entry in entries:
        if isinstance(entry, ManifestFile):
            if _add_file(root, entry, where, log):
                files.append(entry)
        elif _add_dir(root, entry, where, log) and entry not in seen_dirs:
            seen_dirs.add(entry)
            dirs.append(entry)
    return Manifest(tuple(files), tuple(dirs), tuple(log.lines()))


def _descend(root: _Dir, parts: PathParts, where: str, log: WarningLog) -> _Dir | None:
    """The directory ``parts`` (created as needed), or None when an ancestor is a file.

    Creating a directory never conflicts: once a component is new, all below it are new.
    """
    node = root
    for depth, part in enumerate(parts):
        child = node.setdefault(part, {})
        if isinstance(child, ManifestFile):
            log.add(
                "conflict",
                f"{where}: {_show('/'.join(parts[: depth + 1]))} is a file in an earlier entry; dropped",
            )
            return None
        node = child
    return node


def _add_file(root: _Dir, file: ManifestFile, where: str, log: WarningLog) -> bool:
    parent = _descend(root, file.path[:-1], where, log)
    if parent is None:
        return False
    existing = parent.get(file.path[-1])
    if existing is None:
        parent[file.path[-1]] = file
        return True
    if isinstance(existing, dict):
        log.add("conflict", f"{where}: is a directory in an earlier entry; dropped")
    elif existing.xet_hash != file.xet_hash:
        log.add(
            "conflict",
            f"{where}: an earlier entry gives this path the hash {hashes.to_hex(existing.xet_hash)}; "
            f"keeping it, dropping {hashes.to_hex(file.xet_hash)}",
        )
    return False  # an exact repeat is dropped silently


def _add_dir(root: _Dir, parts: PathParts, where: str, log: WarningLog) -> bool:
    return _descend(root, parts, where, log) is not None


# -- writing -------------------------------------------------------------------


def dump_manifest(files: Iterable[ManifestFile], directories: Iterable[PathParts] = ()) -> bytes:
    """Serialise entries as a Hub-style tree listing, sorted by path (UTF-8 JSON).

    ``parse_manifest`` reads it back to the same files and directories.
    Raises ``ManifestError`` for a path that ``path_problem`` rejects.
    """
    rows: list[tuple[PathParts, dict[str, Any]]] = []
    for d in directories:
        rows.append((d, {"type": "directory", "path": _checked(d)}))
    for f in files:
        row: dict[str, Any] = {"type": "file", "path": _checked(f.path)}
        if f.size is not None:
            row["size"] = f.size
        row["xetHash"] = hashes.to_hex(f.xet_hash)
        if f.sha256 is not None:
            row["lfs"] = {"oid": f.sha256} if f.size is None else {"oid": f.sha256, "size": f.size}
        if f.mtime_ns is not None:
            row["mtime"] = format_mtime(f.mtime_ns)
        rows.append((f.path, row))
    rows.sort(key=lambda r: r[0])
    return json.dumps([r for _, r in rows], ensure_ascii=False, indent=1).encode("utf-8") + b"\n"


def _checked(parts: PathParts) -> str:
    path = "/".join(parts)
    problem = "'/' inside a component" if any("/" in p for p in parts) else path_problem(path)
    if problem is not None:
        raise ManifestError(f"cannot write manifest entry {_show(parts)}: {problem}")
    return path


def store_manifest(store: Store) -> Manifest | None:
    """The names manifest the store keeps beside its objects (``Store.read_meta``), or None."""
    data = store.read_meta(MANIFEST_NAME, limit=MAX_MANIFEST_BYTES)
    return None if data is None else parse_manifest(data, source=f"{store.location}/{MANIFEST_NAME}")


def load_manifest(path: Path) -> Manifest:
    """Read and parse a manifest file; refuses one over ``MAX_MANIFEST_BYTES`` before reading it.

    Raises ``ManifestError`` (unusable content) or ``OSError``.
    """
    size = path.stat().st_size
    if size > MAX_MANIFEST_BYTES:
        raise ManifestError(f"manifest {path}: {size} bytes, the limit is {MAX_MANIFEST_BYTES}")
    return parse_manifest(path.read_bytes(), source=str(path))
