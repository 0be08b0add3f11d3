"""A mount's life: the background daemon, ``xetfs umount``, refusals, and signals.

``xetfs mount`` without ``--foreground`` starts a daemon and returns once the
mount answers; these tests run it as users do (``python -m xetfs``, a
process of its own), find the daemon by its command line, and clean up in
``finally`` (``mounting.force_unmount``, then the daemon's pid) whatever
happens.  Signals are sent to a foreground daemon from ``mounting.mounted``
and to a background one.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import oracle
from helpers.mounting import EXIT_DEADLINE, force_unmount, is_mounted, mount_device, mounted, wait_until
from helpers.oracle import OracleStore, run_xetfs

from xetfs.base import hashes
from xetfs.storage.manifest import ManifestFile, dump_manifest

pytestmark = pytest.mark.fuse

GONE_DEADLINE = 2.0  # seconds from a signal until the mount is gone


def daemon_pids(mountpoint: Path) -> list[int]:
    """Live ``xetfs mount`` processes serving ``mountpoint`` (found by command line)."""
    target = str(mountpoint).encode()
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"xetfs" in argv and b"mount" in argv and target in argv and alive(int(proc.name)):
            pids.append(int(proc.name))
    return pids


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie waiting for a reaper counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


@contextlib.contextmanager
def cleanup(mountpoint: Path) -> Iterator[None]:
    """On the way out, leave nothing mounted at ``mountpoint`` and no daemon serving it."""
    try:
        yield
    finally:
        if is_mounted(mountpoint):
            force_unmount(mountpoint)
        for pid in daemon_pids(mountpoint):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        assert not is_mounted(mountpoint), f"{mountpoint} is still mounted"


def one_error_line(stderr: bytes, *needles: str) -> str:
    """The single ``xetfs: error:`` line of ``stderr``; it must mention every needle."""
    lines = stderr.decode(errors="replace").splitlines()
    assert len(lines) == 1 and lines[0].startswith("xetfs: error: "), lines
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


@pytest.fixture
def mnt(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "mnt"
    path.mkdir()
    with cleanup(path):
        yield path


# -- the background daemon ---------------------------------------------------------------------


def test_background_mount_answers_at_once_then_umount(basic_store: OracleStore, mnt: Path, tmp_path: Path) -> None:
    log = tmp_path / "daemon.log"
    proc = run_xetfs("mount", basic_store.path, mnt, "--log-file", log, "--log-level", "info")
    assert proc.returncode == 0, proc.stderr
    # No polling: the command returned, so the mount must answer now.
    assert sorted(os.listdir(mnt)) == sorted(f.hash for f in basic_store.unique())
    f = basic_store["text.txt"]
    assert (mnt / f.hash).read_bytes() == f.read()
    assert is_mounted(mnt)
    (pid,) = daemon_pids(mnt)
    assert proc.stdout == b""
    assert str(mnt) in proc.stderr.decode() and str(log) in proc.stderr.decode()

    umount = run_xetfs("umount", mnt)
    assert (umount.returncode, umount.stderr) == (0, b"")
    assert not is_mounted(mnt)
    wait_until(lambda: not alive(pid), EXIT_DEADLINE, "the daemon to exit after umount")
    assert not any(line.split()[1] == str(mnt) for line in Path("/proc/mounts").read_text().splitlines())
    text = log.read_text()
    assert "Traceback" not in text and " ERROR " not in text, text
    assert os.listdir(mnt) == []


def test_mountpoint_with_spaces_and_unicode(basic_store: OracleStore, tmp_path: Path) -> None:
    """The mount table escapes spaces as octal and holds UTF-8: read-ahead and umount still find the mount."""
    mnt = tmp_path / "ma monture é"
    mnt.mkdir()
    with cleanup(mnt):
        proc = run_xetfs("mount", basic_store.path, mnt)
        assert proc.returncode == 0, proc.stderr
        device = mount_device(mnt)
        assert device is not None
        assert Path(f"/sys/class/bdi/{device}/read_ahead_kb").read_text().strip() == "1024"
        f = basic_store["text.txt"]
        assert (mnt / f.hash).read_bytes() == f.read()
        umount = run_xetfs("umount", mnt)
        assert (umount.returncode, umount.stderr) == (0, b"")
        assert not is_mounted(mnt)


def test_umount_of_a_busy_mount_fails_and_lazy_umount_detaches(basic_store: OracleStore, mnt: Path) -> None:
    assert run_xetfs("mount", basic_store.path, mnt, "--log-file", mnt.parent / "log").returncode == 0
    (pid,) = daemon_pids(mnt)
    f = basic_store["one-byte"]
    with open(mnt / f.hash, "rb") as busy:
        proc = run_xetfs("umount", mnt)
        assert proc.returncode != 0
        one_error_line(proc.stderr, str(mnt), "busy")
        assert is_mounted(mnt) and busy.read() == f.read()
        lazy = run_xetfs("umount", "-z", mnt)
        assert (lazy.returncode, lazy.stderr) == (0, b"")
        assert not is_mounted(mnt)
    wait_until(lambda: not alive(pid), EXIT_DEADLINE, "the daemon to exit after the last file closed")


def test_umount_of_what_is_not_mounted(mnt: Path) -> None:
    proc = run_xetfs("umount", mnt)
    assert proc.returncode != 0
    one_error_line(proc.stderr, str(mnt), "not mounted")
    relative = os.path.relpath(mnt, oracle.REPO_ROOT)  # (run_xetfs runs in the checkout)
    proc = run_xetfs("umount", relative)
    one_error_line(proc.stderr, f"{relative} ({mnt})", "not mounted")  # the path it looked for


def test_umount_by_a_path_through_a_symlink(basic_store: OracleStore, mnt: Path) -> None:
    """The kernel's table holds real paths: a path whose parent is a symlink names the same mount."""
    link = mnt.parent / "link"
    link.symlink_to(mnt.parent, target_is_directory=True)
    assert run_xetfs("mount", basic_store.path, mnt, "--log-file", mnt.parent / "log").returncode == 0
    proc = run_xetfs("umount", link / mnt.name)
    assert (proc.returncode, proc.stderr) == (0, b""), proc.stderr
    assert not is_mounted(mnt)


def test_sigterm_to_the_background_daemon(basic_store: OracleStore, mnt: Path) -> None:
    assert run_xetfs("mount", basic_store.path, mnt, "--log-file", mnt.parent / "log").returncode == 0
    (pid,) = daemon_pids(mnt)
    os.kill(pid, signal.SIGTERM)
    wait_until(lambda: not is_mounted(mnt), GONE_DEADLINE, "the mount to go after SIGTERM")
    wait_until(lambda: not alive(pid), EXIT_DEADLINE, "the daemon to exit after SIGTERM")
    assert os.listdir(mnt) == []


def test_a_foreground_mount_says_when_it_is_ready_and_exits_130_on_ctrl_c(
    basic_store: OracleStore, mnt: Path, tmp_path: Path
) -> None:
    """One ``xetfs: mounted STORE at MNT`` line once the mount answers; Ctrl-C (SIGINT to the terminal's
    process group: the daemon and its decode workers) unmounts and exits 130, as shells expect."""
    err = tmp_path / "stderr"
    with open(err, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "xetfs", "mount", "-f", str(basic_store.path), str(mnt)],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True)  # fmt: skip
    try:
        line = f"xetfs: mounted {basic_store.path} at {mnt}\n"
        wait_until(lambda: err.read_text() != "", 60, "the ready line", proc, err)
        assert err.read_text() == line
        assert is_mounted(mnt) and (mnt / ".xetfs" / "stats").is_file()  # said once it answers
        f = basic_store["text.txt"]
        assert (mnt / f.hash).read_bytes() == f.read()
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(EXIT_DEADLINE) == 130
        assert not is_mounted(mnt)
        assert err.read_text() == line  # nothing else: no traceback from the daemon or its workers
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(EXIT_DEADLINE)


def test_the_default_log_goes_after_a_clean_mount_and_stays_after_a_warning(
    basic_store: OracleStore, mnt: Path, tmp_path: Path
) -> None:
    """With no ``--log-file``, a mount that ends cleanly with nothing above info logged leaves no log file."""
    proc = run_xetfs("mount", basic_store.path, mnt, "--log-level", "info")
    assert proc.returncode == 0, proc.stderr
    log = Path(proc.stderr.decode().rsplit("(log: ", 1)[1].rstrip(")\n"))
    (pid,) = daemon_pids(mnt)
    assert "serving" in log.read_text()  # info lines are written while it runs
    assert run_xetfs("umount", mnt).returncode == 0
    wait_until(lambda: not alive(pid), EXIT_DEADLINE, "the daemon to exit after umount")
    assert not log.exists()

    store = oracle.copy_store(basic_store, tmp_path / "store")  # a name for a file the store lacks: a warning
    gone = ManifestFile(("gone.bin",), hashes.from_hex("07" * 32), None, None)
    (store.path / "xetfs-manifest.json").write_bytes(dump_manifest([gone]))
    proc = run_xetfs("mount", store.path, mnt)
    assert proc.returncode == 0 and b"with 1 warning (log: " in proc.stderr, proc.stderr
    (pid,) = daemon_pids(mnt)
    assert run_xetfs("umount", mnt).returncode == 0
    wait_until(lambda: not alive(pid), EXIT_DEADLINE, "the daemon to exit after umount")
    assert "gone.bin" in log.read_text()


def test_stale_mount_of_a_killed_daemon(basic_store: OracleStore, mnt: Path) -> None:
    """A daemon killed outright leaves a dead mount: mount says how to clean it, umount cleans it."""
    assert run_xetfs("mount", basic_store.path, mnt, "--log-file", mnt.parent / "log").returncode == 0
    (pid,) = daemon_pids(mnt)
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not alive(pid), EXIT_DEADLINE, "the killed daemon to die")
    with pytest.raises(OSError) as exc:
        os.listdir(mnt)
    assert exc.value.errno in (errno.ENOTCONN, errno.ECONNABORTED)

    again = run_xetfs("mount", basic_store.path, mnt)
    assert again.returncode != 0
    one_error_line(again.stderr, str(mnt), f"xetfs umount {mnt}")
    assert b"a stale FUSE mount is in the way" in again.stderr, again.stderr  # (not "already a mount point")
    listed = run_xetfs("ls", mnt)  # (the dead mount given as a store: its store is named, not ENOTCONN alone)
    assert listed.returncode == 1 and f"this is a xetfs mount of {basic_store.path}".encode() in listed.stderr

    umount = run_xetfs("umount", mnt)
    assert (umount.returncode, umount.stderr) == (0, b"")
    assert not is_mounted(mnt) and os.listdir(mnt) == []
    assert run_xetfs("mount", basic_store.path, mnt, "--log-file", mnt.parent / "log").returncode == 0
    assert basic_store["one-byte"].hash in os.listdir(mnt)
    assert run_xetfs("umount", mnt).returncode == 0


# -- refusals: one clear line, nothing mounted --------------------------------------------------


def test_missing_store(mnt: Path, tmp_path: Path) -> None:
    proc = run_xetfs("mount", tmp_path / "no-such-store", mnt)
    assert proc.returncode != 0
    one_error_line(proc.stderr, "no-such-store")
    assert not is_mounted(mnt) and not daemon_pids(mnt)


def test_directory_that_is_no_store(mnt: Path, tmp_path: Path) -> None:
    (tmp_path / "plain").mkdir()
    proc = run_xetfs("mount", tmp_path / "plain", mnt)
    assert proc.returncode != 0
    one_error_line(proc.stderr, str(tmp_path / "plain"), "shards")
    assert not is_mounted(mnt)


@pytest.mark.parametrize("kind", ["file", "missing"])
def test_mountpoint_not_a_directory(basic_store: OracleStore, tmp_path: Path, kind: str) -> None:
    target = tmp_path / "target"
    if kind == "file":
        target.write_bytes(b"")
    with cleanup(target):
        proc = run_xetfs("mount", basic_store.path, target)
        assert proc.returncode != 0
        one_error_line(proc.stderr, str(target), "not a directory" if kind == "file" else "no such directory")
        assert not is_mounted(target) and not daemon_pids(target)


def test_mountpoint_already_mounted(basic_store: OracleStore, multi_store: OracleStore) -> None:
    with mounted(basic_store.path) as m:
        proc = run_xetfs("mount", multi_store.path, m.path)
        assert proc.returncode != 0
        one_error_line(proc.stderr, str(m.path), "already")
        assert len(daemon_pids(m.path)) == 1  # only the first mount's daemon
        assert basic_store["one-byte"].hash in os.listdir(m.path)


def test_non_empty_mountpoint_and_nonempty_option(basic_store: OracleStore, mnt: Path) -> None:
    (mnt / "hidden.txt").write_bytes(b"under the mount")
    proc = run_xetfs("mount", basic_store.path, mnt)
    assert proc.returncode != 0
    one_error_line(proc.stderr, str(mnt), "not empty", "nonempty")
    assert not is_mounted(mnt) and not daemon_pids(mnt)

    proc = run_xetfs("mount", basic_store.path, mnt, "-o", "nonempty", "--log-file", mnt.parent / "log")
    assert proc.returncode == 0, proc.stderr
    names = os.listdir(mnt)
    assert "hidden.txt" not in names and basic_store["one-byte"].hash in names
    assert run_xetfs("umount", mnt).returncode == 0
    assert os.listdir(mnt) == ["hidden.txt"]


@pytest.mark.parametrize("option", ["bogus", "allow_other,bogus", "fsname=x"])  # (uid=0 is --uid 0)
def test_unknown_mount_option(basic_store: OracleStore, mnt: Path, option: str) -> None:
    proc = run_xetfs("mount", basic_store.path, mnt, "-o", option)
    assert proc.returncode != 0
    one_error_line(proc.stderr, option.split(",")[-1].split("=")[0])
    assert b"; xetfs: cache_dir, cache_size," in proc.stderr  # (the options -o takes for xetfs are named too)
    assert not is_mounted(mnt) and not daemon_pids(mnt)


def test_unusable_names_file_is_reported_by_the_daemon(basic_store: OracleStore, mnt: Path, tmp_path: Path) -> None:
    bad = tmp_path / "names.json"
    bad.write_text("{not json")
    proc = run_xetfs("mount", basic_store.path, mnt, "--names", bad, "--log-file", tmp_path / "log")
    assert proc.returncode != 0
    one_error_line(proc.stderr, str(bad), "JSON")
    assert not is_mounted(mnt)
    wait_until(lambda: not daemon_pids(mnt), EXIT_DEADLINE, "the failed daemon to exit")


def test_missing_names_file(basic_store: OracleStore, mnt: Path, tmp_path: Path) -> None:
    missing = tmp_path / "no-such-names.json"
    proc = run_xetfs("mount", basic_store.path, mnt, "--names", missing, "--log-file", tmp_path / "log")
    assert proc.returncode != 0
    line = one_error_line(proc.stderr, str(missing), "No such file or directory")
    assert "[Errno" not in line, f"a raw exception text, unlike every other error line: {line}"
    assert not is_mounted(mnt)
    wait_until(lambda: not daemon_pids(mnt), EXIT_DEADLINE, "the failed daemon to exit")


# -- signals during a long read -----------------------------------------------------------------

BLOCK = 64 * 1024


class Reader(threading.Thread):
    """Reads a file in 64 KiB pieces until EOF or an error; keeps what it got."""

    def __init__(self, path: Path) -> None:
        super().__init__(daemon=True)
        self.path = path
        self.got = bytearray()
        self.error: OSError | None = None
        self.eof = False

    def run(self) -> None:
        try:
            fd = os.open(self.path, os.O_RDONLY)
            try:
                while block := os.read(fd, BLOCK):
                    self.got += block
                self.eof = True
            finally:
                with contextlib.suppress(OSError):
                    os.close(fd)
        except OSError as exc:
            self.error = exc


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_during_a_long_read(big_store: OracleStore, signum: signal.Signals) -> None:
    f = big_store["big.bin"]
    with mounted(big_store.path, "--direct-io") as m:
        reader = Reader(m.path / f.hash)
        try:
            reader.start()
            wait_until(lambda: len(reader.got) >= 4 * 1024 * 1024 or not reader.is_alive(), 30, "the read to run")
            assert reader.is_alive(), "the read ended before the signal: nothing was tested"
            m.proc.send_signal(signum)
            start = time.monotonic()
            wait_until(lambda: not is_mounted(m.path), GONE_DEADLINE, f"the mount to go after {signum.name}")
            gone_after = time.monotonic() - start
            reader.join(EXIT_DEADLINE)
            assert not reader.is_alive(), "the reader is stuck after the mount went away"
            assert m.proc.wait(EXIT_DEADLINE) == (130 if signum == signal.SIGINT else 0)
        finally:
            if is_mounted(m.path):
                force_unmount(m.path)
            reader.join(EXIT_DEADLINE)
        got = bytes(reader.got)
        with open(f.path, "rb") as original:
            assert original.read(len(got)) == got, "wrong bytes before the end of the mount"
        assert len(got) < f.size, "the whole file was read: the signal did not interrupt anything"
        assert reader.eof or (
            reader.error is not None
            and reader.error.errno in (errno.ENOTCONN, errno.EIO, errno.ECONNABORTED, errno.ENOENT)
        )
        assert gone_after < GONE_DEADLINE
        assert signum.name in m.log()


def test_a_daemon_that_fails_at_once_leaves_no_empty_log(tmp_path: Path) -> None:
    """A daemon killed right after it reported its error (before it wrote anything) leaves no empty log; a log
    that held something before is kept as it was."""
    from xetfs.fuse.launch import MountError, spawn_daemon

    failing = ("import os, sys, time; fd = int(sys.argv[sys.argv.index('--ready-fd') + 1]); "
               "os.write(fd, b'error: boom\\n'); time.sleep(60)")  # fmt: skip
    log = tmp_path / "state" / "mnt.log"
    with pytest.raises(MountError, match=r"^boom$"):
        spawn_daemon([sys.executable, "-c", failing], tmp_path, log, b"{}")
    assert not log.exists()
    log.write_text("an earlier mount\n")
    with pytest.raises(MountError, match=r"^boom$"):
        spawn_daemon([sys.executable, "-c", failing], tmp_path, log, b"{}")
    assert log.read_text() == "an earlier mount\n"
    # a daemon that died without a word: the message names its log, which stays (empty) to be looked at
    log.unlink()
    with pytest.raises(MountError, match="the daemon exited"):
        spawn_daemon([sys.executable, "-c", "import os; os._exit(3)"], tmp_path, log, b"{}")
    assert log.exists()


def test_a_mount_refused_by_fuse_says_why(tmp_path: Path) -> None:
    """pyfuse3 says only "fuse_session_mount failed"; libfuse's own reason, on the daemon's stderr (its log),
    goes into the error the user sees."""
    from xetfs.fuse.launch import MountError, spawn_daemon

    refused = ("import os, sys, time; fd = int(sys.argv[sys.argv.index('--ready-fd') + 1]); "
               "print('fuse: failed to open /dev/fuse: Permission denied', file=sys.stderr, flush=True); "
               "os.write(fd, b'error: fuse_session_mount failed\\n'); time.sleep(60)")  # fmt: skip
    log = tmp_path / "mnt.log"
    with pytest.raises(MountError) as failed:
        spawn_daemon([sys.executable, "-c", refused], tmp_path, log, b"{}")
    assert str(failed.value) == "fuse_session_mount failed (fuse: failed to open /dev/fuse: Permission denied)"


def test_a_reply_the_kernel_no_longer_waits_for_is_no_error_in_the_log(caplog: pytest.LogCaptureFixture) -> None:
    """pyfuse3 logs ``fuse_reply_* failed with No such file or directory`` when a request was interrupted or the
    mount was detached under it (a lazy unmount during a stall): a debug line, not an error.  Other failed
    replies stay errors."""
    from xetfs.fuse.mount import _interrupted_reply

    log = logging.getLogger("pyfuse3")
    log.addFilter(_interrupted_reply)
    try:
        with caplog.at_level(logging.INFO):
            log.error("fuse_read(): fuse_reply_* failed with %s", os.strerror(errno.ENOENT))
            log.error("fuse_read(): fuse_reply_* failed with %s", os.strerror(errno.EPIPE))
        assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
            ("ERROR", f"fuse_read(): fuse_reply_* failed with {os.strerror(errno.EPIPE)}")
        ]
        caplog.clear()
        with caplog.at_level(logging.DEBUG):
            log.error("fuse_read(): fuse_reply_* failed with %s", os.strerror(errno.ENOENT))
        assert [r.levelname for r in caplog.records] == ["DEBUG"]
    finally:
        log.removeFilter(_interrupted_reply)
