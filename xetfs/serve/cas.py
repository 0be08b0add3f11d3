"""The CAS routes hf_xet downloads from: reconstructions, signed xorb ranges, telemetry.

* ``GET /v2/reconstructions/{file}`` and ``/v1/...`` (``Authorization: Bearer``
  with a Xet access token of this server): the terms and fetch ranges of
  the bytes asked in ``Range`` (``bytes=s-e``, inclusive end; an end past
  the file is clamped, a start at or past it is 416).  Each fetch range is
  a signed URL of this server.
* ``GET /xorbs/{xorb}/{first}-{stop}?e={expires}&s={signature}``: the
  serialized chunks ``[first, stop)`` of a xorb, or the part of them that
  ``Range`` asks for (counted from the first of them).  hf_xet sends no
  token here, so the URL is its own credential, as a presigned object URL
  is: an expired or altered one gets 403, on which hf_xet asks for a new
  reconstruction.  Expiry times are rounded up to a quarter of
  ``--url-ttl``, so the URLs of a range are the same for a while, whichever
  process signs them, and a proxy can cache them.  Every chunk of the
  range is decoded and checked against its hash before the first byte is
  sent (hf_xet does not check them); a range that fails gets 410
  (``common.DAMAGED``), which hf_xet does not retry.
* ``POST /v1/telemetry``: accepted and dropped.
"""

from __future__ import annotations

import logging
import re

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from xetfs.base import hashes
from xetfs.base.errors import XetfsError
from xetfs.serve import reconstruction
from xetfs.serve.common import BadRange, State, byte_range, error, read_error

log = logging.getLogger("xetfs.serve")

_CHUNKS = re.compile(r"(\d+)-(\d+)")
MAX_TELEMETRY_BYTES = 1024 * 1024


def _xet_token_problem(state: State, request: Request) -> str | None:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token:
        return "no Xet access token"
    return state.signer.token_problem(token.strip(), state.clock())


async def reconstruction_route(request: Request) -> Response:
    state: State = request.app.state.serve
    version = request.url.path.split("/")[1]
    problem = _xet_token_problem(state, request)
    if problem is not None:
        return error(401, None, f"Xet access token refused: {problem}")
    file_id = request.path_params["file_id"].lower()
    snap = await state.contents.snapshot()
    entry = snap.entry(file_id)
    if entry is None and hashes.is_hex(file_id):
        snap = await state.contents.snapshot(missed=True)
        entry = snap.entry(file_id)
    if entry is None:
        return error(404, "EntryNotFound", f"file {file_id} is not in the store")
    try:
        span = byte_range(request.headers.get("range"), entry.size)
    except BadRange as exc:
        if entry.size == 0 and request.headers.get("range", "").strip().startswith("bytes=0-"):
            span = (0, 0)
        else:
            return error(416, None, str(exc), {"Content-Range": f"bytes */{entry.size}"})
    start, end = span if span is not None else (0, entry.size)
    terms = snap.terms(entry)
    try:
        layouts = {x: await snap.reader.layout(x) for x in _xorbs_under(terms, start, end)}
        plan = reconstruction.plan(terms, layouts, start, end, max_fetch=state.settings.max_fetch)
    except XetfsError as exc:
        log.error("reconstruction of file %s: %s", entry.hex, exc)
        return read_error(exc)
    step = max(1, state.settings.url_ttl // 4)
    expires = -(-(int(state.clock()) + state.settings.url_ttl) // step) * step
    base = state.url_base(request)
    urls = {f: _xorb_url(state, base, f, expires) for f in plan.fetches}
    doc = reconstruction.v2_answer(plan, urls) if version == "v2" else reconstruction.v1_answer(plan, urls)
    return JSONResponse(doc, headers={"Cache-Control": "no-store"})


def _xorbs_under(terms: list[reconstruction.Term], start: int, end: int) -> list[bytes]:
    """The xorbs of the terms that hold file bytes ``[start, end)``, in order of first use."""
    out: dict[bytes, None] = {}
    pos = 0
    for t in terms:
        if pos >= end:
            break
        if pos + t.size > start:
            out[t.xorb] = None
        pos += t.size
    return list(out)


def _xorb_url(state: State, base: str, f: reconstruction.Fetch, expires: int) -> str:
    xorb, chunks = hashes.to_hex(f.xorb), f"{f.first}-{f.stop}"
    signature = state.signer.sign("xorb", [xorb, chunks], expires)
    return f"{base}/xorbs/{xorb}/{chunks}?e={expires}&s={signature}"


async def xorb_range(request: Request) -> Response:
    state: State = request.app.state.serve
    xorb_hex, chunks = request.path_params["xorb"], request.path_params["chunks"]
    expires, signature = request.query_params.get("e", ""), request.query_params.get("s", "")
    m = _CHUNKS.fullmatch(chunks)
    if not hashes.is_hex(xorb_hex) or m is None or not expires.isdigit():
        return error(403, None, "not a signed xorb URL of this server")
    now = state.clock()
    problem = state.signer.problem("xorb", [xorb_hex, chunks], int(expires), signature, now)
    if problem is not None:
        return error(403, None, f"signed URL refused: {problem}")
    first, stop = int(m.group(1)), int(m.group(2))
    xorb = hashes.from_hex(xorb_hex)
    snap = await state.contents.snapshot()
    try:
        if not snap.store.has_xorb(xorb):  # signed after this process last looked? (then the xorb may be new)
            # (Signed before ``expires - url_ttl + 1``: ``expires`` counts from the signing time's whole second.)
            snap = await state.contents.looked_at_since(int(expires) - state.settings.url_ttl + 1)
        layout = await snap.reader.layout(xorb)
        if not 0 <= first < stop <= layout.num_chunks:
            return error(416, None, f"xorb {xorb_hex} has {layout.num_chunks} chunks, not [{first}, {stop})")
        size = layout.phys_ends[stop - 1] - layout.phys_start(first)
        span = byte_range(request.headers.get("range"), size)
        async with state.checks:
            data = await snap.chunks(xorb, first, stop)
    except BadRange as exc:
        return error(416, None, str(exc), {"Content-Range": f"bytes */{size}"})
    except XetfsError as exc:
        log.error("xorb %s chunks [%d, %d): %s", xorb_hex, first, stop, exc)
        return read_error(exc)
    headers = {"Cache-Control": f"public, max-age={max(0, int(expires) - int(now))}, immutable",
               "Accept-Ranges": "bytes"}  # fmt: skip
    if span is None:
        return Response(data, 200, headers, media_type="application/octet-stream")
    lo, hi = span
    headers["Content-Range"] = f"bytes {lo}-{hi - 1}/{size}"
    return Response(data[lo:hi], 206, headers, media_type="application/octet-stream")


async def telemetry(request: Request) -> Response:
    received = 0
    async for piece in request.stream():
        received += len(piece)
        if received > MAX_TELEMETRY_BYTES:
            break
    return Response(None, 200)
