"""Decode worker processes for the mount daemon (trio side).

Decoding and hashing chunks is CPU work, and in the daemon it would share
one core (and the GIL) with answering FUSE.  ``DecodePool`` hands runs of
chunks to worker processes (``decode_worker``) instead: each job gets a slot
of a shared memory file and the worker writes the decoded, verified bytes
there.  The chunks stay in their slot (``SharedChunk``) until the cache lets
them go, so a chunk is copied once in the daemon, into its reply; a whole run
for a sequential reader (``decode_whole``, see ``stream``) is one piece, and
the reply may take it straight from the slot.  When slots run short, the
chunks of the oldest slot are copied out to free it (``detach``).  Threads
would not help here: python-lz4, pyfuse3's reply and most of the decode path
hold the GIL, and a thread hop costs more than decoding a chunk.

Checking a xorb's layout (reading its footer and tying its ~1,000 chunk
hashes to the xorb's name: milliseconds of Python) is a job too; the daemon
only unpickles the result.  A decode job costs a process round trip, so the
reader only sends runs worth it (``min_job_bytes``) and decodes small ones
itself.  A worker that dies fails its pending jobs with ``WorkerLost``; the
reader then does the work in the daemon, so a lost worker costs speed,
never a read.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import pickle
import subprocess
import sys
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from xetfs.decode_worker import FRAME, READY, Outcome, encode_frame, outcome_error
from xetfs.errors import XetfsError
from xetfs.format.xorb import ChunkSpec, XorbLayout

log = logging.getLogger(__name__)

SLOT_SIZE = 2 * 1024 * 1024  # decoded bytes per job at most
SLOTS_PER_WORKER = 3  # jobs in flight per worker: one decoding, the next ones queued behind it
HELD_SLOTS = 16  # more slots, for decoded chunks the cache still holds (a prefetch window)
MIN_JOB_BYTES = 256 * 1024  # smaller runs are decoded in the daemon
MAX_WORKERS = 8


def default_workers() -> int:
    """One worker per CPU the daemon may use, at most ``MAX_WORKERS``."""
    return min(MAX_WORKERS, len(os.sched_getaffinity(0)))


class WorkerLost(Exception):
    """The worker holding a job exited; the caller should decode it itself."""


class SharedChunk:
    """A decoded chunk, still in the shared-memory slot its worker wrote it to.

    ``data`` is a view of the slot while ``lease`` keeps the slot from being
    reused; ``detach`` copies the bytes out and lets the lease go.  Take a
    view of ``data`` only to copy it, with no ``await`` in between: the
    slot may be detached and given to another job at any await.
    """

    __slots__ = ("__weakref__", "data", "lease")

    def __init__(self, data: memoryview, lease: _Lease) -> None:
        self.data: memoryview | bytes = data
        self.lease: _Lease | None = lease

    def __len__(self) -> int:
        return len(self.data)

    def detach(self) -> None:
        if self.lease is not None:
            self.data = bytes(self.data)
            self.lease = None


class _Lease:
    """One slot's claim on shared memory; the slot is free again once no chunk refers to its lease."""

    __slots__ = ("__weakref__", "chunks")

    def __init__(self) -> None:
        self.chunks: list[weakref.ref[SharedChunk]] = []

    def share(self, view: memoryview) -> SharedChunk:
        """A chunk of the slot's bytes ``view`` under this lease."""
        chunk = SharedChunk(view, self)
        self.chunks.append(weakref.ref(chunk))
        return chunk

    def detach(self) -> None:
        for ref in self.chunks:
            chunk = ref()
            if chunk is not None:
                chunk.detach()


@dataclass(eq=False)
class _Job:
    slot: int | None  # None: a layout job, which needs no shared memory
    whole: bool = False  # the run's chunks come back as one piece (``decode_whole``)
    done: trio.Event = field(default_factory=trio.Event)
    result: Any = None  # what ``_finish`` made of the worker's answer; None if the worker was lost


@dataclass(eq=False)
class _Worker:
    number: int
    process: subprocess.Popen[bytes]
    jobs_fd: int
    results_fd: int
    pending: dict[int, _Job] = field(default_factory=dict)
    unread: bytearray = field(default_factory=bytearray)  # results received in part
    alive: bool = True
    collecting: bool = False  # a task is reading its results
    ready: bool = False  # it has said it can take jobs


class DecodePool:
    def __init__(
        self,
        workers: int,
        *,
        slots_per_worker: int = SLOTS_PER_WORKER,
        slot_size: int = SLOT_SIZE,
        held_slots: int = HELD_SLOTS,
    ) -> None:
        if workers < 1:
            raise ValueError("a decode pool needs at least one worker")
        self.slot_size = slot_size
        self.min_job_bytes = MIN_JOB_BYTES
        self.capacity = workers * slots_per_worker  # jobs the reader keeps in flight
        self._slot_count = slots = self.capacity + held_slots
        self._memfd = os.memfd_create("xetfs-decode", os.MFD_CLOEXEC)
        os.ftruncate(self._memfd, slots * slot_size)
        self._shared = mmap.mmap(self._memfd, slots * slot_size)
        self._view = memoryview(self._shared)
        self._free = list(range(slots))
        self._slot_waiters = trio.lowlevel.ParkingLot()  # decode calls waiting for a slot
        self._leases: OrderedDict[int, weakref.ref[_Lease]] = OrderedDict()  # slot -> lease, oldest first
        self._next_id = 0
        self._count = workers
        self._workers: list[_Worker] = []
        self._some_ready = trio.Event()  # set once a worker is ready (or none can be)

    @property
    def usable(self) -> bool:
        """Jobs can be sent: a worker is ready, alive, and its results are being collected."""
        return any(self._takes_jobs(w) for w in self._workers)

    @property
    def starting(self) -> bool:
        """No worker takes jobs yet, but one that is alive may soon."""
        return not self.usable and any(w.alive and not w.ready for w in self._workers)

    @staticmethod
    def _takes_jobs(worker: _Worker) -> bool:
        return worker.alive and worker.collecting and worker.ready

    async def wait_ready(self) -> None:
        """Wait until a worker can take jobs, or none ever will (after ``start``)."""
        await self._some_ready.wait()

    def _spawn(self, number: int) -> _Worker:
        shm = (str(self._memfd), str(self._slot_count), str(self.slot_size))
        argv = [sys.executable, "-m", "xetfs.decode_worker", *shm]
        process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, pass_fds=(self._memfd,))
        assert process.stdin is not None and process.stdout is not None
        # Keep raw descriptors: the results side is read by trio (non-blocking).
        jobs_fd, results_fd = os.dup(process.stdin.fileno()), os.dup(process.stdout.fileno())
        process.stdin.close()
        process.stdout.close()
        os.set_blocking(results_fd, False)
        return _Worker(number, process, jobs_fd, results_fd)

    def start(self, nursery: trio.Nursery) -> None:
        """Start the workers (the first time) and collect their results in ``nursery``.

        Until a worker has imported what it needs and said so, ``usable`` is
        false and the reader decodes by itself.  A later trio run (a test,
        say) may start the same pool again.
        """
        if not self._workers:
            self._workers = [self._spawn(n) for n in range(self._count)]
            log.info("started %d decode worker processes", self._count)
        for worker in self._workers:
            if worker.alive and not worker.collecting:
                worker.collecting = True
                nursery.start_soon(self._collect, worker)

    async def decode(
        self, path: str, xorb_hash: bytes, specs: list[ChunkSpec]
    ) -> tuple[int, list[SharedChunk | XetfsError]]:
        """Read, decode and verify one run of adjacent chunks of the xorb at ``path``.

        Returns the bytes read from the store and, per chunk, its bytes (in
        shared memory) or its error.  Raises ``WorkerLost`` if no worker
        could finish the job.  The run must decode to at most ``slot_size``
        bytes.
        """
        slot = await self._take_slot()
        result: tuple[int, list[SharedChunk | XetfsError]] = await self._submit(
            _Job(slot), lambda job_id: ("chunks", job_id, slot, path, xorb_hash, specs)
        )
        return result

    async def decode_whole(self, path: str, xorb_hash: bytes, specs: list[ChunkSpec]) -> tuple[int, SharedChunk]:
        """Like ``decode``, but the run's bytes come back as one piece of shared memory.

        The chunks of a run are written one after another, so the piece is
        their concatenation.  Raises the first chunk's error if any failed
        (the slot is then free again at once), or ``WorkerLost``.
        """
        slot = await self._take_slot()
        result: tuple[int, SharedChunk | XetfsError] = await self._submit(
            _Job(slot, whole=True), lambda job_id: ("chunks", job_id, slot, path, xorb_hash, specs)
        )
        read_bytes, data = result
        if isinstance(data, XetfsError):
            raise data
        return read_bytes, data

    async def layout(self, path: str, xorb_hash: bytes) -> XorbLayout:
        """The checked layout of the xorb at ``path`` (``store.read_layout``, run by a worker).

        Raises what ``read_layout`` would raise, or ``WorkerLost``.
        """
        result: XorbLayout | XetfsError = await self._submit(
            _Job(None), lambda job_id: ("layout", job_id, path, xorb_hash)
        )
        if isinstance(result, XetfsError):
            raise result
        return result

    async def _submit(self, job: _Job, message: Callable[[int], tuple[Any, ...]]) -> Any:
        """Send ``message(job_id)`` to the least busy worker and wait for ``job``'s result."""
        workers = [w for w in self._workers if self._takes_jobs(w)]
        if not workers:
            if job.slot is not None:
                self._release(job.slot)
            raise WorkerLost("no decode worker is running")
        worker = min(workers, key=lambda w: len(w.pending))
        job_id = self._next_id = self._next_id + 1
        worker.pending[job_id] = job
        try:
            os.write(worker.jobs_fd, encode_frame(message(job_id)))
        except OSError:
            self._lose(worker)
        # A cancelled wait does not free the slot: the worker may still be
        # writing into it.  Its chunks free it once nobody holds them.
        await job.done.wait()
        if job.result is None:
            raise WorkerLost(f"decode worker {worker.number} exited")
        return job.result

    async def _take_slot(self) -> int:
        """A free slot, waiting for one if need be.

        With none free, the oldest slot whose chunks are held is copied out;
        with none held either (all are decoding), a job must finish first.
        """
        while not self._free:
            self._reclaim()
            if not self._free:
                await self._slot_waiters.park()
        return self._free.pop()

    def _release(self, slot: int) -> None:
        self._free.append(slot)
        self._slot_waiters.unpark()

    def _reclaim(self) -> None:
        """Free a slot by copying out the chunks of the oldest slot still held, if any is."""
        while not self._free and self._leases:
            _, ref = self._leases.popitem(last=False)
            lease = ref()
            if lease is not None:
                lease.detach()  # the lease ends, and its slot is free, once its chunks let it go

    def _lease_ended(self, slot: int) -> None:
        self._leases.pop(slot, None)
        self._release(slot)

    async def _collect(self, worker: _Worker) -> None:
        """Finish ``worker``'s jobs as their results arrive, until it exits (or this is cancelled)."""
        try:
            await self._collect_until_exit(worker)
        finally:
            worker.collecting = False

    async def _collect_until_exit(self, worker: _Worker) -> None:
        buffer = worker.unread
        while worker.alive:
            await trio.lowlevel.wait_readable(worker.results_fd)
            try:
                data = os.read(worker.results_fd, 1 << 16)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if not data:
                self._lose(worker)
                return
            buffer += data
            while len(buffer) >= FRAME.size:
                (length,) = FRAME.unpack_from(buffer)
                if len(buffer) < FRAME.size + length:
                    break
                body = bytes(buffer[FRAME.size : FRAME.size + length])
                del buffer[: FRAME.size + length]
                message = pickle.loads(body)
                if message == READY:
                    log.info("decode worker %d ready", worker.number)
                    worker.ready = True
                    self._some_ready.set()
                else:
                    self._finish(worker, *message)

    def _finish(self, worker: _Worker, job_id: int, result: Any) -> None:
        job = worker.pending.pop(job_id)
        if job.slot is None:
            job.result = outcome_error(result) if isinstance(result, tuple) else result
        else:
            outcomes, read_bytes = result
            chunks = self._whole(job.slot, outcomes) if job.whole else self._chunks(job.slot, outcomes)
            job.result = (read_bytes, chunks)
        job.done.set()

    def _chunks(self, slot: int, outcomes: list[Outcome]) -> list[SharedChunk | XetfsError]:
        """Each chunk, left in ``slot`` under one lease, or its error; the slot is free again once the lease ends."""
        lease = self._lease(slot)
        base = slot * self.slot_size
        values: list[SharedChunk | XetfsError] = []
        for outcome in outcomes:
            if isinstance(outcome, int):
                values.append(lease.share(self._view[base : base + outcome]))
                base += outcome
            else:
                values.append(outcome_error(outcome))
        return values

    def _whole(self, slot: int, outcomes: list[Outcome]) -> SharedChunk | XetfsError:
        """The run's bytes as one chunk left in ``slot``, or its first error (and the slot is free again)."""
        sizes = [o for o in outcomes if isinstance(o, int)]
        if len(sizes) < len(outcomes):
            self._release(slot)
            return outcome_error(next(o for o in outcomes if not isinstance(o, int)))
        base = slot * self.slot_size
        return self._lease(slot).share(self._view[base : base + sum(sizes)])

    def _lease(self, slot: int) -> _Lease:
        """A new lease on ``slot``: it is free again once no chunk refers to the lease."""
        lease = _Lease()
        self._leases[slot] = weakref.ref(lease)
        weakref.finalize(lease, self._lease_ended, slot)
        self._slot_waiters.unpark()  # a waiting decode may copy the slot's chunks out to take it
        return lease

    def _lose(self, worker: _Worker) -> None:
        if worker.alive:
            worker.alive = False
            code = worker.process.poll()
            log.error("decode worker %d stopped (exit status %s); decoding in the daemon", worker.number, code)
        if not any(w.alive for w in self._workers):
            self._some_ready.set()  # nobody is left to wait for
        for job in worker.pending.values():
            if job.slot is not None:
                self._release(job.slot)
            job.done.set()
        worker.pending.clear()

    def close(self, timeout: float = 2.0) -> None:
        """Stop the workers (closing their input ends them) and free the shared memory."""
        for worker in self._workers:
            worker.alive = False
            with contextlib.suppress(OSError):
                os.close(worker.jobs_fd)
            with contextlib.suppress(OSError):
                os.close(worker.results_fd)
        for worker in self._workers:
            try:
                worker.process.wait(timeout)
            except subprocess.TimeoutExpired:
                worker.process.kill()
                worker.process.wait()
        for ref in list(self._leases.values()):
            lease = ref()
            if lease is not None:
                lease.detach()  # chunks the cache still holds keep their bytes
        with contextlib.suppress(BufferError):  # a view still held elsewhere: the mapping goes with it
            self._view.release()
            self._shared.close()
        os.close(self._memfd)
