"""Damaged stores: which files a damaged chunk touches, and checks that the damage is found, named and contained.

Two ways to read: the ``xetfs`` command (``cat``, ``verify``), and a mount read block by block with
``--direct-io`` (one FUSE request per 64 KiB ``pread``), so that exactly the blocks over damaged
chunks can fail.  ``source`` is where the command reads the store: its directory by default, or a
URL serving a copy of it.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Sequence
from pathlib import Path

from helpers import oracle
from helpers.mounting import Mount
from helpers.oracle import CliRunner, OracleFile, OracleStore, run_xetfs
from xetfs.base import hashes
from xetfs.storage.indexer import load_index
from xetfs.storage.store import Store

EXIT_PROBLEMS = 3  # ``xetfs verify`` found damage
BLOCK = 64 * 1024  # one FUSE request per pread with --direct-io

Damaged = Callable[[str, int], bool]  # (xorb hex, chunk index) -> damaged?
Locs = dict[str, list[oracle.ChunkLoc]]  # file hash -> where each of its chunks comes from


def sole_xorb(store: OracleStore, name: str) -> str:
    """The xorb that holds file ``name`` (uploaded alone, so it has exactly one)."""
    (xorb,) = {t.xorb for t in oracle.store_terms(store)[store[name].hash]}
    return xorb


def files_using(store: OracleStore, xorb: str, chunk: int | None = None) -> set[str]:
    """Hashes of the files that read chunk ``chunk`` (or any chunk) of ``xorb``."""
    return {
        f.hash
        for f in store.unique()
        if any(c.xorb == xorb and chunk in (None, c.chunk) for c in oracle.file_chunks(store, f.hash))
    }


def all_locs(store: OracleStore) -> Locs:
    """Every file's chunks, parsed by the oracle (call it before damaging the store)."""
    return {f.hash: oracle.file_chunks(store, f.hash) for f in store.unique()}


# -- through the command ------------------------------------------------------------------------------


def assert_fails_cleanly(cli: CliRunner, store: OracleStore, f: OracleFile, *names: str,
                         source: object = None, args: Sequence[object] = ()) -> None:  # fmt: skip
    """``cat`` of ``f`` fails: one error line naming ``names``, no wrong bytes on stdout."""
    r = cli("cat", store.path if source is None else source, f.hash, *args)
    assert r.returncode != 0, f.name
    assert f.read().startswith(r.stdout), f"{f.name}: wrong bytes written before the error"
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("xetfs: error: "), lines
    for name in names:
        assert name in lines[0], (name, lines[0])


def assert_reads_back(cli: CliRunner, store: OracleStore, f: OracleFile, *,
                      source: object = None, args: Sequence[object] = ()) -> None:  # fmt: skip
    r = cli("cat", store.path if source is None else source, f.hash, *args)
    assert (r.returncode, r.stderr) == (0, ""), f.name
    assert r.stdout == f.read(), f.name


def check_cli_contained(cli: CliRunner, store: OracleStore, affected: set[str], *names: str,
                        source: object = None, args: Sequence[object] = ()) -> None:  # fmt: skip
    """Files in ``affected`` fail naming ``names``; every other file reads back exactly."""
    assert affected and len(affected) < len(store.unique()), "the damage must hit some files and spare others"
    for f in store.unique():
        if f.hash in affected:
            assert_fails_cleanly(cli, store, f, *names, source=source, args=args)
        else:
            assert_reads_back(cli, store, f, source=source, args=args)


def verify_problems(store: OracleStore, *, source: object = None, args: Sequence[object] = ()) -> list[str]:
    """Run ``xetfs verify`` as a process; it must report damage, and without a traceback."""
    proc = run_xetfs("verify", store.path if source is None else source, *args)
    out, err = proc.stdout.decode(), proc.stderr.decode()
    assert "Traceback" not in out + err
    assert proc.returncode == EXIT_PROBLEMS, out + err
    lines = out.splitlines()
    problems = [line for line in lines if line.startswith("PROBLEM: ")]
    n = len(problems)
    assert lines[-1].startswith(f"{n} problem: " if n == 1 else f"{n} problems: "), lines[-1]
    shards = len(store.shard_paths())  # every shard is counted as checked, a bad one too
    assert f": {shards} shard{'' if shards == 1 else 's'}, " in lines[-1], lines[-1]
    return problems


# -- through a mount ------------------------------------------------------------------------------------


def log_lines(m: Mount, level: str) -> list[str]:
    return [line for line in m.log().splitlines() if f" {level} " in line]


def errors_of(m: Mount) -> dict[str, int]:
    return dict(m.stats()["errors"])


def blocks(size: int) -> list[tuple[int, int]]:
    return [(off, min(BLOCK, size - off)) for off in range(0, size, BLOCK)]


def expected_failures(locs: list[oracle.ChunkLoc], size: int, damaged: Damaged) -> set[int]:
    """Offsets of the 64 KiB blocks of a file that need a damaged chunk."""
    bad = [c for c in locs if damaged(c.xorb, c.chunk)]
    return {off for off, n in blocks(size) if any(c.start < off + n and off < c.end for c in bad)}


def read_blocks(path: Path, original: bytes) -> set[int]:
    """``pread`` every block; successes must equal the original, failures must be EIO.  Returns failed offsets."""
    failed = set()
    fd = os.open(path, os.O_RDONLY)
    try:
        for off, n in blocks(len(original)):
            try:
                got = os.pread(fd, n, off)
            except OSError as exc:
                assert exc.errno == errno.EIO, f"{path} at {off}: {exc}"
                failed.add(off)
                continue
            assert got == original[off : off + n], f"{path}: WRONG BYTES at [{off}, {off + n})"
    finally:
        os.close(fd)
    return failed


def check_contained(m: Mount, store: OracleStore, locs: Locs, damaged: Damaged) -> tuple[int, dict[str, set[int]]]:
    """Read every file of the store block by block; exactly the blocks over damaged chunks fail.

    Returns the number of failed reads and the failed offsets per file hash.
    """
    total = 0
    per_file: dict[str, set[int]] = {}
    for f in store.unique():
        failed = read_blocks(m / f.hash, f.read())
        assert failed == expected_failures(locs[f.hash], f.size, damaged), f.name
        if failed:
            per_file[f.hash] = failed
        total += len(failed)
    return total, per_file


def check_error_log(m: Mount, per_file: dict[str, set[int]], *names: str) -> None:
    """One ERROR line per file whose reads failed (one damaged chunk or xorb, read block by block in order),
    naming the file, the first offset that failed and every one of ``names``."""
    errors = log_lines(m, "ERROR")
    assert len(errors) == len(per_file), "\n".join(errors)
    for file_hash, offsets in per_file.items():
        lines = [e for e in errors if file_hash in e]
        assert len(lines) == 1 and f"offset {min(offsets)} " in lines[0], (file_hash, sorted(offsets), errors)
        for name in names:
            assert name in lines[0], (name, lines[0])


def damage_one_file(store: Path, target: str, at: float = 0.5) -> str:
    """Flip a byte in a chunk that only the file ``target`` (a Xet hash) uses, the one ``at`` the way along
    those chunks (in xorb order); returns the xorb's hex."""
    s = Store.open(store)
    index = load_index(s).index
    users: dict[tuple[bytes, int], set[str]] = {}
    for entry in index:
        for xorb, first, stop, _ in index.terms_of(entry):
            for i in range(first, stop):
                users.setdefault((xorb, i), set()).add(entry.hex)
    candidates = [key for key, who in users.items() if who == {target}]
    assert candidates, "no chunk is the target's alone"
    xorb, i = sorted(candidates)[int(len(candidates) * at)]
    layout = s.load_layout(xorb)
    path = s.xorb_path(xorb)
    offset = layout.phys_start(i) + 8 + (layout.phys_ends[i] - layout.phys_start(i) - 8) // 2
    path.chmod(0o644)
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x40]))
    return hashes.to_hex(xorb)
