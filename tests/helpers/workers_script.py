"""``run_workers`` in a process of its own, for tests/test_serve_processes.py.

``python workers_script.py SCENARIO COUNT``: each worker writes ``worker I PID`` on stdout once ready, then
waits for a signal.  Scenarios: ``serve`` (as is), ``fork-fails`` (the second fork raises), ``dies`` (worker 1
kills itself with SIGKILL once ready), ``bad-store`` (worker 0 fails before it is ready).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from collections.abc import Callable

from xetfs.base.errors import StoreError
from xetfs.base.messages import UserFormatter
from xetfs.serve import processes

scenario, count = sys.argv[1], int(sys.argv[2])
handler = logging.StreamHandler(sys.stderr)
handler.setFormatter(UserFormatter())
logging.getLogger("xetfs").addHandler(handler)


def work(i: int, ready: Callable[[], None]) -> int:
    if scenario == "bad-store" and i == 0:
        raise StoreError("store /nowhere: no such directory")
    os.write(1, f"worker {i} {os.getpid()}\n".encode())  # (one write: print() writes the line end apart)
    ready()
    if scenario == "dies" and i == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    signal.pause()
    return 0


if scenario == "fork-fails":
    real, calls = os.fork, [0]

    def fork() -> int:
        calls[0] += 1
        if calls[0] == 2:
            raise OSError(11, "Resource temporarily unavailable")
        return real()

    os.fork = fork
print(f"parent {os.getpid()}", flush=True)
try:
    sys.exit(processes.run_workers(count, work))
except OSError as exc:
    print(f"failed: {exc}", file=sys.stderr, flush=True)
    sys.exit(1)
