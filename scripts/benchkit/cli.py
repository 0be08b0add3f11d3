"""The command line of scripts/bench.py: options, the run, and the report around the tables."""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchkit import baseline, data
from benchkit.data import KINDS, WORKLOADS, Dataset
from benchkit.mounts import Mounts, force_unmount, is_mounted
from benchkit.paths import REPO
from benchkit.primer import Primer
from benchkit.report import Table, missing, render, to_json
from benchkit.rounds import Runner, Task
from benchkit.rows import CURRENT, Results, Variant
from benchkit.sections import GROUPS, SECTIONS
from benchkit.util import BenchError, GiB, MiB, human, log, parse_size, proc_meminfo

BENCH_MODULES = ("hf_xet", "pyfuse3", "numpy", "xetfs")
SECTION_MODULES = {
    "load": ("safetensors",),
    "parquet": ("pyarrow", "duckdb"),
    "remote": ("obstore", "safetensors"),
    "remote-load": ("safetensors",),
    "hub": ("safetensors", "transformers", "huggingface_hub"),
    "serve": ("huggingface_hub", "hypercorn", "starlette"),
}
SECTION_TOOLS = {
    "fio": ("fio",),
    "remote": ("nginx", "curl"),
    "remote-load": ("nginx",),
    "serve": ("nginx", "curl"),
    "small-files": ("sha256sum", "ls", "find", "xargs", "stat"),
}


def parse_sections(text: str) -> list[str]:
    """``--only``: a comma-separated list of section names, checked against the registry."""
    names = [s.strip() for s in text.split(",") if s.strip()]
    bad = [s for s in names if s not in SECTIONS]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown section: {', '.join(bad)} (sections: {', '.join(SECTIONS)})")
    if not names:
        raise argparse.ArgumentTypeError("no section given")
    return names


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="bench.py",
        description="Side-by-side benchmark: xetfs against hf_xet, a zero-work FUSE filesystem and plain files.",
        epilog="sections: " + ", ".join(SECTIONS),
    )
    p.add_argument("--quick", action="store_true",
                   help="a few minutes: 64 MiB, 3 rounds, no warm-up, 100k-term store, fewer random reads")  # fmt: skip
    p.add_argument("--size", type=parse_size, help="data size per kind and per workload file (default 1G; quick 64M)")
    p.add_argument("--repeat", type=int, help="recorded rounds (default 5; quick 3)")
    p.add_argument("--warmup", type=int, help="unrecorded warm-up rounds (default 1; quick 0)")
    p.add_argument("--kinds", default=",".join(KINDS), help=f"data kinds (default {','.join(KINDS)})")
    p.add_argument("--only", type=parse_sections, default=list(SECTIONS),
                   help="sections to run, comma-separated (default all)")  # fmt: skip
    p.add_argument("--baseline", metavar="REF",
                   help="also run xetfs at commit REF (installed into a temporary venv), interleaved")  # fmt: skip
    p.add_argument(
        "--data-dir",
        type=Path,
        default=Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "xetfs-bench",
        help="where data sets and synthetic stores are kept (default ~/.cache/xetfs-bench)",
    )
    p.add_argument("--mount-files", type=int, default=10_000, help="files in the mount-time store (default 10000)")
    p.add_argument("--mount-shards", type=int, default=100, help="shards in that store (default 100)")
    p.add_argument("--small-files", type=int, default=3000, metavar="N",
                   help="files of 200 B-20 KB for the small-files section (default 3000)")  # fmt: skip
    p.add_argument("--tree-files", type=int, default=100_000, metavar="N",
                   help="files in the tree store of small-files (ls -lR, find, stat; default 100000)")  # fmt: skip
    p.add_argument("--mount-terms", type=int, help="terms in the second mount-time store (default 1M; quick 100k)")
    p.add_argument("--random-reads", type=int, help="4 KiB reads per random-read measurement (default 2000; quick 500)")
    p.add_argument("--read-ahead", type=int, default=1024, metavar="KB",
                   help="read-ahead for xetfs and the ceiling (default 1024)")  # fmt: skip
    p.add_argument("--mount-opt", action="append", default=[], metavar="ARG",
                   help="extra argument for every `xetfs mount` (repeatable), e.g. --mount-opt=--no-prefetch",
                   )  # fmt: skip
    p.add_argument("--peer-out-dir", default="/dev/shm",
                   help="where hf_xet's downloads and the bench's copies are written (default /dev/shm: in memory, "
                        "so that those rows time reading, not a disk's writeback)")  # fmt: skip
    p.add_argument("--json", nargs="?", const="-", metavar="PATH",
                   help="also write the results as JSON to PATH ('-': JSON on stdout, table on stderr)")  # fmt: skip
    p.add_argument("--seed", type=int, default=1, help="seed for the random offsets")
    p.add_argument("--no-primer", dest="primer", action="store_false",
                   help="do not keep a reserve of touched memory to free before each measurement")  # fmt: skip
    p.add_argument("-v", "--verbose", action="store_true", help="time every measurement")
    args = p.parse_args(argv)
    args.size = args.size or (64 * MiB if args.quick else GiB)
    args.repeat = args.repeat if args.repeat is not None else (3 if args.quick else 5)
    args.warmup = args.warmup if args.warmup is not None else (0 if args.quick else 1)
    args.mount_terms = args.mount_terms or (100_000 if args.quick else 1_000_000)
    args.random_reads = args.random_reads or (500 if args.quick else 2000)
    args.kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    bad = [k for k in args.kinds if k not in KINDS]
    if bad:
        p.error(f"unknown kind: {', '.join(bad)} (kinds: {', '.join(KINDS)})")
    if args.repeat < 1 or args.warmup < 0:
        p.error("--repeat must be >= 1 and --warmup >= 0")
    if args.size < 4 * MiB:
        p.error("--size must be at least 4M")
    args.size -= args.size % 4096
    return args


def preflight(args: argparse.Namespace) -> None:
    problems = []
    if os.geteuid() != 0:
        problems.append("run as root (mounts, and read-ahead via /sys/class/bdi)")
    if not os.path.exists("/dev/fuse"):
        problems.append("/dev/fuse is missing (install fuse3)")
    tools = ["dd", "cat", "cmp", "cp", "fincore"] + [t for s in args.only for t in SECTION_TOOLS.get(s, ())]
    for tool in tools:
        if shutil.which(tool) is None:
            problems.append(f"{tool} not found" + (" (scripts/setup.sh --bench installs it)" if tool == "fio" else ""))
    modules = list(BENCH_MODULES) + [m for s in args.only for m in SECTION_MODULES.get(s, ())]
    for mod in modules:
        try:
            __import__(mod)
        except ImportError as exc:
            problems.append(f"python module {mod}: {exc} (install the bench extra: scripts/setup.sh --bench)")
    if problems:
        sys.exit("bench.py: cannot run:\n  " + "\n  ".join(problems))


def build_data(args: argparse.Namespace) -> dict[str, Dataset]:
    wanted: list[str] = []
    for g in GROUPS:
        wanted += [c for c in g.columns(args, set(args.only)) if c not in wanted]
    out = {}
    for column in wanted:
        out[column] = (data.workload if column in WORKLOADS else data.dataset)(args.data_dir, column, args.size)
    need = sum(ds.original_bytes + ds.stored_bytes for ds in out.values())
    avail = proc_meminfo("MemAvailable")
    if avail and need > 0.8 * avail:
        log(f"warning: the data ({human(need)}) may not fit in the page cache ({human(avail)} available); "
            "results will include disk reads")  # fmt: skip
    for ds in out.values():
        if not ds.scheme_ok:
            log(f"warning: {ds.kind}: hf_xet stored chunks as {ds.scheme_summary()}, "
                f"not mostly {data.SCHEME_NAMES[data.EXPECTED_SCHEME[ds.kind]]}")  # fmt: skip
    return out


def collect_tasks(runner: Runner) -> list[Task]:
    """Every group's tasks for the selected sections, each (name, column, variant) once."""
    seen: dict[tuple[str, str, str], Task] = {}
    for g in GROUPS:
        for t in g.tasks(runner, runner.selected):
            seen.setdefault((t.name, t.column, t.variant), t)
    return list(seen.values())


def tables(runner: Runner) -> list[Table]:
    out = []
    for name, s in SECTIONS.items():
        if name in runner.selected or set(s.also) & runner.selected or (name == "parts" and runner.parts_columns):
            out.append(Table(name, s.title_for(runner), s.columns(runner), s.rows(runner)))
    return out


PRIMER_EFFECT = (
    "it affects every figure of a measurement that touches fresh memory: the times and throughputs of xetfs, "
    "the ceiling, hf_xet and the plain file, and their CPU per GiB (touching fresh pages costs system time); "
    "not the parts-alone loop (one reused buffer)"
)


def header(args: argparse.Namespace, runner: Runner, mounts: Mounts, elapsed: float) -> list[str]:
    lines = [
        f"xetfs benchmark: {human(args.size)} per data set, {args.repeat} rounds (+{args.warmup} warm-up), "
        "interleaved; each cell: median [min-max] over rounds; ratios per round"
        + ("  (--quick)" if args.quick else ""),
        f"machine: {os.cpu_count()} cores, Linux {platform.release()}, Python {platform.python_version()}, "
        f"hf_xet {package_version('hf_xet')}, fio {tool_version(['fio', '--version'])}; "
        f"xetfs commit {git_describe()}; run took {elapsed:.0f} s",
        f"read-ahead (KiB) seen on mounts: xetfs {sorted_ra(mounts.read_ahead_seen['xetfs'])}, "
        f"ceiling {sorted_ra(mounts.read_ahead_seen['ceiling'])} (asked for {args.read_ahead})",
        "CPU per GiB: user + system seconds from /proc/PID/stat around each read (the daemon, its decode workers) "
        "and of the reading process, over the GiB of file bytes it delivered; xetfs waits for its decode workers "
        "before a measurement starts",
    ]
    for v in runner.variants:
        if v.name != CURRENT:
            lines.append(f"baseline: xetfs {v.label} (--baseline {args.baseline}), in {v.python}")
    lines += [f"note: {n}" for n in environment_notes()]
    if runner.primer is not None:
        refills = runner.primer.refills
        spread = f"; refills {statistics.median(refills):.2f} GB/s median" if refills else ""
        lines.append(f"memory primer: a {human(runner.primer.nbytes)} reserve of touched memory is freed right before "
                     f"each measurement and taken back after it{spread}; {PRIMER_EFFECT}")  # fmt: skip
    else:
        lines.append("memory primer: off (fresh memory may be slow to touch on this machine)")
    if args.mount_opt:
        lines.append(f"extra xetfs mount arguments: {' '.join(args.mount_opt)}")
    for ds in runner.data.values():
        lines.append(
            f"data {ds.kind:<8} main {human(ds.main.size)} ({ds.chunks:,} chunks), stored/original "
            f"{ds.stored_bytes / ds.original_bytes:.2f}, chunks {ds.scheme_summary()}"
            + ("" if ds.scheme_ok else "  (UNEXPECTED SCHEME)")
        )
    if args.quick and "mount" in args.only:
        lines.append(f"quick mode: the terms store has {args.mount_terms:,} terms, not 1,000,000")
    bad = [k for k, ok in runner.verified.items() if not ok]
    lines.append("content check (against the original, once per reader and data set): "
                 + (f"MISMATCH in {', '.join(bad)}" if bad else f"ok ({len(runner.verified)} checked)"))  # fmt: skip
    return lines


def _compile_tree() -> None:
    """Write the bytecode of this tree's xetfs (``__pycache__``, which git ignores), as pip writes a baseline's:
    with ``PYTHONDONTWRITEBYTECODE`` set, the tree's every command and daemon would compile its modules afresh
    at start-up (about 0.1 s of a mount) while the baseline's read theirs."""
    import compileall

    if not compileall.compile_dir(REPO / "xetfs", quiet=1):
        raise BenchError(f"cannot compile {REPO / 'xetfs'}")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    preflight(args)
    started = time.time()
    args.data_dir.mkdir(parents=True, exist_ok=True)
    datasets = build_data(args)
    _compile_tree()
    results = Results()
    tmp = Path(tempfile.mkdtemp(prefix="xetfs-bench-"))
    mounts = Mounts(args, tmp)
    variants = [Variant(CURRENT, sys.executable, "this tree")]
    runner = Runner(args, mounts, results, datasets, variants)
    interrupted = False
    try:
        if args.baseline:
            variants.append(baseline.install(args.baseline, tmp))
        tasks = collect_tasks(runner)
        if args.primer:
            reserve = 2 * args.size + min(args.size, 512 * MiB) + 256 * MiB
            avail = proc_meminfo("MemAvailable") or 0
            reserve = min(reserve, int(0.4 * avail)) if avail else reserve
            log(f"taking a {human(reserve)} memory reserve (see --no-primer)")
            runner.primer = Primer(reserve)
            runner.primer.hold()
            runner.primer.refills.clear()  # the first fill is not a refill
        runner.run(tasks)
    except BenchError as exc:
        results.errors.append(str(exc))
        log(f"ERROR {exc}")
    except KeyboardInterrupt:
        interrupted = True
        log("interrupted: reporting what was measured")
    finally:
        if runner.primer is not None:
            runner.primer.close()
        for p in [p for p in tmp.glob("*/mnt") if is_mounted(p)]:
            force_unmount(p)
        daemon_problems = scan_logs(mounts.daemon_logs)
        if not [p for p in tmp.glob("*/mnt") if is_mounted(p)]:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            log(f"warning: mounts left under {tmp}")

    shown = tables(runner)
    errors = results.errors + ([] if interrupted else missing(results, shown, variants))
    footer = []
    if errors:
        footer += ["", "Errors:"] + [f"  {e}" for e in errors]
    if daemon_problems:
        footer += ["", "Daemon logs with errors or warnings:"] + [f"  {p}" for p in daemon_problems[:20]]
    if interrupted:
        footer += ["", "INTERRUPTED: partial results"]
    text = render(shown, results, variants, header(args, runner, mounts, time.time() - started))
    text += "\n".join(["", *footer]) if footer else ""
    doc = {
        "meta": meta(args, runner, mounts, time.time() - started, daemon_problems),
        "rows": to_json(shown, results, variants),
        "errors": errors,
    }
    if args.json == "-":
        print(text, file=sys.stderr)
        json.dump(doc, sys.stdout, indent=1)
        print()
    else:
        print(text)
        if args.json:
            Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
    bad_verify = [k for k, ok in runner.verified.items() if not ok]
    return 1 if (errors or bad_verify or interrupted) else 0


def meta(
    args: argparse.Namespace, runner: Runner, mounts: Mounts, elapsed: float, problems: list[str]
) -> dict[str, Any]:
    return {
        "size": args.size,
        "repeat": args.repeat,
        "warmup": args.warmup,
        "quick": args.quick,
        "kinds": args.kinds,
        "sections": args.only,
        "baseline": {v.name: v.label for v in runner.variants if v.name != CURRENT} or None,
        "cpus": os.cpu_count(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "xetfs_commit": git_describe(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - elapsed)),  # (UTC)
        "elapsed_s": round(elapsed, 1),
        "read_ahead_kb": {k: sorted_ra(v) for k, v in mounts.read_ahead_seen.items()},
        "mount_opt": args.mount_opt,
        "verified": runner.verified,
        "data": {
            k: {
                "schemes": {data.SCHEME_NAMES.get(s, str(s)): n for s, n in ds.schemes.items()},
                "stored_bytes": ds.stored_bytes,
                "original_bytes": ds.original_bytes,
                "main_hash": ds.main.hash,
                "chunks": ds.chunks,
            }
            for k, ds in runner.data.items()
        },
        "mount_stores": runner.extra.get("mount_meta"),
        "daemon_log_problems": problems,
    }


def git_describe() -> str:
    import subprocess

    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO,
                              check=True).stdout.strip()  # fmt: skip
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "xetfs"], capture_output=True, text=True,
                               cwd=REPO, check=True).stdout.strip()  # fmt: skip
        return head + (" (xetfs/ modified)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def tool_version(cmd: list[str]) -> str:
    import subprocess

    try:
        return subprocess.run(cmd, capture_output=True, text=True, check=False).stdout.strip() or "?"
    except OSError:
        return "not installed"


def environment_notes() -> list[str]:
    """Machine settings that change what a benchmark sees (reported, never changed)."""
    notes = []
    for ctx in sorted(Path("/sys/kernel/mm/damon/admin/kdamonds").glob("*/contexts/*")):
        try:
            if (ctx.parent.parent / "state").read_text().strip() != "on":
                continue
            aggr_us = int((ctx / "monitoring_attrs/intervals/aggr_us").read_text())
            for scheme in sorted(ctx.glob("schemes/*")):
                action = (scheme / "action").read_text().strip()
                min_age = int((scheme / "access_pattern/age/min").read_text())
                if action == "pageout":
                    notes.append(
                        f"DAMON pageout is on: memory idle for ~{min_age * aggr_us / 1e6:.0f} s is reclaimed, "
                        "so every input is read into the page cache right before it is measured"
                    )
        except (OSError, ValueError):
            continue
    return notes


def package_version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "?"


def sorted_ra(values: set[int | None]) -> list[int | None]:
    return sorted(values, key=lambda v: -1 if v is None else v)


def scan_logs(logs: list[tuple[str, Path]]) -> list[str]:
    """Lines of the daemons' logs that show a problem (tracebacks, errors, warnings), deduplicated."""
    seen: dict[str, str] = {}
    for what, path in logs:
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            if any(w in line for w in ("Traceback", "ERROR", "WARNING", "Error")):
                msg = re.sub(r"^\S+ \S+ ", "", line.strip())  # drop the timestamp
                seen.setdefault(msg, what)
    return [f"{what}: {msg}" for msg, what in seen.items()]
