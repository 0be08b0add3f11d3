"""A small test-only Xet writer (docs/format.md section 7).

Builds chunks, xorbs, shards and whole store directories that xetfs must be
able to read.  It is deliberately independent of ``xetfs.format``: binary
layouts are re-declared here from docs/format.md, so a layout mistake in the
reader is not silently mirrored by the writer.  Hashes come from
``xetfs.base.hashes`` (those are checked separately against xet-core's vectors).

Three levels:

* ``encode_chunk`` / ``build_xorb`` / ``build_shard``: pure functions, bytes out.
* ``StoreBuilder``: writes a store directory (hf_xet ``local://`` layout or the
  flat one), packing the chunks of many files into shared xorbs, so it is fast
  enough for synthetic benchmark stores (thousands of files, a million terms).

Tests import it as ``from helpers.writer import ...`` (pytest puts ``tests/``
on ``sys.path``); scripts can add ``tests/`` to ``sys.path`` first.  Build
time for big synthetic stores is dominated by ``xetfs.base.hashes.merkle_root``
(about 10 s per million chunks).  Not thread-safe; not for production use.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import os
import random
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import lz4.frame

from xetfs.base import hashes

# -- chunks (docs/format.md 2.2, 2.3) ------------------------------------------------

SCHEME_NONE = 0
SCHEME_LZ4 = 1
SCHEME_BG4_LZ4 = 2
MAX_CHUNK = 128 * 1024

CHUNK_HEADER = struct.Struct("<I I")  # version | clen << 8, scheme | ulen << 8


def bg4_split(data: bytes) -> bytes:
    """Byte-group ``data``: every 4th byte from offset k, for k = 0..3, concatenated."""
    return b"".join(data[k::4] for k in range(4))


def lz4_frame(data: bytes) -> bytes:
    """An LZ4 frame with the header xet-core writes (FLG 0x60, BD 0x40 or 0x50)."""
    block_size = lz4.frame.BLOCKSIZE_MAX64KB if len(data) <= 65536 else lz4.frame.BLOCKSIZE_MAX256KB
    frame: bytes = lz4.frame.compress(
        data, block_size=block_size, block_linked=False, content_checksum=False, store_size=False
    )
    return frame


def chunk_header(compressed_length: int, scheme: int, uncompressed_length: int, version: int = 0) -> bytes:
    """The 8-byte chunk header; values are not validated (tests write bad ones on purpose)."""
    return CHUNK_HEADER.pack(version | compressed_length << 8, scheme | uncompressed_length << 8)


def encode_payload(data: bytes, scheme: int) -> bytes:
    """The stored payload of ``data`` under ``scheme`` (0 raw, 1 LZ4 frame, 2 BG4 + LZ4 frame)."""
    if scheme == SCHEME_NONE:
        return bytes(data)
    if scheme == SCHEME_LZ4:
        return lz4_frame(data)
    if scheme == SCHEME_BG4_LZ4:
        return lz4_frame(bg4_split(data))
    raise ValueError(f"unknown scheme {scheme}")


def encode_chunk(data: bytes, scheme: int, *, fallback: bool = False) -> bytes:
    """One chunk: 8-byte header + payload.

    With ``fallback=True`` the chunk is stored raw (scheme 0) when the
    compressed payload is not strictly smaller, as xet-core does; by default
    the requested scheme is kept so tests control exactly what is on disk.
    """
    if not 0 < len(data) <= MAX_CHUNK:
        raise ValueError(f"chunk of {len(data)} bytes (allowed 1..{MAX_CHUNK})")
    payload = encode_payload(data, scheme)
    if fallback and scheme != SCHEME_NONE and len(payload) >= len(data):
        scheme, payload = SCHEME_NONE, bytes(data)
    return chunk_header(len(payload), scheme, len(data)) + payload


# -- xorbs (docs/format.md 2.4) ------------------------------------------------------


@dataclass(frozen=True)
class BuiltXorb:
    """A xorb's bytes and what a test needs to know about its layout."""

    xorb_hash: bytes
    data: bytes
    chunk_hashes: tuple[bytes, ...]
    sizes: tuple[int, ...]  # uncompressed chunk sizes
    phys_ends: tuple[int, ...]  # exclusive physical end of each chunk (header included)
    schemes: tuple[int, ...]  # scheme actually stored for each chunk
    has_footer: bool

    def phys_start(self, i: int) -> int:
        return self.phys_ends[i - 1] if i else 0

    def payload_range(self, i: int) -> tuple[int, int]:
        """Byte range ``[start, end)`` of chunk ``i``'s payload in the xorb file."""
        return self.phys_start(i) + CHUNK_HEADER.size, self.phys_ends[i]


def xorb_footer(
    xorb_hash: bytes, chunk_hashes: Sequence[bytes], phys_ends: Sequence[int], sizes: Sequence[int]
) -> bytes:
    """The V1 footer plus the trailing u32 info_length (docs/format.md 2.4)."""
    n = len(chunk_hashes)
    unpacked_ends = list(itertools.accumulate(sizes))
    parts = [
        b"XETBLOB", bytes([1]), xorb_hash,
        b"XBLBHSH", bytes([0]), struct.pack("<I", n), *chunk_hashes,
        b"XBLBBND", bytes([1]), struct.pack("<I", n),
        struct.pack(f"<{n}I", *phys_ends), struct.pack(f"<{n}I", *unpacked_ends),
        struct.pack("<III", n, 52 + 40 * n, 40 + 8 * n), bytes(16),
    ]  # fmt: skip
    body = b"".join(parts)
    assert len(body) == 92 + 40 * n
    return body + struct.pack("<I", len(body))


def assemble_xorb(
    chunks: Sequence[bytes],
    encoded: Sequence[bytes],
    *,
    footer: bool = True,
    chunk_hashes: Sequence[bytes] | None = None,
) -> BuiltXorb:
    """A xorb from uncompressed ``chunks`` and their ``encoded`` forms (header + payload).

    ``chunk_hashes`` may be passed when the caller already computed them.
    """
    if not chunks or len(chunks) != len(encoded):
        raise ValueError(f"{len(chunks)} chunks, {len(encoded)} encoded chunks")
    if chunk_hashes is None:
        chunk_hashes = tuple(hashes.chunk_hash(c) for c in chunks)
    chunk_hashes = tuple(chunk_hashes)
    sizes = tuple(len(c) for c in chunks)
    phys_ends = tuple(itertools.accumulate(len(e) for e in encoded))
    xorb_hash = hashes.xorb_hash(zip(chunk_hashes, sizes, strict=True))
    data = b"".join(encoded)
    if footer:
        data += xorb_footer(xorb_hash, chunk_hashes, phys_ends, sizes)
    schemes = tuple(e[4] for e in encoded)
    return BuiltXorb(xorb_hash, data, chunk_hashes, sizes, phys_ends, schemes, footer)


def pack_xorb(
    chunks: Sequence[bytes], schemes: Sequence[int] | int = SCHEME_NONE, *, footer: bool = True, fallback: bool = False
) -> BuiltXorb:
    """Encode ``chunks`` (uncompressed) into one xorb; ``schemes`` per chunk or one for all."""
    scheme_list = [schemes] * len(chunks) if isinstance(schemes, int) else list(schemes)
    if len(scheme_list) != len(chunks):
        raise ValueError(f"{len(chunks)} chunks but {len(scheme_list)} schemes")
    encoded = [encode_chunk(c, s, fallback=fallback) for c, s in zip(chunks, scheme_list, strict=True)]
    return assemble_xorb(chunks, encoded, footer=footer)


def build_xorb(
    chunks: Sequence[bytes], schemes: Sequence[int] | int = SCHEME_NONE, footer: bool = True
) -> tuple[bytes, bytes, list[bytes]]:
    """``(xorb_hash, xorb file bytes, chunk hashes)`` for ``chunks``; see ``pack_xorb``."""
    built = pack_xorb(chunks, schemes, footer=footer)
    return built.xorb_hash, built.data, list(built.chunk_hashes)


# -- shards (docs/format.md 3) -------------------------------------------------------

SHARD_MAGIC = bytes(
    [72, 70, 82, 101, 112, 111, 77, 101, 116, 97, 68, 97, 116, 97, 0, 85,
     105, 103, 69, 106, 123, 129, 87, 131, 165, 189, 217, 92, 205, 209, 74, 169]
)  # fmt: skip
SHARD_HEADER = struct.Struct("<32sQQ")
FILE_HEADER = struct.Struct("<32sIIQ")  # file hash, flags, num terms, unused
TERM = struct.Struct("<32sIIII")  # xorb hash, flags, size, chunk start, chunk end
CAS_HEADER = struct.Struct("<32sIIII")  # xorb hash, flags, num chunks, bytes in xorb, bytes on disk
CAS_CHUNK = struct.Struct("<32sIIII")  # chunk hash, uncompressed start, size, flags, unused
SHARD_FOOTER = struct.Struct("<9Q32sQQ48sQQQQ")
BOOKEND = b"\xff" * 32 + bytes(16)
FLAG_VERIFICATION = 0x80000000
FLAG_METADATA_EXT = 0x40000000
CHUNK_FILE_START = 0x80000000  # CAS chunk flag: "global dedup eligible", set where a file begins


@dataclass(frozen=True)
class TermSpec:
    """Chunks ``[start, end)`` of ``xorb_hash``: ``size`` uncompressed bytes."""

    xorb_hash: bytes
    start: int
    end: int
    size: int
    verification: bytes = hashes.ZERO_HASH  # range hash (docs/format.md 1.6)


@dataclass(frozen=True)
class FileSpec:
    """A file record.  ``sha256`` is the ordinary digest (the writer group-reverses it)."""

    file_hash: bytes
    terms: tuple[TermSpec, ...]
    sha256: bytes = hashes.ZERO_HASH

    @property
    def size(self) -> int:
        return sum(t.size for t in self.terms)


@dataclass(frozen=True)
class XorbSpec:
    """A CAS record: the chunk hashes and uncompressed sizes of one xorb."""

    xorb_hash: bytes
    chunk_hashes: tuple[bytes, ...]
    sizes: tuple[int, ...]
    bytes_on_disk: int = 0  # hf_xet writes 0
    chunk_flags: tuple[int, ...] = ()  # per chunk; hf_xet sets bit 31 on chunks that begin a file

    @property
    def num_bytes(self) -> int:
        return sum(self.sizes)


def _sort_key(h: bytes) -> str:
    return hashes.to_hex(h)  # hex order == xet-core's order (docs/format.md 1.1)


def shard_file_records(files: Iterable[FileSpec], *, verification: bool = True, sha256: bool = True) -> bytes:
    """The file info section without its bookend, records sorted by file hash."""
    out = bytearray()
    flags = (FLAG_VERIFICATION if verification else 0) | (FLAG_METADATA_EXT if sha256 else 0)
    for f in sorted(files, key=lambda f: _sort_key(f.file_hash)):
        out += FILE_HEADER.pack(f.file_hash, flags, len(f.terms), 0)
        for t in f.terms:
            out += TERM.pack(t.xorb_hash, 0, t.size, t.start, t.end)
        if verification:
            for t in f.terms:
                out += t.verification + bytes(16)
        if sha256:
            out += hashes.from_hex(f.sha256.hex()) + bytes(16)  # stored group-reversed (3.3)
    return bytes(out)


def shard_cas_records(xorbs: Iterable[XorbSpec]) -> bytes:
    """The CAS info section without its bookend, records sorted by xorb hash."""
    out = bytearray()
    for x in sorted(xorbs, key=lambda x: _sort_key(x.xorb_hash)):
        out += CAS_HEADER.pack(x.xorb_hash, 0, len(x.chunk_hashes), x.num_bytes, x.bytes_on_disk)
        start = 0
        flags = x.chunk_flags or (0,) * len(x.sizes)
        for h, size, flag in zip(x.chunk_hashes, x.sizes, flags, strict=True):
            out += CAS_CHUNK.pack(h, start, size, flag, 0)
            start += size
    return bytes(out)


def build_shard(
    files: Sequence[FileSpec],
    xorbs: Sequence[XorbSpec],
    footer: bool = True,
    verification: bool = True,
    sha256: bool = True,
) -> tuple[bytes, bytes]:
    """``(shard hash, shard bytes)``: header, file section, CAS section, 200-byte footer.

    No lookup tables: the footer's three lookup offsets equal the footer
    offset and their counts are 0, timestamps are 0 (as in hf_xet store
    shards).  The shard hash names the file: ``<to_hex(hash)>.mdb`` (1.7).
    """
    data = bytearray(SHARD_HEADER.pack(SHARD_MAGIC, 2, 200 if footer else 0))
    data += shard_file_records(files, verification=verification, sha256=sha256)
    data += BOOKEND
    cas_info_offset = len(data)
    data += shard_cas_records(xorbs)
    data += BOOKEND
    if footer:
        end = len(data)
        data += SHARD_FOOTER.pack(
            1, 48, cas_info_offset,
            end, 0, end, 0, end, 0,  # lookup tables: offsets, counts
            bytes(32), 0, 0, bytes(48), 0,  # hmac key, created, expiry, reserved, bytes on disk
            sum(f.size for f in files), sum(x.num_bytes for x in xorbs), end,
        )  # fmt: skip
    out = bytes(data)
    return hashes.chunk_hash(out), out


# -- stores (docs/format.md 4) -------------------------------------------------------

Layout = Literal["hf_xet", "flat"]


@dataclass
class _PendingXorb:
    chunks: list[bytes] = field(default_factory=list)
    hashes: list[bytes] = field(default_factory=list)
    encoded: list[bytes] = field(default_factory=list)
    nbytes: int = 0
    file_starts: set[int] = field(default_factory=set)  # chunks that begin a file


@dataclass
class _PendingTerm:
    """A term whose xorb may not be sealed yet: ``xorb`` is a builder-local xorb id."""

    xorb: int
    start: int
    end: int
    size: int


@dataclass
class _PendingFile:
    file_hash: bytes
    terms: list[_PendingTerm]
    sha256: bytes


def split_fixed(content: bytes, chunk_size: int) -> list[bytes]:
    """Cut ``content`` into ``chunk_size`` pieces (the last may be shorter)."""
    if not 0 < chunk_size <= MAX_CHUNK:
        raise ValueError(f"chunk_size {chunk_size} (allowed 1..{MAX_CHUNK})")
    return [content[i : i + chunk_size] for i in range(0, len(content), chunk_size)]


def split_at(content: bytes, boundaries: Sequence[int]) -> list[bytes]:
    """Cut ``content`` at the given offsets (ascending; 0 and len(content) are implied)."""
    cuts = [0, *boundaries, len(content)]
    return [content[a:b] for a, b in itertools.pairwise(cuts) if b > a]


class StoreBuilder:
    """Writes a Xet store directory in the hf_xet or the flat layout.

    Files added with ``add_file`` are chunked and their chunks appended to the
    *pending* xorb, shared by all files until it is sealed (when full, on
    ``seal_xorb`` or on ``flush_shard``).  A file that does not fit continues
    in the next xorb, so its terms cross xorbs.  ``flush_shard`` writes a shard
    with the files added since the previous one and the CAS records of the
    xorbs sealed since then; ``cas=False`` leaves those CAS records for the next
    shard (terms then point at xorbs described in another shard, or in none).

    Layouts: ``"hf_xet"`` writes ``root/xet/xorbs/{xorbs/default.<hex>, shards/<hex>.mdb}``;
    ``"flat"`` writes ``root/{xorbs/<hex><xorb_suffix>, shards/<hex>.mdb}``.

    ``finish()`` seals and flushes whatever is pending.  Every xorb written is
    in ``self.xorbs`` (by hash, with its layout) and ``self.xorb_paths``;
    every file's record is in ``self.files``; shard paths in ``self.shard_paths``.
    Uncompressed chunks are kept in memory (``content_of_terms`` needs them).
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        layout: Layout = "hf_xet",
        *,
        xorb_suffix: str = "",
        max_xorb_chunks: int = 8192,
        max_xorb_bytes: int = 64 * 1024 * 1024,
        xorb_footer: bool = True,
        shard_footer: bool = True,
        verification: bool = True,
        sha256: bool = True,
    ) -> None:
        self.root = Path(root)
        if layout == "hf_xet":
            base = self.root / "xet" / "xorbs"
            self._xorb_name = "default.{}"
        elif layout == "flat":
            base = self.root
            self._xorb_name = "{}" + xorb_suffix
        else:
            raise ValueError(f"unknown layout {layout!r}")
        self.xorb_dir = base / "xorbs"
        self.shard_dir = base / "shards"
        self.xorb_dir.mkdir(parents=True, exist_ok=True)
        self.shard_dir.mkdir(parents=True, exist_ok=True)
        self.max_xorb_chunks = max_xorb_chunks
        self.max_xorb_bytes = max_xorb_bytes
        self.xorb_footer = xorb_footer
        self.shard_footer = shard_footer
        self.verification = verification
        self.sha256 = sha256

        self.xorbs: dict[bytes, BuiltXorb] = {}
        self.xorb_paths: dict[bytes, Path] = {}
        self.files: dict[bytes, FileSpec] = {}
        self.shard_paths: list[Path] = []
        self._sealed: list[bytes] = []  # builder-local xorb id -> xorb hash
        self._ids: dict[bytes, int] = {}  # xorb hash -> first builder-local id
        self._chunk_data: dict[bytes, list[bytes]] = {}
        self._chunk_flags: dict[bytes, tuple[int, ...]] = {}
        self._pending = _PendingXorb()
        self._pending_files: list[_PendingFile] = []
        self._relisted: list[bytes] = []
        self._unlisted_xorbs: list[bytes] = []  # sealed, CAS record not yet in a shard
        self._verification = functools.lru_cache(maxsize=4096)(self._verification_uncached)

    # -- adding content ---------------------------------------------------------

    def add_file(
        self,
        content: bytes,
        *,
        chunk_size: int = 64 * 1024,
        boundaries: Sequence[int] | None = None,
        scheme: int | Sequence[int] = SCHEME_NONE,
        chunks_per_term: int | None = None,
        fallback: bool = False,
    ) -> bytes:
        """Add one file; returns its file hash.

        ``boundaries`` (chunk cut offsets) override ``chunk_size``.  ``scheme``
        is one scheme for every chunk or a sequence used cyclically (mixed
        schemes in one xorb).  ``chunks_per_term`` cuts the file into terms of
        at most that many chunks even inside one xorb.  Adding the same content
        twice stores it twice but lists the file once per shard.
        """
        chunks = split_at(content, boundaries) if boundaries is not None else split_fixed(content, chunk_size)
        schemes = itertools.cycle([scheme] if isinstance(scheme, int) else scheme)
        chunk_hashes = [hashes.chunk_hash(c) for c in chunks]
        file_hash = hashes.file_hash(zip(chunk_hashes, map(len, chunks), strict=True))
        terms: list[_PendingTerm] = []
        for n, (chunk, chunk_hash) in enumerate(zip(chunks, chunk_hashes, strict=True)):
            index = self._append_chunk(chunk, chunk_hash, encode_chunk(chunk, next(schemes), fallback=fallback))
            if n == 0:
                self._pending.file_starts.add(index)
            xorb_id = len(self._sealed)  # the pending xorb's future id
            last = terms[-1] if terms else None
            if (
                last is not None
                and last.xorb == xorb_id
                and last.end == index
                and (chunks_per_term is None or last.end - last.start < chunks_per_term)
            ):
                last.end += 1
                last.size += len(chunk)
            else:
                terms.append(_PendingTerm(xorb_id, index, index + 1, len(chunk)))
        sha = hashlib.sha256(content).digest() if self.sha256 else hashes.ZERO_HASH
        self._pending_files.append(_PendingFile(file_hash, terms, sha))
        return file_hash

    def add_file_from_terms(self, pieces: Sequence[tuple[bytes, int, int]]) -> bytes:
        """Add a file made of chunk ranges ``(xorb hash, start, end)`` of already sealed xorbs.

        Ranges may repeat, overlap or go backwards (docs/format.md 3.8).  Returns
        the file hash; the content is ``self.content_of_terms(pieces)``.
        """
        pairs: list[tuple[bytes, int]] = []
        terms: list[_PendingTerm] = []
        for xorb_hash, start, end in pieces:
            built = self.xorbs[xorb_hash]
            if not 0 <= start < end <= len(built.sizes):
                raise ValueError(f"chunk range [{start}, {end}) of a xorb with {len(built.sizes)} chunks")
            pairs += zip(built.chunk_hashes[start:end], built.sizes[start:end], strict=True)
            terms.append(_PendingTerm(self._ids[xorb_hash], start, end, sum(built.sizes[start:end])))
        file_hash = hashes.file_hash(pairs)
        sha = hashes.ZERO_HASH
        if self.sha256:
            digest = hashlib.sha256()
            for x, s, e in pieces:  # streamed: a million repeated terms can be gigabytes
                for c in self._chunk_data[x][s:e]:
                    digest.update(c)
            sha = digest.digest()
        self._pending_files.append(_PendingFile(file_hash, terms, sha))
        return file_hash

    def content_of_terms(self, pieces: Iterable[tuple[bytes, int, int]]) -> bytes:
        """The bytes that chunk ranges ``(xorb hash, start, end)`` decode to."""
        return b"".join(b"".join(self._chunk_data[x][s:e]) for x, s, e in pieces)

    def relist(self, file_hash: bytes) -> None:
        """List an already written file again in the next shard (like a re-upload)."""
        if file_hash not in self.files:
            raise KeyError("relist() needs a file written by an earlier flush_shard()")
        self._relisted.append(file_hash)

    # -- sealing and flushing -----------------------------------------------------

    def _append_chunk(self, chunk: bytes, chunk_hash: bytes, encoded: bytes) -> int:
        """Append to the pending xorb (sealing it first when full); returns the chunk index."""
        pending = self._pending
        if pending.chunks and (
            len(pending.chunks) >= self.max_xorb_chunks or pending.nbytes + len(chunk) > self.max_xorb_bytes
        ):
            self.seal_xorb()
            pending = self._pending
        pending.chunks.append(chunk)
        pending.hashes.append(chunk_hash)
        pending.encoded.append(encoded)
        pending.nbytes += len(chunk)
        return len(pending.chunks) - 1

    def seal_xorb(self, footer: bool | None = None) -> bytes | None:
        """Write the pending xorb (if it has chunks); returns its hash.

        ``footer`` overrides the builder's ``xorb_footer`` for this xorb.
        """
        pending = self._pending
        if not pending.chunks:
            return None
        built = assemble_xorb(
            pending.chunks,
            pending.encoded,
            footer=self.xorb_footer if footer is None else footer,
            chunk_hashes=pending.hashes,
        )
        xorb_hash = built.xorb_hash
        if xorb_hash not in self.xorbs:  # identical content twice: keep the first file
            path = self.xorb_dir / self._xorb_name.format(hashes.to_hex(xorb_hash))
            path.write_bytes(built.data)
            self.xorbs[xorb_hash] = built
            self.xorb_paths[xorb_hash] = path
            self._chunk_data[xorb_hash] = pending.chunks
            self._chunk_flags[xorb_hash] = tuple(
                CHUNK_FILE_START if i in pending.file_starts else 0 for i in range(len(pending.chunks))
            )
            self._ids[xorb_hash] = len(self._sealed)
            self._unlisted_xorbs.append(xorb_hash)
        self._sealed.append(xorb_hash)
        self._pending = _PendingXorb()
        return xorb_hash

    def flush_shard(self, *, cas: bool = True) -> bytes | None:
        """Write a shard of the files added since the last one; returns its hash.

        Seals the pending xorb first (the files may point into it).  With
        ``cas=False`` the CAS records of newly sealed xorbs are kept for the
        next shard.  Does nothing (returns None) when there is nothing to list.
        """
        if self._pending_files:
            self.seal_xorb()
        files: dict[bytes, FileSpec] = {}
        for pf in self._pending_files:
            spec = FileSpec(pf.file_hash, tuple(self._resolve(t) for t in pf.terms), pf.sha256)
            files.setdefault(spec.file_hash, spec)
            self.files.setdefault(spec.file_hash, spec)
        for file_hash in self._relisted:
            files.setdefault(file_hash, self.files[file_hash])
        xorbs = [self._xorb_spec(h) for h in self._unlisted_xorbs] if cas else []
        if not files and not xorbs:
            return None
        shard_hash, data = build_shard(
            list(files.values()), xorbs, footer=self.shard_footer, verification=self.verification, sha256=self.sha256
        )
        path = self.shard_dir / f"{hashes.to_hex(shard_hash)}.mdb"
        path.write_bytes(data)
        self.shard_paths.append(path)
        self._pending_files.clear()
        self._relisted.clear()
        if cas:
            self._unlisted_xorbs.clear()
        return shard_hash

    def finish(self, *, cas: bool = True) -> list[Path]:
        """Seal the pending xorb and write the last shard; returns all shard paths."""
        self.seal_xorb()
        self.flush_shard(cas=cas)
        return self.shard_paths

    def _resolve(self, t: _PendingTerm) -> TermSpec:
        xorb_hash = self._sealed[t.xorb]
        return TermSpec(xorb_hash, t.start, t.end, t.size, self._verification(xorb_hash, t.start, t.end))

    def _verification_uncached(self, xorb_hash: bytes, start: int, end: int) -> bytes:
        return hashes.verification_hash(self.xorbs[xorb_hash].chunk_hashes[start:end])

    def _xorb_spec(self, xorb_hash: bytes) -> XorbSpec:
        built = self.xorbs[xorb_hash]
        return XorbSpec(xorb_hash, built.chunk_hashes, built.sizes, chunk_flags=self._chunk_flags[xorb_hash])


def lz4_as_long_as_its_data(size: int) -> bytes:
    """Data of ``size`` bytes whose LZ4 frame is exactly ``size`` bytes too (zeros, then enough random bytes)."""
    rng = random.Random(size)
    noise = rng.randbytes(size)
    lo, hi = 0, size
    while lo < hi:  # the fewest random bytes that make the frame at least as long as the data
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if len(encode_payload(noise[:mid] + bytes(size - mid), 1)) < size else (lo, mid)
    for k in range(max(0, lo - 64), min(size, lo + 64)):
        data = noise[:k] + bytes(size - k)
        if len(encode_payload(data, 1)) == size:
            return data
    raise AssertionError("no such data near the boundary")
