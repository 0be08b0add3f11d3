"""A decode worker process: reads, decodes and verifies chunk runs and xorb layouts for the mount daemon.

The daemon (``pool.DecodePool``) starts workers with ``python -m
xetfs.decode_worker SHM_FD SLOTS SLOT_SIZE``.  ``SHM_FD`` is a shared memory
file of ``SLOTS * SLOT_SIZE`` bytes, split into slots; the daemon lends one
slot per job.  Jobs arrive on stdin and results leave on stdout as
length-prefixed pickles (both ends are this package).

A job is one of:

* ``("chunks", job_id, slot, path, xorb_hash, specs)``: read the chunks
  ``specs`` describes (``format.xorb.ChunkSpec``, one run of adjacent chunks)
  from the xorb file at ``path``, decode and verify each, and write the
  decoded bytes one after another into the slot.  The result is ``(job_id,
  (outcomes, read_bytes))`` with, per chunk, its decoded length or ``(error
  class name, message)``.
* ``("layout", job_id, path, xorb_hash)``: read and check the xorb's layout
  (``store.read_layout``: footer, Merkle root against the name).  The result
  is ``(job_id, layout)`` or ``(job_id, (error class name, message))``.

Before the first job the worker sends ``READY``.  It exits when stdin
closes, that is when the daemon goes away.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import pickle
import signal
import struct
import sys
from typing import Any

from cachetools import LRUCache

from xetfs import errors
from xetfs.errors import XetfsError
from xetfs.format.xorb import ChunkSpec, XorbLayout, decode_chunks
from xetfs.hashes import to_hex
from xetfs.malloc import keep_freed_memory
from xetfs.store import open_xorb, read_chunk_run, read_layout

FRAME = struct.Struct("<I")
READY: tuple[int, None] = (0, None)  # the result a worker sends once it can take jobs (job ids start at 1)
MAX_OPEN_FILES = 64

# What a worker may name in a result, mapped back to the class the daemon raises.
_ERROR_CLASSES: dict[str, type[XetfsError]] = {
    cls.__name__: cls
    for cls in (errors.XorbFormatError, errors.FormatError, errors.IntegrityError, errors.MissingObjectError)
}

Outcome = int | tuple[str, str]


def error_outcome(exc: XetfsError) -> tuple[str, str]:
    """How a worker names an error in a result: ``(class name, message)``."""
    return type(exc).__name__, str(exc)


def outcome_error(outcome: tuple[str, str]) -> XetfsError:
    """The error a worker named (``error_outcome``), as the class the daemon would have raised."""
    name, message = outcome
    return _ERROR_CLASSES.get(name, errors.XorbFormatError)(message)


def encode_frame(message: Any) -> bytes:
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return FRAME.pack(len(body)) + body


def _read_exactly(fd: int, n: int) -> bytes | None:
    """``n`` bytes from ``fd``, or None at end of input."""
    parts = []
    while n:
        part = os.read(fd, n)
        if not part:
            return None
        parts.append(part)
        n -= len(part)
    return b"".join(parts)


class _Files(LRUCache[str, int]):
    """Open xorb files by path; the least recently used are closed."""

    def popitem(self) -> tuple[str, int]:
        path, fd = super().popitem()
        os.close(fd)
        return path, fd

    def fd(self, path: str, xorb_hash: bytes) -> int:
        fd = self.get(path)
        if fd is None:
            fd = self[path] = open_xorb(path, xorb_hash)
        return fd


def run_job(
    files: _Files, out: memoryview, path: str, xorb_hash: bytes, specs: list[ChunkSpec]
) -> tuple[list[Outcome], int]:
    """Decode one run into ``out``; the outcomes and the bytes read from the store."""
    (first, start, _, _, _), (last, _, end, _, _) = specs[0], specs[-1]
    try:
        data = read_chunk_run(files.fd(path, xorb_hash), start, end, first, last + 1, where=f"xorb {to_hex(xorb_hash)}")
    except XetfsError as exc:
        return [error_outcome(exc)] * len(specs), 0
    outcomes: list[Outcome] = []
    pos = 0
    for chunk in decode_chunks(data, xorb_hash, specs):
        if isinstance(chunk, XetfsError):
            outcomes.append(error_outcome(chunk))
            continue
        size = len(chunk)
        out[pos : pos + size] = chunk
        pos += size
        outcomes.append(size)
    return outcomes, len(data)


def load_layout(files: _Files, path: str, xorb_hash: bytes) -> XorbLayout | tuple[str, str]:
    """The checked layout of the xorb at ``path``, or ``(error class name, message)``."""
    try:
        return read_layout(files.fd(path, xorb_hash), xorb_hash)
    except XetfsError as exc:
        return error_outcome(exc)


def serve(jobs_fd: int, results_fd: int, shared: memoryview, slot_size: int) -> None:
    """Answer jobs until ``jobs_fd`` closes."""
    files = _Files(MAX_OPEN_FILES)
    while True:
        head = _read_exactly(jobs_fd, FRAME.size)
        if head is None:
            return
        body = _read_exactly(jobs_fd, FRAME.unpack(head)[0])
        if body is None:
            return
        job = pickle.loads(body)
        result: Any
        if job[0] == "layout":
            _, job_id, path, xorb_hash = job
            result = load_layout(files, path, xorb_hash)
        else:
            _, job_id, slot, path, xorb_hash, specs = job
            out = shared[slot * slot_size : (slot + 1) * slot_size]
            result = run_job(files, out, path, xorb_hash, specs)
        os.write(results_fd, encode_frame((job_id, result)))


def main() -> None:
    # Ctrl-C in a terminal reaches the whole process group; the daemon
    # decides when workers stop (by closing their input).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    keep_freed_memory()  # a job allocates and frees megabytes
    shm_fd, slots, slot_size = (int(a) for a in sys.argv[1:4])
    shared = mmap.mmap(shm_fd, slots * slot_size)
    with contextlib.suppress(BrokenPipeError):
        os.write(sys.stdout.fileno(), encode_frame(READY))
        serve(sys.stdin.fileno(), sys.stdout.fileno(), memoryview(shared), slot_size)


if __name__ == "__main__":
    main()
