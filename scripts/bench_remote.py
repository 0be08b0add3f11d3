#!/usr/bin/env python3
"""Remote-store benchmark: xetfs over nginx on loopback, side by side with the wire and a local mount.

    .venv/bin/python scripts/bench_remote.py --size 256M --kinds text --repeat 3
    .venv/bin/python scripts/bench_remote.py --json out.json

Needs root, /dev/fuse and nginx.  For each data kind (a store written by
hf_xet, ``benchkit.data.dataset``) served by nginx from the same machine, every
round measures, in a rotated order:

* curl      the store's xorbs fetched whole by one ``curl`` (the wire's limit on loopback)
* obstore   the xorbs read in 8 MiB range requests, 8 at a time, with obstore (what xetfs uses)
* urllib    the same ranges with the standard library (http.client, one keep-alive
            connection per thread): the alternative client
* remote    a fresh ``xetfs mount http://...`` with the disk cache off: ``dd bs=1M`` of the file
* fill      the same with an empty disk cache (the cost of writing it)
* warm      a fresh mount whose disk cache holds every byte: reads from the cache, not the wire
* local     a fresh mount of the store directory itself

With ``--safetensors``, also ``safetensors.numpy.load_file`` of a model of
``--size`` bytes (float32 tensors, packed with ``xetfs pack``) through a fresh
mount over nginx and of the store directory (``measure_safetensors``).

Rows give GB/s of the file (or of the xorbs, for the clients), CPU seconds
per GiB of everything involved (the daemon and its workers, or the client),
and HTTP requests per GiB.  ``measure()`` returns the figures as a dict, for
``scripts/bench.py`` to show in its own tables.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))
sys.path.insert(0, str(REPO / "tests"))
import servers  # noqa: E402
from benchkit import data as bench_data  # noqa: E402
from mounting import mounted  # noqa: E402

GiB = 1 << 30
RANGE = 8 * 1024 * 1024
THREADS = 8
TICK = os.sysconf("SC_CLK_TCK")


def tree_cpu(pid: int) -> float:
    """CPU seconds (user + system) of ``pid`` and its live descendants."""
    total = 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / TICK
        for task in Path(f"/proc/{pid}/task").iterdir():
            for child in (task / "children").read_text().split():
                total += tree_cpu(int(child))
    except (OSError, IndexError, ValueError):
        pass
    return total


def dd(path: Path, size: int) -> float:
    started = time.perf_counter()
    proc = subprocess.run(["dd", f"if={path}", "of=/dev/null", "bs=1M"], capture_output=True, check=False)
    took = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(f"dd {path} failed: {proc.stderr.decode()[-300:]}")
    return took


def mounted_read(store: str, name: str, size: int, *options: str) -> dict[str, float]:
    """A fresh mount of ``store``; ``dd`` of ``name``; seconds, CPU of the daemon tree, requests."""
    with mounted(store, *options) as m:
        cpu0 = tree_cpu(m.proc.pid)
        took = dd(m / name, size)
        cpu = tree_cpu(m.proc.pid) - cpu0
        remote = m.stats()["remote"]
    return {"seconds": took, "cpu": cpu, "requests": remote["requests"], "wire_bytes": remote["bytes"]}


def curl(urls: list[str]) -> dict[str, float]:
    started = time.perf_counter()
    before = os.times()
    subprocess.run(["curl", "-sf", *[a for u in urls for a in (u, "-o", "/dev/null")]], check=True)
    after = os.times()
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    return {"seconds": time.perf_counter() - started, "cpu": cpu, "requests": len(urls)}


def _ranges(sizes: dict[str, int]) -> list[tuple[str, int, int]]:
    return [(name, at, min(size, at + RANGE)) for name, size in sizes.items() for at in range(0, size, RANGE)]


def _timed(fn: Callable[[], None]) -> tuple[float, float]:
    started, cpu0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - started, time.process_time() - cpu0


def obstore_ranges(base: str, sizes: dict[str, int]) -> dict[str, float]:
    import obstore
    from obstore.store import HTTPStore

    store = HTTPStore.from_url(base, client_options={"allow_http": True})
    jobs = _ranges(sizes)

    def one(job: tuple[str, int, int]) -> None:
        name, start, end = job
        assert len(memoryview(obstore.get_range(store, name, start=start, end=end))) == end - start

    def run() -> None:
        with ThreadPoolExecutor(THREADS) as pool:
            list(pool.map(one, jobs))

    took, cpu = _timed(run)
    return {"seconds": took, "cpu": cpu, "requests": len(jobs)}


def urllib_ranges(base: str, sizes: dict[str, int]) -> dict[str, float]:
    host, port = base.removeprefix("http://").split(":")
    jobs = _ranges(sizes)
    import threading

    local = threading.local()

    def one(job: tuple[str, int, int]) -> None:
        name, start, end = job
        conn = getattr(local, "conn", None) or http.client.HTTPConnection(host, int(port), timeout=30)
        local.conn = conn
        conn.request("GET", f"/{name}", headers={"Range": f"bytes={start}-{end - 1}"})
        response = conn.getresponse()
        data = response.read()
        assert response.status == 206 and len(data) == end - start

    def run() -> None:
        with ThreadPoolExecutor(THREADS) as pool:
            list(pool.map(one, jobs))

    took, cpu = _timed(run)
    return {"seconds": took, "cpu": cpu, "requests": len(jobs)}


def measure(data_dir: Path, kind: str, size: int, repeat: int = 3) -> dict[str, Any]:
    """Figures for one data kind: per configuration, the median over ``repeat`` rounds of GB/s,
    CPU s per GiB and requests per GiB, and ratios per round."""
    data = bench_data.dataset(data_dir, kind, size)
    from xetfs.remote import publish

    publish(data.store)
    xorbs = {p.relative_to(data.store).as_posix(): p.stat().st_size for p in data.xorbs}
    wire = sum(xorbs.values())
    name, file_size = data.main.hash, data.main.size
    rounds: dict[str, list[dict[str, float]]] = {}
    with servers.nginx(data.store) as web:
        cache = Path(tempfile.mkdtemp(prefix="xetfs-bench-cache-"))
        try:
            configs: dict[str, Callable[[], dict[str, float]]] = {
                "curl": lambda: curl([f"{web.url}/{x}" for x in xorbs]),
                "obstore": lambda: obstore_ranges(web.url, xorbs),
                "urllib": lambda: urllib_ranges(web.url, xorbs),
                "remote": lambda: mounted_read(web.url, name, file_size, "--disk-cache-size", "0"),
                "local": lambda: mounted_read(str(data.store), name, file_size),
            }

            def fill_and_warm() -> None:
                shutil.rmtree(cache, ignore_errors=True)
                fill = mounted_read(web.url, name, file_size, "--cache-dir", str(cache))
                warm = mounted_read(web.url, name, file_size, "--cache-dir", str(cache))
                rounds.setdefault("fill", []).append(fill)
                rounds.setdefault("warm", []).append(warm)

            for r in range(repeat + 1):  # round 0 warms up and is not recorded
                order = [*configs, "fill+warm"]
                order = order[r % len(order) :] + order[: r % len(order)]
                for key in order:
                    if key == "fill+warm":
                        if r:
                            fill_and_warm()
                        else:
                            shutil.rmtree(cache, ignore_errors=True)
                        continue
                    result = configs[key]()
                    if r:
                        rounds.setdefault(key, []).append(result)
        finally:
            shutil.rmtree(cache, ignore_errors=True)
    out: dict[str, Any] = {"kind": kind, "file_bytes": file_size, "xorb_bytes": wire, "rows": {}}
    for key, results in rounds.items():
        moved = wire if key in ("curl", "obstore", "urllib") else file_size
        out["rows"][key] = {
            "GB/s": statistics.median(moved / r["seconds"] / 1e9 for r in results),
            "cpu_s_per_GiB": statistics.median(r["cpu"] / (moved / GiB) for r in results),
            "requests_per_GiB": statistics.median(r["requests"] / (moved / GiB) for r in results),
        }
    n = len(rounds["remote"])
    for num, den in (("remote", "curl"), ("remote", "local"), ("warm", "local"), ("obstore", "urllib")):
        ratios = []
        for i in range(n):
            a = (file_size if num in ("remote", "warm") else wire) / rounds[num][i]["seconds"]
            b = (file_size if den == "local" else wire) / rounds[den][i]["seconds"]
            ratios.append(a / b)
        out[f"{num}/{den}"] = statistics.median(ratios)
    return out


def safetensors_store(data_dir: Path, size: int) -> Path:
    """A store (``xetfs pack``) holding ``model.safetensors``: float32 tensors of ``size`` bytes in all."""
    import numpy as np
    from safetensors.numpy import save_file

    root = data_dir / "data" / f"safetensors-{size}-v1"
    if not (root / "done").exists():
        shutil.rmtree(root, ignore_errors=True)
        (root / "src").mkdir(parents=True)
        rng = np.random.default_rng(7)
        per = 16 * 1024 * 1024
        tensors = {f"layer{i}.weight": rng.standard_normal(per // 4, dtype=np.float32) for i in range(size // per)}
        save_file(tensors, str(root / "src" / "model.safetensors"))
        env = {**os.environ, "HF_XET_CACHE": str(root / "hf_xet")}
        subprocess.run([sys.executable, "-m", "xetfs", "pack", "--no-progress", str(root / "src"), str(root / "store")],
                       check=True, env=env, capture_output=True)  # fmt: skip
        (root / "done").touch()
    return root / "store"


def _load_safetensors(store: str, *options: str) -> dict[str, float]:
    from safetensors.numpy import load_file

    with mounted(store, *options) as m:
        cpu0, own0 = tree_cpu(m.proc.pid), time.process_time()
        started = time.perf_counter()
        tensors = load_file(str(m / "model.safetensors"))
        took = time.perf_counter() - started
        cpu = tree_cpu(m.proc.pid) - cpu0 + time.process_time() - own0
        requests = m.stats()["remote"]["requests"]
    assert tensors
    return {"seconds": took, "cpu": cpu, "requests": requests}


def measure_safetensors(data_dir: Path, size: int, repeat: int = 3) -> dict[str, Any]:
    """``safetensors.numpy.load_file`` of a ``size``-byte model through a fresh mount: over nginx (no disk
    cache) and of the store directory; medians of GB/s, CPU s per GiB (daemon and loader) and the ratio."""
    store = safetensors_store(data_dir, size)
    file_size = (store.parent / "src" / "model.safetensors").stat().st_size
    rounds: dict[str, list[dict[str, float]]] = {"remote": [], "local": []}
    with servers.nginx(store) as web:
        for r in range(repeat + 1):
            order = ["remote", "local"] if r % 2 else ["local", "remote"]
            for key in order:
                result = _load_safetensors(web.url, "--disk-cache-size", "0") if key == "remote" else (
                    _load_safetensors(str(store)))  # fmt: skip
                if r:
                    rounds[key].append(result)
    out: dict[str, Any] = {"kind": "safetensors", "file_bytes": file_size, "rows": {}}
    for key, results in rounds.items():
        out["rows"][key] = {
            "GB/s": statistics.median(file_size / r["seconds"] / 1e9 for r in results),
            "cpu_s_per_GiB": statistics.median(r["cpu"] / (file_size / GiB) for r in results),
            "requests_per_GiB": statistics.median(r["requests"] / (file_size / GiB) for r in results),
        }
    out["remote/local"] = statistics.median(
        b["seconds"] / a["seconds"] for a, b in zip(rounds["remote"], rounds["local"], strict=True)
    )
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=lambda t: int(float(t.rstrip("MG")) * (GiB if t.endswith("G") else 1 << 20)),
                   default="256M", help="file size per kind (default 256M)")  # fmt: skip
    p.add_argument("--kinds", default="text", help="comma-separated: random,text,float32")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--data-dir", type=Path, default=Path(tempfile.gettempdir()) / "xetfs-bench")
    p.add_argument("--json", type=Path)
    p.add_argument("--safetensors", action="store_true", help="also load a safetensors model (needs safetensors)")
    args = p.parse_args(argv)
    results = [measure(args.data_dir, kind, args.size, args.repeat) for kind in args.kinds.split(",") if kind]
    if args.safetensors:
        results.append(measure_safetensors(args.data_dir, args.size, args.repeat))
    for res in results:
        xorbs = f", xorbs {res['xorb_bytes'] / 1e6:.0f} MB" if "xorb_bytes" in res else ""
        print(f"\n{res['kind']}: file {res['file_bytes'] / 1e6:.0f} MB{xorbs}")
        print(f"  {'':<10}{'GB/s':>8}{'CPU s/GiB':>12}{'req/GiB':>10}")
        for key, row in res["rows"].items():
            print(f"  {key:<10}{row['GB/s']:>8.2f}{row['cpu_s_per_GiB']:>12.2f}{row['requests_per_GiB']:>10.0f}")
        for key in ("remote/curl", "remote/local", "warm/local", "obstore/urllib"):
            if key in res:
                print(f"  {key:<16}{res[key]:.2f}x")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
