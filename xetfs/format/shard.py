"""Shard (``*.mdb``) parsing (docs/format.md section 3).

``parse_shard`` takes a whole shard's bytes and returns a frozen ``Shard``.
Term and chunk lists are views over the shard bytes (``RecordTable``): they
are validated once while parsing and unpacked on demand, so a shard with a
million terms does not become a million Python objects at once.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

from xetfs.base.errors import ShardFormatError
from xetfs.base.hashes import MARKER_HASH, ZERO_HASH

MAGIC = bytes(
    [72, 70, 82, 101, 112, 111, 77, 101, 116, 97, 68, 97, 116, 97, 0, 85,
     105, 103, 69, 106, 123, 129, 87, 131, 165, 189, 217, 92, 205, 209, 74, 169]
)  # fmt: skip
HEADER_VERSION = 2
FOOTER_VERSION = 1
RECORD_SIZE = 48
FOOTER_SIZE = 200

FLAG_VERIFICATION = 0x80000000
FLAG_METADATA_EXT = 0x40000000

HEADER = struct.Struct("<32sQQ")
FILE_HEADER = struct.Struct("<32sIIQ")
TERM = struct.Struct("<32sIIII")  # xorb hash, flags, size, chunk start, chunk end
CAS_HEADER = struct.Struct("<32sIIII")  # xorb hash, flags, chunks, bytes in xorb, bytes on disk
CAS_CHUNK = struct.Struct("<32sIIII")  # chunk hash, start, size, flags, unused
FOOTER = struct.Struct("<9Q32sQQ48sQQQQ")
BOOKEND = MARKER_HASH + bytes(16)


class Term(NamedTuple):
    """One piece of a file: chunks ``[start, end)`` of ``xorb_hash``, ``size`` decoded bytes."""

    xorb_hash: bytes
    size: int
    start: int
    end: int


class CasChunk(NamedTuple):
    chunk_hash: bytes
    start: int  # uncompressed offset inside the xorb
    size: int


@dataclass(frozen=True, slots=True)
class RecordTable:
    """``count`` 48-byte records of ``data`` starting at ``offset``, unpacked lazily."""

    data: bytes
    offset: int
    count: int

    def __len__(self) -> int:
        return self.count

    def raw(self) -> memoryview:
        return memoryview(self.data)[self.offset : self.offset + RECORD_SIZE * self.count]

    def _unpack(self) -> Iterator[tuple[bytes, int, int, int, int]]:
        return TERM.iter_unpack(self.raw())


class TermTable(RecordTable):
    def __iter__(self) -> Iterator[Term]:
        for xorb, _flags, size, start, end in self._unpack():
            yield Term(xorb, size, start, end)

    def __getitem__(self, i: int) -> Term:
        if not 0 <= i < self.count:
            raise IndexError(i)
        xorb, _flags, size, start, end = TERM.unpack_from(self.data, self.offset + RECORD_SIZE * i)
        return Term(xorb, size, start, end)


class ChunkTable(RecordTable):
    def __iter__(self) -> Iterator[CasChunk]:
        for chunk_hash, start, size, _flags, _unused in self._unpack():
            yield CasChunk(chunk_hash, start, size)


@dataclass(frozen=True, slots=True)
class FileRecord:
    file_hash: bytes
    flags: int
    terms: TermTable
    verification: tuple[bytes, ...]  # one range hash per term, or empty
    sha256: bytes | None  # stored (group-reversed) form; see hashes.sha256_from_stored

    @property
    def size(self) -> int:
        return sum(t.size for t in self.terms)


@dataclass(frozen=True, slots=True)
class CasRecord:
    xorb_hash: bytes
    num_bytes: int
    chunks: ChunkTable


@dataclass(frozen=True, slots=True)
class ShardFooter:
    version: int
    file_info_offset: int
    cas_info_offset: int
    file_lookup_offset: int
    file_lookup_num: int
    xorb_lookup_offset: int
    xorb_lookup_num: int
    chunk_lookup_offset: int
    chunk_lookup_num: int
    hmac_key: bytes
    created: int
    expiry: int
    materialized_bytes: int
    stored_bytes: int
    footer_offset: int


@dataclass(frozen=True, slots=True)
class Shard:
    footer: ShardFooter | None
    files: tuple[FileRecord, ...]
    xorbs: tuple[CasRecord, ...]


def parse_shard(data: bytes, *, where: str) -> Shard:
    """Parse a whole shard.  Raises ``ShardFormatError`` naming ``where`` and the offset."""
    size = len(data)
    if size < 3 * RECORD_SIZE:
        raise ShardFormatError(f"{where}: {size} bytes is too short for a shard (at least {3 * RECORD_SIZE})")
    tag, version, footer_size = HEADER.unpack_from(data, 0)
    if tag != MAGIC:
        raise ShardFormatError(f"{where}: bad shard magic at offset 0")
    if version != HEADER_VERSION:
        raise ShardFormatError(f"{where}: unsupported shard version {version} at offset 32 (expected {HEADER_VERSION})")
    if footer_size not in (0, FOOTER_SIZE):
        raise ShardFormatError(f"{where}: footer size {footer_size} at offset 40 (expected 0 or {FOOTER_SIZE})")
    body_end = size - footer_size
    if body_end < 3 * RECORD_SIZE:
        raise ShardFormatError(f"{where}: {size} bytes cannot hold a header, two bookends and a footer")
    files, cas_start = _parse_files(data, RECORD_SIZE, body_end, where)
    xorbs, cas_end = _parse_cas(data, cas_start, body_end, where)
    footer = None
    if footer_size:
        footer = _parse_footer(data, cas_start, cas_end, where)
    elif cas_end != size:
        raise ShardFormatError(f"{where}: {size - cas_end} unexpected bytes after the CAS bookend at offset {cas_end}")
    return Shard(footer, files, xorbs)


def _record(data: bytes, pos: int, end: int, what: str, where: str) -> None:
    if pos + RECORD_SIZE > end:
        raise ShardFormatError(
            f"{where}: truncated {what} at offset {pos} ({max(0, end - pos)} of {RECORD_SIZE} bytes present)"
        )


def _check_count(count: int, per: int, pos: int, end: int, what: str, where: str) -> None:
    """Refuse a count that claims more records than the bytes left can hold."""
    left = (end - pos) // RECORD_SIZE
    if count * per > left:
        raise ShardFormatError(
            f"{where}: {what} at offset {pos - RECORD_SIZE} lists {count} entries, {count * per} records of "
            f"{RECORD_SIZE} bytes, but only {left} follow it: the shard is cut short or damaged"
        )


def _bookend(data: bytes, pos: int, where: str, section: str) -> None:
    if data[pos : pos + RECORD_SIZE] != BOOKEND:
        raise ShardFormatError(f"{where}: malformed {section} bookend at offset {pos}")


def _parse_files(data: bytes, pos: int, end: int, where: str) -> tuple[tuple[FileRecord, ...], int]:
    files: list[FileRecord] = []
    while True:
        _record(data, pos, end, "file record", where)
        file_hash, flags, n, _unused = FILE_HEADER.unpack_from(data, pos)
        if file_hash == MARKER_HASH:
            _bookend(data, pos, where, "file info")
            return tuple(files), pos + RECORD_SIZE
        header_at = pos
        pos += RECORD_SIZE
        has_verify = bool(flags & FLAG_VERIFICATION)
        has_ext = bool(flags & FLAG_METADATA_EXT)
        _check_count(n, 2 if has_verify else 1, pos, end, f"file record {len(files)}", where)
        terms = TermTable(data, pos, n)
        for i, (_xorb, _flags, tsize, start, stop) in enumerate(terms._unpack()):
            if start >= stop or tsize < stop - start:
                raise ShardFormatError(
                    f"{where}: file record {len(files)} term {i} at offset {pos + RECORD_SIZE * i} "
                    f"has chunk range [{start}, {stop}) and size {tsize}"
                )
        pos += RECORD_SIZE * n
        verification: tuple[bytes, ...] = ()
        if has_verify:
            verification = tuple(data[pos + RECORD_SIZE * i : pos + RECORD_SIZE * i + 32] for i in range(n))
            pos += RECORD_SIZE * n
        sha256 = None
        if has_ext:
            _record(data, pos, end, "metadata record", where)
            sha256 = data[pos : pos + 32]
            pos += RECORD_SIZE
        if n == 0 and file_hash != ZERO_HASH:
            raise ShardFormatError(f"{where}: file record at offset {header_at} has no terms but a non-empty hash")
        files.append(FileRecord(file_hash, flags, terms, verification, sha256))


def _parse_cas(data: bytes, pos: int, end: int, where: str) -> tuple[tuple[CasRecord, ...], int]:
    xorbs: list[CasRecord] = []
    while True:
        _record(data, pos, end, "CAS record", where)
        xorb_hash, _flags, n, num_bytes, _on_disk = CAS_HEADER.unpack_from(data, pos)
        if xorb_hash == MARKER_HASH:
            _bookend(data, pos, where, "CAS info")
            return tuple(xorbs), pos + RECORD_SIZE
        pos += RECORD_SIZE
        _check_count(n, 1, pos, end, f"CAS record {len(xorbs)}", where)
        xorbs.append(CasRecord(xorb_hash, num_bytes, ChunkTable(data, pos, n)))
        pos += RECORD_SIZE * n


def _parse_footer(data: bytes, cas_start: int, cas_end: int, where: str) -> ShardFooter:
    at = len(data) - FOOTER_SIZE
    fields = FOOTER.unpack_from(data, at)
    (version, file_off, cas_off, flookup, fnum, xlookup, xnum, clookup, cnum,
     hmac, created, expiry, _reserved, _on_disk, materialized, stored, footer_off) = fields  # fmt: skip
    footer = ShardFooter(version, file_off, cas_off, flookup, fnum, xlookup, xnum, clookup, cnum,
                         hmac, created, expiry, materialized, stored, footer_off)  # fmt: skip
    if version != FOOTER_VERSION:
        raise ShardFormatError(f"{where}: unsupported shard footer version {version} at offset {at}")
    expected = {
        "footer_offset": (footer_off, at),
        "file_info_offset": (file_off, RECORD_SIZE),
        "cas_info_offset": (cas_off, cas_start),
        "file_lookup_offset": (flookup, cas_end),
        "xorb_lookup_offset": (xlookup, flookup + 12 * fnum),
        "chunk_lookup_offset": (clookup, xlookup + 12 * xnum),
    }
    for name, (found, want) in expected.items():
        if found != want:
            raise ShardFormatError(f"{where}: footer at offset {at} has {name} {found}, expected {want}")
    if clookup + 16 * cnum != at:
        raise ShardFormatError(
            f"{where}: footer at offset {at}: lookup tables end at {clookup + 16 * cnum}, not at the footer"
        )
    return footer
