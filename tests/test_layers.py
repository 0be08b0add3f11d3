"""The package's folders are its layers: imports point down only, and no module imports itself round.

The import graph is read from the source (every ``import`` and ``from``
statement, those inside functions included; those under ``if
TYPE_CHECKING:`` are for the type checker only and are left out).
"""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

PACKAGE = Path(__file__).resolve().parent.parent / "xetfs"

# Each folder of xetfs/ and its rank: a module may import from its own folder and from folders of a
# lower rank, never from a higher one or from a sibling of the same rank.
LAYERS = {
    "commands": 6,  # the xetfs command line and its sub-commands
    "fuse": 5,  # the FUSE front end
    "serve": 5,  # the HTTP front end (xetfs serve)
    "read": 4,  # the read path
    "names": 4,  # the tree a mount shows
    "write": 4,  # writing stores
    "storage": 3,  # object sources, disk cache, index, manifest, catalogue
    "format": 2,  # pure parsers of shards, xorbs, chunks
    "base": 1,  # errors, hashes, counters, settings, messages
}
TOP = {"xetfs": 0, "xetfs.__main__": 7}  # the package itself (its version only: below all) and ``python -m xetfs``


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _is_type_checking(node):
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        yield from _imports(node)


def import_graph() -> dict[str, set[str]]:
    """Module -> the modules of xetfs it imports at run time."""
    mods = modules()

    def known(name: str) -> str:
        while name not in mods:
            name = name.rpartition(".")[0]
        return name

    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        deps: set[str] = set()
        for node in _imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                deps |= {known(a.name) for a in node.names if a.name.split(".")[0] == "xetfs"}
                continue
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            if base.split(".")[0] != "xetfs":
                continue
            for alias in node.names:
                full = f"{base}.{alias.name}"
                deps.add(full if full in mods else known(base))
        graph[name] = deps - {name}
    return graph


def rank(module: str) -> int:
    if module in TOP:
        return TOP[module]
    folder = module.split(".")[1]
    assert folder in LAYERS, f"{module}: not in a layer folder (xetfs/<layer>/...; layers: {', '.join(LAYERS)})"
    return LAYERS[folder]


def folder(module: str) -> str:
    return module if module in TOP else module.split(".")[1]


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (a list of modules, the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                return [*path[path.index(dep) :], dep]
            if dep not in state and (cycle := visit(dep)) is not None:
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)) is not None:
            return cycle
    return None


def test_every_module_lies_in_a_layer() -> None:
    strays = [m for m in modules() if m not in TOP and m.count(".") < 1]
    assert not strays
    for module in modules():
        rank(module)
    assert set(LAYERS) == {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}


def test_no_import_cycle() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or ())


def test_imports_point_down() -> None:
    wrong = [
        f"{module} imports {dep}"
        for module, deps in import_graph().items()
        for dep in sorted(deps)
        if folder(dep) != folder(module) and rank(dep) >= rank(module)
    ]
    assert not wrong, "imports that point up or sideways:\n" + "\n".join(wrong)


def test_the_base_imports_nothing_of_xetfs_above_it() -> None:
    graph = import_graph()
    assert graph["xetfs"] == set()
    assert all(dep.startswith("xetfs.base") for m, deps in graph.items() if m.startswith("xetfs.base.") for dep in deps)


def test_the_checks_catch_what_they_look_for() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None
    source = "import xetfs.a\nif TYPE_CHECKING:\n    import xetfs.b\ndef f():\n    import xetfs.c\n"
    nodes = list(_imports(ast.parse(source)))
    assert [n.names[0].name for n in nodes if isinstance(n, ast.Import)] == ["xetfs.a", "xetfs.c"]


# -- docs/architecture.md stays true to the tree -----------------------------------------------

ARCHITECTURE = PACKAGE.parent / "docs" / "architecture.md"


def _section(title: str) -> str:
    text = ARCHITECTURE.read_text()
    assert f"\n## {title}\n" in text, f"docs/architecture.md: no section '## {title}'"
    return text.partition(f"\n## {title}\n")[2].partition("\n## ")[0]


def test_the_module_map_lists_every_folder_and_module() -> None:
    listed = re.findall(r"^\| `(xetfs/[\w/]+(?:\.py|/))` \|", _section("Module map"), re.MULTILINE)
    assert len(listed) == len(set(listed)), "a module is listed twice"
    tree = {f"xetfs/{p.relative_to(PACKAGE).as_posix()}" for p in PACKAGE.rglob("*.py") if p.name != "__init__.py"}
    tree |= {f"xetfs/{p.parent.relative_to(PACKAGE).as_posix()}/" for p in PACKAGE.glob("*/__init__.py")}
    assert set(listed) == tree, f"missing: {sorted(tree - set(listed))}; not in the tree: {sorted(set(listed) - tree)}"


def cold_read_types() -> tuple[list[str], list[str], list[str]]:
    """The types "The types of one cold read" lists: for both kinds of store, local only, remote only
    (``module.Type`` below ``xetfs``); checks that the counts it gives add up."""
    section = _section("The types of one cold read")
    count = re.search(r"\*\*Count:\*\* local (\d+), remote (\d+), together (\d+)\.", section)
    assert count is not None
    groups = {}
    for name in ("Both local and remote", "Local only", "Remote only"):
        found = re.search(rf"^{name} \((\d+)\):(.*?)(?=\n\n(?![*\s])|\Z)", section, re.MULTILINE | re.DOTALL)
        assert found is not None, name
        types = re.findall(r"`([a-z_.]+\.[A-Za-z_]+)`", found.group(2))
        assert len(types) == int(found.group(1)), f"{name}: {len(types)} types listed, {found.group(1)} said"
        groups[name] = types
    both, local, remote = groups.values()
    everything = [*both, *local, *remote]
    assert len(set(everything)) == len(everything), "a type is listed twice"
    assert [len(both) + len(local), len(both) + len(remote), len(everything)] == [int(n) for n in count.groups()]
    return both, local, remote


def test_the_listed_types_exist_and_their_counts_add_up() -> None:
    for dotted in [name for group in cold_read_types() for name in group]:
        module, _, name = dotted.rpartition(".")
        assert isinstance(getattr(importlib.import_module(f"xetfs.{module}"), name, None), type), dotted


# -- small pieces: the bars of code size ---------------------------------------------------------

MAX_CLASS_LINES = 300  # a class of the read path (read/) or of the FUSE front end (fuse/)
MAX_FUNCTION_LINES = 60  # a function or method anywhere in xetfs/
CLASS_BAR_FOLDERS = ("read", "fuse")


def oversized(source: str, where: str, *, classes: bool) -> list[str]:
    """The functions of ``source`` over ``MAX_FUNCTION_LINES`` lines and (with ``classes``) its classes over
    ``MAX_CLASS_LINES``, as ``where:line kind name: n lines``.  A node's lines run from its ``def`` or
    ``class`` line (decorators not counted) to its last line."""
    found = []
    for node in ast.walk(ast.parse(source, where)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            kind, bar = "function", MAX_FUNCTION_LINES
        elif isinstance(node, ast.ClassDef) and classes:
            kind, bar = "class", MAX_CLASS_LINES
        else:
            continue
        lines = (node.end_lineno or node.lineno) - node.lineno + 1
        if lines > bar:
            found.append(f"{where}:{node.lineno} {kind} {node.name}: {lines} lines (at most {bar})")
    return found


def test_classes_and_functions_stay_small() -> None:
    found = [
        offender
        for path in sorted(PACKAGE.rglob("*.py"))
        for offender in oversized(
            path.read_text(),
            str(path.relative_to(PACKAGE.parent)),
            classes=path.relative_to(PACKAGE).parts[0] in CLASS_BAR_FOLDERS,
        )
    ]
    assert not found, "too long; split it along a seam (docs/architecture.md, Layers):\n" + "\n".join(found)


def test_the_size_check_names_what_is_too_long() -> None:
    body = "".join(f"    x = {i}\n" for i in range(MAX_FUNCTION_LINES - 1))
    fits = f"def fits():\n{body}"
    long = f"async def long():\n{body}    x = 0\n"
    big = "class Big:\n" + "".join(f"    def m{i}(self):\n        pass\n" for i in range(MAX_CLASS_LINES // 2))
    assert oversized(fits, "f.py", classes=True) == []
    assert oversized(long, "f.py", classes=True) == ["f.py:1 function long: 61 lines (at most 60)"]
    assert oversized(big, "f.py", classes=True) == ["f.py:1 class Big: 301 lines (at most 300)"]
    assert oversized(big, "f.py", classes=False) == []


def test_the_commands_start_without_the_fuse_modules_and_the_read_path() -> None:
    """The command line, and the command side of a mount (``fuse.launch``), import neither pyfuse3 nor trio nor
    the read path: ``xetfs ls``, ``stats``, ``umount`` and ``mount`` itself start in a fraction of the daemon's
    time, which imports them all."""
    code = (
        "import sys\n"
        "from xetfs.commands import cli, mount\n"
        "from xetfs.fuse import daemonconfig, launch\n"
        "cli.build_parser()\n"
        "print(sorted(m for m in sys.modules if m in ('trio', 'pyfuse3') or m.startswith('xetfs.read')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stdout
