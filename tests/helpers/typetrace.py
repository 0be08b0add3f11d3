"""The project's types a cold read meets, found by tracing one (``python -m helpers.typetrace STORE FILE_HASH``).

Run in a process of its own, so that every thread it starts is traced from
its first call.  It assembles a filesystem over STORE as a mount does
(``build_fs``, with two decode workers), waits for the workers, and reads the
file from its start to its end in 128 KiB requests, as the kernel does
through ``XetFS.read``.  Meanwhile a profile hook notes every type of the
project whose code runs (a method, or a dataclass's or named tuple's
constructor) or whose value is passed to or returned by the project's code.
The jobs the daemon sent are then run again by a decode worker in this
process, traced the same way (a worker's own types).  Exceptions are left
out.  Printed: one dotted name per line, ``module.Type`` below ``xetfs``,
prefixed with ``daemon`` or ``worker``.

Options: ``--cache-dir DIR`` for a remote store (a URL), whose disk cache is
then on.
"""

from __future__ import annotations

import argparse
import inspect
import os
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import trio

from xetfs.base import hashes
from xetfs.base.settings import SLOT_SIZE
from xetfs.fuse.launch import MountConfig
from xetfs.fuse.mount import build_fs
from xetfs.names.tree import BY_HASH_INODE
from xetfs.read import decode_worker
from xetfs.read import pool as pool_module

BLOCK = 128 * 1024
VARARGS, VARKW = inspect.CO_VARARGS, inspect.CO_VARKEYWORDS


class Trace:
    """The project's types seen by a profile hook while ``on``."""

    def __init__(self) -> None:
        self.on = False
        self.seen: set[type] = set()

    def note(self, value: Any) -> None:
        kind = value if isinstance(value, type) else type(value)
        module = getattr(kind, "__module__", "") or ""
        if module.startswith("xetfs.") and not issubclass(kind, BaseException):
            self.seen.add(kind)

    def hook(self, frame: FrameType, event: str, arg: Any) -> None:
        if not self.on or event not in ("call", "return"):
            return
        name = frame.f_globals.get("__name__", "")
        if not (name.startswith("xetfs.") or name.startswith("namedtuple_")):
            return
        if event == "return":
            self.note(arg)
            return
        code = frame.f_code  # its arguments, ``self`` and ``cls`` included (a coroutine resumed: the same)
        count = code.co_argcount + code.co_kwonlyargcount + bool(code.co_flags & VARARGS) + bool(code.co_flags & VARKW)
        local = frame.f_locals
        for name in code.co_varnames[:count]:
            self.note(local.get(name))

    def names(self) -> list[str]:
        return sorted(f"{kind.__module__.removeprefix('xetfs.')}.{kind.__qualname__}" for kind in self.seen)


async def read_whole(fs: Any, file_hash: bytes) -> int:
    attrs = await fs.lookup(BY_HASH_INODE, hashes.to_hex(file_hash).encode())
    handle = await fs.open(attrs.st_ino, os.O_RDONLY, None)
    size, at = attrs.st_size, 0
    trace.on = True
    while at < size:
        data = await fs.read(handle.fh, at, min(BLOCK, size - at))
        if not data:
            break
        at += len(data)
        await trio.sleep(0)  # (as between the kernel's requests: prefetch tasks run)
    trace.on = False
    await fs.release(handle.fh)
    return at


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("store")
    parser.add_argument("file_hash")
    parser.add_argument("--cache-dir", type=Path)
    args = parser.parse_args()
    jobs: list[decode_worker.Job] = []
    encode = decode_worker.encode_frame

    def keeping_jobs(message: Any) -> bytes:
        if isinstance(message, decode_worker.Job):
            jobs.append(message)
        return encode(message)

    pool_module.encode_frame = keeping_jobs  # type: ignore[attr-defined]
    config = MountConfig(store=args.store, mountpoint=Path("/nonexistent"), workers=2, cache_dir=args.cache_dir)
    fs = build_fs(config)
    file_hash = hashes.from_hex(args.file_hash)

    async def run() -> int:
        async with trio.open_nursery() as nursery:
            fs.reader.start(nursery)
            fs.start_background(nursery)
            await fs.reader.wait_for_workers()
            workers = fs.reader._loader._pool._workers  # type: ignore[union-attr]  # (all of them: none says
            with trio.fail_after(30):  # it is ready during the read)
                while not all(w.ready for w in workers):
                    await trio.sleep(0.01)
            got = await read_whole(fs, file_hash)
            nursery.cancel_scope.cancel()
        return got

    try:
        got = trio.run(run)
    finally:
        fs.reader.close()
    daemon = trace.names()
    trace.seen.clear()
    slot_size = SLOT_SIZE
    store = fs.reader.store
    setup = decode_worker.Setup(store.source.worker_setup(), str(store.chunks.tmp) if store.chunks else None)
    worker = decode_worker.Worker(memoryview(bytearray(slot_size * 16)), slot_size, setup)
    trace.on = True
    for job in jobs:  # (as ``decode_worker.serve`` does, into slots of its own)
        job = job._replace(parts=tuple((i % 16, run) for i, (_, run) in enumerate(job.parts)))
        if not job.parts:
            worker.load_layout(job)
        else:
            worker.decode(job, worker.fetch(job) if job.source.path is None else None)
    trace.on = False
    print(f"read {got}", file=sys.stderr)
    for name in daemon:
        print("daemon", name)
    for name in trace.names():
        print("worker", name)


trace = Trace()
threading.setprofile(trace.hook)
sys.setprofile(trace.hook)

if __name__ == "__main__":
    main()
