"""Section hub: a huggingface_hub cache imported into a store, then loaded by repo id through a mount.

* import: ``xetfs pack --hub-cache`` of a cache written the way
  huggingface_hub writes it (``tests/helpers/hub_cache.py``): three revisions of a
  model whose safetensors differ in one of eight tensors each (16 MiB per
  tensor; 2 MiB with --quick), plus a small dataset; into a fresh store
  every round.  Throughput (cache bytes / wall), CPU s per GiB of the cache
  and the dedup ratio (cache bytes / store bytes added).
* load: in a fresh process with ``HF_HUB_CACHE`` set and
  ``HF_HUB_OFFLINE=1``, ``AutoConfig.from_pretrained(repo)`` and every
  tensor of ``hf_hub_download(repo, "model.safetensors")`` through
  ``safe_open`` (memory-mapped), timed inside the process after its
  imports: from the original cache directory (page-cached), through a fresh
  mount (nothing decoded yet) and again through the same mount.  CPU per GiB
  of the model: the loader's, plus the daemon's and its workers' for the mount.
  Every load must give the same tensors (their sha256, taken after the timing).

The import runs this tree's xetfs; with --baseline, the mounts run both.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchkit.paths import REPO
from benchkit.rounds import Runner, Task
from benchkit.rows import Row, busy_row, per_gib, ratio
from benchkit.sections import Section
from benchkit.sections.common import run_json
from benchkit.util import BenchError, children_cpu

sys.path.insert(0, str(REPO / "tests"))
if TYPE_CHECKING:
    from helpers import hub_cache  # (imported where it is used: it needs numpy, which --help does not)

COLUMN = ""
TENSOR_MIB, QUICK_TENSOR_MIB = 16, 2

IMPORT = Row("hub_import", "import (xetfs pack --hub-cache): cache bytes / wall", "MB/s")
DEDUP = Row("hub_dedup", "import: dedup (cache bytes / store bytes added)", "x")
CPU_IMPORT = Row("cpu_hub_import", "CPU import, per GiB of the cache", "s/GiB")
PLAIN = Row("hub_plain", "load from the original cache dir (page cache)", "s")
COLD = Row("hub_cold", "load through a fresh mount", "s", xetfs=True)
WARM = Row("hub_warm", "load again through the same mount", "s", xetfs=True)
R_COLD = Row("r_hub_cold", "fresh mount / cache dir", "x", derive=ratio(COLD, PLAIN), xetfs=True)
R_WARM = Row("r_hub_warm", "mount again / cache dir", "x", derive=ratio(WARM, PLAIN), xetfs=True)
CPU_PLAIN = Row("cpu_hub_plain", "CPU loader on the cache dir", "s/GiB")
CPU_COLD = Row("cpu_hub_cold", "CPU fresh mount (daemon + workers + loader)", "s/GiB", xetfs=True)
CPU_WARM = Row("cpu_hub_warm", "CPU same mount again (daemon + workers + loader)", "s/GiB", xetfs=True)

ROWS = (IMPORT, DEDUP, CPU_IMPORT, PLAIN, COLD, WARM, R_COLD, R_WARM, CPU_PLAIN, CPU_COLD, CPU_WARM)

BUSY_IMPORT = busy_row("hub_import", "import", IMPORT, (CPU_IMPORT,))


def busy_rows(r: Any) -> tuple[Row, ...]:
    """How busy the cores were in each load (CPU per GiB of the model: its size relates them)."""
    spec = r.extra.get("hub")
    if spec is None:
        return (BUSY_IMPORT,)
    gib = spec.tensor_bytes / 2**30
    return (
        BUSY_IMPORT,
        busy_row("hub_plain", "load from the cache dir (loader)", PLAIN, (CPU_PLAIN,), gib),
        busy_row("hub_cold", "load through a fresh mount (daemon + workers + loader)", COLD, (CPU_COLD,), gib),
        busy_row("hub_warm", "load again (daemon + workers + loader)", WARM, (CPU_WARM,), gib),
    )


SECTIONS = (
    Section(
        "hub",
        lambda r: f"Hugging Face cache: import, then AutoConfig + safetensors load by repo id ({_describe(r)})",
        lambda r: ROWS + busy_rows(r),
        lambda r: (COLUMN,),
    ),
)

LOADER = r"""
import hashlib, json, resource, sys, time
from transformers import AutoConfig
from huggingface_hub import hf_hub_download
from safetensors import safe_open
repo = sys.argv[1]
cpu0 = resource.getrusage(resource.RUSAGE_SELF)
t0 = time.perf_counter()
config = AutoConfig.from_pretrained(repo)
tensors = []
with safe_open(hf_hub_download(repo, "model.safetensors"), framework="np") as f:
    for key in f.keys():
        tensors.append((key, f.get_tensor(key)))
wall = time.perf_counter() - t0
cpu1 = resource.getrusage(resource.RUSAGE_SELF)
cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
digest = hashlib.sha256()
for key, t in tensors:  # after the timing: what was loaded, to compare between loads
    digest.update(key.encode() + t.tobytes())
n = sum(t.nbytes for _, t in tensors)
print(json.dumps({"seconds": wall, "cpu": cpu, "bytes": n, "sha256": digest.hexdigest(),
                  "config": type(config).__name__}))
"""

PACKED = re.compile(r"(\d+) (?:cache bytes|bytes?\)) -> (\d+) store bytes? added")  # (older commits: "cache bytes")


def _describe(r: Any) -> str:
    spec = r.extra.get("hub")
    return f"{spec.tensor_bytes / 2**20:.0f} MiB model, 3 revisions" if spec else ""


def tensor_mib(args: Any) -> int:
    return QUICK_TENSOR_MIB if args.quick else TENSOR_MIB


def columns(args: Any, selected: set[str]) -> list[str]:
    return []  # its cache is made in the run's work directory


def tasks(r: Runner, selected: set[str]) -> list[Task]:
    if "hub" not in selected:
        return []
    out = [
        Task("hub-import", COLUMN, "", lambda rnd: t_import(r, rnd)),
        Task("hub-plain", COLUMN, "", lambda rnd: t_plain(r, rnd)),
    ]
    return out + [Task("hub-mount", COLUMN, v.name, _bind(r, v.name)) for v in r.variants]


def _bind(r: Runner, variant: str) -> Any:
    return lambda rnd: t_mount(r, rnd, variant)


def parse_pack(stdout: str) -> tuple[int, int]:
    """Cache bytes and store bytes added, from ``xetfs pack --hub-cache``'s summary line."""
    m = PACKED.search(stdout)
    if m is None:
        raise BenchError(f"unexpected `xetfs pack --hub-cache` output: {stdout[-500:]!r}")
    return int(m.group(1)), int(m.group(2))


def pack(cache: Path, store: Path) -> tuple[int, int, float, float]:
    """``xetfs pack --hub-cache`` into ``store``: cache bytes, store bytes added, wall and CPU seconds."""
    env = dict(os.environ, HF_XET_CACHE=str(store.parent / "hf_xet"), HF_HUB_DISABLE_TELEMETRY="1")
    cpu0, t0 = children_cpu(), time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "xetfs", "pack", "--hub-cache", str(cache), str(store),
                           "--no-progress"], capture_output=True, text=True, env=env, cwd=REPO, timeout=3600,
                          check=False)  # fmt: skip
    wall, cpu = time.perf_counter() - t0, children_cpu() - cpu0
    if proc.returncode != 0:
        raise BenchError(f"xetfs pack --hub-cache failed ({proc.returncode}): {proc.stderr.strip()[-1000:]}")
    cache_bytes, store_bytes = parse_pack(proc.stdout)
    return cache_bytes, store_bytes, wall, cpu


def prepared(r: Runner) -> tuple[hub_cache.CacheSpec, Path]:
    """The cache (made once per run) and a store imported from it (once), for the loads."""
    from helpers import hub_cache

    if "hub" not in r.extra:
        work = r.work_dir("hub")
        r.extra["hub"] = hub_cache.make_hub_cache(work / "cache", floats=tensor_mib(r.args) * 2**20 // 4)
        pack(r.extra["hub"].root, work / "store")
        r.extra["hub_store"] = work / "store"
    return r.extra["hub"], r.extra["hub_store"]


def load(r: Runner, cache: Path) -> dict[str, Any]:
    """The loader in a fresh process with ``HF_HUB_CACHE=cache``; every load must give the same tensors."""
    from helpers import hub_cache

    _, store = prepared(r)
    env = dict(os.environ, HF_HUB_CACHE=str(cache), HF_HUB_OFFLINE="1", HF_HOME=str(store.parent / "hf_home"),
               TRANSFORMERS_VERBOSITY="error", HF_HUB_DISABLE_TELEMETRY="1")  # fmt: skip
    res = run_json(["-c", LOADER, hub_cache.MODEL], f"loading {hub_cache.MODEL} from {cache}", 600, env=env)
    first = r.extra.setdefault("hub_loaded", (res["sha256"], res["bytes"]))
    if (res["sha256"], res["bytes"]) != first or res["bytes"] <= 0:
        raise BenchError(f"{cache}: loaded {res['bytes']} tensor bytes (sha256 {res['sha256']}), "
                         f"the first load {first[1]} (sha256 {first[0]})")  # fmt: skip
    return res


def t_import(r: Runner, rnd: int) -> None:
    spec, _ = prepared(r)
    store = r.work_dir("hub-import") / "store"
    try:
        with r.primed():
            cache_bytes, store_bytes, wall, cpu = pack(spec.root, store)
    finally:
        shutil.rmtree(store.parent, ignore_errors=True)
    r.r.add(IMPORT, COLUMN, rnd, cache_bytes / wall / 1e6)
    r.r.add(DEDUP, COLUMN, rnd, cache_bytes / store_bytes)
    r.r.add(CPU_IMPORT, COLUMN, rnd, per_gib(cache_bytes, cpu))


def t_plain(r: Runner, rnd: int) -> None:
    spec, _ = prepared(r)
    with r.primed():
        res = load(r, spec.root)
    r.r.add(PLAIN, COLUMN, rnd, res["seconds"])
    r.r.add(CPU_PLAIN, COLUMN, rnd, per_gib(spec.tensor_bytes, res["cpu"]))


def t_mount(r: Runner, rnd: int, variant: str) -> None:
    spec, store = prepared(r)
    with r.primed(now=False) as go, r.mounts.xetfs(store, variant=r.variant(variant)) as x:
        go()
        for speed, cpu_row in ((COLD, CPU_COLD), (WARM, CPU_WARM)):
            with r.cpu(x) as use:
                res = load(r, x.mountpoint)
            cpu = res["cpu"] + use.daemon + use.workers  # the loader's own figure: no start-up or imports
            r.r.add(speed, COLUMN, rnd, res["seconds"], variant)
            r.r.add(cpu_row, COLUMN, rnd, per_gib(spec.tensor_bytes, cpu), variant)
