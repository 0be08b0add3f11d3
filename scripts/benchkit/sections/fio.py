"""Section fio: fio's own jobs on one file of each data kind (the first of the four size/4 files).

Jobs (``ioengine=psync``, JSON output):

* ``rand1``: 4 KiB random reads, one job, over the whole file (fio's random
  map: every block once);
* ``rand4``: the same with 4 jobs, each over its own quarter of the file;
* ``seq``: 1 MiB sequential reads of the whole file.

Where: xetfs, on a fresh mount per job (the ``cold`` pass) and then the same
job again on that mount (the ``cached`` pass: chunks in xetfs' chunk cache);
the ceiling FS; the plain file.  Reported: IOPS and completion latency
p50/p99/p99.9 for the random jobs, throughput for all, decode amplification
(chunks decoded over distinct chunks of the file) for xetfs, and CPU per GiB.

fio's ``invalidate`` option is 1 by default: before a job starts, fio calls
``posix_fadvise(POSIX_FADV_DONTNEED)`` on the file.  On a FUSE file this
drops the kernel's page cache of it, so every job here starts with nothing
in the page cache: the cached pass is served by xetfs' chunk cache, not by
the kernel.  The plain file runs with ``invalidate=0`` after being read once,
so that it is served from the page cache rather than the disk.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from benchkit.data import Dataset, StoredFile, distinct_chunks
from benchkit.rounds import Runner, Task
from benchkit.rows import Row, Target, busy_row, per_gib, ratio
from benchkit.sections import Section
from benchkit.sections.common import decoded_chunks, vs_floor
from benchkit.sections.parts import parts_task
from benchkit.util import BenchError, cat_to_null

JOBS = {
    "rand1": ("4 KiB randread, 1 job", ["--rw=randread", "--bs=4k", "--numjobs=1"]),
    "rand4": ("4 KiB randread, 4 jobs", ["--rw=randread", "--bs=4k", "--numjobs=4"]),
    "seq": ("1 MiB sequential read", ["--rw=read", "--bs=1M", "--numjobs=1"]),
}
WHERE = {"cold": "xetfs cold", "cached": "xetfs cached", "ceiling": "ceiling FS", "plain": "plain file"}
LAT = {"p50": "50.000000", "p99": "99.000000", "p99.9": "99.900000"}

ROWS: dict[tuple[str, str, str], Row] = {}  # (job, where, metric) -> row
for _job, (_label, _) in JOBS.items():
    for _w, _wl in WHERE.items():
        _x = _w in ("cold", "cached")
        if _job != "seq":
            ROWS[_job, _w, "iops"] = Row(f"fio_{_job}_{_w}_iops", f"{_label}, {_wl}: IOPS", "IOPS", xetfs=_x)
            for _m in LAT:
                ROWS[_job, _w, _m] = Row(f"fio_{_job}_{_w}_{_m}", f"{_label}, {_wl}: {_m} latency", "us", xetfs=_x)
        ROWS[_job, _w, "gbps"] = Row(f"fio_{_job}_{_w}_gbps", f"{_label}, {_wl}: throughput", "GB/s", xetfs=_x)
        if _x:
            ROWS[_job, _w, "amp"] = Row(
                f"fio_{_job}_{_w}_amp", f"{_label}, {_wl}: decode amplification", "x", xetfs=True
            )
    for _part in ("daemon", "workers", "reader"):
        ROWS[_job, "cold", f"cpu_{_part}"] = Row(f"cpu_fio_{_job}_cold_{_part}",
                                                 f"{_label}, xetfs cold: CPU {_part if _part != 'reader' else 'fio'}",
                                                 "s/GiB", xetfs=True)  # fmt: skip
    ROWS[_job, "ceiling", "cpu_daemon"] = Row(f"cpu_fio_{_job}_ceiling", f"{_label}, ceiling FS: CPU daemon", "s/GiB")
    ROWS[_job, "cold", "floor"] = Row(
        f"r_cpu_fio_{_job}",
        f"{_label}, xetfs cold: CPU (daemon + workers) / (ceiling + parts)",
        "x",
        derive=vs_floor(
            ROWS[_job, "cold", "cpu_daemon"], ROWS[_job, "cold", "cpu_workers"], ROWS[_job, "ceiling", "cpu_daemon"]
        ),
        xetfs=True,
    )
    _main = "iops" if _job != "seq" else "gbps"
    for _w, _goal in (("cold", 0.5), ("cached", 0.8)):
        ROWS[_job, _w, "vs_ceiling"] = Row(
            f"r_fio_{_job}_{_w}_ceiling",
            f"{_label}, {WHERE[_w]} / ceiling FS ({_main})",
            "x",
            Target(">=", _goal, f">= {_goal}") if _job != "seq" else None,
            derive=ratio(ROWS[_job, _w, _main], ROWS[_job, "ceiling", _main]),
            xetfs=True,
        )
    ROWS[_job, "cold", "vs_plain"] = Row(f"r_fio_{_job}_cold", f"{_label}, xetfs cold / plain ({_main})", "x",
                                         derive=ratio(ROWS[_job, "cold", _main], ROWS[_job, "plain", _main]),
                                         xetfs=True)  # fmt: skip

# The sequential job reads the whole file, the bytes its CPU rows are per: how busy the cores were.
ROWS["seq", "cold", "busy"] = busy_row(
    "fio_seq_cold",
    "1 MiB sequential read, xetfs cold (daemon + workers + fio)",
    ROWS["seq", "cold", "gbps"],
    tuple(ROWS["seq", "cold", f"cpu_{p}"] for p in ("daemon", "workers", "reader")),
)

SECTIONS = (
    Section(
        "fio",
        lambda r: f"fio, psync, on the first size/4 file of each kind ({_sizes(r)}); latency in us",
        lambda r: tuple(ROWS.values()),
        lambda r: tuple(r.args.kinds),
    ),
)


def _sizes(r: Any) -> str:
    return ", ".join(f"{k} {r.data[k].parallel[0].size / 2**20:.0f} MiB" for k in r.args.kinds if k in r.data)


def columns(args: Any, selected: set[str]) -> list[str]:
    return list(args.kinds) if "fio" in selected else []


def tasks(r: Runner, selected: set[str]) -> list[Task]:
    if "fio" not in selected:
        return []
    out = []
    for kind in r.args.kinds:
        ds = r.data[kind]
        f = ds.parallel[0]
        chunks = distinct_chunks(ds.store, f.hash)
        for job in JOBS:
            out += [Task(f"fio-{job}-xetfs", kind, v.name, _bind(t_xetfs, r, ds, f, chunks, job, v.name))
                    for v in r.variants]  # fmt: skip
        out.append(Task("fio-ceiling", kind, "", _bind(t_ceiling, r, ds, f, chunks, "", "")))
        out.append(Task("fio-plain", kind, "", _bind(t_plain, r, ds, f, chunks, "", "")))
        out.append(parts_task(r, kind))
    return out


def _bind(fn: Any, r: Runner, ds: Dataset, f: StoredFile, chunks: int, job: str, variant: str) -> Any:
    return lambda rnd: fn(r, ds, f, chunks, job, rnd, variant)


def fio_command(path: Path, size: int, job: str, *, invalidate: bool) -> list[str]:
    _, opts = JOBS[job]
    cmd = ["fio", f"--name={job}", f"--filename={path}", "--ioengine=psync", "--readonly", "--output-format=json",
           f"--invalidate={int(invalidate)}", "--randrepeat=1", *opts]  # fmt: skip
    if job == "rand4":
        quarter = size // 4 // 4096 * 4096
        cmd += [f"--size={quarter}", f"--offset_increment={quarter}", "--group_reporting"]
    else:
        cmd.append(f"--size={size}")
    return cmd


def parse_fio(doc: dict[str, Any]) -> dict[str, float]:
    """IOPS, throughput (GB/s), bytes, completion latency percentiles (us) and CPU seconds of a fio JSON report."""
    jobs = doc.get("jobs") or []
    if not jobs:
        raise BenchError("fio reported no jobs")
    read = jobs[0]["read"]
    if jobs[0].get("error"):
        raise BenchError(f"fio job failed with error {jobs[0]['error']}")
    job = jobs[0]
    out = {"iops": float(read["iops"]), "gbps": float(read["bw_bytes"]) / 1e9, "bytes": float(read["io_bytes"])}
    # fio's own CPU use while its jobs ran (percent of the job's run time), without its start-up.
    out["cpu_s"] = (float(job["usr_cpu"]) + float(job["sys_cpu"])) / 100 * float(job["job_runtime"]) / 1000
    pct = read.get("clat_ns", {}).get("percentile", {})
    for name, key in LAT.items():
        if key in pct:
            out[name] = pct[key] / 1000
    return out


def run_fio(r: Runner, path: Path, size: int, job: str, *, invalidate: bool) -> dict[str, float]:
    cmd = fio_command(path, size, job, invalidate=invalidate)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=r.timeout_for(4 * size), check=False)
    except subprocess.TimeoutExpired:
        raise BenchError(f"fio {job} on {path} timed out") from None
    if proc.returncode != 0:
        raise BenchError(f"fio {job} on {path} failed ({proc.returncode}): {proc.stderr.strip()[-1000:]}")
    try:
        res = parse_fio(json.loads(proc.stdout[proc.stdout.index("{") :]))
    except ValueError:
        raise BenchError(f"fio {job} printed no JSON: {proc.stdout[:300]!r}") from None
    if res["bytes"] < size - 4096 * 4:
        raise BenchError(f"fio {job} read {res['bytes']:.0f} bytes of {size}")
    return res


def record(r: Runner, job: str, where: str, column: str, rnd: int, res: dict[str, float], variant: str = "") -> None:
    for metric, value in res.items():
        row = ROWS.get((job, where, metric))
        if row is not None:
            r.r.add(row, column, rnd, value, variant)


def t_xetfs(r: Runner, ds: Dataset, f: StoredFile, chunks: int, job: str, rnd: int, variant: str) -> None:
    cat_to_null(ds.xorbs)
    with r.primed(now=False) as go, r.mounts.xetfs(ds.store, variant=r.variant(variant)) as x:
        go()
        path = x.mountpoint / f.hash
        for where in ("cold", "cached"):
            c0 = decoded_chunks(x)
            with r.cpu(x) as cpu:
                res = run_fio(r, path, f.size, job, invalidate=True)
            res["amp"] = (decoded_chunks(x) - c0) / chunks
            if where == "cold":
                res["cpu_daemon"] = per_gib(f.size, cpu.daemon)
                res["cpu_workers"] = per_gib(f.size, cpu.workers)
                res["cpu_reader"] = per_gib(f.size, res["cpu_s"])
            record(r, job, where, ds.kind, rnd, res, variant)


def t_ceiling(r: Runner, ds: Dataset, f: StoredFile, _c: int, _j: str, rnd: int, _v: str) -> None:
    cat_to_null([f.path])
    with r.primed(now=False) as go, r.mounts.ceiling([f.path]) as c:
        go()
        for job in JOBS:
            with r.cpu(c) as cpu:
                res = run_fio(r, c.mountpoint / f.path.name, f.size, job, invalidate=True)
            res["cpu_daemon"] = per_gib(f.size, cpu.daemon)
            record(r, job, "ceiling", ds.kind, rnd, res)


def t_plain(r: Runner, ds: Dataset, f: StoredFile, _c: int, _j: str, rnd: int, _v: str) -> None:
    with r.primed():
        for job in JOBS:
            cat_to_null([f.path])
            res = run_fio(r, f.path, f.size, job, invalidate=False)
            record(r, job, "plain", ds.kind, rnd, res)
