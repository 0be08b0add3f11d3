"""Section load: a safetensors model loaded the way loaders do it.

The file (``data.write_model``: hundreds of float16 and float32 tensors of
mixed sizes, about --size bytes) is opened with
``safetensors.safe_open(path, framework="numpy")`` and ``get_tensor`` is
called for every key in the order ``keys()`` gives, which is sorted by name,
not by offset in the file.  Four ways, each timed from ``safe_open`` to the
last tensor:

* xetfs: a fresh mount (empty chunk cache, xorbs page-cached);
* hf_xet: ``download_files`` from the same store to /dev/shm, then the load
  of the downloaded file (the time of both: the peer's time to a loaded model);
* the ceiling FS serving the original file from memory;
* the plain file (page-cached).

A cold `dd bs=1M` of the same file on a fresh mount is timed too: the
target for a load is at most 1.2x that time.

Decode amplification is the chunks xetfs decoded (``.xetfs/stats``) over the
distinct chunks of the file.  CPU per GiB of the file: xetfs' daemon, its
decode workers and the loading process; hf_xet's download process plus the
loader; the ceiling daemon and the loader on it (what FUSE costs a loader
whatever the daemon does).  And the shortest time the xetfs load's CPU
(daemon, workers and loader together) allows on this machine's cores, with
every core busy all along: when that is close to the load's time, the load
is bound by CPU, and only less CPU per GiB makes it faster.  Beside each
time target, the same ratio in CPU: the load's CPU (daemon, workers and
loader) over hf_xet's (download and loader), and over the cold `dd`'s
(daemon, workers and `dd`).  Where every one of them is bound by the cores,
a time ratio gets below its CPU ratio only by keeping the cores busier.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from benchkit.data import Dataset
from benchkit.rounds import Runner, Task
from benchkit.rows import Row, Target, busy_row, per_gib, ratio
from benchkit.sections import Section
from benchkit.sections.common import decoded_chunks, run_json, vs_floor
from benchkit.sections.parts import parts_task
from benchkit.sections.sequential import peer_download, peer_output
from benchkit.util import cat_to_null, dd, files_equal

COLUMN = "model"
CORES = os.cpu_count() or 1

LOAD_XETFS = Row("load_xetfs", "xetfs, fresh mount: safe_open + every get_tensor", "s", xetfs=True)
LOAD_PEER = Row("load_peer", "hf_xet download_files, then load from /dev/shm", "s")
LOAD_CEILING = Row("load_ceiling", "ceiling FS", "s")
LOAD_PLAIN = Row("load_plain", "plain file (page cache)", "s")
R_LOAD_PLAIN = Row("r_load_plain", "xetfs time / plain time", "x", derive=ratio(LOAD_XETFS, LOAD_PLAIN), xetfs=True)
R_LOAD_PEER = Row("r_load_peer", "xetfs time / hf_xet time", "x", Target("<=", 0.5, "<= 0.5"),
                  derive=ratio(LOAD_XETFS, LOAD_PEER), xetfs=True)  # fmt: skip
LOAD_DD = Row("load_dd", "xetfs, fresh mount: dd bs=1M of the same file", "s", xetfs=True)
R_LOAD_DD = Row("r_load_dd", "xetfs load time / cold dd time of the file", "x", Target("<=", 1.2, "<= 1.2"),
                derive=ratio(LOAD_XETFS, LOAD_DD), xetfs=True)  # fmt: skip
LOAD_AMP = Row("load_amp", "xetfs decode amplification (chunks decoded / distinct)", "x", xetfs=True)
CPU_LOAD_DAEMON = Row("cpu_load_daemon", "CPU xetfs daemon", "s/GiB", xetfs=True)
CPU_LOAD_WORKERS = Row("cpu_load_workers", "CPU xetfs decode workers", "s/GiB", xetfs=True)
CPU_LOAD_READER = Row("cpu_load_reader", "CPU loader on xetfs", "s/GiB", xetfs=True)
CPU_LOAD_PEER = Row("cpu_load_peer", "CPU hf_xet download + loader", "s/GiB")
CPU_LOAD_CEILING = Row("cpu_load_ceiling", "CPU ceiling daemon", "s/GiB")
CPU_LOAD_CEILING_READER = Row("cpu_load_ceiling_reader", "CPU loader on the ceiling FS", "s/GiB")
CPU_LOAD_PLAIN = Row("cpu_load_plain", "CPU loader on the plain file", "s/GiB")
LOAD_CPU_BOUND = Row("load_cpu_bound", "xetfs load: its CPU (daemon + workers + loader) / cores", "s", xetfs=True)
R_LOAD_CPU_BOUND = Row("r_load_cpu_bound", "xetfs load: that CPU bound / hf_xet time", "x",
                       derive=ratio(LOAD_CPU_BOUND, LOAD_PEER), xetfs=True)  # fmt: skip
CPU_LOAD_ALL = Row("cpu_load_all", "CPU xetfs load: daemon + workers + loader", "s/GiB", xetfs=True)
R_CPU_LOAD_PEER = Row("r_cpu_load_peer", "CPU xetfs load / CPU hf_xet download + loader", "x",
                      derive=ratio(CPU_LOAD_ALL, CPU_LOAD_PEER), xetfs=True)  # fmt: skip
CPU_DD_ALL = Row("cpu_dd_all", "CPU xetfs cold dd: daemon + workers + dd", "s/GiB", xetfs=True)
CPU_DD_READER = Row("cpu_dd_reader", "CPU dd on xetfs", "s/GiB", xetfs=True)
R_CPU_LOAD_DD = Row("r_cpu_load_dd", "CPU xetfs load / CPU xetfs cold dd", "x",
                    derive=ratio(CPU_LOAD_ALL, CPU_DD_ALL), xetfs=True)  # fmt: skip
R_CPU_LOAD = Row("r_cpu_load", "CPU xetfs (daemon + workers) / (ceiling + parts)", "x",
                 derive=vs_floor(CPU_LOAD_DAEMON, CPU_LOAD_WORKERS, CPU_LOAD_CEILING), xetfs=True)  # fmt: skip

ROWS = (LOAD_XETFS, LOAD_DD, LOAD_PEER, LOAD_CEILING, LOAD_PLAIN, R_LOAD_PLAIN, R_LOAD_PEER, R_LOAD_DD,
        LOAD_AMP, CPU_LOAD_DAEMON, CPU_LOAD_WORKERS, CPU_LOAD_READER, CPU_LOAD_PEER, CPU_LOAD_CEILING,
        CPU_LOAD_CEILING_READER, CPU_LOAD_PLAIN, R_CPU_LOAD, LOAD_CPU_BOUND, R_LOAD_CPU_BOUND, CPU_LOAD_ALL,
        R_CPU_LOAD_PEER, CPU_DD_ALL, CPU_DD_READER, R_CPU_LOAD_DD)  # fmt: skip


def busy_rows(r: Any) -> tuple[Row, ...]:
    """How busy the cores were in each load (its CPU rows are per GiB of the model: the model's size relates them)."""
    ds = r.data.get(COLUMN)
    if ds is None:
        return ()
    gib = ds.main.size / 2**30
    return (
        busy_row("load_xetfs", "xetfs load (daemon + workers + loader)", LOAD_XETFS, (CPU_LOAD_ALL,), gib),
        busy_row("load_dd", "xetfs cold dd (daemon + workers + dd)", LOAD_DD, (CPU_DD_ALL,), gib),
        busy_row("load_peer", "hf_xet download, then load", LOAD_PEER, (CPU_LOAD_PEER,), gib),
        busy_row(
            "load_ceiling",
            "ceiling FS (daemon + loader)",
            LOAD_CEILING,
            (CPU_LOAD_CEILING, CPU_LOAD_CEILING_READER),
            gib,
        ),
        busy_row("load_plain", "plain file (loader)", LOAD_PLAIN, (CPU_LOAD_PLAIN,), gib),
    )


SECTIONS = (
    Section(
        "load",
        lambda r: f"Loading a safetensors model ({_describe(r)}), time to loaded, s",
        lambda r: ROWS + busy_rows(r),
        lambda r: (COLUMN,),
    ),
)

LOADER = r"""
import json, resource, sys, time
from safetensors import safe_open
path = sys.argv[1]
r0 = resource.getrusage(resource.RUSAGE_SELF)
t0 = time.perf_counter()
n = tensors = 0
with safe_open(path, framework="numpy") as f:
    for key in f.keys():
        n += f.get_tensor(key).nbytes
        tensors += 1
secs = time.perf_counter() - t0
r1 = resource.getrusage(resource.RUSAGE_SELF)
cpu = r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime
json.dump({"seconds": secs, "cpu": cpu, "bytes": n, "tensors": tensors}, sys.stdout)
"""


def _describe(r: Any) -> str:
    ds = r.data.get(COLUMN)
    if ds is None:
        return ""
    info = r.extra.get("model_tensors")
    return f"{ds.main.size / 2**20:.0f} MiB" + (f", {info} tensors" if info else "")


def columns(args: Any, selected: set[str]) -> list[str]:
    return [COLUMN] if "load" in selected else []


def tasks(r: Runner, selected: set[str]) -> list[Task]:
    if "load" not in selected:
        return []
    ds = r.data[COLUMN]
    out = [Task("load-xetfs", COLUMN, v.name, _bind(t_xetfs, r, ds, v.name)) for v in r.variants]
    out += [Task("load-dd", COLUMN, v.name, _bind(t_dd, r, ds, v.name)) for v in r.variants]
    out += [
        Task("load-peer", COLUMN, "", _bind(t_peer, r, ds, "")),
        Task("load-ceiling", COLUMN, "", _bind(t_ceiling, r, ds, "")),
        Task("load-plain", COLUMN, "", _bind(t_plain, r, ds, "")),
        parts_task(r, COLUMN),
    ]
    return out


def _bind(fn: Any, r: Runner, ds: Dataset, variant: str) -> Any:
    return lambda rnd: fn(r, ds, rnd, variant)


def load(r: Runner, path: Path, ds: Dataset) -> dict[str, Any]:
    res = run_json(["-c", LOADER, str(path)], f"loading {path}", r.timeout_for(ds.main.size))
    r.extra["model_tensors"] = res["tensors"]
    return res


def t_xetfs(r: Runner, ds: Dataset, rnd: int, variant: str) -> None:
    cat_to_null(ds.xorbs)
    with r.primed(now=False) as go, r.mounts.xetfs(ds.store, variant=r.variant(variant)) as x:
        go()
        path = x.mountpoint / ds.main.hash
        c0 = decoded_chunks(x)
        with r.cpu(x) as cpu:
            res = load(r, path, ds)
        chunks = decoded_chunks(x) - c0
        r.check_once(f"load-xetfs{variant and '@' + variant}", lambda: files_equal(path, ds.main.path))
    r.r.add(LOAD_XETFS, COLUMN, rnd, res["seconds"], variant)
    r.r.add(LOAD_AMP, COLUMN, rnd, chunks / ds.chunks, variant)
    r.r.add(CPU_LOAD_DAEMON, COLUMN, rnd, per_gib(ds.main.size, cpu.daemon), variant)
    r.r.add(CPU_LOAD_WORKERS, COLUMN, rnd, per_gib(ds.main.size, cpu.workers), variant)
    r.r.add(CPU_LOAD_READER, COLUMN, rnd, per_gib(ds.main.size, res["cpu"]), variant)
    r.r.add(LOAD_CPU_BOUND, COLUMN, rnd, (cpu.daemon + cpu.workers + res["cpu"]) / CORES, variant)
    r.r.add(CPU_LOAD_ALL, COLUMN, rnd, per_gib(ds.main.size, cpu.daemon + cpu.workers + res["cpu"]), variant)


def t_dd(r: Runner, ds: Dataset, rnd: int, variant: str) -> None:
    """A cold sequential read of the model file on a fresh mount: what a load is held against."""
    cat_to_null(ds.xorbs)
    with r.primed(now=False) as go, r.mounts.xetfs(ds.store, variant=r.variant(variant)) as x:
        go()
        with r.cpu(x) as cpu:
            secs = dd(x.mountpoint / ds.main.hash, ds.main.size, r.timeout_for(ds.main.size))
    r.r.add(LOAD_DD, COLUMN, rnd, secs, variant)
    r.r.add(CPU_DD_ALL, COLUMN, rnd, per_gib(ds.main.size, cpu.daemon + cpu.workers + cpu.reader), variant)
    r.r.add(CPU_DD_READER, COLUMN, rnd, per_gib(ds.main.size, cpu.reader), variant)


def t_peer(r: Runner, ds: Dataset, rnd: int, _v: str) -> None:
    with peer_output(r, ds) as (work, out), r.primed():
        got = peer_download(r, ds, work, out)
        res = load(r, out, ds)
    r.r.add(LOAD_PEER, COLUMN, rnd, got["seconds"] + res["seconds"])
    r.r.add(CPU_LOAD_PEER, COLUMN, rnd, per_gib(ds.main.size, got["cpu"] + res["cpu"]))


def t_ceiling(r: Runner, ds: Dataset, rnd: int, _v: str) -> None:
    cat_to_null([ds.main.path])
    with r.primed(now=False) as go, r.mounts.ceiling([ds.main.path]) as c:
        go()
        with r.cpu(c) as cpu:
            res = load(r, c.mountpoint / ds.main.path.name, ds)
    r.r.add(LOAD_CEILING, COLUMN, rnd, res["seconds"])
    r.r.add(CPU_LOAD_CEILING, COLUMN, rnd, per_gib(ds.main.size, cpu.daemon))
    r.r.add(CPU_LOAD_CEILING_READER, COLUMN, rnd, per_gib(ds.main.size, res["cpu"]))


def t_plain(r: Runner, ds: Dataset, rnd: int, _v: str) -> None:
    cat_to_null([ds.main.path])
    with r.primed():
        res = load(r, ds.main.path, ds)
    r.r.add(LOAD_PLAIN, COLUMN, rnd, res["seconds"])
    r.r.add(CPU_LOAD_PLAIN, COLUMN, rnd, per_gib(ds.main.size, res["cpu"]))
