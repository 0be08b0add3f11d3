"""Unit tests of the pure parts of ``xetfs serve``: reconstruction plans, ranges, signatures, tokens, trees."""

from __future__ import annotations

import itertools
import os
import random
import stat
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xetfs.base.errors import IntegrityError
from xetfs.format.xorb import XorbLayout
from xetfs.serve import hub
from xetfs.serve.access import TokenFileError, UserTokens
from xetfs.serve.common import BadRange, byte_range
from xetfs.serve.reconstruction import Term, plan, v1_answer, v2_answer
from xetfs.serve.signing import KeyFileError, Signer, load_key
from xetfs.storage.catalogue import Content, Repo, Revision

pytestmark = pytest.mark.unit

# -- reconstruction plans -------------------------------------------------------------------


def make_layout(rng: random.Random, name: bytes, chunks: int) -> tuple[XorbLayout, bytes]:
    """A layout of ``chunks`` chunks of random sizes (stored sizes differ from decoded ones) and its decoded bytes."""
    phys, unpacked, p, u = [], [], 0, 0
    for _ in range(chunks):
        size = rng.randint(1, 50)
        u += size
        p += 8 + rng.randint(1, 60)
        phys.append(p)
        unpacked.append(u)
    return XorbLayout(name, tuple(phys), tuple(unpacked), None), rng.randbytes(u)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 2**32), st.integers(1, 400))
def test_a_plan_rebuilds_the_range_and_fits_the_client(seed: int, max_fetch: int) -> None:
    rng = random.Random(seed)
    xorbs = {}
    for k in range(rng.randint(1, 3)):
        name = bytes([k]) * 32
        xorbs[name] = make_layout(rng, name, rng.randint(1, 12))
    terms, content = [], b""
    for _ in range(rng.randint(1, 8)):  # terms may repeat chunks of a xorb, as deduplicated files do
        name = rng.choice(list(xorbs))
        layout, decoded = xorbs[name]
        first = rng.randrange(layout.num_chunks)
        stop = rng.randint(first + 1, layout.num_chunks)
        terms.append(Term(name, first, stop, layout.range_size(first, stop)))
        content += decoded[layout.unpacked_start(first) : layout.unpacked_ends[stop - 1]]
    start = rng.randrange(len(content))
    end = rng.randint(start + 1, len(content))
    layouts = {n: layout for n, (layout, _) in xorbs.items()}
    p = plan(terms, layouts, start, end, max_fetch=max_fetch)
    rebuilt = b""
    for t in p.terms:
        layout, decoded = xorbs[t.xorb]
        assert t.size == layout.range_size(t.first, t.stop)
        rebuilt += decoded[layout.unpacked_start(t.first) : layout.unpacked_ends[t.stop - 1]]
        holders = [f for f in p.fetches if f.xorb == t.xorb and f.first <= t.first and t.stop <= f.stop]
        assert len(holders) == 1  # every term inside exactly one fetch range
    assert rebuilt[p.offset_into_first_range : p.offset_into_first_range + end - start] == content[start:end]
    assert p.offset_into_first_range < p.terms[0].size
    for _, fetches in itertools.groupby(p.fetches, key=lambda f: f.xorb):
        spans = [(f.first, f.stop) for f in fetches]
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))  # disjoint: no two start alike
    for f in p.fetches:
        layout = layouts[f.xorb]
        assert (f.byte_start, f.byte_end) == (layout.phys_start(f.first), layout.phys_ends[f.stop - 1])
        assert f.byte_end - f.byte_start <= max_fetch or f.stop - f.first == 1
        assert any(t.xorb == f.xorb and f.first <= t.first < f.stop for t in p.terms)  # none unused


def test_a_plan_trims_to_whole_chunks() -> None:
    layout = XorbLayout(b"x" * 32, (20, 40, 60, 80), (10, 20, 30, 40), None)
    p = plan([Term(b"x" * 32, 0, 4, 40)], {b"x" * 32: layout}, 15, 25, max_fetch=1000)
    assert (p.offset_into_first_range, p.terms) == (5, (Term(b"x" * 32, 1, 3, 20),))
    doc = v1_answer(p, {f: "u" for f in p.fetches})
    (fetch,) = doc["fetch_info"][next(iter(doc["fetch_info"]))]  # type: ignore[index, call-overload]
    assert fetch == {"range": {"start": 1, "end": 3}, "url": "u", "url_range": {"start": 0, "end": 39}}  # (its own)
    doc2 = v2_answer(p, {f: "u" for f in p.fetches})
    ((_, [entry]),) = doc2["xorbs"].items()  # type: ignore[attr-defined]
    assert entry == {"url": "u", "ranges": [{"chunks": {"start": 1, "end": 3}, "bytes": {"start": 0, "end": 39}}]}


def test_a_term_whose_size_disagrees_with_its_chunks_is_refused() -> None:
    layout = XorbLayout(b"x" * 32, (20, 40), (10, 20), None)
    with pytest.raises(IntegrityError, match=r"chunks \[0, 2\) hold 20 bytes, the shard's term says 21"):
        plan([Term(b"x" * 32, 0, 2, 21)], {b"x" * 32: layout}, 0, 5)


# -- ranges -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "size", "expected"),
    [
        (None, 10, None),
        ("bytes=0-9", 10, (0, 10)),
        ("bytes=2-4", 10, (2, 5)),
        ("bytes=3-", 10, (3, 10)),
        ("bytes=-4", 10, (6, 10)),
        ("bytes=-40", 10, (0, 10)),
        ("bytes=0-268435455", 10, (0, 10)),  # hf_xet's blocks run past the end: clamped
    ],
)
def test_byte_ranges(value: str | None, size: int, expected: tuple[int, int] | None) -> None:
    assert byte_range(value, size) == expected


@pytest.mark.parametrize("value", ["bytes=10-12", "bytes=10-", "bytes=5-3", "bytes=0-1,4-5", "items=0-1", "bytes=-0",
                                   "bytes=-", "bytes=a-b"])  # fmt: skip
def test_ranges_that_cannot_be_served(value: str) -> None:
    with pytest.raises(BadRange):
        byte_range(value, 10)


# -- signatures, keys, tokens ------------------------------------------------------------------


def test_signatures_grant_what_they_sign_until_they_expire() -> None:
    signer = Signer(b"k" * 32)
    sig = signer.sign("xorb", ["abc", "0-3"], 1000)
    assert signer.problem("xorb", ["abc", "0-3"], 1000, sig, now=999) is None
    assert signer.problem("xorb", ["abc", "0-4"], 1000, sig, now=999) == "bad signature"
    assert signer.problem("xorb", ["abc", "0-3"], 1001, sig, now=999) == "bad signature"
    assert signer.problem("xorb", ["abc", "0-3"], 1000, sig, now=1010) == "expired 10 s ago"
    assert Signer(b"j" * 32).problem("xorb", ["abc", "0-3"], 1000, sig, now=999) == "bad signature"
    token = signer.token(2000)
    assert signer.token_problem(token, now=1999) is None
    assert signer.token_problem(token, now=2000) == "expired 0 s ago"
    assert signer.token_problem(token.replace(".", "x", 1), now=0) == "not a token of this server"
    assert Signer(b"j" * 32).token_problem(token, now=0) == "bad signature"
    assert token != signer.token(2000)  # each has its own nonce


def test_a_key_file_is_made_once_and_shared(tmp_path: Path) -> None:
    path = tmp_path / "key"
    key = load_key(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_key(path) == key and len(key) >= 32
    assert load_key(None) != load_key(None)
    assert sorted(os.listdir(tmp_path)) == ["key"]  # nothing left aside
    (tmp_path / "short").write_text("abc\n")
    with pytest.raises(KeyFileError, match="short: 3 bytes, at least 32"):
        load_key(tmp_path / "short")


def test_user_tokens(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text("# comment\n  alpha  \n\nbeta\n")
    tokens = UserTokens(path)
    assert tokens.allows("Bearer alpha") and tokens.allows("bearer beta")
    assert not tokens.allows(None) and not tokens.allows("Bearer gamma") and not tokens.allows("Basic alpha")
    assert not tokens.allows("Bearer # comment") and not tokens.allows("Bearer ")
    path.write_text("gamma\n")  # replaced: read again
    os.utime(path, ns=(1, 1))
    assert tokens.allows("Bearer gamma") and not tokens.allows("Bearer alpha")
    (tmp_path / "empty").write_text("# none\n")
    with pytest.raises(TokenFileError, match="no tokens"):
        UserTokens(tmp_path / "empty")


# -- catalogue lookups and tree listings ----------------------------------------------------------------


def tiny_repo() -> Repo:
    lfs, text = "a" * 64, "b" * 40
    files = {"README.md": text, "w/model.bin": lfs, "w/deep/x.txt": text}
    return Repo("model", "org/m", {"main": "c" * 40, "refs/pr/1": "c" * 40},
                {lfs: Content("1" * 64, 1000), text: Content("2" * 64, 5)}, {"c" * 40: Revision(files)})  # fmt: skip


def test_revisions_resolve_as_on_the_hub() -> None:
    repo = tiny_repo()
    for rev in ("main", "refs/heads/main", "refs/pr/1", "c" * 40):
        assert hub.resolve(repo, rev) == "c" * 40, rev
    assert hub.resolve(repo, "d" * 40) is None and hub.resolve(repo, "dev") is None


def test_tree_listings() -> None:
    repo, commit = tiny_repo(), "c" * 40
    top = list(hub.tree(repo, commit, "", recursive=False))
    assert [(e["type"], e["path"]) for e in top] == [("file", "README.md"), ("directory", "w")]
    everything = list(hub.tree(repo, commit, "", recursive=True))
    assert [e["path"] for e in everything] == ["README.md", "w", "w/deep", "w/deep/x.txt", "w/model.bin"]
    assert [e["path"] for e in hub.tree(repo, commit, "w", recursive=False)] == ["w/deep", "w/model.bin"]
    model = next(e for e in everything if e["path"] == "w/model.bin")
    pointer = hub.lfs_pointer("a" * 64, 1000)
    assert model["oid"] == hub.git_blob_id(pointer) and model["xetHash"] == "1" * 64
    assert model["lfs"] == {"oid": "a" * 64, "size": 1000, "pointerSize": len(pointer)}
    readme = everything[0]
    assert readme == {"type": "file", "path": "README.md", "size": 5, "oid": "b" * 40}  # regular: no Xet hash
    assert hub.is_directory(repo, commit, "w/deep") and not hub.is_directory(repo, commit, "w/model.bin")
    assert not hub.is_directory(repo, commit, "additional_chat_templates")
