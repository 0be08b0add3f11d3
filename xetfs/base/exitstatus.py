"""The exit statuses of the ``xetfs`` command, in one place.

Every command returns one of these; the documentation's table of exit
statuses is made from ``ExitStatus`` and its ``MEANING``, so a new status
belongs here first.
"""

from __future__ import annotations

import enum


class ExitStatus(enum.IntEnum):
    OK = 0
    ERROR = 1  # a deliberate error (one ``xetfs: error:`` line on stderr), or an OSError
    USAGE = 2  # bad arguments
    PROBLEMS = 3  # ``verify`` found damage in the store
    SKIPPED = 4  # ``pack`` finished, but skipped some files (see its warnings); ``pack --strict`` fails instead
    INTERRUPTED = 130  # SIGINT (Ctrl-C), as a shell reports a program it ended: 128 + 2
    BROKEN_PIPE = 141  # the output pipe was closed: what a shell shows for a program killed by SIGPIPE


MEANING: dict[ExitStatus, str] = {
    ExitStatus.OK: "success",
    ExitStatus.ERROR: "an error, described on stderr in one line",
    ExitStatus.USAGE: "bad arguments",
    ExitStatus.PROBLEMS: "verify found damage in the store (each problem is a PROBLEM: line)",
    ExitStatus.SKIPPED: "pack wrote the store but skipped some files (each named by a warning)",
    ExitStatus.INTERRUPTED: "interrupted by SIGINT (Ctrl-C); a foreground mount unmounted cleanly",
    ExitStatus.BROKEN_PIPE: "the reader of the output went away before it was all written",
}
