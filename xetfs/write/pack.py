"""``xetfs pack SRC... STORE``: write files into a local Xet store with hf_xet, and name them.

Owns the planning of a pack (which files, under which names), the upload
through the official client (``hf_xet.upload_files`` with a ``local://``
endpoint), and the names manifest beside the store
(``STORE/xetfs-manifest.json``, Hub tree-listing JSON, merged with the one
already there), and the store's listing (``remote.publish``), which lets a
plain HTTP server serve it.  Also where a mount looks for that manifest.

Each file's modification time (taken before the upload) is kept in the
manifest's ``mtime`` field, which the mount shows.

Naming: a directory that is the only SRC contributes its contents relative to
itself; otherwise a directory contributes ``<its name>/...`` and a file its
name.  Directories are walked in sorted order; only regular files are packed
(symlinks and special files are skipped with a warning, so nothing outside
the tree is read); every directory is recorded, so empty ones survive.  With
``follow_symlinks`` a link is packed as what it points to (a file, or a
directory walked in turn; a link back to a directory above it is skipped).

Skipped files are counted (``Plan.skipped``): ``pack --strict`` refuses to
pack when there are any, and otherwise ``pack`` exits with
``ExitStatus.SKIPPED`` so that a script can tell the pack is incomplete.
A directory whose files are all symlinks (a huggingface_hub snapshot: its
subdirectories are real) gets a hint naming ``--hub-cache`` and
``--follow-symlinks``.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import stat
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xetfs.base import hashes
from xetfs.base.errors import XetfsError
from xetfs.base.messages import plural, print_warning
from xetfs.storage.index import EMPTY_SHA256
from xetfs.storage.layout import HF_XET_OWN, find_beside, replace_file
from xetfs.storage.manifest import (
    MANIFEST_NAME,
    Entry,
    Manifest,
    ManifestFile,
    PathParts,
    combine,
    dump_manifest,
    load_manifest,
    path_problem,
)
from xetfs.storage.remote import publish
from xetfs.write.packstate import Known, Stamp, forget_gone, load_state, remember, save_state, stamp_of

LOCK_NAME = ".xetfs-pack.lock"  # the store's pack lock (``locked``)
REDB_INDEX = "global_dedup_lookup.redb"  # hf_xet's own lookup table in xet/xorbs/, not read by xetfs

Warn = Callable[[str], None]


# -- finding and loading a manifest --------------------------------------------------


def find_manifest(store_dir: Path) -> Path | None:
    """The manifest of the store given as ``store_dir`` (``DIR``, ``DIR/xet`` or ``DIR/xet/xorbs``), or None."""
    return find_beside(store_dir, MANIFEST_NAME)


# -- planning ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Source:
    """One file to upload: its name in the manifest, where it is on disk (absolute), what its ``stat`` said."""

    path: PathParts
    local: Path
    stamp: Stamp

    @property
    def mtime_ns(self) -> int:
        return self.stamp.mtime_ns

    @property
    def size(self) -> int:
        return self.stamp.size


@dataclass
class Plan:
    """What a pack will upload (``files``, in walk order) and which directories it records.

    ``skipped``: the paths left out, each with a warning (the store itself, when a source holds it, is not
    counted); ``all_links``: directories with symlinks (not followed) and no regular file, nor any below them.
    """

    files: list[Source] = field(default_factory=list)
    directories: list[PathParts] = field(default_factory=list)
    skipped: list[Path] = field(default_factory=list)
    all_links: list[Path] = field(default_factory=list)


def links_hint(directories: Sequence[Path]) -> str:
    """What to do about directories whose files are all symlinks (a huggingface_hub snapshot, most often)."""
    others = len(directories) - 1
    where = str(directories[0]) + (f" (and {plural(others, 'other directory', 'other directories')})" if others else "")
    return (
        f"every file in {where} is a symlink, as in a huggingface_hub snapshot: import the cache with "
        "xetfs pack --hub-cache [DIR] STORE, or pack what the links point to with --follow-symlinks"
    )


def plan_pack(sources: Sequence[Path], store: Path, warn: Warn = print_warning, *,
              follow_symlinks: bool = False) -> Plan:  # fmt: skip
    """Walk ``sources`` and name what they hold (see the module docstring).

    The store directory is skipped if a source contains it.  Raises
    ``OSError`` for a missing or unreadable source and ``XetfsError`` for a
    source that is neither a file nor a directory, for nothing to pack
    (with the hint of ``links_hint`` when it applies), and for two sources
    that give the same name.  The caller shows that hint otherwise.
    """
    plan = Plan()
    skip = store.resolve()
    for src in sources:
        where = src.resolve()
        if where == skip or skip in where.parents:
            raise XetfsError(f"{src}: is the destination store {store} or inside it")
        st = os.stat(src)  # follows a symlink named on the command line: that one the user chose
        if stat.S_ISDIR(st.st_mode):
            prefix: PathParts = () if len(sources) == 1 else (_top_name(src),)
            if prefix:
                plan.directories.append(prefix)
            _walk(src, prefix, plan, skip, warn, follow_symlinks)
        elif stat.S_ISREG(st.st_mode):
            plan.files.append(Source((_top_name(src),), src.absolute(), Stamp.of(st)))
        else:
            raise XetfsError(f"{src}: not a regular file or directory")
    if plan.all_links:  # (a directory of links beside subdirectories of files is not a snapshot: no hint)
        holding = {parent for f in plan.files for parent in f.local.parents}
        plan.all_links = [d for d in plan.all_links if d.absolute() not in holding]
    if not plan.files:
        hint = f"; {links_hint(plan.all_links)}" if plan.all_links else ""
        raise XetfsError(f"nothing to pack: no regular files in {', '.join(map(str, sources))}{hint}")
    _check_unique(plan)
    return plan


def _top_name(src: Path) -> str:
    name = src.name if src.name not in ("", ".", "..") else src.resolve().name
    if not name:
        raise XetfsError(f"{src}: has no name to use in the manifest")
    problem = path_problem(name)
    if problem is not None:
        raise XetfsError(f"{src}: cannot be named {name!r} in the manifest: {problem}")
    return name


def _walk(top: Path, prefix: PathParts, plan: Plan, skip: Path, warn: Warn, follow: bool) -> None:
    """Add the regular files and directories below ``top`` to ``plan``, depth first in name order.

    With ``follow``, a symlink counts as what it points to; a link to a
    directory the walk is inside (a loop) and a dangling link are skipped.
    """

    def skipped(message: str, path: Path) -> None:
        warn(message)
        plan.skipped.append(path)

    stack: list[tuple[Path, PathParts, frozenset[Path]]] = [(top, prefix, frozenset({top.resolve()}))]
    while stack:
        directory, parts, above = stack.pop()
        with os.scandir(directory) as it:
            entries = sorted(it, key=lambda e: e.name)
        links = sum(e.is_symlink() for e in entries)
        if links and not follow and all(e.is_symlink() or e.is_dir(follow_symlinks=False) for e in entries):
            plan.all_links.append(directory)
        below: list[tuple[Path, PathParts, frozenset[Path]]] = []
        for e in entries:
            path = Path(e.path)
            problem = path_problem(e.name)
            link = e.is_symlink()
            if problem is not None:
                skipped(f"skipping {path}: cannot be named in the manifest: {problem}", path)
            elif link and not follow:
                skipped(f"skipping symlink {path}", path)
            elif link and not e.is_dir() and not e.is_file():
                what = "nothing (dangling)" if not os.path.exists(path) else "neither a regular file nor a directory"
                skipped(f"skipping symlink {path}: it points to {what}", path)
            elif e.is_dir(follow_symlinks=follow):
                real = path.resolve()
                if real == skip:
                    warn(f"skipping {path}: it is the destination store")
                    continue
                if real in above:
                    skipped(f"skipping symlink {path}: it points to {real}, which holds it (a loop)", path)
                    continue
                plan.directories.append((*parts, e.name))
                below.append((path, (*parts, e.name), above | {real}))
            elif e.is_file(follow_symlinks=follow):
                plan.files.append(Source((*parts, e.name), path.absolute(), Stamp.of(e.stat(follow_symlinks=follow))))
            else:
                skipped(f"skipping {path}: not a regular file", path)
        stack.extend(reversed(below))


def _check_unique(plan: Plan) -> None:
    """Raise ``XetfsError`` when two sources give one name, or a name is both a file and a directory."""
    seen: dict[PathParts, Path] = {}
    for f in plan.files:
        other = seen.setdefault(f.path, f.local)
        if other is not f.local:
            raise XetfsError(f"two sources would both be named {'/'.join(f.path)!r}: {other} and {f.local}")
    dirs = set(plan.directories)
    for f in plan.files:
        dirs.update(f.path[:k] for k in range(1, len(f.path)))
    for f in plan.files:
        if f.path in dirs:
            raise XetfsError(f"{'/'.join(f.path)!r} would be both a file ({f.local}) and a directory")


# -- uploading -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Uploaded:
    """What hf_xet reports for one uploaded file."""

    xet_hash: bytes
    size: int
    sha256: str | None


def upload(paths: Sequence[Path], store: Path, *, progress: bool = False,
           rounds: Sequence[int] | None = None) -> list[Uploaded]:  # fmt: skip
    """Upload ``paths`` into the store at ``store``: one ``hf_xet.upload_files`` call per round.

    hf_xet deduplicates a file against what earlier calls stored, not
    against the other files of the same call, so files that are likely to
    share chunks (versions of one file) go into different rounds:
    ``rounds[i]`` is the round of ``paths[i]`` (default: all in round 0).
    Results are in input order.  ``progress`` shows a progress bar of bytes
    and files on stderr.  Raises ``XetfsError`` when hf_xet is missing or
    an upload fails.
    """
    try:
        import hf_xet
    except ImportError:
        raise XetfsError("pack needs hf_xet, which is not installed: install xetfs[pack]") from None
    from tqdm import tqdm

    endpoint = f"local://{store.resolve()}"
    order = list(rounds) if rounds is not None else [0] * len(paths)
    results: dict[int, Uploaded] = {}
    with tqdm(total=0, unit="B", unit_scale=True, unit_divisor=1024, disable=not progress, desc="pack") as bar:
        updater = _progress_updater(bar, len(paths)) if progress else None
        for r in sorted(set(order)):
            picked = [i for i, k in enumerate(order) if k == r]
            batch = [str(paths[i]) for i in picked]
            try:
                infos = _upload_round(hf_xet, batch, endpoint, updater)
            except Exception as exc:  # hf_xet raises plain RuntimeError/OSError subclasses
                if not _drop_damaged_index(store, exc):
                    raise XetfsError(f"hf_xet could not write {store}: {exc}") from exc
                try:
                    infos = _upload_round(hf_xet, batch, endpoint, updater)
                except Exception as again:
                    raise XetfsError(f"hf_xet could not write {store}: {again}") from again
            if len(infos) != len(batch):
                raise XetfsError(f"hf_xet reported {plural(len(infos), 'result')} for {plural(len(batch), 'file')}")
            for i, info in zip(picked, infos, strict=True):
                results[i] = _uploaded(info, paths[i])
    return [results[i] for i in range(len(paths))]


def _upload_round(hf_xet: Any, batch: list[str], endpoint: str, updater: Any) -> list[Any]:
    with warnings.catch_warnings():
        # upload_files is deprecated in favour of XetSession, and still writes the same store.
        warnings.simplefilter("ignore", DeprecationWarning)
        return list(hf_xet.upload_files(batch, endpoint, None, None, updater, None))


def _drop_damaged_index(store: Path, exc: Exception) -> bool:
    """Remove hf_xet's redb index when ``exc`` says it cannot be opened; True if it was removed.

    A pack killed while hf_xet writes the index can leave it unreadable, and
    every later upload then fails.  The index is hf_xet's own lookup table,
    not part of the store xetfs reads (xorbs and shards): hf_xet writes a new
    one and still deduplicates against the shards, so removing it loses
    nothing.  The warning names the file.
    """
    index = store / "xet" / "xorbs" / REDB_INDEX
    if "redb" not in str(exc) or not index.is_file():
        return False
    print_warning(f"{index}: hf_xet cannot open its index ({exc}); removed it, hf_xet writes a new one")
    index.unlink()
    return True


def _progress_updater(bar: Any, files: int) -> Callable[[Any, Any], None]:
    """An hf_xet progress callback (``(total_update, item_updates)``, verified with hf_xet 1.8) feeding ``bar``.

    The bar counts bytes; its postfix counts the files finished out of ``files``.
    """
    finished: set[str] = set()
    bar.set_postfix_str(f"0/{files} files", refresh=False)

    def update(total_update: Any, item_updates: Any) -> None:
        if total_update.total_bytes_increment:
            bar.total += total_update.total_bytes_increment
            bar.refresh()
        before = len(finished)
        for item in item_updates or ():
            if item.total_bytes and item.bytes_completed >= item.total_bytes:
                finished.add(item.item_name)
        if len(finished) != before:
            bar.set_postfix_str(f"{len(finished)}/{files} files", refresh=False)
        bar.update(total_update.total_bytes_completion_increment)

    return update


def _uploaded(info: Any, path: Path) -> Uploaded:
    if not isinstance(info.hash, str) or not hashes.is_hex(info.hash):
        raise XetfsError(f"hf_xet returned a bad hash for {path}: {info.hash!r}")
    sha256 = info.sha256 if isinstance(info.sha256, str) and hashes.is_hex(info.sha256) else None
    if info.file_size == 0 and sha256 == "0" * 64:
        sha256 = EMPTY_SHA256  # hf_xet reports zeros for an empty file
    return Uploaded(hashes.from_hex(info.hash), int(info.file_size), sha256)


# -- the manifest --------------------------------------------------------------------


def merge(
    new: Sequence[Entry], old: Manifest | None, *, source: str, replace: bool = False
) -> tuple[Manifest, list[str], tuple[int, int]]:
    """``new`` entries over an ``old`` manifest: same path replaced, conflicting old entries dropped; with
    ``replace``, nothing of ``old`` kept.

    Returns the merged manifest, warnings about what was dropped from ``old``, and how many of its files
    now name other bytes and how many are no longer named (``replace``).
    """
    if old is None:
        return combine(new, source=source), [], (0, 0)
    new_files = {e.path: e.xet_hash for e in new if isinstance(e, ManifestFile)}
    changed = sum(f.path in new_files and new_files[f.path] != f.xet_hash for f in old.files)
    kept: list[Entry] = [] if replace else [f for f in old.files if f.path not in new_files]
    merged = combine([*new, *kept, *([] if replace else old.directories)], source=source)
    messages = [] if replace else [f"not kept from the existing manifest: {msg}" for msg in old.warnings]
    messages += [f"merging: {msg}" for msg in merged.warnings]
    removed = sum(f.path not in new_files for f in old.files) if replace else 0
    return Manifest(merged.files, merged.directories, ()), messages, (changed, removed)


def write_manifest(path: Path, manifest: Manifest) -> None:
    """Write ``manifest`` to ``path`` atomically (a temporary file, then rename)."""
    replace_file(path, dump_manifest(manifest.files, manifest.directories))


# -- the command -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PackResult:
    files: int  # files uploaded by this pack
    bytes: int
    store: Path
    manifest: Path
    manifest_files: int  # files named by the manifest after the merge
    skipped: int = 0  # paths of the sources left out (each had a warning)
    store_bytes: int = 0  # what the store grew by
    changed: int = 0  # paths named before that now name other bytes
    removed: int = 0  # paths named before and no more (``--replace``)
    unchanged: int = 0  # files the manifest named with the size and time they have: not read again

    def line(self) -> str:
        """The summary line ``pack`` prints."""
        news = [f"{self.unchanged} unchanged, not read again"] if self.unchanged else []
        news += [f"{self.changed} with new bytes"] if self.changed else []
        news += [f"{self.removed} removed"] if self.removed else []
        skipped = f"; skipped {plural(self.skipped, 'path')} (see the warnings)" if self.skipped else ""
        return (
            f"packed {plural(self.files, 'file')} ({plural(self.bytes, 'byte')}) into {self.store}: "
            f"{plural(self.store_bytes, 'store byte')} added{read_over_added(self.bytes, self.store_bytes)}; "
            f"{self.manifest} names {plural(self.manifest_files, 'file')}"
            f"{' (' + ', '.join(news) + ')' if news else ''}{skipped}"
        )


def read_over_added(read: int, added: int) -> str:
    """`` (read / added: Nx, ...)``: the bytes a pack read over the bytes the store grew by (deduplication and
    compression), for its summary line; nothing if the store did not grow (or shrank: files deleted meanwhile)."""
    if read <= 0 or added <= 0:
        return ""
    ratio = round(read / added, 2)
    if ratio < 0.5:  # (a few small files: the new shard, and each xorb's footer, outweigh them)
        return f" (read / added: {ratio:.2f}x: the shard and xorb footers outweigh so few bytes)"
    if ratio <= 1.0:  # (bytes neither dedup nor compression shrank grow a store a little more: chunk headers)
        return f" (read / added: {ratio:.2f}x: no dedup or compression gain)"
    return f" (read / added: {ratio:.2f}x, dedup and compression)"


def store_bytes(store_dir: Path) -> int:
    """Bytes of the store's xorbs and shards (what a mount reads; hf_xet's own index and caches not counted)."""
    total = 0
    for root, _, files in os.walk(store_dir):
        if os.path.basename(root) not in ("xorbs", "shards"):
            continue
        for name in files:
            if not HF_XET_OWN.fullmatch(name):
                with contextlib.suppress(FileNotFoundError):
                    total += os.lstat(os.path.join(root, name)).st_size
    return total


@contextlib.contextmanager
def locked(store_dir: Path, warn: Warn) -> Iterator[None]:
    """Hold the store's pack lock (``flock`` on ``STORE/.xetfs-pack.lock``) for the block.

    A pack holds it from reading the manifest or catalogue to replacing it,
    uploads included (hf_xet itself cannot write one store from two
    processes at once), so two packs into one store run one after the other
    and keep both their names.  ``warn`` is told when another process holds
    it.  The kernel drops the lock when a process dies, so a killed pack
    never leaves it held.  Not re-entrant within one process.
    """
    fd = os.open(store_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            warn(f"another pack is writing {store_dir}: waiting for it to finish")
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def refuse_skips(skipped: int, what: str = "path") -> None:
    """For ``--strict``: raise ``XetfsError`` when anything was skipped (``skipped`` of ``what``)."""
    if skipped:
        raise XetfsError(f"--strict: {plural(skipped, what)} skipped (see the warnings); nothing recorded")


def pack(
    sources: Sequence[str | os.PathLike[str]],
    store: str | os.PathLike[str],
    *,
    progress: bool = False,
    warn: Warn = print_warning,
    strict: bool = False,
    follow_symlinks: bool = False,
    replace: bool = False,
    reread: bool = False,
) -> PackResult:
    """Upload ``sources`` into ``store`` and merge their names into its manifest (with ``replace``, the
    manifest names only what ``sources`` hold).

    A file an earlier pack read and that has not changed since
    (``packstate``), whose bytes the store holds, is taken as it is, not read
    again (``unchanged``), unless ``reread``.

    With ``strict``, a source path that would be skipped (``Plan.skipped``)
    stops the pack before anything is uploaded.  Raises ``XetfsError`` or
    ``OSError`` with a message fit for one line.
    """
    store_dir = Path(store).absolute()
    if store_dir.exists() and not store_dir.is_dir():
        raise XetfsError(f"store {store_dir}: exists and is not a directory")
    plan = plan_pack([Path(s) for s in sources], store_dir, warn, follow_symlinks=follow_symlinks)
    if plan.all_links:
        warn(links_hint(plan.all_links))
    if strict:
        refuse_skips(len(plan.skipped))
    store_dir.mkdir(parents=True, exist_ok=True)
    # hf_xet cannot write one store from two processes at once: packs take turns.
    with locked(store_dir, warn):
        manifest_path = store_dir / MANIFEST_NAME
        old = load_manifest(manifest_path) if manifest_path.exists() else None  # a broken one stops us here
        before = store_bytes(store_dir)
        state = load_state(store_dir)
        kept, todo = ([], plan.files) if reread else unchanged(plan.files, state, store_dir, warn)
        stamps = [stamp_of(f.local) for f in todo]  # (the file hf_xet reads next; the plan's stamp may be old)
        shards = shard_names(store_dir)
        results = upload([f.local for f in todo], store_dir, progress=progress) if todo else []
        new: list[Entry] = []
        for f, stamp, r in zip(todo, stamps, results, strict=True):
            new.append(ManifestFile(f.path, r.xet_hash, r.size, r.sha256, f.mtime_ns))
            remember(state, f.local, stamp, hashes.to_hex(r.xet_hash), r.sha256)
        new += [*kept, *plan.directories]
        done = [("/".join(f.path), r.xet_hash) for f, r in zip(todo, results, strict=True)]
        warn_of_lost_xorbs(store_dir, done, shards, warn)
        merged, messages, (changed, removed) = merge(new, old, source=MANIFEST_NAME, replace=replace)
        for message in messages:
            warn(message)
        write_manifest(manifest_path, merged)
        forget_gone(state, [Path(s) for s in sources], (f.local for f in plan.files))
        save_state(store_dir, state)
        publish(store_dir)  # the listing an HTTP server needs to serve the store
        grown = store_bytes(store_dir) - before
    return PackResult(len(results), sum(r.size for r in results), store_dir, manifest_path, len(merged.files),
                      len(plan.skipped), grown, changed, removed, len(kept))  # fmt: skip


def unchanged(
    files: Sequence[Source], state: Mapping[str, Known], store_dir: Path, warn: Warn
) -> tuple[list[ManifestFile], list[Source]]:
    """The manifest entries of the files an earlier pack read that have not changed since (``Known.still``),
    whose bytes the store lists at their size (its shards are read to know), and the files to upload: the rest."""
    same = [(f, k) for f in files if (k := state.get(str(f.local))) is not None and k.sha256 and k.still(f.stamp)]
    there = held(store_dir, [hashes.from_hex(k.xet_hash) for _, k in same], warn)
    kept = {
        f.path: ManifestFile(f.path, hashes.from_hex(k.xet_hash), f.size, k.sha256, f.mtime_ns)
        for f, k in same
        if there.get(hashes.from_hex(k.xet_hash)) == f.size
    }
    return list(kept.values()), [f for f in files if f.path not in kept]


def held(store_dir: Path, file_hashes: Sequence[bytes], warn: Warn) -> dict[bytes, int]:
    """Which of ``file_hashes`` the store holds, with their sizes: its shards list them, and it has every xorb
    their terms name (read only if there are any to ask about).  None, with a warning, if the shards cannot
    be read: then a pack reads every file again."""
    if not file_hashes:
        return {}
    found = _look_up(store_dir, file_hashes, warn)
    return {h: size for h, (size, lost) in found.items() if lost is None}


def shard_names(store_dir: Path) -> frozenset[str]:
    """The names of the store's shards now; none where there is no store yet."""
    from xetfs.storage.store import Store

    try:
        store = Store.open(store_dir)
    except XetfsError:
        return frozenset()
    try:
        return frozenset(s.name for s in store.shard_files())
    finally:
        store.close()


def warn_of_lost_xorbs(store_dir: Path, files: Sequence[tuple[str, bytes]], shards_before: frozenset[str],
                       warn: Warn) -> None:  # fmt: skip
    """Warn of each file just packed (``(name, xet hash)``) whose bytes a xorb the store lacks should hold:
    hf_xet does not write a xorb again while a shard lists it, so the file does not read (``verify`` tells).
    The shards the pack wrote (those not in ``shards_before``) are read first: they list what it uploaded,
    and the whole store's index is read only for a file they do not list."""
    if not files:
        return
    found = _look_up(store_dir, [h for _, h in files], warn, shards_before)
    for name, h in files:
        lost = found.get(h, (0, None))[1]
        if lost is not None:
            warn(f"{name}: the store lacks xorb {hashes.to_hex(lost)}, which holds its bytes, and a pack does not "
                 "write a xorb again while a shard lists it: the file does not read "
                 f"(xetfs verify {store_dir})")  # fmt: skip


def _look_up(
    store_dir: Path, file_hashes: Sequence[bytes], warn: Warn, passed_over: frozenset[str] | None = None
) -> dict[bytes, tuple[int, bytes | None]]:
    """By file hash, for those the store's shards list: the size, and the first xorb of its terms the store
    lacks (None if it has them all).  With ``passed_over``, the other shards are asked first, and every shard
    only for the files they do not list.  Empty, with a warning, if the shards cannot be read."""
    from xetfs.storage.index import Index
    from xetfs.storage.indexer import load_index, read_shard
    from xetfs.storage.store import Store

    try:
        store = Store.open(store_dir)
    except XetfsError as exc:
        warn(f"every file is read again: the store's shards cannot tell what it holds: {exc}")
        return {}
    has_xorb = functools.cache(store.has_xorb)  # (a xorb holds the chunks of many files: looked up once)

    def look(index: Index, wanted: Sequence[bytes]) -> dict[bytes, tuple[int, bytes | None]]:
        found = {}
        for h in wanted:
            if (entry := index.get(h)) is not None:
                found[h] = (entry.size, next((x for x, _, _, _ in index.terms_of(entry) if not has_xorb(x)), None))
        return found

    try:
        out = {}
        if passed_over is not None:
            written = Index()
            for shard_file in store.shard_files():
                if shard_file.name not in passed_over:
                    with contextlib.suppress(XetfsError):  # (a bad one: the whole index below says so)
                        written.add_shard(read_shard(store, shard_file))
            out = look(written, file_hashes)
        rest = [h for h in file_hashes if h not in out]
        return out | (look(load_index(store).index, rest) if rest else {})
    except XetfsError as exc:
        warn(f"every file is read again: the store's shards cannot tell what it holds: {exc}")
        return {}
    finally:
        store.close()
