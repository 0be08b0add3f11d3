"""``xetfs stats MNT``: a mount's counters for a person, as a summary or as the whole table.

The summary says in a dozen lines what the mount holds, what it served,
how its cache does and whether anything failed, naming a counter only when
it is not zero where zero is normal (errors, skipped shards, lost workers).
The table (``--all``) shows every counter of the document; the keys are
described in ``docs/stats.md``.
"""

from __future__ import annotations

import time
from typing import Any

from xetfs.base.messages import human_size, plural

LABEL = 10  # the width of the summary's first column


def format_stats(doc: dict[str, Any]) -> str:
    """The stats document as a two-column table, one section per group."""
    lines = []
    for group, values in doc.items():
        if not isinstance(values, dict):
            shown = f"{values:,.2f}" if isinstance(values, float) else "-" if values == "" else values
            lines.append(f"{group:<24}{shown}")  # (an empty text, as refresh_error after no failure: "-")
            continue
        lines.append(f"{group}:")
        for key, value in values.items():
            shown = f"{value:,.3f}" if isinstance(value, float) else f"{value:,}"  # (seconds: to the millisecond)
            if ("bytes" in key or key == "bytes") and isinstance(value, int) and value >= 1024:
                shown += f"  ({human_size(value)})"
            elif key.startswith("last_") and isinstance(value, int):  # (a time: Unix seconds, 0 if never)
                shown = _when(value)
            lines.append(f"  {key:<22}{shown}")
        if group == "cache" and values.get("hits", 0) + values.get("misses", 0):
            lines.append(f"  {'hit ratio':<22}{_ratio(values)}")
    return "\n".join(lines)


def summarize_stats(doc: dict[str, Any], mountpoint: str, source: str | None) -> str:
    """What ``xetfs stats MNT`` prints: one line per concern; ``source`` is the store, as the mount table names
    it (None if unknown)."""
    g: dict[str, dict[str, Any]] = {k: v for k, v in doc.items() if isinstance(v, dict)}
    index, reads, cache = g.get("index", {}), g.get("reads", {}), g.get("cache", {})
    decode, workers, prefetch = g.get("decode", {}), g.get("workers", {}), g.get("prefetch", {})
    remote, refresh = g.get("remote", {}), g.get("refresh", {})
    of = f" of {source}" if source else ""
    rows = [
        ("mount", f"{mountpoint}{of}: pid {doc.get('pid', '?')}, up {_duration(doc.get('uptime_seconds', 0.0))}"),
        ("files", f"{plural(index.get('files', 0), 'file')} in {plural(index.get('shards', 0), 'shard')}"
                  + _unusual(index, shards_skipped="skipped (bad shards: see the mount's log)")),
        ("reads", f"{plural(reads.get('requests', 0), 'request')}, {human_size(reads.get('bytes', 0))} returned"),
        ("cache", f"{human_size(cache.get('bytes', 0))} held of {human_size(cache.get('capacity_bytes', 0))}; "
                  f"hit ratio {_ratio(cache)}; {plural(cache.get('evictions', 0), 'eviction')}"),
        ("decoded", f"{plural(decode.get('chunks', 0), 'chunk')}, {human_size(decode.get('bytes', 0))} "
                    f"({decode.get('in_workers', 0):,} in workers)"
                    + _unusual(decode, worker_fallbacks="done in the daemon (worker lost)")),
        ("workers", f"{workers.get('alive', 0)} of {workers.get('workers', 0)} alive"
                    + _unusual(workers, lost="lost", hung="stopped as hung")),
        ("prefetch", f"{plural(prefetch.get('requests', 0), 'window')}, {plural(prefetch.get('chunks', 0), 'chunk')}"
                     f", {prefetch.get('hits', 0):,} used"),
        ("errors", _errors(g.get("errors", {}), remote.get("failed_reads", 0))),
        ("remote", _remote(remote, source)),
        ("refresh", _refresh(refresh, doc.get("refresh_error", ""))),
    ]  # fmt: skip
    lines = [f"{label:<{LABEL}}{text}" for label, text in rows]
    lines.append(f"(every counter: xetfs stats --all {mountpoint}; the keys: docs/stats.md)")
    return "\n".join(lines)


def _ratio(cache: dict[str, Any]) -> str:
    hits, misses = cache.get("hits", 0), cache.get("misses", 0)
    return f"{hits / (hits + misses):.1%}" if hits + misses else "-"


def _when(unix: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(unix)) if unix else "never"


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h" if days else f"{hours} h {minutes} min" if hours else f"{minutes} min {secs} s"


def _unusual(group: dict[str, Any], **meaning: str) -> str:
    """``"; N what"`` for each of the counters named in ``meaning`` that is not zero."""
    return "".join(f"; {group[key]:,} {what}" for key, what in meaning.items() if group.get(key))


def _errors(errors: dict[str, Any], out_of_reach: int) -> str:
    """The reads that failed, by cause: the ``errors`` group, and those whose server was out of reach (counted
    with the remote store's counters)."""
    failed = {key: n for key, n in errors.items() if n}
    if out_of_reach:
        failed["server out of reach or refusing"] = out_of_reach
    if not failed:
        return "none"
    total = sum(failed.values())
    causes = ", ".join(f"{key} {n:,}" for key, n in failed.items())
    return f"{plural(total, 'read')} failed with EIO ({causes}; the mount's log names each)"


def _remote(remote: dict[str, Any], source: str | None) -> str:
    if not remote.get("requests") and not remote.get("disk_hits") and not remote.get("disk_misses"):
        return "none (a local store)" if source and "://" not in source else "no requests yet"
    text = f"{plural(remote.get('requests', 0), 'request')}, {human_size(remote.get('bytes', 0))} received" + _unusual(
        remote,
        retries="retried",
        errors="failed",
        failed_reads="reads failed (server out of reach or refusing)",
    )
    if remote.get("hung"):
        text += (
            f"; taken for hung {plural(remote['hung'], 'time')}, {remote.get('not_requested', 0):,} fetches not asked"
        )
    if remote.get("disk_hits") or remote.get("disk_misses") or remote.get("disk_bytes"):
        text += (
            f"; disk cache {human_size(remote.get('disk_bytes', 0))}, {plural(remote.get('disk_hits', 0), 'hit')}, "
            f"{plural(remote.get('disk_misses', 0), 'miss', 'misses')}"
            + _unusual(remote, disk_corrupt="corrupt (fetched again)", disk_write_errors="not written")
        )
    return text  # fmt: skip


def _refresh(refresh: dict[str, Any], error: str) -> str:
    done = refresh.get("refreshes", 0)
    if not done and not refresh.get("failures"):
        return "never"
    text = f"{plural(done, 'refresh', 'refreshes')} (last {_when(refresh.get('last_refresh', 0))})"
    if refresh.get("failures"):
        text += f"; {refresh['failures']:,} failed (last {_when(refresh.get('last_failure', 0))}: {error or '?'})"
    return text
