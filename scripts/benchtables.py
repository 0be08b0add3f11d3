#!/usr/bin/env python3
"""Markdown tables from a bench JSON (``scripts/bench.py --json PATH``): one table per section.

    .venv/bin/python scripts/benchtables.py out.json     # the tables on stdout

The JSON is the document ``benchkit.cli`` writes: ``meta`` (the run's
settings, machine and commit) and ``rows``, one per (row, column, variant)
with its per-round ``values``, ``median``, ``min``, ``max``, ``unit`` and
``target``.  Each section becomes one table: its rows in the bench's order,
one column per data kind, each cell ``median [min-max]`` formatted as the
bench prints it, with PASS or MISS where the row has a target.
``scripts/gendocs.py`` puts the tables of ``docs/bench.json`` into
``docs/performance.md``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchkit.report import COLUMN_LABEL, fmt_value


def _cell(row: Mapping[str, Any]) -> str:
    unit = row["unit"]
    text = f"{fmt_value(row['median'], unit)} [{fmt_value(row['min'], unit)}–{fmt_value(row['max'], unit)}]"
    if row.get("pass") is not None:
        text += " PASS" if row["pass"] else " MISS"
    return text


def _label(row: Mapping[str, Any]) -> str:
    label = str(row["label"]).replace("|", "\\|")
    unit = row["unit"]
    return f"{label} ({unit}; target {row['target']})" if row.get("target") else f"{label} ({unit})"


def run_line(meta: Mapping[str, Any], source: str) -> str:
    parts = [f"commit {meta.get('xetfs_commit', '?')}"]
    if meta.get("size") is not None:
        parts.append(f"{int(meta['size']) / 2**20:,.0f} MiB per data set")
    if meta.get("repeat") is not None:
        parts.append(f"{meta['repeat']} rounds")
    if meta.get("cpus") is not None:
        parts.append(f"{meta['cpus']} CPUs")
    if meta.get("kernel"):
        parts.append(f"kernel {meta['kernel']}")
    if meta.get("elapsed_s") is not None:
        parts.append(f"{meta['elapsed_s']:,.0f} s")
    return f"From `{source}`: " + ", ".join(parts) + ". Each cell: median [min–max] over the rounds."


def render_markdown(doc: Mapping[str, Any], source: str = "bench.json", *, headline: bool = True) -> str:
    """The tables of ``doc``: a heading per section, then its rows over its columns; first, with ``headline``,
    a line saying what was measured (``run_line``)."""
    rows: Sequence[Mapping[str, Any]] = doc.get("rows", [])
    sections: dict[str, dict[tuple[str, str], dict[str, Mapping[str, Any]]]] = {}
    columns: dict[str, list[str]] = {}
    for row in rows:
        section = str(row["section"])
        column = row.get("column") or ""
        label = _label(row)
        sections.setdefault(section, {}).setdefault((label, str(row["key"])), {})[column] = row
        cols = columns.setdefault(section, [])
        if column not in cols:
            cols.append(column)
    out = [run_line(doc.get("meta", {}), source)] if headline else []
    for section, table in sections.items():
        cols = columns[section]
        heads = [COLUMN_LABEL.get(c, c) or "value" for c in cols]
        out += ["", f"### {section}", "", "| row | " + " | ".join(heads) + " |", "|---" * (len(cols) + 1) + "|"]
        for (label, _key), cells in table.items():
            out.append(f"| {label} | " + " | ".join(_cell(cells[c]) if c in cells else "-" for c in cols) + " |")
    errors = doc.get("errors") or []
    if errors:
        out += ["", "Errors reported by the run:", ""] + [f"* {e}" for e in errors]
    return "\n".join(out) + "\n"


def target_rows(runs: Sequence[tuple[str, Mapping[str, Any]]]) -> str:
    """One table of every row with a target, each from the first of ``runs`` (name, JSON; newest first) that
    has it for its size of data sets: the latest figure of each target, and the run it comes from."""
    seen: dict[tuple[str, int, str, str], tuple[str, Mapping[str, Any], Mapping[str, Any]]] = {}
    for name, doc in runs:
        size = int(doc.get("meta", {}).get("size") or 0)
        for row in doc.get("rows", []):
            key = (str(row["section"]), size, str(row["key"]), str(row.get("column") or ""))
            if row.get("target") and not row.get("variant") and key not in seen:
                seen[key] = (name, doc.get("meta", {}), row)
    out = ["| section | row | data | median [min–max] | target | from |", "|---|---|---|---|---|---|"]
    for (section, _size, _key, column), (name, meta, row) in sorted(seen.items(), key=lambda i: i[0][:2]):
        label = str(row["label"]).replace("|", "\\|")
        data = COLUMN_LABEL.get(column, column) or "-"
        mib = f"{int(meta['size']) >> 20} MiB" if meta.get("size") is not None else "?"
        run = f"[{name}](bench-tables.md#{name.replace('.', '')}), {meta.get('xetfs_commit', '?')}, {mib}"
        out.append(f"| {section} | {label} | {data} | {_cell(row)} | {row['target']} | {run} |")
    return "\n".join(out)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: benchtables.py BENCH.json", file=sys.stderr)
        return 2
    path = Path(argv[0])
    sys.stdout.write(render_markdown(json.loads(path.read_text()), source=path.name))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
