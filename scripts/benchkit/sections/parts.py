"""Section parts: the work a read path cannot avoid, per data set, in one tight loop (``benchkit/parts.py``).

Read every xorb into a reused buffer, decode every chunk, hash every chunk;
CPU seconds per GiB of decoded bytes for each step and in all.  Other
sections divide xetfs' CPU per GiB by the ceiling daemon's plus this, so
they ask for it too.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from benchkit.paths import SCRIPTS
from benchkit.rounds import Runner, Task
from benchkit.rows import Row, per_gib
from benchkit.sections import Section
from benchkit.util import BenchError, cat_to_null

PARTS_READ = Row("parts_read", "parts alone: read the xorbs (readinto, page cache)", "s/GiB")
PARTS_DECODE = Row("parts_decode", "parts alone: parse headers and decode chunks", "s/GiB")
PARTS_HASH = Row("parts_hash", "parts alone: hash every chunk (BLAKE3)", "s/GiB")
PARTS_TOTAL = Row("parts_total", "parts alone: all three", "s/GiB")

SECTIONS = (
    Section(
        "parts",
        "The parts alone, CPU s per GiB decoded (one process, one loop over every xorb of the data set)",
        lambda r: (PARTS_READ, PARTS_DECODE, PARTS_HASH, PARTS_TOTAL),
        lambda r: tuple(r.parts_columns),
    ),
)


def columns(args: Any, selected: set[str]) -> list[str]:
    return list(args.kinds) if "parts" in selected else []


def tasks(r: Runner, selected: set[str]) -> list[Task]:
    return [parts_task(r, k) for k in r.args.kinds] if "parts" in selected else []


def parts_task(r: Runner, column: str) -> Task:
    """The parts-alone measurement of one data set (other sections ask for it; it runs once per round)."""
    if column not in r.parts_columns:
        r.parts_columns.append(column)
    return Task("parts", column, "", lambda rnd: measure(r, column, rnd))


def measure(r: Runner, column: str, rnd: int) -> None:
    ds = r.data[column]
    cat_to_null(ds.xorbs)
    try:
        proc = subprocess.run(
            [sys.executable, str(SCRIPTS / "benchkit" / "parts.py"), *map(str, ds.xorbs)],
            capture_output=True,
            timeout=r.timeout_for(ds.stored_bytes),
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise BenchError("the parts-alone loop timed out") from None
    if proc.returncode != 0:
        raise BenchError(f"the parts-alone loop failed: {proc.stderr.decode(errors='replace').strip()}")
    res = json.loads(proc.stdout)
    n = res["bytes"]
    r.r.add(PARTS_READ, column, rnd, per_gib(n, res["read_s"]))
    r.r.add(PARTS_DECODE, column, rnd, per_gib(n, res["decode_s"]))
    r.r.add(PARTS_HASH, column, rnd, per_gib(n, res["hash_s"]))
    r.r.add(PARTS_TOTAL, column, rnd, per_gib(n, res["read_s"] + res["decode_s"] + res["hash_s"]))
