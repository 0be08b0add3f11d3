"""The report: tables of rows, rendered as text and as JSON, and the check that every row asked for has a figure.

A ``Table`` is what one section shows: its rows over its columns (data
kinds, or one column ``""``).  With a baseline, every xetfs row is followed
by the baseline's figure and by the working tree's figure over it, taken per
round.  A row that was asked for and has no figure in some column is
reported as an error (``missing``), never left out without a word.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from benchkit.rows import CURRENT, Results, Row, Variant, summarize

COLUMN_LABEL = {
    "random": "random (raw)",
    "text": "text (LZ4)",
    "float32": "float32 (BG4)",
    "model": "safetensors",
    "table": "parquet",
    "": "",
}


@dataclass(frozen=True)
class Table:
    section: str
    title: str
    columns: tuple[str, ...]
    rows: tuple[Row, ...]


@dataclass(frozen=True)
class Line:
    """One rendered line: a row for one variant, or a row's working tree / baseline ratio."""

    row: Row
    label: str
    unit: str
    variant: str
    versus: bool  # the working tree over ``variant``
    values: dict[str, list[float]]  # column -> per-round figures


def lines(results: Results, table: Table, variants: Sequence[Variant]) -> list[Line]:
    out = []
    for row in table.rows:
        vals = {c: results.values(row, c) for c in table.columns}
        out.append(Line(row, row.label, row.unit, CURRENT, False, vals))
        if not row.xetfs:
            continue
        for v in variants:
            if v.name == CURRENT:
                continue
            base = {c: results.values(row, c, v.name) for c in table.columns}
            out.append(Line(row, f"  baseline {v.label}", row.unit, v.name, False, base))
            vs = {c: results.versus(row, c, v.name) for c in table.columns}
            out.append(Line(row, f"  this tree / {v.label}", "x", v.name, True, vs))
    return out


def missing(results: Results, tables: Sequence[Table], variants: Sequence[Variant]) -> list[str]:
    """Every (row, column, variant) that was asked for and has no figure."""
    out = []
    for t in tables:
        for ln in lines(results, t, variants):
            for c in t.columns:
                if ln.versus and results.values(ln.row, c) and results.values(ln.row, c, ln.variant):
                    continue  # both figures are there: a ratio is undefined only when they are zero
                if not ln.values[c]:
                    where = f" [{c}]" if c else ""
                    who = "" if ln.variant == CURRENT else f" ({'vs ' if ln.versus else ''}{ln.variant})"
                    out.append(f"{t.section}: row {ln.row.key}{where}{who} ({ln.label.strip()}) has no figure")
    return out


def fmt_value(x: float, unit: str) -> str:
    if unit == "x":
        return f"{x:.2f}x"
    if unit in ("us", "MiB", "IOPS", "%", "/GiB") or abs(x) >= 1000:
        return f"{x:,.0f}"
    if unit == "s/GiB":
        return f"{x:.2f}"
    if unit == "s":
        return f"{x:.3f}" if x < 1 else f"{x:.2f}"
    return f"{x:.2f}" if x < 10 else f"{x:.1f}"


def cell_text(values: list[float], unit: str, row: Row | None = None, column: str = "") -> str:
    if not values:
        return "-"
    med, lo, hi = summarize(values)
    text = f"{fmt_value(med, unit)} [{fmt_value(lo, unit)}-{fmt_value(hi, unit)}]"
    if row is not None and row.target is not None:
        ok = row.target.check(column, med)
        if ok is not None:
            text += " PASS" if ok else " MISS"
    return text


def render(tables: Sequence[Table], results: Results, variants: Sequence[Variant], header: Sequence[str]) -> str:
    out = list(header)
    for t in tables:
        lns = lines(results, t, variants)
        texts = [
            [cell_text(ln.values[c], ln.unit, None if ln.variant != CURRENT else ln.row, c) for c in t.columns]
            for ln in lns
        ]
        label_w = 4 + max((len(ln.label) for ln in lns), default=30)
        width = max([14, *(len(x) for row in texts for x in row)])
        out += ["", t.title]
        if t.columns != ("",):
            out.append(" " * label_w + "".join(f"{COLUMN_LABEL.get(c, c):<{width + 2}}" for c in t.columns) + "target")
        for ln, row_texts in zip(lns, texts, strict=True):
            target = ln.row.target.text if ln.row.target and ln.variant == CURRENT else ""
            body = "".join(f"{x:<{width + 2}}" for x in row_texts)
            out.append(f"  {ln.label:<{label_w - 2}}{body}{target}".rstrip())
    return "\n".join(out)


def to_json(tables: Sequence[Table], results: Results, variants: Sequence[Variant]) -> list[dict[str, Any]]:
    rows = []
    for t in tables:
        for ln in lines(results, t, variants):
            for c, vals in ln.values.items():
                if not vals:
                    continue
                med, lo, hi = summarize(vals)
                target = ln.row.target if ln.variant == CURRENT and not ln.versus else None
                rows.append(
                    {
                        "section": t.section,
                        "key": ln.row.key,
                        "label": ln.label.strip(),
                        "variant": ln.variant or None,
                        "versus": ln.versus,
                        "column": c or None,
                        "unit": ln.unit,
                        "values": vals,
                        "median": med,
                        "min": lo,
                        "max": hi,
                        "target": f"{target.op} {target.limit(c)}" if target and target.limit(c) is not None else None,
                        "pass": target.check(c, med) if target else None,
                    }
                )
    return rows
