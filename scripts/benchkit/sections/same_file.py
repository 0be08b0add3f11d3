"""Section same-file: 1, 2 and 4 readers of one file at once (dd bs=1M each, started together).

On a fresh xetfs mount per count: aggregate throughput (readers x file size
over the wall time until the last one finishes), decode amplification
(chunks decoded over the distinct chunks of the file: readers that share a
file, like files that share chunks, should need each chunk decoded once) and
CPU per GiB delivered.  The ceiling FS does the same for reference.
"""

from __future__ import annotations

from typing import Any

from benchkit.data import Dataset
from benchkit.rounds import Runner, Task
from benchkit.rows import Row, busy_row, per_gib, ratio
from benchkit.sections import Section
from benchkit.sections.common import decoded_chunks, vs_floor
from benchkit.sections.parts import parts_task
from benchkit.util import cat_to_null, drop_file_pages, readers_wall

READERS = (1, 2, 4)
XETFS_GBPS = {n: Row(f"same_{n}", f"xetfs, {n} reader{'s' * (n > 1)}: aggregate", "GB/s", xetfs=True) for n in READERS}
CEILING_GBPS = {n: Row(f"same_ceiling_{n}", f"ceiling, {n} reader{'s' * (n > 1)}: aggregate", "GB/s") for n in READERS}
AMP = {n: Row(f"same_{n}_amp", f"xetfs, {n} reader{'s' * (n > 1)}: decode amplification", "x", xetfs=True)
       for n in READERS}  # fmt: skip
SCALE = {n: Row(f"r_same_{n}", f"xetfs {n} readers / 1 reader", "x", derive=ratio(XETFS_GBPS[n], XETFS_GBPS[1]),
                xetfs=True) for n in READERS if n > 1}  # fmt: skip
CEILING_SCALE = {n: Row(f"r_same_ceiling_{n}", f"ceiling {n} readers / 1 reader", "x",
                        derive=ratio(CEILING_GBPS[n], CEILING_GBPS[1])) for n in READERS if n > 1}  # fmt: skip
CPU_DAEMON = {n: Row(f"cpu_same_{n}_daemon", f"xetfs, {n} reader(s): CPU daemon per GiB delivered", "s/GiB",
                     xetfs=True) for n in READERS}  # fmt: skip
CPU_WORKERS = {n: Row(f"cpu_same_{n}_workers", f"xetfs, {n} reader(s): CPU decode workers per GiB delivered",
                      "s/GiB", xetfs=True) for n in READERS}  # fmt: skip
CPU_READER = {n: Row(f"cpu_same_{n}_reader", f"xetfs, {n} reader(s): CPU dd per GiB delivered", "s/GiB",
                     xetfs=True) for n in READERS}  # fmt: skip
CPU_CEILING = {n: Row(f"cpu_same_ceiling_{n}", f"ceiling, {n} reader(s): CPU daemon per GiB delivered", "s/GiB")
               for n in READERS}  # fmt: skip
FLOOR = {n: Row(f"r_cpu_same_{n}", f"xetfs, {n} reader(s): CPU (daemon + workers) / (ceiling + parts)", "x",
                derive=vs_floor(CPU_DAEMON[n], CPU_WORKERS[n], CPU_CEILING[n]), xetfs=True)
         for n in READERS}  # fmt: skip

BUSY = {n: busy_row(f"same_{n}", f"xetfs, {n} reader(s) (daemon + workers + dd)", XETFS_GBPS[n],
                    (CPU_DAEMON[n], CPU_WORKERS[n], CPU_READER[n])) for n in READERS}  # fmt: skip

ROWS = (
    *XETFS_GBPS.values(),
    *SCALE.values(),
    *AMP.values(),
    *CEILING_GBPS.values(),
    *CEILING_SCALE.values(),
    *(
        row
        for n in READERS
        for row in (CPU_DAEMON[n], CPU_WORKERS[n], CPU_READER[n], CPU_CEILING[n], FLOOR[n], BUSY[n])
    ),
)

SECTIONS = (
    Section(
        "same-file",
        "Readers of the same file at once (the main file of each kind), aggregate GB/s",
        lambda r: ROWS,
        lambda r: tuple(r.args.kinds),
    ),
)


def columns(args: Any, selected: set[str]) -> list[str]:
    return list(args.kinds) if "same-file" in selected else []


def tasks(r: Runner, selected: set[str]) -> list[Task]:
    if "same-file" not in selected:
        return []
    out = []
    for kind in r.args.kinds:
        ds = r.data[kind]
        for n in READERS:
            out += [Task(f"same-file-{n}", kind, v.name, _bind(t_xetfs, r, ds, n, v.name)) for v in r.variants]
        out += [Task("same-file-ceiling", kind, "", _bind(t_ceiling, r, ds, 0, "")), parts_task(r, kind)]
    return out


def _bind(fn: Any, r: Runner, ds: Dataset, n: int, variant: str) -> Any:
    return lambda rnd: fn(r, ds, n, rnd, variant)


def t_xetfs(r: Runner, ds: Dataset, n: int, rnd: int, variant: str) -> None:
    cat_to_null(ds.xorbs)
    total = n * ds.main.size
    with r.primed(now=False) as go, r.mounts.xetfs(ds.store, variant=r.variant(variant)) as x:
        go()
        path = x.mountpoint / ds.main.hash
        c0 = decoded_chunks(x)
        with r.cpu(x) as cpu:
            secs = readers_wall([path] * n, True, r.timeout_for(total))
        chunks = decoded_chunks(x) - c0
    r.r.add(XETFS_GBPS[n], ds.kind, rnd, total / secs / 1e9, variant)
    r.r.add(AMP[n], ds.kind, rnd, chunks / ds.chunks, variant)
    r.r.add(CPU_DAEMON[n], ds.kind, rnd, per_gib(total, cpu.daemon), variant)
    r.r.add(CPU_WORKERS[n], ds.kind, rnd, per_gib(total, cpu.workers), variant)
    r.r.add(CPU_READER[n], ds.kind, rnd, per_gib(total, cpu.reader), variant)


def t_ceiling(r: Runner, ds: Dataset, _n: int, rnd: int, _v: str) -> None:
    cat_to_null([ds.main.path])
    with r.primed(now=False) as go, r.mounts.ceiling([ds.main.path]) as c:
        go()
        path = c.mountpoint / ds.main.path.name
        for n in READERS if rnd % 2 == 0 else tuple(reversed(READERS)):
            drop_file_pages(path)
            total = n * ds.main.size
            with r.cpu(c) as cpu:
                secs = readers_wall([path] * n, True, r.timeout_for(total))
            r.r.add(CEILING_GBPS[n], ds.kind, rnd, total / secs / 1e9)
            r.r.add(CPU_CEILING[n], ds.kind, rnd, per_gib(total, cpu.daemon))
