"""``xetfs push STORE TARGET``: copy a store directory to a bucket (``s3://``, ``gs://``, ``az://``) or a directory.

A store only grows, and nodes may read the target while a push runs, so a
push is ordered, incremental and never deletes:

1. xorbs, 2. shards, 3. any other file of the store, 4. the listing
(``xetfs-listing.json``: every object of the target), 5. the names
manifest, then the Hub catalogue.  Each phase ends before the next begins,
so a reader never sees a shard whose xorbs are missing, nor a listing,
manifest or catalogue naming objects that are not there yet.

Xorbs and shards are named by their hash: one the target already has with
the same size is not sent.  Any other file is compared by content with the
target's copy and sent only when it differs, so a second push of an
unchanged store sends nothing.

Every object is replaced atomically: a directory target gets a temporary
file (under ``TARGET/.xetfs-push/``) renamed into place; a bucket gets one
single-request upload, which the service makes visible whole or not at all.
Multipart uploads are never started (obstore cannot list the ones an
interrupted run would leave, so they could not be cleaned up): one object
may be at most ``MAX_OBJECT_BYTES``, far above a xorb's 64 MiB.  A push
killed at any point can be run again; temporary files it left in a
directory target are removed by the next run.

Every object sent is checked: its size as the target reports it, plus its
bytes (a directory target's file is read back and hashed; a bucket's ETag
must be the MD5 of the bytes sent, where the service's ETag is one; an
ETag of another kind makes push read the object back).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import hashlib
import os
import re
import shutil
import sys
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Protocol

import blake3

from xetfs.base import hashes
from xetfs.base.errors import StoreError, XetfsError
from xetfs.base.settings import PUSH_JOBS, PUSH_MAX_COMPARED_BYTES
from xetfs.format.xorb import check_run
from xetfs.storage.catalogue import CATALOGUE_NAME
from xetfs.storage.layout import LISTING_NAME, SHARD_NAME, XORB_NAME, Listing, shard_name_problem
from xetfs.storage.manifest import MANIFEST_NAME
from xetfs.storage.objects import RemoteOptions, access_hint, aws_files_config, client_message, is_url, public_url
from xetfs.storage.remote import local_listing
from xetfs.storage.store import layout_from

MAX_OBJECT_BYTES = 5 * 1024**3  # the largest single-request upload S3 accepts
TEMP_DIR = ".xetfs-push"  # a directory target's temporary files, hidden from stores and listings
PUSH_SCHEMES = ("s3", "s3a", "gs", "az", "abfs", "abfss")

# The phases, in the order they are pushed.
XORBS, SHARDS, OTHER, LISTING, META = range(5)
_META_ORDER = (MANIFEST_NAME, CATALOGUE_NAME)  # phase META, one after the other


class PushError(XetfsError):
    """An object could not be sent or did not arrive as sent."""


@dataclass(frozen=True)
class Item:
    """One object to push: its name in the store (``/``-separated), where its bytes are, and its phase."""

    name: str
    size: int
    phase: int
    path: Path | None = None  # a file of the store
    data: bytes | None = None  # or bytes made by push (the listing)

    def read(self) -> bytes:
        if self.data is not None:
            return self.data
        assert self.path is not None
        with open(self.path, "rb") as f:
            data = f.read()
        if len(data) != self.size:
            raise PushError(f"{self.path}: {len(data)} bytes, {self.size} when listed (is the store being written?)")
        return data


def phase_of(name: str) -> int:
    """The phase an object of a store belongs to, by its name."""
    parts = name.split("/")
    if name == LISTING_NAME:
        return LISTING
    if name in _META_ORDER:
        return META
    if len(parts) >= 2 and parts[-2] == "xorbs" and XORB_NAME.fullmatch(parts[-1]):
        return XORBS
    if len(parts) >= 2 and parts[-2] == "shards" and SHARD_NAME.fullmatch(parts[-1]):
        return SHARDS
    return OTHER


def plan(top: Path) -> tuple[list[Item], Listing]:
    """The objects of the store directory ``top`` (its listing's, so no hidden files or caches), ordered by
    phase, and that listing."""
    listing = local_listing(top)
    items = [Item(name, size, phase_of(name), path=top / name) for name, size in listing.objects]
    items.sort(key=lambda i: (i.phase, _META_ORDER.index(i.name) if i.phase == META else 0, i.name))
    return items, listing


class Target(Protocol):
    """Where a store is pushed.  Names are ``/``-separated paths under the target's top."""

    location: str  # for messages, without secrets

    def objects(self) -> dict[str, int]:
        """Every object the target holds (not temporaries): name -> size."""
        ...

    def read(self, name: str) -> bytes | None:
        """The object ``name``, or None when it is missing."""
        ...

    def same(self, name: str, data: bytes) -> bool:
        """Whether the object ``name`` (listed by ``objects``) holds exactly ``data``."""
        ...

    def put(self, name: str, data: bytes) -> None:
        """Store ``data`` as ``name``, atomically, and check that it arrived; raises ``PushError``."""
        ...

    def clean(self) -> int:
        """Remove what an interrupted push left behind (never an object); how many things were removed."""
        ...


class DirTarget:
    """A directory on a local or mounted filesystem."""

    def __init__(self, top: Path) -> None:
        self.top = top.absolute()
        self.location = str(self.top)
        self._temp = self.top / TEMP_DIR

    def objects(self) -> dict[str, int]:
        out: dict[str, int] = {}
        if not self.top.is_dir():
            return out
        for dirpath, dirnames, filenames in os.walk(self.top):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            for name in filenames:
                path = Path(dirpath, name)
                if not name.startswith(".") and path.is_file():
                    out[path.relative_to(self.top).as_posix()] = path.stat().st_size
        return out

    def read(self, name: str) -> bytes | None:
        try:
            return (self.top / name).read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:  # (a damaged disk: the object is sent again)
            raise PushError(f"{self.top / name}: cannot read: {exc.strerror or exc}") from None

    def same(self, name: str, data: bytes) -> bool:
        try:
            return self.read(name) == data
        except PushError:
            return False

    def put(self, name: str, data: bytes) -> None:
        final = self.top / name
        try:
            self._temp.mkdir(parents=True, exist_ok=True)
            final.parent.mkdir(parents=True, exist_ok=True)
            tmp = self._temp / f"{uuid.uuid4().hex}.tmp"
            try:
                with open(tmp, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                with open(tmp, "rb") as f:  # read back what the filesystem holds
                    back = f.read()
                if len(back) != len(data) or blake3.blake3(back).digest() != blake3.blake3(data).digest():
                    raise PushError(f"{final}: the copy read back differs from what was written "
                                    f"({len(back)} of {len(data)} bytes)")  # fmt: skip
                os.replace(tmp, final)
            finally:
                tmp.unlink(missing_ok=True)
            _sync_dir(final.parent)
        except OSError as exc:
            raise PushError(f"{final}: cannot write: {exc.strerror or exc}") from None

    def clean(self) -> int:
        if not self._temp.is_dir():
            return 0
        count = sum(1 for _ in self._temp.iterdir())
        shutil.rmtree(self._temp, ignore_errors=True)
        return count


def _sync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):  # some filesystems refuse to sync a directory
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class BucketTarget:
    """A prefix of a bucket or container, through obstore: ``s3://``, ``gs://``, ``az://``.

    Credentials and endpoints come from the environment (for S3 also from the
    AWS shared config and credentials files, as for reading a store).
    obstore's own retries (with backoff) cover transient failures.
    """

    def __init__(self, url: str, options: RemoteOptions | None = None) -> None:
        from obstore.store import from_url

        self.location = public_url(url)
        options = options or RemoteOptions(request_timeout=120.0)
        self._url, self._options = url, options
        self._secrets = options.secrets()
        self._etags: dict[str, str | None] = {}  # by object, as ``objects`` listed it: its MD5, if its ETag is one
        client: Any = {
            "timeout": timedelta(seconds=options.request_timeout),
            "connect_timeout": timedelta(seconds=options.connect_timeout),
            "allow_http": True,
        }
        config: Any = aws_files_config() if url.lower().startswith(("s3://", "s3a://")) else None
        try:
            self._store = from_url(url, config=config or None, client_options=client)
        except Exception as exc:  # obstore raises its own errors for bad configuration
            raise PushError(f"target {self.location}: {self._message(exc)}") from None

    def objects(self) -> dict[str, int]:
        import obstore

        try:
            listed = [meta for batch in obstore.list(self._store, None, chunk_size=1000) for meta in batch]
        except Exception as exc:
            message = self._message(exc)
            if "NoSuchBucket" in message or "ContainerNotFound" in message:
                message += " (push does not create buckets or containers: create it first)"
            raise PushError(f"target {self.location}: cannot list: {message}") from None
        self._etags = {meta["path"]: _md5_etag(meta.get("e_tag")) for meta in listed}
        return {meta["path"]: meta["size"] for meta in listed}

    def read(self, name: str) -> bytes | None:
        import obstore
        import obstore.exceptions as oe

        try:
            return bytes(obstore.get(self._store, name).bytes())
        except oe.NotFoundError:
            return None
        except Exception as exc:
            raise PushError(f"{self.location}/{name}: cannot read: {self._message(exc)}") from None

    def same(self, name: str, data: bytes) -> bool:
        etag = self._etags.get(name)
        if etag is not None and etag == hashlib.md5(data, usedforsecurity=False).hexdigest():
            return True  # the service's MD5 of what it holds: nothing to read back
        return self.read(name) == data  # (no MD5 ETag, or one that differs: an encrypted object's is no MD5)

    def put(self, name: str, data: bytes) -> None:
        import obstore

        where = f"{self.location}/{name}"
        try:
            result = obstore.put(self._store, name, data, use_multipart=False)
            meta = obstore.head(self._store, name)
        except Exception as exc:
            raise PushError(f"{where}: upload failed: {self._message(exc)}") from None
        problem = self._arrived(name, data, meta, _md5_etag(result.get("e_tag") or meta.get("e_tag")))
        if problem is None:
            return
        base = name.rpartition("/")[2]
        if SHARD_NAME.fullmatch(base) or XORB_NAME.fullmatch(base):
            # Named by its hash, so whatever is there under the name is wrong: taken away, so that the next push
            # sends it again rather than count it as there.  (A names file, listing or catalogue is compared by
            # its bytes on the next push, and stays: nodes read it.)
            try:
                obstore.delete(self._store, name)
            except Exception as exc:
                problem += f"; it could not be removed ({self._message(exc)}): 'xetfs push --check' sends it again"
            else:
                problem += "; removed: push again to send it"
        raise PushError(f"{where}: {problem}")

    def _arrived(self, name: str, data: bytes, meta: Mapping[str, Any], etag: str | None) -> str | None:
        """What is wrong with the object just put as ``name``, or None if it holds ``data``.

        The size, then the MD5 ETag; an ETag that is no MD5 (Azure, S3 objects encrypted with KMS or a
        customer's key, whose ETags may look like one), or one that differs, has the bytes read back and
        compared.
        """
        if meta["size"] != len(data):
            return f"the target holds {meta['size']} bytes, {len(data)} were sent"
        if etag is not None and etag == hashlib.md5(data, usedforsecurity=False).hexdigest():
            return None
        try:
            back = self.read(name)
        except PushError as exc:
            return f"cannot be read back to check it ({exc})"
        if back != data:
            seen = f"ETag {etag} is not the MD5 of the {len(data)} bytes sent, and " if etag is not None else ""
            return f"{seen}the object read back differs from the {len(data)} bytes sent"
        return None

    def clean(self) -> int:
        return 0  # single-request uploads leave nothing behind

    def _message(self, exc: BaseException) -> str:
        """The error's one line, with what a refused request was sent with."""
        import obstore.exceptions as oe

        message = client_message(exc, self._secrets)
        if isinstance(exc, (oe.PermissionDeniedError, oe.UnauthenticatedError)) or re.search(r"\b40[13]\b", message):
            message += access_hint(self._url, self._options)
        return message


def own_damage(item: Item, data: bytes) -> str | None:
    """What is wrong with the store's own copy of a xorb or shard (its bytes ``data``), judged by its name (the
    hash of its content), or None: a push that replaces a target's copy must not send a damaged one."""
    name = item.name.rsplit("/", 1)[-1]
    if item.phase == SHARDS:
        return shard_name_problem(name, data)
    m = XORB_NAME.fullmatch(name)
    assert m is not None  # (phase XORBS: a xorb's name)
    xorb_hash = hashes.from_hex(m.group(1))
    try:
        layout = layout_from(lambda start, end: data[start:end], len(data), xorb_hash)
        problems = check_run(data, xorb_hash, layout, 0, layout.num_chunks)
    except XetfsError as exc:
        return str(exc)
    return next((str(p) for p in problems if p is not None), None)


def _md5_etag(etag: str | None) -> str | None:
    """An ETag that is the MD5 of the object's bytes (a single-request upload to S3), else None."""
    tag = (etag or "").strip('"').lower()
    return tag if re.fullmatch(r"[0-9a-f]{32}", tag) else None


def open_target(location: str) -> Target:
    """The target named by ``location``: a bucket URL or a directory.  HTTP(S) servers cannot be written."""
    scheme, sep, _ = location.partition("://")
    if sep and scheme.lower() in PUSH_SCHEMES:
        return BucketTarget(location)
    if is_url(location) or sep:
        raise PushError(f"target {public_url(location) if is_url(location) else location}: cannot push there "
                        f"(push writes to s3://, gs://, az:// or a directory; "
                        f"an HTTP server serves a directory pushed to)")  # fmt: skip
    return DirTarget(Path(location))


@dataclass
class PushReport:
    """What a push did.  ``sent`` objects (``sent_bytes``), of them ``replaced``: xorbs and shards whose copy in
    the target differed (``check``), ``present``: already there with the same size (xorbs, shards; with
    ``check``, the same bytes), ``unchanged``: compared by content and equal, ``cleaned``: leftovers removed."""

    sent: int = 0
    sent_bytes: int = 0
    replaced: int = 0
    present: int = 0
    unchanged: int = 0
    cleaned: int = 0
    seconds: float = 0.0

    def summary(self, source: str, target: str) -> str:
        cleaned = f", {self.cleaned} temporary files of an interrupted push removed" if self.cleaned else ""
        replaced = f" ({self.replaced} of them in place of a damaged copy)" if self.replaced else ""
        return (
            f"pushed {source} to {target}: {self.sent} objects sent ({self.sent_bytes} bytes){replaced}, "
            f"{self.present} already there, {self.unchanged} unchanged{cleaned}, in {self.seconds:.1f} s"
        )


def merged_listing(source: Listing, target: dict[str, int]) -> Listing:
    """The listing of the target once the source is pushed: the source's objects, and those the target
    already held (a push never deletes); not the listing itself, nor hidden files."""
    objects = dict(target)
    objects.update(source.objects)
    keep = {n: s for n, s in objects.items() if n != LISTING_NAME and not any(p.startswith(".") for p in n.split("/"))}
    return Listing(tuple(sorted(keep.items())), source.mtime)


def push(
    top: Path,
    target: Target,
    *,
    jobs: int = PUSH_JOBS,
    check: bool = False,
    progress: Callable[[int], None] = lambda n: None,
    total: Callable[[int], None] = lambda n: None,
) -> PushReport:
    """Push the store directory ``top`` to ``target`` in phase order (see the module's docstring).

    With ``check``, xorbs and shards the target has with the right size are
    compared by content too (``Target.same``), and sent again if they differ.

    ``total(n)`` is told the bytes that may be sent once they are known,
    ``progress(n)`` each object's bytes when it has been sent (or found
    present).  Raises ``PushError`` (or ``StoreError`` for a source that is not
    a store); objects already pushed stay, and a new run goes on from there.
    """
    started = time.monotonic()
    report = PushReport(cleaned=target.clean())
    items, listing = plan(top)
    there = target.objects()
    total(sum(i.size for i in items))
    for phase in (XORBS, SHARDS, OTHER):
        _push_phase([i for i in items if i.phase == phase], target, there, report, jobs, progress, check)
    data = merged_listing(listing, there).dump()
    listed = Item(LISTING_NAME, len(data), LISTING, data=data)
    _push_phase([listed], target, there, report, 1, lambda n: None)  # (not in the total)
    for item in (i for i in items if i.phase == META):  # the manifest, then the catalogue
        _push_phase([item], target, there, report, 1, progress)
    target.clean()  # (a directory target's temporary directory, empty by now)
    report.seconds = time.monotonic() - started
    return report


def _push_phase(items: list[Item], target: Target, there: dict[str, int], report: PushReport, jobs: int,
                progress: Callable[[int], None], check: bool = False) -> None:  # fmt: skip
    """Send what ``items`` the target lacks, ``jobs`` at a time; returns when all are there (or raises)."""
    if not items:
        return

    def one(item: Item) -> tuple[Item, str]:
        if item.size > MAX_OBJECT_BYTES:
            raise PushError(f"{item.name}: {item.size} bytes, more than the {MAX_OBJECT_BYTES} one upload may hold")
        content_named = item.phase in (XORBS, SHARDS)
        if there.get(item.name) == item.size:
            if content_named and check:
                data = item.read()
                if target.same(item.name, data):
                    return item, "present"
                damage = own_damage(item, data)
                if damage is not None:
                    raise PushError(f"{target.location}/{item.name} differs from the store's copy, and that is "
                                    f"damaged too ({damage}): run xetfs verify on the store")  # fmt: skip
                target.put(item.name, data)
                return item, "replaced"
            if content_named or item.size > PUSH_MAX_COMPARED_BYTES:
                return item, "present"
            data = item.read()
            if target.read(item.name) == data:
                return item, "unchanged"
        else:
            data = item.read()
        target.put(item.name, data)
        return item, "sent"

    with concurrent.futures.ThreadPoolExecutor(max(1, jobs)) as pool:
        futures = [pool.submit(one, item) for item in items]
        try:
            for future in concurrent.futures.as_completed(futures):
                item, what = future.result()
                if what in ("sent", "replaced"):
                    report.sent += 1
                    report.replaced += what == "replaced"
                    report.sent_bytes += item.size
                    there[item.name] = item.size
                elif what == "present":
                    report.present += 1
                else:
                    report.unchanged += 1
                progress(item.size)
        except BaseException:
            for f in futures:
                f.cancel()
            raise


# -- the command ---------------------------------------------------------------------------------


def add_push_parser(sub: Any) -> None:
    from xetfs.commands.args import add_credentials_arg

    p = sub.add_parser(
        "push",
        help="copy a store to a bucket (s3://, gs://, az://) or a directory, for nodes to mount",
        description="Copy the store directory STORE to TARGET: a bucket prefix (s3://BUCKET/PREFIX, gs://, az://) "
        "or a directory (to be served over HTTP).  Only what the target lacks is sent, in an order that "
        "keeps the target a consistent store at every moment: xorbs, shards, the listing, then the names "
        "manifest and the Hub catalogue.  Nothing is deleted.  An interrupted push can be run again.  "
        "The listing push writes is what 'xetfs publish' writes in place: a directory pushed to is ready "
        "to be served.",
    )
    p.add_argument("store", help="store directory (as written by 'xetfs pack')")
    p.add_argument("target", help="s3://BUCKET/PREFIX, gs://BUCKET/PREFIX, az://CONTAINER/PREFIX, or a directory")
    p.add_argument("--jobs", type=int, default=PUSH_JOBS, metavar="N",
                   help=f"objects sent at once (default {PUSH_JOBS})")  # fmt: skip
    p.add_argument("--check", action="store_true",
                   help="compare the xorbs and shards TARGET already has with STORE's by content too (a bucket's "
                        "MD5 ETag, else the bytes read back), and send again those that differ: repairs a target "
                        "that 'xetfs verify' found damaged (reads the whole store)")  # fmt: skip
    add_credentials_arg(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bar even on a terminal")
    p.set_defaults(func=cmd_push)


def cmd_push(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    if is_url(args.store):
        raise StoreError(f"store {public_url(args.store)}: push copies a local store directory")
    top = Path(args.store)
    target = open_target(args.target)
    if isinstance(target, DirTarget) and _inside(target.top, top.resolve()):
        raise PushError(f"target {target.top}: inside the store {top} (or the store itself)")
    show = sys.stderr.isatty() and not args.no_progress
    with tqdm(total=0, unit="B", unit_scale=True, unit_divisor=1024, disable=not show, desc="push") as bar:

        def set_total(n: int) -> None:
            bar.total = n
            bar.refresh()

        report = push(top, target, jobs=args.jobs, check=args.check, progress=bar.update, total=set_total)
    print(report.summary(str(top), target.location), file=sys.stderr)
    return 0


def _inside(path: Path, top: Path) -> bool:
    path = path.resolve()
    return path == top or top in path.parents
