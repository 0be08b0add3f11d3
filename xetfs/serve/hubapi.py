"""The Hub routes: ``resolve``, revision info, tree listings and the Xet token route.

Paths are split on their raw segments (``common.segments``): huggingface_hub
percent-encodes a revision like ``refs/pr/1`` into one segment, and a repo
id is one segment (``gpt2``) or two (``org/name``).

* ``HEAD|GET /{prefix}{repo}/resolve/{revision}/{path}`` (prefix ``datasets/``,
  ``spaces/`` or none): the Hub's file metadata headers; a GET also the
  bytes, with ``Range``.  A file whose blob is a sha256 is an LFS file and
  carries ``X-Xet-Hash`` and the token route (``Link: <...>; rel="xet-auth"``),
  so clients with hf_xet download it from the CAS routes; a file named by a
  git sha1 is a regular file and goes as a plain body.
* ``GET /api/{types}/{repo}[/revision/{revision}]``: the repo at a revision
  (``sha``, ``siblings``; with ``?blobs=true`` each sibling's size, blob id
  and LFS object).
* ``GET /api/{types}/{repo}/tree/{revision}[/{path}]``: the listing, paginated
  with ``Link: <...>; rel="next"`` (the cursor is the last path sent, so any
  process can answer the next page).
* ``POST /api/{types}/{repo}/paths-info/{revision}``: the tree entries of the
  paths in the form field ``paths`` (``HfApi.get_paths_info``, and
  ``HfFileSystem`` for a file's time); paths that are not there are left out.
* ``GET /api/{types}/{repo}/refs``: the branches (the catalogue's refs).
* ``GET /api/{types}/{repo}/xet-read-token/{revision}``: a Xet access token,
  as headers (huggingface_hub) and as JSON (hf_xet's refresh).
"""

from __future__ import annotations

import base64
import json
import logging
import urllib.parse
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from xetfs.base.errors import XetfsError
from xetfs.base.settings import SERVE_BLOCK
from xetfs.serve import hub
from xetfs.serve.common import (
    BadRange,
    BodyCutShort,
    State,
    byte_range,
    error,
    raw_path,
    read_error,
    segments,
    unauthorized,
)
from xetfs.serve.contents import Snapshot
from xetfs.storage.catalogue import Repo
from xetfs.storage.index import FileEntry

log = logging.getLogger("xetfs.serve")

_API_ACTIONS = ("revision", "tree", "xet-read-token", "paths-info", "refs")
NOT_SERVED = "xetfs serve does not answer this (it serves downloads, listings and revision info)"
PATHS_INFO_MAX = 1000  # paths one paths-info request may ask for (the Hub's bound)
PATHS_INFO_BYTES = 1 << 20  # and the size of its body


def _split_repo(parts: list[str], actions: tuple[str, ...]) -> tuple[str, str, list[str]] | None:
    """``(repo id, action, rest)`` of ``org/name/ACTION/...`` or ``name/ACTION/...``; None if neither."""
    if len(parts) >= 3 and parts[2] in actions and parts[0] and parts[1]:
        return f"{parts[0]}/{parts[1]}", parts[2], parts[3:]
    if len(parts) >= 2 and parts[1] in actions and parts[0]:
        return parts[0], parts[1], parts[2:]
    return None


@dataclass(frozen=True)
class _Lookup:
    """A repo and revision of a request, found in the snapshot (looked at again once on a miss)."""

    snap: Snapshot
    repo: Repo
    commit: str
    file: hub.File | None = None


async def _lookup(
    state: State, repo_type: str, repo_id: str, revision: str, path: str | None = None
) -> _Lookup | Response:
    """The repo and commit of a request (and the file at ``path``, when given), or the Hub's 404 for what is
    missing.  A miss looks at the store again first: a pack may have added it, and another process may
    already have answered about it."""
    snap = await state.contents.snapshot()
    for attempt in (0, 1):
        repo = snap.catalogue.repo(repo_type, repo_id)
        commit = hub.resolve(repo, revision) if repo is not None else None
        file = hub.find_file(repo, commit, path) if repo is not None and commit is not None and path else None
        if (commit is not None and (path is None or file is not None)) or attempt:
            break
        snap = await state.contents.snapshot(missed=True)
    if repo is None:
        return error(404, "RepoNotFound", f"Repository not found: {repo_type} {repo_id}")
    if commit is None:
        return error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
    if path is not None and file is None:
        return error(404, "EntryNotFound", f"Entry not found: {path}", {"X-Repo-Commit": commit})
    return _Lookup(snap, repo, commit, file)


# -- resolve -------------------------------------------------------------------------


async def resolve(request: Request) -> Response:
    state: State = request.app.state.serve
    if not state.user_allowed(request):
        return unauthorized()
    parts = segments(request)
    repo_type = "model"
    if parts and parts[0] in ("datasets", "spaces"):
        repo_type, parts = parts[0][:-1], parts[1:]
    split = _split_repo(parts, ("resolve",))
    if split is None or len(split[2]) < 2 or not all(split[2]):
        return error(404, None, "Not found")
    repo_id, _, rest = split
    revision, path = rest[0], "/".join(rest[1:])
    found = await _lookup(state, repo_type, repo_id, revision, path)
    if isinstance(found, Response):
        return found
    file = found.file
    assert file is not None
    entry = found.snap.entry(file.content.xet_hash)
    if entry is None:
        log.warning("%s %s: %s: file %s is not in the store", repo_type, repo_id, path, file.content.xet_hash)
        return error(410, "CorruptedObject", f"{path}: its content is not in the store")
    headers = {
        "X-Repo-Commit": found.commit,
        "ETag": f'"{file.blob}"',
        "X-Linked-Etag": f'"{file.blob}"',
        "X-Linked-Size": str(entry.size),
        "Accept-Ranges": "bytes",
        "Cache-Control": state.cache_control(immutable=revision == found.commit),
    }
    if file.is_lfs:
        route = f"{state.url_base(request)}/api/{repo_type}s/{repo_id}/xet-read-token/{found.commit}"
        headers.update({"X-Xet-Hash": entry.hex, "X-Xet-Refresh-Route": route, "Link": f'<{route}>; rel="xet-auth"'})
        state.vary(headers)
    if _matches(request.headers.get("if-none-match"), file.blob):  # a cache checking its copy: still good
        return Response(None, 304, headers)
    return await _send(request, found.snap, entry, headers, f"{repo_type} {repo_id}@{found.commit[:12]}: {path}")


async def _send(request: Request, snap: Snapshot, entry: FileEntry, headers: dict[str, str], what: str) -> Response:
    """The file's bytes, or the range the request asks for, with ``headers``; ``what`` names it in the log."""
    try:
        span = byte_range(request.headers.get("range"), entry.size)
    except BadRange as exc:
        return error(416, None, str(exc), {"Content-Range": f"bytes */{entry.size}"})
    start, end = span if span is not None else (0, entry.size)
    if span is not None:
        headers["Content-Range"] = f"bytes {start}-{end - 1}/{entry.size}"
    status = 206 if span is not None else 200
    headers["Content-Length"] = str(end - start)
    if request.method == "HEAD":
        return Response(None, status, headers, media_type="application/octet-stream")
    try:  # the first block before the status line: a damaged start fails with a clean error
        first = await snap.read(entry, start, min(SERVE_BLOCK, end - start)) if end > start else b""
    except XetfsError as exc:
        log.error("%s: %s", what, exc)
        return read_error(exc)

    async def body() -> AsyncIterator[bytes]:
        yield first
        pos = start + len(first)
        while pos < end:
            try:
                data = await snap.read(entry, pos, min(SERVE_BLOCK, end - pos))
            except XetfsError as exc:
                # The status is sent: cutting the body short is the only way left to fail.
                log.error("%s at byte %d: %s; body cut short", what, pos, exc)
                raise BodyCutShort(str(exc)) from exc
            yield data
            pos += len(data)

    return StreamingResponse(body(), status, headers, media_type="application/octet-stream")


def _matches(if_none_match: str | None, blob: str) -> bool:
    """Whether an ``If-None-Match`` value names the blob's ETag (or is ``*``)."""
    if if_none_match is None:
        return False
    tags = [t.strip().removeprefix("W/") for t in if_none_match.split(",")]
    return "*" in tags or f'"{blob}"' in tags


# -- the API -----------------------------------------------------------------------------


async def api(request: Request) -> Response:
    state: State = request.app.state.serve
    parts = segments(request)[1:]  # after "api"
    repo_type = hub.API_TYPES.get(parts[0]) if parts else None
    if repo_type is None:
        return error(404, None, NOT_SERVED)
    parts = parts[1:]
    split = _split_repo(parts, _API_ACTIONS)
    if split is None:
        if 1 <= len(parts) <= 2 and all(parts):  # GET /api/models/{repo}: the default branch
            split = ("/".join(parts), "revision", ["main"])
        else:
            return error(404, None, NOT_SERVED)
    repo_id, action, rest = split
    if not state.user_allowed(request):
        return unauthorized()
    if (request.method == "POST") != (action == "paths-info"):
        allow = "POST" if action == "paths-info" else "GET"
        return error(405, None, f"{request.method} is not answered here", {"Allow": allow})
    if action == "refs" and not rest:
        return await _refs(request, state, repo_type, repo_id)
    if not rest or not rest[0]:
        return error(404, None, NOT_SERVED)
    if action == "xet-read-token":
        return await _xet_token(request, state, repo_type, repo_id, "/".join(rest))
    found = await _lookup(state, repo_type, repo_id, rest[0])
    if isinstance(found, Response):
        return found
    immutable = rest[0] == found.commit
    if action == "revision":
        return _revision_info(state, found.repo, found.commit, immutable, blobs=_yes(request.query_params.get("blobs")))
    if action == "paths-info":
        return await _paths_info(request, state, found, immutable)
    if action == "refs":
        return error(404, None, NOT_SERVED)
    return _tree(request, state, found.repo, found.commit, "/".join(rest[1:]), immutable)


def _revision_info(state: State, repo: Repo, commit: str, immutable: bool, *, blobs: bool = False) -> Response:
    files = sorted(repo.revisions[commit].files.items())
    siblings = [hub.File(p, b, repo.blobs[b]).sibling() if blobs else {"rfilename": p} for p, b in files]
    doc = {"_id": f"{repo.type}/{repo.id}", "id": repo.id, "sha": commit, "private": False, "gated": False,
           "disabled": False, "siblings": siblings}  # fmt: skip
    return JSONResponse(doc, headers={"Cache-Control": state.cache_control(immutable)})


async def _paths_info(request: Request, state: State, found: _Lookup, immutable: bool) -> Response:
    """The tree entries of the paths asked for (a form, as huggingface_hub sends it, or JSON).  With ``expand``,
    each has its ``lastCommit``: the commit, dated when the store last changed (it keeps no commit dates;
    ``HfFileSystem.modified``, which duckdb asks, needs one)."""
    wrong = error(400, None, f"paths-info: a form or JSON object with 'paths', at most {PATHS_INFO_MAX} of them")
    body = b""
    async for part in request.stream():
        body += part
        if len(body) > PATHS_INFO_BYTES:
            return wrong
    try:
        if request.headers.get("content-type", "").startswith("application/json"):
            form = json.loads(body)
            asked, expand = form.get("paths", []), str(form.get("expand", ""))
            asked = [asked] if isinstance(asked, str) else asked
        else:
            form = urllib.parse.parse_qs(body.decode(), keep_blank_values=True)
            asked, expand = form.get("paths", []), (form.get("expand") or [""])[0]
    except (ValueError, AttributeError, UnicodeDecodeError):
        return wrong
    if not isinstance(asked, list) or len(asked) > PATHS_INFO_MAX or not all(isinstance(p, str) for p in asked):
        return wrong
    repo, commit = found.repo, found.commit
    entries = [e for p in dict.fromkeys(p.strip("/") for p in asked) if (e := hub.path_entry(repo, commit, p))]
    if _yes(expand):
        date = datetime.fromtimestamp(found.snap.store.mtime, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
        for entry in entries:
            entry["lastCommit"] = {"id": commit, "title": "", "date": date}
    return JSONResponse(entries, headers={"Cache-Control": state.cache_control(immutable)})


async def _refs(request: Request, state: State, repo_type: str, repo_id: str) -> Response:
    """The repo's branches and pull requests (``HfApi.list_repo_refs``): the catalogue's refs."""
    snap = await state.contents.snapshot()
    repo = snap.catalogue.repo(repo_type, repo_id)
    if repo is None:
        return error(404, "RepoNotFound", f"Repository not found: {repo_type} {repo_id}")
    refs = sorted(repo.refs.items())
    pull = [(n, c) for n, c in refs if n.startswith(("pr/", "refs/pr/"))]  # (the cache names them refs/pr/N)
    branches = [{"name": n, "ref": f"refs/heads/{n}", "targetCommit": c} for n, c in refs if (n, c) not in pull]
    doc: dict[str, object] = {"branches": branches, "tags": [], "converts": []}
    if _yes(request.query_params.get("include_prs")):
        doc["pullRequests"] = [{"name": n, "ref": n if n.startswith("refs/") else f"refs/{n}", "targetCommit": c}
                               for n, c in pull]  # fmt: skip
    return JSONResponse(doc, headers={"Cache-Control": state.cache_control(False)})


def _tree(request: Request, state: State, repo: Repo, commit: str, path: str, immutable: bool) -> Response:
    if not hub.is_directory(repo, commit, path):
        return error(404, "EntryNotFound", f"{path}: no such directory", {"X-Repo-Commit": commit})
    recursive = _yes(request.query_params.get("recursive"))
    after = _cursor(request.query_params.get("cursor"))
    page: list[dict[str, object]] = []
    more = False
    for item in hub.tree(repo, commit, path, recursive=recursive):
        if after is not None and str(item["path"]) <= after:
            continue
        if len(page) == state.settings.tree_page:
            more = True
            break
        page.append(item)
    headers = {"Cache-Control": state.cache_control(immutable)}
    if more:
        cursor = base64.urlsafe_b64encode(str(page[-1]["path"]).encode()).decode()
        base = raw_path(request)  # as the client sent it (encoded), without the query
        query = f"recursive={str(recursive).lower()}&expand=false&cursor={cursor}"
        headers["Link"] = f'<{state.url_base(request)}{base}?{query}>; rel="next"'
        state.vary(headers)
    return JSONResponse(page, headers=headers)


def _yes(value: str | None) -> bool:
    """Whether a query or form parameter says yes (``true``, ``1``), as huggingface_hub sends its flags."""
    return (value or "").lower() in ("1", "true")


def _cursor(value: str | None) -> str | None:
    if not value:
        return None
    try:
        return base64.urlsafe_b64decode(value.encode()).decode()
    except (ValueError, UnicodeDecodeError):
        return ""  # an unreadable cursor starts over rather than failing


async def _xet_token(request: Request, state: State, repo_type: str, repo_id: str, revision: str) -> Response:
    found = await _lookup(state, repo_type, repo_id, revision)
    if isinstance(found, Response):
        return found
    expires = int(state.clock()) + state.settings.token_ttl
    token = state.signer.token(expires)
    cas = state.url_base(request)
    headers = {"X-Xet-Cas-Url": cas, "X-Xet-Access-Token": token, "X-Xet-Token-Expiration": str(expires),
               "Cache-Control": "no-store"}  # fmt: skip
    return JSONResponse({"accessToken": token, "exp": expires, "casUrl": cas}, headers=headers)
