"""What several sections share: decode amplification, CPU rows per GiB, and a child process that reports JSON."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

from benchkit.mounts import Daemon
from benchkit.rows import Get, Row
from benchkit.sections.parts import PARTS_TOTAL
from benchkit.util import BenchError


def decoded_chunks(x: Daemon) -> int:
    """Chunks the xetfs daemon has decoded so far (its .xetfs/stats)."""
    return int(x.stats()["decode"]["chunks"])


def settled_stats(x: Daemon, quiet: float = 0.2, deadline: float = 10.0) -> dict[str, Any]:
    """The daemon's counters once no chunk has been decoded for ``quiet`` seconds (prefetches that were
    under way when a reader finished have ended), or at ``deadline``."""
    end = time.monotonic() + deadline
    stats = x.stats()
    while time.monotonic() < end:
        time.sleep(quiet)
        now = x.stats()
        if now["decode"]["chunks"] == stats["decode"]["chunks"]:
            return now
        stats = now
    return stats


def vs_floor(daemon: Row, workers: Row, ceiling: Row) -> Any:
    """Per round: (xetfs daemon + workers) / (ceiling daemon + the parts alone), all in CPU s per GiB."""

    def f(get: Get) -> float | None:
        d, w, c, p = (get(r) for r in (daemon, workers, ceiling, PARTS_TOTAL))
        if d is None or w is None or c is None or p is None or c + p <= 0:
            return None
        return (d + w) / (c + p)

    return f


def run_json(
    argv: Sequence[str], what: str, timeout: float, stdin: str | None = None, env: dict[str, str] | None = None
) -> dict[str, Any]:
    """Run a child process that prints one JSON object; a failure or a timeout is a BenchError naming ``what``."""
    try:
        proc = subprocess.run(
            [sys.executable, *argv], input=stdin, capture_output=True, text=True, timeout=timeout, check=False, env=env
        )
    except subprocess.TimeoutExpired:
        raise BenchError(f"{what} took more than {timeout:.0f} s") from None
    if proc.returncode != 0:
        raise BenchError(f"{what} failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
    try:
        return dict(json.loads(proc.stdout.strip().splitlines()[-1]))
    except (ValueError, IndexError):
        raise BenchError(f"{what} printed no JSON: {proc.stdout[:200]!r} {proc.stderr[-500:]!r}") from None
