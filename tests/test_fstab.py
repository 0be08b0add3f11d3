"""``mount -t fuse.xetfs``, an ``/etc/fstab``-style line, and the ``-o`` spelling of every mount option.

``mount(8)`` runs ``mount.fuse3``, which runs ``xetfs STORE MNT -o OPTS``
through ``/bin/sh`` with no ``PATH`` in its environment: the shell's default
path finds ``xetfs``.  The tests install a two-line ``xetfs`` script running
this checkout in ``/usr/local/sbin`` (the first directory of that path) for
their duration, and remove it after.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import servers
from helpers.mounting import force_unmount, is_mounted, mountinfo, wait_until
from helpers.oracle import REPO_ROOT, CliRunner

from xetfs.commands.cli import build_parser
from xetfs.commands.mountopts import (
    IGNORED,
    expand_mount_argv,
    expand_options,
    helper_argv,
    option_table,
    split_options,
)

pytestmark = pytest.mark.fuse

SAMPLE = REPO_ROOT / "sample" / "store"
HELPER = Path("/usr/local/sbin/xetfs")
MARK = "# installed by xetfs's tests/test_fstab.py"
TOKEN = "fstab-token-5c0ffee"


@pytest.fixture(scope="module")
def helper() -> Iterator[Path]:
    """``xetfs`` where ``mount.fuse3``'s shell finds it, for the module's duration."""
    with open("/run/lock/xetfs-test-helper.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (HELPER.exists() or HELPER.is_symlink()) and MARK not in HELPER.read_text(errors="replace"):
            pytest.fail(f"{HELPER} exists and is not this test's helper: remove it to run these tests")
        HELPER.write_text(f'#!/bin/sh\n{MARK}\nexec "{sys.executable}" -m xetfs "$@"\n')
        HELPER.chmod(0o755)
        try:
            yield HELPER
        finally:
            HELPER.unlink(missing_ok=True)


def _files(cli: CliRunner, store: Path | str) -> dict[str, bytes]:
    """Every file the sample store names, read with ``xetfs cat`` (the oracle for the mount)."""
    entries = json.loads((SAMPLE / "xetfs-manifest.json").read_bytes())
    out = {}
    for e in entries:
        if e["type"] == "file" and e["size"]:
            got = cli("cat", store, e["xetHash"])
            assert got.returncode == 0, got.stderr
            out[e["path"]] = got.stdout
        elif e["type"] == "file":
            out[e["path"]] = b""
    return out


def _fs_type(mnt: Path) -> str | None:
    target = os.path.abspath(mnt)
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            if left.split()[4] == target:
                return right.split()[0]
    return None


@contextlib.contextmanager
def _mounted_by_mount(cmd: list[str], mnt: Path, env: dict[str, str] | None = None) -> Iterator[None]:
    """Run ``cmd`` (a ``mount``), then leave the block with ``umount MNT`` (forcing only when that fails)."""
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120, check=False)
    try:
        assert proc.returncode == 0, f"{cmd}: {proc.stderr}"
        assert _fs_type(mnt) == "fuse.xetfs", proc.stderr
        yield
        out = subprocess.run(["umount", str(mnt)], capture_output=True, text=True, timeout=60, check=False)
        assert out.returncode == 0, out.stderr
        wait_until(lambda: not is_mounted(mnt), 20, f"{mnt} to be unmounted")
    finally:
        if is_mounted(mnt):
            force_unmount(mnt)


def _log_of(mnt: Path) -> str:
    name = str(mnt.resolve()).strip("/").replace("/", "_")
    path = Path(os.environ["XDG_STATE_HOME"]) / "xetfs" / f"{name}.log"
    return path.read_text(errors="replace") if path.exists() else ""


def test_mount_t_fuse_xetfs_and_umount(helper: Path, tmp_path: Path, cli: CliRunner) -> None:
    files = _files(cli, SAMPLE)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    cmd = ["mount", "-t", "fuse.xetfs", str(SAMPLE), str(mnt), "-o", "cache_size=64M,workers=0,nodev,nosuid"]
    with _mounted_by_mount(cmd, mnt):
        for name, data in files.items():
            assert (mnt / name).read_bytes() == data, name
        options = next(opts for point, _, opts in mountinfo() if point == str(mnt))
        assert {"ro", "nodev", "nosuid"} <= set(options), options
    assert "Traceback" not in _log_of(mnt)


def test_mount_t_fuse_with_the_program_named_in_the_source(tmp_path: Path, cli: CliRunner) -> None:
    """``mount -t fuse 'PROGRAM#STORE' MNT``: a given installation, whatever ``xetfs`` the shell's path finds
    (docs/mirrors.md)."""
    program = tmp_path / "bin" / "xetfs"
    program.parent.mkdir()
    program.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m xetfs "$@"\n')
    program.chmod(0o755)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    cmd = ["mount", "-t", "fuse", f"{program}#{SAMPLE}", str(mnt), "-o", "workers=0,cache_size=32M"]
    with _mounted_by_mount(cmd, mnt):
        for name, data in _files(cli, SAMPLE).items():
            assert (mnt / name).read_bytes() == data, name


def test_fstab_line_with_xetfs_options_and_a_credentials_file(helper: Path, tmp_path: Path, cli: CliRunner) -> None:
    www = tmp_path / "www"
    assert cli("push", "--no-progress", SAMPLE, www / "store").returncode == 0
    creds = tmp_path / "creds"
    creds.write_text(f"# for the node's mounts\nXETFS_HTTP_TOKEN={TOKEN}\n")
    creds.chmod(0o600)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    with servers.nginx(www, token=TOKEN) as web:
        url = f"{web.url}/store"
        generic = "ro,noauto,nofail,_netdev,x-systemd.automount,x-systemd.mount-timeout=30,defaults"
        options = f"{generic},credentials={creds},cache_size=32M,workers=0,disk_cache_size=0,io_timeout=20,layout=names"
        fstab = tmp_path / "fstab"
        fstab.write_text(f"# a node's mirror\n{url}  {mnt}  fuse.xetfs  {options}  0  0\n")
        env = {k: v for k, v in os.environ.items() if not k.startswith("XETFS_HTTP")}  # only the file has the token
        with _mounted_by_mount(["mount", "-T", str(fstab), str(mnt)], mnt, env=env):
            for name, data in _files(cli, SAMPLE).items():
                assert (mnt / name).read_bytes() == data, name
        assert TOKEN not in _log_of(mnt)
        served = [line for line in web.access_log().splitlines() if "GET /store/" in line]
        assert served and not [line for line in served if '" 401 ' in line], served  # the file's token


def test_helper_form_is_mount() -> None:
    commands = ["mount", "ls", "push"]
    assert helper_argv(["/srv/store", "/mnt/x", "-o", "ro"], commands) == ["mount", "/srv/store", "/mnt/x", "-o", "ro"]
    assert helper_argv(["ls", "/srv/store"], commands) == ["ls", "/srv/store"]
    assert helper_argv(["--version"], commands) == ["--version"]
    assert helper_argv(["/srv/store"], commands) == ["/srv/store"]  # (one argument: argparse says what is wrong)


def test_every_mount_option_has_an_o_spelling() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    mount = sub.choices["mount"]
    table = option_table(mount)
    longs = {s for a in mount._actions for s in a.option_strings if s.startswith("--")}
    hidden = {s for a in mount._actions if a.help == argparse.SUPPRESS for s in a.option_strings}
    assert hidden == {"--ready-fd", "--config-fd", "--drop-clean-log"}  # (between xetfs mount and its daemon)
    assert {flag for flag, _ in table.values()} == longs - {"--help", "--foreground"} - hidden
    for name, (flag, takes_value) in table.items():
        given = f"{name}=1" if takes_value else name
        assert expand_options(["S", "M", "-o", given], table) == ["S", "M", flag, *(["1"] if takes_value else [])]
    argv = ["mount", "s3://b/p", "/mnt", "-o", "rw,nosuid,nodev,cache_size=2G,workers=4,disk_cache_size=0",
            "-o", "_netdev,nofail,x-systemd.automount,allow_other,no_prefetch"]  # fmt: skip
    words = expand_mount_argv(argv, parser)
    assert words == ["mount", "s3://b/p", "/mnt", "--cache-size", "2G", "--workers", "4", "--disk-cache-size", "0",
                     "--no-prefetch", "-o", "nosuid,nodev,allow_other"]  # fmt: skip
    args = parser.parse_args(words)
    assert (args.cache_size, args.workers, args.disk_cache_size, args.prefetch) == (2 << 30, 4, 0, False)
    assert {"defaults", "rw", "_netdev", "nofail", "user", "users", "auto", "noauto", "dev", "suid", "exec"} <= IGNORED
    assert split_options(r"a=1,header=X-A: b\,c,,ro") == ["a=1", "header=X-A: b,c", "ro"]
    with pytest.raises(argparse.ArgumentTypeError, match="needs a value"):
        expand_options(["-o", "workers"], table)
    with pytest.raises(argparse.ArgumentTypeError, match="takes no value"):
        expand_options(["-o", "strict=1"], table)
    with pytest.raises(argparse.ArgumentTypeError, match=r"mount option foreground: not as -o .* give -f"):
        expand_options(["-o", "foreground"], table)


def test_unknown_o_option_is_refused(cli: CliRunner, tmp_path: Path) -> None:
    """A usage error (exit status 2), naming every option -o takes, the common ones (log_level) too."""
    (tmp_path / "mnt").mkdir()
    out = cli(SAMPLE, tmp_path / "mnt", "-o", "cache_size=1M,bogus")
    assert out.returncode == 2 and "unknown mount option(s): bogus" in out.stderr, out.stderr
    assert "log_level" in out.stderr and "debug" in out.stderr and "cache_size" in out.stderr, out.stderr
    assert not is_mounted(tmp_path / "mnt")


@pytest.mark.parametrize(
    ("option", "said"),
    [
        (["--io-timeout", "-1"], "--io-timeout: not a usable time: '-1' (seconds, more than 0)"),
        (["-o", "io_mode=thread,io_timeout=0"], "--io-timeout: not a usable time: '0' (seconds, more than 0)"),
        (["--refresh-every", "-3"], "--refresh-every: not a usable time: '-3'"),
        (["--uid", "-5"], "--uid: -5 is out of range (0 to 4294967294)"),
        (["--gid", "4294967296"], "--gid: 4294967296 is out of range (0 to 4294967294)"),
        (["--workers", "-1"], "--workers: -1 is out of range (0 to 256)"),
        (["--read-ahead", "3G"], "--read-ahead: 3G is more than 64M"),
        (["--read-ahead", "1"], "--read-ahead: 1 is less than 4K"),
        (["-o", "read_ahead=4095"], "--read-ahead: 4095 is less than 4K"),
    ],
)
def test_values_that_cannot_work_are_refused_before_mounting(tmp_path: Path, option: list[str], said: str) -> None:
    (tmp_path / "mnt").mkdir()
    out = subprocess.run([sys.executable, "-m", "xetfs", "mount", str(SAMPLE), str(tmp_path / "mnt"), *option],
                         capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert out.returncode == 2 and said in out.stderr, out.stderr
    assert not is_mounted(tmp_path / "mnt")


def test_more_workers_than_cpus_or_a_cache_beyond_memory_is_said(capsys: pytest.CaptureFixture[str]) -> None:
    from xetfs.base.settings import usable_cpus
    from xetfs.commands.mount import _warn_of_waste
    from xetfs.fuse.launch import MountConfig

    cpus = usable_cpus()
    _warn_of_waste(MountConfig(store="s", mountpoint=Path("/m"), workers=cpus, cache_size=1 << 20))
    assert capsys.readouterr().err == ""
    _warn_of_waste(MountConfig(store="s", mountpoint=Path("/m"), workers=cpus + 1, cache_size=1 << 45))
    err = capsys.readouterr().err.splitlines()
    assert (
        err[0] == f"xetfs: warning: --workers {cpus + 1}: more decode workers than CPUs ({cpus}) add processes "
        "and memory, not speed"
    )
    assert err[1].startswith("xetfs: warning: --cache-size 32.0 TiB: more than this machine's memory ("), err
