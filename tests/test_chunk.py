"""Chunk headers and payload decoding (docs/format.md 2.2, 2.3): known answers,
round trips through the test writer, and malformed input.
"""

from __future__ import annotations

import random
import struct

import lz4.frame
import pytest
from helpers import writer

from xetfs.base.errors import XorbFormatError
from xetfs.format import chunk
from xetfs.format.chunk import ChunkHeader, decode_chunk, parse_chunk_header

pytestmark = pytest.mark.unit

W = "test"


def _data(kind: str, n: int, seed: int = 0) -> bytes:
    rng = random.Random(f"{kind}-{n}-{seed}")
    if kind == "random":
        return rng.randbytes(n)
    if kind == "zeros":
        return bytes(n)
    if kind == "text":
        words = [b"xet ", b"chunk ", b"shard ", b"xorb ", b"hash\n", b"lz4 "]
        out = bytearray()
        while len(out) < n:
            out += rng.choice(words)
        return bytes(out[:n])
    if kind == "floats":  # float32-like: slowly varying high bytes, noisy low bytes
        vals = [1.0 + i / 1000 + rng.random() / 1e4 for i in range(n // 4 + 1)]
        return struct.pack(f"<{len(vals)}f", *vals)[:n]
    raise AssertionError(kind)


# -- header -------------------------------------------------------------------


def test_header_size() -> None:
    assert chunk.HEADER_SIZE == 8
    assert writer.CHUNK_HEADER.size == 8


def test_header_known_answer() -> None:
    # first chunk of hf_xet's xorb for b"hello world": scheme 0, 11 -> 11 bytes
    raw = bytes.fromhex("000b0000000b0000")
    assert parse_chunk_header(raw, 0, where=W) == ChunkHeader(0, 11, 0, 11)
    assert writer.chunk_header(11, 0, 11) == raw


def test_header_u24_fields_are_little_endian() -> None:
    raw = bytes([0, 0x03, 0x02, 0x01, 1, 0x06, 0x05, 0x01])
    assert parse_chunk_header(raw, 0, where=W) == ChunkHeader(0, 0x010203, 1, 0x010506)


def test_header_at_offset_and_in_memoryview() -> None:
    raw = b"junk" + writer.chunk_header(5, 2, 9) + b"tail"
    assert parse_chunk_header(memoryview(raw), 4, where=W) == ChunkHeader(0, 5, 2, 9)
    assert parse_chunk_header(bytearray(raw), 4, where=W) == ChunkHeader(0, 5, 2, 9)


@pytest.mark.parametrize(
    ("clen", "scheme", "ulen"),
    [(1, 0, 1), (131072, 0, 131072), (262144, 1, 131072), (1, 2, 131072), (262144, 2, 1)],
)
def test_header_limits_accepted(clen: int, scheme: int, ulen: int) -> None:
    assert parse_chunk_header(writer.chunk_header(clen, scheme, ulen), 0, where=W) == ChunkHeader(0, clen, scheme, ulen)


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (writer.chunk_header(10, 0, 10, version=1), "version"),
        (writer.chunk_header(10, 0, 10, version=255), "version"),
        (writer.chunk_header(10, 3, 10), "scheme"),
        (writer.chunk_header(10, 99, 10), "scheme"),
        (writer.chunk_header(10, 255, 10), "scheme"),
        (writer.chunk_header(10, 1, 0), "uncompressed"),
        (writer.chunk_header(10, 1, 131073), "uncompressed"),
        (writer.chunk_header(10, 1, 0xFFFFFF), "uncompressed"),
        (writer.chunk_header(0, 1, 10), "payload"),
        (writer.chunk_header(262145, 1, 10), "payload"),
        (writer.chunk_header(0xFFFFFF, 2, 10), "payload"),
        (writer.chunk_header(10, 0, 11), "payload length"),
        (writer.chunk_header(11, 0, 10), "payload length"),
    ],
)
def test_header_rejected(raw: bytes, why: str) -> None:
    with pytest.raises(XorbFormatError, match=why):
        parse_chunk_header(raw, 0, where="xorb abc")
    with pytest.raises(XorbFormatError, match="xorb abc"):
        parse_chunk_header(raw, 0, where="xorb abc")


@pytest.mark.parametrize("n", range(8))
def test_truncated_header(n: int) -> None:
    raw = writer.chunk_header(11, 0, 11)[:n]
    with pytest.raises(XorbFormatError, match="truncated chunk header"):
        parse_chunk_header(raw, 0, where=W)
    with pytest.raises(XorbFormatError, match="truncated chunk header"):
        parse_chunk_header(b"x" * 16 + raw, 16, where=W)


def test_header_offset_past_end() -> None:
    with pytest.raises(XorbFormatError):
        parse_chunk_header(b"\0" * 8, 100, where=W)


# -- BG4 ------------------------------------------------------------------------


def test_bg4_known_answer() -> None:
    # n = 10: q, r = 2, 2 -> groups 0 and 1 have three bytes, groups 2 and 3 two.
    assert chunk.bg4_split(b"abcdefghij") == b"aeibfjcgdh"
    assert chunk.bg4_regroup(b"aeibfjcgdh") == b"abcdefghij"
    assert writer.bg4_split(b"abcdefghij") == b"aeibfjcgdh"


@pytest.mark.parametrize("n", [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 1021, 1022, 1023, 1024])
def test_bg4_round_trip_all_remainders(n: int) -> None:
    data = _data("random", n)
    grouped = chunk.bg4_split(data)
    assert grouped == writer.bg4_split(data)
    assert len(grouped) == n
    assert chunk.bg4_regroup(grouped) == data
    assert chunk.bg4_regroup(memoryview(grouped)) == data


# -- decoding: round trips --------------------------------------------------------

SIZES = [1, 2, 3, 4, 5, 6, 7, 8, 63, 64, 65, 1000, 4097, 65535, 65536, 65537, 100_001, 131071, 131072]


@pytest.mark.parametrize("scheme", [0, 1, 2])
@pytest.mark.parametrize("kind", ["random", "zeros", "text", "floats"])
@pytest.mark.parametrize("n", SIZES)
def test_round_trip(scheme: int, kind: str, n: int) -> None:
    data = _data(kind, n)
    encoded = writer.encode_chunk(data, scheme)
    header = parse_chunk_header(encoded, 0, where=W)
    assert header == ChunkHeader(0, len(encoded) - 8, scheme, n)
    out = decode_chunk(header.scheme, encoded[8:], header.uncompressed_length, where=W)
    assert bytes(out) == data
    out = decode_chunk(header.scheme, memoryview(encoded)[8:], header.uncompressed_length, where=W)
    assert bytes(out) == data


@pytest.mark.parametrize("n", [4, 5, 6, 7, 4096, 4097, 4098, 4099])
def test_bg4_lengths_mod_4(n: int) -> None:
    data = _data("floats", n)
    payload = writer.encode_payload(data, chunk.SCHEME_BG4_LZ4)
    assert lz4.frame.decompress(payload) == writer.bg4_split(data)
    assert decode_chunk(2, payload, n, where=W) == data


def test_scheme_0_returns_the_payload_itself() -> None:
    payload = memoryview(b"abcdef")
    assert decode_chunk(0, payload, 6, where=W) is payload


def test_writer_frame_header_matches_xet_core() -> None:
    small = writer.lz4_frame(bytes(65536))
    big = writer.lz4_frame(bytes(65537))
    assert small[:4] == b"\x04\x22\x4d\x18" and big[:4] == b"\x04\x22\x4d\x18"
    assert (small[4], small[5]) == (0x60, 0x40)
    assert (big[4], big[5]) == (0x60, 0x50)
    assert small.endswith(b"\0\0\0\0") and big.endswith(b"\0\0\0\0")


def test_writer_fallback_to_scheme_0() -> None:
    data = _data("random", 5000)
    assert writer.encode_chunk(data, 1)[4] == 1
    stored = writer.encode_chunk(data, 1, fallback=True)
    assert stored[4] == 0 and stored[8:] == data
    assert writer.encode_chunk(bytes(5000), 1, fallback=True)[4] == 1


# -- decoding: frames other than xet-core's (slow path) ------------------------------

FRAME_VARIANTS = {
    "multi-block-64k": {"block_size": lz4.frame.BLOCKSIZE_MAX64KB, "block_linked": False},
    "linked-blocks": {"block_size": lz4.frame.BLOCKSIZE_MAX64KB, "block_linked": True},
    "content-checksum": {"content_checksum": True},
    "content-size": {"store_size": True},
    "block-checksum": {"block_checksum": True},
    "all-flags": {"content_checksum": True, "store_size": True, "block_checksum": True},
    "4mb-blocks": {"block_size": lz4.frame.BLOCKSIZE_MAX4MB},
}


@pytest.mark.parametrize("variant", sorted(FRAME_VARIANTS))
@pytest.mark.parametrize("n", [1, 1000, 65536, 100_000, 131072])
@pytest.mark.parametrize("kind", ["text", "random"])
def test_other_conforming_frames(variant: str, n: int, kind: str) -> None:
    data = _data(kind, n)
    options = {"block_linked": False, "content_checksum": False, "store_size": False, **FRAME_VARIANTS[variant]}
    frame = lz4.frame.compress(data, **options)
    assert decode_chunk(1, frame, n, where=W) == data
    bg4 = lz4.frame.compress(chunk.bg4_split(data), **options)
    assert decode_chunk(2, bg4, n, where=W) == data
    with pytest.raises(XorbFormatError):
        decode_chunk(1, frame, n + 1, where=W)
    with pytest.raises(XorbFormatError):
        decode_chunk(1, frame, n - 1, where=W)


def test_incompressible_block_stored_uncompressed() -> None:
    # lz4 marks a block that does not shrink as stored (bit 31 of its length).
    data = _data("random", 3000)
    frame = writer.lz4_frame(data)
    word = int.from_bytes(frame[7:11], "little")
    assert word & 0x80000000 and word & 0x7FFFFFFF == 3000
    assert decode_chunk(1, frame, 3000, where=W) == data
    with pytest.raises(XorbFormatError):
        decode_chunk(1, frame, 2999, where=W)


# -- decoding: wrong sizes, garbage, trailing bytes -----------------------------------


@pytest.mark.parametrize("scheme", [0, 1, 2])
@pytest.mark.parametrize("kind", ["random", "text"])
@pytest.mark.parametrize("delta", [-1000, -1, 1, 1000])
def test_wrong_size(scheme: int, kind: str, delta: int) -> None:
    data = _data(kind, 5000)
    payload = writer.encode_payload(data, scheme)
    with pytest.raises(XorbFormatError):
        decode_chunk(scheme, payload, 5000 + delta, where=W)


@pytest.mark.parametrize("scheme", [1, 2])
@pytest.mark.parametrize("size", [0, 131073, 2**31, 2**40])
def test_absurd_sizes_are_format_errors(scheme: int, size: int) -> None:
    payload = writer.encode_payload(_data("text", 100), scheme)
    with pytest.raises(XorbFormatError):
        decode_chunk(scheme, payload, size, where=W)


@pytest.mark.parametrize("scheme", [3, 99, -1])
def test_unknown_scheme(scheme: int) -> None:
    with pytest.raises(XorbFormatError, match="scheme"):
        decode_chunk(scheme, b"abc", 3, where=W)


@pytest.mark.parametrize("scheme", [1, 2])
@pytest.mark.parametrize(
    "payload",
    [b"", b"\x04", b"\x04\x22\x4d", b"\x04\x22\x4d\x18", b"not an lz4 frame at all", bytes(100), b"\xff" * 64],
)
def test_garbage_payload(scheme: int, payload: bytes) -> None:
    with pytest.raises(XorbFormatError):
        decode_chunk(scheme, payload, 100, where=W)


@pytest.mark.parametrize("scheme", [1, 2])
@pytest.mark.parametrize("kind", ["text", "random"])
def test_every_truncated_frame(scheme: int, kind: str) -> None:
    data = _data(kind, 2000)
    payload = writer.encode_payload(data, scheme)
    for k in range(len(payload)):
        with pytest.raises(XorbFormatError):
            decode_chunk(scheme, payload[:k], 2000, where=W)


@pytest.mark.parametrize("scheme", [1, 2])
@pytest.mark.parametrize("extra", [b"\0", b"\0\0\0\0", b"garbage", "frame"])
@pytest.mark.parametrize("flags", [{}, {"content_checksum": True}])
def test_trailing_bytes_after_frame(scheme: int, extra: bytes | str, flags: dict[str, bool]) -> None:
    data = _data("text", 3000)
    frame = lz4.frame.compress(
        chunk.bg4_split(data) if scheme == 2 else data,
        **{"block_linked": False, "content_checksum": False, "store_size": False, **flags},
    )
    tail = frame if extra == "frame" else extra
    assert isinstance(tail, bytes)
    with pytest.raises(XorbFormatError):
        decode_chunk(scheme, frame + tail, 3000, where=W)


def test_frame_with_two_frames_worth_of_output() -> None:
    # Two concatenated frames decode to twice the data; the cap must stop it.
    data = _data("text", 3000)
    frame = writer.lz4_frame(data)
    with pytest.raises(XorbFormatError):
        decode_chunk(1, frame + frame, 6000, where=W)


def test_corrupt_block_is_a_format_error_or_wrong_bytes() -> None:
    # Flipping a byte inside a compressed block either breaks decoding (format
    # error) or yields other bytes of the right length (caught by the chunk hash).
    data = _data("text", 5000)
    frame = writer.lz4_frame(data)
    rng = random.Random(5)
    for _ in range(300):
        bad = bytearray(frame)
        pos = rng.randrange(7, len(frame) - 4)
        bad[pos] ^= 1 << rng.randrange(8)
        try:
            out = decode_chunk(1, bytes(bad), 5000, where=W)
        except XorbFormatError:
            continue
        assert len(out) == 5000
