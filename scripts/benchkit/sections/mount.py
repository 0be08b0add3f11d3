"""Section mount: `xetfs mount` in background mode, as a user runs it, until it returns and the mount answers.

Two synthetic stores (written by the test-only writer): 10,000 files in 100
shards, and 1,000,000 terms (100,000 with --quick).  Peak RSS of the daemon
and its workers right after mounting is recorded too.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchkit import data as bench_data
from benchkit.mounts import EXIT_DEADLINE, READY_DEADLINE, STATS, _zombie, find_daemon, force_unmount, is_mounted
from benchkit.rounds import Runner, Task
from benchkit.rows import Row, Target
from benchkit.sections import Section
from benchkit.util import BenchError, MiB, log, poll, tree_hwm

MOUNT_FILES = Row("mount_files", "xetfs mount, many files", "s", Target("<=", 1.0, "<= 1 s"), xetfs=True)
MOUNT_TERMS = Row("mount_terms", "xetfs mount, many terms", "s", Target("<=", 5.0, "<= 5 s"), xetfs=True)
MOUNT_RSS_FILES = Row("mount_rss_files", "peak RSS after mount, many files", "MiB", Target("<=", 612, "<= 612 MiB"),
                      xetfs=True)  # fmt: skip
MOUNT_RSS_TERMS = Row("mount_rss_terms", "peak RSS after mount, many terms", "MiB", Target("<=", 612, "<= 612 MiB"),
                      xetfs=True)  # fmt: skip
ROWS = {"files": (MOUNT_FILES, MOUNT_RSS_FILES), "terms": (MOUNT_TERMS, MOUNT_RSS_TERMS)}


def _title(r: Any) -> str:
    info = r.extra.get("mount_info", {})
    stores = "; ".join(f"{k}: {v}" for k, v in info.items())
    return f"Mount time, s (`xetfs mount` in background mode until it returns and answers; {stores})"


SECTIONS = (
    Section("mount", _title, lambda r: (MOUNT_FILES, MOUNT_TERMS, MOUNT_RSS_FILES, MOUNT_RSS_TERMS), lambda r: ("",)),
)


def columns(args: Any, selected: set[str]) -> list[str]:
    return []


def tasks(r: Runner, selected: set[str]) -> list[Task]:
    if "mount" not in selected:
        return []
    files_store, files_meta = bench_data.synthetic_files(r.args.data_dir, r.args.mount_files, r.args.mount_shards)
    terms_store, terms_meta = bench_data.synthetic_terms(r.args.data_dir, r.args.mount_terms)
    stores = {"files": files_store, "terms": terms_store}
    r.extra["mount_info"] = {
        "files": f"{files_meta['files']:,} files / {files_meta['shards']} shards",
        "terms": f"{terms_meta['terms']:,} terms ({terms_meta['files']} files, {terms_meta['shards']} shards)",
    }
    r.extra["mount_meta"] = {"files": files_meta, "terms": terms_meta}
    return [Task("mount", "", v.name, _bind(r, stores, v.name)) for v in r.variants]


def _bind(r: Runner, stores: dict[str, Path], variant: str) -> Any:
    return lambda rnd: t_mount(r, stores, rnd, variant)


def t_mount(r: Runner, stores: dict[str, Path], rnd: int, variant: str) -> None:
    order = list(stores.items()) if rnd % 2 == 0 else list(reversed(stores.items()))
    for key, store in order:
        with r.primed():
            secs, rss = time_mount(r, store, variant)
        seconds_row, rss_row = ROWS[key]
        r.r.add(seconds_row, "", rnd, secs, variant)
        r.r.add(rss_row, "", rnd, rss / MiB if rss else None, variant)


def time_mount(r: Runner, store: Path, variant: str) -> tuple[float, int | None]:
    """`xetfs mount STORE MNT` as a user runs it: seconds until it returns and the mount answers."""
    with background_mount(r, store, variant) as (mnt, secs):
        pid = find_daemon(mnt)
        rss = tree_hwm(pid) if pid else None
        return secs, rss


@contextlib.contextmanager
def background_mount(r: Runner, store: Path, variant: str, *options: str) -> Iterator[tuple[Path, float]]:
    """`xetfs mount STORE MNT` as a user runs it (background mode); yields the mountpoint and the seconds until
    the command returned and the mount answered.  Unmounted with `xetfs umount` when the block ends; a daemon
    that does not exit then is killed."""
    v = r.variant(variant)
    work, mnt, log_path, cmd = r.mounts.xetfs_mount_cmd("mount", store, *options, variant=v)
    r.mounts.daemon_logs.append(("xetfs mount (background)", log_path))
    try:
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, timeout=READY_DEADLINE * 3, check=False, cwd=work)
        if proc.returncode != 0:
            raise BenchError(f"xetfs mount failed ({proc.returncode}): {proc.stderr.decode(errors='replace')}")
        (mnt / STATS).stat()
        secs = time.perf_counter() - t0
        yield mnt, secs  # no /proc scan before: a reader may start right away
    except subprocess.TimeoutExpired:
        raise BenchError("xetfs mount did not return") from None
    finally:
        pid = find_daemon(mnt) if is_mounted(mnt) else None
        if is_mounted(mnt):
            subprocess.run([v.python, "-m", "xetfs", "umount", str(mnt)], capture_output=True, check=False, cwd=work)
        if pid is not None:
            with contextlib.suppress(BenchError):
                poll(lambda: not Path(f"/proc/{pid}").exists() or _zombie(pid), EXIT_DEADLINE, "the daemon to exit")
            if Path(f"/proc/{pid}").exists() and not _zombie(pid):
                log(f"xetfs daemon {pid} did not exit after umount; killing it")
                force_unmount(mnt)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        if is_mounted(mnt):
            force_unmount(mnt)
