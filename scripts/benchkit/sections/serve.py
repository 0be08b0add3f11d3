"""Section serve: `hf_hub_download` through `xetfs serve`, beside hf_xet on local:// and curl from nginx.

For the ``random`` and ``text`` kinds, the main file is packed once as the
``main`` revision of a Hub repo (``xetfs pack DIR STORE --repo
bench/KIND``: the store has a Hub catalogue).  Every round measures:

* serve        `xetfs serve STORE` on loopback; a fresh client process with
               ``HF_ENDPOINT`` pointing at it and an empty ``HF_HUB_CACHE``
               (under --peer-out-dir, like hf_xet's output) runs
               ``hf_hub_download(repo, "data.bin")``: hf_xet's CAS routes,
               every xorb range checked by the server before it is sent
* serve plain  the same with ``HF_HUB_DISABLE_XET=1``: the file as one plain
               ``GET`` of ``resolve`` (what clients without hf_xet get)
* peer         hf_xet's ``download_files`` from the same store through
               ``local://`` to --peer-out-dir (as in the ``peer`` section)
* curl         nginx serving the original file; ``curl -o`` to --peer-out-dir

Times are the client's: the call inside the process (after its imports),
or curl's whole run.  CPU per GiB of the file on both sides: the server
process (``xetfs serve``, or nginx) and the client (huggingface_hub and
hf_xet, or curl).
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchkit import data as bench_data
from benchkit.data import Dataset, PackedDir
from benchkit.paths import REPO
from benchkit.rounds import Runner, Task
from benchkit.rows import Row, Target, busy_row, per_gib, ratio
from benchkit.sections import Section
from benchkit.sections.common import run_json
from benchkit.sections.sequential import peer_download, peer_output
from benchkit.util import BenchError, cat_to_null, children_cpu, files_equal, tree_cpu

sys.path.insert(0, str(REPO / "tests"))
from helpers import servers

SERVE_KINDS = ("random", "text")
NAME = "data.bin"

SERVE = Row("serve", "hf_hub_download through xetfs serve (hf_xet)", "GB/s")
SERVE_PLAIN = Row("serve_plain", "hf_hub_download through xetfs serve, HF_HUB_DISABLE_XET=1", "GB/s")
PEER = Row("serve_peer", "hf_xet download_files, local:// store", "GB/s")
CURL = Row("serve_curl", "curl of the plain file from nginx", "GB/s")
R_PEER = Row("r_serve_peer", "xetfs serve / hf_xet local://", "x", Target(">=", 0.8, ">= 0.8"),
             derive=ratio(SERVE, PEER))  # fmt: skip
R_CURL = Row("r_serve_curl", "xetfs serve / curl from nginx", "x", derive=ratio(SERVE, CURL))
R_PLAIN = Row("r_serve_plain", "xetfs serve plain GET / curl from nginx", "x", derive=ratio(SERVE_PLAIN, CURL))
CPU_SERVER = Row("cpu_serve_server", "CPU xetfs serve (its server processes)", "s/GiB")
CPU_CLIENT = Row("cpu_serve_client", "CPU client: huggingface_hub + hf_xet", "s/GiB")
CPU_PLAIN_SERVER = Row("cpu_serve_plain_server", "CPU xetfs serve, plain GET (its server processes)", "s/GiB")
CPU_PLAIN_CLIENT = Row("cpu_serve_plain_client", "CPU client, plain GET: huggingface_hub", "s/GiB")
CPU_PEER = Row("cpu_serve_peer", "CPU hf_xet download_files", "s/GiB")
CPU_NGINX = Row("cpu_serve_nginx", "CPU nginx", "s/GiB")
CPU_CURL = Row("cpu_serve_curl", "CPU curl", "s/GiB")
BUSY_SERVE = busy_row("serve", "xetfs serve (server + client)", SERVE, (CPU_SERVER, CPU_CLIENT))
BUSY_PLAIN = busy_row("serve_plain", "xetfs serve plain GET (server + client)", SERVE_PLAIN,
                      (CPU_PLAIN_SERVER, CPU_PLAIN_CLIENT))  # fmt: skip
BUSY_PEER = busy_row("serve_peer", "hf_xet local://", PEER, (CPU_PEER,))
BUSY_CURL = busy_row("serve_curl", "nginx + curl", CURL, (CPU_NGINX, CPU_CURL))

ROWS = (SERVE, SERVE_PLAIN, PEER, CURL, R_PEER, R_CURL, R_PLAIN, CPU_SERVER, CPU_CLIENT, CPU_PLAIN_SERVER,
        CPU_PLAIN_CLIENT, CPU_PEER, CPU_NGINX, CPU_CURL, BUSY_SERVE, BUSY_PLAIN, BUSY_PEER, BUSY_CURL)  # fmt: skip


def kinds(args: Any) -> tuple[str, ...]:
    return tuple(k for k in args.kinds if k in SERVE_KINDS)


SECTIONS = (
    Section(
        "serve",
        "xetfs serve: hf_hub_download of the file over loopback, GB/s, beside hf_xet local:// and curl from nginx",
        lambda r: ROWS,
        lambda r: kinds(r.args),
    ),
)

CLIENT = r"""
import json, os, resource, sys, time
from huggingface_hub import hf_hub_download
repo, name = sys.argv[1], sys.argv[2]
r0 = resource.getrusage(resource.RUSAGE_SELF)
t0 = time.perf_counter()
path = hf_hub_download(repo, name)
secs = time.perf_counter() - t0
r1 = resource.getrusage(resource.RUSAGE_SELF)
cpu = r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime
print(json.dumps({"seconds": secs, "cpu": cpu, "path": path, "size": os.path.getsize(path)}))
"""


def columns(args: Any, selected: set[str]) -> list[str]:
    return list(kinds(args)) if "serve" in selected else []


def tasks(r: Runner, selected: set[str]) -> list[Task]:
    if "serve" not in selected:
        return []
    out = []
    for kind in kinds(r.args):
        ds = r.data[kind]
        out += [
            Task("serve", kind, "", _bind(t_serve, r, ds, False)),
            Task("serve-plain", kind, "", _bind(t_serve, r, ds, True)),
            Task("serve-peer", kind, "", _bind(t_peer, r, ds, False)),
            Task("serve-curl", kind, "", _bind(t_curl, r, ds, False)),
        ]
    return out


def _bind(fn: Any, r: Runner, ds: Dataset, flag: bool) -> Any:
    return lambda rnd: fn(r, ds, rnd, flag)


def repo_of(kind: str) -> str:
    return f"bench/{kind}"


def packed(r: Runner, ds: Dataset) -> PackedDir:
    """The data set's main file as the repo ``bench/KIND`` (packed once, kept under --data-dir)."""
    key = f"serve_store:{ds.kind}"
    if key not in r.extra:
        r.extra[key] = bench_data.repo_store(r.args.data_dir, ds, repo_of(ds.kind))
    store: PackedDir = r.extra[key]
    return store


def t_serve(r: Runner, ds: Dataset, rnd: int, plain: bool) -> None:
    store = packed(r, ds)
    cat_to_null(store.xorbs)
    # At its default log level, as users run it (the test helper's info level logs every request).
    with servers.xetfs_serve(store.store, "--log-level", "warning") as web, r.memory_dir("hub") as cache:
        if web.proc is None:
            raise BenchError("xetfs serve has no process to account CPU to")
        env = dict(os.environ, HF_ENDPOINT=web.url, HF_HUB_CACHE=str(cache / "hub"), HF_HOME=str(cache / "home"),
                   HF_XET_CACHE=str(cache / "xet"), HF_HUB_DISABLE_TELEMETRY="1", DO_NOT_TRACK="1",
                   HF_HUB_DISABLE_PROGRESS_BARS="1")  # fmt: skip
        env.pop("HF_HUB_OFFLINE", None)
        env.pop("HF_TOKEN", None)
        if plain:
            env["HF_HUB_DISABLE_XET"] = "1"
        else:
            env.pop("HF_HUB_DISABLE_XET", None)
        with r.primed():
            s0 = sum(tree_cpu(web.proc.pid))
            res = run_json(["-c", CLIENT, repo_of(ds.kind), NAME], f"hf_hub_download from xetfs serve ({ds.kind})",
                           r.timeout_for(ds.main.size), env=env)  # fmt: skip
            server = sum(tree_cpu(web.proc.pid)) - s0
        if res["size"] != ds.main.size:
            raise BenchError(f"hf_hub_download wrote {res['size']} bytes, expected {ds.main.size}")
        what = "plain" if plain else "xet"
        r.check_once(f"serve-{what}-{ds.kind}", lambda: files_equal(Path(res["path"]), ds.main.path))
    speed, cpu_server, cpu_client = (SERVE_PLAIN, CPU_PLAIN_SERVER, CPU_PLAIN_CLIENT) if plain else (
        SERVE, CPU_SERVER, CPU_CLIENT)  # fmt: skip
    r.r.add(speed, ds.kind, rnd, ds.main.size / res["seconds"] / 1e9)
    r.r.add(cpu_server, ds.kind, rnd, per_gib(ds.main.size, server))
    r.r.add(cpu_client, ds.kind, rnd, per_gib(ds.main.size, res["cpu"]))


def t_peer(r: Runner, ds: Dataset, rnd: int, _flag: bool) -> None:
    store = packed(r, ds)
    same = dataclasses.replace(ds, store=store.store)  # the main file's Xet hash is the same in both stores
    with peer_output(r, same) as (work, out), r.primed():
        res = peer_download(r, same, work, out)
    r.r.add(PEER, ds.kind, rnd, ds.main.size / res["seconds"] / 1e9)
    r.r.add(CPU_PEER, ds.kind, rnd, per_gib(ds.main.size, res["cpu"]))


def t_curl(r: Runner, ds: Dataset, rnd: int, _flag: bool) -> None:
    store = packed(r, ds)
    cat_to_null([store.files / NAME])
    with servers.nginx(store.files) as web, r.memory_dir("curl") as out:
        if web.proc is None:
            raise BenchError("nginx has no process to account CPU to")
        target = out / NAME
        with r.primed():
            n0, c0, t0 = sum(tree_cpu(web.proc.pid)), children_cpu(), time.perf_counter()
            proc = subprocess.run(["curl", "-sf", f"{web.url}/{NAME}", "-o", str(target)], capture_output=True,
                                  timeout=r.timeout_for(ds.main.size), check=False)  # fmt: skip
            took, curl = time.perf_counter() - t0, children_cpu() - c0
            nginx = sum(tree_cpu(web.proc.pid)) - n0
        if proc.returncode != 0 or target.stat().st_size != ds.main.size:
            raise BenchError(f"curl from nginx failed ({proc.returncode}): {proc.stderr.decode(errors='replace')}")
    r.r.add(CURL, ds.kind, rnd, ds.main.size / took / 1e9)
    r.r.add(CPU_CURL, ds.kind, rnd, per_gib(ds.main.size, curl))
    r.r.add(CPU_NGINX, ds.kind, rnd, per_gib(ds.main.size, nginx))
