"""Long-running mutational fuzzer for the untrusted-input parsers of xetfs.

    .venv/bin/python scripts/fuzz.py --seconds 600 [--target shard|xorb|chunk|manifest|all]
                                     [--seed N] [--store DIR]... [--out DIR]

Targets and what may escape them (anything else is a failure):

* ``shard``    ``xetfs.format.shard.parse_shard``; an accepted shard is also
  indexed (``xetfs.storage.index``) and every term located.  Only ``FormatError``.
* ``xorb``     ``footer_length`` (never raises), then ``parse_footer`` or
  ``walk_headers`` (what ``Store.load_layout`` does, minus the file), then
  every chunk decoded and verified with ``format.xorb.decode_run``.  Only
  ``FormatError``, plus ``IntegrityError`` from the verification of a decoded
  chunk against its footer hash.
* ``chunk``    ``parse_chunk_header`` + ``decode_chunk`` on the chunk's own
  header, and ``decode_chunk`` with other schemes and sizes.  Only
  ``FormatError``; a decoded chunk has exactly the declared size.
* ``manifest`` ``xetfs.storage.manifest.parse_manifest``; an accepted manifest must
  hold only safe, conflict-free paths, survive a ``dump_manifest`` round trip
  and build a name tree (``xetfs.names.tree.build_tree``) whose every name is one
  plain component.  Only ``ManifestError``.

Seeds are valid objects built with the test writer (``tests/helpers/writer.py``)
and, when present, the objects of real hf_xet stores (the bundled
``sample/store`` and every ``--store``).  Each target first sweeps every
aligned 4- and 8-byte field of every seed with extreme values (counts and
offsets of 0, 1, 2^31, 2^32-1, 2^64-1, the input's length, ...), then mutates
at random: bit flips, interesting bytes, truncation, cut, insertion,
duplication, splices between seeds, and pure random bytes.  Accepted mutants
join the corpus.

Memory is bounded: the peak RSS (``getrusage``) may not grow more than
``--max-rss-growth`` MiB over the baseline taken after the seeds are built
(a header that claims 2^32 records must not allocate), the address space is
capped so a huge allocation fails fast with ``MemoryError`` (recorded as a
failure), and every input has a time limit (a hang is a failure).

Prints the inputs tried per target and the failures; exits 1 on any failure
and saves each distinct failing input (with its traceback) under ``--out``.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import random
import resource
import signal
import struct
import sys
import time
import traceback
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # helpers.writer
sys.path.insert(0, str(REPO))

from helpers import writer  # noqa: E402
from helpers.writer import FileSpec, TermSpec, XorbSpec  # noqa: E402

from xetfs.base import hashes  # noqa: E402
from xetfs.base.errors import FormatError, IntegrityError, ManifestError  # noqa: E402
from xetfs.format.chunk import HEADER_SIZE, MAX_UNCOMPRESSED, decode_chunk, parse_chunk_header  # noqa: E402
from xetfs.format.shard import parse_shard  # noqa: E402
from xetfs.format.xorb import XorbLayout, decode_run, footer_length, parse_footer, walk_headers  # noqa: E402
from xetfs.names.tree import build_tree  # noqa: E402
from xetfs.storage.index import FileEntry, Index, TermSlice, chunk_range  # noqa: E402
from xetfs.storage.manifest import Manifest, dump_manifest, parse_manifest, path_problem  # noqa: E402

MiB = 1024 * 1024
TARGETS = ("shard", "xorb", "chunk", "manifest")
DEFAULT_OUT = REPO / "fuzz-failures"
INPUT_TIME_LIMIT = 10.0  # seconds for one input; more is a hang
MAX_REAL_SEED = 4 * MiB  # real store objects bigger than this are not used as seeds
MAX_CORPUS = 300  # per target, seeds included
MAX_CORPUS_ENTRY = 16 * 1024  # bigger accepted mutants are not kept (the corpus must not look like a leak)
MAX_SAVED = 50  # distinct failing inputs written to --out

U32_VALUES = (0, 1, 2, 3, 7, 8, 47, 48, 49, 92, 0x7F, 0xFF, 0x100, 0xFFFF, 0x10000, 0x20000, 0x20001,
              0x7FFFFFFF, 0x80000000, 0xFFFFFFFE, 0xFFFFFFFF)  # fmt: skip
U64_VALUES = (0, 1, 2, 48, 200, 0xFFFFFFFF, 0x100000000, 2**63 - 1, 2**63, 2**64 - 1)
INTERESTING_BYTES = (0x00, 0x01, 0x02, 0x7F, 0x80, 0xFE, 0xFF, 0x58, 0x22, 0x2F, 0x5C, 0x2E)


class InputTimeout(Exception):
    """One input ran longer than ``INPUT_TIME_LIMIT``."""


class PropertyFailure(AssertionError):
    """An accepted input broke an invariant of the parser's result."""


# -- seeds ---------------------------------------------------------------------------


def _term(x: XorbSpec, a: int, b: int) -> TermSpec:
    return TermSpec(x.xorb_hash, a, b, sum(x.sizes[a:b]), hashes.verification_hash(x.chunk_hashes[a:b]))


def shard_seeds(rng: random.Random) -> list[bytes]:
    hs = tuple(hashes.chunk_hash(bytes([i])) for i in range(9))
    sizes = tuple(rng.randint(1, 70_000) for _ in hs)
    xa = XorbSpec(hashes.xorb_hash(zip(hs[:4], sizes[:4], strict=True)), hs[:4], sizes[:4])
    xb = XorbSpec(hashes.xorb_hash(zip(hs[4:6], sizes[4:6], strict=True)), hs[4:6], sizes[4:6])
    xc = XorbSpec(hashes.xorb_hash(zip(hs[6:], sizes[6:], strict=True)), hs[6:], sizes[6:])
    files = [
        FileSpec(hashes.chunk_hash(b"f1"), (_term(xa, 0, 4),), hashlib.sha256(b"1").digest()),
        FileSpec(
            hashes.chunk_hash(b"f2"), (_term(xb, 0, 2), _term(xa, 1, 2), _term(xc, 0, 3)), hashlib.sha256(b"2").digest()
        ),
        FileSpec(hashes.chunk_hash(b"f3"), (_term(xc, 2, 3), _term(xc, 0, 1))),
        FileSpec(hashes.ZERO_HASH, ()),
    ]
    out = []
    for footer in (True, False):
        for verification, sha in ((True, True), (False, False), (True, False), (False, True)):
            out.append(writer.build_shard(files, [xa, xb, xc], footer=footer, verification=verification, sha256=sha)[1])
    out.append(writer.build_shard([files[3]], [])[1])  # only an empty file (440 bytes)
    out.append(writer.build_shard([], [xa])[1])  # CAS records only (a re-upload shard)
    out.append(writer.build_shard(files[:1], [], footer=False)[1])  # terms into xorbs of no shard
    return out


def xorb_seeds(rng: random.Random) -> list[bytes]:
    text = b"some text, some text, some more text. " * 50
    walk = struct.pack("<400f", *(rng.gauss(0, 1) for _ in range(400)))
    chunks = [rng.randbytes(300), b"ab" * 200, bytes(100), text[:999], b"q", walk]
    out = [
        writer.pack_xorb(chunks, [0, 1, 2, 1, 0, 2]).data,
        writer.pack_xorb(chunks, [1, 0, 2, 2, 1, 0], footer=False).data,
        writer.pack_xorb([b"x"]).data,  # one chunk, raw
        writer.pack_xorb([b"y" * 5000], 1).data,
        writer.pack_xorb([rng.randbytes(64) for _ in range(40)], [0, 1, 2, 0] * 10).data,  # many small chunks
        writer.pack_xorb([rng.randbytes(MAX_UNCOMPRESSED), bytes(MAX_UNCOMPRESSED)], [0, 1]).data,  # largest
        writer.pack_xorb([bytes(70_000)], 2, footer=False).data,  # a 256 KiB-block frame
    ]
    return out


def chunk_seeds(rng: random.Random) -> list[bytes]:
    text = b"The quick brown fox jumps over the lazy dog. " * 3000
    walk = struct.pack("<20000f", *(rng.gauss(0, 1) for _ in range(20000)))
    contents = [
        b"a",
        b"ab" * 3,
        text[:100],
        text[:65_536],
        text[:65_537],
        text[:MAX_UNCOMPRESSED],
        rng.randbytes(1000),
        bytes(MAX_UNCOMPRESSED),
        walk[:4097],
        walk[:80_000],
    ]
    return [writer.encode_chunk(c, s) for c in contents for s in (0, 1, 2)]


def manifest_seeds(rng: random.Random) -> list[bytes]:
    def h(i: int) -> str:
        return hashes.to_hex(hashes.chunk_hash(b"m%d" % i))

    rows: list[dict[str, Any]] = [
        {"type": "directory", "path": "dir", "oid": "0" * 40, "size": 0},
        {
            "type": "file",
            "path": "dir/a.bin",
            "size": 123,
            "oid": "1" * 40,
            "xetHash": h(1),
            "lfs": {"oid": hashlib.sha256(b"a").hexdigest(), "size": 123, "pointerSize": 134},
        },
        {"type": "file", "path": "dir/sub/b.txt", "size": 5, "xetHash": h(2)},
        {"type": "file", "path": "c", "xetHash": h(3), "lfs": {"oid": hashlib.sha256(b"c").hexdigest()}},
        {"type": "file", "path": "README.md", "size": 10, "oid": "2" * 40},  # no xetHash: kept in git
        {"type": "file", "path": "name with spaces and üñíçødé", "xetHash": h(4)},
        {"type": "file", "path": "back\\slash\\..\\x", "xetHash": h(5)},
        {"type": "directory", "path": "empty/dir"},
    ]
    out = [json.dumps(rows).encode(), json.dumps(rows, indent=1, ensure_ascii=False).encode(), b"[]"]
    conflicts = [*rows[:3], dict(rows[1], xetHash=h(9)), {"path": "dir/a.bin/x", "xetHash": h(7)}]
    out.append(json.dumps(conflicts).encode())
    return out


def real_objects(stores: list[Path]) -> dict[str, list[bytes]]:
    """Shards, xorbs (and their chunks) and manifests of real stores, when they are small enough."""
    out: dict[str, list[bytes]] = {t: [] for t in TARGETS}
    for store in stores:
        for path in sorted(store.rglob("*")):
            if not path.is_file() or path.stat().st_size > MAX_REAL_SEED or "shard-cache" in path.parts:
                continue
            if path.suffix == ".mdb":
                out["shard"].append(path.read_bytes())
            elif path.name.startswith("default.") and not path.name.endswith(".tagset"):
                data = path.read_bytes()
                out["xorb"].append(data)
                out["chunk"].extend(_chunks_of(data))
            elif path.name == "xetfs-manifest.json":
                out["manifest"].append(path.read_bytes())
    return out


def _chunks_of(xorb: bytes, limit: int = 12) -> list[bytes]:
    """Up to ``limit`` whole chunks (header + payload) of a valid footered xorb."""
    length = footer_length(xorb[-4:], len(xorb))
    if length is None:
        return []
    layout = parse_footer(xorb[len(xorb) - length - 4 :], len(xorb), where="seed")
    step = max(1, layout.num_chunks // limit)
    return [xorb[layout.phys_start(i) : layout.phys_ends[i]] for i in range(0, layout.num_chunks, step)]


def default_stores() -> list[Path]:
    sample = REPO / "sample" / "store"
    return [sample] if sample.is_dir() else []


# -- mutations -----------------------------------------------------------------------


def field_sweep(data: bytes) -> Iterator[bytes]:
    """Every u32 and u64 field set to each extreme value.

    Fields are aligned from the start (shard records, chunk headers) and from
    the end (a xorb footer ends the file at any alignment).
    """
    n = len(data)
    for width, fmt, values in ((4, "<I", (*U32_VALUES, n, n // 2, n - 4, n + 1)),
                               (8, "<Q", (*U64_VALUES, n, n - 200, n + 48))):  # fmt: skip
        positions = sorted(set(range(0, n - width + 1, width)) | set(range(n - width, -1, -width)))
        for pos in positions:
            for v in values:
                yield data[:pos] + struct.pack(fmt, v % 2 ** (8 * width)) + data[pos + width :]


def mutate(rng: random.Random, data: bytes, corpus: list[bytes]) -> bytes:
    """``data`` with one to five random changes."""
    out = bytearray(data)
    for _ in range(rng.choice((1, 1, 1, 2, 2, 3, 5))):
        _one_mutation(rng, out, corpus)
    return bytes(out)


def _pos(rng: random.Random, out: bytearray) -> int:
    """A position, biased towards both ends (headers at the start, footers at the end)."""
    n = len(out)
    r = rng.random()
    if r < 0.3:
        return rng.randrange(min(n, 256))
    if r < 0.6:
        return max(0, n - 1 - rng.randrange(min(n, 512)))
    return rng.randrange(n)


def _one_mutation(rng: random.Random, out: bytearray, corpus: list[bytes]) -> None:
    n = len(out)
    kind = rng.randrange(11)
    if n == 0 or kind == 0:
        at = rng.randint(0, n)
        out[at:at] = rng.randbytes(rng.choice((1, 2, 4, 8, 48, rng.randint(1, 300))))
    elif kind == 1:  # bit flip
        at = _pos(rng, out)
        out[at] ^= 1 << rng.randrange(8)
    elif kind == 2:  # interesting byte
        out[_pos(rng, out)] = rng.choice(INTERESTING_BYTES)
    elif kind == 3:  # extreme u32
        at = _pos(rng, out) & ~3
        out[at : at + 4] = struct.pack("<I", rng.choice((*U32_VALUES, n, n // 48)))[: n - at]
    elif kind == 4:  # extreme u64
        at = _pos(rng, out) & ~7
        out[at : at + 8] = struct.pack("<Q", rng.choice((*U64_VALUES, n)))[: n - at]
    elif kind == 5:  # truncate
        del out[rng.randint(0, n) :]
    elif kind == 6:  # cut a slice (a record, or anything)
        at = _pos(rng, out)
        del out[at : at + rng.choice((1, 4, 8, 48, rng.randint(1, 200)))]
    elif kind == 7:  # duplicate a slice in place
        at = _pos(rng, out)
        piece = out[at : at + rng.choice((4, 8, 48, 96, rng.randint(1, 200)))]
        out[at:at] = piece
    elif kind == 8:  # splice a piece of another input
        other = rng.choice(corpus)
        if other:
            a = rng.randrange(len(other))
            splice = other[a : a + rng.randint(1, 400)]
            at = _pos(rng, out)
            out[at : at + len(splice)] = splice
    elif kind == 9:  # random run of bytes
        at = _pos(rng, out)
        k = rng.randint(1, 64)
        out[at : at + k] = rng.randbytes(k)
    else:  # add or remove one trailing byte (lengths, "ends exactly at EOF" rules)
        if rng.random() < 0.5:
            out.append(rng.randrange(256))
        else:
            del out[-1:]


# -- manifest-specific generation ----------------------------------------------------

NASTY_PATHS = ("..", "../x", "a/../../x", "a/./b", "/etc/passwd", "/", "", "a//b", "a/", ".", "a\0b", "\0",
               "a\\..\\..\\b", "..\\x", "\ud800", "x" * 256, "d/" * 2100 + "f", ".xetfs/stats", ".xetfs",
               "dir/a.bin", "dir", "dir/a.bin/x", "ü" * 128, "tab\tname", "new\nline", "ok")  # fmt: skip
NASTY_VALUES: tuple[Any, ...] = (None, True, 0, -1, 1.5, 10**30, "", "x", [], {}, "0" * 64, "G" * 64,
                                  "A" * 64, {"oid": 5}, {"oid": "f" * 64})  # fmt: skip


def manifest_mutate(rng: random.Random, data: bytes, corpus: list[bytes]) -> bytes:
    """Structural changes to a JSON listing (nasty paths, wrong types, conflicts), else byte mutations."""
    r = rng.random()
    if r < 0.05:
        depth = rng.choice((100, 1000, 100_000))
        return b"[" * depth + b"]" * (depth if rng.random() < 0.5 else 0)
    if r < 0.08:
        return b"[" + b"9" * rng.choice((4300, 5000, 100_000)) + b"]"
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        doc = None
    if r > 0.55 or not isinstance(doc, list) or not doc:
        return mutate(rng, data, corpus)
    for _ in range(rng.randint(1, 4)):
        i = rng.randrange(len(doc))
        item = doc[i]
        choice = rng.randrange(6)
        if choice == 0 and isinstance(item, dict):
            item["path"] = rng.choice(NASTY_PATHS)
        elif choice == 1 and isinstance(item, dict):
            item[rng.choice(("path", "type", "xetHash", "size", "lfs", "oid"))] = rng.choice(NASTY_VALUES)
        elif choice == 2:  # a conflicting duplicate
            clone = dict(item) if isinstance(item, dict) else item
            if isinstance(clone, dict):
                clone["xetHash"] = hashes.to_hex(hashes.chunk_hash(rng.randbytes(8)))
                if rng.random() < 0.5:
                    clone["path"] = str(clone.get("path")) + "/child"
            doc.insert(rng.randint(0, len(doc)), clone)
        elif choice == 3:
            doc[i] = rng.choice(NASTY_VALUES)
        elif choice == 4 and isinstance(item, dict):
            item["type"] = rng.choice(("file", "directory", "symlink", None))
        else:
            doc.insert(
                rng.randint(0, len(doc)),
                {"path": rng.choice(NASTY_PATHS), "xetHash": hashes.to_hex(hashes.chunk_hash(b"%d" % i))},
            )
    try:
        return json.dumps(doc, ensure_ascii=rng.random() < 0.5).encode("utf-8", "surrogatepass")
    except (ValueError, RecursionError):
        return data


# -- checks (one per target) ---------------------------------------------------------


def check_shard(data: bytes) -> bool:
    """True when the shard was accepted (and then used without trouble)."""
    try:
        shard = parse_shard(data, where="shard fuzz.mdb")
    except FormatError:
        return False
    for f in shard.files:
        terms = list(f.terms)
        _require(len(terms) == len(f.terms), "term count")
        _require(all(t.start < t.end for t in terms), "empty chunk range accepted")
        _require(f.size >= 0, "negative size")
        _require(len(f.verification) in (0, len(terms)), "verification records")
        for i in range(len(terms)):
            _require(f.terms[i] == terms[i], "term table")
    for x in shard.xorbs:
        _require(len(list(x.chunks)) == len(x.chunks), "chunk count")
    index = Index()
    index.add_shard(shard)
    for entry in index:
        for offset in {0, entry.size // 3, max(0, entry.size - 1)}:
            pieces = index.locate(entry, offset, 70_000)
            _require(sum(p.length for p in pieces) == min(70_000, max(0, entry.size - offset)), "locate")
    return True


def load_xorb(data: bytes) -> XorbLayout:
    """What ``Store.load_layout`` does with a file's bytes (minus hashing): footer if present, else a walk."""
    size = len(data)
    length = footer_length(data[-4:], size) if size >= 4 else None
    if length is not None:
        _require(92 <= length <= size - 4 and (length - 92) % 40 == 0, f"footer_length {length} for {size} bytes")
        footer = data[size - length - 4 :]
        if footer.startswith(b"XETBLOB"):
            return parse_footer(footer, size, where="xorb fuzz")
    return walk_headers(data, where="xorb fuzz")


def check_xorb(data: bytes) -> bool:
    try:
        layout = load_xorb(data)
    except FormatError:
        return False
    n = layout.num_chunks
    _require(n >= 1 and len(layout.unpacked_ends) == n, "chunk count")
    _require(all(b > a for a, b in zip((0, *layout.phys_ends), layout.phys_ends, strict=False)), "phys ends")
    _require(all(b > a for a, b in zip((0, *layout.unpacked_ends), layout.unpacked_ends, strict=False)), "ends")
    _require(layout.phys_ends[-1] <= len(data), "chunk section beyond the file")
    _require(layout.chunk_hashes is None or len(layout.chunk_hashes) == n, "hash count")
    # Decode like the reader: runs of adjacent chunks, each checked against header and hash.
    for start in range(0, n, 7):
        stop = min(n, start + 7)
        try:
            run = data[layout.phys_start(start) : layout.phys_ends[stop - 1]]
            chunks = decode_run(run, bytes(32), layout, start, stop, verify=True)
        except (FormatError, IntegrityError):
            continue
        for i, c in zip(range(start, stop), chunks, strict=True):
            if isinstance(c, (FormatError, IntegrityError)):
                continue  # a bad chunk is reported as its error; its neighbours still decode
            if not isinstance(c, bytes):
                raise PropertyFailure(f"chunk {i} decodes to {type(c).__name__}")
            _require(len(c) == layout.chunk_size(i), f"chunk {i} decodes to {len(c)} bytes")
            if layout.chunk_hashes is not None:
                _require(hashes.chunk_hash(c) == layout.chunk_hashes[i], "unverified bytes returned")
    # Map term-like ranges onto the layout, as the reader does (index.chunk_range).
    for a, b in ((0, n), (n // 2, n), (0, 1)):
        if a < b:
            size = layout.range_size(a, b)
            first, stop = chunk_range(TermSlice(0, bytes(32), a, b, size, size // 2, size - size // 2), layout)
            _require(a <= first < stop <= b, f"chunk range [{first}, {stop}) for [{a}, {b})")
    return True


def check_chunk(data: bytes, rng: random.Random) -> bool:
    accepted = False
    try:
        header = parse_chunk_header(data, 0, where="chunk fuzz")
        payload = data[HEADER_SIZE : HEADER_SIZE + header.compressed_length]
        out = decode_chunk(header.scheme, payload, header.uncompressed_length, where="chunk fuzz")
        _require(len(out) == header.uncompressed_length, f"decoded {len(out)} != {header.uncompressed_length}")
        accepted = True
    except FormatError:
        pass
    # The decoder alone, with a scheme and size that the header may not agree with.
    scheme = rng.choice((0, 1, 2, 2, 1, 3, 99))
    size = rng.choice((0, 1, len(data), max(0, len(data) - 8), 65_536, MAX_UNCOMPRESSED, rng.randint(0, 70_000)))
    try:
        out = decode_chunk(scheme, data[HEADER_SIZE:], min(size, MAX_UNCOMPRESSED), where="chunk fuzz")
        _require(len(out) == min(size, MAX_UNCOMPRESSED), "decoded size")
    except FormatError:
        pass
    return accepted


def check_manifest(data: bytes) -> bool:
    try:
        manifest = parse_manifest(data, source="fuzz.json")
    except ManifestError:
        return False
    _check_names(manifest)
    again = parse_manifest(dump_manifest(manifest.files, manifest.directories), source="round-trip")
    _require(
        sorted((f.path, f.xet_hash) for f in again.files) == sorted((f.path, f.xet_hash) for f in manifest.files),
        "dump_manifest round trip changed the files",
    )
    # Build the name tree (as a mount does) over an index that holds every named file.
    index = Index()
    for f in manifest.files:
        index.files.setdefault(
            f.xet_hash, FileEntry(f.xet_hash, 0, None, array("I"), array("I"), array("I"), array("Q"))
        )
    tree, _warnings = build_tree(index, manifest)
    seen = 0
    limit = 3 * (sum(map(len, (f.path for f in manifest.files))) + sum(map(len, manifest.directories))) + 100
    stack = [1]
    while stack:
        inode = stack.pop()
        for name, node in tree.children(inode):
            seen += 1
            _require(name not in (b"", b".", b"..") and b"/" not in name and b"\0" not in name, f"name {name!r}")
            if tree.is_dir(node.inode) and node.inode != inode:
                stack.append(node.inode)
        _require(seen <= limit, "tree walk does not end")
    return True


def _check_names(manifest: Manifest) -> None:
    files = {f.path for f in manifest.files}
    _require(len(files) == len(manifest.files), "duplicate file paths accepted")
    for f in manifest.files:
        _require(path_problem(f.name) is None, f"unsafe path accepted: {f.name!r}")
        _require(all("/" not in p and p not in ("", ".", "..") for p in f.path), f"bad component in {f.path!r}")
        for k in range(1, len(f.path)):
            _require(f.path[:k] not in files, f"{f.name!r} is below a file")
    for d in manifest.directories:
        _require(path_problem("/".join(d)) is None and d not in files, f"bad directory {d!r}")


def _require(ok: bool, what: str) -> None:
    if not ok:
        raise PropertyFailure(what)


# -- the loop --------------------------------------------------------------------------


@dataclass
class TargetStats:
    tried: int = 0
    accepted: int = 0
    failures: int = 0
    sweep: int = 0  # of ``tried``: inputs from the systematic field sweep


@dataclass
class Report:
    seconds: float
    seed: int
    targets: dict[str, TargetStats]
    rss_baseline_kib: int
    rss_peak_kib: int
    failures: list[str] = field(default_factory=list)  # one line per distinct failure
    saved: list[Path] = field(default_factory=list)

    @property
    def total_failures(self) -> int:
        return sum(t.failures for t in self.targets.values())

    def lines(self) -> list[str]:
        out = [f"fuzz: {self.seconds:.1f} s, seed {self.seed}"]
        for name, t in self.targets.items():
            out.append(
                f"  {name:<9} {t.tried:>9} inputs ({t.sweep} field sweep, {t.accepted} accepted), {t.failures} failures"
            )
        total = sum(t.tried for t in self.targets.values())
        growth = (self.rss_peak_kib - self.rss_baseline_kib) / 1024
        out.append(
            f"  total     {total:>9} inputs, {self.total_failures} failures; "
            f"peak RSS {self.rss_peak_kib / 1024:.0f} MiB ({growth:+.1f} MiB over the baseline)"
        )
        out += [f"  FAILURE {line}" for line in self.failures]
        out += [f"  saved {p}" for p in self.saved]
        return out


class Fuzzer:
    def __init__(self, *, seed: int, stores: list[Path], out_dir: Path | None, max_rss_growth_mib: float) -> None:
        self.rng = random.Random(seed)
        self.seed = seed
        self.out_dir = out_dir
        self.max_rss_growth_kib = int(max_rss_growth_mib * 1024)
        real = real_objects(stores)
        makers: dict[str, Callable[[random.Random], list[bytes]]] = {
            "shard": shard_seeds,
            "xorb": xorb_seeds,
            "chunk": chunk_seeds,
            "manifest": manifest_seeds,
        }
        self.seeds = {t: makers[t](random.Random(seed + i)) + real[t] for i, t in enumerate(TARGETS)}
        self.corpus = {t: list(s) for t, s in self.seeds.items()}
        self.stats = {t: TargetStats() for t in TARGETS}
        self.failure_keys: dict[str, int] = {}
        self.saved: list[Path] = []
        self.baseline_kib = 0

    def _check(self, target: str, data: bytes) -> bool:
        if target == "shard":
            return check_shard(data)
        if target == "xorb":
            return check_xorb(data)
        if target == "chunk":
            return check_chunk(data, self.rng)
        return check_manifest(data)

    def _sweeps(self, target: str) -> Iterator[bytes]:
        for s in self.seeds[target]:
            if len(s) <= 20_000:  # the big seeds are covered by the random phase
                yield from field_sweep(s)

    def _next_random(self, target: str) -> bytes:
        rng = self.rng
        corpus = self.corpus[target]
        if rng.random() < 0.03:
            return rng.randbytes(rng.choice((0, 1, 7, 8, 48, 143, 144, 200, 440, rng.randint(0, 3000))))
        base = rng.choice(corpus)
        if target == "manifest":
            return manifest_mutate(rng, base, corpus)
        return mutate(rng, base, corpus)

    def run_one(self, target: str, data: bytes) -> None:
        stats = self.stats[target]
        stats.tried += 1
        signal.setitimer(signal.ITIMER_REAL, INPUT_TIME_LIMIT)
        try:
            accepted = self._check(target, data)
        except InputTimeout:
            self._fail(target, data, f"took more than {INPUT_TIME_LIMIT:g} s", "hang")
            return
        except RecursionError as exc:
            self._fail(target, data, _trace(exc), f"RecursionError at {_where(exc)}")
            return
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt | SystemExit):
                raise
            self._fail(target, data, _trace(exc), f"{type(exc).__name__} at {_where(exc)}: {_short(exc)}")
            return
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        if accepted:
            stats.accepted += 1
            corpus = self.corpus[target]
            if len(data) > MAX_CORPUS_ENTRY:
                pass
            elif len(corpus) < MAX_CORPUS:
                corpus.append(data)
            else:
                corpus[len(self.seeds[target]) + self.rng.randrange(MAX_CORPUS - len(self.seeds[target]))] = data
        peak = _maxrss_kib()
        if peak - self.baseline_kib > self.max_rss_growth_kib:
            self._fail(target, data, f"peak RSS grew to {peak // 1024} MiB", "memory")
            self.baseline_kib = peak  # report each new high once

    def _fail(self, target: str, data: bytes, detail: str, key: str) -> None:
        self.stats[target].failures += 1
        full_key = f"{target}: {key}"
        n = self.failure_keys.get(full_key, 0)
        self.failure_keys[full_key] = n + 1
        if n or self.out_dir is None or len(self.saved) >= MAX_SAVED:
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        name = f"{target}-{hashlib.sha1(data).hexdigest()[:12]}"
        (self.out_dir / f"{name}.bin").write_bytes(data)
        (self.out_dir / f"{name}.txt").write_text(f"{full_key}\n\n{detail}\n")
        self.saved.append(self.out_dir / f"{name}.bin")

    def run(self, seconds: float, targets: list[str]) -> Report:
        start = time.monotonic()
        deadline = start + seconds
        sweeps: dict[str, Iterator[bytes] | None] = {t: self._sweeps(t) for t in targets}
        with _limits():
            self.baseline_kib = start_kib = _maxrss_kib()
            while time.monotonic() < deadline:
                for target in targets:
                    for i in range(20):  # a batch per target, then the clock is checked again
                        sweep = sweeps[target] if i % 2 else None  # half sweep, half random until swept
                        data = None if sweep is None else next(sweep, None)
                        if data is None:
                            if sweep is not None:
                                sweeps[target] = None
                            data = self._next_random(target)
                        else:
                            self.stats[target].sweep += 1
                        self.run_one(target, data)
                    if time.monotonic() >= deadline:
                        break
        failures = [f"{key} ({n}x)" for key, n in self.failure_keys.items()]
        return Report(
            time.monotonic() - start,
            self.seed,
            {t: self.stats[t] for t in targets},
            start_kib,
            _maxrss_kib(),
            failures,
            self.saved,
        )


def _maxrss_kib() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _vmsize() -> int:
    with open("/proc/self/statm", encoding="ascii") as f:
        return int(f.read().split()[0]) * resource.getpagesize()


@contextlib.contextmanager
def _limits() -> Iterator[None]:
    """A time limit per input (SIGALRM) and an address-space cap of the current size + 2 GiB."""

    def alarm(signum: int, frame: Any) -> None:
        raise InputTimeout

    old_handler = signal.signal(signal.SIGALRM, alarm)
    old_as = resource.getrlimit(resource.RLIMIT_AS)
    cap = _vmsize() + 2048 * MiB
    if old_as[0] == resource.RLIM_INFINITY or old_as[0] > cap:
        resource.setrlimit(resource.RLIMIT_AS, (cap, old_as[1]))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old_handler)
        resource.setrlimit(resource.RLIMIT_AS, old_as)


def _where(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    mine = [f for f in frames if "/xetfs/" in f.filename] or frames
    f = mine[-1]
    return f"{Path(f.filename).name}:{f.lineno} ({f.name})"


def _trace(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc))[-6000:]


def _short(exc: BaseException) -> str:
    text = str(exc)
    return text if len(text) <= 100 else text[:97] + "..."


def fuzz(
    seconds: float,
    targets: list[str] | None = None,
    *,
    seed: int | None = None,
    stores: list[Path] | None = None,
    out_dir: Path | None = None,
    max_rss_growth_mib: float = 200.0,
) -> Report:
    """Run the fuzz loop for ``seconds`` over ``targets`` (default all) and return the report."""
    seed = int.from_bytes(os.urandom(4), "little") if seed is None else seed
    fuzzer = Fuzzer(
        seed=seed,
        stores=default_stores() if stores is None else stores,
        out_dir=out_dir,
        max_rss_growth_mib=max_rss_growth_mib,
    )
    return fuzzer.run(seconds, list(targets or TARGETS))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=60.0, help="how long to run (default 60)")
    p.add_argument("--target", choices=[*TARGETS, "all"], default="all")
    p.add_argument("--seed", type=int, help="random seed (default: random, printed)")
    p.add_argument(
        "--store",
        type=Path,
        action="append",
        default=[],
        help="also seed from this store's objects (repeatable; sample/store is always used)",
    )
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"where failing inputs go (default {DEFAULT_OUT})")
    p.add_argument(
        "--max-rss-growth",
        type=float,
        default=200.0,
        metavar="MIB",
        help="fail when the peak RSS grows more than this over the baseline (default 200)",
    )
    args = p.parse_args(argv)
    targets = list(TARGETS) if args.target == "all" else [args.target]
    report = fuzz(
        args.seconds,
        targets,
        seed=args.seed,
        stores=default_stores() + args.store,
        out_dir=args.out,
        max_rss_growth_mib=args.max_rss_growth,
    )
    print("\n".join(report.lines()))
    return 1 if report.total_failures else 0


if __name__ == "__main__":
    sys.exit(main())
