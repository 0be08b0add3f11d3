"""Xorb layout: the footer (docs/format.md 2.4) and the header walk (2.5).

A ``XorbLayout`` tells where each chunk lives in the xorb file (physical END
offsets, headers included) and where it lands once decoded (uncompressed END
offsets), plus the chunk hashes when the footer has them.  Functions here take
bytes that the caller read; they never touch files.
"""

from __future__ import annotations

import struct
from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import NamedTuple

from xetfs.base.errors import IntegrityError, XetfsError, XorbFormatError
from xetfs.base.hashes import HASH_SIZE, chunk_hash, to_hex
from xetfs.format.chunk import (
    HEADER_SIZE,
    MAX_COMPRESSED,
    MAX_UNCOMPRESSED,
    SCHEME_NONE,
    Buffer,
    ChunkHeader,
    decode_chunk,
    parse_chunk_header,
)

FOOTER_IDENT = b"XETBLOB"
HASHES_IDENT = b"XBLBHSH"
BOUNDARY_IDENT = b"XBLBBND"
FOOTER_VERSION = 1
HASHES_VERSION = 0
BOUNDARY_VERSION = 1
MAX_CHUNKS = 8192 * 8  # generous: xet-core builds at most 8192 chunks per xorb

HASHES_AT = 52  # where a footer's chunk hashes start, from the footer's start

# The fixed tail of a footer: n, hashes offset, boundary offset, 16-byte buffer, info_length.
TAIL = struct.Struct("<III16sI")
TAIL_SIZE = TAIL.size  # 32


def footer_size(n: int) -> int:
    """Bytes of footer (without the trailing u32 length) for ``n`` chunks."""
    return 92 + 40 * n


@dataclass(frozen=True, slots=True)
class XorbLayout:
    """Where every chunk of one xorb lives.

    ``phys_ends[i]`` is the exclusive physical end of chunk ``i`` in the file
    (its 8-byte header starts at ``phys_ends[i-1]``, 0 for the first);
    ``unpacked_ends[i]`` the exclusive end of its bytes in the decoded xorb.
    ``chunk_hashes`` is None when the xorb had no footer.
    """

    xorb_hash: bytes | None
    phys_ends: tuple[int, ...]
    unpacked_ends: tuple[int, ...]
    chunk_hashes: tuple[bytes, ...] | None

    @property
    def num_chunks(self) -> int:
        return len(self.phys_ends)

    def phys_start(self, i: int) -> int:
        return self.phys_ends[i - 1] if i else 0

    def unpacked_start(self, i: int) -> int:
        return self.unpacked_ends[i - 1] if i else 0

    def chunk_size(self, i: int) -> int:
        return self.unpacked_ends[i] - self.unpacked_start(i)

    def range_size(self, start: int, end: int) -> int:
        """Decoded bytes of chunks ``[start, end)``."""
        return self.unpacked_ends[end - 1] - self.unpacked_start(start)

    def chunk_at(self, offset: int) -> int:
        """Index of the chunk holding decoded byte ``offset`` of the xorb."""
        return bisect_right(self.unpacked_ends, offset)

    def chunk_at_phys(self, offset: int) -> int:
        """Index of the chunk whose stored bytes (header included) hold byte ``offset`` of the xorb file."""
        return bisect_right(self.phys_ends, offset)


def footer_length(tail4: bytes, file_size: int) -> int | None:
    """From the file's last 4 bytes, the footer length, or None if it cannot be one."""
    if file_size < 4 or len(tail4) != 4:
        return None
    length = int.from_bytes(tail4, "little")
    if length < footer_size(0) or length + 4 > file_size or (length - 92) % 40:
        return None
    return length


def parse_footer(footer: bytes, file_size: int, *, where: str) -> XorbLayout:
    """Parse a V1 footer: ``footer`` is the file's last ``info_length + 4`` bytes."""
    size = len(footer)
    if size < footer_size(0) + 4:
        raise XorbFormatError(f"{where}: footer of {size} bytes is too short")
    start = file_size - size
    if footer[:7] != FOOTER_IDENT:
        raise XorbFormatError(f"{where}: no {FOOTER_IDENT.decode()} footer at offset {start}")
    version = footer[7]
    if version == 0:
        raise XorbFormatError(f"{where}: unsupported xorb footer version 0 at offset {start}")
    if version != FOOTER_VERSION:
        raise XorbFormatError(f"{where}: unknown xorb footer version {version} at offset {start}")
    n, hashes_off, boundary_off, _buffer, info_length = TAIL.unpack_from(footer, size - TAIL_SIZE)
    if info_length != size - 4 or info_length != footer_size(n):
        raise XorbFormatError(
            f"{where}: footer at offset {start} has info_length {info_length}, expected {footer_size(n)} for {n} chunks"
        )
    if n == 0 or n > MAX_CHUNKS:
        raise XorbFormatError(f"{where}: footer at offset {start} declares {n} chunks (allowed 1..{MAX_CHUNKS})")
    if hashes_off != HASHES_AT + 40 * n or boundary_off != 40 + 8 * n:
        raise XorbFormatError(
            f"{where}: footer at offset {start} has section offsets {hashes_off}/{boundary_off}, "
            f"expected {HASHES_AT + 40 * n}/{40 + 8 * n}"
        )
    xorb_hash = footer[8:40]
    _check_ident(footer, 40, HASHES_IDENT, HASHES_VERSION, n, start, where)
    hashes = tuple(footer[HASHES_AT + HASH_SIZE * i : HASHES_AT + HASH_SIZE * (i + 1)] for i in range(n))
    bound_at = HASHES_AT + HASH_SIZE * n
    _check_ident(footer, bound_at, BOUNDARY_IDENT, BOUNDARY_VERSION, n, start, where)
    phys = struct.unpack_from(f"<{n}I", footer, bound_at + 12)
    unpacked = struct.unpack_from(f"<{n}I", footer, bound_at + 12 + 4 * n)
    third_n = int.from_bytes(footer[bound_at + 12 + 8 * n : bound_at + 16 + 8 * n], "little")
    if third_n != n:
        raise XorbFormatError(f"{where}: footer chunk counts disagree ({n} vs {third_n})")
    _check_offsets(phys, unpacked, start, where)
    if phys[-1] != start:
        raise XorbFormatError(
            f"{where}: chunk section ends at offset {phys[-1]} but the footer starts at offset {start}"
        )
    return XorbLayout(xorb_hash, phys, unpacked, hashes)


def _check_ident(buf: bytes, at: int, ident: bytes, version: int, n: int, base: int, where: str) -> None:
    if buf[at : at + 7] != ident or buf[at + 7] != version:
        raise XorbFormatError(
            f"{where}: expected {ident.decode()} version {version} at offset {base + at}, found {buf[at : at + 8]!r}"
        )
    count = int.from_bytes(buf[at + 8 : at + 12], "little")
    if count != n:
        raise XorbFormatError(f"{where}: section at offset {base + at} counts {count} chunks, footer says {n}")


def _check_offsets(phys: tuple[int, ...], unpacked: tuple[int, ...], base: int, where: str) -> None:
    """Every chunk must have the size a chunk header can declare (docs/format.md 2.2)."""
    prev_p = prev_u = 0
    for i, (p, u) in enumerate(zip(phys, unpacked, strict=True)):
        if not HEADER_SIZE + 1 <= p - prev_p <= HEADER_SIZE + MAX_COMPRESSED:
            raise XorbFormatError(
                f"{where}: footer (offset {base}) gives chunk {i} physical range [{prev_p}, {p}): "
                f"a chunk takes {HEADER_SIZE + 1}..{HEADER_SIZE + MAX_COMPRESSED} bytes"
            )
        if not 1 <= u - prev_u <= MAX_UNCOMPRESSED:
            raise XorbFormatError(
                f"{where}: footer (offset {base}) gives chunk {i} decoded range [{prev_u}, {u}): "
                f"a chunk holds 1..{MAX_UNCOMPRESSED} bytes"
            )
        prev_p, prev_u = p, u


def walk_headers(data: bytes, *, where: str) -> XorbLayout:
    """Build a layout by walking the chunk headers of a footer-less xorb held in ``data``."""
    return walk_headers_with(lambda start, end: data[start:end], len(data), where=where)


def walk_headers_with(read: Callable[[int, int], bytes], size: int, *, where: str) -> XorbLayout:
    """Build a layout by walking the chunk headers of a footer-less xorb of ``size`` bytes.

    ``read(start, end)`` returns those bytes of the xorb; only the 8-byte
    headers are read, so memory stays bounded whatever the file claims.  The
    walk must end exactly at ``size``.  Chunk hashes are not known
    (``chunk_hashes`` is None); the caller computes them from the decoded
    chunks.
    """
    phys: list[int] = []
    unpacked: list[int] = []
    pos = total = 0
    while pos < size:
        if len(phys) >= MAX_CHUNKS:
            raise XorbFormatError(f"{where}: more than {MAX_CHUNKS} chunks")
        header = parse_chunk_header(read(pos, min(pos + HEADER_SIZE, size)), 0, where=where, at=pos)
        end = pos + HEADER_SIZE + header.compressed_length
        if end > size:
            raise XorbFormatError(
                f"{where}: chunk {len(phys)} at offset {pos} needs {header.compressed_length} payload bytes, "
                f"only {size - pos - HEADER_SIZE} present"
            )
        total += header.uncompressed_length
        phys.append(end)
        unpacked.append(total)
        pos = end
    if not phys:
        raise XorbFormatError(f"{where}: empty xorb")
    return XorbLayout(None, tuple(phys), tuple(unpacked), None)


class ChunkRun(NamedTuple):
    """What decoding chunks ``[first, first + len(phys) - 1)`` of a xorb needs to know, in few objects: the
    daemon's decodes and a decode worker's (it travels with every job) alike.  Chunk ``k`` of the run is
    chunk ``first + k`` of the xorb."""

    first: int
    phys: tuple[int, ...]  # where each chunk's header starts in the xorb file, then where the last one ends
    unpacked: tuple[int, ...]  # where each starts once decoded, then where the last one ends
    hashes: bytes | None  # the hashes their decoded bytes must have, back to back (None: not verified)

    def sizes(self) -> list[int]:
        """Each chunk's decoded bytes."""
        u = self.unpacked
        return [u[k + 1] - u[k] for k in range(len(u) - 1)]

    def stored_raw_sized(self) -> bool:
        """Whether every chunk's stored payload is as long as its decoded bytes, as raw chunks' are: then
        the payloads can be read straight to where the decoded chunks go (``check_in_place``)."""
        p, u = self.phys, self.unpacked
        return all(p[k + 1] - p[k] - HEADER_SIZE == u[k + 1] - u[k] for k in range(len(p) - 1))

    def chunks(self) -> int:
        """How many chunks the run has."""
        return len(self.phys) - 1

    def size(self, k: int) -> int:
        """Chunk ``k``'s decoded bytes."""
        return self.unpacked[k + 1] - self.unpacked[k]

    def expected(self, k: int) -> bytes | None:
        """The hash chunk ``k``'s decoded bytes must have (None: not verified)."""
        return self.hashes[k * HASH_SIZE : (k + 1) * HASH_SIZE] if self.hashes is not None else None


def chunk_run(layout: XorbLayout, start: int, stop: int, *, verify: bool) -> ChunkRun:
    """Chunks ``[start, stop)`` as a ``ChunkRun``; hashes only with ``verify`` and when the layout has them."""
    if not 0 <= start <= stop <= layout.num_chunks:
        raise IndexError(f"chunks [{start}, {stop}) of a xorb of {layout.num_chunks}")
    hashes = layout.chunk_hashes if verify else None
    return ChunkRun(
        start,
        (layout.phys_start(start), *layout.phys_ends[start:stop]),
        (layout.unpacked_start(start), *layout.unpacked_ends[start:stop]),
        b"".join(hashes[start:stop]) if hashes else None,
    )


def decode_run(
    data: Buffer, xorb_hash: bytes, layout: XorbLayout, start: int, stop: int, *, verify: bool
) -> list[bytes | XetfsError]:
    """Decode chunks ``[start, stop)`` from ``data`` (their physical bytes, read in one piece).

    Checks each header against the layout and, with ``verify``, each decoded
    chunk against its hash in the layout.  A chunk that fails becomes its
    error in the result; the others still decode.
    """
    run = chunk_run(layout, start, stop, verify=verify)
    return [c if isinstance(c, XetfsError) else bytes(c) for c in decode_chunks(data, xorb_hash, run)]


def check_run(data: Buffer, xorb_hash: bytes, layout: XorbLayout, start: int, stop: int) -> list[XetfsError | None]:
    """Check chunks ``[start, stop)`` in ``data`` (their physical bytes, read in one piece), keeping nothing.

    Per chunk, None when its header matches the layout and it decodes to its
    hash, else its error.  ``decode_run`` with ``verify``, without copying a
    raw chunk's bytes out of ``data``.
    """
    run = chunk_run(layout, start, stop, verify=True)
    return [c if isinstance(c, XetfsError) else None for c in decode_chunks(data, xorb_hash, run)]


def decode_chunks(data: Buffer, xorb_hash: bytes, run: ChunkRun) -> list[Buffer | XetfsError]:
    """Decode the chunks of ``run`` from ``data``, their physical bytes read in one piece.

    ``data`` starts at the run's first header.  A raw chunk comes back as a
    view into ``data`` (no copy).  A chunk that fails becomes its error; the
    others still decode.
    """
    view = memoryview(data)
    xorb = f"xorb {to_hex(xorb_hash)}"  # for messages; built once per run, not per chunk
    out: list[Buffer | XetfsError] = []
    for k in range(run.chunks()):
        try:
            out.append(_decode_chunk(view, xorb, run, k))
        except XetfsError as exc:
            out.append(exc)
    return out


def decode_chunks_into(data: Buffer, xorb_hash: bytes, run: ChunkRun, out: memoryview) -> list[int | XetfsError]:
    """``decode_chunks``, writing the decoded chunks one after another into ``out``.

    Returns, per chunk, its decoded length or the error that stopped it (a
    chunk that fails takes no room).  ``out`` must hold the run's decoded bytes.
    """
    sizes: list[int | XetfsError] = []
    pos = 0
    for chunk in decode_chunks(data, xorb_hash, run):
        if isinstance(chunk, XetfsError):
            sizes.append(chunk)
            continue
        size = len(chunk)
        out[pos : pos + size] = chunk
        pos += size
        sizes.append(size)
    return sizes


def decode_runs_into(
    data: Buffer, xorb_hash: bytes, runs: Sequence[tuple[ChunkRun, memoryview]]
) -> list[list[int | XetfsError]]:
    """``decode_chunks_into`` for adjacent runs read in one piece, each into its own ``out``.

    ``data`` starts at the first run's first chunk header.  Returns, per run,
    per chunk, its decoded length or the error that stopped it.
    """
    view = memoryview(data)
    base = runs[0][0].phys[0] if runs else 0
    return [decode_chunks_into(view[run.phys[0] - base : run.phys[-1] - base], xorb_hash, run, out)
            for run, out in runs]  # fmt: skip


def all_raw(headers: Buffer, run: ChunkRun) -> bool:
    """Whether ``headers``, back to back, are those of ``run``'s chunks stored raw (version 0, scheme 0,
    stored as long as decoded): then payloads read in place are the stored bytes as they are."""
    sizes = run.sizes()
    return bytes(headers) == struct.pack(f"<{2 * len(sizes)}I", *[size << 8 for size in sizes for _ in (0, 1)])


def check_in_place(headers: Buffer, run: ChunkRun, out: memoryview) -> bool:
    """Finish chunks whose payloads were read straight to their places in ``out``, one after another
    (``ChunkRun.stored_raw_sized``), their headers back to back in ``headers``.

    Checks each header against the footer, decodes in place a payload that
    is stored compressed after all, and verifies each chunk.  False at the
    first chunk that fails: the caller then decodes the run from its stored
    bytes (``decode_chunks``), which says which chunks fail and why.
    """
    # The common case in a few calls: every header says raw, and the hashes, back to back, are the footer's.
    if all_raw(headers, run):
        if run.hashes is None:
            return True
        ends = run.unpacked
        base = ends[0]
        found = b"".join([chunk_hash(out[a - base : b - base]) for a, b in pairwise(ends)])
        if found == run.hashes:
            return True
    pos = 0
    for k in range(run.chunks()):
        size = run.size(k)
        place = out[pos : pos + size]
        where = f"chunk {run.first + k}"
        try:
            header = parse_chunk_header(headers, k * HEADER_SIZE, where=where)
            _check_header(header, run, k, where)
            if header.scheme != SCHEME_NONE:
                place[:] = decode_chunk(header.scheme, bytes(place), size, where=where)
            _check_hash(place, run, k, where)
        except XetfsError:
            return False
        pos += size
    return True


def _decode_chunk(view: memoryview, xorb: str, run: ChunkRun, k: int) -> Buffer:
    """Chunk ``k`` of ``run``, from ``view`` (the run's stored bytes); ``xorb`` names it."""
    base = run.phys[0]
    at = run.phys[k] - base
    header = parse_chunk_header(view, at, where=f"{xorb} chunk {run.first + k}", at=run.phys[k])
    where = f"{xorb} chunk {run.first + k} at byte {run.phys[k]} of the xorb"
    _check_header(header, run, k, where)
    decoded = decode_chunk(header.scheme, view[at + HEADER_SIZE : run.phys[k + 1] - base], run.size(k), where=where)
    _check_hash(decoded, run, k, where)
    return decoded


def _check_header(header: ChunkHeader, run: ChunkRun, k: int, where: str) -> None:
    """A chunk's header must give the stored and decoded lengths the footer gives."""
    stored = run.phys[k + 1] - run.phys[k] - HEADER_SIZE
    size = run.size(k)
    if header.compressed_length != stored or header.uncompressed_length != size:
        raise XorbFormatError(
            f"{where}: header says {header.compressed_length} -> "
            f"{header.uncompressed_length} bytes, footer says {stored} -> {size}"
        )


def _check_hash(decoded: Buffer, run: ChunkRun, k: int, where: str) -> None:
    """A decoded chunk must hash to what the footer says (when it is verified)."""
    expected = run.expected(k)
    if expected is not None:
        found = chunk_hash(decoded)
        if found != expected:
            raise IntegrityError(f"{where}: decoded bytes hash to {to_hex(found)}, footer says {to_hex(expected)}")
