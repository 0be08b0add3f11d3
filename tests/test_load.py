"""Load on real mounts: many concurrent readers, and a store of 100,000 files.

* Sixteen readers (eight threads of this process, eight child processes) read
  every file of an hf_xet store at once, each in its own order, sequentially
  and with random ``pread``s; every byte is checked (SHA-256 of each whole
  file, and each random slice against the original file).  An overall
  deadline turns a deadlock into a loud failure (with the daemon's Python
  stacks, from py-spy when it is installed).
* A writer-built store of 100,000 small files (many files per xorb, named in
  100 directories by a manifest): ``find`` sees every name, a sample of the
  files reads back exactly, and the daemon's resident memory stays flat while
  they are read.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from helpers.mounting import Mount, mounted
from helpers.oracle import OracleStore
from helpers.writer import StoreBuilder

from xetfs.base import hashes
from xetfs.storage.manifest import ManifestFile, dump_manifest

pytestmark = pytest.mark.fuse

MiB = 1024 * 1024
DEADLINE = 120.0  # seconds for all sixteen readers together
THREADS = 8
PROCESSES = 8
TESTS = Path(__file__).resolve().parent

# -- the reader (run by threads here and by child processes) ------------------------------

FileJob = tuple[str, str, int, str]  # name in the mount, original path, size, sha256


def read_all(mnt: str, files: list[FileJob], seed: int) -> dict[str, Any]:
    """Read every file under ``mnt`` whole (random block sizes) and at random offsets; report any difference."""
    rng = random.Random(seed)
    order = list(files)
    rng.shuffle(order)
    problems: list[str] = []
    reads = nbytes = 0
    for name, original, size, sha256 in order:
        path = os.path.join(mnt, name)
        try:
            h = hashlib.sha256()
            with open(path, "rb", buffering=0) as f:
                while block := f.read(rng.choice((4096, 65536, 131_089, MiB))):
                    h.update(block)
                    reads += 1
                    nbytes += len(block)
            if h.hexdigest() != sha256:
                problems.append(f"{name}: sha256 {h.hexdigest()} != {sha256}")
            fd = os.open(path, os.O_RDONLY)
            ofd = os.open(original, os.O_RDONLY)
            try:
                for _ in range(8):
                    off = rng.randrange(size + 2)
                    n = rng.choice((1, 100, 4096, 70_000, 300_000))
                    got, want = os.pread(fd, n, off), os.pread(ofd, n, off)
                    reads += 1
                    nbytes += len(got)
                    if got != want:
                        problems.append(f"{name}: WRONG BYTES from pread({n}, {off}): {len(got)} vs {len(want)} bytes")
            finally:
                os.close(fd)
                os.close(ofd)
        except OSError as exc:
            problems.append(f"{name}: {exc!r}")
    return {"problems": problems, "reads": reads, "bytes": nbytes}


CHILD = (
    "import json, sys\n"
    f"sys.path.insert(0, {str(TESTS)!r})\n"
    "from test_load import read_all\n"
    "json.dump(read_all(**json.loads(sys.argv[1])), sys.stdout)\n"
)


def daemon_stacks(pid: int) -> str:
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not os.path.exists(spy):
        return "(py-spy not installed)"
    proc = subprocess.run([spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=30, check=False)
    return proc.stdout + proc.stderr


@dataclass
class Readers:
    """Sixteen readers in flight: thread futures and child processes."""

    threads: list[Future[dict[str, Any]]]
    procs: list[subprocess.Popen[str]]

    def done(self) -> bool:
        return all(f.done() for f in self.threads) and all(p.poll() is not None for p in self.procs)


def run_readers(m: Mount, files: list[FileJob]) -> list[dict[str, Any]]:
    """Start 8 threads and 8 processes on ``files``; wait for all of them within ``DEADLINE``."""
    job = {"mnt": str(m.path), "files": files}
    pool = ThreadPoolExecutor(THREADS)
    procs: list[subprocess.Popen[str]] = []
    try:
        futures = [pool.submit(read_all, str(m.path), files, seed) for seed in range(THREADS)]
        for seed in range(THREADS, THREADS + PROCESSES):
            p = subprocess.Popen(
                [sys.executable, "-c", CHILD, json.dumps({**job, "seed": seed})],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            procs.append(p)
        readers = Readers(futures, procs)
        end = time.monotonic() + DEADLINE
        while not readers.done():
            if m.proc.poll() is not None:
                raise AssertionError(f"the daemon died under load:\n{m.log()}")
            if time.monotonic() > end:
                raise AssertionError(
                    f"DEADLOCK? 16 readers not done after {DEADLINE} s; daemon stacks:\n{daemon_stacks(m.proc.pid)}"
                )
            time.sleep(0.05)
        results = [f.result() for f in futures]
        for p in procs:
            out, err = p.communicate()
            assert p.returncode == 0, err
            results.append(json.loads(out))
        return results
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            if p.stdout is not None and not p.stdout.closed:
                p.communicate()
        pool.shutdown(wait=False, cancel_futures=True)


@pytest.mark.parametrize(
    "options",
    [["--direct-io", "--cache-size", "2M"], []],
    ids=["direct-io-small-cache", "page-cache"],
)
def test_sixteen_concurrent_readers(basic_store: OracleStore, options: list[str]) -> None:
    files: list[FileJob] = [(f.hash, str(f.path), f.size, f.sha256) for f in basic_store.unique()]
    with mounted(basic_store.path, *options) as m:
        results = run_readers(m, files)
        problems = [p for r in results for p in r["problems"]]
        assert not problems, problems[:20]
        total = sum(f[2] for f in files)
        assert all(r["bytes"] >= total for r in results)  # every reader read every file at least once
        stats = m.stats()
        assert stats["errors"] == {"integrity": 0, "missing": 0, "format": 0, "timeout": 0, "io": 0}
        if "--direct-io" in options:
            assert stats["cache"]["evictions"] > 0  # the small cache really churned
            assert stats["reads"]["requests"] >= 16 * len(files)


# -- 100,000 files -------------------------------------------------------------------------

N_FILES = 100_000
N_DIRS = 100


def content(i: int) -> bytes:
    return b"file %d\n" % i * (1 + i % 7)


def name_of(i: int) -> str:
    return f"d{i % N_DIRS:02d}/f{i:06d}.txt"


@dataclass(frozen=True)
class ManyFiles:
    path: Path
    hashes: list[bytes]  # file hash of file i


@pytest.fixture(scope="module")
def many_files(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManyFiles]:
    root = tmp_path_factory.mktemp("many") / "store"
    b = StoreBuilder(root)  # up to 8192 chunks per xorb: about 13 xorbs
    file_hashes = [b.add_file(content(i)) for i in range(N_FILES)]
    b.finish()
    entries = [ManifestFile(tuple(name_of(i).split("/")), h, None, None) for i, h in enumerate(file_hashes)]
    (root / "xetfs-manifest.json").write_bytes(dump_manifest(entries))
    yield ManyFiles(root, file_hashes)
    shutil.rmtree(root, ignore_errors=True)


def vm_rss(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_hundred_thousand_files(many_files: ManyFiles) -> None:
    with mounted(many_files.path, "--cache-size", "64M") as m:
        index = m.stats()["index"]
        assert index["files"] == N_FILES and index["shards_skipped"] == 0, index

        proc = subprocess.run(
            f"find '{m.path}' -type f | wc -l", shell=True, capture_output=True, text=True, timeout=120, check=True
        )
        # Every file by its name: the hidden .xetfs is not listed.
        assert int(proc.stdout) == N_FILES, proc.stdout
        proc = subprocess.run(
            ["find", str(m.path), "-type", "d"], capture_output=True, text=True, timeout=120, check=True
        )
        assert len(proc.stdout.splitlines()) == 1 + N_DIRS  # root, d00..d99
        assert len(os.listdir(m / "d07")) == N_FILES // N_DIRS
        after_find = vm_rss(m.proc.pid)

        rng = random.Random(9)
        for i in rng.sample(range(N_FILES), 3000):
            assert (m / name_of(i)).read_bytes() == content(i), name_of(i)
        for i in rng.sample(range(N_FILES), 1000):
            assert (m / ".xetfs" / "by-hash" / hashes.to_hex(many_files.hashes[i])).read_bytes() == content(i)
        for i in rng.sample(range(N_FILES), 200):
            sha = hashlib.sha256(content(i)).hexdigest()
            assert (m / ".xetfs" / "by-sha256" / sha).read_bytes() == content(i)
        after_reads = vm_rss(m.proc.pid)
        growth = after_reads - after_find
        assert growth < 50 * MiB, f"daemon RSS grew by {growth / MiB:.1f} MiB while reading 4200 files"
        assert m.stats()["errors"] == {"integrity": 0, "missing": 0, "format": 0, "timeout": 0, "io": 0}
