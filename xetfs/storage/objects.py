"""Object sources: the bytes of a remote store's objects, by name and byte range.

A remote store is a store directory served over HTTP(S) or copied to an
object store (``s3://``, ``gs://``, ``az://``).  ``ObstoreSource`` reads its
objects with obstore (Rust, releases the GIL): whole small objects (shards,
listings, manifests), exact byte ranges of xorbs, and, where the service can
list, the names under a prefix.  From a plain HTTP(S) server, the xorb ranges
that decode workers fetch go through ``_HttpRanges`` instead (``http.client``
on kept-alive connections, the body read straight into the worker's slots):
about half the CPU of obstore's client.  ``Store`` turns ``(xorb, chunk
range)`` into range reads (``Store.read_xorb``; a decode worker, from its
job); it does not know which kind of source it reads from, and a
``diskcache.CachedSource`` can sit between.

Every call is bounded: one request may take at most ``request_timeout``
seconds, failed requests (connection errors, resets, truncated bodies,
5xx and 429 answers) are tried again with exponential backoff until
``deadline`` seconds have passed since the call began.  A server that
cannot be reached at all is remembered as down for ``DOWN_SECONDS``:
meanwhile calls fail at once instead of each waiting for its deadline.

Secrets (an HTTP bearer token, extra header values, credentials in a URL)
never reach a message: ``redact`` removes them from every error text.
Calls may come from any thread.
"""

from __future__ import annotations

import configparser
import os
import random
import re
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from xetfs.base.errors import (
    MissingObjectError,
    NoRangeRequestsError,
    ServerUnreachableError,
    StoreError,
    StoreTimeoutError,
    XetfsError,
)
from xetfs.base.settings import (
    CONNECT_TIMEOUT,
    DOWN_SECONDS,
    FIRST_BACKOFF,
    HTTP_IDLE_CONNECTIONS,
    IO_TIMEOUT,
    IOV_MAX,
    MAX_BACKOFF,
    MESSAGE_CHARS,
    REQUEST_TIMEOUT,
    TAG_SETTLE_SECONDS,
    user_home,
)
from xetfs.base.stats import RemoteCounters
from xetfs.format.chunk import Buffer

if TYPE_CHECKING:
    import http.client

    from obstore.store import ClientConfig

T = TypeVar("T")

SCHEMES = ("http", "https", "s3", "gs", "az", "abfs", "abfss")
TOKEN_ENV = "XETFS_HTTP_TOKEN"  # bearer token for HTTP stores
HEADERS_ENV = "XETFS_HTTP_HEADERS"  # extra HTTP headers: "Name: value" lines


def is_url(location: str) -> bool:
    """Whether ``location`` names a remote store (a URL with a known scheme) rather than a directory."""
    scheme, sep, _ = location.partition("://")
    return bool(sep) and scheme.lower() in SCHEMES


class ObjectSource(Protocol):
    """Bytes of a store's objects.  Names are paths relative to the store's top, ``/``-separated.

    Raises ``MissingObjectError`` for an object that does not exist,
    ``StoreTimeoutError`` when a call ran out of time, ``StoreError`` for
    anything else; messages never carry secrets.
    """

    location: str  # the store's URL without secrets, for messages

    def read(self, name: str, *, limit: int, fresh: bool = False) -> bytes:
        """The whole object ``name``; refused if larger than ``limit`` bytes.

        ``fresh``: the object may change (a listing, a manifest), so a cache
        in between asks the server first and falls back to its copy only
        when the server cannot answer.
        """
        ...

    def read_range(self, name: str, start: int, end: int) -> bytes | memoryview:
        """Bytes ``[start, end)`` of object ``name``: exactly that many, or an error."""
        ...

    def read_range_into(self, name: str, start: int, end: int, parts: Sequence[memoryview]) -> None:
        """``read_range`` into ``parts``, one after the other; together they hold exactly ``end - start``
        bytes.  Several parts put chunk headers and payloads each where they belong, with no copy between."""
        ...

    def list(self, prefix: str) -> list[tuple[str, int, float]] | None:
        """``(name, size, mtime)`` of every object under ``prefix``, or None where the service cannot list."""
        ...

    def tag(self, name: str) -> str | None:
        """What changes when the object ``name`` is replaced (its ETag, size and time; a file's identity),
        asked of the server itself, with no body; None if there is no such object."""
        ...

    def local_path(self, name: str) -> str | None:
        """The object's file on this machine, for readers that read it themselves; None where it has none."""
        ...

    def worker_setup(self) -> tuple[str, RemoteOptions] | None:
        """How a decode worker opens the same source for itself: a URL and options (secrets included:
        hand them over a pipe, never a command line), or None where workers read local files."""
        ...


def scatter(data: Buffer, parts: Sequence[memoryview]) -> None:
    """Copy ``data`` into ``parts``, one after the other (``read_range_into`` from a source that reads
    whole ranges)."""
    view, pos = memoryview(data), 0
    for part in parts:
        part[:] = view[pos : pos + len(part)]
        pos += len(part)


def header_lines(headers: Sequence[str]) -> list[str]:
    """``--header`` lines and those of ``XETFS_HTTP_HEADERS``, blank ones left out."""
    return [line for line in (*headers, *os.environ.get(HEADERS_ENV, "").splitlines()) if line.strip()]


@dataclass(frozen=True)
class RemoteOptions:
    """How to reach a remote store.  ``headers`` may hold secrets: they are only ever sent."""

    headers: tuple[tuple[str, str], ...] = ()
    request_timeout: float = REQUEST_TIMEOUT
    deadline: float = IO_TIMEOUT
    connect_timeout: float = CONNECT_TIMEOUT

    @classmethod
    def from_env(cls, token: str | None = None, headers: list[str] | None = None, **kw: Any) -> RemoteOptions:
        """Headers from ``--header`` lines and ``XETFS_HTTP_HEADERS``, a bearer token from ``token`` or
        ``XETFS_HTTP_TOKEN``."""
        pairs = []
        for line in header_lines(headers or ()):
            name, sep, value = line.partition(":")
            if not sep or not name.strip():
                raise StoreError(f"not an HTTP header (want 'Name: value'): {name.strip()[:40]!r}")
            pairs.append((name.strip(), value.strip()))
        token = token or os.environ.get(TOKEN_ENV)
        if token:
            pairs.append(("Authorization", f"Bearer {token}"))
        return cls(headers=tuple(pairs), **kw)

    @classmethod
    def for_timeout(cls, io_timeout: float, headers: list[str] | None = None) -> RemoteOptions:
        """Options (headers as in ``from_env``) under which every call ends within ``io_timeout`` seconds;
        one request may stall for a third of it, leaving room for another try."""
        step = max(1.0, io_timeout / 3)
        return cls.from_env(headers=headers, deadline=io_timeout, request_timeout=step,
                            connect_timeout=min(CONNECT_TIMEOUT, step))  # fmt: skip

    def secrets(self) -> list[str]:
        out = []
        for _, value in self.headers:
            out.append(value)
            out.extend(part for part in value.split() if len(part) >= 4)
        return out


def redact(text: str, secrets: list[str]) -> str:
    """``text`` with every secret, any ``user:password@`` and any query string of a URL replaced by ``***``.

    A URL's query may carry a signature or token (presigned and SAS URLs), and
    client errors quote the URL they requested.
    """
    for secret in sorted(secrets, key=len, reverse=True):
        if secret:
            text = text.replace(secret, "***")
    text = re.sub(r"(://[^\s?#]*)\?[^\s)\"'>]*", r"\1?***", text)
    return re.sub(r"(://)[^/@\s]*@", r"\1***@", text)


def public_url(url: str) -> str:
    """``url`` without a password or query (what messages and cache keys may show).

    A user name without a password stays: in ``abfs://CONTAINER@ACCOUNT...`` it names the container.
    """
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:  # an IPv6 address
        host = f"[{host}]"
    if parts.port:
        host += f":{parts.port}"
    if parts.username and parts.password is None:
        host = f"{parts.username}@{host}"
    return urllib.parse.urlunsplit((parts.scheme, host, parts.path.rstrip("/"), "", ""))


class ObstoreSource:
    """An ``ObjectSource`` over obstore: HTTP(S), S3 (and compatible), GCS and Azure."""

    def __init__(self, url: str, options: RemoteOptions, counters: RemoteCounters | None = None) -> None:
        parts = urllib.parse.urlsplit(url)
        url = urllib.parse.urlunsplit(parts._replace(path=parts.path.rstrip("/")))  # (names are joined with "/")
        self.location = public_url(url)
        self._url = url
        self.options = options
        self.counters = counters or RemoteCounters()
        self._secrets = options.secrets()
        self._lock = threading.Lock()  # guards whether the server is down (the counters have a lock of their own)
        # Whether the server answered lately, for every call of this source: calls fail at once until
        # ``_down_until``; ``_down_reason`` ("after <request> failed (<why>)") says which request found it down.
        self._down_until = self._down_since = 0.0
        self._down_reason = ""
        try:
            self._store = _open(url, options)
        except Exception as exc:  # obstore raises its own errors for bad configuration
            raise StoreError(f"store {self.location}: {self._message(exc)}") from None
        self.lists = not url.lower().startswith(("http://", "https://"))
        self._http = _HttpRanges.for_url(url, options)

    # -- ObjectSource ------------------------------------------------------

    def read(self, name: str, *, limit: int, fresh: bool = False) -> bytes:
        import obstore

        def get() -> bytes:
            result = obstore.get(self._store, name)
            if result.meta["size"] > limit:
                raise StoreError(f"{self._where(name)}: {result.meta['size']} bytes, more than the {limit} allowed")
            return bytes(result.bytes())

        data = self._call(name, get)
        self._count(len(data))
        return data

    def read_range(self, name: str, start: int, end: int) -> memoryview:
        import obstore

        def get() -> tuple[memoryview, float]:
            began = time.monotonic()
            data = memoryview(obstore.get_range(self._store, name, start=start, end=end))  # (no copy)
            if len(data) != end - start:
                raise _Transient(f"short body: {len(data)} of {end - start} bytes")
            return data, time.monotonic() - began

        data, waited = self._call(f"{name} bytes [{start}, {end})", get, name=name)
        self._answered(len(data), waited)
        return data

    def read_range_into(self, name: str, start: int, end: int, parts: Sequence[memoryview]) -> None:
        """``read_range`` into ``parts`` (exactly ``end - start`` bytes in all).

        From a plain HTTP(S) server, the body goes straight from the socket
        into the parts (``http.client``, kept-alive connections): no copy in
        between, and about half the CPU of the general client.  Without TLS,
        on a connection kept alive, a body of the exact length is read with
        ``recvmsg_into``: one system call for as many parts as the socket has
        bytes for (``_scatter_body``).
        """
        if self._http is None:
            scatter(self.read_range(name, start, end), parts)
            return
        http = self._http
        try:
            waited = self._call(f"{name} bytes [{start}, {end})", lambda: http.get_into(name, start, end, parts),
                                name=name)  # fmt: skip
        except _NotRanges:
            self._http = None  # (a redirect, or a server that ignores Range: the general client handles both)
            scatter(self.read_range(name, start, end), parts)
            return
        self._answered(end - start, waited)

    def local_path(self, name: str) -> str | None:
        return None

    def worker_setup(self) -> tuple[str, RemoteOptions] | None:
        return self._url, self.options

    def list(self, prefix: str) -> list[tuple[str, int, float]] | None:
        if not self.lists:
            return None
        import obstore

        def run() -> list[tuple[str, int, float]]:
            out: list[tuple[str, int, float]] = []
            for batch in obstore.list(self._store, prefix or None, chunk_size=1000):
                out.extend((meta["path"], meta["size"], meta["last_modified"].timestamp()) for meta in batch)
            return out

        return self._call(prefix, run)

    def exists(self, name: str) -> bool:
        """Whether the object ``name`` is there: a ``HEAD`` that succeeds (any failure, a refusal or a server
        down, says no)."""
        import obstore

        try:
            self._call(name, lambda: obstore.head(self._store, name))
        except XetfsError:
            return False
        return True

    def tag(self, name: str) -> str | None:
        import obstore

        try:
            meta = self._call(name, lambda: obstore.head(self._store, name))
        except MissingObjectError:
            return None
        except ServerUnreachableError:
            raise
        except StoreError:  # a server that refuses HEAD (405, say): a tag that never matches, so it is read
            return untagged()
        modified = meta["last_modified"].timestamp()
        if not meta.get("e_tag") and modified <= 0:
            return untagged()  # (no validator at all)
        return settled(f"{meta.get('e_tag')} {meta['size']} {modified}", modified)

    # -- retries, deadlines, health ------------------------------------------

    def _call(self, what: str, fn: Callable[[], T], *, name: str | None = None) -> T:
        """``fn()``, tried again on transient failures until the deadline."""
        import obstore.exceptions as oe

        deadline = time.monotonic() + self.options.deadline
        backoff = FIRST_BACKOFF
        with self.counters.lock:
            self.counters.in_flight += 1
        try:
            while True:
                self._check_up(what)
                with self.counters.lock:
                    self.counters.requests += 1
                try:
                    return fn()
                except oe.NotFoundError:
                    raise MissingObjectError(f"{self._where(name or what)}: not found") from None
                except (oe.PermissionDeniedError, oe.UnauthenticatedError) as exc:
                    self._error()
                    raise StoreError(f"{self._where(what)}: access refused: {self._message(exc)}"
                                     f"{access_hint(self._url, self.options)}") from None  # fmt: skip
                except oe.NotSupportedError as exc:  # (never transient: not tried again)
                    self._error()
                    if "range request not supported" in str(exc).lower():
                        raise NoRangeRequestsError(f"{self._where(what)}: the server does not answer range requests "
                                                   f"(it sends whole objects): serve the store with one that does, "
                                                   f"such as nginx") from None  # fmt: skip
                    raise StoreError(f"{self._where(what)}: not supported: {self._message(exc)}") from None
                except StoreError:
                    raise
                except Exception as exc:  # obstore's errors, and our own _Transient
                    final = self._final(what, name, exc)
                    if not isinstance(final, MissingObjectError):  # (an object that is not there: an answer)
                        self._error()
                    if final is not None:
                        raise final from None
                    left = deadline - time.monotonic()
                    if left <= backoff:
                        raise StoreTimeoutError(
                            f"{self._where(what)}: gave up after {self.options.deadline:g} s: {self._message(exc)}"
                        ) from None
                    with self.counters.lock:
                        self.counters.retries += 1
                    time.sleep(backoff * random.uniform(0.5, 1.0))
                    backoff = min(MAX_BACKOFF, backoff * 2)
        finally:
            with self.counters.lock:
                self.counters.in_flight -= 1

    def _final(self, what: str, name: str | None, exc: Exception) -> XetfsError | None:
        """The error to raise for a failed request that trying again cannot mend, or None (transient)."""
        message, full = self._message(exc), str(exc)
        ours = exc if isinstance(exc, _Transient) else None
        status = ours.status if ours is not None else _status(full)
        if status == 404:
            return MissingObjectError(f"{self._where(name or what)}: not found")
        if status in (401, 403):
            said = service_error(full)
            return StoreError(f"{self._where(what)}: access refused (HTTP {status}{f': {said}' if said else ''})"
                              f"{access_hint(self._url, self.options)}")  # fmt: skip
        if status is not None and 400 <= status < 500 and status not in (408, 429):
            return StoreError(f"{self._where(what)}: {message}")
        tls = _tls_failure(full)
        if tls is not None:  # (a refused certificate: as a server out of reach, the disk cache's copies serve)
            kind = ServerUnreachableError if "certificate" in tls else StoreError
            return kind(f"{self._where(what)}: the TLS handshake failed: {tls}")
        if ours.unreachable if ours is not None else _unreachable(full):  # (the client's words would repeat the URL)
            reason = str(ours) if ours is not None else _connect_reason(full)
            self._mark_down(f"after {what or 'the listing'} failed: no connection ({reason})")
            return ServerUnreachableError(f"{self._where(what)}: server unreachable: no connection ({reason})")
        return None

    def _check_up(self, what: str) -> None:
        with self._lock:
            now = time.monotonic()
            if now < self._down_until:  # not tried: the reason is another request's, and says so
                raise ServerUnreachableError(f"{self._where(what)}: not requested: server marked down "
                                             f"{now - self._down_since:.1f} s ago, {self._down_reason}")  # fmt: skip

    def _mark_down(self, reason: str) -> None:
        with self._lock:
            self._down_since = time.monotonic()
            self._down_until = self._down_since + DOWN_SECONDS
            self._down_reason = reason

    def _count(self, size: int) -> None:
        with self.counters.lock:
            self.counters.bytes += size

    def _answered(self, size: int, waited: float) -> None:
        """Count a range request answered with ``size`` bytes, whose answer started ``waited`` seconds after it
        was sent (through obstore: ended)."""
        with self.counters.lock:
            self.counters.bytes += size
            self.counters.ranges += 1
            self.counters.wait_s += waited

    def _error(self) -> None:
        with self.counters.lock:
            self.counters.errors += 1

    def _where(self, what: str) -> str:
        """The object ``what`` names, for a message (the store itself for ``""``: its listing)."""
        return f"{self.location}/{what}" if what else self.location

    def _message(self, exc: BaseException) -> str:
        return client_message(exc, self._secrets)


def untagged() -> str:
    """A tag that matches no other (``ObjectSource.tag`` for an object it cannot vouch for): it is read."""
    return f"untagged {time.monotonic_ns()} {random.random()}"


def settled(tag: str, modified: float) -> str:
    """``tag`` of an object last changed at ``modified`` (Unix time), or ``untagged`` if that was less than
    ``TAG_SETTLE_SECONDS`` ago: it may change again within its time's resolution, keeping its size."""
    return untagged() if abs(time.time() - modified) < TAG_SETTLE_SECONDS else tag


def client_message(exc: BaseException, secrets: list[str]) -> str:
    """An obstore error as one line: its first line (a multi-line dump of causes follows it), a service's XML
    error as its code and message, without the request's URL and time it repeats, cut at a word; no
    secrets."""
    text = " ".join(str(exc).split("Debug source:")[0].split())
    text = re.sub(r"Error performing [A-Z]+ \S+ in [\d.]+\w*s - ", "", text)  # (the URL: the caller names it)
    said = service_error(text)
    if said is not None:
        text = text[: text.find("<")].rstrip(": ") + f": {said}"
    elif (page := text.lower().find("<html")) >= 0:  # a web server's error page: its status line says enough
        text = text[:page].rstrip(": ")
    if len(text) > MESSAGE_CHARS:
        cut = text.rfind(" ", MESSAGE_CHARS // 2, MESSAGE_CHARS)  # (at a word, unless one word is that long)
        text = text[: cut if cut > 0 else MESSAGE_CHARS] + " ..."
    return redact(text, secrets)


def service_error(text: str) -> str | None:
    """``Code: Message`` of the XML error document a service (S3, GCS, Azure) answered with, if ``text`` holds
    one."""
    code = re.search(r"<Code>([^<]*)</Code>", text)
    if code is None:
        return None
    said = re.search(r"<Message>([^<]*)</Message>", text)
    return f"{code[1]}: {said[1]}" if said else code[1]


def access_hint(url: str, options: RemoteOptions, env: Mapping[str, str] | None = None) -> str:
    """What a refused request was sent with, for its message: the endpoint and credentials of an S3 store,
    whether an HTTP store got a token ("" for other services, whose settings obstore reads itself)."""
    env = os.environ if env is None else env
    scheme = url.partition("://")[0].lower()
    if scheme in ("http", "https"):
        if "?" in url:
            return " (the URL carries a signature or token: has it expired?)"
        if any(name.lower() == "authorization" for name, _ in options.headers):
            return " (an Authorization header was sent: is its token allowed to read this store?)"
        return f" (no token was sent: if the server wants one, set {TOKEN_ENV} or pass --header)"
    if scheme not in ("s3", "s3a"):
        return ""
    files = aws_files_config(env)
    endpoint = env.get("AWS_ENDPOINT_URL") or env.get("AWS_ENDPOINT") or files.get("endpoint") or "AWS"
    if env.get("AWS_ACCESS_KEY_ID"):
        keys = "the key pair of AWS_ACCESS_KEY_ID"
    elif "access_key_id" in files:
        keys = f"the key pair of profile {env.get('AWS_PROFILE') or 'default'} in the AWS credentials file"
    else:
        keys = (
            "no key pair in AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, nor in the AWS credentials file "
            "(an instance or web-identity role, if any, was used)"
        )
    return f" (endpoint {endpoint}, {keys})"


class _Transient(Exception):
    """A request of our own client that failed: worth another try unless ``_final`` says otherwise, from
    ``status`` (the server's answer, if it gave one) and ``unreachable`` (no connection could be made).
    obstore's errors say these in their text only."""

    def __init__(self, message: str, *, status: int | None = None, unreachable: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.unreachable = unreachable


class _NotRanges(StoreError):
    """The server did not answer a range request with 206 (it redirects, or ignores ``Range``): the general
    client takes over for this store."""


class _HttpRanges:
    """Range requests to a plain HTTP(S) store with ``http.client``, into the caller's buffer.

    Only for URLs without credentials or a query (which the general client
    handles); its errors are ``_Transient`` with the server's status or that
    no connection could be made, which ``_call`` and ``_final`` judge as they
    judge obstore's, so retries, deadlines and health are the same.
    Connections are kept alive in a small pool that any thread takes from
    and gives back to.
    """

    def __init__(self, scheme: str, host: str, port: int, base: str, options: RemoteOptions) -> None:
        # Loaded now, not with the module (a local store never needs it), nor at the first read: the import
        # (http.client, email parsing, ssl) takes about 30 ms of CPU, which the first read would wait for.
        import http.client  # noqa: F401

        self.https = scheme == "https"
        self.host, self.port, self.base = host, port, base
        self.headers = dict(options.headers)
        self.timeout = options.request_timeout
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    @classmethod
    def for_url(cls, url: str, options: RemoteOptions) -> _HttpRanges | None:
        parts = urllib.parse.urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme not in ("http", "https") or parts.username or parts.query or not parts.hostname:
            return None
        port = parts.port or (443 if scheme == "https" else 80)
        return cls(scheme, parts.hostname, port, parts.path.rstrip("/"), options)

    def get_into(self, name: str, start: int, end: int, parts: Sequence[memoryview]) -> float:
        """Bytes ``[start, end)`` of ``name`` into ``parts``; how long the answer took to start (its headers)."""
        import http.client  # (loaded by ``__init__``)

        conn = self._take()
        path = f"{self.base}/{urllib.parse.quote(name)}"
        began = time.monotonic()
        try:
            conn.request("GET", path, headers={**self.headers, "Range": f"bytes={start}-{end - 1}"})
            response = conn.getresponse()
            waited = time.monotonic() - began
        except ConnectionRefusedError as exc:
            conn.close()
            raise _Transient(exc.strerror or "connection refused", unreachable=True) from None
        except socket.gaierror as exc:
            conn.close()
            raise _Transient(f"dns error: {exc}", unreachable=True) from None
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            raise _Transient(f"request failed: {exc}") from None
        if response.status != 206:
            conn.close()
            if response.status == 200 or 300 <= response.status < 400:
                raise _NotRanges(f"answered a range request with {response.status}")
            raise _Transient(f"server answered with status code: {response.status}", status=response.status)
        try:
            if _scatter_ok(conn, response, end - start):
                got = _scatter_body(conn.sock, response, parts)
                response.close()  # (http.client saw none of the body go by; the length is checked below)
            else:
                got = _read_body(response, parts)
        except _Transient:
            conn.close()
            raise
        if got != end - start or (not response.isclosed() and response.read(1)):
            conn.close()
            raise _Transient(f"short body: {got} of {end - start} bytes")
        self._give_back(conn)
        return waited

    def _take(self) -> http.client.HTTPConnection:
        import http.client

        with self._lock:
            if self._idle:
                return self._idle.pop()
        kind = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
        return kind(self.host, self.port, timeout=self.timeout)

    def _give_back(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            if len(self._idle) < HTTP_IDLE_CONNECTIONS:
                self._idle.append(conn)
                return
        conn.close()

    def close(self) -> None:
        """Close the idle connections (a later read opens new ones)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def __del__(self) -> None:
        self.close()


def _scatter_ok(conn: http.client.HTTPConnection, response: http.client.HTTPResponse, size: int) -> bool:
    """Whether the body may be read from the socket itself: a plain socket, kept open, and exactly ``size`` bytes."""
    return (
        type(conn.sock) is socket.socket  # not TLS, and not handed to the response (``Connection: close``)
        and response.getheader("Content-Length") == str(size)
        and response.getheader("Transfer-Encoding") is None
    )


def _scatter_body(sock: socket.socket, response: http.client.HTTPResponse, parts: Sequence[memoryview]) -> int:
    """Fill ``parts`` from the body: what ``http.client`` has buffered, then ``recvmsg_into`` from the socket.

    One system call fills as many parts as the socket has bytes for, where
    ``response.readinto`` would take a few Python calls for every part.  The
    bytes placed; fewer than the parts hold if the stream ended first.  The
    socket's timeout bounds each wait.
    """
    views = [p for p in parts if len(p)]
    i = got = 0
    try:
        buffered = len(response.fp.peek())  # (one read of the socket if the buffer is empty)
        while buffered and i < len(views):
            take = min(len(views[i]), buffered)
            response.fp.readinto(views[i][:take])
            buffered -= take
            got += take
            if take == len(views[i]):
                i += 1
            else:
                views[i] = views[i][take:]
        while i < len(views):
            n = sock.recvmsg_into(views[i : i + IOV_MAX])[0]
            if not n:
                return got
            got += n
            while n >= len(views[i]):
                n -= len(views[i])
                i += 1
                if i == len(views):
                    return got
            views[i] = views[i][n:]
    except OSError as exc:
        raise _Transient(f"body failed after {got} bytes: {exc}") from None
    return got


def _read_body(response: http.client.HTTPResponse, parts: Sequence[memoryview]) -> int:
    """Fill ``parts`` from the body through ``http.client`` (TLS, chunked or unsized answers): the bytes placed."""
    import http.client

    got = 0
    try:
        for part in parts:
            done = 0
            while done < len(part) and (n := response.readinto(part[done:])):
                done += n
            got += done
            if done < len(part):
                break
    except (OSError, http.client.HTTPException) as exc:
        raise _Transient(f"body failed after about {got} bytes: {exc}") from None
    return got


def _status(message: str) -> int | None:
    """The HTTP status an obstore error message reports, if any."""
    m = re.search(r"status code: (\d{3})", message)
    return int(m.group(1)) if m else None


def _unreachable(message: str) -> bool:
    """Whether an error says no connection could be made at all (as opposed to one that broke)."""
    return "ConnectError" in message or "dns error" in message.lower()


def _tls_failure(message: str) -> str | None:
    """What went wrong in a TLS handshake that an error reports (rustls's words), for a message; None if not one."""
    m = re.search(r"\b(InvalidMessage|InvalidCertificate|AlertReceived|PeerIncompatible|PeerMisbehaved)\(\s*(\w+)",
                  message)  # fmt: skip
    if m is None:
        return None
    kind, detail = m.groups()
    if kind == "InvalidMessage":  # (a plain HTTP server's answer, most often)
        return f"the server does not speak TLS there ({detail}): is the URL http://, not https://?"
    if kind == "InvalidCertificate":
        return f"its certificate was refused ({detail})"
    return f"{kind} ({detail})"


def _connect_reason(message: str) -> str:
    m = re.search(r'message: "([^"]{1,80})"', message)
    return m.group(1) if m else "cannot connect"


def aws_files_config(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """S3 settings from the AWS shared config and credentials files, for what the environment leaves unset.

    The profile is ``AWS_PROFILE`` (else ``default``); the files are
    ``AWS_CONFIG_FILE`` (else ``~/.aws/config``: ``region``, ``endpoint_url``)
    and ``AWS_SHARED_CREDENTIALS_FILE`` (else ``~/.aws/credentials``: the key
    pair and session token).  The environment wins, as with the AWS tools.
    """
    env = os.environ if env is None else env
    profile = env.get("AWS_PROFILE") or "default"
    home = user_home() / ".aws"
    config = _ini(Path(env.get("AWS_CONFIG_FILE") or home / "config"), "default" if profile == "default"
                  else f"profile {profile}")  # fmt: skip
    creds = _ini(Path(env.get("AWS_SHARED_CREDENTIALS_FILE") or home / "credentials"), profile)
    out = {}
    if not (env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")) and config.get("region"):
        out["region"] = config["region"]
    if not (env.get("AWS_ENDPOINT_URL") or env.get("AWS_ENDPOINT")) and config.get("endpoint_url"):
        out["endpoint"] = config["endpoint_url"]
    if not env.get("AWS_ACCESS_KEY_ID") and creds.get("aws_access_key_id"):
        out["access_key_id"] = creds["aws_access_key_id"]
        out["secret_access_key"] = creds.get("aws_secret_access_key", "")
        if creds.get("aws_session_token"):
            out["session_token"] = creds["aws_session_token"]
    return out


def _ini(path: Path, section: str) -> dict[str, str]:
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read(path, encoding="utf-8")
    except (OSError, configparser.Error):
        return {}
    return dict(parser[section]) if parser.has_section(section) else {}


def _open(url: str, options: RemoteOptions) -> Any:
    from obstore.store import from_url

    client: ClientConfig = {
        "timeout": timedelta(seconds=options.request_timeout),
        "connect_timeout": timedelta(seconds=options.connect_timeout),
        "allow_http": True,
    }
    if options.headers:
        client["default_headers"] = dict(options.headers)
    # Our own loop retries (with a deadline, and counting); obstore's would hide them.
    retry: Any = {"max_retries": 0, "retry_timeout": timedelta(seconds=options.deadline)}
    if url.lower().startswith(("s3://", "s3a://")):
        config: Any = aws_files_config()
        return from_url(url, config=config or None, client_options=client, retry_config=retry)
    return from_url(url, client_options=client, retry_config=retry)
