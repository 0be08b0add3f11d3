"""Shard parsing (docs/format.md 3, 8): pinned layouts, a known answer from
hf_xet, round trips through the test writer, every truncated prefix and
every structural check.
"""

from __future__ import annotations

import hashlib
import random
import struct
import tracemalloc
from pathlib import Path

import pytest
from helpers import writer
from helpers.writer import FileSpec, TermSpec, XorbSpec

from xetfs.base import hashes
from xetfs.base.errors import ShardFormatError
from xetfs.format import shard
from xetfs.format.shard import CasChunk, Term, parse_shard

pytestmark = pytest.mark.unit

W = "shard test"
HELLO_SHARD = "f5df023b52902f6516da9b41432161b304f443c655fcd235af1f4426b5ae5f29"  # hf_xet 1.8.0, b"hello world"


def _h(i: int) -> bytes:
    return hashes.chunk_hash(i.to_bytes(4, "little"))


def _xorb(seed: int, n: int) -> XorbSpec:
    rng = random.Random(seed)
    hs = tuple(_h(seed * 1000 + i) for i in range(n))
    return XorbSpec(hashes.xorb_hash(zip(hs, [1] * n, strict=True)), hs, tuple(rng.randint(1, 9999) for _ in range(n)))


def _term(x: XorbSpec, start: int, end: int) -> TermSpec:
    return TermSpec(
        x.xorb_hash, start, end, sum(x.sizes[start:end]), hashes.verification_hash(x.chunk_hashes[start:end])
    )


def _sample() -> tuple[list[FileSpec], list[XorbSpec]]:
    xa, xb = _xorb(1, 5), _xorb(2, 3)
    files = [
        FileSpec(_h(100), (_term(xa, 0, 5),), hashlib.sha256(b"one").digest()),
        FileSpec(_h(101), (_term(xa, 1, 3), _term(xb, 0, 3), _term(xa, 1, 3)), hashlib.sha256(b"two").digest()),
        FileSpec(hashes.ZERO_HASH, (), hashlib.sha256(b"").digest()),
        FileSpec(_h(102), tuple(_term(xb, i, i + 1) for i in (2, 1, 0)), hashlib.sha256(b"three").digest()),
    ]
    return files, [xa, xb]


# -- pinned layouts ---------------------------------------------------------------


def test_struct_sizes() -> None:
    for s in (shard.HEADER, shard.FILE_HEADER, shard.TERM, shard.CAS_HEADER, shard.CAS_CHUNK):
        assert s.size == shard.RECORD_SIZE == 48
    assert shard.FOOTER.size == shard.FOOTER_SIZE == 200
    assert len(shard.BOOKEND) == 48
    for s in (writer.SHARD_HEADER, writer.FILE_HEADER, writer.TERM, writer.CAS_HEADER, writer.CAS_CHUNK):
        assert s.size == 48
    assert writer.SHARD_FOOTER.size == 200


def test_magic_and_bookend() -> None:
    tag = "48 46 52 65 70 6F 4D 65 74 61 44 61 74 61 00 55 69 67 45 6A 7B 81 57 83 A5 BD D9 5C CD D1 4A A9"
    assert bytes.fromhex(tag) == shard.MAGIC  # docs/format.md 3.2
    assert shard.MAGIC[:15] == b"HFRepoMetaData\0"
    assert shard.MAGIC == writer.SHARD_MAGIC
    assert b"\xff" * 32 + bytes(16) == shard.BOOKEND


# -- known answer: the shard hf_xet 1.8.0 wrote for b"hello world" ---------------------


def test_hello_world_matches_hf_xet(tmp_path: Path) -> None:
    b = writer.StoreBuilder(tmp_path)
    file_hash = b.add_file(b"hello world")
    (path,) = b.finish()
    assert path.name == HELLO_SHARD + ".mdb"  # the name is the hash of every byte
    data = path.read_bytes()
    assert hashlib.sha256(data).hexdigest() == "4c79ad7d0d005cdf28e6c36f266c710324dd925b1dbb3914dc32307503bbc539"
    assert len(data) == 632
    s = parse_shard(data, where=W)
    chunk = hashes.chunk_hash(b"hello world")
    (f,) = s.files
    assert f.file_hash == file_hash
    assert hashes.to_hex(f.file_hash) == "f15edd43b7e85cfd25e2758ffe13b99fdd09dfa817e8d9f6548722a7a126db7f"
    assert f.flags == shard.FLAG_VERIFICATION | shard.FLAG_METADATA_EXT
    assert list(f.terms) == [Term(chunk, 11, 0, 1)]
    assert f.verification == (hashes.verification_hash([chunk]),)
    assert f.sha256 is not None
    assert hashes.sha256_from_stored(f.sha256) == hashlib.sha256(b"hello world").hexdigest()
    assert f.size == 11
    (x,) = s.xorbs
    assert x.xorb_hash == chunk and x.num_bytes == 11
    assert list(x.chunks) == [CasChunk(chunk, 0, 11)]
    assert s.footer is not None
    ft = s.footer
    assert (ft.version, ft.file_info_offset, ft.cas_info_offset) == (1, 48, 288)
    assert ft.file_lookup_offset == ft.xorb_lookup_offset == ft.chunk_lookup_offset == ft.footer_offset == 432
    assert (ft.file_lookup_num, ft.xorb_lookup_num, ft.chunk_lookup_num) == (0, 0, 0)
    assert (ft.hmac_key, ft.created, ft.expiry) == (bytes(32), 0, 0)
    assert (ft.materialized_bytes, ft.stored_bytes) == (11, 11)


def test_empty_file_only_shard_is_440_bytes() -> None:
    _, data = writer.build_shard([FileSpec(hashes.ZERO_HASH, ())], [])
    assert len(data) == 440
    s = parse_shard(data, where=W)
    (f,) = s.files
    assert f.file_hash == hashes.ZERO_HASH and len(f.terms) == 0 and f.size == 0
    assert f.verification == () and f.sha256 == bytes(32)
    assert s.xorbs == ()


# -- round trips ------------------------------------------------------------------


@pytest.mark.parametrize("footer", [True, False])
@pytest.mark.parametrize("verification", [True, False])
@pytest.mark.parametrize("sha256", [True, False])
def test_round_trip(footer: bool, verification: bool, sha256: bool) -> None:
    files, xorbs = _sample()
    _, data = writer.build_shard(files, xorbs, footer=footer, verification=verification, sha256=sha256)
    s = parse_shard(data, where=W)
    want = sorted(files, key=lambda f: hashes.to_hex(f.file_hash))
    assert [f.file_hash for f in s.files] == [f.file_hash for f in want]
    for got, spec in zip(s.files, want, strict=True):
        assert list(got.terms) == [Term(t.xorb_hash, t.size, t.start, t.end) for t in spec.terms]
        assert len(got.terms) == len(spec.terms)
        assert [got.terms[i] for i in range(len(got.terms))] == list(got.terms)
        assert got.size == spec.size
        assert got.verification == (tuple(t.verification for t in spec.terms) if verification else ())
        if sha256:
            assert got.sha256 is not None and hashes.sha256_from_stored(got.sha256) == spec.sha256.hex()
        else:
            assert got.sha256 is None
    assert [x.xorb_hash for x in s.xorbs] == sorted((x.xorb_hash for x in xorbs), key=hashes.to_hex)
    for got_x in s.xorbs:
        spec_x = next(x for x in xorbs if x.xorb_hash == got_x.xorb_hash)
        assert got_x.num_bytes == sum(spec_x.sizes)
        starts = [sum(spec_x.sizes[:i]) for i in range(len(spec_x.sizes))]
        assert list(got_x.chunks) == [
            CasChunk(h, st, sz) for h, st, sz in zip(spec_x.chunk_hashes, starts, spec_x.sizes, strict=True)
        ]
        assert len(got_x.chunks) == len(spec_x.sizes)
    if footer:
        assert s.footer is not None
        assert s.footer.materialized_bytes == sum(f.size for f in files)
        assert s.footer.stored_bytes == sum(sum(x.sizes) for x in xorbs)
        assert s.footer.footer_offset == len(data) - 200
    else:
        assert s.footer is None


def test_term_table_indexing() -> None:
    files, xorbs = _sample()
    _, data = writer.build_shard(files, xorbs)
    s = parse_shard(data, where=W)
    terms = next(f.terms for f in s.files if len(f.terms) == 3 and f.file_hash == _h(101))
    assert terms[0] == Term(xorbs[0].xorb_hash, sum(xorbs[0].sizes[1:3]), 1, 3)
    assert len(terms.raw()) == 3 * 48
    for bad in (-1, 3, 100):
        with pytest.raises(IndexError):
            terms[bad]


def test_no_files_no_xorbs() -> None:
    _, data = writer.build_shard([], [])
    assert len(data) == 48 * 3 + 200
    s = parse_shard(data, where=W)
    assert s.files == () and s.xorbs == ()
    _, bare = writer.build_shard([], [], footer=False)
    assert len(bare) == 144
    assert parse_shard(bare, where=W).footer is None


def test_lookup_tables_are_accepted() -> None:
    # A shard-cache style shard: 1 file entry, 1 xorb entry, 2 chunk entries in the tables.
    files, xorbs = _sample()
    _, data = writer.build_shard(files[:1], xorbs[:1])
    body, foot = data[:-200], list(writer.SHARD_FOOTER.unpack(data[-200:]))
    tables = bytes(12) + bytes(12) + bytes(16) * 2
    end = len(body)
    foot[3:9] = [end, 1, end + 12, 1, end + 24, 2]
    foot[-1] = end + len(tables)
    s = parse_shard(body + tables + writer.SHARD_FOOTER.pack(*foot), where=W)
    assert s.footer is not None and s.footer.chunk_lookup_num == 2
    assert len(s.files) == 1


def test_verification_and_ext_flags_per_record() -> None:
    # flags other than bits 30/31 are ignored
    files, xorbs = _sample()
    _, data = writer.build_shard(files[:1], xorbs, verification=False, sha256=False)
    raw = bytearray(data)
    struct.pack_into("<I", raw, 48 + 32, 0x00000001)
    assert parse_shard(bytes(raw), where=W).files[0].flags == 1


# -- rejections -------------------------------------------------------------------


def _shard(footer: bool = True) -> bytes:
    files, xorbs = _sample()
    return writer.build_shard(files, xorbs, footer=footer)[1]


def _with_footer_field(data: bytes, index: int, value: object) -> bytes:
    fields = list(writer.SHARD_FOOTER.unpack(data[-200:]))
    fields[index] = value
    return data[:-200] + writer.SHARD_FOOTER.pack(*fields)


@pytest.mark.parametrize("footer", [True, False])
def test_every_truncated_prefix(footer: bool) -> None:
    data = _shard(footer)
    for k in range(len(data)):
        with pytest.raises(ShardFormatError):
            parse_shard(data[:k], where=W)


@pytest.mark.parametrize("extra", [b"\0", bytes(48), bytes(200)])
def test_trailing_bytes(extra: bytes) -> None:
    with pytest.raises(ShardFormatError):
        parse_shard(_shard(footer=False) + extra, where=W)
    with pytest.raises(ShardFormatError):
        parse_shard(_shard(footer=True) + extra, where=W)


def test_bad_magic() -> None:
    data = bytearray(_shard())
    data[5] ^= 1
    with pytest.raises(ShardFormatError, match="magic"):
        parse_shard(bytes(data), where=W)


@pytest.mark.parametrize("version", [0, 1, 3, 2**64 - 1])
def test_bad_header_version(version: int) -> None:
    data = bytearray(_shard())
    struct.pack_into("<Q", data, 32, version)
    with pytest.raises(ShardFormatError, match="version"):
        parse_shard(bytes(data), where=W)


@pytest.mark.parametrize("footer_size", [1, 100, 199, 201, 2**64 - 1])
def test_bad_footer_size(footer_size: int) -> None:
    data = bytearray(_shard())
    struct.pack_into("<Q", data, 40, footer_size)
    with pytest.raises(ShardFormatError, match="footer size"):
        parse_shard(bytes(data), where=W)


def test_header_says_no_footer_but_there_is_one() -> None:
    data = bytearray(_shard())
    struct.pack_into("<Q", data, 40, 0)
    with pytest.raises(ShardFormatError, match="unexpected bytes"):
        parse_shard(bytes(data), where=W)


def test_header_says_footer_but_there_is_none() -> None:
    data = bytearray(_shard(footer=False))
    struct.pack_into("<Q", data, 40, 200)
    with pytest.raises(ShardFormatError):
        parse_shard(bytes(data), where=W)


@pytest.mark.parametrize(("start", "end", "size"), [(3, 3, 10), (4, 3, 10), (0, 5, 4), (0, 1, 0)])
def test_bad_term(start: int, end: int, size: int) -> None:
    x = _sample()[1][0]
    spec = FileSpec(_h(7), (TermSpec(x.xorb_hash, start, end, size),))
    _, data = writer.build_shard([spec], [])
    with pytest.raises(ShardFormatError, match="chunk range"):
        parse_shard(data, where=W)


def test_zero_terms_but_non_zero_hash() -> None:
    _, data = writer.build_shard([FileSpec(_h(7), ())], [])
    with pytest.raises(ShardFormatError, match="no terms"):
        parse_shard(data, where=W)


@pytest.mark.parametrize("section", ["file", "cas"])
def test_malformed_bookend(section: str) -> None:
    data = _shard()
    footer = writer.SHARD_FOOTER.unpack(data[-200:])
    at = footer[2] - 48 if section == "file" else footer[3] - 48
    assert data[at : at + 32] == b"\xff" * 32
    bad = bytearray(data)
    bad[at + 40] = 1
    with pytest.raises(ShardFormatError, match="bookend"):
        parse_shard(bytes(bad), where=W)


def test_huge_term_count_rejected_without_allocation() -> None:
    data = bytearray(_shard())
    struct.pack_into("<I", data, 48 + 36, 0xFFFFFFFF)  # first file record's num_entries
    tracemalloc.start()
    try:
        with pytest.raises(ShardFormatError, match="4294967295"):
            parse_shard(bytes(data), where="shard xyz.mdb")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000


def test_huge_cas_chunk_count_rejected_without_allocation() -> None:
    data = _shard()
    cas_at = writer.SHARD_FOOTER.unpack(data[-200:])[2]
    bad = bytearray(data)
    struct.pack_into("<I", bad, cas_at + 36, 0xFFFFFFFF)
    tracemalloc.start()
    try:
        with pytest.raises(ShardFormatError, match="4294967295"):
            parse_shard(bytes(bad), where=W)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000


def test_term_count_one_too_many() -> None:
    # Claims one more term than present: the verification records get read as
    # terms, so the count check alone cannot catch it; the walk must still fail.
    files, xorbs = _sample()
    _, data = writer.build_shard(files[:1], xorbs[:1])
    bad = bytearray(data)
    struct.pack_into("<I", bad, 48 + 36, 2)
    with pytest.raises(ShardFormatError):
        parse_shard(bytes(bad), where=W)


FOOTER_FIELDS = {
    "version": (0, 2),
    "file_info_offset": (1, 96),
    "cas_info_offset": (2, 0),
    "file_lookup_offset": (3, 0),
    "file_lookup_num": (4, 1),
    "xorb_lookup_offset": (5, 7),
    "xorb_lookup_num": (6, 2**64 - 1),
    "chunk_lookup_offset": (7, 0),
    "chunk_lookup_num": (8, 1),
    "footer_offset": (16, 0),
}


@pytest.mark.parametrize("name", sorted(FOOTER_FIELDS))
def test_bad_footer_field(name: str) -> None:
    index, value = FOOTER_FIELDS[name]
    with pytest.raises(ShardFormatError, match="footer"):
        parse_shard(_with_footer_field(_shard(), index, value), where=W)


@pytest.mark.parametrize("index", [9, 10, 11, 12, 13, 14, 15])  # hmac, timestamps, reserved, byte totals
def test_bookkeeping_footer_fields_are_not_validated(index: int) -> None:
    value: object = b"\x01" * (32 if index == 9 else 48) if index in (9, 12) else 12345
    s = parse_shard(_with_footer_field(_shard(), index, value), where=W)
    assert len(s.files) == 4
