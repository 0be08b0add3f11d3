"""Reading a huggingface_hub cache directory, and how huggingface_hub names blobs.

Owns the cache layout as huggingface_hub writes it (``<type>s--<org>--<name>/``
with ``refs/``, ``snapshots/<commit>/``, ``blobs/``, ``.no_exist/<commit>/``
and ``trees/<commit>.json``) and the blob-naming rule.  Reads only: nothing
here writes or uploads.

A repo's blob is a regular file, or (huggingface_hub 1.32 and later, for files
it downloaded through Xet) a symlink into the cache's shared store of Xet
files, ``<cache>/blobs/<first 2 hex>/<xet hash>``, where the bytes are.

Bad input is reported through ``warn`` with the item's path and skipped; the
rest of the cache is still described:

* ``blobs/*.incomplete`` (a partial download) is skipped;
* a snapshot symlink whose blob is missing (broken), or that points outside
  the repo's ``blobs/``, is skipped, and so is anything that is neither a
  file nor a symlink;
* a blob that is a symlink anywhere but to a file of the shared store, or
  whose file there is missing, is skipped;
* a ref whose commit has no snapshot, or whose content is not a 40-hex
  commit, is skipped;
* a snapshot entry that is a regular file (a cache copied with symlinks
  followed) is kept, named by ``blob_name_rule``.

Blob names (``blob_name_rule``): huggingface_hub names a blob by the ETag
the Hub sent, which is the sha256 of the content for files stored with LFS
or Xet, and the git blob sha1 (``sha1(b"blob <size>\\0" + content)``) for
the rest.  For a file that has no name yet (``pack SRC --repo``, or a
dereferenced cache), xetfs uses the sha256 when the file is 10 MiB or larger
or its name matches the Hub's default ``.gitattributes`` LFS patterns
(``*.safetensors``, ``*.bin``, ``*.parquet``, ... see ``LFS_PATTERNS``), and
the git blob sha1 otherwise.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from xetfs.storage.catalogue import REPO_TYPES, is_blob_name, is_commit, ref_problem, repo_id_problem
from xetfs.storage.manifest import path_problem

Warn = Callable[[str], None]

LFS_SIZE = 10 * 1024 * 1024
# The Hub's default .gitattributes for new repos: files matching these are LFS (so Xet) files.
LFS_PATTERNS = (
    "*.7z", "*.arrow", "*.bin", "*.bz2", "*.ckpt", "*.ftz", "*.gz", "*.h5", "*.joblib", "*.lfs.*",
    "*.mlmodel", "*.model", "*.msgpack", "*.npy", "*.npz", "*.onnx", "*.ot", "*.parquet", "*.pb",
    "*.pickle", "*.pkl", "*.pt", "*.pth", "*.rar", "*.safetensors", "*.tar.*", "*.tar", "*.tflite",
    "*.tgz", "*.wasm", "*.xz", "*.zip", "*.zst", "*tfevents*", "*.gguf", "*.mp3", "*.ogg", "*.wav",
    "*.png", "*.jpg", "*.jpeg", "*.webp",
)  # fmt: skip
INCOMPLETE_SUFFIX = ".incomplete"
SHARED_BLOBS = "blobs"  # the store of Xet files a cache's repos share (huggingface_hub 1.32+): blobs/<xx>/<hash>
HASH_BLOCK = 1024 * 1024


def default_cache_dir() -> Path:
    """``HF_HUB_CACHE``, else ``HF_HOME/hub``, else ``~/.cache/huggingface/hub`` (as huggingface_hub decides)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "huggingface" / "hub"


def parse_repo_folder(name: str) -> tuple[str, str] | None:
    """``models--org--name`` -> ``("model", "org/name")``; None for anything else."""
    kind, sep, rest = name.partition("--")
    if not sep or kind[:-1] not in REPO_TYPES or not kind.endswith("s"):
        return None
    repo_id = rest.replace("--", "/")
    return None if repo_id_problem(repo_id) else (kind[:-1], repo_id)


def is_lfs_path(path: str, size: int) -> bool:
    """Whether the Hub would keep ``path`` (of ``size`` bytes) in LFS/Xet by default (see the module docstring)."""
    name = path.rsplit("/", 1)[-1]
    return size >= LFS_SIZE or any(fnmatch.fnmatchcase(name, p) or fnmatch.fnmatchcase(path, p) for p in LFS_PATTERNS)


@dataclass(frozen=True, slots=True)
class Digests:
    """What one read of a file gave: its size, sha256 and git blob sha1 (hex)."""

    size: int
    sha256: str
    git_sha1: str


def digest_file(path: Path) -> Digests:
    """sha256 and git blob sha1 of ``path`` in one read.  Raises ``OSError``."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        sha256 = hashlib.sha256()
        sha1 = hashlib.sha1(f"blob {size}\0".encode())
        read = 0
        while block := f.read(HASH_BLOCK):
            sha256.update(block)
            sha1.update(block)
            read += len(block)
    if read != size:
        raise OSError(f"{path}: changed while being read ({size} bytes at open, {read} read)")
    return Digests(size, sha256.hexdigest(), sha1.hexdigest())


# -- the cache's content -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CachedFile:
    """A file of a snapshot: its path there, its blob name (None: to be named by the rule) and where its bytes are."""

    path: str
    blob: str | None
    local: Path


@dataclass
class CachedRevision:
    commit: str
    files: list[CachedFile] = field(default_factory=list)
    no_exist: list[str] = field(default_factory=list)
    tree: Path | None = None  # trees/<commit>.json


@dataclass
class CachedRepo:
    type: str
    id: str
    folder: Path
    refs: dict[str, str] = field(default_factory=dict)
    revisions: dict[str, CachedRevision] = field(default_factory=dict)
    blobs: dict[str, Path] = field(default_factory=dict)  # every complete blob, referenced or not


def scan_cache(cache_dir: Path, repos: Iterable[str] = (), warn: Warn = print) -> list[CachedRepo]:
    """Describe the repos of the cache at ``cache_dir`` (only those whose id is in ``repos``, when given).

    Raises ``OSError`` when ``cache_dir`` cannot be listed; problems inside
    it are warnings (see the module docstring).
    """
    wanted = set(repos)
    found: list[CachedRepo] = []
    with os.scandir(cache_dir) as it:
        entries = sorted(it, key=lambda e: e.name)
    for e in entries:
        parsed = parse_repo_folder(e.name) if e.is_dir(follow_symlinks=False) else None
        if parsed is None:
            continue  # .locks, version.txt, stray files: not repos
        if wanted and parsed[1] not in wanted:
            continue
        found.append(_scan_repo(Path(e.path), *parsed, warn=warn))
    for missing in sorted(wanted - {r.id for r in found}):
        warn(f"{cache_dir}: no repo {missing!r} in the cache")
    return found


def _scan_repo(folder: Path, repo_type: str, repo_id: str, warn: Warn) -> CachedRepo:
    repo = CachedRepo(repo_type, repo_id, folder)
    blobs = folder / "blobs"
    skipped: set[str] = set()
    shared = Path(os.path.abspath(folder.parent / SHARED_BLOBS))
    for path in _files(blobs):
        problem = _blob_problem(path, shared)
        if problem is None:
            repo.blobs[path.name] = path  # (a link to the shared store is read through: its bytes are there)
        else:
            warn(f"skipping {path}: {problem}")
            skipped.add(path.name)
    snapshots = folder / "snapshots"
    for commit_dir in sorted(snapshots.iterdir()) if snapshots.is_dir() else []:
        if not is_commit(commit_dir.name) or not commit_dir.is_dir():
            warn(f"skipping {commit_dir}: not a snapshot directory named by a commit")
            continue
        repo.revisions[commit_dir.name] = _scan_snapshot(commit_dir, blobs, repo.blobs, skipped, warn)
    no_exist = folder / ".no_exist"
    for commit_dir in sorted(no_exist.iterdir()) if no_exist.is_dir() else []:
        rev = repo.revisions.get(commit_dir.name)
        if rev is None and is_commit(commit_dir.name):
            rev = repo.revisions[commit_dir.name] = CachedRevision(commit_dir.name)
        if rev is None:
            warn(f"skipping {commit_dir}: not named by a commit")
            continue
        rev.no_exist = [p for p, _ in _relative_files(commit_dir, warn)]
    for commit, rev in repo.revisions.items():
        tree = folder / "trees" / f"{commit}.json"
        if tree.is_file() and not tree.is_symlink():
            rev.tree = tree
    _scan_refs(repo, warn)
    return repo


def _blob_problem(path: Path, shared: Path) -> str | None:
    """Why ``path``, in a repo's ``blobs/``, is not a blob; None if it is: a regular file, or a symlink to a
    regular file of the cache's shared store ``shared`` (absolute: ``<shared>/<first 2 hex>/<xet hash>``)."""
    if path.name.endswith(INCOMPLETE_SUFFIX):
        return "a partial download (.incomplete)"
    if not is_blob_name(path.name):
        return "not a blob (a file named by a sha256 or git sha1)"
    if not path.is_symlink():
        return None if path.is_file() else "not a blob (a file named by a sha256 or git sha1)"
    link = os.readlink(path)
    target = Path(os.path.abspath(path.parent / link))
    name = target.name
    outside = target.parent.parent != shared
    if outside or len(name) != 64 or not is_blob_name(name) or target.parent.name != name[:2]:
        return f"a symlink, not into the cache's shared store of Xet files ({link})"
    if target.is_symlink() or not target.is_file():
        return f"its file in the cache's shared store is missing ({target})"
    return None


def _scan_snapshot(
    commit_dir: Path, blobs: Path, known: dict[str, Path], skipped: set[str], warn: Warn
) -> CachedRevision:
    """The files of a snapshot: links to the blobs ``known`` (``skipped``: blobs already warned of), or
    regular files."""
    rev = CachedRevision(commit_dir.name)
    home = Path(os.path.abspath(blobs))
    for path, local in _relative_files(commit_dir, warn, follow=True):
        if not local.is_symlink():
            rev.files.append(CachedFile(path, None, local))
            continue
        target = Path(os.path.abspath(local.parent / os.readlink(local)))
        if target.parent != home or not is_blob_name(target.name):
            warn(f"skipping {local}: the symlink points outside the repo's blobs ({os.readlink(local)})")
        elif target.name in skipped:
            warn(f"skipping {local}: its blob {target.name} was skipped (see above)")
        elif target.name not in known:
            warn(f"skipping {local}: broken symlink, blob {target.name} is missing")
        else:
            rev.files.append(CachedFile(path, target.name, known[target.name]))
    return rev


def _scan_refs(repo: CachedRepo, warn: Warn) -> None:
    for ref, path in _relative_files(repo.folder / "refs", warn):
        try:
            commit = path.read_text("ascii").strip()
        except (OSError, UnicodeDecodeError) as exc:
            warn(f"skipping ref {path}: unreadable: {exc}")
            continue
        if ref_problem(ref) is not None or not is_commit(commit):
            warn(f"skipping ref {path}: does not hold a 40-hex commit")
        elif commit not in repo.revisions:
            warn(f"skipping ref {path}: its commit {commit} has no snapshot in the cache")
        else:
            repo.refs[ref] = commit


def _files(directory: Path) -> list[Path]:
    if not directory.is_dir():
        return []
    return sorted(Path(e.path) for e in os.scandir(directory))


def _relative_files(top: Path, warn: Warn, follow: bool = False) -> list[tuple[str, Path]]:
    """``(relative path, path)`` of every file below ``top`` (symlinks too when ``follow``), in name order."""
    out: list[tuple[str, Path]] = []
    if not top.is_dir():
        return out
    stack = [top]
    while stack:
        directory = stack.pop()
        with os.scandir(directory) as it:
            entries = sorted(it, key=lambda e: e.name, reverse=True)
        for e in entries:
            path = Path(e.path)
            rel = path.relative_to(top).as_posix()
            if e.is_dir(follow_symlinks=False):
                stack.append(path)
            elif path_problem(rel) is not None:
                warn(f"skipping {path}: unusable name: {path_problem(rel)}")
            elif e.is_file(follow_symlinks=False) or (follow and e.is_symlink()):
                out.append((rel, path))
            else:
                warn(f"skipping {path}: not a regular file")
    out.sort()
    return out
