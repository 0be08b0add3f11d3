"""Signed, expiring credentials the server hands out: Xet access tokens and xorb-range URLs.

Both are an HMAC-SHA256 over what they grant and when they expire, under
one key.  Several server processes (or machines) that share the key file
accept each other's tokens and URLs, so no request depends on which
process answered an earlier one.  Pure apart from ``load_key``; the clock
is passed in.
"""

from __future__ import annotations

import base64
import hmac
import os
import secrets
from collections.abc import Sequence
from hashlib import sha256
from pathlib import Path

from xetfs.base.errors import XetfsError

KEY_BYTES = 32


class KeyFileError(XetfsError):
    """A signing key file that cannot be used."""


def load_key(path: Path | None) -> bytes:
    """The signing key in ``path``, written there first (mode 0600) when the file does not exist.

    Without ``path``: a new random key, good for this process only.  A key
    file holds at least ``KEY_BYTES`` hex digits or bytes; surrounding
    whitespace is ignored.  Two processes creating the same file at once
    end up with the same key: the file appears whole or not at all
    (written aside, then hard-linked into place).
    """
    if path is None:
        return secrets.token_bytes(KEY_BYTES)
    if not path.exists():
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, secrets.token_hex(KEY_BYTES).encode() + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass  # another process was first: use its key
        finally:
            tmp.unlink()
    key = path.read_bytes().strip()
    if len(key) < KEY_BYTES:
        raise KeyFileError(f"key file {path}: {len(key)} bytes, at least {KEY_BYTES} are needed")
    return key


class Signer:
    """Signs and checks ``(purpose, fields, expiry)``; signatures are URL-safe base64 without padding."""

    def __init__(self, key: bytes) -> None:
        if len(key) < KEY_BYTES:
            raise KeyFileError(f"signing key of {len(key)} bytes, at least {KEY_BYTES} are needed")
        self._key = key

    def sign(self, purpose: str, fields: Sequence[str], expires: int) -> str:
        message = "\n".join([purpose, *fields, str(expires)]).encode()
        digest = hmac.new(self._key, message, sha256).digest()
        return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()

    def problem(self, purpose: str, fields: Sequence[str], expires: int, signature: str, now: float) -> str | None:
        """Why ``signature`` does not grant ``fields`` for ``purpose`` at time ``now``, or None when it does."""
        if not hmac.compare_digest(self.sign(purpose, fields, expires).encode(), signature.encode()):
            return "bad signature"
        if expires <= now:
            return f"expired {int(now - expires)} s ago"
        return None

    # -- Xet access tokens ---------------------------------------------------

    def token(self, expires: int) -> str:
        """A Xet access token valid until ``expires`` (Unix seconds): ``<expires>.<nonce>.<signature>``."""
        nonce = secrets.token_urlsafe(9)
        return f"{expires}.{nonce}.{self.sign('xet-token', [nonce], expires)}"

    def token_problem(self, token: str, now: float) -> str | None:
        """Why ``token`` is not a valid Xet access token at ``now``, or None."""
        parts = token.split(".")
        if len(parts) != 3 or not parts[0].isdigit():
            return "not a token of this server"
        return self.problem("xet-token", [parts[1]], int(parts[0]), parts[2], now)
