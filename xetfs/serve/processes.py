"""Several server processes on one listening socket.

``xetfs serve --workers N`` binds its address once, then forks N processes
that each run the whole application on that socket; the kernel hands each
new connection to one of them.  They share nothing but the socket and the
signing key (no request depends on which process answered an earlier one),
so this is N servers behind a balancer, on one port.  The checks of xorb
ranges (decode and hash, a core's work each) then run on N cores.

The first process starts alone; the others are forked once it says it is
ready (store loaded, serving), so that a store that cannot be opened gives
one error, from that first process.  The parent then only waits: it passes
SIGTERM and SIGINT on, and when a process dies (killed, or ended with an
error) it stops the others and returns an error.  A process stopped cleanly
on its own (SIGTERM sent to it alone) leaves the others serving.  Whatever
ends the parent ends the processes too: they are stopped when it returns or
fails, and the kernel sends them SIGTERM if it dies.  With one worker
nothing is forked: the application runs in this process.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable, Iterator
from types import FrameType
from typing import NoReturn

from xetfs.base.errors import XetfsError, describe
from xetfs.base.exitstatus import ExitStatus
from xetfs.base.messages import print_error

log = logging.getLogger("xetfs.serve")

# ``work(i, ready)``: serve as worker ``i``; call ``ready()`` once serving; return an exit status.
Work = Callable[[int, Callable[[], None]], int]
STOPS = (signal.SIGTERM, signal.SIGINT)
PR_SET_PDEATHSIG = 1


def listen(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port``, for every worker to listen on (``fd://`` in hypercorn)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


class _Workers:
    """The parent's view of its worker processes: forking them, passing signals on, stopping them."""

    def __init__(self, work: Work) -> None:
        self.work = work
        self.children: dict[int, int] = {}  # pid -> worker number
        self.stopping = False  # asked to stop: a worker ended by that signal is no error

    def forward(self, signum: int, _frame: FrameType | None = None) -> None:
        self.stopping = True
        for pid in self.children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    def fork(self, i: int, ready: Callable[[], None], *, close: int = -1) -> int:
        """Start worker ``i``; its pid.  Signals are held meanwhile, so that one that comes now reaches the
        worker too (it is in ``children`` before they are let through)."""
        parent = os.getpid()
        with _signals_held():
            pid = os.fork()
            if pid == 0:
                _run_child(i, self.work, ready, close, parent)
            self.children[pid] = i
        return pid

    def stop_all(self) -> None:
        """SIGTERM to the workers still running, and wait for them."""
        self.forward(signal.SIGTERM)
        while self.children:
            pid, _ = os.wait()
            self.children.pop(pid, None)


def run_workers(count: int, work: Work) -> int:
    """Run ``work`` as ``count`` processes (see the module docstring); the exit status.

    Nothing may run in other threads of this process when it is called:
    each worker opens the store and starts its threads after the fork.
    """
    if count == 1:
        return work(0, lambda: None)
    workers = _Workers(work)
    old = {s: signal.signal(s, workers.forward) for s in STOPS}
    try:
        first, ready = _fork_first(workers)
        if not ready:  # it ended before serving, and said why (or was killed: then that is said here)
            _, wait_status = os.waitpid(first, 0)
            workers.children.pop(first, None)
            return _ended(0, os.waitstatus_to_exitcode(wait_status), workers.stopping, before_ready=True)
        for i in range(1, count):
            if not workers.stopping:
                workers.fork(i, lambda: None)
        return _wait(workers)
    finally:
        workers.stop_all()  # (a failed fork, or an error here: no worker is left serving without a parent)
        for s, handler in old.items():
            signal.signal(s, handler)


def _fork_first(workers: _Workers) -> tuple[int, bool]:
    """Fork worker 0 and wait until it is ready or gone: its pid, and whether it is serving."""
    r, w = os.pipe()
    try:

        def ready() -> None:
            os.write(w, b"1")
            os.close(w)

        pid = workers.fork(0, ready, close=r)
        os.close(w)
        w = -1
        return pid, os.read(r, 1) == b"1"  # (end of file: it ended first)
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)


def _run_child(i: int, work: Work, ready: Callable[[], None], close: int, parent: int) -> NoReturn:
    """Worker ``i``, in the forked child: run ``work`` and exit; never returns into the parent's code."""
    status: int = ExitStatus.ERROR
    try:
        if close >= 0:
            os.close(close)
        for s in STOPS:
            signal.signal(s, signal.SIG_DFL)
        _die_with_parent(parent)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPS)
        status = work(i, ready)
    except KeyboardInterrupt:
        status = ExitStatus.INTERRUPTED
    except (XetfsError, OSError) as exc:
        print_error(describe(exc))
    except BaseException:
        log.exception("server process %d failed", i)
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(status)


def _die_with_parent(parent: int) -> None:
    """Have the kernel send this process SIGTERM when its parent dies (Linux), and stop now if it is gone
    already (the signal waits until the caller lets it through)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGTERM)


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    old = signal.pthread_sigmask(signal.SIG_BLOCK, STOPS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _wait(workers: _Workers) -> int:
    """Wait for every worker; the status of the first that died (none for workers stopped as asked)."""
    status = 0
    while workers.children:
        pid, wait_status = os.wait()
        i = workers.children.pop(pid, None)
        if i is None:
            continue
        code = os.waitstatus_to_exitcode(wait_status)
        found = _ended(i, code, workers.stopping)
        if found and not status:
            status = found
            workers.forward(signal.SIGTERM)
    return status


def _ended(i: int, code: int, stopping: bool, *, before_ready: bool = False) -> int:
    """What the end of worker ``i`` with exit code ``code`` (minus the signal if killed) means for the
    server: 0, or ``ExitStatus.ERROR`` after saying why on the log."""
    if code == 0 or (stopping and code in (-signal.SIGTERM, -signal.SIGINT)):
        if code == 0 and not stopping and not before_ready:
            log.warning("server process %d stopped; the others go on", i)
        return 0
    if code == ExitStatus.INTERRUPTED and stopping:
        return 0
    when = " before it was ready" if before_ready else ""
    if code < 0:
        log.error("server process %d was killed by %s%s; stopping the others", i, signal.Signals(-code).name, when)
    elif not before_ready:  # (before it was ready, it said why itself)
        log.error("server process %d ended with status %d; stopping the others", i, code)
    return ExitStatus.ERROR
