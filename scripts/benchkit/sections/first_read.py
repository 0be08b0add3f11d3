"""Section first-read: a read started right after `xetfs mount` returns, beside hf_xet's download of the file.

The other sections wait for xetfs' decode workers before they measure; this
one does not.  A reader process is started first and waits; `xetfs mount
STORE MNT` runs in background mode, as a user runs it, and the moment it
returns (and the mount answers) the reader is told to go.  It opens the main
file of each data kind, reads 4 KiB (the time to the first byte), then
1 MiB at a time to the end, noting when the first 100 MB (or the whole file,
if smaller) had arrived.  All times count from the go.

Beside it, hf_xet's ``download_files`` of the same file from the same store
(the call itself, as in the ``peer`` section).  CPU per GiB: the daemon and
its workers from the go on (their pid is looked up while the reader runs,
so the first milliseconds may be missed) and the reader; hf_xet's process
during the call.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchkit.data import Dataset
from benchkit.mounts import find_daemon
from benchkit.rounds import Runner, Task
from benchkit.rows import Row, busy_row, per_gib, ratio
from benchkit.sections import Section
from benchkit.sections.mount import background_mount
from benchkit.sections.sequential import peer_download, peer_output
from benchkit.util import BenchError, cat_to_null, tree_cpu

MARK = 100_000_000  # the first 100 MB

MOUNTED = Row("fr_mount", "xetfs mount returned and answered, s", "s", xetfs=True)
FIRST_BYTE = Row("fr_first_byte", "xetfs, right after mount: first 4 KiB, ms", "ms", xetfs=True)
FIRST_100 = Row("fr_first_100mb", "xetfs, right after mount: first 100 MB (or the file), s", "s", xetfs=True)
WHOLE = Row("fr_whole", "xetfs, right after mount: the whole file, GB/s", "GB/s", xetfs=True)
PEER = Row("fr_peer", "hf_xet download_files of the file, GB/s", "GB/s")
R_PEER = Row("r_fr_peer", "xetfs right after mount / hf_xet download", "x", derive=ratio(WHOLE, PEER), xetfs=True)
CPU_XETFS = Row("cpu_fr_xetfs", "CPU xetfs: daemon + workers (from the go) + reader", "s/GiB", xetfs=True)
CPU_PEER = Row("cpu_fr_peer", "CPU hf_xet download", "s/GiB")
BUSY_XETFS = busy_row("fr_xetfs", "xetfs, right after mount (daemon + workers + reader)", WHOLE, (CPU_XETFS,))
BUSY_PEER = busy_row("fr_peer", "hf_xet download", PEER, (CPU_PEER,))

ROWS = (MOUNTED, FIRST_BYTE, FIRST_100, WHOLE, PEER, R_PEER, CPU_XETFS, CPU_PEER, BUSY_XETFS, BUSY_PEER)

SECTIONS = (
    Section(
        "first-read",
        "A read started right after `xetfs mount` returns (decode workers not waited for), beside hf_xet",
        lambda r: ROWS,
        lambda r: tuple(r.args.kinds),
    ),
)

READER = r"""
import json, os, resource, sys, time
mark = int(sys.argv[1])
print("ready", flush=True)
path = sys.stdin.readline().rstrip("\n")  # the go
clock = time.perf_counter
r0 = resource.getrusage(resource.RUSAGE_SELF)
t0 = clock()
fd = os.open(path, os.O_RDONLY)
total = len(os.read(fd, 4096))
first = clock() - t0
at_mark = None
buf = bytearray(1 << 20)
while True:
    if at_mark is None and total >= mark:
        at_mark = clock() - t0
    n = os.readv(fd, [buf])
    if not n:
        break
    total += n
end = clock() - t0
os.close(fd)
r1 = resource.getrusage(resource.RUSAGE_SELF)
cpu = r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime
print(json.dumps({"first": first, "mark": end if at_mark is None else at_mark, "seconds": end, "bytes": total,
                  "cpu": cpu}))
"""


def columns(args: Any, selected: set[str]) -> list[str]:
    return list(args.kinds) if "first-read" in selected else []


def tasks(r: Runner, selected: set[str]) -> list[Task]:
    if "first-read" not in selected:
        return []
    out = []
    for kind in r.args.kinds:
        ds = r.data[kind]
        out.append(Task("first-read-peer", kind, "", _bind(t_peer, r, ds, "")))
        out += [Task("first-read", kind, v.name, _bind(t_xetfs, r, ds, v.name)) for v in r.variants]
    return out


def _bind(fn: Any, r: Runner, ds: Dataset, variant: str) -> Any:
    return lambda rnd: fn(r, ds, rnd, variant)


def t_xetfs(r: Runner, ds: Dataset, rnd: int, variant: str) -> None:
    cat_to_null(ds.xorbs)
    timeout = r.timeout_for(ds.main.size)
    with r.primed(now=False) as go:
        reader = subprocess.Popen(
            [sys.executable, "-c", READER, str(MARK)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            if reader.stdout is None or reader.stdout.readline().strip() != "ready":
                raise BenchError(f"the first-read reader did not start: {reader.stderr and reader.stderr.read()}")
            with background_mount(r, ds.store, variant) as (mnt, mounted):
                go()
                out, err, used = _go(reader, mnt, ds.main.hash, timeout)
        finally:
            if reader.poll() is None:
                reader.kill()
                reader.wait()
    if reader.returncode != 0:
        raise BenchError(f"the first-read reader failed ({reader.returncode}): {err[-500:]}")
    res = json.loads(out.strip().splitlines()[-1])
    if res["bytes"] != ds.main.size:
        raise BenchError(f"the first-read reader got {res['bytes']} bytes of {ds.main.hash}, not {ds.main.size}")
    r.r.add(MOUNTED, ds.kind, rnd, mounted, variant)
    r.r.add(FIRST_BYTE, ds.kind, rnd, res["first"] * 1000, variant)
    r.r.add(FIRST_100, ds.kind, rnd, res["mark"], variant)
    r.r.add(WHOLE, ds.kind, rnd, ds.main.size / res["seconds"] / 1e9, variant)
    if used is not None:
        r.r.add(CPU_XETFS, ds.kind, rnd, per_gib(ds.main.size, used + res["cpu"]), variant)


def _go(reader: subprocess.Popen[str], mnt: Path, name: str, timeout: float) -> tuple[str, str, float | None]:
    """Tell the waiting reader to read ``mnt/name``, now: its output, and the CPU seconds the daemon and its
    workers used from then until the reader ended (None if the daemon was not found)."""
    if reader.stdin is None:
        raise BenchError("the first-read reader has no stdin")
    reader.stdin.write(f"{mnt / name}\n")  # the path is the go: the reader started before the mount existed
    reader.stdin.flush()
    pid = find_daemon(mnt)  # while the reader reads: a /proc scan before the go would delay it
    before = sum(tree_cpu(pid)) if pid else 0.0
    try:
        out, err = reader.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise BenchError(f"reading {name} right after mounting took more than {timeout:.0f} s") from None
    return out, err, sum(tree_cpu(pid)) - before if pid else None


def t_peer(r: Runner, ds: Dataset, rnd: int, _v: str) -> None:
    with peer_output(r, ds) as (work, out), r.primed():
        res = peer_download(r, ds, work, out)
    r.r.add(PEER, ds.kind, rnd, ds.main.size / res["seconds"] / 1e9)
    r.r.add(CPU_PEER, ds.kind, rnd, per_gib(ds.main.size, res["cpu"]))
