"""docs/architecture.md lists the types one cold read meets: a traced read of a local and of a remote store
meets exactly those (``helpers.typetrace``: the daemon's side through ``XetFS.read``, with decode workers,
and the jobs it sent run again by a worker in the tracing process)."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import servers
from helpers.writer import SCHEME_LZ4, StoreBuilder
from test_layers import cold_read_types

from xetfs.base import hashes
from xetfs.storage.remote import publish

pytestmark = pytest.mark.integration

TESTS = Path(__file__).resolve().parent


def traced(store: str, file_hash: bytes, *options: str) -> set[str]:
    """The types ``helpers.typetrace`` saw, daemon and worker together."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, "-m", "helpers.typetrace", store, hashes.to_hex(file_hash), *options],
        capture_output=True, text=True, timeout=120, cwd=TESTS, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {line.split()[1] for line in proc.stdout.splitlines()}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bytes]:
    """A store of one file of 8 MB of text-like bytes (LZ4 chunks)."""
    root = tmp_path_factory.mktemp("store")
    rng = random.Random(7)
    words = [rng.randbytes(rng.randrange(3, 9)).hex().encode() for _ in range(500)]
    content = b" ".join(rng.choice(words) for _ in range(6 * 1024 * 1024 // 9))
    b = StoreBuilder(root)
    file_hash = b.add_file(content, scheme=SCHEME_LZ4)
    b.finish()
    return root, file_hash


def _difference(seen: set[str], listed: set[str]) -> str:
    return f"met but not listed: {sorted(seen - listed)}; listed but not met: {sorted(listed - seen)}"


def test_a_local_cold_read_meets_the_listed_types(store: tuple[Path, bytes]) -> None:
    root, file_hash = store
    both, local, _ = cold_read_types()
    seen = traced(str(root), file_hash)
    assert seen == set(both) | set(local), _difference(seen, set(both) | set(local))


def test_a_remote_cold_read_meets_the_listed_types(store: tuple[Path, bytes], tmp_path: Path) -> None:
    root, file_hash = store
    both, _, remote = cold_read_types()
    publish(root)
    with servers.nginx(root) as web:
        seen = traced(web.url, file_hash, "--cache-dir", str(tmp_path / "cache"))
    assert seen == set(both) | set(remote), _difference(seen, set(both) | set(remote))
