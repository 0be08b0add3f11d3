"""The daemon's log file, and its removal after a mount that had nothing to say.

A background mount logs to a file (by default one per mountpoint under
``$XDG_STATE_HOME/xetfs``, see ``mount.default_log_file``).  ``LogFile``
writes it and remembers the most severe record and how many bytes it wrote,
so that ``drop_if_clean`` can take back what a mount that ended cleanly,
with nothing logged at warning or above, added: the file is removed when
it was empty before, else cut back to its earlier length.  Anything else
written there (the daemon's stderr: a crash, a traceback) keeps the file.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path


class LogFile(logging.FileHandler):
    """A ``FileHandler`` (append mode) that can tell whether it wrote everything since it opened, all below
    warning."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, mode="a", encoding="utf-8", delay=False)
        self.path = path
        self.start = path.stat().st_size  # (opened, so it exists)
        self.written = 0
        self.worst = logging.NOTSET

    def emit(self, record: logging.LogRecord) -> None:
        self.worst = max(self.worst, record.levelno)
        with contextlib.suppress(Exception):  # (a record that cannot be formatted is reported by emit below)
            self.written += len((self.format(record) + self.terminator).encode("utf-8"))
        super().emit(record)

    def drop_if_clean(self) -> bool:
        """Close, then remove what this handler added if nothing else was written and nothing reached warning.

        Returns True when the file was removed or cut back.  Call it only
        when the mount ended cleanly.
        """
        self.close()
        if self.worst >= logging.WARNING:
            return False
        try:
            size = self.path.stat().st_size
            if size != self.start + self.written:
                return False  # something else wrote there too
            if self.start == 0:
                self.path.unlink()
            else:
                os.truncate(self.path, self.start)
        except OSError:
            return False
        return True
