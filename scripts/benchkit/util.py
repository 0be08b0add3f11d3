"""Small tools of the benchmark: sizes, polling, /proc, dd and other readers run as child processes."""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from benchkit.paths import REPO

sys.path.insert(0, str(REPO / "tests"))
from helpers.mounting import mount_device

MiB = 1024 * 1024
GiB = 1024 * MiB
CLK_TCK = os.sysconf("SC_CLK_TCK")


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


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


# -- CPU time from /proc ---------------------------------------------------------------


def proc_cpu(pid: int) -> float | None:
    """CPU seconds (user + system) a live process has used so far, from /proc/PID/stat; None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def children_of(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def tree_cpu(pid: int) -> tuple[float, float]:
    """CPU seconds so far of a daemon and of its live children (the decode workers), separately."""
    return proc_cpu(pid) or 0.0, sum(proc_cpu(c) or 0.0 for c in children_of(pid))


def children_cpu() -> float:
    """CPU seconds of this process's children that have been waited for (RUSAGE_CHILDREN)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime
