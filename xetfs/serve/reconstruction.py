"""The CAS reconstruction answer for bytes ``[start, end)`` of a file: pure.

What hf_xet expects (``QueryReconstructionResponse`` of xet-core, v1 and
v2): the file's terms trimmed to whole chunks around the range, each a
``(xorb, chunk range, decoded length)``; ``offset_into_first_range``, the
bytes of the first chunk before ``start``; and per xorb the chunk ranges to
fetch, each with a URL and the HTTP range (inclusive end) to ask of it.
Each URL here names its chunk range and serves just their serialized bytes,
so the HTTP range is relative to them: ``0`` to their length less one.
(hf_xet only sends it as ``Range`` and counts its length.)  So every URL is
a whole resource of its own, which a caching proxy can keep and cut ranges
from.

The client needs every term to lie inside one fetch range, and no two
fetch ranges of a xorb to start at the same chunk (it keys its blocks by
that chunk).  So the terms' chunk ranges are united per xorb, the unions
cut into pieces of at most ``max_fetch`` serialized bytes (whole chunks, at
least one), and the terms cut again where a piece ends.  The bound keeps
what the server must hold to check a range before sending it small.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from xetfs.base import hashes
from xetfs.base.errors import IntegrityError, MissingObjectError
from xetfs.base.settings import SERVE_MAX_FETCH
from xetfs.format.xorb import XorbLayout


@dataclass(frozen=True, slots=True)
class Term:
    """A term of a file as its shard records it: chunks ``[first, stop)`` of ``xorb``, ``size`` decoded bytes."""

    xorb: bytes
    first: int
    stop: int
    size: int


@dataclass(frozen=True, slots=True)
class Fetch:
    """Chunks ``[first, stop)`` of ``xorb``: serialized bytes ``[byte_start, byte_end)`` of the xorb."""

    xorb: bytes
    first: int
    stop: int
    byte_start: int
    byte_end: int


@dataclass(frozen=True, slots=True)
class Plan:
    offset_into_first_range: int
    terms: tuple[Term, ...]  # trimmed and cut; ``size`` is the decoded bytes of their whole chunks
    fetches: tuple[Fetch, ...]  # disjoint per xorb, sorted by xorb then chunk


def plan(
    terms: Sequence[Term],
    layouts: Mapping[bytes, XorbLayout],
    start: int,
    end: int,
    *,
    max_fetch: int = SERVE_MAX_FETCH,
) -> Plan:
    """The reconstruction of file bytes ``[start, end)`` (``0 <= start < end <= file size``).

    ``layouts`` holds the layout of every xorb of the terms under the range.
    Raises ``IntegrityError`` when a term's size differs from its chunks', and
    ``MissingObjectError`` when its chunks lie beyond its xorb.
    """
    trimmed: list[Term] = []
    first_offset = 0
    pos = 0
    for term in terms:
        if pos >= end:
            break
        t_end = pos + term.size
        if t_end <= start:
            pos = t_end
            continue
        layout = layouts[term.xorb]
        _check(term, layout)
        base = layout.unpacked_start(term.first) - pos  # decoded xorb offset minus file offset
        first, stop = term.first, term.stop
        if start > pos:
            first = layout.chunk_at(start + base)
        if end < t_end:
            stop = layout.chunk_at(end - 1 + base) + 1
        if not trimmed:
            first_offset = start - (layout.unpacked_start(first) - base)
        trimmed.append(Term(term.xorb, first, stop, layout.range_size(first, stop)))
        pos = t_end
    fetches = _fetches(trimmed, layouts, max_fetch)
    return Plan(first_offset, tuple(_cut(trimmed, fetches, layouts)), tuple(fetches))


def _check(term: Term, layout: XorbLayout) -> None:
    where = f"xorb {hashes.to_hex(term.xorb)}: chunks [{term.first}, {term.stop})"
    if not 0 <= term.first < term.stop <= layout.num_chunks:
        raise MissingObjectError(f"{where} of a term: the xorb has {layout.num_chunks} chunks")
    size = layout.range_size(term.first, term.stop)
    if size != term.size:
        raise IntegrityError(f"{where} hold {size} bytes, the shard's term says {term.size}")


def _fetches(terms: Sequence[Term], layouts: Mapping[bytes, XorbLayout], max_fetch: int) -> list[Fetch]:
    """United chunk ranges of ``terms`` per xorb, cut to at most ``max_fetch`` serialized bytes each."""
    by_xorb: dict[bytes, list[tuple[int, int]]] = {}
    for t in terms:
        by_xorb.setdefault(t.xorb, []).append((t.first, t.stop))
    out: list[Fetch] = []
    for xorb in sorted(by_xorb):
        layout = layouts[xorb]
        united: list[list[int]] = []
        for first, stop in sorted(by_xorb[xorb]):
            if united and first <= united[-1][1]:
                united[-1][1] = max(united[-1][1], stop)
            else:
                united.append([first, stop])
        for first, stop in united:
            lo = first
            while lo < stop:
                hi = lo + 1
                while hi < stop and layout.phys_ends[hi] - layout.phys_start(lo) <= max_fetch:
                    hi += 1
                out.append(Fetch(xorb, lo, hi, layout.phys_start(lo), layout.phys_ends[hi - 1]))
                lo = hi
    return out


def _cut(terms: Sequence[Term], fetches: Sequence[Fetch], layouts: Mapping[bytes, XorbLayout]) -> list[Term]:
    """``terms`` cut where a fetch range of their xorb ends, so each lies inside one."""
    bounds: dict[bytes, set[int]] = {}
    for f in fetches:
        bounds.setdefault(f.xorb, set()).add(f.stop)
    out: list[Term] = []
    for t in terms:
        layout = layouts[t.xorb]
        cuts = sorted(b for b in bounds[t.xorb] if t.first < b < t.stop)
        lo = t.first
        for hi in [*cuts, t.stop]:
            out.append(Term(t.xorb, lo, hi, layout.range_size(lo, hi)))
            lo = hi
    return out


# -- the JSON answers -------------------------------------------------------------------


def v1_answer(p: Plan, url: Mapping[Fetch, str]) -> dict[str, object]:
    """``QueryReconstructionResponse``: ``url[fetch]`` is where each fetch range is served."""
    fetch_info: dict[str, list[dict[str, object]]] = {}
    for f in p.fetches:
        fetch_info.setdefault(hashes.to_hex(f.xorb), []).append(
            {"range": {"start": f.first, "end": f.stop}, "url": url[f],
             "url_range": {"start": 0, "end": f.byte_end - f.byte_start - 1}}
        )  # fmt: skip
    return {"offset_into_first_range": p.offset_into_first_range, "terms": _terms(p), "fetch_info": fetch_info}


def v2_answer(p: Plan, url: Mapping[Fetch, str]) -> dict[str, object]:
    """``QueryReconstructionResponseV2``, one range per URL (so no multi-range requests come back)."""
    xorbs: dict[str, list[dict[str, object]]] = {}
    for f in p.fetches:
        xorbs.setdefault(hashes.to_hex(f.xorb), []).append(
            {"url": url[f], "ranges": [{"chunks": {"start": f.first, "end": f.stop},
                                        "bytes": {"start": 0, "end": f.byte_end - f.byte_start - 1}}]}
        )  # fmt: skip
    return {"offset_into_first_range": p.offset_into_first_range, "terms": _terms(p), "xorbs": xorbs}


def _terms(p: Plan) -> list[dict[str, object]]:
    return [
        {"hash": hashes.to_hex(t.xorb), "unpacked_length": t.size, "range": {"start": t.first, "end": t.stop}}
        for t in p.terms
    ]
