"""Decode worker processes behind a real mount.

The daemon starts its workers at mount, sends them the runs worth sending,
keeps serving correct bytes when one dies, and takes them down with it.
"""

from __future__ import annotations

import hashlib
import os
import re
import signal
from pathlib import Path

import pytest
from helpers.mounting import Mount, mounted, wait_until
from helpers.oracle import OracleFile, OracleStore
from helpers.processes import children

pytestmark = pytest.mark.fuse


def _workers(m: Mount) -> list[int]:
    """Process ids of the daemon's decode workers."""
    found = []
    for child in children(m.proc.pid):
        try:
            command = Path(f"/proc/{child}/cmdline").read_bytes()
        except OSError:  # (it ended between the listing and here: a killed worker on its way out)
            continue
        if b"xetfs.read.decode_worker" in command:
            found.append(child)
    return found


def _wait_for_workers(m: Mount, n: int) -> None:
    """The workers start once the mount answers; wait until all ``n`` have said they are ready."""
    m.wait_for_workers()
    assert f"decoding in {n} worker processes" in m.log()
    wait_until(lambda: len(_workers(m)) == n, 20, "the decode worker processes", m.proc, m.log_path)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_reads_are_decoded_in_workers(basic_store: OracleStore) -> None:
    with mounted(basic_store.path, "--workers", "2", "--direct-io") as m:
        _wait_for_workers(m, 2)
        for f in basic_store.unique():
            assert _sha256(m / f".xetfs/by-hash/{f.hash}") == f.sha256, f.name
        decode = m.stats()["decode"]
        assert decode["in_workers"] > 0 and decode["layouts_in_workers"] > 0
        assert decode["worker_fallbacks"] == 0
        assert "decoding in 2 worker processes" in m.log()


def test_workers_0_decodes_in_the_daemon(basic_store: OracleStore) -> None:
    with mounted(basic_store.path, "--workers", "0", "--direct-io") as m:
        assert _workers(m) == []
        for f in basic_store.unique():
            assert _sha256(m / f".xetfs/by-hash/{f.hash}") == f.sha256, f.name
        decode = m.stats()["decode"]
        assert decode["in_workers"] == 0 and decode["layouts_in_workers"] == 0 and decode["chunks"] > 0


def _read_killing_the_workers(m: Mount, f: OracleFile) -> None:
    """Read ``f`` through ``m``, killing both decode workers after its first 8 MiB; every byte must come, and
    two workers are started in their place."""
    path = m / f".xetfs/by-hash/{f.hash}"
    _wait_for_workers(m, 2)
    with open(path, "rb") as src:
        src.read(8 << 20)  # the workers are busy with prefetch now
        killed = _workers(m)
        for pid in killed:
            os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not any(_alive(p) for p in killed), 10, "the killed workers to be reaped", m.proc,
                   m.log_path)  # fmt: skip
        rest = src.read()
    assert len(rest) == f.size - (8 << 20)
    assert _sha256(path) == f.sha256
    wait_until(lambda: m.stats()["workers"]["alive"] == 2, 20, "workers started in their place", m.proc, m.log_path)
    assert not set(killed) & set(_workers(m))


def test_a_killed_worker_costs_no_read(big_store: OracleStore) -> None:
    f = big_store["big.bin"]
    with mounted(big_store.path, "--workers", "2", "--direct-io", allow_errors=True) as m:
        _read_killing_the_workers(m, f)
        assert len(re.findall(r"decode worker \d+ stopped", m.log())) == 2
        assert "decoding in the daemon" in m.log()
        assert m.stats()["errors"] == {"integrity": 0, "missing": 0, "format": 0, "timeout": 0, "io": 0}


def test_unmount_ends_the_workers(basic_store: OracleStore) -> None:
    with mounted(basic_store.path, "--workers", "2") as m:
        _wait_for_workers(m, 2)
        pids = _workers(m)
    # mounted() has unmounted and waited for the daemon
    wait_until(lambda: not any(_alive(p) for p in pids), 10, "the workers to exit")


def test_a_killed_worker_costs_no_read_of_a_remote_store(big_store: OracleStore, tmp_path: Path) -> None:
    """Over nginx, the workers fetch, decode and verify; killed during a read, the daemon takes over."""
    from helpers import oracle, servers

    from xetfs.storage.remote import publish

    copy = oracle.copy_store(big_store, tmp_path / "store")
    publish(copy.path)
    f = big_store["big.bin"]
    with (
        servers.nginx(copy.path) as web,
        mounted(web.url, "--workers", "2", "--direct-io", "--disk-cache-size", "0", allow_errors=True) as m,
    ):
        _read_killing_the_workers(m, f)
        stats = m.stats()
        assert stats["decode"]["in_workers"] > 0  # remote runs decoded in workers (before the kill)
        assert stats["workers"]["lost"] == 2, stats["workers"]
        assert stats["errors"] == {"integrity": 0, "missing": 0, "format": 0, "timeout": 0, "io": 0}
        assert stats["remote"]["failed_reads"] == 0
