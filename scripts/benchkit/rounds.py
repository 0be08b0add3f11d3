"""Running rounds: every task once per round, in a rotated order, after unrecorded warm-up rounds.

A ``Task`` measures one configuration (one data column, one xetfs variant)
for round ``rnd`` (negative: warm-up, not recorded).  Rounds rotate the
order and reverse it every other round, so that no configuration always runs
right after the same other one.  A task that fails records an error and the
round goes on.  The ``Runner`` is also what tasks are given: the options,
the mounts, the results, the data and the memory primer.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchkit.data import Dataset
from benchkit.mounts import Daemon, Mounts
from benchkit.primer import Primer
from benchkit.rows import Results, Variant
from benchkit.util import BenchError, children_cpu, log


@dataclass(frozen=True)
class Task:
    name: str
    column: str
    variant: str
    run: Callable[[int], None]


@dataclass
class CpuUse:
    """CPU seconds used during a measurement: the daemon, its decode workers, and the processes we ran."""

    daemon: float = 0.0
    workers: float = 0.0
    reader: float = 0.0


def rotations(count: int, rounds: list[int]) -> Iterator[tuple[int, list[int]]]:
    """For each round, the order of ``count`` tasks: rotated by the round, reversed every other round."""
    for rnd in rounds:
        idx = list(range(count))
        shift = (rnd % count) if count else 0
        order = idx[shift:] + idx[:shift]
        if rnd >= 0 and rnd % 2:
            order.reverse()
        yield rnd, order


class Runner:
    def __init__(
        self,
        args: argparse.Namespace,
        mounts: Mounts,
        results: Results,
        data: dict[str, Dataset],
        variants: list[Variant],
    ) -> None:
        self.args = args
        self.mounts = mounts
        self.r = results
        self.data = data  # column ("random", "model", ...) -> its data set
        self.variants = variants  # the working tree first
        self.verified: dict[str, bool] = {}
        self.rng = random.Random(args.seed)
        self.primer: Primer | None = None
        self.extra: dict[str, Any] = {}
        self.selected: set[str] = set(args.only)
        self.parts_columns: list[str] = []  # data sets whose parts-alone loop runs

    @contextlib.contextmanager
    def primed(self, *, now: bool = True) -> Iterator[Callable[[], None]]:
        """Free the memory reserve for a measurement, and take it back when the block ends.

        With ``now=False`` the block calls the function it gets as late as
        possible (after mounting, right before reading): freed pages stay
        fast to touch for only a couple of seconds.
        """
        primer = self.primer
        released = False

        def release() -> None:
            nonlocal released
            if primer is not None and not released:
                primer.release()
                released = True

        if now:
            release()
        try:
            yield release
        finally:
            if primer is not None and released:
                primer.hold()

    @contextlib.contextmanager
    def cpu(self, daemon: Daemon | None = None) -> Iterator[CpuUse]:
        """CPU used while the block runs, by ``daemon`` and its workers (from /proc) and by our children.

        Our children's share counts processes started and waited for inside
        the block (``dd``, ``fio``, a loader); the daemon must not exit
        inside it.
        """
        use = CpuUse()
        d0 = daemon.cpu() if daemon else (0.0, 0.0)
        r0 = children_cpu()
        yield use
        d1 = daemon.cpu() if daemon else (0.0, 0.0)
        use.daemon, use.workers, use.reader = d1[0] - d0[0], max(0.0, d1[1] - d0[1]), children_cpu() - r0

    def variant(self, name: str) -> Variant:
        return next(v for v in self.variants if v.name == name)

    def check_once(self, key: str, same: Callable[[], bool]) -> None:
        """Compare what a reader got with the original, once per key (reader and data)."""
        if key not in self.verified:
            self.verified[key] = same()

    def timeout_for(self, nbytes: int) -> float:
        return 120 + nbytes / 10e6  # never slower than 10 MB/s

    def work_dir(self, prefix: str) -> Path:
        return self.mounts._new_dir(prefix)

    @contextlib.contextmanager
    def memory_dir(self, what: str) -> Iterator[Path]:
        """An empty directory under ``--peer-out-dir`` (memory, by default) for a tool's output, removed
        afterwards: rows that write a copy or a download time the reading, not a disk's writeback."""
        d = Path(self.args.peer_out_dir) / f"xetfs-bench-{os.getpid()}-{what}"
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        try:
            yield d
        finally:
            shutil.rmtree(d, ignore_errors=True)

    def run(self, tasks: list[Task]) -> None:
        rounds = list(range(-self.args.warmup, self.args.repeat))
        for rnd, order in rotations(len(tasks), rounds):
            what = "warm-up round" if rnd < 0 else f"round {rnd + 1}/{self.args.repeat}"
            log(f"{what}: {len(order)} measurements")
            for i in order:
                task = tasks[i]
                name = " ".join(x for x in (task.name, task.column, task.variant and f"@{task.variant}") if x)
                t0 = time.monotonic()
                try:
                    task.run(rnd)
                except BenchError as exc:
                    msg = f"{what}, {name}: {exc}"
                    log("ERROR " + msg)
                    self.r.errors.append(msg)
                except Exception as exc:
                    msg = f"{what}, {name}: unexpected {type(exc).__name__}: {exc}"
                    log("ERROR " + msg + "\n" + traceback.format_exc())
                    self.r.errors.append(msg)
                if self.args.verbose:
                    log(f"  {name}: {time.monotonic() - t0:.1f} s")
