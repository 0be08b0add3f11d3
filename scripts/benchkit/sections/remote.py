"""Sections remote and remote-load: xetfs over nginx on loopback, beside the wire and a local mount.

For each data kind (a store written by hf_xet, served by nginx from the same
machine), every round measures:

* curl      the store's xorbs fetched whole by one ``curl`` (the wire's limit on loopback)
* obstore   the xorbs read in 8 MiB range requests, 8 at a time, with obstore (what xetfs uses)
* urllib    the same ranges with the standard library (http.client, one keep-alive
            connection per thread): the alternative client
* cold      a fresh ``xetfs mount http://...`` with the disk cache off: ``dd bs=1M`` of the file
* fill      the same with an empty disk cache (the cost of writing it)
* warm      then a fresh mount whose disk cache holds every byte: reads from the cache, not the wire
            (its files read into the page cache first, as the local store's xorbs are)
* local     a fresh mount of the store directory itself

``remote-load`` (run with ``remote`` too) loads the safetensors model of the
``load`` section (``safe_open`` and every ``get_tensor``) through a fresh
mount over nginx with the disk cache off, and through a fresh mount of the
store directory.

Throughputs are GB/s of the file (of the xorbs, for the clients); CPU is
seconds per GiB of everything involved (the daemon and its workers and the
reader, or the client); requests per GiB come from the daemon's counters.
"""

from __future__ import annotations

import contextlib
import http.client
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchkit.data import Dataset
from benchkit.paths import REPO
from benchkit.rounds import Runner, Task
from benchkit.rows import Row, Target, busy_row, per_gib, ratio
from benchkit.sections import Section
from benchkit.sections.load import load
from benchkit.util import BenchError, cat_to_null, children_cpu, dd, files_equal

sys.path.insert(0, str(REPO / "tests"))
from helpers import servers

RANGE = 8 * 1024 * 1024
THREADS = 8
NO_DISK_CACHE = ("--disk-cache-size", "0")
MODEL = "model"

CURL = Row("remote_curl", "curl, whole xorbs (the wire), GB/s of xorbs", "GB/s")
OBSTORE = Row("remote_obstore", "obstore, 8 MiB ranges x 8 threads, GB/s of xorbs", "GB/s")
URLLIB = Row("remote_urllib", "http.client, 8 MiB ranges x 8 threads, GB/s of xorbs", "GB/s")
COLD = Row("remote_cold", "xetfs over nginx, fresh mount, no disk cache", "GB/s", xetfs=True)
FILL = Row("remote_fill", "xetfs over nginx, filling an empty disk cache", "GB/s", xetfs=True)
WARM = Row("remote_warm", "xetfs, fresh mount, every byte from the disk cache", "GB/s", xetfs=True)
LOCAL = Row("remote_local", "xetfs, fresh mount of the store directory", "GB/s", xetfs=True)
R_COLD_CURL = Row("r_remote_curl", "remote mount / curl (per round)", "x", derive=ratio(COLD, CURL), xetfs=True)
R_COLD_LOCAL = Row("r_remote_local", "remote mount / local mount", "x", Target(">=", 0.8, ">= 0.8"),
                   derive=ratio(COLD, LOCAL), xetfs=True)  # fmt: skip
R_WARM_LOCAL = Row("r_remote_warm", "disk cache / local mount", "x", Target(">=", 0.9, ">= 0.9"),
                   derive=ratio(WARM, LOCAL), xetfs=True)  # fmt: skip
R_CLIENTS = Row("r_remote_clients", "obstore / http.client", "x", derive=ratio(OBSTORE, URLLIB))
CPU_CURL = Row("cpu_remote_curl", "CPU curl", "s/GiB")
CPU_OBSTORE = Row("cpu_remote_obstore", "CPU obstore client", "s/GiB")
CPU_URLLIB = Row("cpu_remote_urllib", "CPU http.client client", "s/GiB")
CPU_COLD = Row("cpu_remote_cold", "CPU remote mount (daemon + workers + dd)", "s/GiB", xetfs=True)
CPU_FILL = Row("cpu_remote_fill", "CPU filling the disk cache (daemon + workers + dd)", "s/GiB", xetfs=True)
CPU_WARM = Row("cpu_remote_warm", "CPU from the disk cache (daemon + workers + dd)", "s/GiB", xetfs=True)
CPU_LOCAL = Row("cpu_remote_local", "CPU local mount (daemon + workers + dd)", "s/GiB", xetfs=True)
REQ_CURL = Row("req_remote_curl", "requests per GiB: curl", "/GiB")
REQ_RANGES = Row("req_remote_ranges", "requests per GiB: 8 MiB ranges", "/GiB")
REQ_COLD = Row("req_remote_cold", "requests per GiB: remote mount", "/GiB", xetfs=True)
REQ_FILL = Row("req_remote_fill", "requests per GiB: filling the disk cache", "/GiB", xetfs=True)
REQ_WARM = Row("req_remote_warm", "requests per GiB: from the disk cache", "/GiB", xetfs=True)
R_CPU_COLD = Row("r_cpu_remote_local", "CPU remote mount / CPU local mount", "x", Target("<=", 1.2, "<= 1.2"),
                 derive=ratio(CPU_COLD, CPU_LOCAL), xetfs=True)  # fmt: skip
R_CPU_WARM = Row("r_cpu_remote_warm", "CPU disk cache / CPU local mount", "x", Target("<=", 1.1, "<= 1.1"),
                 derive=ratio(CPU_WARM, CPU_LOCAL), xetfs=True)  # fmt: skip
R_CPU_FILL = Row("r_cpu_remote_fill", "CPU filling the disk cache / CPU remote mount", "x", Target("<=", 1.3, "<= 1.3"),
                 derive=ratio(CPU_FILL, CPU_COLD), xetfs=True)  # fmt: skip
SENT_COLD = Row("sent_remote_cold", "xorb bytes nginx sent / xorb bytes the file needs: remote mount", "x",
                Target("<=", 1.02, "<= 1.02"), xetfs=True)  # fmt: skip
SENT_FILL = Row("sent_remote_fill", "xorb bytes nginx sent / xorb bytes the file needs: filling the disk cache", "x",
                Target("<=", 1.02, "<= 1.02"), xetfs=True)  # fmt: skip
SENT_WARM = Row("sent_remote_warm", "xorb bytes nginx sent / xorb bytes the file needs: from the disk cache", "x",
                xetfs=True)  # fmt: skip

BUSY = (
    busy_row("remote_curl", "curl", CURL, (CPU_CURL,)),
    busy_row("remote_obstore", "obstore client", OBSTORE, (CPU_OBSTORE,)),
    busy_row("remote_urllib", "http.client client", URLLIB, (CPU_URLLIB,)),
    busy_row("remote_cold", "remote mount (daemon + workers + dd)", COLD, (CPU_COLD,)),
    busy_row("remote_fill", "filling the disk cache (daemon + workers + dd)", FILL, (CPU_FILL,)),
    busy_row("remote_warm", "from the disk cache (daemon + workers + dd)", WARM, (CPU_WARM,)),
    busy_row("remote_local", "local mount (daemon + workers + dd)", LOCAL, (CPU_LOCAL,)),
)

ROWS = (CURL, OBSTORE, URLLIB, COLD, FILL, WARM, LOCAL, R_COLD_CURL, R_COLD_LOCAL, R_WARM_LOCAL, R_CLIENTS,
        CPU_CURL, CPU_OBSTORE, CPU_URLLIB, CPU_COLD, CPU_FILL, CPU_WARM, CPU_LOCAL,
        REQ_CURL, REQ_RANGES, REQ_COLD, REQ_FILL, REQ_WARM, R_CPU_COLD, R_CPU_WARM, R_CPU_FILL, SENT_COLD, SENT_FILL,
        SENT_WARM, *BUSY)  # fmt: skip

LOAD_REMOTE = Row("rload_remote", "xetfs over nginx, fresh mount, no disk cache", "s", xetfs=True)
LOAD_LOCAL = Row("rload_local", "xetfs, fresh mount of the store directory", "s", xetfs=True)
R_LOAD = Row("r_rload", "remote time / local time", "x", Target("<=", 1.2, "<= 1.2"),
             derive=ratio(LOAD_REMOTE, LOAD_LOCAL), xetfs=True)  # fmt: skip
CPU_LOAD_REMOTE = Row("cpu_rload_remote", "CPU remote (daemon + workers + loader)", "s/GiB", xetfs=True)
CPU_LOAD_LOCAL = Row("cpu_rload_local", "CPU local (daemon + workers + loader)", "s/GiB", xetfs=True)
REQ_LOAD = Row("req_rload_remote", "requests per GiB: remote", "/GiB", xetfs=True)

LOAD_ROWS = (LOAD_REMOTE, LOAD_LOCAL, R_LOAD, CPU_LOAD_REMOTE, CPU_LOAD_LOCAL, REQ_LOAD)


def load_busy_rows(r: Any) -> tuple[Row, ...]:
    """How busy the cores were in each load (CPU per GiB of the model: its size relates them)."""
    ds = r.data.get(MODEL)
    if ds is None:
        return ()
    gib = ds.main.size / 2**30
    return (
        busy_row("rload_remote", "remote load (daemon + workers + loader)", LOAD_REMOTE, (CPU_LOAD_REMOTE,), gib),
        busy_row("rload_local", "local load (daemon + workers + loader)", LOAD_LOCAL, (CPU_LOAD_LOCAL,), gib),
    )


SECTIONS = (
    Section(
        "remote",
        "Remote store over nginx on loopback: dd bs=1M of the file, GB/s (clients: of the xorbs)",
        lambda r: ROWS,
        lambda r: tuple(r.args.kinds),
    ),
    Section(
        "remote-load",
        "Remote store: loading the safetensors model (safe_open + every get_tensor), time to loaded, s",
        lambda r: LOAD_ROWS + load_busy_rows(r),
        lambda r: (MODEL,),
        also=("remote",),
    ),
)

LOAD_SELECTED = {"remote", "remote-load"}


def columns(args: Any, selected: set[str]) -> list[str]:
    return ([*args.kinds] if "remote" in selected else []) + ([MODEL] if LOAD_SELECTED & selected else [])


def tasks(r: Runner, selected: set[str]) -> list[Task]:
    out: list[Task] = []
    if "remote" in selected:
        for kind in r.args.kinds:
            ds = r.data[kind]
            out += [
                Task("remote-curl", kind, "", _bind(t_curl, r, ds, "")),
                Task("remote-obstore", kind, "", _bind(t_obstore, r, ds, "")),
                Task("remote-urllib", kind, "", _bind(t_urllib, r, ds, "")),
            ]
            for v in r.variants:
                out += [
                    Task("remote-cold", kind, v.name, _bind(t_cold, r, ds, v.name)),
                    Task("remote-fill-warm", kind, v.name, _bind(t_fill_warm, r, ds, v.name)),
                    Task("remote-local", kind, v.name, _bind(t_local, r, ds, v.name)),
                ]
    if LOAD_SELECTED & selected:
        ds = r.data[MODEL]
        for v in r.variants:
            out += [
                Task("remote-load", MODEL, v.name, _bind(t_load_remote, r, ds, v.name)),
                Task("remote-load-local", MODEL, v.name, _bind(t_load_local, r, ds, v.name)),
            ]
    return out


def _bind(fn: Any, r: Runner, ds: Dataset, variant: str) -> Any:
    return lambda rnd: fn(r, ds, rnd, variant)


def gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9


def ranges(sizes: dict[str, int], step: int = RANGE) -> list[tuple[str, int, int]]:
    """``(name, start, end)`` of every ``step``-byte range of every object, the last one of each shorter."""
    return [(name, at, min(size, at + step)) for name, size in sizes.items() for at in range(0, size, step)]


def xorb_sizes(ds: Dataset) -> dict[str, int]:
    return {p.relative_to(ds.store).as_posix(): p.stat().st_size for p in ds.xorbs}


@contextlib.contextmanager
def served(r: Runner, ds: Dataset) -> Iterator[servers.Server]:
    """nginx serving the data set's store (with the listing a remote store needs)."""
    if not r.extra.get(f"published:{ds.store}"):
        from xetfs.storage.remote import publish

        publish(ds.store)
        r.extra[f"published:{ds.store}"] = True
    cat_to_null(ds.xorbs)
    with servers.nginx(ds.store) as web:
        yield web


def needed_xorb_bytes(r: Runner, ds: Dataset) -> int:
    """The stored bytes of the chunks the main file's terms use (each chunk once, headers included)."""
    key = f"needed:{ds.store}"
    if key not in r.extra:
        from xetfs.base import hashes
        from xetfs.storage.indexer import load_index
        from xetfs.storage.store import Store

        store = Store.open(ds.store)
        idx = load_index(store).index
        entry = idx.get(hashes.from_hex(ds.main.hash))
        if entry is None:
            raise BenchError(f"{ds.main.hash} is not in {ds.store}")
        chunks: dict[bytes, set[int]] = {}
        for piece in idx.locate(entry, 0, entry.size):
            chunks.setdefault(piece.xorb_hash, set()).update(range(piece.start, piece.stop))
        total = 0
        for xorb_hash, used in chunks.items():
            layout = store.load_layout(xorb_hash)
            total += sum(layout.phys_ends[i] - layout.phys_start(i) for i in used)
        r.extra[key] = total
    needed: int = r.extra[key]
    return needed


def t_curl(r: Runner, ds: Dataset, rnd: int, _v: str) -> None:
    sizes = xorb_sizes(ds)
    wire = sum(sizes.values())
    with served(r, ds) as web, r.primed():
        url = web.url
        argv = ["curl", "-sf", *[a for name in sizes for a in (f"{url}/{name}", "-o", "/dev/null")]]
        cpu0, started = children_cpu(), time.perf_counter()
        proc = subprocess.run(argv, capture_output=True, timeout=r.timeout_for(wire), check=False)
        took, cpu = time.perf_counter() - started, children_cpu() - cpu0
    if proc.returncode != 0:
        raise BenchError(f"curl failed ({proc.returncode}): {proc.stderr.decode(errors='replace')[-300:]}")
    r.r.add(CURL, ds.kind, rnd, gbps(wire, took))
    r.r.add(CPU_CURL, ds.kind, rnd, per_gib(wire, cpu))
    r.r.add(REQ_CURL, ds.kind, rnd, len(sizes) / (wire / 2**30))


def _in_threads(fn: Callable[[tuple[str, int, int]], None], jobs: list[tuple[str, int, int]]) -> tuple[float, float]:
    """Wall and this process's CPU seconds to run ``fn`` on every job, ``THREADS`` at a time."""
    started, cpu0 = time.perf_counter(), time.process_time()
    with ThreadPoolExecutor(THREADS) as pool:
        list(pool.map(fn, jobs))
    return time.perf_counter() - started, time.process_time() - cpu0


def t_obstore(r: Runner, ds: Dataset, rnd: int, _v: str) -> None:
    import obstore
    from obstore.store import HTTPStore

    sizes = xorb_sizes(ds)
    jobs = ranges(sizes)
    with served(r, ds) as web, r.primed():
        store = HTTPStore.from_url(web.url, client_options={"allow_http": True})

        def one(job: tuple[str, int, int]) -> None:
            name, start, end = job
            got = len(memoryview(obstore.get_range(store, name, start=start, end=end)))
            if got != end - start:
                raise BenchError(f"obstore: {name} [{start}, {end}) gave {got} bytes")

        took, cpu = _in_threads(one, jobs)
    _clients(r, ds, rnd, OBSTORE, CPU_OBSTORE, sum(sizes.values()), took, cpu, len(jobs))


def t_urllib(r: Runner, ds: Dataset, rnd: int, _v: str) -> None:
    sizes = xorb_sizes(ds)
    jobs = ranges(sizes)
    local = threading.local()
    with served(r, ds) as web, r.primed():
        host, port = web.url.removeprefix("http://").split(":")

        def one(job: tuple[str, int, int]) -> None:
            name, start, end = job
            conn = getattr(local, "conn", None) or http.client.HTTPConnection(host, int(port), timeout=30)
            local.conn = conn
            conn.request("GET", f"/{name}", headers={"Range": f"bytes={start}-{end - 1}"})
            response = conn.getresponse()
            body = response.read()
            if response.status != 206 or len(body) != end - start:
                raise BenchError(f"http.client: {name} [{start}, {end}) gave {response.status}, {len(body)} bytes")

        took, cpu = _in_threads(one, jobs)
    _clients(r, ds, rnd, URLLIB, CPU_URLLIB, sum(sizes.values()), took, cpu, len(jobs))


def _clients(r: Runner, ds: Dataset, rnd: int, speed: Row, cpu_row: Row, wire: int, took: float, cpu: float,
             n: int) -> None:  # fmt: skip
    r.r.add(speed, ds.kind, rnd, gbps(wire, took))
    r.r.add(cpu_row, ds.kind, rnd, per_gib(wire, cpu))
    r.r.add(REQ_RANGES, ds.kind, rnd, n / (wire / 2**30))


def _read(
    r: Runner, ds: Dataset, what: str, store: Path | servers.Server, variant: str, *options: str
) -> tuple[float, float, int, float]:
    """A fresh mount of ``store``; ``dd`` of the file: seconds, CPU (daemon, workers, dd), HTTP requests, and
    the xorb bytes the server sent over those the file needs (footers included: from mounting on)."""
    web = store if isinstance(store, servers.Server) else None
    mark = web.log_mark() if web is not None else 0
    location = store.url if isinstance(store, servers.Server) else store
    with r.primed(now=False) as go, r.mounts.xetfs(location, *options, variant=r.variant(variant)) as x:
        go()
        path = x.mountpoint / ds.main.hash
        req0 = int(x.stats()["remote"]["requests"]) if web is not None else 0
        with r.cpu(x) as cpu:
            took = dd(path, ds.main.size, r.timeout_for(ds.main.size))
        requests = int(x.stats()["remote"]["requests"]) - req0 if web is not None else 0
        r.check_once(f"remote-{what}-{ds.kind}{variant and '@' + variant}", lambda: files_equal(path, ds.main.path))
    sent = web.bytes_sent(since=mark, under="/xorbs/")[0] / needed_xorb_bytes(r, ds) if web is not None else 0.0
    return took, cpu.daemon + cpu.workers + cpu.reader, requests, sent


def _mounted(r: Runner, ds: Dataset, rnd: int, variant: str, rows: tuple[Row, Row, Row | None, Row | None],
             got: tuple[float, float, int, float]) -> None:  # fmt: skip
    speed, cpu_row, req_row, sent_row = rows
    took, cpu, requests, sent = got
    r.r.add(speed, ds.kind, rnd, gbps(ds.main.size, took), variant)
    r.r.add(cpu_row, ds.kind, rnd, per_gib(ds.main.size, cpu), variant)
    if req_row is not None:
        r.r.add(req_row, ds.kind, rnd, requests / (ds.main.size / 2**30), variant)
    if sent_row is not None:
        r.r.add(sent_row, ds.kind, rnd, sent, variant)


def t_cold(r: Runner, ds: Dataset, rnd: int, variant: str) -> None:
    with served(r, ds) as web:
        got = _read(r, ds, "cold", web, variant, *NO_DISK_CACHE)
    _mounted(r, ds, rnd, variant, (COLD, CPU_COLD, REQ_COLD, SENT_COLD), got)


def t_fill_warm(r: Runner, ds: Dataset, rnd: int, variant: str) -> None:
    cache = r.work_dir("disk-cache")
    try:
        with served(r, ds) as web:
            fill = _read(r, ds, "fill", web, variant, "--cache-dir", str(cache))
            cat_to_null(sorted(p for p in cache.rglob("*") if p.is_file()))  # (in the page cache, as the local store)
            warm = _read(r, ds, "warm", web, variant, "--cache-dir", str(cache))
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    _mounted(r, ds, rnd, variant, (FILL, CPU_FILL, REQ_FILL, SENT_FILL), fill)
    _mounted(r, ds, rnd, variant, (WARM, CPU_WARM, REQ_WARM, SENT_WARM), warm)


def t_local(r: Runner, ds: Dataset, rnd: int, variant: str) -> None:
    cat_to_null(ds.xorbs)
    _mounted(r, ds, rnd, variant, (LOCAL, CPU_LOCAL, None, None), _read(r, ds, "local", ds.store, variant))


def _load(r: Runner, ds: Dataset, store: Path | str, variant: str, *options: str) -> tuple[float, float, int]:
    """A fresh mount of ``store``; the model loaded in a child process: seconds, CPU (daemon, workers, loader),
    HTTP requests."""
    with r.primed(now=False) as go, r.mounts.xetfs(store, *options, variant=r.variant(variant)) as x:
        go()
        remote = isinstance(store, str)
        req0 = int(x.stats()["remote"]["requests"]) if remote else 0
        with r.cpu(x) as cpu:
            res = load(r, x.mountpoint / ds.main.hash, ds)
        requests = int(x.stats()["remote"]["requests"]) - req0 if remote else 0
    if res["bytes"] <= 0:
        raise BenchError(f"the loader read no tensors from {store}")
    return float(res["seconds"]), cpu.daemon + cpu.workers + float(res["cpu"]), requests


def t_load_remote(r: Runner, ds: Dataset, rnd: int, variant: str) -> None:
    with served(r, ds) as web:
        took, cpu, requests = _load(r, ds, web.url, variant, *NO_DISK_CACHE)
    r.r.add(LOAD_REMOTE, MODEL, rnd, took, variant)
    r.r.add(CPU_LOAD_REMOTE, MODEL, rnd, per_gib(ds.main.size, cpu), variant)
    r.r.add(REQ_LOAD, MODEL, rnd, requests / (ds.main.size / 2**30), variant)


def t_load_local(r: Runner, ds: Dataset, rnd: int, variant: str) -> None:
    cat_to_null(ds.xorbs)
    took, cpu, _ = _load(r, ds, ds.store, variant)
    r.r.add(LOAD_LOCAL, MODEL, rnd, took, variant)
    r.r.add(CPU_LOAD_LOCAL, MODEL, rnd, per_gib(ds.main.size, cpu), variant)
