"""Unit tests of the benchmark's pure parts (scripts/benchkit): parsing, rows and ratios, rendering.

No FUSE, no data sets: the measurements themselves run only in scripts/bench.py.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

from benchkit import cli
from benchkit.data import SMALL_MAX, SMALL_MIN, model_shapes, small_file_sizes
from benchkit.report import Table, cell_text, fmt_value, missing, render, to_json
from benchkit.rounds import rotations
from benchkit.rows import CURRENT, Results, Row, Target, Variant, busy, busy_row, cores, per_gib, percentile, ratio
from benchkit.sections import GROUPS, SECTIONS, hub, load, parquet, remote, serve, small_files
from benchkit.sections.fio import fio_command, parse_fio
from benchkit.util import parse_size

pytestmark = pytest.mark.unit

A = Row("a", "row a", "GB/s", xetfs=True)
B = Row("b", "row b", "GB/s")
A_OVER_B = Row("a_over_b", "a / b", "x", Target(">=", 1.0, ">= 1x"), ratio(A, B), xetfs=True)
TWICE = Row("twice", "(a / b) / (a / b)", "x", derive=ratio(A_OVER_B, A_OVER_B), xetfs=True)
BASE = Variant("base", "/nonexistent/python", "abc1234")
VARIANTS = [Variant(CURRENT, sys.executable, "this tree")]


@pytest.mark.parametrize(
    ("text", "value"), [("64M", 64 << 20), ("1G", 1 << 30), ("1GiB", 1 << 30), ("4096", 4096), ("1.5k", 1536)]
)
def test_parse_size(text: str, value: int) -> None:
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "lots", "-1M", "0"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        parse_size(text)


def test_only_takes_known_sections() -> None:
    assert cli.parse_sections("load, fio,same-file") == ["load", "fio", "same-file"]
    with pytest.raises(argparse.ArgumentTypeError, match="unknown section: nope"):
        cli.parse_sections("load,nope")
    args = cli.parse_args(["--quick", "--only", "load,parquet,fio,same-file"])
    assert args.only == ["load", "parquet", "fio", "same-file"] and args.size == 64 << 20 and args.repeat == 3


def test_the_issue_sections_exist_and_every_row_key_is_declared_once() -> None:
    assert {"plain", "peer", "ceiling", "cold", "warm", "random", "parallel", "mount"} <= set(SECTIONS)
    assert {"load", "parquet", "fio", "same-file", "parts", "hub", "remote", "remote-load"} <= set(SECTIONS)
    keys: dict[str, Row] = {}
    for group in GROUPS:
        for value in vars(group).values():
            candidates = value.values() if isinstance(value, dict) else [value]
            for row in candidates:
                if isinstance(row, Row):
                    assert keys.setdefault(row.key, row) is row, f"row key {row.key} declared twice"
    assert len(keys) > 100


def test_ratios_are_taken_per_round_and_only_where_both_sides_were_measured() -> None:
    r = Results()
    for rnd, (a, b) in enumerate([(2.0, 1.0), (3.0, 2.0), (4.0, None)]):
        r.add(A, "text", rnd, a)
        r.add(B, "text", rnd, b)
    r.add(A, "text", -1, 100.0)  # a warm-up round is not recorded
    assert r.values(A, "text") == [2.0, 3.0, 4.0]
    assert r.values(B, "text") == [1.0, 2.0]
    assert r.values(A_OVER_B, "text") == [2.0, 1.5]
    assert r.values(TWICE, "text") == [1.0, 1.0]  # derived from a derived row
    assert r.values(A, "random") == []
    with pytest.raises(ValueError, match="derived"):
        r.add(A_OVER_B, "text", 0, 1.0)


def test_variants_are_kept_apart_for_xetfs_rows_only() -> None:
    r = Results()
    for rnd in range(2):
        r.add(A, "", rnd, 2.0 + rnd)
        r.add(A, "", rnd, 1.0, BASE.name)
        r.add(B, "", rnd, 1.0, BASE.name)  # not an xetfs row: one figure whatever the variant
    assert r.values(A, "") == [2.0, 3.0]
    assert r.values(A, "", BASE.name) == [1.0, 1.0]
    assert r.values(B, "") == [1.0, 1.0]
    assert r.versus(A, "", BASE.name) == [2.0, 3.0]
    assert r.values(A_OVER_B, "", BASE.name) == [1.0, 1.0]


def test_percentile_and_per_gib() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 51.0
    assert percentile(list(reversed(values)), 99) == 99.0
    assert percentile([5.0], 99.9) == 5.0
    assert per_gib(2 << 30, 3.0) == 1.5


def test_rotations_rotate_and_reverse() -> None:
    orders = dict(rotations(3, [-1, 0, 1, 2]))
    assert orders[-1] == [2, 0, 1]
    assert orders[0] == [0, 1, 2]
    assert orders[1] == [0, 2, 1]  # rotated by one, then reversed
    assert orders[2] == [2, 0, 1]
    assert all(sorted(o) == [0, 1, 2] for o in orders.values())


def test_fmt_value_and_cells() -> None:
    assert fmt_value(1.234, "x") == "1.23x"
    assert fmt_value(12345.6, "IOPS") == "12,346"
    assert fmt_value(0.1234, "s") == "0.123"
    assert fmt_value(1.5, "s/GiB") == "1.50"
    assert cell_text([], "GB/s") == "-"
    assert cell_text([1.0, 3.0, 2.0], "GB/s") == "2.00 [1.00-3.00]"
    assert cell_text([0.5, 0.7], "x", A_OVER_B, "text").endswith("MISS")
    assert cell_text([1.5], "x", A_OVER_B, "text").endswith("PASS")


def _results() -> Results:
    r = Results()
    for rnd in range(3):
        r.add(A, "text", rnd, 2.0)
        r.add(B, "text", rnd, 1.0)
        r.add(A, "text", rnd, 1.0, BASE.name)
    return r


def test_render_shows_every_row_with_its_spread_and_the_baseline() -> None:
    table = Table("demo", "Demo section", ("text",), (A, B, A_OVER_B))
    text = render([table], _results(), [*VARIANTS, BASE], ["header line"])
    lines = text.splitlines()
    assert lines[0] == "header line"
    assert "Demo section" in lines
    assert any(ln.strip().startswith("row a") and "2.00 [2.00-2.00]" in ln for ln in lines)
    assert any("baseline abc1234" in ln and "1.00 [1.00-1.00]" in ln for ln in lines)
    assert any("this tree / abc1234" in ln and "2.00x" in ln for ln in lines)
    assert any(ln.strip().startswith("a / b") and "2.00x [2.00x-2.00x] PASS" in ln and ">= 1x" in ln for ln in lines)


def test_a_row_asked_for_without_a_figure_is_an_error() -> None:
    table = Table("demo", "Demo", ("text", "random"), (A, B))
    problems = missing(_results(), [table], VARIANTS)
    assert problems == [
        "demo: row a [random] (row a) has no figure",
        "demo: row b [random] (row b) has no figure",
    ]
    with_base = missing(_results(), [Table("demo", "Demo", ("text",), (A,))], [*VARIANTS, BASE])
    assert with_base == []
    assert missing(Results(), [Table("demo", "Demo", ("text",), (A,))], [*VARIANTS, BASE]) == [
        "demo: row a [text] (row a) has no figure",
        "demo: row a [text] (base) (baseline abc1234) has no figure",
        "demo: row a [text] (vs base) (this tree / abc1234) has no figure",
    ]


def test_a_ratio_of_two_zero_figures_is_not_an_error() -> None:
    r = Results()
    for rnd in range(3):
        r.add(A, "text", rnd, 0.0)  # e.g. no CPU in decode workers when every read decodes in the daemon
        r.add(A, "text", rnd, 0.0, BASE.name)
    assert missing(r, [Table("demo", "Demo", ("text",), (A,))], [*VARIANTS, BASE]) == []


def test_json_rows() -> None:
    table = Table("demo", "Demo", ("text",), (A_OVER_B,))
    (row,) = to_json([table], _results(), VARIANTS)
    assert row["key"] == "a_over_b" and row["median"] == 2.0 and row["pass"] is True and row["target"] == ">= 1.0"
    json.dumps(row)


FIO_JSON = {
    "jobs": [
        {
            "error": 0,
            "usr_cpu": 10.0,
            "sys_cpu": 40.0,
            "job_runtime": 2000,
            "read": {
                "iops": 3247.5,
                "bw_bytes": 13_301_760,
                "io_bytes": 16_777_216,
                "clat_ns": {"percentile": {"50.000000": 150_000, "99.000000": 700_000, "99.900000": 2_000_000}},
            },
        }
    ]
}


def test_parse_fio() -> None:
    got = parse_fio(FIO_JSON)
    assert got == {
        "iops": 3247.5,
        "gbps": 0.01330176,
        "bytes": 16_777_216.0,
        "cpu_s": 1.0,
        "p50": 150.0,
        "p99": 700.0,
        "p99.9": 2000.0,
    }


def test_fio_commands() -> None:
    rand4 = fio_command(Path("/m/f"), 16 << 20, "rand4", invalidate=True)
    assert "--numjobs=4" in rand4 and "--invalidate=1" in rand4 and "--ioengine=psync" in rand4
    assert f"--size={4 << 20}" in rand4 and f"--offset_increment={4 << 20}" in rand4
    seq = fio_command(Path("/m/f"), 16 << 20, "seq", invalidate=False)
    assert "--bs=1M" in seq and "--invalidate=0" in seq and f"--size={16 << 20}" in seq


def test_model_shapes_look_like_a_model() -> None:
    shapes = model_shapes(1 << 30)
    sizes = {name: (2 if dt == "float16" else 4) * _count(shape) for name, (dt, shape) in shapes.items()}
    assert len(shapes) >= 200
    assert {dt for dt, _ in shapes.values()} == {"float16", "float32"}
    assert 0.8 * (1 << 30) <= sum(sizes.values()) <= 1 << 30
    assert len(set(sizes.values())) >= 5  # mixed sizes
    assert list(shapes) != sorted(shapes)  # written in layer order; loaders ask in name order


def _count(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def test_remote_ranges_cover_every_object_once() -> None:
    got = remote.ranges({"a": 20, "b": 8, "c": 0}, step=8)
    assert got == [("a", 0, 8), ("a", 8, 16), ("a", 16, 20), ("b", 0, 8)]


def test_remote_load_is_shown_with_remote() -> None:
    args = cli.parse_args(["--quick", "--only", "remote", "--kinds", "text"])
    assert remote.columns(args, set(args.only)) == ["text", "model"]
    assert remote.columns(args, {"remote-load"}) == ["model"] and remote.columns(args, {"load"}) == []
    assert SECTIONS["remote-load"].also == ("remote",)


def test_hub_parses_the_pack_summary_and_sizes_its_model() -> None:
    assert hub.parse_pack("packed 3 revisions\n402653184 cache bytes -> 158334976 store bytes added\n") == (
        402653184,
        158334976,
    )  # (the line of older commits, which --baseline runs)
    line = "imported 1 repo, 3 revisions, 9 files into S: 6 files read (402653184 bytes) -> 158334976 store bytes added"
    assert hub.parse_pack(line) == (402653184, 158334976)
    with pytest.raises(cli.BenchError, match="unexpected"):
        hub.parse_pack("nothing packed")
    assert hub.tensor_mib(cli.parse_args(["--quick"])) == 2 and hub.tensor_mib(cli.parse_args([])) == 16


SPEED = Row("speed", "speed", "GB/s")
WALL = Row("wall", "wall", "s")
CPU_A = Row("cpu_a", "cpu a", "s/GiB")
CPU_B = Row("cpu_b", "cpu b", "s/GiB")
CPU_S = Row("cpu_s", "cpu seconds", "s")


def _get(values: dict[Row, float | None]) -> Callable[[Row], float | None]:
    return lambda row: values.get(row)


def test_busy_relates_cpu_to_wall_time_over_the_cores() -> None:
    # 1 GiB at 2**30 / 1e9 GB/s takes 1 s; 1.5 CPU s on 2 cores over 1 s: 75 % busy
    speed = 2**30 / 1e9
    f = busy(SPEED, (CPU_A, CPU_B), ncores=2)
    assert f(_get({SPEED: speed, CPU_A: 1.0, CPU_B: 0.5})) == pytest.approx(75.0)
    assert f(_get({SPEED: speed, CPU_A: 1.0})) is None  # a CPU row missing: no figure
    assert busy(WALL, (CPU_S,), ncores=4)(_get({WALL: 2.0, CPU_S: 4.0})) == pytest.approx(50.0)
    # CPU per GiB of a 0.5 GiB file: 3 s/GiB is 1.5 CPU s; over 1 s on one core, 150 %
    assert busy(WALL, (CPU_A,), ncores=1, gib=0.5)(_get({WALL: 1.0, CPU_A: 3.0})) == pytest.approx(150.0)
    assert busy(WALL, (CPU_S,), ncores=1)(_get({WALL: 0.0, CPU_S: 1.0})) is None
    with pytest.raises(ValueError, match="without gib"):
        busy(WALL, (CPU_A,))
    with pytest.raises(ValueError, match="mixed units"):
        busy(SPEED, (CPU_A, CPU_S))
    row = busy_row("x", "something", A, (CPU_A,))
    assert row.key == "busy_x" and row.unit == "%" and row.xetfs and row.derive is not None


def test_busy_rows_are_taken_per_round_from_results() -> None:
    r = Results()
    row = busy_row("t", "t", WALL, (CPU_S,))
    for rnd, (wall, cpu) in enumerate([(1.0, 1.0), (2.0, 1.0)]):
        r.add(WALL, "", rnd, wall)
        r.add(CPU_S, "", rnd, cpu)
    n = cores()
    assert r.values(row, "") == pytest.approx([100 / n, 50 / n])


class _FakeRunner:
    def __init__(self, data: dict[str, object], extra: dict[str, object] | None = None) -> None:
        self.data, self.extra = data, extra or {}


def test_runtime_busy_rows_have_keys_of_their_own() -> None:
    from types import SimpleNamespace

    ds = SimpleNamespace(main=SimpleNamespace(size=2**30))
    made = [
        *load.busy_rows(_FakeRunner({"model": ds})),
        *parquet.busy_rows(_FakeRunner({"table": ds})),
        *remote.load_busy_rows(_FakeRunner({"model": ds})),
        *hub.busy_rows(_FakeRunner({}, {"hub": SimpleNamespace(tensor_bytes=2**30)})),
    ]
    declared = {row.key for g in GROUPS for row in vars(g).values() if isinstance(row, Row)}
    keys = [row.key for row in made]
    assert len(keys) == len(set(keys)) and len(keys) >= 12
    assert not (set(keys) - {"busy_hub_import"}) & declared
    assert load.busy_rows(_FakeRunner({})) == ()


def test_small_file_sizes_are_bounded_deterministic_and_mostly_small() -> None:
    sizes = small_file_sizes(3000)
    assert len(sizes) == 3000 and sizes == small_file_sizes(3000)
    assert min(sizes) >= SMALL_MIN and max(sizes) <= SMALL_MAX
    assert sorted(sizes)[1500] < (SMALL_MIN + SMALL_MAX) / 2  # log-uniform: the median is well below the middle


def test_small_files_checks_sha256sum_output_and_rotates_the_tree_tools(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"abc")
    (tmp_path / "b b").write_bytes(b"")
    want = (
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad  a\n"
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855  b b\n"
    )
    assert small_files.sha256sum_expected(["a", "b b"], tmp_path) == want.encode()
    orders = [small_files.tree_order(rnd) for rnd in range(3)]
    assert [o[0] for o in orders] == ["ls", "find", "stat"] and all(sorted(o) == sorted(orders[0]) for o in orders)
    took, out = small_files.run_tool(["sha256sum", "--", "a", "b b"], tmp_path, 30)
    assert out == want.encode() and took > 0
    with pytest.raises(cli.BenchError, match="failed"):
        small_files.run_tool(["sha256sum", "--", "missing"], tmp_path, 30)


def test_the_new_sections_are_registered_with_their_options() -> None:
    assert {"small-files", "first-read", "serve"} <= set(SECTIONS)
    args = cli.parse_args(["--quick", "--only", "serve,small-files", "--kinds", "float32,text,random"])
    assert args.small_files == 3000 and args.tree_files == 100_000
    assert serve.kinds(args) == ("text", "random")  # issue 31: text and random only
    assert serve.columns(args, {"serve"}) == ["text", "random"] and serve.columns(args, {"load"}) == []
    assert small_files.columns(args, set(args.only)) == []  # its stores are made by its tasks
    assert cli.parse_args(["--small-files", "500", "--tree-files", "2000"]).tree_files == 2000


def test_ceiling_fs_needs_a_file_or_a_directory(capsys: pytest.CaptureFixture[str]) -> None:
    import ceiling_fs

    with pytest.raises(SystemExit):
        ceiling_fs.main(["/nonexistent-mountpoint"])
    assert "no file to serve" in capsys.readouterr().err
