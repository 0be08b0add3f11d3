"""Processes in tests: kill a child at a point of its progress (not after a time), list a process's children.

The process runs in slices of about a millisecond (SIGCONT, then SIGSTOP), and its progress is
measured while it is stopped, so it is killed where chosen however fast or slow the machine is.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from helpers.mounting import wait_until


def state(pid: int) -> str | None:
    """The state letter of process ``pid`` (``T`` stopped, ``Z`` exited), or None when it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return None


def kill_when(proc: subprocess.Popen[bytes], reached: Callable[[], bool], deadline: float = 120) -> bool:
    """SIGKILL ``proc`` at the first of its stops at which ``reached()`` holds, and reap it.

    Returns True when it was killed so, False when it ended first (it is reaped either way).
    Fails the test when neither happens within ``deadline`` seconds.
    """
    end = time.monotonic() + deadline
    try:
        while True:
            proc.send_signal(signal.SIGSTOP)
            wait_until(lambda: state(proc.pid) in ("T", "Z", None), 10, "the process to stop")
            if proc.poll() is not None or state(proc.pid) == "Z":
                return False
            if reached():
                proc.send_signal(signal.SIGKILL)
                return True
            assert time.monotonic() < end, f"{proc.args!r}: the point to kill it at not reached in {deadline} s"
            proc.send_signal(signal.SIGCONT)
            time.sleep(0.001)  # (a time slice for the process, not a wait for something to be ready)
    finally:
        proc.kill()
        proc.wait(10)


def children(pid: int) -> list[int]:
    """The pids of the live child processes of ``pid`` (from /proc; exited ones not counted)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) ": state, ppid, ...
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(entry.name))
    return sorted(found)
