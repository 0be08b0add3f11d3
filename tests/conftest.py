"""Shared fixtures: stores written by hf_xet (built once per session) and in-process CLI runs.

Store fixtures are session-scoped and read-only by convention: a test that
damages a store works on a copy (``oracle.copy_store``).

The hooks here give every test its tier and check what it needs from the machine
(``helpers/requirements.py`` says what the tiers and the ``fuse`` and ``root`` markers mean).
"""

from __future__ import annotations

import logging
import os
import random
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import oracle
from helpers.oracle import CliResult, CliRunner, OracleStore
from helpers.requirements import in_ci, missing_fuse, missing_root, tier_of
from hypothesis import settings

if not os.access(oracle.REPO_ROOT, os.W_OK):
    # Another user's checkout (the unit tier run as a user who is not root): hypothesis cannot keep its
    # examples in .hypothesis there, and would warn, which this suite makes an error.
    settings.register_profile("read-only-checkout", database=None)
    settings.load_profile("read-only-checkout")


def pytest_configure(config: pytest.Config) -> None:
    """One seed for the random points of a run (``XETFS_TEST_SEED``, drawn if unset): pytest-xdist's workers
    inherit it, so that they collect the same test ids, and an id that names it runs that case again."""
    os.environ.setdefault("XETFS_TEST_SEED", str(random.randrange(1 << 30)))


@pytest.hookimpl(tryfirst=True)  # before ``-m`` selects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test has exactly one tier; a ``fuse`` test is ``e2e`` and gets that marker here."""
    problems = []
    for item in items:
        try:
            tier = tier_of({mark.name for mark in item.iter_markers()})
        except ValueError as exc:
            problems.append(f"{item.nodeid}: {exc}")
            continue
        if tier is None:
            problems.append(f"{item.nodeid}: no tier (mark it, or its module, unit, integration or e2e)")
        elif item.get_closest_marker(tier) is None:
            item.add_marker(tier)
    if problems:
        raise pytest.UsageError("tests without one tier:\n  " + "\n  ".join(problems))


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test marked ``fuse`` or ``root`` is skipped, with the reason, where the machine lacks it."""
    reason = (missing_fuse() if item.get_closest_marker("fuse") else None) or (
        missing_root() if item.get_closest_marker("root") else None
    )
    if reason is not None:
        pytest.skip(reason)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Under ``CI=true`` a skipped test fails: the suite skips only for what the machine lacks."""
    outcome = yield
    report: pytest.TestReport = outcome.get_result()  # type: ignore[attr-defined]
    if report.skipped and in_ci() and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped under CI=true, where nothing may be: {reason}"


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
