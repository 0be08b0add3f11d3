"""The README and docs/ stay true: generated pages are current, links and anchors resolve, cited tests exist.

Unit tier: no root, no FUSE, no servers.  ``scripts/gendocs.py`` writes the
generated pages (usage, stats keys, the bench tables); the rest checks what
people follow: every relative link and ``#anchor`` of README.md and
docs/*.md resolves as GitHub resolves it, every ``tests/FILE.py::NAME`` the
pages cite is a test, every ``docs/format.md`` section cited anywhere
exists, and README.md stays under 16 KB.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

import benchtables
import gendocs
from benchkit.report import Table, to_json
from benchkit.rows import CURRENT, Results, Row, Target, Variant, ratio

from xetfs.commands.args import size_text

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
PAGES = [README, *sorted((REPO / "docs").glob("*.md"))]
README_LIMIT = 16 * 1024

# -- generated pages -----------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["docs/usage.md", "docs/stats.md", "docs/performance.md", "docs/bench-tables.md", "README.md"]
)
def test_generated_pages_are_current(name: str) -> None:
    path = REPO / name
    assert path.read_text() == gendocs.pages()[path], f"{name} is stale: run scripts/gendocs.py"


def test_the_readme_figures_come_from_the_bench_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for bench in (REPO / "docs").glob("bench-*.json"):
        run = json.loads(bench.read_text())
        for row in run["rows"]:
            if row["key"] == "r_remote_local" and not row["variant"] and row["column"] == "random":
                row["median"] = 0.123456
        (tmp_path / bench.name).write_text(json.dumps(run))
    monkeypatch.setattr(gendocs, "DOCS", tmp_path)
    figures = gendocs.readme_figures()
    assert "| over nginx, speed / a local mount's (text, random) | " in figures and ", 0.12 |" in figures
    remote = json.loads((REPO / "docs" / "bench-remote.json").read_text())["meta"]
    size = size_text(remote["size"])
    assert f"measured at {remote['xetfs_commit']} on {remote['cpus']} CPUs:" in figures
    assert (f"\n.venv/bin/python scripts/bench.py --size {size} --repeat {remote['repeat']} --warmup "
            f"{remote['warmup']} --kinds {','.join(remote['kinds'])} --only remote\n") in figures  # fmt: skip


def test_check_mode_names_a_stale_page(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    for name in ("usage.md", "stats.md", "performance.md", "bench-tables.md"):
        (docs / name).write_text((REPO / "docs" / name).read_text())
    for bench in (REPO / "docs").glob("bench*.json"):  # (the runs the performance page's tables come from)
        (docs / bench.name).write_text(bench.read_text())
    monkeypatch.setattr(gendocs, "REPO", tmp_path)
    monkeypatch.setattr(gendocs, "DOCS", docs)
    monkeypatch.setattr(gendocs, "BENCH_JSON", docs / "bench.json")
    monkeypatch.setattr(gendocs, "README", tmp_path / "README.md")
    (tmp_path / "README.md").write_text(README.read_text())
    assert gendocs.main(["--check"]) == 0
    (docs / "usage.md").write_text((docs / "usage.md").read_text().replace("--cache-size", "--cache-sise"))
    assert gendocs.main(["--check"]) == 1
    assert gendocs.main([]) == 0  # rewrites it
    assert gendocs.main(["--check"]) == 0


def test_usage_lists_every_command_and_option() -> None:
    from xetfs.commands.cli import build_parser

    text = (REPO / "docs" / "usage.md").read_text()
    commands = gendocs._subparsers(build_parser())
    assert len(commands) >= 8
    for name, (_, sub) in commands.items():
        assert f"## xetfs {name}\n" in text
        for action in sub._actions:
            if action.help == "==SUPPRESS==" or action.dest == "help":
                continue
            for flag in action.option_strings:
                assert f"`{flag}`" in text, f"xetfs {name} {flag} is not in docs/usage.md"


def test_every_counter_has_its_row_and_the_groups_are_the_documents() -> None:
    """``stats.GROUPS`` is what ``.xetfs/stats`` holds: a filesystem over the sample store, no mount."""
    from dataclasses import fields

    from xetfs.base import stats
    from xetfs.fuse.fs import XetFS
    from xetfs.names.tree import build_tree
    from xetfs.read.reader import Reader
    from xetfs.storage.indexer import load_index
    from xetfs.storage.store import Store

    store = Store.open(REPO / "sample" / "store")
    loaded = load_index(store)
    tree, _ = build_tree(loaded.index, None)
    reader = Reader(loaded.index, store)
    try:
        doc = json.loads(XetFS(tree, reader).stats_document())
    finally:
        reader.close()
    assert list(doc) == [*stats.GROUPS, "uptime_seconds", "pid", "refresh_error"]
    text = (REPO / "docs" / "stats.md").read_text()
    for group, cls in stats.GROUPS.items():
        assert list(doc[group]) == [f.name for f in fields(cls)]
        for key in doc[group]:
            assert f"| `{group}.{key}` | " in text


def test_a_counter_without_a_comment_is_refused(tmp_path: Path) -> None:
    source = tmp_path / "counters.py"
    source.write_text(
        '@dataclass\nclass C:\n    """Doc."""\n\n    said: int = 0  # what it counts\n    unsaid: int = 0\n'
    )
    assert gendocs.counter_docs(source) == {"C": ("Doc.", {"said": "what it counts", "unsaid": ""})}


# -- bench tables ----------------------------------------------------------------

A = Row("a", "row a", "GB/s", xetfs=True)
B = Row("b", "row b", "GB/s")
A_OVER_B = Row("a_over_b", "a / b", "x", Target(">=", 1.0, ">= 1x"), ratio(A, B), xetfs=True)


def sample_bench_json() -> dict[str, object]:
    """A small document as ``scripts/bench.py --json`` writes it, made by the bench's own code."""
    results = Results()
    for rnd, (a, b) in enumerate([(2.0, 1.0), (3.0, 1.5), (4.0, 2.5)]):
        for column in ("text", "random"):
            results.add(A, column, rnd, a)
            results.add(B, column, rnd, b)
            results.add(A, column, rnd, a / 2, "base")
    variants = [Variant(CURRENT, sys.executable, "this tree"), Variant("base", "/nonexistent", "abc1234")]
    tables = [Table("cold", "Cold reads", ("text", "random"), (A, B, A_OVER_B))]
    meta = {"size": 64 << 20, "repeat": 3, "cpus": 2, "kernel": "6.1", "xetfs_commit": "0123abc", "elapsed_s": 12.5}
    doc: dict[str, object] = json.loads(json.dumps({"meta": meta, "rows": to_json(tables, results, variants)}))
    return doc


def test_bench_tables_from_a_sample_json(tmp_path: Path) -> None:
    text = benchtables.render_markdown(sample_bench_json(), source="sample.json")
    lines = text.splitlines()
    assert lines[0].startswith("From `sample.json`: commit 0123abc, 64 MiB per data set, 3 rounds, 2 CPUs")
    assert "### cold" in lines
    assert "| row | text (LZ4) | random (raw) |" in lines
    assert "| row a (GB/s) | 3.00 [2.00–4.00] | 3.00 [2.00–4.00] |" in lines
    assert "| baseline abc1234 (GB/s) | 1.50 [1.00–2.00] | 1.50 [1.00–2.00] |" in lines
    assert "| this tree / abc1234 (x) | 2.00x [2.00x–2.00x] | 2.00x [2.00x–2.00x] |" in lines
    ratio_line = next(ln for ln in lines if ln.startswith("| a / b"))
    assert "target >= 1.0" in ratio_line and ratio_line.count("PASS") == 2
    assert "Errors" not in text
    failed = benchtables.render_markdown({**sample_bench_json(), "errors": ["load: row x has no figure"]})
    assert failed.endswith("Errors reported by the run:\n\n* load: row x has no figure\n")
    path = tmp_path / "sample.json"
    path.write_text(json.dumps(sample_bench_json()))
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "benchtables.py"), str(path)],
                         capture_output=True, text=True, check=True)  # fmt: skip
    assert out.stdout == text


def test_the_performance_page_takes_the_committed_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The performance page's targets and the bench tables page come from every ``docs/bench*.json``, and
    a target's figure from the newest run that has it."""
    bench = tmp_path / "bench.json"
    monkeypatch.setattr(gendocs, "BENCH_JSON", bench)
    page = (REPO / "docs" / "performance.md").read_text()
    assert "No bench JSON is committed yet" in gendocs.performance_page(page)
    old, new = sample_bench_json(), sample_bench_json()
    old["meta"] = {**old["meta"], "started": "2026-01-01T00:00:00Z", "xetfs_commit": "0ldc0de"}  # type: ignore[dict-item]
    new["meta"] = {**new["meta"], "started": "2026-02-01T00:00:00Z"}  # type: ignore[dict-item]
    bench.write_text(json.dumps(old))
    (tmp_path / "bench-later.json").write_text(json.dumps(new))
    with_targets = gendocs.performance_page(page)
    target = next(ln for ln in with_targets.splitlines() if ln.startswith("| cold | a / b | text (LZ4) |"))
    assert "PASS | >= 1.0 | [bench-later.json](bench-tables.md#bench-laterjson), 0123abc, 64 MiB |" in target
    assert with_targets.startswith(page.partition(gendocs.TABLES_BEGIN)[0])
    assert with_targets.endswith(page.partition(gendocs.TABLES_END)[2])
    assert gendocs.performance_page(with_targets) == with_targets  # rendering again changes nothing
    tables = gendocs.bench_tables_page()
    assert tables.index("## bench-later.json") < tables.index("## bench.json")  # (newest first)
    assert "| row a (GB/s) | 3.00 [2.00–4.00] | 3.00 [2.00–4.00] |" in tables


# -- links and anchors -----------------------------------------------------------

FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*$", re.MULTILINE)


def prose(text: str) -> str:
    """``text`` without fenced code blocks and code spans, where brackets are not links."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text
    out = []
    for ch in text.lower():
        if ch in " -":
            out.append("-")
        elif ch == "_" or unicodedata.category(ch)[0] in "LN":
            out.append(ch)
    return "".join(out)


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for heading in HEADING.findall(FENCE.sub("", path.read_text())):
        base = github_anchor(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def test_github_anchor_rule() -> None:
    assert github_anchor("3. Shards (`*.mdb`)") == "3-shards-mdb"
    assert github_anchor("4. The store directory (`local://DIR`)") == "4-the-store-directory-localdir"
    assert github_anchor("10. What was checked against hf_xet") == "10-what-was-checked-against-hf_xet"
    assert github_anchor("The hidden .xetfs directory") == "the-hidden-xetfs-directory"


def test_repeated_headings_are_numbered(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text("# A\n## Notes\n```\n# not a heading\n```\n## Notes\n")
    assert anchors(page) == {"a", "notes", "notes-1"}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_and_anchor_resolves(page: Path) -> None:
    problems = []
    for target in LINK.findall(prose(page.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        dest = (page.parent / file_part).resolve() if file_part else page
        if not dest.exists():
            problems.append(f"{target}: no file {dest}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            problems.append(f"{target}: no heading with anchor #{anchor} in {dest.name}")
    assert not problems, f"{page.name}: " + "; ".join(problems)


def test_the_link_check_sees_a_broken_link_and_a_broken_anchor(tmp_path: Path) -> None:
    (tmp_path / "b.md").write_text("# Title\n")
    page = tmp_path / "a.md"
    page.write_text("[ok](b.md#title) [bad](b.md#nope) `[code](c.md)` [gone](c.md)\n")
    found = LINK.findall(prose(page.read_text()))
    assert found == ["b.md#title", "b.md#nope", "c.md"]
    assert "nope" not in anchors(tmp_path / "b.md")


def test_readme_is_short() -> None:
    size = len(README.read_bytes())
    assert size < README_LIMIT, f"README.md is {size} bytes (limit {README_LIMIT})"


def test_readme_starts_with_the_two_commands() -> None:
    lines = README.read_text().splitlines()
    assert lines[2] == "```sh"
    assert lines[3].startswith("scripts/demo.sh ") and "#" in lines[3]
    assert lines[4].startswith("scripts/test.sh ") and "#" in lines[4]
    assert lines[5] == "```"


# -- citations -------------------------------------------------------------------

CITED_TEST = re.compile(r"tests/(test_\w+\.py)::(test_\w+)")


def test_every_cited_test_exists() -> None:
    problems = []
    cited = [(page, *found) for page in PAGES for found in CITED_TEST.findall(page.read_text())]
    assert len(cited) > 50  # docs/guarantees.md names the tests behind each guarantee
    for page, file, name in cited:
        source = REPO / "tests" / file
        if not source.exists() or not re.search(rf"^\s*(async )?def {name}\(", source.read_text(), re.MULTILINE):
            problems.append(f"{page.name}: tests/{file}::{name}")
    assert not problems, "cited tests that do not exist: " + ", ".join(problems)


def repo_text_files() -> list[Path]:
    # safe.directory: a user who does not own the checkout (the unit tier as another user) may list it too.
    listed = subprocess.run(["git", "-c", f"safe.directory={REPO}", "ls-files", "--cached", "--others",
                             "--exclude-standard"], cwd=REPO, capture_output=True, text=True,
                            check=True).stdout.split()  # fmt: skip
    return [REPO / p for p in listed if p.endswith((".py", ".md", ".sh", ".toml", ".txt", ".cfg"))]


def format_sections() -> set[str]:
    """``1``, ``1.4``, …: the numbered headings of docs/format.md, and ``9.N`` for the numbered traps of 9."""
    text = (REPO / "docs" / "format.md").read_text()
    out = set(re.findall(r"^#{2,3} (\d+(?:\.\d+)?)\.? ", text, re.MULTILINE))
    traps = text.partition("\n## 9. ")[2].partition("\n## 10. ")[0]
    out |= {f"9.{n}" for n in re.findall(r"^(\d+)\. ", traps, re.MULTILINE)}
    return out


# "docs/format.md section 3", "docs/format.md 2.2, 2.3", "docs/format.md 3 and 8"
FORMAT_CITATION = re.compile(r"docs/format\.md,? (?:section )?(\d+(?:\.\d+)?)((?:(?:,| and) \d+(?:\.\d+)?)*)")


def test_no_file_cites_a_document_outside_the_repository() -> None:
    sections = format_sections()
    assert {"1", "1.4", "2.5", "3.8", "4", "8", "9.1", "10"} <= sections
    assert FORMAT_CITATION.findall("(docs/format.md 2.2, 2.4 and 3) docs/format.md section 9") == [
        ("2.2", ", 2.4 and 3"),
        ("9", ""),
    ]
    problems = []
    citations = 0
    for path in repo_text_files():
        text = path.read_text(errors="replace")
        rel = path.relative_to(REPO)
        if re.search(r"(?<![\w/])FORMAT\.md|spec/\w+\.md", text):
            problems.append(f"{rel}: cites a format document outside the repository")
        for doc in set(re.findall(r"\bdocs/[\w.-]+\.md", text)):
            if not (REPO / doc).exists():
                problems.append(f"{rel}: cites {doc}, which does not exist")
        for first, more in FORMAT_CITATION.findall(text):
            citations += 1
            for number in [first, *re.findall(r"\d+(?:\.\d+)?", more)]:
                if number not in sections:
                    problems.append(f"{rel}: cites docs/format.md {number}, which has no such section")
    assert citations > 30  # the parsers, the hashes and their tests cite the format
    assert not problems, "\n".join(problems)
