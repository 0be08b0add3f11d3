"""Xorb footer and header walk (docs/format.md 2.4, 2.5, 8): known answers, round
trips through the test writer, truncation and every footer check.
"""

from __future__ import annotations

import random
import struct
import tracemalloc
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import pytest
from helpers import writer

from xetfs.base import hashes
from xetfs.base.errors import XetfsError, XorbFormatError
from xetfs.format import xorb
from xetfs.format.xorb import XorbLayout, footer_length, parse_footer, walk_headers

pytestmark = pytest.mark.unit

W = "xorb test"

# The xorb hf_xet 1.8.0 wrote for b"hello world" (one chunk, scheme 0, footer).
HELLO_XORB = bytes.fromhex(
    "000b0000000b000068656c6c6f20776f726c64"
    "584554424c4f4201"
    "119f359d8b37394e0213441f7a559081d97ba0cf5f4ea519b151e66f460bf56c"
    "58424c4248534800" "01000000"
    "119f359d8b37394e0213441f7a559081d97ba0cf5f4ea519b151e66f460bf56c"
    "58424c42424e4401" "01000000" "13000000" "0b000000"
    "01000000" "5c000000" "30000000" "00000000000000000000000000000000"
    "84000000"
)  # fmt: skip


def _footer_of(data: bytes) -> bytes:
    """The last ``info_length + 4`` bytes of a footered xorb."""
    (length,) = struct.unpack_from("<I", data, len(data) - 4)
    return data[len(data) - length - 4 :]


def _parse(data: bytes) -> XorbLayout:
    return parse_footer(_footer_of(data), len(data), where=W)


def _chunks(n: int, seed: int = 0, max_size: int = 3000) -> list[bytes]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        size = rng.randint(1, max_size)
        out.append(rng.randbytes(size) if rng.random() < 0.5 else bytes([rng.randrange(4)]) * size)
    return out


@dataclass(frozen=True)
class Footer:
    """The fields of a V1 footer, by default valid for ``n`` chunks of 10 bytes stored raw."""

    n: int
    ident: bytes = b"XETBLOB"
    version: int = 1
    xorb_hash: bytes = bytes(32)
    hash_ident: bytes = b"XBLBHSH"
    hash_version: int = 0
    n1: int | None = None
    bound_ident: bytes = b"XBLBBND"
    bound_version: int = 1
    n2: int | None = None
    phys: list[int] | None = None
    unpacked: list[int] | None = None
    n3: int | None = None
    hashes_off: int | None = None
    bound_off: int | None = None
    buffer: bytes = bytes(16)
    info_length: int | None = None

    def pack(self) -> tuple[bytes, int]:
        """The footer bytes (with the trailing length) and the size of the file they end."""
        n = self.n
        phys = self.phys if self.phys is not None else [18 * (i + 1) for i in range(n)]
        unpacked = self.unpacked if self.unpacked is not None else [10 * (i + 1) for i in range(n)]

        def u32(value: int | None, default: int) -> bytes:
            return struct.pack("<I", default if value is None else value)

        out = b"".join(
            [
                self.ident, bytes([self.version]), self.xorb_hash,
                self.hash_ident, bytes([self.hash_version]), u32(self.n1, n), bytes(32) * n,
                self.bound_ident, bytes([self.bound_version]), u32(self.n2, n),
                struct.pack(f"<{len(phys)}I", *phys), struct.pack(f"<{len(unpacked)}I", *unpacked),
                u32(self.n3, n), u32(self.hashes_off, 52 + 40 * n), u32(self.bound_off, 40 + 8 * n), self.buffer,
                u32(self.info_length, 92 + 40 * n),
            ]
        )  # fmt: skip
        return out, 18 * n + len(out)


def _footer(n: int, **overrides: Any) -> tuple[bytes, int]:
    return Footer(n, **overrides).pack()


# -- sizes and known answers --------------------------------------------------------


def test_sizes() -> None:
    assert xorb.TAIL.size == xorb.TAIL_SIZE == 32
    assert xorb.footer_size(0) == 92
    assert xorb.footer_size(1) == 132
    assert xorb.footer_size(8192) == 92 + 40 * 8192


def test_writer_matches_hf_xet_hello_world() -> None:
    xorb_hash, data, chunk_hashes = writer.build_xorb([b"hello world"], 0)
    assert data == HELLO_XORB
    assert hashes.to_hex(xorb_hash) == "4e39378b9d359f118190557a1f44130219a54e5fcfa07bd96cf50b466fe651b1"
    assert chunk_hashes == [hashes.chunk_hash(b"hello world")]


def test_hello_world_footer() -> None:
    data = HELLO_XORB
    assert footer_length(data[-4:], len(data)) == 132
    layout = _parse(data)
    assert layout == XorbLayout(hashes.chunk_hash(b"hello world"), (19,), (11,), (hashes.chunk_hash(b"hello world"),))
    assert layout.num_chunks == 1
    # one-chunk example of 2.4: info_length 132, hashes offset 92, boundary offset 48
    assert struct.unpack_from("<III16sI", data, len(data) - 32)[1:3] == (92, 48)


def test_footer_offsets_from_end_point_at_the_sections() -> None:
    _, data, _ = writer.build_xorb(_chunks(7, 1), [0, 1, 2, 0, 1, 2, 0])
    size = len(data)
    n, hashes_off, bound_off = struct.unpack_from("<III", data, size - 32)
    assert n == 7
    assert data[size - 4 - hashes_off : size - 4 - hashes_off + 7] == b"XBLBHSH"
    assert data[size - 4 - bound_off : size - 4 - bound_off + 7] == b"XBLBBND"


# -- round trips ----------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 3, 5, 9, 10, 100])
@pytest.mark.parametrize("schemes", ["none", "lz4", "bg4", "mixed"])
def test_round_trip(n: int, schemes: str) -> None:
    chunks = _chunks(n, seed=n)
    scheme_list = {"none": [0] * n, "lz4": [1] * n, "bg4": [2] * n, "mixed": [i % 3 for i in range(n)]}[schemes]
    built = writer.pack_xorb(chunks, scheme_list)
    layout = _parse(built.data)
    assert layout.xorb_hash == built.xorb_hash == hashes.xorb_hash(zip(built.chunk_hashes, built.sizes, strict=True))
    assert layout.chunk_hashes == built.chunk_hashes
    assert layout.phys_ends == built.phys_ends
    assert layout.num_chunks == n
    total = 0
    for i, c in enumerate(chunks):
        assert layout.unpacked_start(i) == total
        total += len(c)
        assert layout.unpacked_ends[i] == total
        assert layout.chunk_size(i) == len(c)
        assert layout.phys_start(i) == built.phys_start(i)
    assert layout.range_size(0, n) == total
    # the header walk over the chunk section finds the same layout, without hashes
    bare = walk_headers(built.data[: built.phys_ends[-1]], where=W)
    assert bare == XorbLayout(None, layout.phys_ends, layout.unpacked_ends, None)


def test_chunk_at_and_range_size() -> None:
    built = writer.pack_xorb([b"a" * 10, b"b" * 5, b"c" * 1, b"d" * 7])
    layout = _parse(built.data)
    assert [layout.chunk_at(o) for o in range(23)] == [0] * 10 + [1] * 5 + [2] + [3] * 7
    assert layout.range_size(1, 3) == 6
    assert layout.range_size(3, 4) == 7


@pytest.mark.parametrize("verify", [True, False])
@pytest.mark.parametrize("footer", [True, False])
def test_a_chunk_run_gives_each_chunks_place_size_and_hash(verify: bool, footer: bool) -> None:
    chunks = _chunks(12, seed=4)
    built = writer.pack_xorb(chunks, [i % 3 for i in range(12)])
    layout = _parse(built.data) if footer else walk_headers(built.data[: built.phys_ends[-1]], where=W)
    for start, stop in [(0, 1), (0, 12), (3, 9), (11, 12)]:
        run = xorb.chunk_run(layout, start, stop, verify=verify)
        hashes = layout.chunk_hashes if verify else None
        assert run.chunks() == stop - start and run.first == start
        for k, i in enumerate(range(start, stop)):
            assert (run.phys[k], run.phys[k + 1]) == (layout.phys_start(i), layout.phys_ends[i])
            assert run.size(k) == layout.chunk_size(i) == run.sizes()[k]
            assert run.expected(k) == (hashes[i] if hashes else None)
    for start, stop in [(-1, 2), (3, 2), (0, 13)]:
        with pytest.raises(IndexError):
            xorb.chunk_run(layout, start, stop, verify=verify)


def test_check_in_place_decodes_a_compressed_payload_as_long_as_its_data() -> None:
    """Chunks read straight to their places (as decode workers read raw-sized runs): a payload whose header
    says LZ4 is decoded where it lies; a wrong hash, or a header that disagrees with the footer, fails."""
    tricky = writer.lz4_as_long_as_its_data(1000)
    chunks = [b"r" * 1000, tricky, bytes(range(256)) * 4]
    built = writer.pack_xorb(chunks, [0, 1, 0])
    layout = _parse(built.data)
    run = xorb.chunk_run(layout, 0, 3, verify=True)
    spans = list(pairwise(run.phys))  # each chunk's [header start, payload end)
    assert run.stored_raw_sized()

    def placed(data: bytes) -> tuple[bytes, memoryview]:
        headers = b"".join(data[a : a + 8] for a, _ in spans)
        return headers, memoryview(bytearray(b"".join(data[a + 8 : b] for a, b in spans)))

    headers, out = placed(built.data)
    assert xorb.check_in_place(headers, run, out) and bytes(out) == b"".join(chunks)
    headers, out = placed(built.data)
    assert run.hashes is not None
    wrong = run._replace(hashes=run.hashes[:32] + bytes(32) + run.hashes[64:])
    assert not xorb.check_in_place(headers, wrong, out)
    short = bytearray(built.data)
    short[spans[2][0] : spans[2][0] + 8] = writer.chunk_header(999, 0, 999)
    headers, out = placed(bytes(short))
    assert not xorb.check_in_place(headers, run, out)


def test_footerless_xorb_walk() -> None:
    chunks = _chunks(20, seed=3)
    schemes = [i % 3 for i in range(20)]
    with_footer = writer.pack_xorb(chunks, schemes)
    bare = writer.pack_xorb(chunks, schemes, footer=False)
    assert bare.data == with_footer.data[: with_footer.phys_ends[-1]]
    assert bare.xorb_hash == with_footer.xorb_hash
    layout = walk_headers(bare.data, where=W)
    assert layout.xorb_hash is None and layout.chunk_hashes is None
    assert layout.phys_ends == with_footer.phys_ends
    assert layout.unpacked_ends == _parse(with_footer.data).unpacked_ends
    assert _load(bare.data) == layout


# -- footer_length -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("length", "file_size", "want"),
    [
        (92, 96, 92),
        (132, 155, 132),
        (132, 136, 132),
        (132, 135, None),  # L + 4 > size
        (91, 1000, None),  # shorter than any footer
        (0, 1000, None),
        (93, 1000, None),  # not 92 + 40n
        (131, 1000, None),
        (0xFFFFFFFF, 1000, None),
        (92 + 40 * 0x06000000, 2**40, 92 + 40 * 0x06000000),
    ],
)
def test_footer_length(length: int, file_size: int, want: int | None) -> None:
    assert footer_length(struct.pack("<I", length), file_size) == want


@pytest.mark.parametrize(("tail", "size"), [(b"", 0), (b"\x84\0\0", 155), (b"\x84\0\0\0\0", 155), (b"\x84\0\0\0", 3)])
def test_footer_length_bad_input(tail: bytes, size: int) -> None:
    assert footer_length(tail, size) is None


# -- parse_footer: every check ------------------------------------------------------


def test_synthetic_footer_parses() -> None:
    footer, size = _footer(3)
    layout = parse_footer(footer, size, where=W)
    assert layout.phys_ends == (18, 36, 54)
    assert layout.unpacked_ends == (10, 20, 30)


BAD_FOOTERS: dict[str, tuple[dict[str, Any], str]] = {
    "ident": ({"ident": b"XETBLOX"}, "XETBLOB"),
    "version 0": ({"version": 0}, "version 0"),
    "version 2": ({"version": 2}, "version 2"),
    "hash ident": ({"hash_ident": b"XBLBHSX"}, "XBLBHSH"),
    "hash version": ({"hash_version": 1}, "XBLBHSH"),
    "boundary ident": ({"bound_ident": b"XBLBBNX"}, "XBLBBND"),
    "boundary version": ({"bound_version": 0}, "XBLBBND"),
    "n1": ({"n1": 2}, "counts 2 chunks"),
    "n2": ({"n2": 4}, "counts 4 chunks"),
    "n3": ({"n3": 2}, "info_length"),
    "n1 huge": ({"n1": 0xFFFFFFFF}, "counts"),
    "n3 huge": ({"n3": 0xFFFFFFFF}, "info_length"),
    "info_length": ({"info_length": 92 + 40 * 3 + 40}, "info_length"),
    "hashes offset": ({"hashes_off": 52 + 40 * 3 + 1}, "section offsets"),
    "boundary offset": ({"bound_off": 40 + 8 * 3 - 8}, "section offsets"),
    "phys not increasing": ({"phys": [18, 18, 54]}, "physical range"),
    "phys decreasing": ({"phys": [36, 18, 54]}, "physical range"),
    "first phys too small": ({"phys": [8, 36, 54]}, "physical range"),
    "last phys not footer start": ({"phys": [18, 36, 53]}, "footer starts"),
    "last phys past footer": ({"phys": [18, 36, 55]}, "footer starts"),
    "empty chunk": ({"unpacked": [10, 10, 30]}, "a chunk holds"),
    "unpacked decreasing": ({"unpacked": [10, 20, 15]}, "a chunk holds"),
    "first unpacked zero": ({"unpacked": [0, 20, 30]}, "a chunk holds"),
    # Physical offsets are not covered by any hash: no chunk may claim more than a header can declare.
    "huge physical chunk": ({"phys": [18, 1 << 30, (1 << 30) + 18]}, "physical range"),
    "huge decoded chunk": ({"unpacked": [10, 10 + 131073, 10 + 131083]}, "a chunk holds"),
}


@pytest.mark.parametrize("case", sorted(BAD_FOOTERS))
def test_bad_footer(case: str) -> None:
    overrides, message = BAD_FOOTERS[case]
    footer, size = _footer(3, **overrides)
    with pytest.raises(XorbFormatError, match=message):
        parse_footer(footer, size, where="xorb 1234")


def test_zero_chunk_footer() -> None:
    footer, size = _footer(0)
    assert len(footer) == 96
    with pytest.raises(XorbFormatError, match="0 chunks"):
        parse_footer(footer, size + 10, where=W)


def test_too_many_chunks() -> None:
    n = xorb.MAX_CHUNKS + 1
    footer, size = _footer(n)
    with pytest.raises(XorbFormatError, match=str(n)):
        parse_footer(footer, size, where=W)


def test_buffer_bytes_are_not_validated() -> None:
    # bytes 0-3 may hold an upload nonce, 4-15 are reserved (2.4): tolerated
    footer, size = _footer(2, buffer=b"\x01\x02\x03\x04" + bytes(12))
    assert parse_footer(footer, size, where=W).num_chunks == 2


def test_huge_chunk_count_rejected_without_allocation() -> None:
    built = writer.pack_xorb(_chunks(3))
    data = bytearray(built.data)
    struct.pack_into("<I", data, len(data) - 32, 0xFFFFFFFF)  # the third n copy
    tracemalloc.start()
    try:
        with pytest.raises(XorbFormatError):
            _parse(bytes(data))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000


def test_every_truncated_footer_prefix() -> None:
    built = writer.pack_xorb(_chunks(5, 7), [0, 1, 2, 1, 0])
    footer = _footer_of(built.data)
    for k in range(len(footer)):
        with pytest.raises(XorbFormatError):
            parse_footer(footer[:k], len(built.data), where=W)
        with pytest.raises(XorbFormatError):
            parse_footer(footer[:k], len(built.data) - (len(footer) - k), where=W)


def test_every_truncated_footer_suffix() -> None:
    built = writer.pack_xorb(_chunks(5, 8), [2, 1, 0, 1, 2])
    footer = _footer_of(built.data)
    for k in range(1, len(footer)):
        with pytest.raises(XorbFormatError):
            parse_footer(footer[k:], len(built.data), where=W)


def _load(data: bytes) -> XorbLayout:
    """What a reader does with a xorb file's bytes (2.5): footer if detected, else walk."""
    length = footer_length(data[-4:], len(data))
    if length is not None and data[len(data) - length - 4 :].startswith(b"XETBLOB"):
        return parse_footer(data[len(data) - length - 4 :], len(data), where=W)
    return walk_headers(data, where=W)


@pytest.mark.parametrize("footer", [True, False])
def test_every_truncated_xorb_prefix(footer: bool) -> None:
    built = writer.pack_xorb(_chunks(4, 9, max_size=200), [0, 1, 2, 0], footer=footer)
    full = _load(built.data)
    for k in range(len(built.data)):
        try:
            layout = _load(built.data[:k])
        except XorbFormatError:
            continue
        # only a prefix that ends on a chunk boundary is a valid (footer-less) xorb
        assert k in built.phys_ends
        m = built.phys_ends.index(k) + 1
        assert layout.phys_ends == full.phys_ends[:m]
        assert layout.unpacked_ends == full.unpacked_ends[:m]


# -- walk_headers -------------------------------------------------------------------


def test_walk_empty() -> None:
    with pytest.raises(XorbFormatError, match="empty"):
        walk_headers(b"", where=W)


@pytest.mark.parametrize("extra", [b"\0", b"\0" * 7, writer.chunk_header(100, 0, 100), b"X"])
def test_walk_trailing_bytes(extra: bytes) -> None:
    data = writer.pack_xorb([b"abc", b"defg"], footer=False).data
    with pytest.raises(XorbFormatError):
        walk_headers(data + extra, where=W)


def test_walk_stops_at_a_footer() -> None:
    built = writer.pack_xorb([b"abc", b"defg"])
    with pytest.raises(XorbFormatError, match="version 88"):  # 'X' of XETBLOB
        walk_headers(built.data, where=W)


def test_walk_truncated_payload() -> None:
    data = writer.pack_xorb([b"abc" * 100, b"defg"], footer=False).data
    with pytest.raises(XorbFormatError, match="payload bytes"):
        walk_headers(data[:-1], where=W)


def test_walk_too_many_chunks() -> None:
    one = writer.encode_chunk(b"z", 0)
    data = one * (xorb.MAX_CHUNKS + 1)
    with pytest.raises(XorbFormatError, match="more than"):
        walk_headers(data, where=W)
    assert walk_headers(one * 1000, where=W).num_chunks == 1000


def test_walk_bad_header_in_the_middle() -> None:
    built = writer.pack_xorb([b"abc", b"defg", b"hi"], footer=False)
    data = bytearray(built.data)
    data[built.phys_ends[0] + 4] = 7  # scheme of chunk 1
    with pytest.raises(XorbFormatError, match="scheme 7"):
        walk_headers(bytes(data), where=W)


def test_check_in_place_of_raw_chunks_checks_every_hash() -> None:
    """All raw (the whole-run check): one wrong hash anywhere fails the run; unverified, the headers suffice."""
    chunks = [bytes([k]) * (500 + k) for k in range(5)]
    built = writer.pack_xorb(chunks, [0] * 5)
    run = xorb.chunk_run(_parse(built.data), 0, 5, verify=True)
    assert run.stored_raw_sized() and run.hashes is not None
    headers = b"".join(built.data[a : a + 8] for a in run.phys[:-1])

    def out() -> memoryview:
        return memoryview(bytearray(b"".join(chunks)))

    assert xorb.check_in_place(headers, run, out())
    for k in range(5):
        wrong = run._replace(hashes=run.hashes[: 32 * k] + bytes(32) + run.hashes[32 * (k + 1) :])
        assert not xorb.check_in_place(headers, wrong, out())
    damaged = out()
    damaged[700] ^= 1
    assert not xorb.check_in_place(headers, run, damaged)
    assert xorb.check_in_place(headers, run._replace(hashes=None), damaged)


@pytest.mark.parametrize("scheme", [0, 1, 2])
def test_check_run_names_just_the_chunks_that_fail(scheme: int) -> None:
    """``check_run`` agrees with ``decode_run`` chunk by chunk: None where it decodes to its bytes, the same
    error where it does not, and a damaged chunk does not stop the check of the others."""
    chunks = _chunks(6, seed=scheme + 40)
    built = writer.pack_xorb(chunks, [scheme] * 6)
    layout = _parse(built.data)
    data = bytearray(built.data[: built.phys_ends[-1]])
    assert xorb.check_run(data, built.xorb_hash, layout, 0, 6) == [None] * 6
    assert xorb.decode_run(data, built.xorb_hash, layout, 0, 6, verify=True) == chunks
    data[built.phys_ends[2] - 1] ^= 0x40  # the last stored byte of chunk 2
    tail = data[built.phys_start(1) :]  # the bytes of chunks [1, 6), read from chunk 1 on
    found = xorb.check_run(tail, built.xorb_hash, layout, 1, 5)
    assert found[0] is None and found[2:] == [None, None]
    expected = xorb.decode_run(tail, built.xorb_hash, layout, 1, 5, verify=True)[1]
    assert isinstance(found[1], XetfsError) and str(found[1]) == str(expected), found


def test_a_chunk_that_fails_names_its_byte_in_the_xorb() -> None:
    """A damaged header or payload of a run read from its first chunk on: the message names the chunk and
    where it lies in the xorb, not in the bytes read."""
    built = writer.pack_xorb(_chunks(4, seed=7), [1] * 4)  # LZ4
    layout = _parse(built.data)
    at, start = built.phys_start(2), built.phys_start(1)
    expected = {"header": f" chunk 2: chunk header at offset {at} has version 9, expected 0",
                "payload": f" chunk 2 at byte {at} of the xorb: payload is not an LZ4 frame"}  # fmt: skip
    for damage, says in expected.items():
        data = bytearray(built.data[: built.phys_ends[-1]])
        if damage == "header":
            data[at] = 9
        else:
            data[at + 8 : built.phys_ends[2]] = bytes(built.phys_ends[2] - at - 8)
        found = xorb.check_run(data[start:], built.xorb_hash, layout, 1, 4)  # chunks 1, 2 and 3
        assert found[0] is None and found[2] is None, found
        assert says in str(found[1]) and str(at - start) not in str(found[1]), (damage, found[1])
