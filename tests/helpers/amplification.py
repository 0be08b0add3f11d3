"""What a mount decodes for the reads it gets: the chunks reads touch, and the counters once prefetch is done."""

from __future__ import annotations

import json
from typing import Any

from helpers import oracle
from helpers.mounting import Mount, wait_until
from helpers.oracle import OracleStore

MOST = 1.05


SETTLE_DEADLINE = 10.0


def loaded(stats: dict[str, Any]) -> int:
    """The chunks that reads and prefetch (reading ahead in a xorb included) asked to be loaded: once every load
    is done and none failed, the chunks decoded (``decode.chunks``)."""
    return int(stats["cache"]["misses"] + stats["prefetch"]["chunks"])


def chunk_set(store: OracleStore, name: str, reads: list[tuple[int, int]] | None = None) -> set[tuple[str, int]]:
    """The distinct chunks a file's reads touch (all of the file by default)."""
    locs = oracle.file_chunks(store, store[name].hash)
    if reads is None:
        return {(c.xorb, c.chunk) for c in locs}
    return {(c.xorb, c.chunk) for off, n in reads for c in locs if c.start < off + n and c.end > off}


def settled(m: Mount) -> dict[str, Any]:
    """The counters once background prefetch is done (polled, with a deadline)."""
    last = [m.stats()]

    def quiet() -> bool:
        now = m.stats()
        same = all(now[k] == last[0][k] for k in ("cache", "decode", "prefetch", "store"))
        last[0] = now
        return same and loaded(now) == now["decode"]["chunks"]

    try:
        wait_until(quiet, SETTLE_DEADLINE, "the counters to settle", m.proc, m.log_path)
    except Exception as exc:
        raise AssertionError(
            f"{exc}\nlast counters: {json.dumps({k: last[0][k] for k in ('cache', 'decode', 'prefetch', 'store')})}"
        ) from None
    return last[0]


def decoded(m: Mount) -> int:
    return int(settled(m)["decode"]["chunks"])
