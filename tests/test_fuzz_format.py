"""Property tests: random and mutated bytes may only raise the declared errors.

Every parser in ``xetfs.format`` either succeeds or raises a ``FormatError``
subclass (never IndexError, struct.error, ValueError, RuntimeError...), and a
verified read never returns wrong bytes.  Examples are derandomized so CI
runs are reproducible.  For a deeper search set ``XETFS_FUZZ_EXAMPLES``
(e.g. 20000) in the environment.
"""

from __future__ import annotations

import hashlib
import os
import random
import struct
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import pytest
import trio
from helpers import writer
from helpers.writer import FileSpec, StoreBuilder, TermSpec, XorbSpec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from xetfs.base import hashes
from xetfs.base.errors import FormatError, IntegrityError, ShardFormatError, XorbFormatError
from xetfs.format.chunk import MAX_UNCOMPRESSED, decode_chunk, parse_chunk_header
from xetfs.format.shard import MAGIC, parse_shard
from xetfs.format.xorb import XorbLayout, footer_length, parse_footer, walk_headers
from xetfs.read.reader import Reader
from xetfs.storage import index
from xetfs.storage.store import Store

pytestmark = pytest.mark.unit

T = TypeVar("T")
EXAMPLES = int(os.environ.get("XETFS_FUZZ_EXAMPLES", "250"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


def only_format_errors(kind: type[FormatError], fn: Callable[[], T]) -> T | None:
    """Run ``fn``; a ``kind`` error means "rejected" (None); anything else escapes and fails the test."""
    try:
        return fn()
    except kind:
        return None


# -- valid objects to mutate --------------------------------------------------------


def _valid_shard(footer: bool) -> bytes:
    rng = random.Random(1)
    hs = tuple(hashes.chunk_hash(bytes([i])) for i in range(6))
    sizes = tuple(rng.randint(1, 5000) for _ in hs)
    xa = XorbSpec(hashes.xorb_hash(zip(hs[:4], sizes[:4], strict=True)), hs[:4], sizes[:4])
    xb = XorbSpec(hashes.xorb_hash(zip(hs[4:], sizes[4:], strict=True)), hs[4:], sizes[4:])

    def term(x: XorbSpec, a: int, b: int) -> TermSpec:
        return TermSpec(x.xorb_hash, a, b, sum(x.sizes[a:b]), hashes.verification_hash(x.chunk_hashes[a:b]))

    files = [
        FileSpec(hashes.chunk_hash(b"f1"), (term(xa, 0, 4),), hashlib.sha256(b"1").digest()),
        FileSpec(hashes.chunk_hash(b"f2"), (term(xb, 0, 2), term(xa, 1, 2)), hashlib.sha256(b"2").digest()),
        FileSpec(hashes.ZERO_HASH, ()),
    ]
    return writer.build_shard(files, [xa, xb], footer=footer)[1]


SHARDS = [_valid_shard(True), _valid_shard(False)]
XORB = writer.pack_xorb([random.Random(2).randbytes(300), b"ab" * 200, bytes(100), b"xyz" * 70, b"q"], [0, 1, 2, 1, 0])
BARE_XORB = writer.pack_xorb([b"hello" * 40, random.Random(3).randbytes(50), b"\0" * 77], [1, 0, 2], footer=False)


@st.composite
def mutated(draw: st.DrawFn, data: bytes) -> bytes:
    """``data`` with a few bytes changed, and maybe cut short, extended or with a slice removed."""
    out = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        if not out:
            break
        pos = draw(st.integers(0, len(out) - 1))
        out[pos] = draw(st.sampled_from([0x00, 0xFF, 0x01, 0x80, 0x58, out[pos] ^ 0xFF, out[pos] ^ 1]))
    action = draw(st.sampled_from(["none", "truncate", "extend", "cut"]))
    if action == "truncate":
        del out[draw(st.integers(0, len(out))) :]
    elif action == "extend":
        out += draw(st.binary(min_size=1, max_size=64))
    elif action == "cut" and out:
        a = draw(st.integers(0, len(out) - 1))
        del out[a : a + draw(st.integers(1, 100))]
    return bytes(out)


def _u32_poke(data: bytes, draw: st.DrawFn) -> bytes:
    """Overwrite one aligned 4-byte field with an extreme value (counts, offsets, lengths)."""
    out = bytearray(data)
    pos = draw(st.integers(0, max(0, len(out) // 4 - 1))) * 4
    value = draw(st.sampled_from([0, 1, 2, 0xFFFFFFFF, 0x7FFFFFFF, 0x80000000, len(data), len(data) // 2]))
    out[pos : pos + 4] = struct.pack("<I", value)[: len(out) - pos]
    return bytes(out)


@st.composite
def poked(draw: st.DrawFn, data: bytes) -> bytes:
    return _u32_poke(data, draw)


# -- shards -----------------------------------------------------------------------


def _check_shard(data: bytes) -> None:
    shard = only_format_errors(ShardFormatError, lambda: parse_shard(data, where="fuzz"))
    if shard is not None:  # accepted: using the records must not fail either
        for f in shard.files:
            list(f.terms)
            assert f.size >= 0
        for x in shard.xorbs:
            list(x.chunks)


@FUZZ
@given(st.binary(max_size=2000))
def test_shard_random_bytes(data: bytes) -> None:
    _check_shard(data)


@FUZZ
@given(st.binary(max_size=1200), st.sampled_from([0, 200, 1, 2**64 - 1]))
def test_shard_random_body_behind_a_valid_header(body: bytes, footer_size: int) -> None:
    _check_shard(MAGIC + struct.pack("<QQ", 2, footer_size) + body)


@FUZZ
@given(st.sampled_from([0, 1]).flatmap(lambda i: mutated(SHARDS[i])))
def test_shard_mutations(data: bytes) -> None:
    _check_shard(data)


@FUZZ
@given(st.sampled_from([0, 1]).flatmap(lambda i: poked(SHARDS[i])))
def test_shard_extreme_fields(data: bytes) -> None:
    _check_shard(data)


@FUZZ
@given(st.data())
def test_shard_record_shuffle(data: st.DataObject) -> None:
    """Records of a valid shard in another order, repeated or dropped."""
    shard = SHARDS[1]
    records = [shard[i : i + 48] for i in range(48, len(shard), 48)]
    picked = data.draw(st.lists(st.sampled_from(records), max_size=20))
    _check_shard(shard[:48] + b"".join(picked))


# -- xorbs ------------------------------------------------------------------------


def _load(data: bytes) -> XorbLayout | None:
    """What Store.load_layout does with the bytes, minus hashing: footer if detected, else walk."""
    length = footer_length(data[-4:], len(data)) if len(data) >= 4 else None
    if length is not None:
        assert 92 <= length <= len(data) - 4 and (length - 92) % 40 == 0
        footer = data[len(data) - length - 4 :]
        if footer.startswith(b"XETBLOB"):
            return only_format_errors(XorbFormatError, lambda: parse_footer(footer, len(data), where="fuzz"))
    return only_format_errors(XorbFormatError, lambda: walk_headers(data, where="fuzz"))


def _check_layout(layout: XorbLayout | None, size: int) -> None:
    if layout is None:
        return
    n = layout.num_chunks
    assert n >= 1 and len(layout.unpacked_ends) == n
    assert all(b > a for a, b in zip((0, *layout.phys_ends), layout.phys_ends, strict=False))
    assert all(b > a for a, b in zip((0, *layout.unpacked_ends), layout.unpacked_ends, strict=False))
    assert layout.phys_ends[-1] <= size
    if layout.chunk_hashes is not None:
        assert len(layout.chunk_hashes) == n


@FUZZ
@given(st.binary(max_size=4), st.integers(0, 2**64))
def test_footer_length_never_raises(tail: bytes, size: int) -> None:
    length = footer_length(tail, size)
    assert length is None or (92 <= length <= size - 4 and (length - 92) % 40 == 0)


@FUZZ
@given(st.binary(max_size=1500))
def test_xorb_random_bytes(data: bytes) -> None:
    _check_layout(_load(data), len(data))


@FUZZ
@given(st.one_of(mutated(XORB.data), poked(XORB.data)))
def test_xorb_mutations(data: bytes) -> None:
    _check_layout(_load(data), len(data))


@FUZZ
@given(st.data())
def test_footer_mutations(data: st.DataObject) -> None:
    size = len(XORB.data)
    start = XORB.phys_ends[-1]
    footer = data.draw(st.one_of(mutated(XORB.data[start:]), poked(XORB.data[start:])))
    file_size = data.draw(st.sampled_from([size, size + 1, len(footer), start + len(footer), 2**40]))
    layout = only_format_errors(XorbFormatError, lambda: parse_footer(footer, file_size, where="fuzz"))
    if layout is not None:
        _check_layout(layout, file_size)
        assert layout.phys_ends[-1] == file_size - len(footer)


@FUZZ
@given(st.one_of(mutated(BARE_XORB.data), poked(BARE_XORB.data), st.binary(max_size=600)))
def test_walk_headers_mutations(data: bytes) -> None:
    layout = only_format_errors(XorbFormatError, lambda: walk_headers(data, where="fuzz"))
    if layout is not None:
        _check_layout(layout, len(data))
        assert layout.phys_ends[-1] == len(data)


# -- chunks -----------------------------------------------------------------------

PAYLOADS = [writer.encode_payload(b"some text, some text, some more text " * 30, s) for s in (1, 2)]
PAYLOADS += [writer.encode_payload(random.Random(4).randbytes(700), 1), writer.encode_payload(bytes(70_000), 2)]


def _decode(scheme: int, payload: bytes, size: int) -> None:
    out = only_format_errors(XorbFormatError, lambda: decode_chunk(scheme, payload, size, where="fuzz"))
    if out is not None:
        assert len(out) == size


@FUZZ
@given(st.integers(0, 3), st.binary(max_size=300), st.integers(0, MAX_UNCOMPRESSED))
def test_decode_random(scheme: int, payload: bytes, size: int) -> None:
    _decode(scheme, payload, size)


@FUZZ
@given(
    st.integers(1, 2),
    st.sampled_from(range(len(PAYLOADS))).flatmap(lambda i: mutated(PAYLOADS[i])),
    st.sampled_from([1110, 700, 70_000, 1, MAX_UNCOMPRESSED]),
)
def test_decode_mutated_frames(scheme: int, payload: bytes, size: int) -> None:
    _decode(scheme, payload, size)


@FUZZ
@given(st.binary(min_size=0, max_size=12), st.integers(0, 12))
def test_chunk_header_random(raw: bytes, offset: int) -> None:
    header = only_format_errors(XorbFormatError, lambda: parse_chunk_header(raw, offset, where="fuzz"))
    if header is not None:
        assert header.version == 0 and header.scheme in (0, 1, 2)
        assert 0 < header.uncompressed_length <= MAX_UNCOMPRESSED


# -- store level: a flipped payload byte ----------------------------------------------


class CorruptStore:
    """A writer-built store: several files over two footered xorbs (mixed schemes)."""

    def __init__(self, root: Path) -> None:
        rng = random.Random(5)
        b = StoreBuilder(root, max_xorb_chunks=12)
        self.contents: dict[bytes, bytes] = {}
        for size, chunk in [(5000, 1000), (700, 350), (9000, 1500), (40, 40), (4000, 1000), (3000, 1000)]:
            content = rng.randbytes(size // 2) + bytes(rng.choice(b"xy") for _ in range(size - size // 2))
            self.contents[b.add_file(content, chunk_size=chunk, scheme=[0, 1, 2])] = content
        b.finish()
        self.builder = b
        assert len(b.xorbs) == 2

    def touches(self, file_hash: bytes, offset: int, size: int, xorb_hash: bytes, chunk: int) -> bool:
        """Whether file bytes ``[offset, offset + size)`` come from ``chunk`` of ``xorb_hash``."""
        built = self.builder.xorbs[xorb_hash]
        pos = 0
        for t in self.builder.files[file_hash].terms:
            for i in range(t.start, t.end):
                n = self.builder.xorbs[t.xorb_hash].sizes[i]
                if t.xorb_hash == xorb_hash and i == chunk and pos < offset + size and offset < pos + n:
                    return True
                pos += n
        assert built.sizes[chunk] > 0
        return False


@contextmanager
def flipped(path: Path, offset: int, bit: int) -> Iterator[None]:
    """Flip one bit of a file for the duration of the block."""
    original = path.read_bytes()
    data = bytearray(original)
    data[offset] ^= 1 << bit
    path.write_bytes(bytes(data))
    try:
        yield
    finally:
        path.write_bytes(original)


@pytest.fixture(scope="module")
def corrupt_store(tmp_path_factory: pytest.TempPathFactory) -> CorruptStore:
    return CorruptStore(tmp_path_factory.mktemp("corrupt-store"))


@settings(
    max_examples=max(60, EXAMPLES // 20),
    deadline=None,
    derandomize=True,
)
@given(st.data())
def test_flipped_payload_byte(corrupt_store: CorruptStore, data: st.DataObject) -> None:
    cs = corrupt_store
    xorb_hash = data.draw(st.sampled_from(sorted(cs.builder.xorbs)))
    built = cs.builder.xorbs[xorb_hash]
    chunk = data.draw(st.integers(0, len(built.sizes) - 1))
    start, end = built.payload_range(chunk)
    offset = data.draw(st.integers(start, end - 1))
    bit = data.draw(st.integers(0, 7))
    ranges = [(fh, o, s) for fh, c in cs.contents.items() for o, s in [(0, len(c)), (len(c) // 3, len(c) // 3 + 1)]]
    with flipped(cs.builder.xorb_paths[xorb_hash], offset, bit):
        store = Store.open(cs.builder.root)
        try:
            assert store.load_layout(xorb_hash).chunk_hashes == built.chunk_hashes  # footer untouched
            idx = index.build(parse_shard(store.read_shard(f), where=f.name) for f in store.shard_files())
            reader = Reader(idx, store)
            failures = 0
            for fh, o, s in ranges:
                entry = idx.get(fh)
                assert entry is not None
                want = cs.contents[fh][o : o + s]
                try:
                    got = bytes(trio.run(reader.read, entry, o, s))
                except (IntegrityError, XorbFormatError):
                    assert cs.touches(fh, o, s, xorb_hash, chunk), "an unaffected range failed"
                    failures += 1
                    continue
                assert got == want  # a verified read never returns wrong bytes
            errors = reader.statistics().errors
            assert errors.integrity + errors.format == failures
        finally:
            store.close()


def test_flipped_payload_byte_in_a_footerless_xorb(tmp_path: Path) -> None:
    """Without a footer the chunk hashes come from decoding: the whole xorb is refused."""
    b = StoreBuilder(tmp_path, xorb_footer=False)
    fa = b.add_file(b"a" * 3000, chunk_size=1000, scheme=1)
    b.seal_xorb()
    fb = b.add_file(b"b" * 3000, chunk_size=1000, scheme=2)
    b.finish()
    xa = b.files[fa].terms[0].xorb_hash
    _, end = b.xorbs[xa].payload_range(2)
    with flipped(b.xorb_paths[xa], end - 6, 0):
        store = Store.open(tmp_path)
        try:
            with pytest.raises((IntegrityError, XorbFormatError)):
                store.load_layout(xa)
            idx = index.build(parse_shard(store.read_shard(f), where=f.name) for f in store.shard_files())
            reader = Reader(idx, store)
            entry_a, entry_b = idx.get(fa), idx.get(fb)
            assert entry_a is not None and entry_b is not None
            with pytest.raises((IntegrityError, XorbFormatError)):
                trio.run(reader.read, entry_a, 0, 10)
            assert bytes(trio.run(reader.read, entry_b, 0, 3000)) == b"b" * 3000
        finally:
            store.close()
