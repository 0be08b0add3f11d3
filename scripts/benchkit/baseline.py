"""--baseline REF: another commit of xetfs, installed into a temporary venv, to run beside the working tree.

``git archive REF`` (only what is committed at REF) is unpacked into a
temporary directory and ``pip install``-ed, with its runtime dependencies,
into a fresh venv made by this Python.  pip's own cache and the configured
indexes are used as usual, so a second install of the same dependencies is
quick.  Its daemons run with that venv's Python from a directory outside the
repository, so the working tree's package is never imported by mistake.
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from benchkit.paths import REPO
from benchkit.rows import Variant
from benchkit.util import BenchError, log

BASELINE = "base"


def resolve(ref: str) -> str:
    """The full commit id of ``ref`` in this repository."""
    proc = subprocess.run(["git", "rev-parse", "--verify", f"{ref}^{{commit}}"], capture_output=True, text=True,
                          cwd=REPO, check=False)  # fmt: skip
    if proc.returncode != 0:
        raise BenchError(f"--baseline {ref}: not a commit of {REPO}: {proc.stderr.strip()}")
    return proc.stdout.strip()


def install(ref: str, tmp: Path) -> Variant:
    """Install xetfs at ``ref`` into a venv under ``tmp``; the variant that runs it."""
    commit = resolve(ref)
    root = Path(tempfile.mkdtemp(prefix="baseline-", dir=tmp))
    src, venv = root / "src", root / "venv"
    log(f"installing the baseline xetfs {commit[:10]} ({ref}) into {venv}")
    archive = root / "src.tar"
    with open(archive, "wb") as out:
        subprocess.run(["git", "archive", "--format=tar", commit], stdout=out, cwd=REPO, check=True)
    src.mkdir()
    with tarfile.open(archive) as tar:
        tar.extractall(src, filter="data")
    archive.unlink()
    steps = [
        [sys.executable, "-m", "venv", str(venv)],
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check", "-q", str(src)],
    ]
    for cmd in steps:
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=root, check=False)
        if proc.returncode != 0:
            raise BenchError(f"installing the baseline failed: {' '.join(cmd)}:\n{proc.stderr.strip()[-2000:]}")
    # Its daemons run through a wrapper that drops PYTHONPATH: a working tree run with PYTHONPATH pointing
    # at it (a git worktree beside an editable install) must not make the baseline import that tree.
    python = str(venv / "bin" / "python-baseline")
    Path(python).write_text(f'#!/bin/sh\nunset PYTHONPATH\nexec "{venv / "bin" / "python"}" "$@"\n')
    Path(python).chmod(0o755)
    check = subprocess.run([python, "-c", "import xetfs, sys; print(xetfs.__file__)"], capture_output=True, text=True,
                           cwd=root, check=False)  # fmt: skip
    if check.returncode != 0 or not check.stdout.strip().startswith(str(venv)):
        raise BenchError(f"the baseline venv does not import its own xetfs: {check.stdout}{check.stderr}")
    return Variant(BASELINE, python, commit[:7])
