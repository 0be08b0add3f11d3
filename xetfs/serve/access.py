"""User tokens (``--token-file``): who may use the Hub routes and the Xet token route.

The file holds one token per line; blank lines and lines starting with
``#`` are ignored.  It is read again when it changes (size, mtime or
inode), so tokens can be added or revoked without a restart.  Tokens are
compared in constant time and never logged.
"""

from __future__ import annotations

import hmac
import threading
from pathlib import Path

from xetfs.base.errors import XetfsError

MAX_TOKEN_FILE_BYTES = 1024 * 1024


class TokenFileError(XetfsError):
    """A token file that cannot be used."""


def parse_tokens(text: str) -> frozenset[str]:
    return frozenset(line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#"))


class UserTokens:
    """The tokens of a token file, read again when the file changes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._stamp: tuple[int, int, int] | None = None
        self._tokens: frozenset[str] = frozenset()
        self._read()
        if not self._tokens:
            raise TokenFileError(f"token file {path}: no tokens in it")

    def _read(self) -> None:
        try:
            st = self.path.stat()
            stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
            if stamp == self._stamp:
                return
            if st.st_size > MAX_TOKEN_FILE_BYTES:
                raise TokenFileError(f"token file {self.path}: {st.st_size} bytes, more than {MAX_TOKEN_FILE_BYTES}")
            tokens = parse_tokens(self.path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as exc:
            if self._stamp is None:
                raise TokenFileError(f"token file {self.path}: cannot read it: {exc}") from None
            return  # keep the tokens read before (a file being replaced)
        self._stamp, self._tokens = stamp, tokens

    def allows(self, authorization: str | None) -> bool:
        """Whether an ``Authorization`` header value carries one of the tokens (``Bearer <token>``)."""
        if not authorization:
            return False
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return False
        with self._lock:
            self._read()
            tokens = self._tokens
        given = token.strip().encode()
        found = False
        for known in tokens:
            found |= hmac.compare_digest(known.encode(), given)
        return found
