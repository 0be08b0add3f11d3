"""Packs of a Hugging Face cache and the clients that read one: the xetfs command as a child process,
``hub_clients.py`` on a cache, ``diff -r`` of two trees."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from helpers import hub_cache
from helpers.oracle import REPO_ROOT, hf_xet_env

HERE = Path(__file__).resolve().parent


def xetfs(tmp: Path, *args: object, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "xetfs", *map(str, args)],
        capture_output=True, text=True, cwd=REPO_ROOT, env=hf_xet_env(tmp / "hf_xet"), timeout=120, check=False,
    )  # fmt: skip
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def clients(cache: Path, tmp: Path) -> dict[str, Any]:
    """The report of ``hub_clients.py`` run on ``cache``, offline."""
    env = dict(hf_xet_env(tmp / "hf_xet"), HF_HUB_CACHE=str(cache), HF_HUB_OFFLINE="1", HF_HOME=str(tmp / "hf_home"),
               TRANSFORMERS_OFFLINE="1", TRANSFORMERS_VERBOSITY="error", NO_COLOR="1")  # fmt: skip
    proc = subprocess.run([sys.executable, str(HERE / "hub_clients.py")], capture_output=True, text=True, env=env,
                          timeout=120, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return dict(json.loads(proc.stdout))


def diff(a: Path, b: Path) -> str:
    """``diff -r`` (symlinks followed; the mount's ``.xetfs`` is hidden from listings)."""
    proc = subprocess.run(["diff", "-r", str(a), str(b)], capture_output=True, text=True, check=False)
    return proc.stdout + proc.stderr


@dataclass
class Imported:
    spec: hub_cache.CacheSpec
    store: Path
    tmp: Path
    pack: subprocess.CompletedProcess[str]
