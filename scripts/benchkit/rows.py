"""Rows of the report: each declared once, with its key, label, unit and how its figure is made.

A ``Row`` is either measured (a task records values under it with
``Results.add``) or derived per round from other rows (``ratio``,
``derive``): the two sides of a ratio were measured in the same round, close
together, so the ratio is taken per round and then summarised like any other
figure.  A row marked ``xetfs`` is measured for every xetfs variant (the
working tree, and the baseline with ``--baseline``).
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

CURRENT = ""  # the variant name of the working tree's xetfs

Get = Callable[["Row"], float | None]  # a row's value in one round (None: not measured)


@dataclass(frozen=True)
class Variant:
    """Which xetfs runs: ``CURRENT`` is the working tree; a baseline has its own Python (a venv) and a label."""

    name: str
    python: str
    label: str


@dataclass(frozen=True)
class Target:
    op: str  # ">=" or "<="
    value: float | tuple[tuple[str, float], ...]  # per column when a tuple of pairs
    text: str

    def limit(self, column: str) -> float | None:
        if isinstance(self.value, tuple):
            return dict(self.value).get(column)
        return self.value

    def check(self, column: str, x: float) -> bool | None:
        limit = self.limit(column)
        if limit is None:
            return None
        return x >= limit if self.op == ">=" else x <= limit


@dataclass(frozen=True, eq=False)
class Row:
    key: str
    label: str
    unit: str  # "GB/s", "MB/s", "x", "us", "s", "MiB", "%", "IOPS", "s/GiB", "/GiB" (a count per GiB)
    target: Target | None = None
    derive: Callable[[Get], float | None] | None = None  # per round, from other rows
    xetfs: bool = False  # measured once per xetfs variant

    def __hash__(self) -> int:
        return hash(self.key)


def ratio(num: Row, den: Row) -> Callable[[Get], float | None]:
    """``num / den`` in one round."""

    def f(get: Get) -> float | None:
        a, b = get(num), get(den)
        return a / b if a is not None and b else None

    return f


def cores() -> int:
    """The cores this process may run on (its CPU affinity), which every process it starts inherits."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


SPEED_UNITS = {"GB/s": 1e9, "MB/s": 1e6}


def busy(
    time: Row, cpu: Sequence[Row], ncores: int | None = None, gib: float | None = None
) -> Callable[[Get], float | None]:
    """Per round: how busy the cores were, in percent: (CPU seconds / cores) / wall seconds x 100.

    This is the inverse of "time / (CPU seconds / cores)": 100 % means every
    core was busy all along (the figure is CPU-bound), 50 % that half of
    the cores' time went unused.  ``cpu`` rows are summed.  Pairs of units
    it understands, so that one measurement needs no extra row:

    * ``time`` a speed (GB/s, MB/s of some bytes) and ``cpu`` in s/GiB of
      the same bytes: the byte count cancels out;
    * ``time`` in s and ``cpu`` in s (CPU seconds of the same measurement);
    * ``time`` in s and ``cpu`` in s/GiB, given ``gib``, the GiB the CPU
      rows are per.

    Anything else raises ``ValueError`` when the row is declared.
    """
    n = ncores or cores()
    units = {r.unit for r in cpu}
    if len(units) != 1:
        raise ValueError(f"busy({time.key}): CPU rows in mixed units {sorted(units)}")
    (unit,) = units
    if time.unit in SPEED_UNITS and unit == "s/GiB":
        scale = SPEED_UNITS[time.unit] / 2**30

        def from_speed(get: Get) -> float | None:
            speed, used = get(time), _total(get, cpu)
            return None if speed is None or used is None else 100 * used * speed * scale / n

        return from_speed
    if time.unit == "s" and (unit == "s" or (unit == "s/GiB" and gib)):
        factor = gib if unit == "s/GiB" and gib else 1.0

        def from_time(get: Get) -> float | None:
            wall, used = get(time), _total(get, cpu)
            return None if not wall or used is None else 100 * used * factor / n / wall

        return from_time
    why = " without gib" if unit == "s/GiB" else ""
    raise ValueError(f"busy({time.key}): cannot relate {time.unit} to CPU in {unit}{why}")


def _total(get: Get, rows: Sequence[Row]) -> float | None:
    values = [get(r) for r in rows]
    return None if any(v is None for v in values) else sum(v for v in values if v is not None)


def busy_row(key: str, what: str, time: Row, cpu: Sequence[Row], gib: float | None = None) -> Row:
    """A derived row ``busy_KEY``: how busy the cores were during ``time`` (see ``busy``)."""
    return Row(f"busy_{key}", f"cores busy, %: {what}", "%", derive=busy(time, cpu, gib=gib), xetfs=time.xetfs)


def per_gib(nbytes: int, seconds: float) -> float:
    return seconds / (nbytes / 2**30)


def summarize(values: list[float]) -> tuple[float, float, float]:
    return statistics.median(values), min(values), max(values)


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile by nearest rank (``values`` need not be sorted)."""
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))]


class Results:
    """Per-round values: ``add(row, column, round, value, variant)``; derived rows are computed on demand."""

    def __init__(self) -> None:
        self.samples: dict[tuple[str, str, str], dict[int, float]] = {}
        self.errors: list[str] = []

    def add(self, row: Row, column: str, rnd: int, value: float | None, variant: str = CURRENT) -> None:
        if row.derive is not None:
            raise ValueError(f"row {row.key} is derived; it takes no values")
        if rnd < 0 or value is None:
            return  # a warm-up round, or nothing measured
        self.samples.setdefault((row.key, column, variant if row.xetfs else CURRENT), {})[rnd] = value

    def _by_round(self, row: Row, column: str, variant: str) -> dict[int, float]:
        return self.samples.get((row.key, column, variant if row.xetfs else CURRENT), {})

    def rounds(self) -> list[int]:
        return sorted({r for d in self.samples.values() for r in d})

    def value_at(self, row: Row, column: str, variant: str, rnd: int) -> float | None:
        """The row's figure in one round, or None."""
        if row.derive is None:
            return self._by_round(row, column, variant).get(rnd)
        return row.derive(lambda other: self.value_at(other, column, variant, rnd))

    def values(self, row: Row, column: str, variant: str = CURRENT) -> list[float]:
        """The row's figures, one per round in which it could be made."""
        out = []
        for rnd in self.rounds():
            v = self.value_at(row, column, variant, rnd)
            if v is not None:
                out.append(v)
        return out

    def versus(self, row: Row, column: str, variant: str) -> list[float]:
        """Per round: the working tree's figure over ``variant``'s."""
        out = []
        for rnd in self.rounds():
            a = self.value_at(row, column, CURRENT, rnd)
            b = self.value_at(row, column, variant, rnd)
            if a is not None and b:
                out.append(a / b)
        return out
