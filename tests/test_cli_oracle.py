"""The command line against stores written by hf_xet: ``cat``, ``ls``, ``verify`` and their errors.

Every expected value comes from the original files or from ``oracle``'s own
parse of the store, never from xetfs.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import oracle
from helpers.oracle import ChunkLoc, CliRunner, OracleStore, copy_store, run_xetfs

from xetfs.base import hashes

pytestmark = pytest.mark.integration

STORES = ["basic_store", "multi_store"]
SUMMARY = re.compile(
    r"^OK: (\d+) shards?, (\d+) xorbs?, (\d+) chunks?, (\d+) files?, (\d+) file bytes? checked$"
)  # (the singular where there is one: ``1 shard``)


def interesting_ranges(chunks: list[ChunkLoc], size: int, edits: tuple[int, ...], seed: int) -> list[tuple[int, int]]:
    """``(offset, length)`` pairs that start/end mid-chunk, on and around chunk, term and edit boundaries."""
    rng = random.Random(seed)
    out = [(0, size), (0, 1), (size - 1, 1), (size - 1, 100), (size // 2, size), (0, 0), (size, 10)]
    inner = [c.end for c in chunks[:-1]]
    for b in rng.sample(inner, min(6, len(inner))) + oracle.term_boundaries(chunks) + list(edits):
        out += [(b - 1, 2), (b - 1, 1), (b, 1), (b - 1000, 3000), (b - 70_000, 140_000)]
    for c in rng.sample(chunks, min(4, len(chunks))):
        mid = (c.start + c.end) // 2
        out += [(c.start, c.end - c.start), (c.start + 1, c.end - c.start - 2), (mid, 1), (mid, 300_000)]
    for _ in range(6):
        out.append((rng.randrange(size), rng.randrange(1, 400_000)))
    return sorted({(max(0, o), max(0, n)) for o, n in out if o <= size})


def check_ranges(cli: CliRunner, store: OracleStore, name: str, seed: int) -> int:
    f = store[name]
    data = f.read()
    chunks = oracle.file_chunks(store, f.hash)
    ranges = interesting_ranges(chunks, f.size, oracle.EDITS.get(name, ()), seed)
    for offset, length in ranges:
        r = cli("cat", store.path, f.hash, "--offset", offset, "--length", length)
        assert (r.returncode, r.stderr) == (0, ""), f"{name} [{offset}, +{length})"
        expected = data[offset : offset + length]
        assert r.stdout == expected, f"{name} [{offset}, +{length}): {len(r.stdout)} bytes, expected {len(expected)}"
    return len(ranges)


def assert_one_error_line(proc_stderr: bytes) -> str:
    text = proc_stderr.decode()
    assert "Traceback" not in text
    lines = text.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("xetfs: error: "), lines[0]
    return lines[0]


# -- the stores are what the tests think they are ----------------------------------


def test_basic_store_uses_all_three_schemes(basic_store: OracleStore) -> None:
    counts = oracle.scheme_counts(basic_store.xorb_paths())
    assert set(counts) == {0, 1, 2}, counts


def test_multi_store_terms_cross_xorbs_and_shards(multi_store: OracleStore) -> None:
    terms = oracle.store_terms(multi_store)
    assert len(multi_store.shard_paths()) == len(oracle.MULTI_CALLS)
    a_xorbs = {t.xorb for t in terms[multi_store["a.bin"].hash]}
    b_xorbs = [t.xorb for t in terms[multi_store["b.bin"].hash]]
    assert len(b_xorbs) >= 3 and a_xorbs < set(b_xorbs), b_xorbs
    assert len({t.xorb for t in terms[multi_store["d.bin"].hash]}) >= 3
    # The file record of b lives in a shard that does not describe a's xorb.
    (b_shard,) = oracle.shard_of(multi_store, multi_store["b.bin"].hash)
    assert multi_store["a.bin"].hash not in oracle.shard_files(b_shard)


@pytest.mark.slow
def test_big_store_has_three_xorbs(big_store: OracleStore) -> None:
    assert len(big_store.xorb_paths()) == 3
    assert len(oracle.store_terms(big_store)[big_store["big.bin"].hash]) == 3


# -- cat -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("store_name", "name"),
    [
        ("basic_store", "random.bin"),
        ("basic_store", "text.txt"),
        ("basic_store", "walk.f32"),
        ("basic_store", "empty"),
        ("basic_store", "one-byte"),
        ("multi_store", "b.bin"),
        ("multi_store", "d.bin"),
    ],
)
def test_cat_subprocess_returns_the_original(request: pytest.FixtureRequest, store_name: str, name: str) -> None:
    store: OracleStore = request.getfixturevalue(store_name)
    proc = run_xetfs("cat", store.path, store[name].hash)
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stderr == b""
    assert proc.stdout == store[name].read()


def test_cat_subprocess_range(multi_store: OracleStore) -> None:
    f = multi_store["d.bin"]
    offset, length = oracle.EDITS["d.bin"][0] - 12_345, 500_000
    proc = run_xetfs("cat", multi_store.path, f.hash, "--offset", offset, "--length", length)
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stdout == f.read()[offset : offset + length]


@pytest.mark.parametrize("store_name", STORES)
def test_cat_every_file(request: pytest.FixtureRequest, cli: CliRunner, store_name: str) -> None:
    store: OracleStore = request.getfixturevalue(store_name)
    for f in store.files:
        r = cli("cat", store.path, f.hash)
        assert (r.returncode, r.stderr) == (0, ""), f.name
        assert r.stdout == f.read(), f.name


@pytest.mark.parametrize("store_name", STORES)
def test_cat_ranges(request: pytest.FixtureRequest, cli: CliRunner, store_name: str) -> None:
    store: OracleStore = request.getfixturevalue(store_name)
    checked = sum(check_ranges(cli, store, f.name, seed) for seed, f in enumerate(store.unique()) if f.size)
    assert checked > 100


def test_cat_by_prefix_and_uppercase(cli: CliRunner, multi_store: OracleStore) -> None:
    f = multi_store["c.txt"]
    for key in (f.hash[:8], f.hash[:20], f.hash.upper()):
        r = cli("cat", multi_store.path, key)
        assert r.returncode == 0, r.stderr
        assert r.stdout == f.read()


def test_cat_accepts_inner_store_directories(cli: CliRunner, basic_store: OracleStore) -> None:
    f = basic_store["text.txt"]
    for where in (basic_store.path / "xet", basic_store.path / "xet" / "xorbs"):
        r = cli("cat", where, f.hash, "--offset", 1000, "--length", 5000)
        assert r.returncode == 0, r.stderr
        assert r.stdout == f.read()[1000:6000]


def test_cat_into_a_closed_pipe(basic_store: OracleStore) -> None:
    """``xetfs cat ... | head -c 10``: the reader goes away, cat stops quietly, with the status of SIGPIPE.

    The output is incomplete, so the status is not 0 (a shell with ``pipefail`` sees it, as with ``cat``).
    """
    f = basic_store["random.bin"]  # 3 MB: far more than a pipe buffer, so cat is still writing
    with subprocess.Popen(
        [sys.executable, "-m", "xetfs", "cat", str(basic_store.path), f.hash],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=oracle.REPO_ROOT,
    ) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        assert proc.stdout.read(10) == f.read()[:10]
        proc.stdout.close()
        err = proc.stderr.read()
        code = proc.wait(timeout=oracle.XETFS_TIMEOUT)
    assert (code, err) == (141, b"")


@pytest.mark.slow
def test_cat_big_file_subprocess(big_store: OracleStore) -> None:
    f = big_store["big.bin"]
    proc = run_xetfs("cat", big_store.path, f.hash)
    assert proc.returncode == 0, proc.stderr.decode()
    assert len(proc.stdout) == f.size
    assert hashlib.sha256(proc.stdout).hexdigest() == f.sha256


@pytest.mark.slow
def test_cat_big_file_ranges_across_xorbs(cli: CliRunner, big_store: OracleStore) -> None:
    f = big_store["big.bin"]
    chunks = oracle.file_chunks(big_store, f.hash)
    bounds = oracle.term_boundaries(chunks)
    assert len(bounds) == 2
    # Far beyond CAT_BLOCK (8 MiB) so the output is written in several pieces.
    ranges = [(b - 1, 2) for b in bounds] + [(b - 5_000_000, 20_000_000) for b in bounds]
    ranges += [(bounds[0] - 7, bounds[1] - bounds[0] + 14), (f.size - 70_000, 100_000)]
    with f.path.open("rb") as original:
        for offset, length in ranges:
            r = cli("cat", big_store.path, f.hash, "--offset", offset, "--length", length)
            assert r.returncode == 0, r.stderr
            original.seek(offset)
            assert r.stdout == original.read(length), (offset, length)


# -- ls ------------------------------------------------------------------------------


def expected_listing(store: OracleStore) -> dict[str, dict[str, object]]:
    """``ls`` rows from the oracle's own reading of the store; ``chunks`` counts distinct (xorb, chunk) pairs."""
    terms = oracle.store_terms(store)
    rows = {}
    for f in store.unique():
        chunks = len({(c.xorb, c.chunk) for c in oracle.file_chunks(store, f.hash)})
        rows[f.hash] = {"hash": f.hash, "size": f.size, "sha256": f.sha256, "terms": len(terms[f.hash]),
                        "chunks": chunks}  # fmt: skip
    return rows


@pytest.mark.parametrize("store_name", STORES)
def test_ls_json_lists_every_file(request: pytest.FixtureRequest, cli: CliRunner, store_name: str) -> None:
    store: OracleStore = request.getfixturevalue(store_name)
    r = cli("ls", store.path, "--json")
    assert (r.returncode, r.stderr) == (0, "")
    rows = json.loads(r.stdout)
    assert {row["hash"]: row for row in rows} == expected_listing(store)
    assert len(rows) == len(store.unique())


def test_ls_json_empty_file(cli: CliRunner, basic_store: OracleStore) -> None:
    rows = json.loads(cli("ls", basic_store.path, "--json").stdout)
    (empty,) = [row for row in rows if row["hash"] == basic_store["empty"].hash]
    assert empty == {"hash": "0" * 64, "size": 0, "sha256": hashlib.sha256(b"").hexdigest(), "terms": 0, "chunks": 0}


@pytest.mark.parametrize("store_name", STORES)
def test_ls_text(request: pytest.FixtureRequest, cli: CliRunner, store_name: str) -> None:
    store: OracleStore = request.getfixturevalue(store_name)
    r = cli("ls", store.path)
    assert (r.returncode, r.stderr) == (0, "")
    found = {}
    for line in r.stdout.decode().splitlines():
        h, size, sha, terms, chunks = line.split()
        found[h] = {"hash": h, "size": int(size), "sha256": sha, "terms": int(terms), "chunks": int(chunks)}
    assert found == expected_listing(store)


def test_ls_subprocess(multi_store: OracleStore) -> None:
    proc = run_xetfs("ls", multi_store.path, "--json")
    assert (proc.returncode, proc.stderr) == (0, b"")
    assert {row["hash"] for row in json.loads(proc.stdout)} == {f.hash for f in multi_store.files}


@pytest.mark.slow
def test_ls_big(cli: CliRunner, big_store: OracleStore) -> None:
    rows = json.loads(cli("ls", big_store.path, "--json").stdout)
    assert {row["hash"]: row for row in rows} == expected_listing(big_store)


# -- verify --------------------------------------------------------------------------


def expected_summary(store: OracleStore) -> tuple[int, ...]:
    xorbs = store.xorb_paths()
    unique = store.unique()
    return (
        len(store.shard_paths()),
        len(xorbs),
        sum(len(oracle.xorb_chunks(p)) for p in xorbs),
        len(unique),
        sum(f.size for f in unique),
    )


@pytest.mark.parametrize("store_name", STORES)
def test_verify_accepts_hf_xet_stores(request: pytest.FixtureRequest, store_name: str) -> None:
    store: OracleStore = request.getfixturevalue(store_name)
    proc = run_xetfs("verify", store.path)
    assert proc.returncode == 0, proc.stdout.decode() + proc.stderr.decode()
    assert proc.stderr == b""
    lines = proc.stdout.decode().splitlines()
    assert len(lines) == 1, lines
    m = SUMMARY.match(lines[0])
    assert m, lines[0]
    assert tuple(int(g) for g in m.groups()) == expected_summary(store)


@pytest.mark.slow
def test_verify_big_store(cli: CliRunner, big_store: OracleStore) -> None:
    r = cli("verify", big_store.path, "--no-progress")
    assert r.returncode == 0, r.stdout
    m = SUMMARY.match(r.stdout.decode().strip())
    assert m, r.stdout
    assert tuple(int(g) for g in m.groups()) == expected_summary(big_store)


# -- errors --------------------------------------------------------------------------


def _ambiguous_store(store: OracleStore, dest: Path) -> tuple[OracleStore, str]:
    """A copy of ``store`` plus a shard whose one file record differs from a real one only after digit 48."""
    copy = copy_store(store, dest)
    (shard,) = copy.shard_paths()
    data = bytearray(shard.read_bytes())
    pos = 48
    while True:  # the first file record with terms (an empty file must keep the zero hash)
        file_hash, flags, n = struct.unpack_from("<32sII", data, pos)
        assert file_hash != b"\xff" * 32, "no file record with terms"
        if n:
            break
        pos += 48 * (1 + n * (2 if flags & 0x80000000 else 1) + (1 if flags & 0x40000000 else 0))
    original = oracle.xet_hex(bytes(data[pos : pos + 32]))
    data[pos + 31] ^= 0xFF  # raw byte 31 is printed as hex digits 48-49
    (copy.shard_dir / f"{hashes.to_hex(hashes.chunk_hash(bytes(data)))}.mdb").write_bytes(data)  # (named as a shard is)
    return copy, original


def test_error_ambiguous_prefix(cli: CliRunner, tmp_path: Path, basic_store: OracleStore) -> None:
    store, h = _ambiguous_store(basic_store, tmp_path / "store")
    rows = json.loads(cli("ls", store.path, "--json").stdout)
    assert sum(row["hash"].startswith(h[:48]) for row in rows) == 2
    proc = run_xetfs("cat", store.path, h[:8])
    assert proc.returncode != 0
    assert proc.stdout == b""
    line = assert_one_error_line(proc.stderr)
    assert h[:8] in line
    # The full hash still names exactly one file.
    r = cli("cat", store.path, h)
    assert r.returncode == 0
    assert hashlib.sha256(r.stdout).hexdigest() in {f.sha256 for f in basic_store.files if f.hash == h}


def test_error_missing_store(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-store"
    for args in (["ls", missing], ["cat", missing, "0" * 64], ["verify", missing]):
        proc = run_xetfs(*args)
        assert proc.returncode != 0, args
        assert str(missing) in assert_one_error_line(proc.stderr)


@pytest.mark.parametrize("layout", ["empty-dir", "no-shards-dir", "empty-shards-dir"])
def test_error_store_without_shards(tmp_path: Path, basic_store: OracleStore, layout: str) -> None:
    store = tmp_path / "store"
    if layout == "empty-dir":
        store.mkdir()
    else:
        shutil.copytree(basic_store.path, store)
        shutil.rmtree(store / "xet" / "xorbs" / "shards")
        shutil.rmtree(store / "xet" / "shard-cache", ignore_errors=True)  # client copies: not part of the store
        if layout == "empty-shards-dir":
            (store / "xet" / "xorbs" / "shards").mkdir()
    for args in (["ls", store], ["cat", store, basic_store["text.txt"].hash]):
        proc = run_xetfs(*args)
        assert proc.returncode != 0, args
        assert proc.stdout == b""
        assert "shards" in assert_one_error_line(proc.stderr)


def test_error_unknown_hash(basic_store: OracleStore) -> None:
    unknown = "12" * 32
    proc = run_xetfs("cat", basic_store.path, unknown)
    assert proc.returncode != 0
    assert proc.stdout == b""
    assert unknown in assert_one_error_line(proc.stderr)


@pytest.mark.parametrize("key", ["12345678", "abc", "not-a-hash", "g" * 64])
def test_error_bad_or_unknown_prefix(cli: CliRunner, basic_store: OracleStore, key: str) -> None:
    r = cli("cat", basic_store.path, key)
    assert r.returncode != 0
    assert r.stdout == b""
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("xetfs: error: "), lines


@pytest.mark.parametrize("value", ["inf", "1e400", "nan", "-1", "12Q"])
def test_error_bad_size_is_a_usage_error(basic_store: OracleStore, value: str) -> None:
    proc = run_xetfs("cat", basic_store.path, basic_store["text.txt"].hash, "--length", value)
    err = proc.stderr.decode()
    assert "Traceback" not in err
    assert proc.returncode == 2, err
    assert proc.stdout == b""
    assert err.splitlines()[-1].startswith("xetfs cat: error: argument --length"), err
