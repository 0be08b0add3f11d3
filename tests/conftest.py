"""Shared fixtures: stores written by hf_xet (built once per session) and in-process CLI runs.

Store fixtures are session-scoped and read-only by convention: a test that
damages a store works on a copy (``oracle.copy_store``).
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import oracle
import pytest
from oracle import CliResult, CliRunner, OracleStore


@pytest.fixture(scope="session", autouse=True)
def state_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Daemon logs that default to ``$XDG_STATE_HOME/xetfs`` land in the session's temporary directory.

    Set in the environment, so mounts started as subprocesses inherit it.
    """
    path = tmp_path_factory.mktemp("state")
    saved = os.environ.get("XDG_STATE_HOME")
    os.environ["XDG_STATE_HOME"] = str(path)
    try:
        yield path
    finally:
        if saved is None:
            os.environ.pop("XDG_STATE_HOME", None)
        else:
            os.environ["XDG_STATE_HOME"] = saved


@pytest.fixture(scope="session")
def basic_store(tmp_path_factory: pytest.TempPathFactory) -> OracleStore:
    """One upload call: raw, LZ4 and BG4 content, empty, one byte, twelve small files."""
    return oracle.make_basic_store(tmp_path_factory.mktemp("basic"))


@pytest.fixture(scope="session")
def multi_store(tmp_path_factory: pytest.TempPathFactory) -> OracleStore:
    """One upload call per file; later files share content with earlier ones (see oracle.EDITS)."""
    return oracle.make_multi_store(tmp_path_factory.mktemp("multi"))


@pytest.fixture(scope="session")
def big_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OracleStore]:
    """A single 144 MB random file in three xorbs (a few seconds to build)."""
    tmp = tmp_path_factory.mktemp("big")
    yield oracle.make_big_store(tmp)
    shutil.rmtree(tmp, ignore_errors=True)  # 290 MB: do not keep it around after the session


@pytest.fixture
def cli(capsysbinary: pytest.CaptureFixture[bytes]) -> CliRunner:
    """Run ``xetfs.commands.cli.main(args)`` in this process and capture its output.

    Faster than a subprocess for many small calls.  ``main`` reconfigures
    logging on each call; the root logger is restored afterwards.
    """
    from xetfs.commands import cli as xetfs_cli

    def run(*args: object) -> CliResult:
        root = logging.getLogger()
        saved = (root.handlers[:], root.level)
        capsysbinary.readouterr()
        try:
            code = xetfs_cli.main([str(a) for a in args])
        finally:
            root.handlers[:], root.level = saved[0], saved[1]
        out, err = capsysbinary.readouterr()
        return CliResult(code, out, err.decode(errors="replace"))

    return run
