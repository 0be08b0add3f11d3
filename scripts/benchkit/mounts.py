"""FUSE daemons the benchmark starts: xetfs (the working tree's or a baseline's) and the ceiling.

Every mount is unmounted when its block ends, fails or is interrupted.  A
daemon knows its pid, so its CPU time and its decode workers' can be read
from /proc around a measurement (``Daemon.cpu``), and its counters through
the mount (``Daemon.stats``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchkit.paths import CEILING, REPO
from benchkit.rows import Variant
from benchkit.util import BenchError, log, poll, read_ahead_kb, tree_cpu, tree_hwm

sys.path.insert(0, str(REPO / "tests"))
from helpers.mounting import force_unmount, is_mounted

STATS = ".xetfs/stats"
READY_DEADLINE = 60.0
EXIT_DEADLINE = 15.0
READ_AHEAD_DEADLINE = 5.0


@dataclass
class Daemon:
    """A FUSE daemon we started (xetfs --foreground, or the ceiling) and its mountpoint."""

    name: str
    proc: subprocess.Popen[bytes]
    mountpoint: Path
    log_path: Path
    other_logs: tuple[Path, ...] = ()
    read_ahead: int | None = None

    def dead(self) -> str | None:
        if self.proc.poll() is None:
            return None
        return f"{self.name} exited with status {self.proc.returncode}:\n{self.log_tail()}"

    def log_tail(self, lines: int = 30) -> str:
        text = ""
        for path in (*self.other_logs, self.log_path):
            with contextlib.suppress(OSError):
                text += path.read_text(errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def hwm(self) -> int | None:
        return tree_hwm(self.proc.pid)

    def cpu(self) -> tuple[float, float]:
        """CPU seconds so far: the daemon's own, and its live decode workers' together."""
        return tree_cpu(self.proc.pid)

    def stats(self) -> dict[str, Any]:
        """xetfs' live counters, read through the mount."""
        return dict(json.loads((self.mountpoint / STATS).read_bytes()))

    def stop(self) -> None:
        """SIGTERM and wait; then abort the connection and kill.  Never leaves the mount behind."""
        try:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(EXIT_DEADLINE)
                except subprocess.TimeoutExpired:
                    log(f"{self.name} did not exit on SIGTERM; aborting the mount")
                    force_unmount(self.mountpoint)
                    self.proc.kill()
                    self.proc.wait(EXIT_DEADLINE)
        finally:
            if is_mounted(self.mountpoint):
                force_unmount(self.mountpoint)
            if is_mounted(self.mountpoint):
                raise BenchError(f"{self.mountpoint} is still mounted after {self.name} stopped")


def workers_ready(log_path: Path) -> bool:
    """Whether every decode worker a daemon started has said it is ready (its log at level info)."""
    try:
        text = log_path.read_text(errors="replace")
    except OSError:
        return False
    if "decoding in the daemon" in text:
        return True
    started = re.search(r"decoding in (\d+) worker processes", text)
    return started is not None and len(re.findall(r"decode worker \d+ ready", text)) >= int(started[1])


class Mounts:
    """Starts the daemons of one run, each in a fresh work directory under ``tmp``."""

    def __init__(self, args: argparse.Namespace, tmp: Path) -> None:
        self.args = args
        self.tmp = tmp
        self.counter = 0
        self.daemon_logs: list[tuple[str, Path]] = []
        self.read_ahead_seen: dict[str, set[int | None]] = {"xetfs": set(), "ceiling": set()}

    def _new_dir(self, prefix: str) -> Path:
        self.counter += 1
        d = self.tmp / f"{prefix}{self.counter}"
        d.mkdir()
        return d

    def xetfs_mount_cmd(
        self, prefix: str, store: Path | str, *options: str, after: Sequence[str] = (), variant: Variant | None = None
    ) -> tuple[Path, Path, Path, list[str]]:
        """A fresh work directory, its mountpoint and log, and ``xetfs mount`` for them.

        The arguments are ``options``, then --mount-opt, then ``after`` (the last one given wins).
        """
        work = self._new_dir(prefix)
        mnt = work / "mnt"
        mnt.mkdir()
        log_path = work / "daemon.log"
        python = variant.python if variant else sys.executable
        cmd = [python, "-m", "xetfs", "mount", str(store), str(mnt), "--log-file", str(log_path),
               *options, *self.args.mount_opt, *after]  # fmt: skip
        return work, mnt, log_path, cmd

    def _wait_ready(self, d: Daemon, probe: Path, reported: Callable[[], bool] | None = None) -> None:
        poll(lambda: is_mounted(d.mountpoint) and probe.exists(), READY_DEADLINE, f"{d.name} to answer", d.dead)
        if reported is not None:
            poll(reported, READY_DEADLINE, f"{d.name} to report ready", d.dead)
        # The daemon raises read-ahead right after FUSE INIT; make sure it is done before reading.
        want = self.args.read_ahead
        with contextlib.suppress(BenchError):
            poll(lambda: read_ahead_kb(d.mountpoint) == want, READ_AHEAD_DEADLINE, "read-ahead", d.dead)
        d.read_ahead = read_ahead_kb(d.mountpoint)

    @contextlib.contextmanager
    def xetfs(self, store: Path | str, *options: str, variant: Variant | None = None) -> Iterator[Daemon]:
        """``xetfs mount --foreground`` in a child process (so its pid is known); always unmounted.

        ``variant`` picks the Python (and so the xetfs) that runs it; it runs
        in the mount's work directory, so that ``-m xetfs`` never picks up
        the working tree's package by accident.
        """
        work, mnt, log_path, cmd = self.xetfs_mount_cmd(
            "xetfs",
            store,
            "--foreground",
            "--log-level",
            "info",
            "--read-ahead",
            f"{self.args.read_ahead}K",
            after=options,
            variant=variant,
        )
        with open(work / "daemon.out", "wb") as out:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, cwd=work)
        d = Daemon("xetfs daemon", proc, mnt, work / "daemon.out", (log_path,))
        self.daemon_logs += [(f"xetfs {' '.join(options)}", log_path), (f"xetfs {' '.join(options)}", d.log_path)]
        try:
            self._wait_ready(d, mnt / STATS)
            poll(lambda: workers_ready(log_path), READY_DEADLINE, "the decode workers", d.dead)
            self.read_ahead_seen["xetfs"].add(d.read_ahead)
            yield d
        finally:
            d.stop()

    @contextlib.contextmanager
    def ceiling(
        self, files: Sequence[Path], *, direct_io: bool = False, directory: Path | None = None
    ) -> Iterator[Daemon]:
        """The ceiling FS serving ``files`` (and every file of ``directory``) at its root; always unmounted."""
        work = self._new_dir("ceiling")
        mnt = work / "mnt"
        mnt.mkdir()
        cmd = [sys.executable, str(CEILING), str(mnt), *map(str, files), "--read-ahead", str(self.args.read_ahead)]
        if directory is not None:
            cmd += ["--dir", str(directory)]
            probe = next(e.name for e in os.scandir(directory) if e.is_file())
        else:
            probe = files[0].name
        if direct_io:
            cmd.append("--direct-io")
        with open(work / "ceiling.out", "wb") as out:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
        d = Daemon("ceiling FS", proc, mnt, work / "ceiling.out")
        try:
            self._wait_ready(d, mnt / probe, lambda: b"ready" in d.log_path.read_bytes())
            self.read_ahead_seen["ceiling"].add(d.read_ahead)
            yield d
        finally:
            d.stop()


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")
    except (OSError, IndexError):
        return True


def find_daemon(mnt: Path) -> int | None:
    """The pid of the xetfs daemon serving ``mnt`` (its command line names the mountpoint)."""
    target = str(mnt.resolve()).encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            args = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if target in args and b"--foreground" in args and b"mount" in args:
            return int(entry)
    return None
