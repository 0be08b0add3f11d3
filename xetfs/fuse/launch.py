"""The command's side of a mount: its configuration, the checks before it, starting the daemon and reading
its report, the kernel's mount table, and unmounting.

``xetfs mount`` checks what it can (``check_mountpoint``, ``choose_layout``),
starts the daemon (``spawn_daemon``) and returns once the daemon reports
that the mount answers, or why it failed (``send_warnings`` and ``report``,
the daemon's side of that pipe).  Nothing here imports the FUSE modules or
the read path, so the command starts in a fraction of the daemon's time:
the daemon itself is ``fuse.mount``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import select
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from xetfs.base.errors import XetfsError
from xetfs.base.messages import plural
from xetfs.base.mounttable import XETFS_FS_TYPE, force_hint, mount_at, mounts, within
from xetfs.base.settings import (
    CACHE_SIZE,
    DAEMON_TIMEOUT,
    DISK_CACHE_SIZE,
    FAILED_DAEMON_EXIT,
    IO_MODE,
    IO_TIMEOUT,
    LAYOUT,
    MAX_REPORTED_WARNINGS,
    READ_AHEAD,
    READY_TIMEOUT,
    RESOLVE_TIMEOUT,
    KiB,
    user_home,
)
from xetfs.storage.catalogue import CATALOGUE_NAME, Catalogue, store_catalogue
from xetfs.storage.store import Store

log = logging.getLogger(__name__)


FUSE_FLAGS = {"nodev", "nosuid", "noexec"}  # given to FUSE as they are (mount(8) passes them for "user")


KNOWN_OPTIONS = {"allow_other", "allow_root", "nonempty", "ro", "default_permissions", *FUSE_FLAGS}


class MountError(XetfsError):
    """The filesystem could not be mounted (bad mountpoint, no FUSE, ...)."""


@dataclass(frozen=True)
class MountConfig:
    store: str | Path  # a directory (absolute) or a URL
    mountpoint: Path
    options: frozenset[str] = frozenset()
    uid: int | None = None
    gid: int | None = None
    direct_io: bool = False
    cache_size: int = CACHE_SIZE
    names: Path | None = None
    read_ahead_kb: int = READ_AHEAD // KiB
    strict: bool = False
    prefetch: bool = True
    io_mode: str = IO_MODE  # "inline", "thread" or "auto" (thread on network/FUSE filesystems)
    io_timeout: float = IO_TIMEOUT
    workers: int | None = None  # decode worker processes; None: one per CPU
    layout: str = LAYOUT  # "hub", "names", "hash" or "auto" (see choose_layout)
    cache_dir: Path | None = None  # disk cache of remote stores; None: the default
    disk_cache_size: int = DISK_CACHE_SIZE
    headers: tuple[str, ...] = ()  # for a remote store: extra header lines (the environment adds more)
    refresh_every: float | None = None  # seconds between refreshes of the live mount; None: only when asked


def parse_options(values: list[str], also: Iterable[str] = ()) -> frozenset[str]:
    """The FUSE options of ``-o`` lists (``also``: the xetfs options ``-o`` takes too, for the message)."""
    opts = {o.strip() for v in values for o in v.split(",") if o.strip()}
    unknown = opts - KNOWN_OPTIONS
    if unknown:
        more = f"; xetfs: {', '.join(also)}" if also else ""
        raise MountError(f"unknown mount option(s): {', '.join(sorted(unknown))} "
                         f"(known: {', '.join(sorted(KNOWN_OPTIONS))}{more})")  # fmt: skip
    return frozenset(opts)


def check_mountpoint(mountpoint: Path, *, nonempty: bool) -> None:
    """Refuse a mountpoint that is missing, not a directory, mounted or (by default) not empty."""
    try:
        if os.path.ismount(mountpoint):
            with os.scandir(mountpoint):  # (a dead FUSE daemon's mount fails here: its attributes may be cached)
                pass
            raise MountError(f"{mountpoint}: already a mount point (unmount it first: xetfs umount {mountpoint})")
        if not mountpoint.exists():
            raise MountError(f"{mountpoint}: no such directory (create it first: mkdir {mountpoint})")
        if not mountpoint.is_dir():
            raise MountError(f"{mountpoint}: not a directory")
        if not nonempty and any(os.scandir(mountpoint)):
            raise MountError(f"{mountpoint}: directory is not empty (use -o nonempty to mount over it anyway)")
    except OSError as exc:
        if exc.errno in (107, 103):  # ENOTCONN / ECONNABORTED: a dead FUSE daemon's mount
            raise MountError(
                f"{mountpoint}: a stale FUSE mount is in the way (clean it with: xetfs umount {mountpoint})"
            ) from None
        raise MountError(f"{mountpoint}: {exc.strerror}") from None
    if not os.path.exists("/dev/fuse"):
        raise MountError("FUSE is not available on this machine (no /dev/fuse; install fuse3)")


LAYOUTS = ("auto", "hub", "names", "hash")


def choose_layout(config: MountConfig, store: Store) -> tuple[str, Catalogue | None]:
    """The layout to show, and the catalogue it comes from for ``hub``.

    ``auto``: the Hub cache layout when the store has a catalogue and no
    ``--names`` was given, else the named tree (``names``: by hash when there
    is no manifest).  Raises ``MountError`` for ``hub`` without a catalogue.
    """
    wanted = config.layout == "hub" or (config.layout == "auto" and config.names is None)
    catalogue = store_catalogue(store) if wanted else None
    if config.layout == "hub" and catalogue is None:
        raise MountError(f"--layout hub: {store.location} has no {CATALOGUE_NAME} (import with xetfs pack --hub-cache)")
    if catalogue is not None:
        return "hub", catalogue
    return ("hash" if config.layout == "hash" else "names"), None


def _warnings_in(messages: list[str]) -> int:
    """How many warnings ``messages`` stand for: a closing line of a ``WarningLog``, "... and N more <kind>
    warnings", stands for N."""
    return sum(int(m.group(1)) if (m := re.search(r"\.\.\. and (\d+) more ", line)) else 1 for line in messages)


def send_warnings(fd: int | None, messages: list[str]) -> None:
    """Pass warnings to the waiting ``xetfs mount``, one line each (the log has them all)."""
    if fd is None:
        return
    shown = messages[:MAX_REPORTED_WARNINGS]
    lines = [f"warning: {m}".replace("\n", " ") for m in shown]
    count = _warnings_in(messages)
    if count > _warnings_in(shown):
        lines.append(f"warning: ... and {plural(count - _warnings_in(shown), 'more warning')} (the log lists "
                     "more of them and counts the rest)")  # fmt: skip
    with contextlib.suppress(OSError):
        os.write(fd, "".join(f"{line}\n" for line in [*lines, f"warnings: {count}"]).encode())


def report(fd: int | None, message: str) -> None:
    """Send the final line (``ok`` or ``error: ...``) and close ``fd``."""
    if fd is None:
        return
    with contextlib.suppress(OSError):
        os.write(fd, message.encode() + b"\n")
        os.close(fd)


def spawn_daemon(
    argv: list[str], mountpoint: Path, log_file: Path, config: bytes, env: dict[str, str] | None = None
) -> tuple[list[str], int]:
    """Start the daemon (``argv`` + ``--foreground --ready-fd N --config-fd M``) and wait until it serves.

    ``config`` (``daemonconfig.dump_config``) reaches the daemon on a pipe, fd
    ``M``, and ``env`` is added to its environment: secrets go there, never
    into ``argv``.  Returns the daemon's warnings to show (a long
    list ends with a line for the rest) and their number.  Raises
    ``MountError`` with the daemon's own message when it fails.
    """
    read_fd, write_fd = os.pipe()
    config_fd, config_out = os.pipe()
    log_file.parent.mkdir(parents=True, exist_ok=True)
    new_log = not log_file.exists()
    with open(log_file, "ab") as log_out:
        before = log_out.tell()
        child = subprocess.Popen(
            [*argv, "--foreground", "--ready-fd", str(write_fd), "--config-fd", str(config_fd),
             "--log-file", str(log_file)],
            stdin=subprocess.DEVNULL,
            stdout=log_out,
            stderr=log_out,
            pass_fds=(write_fd, config_fd),
            start_new_session=True,
            cwd="/",
            env={**os.environ, **(env or {})},
        )  # fmt: skip
    os.close(write_fd)
    os.close(config_fd)
    with contextlib.suppress(BrokenPipeError), open(config_out, "wb") as out:  # (a dead daemon: reported below)
        out.write(config)
    lines = _read_report(read_fd, child, READY_TIMEOUT).splitlines()
    warnings = [line.removeprefix("warning: ") for line in lines if line.startswith("warning: ")]
    counts = [int(line.split()[1]) for line in lines if re.fullmatch(r"warnings: \d+", line)]
    message = lines[-1] if lines and not lines[-1].startswith("warning") else ""
    if message != "ok":
        with contextlib.suppress(ProcessLookupError):
            child.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired, OSError):
            child.wait(FAILED_DAEMON_EXIT)
            if message and new_log and log_file.stat().st_size == 0:  # (it said why on the pipe, and nothing else)
                log_file.unlink()
        detail = message.removeprefix("error: ") if message else f"the daemon exited (see {log_file})"
        raise MountError(detail + _fuse_said(log_file, before))
    return warnings, counts[-1] if counts else len(warnings)


def _fuse_said(log_file: Path, start: int) -> str:
    """What libfuse or fusermount3 wrote to the daemon's stderr (its log) from ``start`` on, as `` (...)``: why a
    mount was refused (no access to /dev/fuse, allow_other not allowed), which pyfuse3's error does not say."""
    try:
        with open(log_file, "rb") as f:
            f.seek(start)
            text = f.read(64 * 1024).decode(errors="replace")
    except OSError:
        return ""
    said = [line.strip() for line in text.splitlines() if re.match(r"(fuse|fusermount3?):", line.strip())]
    return f" ({'; '.join(dict.fromkeys(said))})" if said else ""


def _read_report(fd: int, child: subprocess.Popen[bytes], timeout: float) -> str:
    """What the daemon wrote on the report pipe up to and including its final line (or EOF)."""
    deadline = time.monotonic() + timeout
    chunks = []
    with os.fdopen(fd, "rb", buffering=0) as pipe:
        os.set_blocking(fd, False)
        while time.monotonic() < deadline:
            try:
                data = pipe.read(4096)
            except BlockingIOError:
                data = None
            if data:
                chunks.append(data)
                last = b"".join(chunks).rstrip(b"\n").rpartition(b"\n")[2]
                if data.endswith(b"\n") and not last.startswith(b"warning"):
                    break
            elif data == b"":  # EOF: the daemon closed the pipe or died
                break
            if child.poll() is not None and not data:
                break
            select.select([fd], [], [], 0.05)
        else:
            return f"error: the daemon did not report within {timeout:g} s"
    return b"".join(chunks).decode(errors="replace").strip()


FUSECTL = Path("/sys/fs/fuse/connections")


def unmount(mountpoint: Path, *, lazy: bool = False, force: bool = False) -> None:
    """Unmount with fusermount3 (or umount), refusing paths that are not mounted.

    Anything but a xetfs mount is refused unless ``force``.  ``force`` first
    aborts the FUSE connection of a FUSE mount (root only), which fails every
    pending and future request at once: the way out of a hung daemon.
    """
    path = os.path.abspath(mountpoint)  # no syscalls: the mount may be hung
    found = mount_at(path)
    if found is None:  # (the kernel's table names real paths: the parent's symlinks resolved, if that is quick)
        real = _real_parent(path)
        path, found = (real, mount_at(real)) if real is not None else (path, None)
    if found is None:
        shown = str(mountpoint) if str(mountpoint) == path else f"{mountpoint} ({path})"
        raise MountError(f"{shown}: not mounted")
    device, kind, _ = found
    if kind != XETFS_FS_TYPE and not force:
        hint = "; use --force to unmount it anyway" if kind.split(".")[0] == "fuse" else ""
        raise MountError(f"{mountpoint}: not a xetfs mount (it is {kind}){hint}")
    if force:
        if kind.split(".")[0] == "fuse":
            _abort_connection(device)
        lazy = True
    tool = shutil.which("fusermount3") or shutil.which("fusermount")
    cmd = [tool, "-u", *(["-z"] if lazy else []), path] if tool else ["umount", *(["-l"] if lazy else []), path]
    code, err = _unmount_command(cmd, mountpoint, lazy)
    if code != 0 and os.geteuid() == 0 and tool:
        code, err = _unmount_command(["umount", *(["-l"] if lazy else []), path], mountpoint, lazy)
    if code != 0:
        hint = "" if lazy else f" (try: xetfs umount -z {mountpoint}, or --force for a hung daemon)"
        raise MountError(f"{mountpoint}: unmount failed: {err or code}{hint}")


def _unmount_command(cmd: list[str], mountpoint: Path, lazy: bool) -> tuple[int, str]:
    """Run an unmount command: its exit status and what it said.  One that takes longer than
    ``DAEMON_TIMEOUT`` waits for a daemon that does not answer (stopped, or hung): it is killed, and the
    error says how to get out (``lazy``: the unmount was lazy already)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _, err = proc.communicate(timeout=DAEMON_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(RESOLVE_TIMEOUT)  # (a process stuck in the kernel may not go at once: it is left)
        ways = [] if lazy else [f"'xetfs umount -z {mountpoint}' detaches it now (reads already waiting go on waiting)"]
        ways.append(force_hint(mountpoint))
        raise MountError(f"{mountpoint}: the mount's daemon does not answer ({' '.join(cmd[:2])} waited "
                         f"{DAEMON_TIMEOUT:g} s): it is stopped or hung; {'; '.join(ways)}") from None  # fmt: skip
    finally:
        if proc.stderr is not None:
            proc.stderr.close()
    return proc.returncode, err.strip()


def _abort_connection(device: str) -> None:
    """Abort the FUSE connection of the mount on ``device`` through fusectl, mounting fusectl if root needs it."""
    minor = device.partition(":")[2]
    if os.geteuid() != 0:
        raise MountError(f"cannot abort FUSE connection {minor}: --force needs root")
    if not any(point == str(FUSECTL) for point, _, _, _ in mounts()):
        _mount_fusectl()
    abort = FUSECTL / minor / "abort"
    try:
        abort.write_text("1\n")
    except OSError as exc:
        raise MountError(f"cannot abort FUSE connection {minor}: {abort}: {exc.strerror}") from None


def _mount_fusectl() -> None:
    """Mount the FUSE control filesystem at ``FUSECTL`` (root only)."""
    cmd = ["mount", "-t", "fusectl", "fusectl", str(FUSECTL)]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise MountError(
            f"cannot abort a FUSE connection: the fusectl filesystem is not mounted at {FUSECTL}, "
            f"and '{' '.join(cmd)}' failed: {result.stderr.strip() or result.returncode}"
        )
    log.info("mounted fusectl at %s", FUSECTL)


def mounted_device(path: str) -> str | None:
    """``major:minor`` of the mount at ``path``, or None."""
    found = mount_at(path)
    return found[0] if found else None


def _real_parent(path: str) -> str | None:
    """``path`` with the symlinks of its parent resolved, or None if that takes longer than ``RESOLVE_TIMEOUT``:
    resolving stats each component, and one may lie on a hung FUSE mount."""
    parent, name = os.path.split(path)
    return within(RESOLVE_TIMEOUT, lambda: os.path.join(os.path.realpath(parent), name))[1]


def default_log_file(mountpoint: Path) -> Path:
    base = Path(os.environ.get("XDG_STATE_HOME") or user_home() / ".local" / "state") / "xetfs"
    name = str(mountpoint.resolve()).strip("/").replace("/", "_") or "root"
    return base / f"{name}.log"


def python_argv() -> list[str]:
    return [sys.executable, "-m", "xetfs"]
