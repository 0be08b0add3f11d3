"""Section parquet: a column projection plus a filter on a parquet file, with duckdb and with pyarrow.

The file (``data.write_table``: about --size bytes, several row groups;
int64, timestamp, dictionary-encoded string, float64, float32, bool and
string columns) is queried for four of its seven columns, keeping rows with
``score > 0.9 and flag``, grouped by category:

* duckdb: ``SELECT category, count(*), avg(value), max(ts) FROM
  read_parquet(...) WHERE score > 0.9 AND flag GROUP BY category``;
* pyarrow: ``pyarrow.parquet.read_table(columns=..., filters=...)`` then
  ``group_by(...).aggregate(...)``.

Each engine runs in its own process on a fresh xetfs mount and on the plain
file (and the ceiling, for the CPU floor); the answer must be the same
everywhere.  Amplification is chunks decoded over the distinct chunks of the
whole file (a projection reads part of it, so below 1 is possible); decoded
over requested is the bytes xetfs decoded over the bytes the kernel asked for
through FUSE (the query's reads and the kernel's read-ahead), from the
mount's ``decode.bytes`` and ``reads.bytes``: what prefetch decoded that
nobody read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchkit.data import Dataset
from benchkit.rounds import Runner, Task
from benchkit.rows import Row, Target, busy_row, per_gib, ratio
from benchkit.sections import Section
from benchkit.sections.common import run_json, settled_stats, vs_floor
from benchkit.sections.parts import parts_task
from benchkit.util import BenchError, cat_to_null

COLUMN = "table"
ENGINES = ("duckdb", "pyarrow")

QUERY = r"""
import hashlib, json, resource, sys, time
engine, path = sys.argv[1], sys.argv[2]
if engine == "duckdb":
    import duckdb
    con = duckdb.connect()
    con.execute("SET enable_progress_bar = false")  # it would print to stdout
else:
    import pyarrow.parquet as pq
r0 = resource.getrusage(resource.RUSAGE_SELF)
t0 = time.perf_counter()
if engine == "duckdb":
    rows = con.execute(
        "SELECT category, count(*), avg(value), max(ts) FROM read_parquet(?) "
        "WHERE score > 0.9 AND flag GROUP BY category ORDER BY category", [path]
    ).fetchall()
    answer = [(str(c), int(n), round(float(v), 9), str(t)) for c, n, v, t in rows]
else:
    t = pq.read_table(path, columns=["category", "value", "ts", "score", "flag"],
                      filters=[("score", ">", 0.9), ("flag", "==", True)])
    g = t.group_by("category").aggregate([("value", "count"), ("value", "mean"), ("ts", "max")]).to_pylist()
    answer = sorted((str(d["category"]), int(d["value_count"]), round(float(d["value_mean"]), 9), str(d["ts_max"]))
                    for d in g)
secs = time.perf_counter() - t0
r1 = resource.getrusage(resource.RUSAGE_SELF)
cpu = r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime
digest = hashlib.sha256(json.dumps([list(a) for a in answer]).encode()).hexdigest()
json.dump({"seconds": secs, "cpu": cpu, "groups": len(answer), "answer": digest}, sys.stdout)
"""

WHERE = ("xetfs", "ceiling", "plain")
TIME: dict[tuple[str, str], Row] = {}
CPU: dict[tuple[str, str], Row] = {}
AMP: dict[str, Row] = {}
PER_READ: dict[str, Row] = {}
CPU_WORKERS: dict[str, Row] = {}
CPU_READER: dict[str, Row] = {}
RATIO: dict[str, Row] = {}
FLOOR: dict[str, Row] = {}
_LABEL = {"xetfs": "xetfs, fresh mount", "ceiling": "ceiling FS", "plain": "plain file (page cache)"}
for _e in ENGINES:
    for _w in WHERE:
        TIME[_e, _w] = Row(f"pq_{_e}_{_w}", f"{_e}: {_LABEL[_w]}", "s", xetfs=_w == "xetfs")
    AMP[_e] = Row(f"pq_{_e}_amp", f"{_e}: xetfs decode amplification (decoded / distinct)", "x", xetfs=True)
    PER_READ[_e] = Row(f"pq_{_e}_decoded_per_read", f"{_e}: xetfs decoded bytes / bytes read through FUSE", "x",
                       Target("<=", 1.1, "<= 1.1"), xetfs=True)  # fmt: skip
    RATIO[_e] = Row(f"r_pq_{_e}", f"{_e}: xetfs time / plain time", "x", derive=ratio(TIME[_e, "xetfs"],
                    TIME[_e, "plain"]), xetfs=True)  # fmt: skip
    CPU[_e, "xetfs"] = Row(f"cpu_pq_{_e}_daemon", f"{_e}: CPU xetfs daemon", "s/GiB", xetfs=True)
    CPU_WORKERS[_e] = Row(f"cpu_pq_{_e}_workers", f"{_e}: CPU xetfs decode workers", "s/GiB", xetfs=True)
    CPU_READER[_e] = Row(f"cpu_pq_{_e}_reader", f"{_e}: CPU query process on xetfs", "s/GiB", xetfs=True)
    CPU[_e, "ceiling"] = Row(f"cpu_pq_{_e}_ceiling", f"{_e}: CPU ceiling daemon", "s/GiB")
    CPU[_e, "plain"] = Row(f"cpu_pq_{_e}_plain", f"{_e}: CPU query process on the plain file", "s/GiB")
    FLOOR[_e] = Row(f"r_cpu_pq_{_e}", f"{_e}: CPU xetfs (daemon + workers) / (ceiling + parts)", "x",
                    derive=vs_floor(CPU[_e, "xetfs"], CPU_WORKERS[_e], CPU[_e, "ceiling"]), xetfs=True)  # fmt: skip

ROWS = tuple(
    row
    for e in ENGINES
    for row in (
        *(TIME[e, w] for w in WHERE),
        RATIO[e],
        AMP[e],
        PER_READ[e],
        CPU[e, "xetfs"],
        CPU_WORKERS[e],
        CPU_READER[e],
        CPU[e, "ceiling"],
        CPU[e, "plain"],
        FLOOR[e],
    )
)


def busy_rows(r: Any) -> tuple[Row, ...]:
    """How busy the cores were in each query (its CPU rows are per GiB of the file: the file's size relates them)."""
    ds = r.data.get(COLUMN)
    if ds is None:
        return ()
    gib = ds.main.size / 2**30
    out: list[Row] = []
    for e in ENGINES:
        out += [
            busy_row(
                f"pq_{e}_xetfs",
                f"{e}: xetfs (daemon + workers + query)",
                TIME[e, "xetfs"],
                (CPU[e, "xetfs"], CPU_WORKERS[e], CPU_READER[e]),
                gib,
            ),
            busy_row(
                f"pq_{e}_ceiling",
                f"{e}: ceiling FS (daemon; the query not counted)",
                TIME[e, "ceiling"],
                (CPU[e, "ceiling"],),
                gib,
            ),
            busy_row(f"pq_{e}_plain", f"{e}: plain file (query)", TIME[e, "plain"], (CPU[e, "plain"],), gib),
        ]
    return tuple(out)


SECTIONS = (
    Section(
        "parquet",
        lambda r: f"Parquet projection + filter ({_describe(r)}), time, s; CPU per GiB of the file",
        lambda r: ROWS + busy_rows(r),
        lambda r: (COLUMN,),
    ),
)


def _describe(r: Any) -> str:
    ds = r.data.get(COLUMN)
    return f"{ds.main.size / 2**20:.0f} MiB, {r.extra.get('table_row_groups', '?')} row groups" if ds else ""


def columns(args: Any, selected: set[str]) -> list[str]:
    return [COLUMN] if "parquet" in selected else []


def tasks(r: Runner, selected: set[str]) -> list[Task]:
    if "parquet" not in selected:
        return []
    ds = r.data[COLUMN]
    import pyarrow.parquet as pq

    r.extra["table_row_groups"] = pq.ParquetFile(ds.main.path).metadata.num_row_groups
    out = []
    for e in ENGINES:
        out += [Task(f"parquet-{e}-xetfs", COLUMN, v.name, _bind(t_xetfs, r, ds, e, v.name)) for v in r.variants]
        for where, fn in (("ceiling", t_ceiling), ("plain", t_plain)):
            out.append(Task(f"parquet-{e}-{where}", COLUMN, "", _bind(fn, r, ds, e, "")))
    return [*out, parts_task(r, COLUMN)]


def _bind(fn: Any, r: Runner, ds: Dataset, engine: str, variant: str) -> Any:
    return lambda rnd: fn(r, ds, engine, rnd, variant)


def query(r: Runner, engine: str, path: Path, ds: Dataset, where: str) -> dict[str, Any]:
    res = run_json(["-c", QUERY, engine, str(path)], f"{engine} on {path}", r.timeout_for(ds.main.size))
    if res["groups"] == 0:
        raise BenchError(f"{engine} found no rows on {path}: the query tests nothing")
    seen = r.extra.setdefault(f"answer-{engine}", res["answer"])
    r.check_once(f"parquet-{engine}-{where}", lambda: seen == res["answer"])
    return res


def t_xetfs(r: Runner, ds: Dataset, engine: str, rnd: int, variant: str) -> None:
    cat_to_null(ds.xorbs)
    with r.primed(now=False) as go, r.mounts.xetfs(ds.store, variant=r.variant(variant)) as x:
        go()
        s0 = x.stats()
        with r.cpu(x) as cpu:
            res = query(r, engine, x.mountpoint / ds.main.hash, ds, f"xetfs{variant and '@' + variant}")
        s1 = settled_stats(x)
    chunks = s1["decode"]["chunks"] - s0["decode"]["chunks"]
    decoded = s1["decode"]["bytes"] - s0["decode"]["bytes"]
    read = s1["reads"]["bytes"] - s0["reads"]["bytes"]
    r.r.add(TIME[engine, "xetfs"], COLUMN, rnd, res["seconds"], variant)
    r.r.add(AMP[engine], COLUMN, rnd, chunks / ds.chunks, variant)
    r.r.add(PER_READ[engine], COLUMN, rnd, decoded / read if read else None, variant)
    r.r.add(CPU[engine, "xetfs"], COLUMN, rnd, per_gib(ds.main.size, cpu.daemon), variant)
    r.r.add(CPU_WORKERS[engine], COLUMN, rnd, per_gib(ds.main.size, cpu.workers), variant)
    r.r.add(CPU_READER[engine], COLUMN, rnd, per_gib(ds.main.size, res["cpu"]), variant)


def t_ceiling(r: Runner, ds: Dataset, engine: str, rnd: int, _v: str) -> None:
    cat_to_null([ds.main.path])
    with r.primed(now=False) as go, r.mounts.ceiling([ds.main.path]) as c:
        go()
        with r.cpu(c) as cpu:
            res = query(r, engine, c.mountpoint / ds.main.path.name, ds, "ceiling")
    r.r.add(TIME[engine, "ceiling"], COLUMN, rnd, res["seconds"])
    r.r.add(CPU[engine, "ceiling"], COLUMN, rnd, per_gib(ds.main.size, cpu.daemon))


def t_plain(r: Runner, ds: Dataset, engine: str, rnd: int, _v: str) -> None:
    cat_to_null([ds.main.path])
    with r.primed():
        res = query(r, engine, ds.main.path, ds, "plain")
    r.r.add(TIME[engine, "plain"], COLUMN, rnd, res["seconds"])
    r.r.add(CPU[engine, "plain"], COLUMN, rnd, per_gib(ds.main.size, res["cpu"]))
