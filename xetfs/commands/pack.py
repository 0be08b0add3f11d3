"""``xetfs pack``: its arguments, and the sub-command that runs ``write.pack`` or ``write.hubpack``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from xetfs.base.errors import XetfsError
from xetfs.base.exitstatus import ExitStatus
from xetfs.storage.manifest import MANIFEST_NAME
from xetfs.write.pack import pack


def pack_targets(args: argparse.Namespace) -> tuple[list[str], str, Path | None]:
    """``(sources, store, hub cache dir or None)`` from the ``pack`` arguments.

    ``pack SRC... STORE``; ``pack --hub-cache [DIR] STORE`` (``--hub-cache``
    takes its DIR only when a STORE follows it).  Raises ``UsageError``-like
    ``XetfsError`` for a wrong number of paths.
    """
    from xetfs.write.hubcache import default_cache_dir

    paths = list(args.paths)
    if args.hub_cache is None:
        if len(paths) < 2:
            raise PackUsageError("pack needs SRC... STORE (or --hub-cache [DIR] STORE)")
        return paths[:-1], paths[-1], None
    if args.hub_cache == _DEFAULT_CACHE:
        if len(paths) != 1:
            raise PackUsageError("pack --hub-cache [DIR] STORE takes one STORE")
        return [], paths[0], default_cache_dir()
    if not paths:  # "--hub-cache STORE": the value given was the store
        return [], args.hub_cache, default_cache_dir()
    if len(paths) != 1:
        raise PackUsageError("pack --hub-cache [DIR] STORE takes one DIR and one STORE")
    return [], paths[0], Path(args.hub_cache)


class PackUsageError(XetfsError):
    """Wrong arguments to ``pack``."""


_DEFAULT_CACHE = "\0default"


def cmd_pack(args: argparse.Namespace) -> int:
    """The ``pack`` sub-command: prints one summary line.

    Exits ``ExitStatus.SKIPPED`` when something was skipped (with ``--strict``, that is an error instead).
    """
    from xetfs.write.hubpack import pack_hub_cache, pack_revision

    show = sys.stderr.isatty() and not args.no_progress
    sources, store, cache_dir = pack_targets(args)
    done = ExitStatus.OK
    if args.replace and (cache_dir is not None or args.repo):
        raise PackUsageError("--replace goes with pack SRC... STORE (a revision of a repo names its files anyway)")
    if cache_dir is not None:
        if args.revision or args.commit or args.repo_type or args.follow_symlinks or args.reread:
            raise PackUsageError(
                "--revision, --commit, --repo-type, --follow-symlinks and --reread go with pack SRC... STORE"
            )
        hub = pack_hub_cache(cache_dir, store, repos=args.repo or (), progress=show, strict=args.strict)
        print(hub.line(Path(store)))
        return ExitStatus.SKIPPED if hub.skipped_count else done
    if args.repo:
        if len(args.repo) > 1:
            raise PackUsageError("pack SRC... STORE records one revision of one repo: give --repo once")
        commit, hub = pack_revision(
            sources, store, repo_id=args.repo[0], repo_type=args.repo_type or "model",
            revision=args.revision or "main", commit=args.commit, progress=show, strict=args.strict,
            follow_symlinks=args.follow_symlinks, reread=args.reread,
        )  # fmt: skip
        print(f"{args.repo[0]} {args.revision or 'main'} = {commit}; {hub.line(Path(store))}")
        return ExitStatus.SKIPPED if hub.skipped_count else done
    if args.revision or args.commit or args.repo_type:
        raise PackUsageError("--revision, --commit and --repo-type need --repo")
    result = pack(sources, store, progress=show, strict=args.strict, follow_symlinks=args.follow_symlinks,
                  replace=args.replace, reread=args.reread)  # fmt: skip
    print(result.line())
    return ExitStatus.SKIPPED if result.skipped else done


def add_pack_parser(sub: Any, add_common: Callable[[argparse.ArgumentParser], None]) -> None:
    """Register ``pack`` on the sub-parsers ``sub`` of the ``xetfs`` parser."""
    p = sub.add_parser(
        "pack",
        help="write files (or a huggingface_hub cache) into a local store with hf_xet, and name them",
        description="Write files and directories into a local Xet store (with hf_xet) and record their "
        f"names in STORE/{MANIFEST_NAME}, which mount uses.  With --repo, record them as one revision "
        "of a Hub repo instead; with --hub-cache, import a huggingface_hub cache (both into STORE/xetfs-hub.json).",
        usage="%(prog)s SRC... STORE [--repo ORG/NAME ...] | --hub-cache [DIR] STORE [--repo ORG/NAME ...]",
    )
    p.add_argument("paths", nargs="*", metavar="SRC... STORE", help="files and directories to pack, then the store")
    p.add_argument("--hub-cache", nargs="?", const=_DEFAULT_CACHE, metavar="DIR",
                   help="import a huggingface_hub cache (default: HF_HUB_CACHE, HF_HOME/hub, "
                        "~/.cache/huggingface/hub)")  # fmt: skip
    p.add_argument("--repo", action="append", metavar="ORG/NAME",
                   help="with --hub-cache: import only this repo (repeatable); with SRC: the repo they are a "
                        "revision of")  # fmt: skip
    p.add_argument("--repo-type", choices=["model", "dataset", "space"], help="with SRC --repo (default model)")
    p.add_argument("--revision", metavar="BRANCH", help="with SRC --repo: the ref to point at it (default main)")
    p.add_argument("--commit", metavar="SHA", help="with SRC --repo: its commit id (default: derived from content)")
    p.add_argument("--follow-symlinks", action="store_true",
                   help="pack what symlinks in SRC point to (files, and directories walked in turn) instead of "
                        "skipping them; a link back to a directory above it is still skipped")  # fmt: skip
    p.add_argument("--strict", action="store_true",
                   help=f"fail (exit status {int(ExitStatus.ERROR)}) before recording anything if any file "
                        "would be skipped; without it, a pack that skipped files exits with status "
                        f"{int(ExitStatus.SKIPPED)}")  # fmt: skip
    p.add_argument("--replace", action="store_true",
                   help=f"with SRC and no --repo: {MANIFEST_NAME} names only what this pack's SRC hold now: "
                        "names from earlier packs that are not among them go, files deleted from SRC since "
                        "included (their bytes stay in the store); without it, a pack adds to the names "
                        "there")  # fmt: skip
    p.add_argument("--reread", action="store_true",
                   help="with SRC: read every file again, also those an earlier pack on this machine read and "
                        "that have not changed since (otherwise taken as they are)")  # fmt: skip
    p.add_argument("--no-progress", action="store_true", help="no progress bar even on a terminal")
    p.set_defaults(func=cmd_pack)
    add_common(p)
