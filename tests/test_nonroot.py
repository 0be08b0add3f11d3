"""A user who is not root mounts a store with fusermount3, reads a file, and unmounts.

The test runs as root and sets up what a normal Debian machine has: an
unprivileged user (created when missing, removed after) and ``/dev/fuse`` at
mode 0666 (put back as it was after).  That user must be able to run the
project's Python: when this run's interpreter lies under a directory other
users cannot enter (a Python built under ``/root``), the user gets a virtual
environment of a system Python of the same version that sees this run's
packages, which is what docs/mirrors.md tells a shared machine to do.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.mounting import force_unmount, is_mounted, mount_device, mountinfo, wait_until
from helpers.oracle import REPO_ROOT, CliRunner

pytestmark = pytest.mark.fuse

USER = "xetfs-test"
SAMPLE = REPO_ROOT / "sample" / "store"
FUSE_DEVICE = Path("/dev/fuse")


@contextlib.contextmanager
def _user(name: str) -> Iterator[pwd.struct_passwd]:
    """The user ``name``: created (system user, no home, no login) when missing and then removed again."""
    try:
        yield pwd.getpwnam(name)
        return
    except KeyError:
        pass
    subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
                   check=True, capture_output=True)  # fmt: skip
    try:
        yield pwd.getpwnam(name)
    finally:
        uid = pwd.getpwnam(name).pw_uid
        wait_until(lambda: not _processes_of(uid), 20, f"the processes of {name} to end")
        out = subprocess.run(["userdel", name], check=False, capture_output=True, text=True)
        assert out.returncode == 0, f"userdel {name}: {out.stderr}"


def _processes_of(uid: int) -> list[int]:
    """The processes whose real user is ``uid``."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                status = (entry / "status").read_text()
                if next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1] == str(uid):
                    pids.append(int(entry.name))
    return pids


@contextlib.contextmanager
def _fuse_device_for_all() -> Iterator[None]:
    """``/dev/fuse`` at mode 0666 (a normal Debian's) for the block; its mode restored after."""
    mode = stat.S_IMODE(FUSE_DEVICE.stat().st_mode)
    FUSE_DEVICE.chmod(mode | 0o666)
    try:
        yield
    finally:
        FUSE_DEVICE.chmod(mode)


def _as(user: str, *cmd: object, env: dict[str, str], check: bool = True) -> subprocess.CompletedProcess[bytes]:
    proc = subprocess.run(["runuser", "-u", user, "--", *map(str, cmd)], env=env, capture_output=True,
                          timeout=120, check=False)  # fmt: skip
    if check:
        assert proc.returncode == 0, f"{cmd}: {proc.stderr.decode(errors='replace')}"
    return proc


def _python_for(user: str, work: Path, env: dict[str, str]) -> str:
    """An interpreter ``user`` can run that imports this run's xetfs and its packages."""
    if _as(user, sys.executable, "-c", "import xetfs, pyfuse3", env=env, check=False).returncode == 0:
        return sys.executable
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    system = next((p for p in (f"/usr/bin/{version}", f"/usr/local/bin/{version}") if os.access(p, os.X_OK)), None)
    if system is None:
        pytest.fail(f"{sys.executable} cannot be run by other users and no system {version} exists: "
                    "make the venv with a Python every user can run (docs/mirrors.md)")  # fmt: skip
    venv = work / "venv"
    subprocess.run([system, "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True)
    ours = next(Path(p) for p in sys.path if p.endswith("site-packages") and p.startswith(sys.prefix))
    site = venv / "lib" / version / "site-packages"
    (site / "xetfs-shared.pth").write_text(f"import site; site.addsitedir({str(ours)!r})\n")
    python = str(venv / "bin" / "python")
    assert _as(user, python, "-c", "import xetfs, pyfuse3", env=env, check=False).returncode == 0
    return python


def _read_ahead_kb(mnt: Path) -> int:
    device = mount_device(mnt)
    assert device is not None
    return int(Path(f"/sys/class/bdi/{device}/read_ahead_kb").read_text())


def test_a_user_who_is_not_root_mounts_reads_and_unmounts(cli: CliRunner) -> None:
    entries = json.loads((SAMPLE / "xetfs-manifest.json").read_bytes())
    oracle = cli("cat", SAMPLE, next(e["xetHash"] for e in entries if e["path"] == "README.md"))
    before = stat.S_IMODE(FUSE_DEVICE.stat().st_mode)
    work = Path(tempfile.mkdtemp(prefix="xetfs-nonroot-"))
    mnt = work / "mnt"
    try:
        with _user(USER) as user, _fuse_device_for_all():
            for sub in ("mnt", "home", "state"):
                (work / sub).mkdir()
            work.chmod(0o755)
            for path in (work / "mnt", work / "home", work / "state"):
                os.chown(path, user.pw_uid, user.pw_gid)
            env = {"PATH": os.environ.get("PATH", os.defpath), "HOME": str(work / "home"), "LANG": "C.UTF-8",
                   "XDG_STATE_HOME": str(work / "state"), "XDG_CACHE_HOME": str(work / "home")}  # fmt: skip
            python = _python_for(USER, work, env)
            _as(USER, python, "-m", "xetfs", "mount", SAMPLE, mnt, "--log-level", "info", env=env)
            try:
                point = next(opts for p, _, opts in mountinfo() if p == str(mnt))
                assert f"user_id={user.pw_uid}" in point, point
                got = _as(USER, "cat", mnt / "README.md", env=env).stdout
                assert got == oracle.stdout and got
                with pytest.raises(PermissionError):  # not even root, without allow_other or allow_root
                    (mnt / "README.md").read_bytes()
                assert _read_ahead_kb(mnt) != 1024  # raising it needs root: the kernel's default stays
                logs = list((work / "state").rglob("*.log"))
                assert any("could not set read-ahead" in p.read_text() for p in logs), logs
                _as(USER, python, "-m", "xetfs", "umount", mnt, env=env)
                wait_until(lambda: not is_mounted(mnt), 20, f"{mnt} to be unmounted")
                wait_until(lambda: not _processes_of(user.pw_uid), 20, "the daemon to exit")
                # (a log the daemon removed at a clean end held nothing at warning or above)
                assert not any("Traceback" in p.read_text() for p in logs if p.exists())
            finally:
                if is_mounted(mnt):
                    force_unmount(mnt)
        assert stat.S_IMODE(FUSE_DEVICE.stat().st_mode) == before  # put back
    finally:
        shutil.rmtree(work, ignore_errors=True)
