"""The store index: every file hash -> its terms, and offset lookup.

Built from the file-info sections of all shards.  Terms are kept in compact
arrays (about 20 bytes a term) with prefix sums of term sizes, so
``locate`` finds the terms covering a byte range by bisection.  The same file
hash in several shards is one file (the first shard, in name order, wins).
Pure: the caller reads shards and hands over parsed ``Shard`` records.
"""

from __future__ import annotations

import hashlib
from array import array
from bisect import bisect_right
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

from xetfs.base import hashes
from xetfs.base.errors import IntegrityError, MissingObjectError
from xetfs.format.shard import FileRecord, Shard
from xetfs.format.xorb import XorbLayout

EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


@dataclass(frozen=True, slots=True)
class FileEntry:
    """One file of the store.  ``ends[i]`` is the file offset where term ``i`` ends."""

    file_hash: bytes
    size: int
    sha256: str | None  # ordinary hex digest, None when the shard records none
    xorb_ids: array[int]
    starts: array[int]
    stops: array[int]
    ends: array[int]

    @property
    def hex(self) -> str:
        return hashes.to_hex(self.file_hash)

    @property
    def num_terms(self) -> int:
        return len(self.ends)

    def term_start(self, i: int) -> int:
        return self.ends[i - 1] if i else 0

    @property
    def num_chunks(self) -> int:
        """Distinct chunks the file's terms reference (a chunk two terms share counts once)."""
        by_xorb: dict[int, list[tuple[int, int]]] = {}
        for xorb_id, start, stop in zip(self.xorb_ids, self.starts, self.stops, strict=True):
            by_xorb.setdefault(xorb_id, []).append((start, stop))
        total = 0
        for ranges in by_xorb.values():
            reach = 0  # chunks below it are counted
            for start, stop in sorted(ranges):
                if stop > reach:
                    total += stop - max(start, reach)
                    reach = stop
        return total


class TermSlice(NamedTuple):  # a tuple: one is made for every read
    """Bytes ``[offset, offset + length)`` of term ``term`` (chunks ``[start, stop)`` of ``xorb_hash``)."""

    term: int
    xorb_hash: bytes
    start: int
    stop: int
    term_size: int
    offset: int
    length: int


class Index:
    def __init__(self) -> None:
        self.files: dict[bytes, FileEntry] = {}
        self.xorbs: list[bytes] = []
        self._xorb_ids: dict[bytes, int] = {}
        self._term_refs = array("I")  # per xorb id: the terms that use it
        self.listed_xorbs: set[bytes] = set()
        self.shards = 0
        self.terms = 0

    def copy(self) -> Index:
        """An index with the same files, to which more shards can be added without changing this one.

        Entries are shared: their xorb ids mean the same in both (ids are only ever appended).
        """
        other = Index()
        other.files = dict(self.files)
        other.xorbs = list(self.xorbs)
        other._xorb_ids = dict(self._xorb_ids)
        other._term_refs = array("I", self._term_refs)
        other.listed_xorbs = set(self.listed_xorbs)
        other.shards, other.terms = self.shards, self.terms
        return other

    def add_shard(self, shard: Shard) -> None:
        """Add every file and CAS record of a parsed shard (first occurrence wins)."""
        self.shards += 1
        for record in shard.files:
            if record.file_hash not in self.files:
                self.files[record.file_hash] = self._entry(record)
        for cas in shard.xorbs:
            self.listed_xorbs.add(cas.xorb_hash)

    def _xorb_id(self, xorb_hash: bytes) -> int:
        xid = self._xorb_ids.get(xorb_hash)
        if xid is None:
            xid = self._xorb_ids[xorb_hash] = len(self.xorbs)
            self.xorbs.append(xorb_hash)
            self._term_refs.append(0)
        return xid

    def _entry(self, record: FileRecord) -> FileEntry:
        xorb_ids, starts, stops, ends = array("I"), array("I"), array("I"), array("Q")
        total = 0
        for term in record.terms:
            xid = self._xorb_id(term.xorb_hash)
            self._term_refs[xid] += 1
            xorb_ids.append(xid)
            starts.append(term.start)
            stops.append(term.end)
            total += term.size
            ends.append(total)
        self.terms += len(ends)
        sha = None
        if record.sha256 is not None:
            sha = hashes.sha256_from_stored(record.sha256)
            if total == 0 and record.sha256 == hashes.ZERO_HASH:
                sha = EMPTY_SHA256  # hf_xet records zeros for an empty file
        return FileEntry(record.file_hash, total, sha, xorb_ids, starts, stops, ends)

    @property
    def all_xorbs(self) -> set[bytes]:
        """Xorbs referenced by a term or listed in a CAS section."""
        return self.listed_xorbs.union(self.xorbs)

    def shared(self, xorb_hash: bytes) -> bool:
        """Whether more than one term (of one file or several) uses the xorb: its chunks may be read again."""
        xid = self._xorb_ids.get(xorb_hash)
        return xid is None or self._term_refs[xid] > 1

    def get(self, file_hash: bytes) -> FileEntry | None:
        return self.files.get(file_hash)

    def __iter__(self) -> Iterator[FileEntry]:
        return iter(self.files.values())

    def __len__(self) -> int:
        return len(self.files)

    def terms_of(self, entry: FileEntry) -> Iterator[tuple[bytes, int, int, int]]:
        """``(xorb hash, chunk start, chunk stop, size)`` for each term of ``entry``."""
        prev = 0
        for i, end in enumerate(entry.ends):
            yield self.xorbs[entry.xorb_ids[i]], entry.starts[i], entry.stops[i], end - prev
            prev = end

    def locate(self, entry: FileEntry, offset: int, size: int) -> list[TermSlice]:
        """The term pieces that cover file bytes ``[offset, offset + size)``, clipped to the file."""
        end = min(offset + size, entry.size)
        out: list[TermSlice] = []
        if offset >= end:
            return out
        i = bisect_right(entry.ends, offset)
        pos = offset
        while pos < end:
            t_start = entry.term_start(i)
            t_end = entry.ends[i]
            take = min(end, t_end) - pos
            xorb = self.xorbs[entry.xorb_ids[i]]
            out.append(TermSlice(i, xorb, entry.starts[i], entry.stops[i], t_end - t_start, pos - t_start, take))
            pos += take
            i += 1
        return out


def chunk_range(piece: TermSlice, layout: XorbLayout) -> tuple[int, int]:
    """The chunks ``[first, stop)`` of its xorb that a term slice's bytes lie in.

    Raises ``MissingObjectError`` when the term's chunk range lies beyond the
    xorb, ``IntegrityError`` when the term's size differs from its chunks'.
    """
    if piece.stop > layout.num_chunks:
        raise MissingObjectError(
            f"xorb {hashes.to_hex(piece.xorb_hash)}: term {piece.term} wants chunks [{piece.start}, {piece.stop}), "
            f"xorb has {layout.num_chunks}"
        )
    base = layout.unpacked_start(piece.start)
    actual = layout.unpacked_ends[piece.stop - 1] - base
    if actual != piece.term_size:
        raise IntegrityError(
            f"xorb {hashes.to_hex(piece.xorb_hash)}: term {piece.term} chunks [{piece.start}, {piece.stop}) "
            f"hold {actual} bytes, the shard says {piece.term_size}"
        )
    lo = base + piece.offset
    return layout.chunk_at(lo), layout.chunk_at(lo + piece.length - 1) + 1


def build(shards: Iterable[Shard]) -> Index:
    index = Index()
    for shard in shards:
        index.add_shard(shard)
    return index
