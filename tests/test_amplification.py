"""Decode amplification and memory through real mounts, with the kernel page cache on.

Amplification is chunks decoded (``decode.chunks`` in ``.xetfs/stats``) divided
by the distinct chunks the workload read (from the store itself, through
``oracle.file_chunks``).  While the file fits in the cache it must stay at
most 1.05 for each way files are really read: one sequential reader, 4 KiB
random reads, 2 and 4 concurrent readers of one file, two files that share
chunks read one after the other, and a safetensors ``safe_open`` load.
Memory: the daemon and its workers together (proportional set size, which
counts the shared memory they both map once) stay within ``--cache-size``
plus 100 MiB.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from helpers import oracle
from helpers.amplification import MOST, chunk_set, decoded, settled
from helpers.mounting import Mount, mounted
from helpers.oracle import OracleStore, run_xetfs
from safetensors import safe_open
from safetensors.numpy import save

pytestmark = pytest.mark.fuse

MiB = 1024 * 1024
RSS_OVERHEAD = 100 * MiB


def sha256_of(path: Path, block: int = MiB, start: int = 0, length: int | None = None) -> str:
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        f.seek(start)
        left = length if length is not None else 1 << 62
        while left and (data := f.read(min(block, left))):
            h.update(data)
            left -= len(data)
    return h.hexdigest()


def test_one_sequential_reader(big_store: OracleStore) -> None:
    f = big_store["big.bin"]
    with mounted(big_store.path) as m:
        m.wait_for_workers()
        assert sha256_of(m / f.hash) == f.sha256
        distinct = len(chunk_set(big_store, "big.bin"))
        assert distinct <= decoded(m) <= MOST * distinct


def test_random_4k_reads(big_store: OracleStore) -> None:
    """As fio's randread does (it advises POSIX_FADV_RANDOM), so the kernel asks for just the 4 KiB."""
    f = big_store["big.bin"]
    data = f.read()
    rng = random.Random(5)
    reads = [(rng.randrange(f.size // 4096) * 4096, 4096) for _ in range(3000)]
    with mounted(big_store.path) as m:
        m.wait_for_workers()
        fd = os.open(m / f.hash, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
            for off, n in reads:
                assert os.pread(fd, n, off) == data[off : off + n], off
        finally:
            os.close(fd)
        s = settled(m)
        distinct = len(chunk_set(big_store, "big.bin", reads))
        assert distinct <= s["decode"]["chunks"] <= MOST * distinct
        assert s["prefetch"]["requests"] <= 3  # only where a random read happened to follow the one before


def test_a_small_block_sequential_reader_gets_prefetch(big_store: OracleStore) -> None:
    """4 KiB reads with --direct-io: most land in the chunk the read before loaded, and still make a stream."""
    f = big_store["big.bin"]
    data = f.read()[: 8 * MiB]
    with mounted(big_store.path, "--direct-io") as m:
        m.wait_for_workers()
        fd = os.open(m / f.hash, os.O_RDONLY)
        try:
            for off in range(0, len(data), 4096):
                assert os.pread(fd, 4096, off) == data[off : off + 4096], off
        finally:
            os.close(fd)
        s = settled(m)
        assert s["prefetch"]["requests"] > 0 and s["prefetch"]["hits"] > 0, s["prefetch"]


@pytest.mark.parametrize("readers", [2, 4])
def test_concurrent_readers_of_one_file(big_store: OracleStore, readers: int) -> None:
    f = big_store["big.bin"]
    with mounted(big_store.path) as m:
        m.wait_for_workers()
        barrier = threading.Barrier(readers)

        def one(_: int) -> str:
            barrier.wait(timeout=30)
            return sha256_of(m / f.hash)

        with ThreadPoolExecutor(readers) as pool:
            assert set(pool.map(one, range(readers))) == {f.sha256}
        distinct = len(chunk_set(big_store, "big.bin"))
        assert distinct <= decoded(m) <= MOST * distinct


@pytest.mark.parametrize(("fixture", "names"), [("multi_store", ["a.bin", "b.bin", "d.bin"])])
def test_files_sharing_chunks_read_one_after_the_other(
    fixture: str, names: list[str], request: pytest.FixtureRequest
) -> None:
    store: OracleStore = request.getfixturevalue(fixture)
    wanted: set[tuple[str, int]] = set()
    for name in names:
        wanted |= chunk_set(store, name)
    total = sum(len(chunk_set(store, name)) for name in names)
    assert total > 1.3 * len(wanted)  # a real test: much of each later file is shared
    with mounted(store.path) as m:
        m.wait_for_workers()
        for name in names:
            assert sha256_of(m / store[name].hash) == store[name].sha256
        assert len(wanted) <= decoded(m) <= MOST * len(wanted)


@pytest.fixture(scope="module")
def model_store(tmp_path_factory: pytest.TempPathFactory) -> tuple[OracleStore, dict[str, np.ndarray]]:
    """A 60 MB safetensors file of 48 float32 tensors of mixed sizes, in an hf_xet store."""
    rng = np.random.default_rng(3)
    tensors = {}
    for i in range(48):
        rows = int(rng.integers(16, 640))
        tensors[f"layer.{i:02d}.{'weight' if i % 2 else 'bias'}"] = rng.standard_normal((rows, 512), dtype=np.float32)
    store = oracle.make_store(tmp_path_factory.mktemp("model"), {"model.safetensors": save(tensors)})
    return store, tensors


def test_safetensors_load(model_store: tuple[OracleStore, dict[str, np.ndarray]]) -> None:
    store, tensors = model_store
    f = store["model.safetensors"]
    with mounted(store.path) as m:
        m.wait_for_workers()
        with safe_open(str(m / f.hash), framework="numpy") as loaded:
            names = list(loaded.keys())
            assert sorted(names) == sorted(tensors)
            for name in names:
                assert np.array_equal(loaded.get_tensor(name), tensors[name]), name
        distinct = len(chunk_set(store, "model.safetensors"))
        assert distinct <= decoded(m) <= MOST * distinct


# -- memory ---------------------------------------------------------------------------


def _pss(pid: int) -> int:
    """Proportional set size of a process, in bytes (shared pages split among the processes mapping them)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0


def _group(pid: int) -> list[int]:
    """The daemon and its decode workers."""
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except FileNotFoundError:
        children = []
    return [pid, *(int(c) for c in children)]


@contextmanager
def peak_memory(m: Mount) -> Iterator[list[int]]:
    """The largest sum of the group's PSS seen while the block runs (sampled every 20 ms)."""
    peak = [0]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.02):
            peak[0] = max(peak[0], sum(_pss(p) for p in _group(m.proc.pid)))

    thread = threading.Thread(target=sample)
    thread.start()
    try:
        yield peak
    finally:
        stop.set()
        thread.join()


def test_memory_stays_within_the_cache_size(big_store: OracleStore) -> None:
    """A 144 MB file through a 64 MiB cache: four concurrent readers, then random reads, then one
    sequential reader; the daemon and workers stay within the cache plus a fixed overhead."""
    f = big_store["big.bin"]
    data = f.read()
    cache = 64 * MiB
    with mounted(big_store.path, "--cache-size", "64M") as m:
        m.wait_for_workers()
        with peak_memory(m) as peak:
            with ThreadPoolExecutor(4) as pool:
                assert set(pool.map(lambda _: sha256_of(m / f.hash), range(4))) == {f.sha256}
            rng = random.Random(9)
            fd = os.open(m / f.hash, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
                for _ in range(2000):
                    off = rng.randrange(f.size - 65536)
                    assert os.pread(fd, 65536, off) == data[off : off + 65536]
            finally:
                os.close(fd)
        s = settled(m)
        assert s["cache"]["bytes"] <= cache
        assert 0 < peak[0] <= cache + RSS_OVERHEAD, f"daemon + workers: {peak[0] / MiB:.0f} MiB"


def test_stats_of_one_file_show_its_own_amplification(multi_store: OracleStore) -> None:
    """``xetfs stats MNT FILE``: a file's chunks (the oracle's count) and what its own reads decoded.

    b.bin shares most of its chunks with a.bin: read after it, b.bin decodes only the chunks a.bin lacks,
    and each chunk is counted for the file whose read decoded it, so the two add up to ``decode``.
    """
    a, b = multi_store["a.bin"], multi_store["b.bin"]
    chunks_a, chunks_b = chunk_set(multi_store, "a.bin"), chunk_set(multi_store, "b.bin")
    assert len(chunks_b - chunks_a) < len(chunks_b) / 2  # a real test: most of b.bin is in a.bin

    def file_stats(m: Mount, name: str, *more: str) -> subprocess.CompletedProcess[bytes]:
        return run_xetfs("stats", m.path, multi_store[name].hash, *more)

    with mounted(multi_store.path) as m:
        m.wait_for_workers()
        before = json.loads(file_stats(m, "a.bin", "--json").stdout)
        assert before == {"hash": a.hash, "size": a.size, "chunks": len(chunks_a), "decoded_chunks": 0,
                          "decoded_bytes": 0, "bytes_amplification": 0.0, "chunks_amplification": 0.0}  # fmt: skip
        assert sha256_of(m / a.hash) == a.sha256
        assert sha256_of(m / b.hash) == b.sha256
        s = settled(m)
        got = {name: json.loads(file_stats(m, name, "--json").stdout) for name in ("a.bin", "b.bin")}
        text = file_stats(m, "b.bin").stdout.decode()
        # FILE as a shell completes it: from the working directory, under the mount point
        here = subprocess.run([sys.executable, "-m", "xetfs", "stats", m.path.name, f"{m.path.name}/{b.hash}",
                               "--json"], cwd=m.path.parent, capture_output=True, check=False)  # fmt: skip
        assert here.returncode == 0 and json.loads(here.stdout) == got["b.bin"], here.stderr
    one, two = got["a.bin"], got["b.bin"]
    assert (one["chunks"], two["chunks"]) == (len(chunks_a), len(chunks_b))
    assert one["decoded_chunks"] + two["decoded_chunks"] == s["decode"]["chunks"]
    assert one["decoded_bytes"] + two["decoded_bytes"] == s["decode"]["bytes"]
    assert len(chunks_a) <= one["decoded_chunks"] <= MOST * len(chunks_a)
    assert one["decoded_bytes"] >= a.size and one["bytes_amplification"] == round(one["decoded_bytes"] / a.size, 4)
    assert len(chunks_b - chunks_a) <= two["decoded_chunks"] < len(chunks_b) / 2
    assert two["chunks_amplification"] == round(two["decoded_chunks"] / len(chunks_b), 4) < 0.5
    assert f"{two['bytes_amplification']:.2f}x of its bytes, {two['chunks_amplification']:.2f}x of its chunks" in text
    assert f"{two['decoded_chunks']} chunk" in text and f"{len(chunks_b)} chunks" in text
    assert "chunks this file shares with files read before it" in text


def test_stats_of_a_file_refuse_what_is_not_one(basic_store: OracleStore, tmp_path: Path) -> None:
    with mounted(basic_store.path) as m:
        for args, message in [
            ((m.path, "no-such-file"), "no such file"),
            ((m.path, m.path / ".xetfs"), "not a file of the xetfs mount"),
            ((m.path, m.path / ".xetfs" / "stats"), "not a file of the store"),
            ((tmp_path, "x"), "not a xetfs mount"),
        ]:
            proc = run_xetfs("stats", *args)
            assert proc.returncode == 1 and message in proc.stderr.decode(), (args, proc.stderr)
