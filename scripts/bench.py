#!/usr/bin/env python3
"""Side-by-side benchmark: xetfs against hf_xet, a zero-work FUSE filesystem and plain files.

    .venv/bin/python scripts/bench.py              # 1 GiB per kind, 5 rounds (several minutes)
    .venv/bin/python scripts/bench.py --quick      # ~1 min: 64 MiB, 3 rounds, smaller synthetic stores
    .venv/bin/python scripts/bench.py --only cold,peer --kinds text --repeat 3 --json out.json

Needs root and /dev/fuse (mounts, /sys/class/bdi read-ahead).  Everything runs
in one invocation on the same machine and the same data:

* peer      hf_xet.download_files from the same local:// store to /dev/shm
            (a subprocess per measurement; the time of the call itself)
* ceiling   scripts/ceiling_fs.py: the same bytes served from memory by a
            trivial pyfuse3 filesystem with xetfs' mount options
* cold      a fresh xetfs mount (empty chunk cache, xorbs page-cached):
            dd bs=1M of the whole file
* warm      the same file again, twice (kernel page cache), with how much of
            it the page cache still held after the cold read (fincore); and
            on a --direct-io mount after one full read (chunk cache only)
* plain     dd of the original file (page-cached)
* random    4 KiB preads at random offsets through --direct-io mounts:
            chunks not cached (fresh mount, one read per chunk) and cached
            (after a full read), and on the ceiling for reference
* parallel  4 readers of 4 different files at once vs the same 4 files read
            one after another (xetfs cold, and the ceiling)
* mount     `xetfs mount` (background mode) until it returns, for synthetic
            stores of 10,000 files / 100 shards and of 1,000,000 terms
Peak RSS (VmHWM) of every xetfs daemon, plus its decode workers', is recorded.  Data kinds: random bytes
(stored raw), text (LZ4) and a float32 random walk (BG4), written by hf_xet;
data and synthetic stores are cached under --data-dir.

Configurations are interleaved: every round runs every measurement once, in a
rotated order, after an unrecorded warm-up round.  Each row shows the median
and the spread [min-max] over the rounds; ratios are computed per round
(the two sides were measured close together) and then summarised the same way.

Two quirks of virtual machines with DAMON pageout are handled rather than
measured: files idle for ~30 s leave the page cache, so every input is read
again right before its measurement; and memory handed back to the host is
slow to touch again, so a reserve of touched memory is freed right before
each measurement (``Primer``; --no-primer to see the raw machine).  Pageout
can also take pages a streaming read has just filled, before the re-read:
the page-cache rows say how much of the file was still held.  Every mount
is unmounted when a measurement ends, fails or is interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_data
from bench_data import KINDS, Dataset, log

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from mounting import force_unmount, is_mounted, mount_device  # noqa: E402

MiB = 1024 * 1024
GiB = 1024 * MiB
SECTIONS = ("plain", "peer", "ceiling", "cold", "warm", "random", "parallel", "mount")
STATS = ".xetfs/stats"
READY_DEADLINE = 60.0
EXIT_DEADLINE = 15.0
READ_AHEAD_DEADLINE = 5.0
RSS_ALLOWANCE = 100 * MiB
CEILING = REPO / "scripts" / "ceiling_fs.py"


# -- small utilities ---------------------------------------------------------------


def parse_size(text: str) -> int:
    units = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    t = text.strip().lower().removesuffix("ib").removesuffix("b")
    unit = t[-1:] if t[-1:] in units else ""
    try:
        value = float(t[: len(t) - len(unit)])
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (try 64M or 1G)") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"size must be positive: {text!r}")
    return int(value * units[unit])


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.3g} {unit}"
        n /= 1024
    return str(n)


class BenchError(Exception):
    """A measurement could not be made (the message says why)."""


def poll(
    predicate: Callable[[], bool], deadline: float, what: str, alive: Callable[[], str | None] | None = None
) -> None:
    """Wait until ``predicate()``; fail at the deadline, or at once when ``alive()`` reports a death."""
    end = time.monotonic() + deadline
    delay = 0.002
    while not predicate():
        if alive is not None:
            dead = alive()
            if dead:
                raise BenchError(f"{dead} while waiting for {what}")
        if time.monotonic() > end:
            raise BenchError(f"timed out after {deadline:g} s waiting for {what}")
        time.sleep(delay)
        delay = min(delay * 2, 0.05)


def read_ahead_kb(path: Path) -> int | None:
    device = mount_device(path)
    if device is None:
        return None
    try:
        return int(Path(f"/sys/class/bdi/{device}/read_ahead_kb").read_text())
    except (OSError, ValueError):
        return None


def tree_hwm(pid: int) -> int | None:
    """Peak RSS of a process plus that of its children (the daemon and its decode workers).

    A sum of peaks: shared memory (the workers' transfer slots, a few MiB)
    counts once per process, so this errs on the high side.
    """
    own = proc_status(pid, "VmHWM")
    if own is None:
        return None
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        children = []
    return own + sum(proc_status(int(c), "VmHWM") or 0 for c in children)


def proc_status(pid: int, key: str) -> int | None:
    """A ``kB`` value of /proc/PID/status in bytes (VmHWM, VmRSS), or None."""
    return _kb_field(f"/proc/{pid}/status", key)


def proc_meminfo(key: str) -> int | None:
    """A ``kB`` value of /proc/meminfo in bytes (MemAvailable), or None."""
    return _kb_field("/proc/meminfo", key)


def _kb_field(path: str, key: str) -> int | None:
    """The value of a ``Key:  N kB`` line of a /proc file, in bytes, or None."""
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def cat_to_null(paths: Sequence[Path]) -> None:
    """Read files once so that they are in the page cache."""
    if paths:
        subprocess.run(["cat", *map(str, paths)], stdout=subprocess.DEVNULL, check=True)


DD_RESULT = re.compile(rb"(\d+) bytes .*copied, ([0-9.eE+-]+) s")


def dd_command(path: Path) -> list[str]:
    return ["dd", f"if={path}", "of=/dev/null", "bs=1M"]


def dd(path: Path, expect: int, timeout: float) -> float:
    """Seconds dd reports for reading all of ``path`` with 1 MiB reads (checks the byte count)."""
    env = dict(os.environ, LC_ALL="C")
    try:
        proc = subprocess.run(dd_command(path), capture_output=True, env=env, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise BenchError(f"dd of {path} took more than {timeout:.0f} s") from None
    m = DD_RESULT.search(proc.stderr)
    if proc.returncode != 0 or not m:
        raise BenchError(f"dd of {path} failed ({proc.returncode}): {proc.stderr.decode(errors='replace').strip()}")
    if int(m.group(1)) != expect:
        raise BenchError(f"dd of {path} read {int(m.group(1))} bytes, expected {expect}")
    return max(float(m.group(2)), 1e-9)


def readers_wall(paths: Sequence[Path], parallel: bool, timeout: float) -> float:
    """Wall seconds to read ``paths`` with dd: all at once, or one after another."""
    env = dict(os.environ, LC_ALL="C")
    t0 = time.perf_counter()
    if parallel:
        procs = [
            subprocess.Popen(dd_command(path), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
            for path in paths
        ]
        try:
            for proc in procs:
                _, err = proc.communicate(timeout=max(1.0, timeout - (time.perf_counter() - t0)))
                if proc.returncode != 0:
                    raise BenchError(f"parallel dd failed: {err.decode(errors='replace').strip()}")
        except subprocess.TimeoutExpired:
            raise BenchError(f"parallel reads took more than {timeout:.0f} s") from None
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
    else:
        for path in paths:
            try:
                r = subprocess.run(dd_command(path), capture_output=True, env=env, timeout=timeout, check=False)
            except subprocess.TimeoutExpired:
                raise BenchError(f"dd of {path} took more than {timeout:.0f} s") from None
            if r.returncode != 0:
                raise BenchError(f"dd of {path} failed: {r.stderr.decode(errors='replace').strip()}")
    return time.perf_counter() - t0


_RANDOM_READER = r"""
import json, os, sys, time
path = sys.argv[1]
offsets = json.load(sys.stdin)
fd = os.open(path, os.O_RDONLY)
size = os.fstat(fd).st_size
pread, clock = os.pread, time.perf_counter_ns
out = []
for off in offsets:
    t = clock()
    data = pread(fd, 4096, off)
    out.append(clock() - t)
    if len(data) != min(4096, size - off):
        sys.exit(f"short read at {off}: {len(data)} bytes")
os.close(fd)
json.dump(out, sys.stdout)
"""


def random_reads(path: Path, offsets: Sequence[int]) -> list[float]:
    """Latency in µs of a 4 KiB pread at each offset (in a child process, one open file)."""
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _RANDOM_READER, str(path)],
            input=json.dumps(list(offsets)).encode(),
            capture_output=True,
            timeout=60 + 0.05 * len(offsets),
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise BenchError(f"random reads of {path} timed out") from None
    if proc.returncode != 0:
        raise BenchError(f"random reads of {path} failed: {proc.stderr.decode(errors='replace').strip()}")
    return [ns / 1000 for ns in json.loads(proc.stdout)]


def percentile(values: Sequence[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))]


def drop_file_pages(path: Path) -> None:
    """Drop one file's pages from the page cache (works through FUSE too)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def resident_percent(path: Path) -> float | None:
    """How much of ``path`` is in the page cache, in percent (util-linux ``fincore``; reads nothing)."""
    try:
        proc = subprocess.run(
            ["fincore", "--bytes", "--noheadings", "--raw", "--output", "RES,SIZE", str(path)],
            capture_output=True, timeout=30, check=True,
        )  # fmt: skip
        res, size = (int(x) for x in proc.stdout.split())
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    return 100.0 * res / size if size else 100.0


def files_equal(a: Path, b: Path) -> bool:
    return subprocess.run(["cmp", "-s", str(a), str(b)], check=False).returncode == 0


_PRIMER = r"""
import ctypes, mmap, sys, time
STEP = 32 << 20
held = []
for line in sys.stdin:
    cmd, *rest = line.split()
    t = time.perf_counter()
    touched = 0
    if cmd == "hold":
        while len(held) * STEP < int(rest[0]):
            m = mmap.mmap(-1, STEP)
            buf = (ctypes.c_char * STEP).from_buffer(m)
            ctypes.memset(buf, 1, STEP)
            del buf
            held.append(m)
            touched += STEP
    elif cmd == "release":
        for m in held:
            m.close()
        held.clear()
    print(f"ok {touched} {time.perf_counter() - t:.6f}", flush=True)
"""


class Primer:
    """Keeps touched memory in reserve and frees it right before a measurement.

    On these VMs, free memory is handed back to the host within seconds and
    touching it again is slow (0.2-0.3 GB/s, against 1.3 GB/s for memory freed
    a moment ago; the kernel allocates not-yet-returned pages first).  A
    measurement that needs a GiB of fresh pages (FUSE page cache, a daemon's
    heap, hf_xet's output on /dev/shm) would otherwise time the host.  The
    reserve is released just before a measurement and taken back right after
    it, which mostly recycles the pages the measurement itself just freed.
    """

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes
        self.refills: list[float] = []  # GB/s of each refill
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _PRIMER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
        )

    def _ask(self, line: str) -> tuple[int, float]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()
        reply = self.proc.stdout.readline().split()
        if len(reply) != 3 or reply[0] != b"ok":
            raise BenchError(f"the memory primer failed (exit status {self.proc.poll()})")
        return int(reply[1]), float(reply[2])

    def hold(self) -> None:
        touched, secs = self._ask(f"hold {self.nbytes}")
        if touched >= 256 * MiB:
            self.refills.append(touched / max(secs, 1e-9) / 1e9)

    def release(self) -> None:
        self._ask("release")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


# -- mounts --------------------------------------------------------------------------


@dataclass
class Daemon:
    """A FUSE daemon we started (xetfs --foreground, or the ceiling) and its mountpoint."""

    name: str
    proc: subprocess.Popen[bytes]
    mountpoint: Path
    log_path: Path
    other_logs: tuple[Path, ...] = ()
    read_ahead: int | None = None

    def dead(self) -> str | None:
        if self.proc.poll() is None:
            return None
        return f"{self.name} exited with status {self.proc.returncode}:\n{self.log_tail()}"

    def log_tail(self, lines: int = 30) -> str:
        text = ""
        for path in (*self.other_logs, self.log_path):
            with contextlib.suppress(OSError):
                text += path.read_text(errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def hwm(self) -> int | None:
        return tree_hwm(self.proc.pid)

    def stop(self) -> None:
        """SIGTERM and wait; then abort the connection and kill.  Never leaves the mount behind."""
        try:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(EXIT_DEADLINE)
                except subprocess.TimeoutExpired:
                    log(f"{self.name} did not exit on SIGTERM; aborting the mount")
                    force_unmount(self.mountpoint)
                    self.proc.kill()
                    self.proc.wait(EXIT_DEADLINE)
        finally:
            if is_mounted(self.mountpoint):
                force_unmount(self.mountpoint)
            if is_mounted(self.mountpoint):
                raise BenchError(f"{self.mountpoint} is still mounted after {self.name} stopped")


class Bench:
    def __init__(self, args: argparse.Namespace, tmp: Path) -> None:
        self.args = args
        self.tmp = tmp
        self.counter = 0
        self.daemon_logs: list[tuple[str, Path]] = []
        self.read_ahead_seen: dict[str, set[int | None]] = {"xetfs": set(), "ceiling": set()}

    def _new_dir(self, prefix: str) -> Path:
        self.counter += 1
        d = self.tmp / f"{prefix}{self.counter}"
        d.mkdir()
        return d

    def xetfs_mount_cmd(
        self, prefix: str, store: Path, *options: str, after: Sequence[str] = ()
    ) -> tuple[Path, Path, Path, list[str]]:
        """A fresh work directory, its mountpoint and log, and ``xetfs mount`` for them.

        The arguments are ``options``, then --mount-opt, then ``after`` (the last one given wins).
        """
        work = self._new_dir(prefix)
        mnt = work / "mnt"
        mnt.mkdir()
        log_path = work / "daemon.log"
        cmd = [sys.executable, "-m", "xetfs", "mount", str(store), str(mnt), "--log-file", str(log_path),
               *options, *self.args.mount_opt, *after]  # fmt: skip
        return work, mnt, log_path, cmd

    def _wait_ready(self, d: Daemon, probe: Path, reported: Callable[[], bool] | None = None) -> None:
        poll(lambda: is_mounted(d.mountpoint) and probe.exists(), READY_DEADLINE, f"{d.name} to answer", d.dead)
        if reported is not None:
            poll(reported, READY_DEADLINE, f"{d.name} to report ready", d.dead)
        # The daemon raises read-ahead right after FUSE INIT; make sure it is done before reading.
        want = self.args.read_ahead
        with contextlib.suppress(BenchError):
            poll(lambda: read_ahead_kb(d.mountpoint) == want, READ_AHEAD_DEADLINE, "read-ahead", d.dead)
        d.read_ahead = read_ahead_kb(d.mountpoint)

    @contextlib.contextmanager
    def xetfs(self, store: Path, *options: str) -> Iterator[Daemon]:
        """``xetfs mount --foreground`` in a child process (so its pid is known); always unmounted."""
        work, mnt, log_path, cmd = self.xetfs_mount_cmd(
            "xetfs",
            store,
            "--foreground",
            "--log-level",
            "warning",
            "--read-ahead",
            f"{self.args.read_ahead}K",
            after=options,
        )
        with open(work / "daemon.out", "wb") as out:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
        d = Daemon("xetfs daemon", proc, mnt, work / "daemon.out", (log_path,))
        self.daemon_logs += [(f"xetfs {' '.join(options)}", log_path), (f"xetfs {' '.join(options)}", d.log_path)]
        try:
            self._wait_ready(d, mnt / STATS)
            self.read_ahead_seen["xetfs"].add(d.read_ahead)
            yield d
        finally:
            d.stop()

    @contextlib.contextmanager
    def ceiling(self, files: Sequence[Path], *, direct_io: bool = False) -> Iterator[Daemon]:
        work = self._new_dir("ceiling")
        mnt = work / "mnt"
        mnt.mkdir()
        cmd = [sys.executable, str(CEILING), str(mnt), *map(str, files), "--read-ahead", str(self.args.read_ahead)]
        if direct_io:
            cmd.append("--direct-io")
        with open(work / "ceiling.out", "wb") as out:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
        d = Daemon("ceiling FS", proc, mnt, work / "ceiling.out")
        try:
            self._wait_ready(d, mnt / files[0].name, lambda: b"ready" in d.log_path.read_bytes())
            self.read_ahead_seen["ceiling"].add(d.read_ahead)
            yield d
        finally:
            d.stop()


# -- results -------------------------------------------------------------------------


@dataclass
class Target:
    op: str  # ">=" or "<="
    value: float | dict[str, float]  # per kind when a dict
    text: str

    def limit(self, kind: str) -> float | None:
        if isinstance(self.value, dict):
            return self.value.get(kind)
        return self.value

    def check(self, kind: str, x: float) -> bool | None:
        limit = self.limit(kind)
        if limit is None:
            return None
        return x >= limit if self.op == ">=" else x <= limit


@dataclass
class Row:
    key: str
    label: str
    unit: str  # "GB/s", "x", "us", "s", "MiB"
    target: Target | None = None
    cells: dict[str, list[float]] = field(default_factory=dict)  # kind (or "") -> per-round values
    notes: list[str] = field(default_factory=list)


class Results:
    """Per-round samples: ``add(key, kind, round, value)``; rows and ratios are derived at the end."""

    def __init__(self) -> None:
        self.samples: dict[tuple[str, str], dict[int, float]] = {}
        self.errors: list[str] = []
        self.extra: dict[str, Any] = {}

    def add(self, key: str, kind: str, rnd: int, value: float | None) -> None:
        if rnd < 0 or value is None:
            return  # warm-up round
        self.samples.setdefault((key, kind), {})[rnd] = value

    def values(self, key: str, kind: str) -> list[float]:
        d = self.samples.get((key, kind), {})
        return [d[r] for r in sorted(d)]

    def ratio(self, num: str, den: str, kind: str, den_kind: str | None = None) -> list[float]:
        a = self.samples.get((num, kind), {})
        b = self.samples.get((den, den_kind or kind), {})
        return [a[r] / b[r] for r in sorted(a) if r in b and b[r] > 0]


# -- the measurements -----------------------------------------------------------------


class Runner:
    def __init__(self, args: argparse.Namespace, bench: Bench, results: Results, datasets: dict[str, Dataset]) -> None:
        self.args = args
        self.bench = bench
        self.r = results
        self.datasets = datasets
        self.sections = set(args.only)
        self.verified: dict[str, bool] = {}
        self.rng = random.Random(args.seed)
        self.primer: Primer | None = None

    @contextlib.contextmanager
    def primed(self, *, now: bool = True) -> Iterator[Callable[[], None]]:
        """Free the memory reserve for a measurement, and take it back when the block ends.

        With ``now=False`` the block calls the function it gets as late as
        possible (after mounting, right before reading): freed pages stay
        fast to touch for only a couple of seconds.
        """
        primer = self.primer
        released = False

        def release() -> None:
            nonlocal released
            if primer is not None and not released:
                primer.release()
                released = True

        if now:
            release()
        try:
            yield release
        finally:
            if primer is not None and released:
                primer.hold()

    def timeout_for(self, nbytes: int) -> float:
        return 120 + nbytes / 10e6  # never slower than 10 MB/s

    def direct_cache_size(self, ds: Dataset) -> int:
        need = int(ds.main.size * 1.125) + 64 * MiB
        return -(-need // MiB) * MiB

    # Each task measures one configuration for one kind, for round ``rnd`` (-1: warm-up).

    def tasks(self) -> list[tuple[str, str, Callable[[Dataset, int], None]]]:
        s = self.sections
        per_kind: list[tuple[str, Callable[[Dataset, int], None]]] = []
        if "plain" in s:
            per_kind.append(("plain", self.t_plain))
        if "peer" in s:
            per_kind.append(("peer", self.t_peer))
        if s & {"ceiling", "parallel"}:
            per_kind.append(("ceiling", self.t_ceiling))
        if s & {"random", "warm", "ceiling"}:
            per_kind.append(("ceiling-direct", self.t_ceiling_direct))
        if s & {"cold", "warm"}:
            per_kind.append(("xetfs", self.t_xetfs_seq))
        if s & {"random", "warm"}:
            per_kind.append(("xetfs-direct", self.t_xetfs_direct))
        if "parallel" in s:
            per_kind.append(("xetfs-parallel", self.t_xetfs_parallel))
        out = [(name, kind, fn) for kind in self.datasets for name, fn in per_kind]
        if "mount" in s:
            out.append(("mount", "", lambda _ds, rnd: self.t_mount(rnd)))
        return out

    def run(self) -> None:
        tasks = self.tasks()
        rounds = list(range(-self.args.warmup, self.args.repeat))
        for rnd in rounds:
            shift = (rnd % len(tasks)) if tasks else 0
            order = tasks[shift:] + tasks[:shift]
            if rnd >= 0 and rnd % 2:
                order.reverse()  # alternate direction as well as rotating
            what = "warm-up round" if rnd < 0 else f"round {rnd + 1}/{self.args.repeat}"
            log(f"{what}: {len(order)} measurements")
            for name, kind, fn in order:
                ds = self.datasets.get(kind)
                t0 = time.monotonic()
                try:
                    fn(ds, rnd)  # type: ignore[arg-type]
                except BenchError as exc:
                    msg = f"{what}, {name} {kind}: {exc}"
                    log("ERROR " + msg)
                    self.r.errors.append(msg)
                except Exception as exc:
                    msg = f"{what}, {name} {kind}: unexpected {type(exc).__name__}: {exc}"
                    log("ERROR " + msg + "\n" + traceback.format_exc())
                    self.r.errors.append(msg)
                if self.args.verbose:
                    log(f"  {name} {kind}: {time.monotonic() - t0:.1f} s")

    def gbps(self, nbytes: int, seconds: float) -> float:
        return nbytes / seconds / 1e9

    # -- plain file, peer ------------------------------------------------------------

    def t_plain(self, ds: Dataset, rnd: int) -> None:
        cat_to_null([ds.main.path])
        with self.primed():
            secs = dd(ds.main.path, ds.main.size, self.timeout_for(ds.main.size))
        self.r.add("plain", ds.kind, rnd, self.gbps(ds.main.size, secs))

    def t_peer(self, ds: Dataset, rnd: int) -> None:
        cat_to_null(ds.xorbs)
        work = self.bench._new_dir("peer")
        out = Path(self.args.peer_out_dir) / f"xetfs-bench-{os.getpid()}-{ds.kind}.out"
        with self.primed():
            self._peer(ds, rnd, work, out)

    def _peer(self, ds: Dataset, rnd: int, work: Path, out: Path) -> None:
        peer_store = work / "store"
        try:
            # hf_xet opens its redb index for writing: give it a private copy, with the
            # xorbs and shards hard-linked (same files, same page cache).
            subprocess.run(["cp", "-al", str(ds.store), str(peer_store)], check=True)
            redb = peer_store / "xet" / "xorbs" / "global_dedup_lookup.redb"
            if not redb.exists():
                raise BenchError(f"{ds.store} has no hf_xet redb index; hf_xet cannot read it")
            redb.unlink()
            shutil.copyfile(ds.store / "xet" / "xorbs" / redb.name, redb)
            job = {"hash": ds.main.hash, "size": ds.main.size, "endpoint": f"local://{peer_store}", "out": str(out)}
            env = bench_data.hf_xet_env(work / "hf_xet-cache")
            try:
                proc = subprocess.run(
                    [sys.executable, "-c", _PEER],
                    input=json.dumps(job).encode(),
                    env=env,
                    capture_output=True,
                    timeout=self.timeout_for(ds.main.size),
                    check=False,
                )
            except subprocess.TimeoutExpired:
                raise BenchError("hf_xet download timed out") from None
            if proc.returncode != 0:
                raise BenchError(f"hf_xet download failed ({proc.returncode}): {proc.stderr.decode(errors='replace')}")
            res = json.loads(proc.stdout)
            if res["size"] != ds.main.size:
                raise BenchError(f"hf_xet wrote {res['size']} bytes, expected {ds.main.size}")
            if f"peer-{ds.kind}" not in self.verified:
                self.verified[f"peer-{ds.kind}"] = files_equal(out, ds.main.path)
            self.r.add("peer", ds.kind, rnd, self.gbps(ds.main.size, res["seconds"]))
            self.r.add("peer_rss", ds.kind, rnd, res["maxrss"] / MiB)
            self.r.add("peer_cpu", ds.kind, rnd, res["cpu"])
        finally:
            with contextlib.suppress(FileNotFoundError):
                out.unlink()
            shutil.rmtree(work, ignore_errors=True)

    # -- the ceiling ---------------------------------------------------------------------

    def t_ceiling(self, ds: Dataset, rnd: int) -> None:
        par = "parallel" in self.sections
        files = [ds.main.path] + ([f.path for f in ds.parallel] if par else [])
        cat_to_null(files)  # the ceiling maps these; they must be in the page cache
        with self.primed(now=False) as go, self.bench.ceiling(files) as c:
            go()
            main = c.mountpoint / ds.main.path.name
            if "ceiling" in self.sections:
                t1 = dd(main, ds.main.size, self.timeout_for(ds.main.size))
                self.r.add("ceiling", ds.kind, rnd, self.gbps(ds.main.size, t1))
                self.r.add("ceiling_resident", ds.kind, rnd, resident_percent(main))
                for key in ("ceiling_pc", "ceiling_pc2"):
                    t2 = dd(main, ds.main.size, self.timeout_for(ds.main.size))
                    self.r.add(key, ds.kind, rnd, self.gbps(ds.main.size, t2))
                if f"ceiling-{ds.kind}" not in self.verified:
                    self.verified[f"ceiling-{ds.kind}"] = files_equal(main, ds.main.path)
            if par:
                paths = [c.mountpoint / f.path.name for f in ds.parallel]
                total = sum(f.size for f in ds.parallel)
                for parallel in (False, True) if rnd % 2 == 0 else (True, False):
                    for p in paths:
                        drop_file_pages(p)
                    secs = readers_wall(paths, parallel, self.timeout_for(total))
                    self.r.add("ceiling_par4" if parallel else "ceiling_par1", ds.kind, rnd, self.gbps(total, secs))

    def t_ceiling_direct(self, ds: Dataset, rnd: int) -> None:
        cat_to_null([ds.main.path])
        with self.primed(now=False) as go, self.bench.ceiling([ds.main.path], direct_io=True) as c:
            go()
            path = c.mountpoint / ds.main.path.name
            if self.sections & {"warm", "ceiling"}:
                secs = dd(path, ds.main.size, self.timeout_for(ds.main.size))
                self.r.add("ceiling_direct", ds.kind, rnd, self.gbps(ds.main.size, secs))
            if "random" in self.sections:
                lat = random_reads(path, self.uniform_offsets(ds))
                self.r.add("ceiling_rand_p50", ds.kind, rnd, percentile(lat, 50))
                self.r.add("ceiling_rand_p99", ds.kind, rnd, percentile(lat, 99))

    # -- xetfs -------------------------------------------------------------------------

    def t_xetfs_seq(self, ds: Dataset, rnd: int) -> None:
        cat_to_null(ds.xorbs)
        with self.primed(now=False) as go, self.bench.xetfs(ds.store) as x:
            go()
            path = x.mountpoint / ds.main.hash
            t1 = dd(path, ds.main.size, self.timeout_for(ds.main.size))
            self.r.add("cold", ds.kind, rnd, self.gbps(ds.main.size, t1))
            if "warm" in self.sections:
                # What the kernel still holds decides how much of the re-read is served from memory.
                self.r.add("warm_resident", ds.kind, rnd, resident_percent(path))
                for key in ("warm_pc", "warm_pc2"):
                    t2 = dd(path, ds.main.size, self.timeout_for(ds.main.size))
                    self.r.add(key, ds.kind, rnd, self.gbps(ds.main.size, t2))
            if f"xetfs-{ds.kind}" not in self.verified:
                self.verified[f"xetfs-{ds.kind}"] = files_equal(path, ds.main.path)
            self.r.add("rss_seq", ds.kind, rnd, (x.hwm() or 0) / MiB)

    def uniform_offsets(self, ds: Dataset) -> list[int]:
        pages = max(1, ds.main.size // 4096)
        return [self.rng.randrange(pages) * 4096 for _ in range(self.args.random_reads)]

    def distinct_chunk_offsets(self, ds: Dataset) -> list[int]:
        """4 KiB-aligned offsets no two of which can touch the same chunk (chunks are <= 128 KiB).

        Offset i lies in the first 124 KiB of its own 256 KiB slot, so two reads
        are always more than 128 KiB apart.
        """
        slots = list(range(ds.main.size // (256 * 1024)))
        self.rng.shuffle(slots)
        return [s * 256 * 1024 + self.rng.randrange(31) * 4096 for s in slots[: self.args.random_reads]]

    def t_xetfs_direct(self, ds: Dataset, rnd: int) -> None:
        cat_to_null(ds.xorbs)
        cache = self.direct_cache_size(ds)
        self.r.extra["direct_cache_bytes"] = cache
        with self.primed(now=False) as go, self.bench.xetfs(ds.store, "--direct-io", "--cache-size", str(cache)) as x:
            go()
            path = x.mountpoint / ds.main.hash
            if "random" in self.sections:
                lat = random_reads(path, self.distinct_chunk_offsets(ds))
                self.r.add("rand_cold_p50", ds.kind, rnd, percentile(lat, 50))
                self.r.add("rand_cold_p99", ds.kind, rnd, percentile(lat, 99))
            dd(path, ds.main.size, self.timeout_for(ds.main.size))  # fills the chunk cache
            if "warm" in self.sections:
                secs = dd(path, ds.main.size, self.timeout_for(ds.main.size))
                self.r.add("warm_cc", ds.kind, rnd, self.gbps(ds.main.size, secs))
            if "random" in self.sections:
                lat = random_reads(path, self.uniform_offsets(ds))
                self.r.add("rand_warm_p50", ds.kind, rnd, percentile(lat, 50))
                self.r.add("rand_warm_p99", ds.kind, rnd, percentile(lat, 99))
            self.r.add("rss_direct", ds.kind, rnd, (x.hwm() or 0) / MiB)

    def t_xetfs_parallel(self, ds: Dataset, rnd: int) -> None:
        total = sum(f.size for f in ds.parallel)
        for parallel in (False, True) if rnd % 2 == 0 else (True, False):
            cat_to_null(ds.xorbs)
            with self.primed(now=False) as go, self.bench.xetfs(ds.store) as x:
                go()
                paths = [x.mountpoint / f.hash for f in ds.parallel]
                secs = readers_wall(paths, parallel, self.timeout_for(total))
                key = "par4" if parallel else "par1"
                self.r.add(key, ds.kind, rnd, self.gbps(total, secs))
                self.r.add(f"rss_{key}", ds.kind, rnd, (x.hwm() or 0) / MiB)

    # -- mount time ----------------------------------------------------------------------

    def t_mount(self, rnd: int) -> None:
        stores = self.r.extra["mount_stores"]
        order = list(stores.items()) if rnd % 2 == 0 else list(reversed(stores.items()))
        for key, store in order:
            with self.primed():
                secs, rss = self.time_mount(Path(store))
            self.r.add(f"mount_{key}", "", rnd, secs)
            self.r.add(f"mount_rss_{key}", "", rnd, rss / MiB if rss else None)

    def time_mount(self, store: Path) -> tuple[float, int | None]:
        """`xetfs mount STORE MNT` as a user runs it: seconds until it returns and the mount answers."""
        _, mnt, log_path, cmd = self.bench.xetfs_mount_cmd("mount", store)
        self.bench.daemon_logs.append(("xetfs mount (background)", log_path))
        pid = None
        try:
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, timeout=READY_DEADLINE * 3, check=False, cwd=REPO)
            if proc.returncode != 0:
                raise BenchError(f"xetfs mount failed ({proc.returncode}): {proc.stderr.decode(errors='replace')}")
            (mnt / STATS).stat()
            secs = time.perf_counter() - t0
            pid = find_daemon(mnt)
            rss = tree_hwm(pid) if pid else None
            return secs, rss
        except subprocess.TimeoutExpired:
            raise BenchError("xetfs mount did not return") from None
        finally:
            if is_mounted(mnt):
                subprocess.run([sys.executable, "-m", "xetfs", "umount", str(mnt)], capture_output=True, check=False)
            if pid is not None:
                with contextlib.suppress(BenchError):
                    poll(lambda: not Path(f"/proc/{pid}").exists() or _zombie(pid), EXIT_DEADLINE, "the daemon to exit")
                if Path(f"/proc/{pid}").exists() and not _zombie(pid):
                    log(f"xetfs daemon {pid} did not exit after umount; killing it")
                    force_unmount(mnt)
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
            if is_mounted(mnt):
                force_unmount(mnt)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")
    except (OSError, IndexError):
        return True


def find_daemon(mnt: Path) -> int | None:
    """The pid of the xetfs daemon serving ``mnt`` (its command line names the mountpoint)."""
    target = str(mnt.resolve()).encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            args = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if target in args and b"--foreground" in args and b"mount" in args:
            return int(entry)
    return None


_PEER = r"""
import json, os, resource, sys, time
import hf_xet
job = json.load(sys.stdin)
info = hf_xet.PyXetDownloadInfo(job["out"], job["hash"], job["size"])
r0 = resource.getrusage(resource.RUSAGE_SELF)
t0 = time.perf_counter()
hf_xet.download_files([info], job["endpoint"], None, None, None)
secs = time.perf_counter() - t0
r1 = resource.getrusage(resource.RUSAGE_SELF)
cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
# VmHWM, not ru_maxrss: the latter inherits the parent's peak across a vfork + exec.
hwm = next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmHWM:"))
json.dump({"seconds": secs, "size": os.path.getsize(job["out"]), "maxrss": hwm, "cpu": cpu}, sys.stdout)
"""


# -- report --------------------------------------------------------------------------


KIND_LABEL = {"random": "random (raw)", "text": "text (LZ4)", "float32": "float32 (BG4)"}


def build_rows(r: Results, kinds: list[str], args: argparse.Namespace) -> list[tuple[str, list[Row]]]:
    def row(
        key: str,
        label: str,
        unit: str,
        target: Target | None = None,
        ratio: tuple[str, str] | None = None,
        kind_list: Sequence[str] | None = None,
    ) -> Row:
        rw = Row(key, label, unit, target)
        for k in kind_list if kind_list is not None else kinds:
            vals = r.ratio(*ratio, k) if ratio else r.values(key, k)
            if vals:
                rw.cells[k] = vals
        return rw

    sections: list[tuple[str, list[Row]]] = []
    seq = [
        row("plain", "plain file, page cache (dd)", "GB/s"),
        row("peer", "hf_xet download_files -> /dev/shm", "GB/s"),
        row("ceiling", "ceiling FS, first read", "GB/s"),
        row("ceiling_pc", "ceiling FS, page-cache re-read", "GB/s"),
        row("ceiling_pc2", "ceiling FS, second re-read", "GB/s"),
        row("ceiling_direct", "ceiling FS, --direct-io", "GB/s"),
        row("cold", "xetfs cold (fresh mount)", "GB/s"),
        row("warm_pc", "xetfs warm, page-cache re-read", "GB/s"),
        row("warm_pc2", "xetfs warm, second re-read", "GB/s"),
        row("warm_cc", "xetfs warm, chunk cache (--direct-io)", "GB/s"),
    ]
    sections.append(("Sequential read, GB/s (dd bs=1M of the whole file)", seq))
    ratios = [
        row("r_peer", "xetfs cold / hf_xet", "x", Target(">=", 2.5, ">= 2.5x"), ("cold", "peer")),
        row(
            "r_ceiling",
            "xetfs cold / ceiling first read",
            "x",
            Target(">=", {"random": 0.7, "text": 0.5, "float32": 0.5}, ">= 0.7 raw, 0.5"),
            ("cold", "ceiling"),
        ),
        row("r_warm", "xetfs page-cache re-read / plain", "x", Target(">=", 0.8, ">= 0.8x"), ("warm_pc", "plain")),
        row("r_cc", "xetfs chunk cache / ceiling, both direct-io", "x", None, ("warm_cc", "ceiling_direct")),
        row("r_ceiling_pc", "(ref) ceiling page-cache re-read / plain", "x", None, ("ceiling_pc", "plain")),
        row("r_warm2", "(ref) xetfs second re-read / plain", "x", None, ("warm_pc2", "plain")),
        row("r_ceiling_pc2", "(ref) ceiling second re-read / plain", "x", None, ("ceiling_pc2", "plain")),
    ]
    sections.append(("Ratios (per round, then median)", ratios))
    held = [
        row("warm_resident", "xetfs file, after the cold read", "%"),
        row("ceiling_resident", "ceiling file, after the first read", "%"),
    ]
    sections.append(("Page cache holding the file right before the re-read, % (fincore)", held))
    rand = [
        row("rand_cold_p50", "xetfs chunk not cached, p50", "us", Target("<=", 400, "<= 400 us")),
        row("rand_cold_p99", "xetfs chunk not cached, p99", "us"),
        row("rand_warm_p50", "xetfs chunk cached, p50", "us", Target("<=", 150, "<= 150 us")),
        row("rand_warm_p99", "xetfs chunk cached, p99", "us"),
        row("ceiling_rand_p50", "ceiling FS (direct_io), p50", "us"),
        row("ceiling_rand_p99", "ceiling FS (direct_io), p99", "us"),
    ]
    sections.append((f"Random 4 KiB pread latency, us ({args.random_reads} reads per round, --direct-io)", rand))
    par = [
        row("par1", "xetfs cold, 1 reader (4 files in turn)", "GB/s"),
        row("par4", "xetfs cold, 4 readers at once", "GB/s"),
        row("r_par", "xetfs 4 readers / 1 reader", "x", Target(">=", 1.5, ">= 1.5x"), ("par4", "par1")),
        row("ceiling_par1", "ceiling, 1 reader", "GB/s"),
        row("ceiling_par4", "ceiling, 4 readers", "GB/s"),
        row("r_ceiling_par", "ceiling 4 readers / 1 reader", "x", None, ("ceiling_par4", "ceiling_par1")),
    ]
    sections.append(("Parallel readers, aggregate GB/s (4 files of size/4)", par))
    mount_rows = []
    info = r.extra.get("mount_info", {})
    for key, limit in (("files", 1.0), ("terms", 5.0)):
        if key in info:
            mount_rows.append(
                row(
                    f"mount_{key}",
                    f"xetfs mount, {info[key]}",
                    "s",
                    Target("<=", limit, f"<= {limit:g} s"),
                    kind_list=[""],
                )
            )
    sections.append(("Mount time, s (`xetfs mount` in background mode until it returns and answers)", mount_rows))
    cache_default = r.extra.get("default_cache_bytes", 512 * MiB)
    cache_direct = r.extra.get("direct_cache_bytes", 0)
    rss_lim = (RSS_ALLOWANCE + cache_default) / MiB
    mem = [
        row(
            "rss_seq",
            f"cold + re-read mount (cache {human(cache_default)})",
            "MiB",
            Target("<=", rss_lim, f"<= {rss_lim:.0f} MiB"),
        ),
        row(
            "rss_direct",
            f"--direct-io mount (cache {human(cache_direct)})",
            "MiB",
            Target("<=", (RSS_ALLOWANCE + cache_direct) / MiB, f"<= {(RSS_ALLOWANCE + cache_direct) / MiB:.0f} MiB"),
        ),
        row("rss_par1", "parallel mount, 1 reader", "MiB", Target("<=", rss_lim, f"<= {rss_lim:.0f} MiB")),
        row("rss_par4", "parallel mount, 4 readers", "MiB", Target("<=", rss_lim, f"<= {rss_lim:.0f} MiB")),
    ]
    for key in ("files", "terms"):
        if key in info:
            mem.append(
                row(
                    f"mount_rss_{key}",
                    f"after mount, {info[key]}",
                    "MiB",
                    Target("<=", rss_lim, f"<= {rss_lim:.0f} MiB"),
                    kind_list=[""],
                )
            )
    mem.append(row("peer_rss", "hf_xet download process (reference)", "MiB"))
    sections.append(
        ("Peak RSS (VmHWM) of the xetfs daemon plus its decode workers, MiB (target: 100 MiB + cache capacity)", mem)
    )
    return [(title, [rw for rw in rows if rw.cells]) for title, rows in sections]


def fmt_value(x: float, unit: str) -> str:
    if unit == "x":
        return f"{x:.2f}x"
    if unit == "us":
        return f"{x:.0f}"
    if unit == "MiB":
        return f"{x:.0f}"
    if unit == "s":
        return f"{x:.2f}"
    return f"{x:.2f}" if x < 10 else f"{x:.1f}"


def summarize(vals: list[float]) -> tuple[float, float, float]:
    return statistics.median(vals), min(vals), max(vals)


def cell_text(rw: Row, kind: str) -> tuple[str, bool | None]:
    vals = rw.cells.get(kind)
    if not vals:
        return "-", None
    med, lo, hi = summarize(vals)
    text = f"{fmt_value(med, rw.unit)} [{fmt_value(lo, rw.unit)}-{fmt_value(hi, rw.unit)}]"
    ok = rw.target.check(kind, med) if rw.target else None
    if ok is not None:
        text += " PASS" if ok else " MISS"
    return text, ok


def render(sections: list[tuple[str, list[Row]]], kinds: list[str], header: list[str]) -> str:
    lines = list(header)
    label_w = 4 + max((len(rw.label) for _, rows in sections for rw in rows), default=30)
    width = 14
    for _, rows in sections:
        for rw in rows:
            for k in [*kinds, ""]:
                t, _ = cell_text(rw, k)
                width = max(width, len(t))
    for title, rows in sections:
        if not rows:
            continue
        lines.append("")
        lines.append(title)
        per_kind = any(set(rw.cells) - {""} for rw in rows)
        if per_kind:
            lines.append(" " * label_w + "".join(f"{KIND_LABEL.get(k, k):<{width + 2}}" for k in kinds) + "target")
        for rw in rows:
            target = rw.target.text if rw.target else ""
            if "" in rw.cells:
                lines.append(f"  {rw.label:<{label_w - 2}}{cell_text(rw, '')[0]:<{width + 2}}{target}")
            else:
                body = "".join(f"{cell_text(rw, k)[0]:<{width + 2}}" for k in kinds)
                lines.append(f"  {rw.label:<{label_w - 2}}{body}{target}")
    return "\n".join(lines)


def to_json(sections: list[tuple[str, list[Row]]], meta: dict[str, Any], errors: list[str]) -> dict[str, Any]:
    rows = []
    for title, rs in sections:
        for rw in rs:
            for kind, vals in rw.cells.items():
                med, lo, hi = summarize(vals)
                rows.append(
                    {
                        "section": title,
                        "key": rw.key,
                        "label": rw.label,
                        "kind": kind or None,
                        "unit": rw.unit,
                        "values": vals,
                        "median": med,
                        "min": lo,
                        "max": hi,
                        "target": (
                            f"{rw.target.op} {rw.target.limit(kind)}"
                            if rw.target and rw.target.limit(kind) is not None
                            else None
                        ),
                        "pass": rw.target.check(kind, med) if rw.target else None,
                    }
                )
    return {"meta": meta, "rows": rows, "errors": errors}


# -- main ----------------------------------------------------------------------------


def git_describe() -> str:
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "xetfs"], capture_output=True, text=True, cwd=REPO, check=True
        ).stdout.strip()
        return head + (" (xetfs/ modified)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def environment_notes() -> list[str]:
    """Machine settings that change what a benchmark sees (reported, never changed)."""
    notes = []
    for ctx in sorted(Path("/sys/kernel/mm/damon/admin/kdamonds").glob("*/contexts/*")):
        try:
            if (ctx.parent.parent / "state").read_text().strip() != "on":
                continue
            aggr_us = int((ctx / "monitoring_attrs/intervals/aggr_us").read_text())
            for scheme in sorted(ctx.glob("schemes/*")):
                action = (scheme / "action").read_text().strip()
                min_age = int((scheme / "access_pattern/age/min").read_text())
                if action == "pageout":
                    notes.append(
                        f"DAMON pageout is on: memory idle for ~{min_age * aggr_us / 1e6:.0f} s is reclaimed, "
                        "so every input is read into the page cache right before it is measured"
                    )
        except (OSError, ValueError):
            continue
    return notes


def preflight() -> None:
    problems = []
    if os.geteuid() != 0:
        problems.append("run as root (mounts, and read-ahead via /sys/class/bdi)")
    if not os.path.exists("/dev/fuse"):
        problems.append("/dev/fuse is missing (install fuse3)")
    for tool in ("dd", "cat", "cmp", "cp"):
        if shutil.which(tool) is None:
            problems.append(f"{tool} not found")
    for mod in ("hf_xet", "pyfuse3", "numpy", "xetfs"):
        try:
            __import__(mod)
        except ImportError as exc:
            problems.append(f"python module {mod}: {exc} (use the project venv: .venv/bin/python)")
    if problems:
        sys.exit("bench.py: cannot run:\n  " + "\n  ".join(problems))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n")[0],
        epilog="sections: " + ", ".join(SECTIONS),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="~1 minute: 64 MiB, 3 rounds, no warm-up, 100k-term synthetic store, fewer random reads",
    )
    p.add_argument("--size", type=parse_size, help="main file size per kind (default 1G; quick 64M)")
    p.add_argument("--repeat", type=int, help="recorded rounds (default 5; quick 3)")
    p.add_argument("--warmup", type=int, help="unrecorded warm-up rounds (default 1; quick 0)")
    p.add_argument("--kinds", default=",".join(KINDS), help=f"data kinds (default {','.join(KINDS)})")
    p.add_argument("--only", default=",".join(SECTIONS), help="sections to run, comma-separated (default all)")
    p.add_argument(
        "--data-dir",
        type=Path,
        default=Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "xetfs-bench",
        help="where data sets and synthetic stores are kept (default ~/.cache/xetfs-bench)",
    )
    p.add_argument("--mount-files", type=int, default=10_000, help="files in the mount-time store (default 10000)")
    p.add_argument("--mount-shards", type=int, default=100, help="shards in that store (default 100)")
    p.add_argument("--mount-terms", type=int, help="terms in the second mount-time store (default 1M; quick 100k)")
    p.add_argument("--random-reads", type=int, help="4 KiB reads per random-read measurement (default 2000; quick 500)")
    p.add_argument(
        "--read-ahead", type=int, default=1024, metavar="KB", help="read-ahead for xetfs and the ceiling (default 1024)"
    )
    p.add_argument(
        "--mount-opt",
        action="append",
        default=[],
        metavar="ARG",
        help="extra argument for every `xetfs mount` (repeatable), e.g. --mount-opt=--no-prefetch",
    )
    p.add_argument("--peer-out-dir", default="/dev/shm", help="where hf_xet writes its output (default /dev/shm)")
    p.add_argument(
        "--json",
        nargs="?",
        const="-",
        metavar="PATH",
        help="also write the results as JSON to PATH ('-' or no PATH: JSON on stdout, table on stderr)",
    )
    p.add_argument("--seed", type=int, default=1, help="seed for the random offsets and order")
    p.add_argument(
        "--no-primer",
        dest="primer",
        action="store_false",
        help="do not keep a reserve of touched memory to free before each measurement",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="time every measurement")
    args = p.parse_args(argv)
    args.size = args.size or (64 * MiB if args.quick else GiB)
    args.repeat = args.repeat if args.repeat is not None else (3 if args.quick else 5)
    args.warmup = args.warmup if args.warmup is not None else (0 if args.quick else 1)
    args.mount_terms = args.mount_terms or (100_000 if args.quick else 1_000_000)
    args.random_reads = args.random_reads or (500 if args.quick else 2000)
    args.kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    args.only = [s.strip() for s in args.only.split(",") if s.strip()]
    bad = [k for k in args.kinds if k not in KINDS] + [s for s in args.only if s not in SECTIONS]
    if bad:
        p.error(f"unknown kind/section: {', '.join(bad)} (kinds: {', '.join(KINDS)}; sections: {', '.join(SECTIONS)})")
    if args.repeat < 1 or args.warmup < 0:
        p.error("--repeat must be >= 1 and --warmup >= 0")
    if args.size < 4 * MiB:
        p.error("--size must be at least 4M")
    args.size -= args.size % 4096
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    preflight()

    started = time.time()
    args.data_dir.mkdir(parents=True, exist_ok=True)
    per_kind = {"plain", "peer", "ceiling", "cold", "warm", "random", "parallel"} & set(args.only)
    datasets: dict[str, Dataset] = {}
    if per_kind:
        for kind in args.kinds:
            datasets[kind] = bench_data.dataset(args.data_dir, kind, args.size)
        need = sum(ds.original_bytes + ds.stored_bytes for ds in datasets.values())
        avail = proc_meminfo("MemAvailable")
        if avail and need > 0.8 * avail:
            log(
                f"warning: the data ({human(need)}) may not fit in the page cache ({human(avail)} available); "
                "results will include disk reads"
            )
        for ds in datasets.values():
            if not ds.scheme_ok:
                log(
                    f"warning: {ds.kind}: hf_xet stored chunks as {ds.scheme_summary()}, "
                    f"not mostly {bench_data.SCHEME_NAMES[bench_data.EXPECTED_SCHEME[ds.kind]]}"
                )
            cat_to_null([ds.main.path, *(f.path for f in ds.parallel), *ds.xorbs])
    results = Results()
    results.extra["default_cache_bytes"] = 512 * MiB
    if "mount" in args.only:
        files_store, files_meta = bench_data.synthetic_files(args.data_dir, args.mount_files, args.mount_shards)
        terms_store, terms_meta = bench_data.synthetic_terms(args.data_dir, args.mount_terms)
        results.extra["mount_stores"] = {"files": str(files_store), "terms": str(terms_store)}
        results.extra["mount_info"] = {
            "files": f"{files_meta['files']:,} files / {files_meta['shards']} shards",
            "terms": f"{terms_meta['terms']:,} terms ({terms_meta['files']} files, {terms_meta['shards']} shards)",
        }
        results.extra["mount_meta"] = {"files": files_meta, "terms": terms_meta}

    tmp = Path(tempfile.mkdtemp(prefix="xetfs-bench-"))
    bench = Bench(args, tmp)
    runner = Runner(args, bench, results, datasets)
    interrupted = False
    try:
        if args.primer:
            reserve = 2 * args.size + min(args.size, 512 * MiB) + 256 * MiB
            avail = proc_meminfo("MemAvailable") or 0
            reserve = min(reserve, int(0.4 * avail)) if avail else reserve
            log(f"taking a {human(reserve)} memory reserve (see --no-primer)")
            runner.primer = Primer(reserve)
            runner.primer.hold()
            runner.primer.refills.clear()  # the first fill is not a refill
        runner.run()
    except KeyboardInterrupt:
        interrupted = True
        log("interrupted: reporting what was measured")
    finally:
        if runner.primer is not None:
            runner.primer.close()
        leftovers = [p for p in tmp.glob("*/mnt") if is_mounted(p)]
        for p in leftovers:
            force_unmount(p)
        daemon_problems = scan_logs(bench.daemon_logs)
        if not [p for p in tmp.glob("*/mnt") if is_mounted(p)]:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            log(f"warning: mounts left under {tmp}")

    elapsed = time.time() - started
    kinds = list(datasets) or args.kinds
    sections = build_rows(results, kinds, args)
    header = [
        f"xetfs benchmark: {human(args.size)} per kind, {args.repeat} rounds (+{args.warmup} warm-up), "
        f"interleaved; each cell: median [min-max] over rounds" + ("  (--quick)" if args.quick else ""),
        f"machine: {os.cpu_count()} cores, Linux {platform.release()}, Python {platform.python_version()}, "
        f"hf_xet {package_version('hf_xet')}, xetfs commit {git_describe()}; run took {elapsed:.0f} s",
        f"read-ahead (KiB) seen on mounts: xetfs {sorted_ra(bench.read_ahead_seen['xetfs'])}, "
        f"ceiling {sorted_ra(bench.read_ahead_seen['ceiling'])} (asked for {args.read_ahead})",
    ]
    header += [f"note: {n}" for n in environment_notes()]
    if runner.primer is not None:
        refills = runner.primer.refills
        spread = f"; refills {fmt_value(statistics.median(refills), 'GB/s')} GB/s median" if refills else ""
        header.append(
            f"memory primer: a {human(runner.primer.nbytes)} reserve of touched memory is freed right before each "
            f"measurement and taken back after it{spread}"
        )
    else:
        header.append("memory primer: off (fresh memory may be slow to touch on this machine)")
    if args.mount_opt:
        header.append(f"extra xetfs mount arguments: {' '.join(args.mount_opt)}")
    for ds in datasets.values():
        header.append(
            f"data {ds.kind:<8} main {human(ds.main.size)}, stored/original {ds.stored_bytes / ds.original_bytes:.2f}, "
            f"chunks {ds.scheme_summary()}" + ("" if ds.scheme_ok else "  (UNEXPECTED SCHEME)")
        )
    if args.quick and "mount" in args.only:
        header.append(f"quick mode: the terms store has {args.mount_terms:,} terms, not 1,000,000")
    bad_verify = [k for k, ok in runner.verified.items() if not ok]
    header.append(
        "content check (cmp with the original, once per reader and kind): "
        + (f"MISMATCH in {', '.join(bad_verify)}" if bad_verify else f"ok ({len(runner.verified)} checked)")
    )
    footer = []
    if results.errors:
        footer += ["", "Errors:"] + [f"  {e}" for e in results.errors]
    if daemon_problems:
        footer += ["", "Daemon logs with errors or warnings:"] + [f"  {p}" for p in daemon_problems[:20]]
    if interrupted:
        footer += ["", "INTERRUPTED: partial results"]
    table = render(sections, kinds, header) + "\n".join(["", *footer] if footer else [])
    meta = {
        "size": args.size,
        "repeat": args.repeat,
        "warmup": args.warmup,
        "quick": args.quick,
        "kinds": kinds,
        "sections": args.only,
        "cpus": os.cpu_count(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "xetfs_commit": git_describe(),
        "elapsed_s": round(elapsed, 1),
        "read_ahead_kb": {k: sorted_ra(v) for k, v in bench.read_ahead_seen.items()},
        "mount_opt": args.mount_opt,
        "verified": runner.verified,
        "data": {
            k: {
                "schemes": {bench_data.SCHEME_NAMES.get(s, str(s)): n for s, n in ds.schemes.items()},
                "stored_bytes": ds.stored_bytes,
                "original_bytes": ds.original_bytes,
                "main_hash": ds.main.hash,
            }
            for k, ds in datasets.items()
        },
        "mount_stores": results.extra.get("mount_meta"),
        "direct_cache_bytes": results.extra.get("direct_cache_bytes"),
        "peer_cpu_s": {k: results.values("peer_cpu", k) for k in kinds if results.values("peer_cpu", k)},
        "daemon_log_problems": daemon_problems,
    }
    doc = to_json(sections, meta, results.errors)
    if args.json == "-":
        print(table, file=sys.stderr)
        json.dump(doc, sys.stdout, indent=1)
        print()
    else:
        print(table)
        if args.json:
            Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
    return 1 if (results.errors or bad_verify or interrupted) else 0


def package_version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "?"


def sorted_ra(values: set[int | None]) -> list[int | None]:
    return sorted(values, key=lambda v: -1 if v is None else v)


def scan_logs(logs: list[tuple[str, Path]]) -> list[str]:
    """Lines of the daemons' logs that show a problem (tracebacks, errors, warnings), deduplicated."""
    seen: dict[str, str] = {}
    for what, path in logs:
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            if any(w in line for w in ("Traceback", "ERROR", "WARNING", "Error")):
                msg = re.sub(r"^\S+ \S+ ", "", line.strip())  # drop the timestamp
                seen.setdefault(msg, what)
    return [f"{what}: {msg}" for msg, what in seen.items()]


if __name__ == "__main__":
    sys.exit(main())
