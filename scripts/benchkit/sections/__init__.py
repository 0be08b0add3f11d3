"""The sections of the benchmark, each selectable with ``--only``.

A section module declares its rows (``Row`` constants, one key each), the
tables it shows (``SECTIONS``), the data it needs (``columns``) and the
tasks that measure it (``tasks``).  To add a section: write a module with
those three names and add it to ``GROUPS`` below.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from benchkit.rows import Row


@dataclass(frozen=True)
class Section:
    name: str
    title: str | Callable[[Any], str]  # or made from the Runner
    rows: Callable[[Any], tuple[Row, ...]]  # given the Runner
    columns: Callable[[Any], tuple[str, ...]]  # given the Runner
    also: tuple[str, ...] = ()  # other --only names that show this section too

    def title_for(self, runner: Any) -> str:
        return self.title(runner) if callable(self.title) else self.title


def _groups() -> tuple[ModuleType, ...]:
    from benchkit.sections import (
        fio,
        first_read,
        hub,
        load,
        mount,
        parquet,
        parts,
        remote,
        same_file,
        sequential,
        serve,
        small_files,
    )

    return (sequential, mount, load, parquet, fio, same_file, parts, remote, hub, small_files, first_read, serve)


GROUPS = _groups()
SECTIONS: dict[str, Section] = {s.name: s for g in GROUPS for s in g.SECTIONS}
