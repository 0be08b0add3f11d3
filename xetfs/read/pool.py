"""Decode worker processes for the mount daemon (trio side).

Decoding and hashing chunks is CPU work, and in the daemon it would share
one core (and the GIL) with answering FUSE.  ``DecodePool`` hands runs of
chunks to worker processes (``decode_worker``) instead.  Each decode job
writes into slots of the pool's shared memory (``slots.Slots``), which the
caller takes, owns while the runs decoded there are held, and gives back
when they are evicted.  Threads would not help: python-lz4, pyfuse3's reply
and most of the decode path hold the GIL, and a thread hop costs more than
decoding a chunk.

Checking a xorb's layout (its footer, and the ~1,000 chunk hashes tied to
the xorb's name: milliseconds of Python) is a job too; the daemon only
unpickles the result.  A worker that dies fails its pending jobs with
``WorkerLost``; the caller then does the work in the daemon, so a lost
worker costs speed, never a read.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace

import trio

from xetfs.base.errors import StoreTimeoutError
from xetfs.base.settings import (
    EXIT_GRACE,
    FENCED_POLL,
    KEEP_FREE_SLOTS,
    KILLED_WORKER_WAIT,
    MAX_WORKERS,
    MIN_JOB_BYTES,
    MIN_SLOT_RUN,
    SLOT_SIZE,
    SLOTS_PER_WORKER,
    WATCHDOG_PERIOD,
    WORKER_RESTARTS,
    WORKER_RESTARTS_WINDOW,
    usable_cpus,
)
from xetfs.base.stats import WorkerCounters
from xetfs.format.xorb import ChunkRun, XorbLayout
from xetfs.read.decode_worker import FRAME, Job, Ready, Result, Setup, encode_frame
from xetfs.read.slots import Slot, Slots, release_all
from xetfs.storage.store import ChunkSource

log = logging.getLogger(__name__)


def default_workers() -> int:
    """One worker per CPU the daemon may use, at most ``MAX_WORKERS``."""
    return min(MAX_WORKERS, usable_cpus())


def min_slot_run(slot_size: int) -> int:
    """The shortest run that stays in a slot once decoded there: half of it, at most ``MIN_SLOT_RUN``
    (``Loader.load`` copies shorter ones out, and gives the slot back)."""
    return min(slot_size // 2, MIN_SLOT_RUN)


def slots_for(cache_size: int, workers: int, slot_size: int = SLOT_SIZE) -> int:
    """Slots for a cache of ``cache_size`` bytes, and the jobs in flight.

    A run held in a slot fills at least ``min_slot_run`` of it, so the cache can fill with them before the
    slots run out.  Each process maps every slot: up to ``slot_size / min_slot_run`` (4) times the cache in
    address space (not memory: a slot's pages are touched only as far as its runs reach).
    """
    return max(0, cache_size) // min_slot_run(slot_size) + workers * SLOTS_PER_WORKER + KEEP_FREE_SLOTS


class WorkerLost(Exception):
    """The worker holding a job exited, or was stopped; the caller should decode it itself.

    ``fenced``: the worker was killed while it might still write into the
    job's slots, which are never used again: the caller decodes elsewhere.
    """

    def __init__(self, message: str, *, fenced: bool = False) -> None:
        super().__init__(message)
        self.fenced = fenced


@dataclass(eq=False)
class _Pending:
    slots: tuple[Slot, ...]  # empty: a layout job, which needs no shared memory
    sent: float  # when (``trio.current_time``): the watchdog stops a worker whose job is older than its timeout
    done: trio.Event = field(default_factory=trio.Event)
    result: Result | None = None  # None if the worker was lost
    abandoned: bool = False  # the caller was cancelled: the slots are freed when the worker is done with them
    fenced: bool = False  # the worker was killed: the slots are never used again
    timed_out: bool = False  # the worker was killed because this job ran out of time


@dataclass(eq=False)
class _Worker:
    number: int
    process: subprocess.Popen[bytes]
    jobs_fd: int
    results_fd: int
    pending: dict[int, _Pending] = field(default_factory=dict)
    unread: bytearray = field(default_factory=bytearray)  # results received in part
    unsent: bytearray = field(default_factory=bytearray)  # jobs its full input pipe did not take yet
    sending: bool = False  # a task is writing ``unsent`` as the pipe takes it
    alive: bool = True
    collecting: bool = False  # a task is reading its results
    ready: bool = False  # it has said it can take jobs

    @property
    def takes_jobs(self) -> bool:
        return self.alive and self.collecting and self.ready

    def write(self, frame: bytes) -> bool:
        """Write what the input pipe takes of ``frame`` now, and keep the rest after ``unsent`` (``drain``),
        frames whole and in order; False if the pipe broke (the worker is gone).

        A blocking write could stop the daemon for good: a worker writing a large result (a layout) into a
        full results pipe reads no more jobs, and the daemon, stuck in the write, would never read the
        results that would let it go on.
        """
        if not self.unsent:
            try:
                frame = frame[os.write(self.jobs_fd, frame) :]
            except BlockingIOError:
                pass
            except OSError:
                return False
        self.unsent += frame
        return True

    async def drain(self) -> bool:
        """Write ``unsent`` as the input pipe takes it; False if the pipe broke."""
        try:
            while self.unsent and self.alive:
                await trio.lowlevel.wait_writable(self.jobs_fd)
                try:
                    del self.unsent[: os.write(self.jobs_fd, self.unsent)]
                except BlockingIOError:
                    continue
                except OSError:
                    return False
            return True
        finally:
            self.sending = False


class DecodePool:
    def __init__(
        self,
        workers: int,
        *,
        slots: int | None = None,
        slot_size: int = SLOT_SIZE,
        setup: Setup | None = None,
        job_timeout: float | None = None,
    ) -> None:
        """``setup``: how workers reach the store's source (a remote store's URL and options: secrets go
        over the workers' input, never their command line); ``job_timeout``: seconds after which a job's
        worker is taken for hung, stopped and replaced, and the job fails (``StoreTimeoutError``)."""
        if workers < 1:
            raise ValueError("a decode pool needs at least one worker")
        self._setup = setup or Setup(None, None)
        self.job_timeout = job_timeout
        self.slot_size = slot_size
        self.min_job_bytes = MIN_JOB_BYTES
        self.min_slot_run = min_slot_run(slot_size)
        self.capacity = workers * SLOTS_PER_WORKER  # jobs worth keeping in flight
        slots = max(slots or 0, self.capacity + KEEP_FREE_SLOTS)
        self._counters = WorkerCounters(workers=workers, slots=slots, slot_bytes=slot_size)
        self.slots = Slots(slots, slot_size, keep=self.capacity + KEEP_FREE_SLOTS,
                           spare_bytes=KEEP_FREE_SLOTS * slot_size, counters=self._counters)  # fmt: skip
        self._next_id = 0
        self._closed = False
        self._count = workers
        self._workers: list[_Worker] = []
        self._some_ready = trio.Event()  # set once a worker is ready (or none can be)
        self._nursery: trio.Nursery | None = None  # where ``start`` runs the pool's tasks
        self._spawned: list[_Worker] = []  # every worker started, replaced ones too: ``close`` ends them all
        self._deaths: list[float] = []  # when workers died on their own (``trio.current_time``), lately

    def statistics(self) -> WorkerCounters:
        """A snapshot of the pool's counters."""
        c = self._counters
        c.alive = sum(w.alive for w in self._workers)
        c.free_slots = self.slots.free_count
        return replace(c)

    @property
    def worker_count(self) -> int:
        """How many worker processes the pool keeps running."""
        return self._count

    @property
    def usable(self) -> bool:
        """Jobs can be sent: a worker is ready, alive, and its results are being collected."""
        return any(w.takes_jobs for w in self._workers)

    async def wait_ready(self) -> None:
        """Wait until a worker can take jobs, or none ever will (after ``start``)."""
        await self._some_ready.wait()

    # -- workers ----------------------------------------------------------

    def start(self, nursery: trio.Nursery) -> None:
        """Start the workers (the first time) and collect their results in ``nursery``.

        Until a worker has imported what it needs and said so, ``usable`` is
        false and the reader decodes by itself.  A later trio run (a test,
        say) may start the same pool again.
        """
        if not self._workers:
            self._workers = [self._spawn(n) for n in range(self._count)]
            log.info("started %d decode worker processes", self._count)
        self._nursery = nursery
        if self.job_timeout is not None:
            nursery.start_soon(self._watch, self.job_timeout)
        for worker in self._workers:
            if worker.alive and not worker.collecting:
                worker.collecting = True
                nursery.start_soon(self._collect, worker)
            if worker.alive and worker.unsent and not worker.sending:  # left when an earlier run ended
                nursery.start_soon(self._flush, worker)
                worker.sending = True

    async def decode(self, source: ChunkSource, xorb_hash: bytes, parts: list[tuple[Slot, ChunkRun]]) -> Result:
        """Read, decode and verify adjacent runs of chunks of a xorb from ``source``, each into its slot.

        ``parts``: ``(slot, chunks)``, at least one, adjacent and in order, one read (one
        fetch of a remote store) for all.  Each must decode to at most
        ``slot_size`` bytes.  Returns, per part and chunk, its decoded size or
        its error; each part's bytes lie back to back from its slot's start.
        Raises ``WorkerLost`` if no worker could finish the job (the slots are
        still the caller's, unless ``fenced``), ``StoreTimeoutError`` if it took
        longer than ``job_timeout``.  If the caller is cancelled, the slots
        are freed once the worker is done with them.
        """
        result = await self._submit(source, xorb_hash, tuple(parts))
        self._counters.jobs += 1
        return result

    async def layout(self, path: str, xorb_hash: bytes) -> XorbLayout:
        """The checked layout of the xorb at ``path`` (``store.read_layout``, run by a worker).

        Raises what ``read_layout`` would raise, or ``WorkerLost``.
        """
        result = await self._submit(ChunkSource("", path), xorb_hash, ())  # (a file: no object name needed)
        self._counters.layout_jobs += 1
        if isinstance(result.layout, XorbLayout):
            return result.layout
        assert result.layout is not None
        raise result.layout.error()

    async def _submit(self, source: ChunkSource, xorb_hash: bytes, parts: tuple[tuple[Slot, ChunkRun], ...]) -> Result:
        """Send a ``Job`` to the least busy worker and wait for its result."""
        workers = [w for w in self._workers if w.takes_jobs]
        if not workers:
            raise WorkerLost("no decode worker is running")
        worker = min(workers, key=lambda w: len(w.pending))
        job_id = self._next_id = self._next_id + 1
        message = Job(job_id, source, xorb_hash, tuple((slot.index, run) for slot, run in parts))
        worker.pending[job_id] = pending = _Pending(tuple(slot for slot, _ in parts), trio.current_time())
        self._send(worker, encode_frame(message))
        try:
            await pending.done.wait()
        except BaseException:
            if not pending.done.is_set():
                pending.abandoned = True  # the worker may still write into the slots: freed when done
            else:
                release_all(pending.slots)  # done already: nobody else will (fenced ones stay until unfenced)
            raise
        if pending.timed_out:
            raise StoreTimeoutError(f"{message.describe()}: store read took more than {self.job_timeout:g} s "
                                    f"(decode worker {worker.number} stopped and replaced)")  # fmt: skip
        if pending.result is None:
            raise WorkerLost(f"decode worker {worker.number} exited", fenced=pending.fenced)
        return pending.result

    async def _watch(self, timeout: float) -> None:
        """Stop the worker of every job older than ``timeout`` seconds, looking a few times per timeout
        (one timer for all jobs, not one per job)."""
        while not self._closed:
            await trio.sleep(min(WATCHDOG_PERIOD, timeout / 4))
            now = trio.current_time()
            for worker in self._workers:
                oldest = next(iter(worker.pending.values()), None)  # (jobs are sent, and kept, in order)
                if worker.alive and oldest is not None and now - oldest.sent > timeout:
                    self._stop_hung(worker, now)

    def _stop_hung(self, worker: _Worker, now: float) -> None:
        """Kill a worker whose job ran out of time, and start another in its place.

        Its jobs older than the timeout fail with ``StoreTimeoutError``; the
        others go back to their callers as ``WorkerLost``.  Their slots are
        fenced: a process stuck in a read the kernel cannot interrupt may
        still write into them later.  They are given back once the process
        is seen to be gone.
        """
        log.error("decode worker %d did not answer within %g s; stopping it and starting another",
                  worker.number, self.job_timeout)  # fmt: skip
        with contextlib.suppress(OSError):
            worker.process.kill()
        for pending in worker.pending.values():
            pending.fenced = True
            pending.timed_out = now - pending.sent > (self.job_timeout or 0)
            for slot in pending.slots:
                slot.fence()
        fenced = [slot for p in worker.pending.values() for slot in p.slots]
        self._counters.hung += 1
        self._lose(worker, restart=False)  # (replaced below, whatever the count of deaths)
        if self._nursery is not None:
            self._nursery.start_soon(self._replace, worker)
            self._nursery.start_soon(self._unfence_when_gone, worker, fenced)

    async def _replace(self, worker: _Worker) -> None:
        """Start a worker in the place of ``worker``.

        In a thread: a new process closes the descriptors it inherits, and a
        descriptor of a file on a hung filesystem (the store a read hung on)
        may block that close until the filesystem answers; meanwhile the
        other workers and the daemon go on.
        """
        try:
            replacement = await trio.to_thread.run_sync(self._spawn, worker.number, abandon_on_cancel=True)
        except OSError as exc:  # no process could be started (descriptors, memory): one worker fewer
            log.error("could not start a decode worker in the place of worker %d: %s", worker.number, exc)
            return
        if self._closed:
            return  # (``close`` ended it)
        if worker.process.poll() is not None and not (worker.collecting or worker.sending):  # (no task uses its pipes)
            _end([worker], 0)  # (exited: its pipes closed now, not at ``close``, however many die)
            self._spawned.remove(worker)
        self._workers[self._workers.index(worker)] = replacement
        replacement.collecting = True
        assert self._nursery is not None
        self._nursery.start_soon(self._collect, replacement)

    async def _unfence_when_gone(self, worker: _Worker, slots: list[Slot]) -> None:
        """Give fenced slots back once the killed worker has exited (it cannot write any more)."""
        while worker.process.poll() is None:
            await trio.sleep(FENCED_POLL)
        for slot in slots:
            slot.unfence()

    def _send(self, worker: _Worker, frame: bytes) -> None:
        """Write ``frame`` to ``worker``'s input without blocking (``_Worker.write``; the rest as the pipe drains)."""
        if not worker.write(frame):
            self._lose(worker)
        elif worker.unsent and not worker.sending and self._nursery is not None:
            self._nursery.start_soon(self._flush, worker)
            worker.sending = True

    async def _flush(self, worker: _Worker) -> None:
        if not await worker.drain():
            self._lose(worker)

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
            for message in _take_frames(buffer):
                if isinstance(message, Ready):
                    log.info("decode worker %d ready", worker.number)
                    worker.ready = True
                    self._some_ready.set()
                else:
                    self._finish(worker, message)

    def _finish(self, worker: _Worker, result: Result) -> None:
        pending = worker.pending.pop(result.job_id, None)
        if pending is None:  # the worker was taken for lost (its input closed) after it sent this
            return
        pending.result = result
        if pending.abandoned:
            release_all(pending.slots)
        pending.done.set()

    def _restart(self, worker: _Worker) -> None:
        """Start a worker in the place of one that died (killed, out of memory), unless more than
        ``WORKER_RESTARTS`` died within ``WORKER_RESTARTS_WINDOW`` seconds (workers that cannot run)."""
        now = trio.current_time()
        self._deaths = [t for t in self._deaths if now - t < WORKER_RESTARTS_WINDOW] + [now]
        if self._closed or self._nursery is None:
            return
        if len(self._deaths) > WORKER_RESTARTS:
            log.error("decode worker %d is not started again: %d workers died within %g s", worker.number,
                      len(self._deaths), WORKER_RESTARTS_WINDOW)  # fmt: skip
            return
        log.info("starting decode worker %d again", worker.number)
        self._nursery.start_soon(self._replace, worker)

    def _lose(self, worker: _Worker, *, restart: bool = True) -> None:
        """``worker`` is gone (its pipes broke, or it was stopped): its jobs go back to their callers, and
        one that died on its own is started again (``_restart``)."""
        if worker.alive:
            worker.alive = False
            code = worker.process.poll()
            log.error("decode worker %d stopped (exit status %s); decoding in the daemon", worker.number, code)
            self._counters.lost += 1
            if restart:
                self._restart(worker)
        if not any(w.alive for w in self._workers):
            self._some_ready.set()  # nobody is left to wait for
        for pending in worker.pending.values():
            if pending.abandoned:
                release_all(pending.slots)  # (fenced ones stay until unfenced)
            pending.done.set()
        worker.pending.clear()
        worker.unsent.clear()

    def _spawn(self, number: int) -> _Worker:
        """Start decode worker ``number`` (``_start``), kept for ``close``; one started after ``close`` (in a
        thread ``_replace`` gave up waiting for) is ended at once."""
        worker = _start(number, self.slots, self._setup)
        self._spawned.append(worker)
        if self._closed:
            _end([worker], EXIT_GRACE)
        return worker

    def close(self, timeout: float = KILLED_WORKER_WAIT) -> None:
        """Stop the workers (closing their input ends them) and free the shared memory.

        Runs still held in slots must be let go first (``RunStore.clear``).
        """
        self._closed = True
        _end(list(self._spawned), timeout)
        self.slots.close()


def _end(workers: list[_Worker], timeout: float) -> None:
    """Close the workers' pipes (which ends them) and wait for them, killing those that linger."""
    for worker in workers:
        worker.alive = False
        for fd in (worker.jobs_fd, worker.results_fd):
            with contextlib.suppress(OSError):
                os.close(fd)
    _wait_for_exits(workers, timeout)


def _start(number: int, slots: Slots, setup: Setup) -> _Worker:
    """Start decode worker ``number`` over ``slots``, and send it ``setup`` (its first frame)."""
    shm = (str(slots.memfd), str(slots.count), str(slots.slot_size))
    argv = [sys.executable, "-m", "xetfs.read.decode_worker", *shm]
    # A process group of its own: Ctrl-C at the terminal must not reach a worker still starting up
    # (before it can ignore SIGINT); the daemon stops its workers by closing their input.
    process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, pass_fds=(slots.memfd,),
                           process_group=0)  # fmt: skip
    assert process.stdin is not None and process.stdout is not None
    # Keep raw descriptors: the results side is read by trio (non-blocking).
    jobs_fd, results_fd = os.dup(process.stdin.fileno()), os.dup(process.stdout.fileno())
    process.stdin.close()
    process.stdout.close()
    with contextlib.suppress(OSError):  # (the worker is gone already: its collector finds it lost)
        os.write(jobs_fd, encode_frame(setup))  # blocking, into an empty pipe: the worker's first frame
    os.set_blocking(results_fd, False)
    os.set_blocking(jobs_fd, False)  # a full pipe must not stop the daemon: see ``_send``
    return _Worker(number, process, jobs_fd, results_fd)


def _take_frames(buffer: bytearray) -> list[Result | Ready]:
    """The whole frames at the start of ``buffer`` (what a worker sent), taken out of it."""
    messages = []
    while len(buffer) >= FRAME.size:
        (length,) = FRAME.unpack_from(buffer)
        if len(buffer) < FRAME.size + length:
            break
        messages.append(pickle.loads(bytes(buffer[FRAME.size : FRAME.size + length])))
        del buffer[: FRAME.size + length]
    return messages


def _wait_for_exits(workers: list[_Worker], timeout: float) -> None:
    """Wait for the processes of ``workers``, whose input is closed, to exit: a moment (``EXIT_GRACE``) for
    all of them together (an idle worker exits at once), then kill the rest (still busy with jobs nobody
    needs now, or stuck in a read of a frozen store) and wait up to ``timeout`` for them; one that still
    has not exited is left, with a warning.  Stopping takes as long with several such workers as with one."""
    _wait_all(workers, min(EXIT_GRACE, timeout))
    left = [worker for worker in workers if worker.process.poll() is None]
    for worker in left:
        worker.process.kill()
    _wait_all(left, timeout)
    for worker in left:
        if worker.process.poll() is None:  # stuck in a read the kernel cannot interrupt
            log.warning("decode worker %d (pid %d) does not exit; leaving it", worker.number, worker.process.pid)


def _wait_all(workers: list[_Worker], seconds: float) -> None:
    """Wait up to ``seconds`` in all for the processes of ``workers`` to exit."""
    deadline = time.monotonic() + seconds
    for worker in workers:
        with contextlib.suppress(subprocess.TimeoutExpired):
            worker.process.wait(max(0.0, deadline - time.monotonic()))
