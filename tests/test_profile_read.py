"""``scripts/profile_read.py`` still drives the read path it describes (it uses the mount's own objects)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from helpers import oracle
from helpers.oracle import OracleStore

pytestmark = pytest.mark.integration

SCRIPT = oracle.REPO_ROOT / "scripts" / "profile_read.py"


@pytest.mark.parametrize("workers", ["0", "2"])
def test_reads_the_whole_file(basic_store: OracleStore, workers: str) -> None:
    f = basic_store["random.bin"]
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), str(basic_store.path), f.hash, "--workers", workers, "--cprofile", "3"],
        capture_output=True, text=True, timeout=oracle.XETFS_TIMEOUT, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    reads = -(-f.size // 2**20)
    assert f"sequential: {reads} reads of 1048576 bytes" in proc.stdout
    assert re.search(r"CPU per GiB: daemon [0-9.]+ s, decode workers [0-9.]+ s", proc.stdout)
    assert "tottime" in proc.stdout  # the profile was printed


def test_random_reads_make_a_cold_and_a_cached_pass(basic_store: OracleStore) -> None:
    f = basic_store["random.bin"]
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), str(basic_store.path), f.hash, "--workers", "0", "--random", "--block", "4K"],
        capture_output=True, text=True, timeout=oracle.XETFS_TIMEOUT, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    reads = -(-f.size // 4096)
    for name in ("cold", "cached"):
        assert re.search(rf"^{name}: {reads} reads of 4096 bytes, .* us a read\)", proc.stdout, re.M), proc.stdout


def test_rejects_a_bad_hash(basic_store: OracleStore) -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), str(basic_store.path), "xyz"],
        capture_output=True, text=True, timeout=oracle.XETFS_TIMEOUT, check=False,
    )  # fmt: skip
    assert proc.returncode == 2 and "64 hex digits" in proc.stderr


def test_names_a_missing_file(basic_store: OracleStore) -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), str(basic_store.path), "ab" * 32, "--workers", "0"],
        capture_output=True, text=True, timeout=oracle.XETFS_TIMEOUT, check=False,
    )  # fmt: skip
    assert proc.returncode == 1 and f"no file with hash {'ab' * 32}" in proc.stderr
