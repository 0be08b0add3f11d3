"""A decode worker process: reads, decodes and verifies chunk runs and xorb layouts for the mount daemon.

The daemon (``pool.DecodePool``) starts workers with ``python -m
xetfs.read.decode_worker SHM_FD SLOTS SLOT_SIZE``.  ``SHM_FD`` is a shared memory
file of ``SLOTS * SLOT_SIZE`` bytes, split into slots; the daemon lends
slots to decode jobs.  Messages are the typed records below, sent as
length-prefixed pickles (both ends are this package):

* ``Setup`` first: how to reach the store's source, for a remote store
  (its URL and options, secrets included: they travel over the pipe, never
  on a command line).
* ``Job`` → ``Result``: read the serialized chunks of its parts from
  ``source`` (a local file, or one fetch from the store's source), decode
  and verify each chunk, and write each part's chunks one after another
  into its slot.  ``Result.sizes`` holds, per part and chunk, its decoded
  length or the ``WorkerError`` that stopped it.  Chunks stored raw, read
  from a local file or fetched, go straight into the slot (their headers
  aside) and are checked there.  Fetched bytes whose chunks all verified
  are kept in the disk cache when the job says where (``source.cache_to``).
  A job without parts reads and checks the layout of the local xorb
  ``source.path`` instead (``store.read_layout``: footer, Merkle root
  against the name), given as ``Result.layout``.

Before the first job the worker sends ``Ready``.  Fetches of a remote
store start as soon as their jobs arrive, a few at a time in threads
(obstore releases the GIL), so that the network and the decoding overlap;
results go back in the order the jobs came.  The worker exits when its
input closes, that is when the daemon goes away.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import pickle
import queue
import signal
import struct
import sys
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NamedTuple

from xetfs.base import errors
from xetfs.base.errors import XetfsError
from xetfs.base.hashes import to_hex
from xetfs.base.malloc import keep_freed_memory
from xetfs.base.settings import IOV_MAX, WORKER_FETCHES
from xetfs.base.stats import RemoteCounters
from xetfs.format.chunk import HEADER_SIZE, Buffer
from xetfs.format.xorb import (
    ChunkRun,
    XorbLayout,
    all_raw,
    check_in_place,
    decode_chunks_into,
    decode_runs_into,
)
from xetfs.storage.objects import ObjectSource, RemoteOptions
from xetfs.storage.store import ChunkSource, open_xorb, read_chunk_run, read_layout, xorb_fd

FRAME = struct.Struct("<I")
# What a fetch thread brings: the headers of each part, read in place (``Worker.fetch``), the stored bytes, or
# the error that stopped it.
Fetched = list[memoryview] | Buffer | XetfsError
MAX_IN_PLACE_CHUNKS = IOV_MAX // 4  # two buffers a chunk in one preadv

# What a worker may name in an error, mapped back to the class the daemon raises.
_ERROR_CLASSES: dict[str, type[XetfsError]] = {
    cls.__name__: cls
    for cls in (
        errors.XorbFormatError,
        errors.FormatError,
        errors.IntegrityError,
        errors.MissingObjectError,
        errors.ObjectReadError,
        errors.StoreError,
        errors.ServerUnreachableError,
        errors.StoreTimeoutError,
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
class Setup:
    """How a worker reaches the store's source: a remote store's URL and options, or None (a local store)."""

    remote: tuple[str, RemoteOptions] | None
    cache_tmp: str | None  # where disk-cache entries are written before they are renamed into place


class Job(NamedTuple):  # (tuples: one of each crosses a pipe for every job, pickled at C speed)
    """Read chunks of xorb ``xorb_hash`` from ``source`` and decode each part into its slot; with no parts,
    read and check the layout of the local xorb ``source.path``."""

    job_id: int
    source: ChunkSource
    xorb_hash: bytes
    parts: tuple[tuple[int, ChunkRun], ...] = ()  # (slot, chunks), adjacent, in order

    def stored_range(self) -> tuple[int, int]:
        """Where its parts' serialized chunks start and end in the xorb."""
        return self.parts[0][1].phys[0], self.parts[-1][1].phys[-1]

    def describe(self) -> str:
        """``xorb <hex> chunks [a, b)`` (or the xorb alone, for a layout), for messages."""
        where = f"xorb {to_hex(self.xorb_hash)}"
        if not self.parts:
            return where
        first, last = self.parts[0][1], self.parts[-1][1]
        return f"{where} chunks [{first.first}, {last.first + len(last.phys) - 1})"


class Result(NamedTuple):
    """A worker's answer to the job ``job_id``."""

    job_id: int
    sizes: list[list[int | WorkerError]]  # per part, per chunk, in order
    read_bytes: int = 0  # bytes read from the store or the disk cache
    fetched: RemoteCounters | None = None  # what fetching them from a remote store cost since the last report
    cached: int | tuple[int, str] = 0  # bytes kept in the disk cache, or why they could not be (errno, message)
    layout: XorbLayout | WorkerError | None = None  # a layout job's answer


@dataclass(frozen=True, slots=True)
class Ready:
    """A worker can take jobs."""


def encode_frame(message: Job | Result | Ready | Setup) -> bytes:
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


def read_frame(fd: int) -> object | None:
    """The next message on ``fd``, or None at end of input."""
    head = _read_exactly(fd, FRAME.size)
    if head is None:
        return None
    body = _read_exactly(fd, FRAME.unpack(head)[0])
    return None if body is None else pickle.loads(body)


class Worker:
    """One worker's state: its open files, the remote source and its counters, and the shared memory."""

    def __init__(self, shared: memoryview, slot_size: int, setup: Setup) -> None:
        self.shared = shared
        self.slot_size = slot_size
        self.files: dict[str, int] = {}  # open xorb descriptors by path (``xorb_fd``)
        self.counters = RemoteCounters()
        self._reported = RemoteCounters()  # ``counters`` as the last result reported them
        self.source: ObjectSource | None = None
        if setup.remote is not None:
            from xetfs.storage.objects import ObstoreSource

            url, options = setup.remote
            self.source = ObstoreSource(url, options, self.counters)
        self.cache_tmp = Path(setup.cache_tmp) if setup.cache_tmp else None

    def fetch(self, job: Job) -> Fetched:
        """The chunks of ``job`` from the remote source (in a fetch thread).

        When every chunk is stored as long as it decodes (raw chunks), the
        payloads go straight into the slots and the headers aside, as a local
        read does (``_read_in_place``): the headers of each part are returned.
        Otherwise the stored bytes are.
        """
        if all(run.stored_raw_sized() for _, run in job.parts):
            headers = [memoryview(bytearray(HEADER_SIZE * (len(run.phys) - 1))) for _, run in job.parts]
            error = self._fetch_into(job, self._job_places(job, headers))
            return headers if error is None else error
        return self._fetch_stored(job)

    def _fetch_stored(self, job: Job) -> Buffer | XetfsError:
        start, end = job.stored_range()
        buffer = bytearray(end - start)
        error = self._fetch_into(job, [memoryview(buffer)])
        return buffer if error is None else error

    def _fetch_into(self, job: Job, parts: list[memoryview]) -> XetfsError | None:
        if self.source is None:
            return errors.StoreError(f"xorb {to_hex(job.xorb_hash)}: no source to fetch from")
        start, end = job.stored_range()
        try:
            self.source.read_range_into(job.source.name, start, end, parts)
        except XetfsError as exc:
            return exc
        return None

    def decode(self, job: Job, fetched: Fetched | None) -> Result:
        """Decode ``job``: from ``fetched`` (what a fetch thread brought, or its error), else from a local file."""
        src = job.source
        if fetched is None:
            sizes = [self._decode_local(src, job.xorb_hash, slot, run) for slot, run in job.parts]
            return Result(job.job_id, [s for s, _ in sizes], sum(n for _, n in sizes))
        if isinstance(fetched, list):
            done = self._check_in_place(job, fetched)
            if done is not None:
                return done
            fetched = self._fetch_stored(job)  # (a chunk failed: its stored bytes say which, and why)
            if isinstance(fetched, XetfsError):  # (then that is what the reads get, not the network's error)
                fetched = errors.IntegrityError(f"{job.describe()}: a chunk failed its check, and fetching them "
                                                f"again to say which failed too: {fetched}")  # fmt: skip
        if isinstance(fetched, XetfsError):
            failed = [list[int | WorkerError]([WorkerError.of(fetched)] * (len(run.phys) - 1)) for _, run in job.parts]
            return Result(job.job_id, failed, 0, self._fetched())
        view = memoryview(fetched)
        decoded = decode_runs_into(view, job.xorb_hash, [(run, self._slot(slot)) for slot, run in job.parts])
        out = [[WorkerError.of(s) if isinstance(s, XetfsError) else s for s in sizes] for sizes in decoded]
        ok = all(isinstance(s, int) for p in out for s in p)
        return Result(job.job_id, out, len(view), self._fetched(), self._keep(src, [view]) if ok else 0)

    def _check_in_place(self, job: Job, headers: list[memoryview]) -> Result | None:
        """The result of a job fetched in place, once every chunk checks; None if one does not."""
        pairs = list(zip(headers, job.parts, strict=True))
        if not all(check_in_place(h, run, self._slot(slot)) for h, (slot, run) in pairs):
            return None
        start, end = job.stored_range()
        cached: int | tuple[int, str] = 0
        keep = job.source.cache_to and self.cache_tmp is not None
        if keep and all(all_raw(h, run) for h, (_, run) in pairs):  # (else a chunk was decoded in place: not as stored)
            cached = self._keep(job.source, self._job_places(job, headers))
        sizes = [list[int | WorkerError](run.sizes()) for _, run in job.parts]
        return Result(job.job_id, sizes, end - start, self._fetched(), cached)

    def _job_places(self, job: Job, headers: list[memoryview]) -> list[memoryview]:
        """``_places`` of every part of ``job``, one after the other."""
        return [p for (slot, run), h in zip(job.parts, headers, strict=True) for p in _places(run, h, self._slot(slot))]

    def _keep(self, src: ChunkSource, parts: list[memoryview]) -> int | tuple[int, str]:
        """Keep verified stored bytes, ``parts`` one after the other, in the disk cache where the job says:
        the bytes kept, or why they could not be (errno, message)."""
        if not src.cache_to or self.cache_tmp is None:
            return 0
        from xetfs.storage.entryfile import write_entry

        written = write_entry(src.cache_to, parts, self.cache_tmp, direct=True)
        return written if isinstance(written, int) else (written.errno or 0, written.strerror or str(written))

    def _decode_local(
        self, src: ChunkSource, xorb_hash: bytes, slot: int, run: ChunkRun
    ) -> tuple[list[int | WorkerError], int]:
        """Decode the chunks ``run`` from the local file ``src.path`` into ``slot``: per chunk its size or
        error, and the bytes read."""
        out = self._slot(slot)
        count = len(run.phys) - 1
        where = f"xorb {to_hex(xorb_hash)}" + (f" (disk cache entry {src.path})" if src.entry else "")
        try:
            # A disk-cache entry is opened afresh: one dropped and fetched again is a new file of the same name.
            with contextlib.ExitStack() as stack:
                if src.entry is None:
                    fd = xorb_fd(self.files, src.path or "", xorb_hash)
                else:
                    fd = open_xorb(src.path or "", xorb_hash)
                    stack.callback(os.close, fd)
                if count <= MAX_IN_PLACE_CHUNKS and run.stored_raw_sized() and _read_in_place(fd, run, out, src.base):
                    return list[int | WorkerError](run.sizes()), run.phys[-1] - run.phys[0]
                data = read_chunk_run(fd, run.phys[0] - src.base, run.phys[-1] - src.base, run.first,
                                      run.first + count, where=where)  # fmt: skip
        except XetfsError as exc:
            return [WorkerError.of(exc)] * count, 0
        sizes = [WorkerError.of(s) if isinstance(s, XetfsError) else s
                 for s in decode_chunks_into(data, xorb_hash, run, out)]  # fmt: skip
        return sizes, len(data)

    def load_layout(self, job: Job) -> Result:
        """Read and check the layout of the local xorb ``job.source.path`` (a job without parts)."""
        try:
            layout = read_layout(xorb_fd(self.files, job.source.path or "", job.xorb_hash), job.xorb_hash)
        except XetfsError as exc:
            return Result(job.job_id, [], layout=WorkerError.of(exc))
        return Result(job.job_id, [], layout=layout)

    def _slot(self, slot: int) -> memoryview:
        return self.shared[slot * self.slot_size : (slot + 1) * self.slot_size]

    def _fetched(self) -> RemoteCounters:
        """What the fetches cost since the last report: requests, bytes, retries, errors and waits (the counters
        are the source's, shared by its threads)."""
        with self.counters.lock:
            now = replace(self.counters)
        before, self._reported = self._reported, now
        return now.since(before)


def _places(run: ChunkRun, headers: memoryview, out: memoryview) -> list[memoryview]:
    """Where each stored byte of a run of raw-sized chunks goes: its headers back to back in
    ``headers``, each payload straight to its place in ``out`` (``check_in_place``)."""
    places: list[memoryview] = []
    pos = 0
    for k, size in enumerate(run.sizes()):
        places += (headers[k * HEADER_SIZE : (k + 1) * HEADER_SIZE], out[pos : pos + size])
        pos += size
    return places


def _read_in_place(fd: int, run: ChunkRun, out: memoryview, base: int = 0) -> bool:
    """Read a run of raw-sized chunks with their payloads straight into ``out`` (headers aside), and
    check them there (``check_in_place``): one copy less than reading, then decoding into ``out``.
    ``base``: the xorb offset where the file starts.  False if anything is off; the run is then
    decoded the usual way, which says what."""
    headers = memoryview(bytearray(HEADER_SIZE * (len(run.phys) - 1)))
    try:
        read = os.preadv(fd, _places(run, headers, out), run.phys[0] - base)
    except OSError:
        return False
    return read == run.phys[-1] - run.phys[0] and check_in_place(headers, run, out)


def serve(jobs_fd: int, results_fd: int, worker: Worker) -> None:
    """Answer jobs until ``jobs_fd`` closes.

    For a remote store, a thread reads the jobs as they come and starts the
    fetches of remote ones; this thread decodes them in order and writes the
    results.  For a local store, this thread does it all, one job after the
    other: a hand-over between threads costs more than a local read.
    """
    if worker.source is None:
        while (job := read_frame(jobs_fd)) is not None:
            assert isinstance(job, Job)
            done = worker.decode(job, None) if job.parts else worker.load_layout(job)
            os.write(results_fd, encode_frame(done))
        return
    fetcher = ThreadPoolExecutor(WORKER_FETCHES)
    jobs: queue.Queue[tuple[Job, Future[Fetched] | None] | None] = queue.Queue()

    def receive() -> None:
        try:
            while (job := read_frame(jobs_fd)) is not None:
                assert isinstance(job, Job)
                future = None
                if job.parts and job.source.path is None:
                    future = fetcher.submit(worker.fetch, job)
                jobs.put((job, future))
        finally:
            jobs.put(None)

    threading.Thread(target=receive, daemon=True).start()
    while (item := jobs.get()) is not None:
        job, future = item
        if job.parts:
            result = worker.decode(job, future.result() if future is not None else None)
        else:
            result = worker.load_layout(job)
        os.write(results_fd, encode_frame(result))


def main() -> None:
    # Ctrl-C in a terminal reaches the whole process group; the daemon
    # decides when workers stop (by closing their input).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    keep_freed_memory()  # a job allocates and frees megabytes
    shm_fd, slots, slot_size = (int(a) for a in sys.argv[1:4])
    shared = mmap.mmap(shm_fd, slots * slot_size)
    setup = read_frame(sys.stdin.fileno())
    with contextlib.suppress(BrokenPipeError):
        if isinstance(setup, Setup):
            # Ready once set up: a remote source's client is loaded and the first job need not wait for it.
            worker = Worker(memoryview(shared), slot_size, setup)
            os.write(sys.stdout.fileno(), encode_frame(Ready()))
            serve(sys.stdin.fileno(), sys.stdout.fileno(), worker)
    os._exit(0)  # (fetch threads may still wait on the network: nobody needs their answers)


if __name__ == "__main__":
    # Run the module's named copy, so that the records pickle as ``xetfs.read.decode_worker.*``, not ``__main__.*``.
    from xetfs.read.decode_worker import main as _main

    _main()
