"""Real mounts read with ordinary tools: names, bytes, attributes, refusal to write.

Every mount goes through ``mounting.mounted`` (a child daemon, readiness
polled with a deadline, always unmounted, a logged traceback or ERROR fails
the test).  Mounts that several tests only read are module-scoped; a test
that needs fresh counters or page cache mounts its own.  Bytes are compared
with the originals that hf_xet was given (``oracle``), never with what xetfs
says about itself.
"""

from __future__ import annotations

import errno
import hashlib
import json
import mmap
import os
import random
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import oracle
from helpers.mounting import Mount, mounted
from helpers.oracle import OracleFile, OracleStore, run_xetfs

pytestmark = pytest.mark.fuse

GIT_OID = "0" * 40  # Hub listings carry the git blob id; xetfs ignores it

# Where the basic store's files are named in the manifest of the ``named`` mount.
LAYOUT = {
    "random.bin": "models/random.bin",
    "walk.f32": "models/deep/walk.f32",
    "text.txt": "docs/text.txt",
    "empty": "empty",
    "one-byte": "one-byte",
    **{f"small-{i:02d}-{n}": f"small/small-{i:02d}-{n}" for i, n in enumerate(oracle.SMALL_SIZES)},
}
EXTRA_LINKS = {"docs/text-copy.txt": "text.txt"}  # a second name for the same content
EMPTY_DIRS = ("models/none",)


def run(*args: object, **kwargs: Any) -> subprocess.CompletedProcess[bytes]:
    """Run an ordinary tool and capture its output (never raises on exit status)."""
    return subprocess.run([str(a) for a in args], capture_output=True, timeout=60, check=False, **kwargs)


def hub_file(path: str, f: OracleFile) -> dict[str, Any]:
    """One file entry as the Hub's tree listing gives it."""
    return {
        "type": "file",
        "path": path,
        "size": f.size,
        "oid": GIT_OID,
        "xetHash": f.hash,
        "lfs": {"oid": f.sha256, "size": f.size, "pointerSize": 134},
    }


def hub_dir(path: str) -> dict[str, Any]:
    return {"type": "directory", "path": path, "oid": GIT_OID, "size": 0}


def named_files(store: OracleStore) -> dict[str, OracleFile]:
    """Path in the ``named`` mount -> the original file."""
    out = {path: store[name] for name, path in LAYOUT.items()}
    out.update({path: store[name] for path, name in EXTRA_LINKS.items()})
    return out


def named_dirs() -> set[str]:
    dirs = set(EMPTY_DIRS)
    for path in [*LAYOUT.values(), *EXTRA_LINKS]:
        parts = path.split("/")[:-1]
        dirs.update("/".join(parts[: k + 1]) for k in range(len(parts)))
    return dirs


def walk(root: Path) -> tuple[set[str], dict[str, int]]:
    """Directories and ``file -> size`` below ``root`` (relative paths), without ``.xetfs``."""
    dirs: set[str] = set()
    files: dict[str, int] = {}
    for here, subdirs, names in os.walk(root):
        rel = Path(here).relative_to(root)
        if rel == Path("."):
            subdirs[:] = [d for d in subdirs if d != ".xetfs"]
        dirs.update(str(rel / d) for d in subdirs)
        for name in names:
            files[str(rel / name)] = os.stat(Path(here, name)).st_size
    return dirs, files


def ls_la(path: Path) -> dict[str, tuple[str, int]]:
    """``ls -la`` of a directory: name -> (mode string, size), without ``.`` and ``..``.

    (xetfs's readdir does not list ``.`` and ``..``, which POSIX allows; where
    a filesystem lists them they are directories, checked here.)
    """
    proc = run("ls", "-la", "--time-style=+%s", "--", path)
    assert proc.returncode == 0, proc.stderr
    out = {}
    for line in proc.stdout.decode().splitlines()[1:]:  # the first line is "total N"
        mode, _links, _owner, _group, size, _time, name = line.split(maxsplit=6)
        if name in (".", ".."):
            assert mode.startswith("d"), line
            continue
        out[name] = (mode, int(size))
    return out


# -- mounts shared by the tests of this module ------------------------------------------------


@pytest.fixture(scope="module")
def names_file(basic_store: OracleStore, tmp_path_factory: pytest.TempPathFactory) -> Path:
    listing = [hub_file(path, f) for path, f in named_files(basic_store).items()]
    listing += [hub_dir(d) for d in sorted(named_dirs())]
    path = tmp_path_factory.mktemp("names") / "tree.json"
    path.write_text(json.dumps(listing))
    return path


@pytest.fixture(scope="module")
def named(basic_store: OracleStore, names_file: Path) -> Iterator[Mount]:
    """The basic store, named by a Hub-style listing (page cache on)."""
    with mounted(basic_store.path, "--names", str(names_file)) as m:
        yield m


@pytest.fixture(scope="module")
def by_hash(basic_store: OracleStore) -> Iterator[Mount]:
    """The basic store without a manifest: the root lists files by xet hash."""
    with mounted(basic_store.path) as m:
        yield m


MULTI_MODES = {
    "page-cache": (),
    "direct-io": ("--direct-io",),
    "direct-io-no-cache": ("--direct-io", "--cache-size", "0", "--no-prefetch"),
}


@pytest.fixture(scope="module", params=list(MULTI_MODES))
def multi(request: pytest.FixtureRequest, multi_store: OracleStore) -> Iterator[Mount]:
    """The multi store (terms across xorbs and shards) in each read mode."""
    with mounted(multi_store.path, *MULTI_MODES[request.param]) as m:
        yield m


# -- names and sizes ---------------------------------------------------------------------------


def test_ls_la_named_tree(named: Mount, basic_store: OracleStore) -> None:
    files = named_files(basic_store)
    for d in ["", *sorted(named_dirs())]:
        listing = ls_la(named.path / d)
        prefix = f"{d}/" if d else ""
        want = {p[len(prefix) :]: ("-r--r--r--", f.size) for p, f in files.items() if p.startswith(prefix)}
        want = {name: v for name, v in want.items() if "/" not in name}
        subdirs = {x[len(prefix) :] for x in named_dirs() if x.startswith(prefix)}
        want.update({name: ("dr-xr-xr-x", 0) for name in subdirs if "/" not in name})
        assert listing == want, d


def test_os_walk_named_tree(named: Mount, basic_store: OracleStore) -> None:
    dirs, files = walk(named.path)
    assert dirs == named_dirs()
    assert files == {p: f.size for p, f in named_files(basic_store).items()}


def test_ls_la_by_hash_root(by_hash: Mount, basic_store: OracleStore) -> None:
    listing = ls_la(by_hash.path)
    assert listing == {f.hash: ("-r--r--r--", f.size) for f in basic_store.unique()}  # .xetfs is hidden
    assert ls_la(by_hash.path / ".xetfs").keys() == {"by-hash", "by-sha256", "stats"}


# -- bytes, read with ordinary tools -----------------------------------------------------------


def test_sha256sum_every_file(named: Mount, basic_store: OracleStore) -> None:
    files = named_files(basic_store)
    proc = run("sha256sum", *sorted(files), cwd=named.path)
    assert proc.returncode == 0, proc.stderr
    got = {name: digest for digest, name in (line.split(maxsplit=1) for line in proc.stdout.decode().splitlines())}
    assert got == {p: f.sha256 for p, f in files.items()}
    assert got["empty"] == hashlib.sha256(b"").hexdigest()


def test_sha256sum_by_hash_root(by_hash: Mount, basic_store: OracleStore) -> None:
    unique = basic_store.unique()
    proc = run("sha256sum", *[f.hash for f in unique], cwd=by_hash.path)
    assert proc.returncode == 0, proc.stderr
    got = {name: digest for digest, name in (line.split(maxsplit=1) for line in proc.stdout.decode().splitlines())}
    assert got == {f.hash: f.sha256 for f in unique}


@pytest.mark.parametrize("name", ["random.bin", "text.txt", "walk.f32", "small-11-150000"])
def test_dd_random_blocks(named: Mount, basic_store: OracleStore, name: str) -> None:
    f = basic_store[name]
    data = f.read()
    blocks = -(-f.size // 4096)
    rng = random.Random(name)
    cases = [(0, 1), (blocks - 1, 1), (blocks - 2, 10), (blocks + 3, 1)]  # the end, and past it
    cases += [(rng.randrange(blocks), rng.randint(1, 70)) for _ in range(12)]
    for skip, count in cases:
        proc = run("dd", f"if={named.path / LAYOUT[name]}", "bs=4k", f"skip={skip}", f"count={count}", "status=none")
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout == data[skip * 4096 : (skip + count) * 4096], (skip, count)


@pytest.mark.parametrize("n", [1, 100, 4095, 4097, 65_537, 1_000_000, 3_000_000, 5_000_000])
def test_tail_c(named: Mount, basic_store: OracleStore, n: int) -> None:
    data = basic_store["random.bin"].read()
    proc = run("tail", "-c", n, named.path / LAYOUT["random.bin"])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == data[-n:]


def test_cmp_every_file(named: Mount, basic_store: OracleStore) -> None:
    for path, f in named_files(basic_store).items():
        proc = run("cmp", named.path / path, f.path)
        assert (proc.returncode, proc.stdout, proc.stderr) == (0, b"", b""), path


def test_cmp_multi_store(multi: Mount, multi_store: OracleStore) -> None:
    for f in multi_store.files:
        proc = run("cmp", multi.path / ".xetfs/by-hash" / f.hash, f.path)
        assert (proc.returncode, proc.stdout, proc.stderr) == (0, b"", b""), f.name


@pytest.mark.parametrize("name", ["random.bin", "text.txt", "walk.f32", "one-byte", "small-05-4095"])
def test_mmap_random_slices(named: Mount, basic_store: OracleStore, name: str) -> None:
    data = basic_store[name].read()
    rng = random.Random(name)
    with open(named.path / LAYOUT[name], "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        assert len(m) == len(data)
        for _ in range(200):
            start = rng.randrange(len(data))
            end = min(len(data), start + rng.choice([1, 7, 4096, 5000, 70_000]))
            assert m[start:end] == data[start:end], (start, end)
        assert m[-1] == data[-1]
        assert m[:] == data


def test_mmap_of_empty_file_is_refused_like_any_empty_file(named: Mount) -> None:
    with open(named.path / "empty", "rb") as f, pytest.raises(ValueError):
        mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)


@pytest.mark.parametrize("name", ["b.bin", "d.bin"])
def test_pread_across_term_boundaries(multi: Mount, multi_store: OracleStore, name: str) -> None:
    f = multi_store[name]
    data = f.read()
    chunks = oracle.file_chunks(multi_store, f.hash)
    boundaries = oracle.term_boundaries(chunks)
    assert len(boundaries) >= 2, "the multi store must give this file several terms"
    windows = [(b - before, before + after) for b in boundaries for before in (1, 4096, 70_000) for after in (1, 9000)]
    rng = random.Random(name)
    for c in rng.sample(chunks, 10):  # chunk boundaries inside terms, too
        windows.append((c.start - 3, 6))
    windows += [(f.size - 5, 100), (f.size, 10), (0, f.size)]
    fd = os.open(multi.path / ".xetfs/by-hash" / f.hash, os.O_RDONLY)
    try:
        for off, size in windows:
            off = max(off, 0)
            assert os.pread(fd, size, off) == data[off : off + size], (off, size)
    finally:
        os.close(fd)


def test_concurrent_readers(multi: Mount, multi_store: OracleStore) -> None:
    """Threads reading different files at random offsets at the same time all get the right bytes."""
    errors: list[str] = []

    def read_randomly(f: OracleFile) -> None:
        data = f.read()
        rng = random.Random(f.name)
        try:
            fd = os.open(multi.path / f.hash, os.O_RDONLY)
            try:
                for _ in range(60):
                    off, size = rng.randrange(f.size), rng.choice([1, 4096, 100_000, 300_000])
                    if os.pread(fd, size, off) != data[off : off + size]:
                        errors.append(f"{f.name} at {off}+{size}")
            finally:
                os.close(fd)
        except OSError as exc:
            errors.append(f"{f.name}: {exc}")

    threads = [threading.Thread(target=read_randomly, args=(f,)) for f in multi_store.unique() * 2]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    assert errors == []


def test_duplicate_upload_is_one_file(multi: Mount, multi_store: OracleStore) -> None:
    assert multi_store["a.bin"].hash == multi_store["a-again.bin"].hash
    root = sorted(n for n in os.listdir(multi.path) if n != ".xetfs")
    assert root == sorted(f.hash for f in multi_store.unique())


# -- attributes --------------------------------------------------------------------------------


def getfattr(path: Path, name: str | None = None) -> dict[str, str]:
    proc = run("getfattr", *(["-n", name] if name else ["-d"]), "--absolute-names", path)
    assert proc.returncode == 0, proc.stderr
    out = {}
    for line in proc.stdout.decode().splitlines():
        m = re.fullmatch(r'([\w.]+)="(.*)"', line)
        if m:
            out[m.group(1)] = m.group(2)
    return out


def test_getfattr_by_name(named: Mount, basic_store: OracleStore) -> None:
    terms = oracle.store_terms(basic_store)
    names = ("user.xet.hash", "user.xet.sha256", "user.xet.terms")
    for path, f in named_files(basic_store).items():
        want = {"user.xet.hash": f.hash, "user.xet.sha256": f.sha256, "user.xet.terms": str(len(terms[f.hash]))}
        assert {n: getfattr(named.path / path, n)[n] for n in names} == want, path
        assert getfattr(named.path / path) == {}, path  # (none listed: ``getfattr -d`` dumps nothing)


def test_copies_do_not_carry_the_attributes(named: Mount, tmp_path: Path) -> None:
    """``cp -a`` copies the attributes a file lists: a copy, once edited, would carry a hash not its own."""
    probe = tmp_path / "probe"
    probe.touch()
    try:
        os.setxattr(probe, "user.probe", b"1")
    except OSError as exc:  # (then cp -a would drop them whatever the mount lists: nothing to see)
        pytest.skip(f"{tmp_path} cannot hold user attributes: {exc}")
    proc = run("cp", "-a", named.path / "models", tmp_path / "copy")
    assert proc.returncode == 0, proc.stderr
    copied = [p for p in (tmp_path / "copy").rglob("*") if p.is_file()]
    assert copied and all(os.listxattr(p) == [] for p in copied)
    # An empty list, not ENOSYS (after which the kernel would answer "not supported" itself, with no round
    # trip): ``tar --xattrs`` would then warn for every file, and ``getfattr -d`` fail.
    for argv in (("tar", "--xattrs", "-cf", os.devnull, "-C", named.path, "models"), ("getfattr", "-d", named.path)):
        proc = run(*argv)
        assert (proc.returncode, proc.stderr) == (0, b""), argv


def test_xattrs_count_terms_across_xorbs(multi: Mount, multi_store: OracleStore) -> None:
    terms = oracle.store_terms(multi_store)
    for f in multi_store.unique():
        path = multi.path / f.hash
        assert os.listxattr(path) == []  # (read by name only)
        assert os.getxattr(path, "user.xet.hash") == f.hash.encode()
        assert os.getxattr(path, "user.xet.sha256") == f.sha256.encode()
        assert os.getxattr(path, "user.xet.terms") == str(len(terms[f.hash])).encode()
    assert os.getxattr(multi.path / multi_store["d.bin"].hash, "user.xet.terms") == b"6"


def test_xattrs_absent(named: Mount) -> None:
    with pytest.raises(OSError) as exc:
        os.getxattr(named.path / "one-byte", "user.xet.nothing")
    assert exc.value.errno == errno.ENODATA
    for d in ("", "models", ".xetfs", ".xetfs/by-hash"):
        assert os.listxattr(named.path / d) == [], d
        with pytest.raises(OSError) as exc:
            os.getxattr(named.path / d, "user.xet.hash")
        assert exc.value.errno == errno.ENODATA, d


def test_other_xattr_namespaces_are_not_supported(named: Mount) -> None:
    # ``ls -l`` asks each file for these two; "not supported" makes it stop asking this file system, where
    # "no such attribute" would cost two round trips per file listed.
    for name in ("security.selinux", "system.posix_acl_access", "trusted.x"):
        for path in (named.path / "one-byte", named.path / "models"):
            with pytest.raises(OSError) as exc:
                os.getxattr(path, name, follow_symlinks=False)
            assert exc.value.errno == errno.EOPNOTSUPP, (name, path)
    assert os.listxattr(named.path / ".xetfs/stats") == []
    assert getfattr(named.path / "models") == {}


def test_df(named: Mount, basic_store: OracleStore) -> None:
    proc = run("df", named.path)
    assert proc.returncode == 0, proc.stderr
    last = proc.stdout.decode().splitlines()[-1].split()
    assert last[0] == str(basic_store.path) and last[-1] == str(named.path)  # the store is the source
    st = os.statvfs(named.path)
    total = sum(f.size for f in basic_store.unique())
    assert total <= st.f_blocks * st.f_frsize < total + st.f_frsize
    assert st.f_bavail == 0
    assert st.f_flag & os.ST_RDONLY


def stat_lines(root: Path, paths: list[str]) -> dict[str, tuple[str, str, int]]:
    """``stat -c '%a|%F|%s'`` per path: (octal mode, file type, size)."""
    proc = run("stat", "-c", "%a|%F|%s", *paths, cwd=root)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.decode().splitlines()
    out = {}
    for path, line in zip(paths, lines, strict=True):
        mode, kind, size = line.split("|")
        out[path] = (mode, kind, int(size))
    return out


def test_stat_modes_and_sizes(named: Mount, basic_store: OracleStore) -> None:
    files = named_files(basic_store)
    dirs = [".", ".xetfs", ".xetfs/by-hash", ".xetfs/by-sha256", *sorted(named_dirs())]
    got = stat_lines(named.path, [*files, *dirs])
    for path, f in files.items():
        mode, kind, size = got[path]
        assert (mode, size) == ("444", f.size), path
        assert kind in ("regular file", "regular empty file"), path
    for d in dirs:
        assert got[d][:2] == ("555", "directory"), d
    st = os.stat(named.path / ".xetfs/stats")
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o444


def tree_inodes(root: Path) -> dict[str, tuple[int, int]]:
    """Every path below ``root`` (the hidden ``.xetfs`` included) -> (inode, link count)."""
    out = {".": (os.stat(root).st_ino, os.stat(root).st_nlink)}
    for top in (root, root / ".xetfs"):
        st = os.stat(top)
        out[str(top.relative_to(root))] = (st.st_ino, st.st_nlink)
        for here, subdirs, names in os.walk(top):
            for name in subdirs + names:
                st = os.stat(Path(here, name))
                out[str(Path(here, name).relative_to(root))] = (st.st_ino, st.st_nlink)
    return out


def test_inodes_stable_across_two_mounts(named: Mount, basic_store: OracleStore, names_file: Path) -> None:
    first = tree_inodes(named.path)
    with mounted(basic_store.path, "--names", str(names_file)) as again:
        assert tree_inodes(again.path) == first
    assert len({ino for ino, _ in first.values()}) == len(basic_store.unique()) + len(named_dirs()) + 5


def test_file_inodes_do_not_depend_on_the_names(named: Mount, by_hash: Mount, basic_store: OracleStore) -> None:
    for f in basic_store.unique():
        assert os.stat(named.path / ".xetfs/by-hash" / f.hash).st_ino == os.stat(by_hash.path / f.hash).st_ino


def test_every_name_of_a_file_is_a_hard_link(named: Mount, basic_store: OracleStore) -> None:
    f = basic_store["text.txt"]
    paths = ["docs/text.txt", "docs/text-copy.txt", f".xetfs/by-hash/{f.hash}", f".xetfs/by-sha256/{f.sha256}"]
    stats = [os.stat(named.path / p) for p in paths]
    assert {s.st_ino for s in stats} == {stats[0].st_ino}
    assert {s.st_nlink for s in stats} == {2}  # its two names; the names in .xetfs are not counted
    assert os.stat(named.path / "one-byte").st_nlink == 1


def test_uid_and_gid(basic_store: OracleStore) -> None:
    with mounted(basic_store.path, "--uid", "1234", "--gid", "4321") as m:
        f = basic_store["one-byte"]
        paths = [".", ".xetfs", ".xetfs/by-hash", ".xetfs/stats", f.hash, f".xetfs/by-sha256/{f.sha256}"]
        proc = run("stat", "-c", "%u:%g", *paths, cwd=m.path)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.decode().split() == ["1234:4321"] * len(paths)
        assert (m.path / f.hash).read_bytes() == f.read()  # root still reads: default_permissions


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory every user can enter (pytest's tmp_path is private to root)."""
    path = Path(tempfile.mkdtemp(prefix="xetfs-shared-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        for child in path.iterdir():
            child.rmdir()
        path.rmdir()


NOBODY = 65534


def cat_as_nobody(path: Path) -> subprocess.CompletedProcess[bytes]:
    return run("cat", path, user=NOBODY, group=NOBODY, extra_groups=[], cwd="/")


def test_allow_other(basic_store: OracleStore, shared_dir: Path) -> None:
    f = basic_store["small-03-100"]
    with mounted(basic_store.path, mountpoint=shared_dir / "private") as m:
        denied = cat_as_nobody(m.path / f.hash)
        assert denied.returncode != 0 and b"Permission denied" in denied.stderr
    with mounted(basic_store.path, "-o", "allow_other", mountpoint=shared_dir / "shared") as m:
        options = next(line.split()[3] for line in Path("/proc/mounts").read_text().splitlines()
                       if line.split()[1] == str(m.path))  # fmt: skip
        assert "allow_other" in options.split(",")
        allowed = cat_as_nobody(m.path / f.hash)
        assert (allowed.returncode, allowed.stdout) == (0, f.read()), allowed.stderr


# -- nothing can be written --------------------------------------------------------------------

FILE = "small/small-03-100"
DIR = "models"
EMPTY_DIR = "models/none"

WRITES: dict[str, Callable[[Path], object]] = {
    "create": lambda m: os.open(m / DIR / "new", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644),
    "open-write": lambda m: os.open(m / FILE, os.O_WRONLY),
    "open-rdwr": lambda m: os.open(m / FILE, os.O_RDWR),
    "open-append": lambda m: os.open(m / FILE, os.O_WRONLY | os.O_APPEND),
    "open-trunc": lambda m: os.open(m / FILE, os.O_WRONLY | os.O_TRUNC),
    "write-bytes": lambda m: (m / FILE).write_bytes(b"changed"),
    "write-stats": lambda m: (m / ".xetfs/stats").write_bytes(b"{}"),
    "truncate": lambda m: os.truncate(m / FILE, 0),
    "unlink": lambda m: os.unlink(m / FILE),
    "unlink-by-hash": lambda m: os.unlink(m / ".xetfs/by-hash" / os.listdir(m / ".xetfs/by-hash")[0]),
    "mkdir": lambda m: os.mkdir(m / DIR / "sub"),
    "mkdir-in-xetfs": lambda m: os.mkdir(m / ".xetfs/by-hash/sub"),
    "rmdir": lambda m: os.rmdir(m / EMPTY_DIR),
    "rmdir-xetfs": lambda m: os.rmdir(m / ".xetfs/by-sha256"),
    "rename": lambda m: os.rename(m / FILE, m / DIR / "renamed"),
    "rename-dir": lambda m: os.rename(m / EMPTY_DIR, m / "moved"),
    "symlink": lambda m: os.symlink("small", m / DIR / "link"),
    "link": lambda m: os.link(m / FILE, m / DIR / "hard"),
    "mkfifo": lambda m: os.mkfifo(m / DIR / "fifo"),
    "chmod": lambda m: os.chmod(m / FILE, 0o644),
    "chmod-dir": lambda m: os.chmod(m / DIR, 0o755),
    "chown": lambda m: os.chown(m / FILE, 1, 1),
    "utime": lambda m: os.utime(m / FILE, (0, 0)),
    "utime-now": lambda m: os.utime(m / FILE),
    "setxattr": lambda m: os.setxattr(m / FILE, "user.test", b"1"),
    "setxattr-replace": lambda m: os.setxattr(m / FILE, "user.xet.hash", b"0" * 64),
    "removexattr": lambda m: os.removexattr(m / FILE, "user.xet.hash"),
}


def snapshot(m: Path) -> tuple[object, ...]:
    """What a write could change: the names, the file's bytes, attributes and xattrs."""
    st = os.stat(m / FILE)
    xattrs = {n: os.getxattr(m / FILE, n) for n in ("user.xet.hash", "user.xet.sha256", "user.xet.terms")}
    return (walk(m), (m / FILE).read_bytes(), st.st_mode, st.st_uid, st.st_mtime_ns, xattrs,
            sorted(os.listdir(m / ".xetfs/by-hash")))  # fmt: skip


@pytest.mark.parametrize("op", list(WRITES))
def test_writes_fail_with_erofs(named: Mount, op: str) -> None:
    before = snapshot(named.path)
    with pytest.raises(OSError) as exc:
        result = WRITES[op](named.path)
        if isinstance(result, int):  # an fd: the open must not have succeeded
            os.close(result)
    assert exc.value.errno == errno.EROFS, exc.value
    assert snapshot(named.path) == before


def test_no_write_through_a_read_only_descriptor(named: Mount, basic_store: OracleStore) -> None:
    """No writable descriptor can be opened, so write() and ftruncate() never reach the filesystem."""
    fd = os.open(named.path / FILE, os.O_RDONLY)
    try:
        with pytest.raises(OSError) as exc:
            os.write(fd, b"x")
        assert exc.value.errno == errno.EBADF
        with pytest.raises(OSError):
            os.ftruncate(fd, 0)
    finally:
        os.close(fd)
    assert (named.path / FILE).read_bytes() == basic_store["small-03-100"].read()


@pytest.mark.parametrize(
    "command",
    [
        ["touch", "models/new"],
        ["touch", FILE],
        ["sh", "-c", f"echo x > {FILE}"],
        ["sh", "-c", f"echo x >> {FILE}"],
        ["rm", "-f", FILE],
        ["mv", FILE, "elsewhere"],
        ["mkdir", "models/new"],
        ["chmod", "u+w", FILE],
        ["setfattr", "-n", "user.test", "-v", "1", FILE],
        ["ln", "-s", "x", "models/s"],
    ],
    ids=lambda c: " ".join(c).replace("/", "_"),
)
def test_tools_report_read_only_file_system(named: Mount, command: list[str]) -> None:
    before = snapshot(named.path)
    proc = run(*command, cwd=named.path)
    assert proc.returncode != 0
    assert b"Read-only file system" in proc.stderr, proc.stderr
    assert snapshot(named.path) == before


# -- the .xetfs directory ----------------------------------------------------------------------


def test_by_hash_and_by_sha256_serve_the_same_bytes(named: Mount, basic_store: OracleStore) -> None:
    xetfs = named.path / ".xetfs"
    assert sorted(os.listdir(xetfs / "by-hash")) == sorted(f.hash for f in basic_store.unique())
    assert sorted(os.listdir(xetfs / "by-sha256")) == sorted(f.sha256 for f in basic_store.unique())
    for f in basic_store.unique():
        data = f.read()
        assert (xetfs / "by-hash" / f.hash).read_bytes() == data, f.name
        assert (xetfs / "by-sha256" / f.sha256).read_bytes() == data, f.name


def test_missing_names_are_enoent(named: Mount) -> None:
    for path in ("nothing", "models/nothing", ".xetfs/by-hash/" + "0" * 63 + "1", ".xetfs/by-sha256/abc"):
        with pytest.raises(FileNotFoundError):
            os.stat(named.path / path)
    with pytest.raises(NotADirectoryError):
        os.listdir(named.path / "one-byte")


def test_dot_dot_leads_to_the_parent(named: Mount) -> None:
    root = named.path
    assert os.path.samefile(root / "models/deep/..", root / "models")
    assert os.path.samefile(root / "models/..", root)
    assert os.path.samefile(root / ".xetfs/by-hash/..", root / ".xetfs")
    assert os.path.samefile(root / ".xetfs/..", root)


def test_stats_read_in_small_pieces_is_one_document(named: Mount, basic_store: OracleStore) -> None:
    """``dd bs=7``: every piece comes from the snapshot taken at offset 0, so the pieces fit together."""
    (named.path / "one-byte").read_bytes()
    for _ in range(3):
        proc = run("dd", f"if={named.path / '.xetfs/stats'}", "bs=7", "status=none")
        assert proc.returncode == 0, proc.stderr
        doc = json.loads(proc.stdout)
        assert doc["index"]["files"] == len(basic_store.unique())
    tool = run("cat", named.path / ".xetfs/stats")
    assert tool.returncode == 0 and json.loads(tool.stdout).keys() == doc.keys()


def test_stats_file_changes_after_a_read(basic_store: OracleStore) -> None:
    f = basic_store["random.bin"]
    with mounted(basic_store.path) as m:  # a mount of its own: nothing page-cached, counters at zero
        first = json.loads((m.path / ".xetfs/stats").read_bytes())
        again = json.loads((m.path / ".xetfs/stats").read_bytes())
        assert first["reads"] == again["reads"] == {"requests": 0, "bytes": 0}
        assert (m.path / f.hash).read_bytes() == f.read()
        after = m.stats()  # read fresh through the mount
        assert after["reads"]["bytes"] >= f.size
        assert after["reads"]["requests"] > 0
        assert after["decode"]["chunks"] > first["decode"]["chunks"]
        assert after["cache"]["misses"] > first["cache"]["misses"]
        assert after["errors"] == {"integrity": 0, "missing": 0, "format": 0, "timeout": 0, "io": 0}
        assert after["index"]["files"] == len(basic_store.unique())

        text = run_xetfs("stats", "--all", m.path)
        assert text.returncode == 0, text.stderr
        out = text.stdout.decode()
        assert re.search(r"^reads:$", out, re.M) and re.search(r"^  bytes +[\d,]+", out, re.M), out
        assert re.search(r"^  last_refresh +never$", out, re.M), out  # (times as times, not counts)
        raw = run_xetfs("stats", m.path, "--json")
        assert raw.returncode == 0, raw.stderr
        doc = json.loads(raw.stdout)
        assert doc.keys() == after.keys()
        assert doc["reads"]["bytes"] >= f.size


@pytest.mark.parametrize("as_json", [False, True], ids=["table", "json"])
def test_stats_command_into_a_closed_pipe(named: Mount, as_json: bool) -> None:
    """``xetfs stats MNT | head -1`` when head has gone: stop quietly with 141, like ``xetfs cat`` does."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "xetfs", "stats", str(named.path), *(["--json"] if as_json else [])],
            stdout=write_end,
            stderr=subprocess.PIPE,
            cwd=oracle.REPO_ROOT,
            timeout=60,
            check=False,
        )
    finally:
        os.close(write_end)
    assert (proc.returncode, proc.stderr.decode()) == (141, "")


def test_stats_command_outside_a_mount(tmp_path: Path) -> None:
    proc = run_xetfs("stats", tmp_path)
    assert proc.returncode != 0
    lines = proc.stderr.decode().splitlines()
    assert len(lines) == 1 and lines[0].startswith("xetfs: error: ") and str(tmp_path) in lines[0], lines


# -- names from a Hub listing ------------------------------------------------------------------


def test_names_from_a_hub_listing(multi_store: OracleStore, tmp_path: Path) -> None:
    a, b, c = multi_store["a.bin"], multi_store["b.bin"], multi_store["c.txt"]
    listing = [
        hub_dir("weights"),
        hub_file("weights/a.bin", a),
        hub_file("weights/b.bin", b),
        hub_file("config/c.txt", c),
        hub_dir("empty-dir"),
        {"type": "file", "path": ".gitattributes", "size": 1519, "oid": GIT_OID},  # kept in git, not in Xet
        hub_file("../evil", a),
        hub_file("/etc/evil-absolute", a),
        hub_file("weights/../../evil-nested", a),
        hub_file(".xetfs/stats", a),  # the reserved directory is xetfs's own
    ]
    names = tmp_path / "listing.json"
    names.write_text(json.dumps(listing))
    with mounted(multi_store.path, "--names", str(names), mountpoint=tmp_path / "mnt") as m:
        dirs, files = walk(m.path)
        assert dirs == {"weights", "config", "empty-dir"}
        assert files == {"weights/a.bin": a.size, "weights/b.bin": b.size, "config/c.txt": c.size}
        for path, f in (("weights/a.bin", a), ("weights/b.bin", b), ("config/c.txt", c)):
            assert (m.path / path).read_bytes() == f.read(), path
        assert not any("evil" in p.name for p in tmp_path.rglob("*") if not p.is_relative_to(m.path))
        assert json.loads((m.path / ".xetfs/stats").read_bytes())["index"]["files"] == len(multi_store.unique())
        log = m.log()
    warnings = [line for line in log.splitlines() if " WARNING " in line]
    for name in ("../evil", "/etc/evil-absolute", "weights/../../evil-nested", ".gitattributes", ".xetfs"):
        assert any(name in line for line in warnings), (name, warnings)


def test_large_directory_lists_every_name_once(basic_store: OracleStore, tmp_path: Path) -> None:
    """Thousands of names in one directory: readdir must continue where each batch stopped."""
    files = basic_store.unique()
    names = {f"many/name-{i:05d}-é": files[i % len(files)] for i in range(3000)}
    (tmp_path / "names.json").write_text(json.dumps([hub_file(p, f) for p, f in names.items()]))
    with mounted(basic_store.path, "--names", str(tmp_path / "names.json"), mountpoint=tmp_path / "mnt") as m:
        listed = os.listdir(m.path / "many")
        assert len(listed) == len(names)
        assert sorted(listed) == sorted(p.split("/")[1] for p in names)
        proc = run("ls", "-U", m.path / "many")  # the kernel's order: the filesystem's own
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.decode().splitlines() == sorted(listed, key=str.encode)
        one = basic_store["one-byte"]
        linked = [p for p, f in names.items() if f.hash == one.hash]
        assert os.stat(m.path / linked[0]).st_nlink == len(linked)  # the names in .xetfs are not counted
        assert (m.path / linked[-1]).read_bytes() == one.read()


# -- pack, then mount --------------------------------------------------------------------------

PACKED = {
    "README.md": b"# packed\n",
    "données/é.txt": "café crème\n".encode(),
    "日本語/ファイル.bin": oracle.random_bytes(200_000, 31),
    "a/b/c/deep.bin": oracle.random_bytes(70_000, 32),
    "a/b/text.txt": oracle.text_bytes(300_000, 33),
    "a/copy.bin": oracle.random_bytes(70_000, 32),  # the same content as deep.bin
    "empty.txt": b"",
}
PACKED_EMPTY_DIRS = ("vide", "a/b/rien")


def test_pack_then_mount_round_trip(tmp_path: Path) -> None:
    src = tmp_path / "src"
    for name, data in PACKED.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_bytes(data)
    for d in PACKED_EMPTY_DIRS:
        (src / d).mkdir(parents=True)
    store = tmp_path / "store"
    proc = run_xetfs("pack", "--no-progress", src, store)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == b""
    assert (store / "xetfs-manifest.json").is_file()

    with mounted(store) as m:  # the manifest is found beside the store
        assert walk(m.path) == walk(src)
        for name, data in PACKED.items():
            assert (m.path / name).read_bytes() == data, name
        assert os.stat(m.path / "a/copy.bin").st_ino == os.stat(m.path / "a/b/c/deep.bin").st_ino
        assert sorted(os.listdir(m.path)) == sorted(["README.md", "a", "données", "empty.txt", "vide", "日本語"])


# -- damaged data ------------------------------------------------------------------------------


def test_a_failing_read_is_logged_with_the_files_name(multi_store: OracleStore, tmp_path: Path) -> None:
    store = oracle.copy_store(multi_store, tmp_path / "store")
    victim = store["a.bin"]
    first = oracle.file_chunks(store, victim.hash)[0]
    payload = next(c.payload_start for c in oracle.xorb_chunks(store.xorb_path(first.xorb)) if c.index == first.chunk)
    oracle.flip_byte(store.xorb_path(first.xorb), payload + 10)
    names = tmp_path / "listing.json"
    names.write_text(json.dumps([hub_file("weights/a.bin", victim)]))
    with mounted(store.path, "--names", str(names), allow_errors=True) as m:
        for _ in range(3):  # a reader that tries again: counted each time, logged once
            with pytest.raises(OSError) as exc:
                (m.path / "weights/a.bin").read_bytes()
            assert exc.value.errno == errno.EIO
        failures = m.stats()["errors"]["integrity"]
        log = m.log()
    errors = [line for line in log.splitlines() if " ERROR " in line]
    named = f"read of weights/a.bin (file {victim.hash}) at file offset 0"
    assert errors and all(named in line for line in errors), errors
    assert len(errors) == 1 < failures, errors  # a failure at one offset is logged once (the kernel retries)


@pytest.mark.fuse
def test_a_missing_xorb_is_logged_once_for_a_reader_that_goes_on(tmp_path: Path) -> None:
    """A reader that tries every block of a file whose xorb is gone: each read fails, one log line says so."""
    sample = Path(__file__).resolve().parent.parent / "sample" / "store"
    store = tmp_path / "store"
    shutil.copytree(sample, store)
    (xorb,) = (p for p in (store / "xet" / "xorbs" / "xorbs").iterdir() if p.suffix != ".tagset")
    xorb.unlink()
    with mounted(store, "--direct-io", allow_errors=True) as m:
        failed = 0
        fd = os.open(m.path / "model" / "model.safetensors", os.O_RDONLY)
        try:
            for off in range(0, 2 << 20, 64 << 10):
                try:
                    os.pread(fd, 64 << 10, off)
                except OSError as exc:
                    assert exc.errno == errno.EIO
                    failed += 1
        finally:
            os.close(fd)
        errors = [line for line in m.log().splitlines() if " ERROR " in line]
        counted = m.stats()["errors"]["missing"]
    assert failed == 32 and counted >= failed, (failed, counted)
    assert len(errors) == 1, errors
    assert "read of model/model.safetensors (file " in errors[0] and "at file offset 0 " in errors[0], errors
    assert errors[0].endswith("not in the store (reads of this file failing alike are not logged for 10 s)"), errors
