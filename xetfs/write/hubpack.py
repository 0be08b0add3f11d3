"""``xetfs pack --hub-cache`` and ``xetfs pack SRC... --repo``: Hub repos into a store's catalogue.

Owns the import: which files to upload (blobs the catalogue does not know
yet), the checks on each uploaded file (a blob's content must match its
name; a file must not change while it is read), and the catalogue update
(merged under the store's lock, replaced atomically, after every upload has
finished, so nothing half-imported is ever named).

Commit ids for ``pack SRC --repo`` without ``--commit`` (``derive_commit``):
the sha1 of ``b"xetfs-tree 1\\n"`` followed by one line ``<blob name>
<path>\\n`` per file, in path order (UTF-8).  The same files under the same
names always give the same id; any change of a name or a byte gives another.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from xetfs.base import hashes
from xetfs.base.errors import XetfsError
from xetfs.base.messages import plural, print_warning
from xetfs.base.settings import PACK_ROUND_MIN_SIZE
from xetfs.storage.catalogue import (
    CATALOGUE_NAME,
    Catalogue,
    Content,
    Repo,
    Revision,
    is_commit,
    load_catalogue,
    ref_problem,
    repo_id_problem,
    update_catalogue,
)
from xetfs.storage.remote import publish
from xetfs.write.hubcache import CachedRepo, Digests, digest_file, is_lfs_path, scan_cache
from xetfs.write.pack import (
    Source,
    held,
    links_hint,
    locked,
    plan_pack,
    read_over_added,
    refuse_skips,
    shard_names,
    store_bytes,
    upload,
    warn_of_lost_xorbs,
)
from xetfs.write.packstate import Known, forget_gone, load_state, remember, save_state, stamp_of

Warn = Callable[[str], None]


class Skips:
    """The warnings of one import: printed as they come, counted by reason for the summary line."""

    REASONS = (  # what a warning says, and what the summary calls one such item and several
        ("partial download", "partial download", "partial downloads"),
        ("broken symlink", "broken symlink", "broken symlinks"),
        ("no snapshot", "ref without a snapshot", "refs without a snapshot"),
        ("changed while being read", "file changed while read", "files changed while read"),
        ("does not match its name", "blob whose content does not match its name",
         "blobs whose content does not match their name"),
        ("none of its files was imported", "revision with no file imported", "revisions with no file imported"),
        ("no revision has a file", "repo with no revision imported", "repos with no revision imported"),
    )  # fmt: skip
    OTHER = ("other problem", "other problems")

    def __init__(self, warn: Warn) -> None:
        self._warn = warn
        self.counts: dict[tuple[str, str], int] = {}  # by (singular, plural) label

    def __call__(self, message: str) -> None:
        self._warn(message)
        reason = next(((one, many) for key, one, many in self.REASONS if key in message), self.OTHER)
        self.counts[reason] = self.counts.get(reason, 0) + 1

    def summary(self) -> str:
        if not self.counts:
            return "nothing skipped"
        parts = ", ".join(plural(n, one, many) for (one, many), n in sorted(self.counts.items(), key=lambda i: i[0][1]))
        return f"skipped {sum(self.counts.values())} ({parts})"

    @property
    def total(self) -> int:
        return sum(self.counts.values())


# -- uploading with checks -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Job:
    """One file to upload: ``blob`` is the name it must match, or None to name it by the rule (``lfs``)."""

    local: Path
    blob: str | None
    lfs: bool = False
    family: str = ""  # files of one family (versions of one path) are uploaded in separate rounds


@dataclass(frozen=True, slots=True)
class Stored:
    blob: str  # its blob name
    content: Content


def _stamp(path: Path) -> tuple[int, int, int]:
    st = os.stat(path)
    return (st.st_size, st.st_mtime_ns, st.st_ino)


def upload_checked(jobs: Sequence[Job], store_dir: Path, *, progress: bool, warn: Warn) -> list[Stored | None]:
    """Upload ``jobs`` with hf_xet; per job its blob name and content, or None (with a warning) when it failed a check.

    A file whose size, mtime or inode differ before and after, or whose two
    reads (ours for the git sha1, hf_xet's) disagree, "changed while being
    read".  Raises ``XetfsError`` when hf_xet fails as a whole.
    """
    ready: list[tuple[int, tuple[int, int, int], Digests | None]] = []  # (index in jobs, stamp, our digests)
    for i, job in enumerate(jobs):
        try:
            stamp = _stamp(job.local)
            needs_sha1 = (job.blob is not None and len(job.blob) == 40) or (job.blob is None and not job.lfs)
            digests = digest_file(job.local) if needs_sha1 else None
        except OSError as exc:
            warn(f"skipping {job.local}: unreadable: {exc}")
            continue
        if digests is not None and job.blob is not None and digests.git_sha1 != job.blob:
            warn(_mismatch(job, digests.git_sha1))  # before it is uploaded: nothing of it goes into the store
            continue
        ready.append((i, stamp, digests))
    rounds = _rounds([(jobs[i].family, stamp[0]) for i, stamp, _ in ready])
    paths = [jobs[i].local for i, _, _ in ready]
    uploaded = upload(paths, store_dir, progress=progress, rounds=rounds) if ready else []
    out: list[Stored | None] = [None] * len(jobs)
    for (i, stamp, digests), up in zip(ready, uploaded, strict=True):
        content = Content(hashes.to_hex(up.xet_hash), up.size, stamp[1])
        out[i] = _check(jobs[i], stamp, digests, up.sha256, content, warn)
    return out


def _rounds(files: Sequence[tuple[str, int]]) -> list[int]:
    """The upload round of each ``(family, size)``: the k-th large file of a family goes into round k.

    hf_xet deduplicates only against earlier uploads, so versions of one
    file must not share a round; everything else goes in round 0.
    """
    seen: dict[str, int] = {}
    out = []
    for family, size in files:
        if not family or size < PACK_ROUND_MIN_SIZE:
            out.append(0)
            continue
        out.append(seen.get(family, 0))
        seen[family] = out[-1] + 1
    return out


def _check(job: Job, stamp: tuple[int, int, int], digests: Digests | None, sha256: str | None,
           content: Content, warn: Warn) -> Stored | None:  # fmt: skip
    try:
        after = _stamp(job.local)
    except OSError:
        after = None
    if after != stamp or content.size != stamp[0] or (digests is not None and digests.sha256 != sha256):
        warn(f"skipping {job.local}: changed while being read")
        return None
    if job.blob is None:
        name = sha256 if job.lfs else (digests.git_sha1 if digests else None)
    else:
        name = job.blob
        actual = sha256 if len(name) == 64 else (digests.git_sha1 if digests else None)
        if actual != name:
            warn(_mismatch(job, actual) + "; its bytes are in the store, named by no file")
            return None
    if name is None:
        warn(f"skipping {job.local}: hf_xet reported no sha256")
        return None
    return Stored(name, content)


def _mismatch(job: Job, actual: str | None) -> str:
    return f"skipping {job.local}: its content does not match its name (sha {actual})"


# -- results ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HubPackResult:
    repos: int
    revisions: int
    files: int  # snapshot files recorded
    uploaded: int  # files read and uploaded by this run (a file deduplicated whole counts too)
    cache_bytes: int  # bytes of the files uploaded by this run (from the Hub cache, or the directories given)
    store_bytes: int  # bytes the store grew by
    skipped: str
    skipped_count: int = 0  # the items ``skipped`` sums up
    moved: tuple[str, ...] = ()  # refs the store had that now name another commit (``catalogue.moved_refs``)
    unchanged: int = 0  # files of a directory the revision had with the same size and time: not read again

    def line(self, store: Path) -> str:
        moved = f"; {plural(len(self.moved), 'ref')} moved: {', '.join(self.moved)}" if self.moved else ""
        unchanged = f"; {self.unchanged} unchanged, not read again" if self.unchanged else ""
        return (
            f"imported {plural(self.repos, 'repo')}, {plural(self.revisions, 'revision')}, "
            f"{plural(self.files, 'file')} into {store}: {plural(self.uploaded, 'file')} read "
            f"({plural(self.cache_bytes, 'byte')}{unchanged}) -> {plural(self.store_bytes, 'store byte')} added"
            f"{read_over_added(self.cache_bytes, self.store_bytes)}; {self.skipped}{moved}"
        )


def _result(new: Catalogue, stored: Sequence[Stored | None], grown: int, skips: Skips) -> HubPackResult:
    done = [s for s in stored if s is not None]
    return HubPackResult(
        repos=len(new.repos),
        revisions=sum(len(r.revisions) for r in new.repos),
        files=sum(len(rev.files) for r in new.repos for rev in r.revisions.values()),
        uploaded=len(done),
        cache_bytes=sum(s.content.size for s in done),
        store_bytes=grown,
        skipped=skips.summary(),
        skipped_count=skips.total,
    )


def _existing(store_dir: Path) -> Catalogue:
    path = store_dir / CATALOGUE_NAME
    return load_catalogue(path) if path.exists() else Catalogue()  # a broken one stops the pack here


def _store_dir(store: str | os.PathLike[str]) -> Path:
    store_dir = Path(store).absolute()
    if store_dir.exists() and not store_dir.is_dir():
        raise XetfsError(f"store {store_dir}: exists and is not a directory")
    store_dir.mkdir(parents=True, exist_ok=True)
    return store_dir


# -- a huggingface_hub cache -----------------------------------------------------------------


def pack_hub_cache(cache_dir: Path, store: str | os.PathLike[str], *, repos: Sequence[str] = (),
                   progress: bool = False, warn: Warn = print_warning,
                   strict: bool = False) -> HubPackResult:  # fmt: skip
    """Import the cache at ``cache_dir`` (its repos in ``repos``, or all) into ``store``'s catalogue.

    Blobs the catalogue already names are not uploaded again.  Raises
    ``XetfsError`` or ``OSError`` for a missing cache, a broken catalogue or
    a failed upload; problems with single items are warnings (counted in
    ``skipped_count``), and with ``strict`` an error: before the upload
    when the scan skipped something, else before the catalogue is written.
    """
    store_dir = _store_dir(store)
    if not cache_dir.is_dir():
        raise XetfsError(f"{cache_dir}: no huggingface_hub cache there (not a directory)")
    skips = Skips(warn)
    scanned = scan_cache(cache_dir, repos, skips)
    if strict:
        refuse_skips(skips.total, "item")
    with locked(store_dir, warn):
        old = _existing(store_dir)
        jobs = _plan_jobs(scanned, old)
        before = store_bytes(store_dir)
        stored = upload_checked(jobs, store_dir, progress=progress, warn=skips)
        by_local = {job.local: s for job, s in zip(jobs, stored, strict=True) if s is not None}
        new = _catalogue(scanned, old, by_local, skips)
        if strict:
            refuse_skips(skips.total, "item")
        moved = update_catalogue(store_dir, new)
        publish(store_dir)  # the listing an HTTP server needs to serve the store
        grown = store_bytes(store_dir) - before
    return replace(_result(new, stored, grown, skips), moved=tuple(moved))


def _previous(old: Catalogue, repo: CachedRepo, commit: str) -> Revision | None:
    known = old.repo(repo.type, repo.id)
    return None if known is None else known.revisions.get(commit)


def _plan_jobs(scanned: Sequence[CachedRepo], old: Catalogue) -> list[Job]:
    """What to upload: blobs the catalogue does not name, and files of revisions it does not hold yet."""
    known = old.blob_index()
    jobs: list[Job] = []
    queued: set[str] = set()
    for repo in scanned:
        family = {f.blob: _basename(f.path) for rev in repo.revisions.values() for f in rev.files if f.blob}
        for name in _blob_order(repo):
            if name not in known and name not in queued:
                queued.add(name)
                jobs.append(Job(repo.blobs[name], name, family=family.get(name, "")))
        for commit in _revision_order(repo):
            rev = repo.revisions[commit]
            previous = _previous(old, repo, commit)  # a commit never changes: what it holds is done
            for f in rev.files:
                if f.blob is None and (previous is None or f.path not in previous.files):
                    jobs.append(Job(f.local, None, is_lfs_path(f.path, _size(f.local)), _basename(f.path)))
            if rev.tree is not None and (previous is None or previous.tree is None):
                jobs.append(Job(rev.tree, None, lfs=True))
    return jobs


def _blob_order(repo: CachedRepo) -> list[str]:
    """The repo's blobs in the order a reader meets them: by path in each revision, those of revisions a ref
    names first (``main`` first), then blobs no revision names.

    hf_xet packs files in the order it is given them, so the small files of a snapshot directory lie side by
    side in their xorbs, and reading them by name reads ahead (``read.readahead``) instead of making a store
    read, a request on a remote store, for each file.
    """
    order = _revision_order(repo)
    named = dict.fromkeys(f.blob for c in order for f in repo.revisions[c].files if f.blob is not None)
    return [*named, *(blob for blob in repo.blobs if blob not in named)]


def _revision_order(repo: CachedRepo) -> list[str]:
    """The repo's commits, those a ref names first (``main`` first); ``scan_cache`` keeps only refs to commits
    it has a snapshot of."""
    refs = sorted(repo.refs.items(), key=lambda ref: (ref[0] != "main", ref[0]))
    return list(dict.fromkeys([commit for _, commit in refs] + list(repo.revisions)))


def _catalogue(scanned: Sequence[CachedRepo], old: Catalogue, by_local: dict[Path, Stored], warn: Warn) -> Catalogue:
    """The catalogue of what this import holds: every file whose bytes are in the store (uploaded or known).

    A revision none of whose files got there is left out, and a repo left
    with no revision; each with a warning (its files' own warnings said why).
    """
    contents = old.blob_index()
    contents.update({s.blob: s.content for s in by_local.values()})
    repos = []
    for repo in scanned:
        blobs = {name: contents[name] for name in repo.blobs if name in contents}
        revisions: dict[str, Revision] = {}
        for commit, rev in repo.revisions.items():
            previous = _previous(old, repo, commit) or Revision()
            files: dict[str, str] = {}
            for f in rev.files:
                got = by_local.get(f.local)
                blob = f.blob or (got.blob if got else previous.files.get(f.path))
                if blob is not None and blob in contents:
                    files[f.path] = blob
                    blobs[blob] = contents[blob]
            got_tree = by_local.get(rev.tree) if rev.tree is not None else None
            tree = got_tree.content if got_tree else (previous.tree if rev.tree is not None else None)
            no_exist = tuple(sorted(set(rev.no_exist) - set(files)))
            if files or no_exist:
                revisions[commit] = Revision(files, no_exist, tree)
            elif rev.files:
                warn(f"{repo.type} {repo.id}: skipping revision {commit}: none of its files was imported")
        refs = {ref: commit for ref, commit in repo.refs.items() if commit in revisions}
        if revisions:
            repos.append(Repo(repo.type, repo.id, refs, blobs, revisions))
        elif repo.revisions:
            warn(f"{repo.type} {repo.id}: not imported: no revision has a file that was")
    return Catalogue(tuple(sorted(repos, key=lambda r: r.key)))


def _basename(path: str) -> str:
    return path.rsplit("/", 1)[-1]


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


# -- a directory as one revision -----------------------------------------------------------


def derive_commit(files: dict[str, str]) -> str:
    """The commit id of a tree given as ``{path: blob name}`` (see the module docstring)."""
    h = hashlib.sha1(b"xetfs-tree 1\n")
    for path in sorted(files):
        h.update(f"{files[path]} {path}\n".encode())
    return h.hexdigest()


def pack_revision(sources: Sequence[str | os.PathLike[str]], store: str | os.PathLike[str], *, repo_id: str,
                  repo_type: str = "model", revision: str = "main", commit: str | None = None,
                  progress: bool = False, warn: Warn = print_warning, strict: bool = False,
                  follow_symlinks: bool = False, reread: bool = False) -> tuple[str, HubPackResult]:  # fmt: skip
    """Record the files of ``sources`` (named as plain ``pack`` names them) as one revision of a repo.

    Returns the commit id and the result.  Raises ``XetfsError`` for a bad
    repo id, ref or commit, when a file fails its checks (a revision is
    recorded whole or not at all), and with ``strict`` when a source path
    would be skipped.  ``follow_symlinks`` as for ``pack.plan_pack``.  A
    file an earlier pack read and gave a blob name, that has not changed
    since (``packstate``), is not read again (unless ``reread``), as in a
    plain ``pack``.
    """
    _check_names(repo_id, revision, commit)
    store_dir = _store_dir(store)
    skips = Skips(warn)
    plan = plan_pack([Path(s) for s in sources], store_dir, skips, follow_symlinks=follow_symlinks)
    if plan.all_links:
        warn(links_hint(plan.all_links))
    if strict:
        refuse_skips(len(plan.skipped))
    paths = ["/".join(f.path) for f in plan.files]
    with locked(store_dir, warn):
        _existing(store_dir)  # a broken catalogue stops the pack before anything is uploaded
        state = load_state(store_dir)
        known = {} if reread else _unchanged(plan.files, paths, state, store_dir, warn)
        todo = [i for i, p in enumerate(paths) if p not in known]
        jobs = [Job(plan.files[i].local, None, is_lfs_path(paths[i], plan.files[i].size)) for i in todo]
        stamps = [stamp_of(plan.files[i].local) for i in todo]  # (the file read next; the plan's may be old)
        shards = shard_names(store_dir)
        before = store_bytes(store_dir)
        uploaded = upload_checked(jobs, store_dir, progress=progress, warn=skips) if jobs else []
        stored: list[Stored | None] = [known.get(p) for p in paths]
        for i, s in zip(todo, uploaded, strict=True):
            stored[i] = s
        failed = [str(j.local) for j, s in zip(jobs, uploaded, strict=True) if s is None]
        if failed:
            raise XetfsError(
                f"revision not recorded: {plural(len(failed), 'file')} failed their checks: {', '.join(failed)}"
            )
        for i, stamp, s in zip(todo, stamps, uploaded, strict=True):
            if s is not None:
                sha256 = s.blob if len(s.blob) == 64 else None  # (a blob named by its sha256; else a git sha1)
                remember(state, plan.files[i].local, stamp, s.content.xet_hash, sha256, s.blob)
        done = [(paths[i], hashes.from_hex(s.content.xet_hash)) for i, s in zip(todo, uploaded, strict=True) if s]
        warn_of_lost_xorbs(store_dir, done, shards, warn)
        files = {p: s.blob for p, s in zip(paths, stored, strict=True) if s is not None}
        blobs = {s.blob: s.content for s in stored if s is not None}
        commit_id = commit.lower() if commit else derive_commit(files)
        new = Catalogue((Repo(repo_type, repo_id, {revision: commit_id}, blobs, {commit_id: Revision(files)}),))
        moved = update_catalogue(store_dir, new)
        forget_gone(state, [Path(s) for s in sources], (f.local for f in plan.files))
        save_state(store_dir, state)
        publish(store_dir)  # the listing an HTTP server needs to serve the store
        grown = store_bytes(store_dir) - before
    result = _result(new, uploaded, grown, skips)
    return commit_id, replace(result, skipped_count=len(plan.skipped), moved=tuple(moved), unchanged=len(known))


def _check_names(repo_id: str, revision: str, commit: str | None) -> None:
    """Raise ``XetfsError`` for a bad ``--repo``, ``--revision`` or ``--commit``."""
    problem = repo_id_problem(repo_id)
    if problem is not None:
        raise XetfsError(f"--repo {repo_id!r}: {problem}")
    if ref_problem(revision) is not None or is_commit(revision):
        raise XetfsError(f"--revision {revision!r}: not a usable branch or tag name")
    if commit is not None and not is_commit(commit.lower()):
        raise XetfsError(f"--commit {commit!r}: not a 40-hex commit id")


def _unchanged(files: Sequence[Source], paths: Sequence[str], state: Mapping[str, Known], store_dir: Path,
               warn: Warn) -> dict[str, Stored]:  # fmt: skip
    """By path, the blobs of the files an earlier pack read and named, that have not changed since and whose
    bytes the store lists at their size: what a pack need not read again (as ``pack.unchanged``)."""
    same = {}
    for f, path in zip(files, paths, strict=True):
        k = state.get(str(f.local))
        kind = 64 if is_lfs_path(path, f.size) else 40  # (a blob name's kind follows from the path: as a read names it)
        if k is not None and k.blob is not None and len(k.blob) == kind and k.still(f.stamp):
            same[path] = Stored(k.blob, Content(k.xet_hash, f.size, f.mtime_ns))
    there = held(store_dir, [hashes.from_hex(s.content.xet_hash) for s in same.values()], warn)
    return {p: s for p, s in same.items() if there.get(hashes.from_hex(s.content.xet_hash)) == s.content.size}
