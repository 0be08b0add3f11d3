"""Credentials from a file, for mounts started without an environment (``/etc/fstab``, systemd units).

The file holds the environment variables the remote options read
(``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_ENDPOINT_URL``,
``GOOGLE_SERVICE_ACCOUNT``, ``AZURE_STORAGE_ACCOUNT_KEY``,
``XETFS_HTTP_TOKEN``, ...), one ``NAME=VALUE`` a line, as in a systemd
``EnvironmentFile``: blank lines and lines starting with ``#`` are skipped,
a leading ``export`` is allowed, and a value may be quoted.  Since it holds
secrets, a file that other users may read is refused.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from xetfs.base.errors import XetfsError

_LINE = re.compile(r"(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.*)")


class CredentialsError(XetfsError):
    """A credentials file that cannot be used."""


def parse_credentials(text: str, *, where: str) -> dict[str, str]:
    """The variables of a credentials file's ``text``; ``where`` names it in errors (never a value)."""
    out: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _LINE.fullmatch(line)
        if m is None:
            raise CredentialsError(f"{where}: line {number}: not NAME=VALUE")
        value = m.group(2).strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        out[m.group(1)] = value
    return out


def load_credentials(path: Path) -> dict[str, str]:
    """Read ``path`` and set its variables in ``os.environ`` (they win over the environment: the file was
    named on purpose); returns them.  Raises ``CredentialsError`` for a missing, unreadable, world-readable
    or malformed file."""
    try:
        info = path.stat()
        if info.st_mode & stat.S_IROTH:
            raise CredentialsError(
                f"{path}: other users may read it (mode {stat.S_IMODE(info.st_mode):04o}); "
                f"it holds secrets: chmod o-rwx {path}"
            )
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise CredentialsError(f"{path}: cannot read the credentials file: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise CredentialsError(f"{path}: not a text file") from None
    values = parse_credentials(text, where=str(path))
    os.environ.update(values)
    return values
