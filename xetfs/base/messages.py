"""How xetfs words what it tells a user: counts with the right plural, and one warning style.

Every line xetfs writes to stderr for a person starts with ``xetfs: `` and a
lower-case level (``xetfs: warning: ...``, ``xetfs: error: ...``), whether it
comes from ``print_warning`` or from the logging set up by the command line
(``UserFormatter``).  Counts go through ``plural``: ``1 file``, ``2 files``.
"""

from __future__ import annotations

import logging
import sys


def plural(n: int, word: str, many: str | None = None) -> str:
    """``"1 file"``, ``"0 files"``, ``"2 files"``: ``n`` and ``word``, or else ``many``.

    ``many`` defaults to ``word`` + ``s`` (``entry``: ``entries``).
    """
    if n == 1:
        return f"{n} {word}"
    if many is None:
        many = word[:-1] + "ies" if word.endswith("y") and word[-2:-1] not in tuple("aeiou") else word + "s"
    return f"{n} {many}"


def human_size(n: int) -> str:
    """``n`` bytes for a person: ``512 B``, ``3.2 MiB``, ``1.5 TiB``."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return str(n)


def print_warning(message: str) -> None:
    """Write ``xetfs: warning: MESSAGE`` on stderr."""
    print(f"xetfs: warning: {message}", file=sys.stderr)


def print_error(message: str) -> None:
    """Write ``xetfs: error: MESSAGE`` on stderr."""
    print(f"xetfs: error: {message}", file=sys.stderr)


class UserFormatter(logging.Formatter):
    """Log records as ``xetfs: LEVEL: message`` with the level in lower case, as ``print_warning`` writes them;
    with ``stamped``, after the time and process id (a long-running server of several processes)."""

    def __init__(self, *, stamped: bool = False) -> None:
        super().__init__("%(message)s")
        self.stamped = stamped

    def format(self, record: logging.LogRecord) -> str:
        line = f"xetfs: {record.levelname.lower()}: {super().format(record)}"
        return f"{self.formatTime(record)} [{record.process}] {line}" if self.stamped else line
