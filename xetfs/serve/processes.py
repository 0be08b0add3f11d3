"""Several server processes on one listening socket.

``xetfs serve --workers N`` binds its address once, then forks N processes
that each run the whole application on that socket; the kernel hands each
new connection to one of them.  They share nothing but the socket and the
signing key (no request depends on which process answered an earlier one),
so this is N servers behind a balancer, on one port.  The checks of xorb
ranges (decode and hash, a core's work each) then run on N cores.

The first process starts alone; the others are forked once it says it is
ready (store loaded, serving), so that a store that cannot be opened gives
one error, from that first process, and its exit status.  The parent then
only waits: it passes SIGTERM and SIGINT on, and when one process ends
with an error it stops the others and returns that error.  With one worker
nothing is forked: the application runs in this process.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable
from types import FrameType

from xetfs.base.errors import XetfsError, describe
from xetfs.base.exitstatus import ExitStatus
from xetfs.base.messages import print_error

log = logging.getLogger("xetfs.serve")

# ``work(i, ready)``: serve as worker ``i``; call ``ready()`` once serving; return an exit status.
Work = Callable[[int, Callable[[], None]], int]


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


def run_workers(count: int, work: Work) -> int:
    """Run ``work`` as ``count`` processes (see the module docstring); the exit status.

    Nothing may run in other threads of this process when it is called:
    each worker opens the store and starts its threads after the fork.
    """
    if count == 1:
        return work(0, lambda: None)
    children: dict[int, int] = {}  # pid -> worker number
    stopping = False  # asked to stop: a worker ended by that signal is no error

    def forward(signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        first, ready = _fork_first(work, children)
        if not ready:  # it failed before serving, and said why
            _, wait_status = os.waitpid(first, 0)
            children.clear()
            return _status(os.waitstatus_to_exitcode(wait_status))
        for i in range(1, count):
            if not stopping:
                children[_fork(i, work, lambda: None)] = i
        return _wait(children, lambda: stopping, forward)
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


def _fork_first(work: Work, children: dict[int, int]) -> tuple[int, bool]:
    """Fork worker 0 and wait until it is ready or gone: its pid, and whether it is serving."""
    r, w = os.pipe()
    try:

        def ready() -> None:
            os.write(w, b"1")
            os.close(w)

        pid = _fork(0, work, ready, close=r)
        children[pid] = 0
        os.close(w)
        w = -1
        return pid, os.read(r, 1) == b"1"  # (end of file: it ended first)
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)


def _fork(i: int, work: Work, ready: Callable[[], None], *, close: int = -1) -> int:
    """Start worker ``i`` in a child process; its pid.  The child never returns into the caller's code."""
    pid = os.fork()
    if pid:
        return pid
    status: int = ExitStatus.ERROR
    try:
        if close >= 0:
            os.close(close)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
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


def _wait(children: dict[int, int], stopping: Callable[[], bool], stop: Callable[[int, None], None]) -> int:
    """Wait for every worker; the first error's status (none for workers ended by a signal passed on)."""
    status = 0
    while children:
        pid, wait_status = os.wait()
        i = children.pop(pid, None)
        code = os.waitstatus_to_exitcode(wait_status)
        if i is None or code == 0 or status != 0 or (stopping() and code < 0):
            continue
        status = _status(code)
        if code < 0:
            log.error("server process %d was killed by %s; stopping the others", i, signal.Signals(-code).name)
        stop(signal.SIGTERM, None)
    return status


def _status(code: int) -> int:
    """An exit status from ``waitstatus_to_exitcode``'s code (minus the signal for a killed process)."""
    return code if code >= 0 else 128 - code
