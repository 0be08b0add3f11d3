"""Real FUSE mounts for tests: mount in a temp dir, wait until it answers, always unmount.

``mounted(store, *options)`` starts ``xetfs mount --foreground`` in a child
process (pyfuse3 allows one mount per process), polls with a deadline until
the mount answers — failing at once, with the daemon's log, if the daemon
dies — and on exit unmounts, reaps the daemon and fails the test if the log
holds a traceback.  Nothing is left mounted, even when the test fails.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

READY_DEADLINE = 30.0
EXIT_DEADLINE = 10.0
STATS = ".xetfs/stats"


class MountFailed(AssertionError):
    pass


@dataclass
class Mount:
    path: Path
    proc: subprocess.Popen[bytes]
    log_path: Path

    def stats(self) -> dict[str, Any]:
        """The live counters (read fresh through the mount)."""
        return dict(json.loads((self.path / STATS).read_bytes()))

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def __truediv__(self, name: str) -> Path:
        return self.path / name

    def wait_for_workers(self, deadline: float = 20) -> None:
        """Wait until every decode worker the daemon started has said it is ready (they start after mounting)."""

        def ready() -> bool:
            text = self.log()
            started = re.search(r"decoding in (\d+) worker processes", text)
            return started is not None and len(re.findall(r"decode worker \d+ ready", text)) >= int(started[1])

        wait_until(ready, deadline, "the decode workers", self.proc, self.log_path)


def memory(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (peak) of a process, in bytes."""
    out = {}
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0]) * 1024
    return out


def mountinfo() -> Iterator[tuple[str, str, list[str]]]:
    """``(mount point, major:minor, options)`` of every mount (/proc/self/mountinfo).

    The options are the mount's own and its filesystem's (``allow_other`` is one of those).
    """
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
        lines = f.read().splitlines()
    for line in lines:
        left, _, right = line.partition(" - ")
        fields = left.split()
        super_options = right.split()[2].split(",") if len(right.split()) > 2 else []
        # Space, tab, newline and backslash appear as octal escapes (\\040 ...).
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
        yield point, fields[2], fields[5].split(",") + super_options


def is_mounted(path: Path) -> bool:
    target = os.path.abspath(path)
    return any(point == target for point, _, _ in mountinfo())


def mount_device(path: Path) -> str | None:
    """``major:minor`` of the mount at ``path``, or None."""
    target = os.path.abspath(path)
    return next((device for point, device, _ in mountinfo() if point == target), None)


def force_unmount(path: Path) -> None:
    """Last resort: abort the FUSE connection (root) and detach the mount."""
    device = mount_device(path)
    if device is not None:
        minor = device.split(":")[1]
        with contextlib.suppress(OSError):
            Path(f"/sys/fs/fuse/connections/{minor}/abort").write_text("1")
    tool = shutil.which("fusermount3") or "fusermount"
    subprocess.run([tool, "-u", "-z", str(path)], capture_output=True, check=False)
    if is_mounted(path):
        subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)


def wait_until(predicate: Any, deadline: float, what: str, proc: subprocess.Popen[bytes] | None = None,
               log: Path | None = None) -> None:  # fmt: skip
    """Poll ``predicate`` until true; fail loudly at the deadline or when ``proc`` dies."""
    end = time.monotonic() + deadline
    delay = 0.005
    while True:
        if predicate():
            return
        if proc is not None and proc.poll() is not None:
            text = log.read_text(errors="replace") if log and log.exists() else ""
            raise MountFailed(f"daemon exited with status {proc.returncode} while waiting for {what}:\n{text}")
        if time.monotonic() > end:
            text = log.read_text(errors="replace") if log and log.exists() else ""
            raise MountFailed(f"timed out after {deadline} s waiting for {what}:\n{text}")
        time.sleep(delay)
        delay = min(delay * 2, 0.1)


@contextlib.contextmanager
def mounted(store: Path | str, *options: str, allow_errors: bool = False,
            mountpoint: Path | None = None) -> Iterator[Mount]:  # fmt: skip
    """Mount ``store`` with ``options`` (e.g. ``"--direct-io"``) for the duration of the block.

    With ``allow_errors`` the log may contain ERROR lines (tests of corrupt
    stores); a traceback always fails.
    """
    tmp = Path(tempfile.mkdtemp(prefix="xetfs-test-"))
    mnt = mountpoint or tmp / "mnt"
    mnt.mkdir(exist_ok=True)
    log_path = tmp / "daemon.log"
    cmd = [sys.executable, "-m", "xetfs", "mount", "--foreground", str(store), str(mnt),
           "--log-file", str(log_path), "--log-level", "info", *options]  # fmt: skip
    with open(tmp / "daemon.out", "wb") as out:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    mount = Mount(mnt, proc, log_path)
    failure: BaseException | None = None
    try:
        wait_until(lambda: is_mounted(mnt) and (mnt / STATS).exists(), READY_DEADLINE, "the mount", proc, log_path)
        yield mount
    except BaseException as exc:
        failure = exc
        raise
    finally:
        _stop(mount)
        text = mount.log() + (tmp / "daemon.out").read_text(errors="replace")
        shutil.rmtree(tmp, ignore_errors=True)
        if failure is None:
            if "Traceback" in text:
                raise MountFailed(f"the daemon logged a traceback:\n{text}")
            if not allow_errors and " ERROR " in text:
                raise MountFailed(f"the daemon logged an error:\n{text}")


def _stop(mount: Mount) -> None:
    proc = mount.proc
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(EXIT_DEADLINE)
        except subprocess.TimeoutExpired:
            force_unmount(mount.path)
            proc.kill()
            proc.wait(EXIT_DEADLINE)
    if is_mounted(mount.path):
        force_unmount(mount.path)
    if is_mounted(mount.path):
        raise MountFailed(f"{mount.path} is still mounted after the daemon stopped")
