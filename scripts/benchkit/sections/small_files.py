"""Section small-files: thousands of tiny files, and names and attributes over a very large tree.

* sha256sum: ``--small-files`` files (3,000; 200 B to 20 KB, log-uniform,
  text-like and random alternately) in one directory, packed with
  ``xetfs pack DIR STORE``.  ``sha256sum`` of every file, run in that
  directory:
  - through a fresh xetfs mount (``cold``), then again on the same mount
    (``again``: the kernel's page cache holds the bytes; what is left is
    the per-file round trips: lookup, open, release);
  - through the ceiling FS (``scripts/ceiling_fs.py --dir``: the same files
    from memory, with xetfs' kernel options), fresh and again;
  - on the plain files (page cache);
  - through a fresh mount of the same store served by nginx on loopback,
    without a disk cache (``remote``), cold and again, beside the mount of
    the store directory.
  Every sha256sum output must equal the plain files' one.
* cp -r: a copy of the whole directory out of a fresh mount (coreutils
  ``cp`` reads a directory in inode order), of the store directory and
  over nginx; every copied file is checked against the original.
* tree: ``ls -lR``, ``find`` and ``stat`` of every file of a synthetic
  store of ``--tree-files`` files (100,000; the ``mount`` section's
  generator), each on a fresh mount.  ``stat`` gets the names from a list
  (``xargs -0 stat``), so it is lookups and attributes, no listing.  The
  daemon's memory per file is its resident set (VmRSS) after ``ls -lR``
  over the files of the tree.

CPU is in seconds per measurement: the daemon, its decode workers and the
tool (sha256sum, ls, find, stat); the cores-busy rows relate it to the
wall time.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from benchkit import data as bench_data
from benchkit.data import PackedDir
from benchkit.mounts import Daemon
from benchkit.rounds import Runner, Task
from benchkit.rows import Row, Target, busy_row, ratio
from benchkit.sections import Section
from benchkit.util import BenchError, MiB, cat_to_null, proc_status

COLUMN = ""
XORBS = "/xorbs/xorbs/"  # where nginx's access log names xorbs (not shards)
TREE_SHARDS = 100

PLAIN = Row("sf_plain", "sha256sum: plain files, page cache", "s")
CEIL_COLD = Row("sf_ceiling_cold", "sha256sum: ceiling FS, fresh mount", "s")
CEIL_AGAIN = Row("sf_ceiling_again", "sha256sum: ceiling FS, again (same mount)", "s")
COLD = Row("sf_cold", "sha256sum: xetfs, fresh mount (cold)", "s", xetfs=True)
AGAIN = Row("sf_again", "sha256sum: xetfs, again (same mount)", "s", xetfs=True)
R_COLD = Row("r_sf_cold", "xetfs cold / ceiling fresh mount", "x", Target("<=", 1.2, "<= 1.2"),
             derive=ratio(COLD, CEIL_COLD), xetfs=True)  # fmt: skip
R_AGAIN = Row("r_sf_again", "xetfs again / ceiling again", "x", Target("<=", 1.05, "<= 1.05"),
              derive=ratio(AGAIN, CEIL_AGAIN), xetfs=True)  # fmt: skip
R_PLAIN = Row("r_sf_plain", "(ref) xetfs cold / plain files", "x", derive=ratio(COLD, PLAIN), xetfs=True)
R_CEIL_PLAIN = Row("r_sf_ceiling_plain", "(ref) ceiling fresh mount / plain files", "x",
                   derive=ratio(CEIL_COLD, PLAIN))  # fmt: skip
CPU_PLAIN = Row("cpu_sf_plain", "CPU s: sha256sum on the plain files", "s")
CPU_CEIL_COLD = Row("cpu_sf_ceiling_cold", "CPU s: ceiling fresh mount (daemon + sha256sum)", "s")
CPU_CEIL_AGAIN = Row("cpu_sf_ceiling_again", "CPU s: ceiling again (daemon + sha256sum)", "s")
CPU_COLD = Row("cpu_sf_cold", "CPU s: xetfs cold (daemon + workers + sha256sum)", "s", xetfs=True)
CPU_AGAIN = Row("cpu_sf_again", "CPU s: xetfs again (daemon + workers + sha256sum)", "s", xetfs=True)
CPU_COLD_DAEMON = Row("cpu_sf_cold_daemon", "CPU s: xetfs cold, daemon + workers only", "s", xetfs=True)
CPU_CEIL_COLD_DAEMON = Row("cpu_sf_ceiling_cold_daemon", "CPU s: ceiling fresh mount, daemon only", "s")
BUSY_PLAIN = busy_row("sf_plain", "plain files", PLAIN, (CPU_PLAIN,))
BUSY_CEIL_COLD = busy_row("sf_ceiling_cold", "ceiling fresh mount", CEIL_COLD, (CPU_CEIL_COLD,))
BUSY_CEIL_AGAIN = busy_row("sf_ceiling_again", "ceiling again", CEIL_AGAIN, (CPU_CEIL_AGAIN,))
BUSY_COLD = busy_row("sf_cold", "xetfs cold", COLD, (CPU_COLD,))
BUSY_AGAIN = busy_row("sf_again", "xetfs again", AGAIN, (CPU_AGAIN,))
RSS_SMALL = Row("rss_sf", "xetfs daemon + workers, peak RSS after cold + again", "MiB", xetfs=True)
REMOTE_COLD = Row("sf_remote_cold", "sha256sum: xetfs over nginx, fresh mount, no disk cache (cold)", "s", xetfs=True)
REMOTE_AGAIN = Row("sf_remote_again", "sha256sum: xetfs over nginx, again (same mount)", "s", xetfs=True)
R_REMOTE_COLD = Row("r_sf_remote_cold", "xetfs over nginx cold / xetfs cold", "x", Target("<=", 1.3, "<= 1.3"),
                    derive=ratio(REMOTE_COLD, COLD), xetfs=True)  # fmt: skip
R_REMOTE_AGAIN = Row("r_sf_remote_again", "xetfs over nginx again / xetfs again", "x", Target("<=", 1.3, "<= 1.3"),
                     derive=ratio(REMOTE_AGAIN, AGAIN), xetfs=True)  # fmt: skip
CPU_REMOTE_COLD = Row("cpu_sf_remote_cold", "CPU s: xetfs over nginx cold (daemon + workers + sha256sum)", "s",
                      xetfs=True)  # fmt: skip
REQ_REMOTE_COLD = Row("req_sf_remote_cold", "requests to nginx for xorbs: xetfs over nginx cold", "",
                      xetfs=True)  # fmt: skip
BUSY_REMOTE_COLD = busy_row("sf_remote_cold", "xetfs over nginx cold", REMOTE_COLD, (CPU_REMOTE_COLD,))
CP_LOCAL = Row("sf_cp_local", "cp -r of the directory: xetfs, fresh mount", "s", xetfs=True)
CP_REMOTE = Row("sf_cp_remote", "cp -r of the directory: xetfs over nginx, fresh mount, no disk cache", "s",
                xetfs=True)  # fmt: skip
R_CP = Row("r_sf_cp", "cp -r: xetfs over nginx / xetfs", "x", Target("<=", 1.3, "<= 1.3"),
           derive=ratio(CP_REMOTE, CP_LOCAL), xetfs=True)  # fmt: skip
REQ_CP_REMOTE = Row("req_sf_cp_remote", "requests to nginx for xorbs: cp -r over nginx", "", xetfs=True)

TREE_LS = Row("sf_tree_ls", "tree: ls -lR, fresh mount", "s", xetfs=True)
TREE_FIND = Row("sf_tree_find", "tree: find, fresh mount", "s", xetfs=True)
TREE_STAT = Row("sf_tree_stat", "tree: stat of every file by name, fresh mount", "s", xetfs=True)
CPU_TREE_LS = Row("cpu_sf_tree_ls", "CPU s: ls -lR (daemon + workers + ls)", "s", xetfs=True)
CPU_TREE_FIND = Row("cpu_sf_tree_find", "CPU s: find (daemon + workers + find)", "s", xetfs=True)
CPU_TREE_STAT = Row("cpu_sf_tree_stat", "CPU s: stat (daemon + workers + xargs and stat)", "s", xetfs=True)
BUSY_TREE_LS = busy_row("sf_tree_ls", "ls -lR", TREE_LS, (CPU_TREE_LS,))
BUSY_TREE_FIND = busy_row("sf_tree_find", "find", TREE_FIND, (CPU_TREE_FIND,))
BUSY_TREE_STAT = busy_row("sf_tree_stat", "stat", TREE_STAT, (CPU_TREE_STAT,))
TREE_RSS = Row("sf_tree_rss", "tree: daemon RSS after ls -lR", "MiB", xetfs=True)
TREE_PER_FILE = Row("sf_tree_rss_per_file", "tree: daemon RSS after ls -lR / files", "B", xetfs=True)

ROWS = (PLAIN, CEIL_COLD, CEIL_AGAIN, COLD, AGAIN, R_COLD, R_AGAIN, R_PLAIN, R_CEIL_PLAIN,
        CPU_PLAIN, CPU_CEIL_COLD, CPU_CEIL_AGAIN, CPU_COLD, CPU_AGAIN, CPU_COLD_DAEMON, CPU_CEIL_COLD_DAEMON,
        BUSY_PLAIN, BUSY_CEIL_COLD, BUSY_CEIL_AGAIN, BUSY_COLD, BUSY_AGAIN, RSS_SMALL,
        REMOTE_COLD, REMOTE_AGAIN, R_REMOTE_COLD, R_REMOTE_AGAIN, CPU_REMOTE_COLD, REQ_REMOTE_COLD, BUSY_REMOTE_COLD,
        CP_LOCAL, CP_REMOTE, R_CP, REQ_CP_REMOTE,
        TREE_LS, TREE_FIND, TREE_STAT, CPU_TREE_LS, CPU_TREE_FIND, CPU_TREE_STAT,
        BUSY_TREE_LS, BUSY_TREE_FIND, BUSY_TREE_STAT, TREE_RSS, TREE_PER_FILE)  # fmt: skip


def _title(r: Any) -> str:
    small = r.extra.get("small_files")
    what = f"{len(small.names):,} files, {small.total_bytes / 1e6:.1f} MB" if small else ""
    return (f"Small files: sha256sum of every file in one directory ({what}), s; "
            f"and ls -lR, find, stat over {r.args.tree_files:,} files")  # fmt: skip


SECTIONS = (Section("small-files", _title, lambda r: ROWS, lambda r: (COLUMN,)),)


def columns(args: Any, selected: set[str]) -> list[str]:
    return []  # its data sets are made by tasks()


def tasks(r: Runner, selected: set[str]) -> list[Task]:
    if "small-files" not in selected:
        return []
    small = r.extra["small_files"] = bench_data.small_files(r.args.data_dir, r.args.small_files)
    tree, _ = bench_data.synthetic_files(r.args.data_dir, r.args.tree_files, TREE_SHARDS)
    out = [
        Task("small-plain", COLUMN, "", lambda rnd: t_plain(r, small, rnd)),
        Task("small-ceiling", COLUMN, "", lambda rnd: t_ceiling(r, small, rnd)),
    ]
    for v in r.variants:
        out += [
            Task("small-xetfs", COLUMN, v.name, _bind(t_xetfs, r, small, v.name)),
            Task("small-remote", COLUMN, v.name, _bind(t_remote, r, small, v.name)),
            Task("small-cp", COLUMN, v.name, _bind(t_cp, r, small, v.name)),
            Task("small-tree", COLUMN, v.name, _bind(t_tree, r, tree, v.name)),
        ]
    return out


def _bind(fn: Any, r: Runner, what: Any, variant: str) -> Any:
    return lambda rnd: fn(r, what, rnd, variant)


def sha256sum_expected(names: Sequence[str], files: Path) -> bytes:
    """What ``sha256sum NAMES`` prints in ``files`` (computed here, to check every run's output)."""
    lines = [f"{hashlib.sha256((files / n).read_bytes()).hexdigest()}  {n}\n" for n in names]
    return "".join(lines).encode()


def run_tool(argv: Sequence[str], cwd: Path, timeout: float, stdin: bytes | None = None) -> tuple[float, bytes]:
    """Wall seconds of one tool run (its output captured) and its stdout; a failure is a BenchError."""
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(list(argv), cwd=cwd, input=stdin, capture_output=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise BenchError(f"{argv[0]} in {cwd} took more than {timeout:.0f} s") from None
    took = time.perf_counter() - t0
    if proc.returncode != 0:
        raise BenchError(f"{' '.join(argv[:3])} in {cwd} failed ({proc.returncode}): {proc.stderr[-500:]!r}")
    return took, proc.stdout


def expected_sums(r: Runner, small: PackedDir) -> bytes:
    """What ``sha256sum`` prints for the original files (computed once a run)."""
    expected = r.extra.get("small_sums")
    if expected is None:
        expected = r.extra["small_sums"] = sha256sum_expected(small.names, small.files)
    return bytes(expected)


def sha256sum(r: Runner, small: PackedDir, where: Path, daemon: Daemon | None) -> tuple[float, float, float]:
    """``sha256sum`` of every file in ``where``: wall seconds, CPU seconds of everything, and of the daemon
    (with its workers) alone.  The output must be the files' true sums."""
    with r.cpu(daemon) as cpu:
        took, out = run_tool(["sha256sum", "--", *small.names], where, 600)
    if out != expected_sums(r, small):
        raise BenchError(f"sha256sum in {where} printed other sums than the original files have")
    return took, cpu.daemon + cpu.workers + cpu.reader, cpu.daemon + cpu.workers


def t_plain(r: Runner, small: PackedDir, rnd: int) -> None:
    cat_to_null([small.files / n for n in small.names])
    with r.primed():
        took, cpu, _ = sha256sum(r, small, small.files, None)
    r.r.add(PLAIN, COLUMN, rnd, took)
    r.r.add(CPU_PLAIN, COLUMN, rnd, cpu)


def t_ceiling(r: Runner, small: PackedDir, rnd: int) -> None:
    cat_to_null([small.files / n for n in small.names])  # the ceiling maps them: they must be in the page cache
    with r.primed(now=False) as go, r.mounts.ceiling([], directory=small.files) as c:
        go()
        cold, cpu_cold, own = sha256sum(r, small, c.mountpoint, c)
        again, cpu_again, _ = sha256sum(r, small, c.mountpoint, c)
    r.r.add(CEIL_COLD, COLUMN, rnd, cold)
    r.r.add(CEIL_AGAIN, COLUMN, rnd, again)
    r.r.add(CPU_CEIL_COLD, COLUMN, rnd, cpu_cold)
    r.r.add(CPU_CEIL_AGAIN, COLUMN, rnd, cpu_again)
    r.r.add(CPU_CEIL_COLD_DAEMON, COLUMN, rnd, own)


def t_xetfs(r: Runner, small: PackedDir, rnd: int, variant: str) -> None:
    cat_to_null(small.xorbs)
    with r.primed(now=False) as go, r.mounts.xetfs(small.store, variant=r.variant(variant)) as x:
        go()
        cold, cpu_cold, own = sha256sum(r, small, x.mountpoint, x)
        again, cpu_again, _ = sha256sum(r, small, x.mountpoint, x)
        hwm = x.hwm()
    r.r.add(COLD, COLUMN, rnd, cold, variant)
    r.r.add(AGAIN, COLUMN, rnd, again, variant)
    r.r.add(CPU_COLD, COLUMN, rnd, cpu_cold, variant)
    r.r.add(CPU_AGAIN, COLUMN, rnd, cpu_again, variant)
    r.r.add(CPU_COLD_DAEMON, COLUMN, rnd, own, variant)
    r.r.add(RSS_SMALL, COLUMN, rnd, hwm / MiB if hwm else None, variant)


@contextlib.contextmanager
def over_nginx(r: Runner, small: PackedDir, variant: str) -> Iterator[tuple[Any, Daemon]]:
    """nginx serving the small-files store (listing written once a run), and a fresh mount of it without a
    disk cache, primed and ready: ``(server, daemon)``."""
    from helpers import servers  # (the tests' helpers: the bench puts them on the path)

    from benchkit.sections.remote import NO_DISK_CACHE
    from xetfs.storage.remote import publish

    if not r.extra.get("small_published"):
        publish(small.store)
        r.extra["small_published"] = True
    cat_to_null(small.xorbs)  # (nginx reads them from the page cache, as the local mount does)
    with (
        servers.nginx(small.store) as web,
        r.primed(now=False) as go,
        r.mounts.xetfs(web.url, *NO_DISK_CACHE, variant=r.variant(variant)) as x,
    ):
        go()
        yield web, x


def t_remote(r: Runner, small: PackedDir, rnd: int, variant: str) -> None:
    with over_nginx(r, small, variant) as (web, x):
        mark = web.log_mark()
        cold, cpu_cold, _ = sha256sum(r, small, x.mountpoint, x)
        _, requests = web.bytes_sent(since=mark, under=XORBS)
        again, _, _ = sha256sum(r, small, x.mountpoint, x)
    r.r.add(REMOTE_COLD, COLUMN, rnd, cold, variant)
    r.r.add(REMOTE_AGAIN, COLUMN, rnd, again, variant)
    r.r.add(CPU_REMOTE_COLD, COLUMN, rnd, cpu_cold, variant)
    r.r.add(REQ_REMOTE_COLD, COLUMN, rnd, requests, variant)


def copy_out(r: Runner, small: PackedDir, where: Path) -> float:
    """Wall seconds of ``cp -r`` of the mounted directory ``where``; every copied file must be the original."""
    # Into memory: on a disk, cp's own CPU for writing ran from 0.4 to 2.0 s from one copy to the next, more
    # than the reading through either mount took.
    with r.memory_dir("copy") as out:
        dest = out / "copy"
        took, _ = run_tool(["cp", "-r", str(where), str(dest)], out, 600)
        if sha256sum_expected(small.names, dest) != expected_sums(r, small):
            raise BenchError(f"cp -r of {where} copied other bytes than the original files hold")
    return took


def t_cp(r: Runner, small: PackedDir, rnd: int, variant: str) -> None:
    cat_to_null(small.xorbs)
    with r.primed(now=False) as go, r.mounts.xetfs(small.store, variant=r.variant(variant)) as x:
        go()
        r.r.add(CP_LOCAL, COLUMN, rnd, copy_out(r, small, x.mountpoint), variant)
    with over_nginx(r, small, variant) as (web, x):
        mark = web.log_mark()
        r.r.add(CP_REMOTE, COLUMN, rnd, copy_out(r, small, x.mountpoint), variant)
        r.r.add(REQ_CP_REMOTE, COLUMN, rnd, web.bytes_sent(since=mark, under=XORBS)[1], variant)


def tree_names(r: Runner, store: Path, variant: str) -> bytes:
    """The names at the root of the tree store's mount, NUL-separated (listed on a mount of its own, once)."""
    names = r.extra.get("tree_names")
    if names is None:
        with r.mounts.xetfs(store, variant=r.variant(variant)) as x:
            listed = sorted(n for n in os.listdir(x.mountpoint) if not n.startswith("."))
        if len(listed) < r.args.tree_files:
            raise BenchError(f"the tree store shows {len(listed):,} files, not {r.args.tree_files:,}")
        names = r.extra["tree_names"] = b"\0".join(n.encode() for n in listed)
    return names


TREE_TOOLS: dict[str, tuple[list[str], Row, Row]] = {
    "ls": (["ls", "-lR", "."], TREE_LS, CPU_TREE_LS),
    "find": (["find", "."], TREE_FIND, CPU_TREE_FIND),
    "stat": (["xargs", "-0", "stat", "--printf="], TREE_STAT, CPU_TREE_STAT),
}


def tree_order(rnd: int) -> list[str]:
    """The tree tools in a rotated order per round, so that none always runs first."""
    tools = list(TREE_TOOLS)
    k = rnd % len(tools)
    return tools[k:] + tools[:k]


def t_tree(r: Runner, store: Path, rnd: int, variant: str) -> None:
    timeout = 120 + r.args.tree_files / 1000  # never slower than 1,000 files a second
    names = tree_names(r, store, variant)
    for tool in tree_order(rnd):
        argv, row, cpu_row = TREE_TOOLS[tool]
        with r.primed(now=False) as go, r.mounts.xetfs(store, variant=r.variant(variant)) as x:
            go()
            with r.cpu(x) as cpu:
                took, _ = run_tool(argv, x.mountpoint, timeout, stdin=names if tool == "stat" else None)
            rss = proc_status(x.proc.pid, "VmRSS") if tool == "ls" else None
        r.r.add(row, COLUMN, rnd, took, variant)
        r.r.add(cpu_row, COLUMN, rnd, cpu.daemon + cpu.workers + cpu.reader, variant)
        if rss:
            r.r.add(TREE_RSS, COLUMN, rnd, rss / MiB, variant)
            r.r.add(TREE_PER_FILE, COLUMN, rnd, rss / r.args.tree_files, variant)
