"""The memory primer: touched memory kept in reserve and freed right before each measurement."""

from __future__ import annotations

import subprocess
import sys

from benchkit.util import BenchError, MiB

_PRIMER = r"""
import ctypes, mmap, sys, time
STEP = 32 << 20
held = []
for line in sys.stdin:
    cmd, *rest = line.split()
    t = time.perf_counter()
    touched = 0
    if cmd == "hold":
        while len(held) * STEP < int(rest[0]):
            m = mmap.mmap(-1, STEP)
            buf = (ctypes.c_char * STEP).from_buffer(m)
            ctypes.memset(buf, 1, STEP)
            del buf
            held.append(m)
            touched += STEP
    elif cmd == "release":
        for m in held:
            m.close()
        held.clear()
    print(f"ok {touched} {time.perf_counter() - t:.6f}", flush=True)
"""


class Primer:
    """Keeps touched memory in reserve and frees it right before a measurement.

    On these VMs, free memory is handed back to the host within seconds and
    touching it again is slow (0.2-0.3 GB/s, against 1.3 GB/s for memory freed
    a moment ago; the kernel allocates not-yet-returned pages first).  A
    measurement that needs a GiB of fresh pages (FUSE page cache, a daemon's
    heap, hf_xet's output on /dev/shm) would otherwise time the host.  The
    reserve is released just before a measurement and taken back right after
    it, which mostly recycles the pages the measurement itself just freed.
    """

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes
        self.refills: list[float] = []  # GB/s of each refill
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _PRIMER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
        )

    def _ask(self, line: str) -> tuple[int, float]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()
        reply = self.proc.stdout.readline().split()
        if len(reply) != 3 or reply[0] != b"ok":
            raise BenchError(f"the memory primer failed (exit status {self.proc.poll()})")
        return int(reply[1]), float(reply[2])

    def hold(self) -> None:
        touched, secs = self._ask(f"hold {self.nbytes}")
        if touched >= 256 * MiB:
            self.refills.append(touched / max(secs, 1e-9) / 1e9)

    def release(self) -> None:
        self._ask("release")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
