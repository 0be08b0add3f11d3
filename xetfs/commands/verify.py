"""Offline audit of a whole store (``xetfs verify``).

Checks, and reports every problem with the object, the offset and expected
versus found:

* the store has shards, unless it has no xorbs either (an empty store is
  fine, as it is for ``mount``);
* every shard parses and is named after the hash of its bytes;
* every xorb's footer is consistent, its chunk hashes aggregate to its name,
  and every chunk decodes and hashes to its recorded hash;
* every CAS record agrees with the xorb it describes;
* every term's xorb exists, its chunk range and size fit, its verification
  hash recomputes;
* every file's hash recomputes from its chunks and its content matches the
  recorded SHA-256;
* with a Hub catalogue (``audit_catalogue``): every blob and tree listing it
  names is a file of the store of the size it claims, and a blob named by a
  sha256 is a file whose recorded SHA-256 is that name (git sha1 names are
  checked when a pack reads the file);
* with a names manifest (``audit_manifest``): it parses, and every file it
  names is a file of the store of the size it claims.

Xorbs that no shard lists (a lost or bad shard's, or a pack's that was
stopped before it wrote its shard) are counted in a note: no file needs
them, so they are not a problem of their own.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from xetfs.base import hashes
from xetfs.base.errors import XetfsError
from xetfs.base.messages import plural
from xetfs.base.settings import VERIFY_BLOCK, VERIFY_CACHE_SIZE
from xetfs.format.shard import CasRecord, FileRecord, Shard, parse_shard
from xetfs.format.xorb import XorbLayout, check_run
from xetfs.read.reader import Reader
from xetfs.storage.catalogue import Catalogue, Content, Repo
from xetfs.storage.index import EMPTY_SHA256, FileEntry, Index
from xetfs.storage.indexer import shards_missing
from xetfs.storage.layout import shard_name_problem
from xetfs.storage.manifest import Manifest, not_in_store
from xetfs.storage.store import Store


class Progress(Protocol):
    """What ``audit`` reports progress to (a ``tqdm`` bar fits)."""

    def reset(self, total: int | None = None) -> None: ...

    def update(self, n: int = 1) -> bool | None: ...


class _NoProgress:
    def reset(self, total: int | None = None) -> None:
        pass

    def update(self, n: int = 1) -> None:
        pass


@dataclass
class Report:
    problems: list[str] = field(default_factory=list)
    shards: int = 0
    xorbs: int = 0
    chunks: int = 0
    files: int = 0
    bytes_checked: int = 0
    unlisted_xorbs: int = 0  # xorbs no shard lists (see the module docstring)

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass
class _Audit:
    store: Store
    progress: Progress
    names: Mapping[bytes, str]
    report: Report = field(default_factory=Report)
    layouts: dict[bytes, XorbLayout] = field(default_factory=dict)
    bad_xorbs: set[bytes] = field(default_factory=set)  # unreadable as a whole
    bad_chunks: dict[bytes, set[int]] = field(default_factory=dict)  # damaged chunks of readable xorbs

    def problem(self, message: str) -> None:
        self.report.problems.append(message)


async def audit(store: Store, progress: Progress | None = None, *, manifest: Manifest | None = None,
                catalogue: Catalogue | None = None) -> Report:  # fmt: skip
    """Check everything in ``store``, and its names ``manifest`` and Hub ``catalogue`` if it has them; progress
    counts xorb bytes scanned plus file bytes read.  The messages about a file give a path it has."""
    a = _Audit(store, progress or _NoProgress(), _file_names(manifest, catalogue))
    shards = _check_shards(a)
    xorb_bytes = sum(store.xorb_size(x) for x in store.xorb_hashes())
    file_bytes = {r.file_hash: r.size for shard in shards for r in shard.files if r.sha256 is not None}
    a.progress.reset(total=xorb_bytes + sum(file_bytes.values()))
    for xorb_hash in sorted(store.xorb_hashes()):
        _check_xorb(a, xorb_hash)
    index = Index()
    listed: set[bytes] = set()
    for shard in shards:
        index.add_shard(shard)
        for cas in shard.xorbs:
            _check_cas(a, cas)
            listed.add(cas.xorb_hash)
        listed.update(t.xorb_hash for record in shard.files for t in record.terms)
    a.report.unlisted_xorbs = sum(1 for x in store.xorb_hashes() if x not in listed)
    checked: set[bytes] = set()
    reader = Reader(index, store, cache_size=VERIFY_CACHE_SIZE)
    for shard in shards:
        for record in shard.files:
            if record.file_hash not in checked:
                checked.add(record.file_hash)
                await _check_file(a, index, reader, record)
    a.report.files = len(checked)
    a.report.problems += audit_catalogue(catalogue, index) if catalogue is not None else []
    a.report.problems += audit_manifest(manifest, index) if manifest is not None else []
    return a.report


def _file_names(manifest: Manifest | None, catalogue: Catalogue | None) -> dict[bytes, str]:
    """A path for each file the names manifest or Hub catalogue names, for the messages: the first, and how
    many more there are (``"org/name@<commit>/model.bin, and 2 more names"``)."""
    paths: dict[bytes, list[str]] = {}
    for f in manifest.files if manifest else ():
        paths.setdefault(f.xet_hash, []).append(f.name)
    for repo in catalogue.repos if catalogue else ():
        for commit, rev in sorted(repo.revisions.items()):
            for path, blob in sorted(rev.files.items()):
                if (content := repo.blobs.get(blob)) is not None:
                    paths.setdefault(hashes.from_hex(content.xet_hash), []).append(f"{repo.id}@{commit[:12]}/{path}")
    return {h: p[0] + (f", and {plural(len(p) - 1, 'more name')}" if len(p) > 1 else "") for h, p in paths.items()}


def _check_shards(a: _Audit) -> list[Shard]:
    shards = []
    shard_files = a.store.shard_files()
    missing = shards_missing(a.store, len(shard_files))
    if missing is not None:
        a.problem(missing)
    for shard_file in shard_files:
        try:
            data = a.store.read_shard(shard_file)
            shards.append(parse_shard(data, where=f"shard {shard_file.name}"))
        except XetfsError as exc:
            a.problem(str(exc))
            continue
        problem = shard_name_problem(shard_file.name, data)
        if problem is not None:
            a.problem(f"shard {shard_file.name}: {problem}")
    a.report.shards = len(shard_files)  # (a bad one is checked too: it is one of the problems)
    return shards


def _check_xorb(a: _Audit, xorb_hash: bytes) -> None:
    try:
        layout = a.store.load_layout(xorb_hash)
    except XetfsError as exc:
        a.problem(str(exc))
        a.bad_xorbs.add(xorb_hash)
        return
    a.layouts[xorb_hash] = layout
    a.report.xorbs += 1
    # Runs of whole chunks, one store read each (one request for a remote store); a run whose read
    # fails is read again chunk by chunk, so each problem names the chunk it is about.
    start = 0
    while start < layout.num_chunks:
        stop = start + 1
        while stop < layout.num_chunks and layout.phys_ends[stop] - layout.phys_start(start) <= VERIFY_BLOCK:
            stop += 1
        stop = a.store.chunk_limit(xorb_hash, start, stop)  # (within one disk-cache entry or none)
        try:
            problems = _read_run(a.store, xorb_hash, layout, start, stop)
        except XetfsError:
            problems = [_check_chunk(a, xorb_hash, layout, i) for i in range(start, stop)]
        for i, problem in enumerate(problems, start):
            a.progress.update(layout.phys_ends[i] - layout.phys_start(i))
            if problem is not None:
                a.problem(str(problem))
                a.bad_chunks.setdefault(xorb_hash, set()).add(i)
            else:
                a.report.chunks += 1
        start = stop


def _read_run(store: Store, xorb_hash: bytes, layout: XorbLayout, start: int, stop: int) -> list[XetfsError | None]:
    """Chunks ``[start, stop)`` of a xorb read and checked (``check_run``: per chunk, its problem or None): from
    the store's source, or through its disk cache if it has one (``--use-cache``).  A disk-cache entry that fails
    its chunks' check is dropped, and the chunks are read from the source; what the source gave is kept once
    every chunk checked."""
    phys = (layout.phys_start(start), layout.phys_ends[stop - 1])
    if store.chunks is None:
        return check_run(store.read_xorb(xorb_hash, *phys), xorb_hash, layout, start, stop)
    for _ in range(2):  # (an entry that could not be deleted, on a read-only cache, is found again: then no more)
        src = store.chunk_source(xorb_hash, layout, start, stop)
        try:
            data = store.read_source(xorb_hash, src, *phys, start, stop)
        except XetfsError as exc:
            if src.entry is None:
                raise
            store.chunks.drop(xorb_hash, src.entry, str(exc))
            continue
        problems = check_run(data, xorb_hash, layout, start, stop)
        failed = next((p for p in problems if p is not None), None)
        if src.entry is not None and failed is not None:
            store.chunks.drop(xorb_hash, src.entry, str(failed))
            continue
        if src.cache_to is not None and failed is None:
            store.chunks.put(xorb_hash, start, stop, data)
        return problems  # (the source's own bytes, if a chunk failed: the caller reports it)
    return check_run(store.read_xorb(xorb_hash, *phys), xorb_hash, layout, start, stop)


def _check_chunk(a: _Audit, xorb_hash: bytes, layout: XorbLayout, i: int) -> XetfsError | None:
    """Chunk ``i`` read and checked on its own: None, or the error that stopped it."""
    try:
        (problem,) = check_run(a.store.read_xorb(xorb_hash, layout.phys_start(i), layout.phys_ends[i]), xorb_hash,
                               layout, i, i + 1)  # fmt: skip
    except XetfsError as exc:  # the read itself failed
        return exc
    return problem


def _check_cas(a: _Audit, cas: CasRecord) -> None:
    layout = a.layouts.get(cas.xorb_hash)
    where = f"CAS record for xorb {hashes.to_hex(cas.xorb_hash)}"
    if layout is None:
        if not a.store.has_xorb(cas.xorb_hash):
            a.problem(f"{where}: xorb is missing from the store")
        return
    if len(cas.chunks) != layout.num_chunks:
        a.problem(f"{where}: lists {plural(len(cas.chunks), 'chunk')}, the xorb has {layout.num_chunks}")
        return
    for i, chunk in enumerate(cas.chunks):
        if chunk.chunk_hash != (layout.chunk_hashes or ())[i] or chunk.size != layout.chunk_size(i):
            a.problem(f"{where}: chunk {i} differs from the xorb footer (hash or size)")
            return
    if cas.num_bytes != layout.unpacked_ends[-1]:
        a.problem(f"{where}: says {cas.num_bytes} bytes, the xorb holds {layout.unpacked_ends[-1]}")


async def _check_file(a: _Audit, index: Index, reader: Reader, record: FileRecord) -> None:
    name = f"file {hashes.to_hex(record.file_hash)}"
    if record.file_hash in a.names:
        name = f"{a.names[record.file_hash]} ({name})"
    pairs: list[tuple[bytes, int]] = []
    for t, term in enumerate(record.terms):
        where = f"{name} term {t} (xorb {hashes.to_hex(term.xorb_hash)} chunks [{term.start}, {term.end}))"
        layout = a.layouts.get(term.xorb_hash)
        if layout is None:
            missing = not a.store.has_xorb(term.xorb_hash)
            a.problem(f"{where}: xorb is {'missing' if missing else 'unreadable'}")
            return
        if term.end > layout.num_chunks:
            a.problem(f"{where}: xorb has only {plural(layout.num_chunks, 'chunk')}")
            return
        chunk_hashes = (layout.chunk_hashes or ())[term.start : term.end]
        size = layout.range_size(term.start, term.end)
        if size != term.size:
            a.problem(f"{where}: size {term.size} in the shard, chunks hold {size}")
        if record.verification:
            found = hashes.verification_hash(chunk_hashes)
            if found != record.verification[t]:
                a.problem(
                    f"{where}: verification hash expected {hashes.to_hex(record.verification[t])}, "
                    f"found {hashes.to_hex(found)}"
                )
        pairs.extend((h, layout.chunk_size(term.start + k)) for k, h in enumerate(chunk_hashes))
    found_hash = hashes.file_hash(pairs)
    if found_hash != record.file_hash:
        a.problem(f"{name}: chunks hash to {hashes.to_hex(found_hash)}")
    if any(_touches_damage(a, t.xorb_hash, t.start, t.end) for t in record.terms):
        a.problem(f"{name}: content not checked, it uses a damaged chunk")
        return
    entry = index.get(record.file_hash)
    if entry is None or record.sha256 is None:
        return
    digest = hashlib.sha256()
    try:
        for offset in range(0, entry.size, VERIFY_BLOCK):
            data = await reader.read(entry, offset, VERIFY_BLOCK)
            digest.update(data)
            a.report.bytes_checked += len(data)
            a.progress.update(len(data))
    except XetfsError as exc:
        a.problem(f"{name}: {exc}")
        return
    expected = entry.sha256
    if record.sha256 == hashes.ZERO_HASH and entry.size == 0:
        expected = EMPTY_SHA256
    if digest.hexdigest() != expected:
        a.problem(f"{name}: sha256 expected {expected}, found {digest.hexdigest()}")


def _touches_damage(a: _Audit, xorb_hash: bytes, start: int, end: int) -> bool:
    bad = a.bad_chunks.get(xorb_hash, ())
    return xorb_hash in a.bad_xorbs or any(start <= i < end for i in bad)


def audit_catalogue(catalogue: Catalogue, index: Index) -> list[str]:
    """Problems of a Hub catalogue against the store's files (see the module docstring)."""
    problems = [f"catalogue: {w}" for w in catalogue.warnings]

    def check(what: str, content: Content, sha256: str | None, entry: FileEntry | None) -> None:
        if entry is None:
            problems.append(f"catalogue: {what}: file {content.xet_hash} is not in the store")
        elif entry.size != content.size:
            problems.append(f"catalogue: {what}: {content.size} bytes in the catalogue, {entry.size} in the store")
        elif sha256 is not None and entry.sha256 is not None and entry.sha256 != sha256:
            problems.append(f"catalogue: {what}: the store's file {entry.hex} has sha256 {entry.sha256}")

    for repo in catalogue.repos:
        where = f"{repo.type} {repo.id}"
        missing = []  # blobs whose file the store lacks: one line for the repo (a skipped shard takes thousands)
        for name, content in sorted(repo.blobs.items()):
            entry = index.get(hashes.from_hex(content.xet_hash))
            if entry is None:
                missing.append(name)
            else:
                check(f"{where}: blob {name}", content, name if len(name) == 64 else None, entry)
        if missing:
            first = f"blob {missing[0]}: file {repo.blobs[missing[0]].xet_hash}{_named_by(repo, missing[0])}"
            problems.append(f"catalogue: {where}: {first} is not in the store" if len(missing) == 1 else
                            f"catalogue: {where}: the files of {len(missing)} blobs of {len(repo.blobs)} are not in "
                            f"the store; the first: {first}")  # fmt: skip
        for commit, rev in sorted(repo.revisions.items()):
            if rev.tree is not None:
                check(f"{where}: trees/{commit}.json", rev.tree, None, index.get(hashes.from_hex(rev.tree.xet_hash)))
    return problems


def audit_manifest(manifest: Manifest, index: Index) -> list[str]:
    """Problems of a names manifest against the store's files (see the module docstring)."""
    missing, sizes = [], []
    for f in manifest.files:
        entry = index.get(f.xet_hash)
        if entry is None:
            missing.append(f)
        elif f.size is not None and f.size != entry.size:
            sizes.append(f"names: {f.name}: {f.size} bytes in the manifest, {entry.size} in the store")
    lost = [f"names: {not_in_store(missing, len(manifest.files))}"] if missing else []
    return [f"names: {w}" for w in manifest.warnings] + lost + sizes


def _named_by(repo: Repo, blob: str) -> str:
    """Which snapshot files name ``blob``, for a message: " (snapshots/<commit>/<path>, and N more)", or ""."""
    paths = sorted(f"{commit}/{path}" for commit, rev in repo.revisions.items()
                   for path, name in rev.files.items() if name == blob)  # fmt: skip
    if not paths:
        return ""
    more = f", and {len(paths) - 1} more" if len(paths) > 1 else ""
    return f" (snapshots/{paths[0]}{more})"
