"""What a new user meets first: the command on PATH, installing, and the plain errors and exit codes.

Each test runs xetfs the way a user does (scripts/setup.sh, ``python -m
xetfs`` as its own process, real mounts in temporary directories).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import oracle
from helpers.mounting import force_unmount, is_mounted, wait_until
from helpers.oracle import OracleStore, run_xetfs

from xetfs.base import hashes
from xetfs.base.exitstatus import MEANING, ExitStatus
from xetfs.base.messages import plural
from xetfs.base.settings import DAEMON_TIMEOUT
from xetfs.commands.statsview import format_stats, summarize_stats
from xetfs.storage.manifest import MAX_WARNINGS_PER_KIND, ManifestFile, dump_manifest

REPO = oracle.REPO_ROOT
VENV_XETFS = REPO / ".venv" / "bin" / "xetfs"


def _setup(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(REPO / "scripts" / "setup.sh")],
        capture_output=True, text=True, env={**os.environ, **env}, timeout=600, check=False,
    )  # fmt: skip


# -- the command on PATH -----------------------------------------------------------------------


def _others_can_run(path: Path, *, read: bool = False) -> bool:
    """Whether a user neither owner nor in the group may execute ``path`` (every directory above searchable),
    and with ``read`` read it too (a script)."""
    real = path.resolve()
    readable = not read or real.stat().st_mode & stat.S_IROTH
    return bool(readable) and all(p.stat().st_mode & stat.S_IXOTH for p in (real, *real.parents))


@pytest.mark.integration
def test_setup_puts_xetfs_on_path(tmp_path: Path) -> None:
    """After setup, a new shell whose PATH has the link directory runs ``xetfs``; a rerun is quiet."""
    bin_dir = tmp_path / "bin"
    first = _setup({"XETFS_BIN_DIR": str(bin_dir)})
    assert first.returncode == 0, first.stderr
    link = bin_dir / "xetfs"
    assert link.is_symlink() and Path(os.readlink(link)) == VENV_XETFS
    assert f"linked {link} -> {VENV_XETFS}" in first.stderr
    assert f"{bin_dir} is not on your PATH" in first.stderr  # and it says what to do about it
    # Setup as root says, every time, when other users cannot run this xetfs.
    private = os.geteuid() == 0 and not (_others_can_run(VENV_XETFS, read=True)
                                         and _others_can_run(VENV_XETFS.parent / "python"))  # fmt: skip
    assert ("only root can run this xetfs" in first.stderr) == private
    shell = subprocess.run(
        ["env", "-i", f"PATH={bin_dir}:/usr/bin:/bin", f"HOME={tmp_path}", "bash", "-c", "xetfs --version"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert shell.returncode == 0 and shell.stdout.startswith("xetfs "), shell
    again = _setup({"XETFS_BIN_DIR": str(bin_dir), "PATH": f"{bin_dir}:{os.environ['PATH']}"})
    said = [line for line in again.stderr.splitlines() if "xetfs" in line]
    assert again.returncode == 0 and said == [line for line in said if "only root can run" in line], said
    assert len(said) == private, said


@pytest.mark.integration
def test_setup_leaves_another_xetfs_alone(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    other = bin_dir / "xetfs"
    other.write_text("#!/bin/sh\necho another xetfs\n")
    proc = _setup({"XETFS_BIN_DIR": str(bin_dir)})
    assert proc.returncode == 0, proc.stderr
    assert other.read_text() == "#!/bin/sh\necho another xetfs\n"
    assert f"{other} exists and is not this checkout's; run xetfs here as {VENV_XETFS}" in proc.stderr
    other.unlink()
    other.symlink_to(tmp_path / "gone" / "xetfs")  # a checkout that was deleted: replaced
    proc = _setup({"XETFS_BIN_DIR": str(bin_dir)})
    assert proc.returncode == 0 and Path(os.readlink(other)) == VENV_XETFS, proc.stderr


@pytest.mark.integration
def test_pip_install_of_the_project(tmp_path: Path) -> None:
    """``pip install .`` from a clean copy of the sources gives a working ``xetfs`` (not this checkout's)."""
    src = tmp_path / "src"
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    for name in filter(None, files.decode().split("\0")):
        if (REPO / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, src / name)
    site = tmp_path / "site"
    pip = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "-q", "--no-deps",
         "--no-build-isolation", "--target", str(site), str(src)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert pip.returncode == 0, pip.stdout + pip.stderr
    env = {**os.environ, "PYTHONPATH": str(site)}
    where = subprocess.run(
        [str(site / "bin" / "xetfs"), "--version"], capture_output=True, text=True, env=env, timeout=60, check=False
    )
    assert where.returncode == 0 and where.stdout.startswith("xetfs "), where
    assert f"({site / 'xetfs'})" in where.stdout, where.stdout  # (which installation runs)
    module = subprocess.run(
        [sys.executable, "-c", "import xetfs.format.shard, xetfs; print(xetfs.__file__)"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60, check=False,
    )  # fmt: skip
    assert module.returncode == 0 and module.stdout.startswith(str(site)), module


FAKE_PYTHON = """#!/bin/bash
# Records pip's arguments instead of installing; everything else goes to the real python.
if [[ $1 == -m && $2 == pip ]]; then echo "${*:3}" >>"$PIP_CALLS"; exit 0; fi
if [[ $1 == -c && $2 == "import xetfs" ]]; then exit 0; fi
exec "$REAL_PYTHON" "$@"
"""


def _checkout_with_fake_pip(tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the scripts and pyproject.toml whose .venv/bin/python records pip calls (in the file returned)."""
    repo = tmp_path / "repo"
    for name in ("scripts/setup.sh", "scripts/demo.sh", "pyproject.toml"):
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, repo / name)
    bin_dir = repo / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").write_text(FAKE_PYTHON)
    (bin_dir / "xetfs").write_text("#!/bin/sh\necho 'not installed: this is a test' >&2\nexit 1\n")
    for tool in ("python", "xetfs"):
        (bin_dir / tool).chmod(0o755)
    return repo, tmp_path / "pip-calls"


@pytest.mark.integration
def test_setup_installs_the_extras_asked_for_and_keeps_earlier_ones(tmp_path: Path) -> None:
    repo, calls = _checkout_with_fake_pip(tmp_path)
    env = {**os.environ, "XETFS_BIN_DIR": "none", "PIP_CALLS": str(calls), "REAL_PYTHON": sys.executable}

    def setup(*args: str) -> list[str]:
        before = calls.read_text().splitlines() if calls.exists() else []
        proc = subprocess.run(["bash", str(repo / "scripts" / "setup.sh"), *args], capture_output=True, text=True,
                              env=env, timeout=120, check=False)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        return calls.read_text().splitlines()[len(before) :] if calls.exists() else []

    assert setup("--extras", "pack") == ["install --disable-pip-version-check -q -e .[pack]"]
    assert setup("--extras", "pack") == []  # installed: nothing to do
    assert setup() == ["install --disable-pip-version-check -q -e .[pack,test]"]  # test.sh's run keeps pack
    assert setup("--extras", "pack") == []
    bad = subprocess.run(["bash", str(repo / "scripts" / "setup.sh"), "--extras"], capture_output=True, text=True,
                         env=env, timeout=60, check=False)  # fmt: skip
    assert bad.returncode == 2 and "--extras takes a comma-separated list" in bad.stderr


@pytest.mark.integration
def test_the_demo_installs_the_pack_extra_not_the_test_tools(tmp_path: Path) -> None:
    """The demo's setup step asks pip for ``.[pack]`` only (its fake xetfs then stops it: nothing is mounted)."""
    repo, calls = _checkout_with_fake_pip(tmp_path)
    env = {**os.environ, "XETFS_BIN_DIR": "none", "PIP_CALLS": str(calls), "REAL_PYTHON": sys.executable}
    proc = subprocess.run(["bash", str(repo / "scripts" / "demo.sh")], capture_output=True, text=True, env=env,
                          timeout=120, check=False)  # fmt: skip
    assert "not installed: this is a test" in proc.stderr, proc.stderr  # it got as far as the first xetfs command
    assert calls.read_text().splitlines() == ["install --disable-pip-version-check -q -e .[pack]"]


@pytest.mark.fuse
def test_the_demo_runs_and_leaves_no_log_behind(tmp_path: Path) -> None:
    """scripts/demo.sh end to end; its mount logged nothing worth keeping, so its log file goes with it."""
    state = tmp_path / "state"
    env = {**os.environ, "XETFS_BIN_DIR": "none", "XDG_STATE_HOME": str(state)}
    proc = subprocess.run(["bash", str(REPO / "scripts" / "demo.sh")], capture_output=True, text=True, env=env,
                          timeout=600, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "model/config.json: OK" in proc.stdout and "(log: " in proc.stderr, proc.stdout + proc.stderr
    log = Path(proc.stderr.rsplit("(log: ", 1)[1].split(")", 1)[0])
    assert log.parent == state / "xetfs"
    # The daemon removes it once it has unmounted, which may be a moment after umount returns.
    wait_until(lambda: not log.exists(), 10, f"{log} to be removed")
    assert list((state / "xetfs").iterdir()) == []


# -- arguments and messages ------------------------------------------------------------------


@pytest.mark.integration
def test_every_option_has_help() -> None:
    from xetfs.commands.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    missing = [
        f"{name} {action.option_strings or action.dest}"
        for name, p in sub.choices.items()
        for action in p._actions
        if action.help is None and not isinstance(action, argparse._HelpAction)
    ]
    assert missing == []
    text = run_xetfs("mount", "--help").stdout.decode()
    assert "--log-level {debug,info,warning,error}\n" in text and "least severe messages to log" in text


@pytest.mark.integration
def test_mount_on_a_missing_mountpoint_says_so(basic_store: OracleStore, tmp_path: Path) -> None:
    missing = tmp_path / "no-such-dir"
    proc = run_xetfs("mount", basic_store.path, missing)
    assert proc.returncode == 1
    assert proc.stderr.decode() == f"xetfs: error: {missing}: no such directory (create it first: mkdir {missing})\n"
    not_dir = tmp_path / "file"
    not_dir.write_text("x")
    proc = run_xetfs("mount", basic_store.path, not_dir)
    assert proc.stderr.decode() == f"xetfs: error: {not_dir}: not a directory\n"


@pytest.mark.integration
def test_ls_warns_in_the_style_of_every_other_command(basic_store: OracleStore, tmp_path: Path) -> None:
    """``xetfs: warning: ...`` from ``ls`` (through logging) as from ``mount`` and ``pack`` (printed)."""
    store = oracle.copy_store(basic_store, tmp_path / "store")
    f = basic_store["text.txt"]
    missing = "07" * 32
    named = [ManifestFile(("text.txt",), hashes.from_hex(f.hash), None, None),
             ManifestFile(("gone.bin",), hashes.from_hex(missing), None, None)]  # fmt: skip
    (store.path / "xetfs-manifest.json").write_bytes(dump_manifest(named))
    proc = run_xetfs("ls", store.path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.decode() == f"xetfs: warning: names: 'gone.bin' (file {missing}) is not in the store: left out\n"


@pytest.mark.integration
def test_the_stats_table_shows_seconds_to_the_millisecond() -> None:
    table = format_stats({"uptime_seconds": 12.345678, "remote": {"wait_s": 0.30516277387505397, "ranges": 1234},
                          "refresh_error": ""})  # fmt: skip
    assert table.splitlines() == ["uptime_seconds          12.35", "remote:", "  wait_s                0.305",
                                  "  ranges                1,234", "refresh_error           -"]  # fmt: skip


@pytest.mark.integration
def test_counts_are_worded_with_their_plural() -> None:
    assert [plural(n, "file") for n in (0, 1, 2)] == ["0 files", "1 file", "2 files"]
    assert plural(1, "entry") == "1 entry" and plural(3, "entry") == "3 entries" and plural(2, "day") == "2 days"
    assert plural(2, "blob whose content does not match its name", "blobs whose content does not match their name") == (
        "2 blobs whose content does not match their name"
    )


@pytest.mark.integration
def test_exit_statuses_are_distinct_and_each_has_a_meaning() -> None:
    from xetfs.commands import cli

    assert len({int(s) for s in ExitStatus}) == len(ExitStatus) and set(MEANING) == set(ExitStatus)
    assert ExitStatus.SKIPPED not in (ExitStatus.ERROR, ExitStatus.USAGE, ExitStatus.PROBLEMS) and ExitStatus.SKIPPED
    assert (ExitStatus.PROBLEMS, ExitStatus.INTERRUPTED, ExitStatus.BROKEN_PIPE) == (3, 130, 141)
    assert (cli.EXIT_OK, cli.EXIT_ERROR, cli.EXIT_USAGE, cli.EXIT_PROBLEMS) == (0, 1, 2, 3)


# -- exit codes with a closed output pipe -------------------------------------------------------


def _into_a_closed_pipe(*args: object) -> subprocess.CompletedProcess[bytes]:
    """Run ``xetfs ARGS`` with stdout a pipe whose reader has gone (``| head`` after head exited)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(
            [sys.executable, "-m", "xetfs", *map(str, args)],
            stdout=write_end, stderr=subprocess.PIPE, cwd=REPO, timeout=300, check=False,
        )  # fmt: skip
    finally:
        os.close(write_end)


@pytest.mark.integration
def test_verify_into_a_closed_pipe_keeps_the_damage_status(basic_store: OracleStore, tmp_path: Path) -> None:
    """``xetfs verify STORE | head`` on a damaged store never exits 0: it says 3 (damage found)."""
    store = oracle.copy_store(basic_store, tmp_path / "store")
    f = store["random.bin"]
    (xorb,) = {t.xorb for t in oracle.store_terms(store)[f.hash]}
    oracle.flip_byte(store.xorb_path(xorb), 5000)
    assert run_xetfs("verify", store.path).returncode == 3
    for _ in range(3):
        proc = _into_a_closed_pipe("verify", store.path)
        assert (proc.returncode, proc.stderr) == (3, b"")


@pytest.mark.integration
def test_ls_into_a_closed_pipe_is_not_a_success(basic_store: OracleStore) -> None:
    proc = _into_a_closed_pipe("ls", basic_store.path)
    assert (proc.returncode, proc.stderr) == (141, b"")


# -- empty and damaged stores: mount and verify agree ------------------------------------------


@pytest.fixture
def mnt(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "mnt"
    path.mkdir()
    try:
        yield path
    finally:
        if is_mounted(path):
            subprocess.run([sys.executable, "-m", "xetfs", "umount", str(path)], capture_output=True, check=False)
        if is_mounted(path):
            force_unmount(path)
        assert not is_mounted(path)


@pytest.mark.fuse
def test_a_skipped_shard_is_reported_where_the_user_mounts(multi_store: OracleStore, tmp_path: Path, mnt: Path) -> None:
    store = oracle.copy_store(multi_store, tmp_path / "store")
    victim = store.shard_paths()[0]
    oracle.truncate(victim, victim.stat().st_size // 2)
    log = tmp_path / "daemon.log"
    proc = run_xetfs("mount", store.path, mnt, "--log-file", log)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.decode().splitlines()
    assert len(lines) == 2, lines
    assert lines[0].startswith(f"xetfs: warning: skipping shard {victim.name}: "), lines
    assert lines[1] == f"xetfs: mounted {store.path} at {mnt} with 1 warning (log: {log})"
    assert victim.name in log.read_text()


@pytest.mark.fuse
def test_a_mount_given_as_a_store_names_the_store_it_mounts(basic_store: OracleStore, mnt: Path) -> None:
    assert run_xetfs("mount", basic_store.path, mnt).returncode == 0
    for command in ("ls", "verify"):
        proc = run_xetfs(command, mnt)
        assert proc.returncode == ExitStatus.ERROR, proc
        assert proc.stderr.decode() == (f"xetfs: error: store {mnt}: this is a xetfs mount of {basic_store.path}: "
                                        f"give that store instead, or read the files under {mnt}\n")  # fmt: skip


@pytest.mark.fuse
def test_the_mount_counts_every_warning_the_log_sums_up(basic_store: OracleStore, tmp_path: Path, mnt: Path) -> None:
    """Past ``MAX_WARNINGS_PER_KIND`` names of one kind skipped, the log sums the rest up in one line; the mount
    still counts each."""
    store = oracle.copy_store(basic_store, tmp_path / "store")
    skipped = MAX_WARNINGS_PER_KIND + 10
    one = basic_store["one-byte"]  # (names whose size is not the store's: one warning each)
    named = [ManifestFile((f"wrong{k}.bin",), hashes.from_hex(one.hash), one.size + 1, None) for k in range(skipped)]
    (store.path / "xetfs-manifest.json").write_bytes(dump_manifest(named))
    log = tmp_path / "daemon.log"
    proc = run_xetfs("mount", store.path, mnt, "--log-file", log)
    assert proc.returncode == 0, proc.stderr
    *shown, more, last = proc.stderr.decode().splitlines()
    assert last == f"xetfs: mounted {store.path} at {mnt} with {skipped} warnings (log: {log})", last
    assert more == (
        f"xetfs: warning: ... and {skipped - len(shown)} more warnings (the log lists more of them and counts the rest)"
    ), more
    assert "names: ... and 10 more size warnings" in log.read_text()


@pytest.mark.integration
def test_a_directory_of_plain_files_given_as_a_store_says_how_to_make_one(tmp_path: Path) -> None:
    (tmp_path / "data" / "train").mkdir(parents=True)
    (tmp_path / "data" / "train" / "a.json").write_text("{}")
    proc = run_xetfs("ls", tmp_path / "data")
    assert proc.returncode == 1
    hint = f"; to make a store of the files there: xetfs pack {tmp_path / 'data'} STORE\n"
    assert proc.stderr.decode().endswith(hint), proc.stderr
    (tmp_path / "empty").mkdir()
    assert "xetfs pack" not in run_xetfs("ls", tmp_path / "empty").stderr.decode()


@pytest.mark.fuse
def test_a_store_whose_every_shard_is_bad_is_refused(multi_store: OracleStore, tmp_path: Path, mnt: Path) -> None:
    store = oracle.copy_store(multi_store, tmp_path / "store")
    shards = store.shard_paths()
    for shard in shards:
        oracle.truncate(shard, 10)
    proc = run_xetfs("mount", store.path, mnt, "--log-file", tmp_path / "daemon.log")
    assert proc.returncode == 1 and not is_mounted(mnt)
    (line,) = proc.stderr.decode().splitlines()
    assert line.startswith(f"xetfs: error: store {store.path}: nothing to show: all {len(shards)} shards are bad"), line
    assert run_xetfs("verify", store.path).returncode == 3
    assert run_xetfs("ls", store.path).returncode == 1


@pytest.mark.fuse
def test_an_empty_store_mounts_and_verifies(tmp_path: Path, mnt: Path) -> None:
    """A store with neither shards nor xorbs is empty, not damaged: mount and verify both accept it."""
    store = tmp_path / "empty"
    (store / "shards").mkdir(parents=True)
    (store / "xorbs").mkdir()
    verify = run_xetfs("verify", store)
    assert verify.returncode == 0 and verify.stdout.decode().startswith("OK: 0 shards"), verify
    proc = run_xetfs("mount", store, mnt, "--log-file", tmp_path / "daemon.log")
    assert proc.returncode == 0, proc.stderr
    assert "has no shards: the mount shows no files" in proc.stderr.decode()
    assert os.listdir(mnt) == [] and json.loads((mnt / ".xetfs/stats").read_bytes())["index"]["files"] == 0


@pytest.mark.integration
def test_xorbs_without_shards_are_refused_by_mount_and_verify(basic_store: OracleStore, tmp_path: Path) -> None:
    store = oracle.copy_store(basic_store, tmp_path / "store")
    for shard in store.shard_paths():
        shard.unlink()
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    for args in (("mount", store.path, mnt), ("verify", store.path), ("ls", store.path)):
        proc = run_xetfs(*args)
        out = (proc.stdout + proc.stderr).decode()
        assert proc.returncode in (1, 3) and "the shards are missing" in out, (args, out)
    assert not is_mounted(mnt)


# -- umount ------------------------------------------------------------------------------------


@pytest.mark.fuse
def test_umount_refuses_what_xetfs_did_not_mount(mnt: Path) -> None:
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], check=True)
    try:
        proc = run_xetfs("umount", mnt)
        assert proc.returncode == 1 and is_mounted(mnt)
        assert proc.stderr.decode() == (
            f"xetfs: error: {mnt}: not a xetfs mount (it is tmpfs)\n"  # (--force is suggested only for FUSE mounts)
        )
        forced = run_xetfs("umount", "--force", mnt)
        assert (forced.returncode, forced.stderr) == (0, b"") and not is_mounted(mnt)
    finally:
        if is_mounted(mnt):
            subprocess.run(["umount", "-l", str(mnt)], check=False)


FORCE_SCENARIO = textwrap.dedent(
    """
    import json, os, signal, subprocess, sys, time
    store, mnt, log, fusectl = sys.argv[1:5]
    point = "/sys/fs/fuse/connections"
    def mounted(path):
        with open("/proc/self/mountinfo") as f:
            return any(line.split()[4] == path for line in f)
    # This is a private mount namespace: what changes here is seen nowhere else.
    if mounted(point) and fusectl == "missing":
        subprocess.run(["umount", point], check=True)
    if not mounted(point) and fusectl == "mounted":
        subprocess.run(["mount", "-t", "fusectl", "fusectl", point], check=True)
    before = mounted(point)
    daemon = subprocess.Popen([sys.executable, "-m", "xetfs", "mount", "--foreground", store, mnt, "--log-file", log])
    try:
        deadline = time.monotonic() + 30
        while not (mounted(mnt) and os.path.exists(os.path.join(mnt, ".xetfs/stats"))):
            assert daemon.poll() is None and time.monotonic() < deadline, "the mount did not come up"
            time.sleep(0.02)
        os.kill(daemon.pid, signal.SIGSTOP)
        result = {}
        if fusectl == "mounted":  # commands that ask the daemon give up, and say how to end the mount
            began = time.monotonic()
            link = mnt + "-link"
            os.symlink(mnt, link)
            given = {"ls": ("ls", mnt), "stats": ("stats", mnt), "refresh": ("refresh", mnt), "ls-link": ("ls", link)}
            asks = {key: subprocess.Popen([sys.executable, "-m", "xetfs", *args], stdout=subprocess.DEVNULL,
                                          stderr=subprocess.PIPE, text=True) for key, args in given.items()}
            for cmd, ask in asks.items():
                result[cmd] = (ask.wait(60), ask.stderr.read())
            result["asks_seconds"] = time.monotonic() - began
        if fusectl == "mounted":  # a plain umount, with a read waiting for the stopped daemon: it gives up
            reader = subprocess.Popen(["cat", os.path.join(mnt, "a.bin")], stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL)
            began = time.monotonic()
            plain = subprocess.run([sys.executable, "-m", "xetfs", "umount", mnt], capture_output=True, text=True,
                                   timeout=60)
            result.update(plain_status=plain.returncode, plain_stderr=plain.stderr,
                          plain_seconds=time.monotonic() - began)
        proc = subprocess.run([sys.executable, "-m", "xetfs", "umount", "--force", mnt],
                              capture_output=True, text=True, timeout=30)
        if fusectl == "mounted":
            result["reader_status"] = reader.wait(10)
        result.update(fusectl_before=before, fusectl_after=mounted(point), status=proc.returncode,
                      stderr=proc.stderr, still_mounted=mounted(mnt))
        os.kill(daemon.pid, signal.SIGCONT)
        result["daemon_status"] = daemon.wait(10)
        print(json.dumps(result))
    finally:
        if daemon.poll() is None:
            os.kill(daemon.pid, signal.SIGCONT)
            daemon.kill()
            daemon.wait()
    """
)


@pytest.mark.fuse
@pytest.mark.parametrize("fusectl", ["missing", "mounted"])
def test_umount_force_cleans_a_stopped_daemon(basic_store: OracleStore, tmp_path: Path, fusectl: str) -> None:
    """``xetfs umount --force`` of a hung (stopped) daemon, with and without fusectl mounted beforehand.

    Runs in a private mount namespace (``unshare -m``), so that fusectl can be
    absent there whatever the machine has; root mounts it when it is missing.
    """
    if shutil.which("unshare") is None:
        pytest.fail("needs unshare (util-linux)")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    proc = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", sys.executable, "-c", FORCE_SCENARIO,
         str(basic_store.path), str(mnt), str(tmp_path / "daemon.log"), fusectl],
        capture_output=True, text=True, cwd=REPO, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(proc.stdout)
    assert result["fusectl_before"] is (fusectl == "mounted")
    assert (result["status"], result["stderr"]) == (0, ""), result
    assert result["fusectl_after"] and not result["still_mounted"], result
    assert result["daemon_status"] is not None
    assert not is_mounted(mnt)
    if fusectl == "mounted":
        assert result["plain_status"] == ExitStatus.ERROR, result
        assert result["plain_stderr"].startswith(f"xetfs: error: {mnt}: the mount's daemon does not answer ("), result
        assert f"'xetfs umount -z {mnt}' detaches it now" in result["plain_stderr"], result
        assert f"; 'xetfs umount --force {mnt}' fails its pending reads" in result["plain_stderr"], result
        assert result["plain_seconds"] < DAEMON_TIMEOUT * 2 + 10, result
        assert result["reader_status"] != 0, result  # (its read failed when the connection was aborted)
        force = f"'xetfs umount --force {mnt}' fails its pending reads and unmounts it\n"
        assert result["ls"] == [
            ExitStatus.ERROR,
            f"xetfs: error: store {mnt}: this is a xetfs mount of {basic_store.path}, whose daemon does not answer "
            f"(it is stopped or hung): give that store instead; {force}",
        ], result
        for cmd in ("stats", "refresh"):
            assert result[cmd] == [
                ExitStatus.ERROR,
                f"xetfs: error: {mnt}: the mount's daemon does not answer (waited {DAEMON_TIMEOUT:g} s): it is "
                f"stopped or hung; {force}",
            ], result
        assert result["ls-link"] == [
            ExitStatus.ERROR,
            f"xetfs: error: store {mnt}-link: no answer within {DAEMON_TIMEOUT:g} s: it lies on a mount whose daemon "
            "or server does not answer (stopped or hung)\n",
        ], result
        assert result["asks_seconds"] < DAEMON_TIMEOUT + 10, result


# -- logs of the test suite ---------------------------------------------------------------------


@pytest.mark.fuse
def test_default_daemon_log_is_under_the_tests_temporary_directory(
    basic_store: OracleStore, mnt: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A mount without ``--log-file`` logs under ``$XDG_STATE_HOME``, which the suite points at its temp dir."""
    home_logs = Path.home() / ".local" / "state" / "xetfs"
    before = set(home_logs.iterdir()) if home_logs.is_dir() else set()
    proc = run_xetfs("mount", basic_store.path, mnt)
    assert proc.returncode == 0, proc.stderr
    try:
        log = Path(proc.stderr.decode().rsplit("(log: ", 1)[1].rstrip(")\n"))
        assert log.is_file() and log.is_relative_to(tmp_path_factory.getbasetemp()), log
    finally:
        assert run_xetfs("umount", mnt).returncode == 0
    after = set(home_logs.iterdir()) if home_logs.is_dir() else set()
    assert after == before


# -- a packed tree, as ordinary tools see it -----------------------------------------------------

TREE = {
    "README.md": b"# a model\n" * 50,
    "model/config.json": b'{"hidden_size": 8}\n',
    "model/weights.bin": oracle.random_bytes(300_000, 1),
    "model/copy-of-weights.bin": oracle.random_bytes(300_000, 1),  # the same content: one file, two names
    "data/empty.txt": b"",
}
MTIMES = {name: 1_600_000_000_123_456_789 + i * 86_400_000_000_000 for i, name in enumerate(sorted(TREE))}


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store written by ``xetfs pack`` from a tree whose files have known, distinct mtimes."""
    tmp = tmp_path_factory.mktemp("packed")
    src = tmp / "src"
    for name, data in TREE.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_bytes(data)
        os.utime(src / name, ns=(MTIMES[name], MTIMES[name]))
    proc = run_xetfs("pack", src, tmp / "store", "--no-progress")
    assert proc.returncode == 0, proc.stderr
    return tmp / "store"


@pytest.mark.integration
def test_pack_records_mtimes_in_the_manifest(packed: Path) -> None:
    from xetfs.storage.manifest import parse_mtime

    rows = json.loads((packed / "xetfs-manifest.json").read_bytes())
    files = {r["path"]: r for r in rows if r["type"] == "file"}
    assert {p: parse_mtime(r["mtime"]) for p, r in files.items()} == MTIMES
    assert files["README.md"]["mtime"] == "2020-09-13T12:26:40.123456789Z"


@pytest.mark.integration
def test_ls_shows_names_and_mtimes(packed: Path) -> None:
    rows = json.loads(run_xetfs("ls", packed, "--json").stdout)
    assert [r["path"] for r in rows] == sorted(TREE)
    for r in rows:
        assert r["size"] == len(TREE[r["path"]]) and r["mtime"] is not None
    assert rows[0].keys() == {"hash", "size", "sha256", "terms", "chunks", "path", "mtime"}
    weights = {r["hash"] for r in rows if r["path"].endswith("weights.bin")}
    assert len(weights) == 1
    text = run_xetfs("ls", packed).stdout.decode().splitlines()
    assert len(text) == len(TREE)
    readme = next(line for line in text if line.endswith("  README.md"))
    assert readme.split()[-2:] == ["2020-09-13T12:26:40Z", "README.md"]
    # On a terminal, a header names the columns, each above its values.
    if shutil.which("script") is None:
        pytest.fail("needs script (util-linux)")
    cmd = shlex.join([sys.executable, "-m", "xetfs", "ls", str(packed)])
    tty = subprocess.run(["script", "-qec", cmd, "/dev/null"], capture_output=True, text=True, cwd=REPO, timeout=60)
    header, *lines = tty.stdout.replace("\r", "").splitlines()
    assert header.split() == ["xet", "hash", "size", "sha256", "terms", "chunks", "mtime", "path"], tty.stdout
    assert lines == text
    assert header.index("path") == readme.index("README.md") and header.index("mtime") == readme.index("2020-")


@pytest.mark.integration
def test_cat_takes_a_path_the_store_names(packed: Path) -> None:
    for name in ("model/config.json", "./README.md"):
        proc = run_xetfs("cat", packed, name)
        assert (proc.returncode, proc.stdout) == (0, TREE[name.removeprefix("./")]), proc.stderr
    proc = run_xetfs("cat", packed, "model/nope.json")
    assert proc.returncode == ExitStatus.USAGE and proc.stderr.decode() == (
        "xetfs: error: not a file hash or a hash prefix of at least 8 hex digits, nor a path the store's names "
        "give: 'model/nope.json'\n"
    )


@pytest.mark.integration
def test_cat_of_a_name_that_looks_like_a_hash(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "x").write_bytes(b"first\n")
    assert run_xetfs("pack", src, tmp_path / "probe", "--no-progress").returncode == 0
    x_hash = json.loads(run_xetfs("ls", tmp_path / "probe", "--json").stdout)[0]["hash"]
    sha = hashlib.sha256(b"second\n").hexdigest()
    (src / x_hash[:10]).write_bytes(b"second\n")  # (named by the start of x's hash)
    (src / sha).write_bytes(b"second\n")  # (named by a sha256, as a cache's blobs are)
    store = tmp_path / "store"
    assert run_xetfs("pack", src, store, "--no-progress").returncode == 0
    assert run_xetfs("cat", store, sha).stdout == b"second\n"
    assert run_xetfs("cat", store, f"./{x_hash[:10]}").stdout == b"second\n"
    assert run_xetfs("cat", store, x_hash).stdout == b"first\n"
    both = run_xetfs("cat", store, x_hash[:10])
    assert both.returncode == ExitStatus.USAGE and both.stderr.decode() == (
        f"xetfs: error: {x_hash[:10]!r} is a path of the store's names and the hash (or its start) of another "
        f"file: give ./{x_hash[:10]} for the path, or the whole hash\n"
    )


@pytest.mark.integration
def test_cat_by_hash_needs_no_names(packed: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    shutil.copytree(packed, store)
    xet = json.loads(run_xetfs("ls", store, "--json").stdout)[0]
    (store / "xetfs-manifest.json").write_text("{broken")
    proc = run_xetfs("cat", store, xet["hash"])
    assert (proc.returncode, proc.stderr, proc.stdout) == (0, b"", TREE[xet["path"]]), proc.stderr
    proc = run_xetfs("cat", store, xet["hash"][:12])  # (a prefix could be a path too: the names are asked, and lost)
    assert (proc.returncode, proc.stdout) == (0, TREE[xet["path"]]), proc.stderr
    assert proc.stderr.decode().startswith(f"xetfs: warning: manifest {store / 'xetfs-manifest.json'}: "), proc.stderr
    by_path = run_xetfs("cat", store, xet["path"]).stderr.decode()
    assert by_path.startswith(f"xetfs: warning: manifest {store / 'xetfs-manifest.json'}: "), by_path
    assert by_path.endswith(f"(the store has no names): {xet['path']!r}\n"), by_path


@pytest.fixture(scope="module")
def packed_mount(packed: Path) -> Iterator[Path]:
    from helpers.mounting import mounted

    with mounted(packed) as m:
        yield m.path


@pytest.mark.fuse
def test_the_mount_shows_source_mtimes(packed_mount: Path, packed: Path) -> None:
    twins = ("model/copy-of-weights.bin", "model/weights.bin")
    for name in TREE:
        want = max(MTIMES[t] for t in twins) if name in twins else MTIMES[name]
        assert os.stat(packed_mount / name).st_mtime_ns == want, name
    # The two names of one file (one inode) show the later of their times; directories show the store's.
    assert os.stat(packed_mount / "model").st_mtime_ns != MTIMES["model/config.json"]


@pytest.mark.fuse
def test_the_control_directory_is_hidden_but_reachable(packed_mount: Path) -> None:
    assert ".xetfs" not in os.listdir(packed_mount)
    assert sorted(os.listdir(packed_mount / ".xetfs")) == ["by-hash", "by-sha256", "stats"]
    cd = subprocess.run(["bash", "-c", "cd .xetfs && cat stats"], cwd=packed_mount, capture_output=True, timeout=60)
    assert cd.returncode == 0 and json.loads(cd.stdout)["index"]["files"] == 4
    assert os.stat(packed_mount).st_nlink == 2 + 2  # data, model


@pytest.mark.fuse
def test_stats_shows_a_summary_and_every_counter_with_all(packed_mount: Path, packed: Path) -> None:
    assert (packed_mount / "model" / "config.json").read_bytes() == TREE["model/config.json"]
    proc = run_xetfs("stats", packed_mount)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.decode().splitlines()
    assert [line.split()[0] for line in lines[:-1]] == [
        "mount", "files", "reads", "cache", "decoded", "workers", "prefetch", "errors", "remote", "refresh"
    ]  # fmt: skip
    assert re.fullmatch(rf"mount +{re.escape(str(packed_mount))} of {re.escape(str(packed.resolve()))}: pid \d+, "
                        r"up [\d.]+ s", lines[0]), lines[0]  # fmt: skip
    assert lines[1].split(None, 1)[1] == "4 files in 1 shard"
    assert re.fullmatch(r"reads +[1-9]\d* requests?, .* returned", lines[2]), lines[2]
    assert lines[7:10] == ["errors    none", "remote    none (a local store)", "refresh   never"]
    assert lines[-1] == f"(every counter: xetfs stats --all {packed_mount}; the keys: docs/stats.md)"
    table = run_xetfs("stats", "--all", packed_mount).stdout.decode()
    doc = json.loads(run_xetfs("stats", "--json", packed_mount).stdout)
    assert [line[:-1] for line in table.splitlines() if line.endswith(":")] == [
        k for k, v in doc.items() if isinstance(v, dict)
    ]


@pytest.mark.integration
def test_the_stats_summary_names_what_went_wrong() -> None:
    doc = {
        "index": {"files": 9, "shards": 3, "shards_skipped": 1},
        "reads": {"requests": 1, "bytes": 4096},
        "cache": {"bytes": 0, "capacity_bytes": 1 << 20, "hits": 1, "misses": 3, "evictions": 1},
        "decode": {"chunks": 2, "bytes": 10, "in_workers": 2, "worker_fallbacks": 1},
        "workers": {"workers": 2, "alive": 1, "lost": 1, "hung": 1},
        "errors": {"integrity": 2, "missing": 0, "timeout": 1},
        "remote": {"requests": 5, "bytes": 3 << 20, "retries": 2, "errors": 0, "disk_hits": 1, "disk_bytes": 2048,
                   "disk_corrupt": 1, "failed_reads": 4, "hung": 1, "not_requested": 9},
        "refresh": {"refreshes": 2, "failures": 1, "last_refresh": 0, "last_failure": 0},
        "uptime_seconds": 3725.0,
        "pid": 7,
        "refresh_error": "server down",
    }  # fmt: skip
    lines = summarize_stats(doc, "/mnt", "http://mirror/store").splitlines()
    assert lines[0] == "mount     /mnt of http://mirror/store: pid 7, up 1 h 2 min"
    assert lines[1] == "files     9 files in 3 shards; 1 skipped (bad shards: see the mount's log)"
    assert lines[3] == "cache     0 B held of 1.0 MiB; hit ratio 25.0%; 1 eviction"
    assert lines[4] == "decoded   2 chunks, 10 B (2 in workers); 1 done in the daemon (worker lost)"
    assert lines[5] == "workers   1 of 2 alive; 1 lost; 1 stopped as hung"
    assert lines[7] == ("errors    7 reads failed with EIO (integrity 2, timeout 1, server out of reach or "
                        "refusing 4; the mount's log names each)")  # fmt: skip
    assert lines[8] == ("remote    5 requests, 3.0 MiB received; 2 retried; 4 reads failed (server out of reach or "
                        "refusing); taken for hung 1 time, 9 fetches not asked; disk cache 2.0 KiB, 1 hit, 0 "
                        "misses; 1 corrupt (fetched again)")  # fmt: skip
    assert lines[9] == "refresh   2 refreshes (last never); 1 failed (last never: server down)"


@pytest.mark.fuse
def test_tools_that_walk_the_tree_see_the_named_tree(packed_mount: Path, tmp_path: Path) -> None:
    found = subprocess.run(["find", ".", "-type", "f"], cwd=packed_mount, capture_output=True, text=True, timeout=60)
    assert sorted(found.stdout.split()) == sorted(f"./{n}" for n in TREE)
    du = subprocess.run(["du", "-sb", "--apparent-size", "."], cwd=packed_mount, capture_output=True, text=True)
    # du counts the two names of one file once: the sum of the distinct files (and the directories, 0 bytes)
    assert int(du.stdout.split()[0]) == sum(len(d) for n, d in TREE.items() if n != "model/copy-of-weights.bin")

    copied = tmp_path / "copy"
    assert subprocess.run(["cp", "-r", str(packed_mount), str(copied)], timeout=60).returncode == 0
    assert sorted(str(p.relative_to(copied)) for p in copied.rglob("*") if p.is_file()) == sorted(TREE)
    assert not (copied / ".xetfs").exists()

    archive = tmp_path / "all.tar"
    tar = subprocess.run(["tar", "cf", str(archive), "."], cwd=packed_mount, capture_output=True, text=True)
    assert (tar.returncode, tar.stderr) == (0, ""), tar.stderr  # no "File shrank", no .xetfs
    listed = subprocess.run(["tar", "tf", str(archive)], capture_output=True, text=True, check=True).stdout
    assert ".xetfs" not in listed
    out = tmp_path / "out"
    out.mkdir()
    one = subprocess.run(["tar", "xf", str(archive), "./README.md"], cwd=out, capture_output=True, text=True)
    assert (one.returncode, one.stderr) == (0, "")
    assert (out / "README.md").read_bytes() == TREE["README.md"]
    assert os.stat(out / "README.md").st_mtime_ns // 1_000_000_000 == MTIMES["README.md"] // 1_000_000_000


@pytest.mark.fuse
def test_stats_keep_their_size_while_open(packed: Path) -> None:
    """An open ``.xetfs/stats`` is one document: its size and bytes do not change under the reader."""
    from helpers.mounting import mounted

    with mounted(packed) as m:  # a mount of its own: nothing in the page cache, so reads move the counters
        _check_stats_while_open(m.path)


def _check_stats_while_open(packed_mount: Path) -> None:
    fd = os.open(packed_mount / ".xetfs/stats", os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        first = os.pread(fd, 1 << 20, 0)
        assert len(first) == size
        for name in TREE:  # move the counters on
            (packed_mount / name).read_bytes()
        with open(packed_mount / "model/weights.bin", "rb") as f:
            f.seek(123_457)
            f.read(10)
        assert os.fstat(fd).st_size == size
        assert os.pread(fd, 1 << 20, 0) == first
    finally:
        os.close(fd)
    fresh = json.loads((packed_mount / ".xetfs/stats").read_bytes())  # a new open: a new document
    assert fresh["reads"]["bytes"] > json.loads(first)["reads"]["bytes"]


@pytest.mark.fuse
def test_mount_shows_the_store_as_the_source(packed: Path, tmp_path: Path) -> None:
    from helpers.mounting import mounted

    odd = tmp_path / "a store, with a comma"
    shutil.copytree(packed, odd)
    with mounted(odd) as m:
        table = subprocess.run(["findmnt", "-n", "-o", "SOURCE,FSTYPE", str(m.path)], capture_output=True,
                               text=True, check=True).stdout.split()  # fmt: skip
    assert " ".join(table[:-1]) == str(odd) and table[-1] == "fuse.xetfs"


@pytest.mark.integration
def test_a_url_store_is_shown_without_its_password() -> None:
    from xetfs.fuse.launch import MountConfig
    from xetfs.fuse.mount import fuse_options

    opts = fuse_options(MountConfig("http://me:secret@127.0.0.1:8080/store?token=x", Path("/mnt")))
    assert "fsname=http://me@127.0.0.1:8080/store" not in opts  # a user with a password is dropped too
    assert "fsname=http://127.0.0.1:8080/store" in opts and not any("secret" in o or "token" in o for o in opts)
    assert "fsname=http://[::1]:8080/mod%C3%A8le" in fuse_options(MountConfig("http://[::1]:8080/modèle", Path("/m")))


@pytest.mark.fuse
def test_a_store_whose_path_is_not_ascii_mounts(packed: Path, tmp_path: Path) -> None:
    from helpers.mounting import mounted

    odd = tmp_path / "café"
    shutil.copytree(packed, odd)
    with mounted(odd) as m:
        source = subprocess.run(["findmnt", "-n", "-o", "SOURCE", str(m.path)], capture_output=True, text=True,
                                check=True).stdout.strip()  # fmt: skip
        assert (m.path / "README.md").read_bytes() == TREE["README.md"]
    assert source == str(tmp_path / "caf%C3%A9")
