"""Xet hashes: the 32-byte hash type, its hex form and the keyed blake3 hashes.

Pure functions (docs/format.md section 1).  A hash is kept as the 32 raw bytes that
are stored on disk; ``to_hex`` gives the Xet hex form used in file names and by
hf_xet (each 8-byte group byte-reversed), which is *not* ``bytes.hex()``.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterable, Sequence

import blake3

HASH_SIZE = 32

DATA_KEY = bytes.fromhex("6697f5775b9550de3135cbaca597181c9de421109beb2b58b4d0b04b93adf229")
INTERNAL_NODE_KEY = bytes.fromhex("017ec5c7a5472996fd946666b48a02e65ddd536f37c76dd2f86352e64a53713f")
VERIFICATION_KEY = bytes.fromhex("7f1857d6ce56ed66127ff913e7a5c3f3a4cd26d5b5db49e64124987f28fb94c3")
FILE_KEY = bytes(HASH_SIZE)

ZERO_HASH = bytes(HASH_SIZE)
MARKER_HASH = b"\xff" * HASH_SIZE

_HEX_RE = re.compile(r"[0-9a-fA-F]{64}")


_WORDS = struct.Struct("<4Q")  # a hash as four little-endian u64
_HEX_FORMAT = "%016x%016x%016x%016x"


def to_hex(h: bytes) -> str:
    """Xet hex form of a 32-byte hash: each 8-byte group printed as a LE u64."""
    if len(h) != HASH_SIZE:
        raise ValueError(f"a hash is {HASH_SIZE} bytes, got {len(h)}")
    return _HEX_FORMAT % _WORDS.unpack(h)


def from_hex(s: str) -> bytes:
    """Inverse of ``to_hex``; raises ValueError on anything but 64 hex digits."""
    if not is_hex(s):
        raise ValueError(f"not a 64-digit hex hash: {s[:80]!r}")
    b = bytes.fromhex(s)
    return b"".join(b[i : i + 8][::-1] for i in range(0, HASH_SIZE, 8))


def is_hex(s: str) -> bool:
    """True when ``s`` is exactly 64 hex digits (either case)."""
    return _HEX_RE.fullmatch(s) is not None


def chunk_hash(data: bytes | bytearray | memoryview) -> bytes:
    """Hash of one chunk's *uncompressed* bytes (section 1.3)."""
    return blake3.blake3(data, key=DATA_KEY).digest()


def _cut(level: Sequence[tuple[bytes, int]], start: int) -> int:
    """Width of the Merkle group that starts at ``start`` (section 1.4)."""
    remaining = len(level) - start
    if remaining <= 2:
        return remaining
    end = min(9, remaining)
    for i in range(2, end):
        if level[start + i][0][24] & 3 == 0:
            return i + 1
    return end


def merkle_root(pairs: Iterable[tuple[bytes, int]]) -> bytes:
    """Aggregate ``(hash, size)`` pairs into one node hash (xorb hash).

    Empty input gives the zero hash; a single pair gives its hash unchanged.
    """
    level = list(pairs)
    if not level:
        return ZERO_HASH
    while len(level) > 1:
        lines = _node_lines(level)  # a xorb has ~1000 chunks: this loop is on the read path
        nxt: list[tuple[bytes, int]] = []
        start = 0
        while start < len(level):
            end = start + _cut(level, start)
            node = blake3.blake3("".join(lines[start:end]).encode(), key=INTERNAL_NODE_KEY).digest()
            nxt.append((node, sum([size for _, size in level[start:end]])))
            start = end
        level = nxt
    return level[0][0]


def _node_lines(level: Sequence[tuple[bytes, int]]) -> list[str]:
    """``"<hex> : <size>\n"`` for every pair; the hex of all hashes is made in one pass."""
    words = 4 * len(level)
    hexes = struct.pack(f">{words}Q", *struct.unpack(f"<{words}Q", b"".join([h for h, _ in level]))).hex()
    return [f"{hexes[64 * i : 64 * i + 64]} : {size}\n" for i, (_, size) in enumerate(level)]


def xorb_hash(pairs: Iterable[tuple[bytes, int]]) -> bytes:
    """Hash of a xorb from its chunks' ``(hash, uncompressed size)``."""
    return merkle_root(pairs)


def file_hash(pairs: Iterable[tuple[bytes, int]]) -> bytes:
    """Hash of a file from all its chunks in file order (section 1.5)."""
    pairs = list(pairs)
    if not pairs:
        return ZERO_HASH
    return blake3.blake3(merkle_root(pairs), key=FILE_KEY).digest()


def verification_hash(chunk_hashes: Iterable[bytes]) -> bytes:
    """Term verification hash over the raw chunk hashes of a range (section 1.6)."""
    return blake3.blake3(b"".join(chunk_hashes), key=VERIFICATION_KEY).digest()


def sha256_from_stored(stored: bytes) -> str:
    """The ordinary sha256 hex digest from a shard's group-reversed copy (3.3)."""
    return to_hex(stored)
