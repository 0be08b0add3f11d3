"""The names manifest: Hub listings, unsafe names, conflicts, garbage, round trips."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xetfs.base import hashes
from xetfs.base.errors import ManifestError
from xetfs.storage import manifest
from xetfs.storage.manifest import Manifest, ManifestFile, combine, dump_manifest, parse_manifest, path_problem

pytestmark = pytest.mark.unit

H1 = "a961cc336abf956bb689f545ea7d691ec2f156b97c4d103229835856e093916d"
H2 = "a761aca208d2c117c0ba1b37dece516ccab58ed5fc9ebcbfad5ae78a5f77e500"
SHA = "98ea6e4f216f2fb4b69fff9b3a44842c38686ca685f3f55dc48c5d3fb1107be4"


def f(path: str, xet: str = H1, **extra: Any) -> dict[str, Any]:
    return {"type": "file", "path": path, "xetHash": xet, **extra}


def d(path: str) -> dict[str, Any]:
    return {"type": "directory", "path": path}


def parse(entries: Any, source: str = "m.json") -> Manifest:
    return parse_manifest(json.dumps(entries).encode(), source=source)


def names(m: Manifest) -> list[str]:
    return [x.name for x in m.files]


# A listing as the Hub returns it (GET /api/models/<repo>/tree/main?recursive=true).
HUB_LISTING = [
    {"type": "file", "oid": "a6344aac8c09253b3b630fb776ae94478aa0275b", "size": 1519, "path": ".gitattributes"},
    {"type": "directory", "oid": "4b5e9a3d1c2f0e7d6c5b4a39281706f5e4d3c2b1", "size": 0, "path": "onnx"},
    {
        "type": "file",
        "oid": "ad0f3a1a8a8f5b7a3e0b3f2c2d1e0f9a8b7c6d5e",
        "size": 3,
        "xetHash": H1,
        "lfs": {"oid": SHA, "size": 3, "pointerSize": 126},
        "path": "onnx/model.onnx",
    },
    {"type": "file", "oid": "0c9d6c1a2b3e4f5a6b7c8d9e0f1a2b3c4d5e6f70", "size": 688, "path": "config.json"},
    {
        "type": "file",
        "oid": "1b2c3d4e5f6a7b8c9d0e1f2a3b4c5d6e7f8a9b0c",
        "size": 100000,
        "xetHash": H2,
        "lfs": {"oid": "47b543f8457e5b33a9ee65cd5b5c6239af4b210de9f53f3db214dadbee88fe14", "size": 100000},
        "path": "model.safetensors",
    },
    {"type": "directory", "oid": "5b5e9a3d1c2f0e7d6c5b4a39281706f5e4d3c2b1", "size": 0, "path": "empty"},
]


def test_hub_listing() -> None:
    m = parse(HUB_LISTING)
    assert m.files == (
        ManifestFile(("onnx", "model.onnx"), hashes.from_hex(H1), 3, SHA),
        ManifestFile(
            ("model.safetensors",),
            hashes.from_hex(H2),
            100000,
            "47b543f8457e5b33a9ee65cd5b5c6239af4b210de9f53f3db214dadbee88fe14",
        ),
    )
    assert m.directories == (("onnx",), ("empty",))
    assert len(m.warnings) == 2
    assert "'.gitattributes'" in m.warnings[0] and "no xetHash" in m.warnings[0]
    assert "'config.json'" in m.warnings[1]
    assert all(w.startswith("manifest m.json: entry ") for w in m.warnings)


UNSAFE = [
    ("/abs/a.bin", "absolute path"),
    ("/", "absolute path"),
    ("..", "'..' component"),
    ("a/../b", "'..' component"),
    (".", "'.' component"),
    ("./a", "'.' component"),
    ("a/.", "'.' component"),
    ("", "empty path component"),
    ("a//b", "empty path component"),
    ("a/", "empty path component"),
    ("a\0b", "NUL character"),
    ("\0", "NUL character"),
    ("x" * 256, "component of 256 bytes, the limit is 255"),
    ("d/" + "é" * 128, "component of 256 bytes, the limit is 255"),
    ("a/\ud800", "not valid Unicode"),
    ("/".join(["abcdefg"] * 520), "path of 4159 bytes, the limit is 4096"),
]


@pytest.mark.parametrize(("path", "why"), UNSAFE)
def test_unsafe_names_are_dropped_with_a_warning(path: str, why: str) -> None:
    m = parse([f("ok.bin"), f(path, H2), f("ok2.bin")])
    assert names(m) == ["ok.bin", "ok2.bin"]
    assert len(m.warnings) == 1
    assert "entry 1" in m.warnings[0] and why in m.warnings[0]
    assert path_problem(path) is not None


@pytest.mark.parametrize(("path", "why"), UNSAFE)
def test_unsafe_directory_entries_are_dropped(path: str, why: str) -> None:
    m = parse([d(path), d("fine")])
    assert m.directories == (("fine",),)
    assert len(m.warnings) == 1 and why in m.warnings[0]


@pytest.mark.parametrize("path", [123, None, ["a"], {"a": 1}, True])
def test_non_string_paths(path: Any) -> None:
    m = parse([{"type": "file", "path": path, "xetHash": H1}, f("ok")])
    assert names(m) == ["ok"]
    assert "'path' is not a string" in m.warnings[0]


@pytest.mark.parametrize(
    "path",
    [
        "x" * 255,
        "é" * 127,
        "a/b/c.d",
        "..a",
        "a..",
        ".hidden",
        "...",
        " space ",
        "back\\slash",
        "日本語/ファイル.bin",
        "emoji 🎉",
        "/".join(["abc"] * 1024),
    ],
)
def test_safe_names(path: str) -> None:
    m = parse([f(path)])
    assert names(m) == [path] and m.warnings == ()


@pytest.mark.parametrize(
    ("xet", "why"),
    [
        ("abc", "not 64 hex"),
        (H1[:-1], "not 64 hex"),
        (H1 + "0", "not 64 hex"),
        ("g" * 64, "not 64 hex"),
        (12, "not 64 hex"),
        ([H1], "not 64 hex"),
        (None, "no xetHash"),
    ],
)
def test_bad_hashes(xet: Any, why: str) -> None:
    m = parse([f("bad", xet), f("good")])
    assert names(m) == ["good"]
    assert "'bad'" in m.warnings[0] and why in m.warnings[0]


def test_upper_case_hashes_are_accepted() -> None:
    m = parse([f("a", H1.upper(), lfs={"oid": SHA.upper()})])
    assert m.files[0].xet_hash == hashes.from_hex(H1)
    assert m.files[0].sha256 == SHA


@pytest.mark.parametrize("size", [-1, True, 1.5, "3", [3]])
def test_bad_size_is_ignored(size: Any) -> None:
    m = parse([f("a", size=size)])
    assert m.files[0].size is None
    assert "size is not a byte count" in m.warnings[0]


@pytest.mark.parametrize("lfs", [{"oid": "zz"}, {"size": 3}, "oid", 5, {"oid": None}])
def test_bad_lfs_oid_is_ignored(lfs: Any) -> None:
    m = parse([f("a", lfs=lfs)])
    assert m.files[0].sha256 is None
    assert "lfs.oid" in m.warnings[0]


def test_type_defaults_to_file_and_unknown_types_are_dropped() -> None:
    m = parse([{"path": "a", "xetHash": H1}, {"type": "submodule", "path": "b", "xetHash": H1}])
    assert names(m) == ["a"]
    assert "unknown type 'submodule'" in m.warnings[0]


@pytest.mark.parametrize("item", [1, "a", None, [f("a")], True])
def test_entries_that_are_not_objects(item: Any) -> None:
    m = parse([item, f("a")])
    assert names(m) == ["a"]
    assert "entry 0: not a JSON object" in m.warnings[0]


# -- conflicts -----------------------------------------------------------------


def test_same_path_other_hash_keeps_the_first() -> None:
    m = parse([f("a", H1), f("a", H2)])
    assert [x.xet_hash for x in m.files] == [hashes.from_hex(H1)]
    assert "entry 1" in m.warnings[0] and H1 in m.warnings[0] and H2 in m.warnings[0]


def test_same_path_same_hash_is_one_file() -> None:
    m = parse([f("a", H1), f("a", H1)])
    assert names(m) == ["a"] and m.warnings == ()


def test_same_hash_under_two_names_is_kept() -> None:
    m = parse([f("a", H1), f("b/c", H1)])
    assert names(m) == ["a", "b/c"] and m.warnings == ()


@pytest.mark.parametrize(
    ("entries", "kept_files", "kept_dirs", "dropped"),
    [
        ([f("a"), f("a/b")], ["a"], [], "'a/b'"),
        ([f("a/b"), f("a")], ["a/b"], [], "'a'"),
        ([f("a/b/c"), f("a/b")], ["a/b/c"], [], "'a/b'"),
        ([f("a/b"), f("a/b/c/d")], ["a/b"], [], "'a/b/c/d'"),
        ([d("a"), f("a")], [], [("a",)], "'a'"),
        ([d("a/b"), f("a")], [], [("a", "b")], "'a'"),
        ([f("a"), d("a")], ["a"], [], "'a'"),
        ([f("a"), d("a/b")], ["a"], [], "'a/b'"),
    ],
)
def test_file_and_directory_conflicts_drop_the_later_entry(
    entries: list[dict[str, Any]], kept_files: list[str], kept_dirs: list[tuple[str, ...]], dropped: str
) -> None:
    m = parse(entries)
    assert names(m) == kept_files
    assert list(m.directories) == kept_dirs
    assert len(m.warnings) == 1 and "entry 1" in m.warnings[0] and dropped in m.warnings[0]


def test_repeated_directories_are_listed_once() -> None:
    m = parse([d("a"), d("a"), f("a/x"), d("a/b")])
    assert m.directories == (("a",), ("a", "b")) and m.warnings == ()


def test_unicode_names_are_kept_as_given() -> None:
    nfc, nfd = "caf\u00e9", "cafe\u0301"
    m = parse([f(nfc, H1), f(nfd, H2), f("Ünïcödé/日本", H1)])
    assert [x.path for x in m.files] == [(nfc,), (nfd,), ("Ünïcödé", "日本")]
    assert m.warnings == ()


def test_warnings_are_capped_per_kind() -> None:
    entries = [{"type": "file", "path": f"small{i}.txt"} for i in range(50)] + [f("/abs")]
    m = parse(entries)
    assert len(m.warnings) == manifest.MAX_WARNINGS_PER_KIND + 2
    assert "... and 30 more no-xet warnings" in m.warnings
    assert any("absolute path" in w for w in m.warnings)


def test_combine_gives_priority_to_earlier_entries() -> None:
    a = ManifestFile(("a",), hashes.from_hex(H1), 3, None)
    a_b = ManifestFile(("a", "b"), hashes.from_hex(H2), None, None)
    m = combine([("a",), a, a_b], source="merge")
    assert m.files == (a_b,) and m.directories == (("a",),)
    assert len(m.warnings) == 1 and "manifest merge: 'a'" in m.warnings[0]


# -- garbage -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"", "not valid JSON"),
        (b"not json", "not valid JSON"),
        (b"[1, 2", "not valid JSON"),
        (b"\xff\xfe\xfa garbage", "not valid JSON"),
        (b"\x80abc", "not valid JSON"),
        (b"{}", "found a dict"),
        (b'"a string"', "found a str"),
        (b"null", "found a NoneType"),
        (b"42", "found a int"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (b"[" + b"9" * 5000 + b"]", "not valid JSON"),
    ],
)
def test_garbage_raises_manifest_error_naming_the_source(data: bytes, why: str) -> None:
    with pytest.raises(ManifestError, match=r"manifest names\.json: ") as info:
        parse_manifest(data, source="names.json")
    assert why in str(info.value)


def test_deep_nesting_inside_an_entry_is_an_error_not_a_crash() -> None:
    data = b'[{"type": "file", "path": "a", "xetHash": ' + b"[" * 100_000 + b"]" * 100_000 + b"}]"
    with pytest.raises(ManifestError, match="nested too deeply"):
        parse_manifest(data, source="m")


def test_too_big(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(manifest, "MAX_MANIFEST_BYTES", 100)
    with pytest.raises(ManifestError, match="101 bytes, the limit is 100"):
        parse_manifest(b" " * 99 + b"[]", source="m")
    assert parse_manifest(b" " * 98 + b"[]", source="m").files == ()


def test_empty_list() -> None:
    assert parse_manifest(b"[]", source="m") == Manifest((), (), ())


def test_every_truncation_is_an_error_or_a_valid_manifest() -> None:
    data = json.dumps(HUB_LISTING).encode()
    for n in range(len(data)):
        try:
            m = parse_manifest(data[:n], source="m")
        except ManifestError:
            continue
        assert isinstance(m, Manifest)


def test_utf16_and_bom_are_accepted() -> None:
    text = json.dumps([f("é")], ensure_ascii=False)
    assert names(parse_manifest(text.encode("utf-16"), source="m")) == ["é"]
    assert names(parse_manifest(text.encode("utf-8-sig"), source="m")) == ["é"]


KEYS = st.sampled_from(["type", "path", "xetHash", "size", "lfs", "oid", "x"])
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False),
    st.text(max_size=20),
    st.sampled_from(["file", "directory", H1, SHA, "a/b", "..", "/x", "a//b"]),
)
JSONISH = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(KEYS | st.text(max_size=5), inner, max_size=6),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(JSONISH)
def test_random_json_raises_only_manifest_error(value: Any) -> None:
    try:
        m = parse_manifest(json.dumps(value).encode(), source="m")
    except ManifestError:
        return
    for file in m.files:
        assert path_problem(file.name) is None and len(file.xet_hash) == 32


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_raise_only_manifest_error(data: bytes) -> None:
    with contextlib.suppress(ManifestError):
        parse_manifest(data, source="m")


# -- writing -------------------------------------------------------------------

NAME = st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="/\0"), min_size=1, max_size=12).filter(
    lambda s: s not in (".", "..")
)
FILES = st.dictionaries(
    st.lists(NAME, min_size=1, max_size=4).map(tuple),
    st.tuples(
        st.binary(min_size=32, max_size=32),
        st.none() | st.integers(0, 2**63),
        st.none() | st.sampled_from([SHA, H2]),
    ),
    max_size=8,
)


MTIMES = st.none() | st.integers(-(2**63), 2**63 - 1)  # st_mtime_ns: years 1677 to 2262


@settings(max_examples=200, deadline=None)
@given(FILES, MTIMES)
def test_dump_then_parse_round_trips(
    files: dict[tuple[str, ...], tuple[bytes, int | None, str | None]], mtime_ns: int | None
) -> None:
    records = [ManifestFile(p, h, size, sha, mtime_ns) for p, (h, size, sha) in files.items()]
    clean = combine(records, source="gen")  # drop generated file/directory clashes first
    back = parse_manifest(dump_manifest(clean.files), source="dump")
    assert sorted(back.files, key=lambda x: x.path) == sorted(clean.files, key=lambda x: x.path)
    assert back.warnings == ()


def test_dump_format_is_a_hub_listing() -> None:
    data = dump_manifest(
        [
            ManifestFile(("b", "x.bin"), hashes.from_hex(H1), 3, SHA),
            ManifestFile(("a",), hashes.from_hex(H2), None, None),
        ],
        [("b",), ("c",)],
    )
    assert json.loads(data) == [
        {"type": "file", "path": "a", "xetHash": H2},
        {"type": "directory", "path": "b"},
        {"type": "file", "path": "b/x.bin", "size": 3, "xetHash": H1, "lfs": {"oid": SHA, "size": 3}},
        {"type": "directory", "path": "c"},
    ]
    m = parse_manifest(data, source="dump")
    assert m.directories == (("b",), ("c",)) and len(m.files) == 2


def test_dump_writes_utf8_names() -> None:
    data = dump_manifest([ManifestFile(("日本",), hashes.from_hex(H1), None, None)])
    assert "日本".encode() in data


@pytest.mark.parametrize("path", [("..",), ("a", ""), ("a/b",), ("\0",), ()])
def test_dump_refuses_unsafe_names(path: tuple[str, ...]) -> None:
    with pytest.raises(ManifestError, match="cannot write manifest entry"):
        dump_manifest([ManifestFile(path, hashes.from_hex(H1), None, None)])


# -- modification times (our own field; a Hub listing lacks it) ------------------------------


@pytest.mark.parametrize(
    ("text", "ns"),
    [
        ("2020-09-13T12:26:40Z", 1_600_000_000 * 10**9),
        ("2020-09-13T12:26:40.5Z", 1_600_000_000 * 10**9 + 500_000_000),
        ("2020-09-13T12:26:40.123456789+00:00", 1_600_000_000 * 10**9 + 123_456_789),
        ("1969-12-31T23:59:59Z", -(10**9)),
    ],
)
def test_mtime_is_read_with_nanoseconds(text: str, ns: int) -> None:
    (file,) = parse([f("a", mtime=text)]).files
    assert file.mtime_ns == ns


@pytest.mark.parametrize(
    "value",
    ["2020-09-13 12:26:40", "2020-09-13T12:26:40+02:00", "2020-13-01T00:00:00Z", "9999-12-31T23:59:59Z", 1, None],
)
def test_a_bad_mtime_is_ignored_with_a_warning(value: Any) -> None:
    m = parse([f("a", mtime=value)])
    assert m.files[0].mtime_ns is None
    assert len(m.warnings) == (value is not None) and all("mtime" in w for w in m.warnings)


def test_a_hub_listing_has_no_mtimes() -> None:
    assert all(file.mtime_ns is None for file in parse(HUB_LISTING).files)
