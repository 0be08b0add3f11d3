"""A byte flipped in a chunk's payload, in a store read from its directory, from nginx and from S3.

One test over the sources and over the three compression schemes of the damaged chunk (raw, LZ4,
byte-grouped).  For each it checks the three ways a user meets the damage:

* the command: ``verify`` names the xorb and the chunk; ``cat`` fails, with one error line naming
  the xorb, for exactly the files that use the chunk, and every other file reads back; the damaged
  file's bytes before and after the chunk still read;
* a mount read block by block (``--direct-io``): exactly the 64 KiB reads that touch the chunk fail
  with ``EIO``, each logged once naming the file, the offset, the xorb and the chunk, and counted as
  an integrity error (a raw chunk) or an integrity or format error (a compressed one);
* a mount read as programs read: a stream stops with ``EIO`` at the chunk with every byte before it
  right, a ``pread`` inside the chunk fails again, ``cat`` fails with "Input/output error", ``cmp``
  of every other file passes afterwards, and every ERROR line names the file, the xorb and the chunk.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import oracle, servers
from helpers.damage import (
    all_locs,
    check_cli_contained,
    check_contained,
    check_error_log,
    errors_of,
    files_using,
    sole_xorb,
    verify_problems,
)
from helpers.mounting import mounted
from helpers.oracle import CliRunner, OracleStore

pytestmark = pytest.mark.fuse

SOURCES = ["directory", "nginx", "s3"]
SCHEMES = [("a.bin", 0), ("c.txt", 1), ("e.f32", 2)]


@pytest.fixture
def store(multi_store: OracleStore, tmp_path: Path) -> OracleStore:
    """A private copy of the multi store (one upload call per file) to damage."""
    return oracle.copy_store(multi_store, tmp_path / "store")


@contextlib.contextmanager
def served(source: str, store: OracleStore, cli: CliRunner, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Where the damaged ``store`` is read from: its directory, or a URL serving it as it is now."""
    if source == "directory":
        yield str(store.path)
    elif source == "nginx":
        assert cli("publish", store.path).returncode == 0  # the listing an HTTP store needs
        with servers.nginx(store.path) as web:
            yield web.url
    else:
        with servers.moto_s3() as s3:
            for key, value in {**servers.S3_ENV, "AWS_ENDPOINT_URL": s3.url}.items():
                monkeypatch.setenv(key, value)  # for this process and the ones it starts
            url = "s3://damaged/store"
            servers.upload_dir(url, s3.url, store.path)
            yield url


def run(*cmd: object) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([str(c) for c in cmd], capture_output=True, check=False, timeout=60)


@pytest.mark.parametrize(("name", "scheme"), SCHEMES)
@pytest.mark.parametrize("source", SOURCES)
def test_a_flipped_byte_fails_only_the_reads_that_need_it(
    store: OracleStore, cli: CliRunner, monkeypatch: pytest.MonkeyPatch, source: str, name: str, scheme: int
) -> None:
    f = store[name]
    data = f.read()
    xorb = sole_xorb(store, name)
    chunks = oracle.xorb_chunks(store.xorb_path(xorb))
    locs = oracle.file_chunks(store, f.hash)
    # A chunk in the middle of the file, compressed with the scheme under test.
    loc = next(c for c in locs[len(locs) // 2 :] if chunks[c.chunk].scheme == scheme)
    chunk = chunks[loc.chunk]
    affected = files_using(store, xorb, loc.chunk)
    assert f.hash in affected
    every_loc = all_locs(store)
    oracle.flip_byte(store.xorb_path(xorb), chunk.payload_start + (chunk.phys_end - chunk.payload_start) // 2)
    remote = [] if source == "directory" else ["--disk-cache-size", "0"]  # every read goes to the server

    with served(source, store, cli, monkeypatch) as where:
        # -- the command
        problems = verify_problems(store, source=where, args=remote)
        pattern = re.compile(rf"\bxorb {xorb}\b.*\bchunk {loc.chunk}\b")
        assert any(pattern.search(p) for p in problems), problems
        check_cli_contained(cli, store, affected, xorb, source=where, args=remote)
        # The rest of the damaged file is still readable: everything before and after the chunk.
        head = cli("cat", where, f.hash, "--length", loc.start, *remote)
        assert (head.returncode, head.stdout) == (0, data[: loc.start])
        tail = cli("cat", where, f.hash, "--offset", loc.end, *remote)
        assert (tail.returncode, tail.stdout) == (0, data[loc.end :])

        # -- a mount read block by block
        with mounted(where, "--direct-io", *remote, allow_errors=True) as m:
            failed, per_file = check_contained(m, store, every_loc, lambda x, c: (x, c) == (xorb, loc.chunk))
            assert f.hash in per_file
            check_error_log(m, per_file, xorb, f"chunk {loc.chunk}")
            e = errors_of(m)
            if scheme == 0:  # a raw chunk always decodes: only its hash can tell
                assert e == {"integrity": failed, "missing": 0, "format": 0, "timeout": 0, "io": 0}
            else:
                assert e["integrity"] + e["format"] == failed and e["missing"] == e["timeout"] == 0, e

        # -- a mount read as programs read (through the page cache)
        with mounted(where, *remote, allow_errors=True) as m:
            got = bytearray()
            fd = os.open(m.path / f.hash, os.O_RDONLY)
            try:
                with pytest.raises(OSError) as exc:
                    while block := os.read(fd, 65536):
                        got += block
                assert exc.value.errno == errno.EIO
                with pytest.raises(OSError) as again:
                    os.pread(fd, 10, loc.start + min(50, (loc.end - loc.start) // 2))
                assert again.value.errno == errno.EIO
            finally:
                os.close(fd)
            assert data.startswith(got)
            tool = run("cat", m.path / f.hash)
            assert tool.returncode != 0 and b"Input/output error" in tool.stderr
            assert data.startswith(tool.stdout)
            for other in store.unique():  # still fine after the errors
                if other.hash not in affected:
                    assert run("cmp", m.path / other.hash, other.path).returncode == 0, other.name
            e = errors_of(m)
            if scheme == 0:
                assert e["integrity"] >= 1 and e["format"] == e["missing"] == 0, e
            else:
                assert e["integrity"] + e["format"] >= 1 and e["missing"] == 0, e
            log = m.log()
    errors = [line for line in log.splitlines() if " ERROR " in line]
    assert errors, log
    assert all(f.hash in line and xorb in line and f"chunk {loc.chunk}" in line for line in errors), errors
    assert "Traceback" not in log
