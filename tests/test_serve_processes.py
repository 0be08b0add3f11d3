"""Server processes on one socket (xetfs/serve/processes.py): how they start, stop, and end together.

``run_workers`` runs in a process of its own (``helpers/workers_script.py``) whose workers only wait for a
signal, so each case is about the processes alone, whatever the application.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from helpers.mounting import wait_until
from helpers.oracle import REPO_ROOT
from helpers.processes import state

pytestmark = pytest.mark.integration

SCRIPT = Path(__file__).resolve().parent / "helpers" / "workers_script.py"


@contextmanager
def started(scenario: str, count: int, tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    out = tmp_path / "out"
    with open(out, "ab") as f:  # (O_APPEND: the workers' lines, written at once, never land on one another)
        proc = subprocess.Popen([sys.executable, str(SCRIPT), scenario, str(count)], stdout=f,
                                stderr=subprocess.STDOUT, cwd=REPO_ROOT)  # fmt: skip
    try:
        yield proc, out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def workers(out: Path) -> dict[int, int]:
    """Worker number -> pid, from what the workers wrote once ready."""
    return {int(i): int(pid) for i, pid in re.findall(r"^worker (\d+) (\d+)$", out.read_text(), re.MULTILINE)}


def gone(pids: list[int]) -> bool:
    return all(state(pid) in (None, "Z") for pid in pids)


def test_sigterm_to_the_server_stops_every_process(tmp_path: Path) -> None:
    with started("serve", 3, tmp_path) as (proc, out):
        wait_until(lambda: len(workers(out)) == 3, 30, "three workers ready", proc, out)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, out.read_text()
        wait_until(lambda: gone(list(workers(out).values())), 30, "workers ended")


def test_a_dead_worker_stops_the_others_with_an_error(tmp_path: Path) -> None:
    with started("dies", 3, tmp_path) as (proc, out):
        assert proc.wait(30) == 1
        text = out.read_text()
        assert "xetfs: error: server process 1 was killed by SIGKILL; stopping the others" in text, text
        wait_until(lambda: gone(list(workers(out).values())), 30, "workers ended")


def test_a_failed_fork_leaves_no_worker_behind(tmp_path: Path) -> None:
    with started("fork-fails", 3, tmp_path) as (proc, out):
        assert proc.wait(30) == 1
        text = out.read_text()
        assert "failed: [Errno 11] Resource temporarily unavailable" in text, text
        assert list(workers(out)) == [0]
        wait_until(lambda: gone(list(workers(out).values())), 30, "worker 0 ended")


def test_workers_end_when_the_parent_is_killed(tmp_path: Path) -> None:
    with started("serve", 2, tmp_path) as (proc, out):
        wait_until(lambda: len(workers(out)) == 2, 30, "two workers ready", proc, out)
        proc.kill()  # SIGKILL: the parent passes nothing on
        proc.wait(10)
        wait_until(lambda: gone(list(workers(out).values())), 30, "workers ended with their parent")


def test_a_store_that_fails_gives_one_error_and_starts_no_other_worker(tmp_path: Path) -> None:
    with started("bad-store", 3, tmp_path) as (proc, out):
        assert proc.wait(30) == 1
        lines = [line for line in out.read_text().splitlines() if not line.startswith("parent ")]
        assert lines == ["xetfs: error: store /nowhere: no such directory"]


def test_a_signal_that_comes_while_a_worker_is_forked_still_reaches_it(tmp_path: Path) -> None:
    """SIGTERM sent right as the workers start (over and over, until the server ends): no worker is left."""
    with started("serve", 4, tmp_path) as (proc, out):
        wait_until(lambda: out.read_text().startswith("parent "), 30, "the parent started", proc, out)
        end = time.monotonic() + 30
        while proc.poll() is None and time.monotonic() < end:
            proc.send_signal(signal.SIGTERM)
            time.sleep(0.001)  # (a burst of signals, not a wait for something to be ready)
        # 0, or killed by one of the last signals, sent after the server had put its own handler back
        assert proc.wait(30) in (0, -signal.SIGTERM), out.read_text()
        wait_until(lambda: gone(list(workers(out).values())), 30, "workers ended")
