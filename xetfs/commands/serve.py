"""``xetfs serve``: its options, and running the application under hypercorn on trio.

Starlette and hypercorn come with the ``serve`` extra; they are imported
only when the command runs, so the rest of xetfs works without them.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xetfs.base import settings
from xetfs.base.errors import XetfsError
from xetfs.base.malloc import keep_freed_memory
from xetfs.base.messages import UserFormatter, plural

if TYPE_CHECKING:
    from xetfs.serve.common import Settings
    from xetfs.serve.contents import Snapshot
    from xetfs.storage.store import Store

DESCRIPTION = """\
Serve a store as an offline Hugging Face endpoint.  Point HF_ENDPOINT at the
public URL and huggingface_hub, hf_xet and transformers download the repos
of the store's catalogue from it: Xet files through the CAS routes (every
xorb range checked before it is sent), regular files as plain bodies.  No
FUSE is needed.  See docs/serve.md for proxies, load balancers and security.
"""


def add_serve_parser(sub: Any, add_common: Callable[[argparse.ArgumentParser], None]) -> None:
    from xetfs.commands.args import add_remote_args, parse_size, seconds, size_text

    p = sub.add_parser("serve", help="serve a store as an offline Hugging Face endpoint (HF_ENDPOINT)",
                       description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("store", help="store directory or URL (http(s)://, s3://, gs://, az://)")
    add_remote_args(p)
    p.add_argument("--host", default=settings.SERVE_HOST,
                   help=f"address to listen on (default {settings.SERVE_HOST}: this machine only; "
                        "0.0.0.0 or :: for all)",
                   )  # fmt: skip  # fmt: skip
    p.add_argument("--port", type=int, default=settings.SERVE_PORT,
                   help=f"port to listen on (default {settings.SERVE_PORT})")  # fmt: skip
    p.add_argument("--public-url", metavar="URL",
                   help="the address clients reach the server at, e.g. behind a proxy: every URL the server "
                        "hands out starts with it (default: the address each client reached, from its Host "
                        "header)")  # fmt: skip
    p.add_argument("--token-file", type=Path, metavar="FILE",
                   help="require one of the tokens in FILE (one a line) as 'Authorization: Bearer' on the "
                        "Hub routes and the Xet token route")  # fmt: skip
    p.add_argument("--key-file", type=Path, metavar="FILE",
                   help="key that signs Xet tokens and xorb URLs, created if missing; give every server "
                        "behind one address the same file (default: a key for this server only)")  # fmt: skip
    p.add_argument("--token-ttl", type=int, default=settings.SERVE_TOKEN_TTL, metavar="SECONDS",
                   help=f"lifetime of a Xet access token, at least 10 (default {settings.SERVE_TOKEN_TTL}; "
                        "clients renew a token 60 s before it expires, so one of 120 or less is renewed at "
                        "every use)")  # fmt: skip
    p.add_argument("--url-ttl", type=int, default=settings.SERVE_URL_TTL, metavar="SECONDS",
                   help="lifetime of a signed xorb-range URL, at least 10 "
                        f"(default {settings.SERVE_URL_TTL})")  # fmt: skip
    p.add_argument("--max-fetch", type=parse_size, default=settings.SERVE_MAX_FETCH,
                   help="largest xorb range in a reconstruction answer; each is held in memory while it is "
                        f"checked (default {size_text(settings.SERVE_MAX_FETCH)})")  # fmt: skip
    p.add_argument("--checks", type=int, default=settings.SERVE_CHECKS, metavar="N",
                   help="xorb ranges read and checked at the same time, per server process "
                        f"(default {settings.SERVE_CHECKS})")  # fmt: skip
    p.add_argument("--workers", type=int, default=settings.SERVE_WORKERS, metavar="N",
                   help="server processes on the one address; each checks xorb ranges on a core of its own "
                        f"(default: one per core, at most {settings.SERVE_WORKERS_MAX})")  # fmt: skip
    p.add_argument("--tree-page-size", type=int, default=settings.SERVE_TREE_PAGE, metavar="N",
                   help="entries per page of a tree listing "
                        f"(default {settings.SERVE_TREE_PAGE}, as the Hub)")  # fmt: skip
    p.add_argument("--rescan", type=seconds, metavar="SECONDS",
                   help="look at the store again for new packs and moved branches: a directory at the first "
                        f"request after this long (default {settings.SERVE_RESCAN:g}), a URL's catalogue every "
                        f"this long (default {settings.SERVE_REMOTE_RESCAN:g}); and on a miss")  # fmt: skip
    p.set_defaults(func=cmd_serve)


def _default_url(host: str, port: int) -> str:
    shown = host
    try:
        if ipaddress.ip_address(host).version == 6:
            shown = f"[{host}]"
    except ValueError:
        pass
    if host in ("0.0.0.0", "::"):
        shown = "127.0.0.1"
    return f"http://{shown}:{port}"


def _bind(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _opener(args: argparse.Namespace, *, note: bool) -> Callable[[str], Store]:
    """How a server process opens its store, at start and for every load after a change: with ``note``, it says
    where the disk cache is the first time (once per server, not per process and load)."""
    from xetfs.commands.args import open_location

    def open_store(_: str) -> Store:
        nonlocal note
        store = open_location(args, note=note)
        note = False
        return store

    return open_store


def cmd_serve(args: argparse.Namespace) -> int:
    from xetfs.commands.args import UsageError

    try:
        import hypercorn  # noqa: F401
        import starlette  # noqa: F401
    except ImportError:
        raise UsageError("xetfs serve needs its extra: pip install 'xetfs[serve]'") from None
    from xetfs.serve.access import UserTokens
    from xetfs.serve.app import serve_on
    from xetfs.serve.common import State
    from xetfs.serve.contents import Contents
    from xetfs.serve.processes import listen, run_workers
    from xetfs.serve.signing import Signer, load_key

    for handler in logging.getLogger().handlers:  # a server's log: each line with its time and process
        handler.setFormatter(UserFormatter(stamped=True))
    settings = _settings(args)
    tokens = UserTokens(args.token_file) if args.token_file else None
    signer = Signer(load_key(args.key_file))
    try:
        sock = listen(args.host, args.port)
    except OSError as exc:
        raise XetfsError(f"cannot listen on {_bind(args.host, args.port)}: {exc}") from None
    listening = f"http://{_bind(args.host, sock.getsockname()[1])}"
    processes = plural(args.workers, "server process", "server processes")
    shown = args.public_url or listening
    where = f"{shown} (listening on {listening}; {processes})" if args.public_url else f"{shown} ({processes})"

    def work(worker: int, ready: Callable[[], None]) -> int:
        """One server process: opens the store, serves until told to stop."""
        keep_freed_memory()  # (as the mount daemon: buffers of a xorb range are reused, not mapped afresh)
        contents = Contents(args.store, _opener(args, note=worker == 0), rescan=args.rescan, io_timeout=args.io_timeout)

        async def started() -> None:
            if worker == 0:
                _announce(await contents.snapshot(), where)
            ready()

        serve_on(sock, State(settings, contents, signer, tokens), started=started)
        return 0

    with sock:
        status = run_workers(args.workers, work)
    if status == 0:  # (stopped by SIGTERM or SIGINT; a failure said what it was)
        print(f"xetfs: stopped serving at {shown}", file=sys.stderr, flush=True)
    return status


def _settings(args: argparse.Namespace) -> Settings:
    """The server's settings from its options; ``UsageError`` for a value out of bounds."""
    from xetfs.commands.args import UsageError
    from xetfs.serve.common import Settings

    if min(args.token_ttl, args.url_ttl) < 10 or min(args.tree_page_size, args.checks, args.max_fetch,
                                                      args.workers) < 1:  # fmt: skip
        raise UsageError("--token-ttl and --url-ttl: at least 10; --tree-page-size, --checks, --max-fetch, "
                         "--workers: at least 1")  # fmt: skip
    public_url = (args.public_url or _default_url(args.host, args.port)).rstrip("/")
    if not public_url.startswith(("http://", "https://")):
        raise UsageError(f"--public-url {public_url!r}: not an http(s) URL")
    return Settings(public_url, follow_host=args.public_url is None, token_ttl=args.token_ttl,
                    url_ttl=args.url_ttl, tree_page=args.tree_page_size, max_fetch=args.max_fetch,
                    checks_at_once=args.checks)  # fmt: skip


def _announce(snap: Snapshot, where: str) -> None:
    """The start-up line on the terminal: what is served and where; a warning when the store names no repo."""
    from xetfs.storage.catalogue import CATALOGUE_NAME

    repos = len(snap.catalogue.repos)
    print(f"xetfs: serving {plural(repos, 'repo')}, {plural(len(snap.index), 'file')} at {where}", file=sys.stderr,
          flush=True)  # fmt: skip
    if not repos:
        print(f"xetfs: warning: the store names no repo (no {CATALOGUE_NAME} at its top, or one without repos): "
              "every request for a repo gets 404 until 'xetfs pack --repo' or 'xetfs pack --hub-cache' writes one "
              "(docs/hub-caches.md)", file=sys.stderr, flush=True)  # fmt: skip
