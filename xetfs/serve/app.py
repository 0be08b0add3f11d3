"""The ASGI application (the routes of ``hubapi`` and ``cas``, a health route, the request log), and
``serve_on``, which runs it under hypercorn on trio in one server process.

The log has one line per request at level INFO: method, path (never the
query, which holds URL signatures), status and time.  Headers are not
logged, so neither are tokens.  A path that is not UTF-8 once decoded gets
400.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import time
from collections.abc import Awaitable, Callable
from functools import partial
from urllib.parse import unquote

import trio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from xetfs.base.settings import SERVE_KEEP_ALIVE
from xetfs.serve import cas, hubapi
from xetfs.serve.common import BodyCutShort, State, error

log = logging.getLogger("xetfs.serve")


async def health(request: Request) -> Response:
    state: State = request.app.state.serve
    snap = await state.contents.snapshot()
    doc = {"status": "ok", "files": len(snap.index), "repos": len(snap.catalogue.repos), "catalogue": snap.version,
           "process": os.getpid()}  # fmt: skip
    return JSONResponse(doc, headers={"Cache-Control": "no-store"})


async def agent_harnesses(request: Request) -> Response:
    """An empty registry of AI agent harnesses, which huggingface_hub asks the endpoint for once a day per
    cache (a 404 would be asked again by every new client process, and fill the log)."""
    return JSONResponse({"standardEnvVars": [], "harnesses": {}}, headers={"Cache-Control": "no-cache"})


def build_app(state: State) -> ASGIApp:
    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/v1/reconstructions/{file_id}", cas.reconstruction_route, methods=["GET"]),
        Route("/v2/reconstructions/{file_id}", cas.reconstruction_route, methods=["GET"]),
        Route("/v1/telemetry", cas.telemetry, methods=["POST"]),
        Route("/xorbs/{xorb}/{chunks}", cas.xorb_range, methods=["GET"]),
        Route("/api/agent-harnesses", agent_harnesses, methods=["GET"]),
        Route("/api/{rest:path}", hubapi.api, methods=["GET", "POST"]),
        Route("/{rest:path}", hubapi.resolve, methods=["GET", "HEAD"]),
    ]
    app = Starlette(routes=routes)
    app.state.serve = state
    return _Logged(_BadPaths(app))


def serve_on(sock: socket.socket, state: State, *, started: Callable[[], Awaitable[None]]) -> None:
    """Serve ``state`` on the bound socket ``sock`` until SIGTERM or SIGINT; ``started()`` runs once
    the server listens."""
    from hypercorn.config import Config
    from hypercorn.trio import serve

    config = Config()
    config.bind = [f"fd://{os.dup(sock.fileno())}"]  # (hypercorn closes the socket it is given)
    config.accesslog = None  # the application logs each request, without queries or headers
    config.errorlog = logging.getLogger("xetfs.serve.http")
    config.errorlog.addFilter(_not_cut_short)
    config.keep_alive_timeout = SERVE_KEEP_ALIVE
    app = build_app(state)

    async def run() -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:

            async def stop() -> None:
                async for signum in signals:
                    log.info("%s: stopping", signal.Signals(signum).name)
                    return

            trio.lowlevel.spawn_system_task(state.contents.watch)  # (a remote store's timed looks; ends with the run)
            async with trio.open_nursery() as nursery:
                await nursery.start(partial(serve, app, config, shutdown_trigger=stop))  # type: ignore[arg-type]
                await started()

    try:
        trio.run(run)
    except BaseExceptionGroup as group:  # (a nursery's errors come grouped: raise the first as itself)
        first: BaseException = group
        while isinstance(first, BaseExceptionGroup):
            first = first.exceptions[0]
        raise first from None


def _not_cut_short(record: logging.LogRecord) -> bool:
    """The HTTP server's record of a body cut short is left out: the failure is logged once, in one line
    (with ``--debug``, its traceback stays)."""
    cut_short = record.exc_info is not None and isinstance(record.exc_info[1], BodyCutShort)
    return not cut_short or log.isEnabledFor(logging.DEBUG)


class _BadPaths:
    """400 for a path whose segments are not UTF-8 (``common.segments`` would fail on it)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            try:
                unquote((scope.get("raw_path") or b"").decode("latin-1"), errors="strict")
            except UnicodeDecodeError:
                await error(400, None, "the path is not UTF-8")(scope, receive, send)
                return
        await self.app(scope, receive, send)


class _Logged:
    """One log line per HTTP request, without query or headers; a body that ended before its length (the
    client went away, or the server cut it short) says how much of it was sent."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.monotonic()
        status = sent = 0
        length: int | None = None

        async def sending(message: Message) -> None:
            nonlocal status, sent, length
            if message["type"] == "http.response.start":
                status = message["status"]
                given = dict(message.get("headers", ())).get(b"content-length")
                length = int(given) if given is not None and given.isdigit() else None
            elif message["type"] == "http.response.body":
                sent += len(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            short = scope["method"] != "HEAD" and length is not None and sent < length
            note = f" (cut short: {sent} of {length} bytes sent)" if short else ""
            log.info("%s %s %d %.3fs%s", scope["method"], scope["path"], status, time.monotonic() - started, note)
