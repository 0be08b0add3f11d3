"""What the server's routes share: its settings and state, error answers, ``Range`` values, path segments.

Error answers carry the Hub's ``X-Error-Code`` and ``X-Error-Message``
headers, which huggingface_hub turns into its own exceptions
(``RepositoryNotFoundError``, ``RevisionNotFoundError``,
``RemoteEntryNotFoundError``), and ``Cache-Control: no-store``: an error
may go away (a pack lands, a damaged object is repaired), so no proxy may
keep it.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import quote, unquote

import trio
from starlette.requests import Request
from starlette.responses import Response

from xetfs.base import settings
from xetfs.base.errors import (
    FormatError,
    IntegrityError,
    MissingObjectError,
    ObjectReadError,
    StoreTimeoutError,
    XetfsError,
)
from xetfs.serve.access import UserTokens
from xetfs.serve.contents import Contents
from xetfs.serve.signing import Signer

log = logging.getLogger("xetfs.serve")

# A damaged or missing object: 410 Gone.  hf_xet retries 5xx but 501, 408, 429 and, fetching xorb ranges,
# 403 (after asking for new URLs), for minutes; any other 4xx ends the download at once (xet-core's
# RetryWrapper).  404 would read as "no such file" and 400 as a bad request, while the object is known and
# gone until someone repairs the store.
DAMAGED = 410
IMMUTABLE_SECONDS = 365 * 24 * 3600
_RANGE = re.compile(r"bytes=(\d*)-(\d*)")
# A Host header fit to start URLs with: a name (``_`` as in container service names, a final dot allowed), an
# IPv4 address or a bracketed IPv6 one, and a port.
_HOST = re.compile(r"(?:[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,251}[A-Za-z0-9_.])?|\[[0-9A-Fa-f:.]+\])(?::\d{1,5})?")
# Headers a proxy adds: behind one, the client's address (https, another port) is not what Host says.
_PROXY_HEADERS = ("forwarded", "x-forwarded-for", "x-forwarded-host", "x-forwarded-proto", "via")


@dataclass
class Settings:
    public_url: str  # every URL handed out starts with it (no trailing slash); see ``follow_host``
    follow_host: bool = False  # no --public-url: URLs name the address each client reached (``State.url_base``)
    token_ttl: int = settings.SERVE_TOKEN_TTL  # seconds a Xet access token lives
    url_ttl: int = settings.SERVE_URL_TTL  # seconds a signed xorb-range URL lives
    tree_page: int = settings.SERVE_TREE_PAGE  # entries per page of a tree listing
    max_fetch: int = settings.SERVE_MAX_FETCH  # serialized bytes of a xorb range in a reconstruction answer
    checks_at_once: int = settings.SERVE_CHECKS  # xorb ranges read and checked at the same time


@dataclass
class State:
    settings: Settings
    contents: Contents
    signer: Signer
    tokens: UserTokens | None = None
    clock: Callable[[], float] = time.time
    checks: trio.Semaphore = field(init=False)
    _said_fallback: bool = field(default=False, init=False)  # ``url_base`` fell back once: said in the log

    def __post_init__(self) -> None:
        self.checks = trio.Semaphore(self.settings.checks_at_once)

    def cache_control(self, immutable: bool) -> str:
        """For an answer that never changes (``immutable``) or may change; private when tokens guard it."""
        if not immutable:
            return "no-cache"
        scope = "private" if self.tokens is not None else "public"
        return f"{scope}, max-age={IMMUTABLE_SECONDS}, immutable"

    def url_base(self, request: Request) -> str:
        """What the URLs handed out to ``request``'s client start with: ``--public-url``; without one, the
        address the client reached (its ``Host``), so that a server listening on every address of its machine
        sends each node URLs it can reach.  The listening address (``public_url``) for a request through a
        proxy (which may speak https, on another port) or whose ``Host`` is not a host and port: said once
        in the log.  An answer that a cache may keep and that holds such URLs varies with ``Host``
        (``vary``)."""
        if not self.settings.follow_host:
            return self.settings.public_url
        host = request.headers.get("host", "")
        proxy = next((h for h in _PROXY_HEADERS if h in request.headers), None)
        if proxy is None and _HOST.fullmatch(host):
            return f"http://{host}"
        if not self._said_fallback:
            self._said_fallback = True
            why = f"came through a proxy ({proxy})" if proxy else f"names the host {host!r}, not a host and port"
            log.warning("a request %s: the URLs handed out name the listening address %s; give --public-url "
                        "with the address clients use", why, self.settings.public_url)  # fmt: skip
        return self.settings.public_url

    def vary(self, headers: dict[str, str]) -> None:
        """Mark an answer holding URLs made by ``url_base`` as varying with ``Host`` (when they follow it), so
        that a cache in front keeps one per address and never hands one client's to another."""
        if self.settings.follow_host:
            headers["Vary"] = "Host"

    def user_allowed(self, request: Request) -> bool:
        return self.tokens is None or self.tokens.allows(request.headers.get("authorization"))


def error(status: int, code: str | None, message: str, headers: dict[str, str] | None = None) -> Response:
    """An error answer in the Hub's manner (the message as JSON ``error`` and as ``X-Error-Message``)."""
    # A header value is Latin-1 without controls: anything else in a message (a path) is escaped there.
    shown = "".join(c if " " <= c <= "~" else c.encode("unicode_escape").decode() for c in message)
    out = {"X-Error-Message": shown, "Cache-Control": "no-store"}
    if code is not None:
        out["X-Error-Code"] = code
    out.update(headers or {})
    return Response(json.dumps({"error": message}), status, out, media_type="application/json")


def unauthorized() -> Response:
    # This message makes huggingface_hub raise its HTTP error with the status, not "repository not found".
    return error(401, None, "Invalid credentials in Authorization header", {"WWW-Authenticate": "Bearer"})


def read_error(exc: XetfsError) -> Response:
    """The answer for a read that failed: damaged or missing objects are final, the rest may pass."""
    if isinstance(exc, (IntegrityError, FormatError, MissingObjectError)):
        return error(DAMAGED, "CorruptedObject", f"the store cannot give these bytes: {exc}")
    if isinstance(exc, StoreTimeoutError):
        return error(504, None, "the store did not answer in time")
    if isinstance(exc, ObjectReadError):
        return error(503, None, "the store could not be read")
    return error(502, None, "the store could not be reached")


class BadRange(Exception):
    """A ``Range`` that cannot be served (416)."""


class BodyCutShort(Exception):
    """A read failed after the status line was sent: the body ends there, the connection is closed.

    Raised from a response body once the failure is logged (one line): the HTTP server's own log of it,
    a traceback, is left out (``app.serve_on``).
    """


def byte_range(value: str | None, size: int) -> tuple[int, int] | None:
    """File bytes ``[start, end)`` of a ``Range: bytes=...`` value over ``size`` bytes; None without one.

    One range only (``s-e``, ``s-`` or ``-n``); an end past the file is
    clamped.  Raises ``BadRange`` for a start at or past the end, and for
    what is not one byte range (a server may ignore such a header, but a
    client that sends one expects it honoured).
    """
    if value is None:
        return None
    m = _RANGE.fullmatch(value.strip())
    if m is None or not (m.group(1) or m.group(2)):
        raise BadRange(f"not a single byte range: {value!r}")
    if not m.group(1):  # the last n bytes
        n = int(m.group(2))
        if n == 0 or size == 0:
            raise BadRange(f"{value!r}: nothing to send of {size} bytes")
        return max(0, size - n), size
    start = int(m.group(1))
    end = size if not m.group(2) else min(size, int(m.group(2)) + 1)
    if start >= size or start >= end:
        raise BadRange(f"{value!r}: the file has {size} bytes")
    return start, end


def raw_path(request: Request) -> str:
    """The request's path as the client sent it (still percent-encoded), without the query."""
    raw = request.scope.get("raw_path")
    return raw.decode("latin-1").partition("?")[0] if raw else quote(request.scope["path"])


def segments(request: Request) -> list[str]:
    """The request path's segments, each percent-decoded on its own (so ``refs%2Fpr%2F1`` stays one).

    Raises ``UnicodeDecodeError`` for a segment that is not UTF-8 once decoded.
    """
    return [unquote(s, encoding="utf-8", errors="strict") for s in raw_path(request).split("/")[1:]]
