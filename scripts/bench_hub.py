#!/usr/bin/env python3
"""The ``hub`` benchmark: a huggingface_hub cache imported into a store, then loaded by repo id through a mount.

    .venv/bin/python scripts/bench_hub.py                    # 3 revisions of a 128 MiB model, 3 rounds
    .venv/bin/python scripts/bench_hub.py --tensor-mib 2 --rounds 2 --json out.json

Needs root and /dev/fuse.  ``measure_hub()`` returns the figures as a dict,
so the main benchmark can run it as one of its sections.  It measures:

* import: ``xetfs pack --hub-cache`` of a cache written the way
  huggingface_hub writes it (``tests/hub_cache.py``): three revisions of a
  model whose safetensors differ in one of eight tensors each, plus a small
  dataset.  Wall time, CPU time, throughput (cache bytes / wall) and the
  dedup ratio (cache bytes / store bytes added).
* load: in a fresh process with ``HF_HUB_CACHE`` set and
  ``HF_HUB_OFFLINE=1``, ``AutoConfig.from_pretrained(repo)`` and a
  safetensors load of every tensor of ``hf_hub_download(repo,
  "model.safetensors")`` (``safe_open``, which memory-maps the file), timed
  inside the process after the imports.  On the original cache directory
  (page-cached), through a fresh mount (cold: nothing decoded yet), and
  again through the same mount (warm).  Rounds are interleaved; each figure
  is the median [min-max].  CPU is the loader's plus, for the mount, the
  daemon's and its decode workers'.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
import hub_cache  # noqa: E402
from mounting import mounted  # noqa: E402

LOADER = r"""
import hashlib, json, os, resource, sys, time
from transformers import AutoConfig
from huggingface_hub import hf_hub_download
from safetensors import safe_open
repo = sys.argv[1]
cpu0 = resource.getrusage(resource.RUSAGE_SELF)
t0 = time.perf_counter()
config = AutoConfig.from_pretrained(repo)
n = 0
with safe_open(hf_hub_download(repo, "model.safetensors"), framework="np") as f:
    for key in f.keys():
        n += f.get_tensor(key).nbytes
wall = time.perf_counter() - t0
cpu1 = resource.getrusage(resource.RUSAGE_SELF)
cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
print(json.dumps({"wall": wall, "cpu": cpu, "bytes": n, "config": type(config).__name__}))
"""


def _clock_ticks() -> int:
    return os.sysconf("SC_CLK_TCK")


def tree_cpu(pid: int) -> float:
    """CPU seconds (user + system) of ``pid`` and its live children (the decode workers)."""
    total = 0.0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(entry) == pid or int(fields[1]) == pid:  # fields[1] is the parent pid
            total += (int(fields[11]) + int(fields[12])) / _clock_ticks()
    return total


def load(cache: Path, work: Path) -> dict[str, Any]:
    env = dict(os.environ, HF_HUB_CACHE=str(cache), HF_HUB_OFFLINE="1", HF_HOME=str(work / "hf_home"),
               TRANSFORMERS_VERBOSITY="error", HF_HUB_DISABLE_TELEMETRY="1")  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", LOADER, hub_cache.MODEL], capture_output=True, text=True, env=env,
                          timeout=600, check=False)  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"loader failed on {cache}:\n{proc.stderr}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def measure_hub(work: Path, *, tensor_mib: float = 16, rounds: int = 3) -> dict[str, Any]:
    """Run the hub benchmark in ``work`` (created); returns the figures (see the module docstring)."""
    work.mkdir(parents=True, exist_ok=True)
    floats = int(tensor_mib * 1024 * 1024 / 4)
    spec = hub_cache.make_hub_cache(work / "cache", floats=floats)
    store = work / "store"
    env = dict(os.environ, HF_XET_CACHE=str(work / "hf_xet"), HF_HUB_DISABLE_TELEMETRY="1")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "xetfs", "pack", "--hub-cache", str(spec.root), str(store),
                           "--no-progress"], capture_output=True, text=True, env=env, cwd=REPO, timeout=3600,
                          check=True)  # fmt: skip
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    m = re.search(r"(\d+) cache bytes -> (\d+) store bytes added", proc.stdout)
    if m is None:
        raise RuntimeError(f"unexpected pack output: {proc.stdout}")
    cache_bytes, store_bytes = int(m.group(1)), int(m.group(2))
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    result: dict[str, Any] = {
        "import": {
            "cache_bytes": cache_bytes,
            "store_bytes": store_bytes,
            "dedup_ratio": cache_bytes / store_bytes,
            "wall_s": wall,
            "cpu_s": cpu,
            "throughput_MBps": cache_bytes / wall / 1e6,
            "cpu_s_per_GiB": cpu / (cache_bytes / 2**30),
        },
        "model_bytes": spec.tensor_bytes,
    }
    samples: dict[str, list[float]] = {k: [] for k in ("plain", "cold", "warm", "plain_cpu", "cold_cpu", "warm_cpu")}
    for _ in range(rounds):
        plain = load(spec.root, work)
        samples["plain"].append(plain["wall"])
        samples["plain_cpu"].append(plain["cpu"])
        with mounted(store) as mnt:
            for label in ("cold", "warm"):
                daemon0 = tree_cpu(mnt.proc.pid)
                got = load(mnt.path, work)
                samples[label].append(got["wall"])
                samples[f"{label}_cpu"].append(got["cpu"] + tree_cpu(mnt.proc.pid) - daemon0)
                if got["bytes"] != plain["bytes"]:
                    raise RuntimeError(f"mount loaded {got['bytes']} bytes, the cache {plain['bytes']}")
    result["load_s"] = {k: summary(v) for k, v in samples.items() if not k.endswith("_cpu")}
    result["load_cpu_s"] = {k.removesuffix("_cpu"): summary(v) for k, v in samples.items() if k.endswith("_cpu")}
    result["cold_over_plain"] = summary([c / p for c, p in zip(samples["cold"], samples["plain"], strict=True)])
    result["warm_over_plain"] = summary([w / p for w, p in zip(samples["warm"], samples["plain"], strict=True)])
    return result


def render(r: dict[str, Any]) -> str:
    imp = r["import"]

    def cell(s: dict[str, float], unit: str = "s") -> str:
        return f"{s['median']:.3f} {unit} [{s['min']:.3f}-{s['max']:.3f}]"

    lines = [
        f"import: {imp['cache_bytes'] / 2**20:.1f} MiB cache -> {imp['store_bytes'] / 2**20:.1f} MiB store "
        f"(dedup {imp['dedup_ratio']:.2f}x) in {imp['wall_s']:.2f} s, {imp['throughput_MBps']:.0f} MB/s, "
        f"CPU {imp['cpu_s']:.2f} s ({imp['cpu_s_per_GiB']:.2f} s/GiB)",
        f"AutoConfig + safetensors load of a {r['model_bytes'] / 2**20:.1f} MiB model by repo id:",
    ]
    for k, label in (("plain", "original cache dir"), ("cold", "mount, fresh"), ("warm", "mount, again")):
        lines.append(f"  {label:<20} wall {cell(r['load_s'][k])}  CPU {cell(r['load_cpu_s'][k])}")
    lines.append(f"  mount fresh / cache dir {cell(r['cold_over_plain'], 'x')}")
    lines.append(f"  mount again / cache dir {cell(r['warm_over_plain'], 'x')}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tensor-mib", type=float, default=16, help="MiB per tensor (8 tensors per revision)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", type=Path, help="also write the figures here")
    p.add_argument("--work-dir", type=Path, help="where the cache and store go (default: a temporary dir)")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="xetfs-bench-hub-") as tmp:
        result = measure_hub(args.work_dir or Path(tmp), tensor_mib=args.tensor_mib, rounds=args.rounds)
    print(render(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
