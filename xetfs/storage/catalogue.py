"""The Hub catalogue: which repos, revisions, refs and files a store holds, by Hugging Face cache names.

Owns the catalogue format (pure: bytes in, frozen records out, and back),
how two catalogues merge, and the catalogue file beside the store
(``STORE/xetfs-hub.json``): where a mount finds it, and its atomic write
(writers hold the store's pack lock, ``pack.locked``).  The format::

    {"format": "xetfs-hub", "version": 1,
     "repos": [{"type": "model", "id": "org/name",
                "refs": {"main": "<commit>", "pr/1": "<commit>"},
                "blobs": {"<blob name>": {"xetHash": "<64 hex>", "size": 123,
                                          "mtime": "2024-05-01T12:00:00.5Z"}},
                "revisions": {"<commit>": {"files": {"dir/a.json": "<blob name>"},
                                           "noExist": ["adapter_config.json"],
                                           "tree": {"xetHash": "<64 hex>", "size": 456}}}}]}

A blob name is what huggingface_hub names the file in ``blobs/``: a sha256
(64 hex) or a git blob sha1 (40 hex).  ``tree`` is the bytes of
``trees/<commit>.json`` when the cache had one.  A blob's ``mtime`` (optional)
is the time its file had where it was packed from; a mount shows it.

Contract of ``parse_catalogue``: input that is not a catalogue document at
all raises ``CatalogueError``; a bad repo, ref, revision or file is dropped
with a warning naming it, and the rest is used.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from xetfs.base import hashes
from xetfs.base.errors import CatalogueError
from xetfs.base.settings import SHOWN_CHARS
from xetfs.storage.layout import find_beside, replace_file
from xetfs.storage.manifest import WarningLog, format_mtime, parse_json, parse_mtime, path_problem
from xetfs.storage.store import Store

CATALOGUE_NAME = "xetfs-hub.json"
FORMAT = "xetfs-hub"
VERSION = 1
MAX_CATALOGUE_BYTES = 1024 * 1024 * 1024

REPO_TYPES = ("model", "dataset", "space")
_COMMIT = re.compile(r"[0-9a-f]{40}")
_BLOB = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?")


@dataclass(frozen=True, slots=True)
class Content:
    """Bytes kept in the store: the Xet file hash (hex) and the size; for a blob, the modification time its
    file had where it was packed from (the Hub cache's blob, or the directory's file), when recorded."""

    xet_hash: str
    size: int
    mtime_ns: int | None = None


@dataclass(frozen=True, slots=True)
class Revision:
    """One commit of a repo: ``files`` maps a path in the snapshot to a blob name."""

    files: Mapping[str, str] = field(default_factory=dict)
    no_exist: tuple[str, ...] = ()
    tree: Content | None = None


@dataclass(frozen=True, slots=True)
class Repo:
    type: str  # "model", "dataset" or "space"
    id: str  # "org/name" or "name"
    refs: Mapping[str, str] = field(default_factory=dict)  # ref name -> commit
    blobs: Mapping[str, Content] = field(default_factory=dict)  # blob name -> content
    revisions: Mapping[str, Revision] = field(default_factory=dict)  # commit -> revision

    @property
    def key(self) -> tuple[str, str]:
        return (self.type, self.id)

    @property
    def folder(self) -> str:
        """The repo's directory name in a huggingface_hub cache (``models--org--name``)."""
        return repo_folder(self.type, self.id)


@dataclass(frozen=True, slots=True)
class Catalogue:
    repos: tuple[Repo, ...] = ()  # sorted by (type, id)
    warnings: tuple[str, ...] = ()

    def repo(self, repo_type: str, repo_id: str) -> Repo | None:
        return next((r for r in self.repos if r.key == (repo_type, repo_id)), None)

    def blob_index(self) -> dict[str, Content]:
        """Every blob name of every repo -> its content (names are content hashes, so one name is one content)."""
        return {name: c for r in self.repos for name, c in r.blobs.items()}


def repo_folder(repo_type: str, repo_id: str) -> str:
    return f"{repo_type}s--{repo_id.replace('/', '--')}"


def repo_id_problem(repo_id: str) -> str | None:
    """Why ``repo_id`` is not a Hub repo id (``name`` or ``org/name``), or None."""
    if not _REPO_ID.fullmatch(repo_id) or "--" in repo_id or ".." in repo_id or len(repo_id) > 200:
        return "not a repo id like org/name"
    return None


def ref_problem(ref: str) -> str | None:
    """Why ``ref`` cannot be a ref name (a file under ``refs/``), or None."""
    return path_problem(ref)


def is_commit(text: str) -> bool:
    return bool(_COMMIT.fullmatch(text))


def is_blob_name(text: str) -> bool:
    return bool(_BLOB.fullmatch(text))


# -- parsing ---------------------------------------------------------------------


def parse_catalogue(data: bytes, *, source: str) -> Catalogue:
    """Parse a catalogue document read from ``source`` (named in messages).

    Raises ``CatalogueError`` only when ``data`` is not usable as a whole.
    """
    doc = parse_json(data, what=f"catalogue {source}", limit=MAX_CATALOGUE_BYTES, error=CatalogueError)
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise CatalogueError(f"catalogue {source}: not a {FORMAT} document")
    if doc.get("version") != VERSION:
        raise CatalogueError(f"catalogue {source}: version {doc.get('version')!r}, this xetfs reads {VERSION}")
    repos = doc.get("repos")
    if not isinstance(repos, list):
        raise CatalogueError(f"catalogue {source}: 'repos' is not a list")
    log = WarningLog()
    parsed: dict[tuple[str, str], Repo] = {}
    for i, item in enumerate(repos):
        repo = _repo(item, f"catalogue {source}: repo {i}", log)
        if repo is None:
            continue
        if repo.key in parsed:
            log.add("invalid", f"catalogue {source}: repo {i} ({repo.type} {repo.id}) repeats an earlier one; merged")
            repo = merge_repo(parsed[repo.key], repo)
        parsed[repo.key] = repo
    return Catalogue(tuple(parsed[k] for k in sorted(parsed)), tuple(log.lines()))


def _repo(item: Any, where: str, log: WarningLog) -> Repo | None:
    if not isinstance(item, dict):
        log.add("invalid", f"{where}: not a JSON object; skipped")
        return None
    repo_type, repo_id = item.get("type"), item.get("id")
    if repo_type not in REPO_TYPES or not isinstance(repo_id, str) or repo_id_problem(repo_id):
        log.add("invalid", f"{where}: bad type or id ({repo_type!r} {repo_id!r}); skipped")
        return None
    where = f"{where} ({repo_type} {repo_id})"
    blobs: dict[str, Content] = {}
    for name, value in _dict(item.get("blobs"), f"{where}: blobs", log).items():
        content = _content(value)
        if not is_blob_name(name) or content is None:
            log.add("invalid", f"{where}: blob {name!r}: not a blob name with xetHash and size; skipped")
            continue
        if content.mtime_ns is None and isinstance(value, dict) and value.get("mtime") is not None:
            log.add("invalid", f"{where}: blob {name!r}: mtime {str(value['mtime'])[:SHOWN_CHARS]!r} is not a time; "
                    "the store's time is shown")  # fmt: skip
        blobs[name] = content
    revisions: dict[str, Revision] = {}
    for commit, value in _dict(item.get("revisions"), f"{where}: revisions", log).items():
        revision = _revision(commit, value, blobs, f"{where}: revision {commit!r}", log)
        if revision is not None:
            revisions[commit] = revision
    refs: dict[str, str] = {}
    for ref, commit in _dict(item.get("refs"), f"{where}: refs", log).items():
        if ref_problem(ref) is not None or not isinstance(commit, str) or commit not in revisions:
            log.add("invalid", f"{where}: ref {ref!r} -> {commit!r}: bad name or no such revision; skipped")
        else:
            refs[ref] = commit
    return Repo(repo_type, repo_id, refs, blobs, revisions)


def _dict(value: Any, where: str, log: WarningLog) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        log.add("invalid", f"{where}: not a JSON object; ignored")
        return {}
    return value


def _content(value: Any) -> Content | None:
    if not isinstance(value, dict):
        return None
    xet, size = value.get("xetHash"), value.get("size")
    if not isinstance(xet, str) or not hashes.is_hex(xet) or type(size) is not int or size < 0:
        return None
    return Content(xet.lower(), size, parse_mtime(value.get("mtime")))  # (a bad time: none, as none recorded)


def _revision(commit: str, value: Any, blobs: Mapping[str, Content], where: str, log: WarningLog) -> Revision | None:
    if not is_commit(commit) or not isinstance(value, dict):
        log.add("invalid", f"{where}: not a 40-hex commit with an object; skipped")
        return None
    files: dict[str, str] = {}
    for path, blob in _dict(value.get("files"), f"{where}: files", log).items():
        problem = path_problem(path)
        if problem is not None:
            log.add("unsafe", f"{where}: file {path!r}: {problem}; skipped")
        elif not isinstance(blob, str) or blob not in blobs:
            log.add("invalid", f"{where}: file {path!r}: blob {blob!r} is not in the repo's blobs; skipped")
        else:
            files[path] = blob
    no_exist: list[str] = []
    raw = value.get("noExist", [])
    for path in raw if isinstance(raw, list) else []:
        problem = path_problem(path) if isinstance(path, str) else "not a string"
        if problem is not None:
            log.add("unsafe", f"{where}: noExist {path!r}: {problem}; skipped")
        else:
            no_exist.append(path)
    tree = value.get("tree")
    content = None if tree is None else _content(tree)
    if tree is not None and content is None:
        log.add("invalid", f"{where}: tree is not xetHash and size; ignored")
    return Revision(files, tuple(sorted(set(no_exist))), content)


# -- merging and writing -------------------------------------------------------------


def merge_repo(old: Repo, new: Repo) -> Repo:
    """``new`` over ``old``: refs move to ``new``'s commits, blobs and revisions are united (a blob keeps the
    time first recorded for it, so that every node and every later pack shows the same)."""
    revisions = dict(old.revisions)
    for commit, rev in new.revisions.items():
        before = revisions.get(commit)
        if before is not None:
            files = {**before.files, **rev.files}
            no_exist = tuple(sorted((set(before.no_exist) | set(rev.no_exist)) - set(files)))
            rev = Revision(files, no_exist, rev.tree or before.tree)
        revisions[commit] = rev
    blobs = dict(old.blobs)
    for name, c in new.blobs.items():
        first = old.blobs[name].mtime_ns if name in old.blobs else None
        blobs[name] = c if first is None else replace(c, mtime_ns=first)
    return replace(
        old,
        refs={**old.refs, **new.refs},
        blobs=blobs,
        revisions=revisions,
    )


def moved_refs(old: Catalogue, new: Catalogue) -> list[str]:
    """What merging ``new`` into ``old`` does to refs ``old`` has: ``"model org/name: main c2f7ab12 -> c7461e0f"``
    for each ref that will name another commit."""
    moved = []
    for repo in new.repos:
        before = old.repo(repo.type, repo.id)
        for ref, commit in sorted(repo.refs.items()):
            was = before.refs.get(ref) if before is not None else None
            if was is not None and was != commit:
                moved.append(f"{repo.type} {repo.id}: {ref} {was[:8]} -> {commit[:8]}")
    return moved


def merge(old: Catalogue, new: Catalogue) -> Catalogue:
    """The repos of both; a repo in both is ``merge_repo(old, new)``."""
    repos = {r.key: r for r in old.repos}
    for r in new.repos:
        repos[r.key] = merge_repo(repos[r.key], r) if r.key in repos else r
    return Catalogue(tuple(repos[k] for k in sorted(repos)))


def dump_catalogue(catalogue: Catalogue) -> bytes:
    """The catalogue document (sorted, UTF-8 JSON); ``parse_catalogue`` reads it back unchanged."""

    def content(c: Content) -> dict[str, Any]:
        row: dict[str, Any] = {"xetHash": c.xet_hash, "size": c.size}
        if c.mtime_ns is not None:
            row["mtime"] = format_mtime(c.mtime_ns)
        return row

    repos = []
    for r in sorted(catalogue.repos, key=lambda r: r.key):
        revisions: dict[str, Any] = {}
        for commit in sorted(r.revisions):
            rev = r.revisions[commit]
            row: dict[str, Any] = {"files": dict(sorted(rev.files.items()))}
            if rev.no_exist:
                row["noExist"] = list(rev.no_exist)
            if rev.tree is not None:
                row["tree"] = content(rev.tree)
            revisions[commit] = row
        repos.append(
            {
                "type": r.type,
                "id": r.id,
                "refs": dict(sorted(r.refs.items())),
                "blobs": {name: content(r.blobs[name]) for name in sorted(r.blobs)},
                "revisions": revisions,
            }
        )
    doc = {"format": FORMAT, "version": VERSION, "repos": repos}
    return json.dumps(doc, ensure_ascii=False, indent=1).encode("utf-8") + b"\n"


# -- the file beside the store ---------------------------------------------------------


def store_catalogue(store: Store) -> Catalogue | None:
    """The Hub catalogue the store keeps beside its objects (``Store.read_meta``), or None.

    For every store: a directory, a web server or a bucket.  Raises ``CatalogueError``.
    """
    data = store.read_meta(CATALOGUE_NAME, limit=MAX_CATALOGUE_BYTES)
    return None if data is None else parse_catalogue(data, source=f"{store.location}/{CATALOGUE_NAME}")


def find_catalogue(store_dir: Path) -> Path | None:
    """The catalogue of the store given as ``store_dir`` (``DIR``, ``DIR/xet`` or ``DIR/xet/xorbs``), or None."""
    return find_beside(store_dir, CATALOGUE_NAME)


def load_catalogue(path: Path) -> Catalogue:
    """Read and parse a catalogue file.  Needs no write access: it is replaced whole, never edited in place.

    Raises ``CatalogueError`` or ``OSError``.
    """
    size = path.stat().st_size
    if size > MAX_CATALOGUE_BYTES:
        raise CatalogueError(f"catalogue {path}: {size} bytes, the limit is {MAX_CATALOGUE_BYTES}")
    return parse_catalogue(path.read_bytes(), source=str(path))


def write_catalogue(path: Path, catalogue: Catalogue) -> None:
    """Replace ``path`` with ``catalogue`` atomically: a reader (or a crash) sees the old file or the new one."""
    replace_file(path, dump_catalogue(catalogue))


def update_catalogue(store_dir: Path, new: Catalogue) -> list[str]:
    """Merge ``new`` into the store's catalogue and write it atomically; the refs that moved (``moved_refs``).

    The caller holds the store's pack lock (``pack.locked``).  An unreadable existing
    catalogue raises ``CatalogueError`` rather than being overwritten.
    """
    path = store_dir / CATALOGUE_NAME
    old = load_catalogue(path) if path.exists() else Catalogue()
    write_catalogue(path, merge(old, new))
    return moved_refs(old, new)
