"""Xorb chunk headers and payload decoding (docs/format.md 2.2, 2.3).

A chunk is an 8-byte header followed by ``compressed_length`` payload bytes.
``decode_chunk`` turns a payload into exactly ``uncompressed_length`` bytes or
raises ``XorbFormatError``; decoding is capped so a hostile payload cannot
make it allocate more than the declared size.
"""

from __future__ import annotations

from dataclasses import dataclass

import lz4.block
import lz4.frame

from xetfs.base.errors import XorbFormatError

HEADER_SIZE = 8
MAX_UNCOMPRESSED = 128 * 1024
MAX_COMPRESSED = 256 * 1024

SCHEME_NONE = 0
SCHEME_LZ4 = 1
SCHEME_BG4_LZ4 = 2
SCHEMES = (SCHEME_NONE, SCHEME_LZ4, SCHEME_BG4_LZ4)

_LZ4_MAGIC = b"\x04\x22\x4d\x18"

Buffer = bytes | bytearray | memoryview


@dataclass(frozen=True, slots=True)
class ChunkHeader:
    version: int
    compressed_length: int
    scheme: int
    uncompressed_length: int


def parse_chunk_header(buf: Buffer, offset: int, *, where: str, at: int | None = None) -> ChunkHeader:
    """Parse and validate the 8-byte header at ``buf[offset:]``.

    ``where`` names the object for messages (e.g. ``"xorb 1a2b..."``), and ``at`` where the header lies in it
    (default ``offset``: ``buf`` is the whole object).
    """
    if at is None:
        at = offset
    raw = bytes(buf[offset : offset + HEADER_SIZE])
    if len(raw) < HEADER_SIZE:
        raise XorbFormatError(
            f"{where}: truncated chunk header at offset {at} ({len(raw)} of {HEADER_SIZE} bytes present)"
        )
    w0 = int.from_bytes(raw[0:4], "little")
    w1 = int.from_bytes(raw[4:8], "little")
    header = ChunkHeader(w0 & 0xFF, w0 >> 8, w1 & 0xFF, w1 >> 8)
    if header.version != 0:
        raise XorbFormatError(f"{where}: chunk header at offset {at} has version {header.version}, expected 0")
    if header.scheme not in SCHEMES:
        raise XorbFormatError(f"{where}: chunk header at offset {at} has unknown compression scheme {header.scheme}")
    if not 0 < header.uncompressed_length <= MAX_UNCOMPRESSED:
        raise XorbFormatError(
            f"{where}: chunk header at offset {at} declares {header.uncompressed_length} "
            f"uncompressed bytes (allowed 1..{MAX_UNCOMPRESSED})"
        )
    if not 0 < header.compressed_length <= MAX_COMPRESSED:
        raise XorbFormatError(
            f"{where}: chunk header at offset {at} declares {header.compressed_length} "
            f"payload bytes (allowed 1..{MAX_COMPRESSED})"
        )
    if header.scheme == SCHEME_NONE and header.compressed_length != header.uncompressed_length:
        raise XorbFormatError(
            f"{where}: uncompressed chunk at offset {at} has payload length "
            f"{header.compressed_length} != uncompressed length {header.uncompressed_length}"
        )
    return header


def decode_chunk(scheme: int, payload: Buffer, size: int, *, where: str) -> Buffer:
    """Decode one chunk payload into exactly ``size`` bytes.

    Scheme 0 returns ``payload`` itself (no copy).  Raises ``XorbFormatError``
    for a corrupt frame, trailing bytes or a size mismatch.
    """
    if scheme == SCHEME_NONE:
        if len(payload) != size:
            raise XorbFormatError(f"{where}: raw chunk has {len(payload)} bytes, header says {size}")
        return payload
    if scheme == SCHEME_LZ4:
        return _lz4_frame(payload, size, where)
    if scheme == SCHEME_BG4_LZ4:
        return bg4_regroup(_lz4_frame(payload, size, where))
    raise XorbFormatError(f"{where}: unknown compression scheme {scheme}")


def _lz4_frame(payload: Buffer, size: int, where: str) -> Buffer:
    """Decode an LZ4 frame of known output size.

    Fast path: a frame with one block, no checksums and no dictionary (what
    xet-core writes) is decoded with ``lz4.block`` straight from the payload
    (no copy of it) into a buffer of the right size.  Anything else goes
    through the streaming frame decoder, capped at ``size + 1`` bytes of output.
    """
    view = memoryview(payload)
    fast = _lz4_single_block(view, size, where)
    if fast is not None:
        return fast
    try:
        dec = lz4.frame.LZ4FrameDecompressor()
        out: bytes = dec.decompress(bytes(view), max_length=size + 1)
        complete = dec.eof and not dec.unused_data
    except Exception as exc:  # python-lz4 raises bare RuntimeError
        raise XorbFormatError(f"{where}: corrupt LZ4 frame: {exc}") from None
    if not complete:
        raise XorbFormatError(f"{where}: LZ4 frame is truncated or followed by extra bytes")
    if len(out) != size:
        raise XorbFormatError(f"{where}: LZ4 frame decodes to {len(out)} bytes, header says {size}")
    return out


def _lz4_single_block(view: memoryview, size: int, where: str) -> Buffer | None:
    """Decode the common one-block frame, or return None to use the slow path."""
    head = bytes(view[:11])
    if head[:4] != _LZ4_MAGIC:
        raise XorbFormatError(f"{where}: payload is not an LZ4 frame (starts {head[:4].hex()})")
    # Frame version 01 with no block checksum, content size, content checksum
    # or dictionary id (FLG 0x40 or 0x60); anything else takes the slow path.
    if len(view) < 15 or head[4] not in (0x40, 0x60):
        return None
    word = int.from_bytes(head[7:11], "little")
    length = word & 0x7FFFFFFF
    if 11 + length + 4 != len(view) or bytes(view[11 + length :]) != b"\0\0\0\0":
        return None
    block = view[11 : 11 + length]
    if word & 0x80000000:
        if length != size:
            raise XorbFormatError(f"{where}: stored LZ4 block has {length} bytes, header says {size}")
        return block
    try:
        out: bytes = lz4.block.decompress(block, uncompressed_size=size)
    except Exception as exc:
        raise XorbFormatError(f"{where}: corrupt LZ4 block: {exc}") from None
    if len(out) != size:
        raise XorbFormatError(f"{where}: LZ4 block decodes to {len(out)} bytes, header says {size}")
    return out


def bg4_split(data: Buffer) -> bytes:
    """Byte-group data into four groups (the writer side of scheme 2)."""
    return b"".join(bytes(data[k::4]) for k in range(4))


def bg4_regroup(grouped: Buffer) -> bytearray:
    """Undo ``bg4_split``: groups 0..r-1 hold one extra byte (docs/format.md 2.3).

    Extended-slice assignment into a ``bytearray`` is the fastest regroup
    measured in pure Python (numpy is slower for 64 KiB chunks).
    """
    n = len(grouped)
    q, r = divmod(n, 4)
    out = bytearray(n)
    pos = 0
    for k in range(4):
        size = q + (1 if k < r else 0)
        out[k::4] = grouped[pos : pos + size]
        pos += size
    return out
