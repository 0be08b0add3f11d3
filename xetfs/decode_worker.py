"""A decode worker process: reads, decodes and verifies chunk runs and xorb layouts for the mount daemon.

The daemon (``pool.DecodePool``) starts workers with ``python -m
xetfs.decode_worker SHM_FD SLOTS SLOT_SIZE``.  ``SHM_FD`` is a shared memory
file of ``SLOTS * SLOT_SIZE`` bytes, split into slots; the daemon lends one
slot per decode job.  Messages are the typed records below, sent as
length-prefixed pickles (both ends are this package):

* ``DecodeJob`` → ``Decoded``: read the run of adjacent chunks ``chunks``
  describes from the xorb file at ``path``, decode and verify each, and write
  the decoded bytes one after another into the slot.  ``Decoded.sizes``
  holds, per chunk, its decoded length or the ``WorkerError`` that stopped it.
  Chunks stored raw (most of a model's weights) are read straight into the
  slot and checked there.
* ``LayoutJob`` → ``LayoutLoaded``: read and check the xorb's layout
  (``store.read_layout``: footer, Merkle root against the name).

Before the first job the worker sends ``Ready``.  It exits when stdin
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
from dataclasses import dataclass

from xetfs import errors
from xetfs.errors import XetfsError
from xetfs.format.chunk import HEADER_SIZE
from xetfs.format.xorb import ChunkRun, XorbLayout, check_in_place, decode_chunks_into
from xetfs.hashes import to_hex
from xetfs.malloc import keep_freed_memory
from xetfs.store import OpenFiles, read_chunk_run, read_layout

FRAME = struct.Struct("<I")
MAX_OPEN_FILES = 64
MAX_IN_PLACE_CHUNKS = 256  # two buffers a chunk in one preadv: within IOV_MAX (1024)

# What a worker may name in an error, mapped back to the class the daemon raises.
_ERROR_CLASSES: dict[str, type[XetfsError]] = {
    cls.__name__: cls
    for cls in (
        errors.XorbFormatError,
        errors.FormatError,
        errors.IntegrityError,
        errors.MissingObjectError,
        errors.ObjectReadError,
    )
}


@dataclass(frozen=True, slots=True)
class WorkerError:
    """An error as a worker reports it: its class name and message."""

    kind: str
    message: str

    @classmethod
    def of(cls, exc: XetfsError) -> WorkerError:
        return cls(type(exc).__name__, str(exc))

    def error(self) -> XetfsError:
        """The error as the class the daemon would have raised."""
        return _ERROR_CLASSES.get(self.kind, errors.XorbFormatError)(self.message)


@dataclass(frozen=True, slots=True)
class DecodeJob:
    job_id: int
    slot: int
    path: str
    xorb_hash: bytes
    chunks: ChunkRun


@dataclass(frozen=True, slots=True)
class LayoutJob:
    job_id: int
    path: str
    xorb_hash: bytes


@dataclass(frozen=True, slots=True)
class Decoded:
    job_id: int
    sizes: list[int | WorkerError]  # per chunk, in order
    read_bytes: int  # bytes read from the store


@dataclass(frozen=True, slots=True)
class LayoutLoaded:
    job_id: int
    layout: XorbLayout | WorkerError


@dataclass(frozen=True, slots=True)
class Ready:
    """A worker can take jobs."""


Job = DecodeJob | LayoutJob
Result = Decoded | LayoutLoaded | Ready


def encode_frame(message: Job | Result) -> bytes:
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


def run_job(files: OpenFiles, out: memoryview, job: DecodeJob) -> Decoded:
    """Decode one run into ``out``."""
    run = job.chunks
    count = len(run.phys) - 1
    try:
        fd = files.fd(job.path, job.xorb_hash)
        if count <= MAX_IN_PLACE_CHUNKS and run.stored_raw_sized() and _read_in_place(fd, run, out):
            return Decoded(job.job_id, list[int | WorkerError](run.sizes()), run.phys[-1] - run.phys[0])
        where = f"xorb {to_hex(job.xorb_hash)}"
        data = read_chunk_run(fd, run.phys[0], run.phys[-1], run.first, run.first + count, where=where)
    except XetfsError as exc:
        return Decoded(job.job_id, [WorkerError.of(exc)] * count, 0)
    sizes = [WorkerError.of(s) if isinstance(s, XetfsError) else s
             for s in decode_chunks_into(data, job.xorb_hash, run.specs(), out)]  # fmt: skip
    return Decoded(job.job_id, sizes, len(data))


def _read_in_place(fd: int, run: ChunkRun, out: memoryview) -> bool:
    """Read a run of raw-sized chunks with their payloads straight into ``out`` (headers aside), and
    check them there (``check_in_place``): one copy less than reading, then decoding into ``out``.
    False if anything is off; ``run_job`` then decodes the run the usual way, which says what."""
    sizes = run.sizes()
    headers = memoryview(bytearray(HEADER_SIZE * len(sizes)))
    parts: list[memoryview] = []
    pos = 0
    for k, size in enumerate(sizes):
        parts += (headers[k * HEADER_SIZE : (k + 1) * HEADER_SIZE], out[pos : pos + size])
        pos += size
    try:
        read = os.preadv(fd, parts, run.phys[0])
    except OSError:
        return False
    return read == run.phys[-1] - run.phys[0] and check_in_place(headers, run, out)


def load_layout(files: OpenFiles, job: LayoutJob) -> LayoutLoaded:
    try:
        return LayoutLoaded(job.job_id, read_layout(files.fd(job.path, job.xorb_hash), job.xorb_hash))
    except XetfsError as exc:
        return LayoutLoaded(job.job_id, WorkerError.of(exc))


def serve(jobs_fd: int, results_fd: int, shared: memoryview, slot_size: int) -> None:
    """Answer jobs until ``jobs_fd`` closes."""
    files = OpenFiles(MAX_OPEN_FILES)
    while True:
        head = _read_exactly(jobs_fd, FRAME.size)
        if head is None:
            return
        body = _read_exactly(jobs_fd, FRAME.unpack(head)[0])
        if body is None:
            return
        job = pickle.loads(body)
        result: Result
        if isinstance(job, LayoutJob):
            result = load_layout(files, job)
        else:
            result = run_job(files, shared[job.slot * slot_size : (job.slot + 1) * slot_size], job)
        os.write(results_fd, encode_frame(result))


def main() -> None:
    # Ctrl-C in a terminal reaches the whole process group; the daemon
    # decides when workers stop (by closing their input).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    keep_freed_memory()  # a job allocates and frees megabytes
    shm_fd, slots, slot_size = (int(a) for a in sys.argv[1:4])
    shared = mmap.mmap(shm_fd, slots * slot_size)
    with contextlib.suppress(BrokenPipeError):
        os.write(sys.stdout.fileno(), encode_frame(Ready()))
        serve(sys.stdin.fileno(), sys.stdout.fileno(), memoryview(shared), slot_size)


if __name__ == "__main__":
    # Run the module's named copy, so that the records pickle as ``xetfs.decode_worker.*``, not ``__main__.*``.
    from xetfs.decode_worker import main as _main

    _main()
