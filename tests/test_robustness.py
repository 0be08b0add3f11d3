"""Robustness on real mounts: damaged and missing objects, stalled stores, signals, life cycle.

Damage.  Every test works on a copy of an hf_xet store (``oracle.copy_store``)
or on a store built with the test writer, damages it, mounts it for real and
checks three things: the damage is contained (only reads that need the
damaged bytes fail, with ``EIO``; a bad shard is skipped with one warning, or
refused with ``--strict``), it is reported (one log line per failed read
naming the file, the xorb and the chunk; the ``errors`` / ``index`` counters
of ``.xetfs/stats``), and no read ever returns a wrong byte (every read that
succeeds is compared with the original file).  Which byte ranges a damage
touches is worked out with ``oracle``'s own parser, not with xetfs.  Reads
use ``--direct-io`` and 64 KiB ``pread``s, so one ``pread`` is one FUSE read
request (no kernel readahead, no retries): the number of failed ``pread``s is
the number of errors the daemon must count and log.  A bad xorb may not make
the daemon allocate its (claimed) size.

Stalled stores.  An inner store is served from inside an outer xetfs mount
(the inner store's files packed into the outer store with ``xetfs pack``);
freezing the outer daemon with SIGSTOP makes every store read of the inner
daemon hang, which ``--io-timeout`` must turn into ``EIO`` in time.

Life cycle.  Signals during heavy parallel reads, ``umount --force`` of a
stopped daemon (``kill -9``, refusals of busy or non-empty mount points and a
single long read under a signal are in test_mount_lifecycle.py).

The fuzz tests at the end run ``scripts/fuzz.py`` for a few seconds, and
check that it would notice a bug.
"""

from __future__ import annotations

import contextlib
import errno
import importlib.util
import json
import os
import random
import shutil
import signal
import struct
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
from helpers import oracle, writer
from helpers.damage import (
    BLOCK,
    all_locs,
    check_contained,
    check_error_log,
    errors_of,
    log_lines,
    read_blocks,
    sole_xorb,
)
from helpers.mounting import Mount, force_unmount, is_mounted, memory, mounted, wait_until
from helpers.oracle import OracleStore, run_xetfs
from helpers.writer import StoreBuilder

from xetfs.base import hashes
from xetfs.base.errors import XorbFormatError
from xetfs.format.xorb import parse_footer

T = TypeVar("T")
fuse = pytest.mark.fuse

MiB = 1024 * 1024
REPO = Path(__file__).resolve().parent.parent


# -- helpers ------------------------------------------------------------------------------


@pytest.fixture
def store(multi_store: OracleStore, tmp_path: Path) -> OracleStore:
    """A private copy of the multi store (one upload call per file) to damage."""
    return oracle.copy_store(multi_store, tmp_path / "store")


def writable(path: Path) -> None:
    path.chmod(path.stat().st_mode | 0o200)


def call_with_deadline(fn: Callable[[], T], seconds: float, what: str) -> tuple[T, float]:
    """Run ``fn`` in a helper thread; fail (without waiting for it) when it takes longer than ``seconds``.

    Returns the result and the time it took.
    """
    box: dict[str, Any] = {}

    def run() -> None:
        start = time.monotonic()
        try:
            box["value"] = fn()
        except BaseException as exc:
            box["error"] = exc
        box["elapsed"] = time.monotonic() - start

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise AssertionError(f"{what}: still blocked after {seconds} s")
    if "error" in box:
        raise box["error"]
    return box["value"], box["elapsed"]


# -- shards damaged before the mount -----------------------------------------------------


def _bookends(data: bytes) -> list[int]:
    """Offsets of the two bookend records (file info, CAS info) of a valid shard."""
    found = [pos for pos in range(48, len(data) - 47, 48) if data[pos : pos + 32] == b"\xff" * 32]
    return found[:2]


def _put(path: Path, offset: int, value: bytes) -> None:
    writable(path)
    data = bytearray(path.read_bytes())
    data[offset : offset + len(value)] = value
    path.write_bytes(bytes(data))


def bad_magic(path: Path) -> None:
    oracle.flip_byte(path, 3)


def unknown_version(path: Path) -> None:
    _put(path, 32, struct.pack("<Q", 3))


def truncated_record(path: Path) -> None:
    file_bookend, _ = _bookends(path.read_bytes())
    oracle.truncate(path, file_bookend - 20)  # in the middle of the last file info record


def missing_bookend(path: Path) -> None:
    """No footer (footer_size 0) and the file ends before the CAS bookend."""
    data = path.read_bytes()
    _, cas_bookend = _bookends(data)
    writable(path)
    path.write_bytes(data[:40] + struct.pack("<Q", 0) + data[48:cas_bookend])


def future_footer_version(path: Path) -> None:
    _put(path, path.stat().st_size - 200, struct.pack("<Q", 2))


def flipped_term_hash(path: Path) -> None:
    """A bit of the first term's xorb hash (after the 48-byte header and the first file's 48-byte record header,
    docs/format.md section 3): the shard still parses, and only its name tells."""
    oracle.flip_byte(path, 48 + 48 + 5)


SHARD_DAMAGE = [bad_magic, unknown_version, truncated_record, missing_bookend, future_footer_version,
                flipped_term_hash]  # fmt: skip
# What the warning must say besides the shard's name.
REASON: dict[Callable[[Path], None], str] = {
    bad_magic: "magic",
    unknown_version: "version 3",
    truncated_record: "",
    missing_bookend: "truncated CAS record",
    future_footer_version: "footer version 2",
    flipped_term_hash: "not to its name",
}


@fuse
@pytest.mark.parametrize("damage", SHARD_DAMAGE, ids=lambda d: d.__name__)
def test_bad_shard_is_skipped_with_one_warning(store: OracleStore, damage: Callable[[Path], None]) -> None:
    victim = store["c.txt"]
    (shard,) = oracle.shard_of(store, victim.hash)
    damage(shard)
    others = [f for f in store.unique() if f.hash != victim.hash]
    with mounted(store.path) as m:  # a warning, no error
        warnings = log_lines(m, "WARNING")
        assert len(warnings) == 1 and shard.name in warnings[0], warnings
        assert REASON[damage] in warnings[0], warnings
        index = m.stats()["index"]
        assert index["shards_skipped"] == 1, index
        assert index["shards"] == len(store.shard_paths()) - 1, index
        assert index["files"] == len(others), index
        assert set(os.listdir(m.path)) == {f.hash for f in others}
        with pytest.raises(FileNotFoundError):
            os.stat(m / victim.hash)
        for f in others:  # d.bin reads c.txt's xorb, which only the damaged shard lists
            assert (m / f.hash).read_bytes() == f.read(), f.name
        assert m.stats()["errors"] == {"integrity": 0, "missing": 0, "format": 0, "timeout": 0, "io": 0}


@fuse
@pytest.mark.parametrize("damage", SHARD_DAMAGE, ids=lambda d: d.__name__)
def test_strict_refuses_a_bad_shard(store: OracleStore, tmp_path: Path, damage: Callable[[Path], None]) -> None:
    (shard,) = oracle.shard_of(store, store["c.txt"].hash)
    damage(shard)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    try:
        proc = run_xetfs("mount", "--strict", store.path, mnt, "--log-file", tmp_path / "daemon.log", timeout=60)
        err = proc.stderr.decode()
        assert proc.returncode == 1, err
        lines = err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("xetfs: error: "), lines
        assert shard.name in lines[0], lines
        assert "Traceback" not in err
        assert not is_mounted(mnt)
    finally:
        if is_mounted(mnt):
            force_unmount(mnt)


# -- xorbs damaged or missing ------------------------------------------------------------


@fuse
@pytest.mark.parametrize("when", ["before-mount", "while-mounted"])
def test_missing_xorb(store: OracleStore, when: str) -> None:
    xorb = sole_xorb(store, "c.txt")
    path = store.xorb_path(xorb)
    locs = all_locs(store)
    if when == "before-mount":
        path.unlink()
    with mounted(store.path, "--direct-io", allow_errors=True) as m:
        if when == "while-mounted":
            path.unlink()  # the daemon listed it at mount time but has not opened it yet
        failed, per_file = check_contained(m, store, locs, lambda x, c: x == xorb)
        assert set(per_file) == {store["c.txt"].hash, store["d.bin"].hash}
        check_error_log(m, per_file, xorb)
        assert errors_of(m) == {"integrity": 0, "missing": failed, "format": 0, "timeout": 0, "io": 0}


@fuse
def test_truncated_xorb_before_mount(store: OracleStore) -> None:
    """The footer is gone and the header walk fails: every read of the xorb fails, naming the chunk."""
    xorb = sole_xorb(store, "a.bin")
    path = store.xorb_path(xorb)
    chunks = oracle.xorb_chunks(path)
    cut = chunks[len(chunks) // 2]
    locs = all_locs(store)
    oracle.truncate(path, cut.phys_start + 100)
    with mounted(store.path, "--direct-io", allow_errors=True) as m:
        failed, per_file = check_contained(m, store, locs, lambda x, c: x == xorb)
        assert {store["a.bin"].hash, store["b.bin"].hash, store["d.bin"].hash} <= set(per_file)
        check_error_log(m, per_file, xorb, f"chunk {cut.index}")
        assert errors_of(m) == {"integrity": 0, "missing": 0, "format": failed, "timeout": 0, "io": 0}


@fuse
def test_xorb_truncated_while_mounted(store: OracleStore) -> None:
    """The layout is already loaded; chunks past the cut fail with EIO, those before it still read."""
    a = store["a.bin"]
    xorb = sole_xorb(store, "a.bin")
    path = store.xorb_path(xorb)
    chunks = oracle.xorb_chunks(path)
    locs = all_locs(store)
    with mounted(store.path, "--direct-io", "--no-prefetch", allow_errors=True) as m:
        data = a.read()
        assert read_blocks(m / a.hash, data[:MiB]) == set()  # loads the layout, opens the xorb
        first_lost = next(c.chunk for c in locs[a.hash] if c.start >= 1_500_000)
        oracle.truncate(path, chunks[first_lost].phys_start + 10)
        failed, per_file = check_contained(m, store, locs, lambda x, c: x == xorb and c >= first_lost)
        assert a.hash in per_file
        assert errors_of(m) == {"integrity": 0, "missing": 0, "format": failed, "timeout": 0, "io": 0}
        check_error_log(m, per_file, xorb, "chunk")  # which chunks the failed read needed


GiB = 1 << 30


def huge_chunk_xorb() -> tuple[bytes, bytes, int, bytes]:
    """A xorb whose footer puts chunk 1 at physical bytes ``[108, 1 GiB)`` (the header there is zeros).

    Chunk 0 is a real 100-byte chunk.  The footer is consistent in every
    checked way: its hashes aggregate to the xorb's name (physical offsets are
    not hashed), its offsets increase and the last one is the footer start.
    Returns (xorb hash, chunk 0's bytes, footer offset, footer with length).
    """
    data0 = random.Random(3).randbytes(100)
    h0, h1 = hashes.chunk_hash(data0), hashes.chunk_hash(b"never stored")
    xorb_hash = hashes.xorb_hash([(h0, 100), (h1, 1000)])
    footer = writer.xorb_footer(xorb_hash, [h0, h1], [108, GiB], [100, 1000])
    return xorb_hash, writer.encode_chunk(data0, 0), GiB, footer


@pytest.mark.integration
def test_footer_chunk_sizes_are_bounded() -> None:
    """parse_footer must refuse chunks beyond the format's limits (docs/format.md 2.2: 8 + 256 KiB on disk,
    128 KiB decoded).

    Otherwise one read of the chunk makes the reader ``pread`` its whole claimed
    physical extent (see test_bad_xorb_is_not_read_into_memory).
    """
    _, _, footer_at, footer = huge_chunk_xorb()
    with pytest.raises(XorbFormatError):
        parse_footer(footer, footer_at + len(footer), where="xorb test")


def _write_huge_xorb_store(root: Path, kind: str) -> tuple[str, str, bytes]:
    """A store with a good file and a file in a 1 GiB (sparse) xorb.  Returns (good hex, bad hex, good bytes)."""
    b = StoreBuilder(root)
    good = random.Random(1).randbytes(200_000)
    fa = b.add_file(good)
    b.seal_xorb()
    if kind == "no-footer":  # sparse zeros after the chunks: no footer, a zero header at the end of the walk
        fb = b.add_file(random.Random(2).randbytes(200_000))
        b.finish()
        os.truncate(b.xorb_paths[b.files[fb].terms[0].xorb_hash], GiB)
        return hashes.to_hex(fa), hashes.to_hex(fb), good
    b.finish()
    xorb_hash, chunk0, footer_at, footer = huge_chunk_xorb()
    with open(b.xorb_dir / f"default.{hashes.to_hex(xorb_hash)}", "wb") as f:
        f.write(chunk0)
        f.seek(footer_at)
        f.write(footer)
    fb = hashes.chunk_hash(b"a file of 1100 bytes")
    shard_hash, shard = writer.build_shard(
        [writer.FileSpec(fb, (writer.TermSpec(xorb_hash, 0, 2, 1100),))],
        [writer.XorbSpec(xorb_hash, (hashes.chunk_hash(chunk0[8:]), hashes.chunk_hash(b"never stored")), (100, 1000))],
    )
    (b.shard_dir / f"{hashes.to_hex(shard_hash)}.mdb").write_bytes(shard)
    return hashes.to_hex(fa), hashes.to_hex(fb), good


@fuse
@pytest.mark.parametrize("kind", ["no-footer", "footer-claims-a-1GiB-chunk"])
def test_bad_xorb_is_not_read_into_memory(tmp_path: Path, kind: str) -> None:
    """A bad 1 GiB xorb file must be refused without reading (and allocating) its size.

    ``no-footer``: ``Store.load_layout`` reads a footer-less xorb whole to
    walk its chunk headers.  ``footer-claims-a-1GiB-chunk``: the reader reads
    a chunk's whole physical extent as the footer gives it.  Either way a
    damaged or hostile file sets how much the daemon allocates.
    """
    good_hex, bad_hex, good = _write_huge_xorb_store(tmp_path / "store", kind)
    with mounted(tmp_path / "store", "--direct-io", "--cache-size", "16M", allow_errors=True) as m:
        pid = m.proc.pid
        assert (m / good_hex).read_bytes() == good
        before = memory(pid)
        fd = os.open(m / bad_hex, os.O_RDONLY)
        try:
            with pytest.raises(OSError) as exc:
                os.pread(fd, 4096, 0 if kind == "no-footer" else 100)
        finally:
            os.close(fd)
        assert exc.value.errno == errno.EIO
        after = memory(pid)
        assert errors_of(m)["format"] == 1
        growth = after["VmHWM"] - before["VmHWM"]
        assert growth < 200 * MiB, f"the daemon's peak RSS grew by {growth // MiB} MiB reading a bad 1 GiB xorb"


# -- a stalled store: bounded waits ------------------------------------------------------


@dataclass(frozen=True)
class Nested:
    """An outer store holding (packed with ``xetfs pack``) the files of an inner store.

    The inner store has three files, each in its own xorb; files 0 and 1 are
    listed by one shard, file 2 by another.
    """

    outer: Path
    inner: Path
    files: dict[str, bytes]  # inner file xet hex -> content, in file order
    xorbs: dict[str, str]  # inner file xet hex -> its xorb's hex
    shards: list[str]  # inner shard names: [files 0 and 1, file 2]

    def outer_locs(self, outer: Path, rel: str) -> list[oracle.ChunkLoc]:
        """Where the bytes of the outer file ``rel`` (a path inside the inner store) live in the outer store."""
        rows = json.loads((outer / "xetfs-manifest.json").read_bytes())
        (xet,) = [r["xetHash"] for r in rows if r.get("path") == rel]
        return oracle.file_chunks(OracleStore(outer, (), ()), xet)


@pytest.fixture(scope="module")
def nested(tmp_path_factory: pytest.TempPathFactory) -> Nested:
    tmp = tmp_path_factory.mktemp("nested")
    b = StoreBuilder(tmp / "inner")
    files, xorbs = {}, {}
    for seed in range(3):
        data = random.Random(40 + seed).randbytes(300_000)
        h = b.add_file(data)
        xorbs[hashes.to_hex(h)] = hashes.to_hex(b.seal_xorb() or b"")
        files[hashes.to_hex(h)] = data
        if seed == 1:
            b.flush_shard()
    b.finish()
    proc = run_xetfs("pack", tmp / "inner", tmp / "outer")
    assert proc.returncode == 0, proc.stderr.decode()
    return Nested(tmp / "outer", tmp / "inner", files, xorbs, [p.name for p in b.shard_paths])


def _read_errno(path: Path, size: int = 4096, offset: int = 0) -> int:
    """0 when ``pread`` succeeds, else its errno."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.pread(fd, size, offset)
    except OSError as exc:
        return exc.errno or -1
    finally:
        with contextlib.suppress(OSError):  # ENOTCONN when the daemon went away meanwhile
            os.close(fd)
    return 0


@fuse
@pytest.mark.parametrize("cache", ["direct-io", "page-cache"])
def test_stuck_store_read_times_out_with_eio(nested: Nested, cache: str) -> None:
    """The inner store lives on a FUSE mount whose daemon is frozen: reads fail after the bound, the mount answers."""
    (first, data1), (second, data2), _ = nested.files.items()
    direct = ["--direct-io"] if cache == "direct-io" else []
    with mounted(nested.outer, "--direct-io") as outer:
        assert (outer / "xet" / "xorbs" / "shards").is_dir()
        with mounted(outer.path, *direct, "--io-timeout", "2", allow_errors=True) as inner:
            assert "store reads: worker threads, 2 s bound" in inner.log()  # auto: FUSE store -> threads
            assert (inner / first).read_bytes() == data1
            os.kill(outer.proc.pid, signal.SIGSTOP)
            try:
                code, elapsed = call_with_deadline(lambda: _read_errno(inner / second), 30, "a read of a stalled store")
                assert code == errno.EIO, os.strerror(code) if code else "the read succeeded"
                assert 1.5 <= elapsed < 10, f"EIO after {elapsed:.1f} s (bound: 2 s)"
                names, _ = call_with_deadline(lambda: set(os.listdir(inner.path)), 5, "ls of the inner mount")
                assert names == set(nested.files)
                stats, _ = call_with_deadline(inner.stats, 5, "the inner stats")
                e = stats["errors"]
                assert e["format"] == e["missing"] == e["integrity"] == 0, e
                timeouts = [line for line in log_lines(inner, "ERROR") if second in line]
                assert e["timeout"] == 1 and "2 s" in timeouts[0], (e, timeouts)  # one store read timed out
                if direct:  # one pread, one FUSE request: one log line
                    assert len(timeouts) == 1, timeouts
                else:  # the kernel may ask again at once for a single page: that fails at once
                    assert len(timeouts) <= 2 and all("failed again at once" in t for t in timeouts[1:]), timeouts
                # Data already read still comes back while the store is stuck.
                again, _ = call_with_deadline((inner / first).read_bytes, 5, "a re-read of cached data")
                assert again == data1
            finally:
                os.kill(outer.proc.pid, signal.SIGCONT)
            # The store is back: the same file reads (nothing bad was cached).
            assert (inner / second).read_bytes() == data2


@fuse
def test_concurrent_stuck_reads_each_fail_within_the_bound(nested: Nested) -> None:
    """Concurrent reads of a frozen store each fail after the bound, not one bound after another.

    Six reads per xorb: they all wait for one layout load, which times out
    after 2 s.  Every one of them must then fail; if each waiter retried the
    load in turn, the last would wait 6 x 2 s.
    """
    (first, data1), *rest = nested.files.items()
    jobs = [(h, off) for h, _ in rest for off in range(0, 300_000, 50_000)]
    assert len(jobs) == 12
    results: dict[int, tuple[int, float]] = {}

    def read(i: int, h: str, off: int, path: Path) -> None:
        start = time.monotonic()
        code = _read_errno(path / h, 4096, off)
        results[i] = (code, time.monotonic() - start)

    with (
        mounted(nested.outer, "--direct-io") as outer,
        mounted(outer.path, "--direct-io", "--io-timeout", "2", allow_errors=True) as inner,
    ):
        assert (inner / first).read_bytes() == data1
        os.kill(outer.proc.pid, signal.SIGSTOP)
        try:
            threads = [
                threading.Thread(target=read, args=(i, h, off, inner.path), daemon=True)
                for i, (h, off) in enumerate(jobs)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join(30)
            assert not any(t.is_alive() for t in threads), f"{sum(t.is_alive() for t in threads)} reads still blocked"
            codes = {code for code, _ in results.values()}
            slowest = max(elapsed for _, elapsed in results.values())
            assert codes == {errno.EIO}, codes
            assert slowest < 8, f"the slowest read failed after {slowest:.1f} s (bound: 2 s)"
            names, _ = call_with_deadline(lambda: set(os.listdir(inner.path)), 5, "ls of the inner mount")
            assert names == set(nested.files)
            stats, _ = call_with_deadline(inner.stats, 5, "the inner stats")
            assert stats["errors"]["timeout"] == len(jobs), stats["errors"]
        finally:
            os.kill(outer.proc.pid, signal.SIGCONT)
        for h, data in rest:
            assert (inner / h).read_bytes() == data


@fuse
def test_sigterm_unmounts_while_store_reads_are_stuck(nested: Nested) -> None:
    """Worker threads blocked on a frozen store do not keep the daemon (or its mount) alive."""
    _, second, third = nested.files
    with (
        mounted(nested.outer, "--direct-io") as outer,
        mounted(outer.path, "--direct-io", "--io-timeout", "30", allow_errors=True) as inner,
    ):
        os.kill(outer.proc.pid, signal.SIGSTOP)
        try:
            readers = [threading.Thread(target=_read_errno, args=(inner / h,), daemon=True) for h in (second, third)]
            for t in readers:
                t.start()
            wait_until(lambda: inner.stats()["reads"]["requests"] >= 2, 10, "two reads in flight")
            start = time.monotonic()
            inner.proc.send_signal(signal.SIGTERM)
            wait_until(lambda: inner.proc.poll() is not None and not is_mounted(inner.path), 15, "the unmount")
            elapsed = time.monotonic() - start
            for t in readers:
                t.join(10)
            assert not any(t.is_alive() for t in readers), "a reader is still blocked after the unmount"
        finally:
            os.kill(outer.proc.pid, signal.SIGCONT)
        assert elapsed < 5.0, f"unmounting with stuck store reads took {elapsed:.2f} s"  # (not --io-timeout's 30 s)


@fuse
def test_store_io_errors_are_contained(nested: Nested, tmp_path: Path) -> None:
    """EIO from the filesystem under the store: an unreadable shard is skipped, an unreadable xorb fails its reads."""
    outer_store = tmp_path / "outer"
    shutil.copytree(nested.outer, outer_store)
    (f0, data0), (f1, data1), (f2, _) = nested.files.items()
    shard_rel = f"xet/xorbs/shards/{nested.shards[1]}"  # lists only f2
    xorb_rel = f"xet/xorbs/xorbs/default.{nested.xorbs[f0]}"
    damaged = []
    for rel in (shard_rel, xorb_rel):  # make the outer store fail the first bytes of each
        loc = nested.outer_locs(outer_store, rel)[0]
        xorb_path = outer_store / "xet" / "xorbs" / "xorbs" / f"default.{loc.xorb}"
        chunk = oracle.xorb_chunks(xorb_path)[loc.chunk]
        oracle.flip_byte(xorb_path, chunk.payload_start + 3)
        damaged.append(loc)
    with mounted(outer_store, "--direct-io", allow_errors=True) as outer:
        assert _read_errno(outer / shard_rel) == errno.EIO
        with mounted(outer.path, "--direct-io", "--io-timeout", "10", allow_errors=True) as inner:
            warnings = log_lines(inner, "WARNING")
            assert len(warnings) == 1 and nested.shards[1] in warnings[0], warnings
            assert inner.stats()["index"]["shards_skipped"] == 1
            assert set(os.listdir(inner.path)) == {f0, f1}
            assert f2 not in os.listdir(inner / ".xetfs" / "by-hash")
            assert _read_errno(inner / f0) == errno.EIO
            assert read_blocks(inner / f1, data1) == set()
            assert inner.stats()["errors"]["io"] == 1  # the file is there, reading it fails
            (line,) = [e for e in log_lines(inner, "ERROR") if f0 in e]
            assert nested.xorbs[f0] in line, line
            assert read_blocks(inner / f0, data0)  # some blocks fail, and every block that reads is right


# -- signals and life cycle --------------------------------------------------------------


@fuse
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_during_heavy_reads_unmounts_quickly(basic_store: OracleStore, signum: int) -> None:
    originals = {f.hash: f.read() for f in basic_store.unique()}
    stop = threading.Event()
    problems: list[str] = []
    reads = [0]

    def reader(m: Mount, seed: int) -> None:
        rng = random.Random(seed)
        names = sorted(originals)
        while not stop.is_set():
            h = rng.choice(names)
            data = originals[h]
            try:
                fd = os.open(m / h, os.O_RDONLY)
            except OSError:
                return  # unmounted under us
            try:
                while not stop.is_set():
                    off = rng.randrange(max(1, len(data)))
                    try:
                        got = os.pread(fd, rng.choice((4096, BLOCK, 1 << 20)), off)
                    except OSError:
                        return
                    if got != data[off : off + len(got)] or (not got and off < len(data)):
                        problems.append(f"wrong bytes from {h} at {off}")
                        return
                    reads[0] += 1
                    if rng.random() < 0.05:
                        break
            finally:
                with contextlib.suppress(OSError):
                    os.close(fd)

    with mounted(basic_store.path, "--direct-io", "--cache-size", "8M") as m:
        threads = [threading.Thread(target=reader, args=(m, i), daemon=True) for i in range(8)]
        for t in threads:
            t.start()
        try:
            wait_until(lambda: reads[0] >= 200, 60, "200 reads", m.proc, m.log_path)
            start = time.monotonic()
            m.proc.send_signal(signum)
            wait_until(lambda: m.proc.poll() is not None and not is_mounted(m.path), 10, "the unmount")
            elapsed = time.monotonic() - start
        finally:
            stop.set()
            for t in threads:
                t.join(10)
        assert not any(t.is_alive() for t in threads), "a reader is stuck after the unmount"
        assert m.proc.returncode == (130 if signum == signal.SIGINT else 0), m.log()
        assert elapsed < 5.0, f"unmounting took {elapsed:.2f} s"
        assert not problems, problems
        assert "unmounted" in m.log()


# ``xetfs umount --force`` of a stopped daemon, with fusectl mounted or not: test_first_use.py.


# -- the fuzzer, briefly -----------------------------------------------------------------


def _load_fuzz_module() -> Any:
    spec = importlib.util.spec_from_file_location("xetfs_fuzz_script", REPO / "scripts" / "fuzz.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.mark.integration
def test_fuzz_smoke(tmp_path: Path) -> None:
    """A few seconds of scripts/fuzz.py over every target: only declared errors, bounded memory."""
    fuzz = _load_fuzz_module()
    report = fuzz.fuzz(4.0, seed=1234, out_dir=tmp_path / "failures")
    print("\n".join(report.lines()))
    assert set(report.targets) == {"shard", "xorb", "chunk", "manifest"}
    for name, t in report.targets.items():
        assert t.tried >= 100, (name, t)
        assert 0 < t.accepted < t.tried, (name, t)  # both paths were exercised
    assert report.total_failures == 0, "\n".join(report.lines())
    assert not (tmp_path / "failures").exists()


@pytest.mark.integration
def test_fuzzer_catches_a_planted_bug(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The smoke test above can fail: an undeclared exception is counted, and its input saved."""
    fuzz = _load_fuzz_module()
    real = fuzz.parse_shard

    def planted(data: bytes, *, where: str) -> Any:
        if len(data) > 40 and data[40] == 0xFF:
            raise IndexError("planted")
        return real(data, where=where)

    monkeypatch.setattr(fuzz, "parse_shard", planted)
    report = fuzz.fuzz(1.0, ["shard"], seed=7, out_dir=tmp_path)
    assert report.targets["shard"].failures > 0
    assert any("IndexError" in line and "planted" in line for line in report.failures), report.failures
    saved = sorted(tmp_path.glob("shard-*.bin"))
    assert len(saved) == 1 and saved[0].read_bytes()[40] == 0xFF
