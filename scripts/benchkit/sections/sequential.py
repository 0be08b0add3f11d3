"""Whole-file reads with dd, and 4 KiB preads: sections plain, peer, ceiling, cold, warm, random, parallel.

* plain     dd of the original file (page-cached)
* peer      hf_xet.download_files from the same local:// store to /dev/shm
            (a subprocess per measurement; the time of the call itself)
* ceiling   scripts/ceiling_fs.py: the same bytes served from memory by a
            trivial pyfuse3 filesystem with xetfs' mount options
* cold      a fresh xetfs mount (empty chunk cache, xorbs page-cached):
            dd bs=1M of the whole file
* warm      the same file again, twice (kernel page cache), with how much of
            it the page cache still held after the cold read (fincore); and
            on a --direct-io mount after one full read (chunk cache only)
* random    4 KiB preads at random offsets through --direct-io mounts:
            chunks not cached (fresh mount, one read per chunk) and cached
            (after a full read), and on the ceiling for reference
* parallel  4 readers of 4 different files at once vs the same 4 files read
            one after another (xetfs cold, and the ceiling)

CPU per GiB comes from /proc around each read: the daemon, its decode
workers and dd itself.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchkit import data as bench_data
from benchkit.data import Dataset
from benchkit.rounds import Runner, Task
from benchkit.rows import Row, Target, busy_row, per_gib, percentile, ratio
from benchkit.sections import Section
from benchkit.sections.common import vs_floor
from benchkit.sections.parts import parts_task
from benchkit.util import (
    BenchError,
    MiB,
    cat_to_null,
    dd,
    drop_file_pages,
    files_equal,
    random_reads,
    readers_wall,
    resident_percent,
)

RSS_ALLOWANCE = 100 * MiB
DEFAULT_CACHE = 512 * MiB

# -- rows --------------------------------------------------------------------------------

PLAIN = Row("plain", "plain file, page cache (dd)", "GB/s")
PEER = Row("peer", "hf_xet download_files -> /dev/shm", "GB/s")
CEILING = Row("ceiling", "ceiling FS, first read", "GB/s")
CEILING_PC = Row("ceiling_pc", "ceiling FS, page-cache re-read", "GB/s")
CEILING_PC2 = Row("ceiling_pc2", "ceiling FS, second re-read", "GB/s")
CEILING_DIRECT = Row("ceiling_direct", "ceiling FS, --direct-io", "GB/s")
COLD = Row("cold", "xetfs cold (fresh mount)", "GB/s", xetfs=True)
WARM_PC = Row("warm_pc", "xetfs warm, page-cache re-read", "GB/s", xetfs=True)
WARM_PC2 = Row("warm_pc2", "xetfs warm, second re-read", "GB/s", xetfs=True)
WARM_CC = Row("warm_cc", "xetfs warm, chunk cache (--direct-io)", "GB/s", xetfs=True)

R_PEER = Row("r_peer", "xetfs cold / hf_xet", "x", Target(">=", 2.5, ">= 2.5x"), ratio(COLD, PEER), xetfs=True)
R_CEILING = Row(
    "r_ceiling",
    "xetfs cold / ceiling first read",
    "x",
    Target(">=", (("random", 0.7), ("text", 0.5), ("float32", 0.5)), ">= 0.7 raw, 0.5"),
    ratio(COLD, CEILING),
    xetfs=True,
)
R_WARM = Row("r_warm", "xetfs page-cache re-read / plain", "x", Target(">=", 0.8, ">= 0.8x"), ratio(WARM_PC, PLAIN),
             xetfs=True)  # fmt: skip
R_CC = Row(
    "r_cc", "xetfs chunk cache / ceiling, both direct-io", "x", derive=ratio(WARM_CC, CEILING_DIRECT), xetfs=True
)
R_CEILING_PC = Row("r_ceiling_pc", "(ref) ceiling page-cache re-read / plain", "x", derive=ratio(CEILING_PC, PLAIN))
R_WARM2 = Row("r_warm2", "(ref) xetfs second re-read / plain", "x", derive=ratio(WARM_PC2, PLAIN), xetfs=True)
R_CEILING_PC2 = Row("r_ceiling_pc2", "(ref) ceiling second re-read / plain", "x", derive=ratio(CEILING_PC2, PLAIN))

WARM_RESIDENT = Row("warm_resident", "xetfs file, after the cold read", "%", xetfs=True)
CEILING_RESIDENT = Row("ceiling_resident", "ceiling file, after the first read", "%")

RAND_COLD_P50 = Row("rand_cold_p50", "xetfs chunk not cached, p50", "us", Target("<=", 400, "<= 400 us"), xetfs=True)
RAND_COLD_P99 = Row("rand_cold_p99", "xetfs chunk not cached, p99", "us", xetfs=True)
RAND_WARM_P50 = Row("rand_warm_p50", "xetfs chunk cached, p50", "us", Target("<=", 150, "<= 150 us"), xetfs=True)
RAND_WARM_P99 = Row("rand_warm_p99", "xetfs chunk cached, p99", "us", xetfs=True)
CEILING_RAND_P50 = Row("ceiling_rand_p50", "ceiling FS (direct_io), p50", "us")
CEILING_RAND_P99 = Row("ceiling_rand_p99", "ceiling FS (direct_io), p99", "us")

PAR1 = Row("par1", "xetfs cold, 1 reader (4 files in turn)", "GB/s", xetfs=True)
PAR4 = Row("par4", "xetfs cold, 4 readers at once", "GB/s", xetfs=True)
R_PAR = Row("r_par", "xetfs 4 readers / 1 reader", "x", Target(">=", 1.5, ">= 1.5x"), ratio(PAR4, PAR1), xetfs=True)
CEILING_PAR1 = Row("ceiling_par1", "ceiling, 1 reader", "GB/s")
CEILING_PAR4 = Row("ceiling_par4", "ceiling, 4 readers", "GB/s")
R_CEILING_PAR = Row("r_ceiling_par", "ceiling 4 readers / 1 reader", "x", derive=ratio(CEILING_PAR4, CEILING_PAR1))

_RSS = Target("<=", (RSS_ALLOWANCE + DEFAULT_CACHE) / MiB, f"<= {(RSS_ALLOWANCE + DEFAULT_CACHE) // MiB} MiB")
RSS_SEQ = Row("rss_seq", "cold + re-read mount (cache 512 MiB)", "MiB", _RSS, xetfs=True)
RSS_DIRECT = Row("rss_direct", "--direct-io mount (cache: the file + 1/8 + 64 MiB)", "MiB", xetfs=True)
RSS_PAR1 = Row("rss_par1", "parallel mount, 1 reader", "MiB", _RSS, xetfs=True)
RSS_PAR4 = Row("rss_par4", "parallel mount, 4 readers", "MiB", _RSS, xetfs=True)
PEER_RSS = Row("peer_rss", "hf_xet download process (reference)", "MiB")

CPU_COLD_DAEMON = Row("cpu_cold_daemon", "xetfs cold: daemon", "s/GiB", xetfs=True)
CPU_COLD_WORKERS = Row("cpu_cold_workers", "xetfs cold: decode workers", "s/GiB", xetfs=True)
CPU_COLD_READER = Row("cpu_cold_reader", "xetfs cold: the reader (dd)", "s/GiB", xetfs=True)
CPU_PEER = Row("cpu_peer", "hf_xet download_files (its process)", "s/GiB")
CPU_CEILING = Row("cpu_ceiling", "ceiling FS first read: daemon", "s/GiB")
CPU_CEILING_READER = Row("cpu_ceiling_reader", "ceiling FS first read: the reader (dd)", "s/GiB")
CPU_PLAIN_READER = Row("cpu_plain_reader", "plain file: the reader (dd)", "s/GiB")


CPU_WARM_PC = Row("cpu_warm_pc", "xetfs page-cache re-read: daemon + workers", "s/GiB", xetfs=True)
CPU_WARM_CC = Row("cpu_warm_cc", "xetfs chunk-cache re-read (--direct-io): daemon + workers", "s/GiB", xetfs=True)
CPU_RAND_COLD = Row("cpu_rand_cold", "xetfs chunk not cached: daemon + workers CPU per read", "us", xetfs=True)
CPU_RAND_WARM = Row("cpu_rand_warm", "xetfs chunk cached: daemon + workers CPU per read", "us", xetfs=True)
CPU_PAR1 = Row("cpu_par1", "xetfs cold, 1 reader: daemon + workers", "s/GiB", xetfs=True)
CPU_PAR4 = Row("cpu_par4", "xetfs cold, 4 readers: daemon + workers", "s/GiB", xetfs=True)

BUSY_PLAIN = busy_row("plain", "dd of the plain file", PLAIN, (CPU_PLAIN_READER,))
BUSY_PEER = busy_row("peer", "hf_xet download_files", PEER, (CPU_PEER,))
BUSY_CEILING = busy_row("ceiling", "ceiling first read (daemon + dd)", CEILING, (CPU_CEILING, CPU_CEILING_READER))
BUSY_COLD = busy_row("cold", "xetfs cold (daemon + workers + dd)", COLD,
                     (CPU_COLD_DAEMON, CPU_COLD_WORKERS, CPU_COLD_READER))  # fmt: skip
BUSY_WARM_PC = busy_row("warm_pc", "xetfs page-cache re-read (daemon + workers; dd not counted)", WARM_PC,
                        (CPU_WARM_PC,))  # fmt: skip
BUSY_WARM_CC = busy_row("warm_cc", "xetfs chunk-cache re-read (daemon + workers; dd not counted)", WARM_CC,
                        (CPU_WARM_CC,))  # fmt: skip
BUSY_PAR1 = busy_row("par1", "xetfs 1 reader (daemon + workers; dd not counted)", PAR1, (CPU_PAR1,))
BUSY_PAR4 = busy_row("par4", "xetfs 4 readers (daemon + workers; dd not counted)", PAR4, (CPU_PAR4,))

R_CPU_COLD = Row(
    "r_cpu_cold",
    "xetfs cold (daemon + workers) / (ceiling + parts)",
    "x",
    derive=vs_floor(CPU_COLD_DAEMON, CPU_COLD_WORKERS, CPU_CEILING),
    xetfs=True,
)


def _kinds(r: Any) -> tuple[str, ...]:
    return tuple(r.args.kinds)


SECTIONS = (
    Section("plain", "Plain file (the original, page-cached)", lambda r: (PLAIN, CPU_PLAIN_READER, BUSY_PLAIN), _kinds),
    Section(
        "peer", "hf_xet download_files from the same store", lambda r: (PEER, CPU_PEER, BUSY_PEER, PEER_RSS), _kinds
    ),
    Section(
        "ceiling",
        "Ceiling FS (zero-work pyfuse3 serving the same bytes from memory)",
        lambda r: (
            CEILING,
            CEILING_PC,
            CEILING_PC2,
            CEILING_DIRECT,
            CEILING_RESIDENT,
            CPU_CEILING,
            CPU_CEILING_READER,
            BUSY_CEILING,
        ),
        _kinds,
    ),
    Section(
        "cold",
        "xetfs cold sequential read (dd bs=1M of the whole file, fresh mount)",
        lambda r: (
            COLD,
            *((R_PEER,) if "peer" in r.selected else ()),
            R_CEILING,
            CPU_COLD_DAEMON,
            CPU_COLD_WORKERS,
            CPU_COLD_READER,
            R_CPU_COLD,
            BUSY_COLD,
            RSS_SEQ,
        ),
        _kinds,
    ),
    Section(
        "warm",
        "xetfs re-reads (page cache; chunk cache with --direct-io), and how much the page cache held (fincore)",
        lambda r: (
            (
                WARM_PC,
                WARM_PC2,
                WARM_CC,
                WARM_RESIDENT,
                CPU_WARM_PC,
                CPU_WARM_CC,
                BUSY_WARM_PC,
                BUSY_WARM_CC,
                RSS_DIRECT,
            )
            + ((R_WARM, R_WARM2, R_CEILING_PC, R_CEILING_PC2) if "plain" in r.selected else ())
            + (R_CC,)
        ),
        _kinds,
    ),
    Section(
        "random",
        lambda r: f"Random 4 KiB pread latency, us ({r.args.random_reads} reads per round, --direct-io mounts)",
        lambda r: (
            RAND_COLD_P50,
            RAND_COLD_P99,
            RAND_WARM_P50,
            RAND_WARM_P99,
            CEILING_RAND_P50,
            CEILING_RAND_P99,
            CPU_RAND_COLD,
            CPU_RAND_WARM,
        ),
        _kinds,
    ),
    Section(
        "parallel",
        "Parallel readers, aggregate GB/s (4 files of size/4)",
        lambda r: (
            PAR1,
            PAR4,
            R_PAR,
            CEILING_PAR1,
            CEILING_PAR4,
            R_CEILING_PAR,
            CPU_PAR1,
            CPU_PAR4,
            BUSY_PAR1,
            BUSY_PAR4,
            RSS_PAR1,
            RSS_PAR4,
        ),
        _kinds,
    ),
)


def columns(args: Any, selected: set[str]) -> list[str]:
    return list(args.kinds) if selected & {s.name for s in SECTIONS} else []


# -- tasks ---------------------------------------------------------------------------------


def tasks(r: Runner, selected: set[str]) -> list[Task]:
    s = selected
    per_kind: list[tuple[str, bool, Any]] = []  # name, per xetfs variant, function(runner, ds, rnd, variant)
    if "plain" in s:
        per_kind.append(("plain", False, t_plain))
    if "peer" in s:
        per_kind.append(("peer", False, t_peer))
    if s & {"ceiling", "parallel", "cold"}:
        per_kind.append(("ceiling", False, t_ceiling))
    if s & {"random", "warm", "ceiling"}:
        per_kind.append(("ceiling-direct", False, t_ceiling_direct))
    if s & {"cold", "warm"}:
        per_kind.append(("xetfs", True, t_xetfs_seq))
    if s & {"random", "warm"}:
        per_kind.append(("xetfs-direct", True, t_xetfs_direct))
    if "parallel" in s:
        per_kind.append(("xetfs-parallel", True, t_xetfs_parallel))
    out = []
    for kind in r.args.kinds if per_kind else ():
        ds = r.data[kind]
        for name, per_variant, fn in per_kind:
            for v in r.variants if per_variant else r.variants[:1]:
                out.append(Task(name, kind, v.name, _bind(fn, r, ds, v.name)))
        if "cold" in s:
            out.append(parts_task(r, kind))
    return out


def _bind(fn: Any, r: Runner, ds: Dataset, variant: str) -> Any:
    return lambda rnd: fn(r, ds, rnd, variant)


def gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9


def t_plain(r: Runner, ds: Dataset, rnd: int, _v: str) -> None:
    cat_to_null([ds.main.path])
    with r.primed(), r.cpu() as cpu:
        secs = dd(ds.main.path, ds.main.size, r.timeout_for(ds.main.size))
    r.r.add(PLAIN, ds.kind, rnd, gbps(ds.main.size, secs))
    r.r.add(CPU_PLAIN_READER, ds.kind, rnd, per_gib(ds.main.size, cpu.reader))


@contextlib.contextmanager
def peer_output(r: Runner, ds: Dataset) -> Iterator[tuple[Path, Path]]:
    """A work directory for hf_xet and the path of its output (in ``Runner.memory_dir``); both removed afterwards."""
    cat_to_null(ds.xorbs)
    work = r.work_dir("peer")
    try:
        with r.memory_dir(f"peer-{ds.kind}") as out:
            yield work, out / "download.out"
    finally:
        shutil.rmtree(work, ignore_errors=True)


def t_peer(r: Runner, ds: Dataset, rnd: int, _v: str) -> None:
    with peer_output(r, ds) as (work, out):
        with r.primed():
            res = peer_download(r, ds, work, out)
        r.check_once(f"peer-{ds.kind}", lambda: files_equal(out, ds.main.path))
    r.r.add(PEER, ds.kind, rnd, gbps(ds.main.size, res["seconds"]))
    r.r.add(PEER_RSS, ds.kind, rnd, res["maxrss"] / MiB)
    r.r.add(CPU_PEER, ds.kind, rnd, per_gib(ds.main.size, res["cpu"]))


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


def peer_download(r: Runner, ds: Dataset, work: Path, out: Path) -> dict[str, Any]:
    """``hf_xet.download_files`` of the main file to ``out``, in a child process: its seconds, CPU and peak RSS."""
    # hf_xet opens its redb index for writing: give it a private copy, with the
    # xorbs and shards hard-linked (same files, same page cache).
    peer_store = work / "store"
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
            timeout=r.timeout_for(ds.main.size),
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise BenchError("hf_xet download timed out") from None
    if proc.returncode != 0:
        raise BenchError(f"hf_xet download failed ({proc.returncode}): {proc.stderr.decode(errors='replace')}")
    res: dict[str, Any] = json.loads(proc.stdout)
    if res["size"] != ds.main.size:
        raise BenchError(f"hf_xet wrote {res['size']} bytes, expected {ds.main.size}")
    return res


def t_ceiling(r: Runner, ds: Dataset, rnd: int, _v: str) -> None:
    par = "parallel" in r.selected
    files = [ds.main.path] + ([f.path for f in ds.parallel] if par else [])
    cat_to_null(files)  # the ceiling maps these; they must be in the page cache
    with r.primed(now=False) as go, r.mounts.ceiling(files) as c:
        go()
        main = c.mountpoint / ds.main.path.name
        if r.selected & {"ceiling", "cold"}:
            with r.cpu(c) as cpu:
                t1 = dd(main, ds.main.size, r.timeout_for(ds.main.size))
            r.r.add(CEILING, ds.kind, rnd, gbps(ds.main.size, t1))
            r.r.add(CPU_CEILING, ds.kind, rnd, per_gib(ds.main.size, cpu.daemon))
            r.r.add(CPU_CEILING_READER, ds.kind, rnd, per_gib(ds.main.size, cpu.reader))
            r.r.add(CEILING_RESIDENT, ds.kind, rnd, resident_percent(main))
            for row in (CEILING_PC, CEILING_PC2):
                t2 = dd(main, ds.main.size, r.timeout_for(ds.main.size))
                r.r.add(row, ds.kind, rnd, gbps(ds.main.size, t2))
            r.check_once(f"ceiling-{ds.kind}", lambda: files_equal(main, ds.main.path))
        if par:
            paths = [c.mountpoint / f.path.name for f in ds.parallel]
            total = sum(f.size for f in ds.parallel)
            for parallel in (False, True) if rnd % 2 == 0 else (True, False):
                for p in paths:
                    drop_file_pages(p)
                secs = readers_wall(paths, parallel, r.timeout_for(total))
                r.r.add(CEILING_PAR4 if parallel else CEILING_PAR1, ds.kind, rnd, gbps(total, secs))


def t_ceiling_direct(r: Runner, ds: Dataset, rnd: int, _v: str) -> None:
    cat_to_null([ds.main.path])
    with r.primed(now=False) as go, r.mounts.ceiling([ds.main.path], direct_io=True) as c:
        go()
        path = c.mountpoint / ds.main.path.name
        if r.selected & {"warm", "ceiling"}:
            secs = dd(path, ds.main.size, r.timeout_for(ds.main.size))
            r.r.add(CEILING_DIRECT, ds.kind, rnd, gbps(ds.main.size, secs))
        if "random" in r.selected:
            lat = random_reads(path, uniform_offsets(r, ds))
            r.r.add(CEILING_RAND_P50, ds.kind, rnd, percentile(lat, 50))
            r.r.add(CEILING_RAND_P99, ds.kind, rnd, percentile(lat, 99))


def t_xetfs_seq(r: Runner, ds: Dataset, rnd: int, variant: str) -> None:
    cat_to_null(ds.xorbs)
    v = r.variant(variant)
    with r.primed(now=False) as go, r.mounts.xetfs(ds.store, variant=v) as x:
        go()
        path = x.mountpoint / ds.main.hash
        with r.cpu(x) as cpu:
            t1 = dd(path, ds.main.size, r.timeout_for(ds.main.size))
        r.r.add(COLD, ds.kind, rnd, gbps(ds.main.size, t1), variant)
        r.r.add(CPU_COLD_DAEMON, ds.kind, rnd, per_gib(ds.main.size, cpu.daemon), variant)
        r.r.add(CPU_COLD_WORKERS, ds.kind, rnd, per_gib(ds.main.size, cpu.workers), variant)
        r.r.add(CPU_COLD_READER, ds.kind, rnd, per_gib(ds.main.size, cpu.reader), variant)
        if "warm" in r.selected:
            # What the kernel still holds decides how much of the re-read is served from memory.
            r.r.add(WARM_RESIDENT, ds.kind, rnd, resident_percent(path), variant)
            for row in (WARM_PC, WARM_PC2):
                with r.cpu(x) as cpu:
                    t2 = dd(path, ds.main.size, r.timeout_for(ds.main.size))
                r.r.add(row, ds.kind, rnd, gbps(ds.main.size, t2), variant)
                if row is WARM_PC:
                    r.r.add(CPU_WARM_PC, ds.kind, rnd, per_gib(ds.main.size, cpu.daemon + cpu.workers), variant)
        r.check_once(f"xetfs{variant and '@' + variant}-{ds.kind}", lambda: files_equal(path, ds.main.path))
        r.r.add(RSS_SEQ, ds.kind, rnd, (x.hwm() or 0) / MiB, variant)


def uniform_offsets(r: Runner, ds: Dataset) -> list[int]:
    pages = max(1, ds.main.size // 4096)
    return [r.rng.randrange(pages) * 4096 for _ in range(r.args.random_reads)]


def distinct_chunk_offsets(r: Runner, ds: Dataset) -> list[int]:
    """4 KiB-aligned offsets no two of which can touch the same chunk (chunks are <= 128 KiB).

    Offset i lies in the first 124 KiB of its own 256 KiB slot, so two reads
    are always more than 128 KiB apart.
    """
    slots = list(range(ds.main.size // (256 * 1024)))
    r.rng.shuffle(slots)
    return [s * 256 * 1024 + r.rng.randrange(31) * 4096 for s in slots[: r.args.random_reads]]


def direct_cache_size(ds: Dataset) -> int:
    need = int(ds.main.size * 1.125) + 64 * MiB
    return -(-need // MiB) * MiB


def t_xetfs_direct(r: Runner, ds: Dataset, rnd: int, variant: str) -> None:
    cat_to_null(ds.xorbs)
    cache = direct_cache_size(ds)
    v = r.variant(variant)
    with r.primed(now=False) as go, r.mounts.xetfs(ds.store, "--direct-io", "--cache-size", str(cache), variant=v) as x:
        go()
        path = x.mountpoint / ds.main.hash
        if "random" in r.selected:
            offsets = distinct_chunk_offsets(r, ds)
            with r.cpu(x) as cpu:
                lat = random_reads(path, offsets)
            r.r.add(RAND_COLD_P50, ds.kind, rnd, percentile(lat, 50), variant)
            r.r.add(RAND_COLD_P99, ds.kind, rnd, percentile(lat, 99), variant)
            r.r.add(CPU_RAND_COLD, ds.kind, rnd, (cpu.daemon + cpu.workers) / len(offsets) * 1e6, variant)
        dd(path, ds.main.size, r.timeout_for(ds.main.size))  # fills the chunk cache
        if "warm" in r.selected:
            with r.cpu(x) as cpu:
                secs = dd(path, ds.main.size, r.timeout_for(ds.main.size))
            r.r.add(WARM_CC, ds.kind, rnd, gbps(ds.main.size, secs), variant)
            r.r.add(CPU_WARM_CC, ds.kind, rnd, per_gib(ds.main.size, cpu.daemon + cpu.workers), variant)
        if "random" in r.selected:
            offsets = uniform_offsets(r, ds)
            with r.cpu(x) as cpu:
                lat = random_reads(path, offsets)
            r.r.add(RAND_WARM_P50, ds.kind, rnd, percentile(lat, 50), variant)
            r.r.add(RAND_WARM_P99, ds.kind, rnd, percentile(lat, 99), variant)
            r.r.add(CPU_RAND_WARM, ds.kind, rnd, (cpu.daemon + cpu.workers) / len(offsets) * 1e6, variant)
        r.r.add(RSS_DIRECT, ds.kind, rnd, (x.hwm() or 0) / MiB, variant)


def t_xetfs_parallel(r: Runner, ds: Dataset, rnd: int, variant: str) -> None:
    total = sum(f.size for f in ds.parallel)
    v = r.variant(variant)
    for parallel in (False, True) if rnd % 2 == 0 else (True, False):
        cat_to_null(ds.xorbs)
        with r.primed(now=False) as go, r.mounts.xetfs(ds.store, variant=v) as x:
            go()
            paths = [x.mountpoint / f.hash for f in ds.parallel]
            with r.cpu(x) as cpu:
                secs = readers_wall(paths, parallel, r.timeout_for(total))
            r.r.add(PAR4 if parallel else PAR1, ds.kind, rnd, gbps(total, secs), variant)
            r.r.add(CPU_PAR4 if parallel else CPU_PAR1, ds.kind, rnd, per_gib(total, cpu.daemon + cpu.workers), variant)
            r.r.add(RSS_PAR4 if parallel else RSS_PAR1, ds.kind, rnd, (x.hwm() or 0) / MiB, variant)
