"""Damaged copies of an hf_xet store: damage is found, named, and contained.

Each test copies the session's multi store (one upload call per file, so
most files live in xorbs of their own), damages one object, and checks that
``verify`` names it, that reading a file that needs the damaged bytes fails
with one ``xetfs: error:`` line, and that every other file still reads back
exactly.  Which files are affected is worked out with ``oracle``'s own parse.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from helpers import oracle
from helpers.damage import assert_reads_back, check_cli_contained, files_using, sole_xorb, verify_problems
from helpers.oracle import CliRunner, OracleStore, run_xetfs

pytestmark = pytest.mark.integration


@pytest.fixture
def store(multi_store: OracleStore, tmp_path: Path) -> OracleStore:
    return oracle.copy_store(multi_store, tmp_path / "store")


# -- a flipped byte in a chunk payload ------------------------------------------------


def test_flipped_byte_fails_in_a_subprocess(store: OracleStore) -> None:
    f = store["a.bin"]
    loc = oracle.file_chunks(store, f.hash)[3]
    chunk = oracle.xorb_chunks(store.xorb_path(loc.xorb))[loc.chunk]
    oracle.flip_byte(store.xorb_path(loc.xorb), chunk.payload_start + 1)
    proc = run_xetfs("cat", store.path, f.hash)
    assert proc.returncode != 0
    assert f.read().startswith(proc.stdout)
    err = proc.stderr.decode()
    assert "Traceback" not in err
    assert len(err.splitlines()) == 1 and err.startswith("xetfs: error: ")
    assert loc.xorb in err and f"chunk {loc.chunk}" in err


def test_flipped_byte_in_footer_hashes(cli: CliRunner, store: OracleStore) -> None:
    """A chunk hash in the footer no longer matches: the whole xorb is refused, by name."""
    xorb = sole_xorb(store, "c.txt")
    path = store.xorb_path(xorb)
    footer = oracle.xorb_chunks(path)[-1].phys_end
    affected = files_using(store, xorb)
    oracle.flip_byte(path, footer + 52 + 5)  # inside the first chunk hash (docs/format.md 2.4)
    problems = verify_problems(store)
    assert any(xorb in p for p in problems), problems
    check_cli_contained(cli, store, affected, xorb)


# -- shards ---------------------------------------------------------------------------


@pytest.mark.parametrize("keep", [0, 47, 0.5, -1])
def test_truncated_shard(cli: CliRunner, store: OracleStore, keep: float) -> None:
    victim = store["c.txt"]
    (shard,) = oracle.shard_of(store, victim.hash)
    # d.bin uses c.txt's xorb, which only the damaged shard describes: it must still read.
    assert store["d.bin"].hash in files_using(store, sole_xorb(store, "c.txt"))
    size = shard.stat().st_size
    oracle.truncate(shard, int(size * keep) if isinstance(keep, float) else keep % size)

    r = cli("ls", store.path, "--json")
    assert r.returncode == 0, r.stderr
    listed = {row["hash"] for row in json.loads(r.stdout)}
    assert listed == {f.hash for f in store.files} - {victim.hash}
    warnings = r.stderr.splitlines()
    assert len(warnings) == 1 and warnings[0].lower().startswith("xetfs: warning: "), warnings
    assert shard.name in warnings[0]

    for f in store.unique():
        if f.hash != victim.hash:
            r = cli("cat", store.path, f.hash)
            assert (r.returncode, r.stdout) == (0, f.read()), f.name
    missing = cli("cat", store.path, victim.hash)
    assert missing.returncode != 0 and missing.stdout == b""
    assert victim.hash in missing.stderr.splitlines()[-1]

    problems = verify_problems(store)
    assert any(shard.name in p for p in problems), problems


# -- xorbs ----------------------------------------------------------------------------


def test_deleted_xorb(cli: CliRunner, store: OracleStore) -> None:
    xorb = sole_xorb(store, "c.txt")
    affected = files_using(store, xorb)
    assert affected == {store["c.txt"].hash, store["d.bin"].hash}
    store.xorb_path(xorb).unlink()
    problems = verify_problems(store)
    assert any(xorb in p and "missing" in p for p in problems), problems
    check_cli_contained(cli, store, affected, xorb)


@pytest.mark.parametrize("where", ["mid-footer", "last-byte", "mid-chunks", "first-chunk"])
def test_truncated_xorb(cli: CliRunner, store: OracleStore, where: str) -> None:
    xorb = sole_xorb(store, "a.bin")
    path = store.xorb_path(xorb)
    chunks = oracle.xorb_chunks(path)
    size = path.stat().st_size
    cut = {
        "mid-footer": (chunks[-1].phys_end + size) // 2,
        "last-byte": size - 1,
        "mid-chunks": chunks[len(chunks) // 2].phys_start + 100,
        "first-chunk": 5,
    }[where]
    affected = files_using(store, xorb)
    assert {store["a.bin"].hash, store["b.bin"].hash, store["d.bin"].hash} <= affected
    oracle.truncate(path, cut)
    problems = verify_problems(store)
    assert any(xorb in p for p in problems), problems
    check_cli_contained(cli, store, affected, xorb)


def test_xorb_without_footer_still_reads(cli: CliRunner, store: OracleStore) -> None:
    """Cut exactly at the footer: a bare chunk section is a valid xorb (docs/format.md 2.5)."""
    xorb = sole_xorb(store, "c.txt")
    path = store.xorb_path(xorb)
    oracle.truncate(path, oracle.xorb_chunks(path)[-1].phys_end)
    for f in store.unique():
        assert_reads_back(cli, store, f)
    proc = run_xetfs("verify", store.path)
    assert proc.returncode == 0, proc.stdout.decode() + proc.stderr.decode()


def test_verify_names_only_the_files_that_touch_the_damaged_chunk(tmp_path: Path) -> None:
    """Files sharing a xorb with a damaged chunk, but not the chunk, are still checked in full."""
    from xetfs.storage.store import Store

    sample = Path(__file__).resolve().parent.parent / "sample" / "store"
    store = tmp_path / "store"
    shutil.copytree(sample, store)
    xorb = next((store / "xet" / "xorbs" / "xorbs").glob("default.*"))
    s = Store.open(store)
    (xorb_hash,) = list(s.xorb_hashes())
    layout = s.load_layout(xorb_hash)
    s.close()
    chunk = layout.num_chunks // 2
    oracle.flip_byte(xorb, layout.phys_start(chunk) + 8 + 100)  # inside the payload, past any frame header
    result = oracle.run_xetfs("verify", store)
    out = result.stdout.decode()
    assert result.returncode == 3, out
    assert re.search(rf"chunk {chunk}\b", out), out
    unchecked = [line for line in out.splitlines() if "content not checked" in line]
    assert len(unchecked) == 1, out  # one file uses that chunk; the other five are read and hashed
    assert re.match(r"PROBLEM: model/model\.safetensors \(file [0-9a-f]{64}\): content not checked", unchecked[0]), out
    assert "6 files" in out.splitlines()[-1]


def test_verify_names_the_files_and_xorbs_a_bad_shard_takes_with_it(tmp_path: Path) -> None:
    """A cut shard is one problem; the named files it listed are another, and its xorbs are counted in a note."""
    sample = Path(__file__).resolve().parent.parent / "sample" / "store"
    store = tmp_path / "store"
    shutil.copytree(sample, store)
    (shard,) = store.rglob("shards/*.mdb")
    oracle.truncate(shard, 3000)
    result = oracle.run_xetfs("verify", store)
    out = result.stdout.decode()
    assert result.returncode == 3, out
    lines = out.splitlines()
    assert lines[0].startswith(f"PROBLEM: shard {shard.name}: "), out
    assert re.fullmatch(r"PROBLEM: names: 6 of the 6 files named are not in the store \(a bad or lost shard's\?\); "
                        r"the first: 'README\.md' \(file [0-9a-f]{64}\)", lines[1]), out  # fmt: skip
    assert lines[2] == ("note: 1 xorb no shard lists (a bad or lost shard's, or a pack's stopped before it wrote its "
                        "shard): no file needs them"), out  # fmt: skip
    assert lines[3].startswith("2 problems: 1 shard, 1 xorb, "), out
    (store / "xetfs-manifest.json").write_text("{not json")
    broken = oracle.run_xetfs("verify", store).stdout.decode()
    assert f"\nPROBLEM: manifest {store / 'xetfs-manifest.json'}: not valid JSON: " in broken, broken
    assert broken.splitlines()[-1].startswith("2 problems: "), broken  # (the shard, the manifest)
