"""Security properties of a mount: read-only everywhere, names stay inside, the store is untouched.

* Writes fail with ``EROFS`` through a real mount (the ones that
  test_mount.py does not already try), no writable shared mapping can be
  made, and the daemon's own handlers refuse writes too (defence in depth:
  the kernel's ``ro`` flag normally stops them first).
* A manifest cannot put a name outside the tree: ``..``, absolute paths, NUL,
  empty components are dropped with a warning; backslashes are ordinary
  characters; conflicting duplicates are reported and the first entry wins
  (test_mount.py covers a plain Hub listing with a few ``..`` names).
* No ``allow_other`` unless asked for; nothing in the tree is writable or
  executable.
* The store is opened read-only and never modified: every store file keeps
  its bytes and mtime across a mount, full reads and ``verify``; a store the
  daemon cannot write to (``chmod -R a-w``, a read-only bind mount) mounts and
  reads as usual.
"""

from __future__ import annotations

import errno
import hashlib
import itertools
import json
import mmap
import os
import shutil
import stat
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio
from helpers import oracle
from helpers.mounting import Mount, force_unmount, is_mounted, mounted, mountinfo
from helpers.oracle import OracleStore, run_xetfs
from helpers.writer import StoreBuilder

from xetfs.base import hashes

fuse = pytest.mark.fuse

# -- a small named store ------------------------------------------------------------------


@dataclass(frozen=True)
class NamedStore:
    path: Path
    contents: dict[str, bytes]  # xet hex -> bytes
    a: str
    b: str
    c: str


@pytest.fixture(scope="module")
def named_store(tmp_path_factory: pytest.TempPathFactory) -> NamedStore:
    """Three files (A, B, C) and a manifest: ``d/a.txt``, ``d/sub/b.bin``, ``c``, and an empty ``empty/``."""
    root = tmp_path_factory.mktemp("named") / "store"
    b = StoreBuilder(root)
    contents = {}
    for data in (b"alpha\n" * 1000, bytes(range(256)) * 300, b"gamma"):
        contents[hashes.to_hex(b.add_file(data, chunk_size=4096, scheme=[0, 1, 2]))] = data
    b.finish()
    a, bb, c = contents
    rows = [
        {"type": "file", "path": "d/a.txt", "xetHash": a},
        {"type": "file", "path": "d/sub/b.bin", "xetHash": bb},
        {"type": "file", "path": "c", "xetHash": c},
        {"type": "directory", "path": "empty"},
    ]
    (root / "xetfs-manifest.json").write_text(json.dumps(rows))
    return NamedStore(root, contents, a, bb, c)


def walk(top: Path) -> Iterator[tuple[Path, os.stat_result]]:
    """Every entry under ``top`` (``top`` included), with its lstat, without following anything."""
    stack = [top]
    while stack:
        d = stack.pop()
        yield d, os.lstat(d)
        for entry in sorted(os.scandir(d), key=lambda e: e.name):
            path = Path(entry.path)
            if entry.is_dir(follow_symlinks=False):
                stack.append(path)
            else:
                yield path, os.lstat(path)


# -- read-only everywhere -----------------------------------------------------------------


def _open(path: Path, flags: int) -> Callable[[], object]:
    def run() -> None:
        os.close(os.open(path, flags, 0o644))

    return run


def write_operations(m: Path) -> dict[str, Callable[[], object]]:
    """Writes that test_mount.py's ``test_writes_fail_with_erofs`` does not try."""
    f, new = m / "d" / "a.txt", m / "d" / "new"
    by_hash = m / ".xetfs" / "by-hash"
    one = next(iter(os.listdir(by_hash)))
    return {
        "open O_RDONLY|O_TRUNC": _open(f, os.O_RDONLY | os.O_TRUNC),
        "open O_RDONLY|O_CREAT|O_EXCL": _open(new, os.O_RDONLY | os.O_CREAT | os.O_EXCL),
        "open O_CREAT on an existing name, for writing": _open(f, os.O_WRONLY | os.O_CREAT),
        "open by-hash O_RDWR": _open(by_hash / one, os.O_RDWR),
        "open stats O_RDWR": _open(m / ".xetfs" / "stats", os.O_RDWR),
        "rename over an existing file": lambda: os.rename(f, m / "c"),
        "rename into .xetfs": lambda: os.rename(f, m / ".xetfs" / "x"),
        "rename .xetfs": lambda: os.rename(m / ".xetfs", m / "x"),
        "link into by-hash": lambda: os.link(f, by_hash / "x"),
        "mknod regular": lambda: os.mknod(new, stat.S_IFREG | 0o644),
        "mknod fifo": lambda: os.mknod(new, stat.S_IFIFO | 0o644),
        "chmod setuid": lambda: os.chmod(f, 0o4755),
        "chmod .xetfs": lambda: os.chmod(m / ".xetfs", 0o777),
        "utime of a directory": lambda: os.utime(m / "d", (1, 1)),
        "setxattr on a directory": lambda: os.setxattr(m / "d", "user.x", b"1"),
        "removexattr that does not exist": lambda: os.removexattr(f, "user.none"),
    }


@fuse
def test_more_writes_fail_with_erofs(named_store: NamedStore) -> None:
    with mounted(named_store.path) as m:
        before = {p: (s.st_mode, s.st_size) for p, s in walk(m.path) if p.name != "stats"}
        for name, op in write_operations(m.path).items():
            with pytest.raises(OSError) as exc:
                op()
            assert exc.value.errno == errno.EROFS, f"{name}: {exc.value}"
        after = {p: (s.st_mode, s.st_size) for p, s in walk(m.path) if p.name != "stats"}
        assert after == before
        assert (m / "d" / "a.txt").read_bytes() == named_store.contents[named_store.a]


@fuse
def test_no_writable_shared_mapping(named_store: NamedStore) -> None:
    with mounted(named_store.path) as m:
        fd = os.open(m / "d" / "a.txt", os.O_RDONLY)
        try:
            with pytest.raises(PermissionError):
                mmap.mmap(fd, 0, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            with mmap.mmap(fd, 0, mmap.MAP_PRIVATE, mmap.PROT_READ | mmap.PROT_WRITE) as private:
                private[0:5] = b"XXXXX"  # copy on write: only this mapping changes
            with mmap.mmap(fd, 0, mmap.MAP_SHARED, mmap.PROT_READ) as view:
                assert view[:] == named_store.contents[named_store.a]
        finally:
            os.close(fd)
        assert (m / "d" / "a.txt").read_bytes() == named_store.contents[named_store.a]


@pytest.mark.integration
def test_daemon_refuses_writes_itself(named_store: NamedStore) -> None:
    """Without the kernel's ``ro`` flag in the way, every write handler of ``XetFS`` answers EROFS."""
    import pyfuse3

    from xetfs.fuse.fs import XetFS
    from xetfs.names.tree import ROOT_INODE, build_tree
    from xetfs.read.reader import Reader
    from xetfs.storage.indexer import load_index
    from xetfs.storage.store import Store

    store = Store.open(named_store.path)
    try:
        loaded = load_index(store)
        tree, _ = build_tree(loaded.index, None)
        fs = XetFS(tree, Reader(loaded.index, store))
        file_inode = tree.lookup(ROOT_INODE, named_store.a.encode())
        assert file_inode is not None
        ino = file_inode.inode
        calls: dict[str, tuple[Any, ...]] = {
            "setattr": (ino, pyfuse3.EntryAttributes(), pyfuse3.SetattrFields(), None, None),
            "mknod": (ROOT_INODE, b"n", stat.S_IFREG | 0o644, 0, None),
            "mkdir": (ROOT_INODE, b"n", 0o755, None),
            "unlink": (ROOT_INODE, named_store.a.encode(), None),
            "rmdir": (ROOT_INODE, b".xetfs", None),
            "symlink": (ROOT_INODE, b"n", b"target", None),
            "rename": (ROOT_INODE, named_store.a.encode(), ROOT_INODE, b"n", 0, None),
            "link": (ino, ROOT_INODE, b"n", None),
            "create": (ROOT_INODE, b"n", 0o644, os.O_WRONLY | os.O_CREAT, None),
            "write": (1, 0, b"x"),
            "setxattr": (ino, b"user.x", b"1", None),
            "removexattr": (ino, b"user.xet.hash", None),
        }
        calls.update(
            {
                f"open {flag}": (ino, getattr(os, flag), None)
                for flag in ("O_WRONLY", "O_RDWR", "O_TRUNC", "O_APPEND", "O_CREAT")
            }
        )
        for name, args in calls.items():
            handler = getattr(fs, name.split()[0])
            with pytest.raises(pyfuse3.FUSEError) as exc:
                trio.run(handler, *args)
            assert exc.value.errno == errno.EROFS, name
    finally:
        store.close()


# -- names stay inside the tree ----------------------------------------------------------

UNSAFE = ["..", "../escape.txt", "a/../../x", "/abs/x", "/", "a\0b", "a//b", "./c", "c/.", "", "d/./a.txt", "d/../c"]


def hostile_manifest(s: NamedStore) -> list[dict[str, Any]]:
    unknown = hashes.to_hex(hashes.chunk_hash(b"not in the store"))
    rows: list[dict[str, Any]] = [{"type": "file", "path": "ok/a.txt", "xetHash": s.a}]
    rows += [{"type": "file", "path": p, "xetHash": s.b} for p in UNSAFE]
    rows += [
        {"type": "directory", "path": "../outside"},
        {"type": "file", "path": "back\\..\\..\\slash", "xetHash": s.c},  # one name with backslashes
        {"type": "file", "path": "dup.txt", "xetHash": s.a},
        {"type": "file", "path": "dup.txt", "xetHash": s.b},  # conflicting duplicate: dropped, reported
        {"type": "file", "path": "dup.txt", "xetHash": s.a},  # exact repeat: one name
        {"type": "file", "path": "fd", "xetHash": s.a},
        {"type": "file", "path": "fd/inner", "xetHash": s.b},  # below a file: dropped, reported
        {"type": "file", "path": ".xetfs/evil", "xetHash": s.b},  # the reserved directory
        {"type": "file", "path": "missing.bin", "xetHash": unknown},
        {"type": "file", "path": "nested/deep/b.bin", "xetHash": s.b},
    ]
    return rows


EXPECTED_FILES = {"ok/a.txt": "a", "back\\..\\..\\slash": "c", "dup.txt": "a", "fd": "a", "nested/deep/b.bin": "b"}
EXPECTED_DIRS = {"ok", "nested", "nested/deep"}


@fuse
@pytest.mark.parametrize("where", ["store", "--names"])
def test_manifest_names_cannot_escape(named_store: NamedStore, tmp_path: Path, where: str) -> None:
    store = tmp_path / "store"
    shutil.copytree(named_store.path, store)
    manifest = json.dumps(hostile_manifest(named_store)).encode()
    assert b"\\u0000" in manifest  # the NUL really is in the JSON
    options: list[str] = []
    if where == "store":
        (store / "xetfs-manifest.json").write_bytes(manifest)
    else:
        (store / "xetfs-manifest.json").unlink()
        (tmp_path / "names.json").write_bytes(manifest)
        options = ["--names", str(tmp_path / "names.json")]
    with mounted(store, *options) as m:
        files: set[str] = set()
        dirs: set[str] = set()
        for path, st in walk(m.path):
            rel = path.relative_to(m.path).as_posix()
            if rel == "." or rel.startswith(".xetfs"):
                continue
            (dirs if stat.S_ISDIR(st.st_mode) else files).add(rel)
        assert files == set(EXPECTED_FILES), files
        assert dirs == EXPECTED_DIRS, dirs
        by_letter = {"a": named_store.a, "b": named_store.b, "c": named_store.c}
        for rel, letter in EXPECTED_FILES.items():
            assert (m.path / rel).read_bytes() == named_store.contents[by_letter[letter]], rel
        assert sorted(os.listdir(m / ".xetfs")) == ["by-hash", "by-sha256", "stats"]
        for outside in ("escape.txt", "x", "outside", "abs"):
            assert not (m.path.parent / outside).exists()
        warnings = [line for line in m.log().splitlines() if " WARNING " in line]
        text = "\n".join(warnings)
        assert sum("unsafe name" in w for w in warnings) == len(UNSAFE) + 1, text  # + the directory
        assert any("dup.txt" in w and "earlier entry" in w for w in warnings), text
        assert any("fd/inner" in w for w in warnings), text
        assert any(".xetfs" in w and "reserved" in w for w in warnings), text
        assert any("missing.bin" in w and "not in the store" in w for w in warnings), text


# -- mount options and modes --------------------------------------------------------------


def mount_options(mnt: Path) -> set[str]:
    for point, _, options in mountinfo():
        if point == str(mnt):
            return set(options)
    raise AssertionError(f"{mnt} not in /proc/self/mountinfo")


@fuse
def test_no_allow_other_unless_asked(named_store: NamedStore) -> None:
    """By default only the mounting user sees the files (``-o allow_other`` is in test_mount.py)."""
    with mounted(named_store.path) as m:
        opts = mount_options(m.path)
        assert {"ro", "nosuid", "nodev"} <= opts, opts
        assert not {"allow_other", "allow_root", "rw"} & opts, opts


@fuse
@pytest.mark.parametrize("option", ["rw", "suid", "dev", "exec,rw"])
def test_write_options_are_ignored(named_store: NamedStore, option: str) -> None:
    """mount(8) passes ``rw`` (and may pass ``suid``, ``dev``, ``exec``) to every helper: they are accepted, as
    helpers do, and change nothing: the mount stays read-only, nosuid and nodev."""
    with mounted(named_store.path, "-o", option) as m:
        opts = mount_options(m.path)
        assert {"ro", "nosuid", "nodev"} <= opts and "rw" not in opts, opts
        with pytest.raises(OSError) as err:
            (m.path / "new-file").write_bytes(b"x")
        assert err.value.errno == errno.EROFS


@fuse
def test_nothing_is_writable_or_executable(named_store: NamedStore) -> None:
    with mounted(named_store.path) as m:
        seen = 0
        for path, st in itertools.chain(walk(m.path), walk(m.path / ".xetfs")):  # .xetfs is hidden from walks
            seen += 1
            mode = stat.S_IMODE(st.st_mode)
            assert mode & 0o222 == 0, f"{path}: writable mode {oct(mode)}"
            assert not os.access(path, os.W_OK), path
            if stat.S_ISDIR(st.st_mode):
                continue
            assert stat.S_ISREG(st.st_mode), f"{path}: not a regular file or directory"
            assert mode & 0o111 == 0, f"{path}: executable mode {oct(mode)}"
            assert mode & (stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX) == 0, path
        assert seen >= 12


# -- the store is read-only to the daemon --------------------------------------------------


def snapshot(root: Path) -> dict[str, tuple[Any, ...]]:
    """Every entry under ``root``: kind, mode, size, mtime and (for files) the SHA-256 of the bytes."""
    out: dict[str, tuple[Any, ...]] = {}
    for path, st in walk(root):
        digest = hashlib.sha256(path.read_bytes()).hexdigest() if stat.S_ISREG(st.st_mode) else None
        out[str(path.relative_to(root))] = (stat.S_IFMT(st.st_mode), st.st_mode, st.st_size, st.st_mtime_ns, digest)
    return out


def read_everything(m: Mount, store: OracleStore) -> None:
    for f in store.files:
        assert (m / f.hash).read_bytes() == f.read(), f.name
    m.stats()


def store_descriptors(pid: int, root: Path) -> dict[str, int]:
    """The daemon's open descriptors on store files: path -> open flags (from /proc/PID/fdinfo)."""
    out = {}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            info = Path(f"/proc/{pid}/fdinfo/{fd}").read_text()
        except OSError:
            continue
        if target.startswith(str(root) + "/"):
            flags = next(int(line.split()[1], 8) for line in info.splitlines() if line.startswith("flags:"))
            out[target] = flags
    return out


@fuse
def test_store_is_never_modified(multi_store: OracleStore, tmp_path: Path) -> None:
    store = oracle.copy_store(multi_store, tmp_path / "store")
    before = snapshot(store.path)
    with mounted(store.path, "--direct-io") as m:
        read_everything(m, store)
        fds = store_descriptors(m.proc.pid, store.path.resolve())
        assert fds, "the daemon keeps no store file open after reading (expected open xorbs)"
        for path, flags in fds.items():
            assert flags & os.O_ACCMODE == os.O_RDONLY, f"{path} open with flags {oct(flags)}"
    for args in (("verify", store.path), ("ls", store.path)):
        proc = run_xetfs(*args)
        assert proc.returncode == 0, proc.stderr.decode()
    assert snapshot(store.path) == before


@fuse
def test_mount_of_a_store_without_write_permission(multi_store: OracleStore, tmp_path: Path) -> None:
    store = oracle.copy_store(multi_store, tmp_path / "store")
    subprocess.run(["chmod", "-R", "a-w", str(store.path)], check=True)
    try:
        before = snapshot(store.path)
        with mounted(store.path) as m:
            read_everything(m, store)
        assert snapshot(store.path) == before
    finally:
        subprocess.run(["chmod", "-R", "u+w", str(store.path)], check=True)


@fuse
def test_mount_of_a_read_only_bind_mount(multi_store: OracleStore, tmp_path: Path) -> None:
    """Even root cannot write there: any attempt by the daemon to write would fail the mount or the reads."""
    view = tmp_path / "ro-view"
    view.mkdir()
    bound = False
    try:
        if subprocess.run(["mount", "--bind", str(multi_store.path), str(view)], check=False).returncode != 0:
            pytest.skip("cannot make bind mounts here")
        bound = True
        subprocess.run(["mount", "-o", "remount,ro,bind", str(view)], check=True)
        with pytest.raises(OSError) as exc:
            (view / "probe").write_bytes(b"x")
        assert exc.value.errno == errno.EROFS
        store = multi_store.at(view)
        with mounted(view) as m:
            read_everything(m, store)
    finally:
        if bound:
            subprocess.run(["umount", str(view)], check=False)
        if is_mounted(view):
            force_unmount(view)
