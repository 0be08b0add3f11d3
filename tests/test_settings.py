"""Every tuning constant and default is defined once, in xetfs/base/settings.py, and used."""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

import pytest

from xetfs.base import settings

pytestmark = pytest.mark.unit

PACKAGE = Path(__file__).resolve().parent.parent / "xetfs"
SETTINGS = PACKAGE / "base" / "settings.py"
NAMES = {n for n in vars(settings) if n.isupper() and n not in ("KiB", "MiB", "GiB")}


def top_level_names(path: Path) -> set[str]:
    names = set()
    for node in ast.parse(path.read_text()).body:
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def test_no_module_defines_a_setting_again() -> None:
    again = {f"{p.relative_to(PACKAGE)}: {n}" for p in PACKAGE.rglob("*.py") if p != SETTINGS
             for n in top_level_names(p) & NAMES}  # fmt: skip
    assert not again, f"defined outside xetfs/base/settings.py: {sorted(again)}"


def test_every_setting_is_used() -> None:
    sources = "\n".join(p.read_text() for p in PACKAGE.rglob("*.py") if p != SETTINGS)
    unused = sorted(n for n in NAMES if not re.search(rf"\b{n}\b", sources))
    assert not unused, f"settings nothing uses: {unused}"


# Numbers that are not tuning: none, one, minus one (a count's start, a step, "no bound").
PLAIN_NUMBERS = {0, 1, -1}


def literal_defaults(source: str, where: str) -> list[str]:
    """Numbers written as defaults in the module ``source``: of a function's parameters, of a class's fields,
    and of a command-line option (``add_argument(default=...)``), other than ``PLAIN_NUMBERS``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        values: list[ast.expr] = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            values += node.args.defaults + [d for d in node.args.kw_defaults if d is not None]
        elif isinstance(node, ast.ClassDef):
            values += [s.value for s in node.body if isinstance(s, ast.AnnAssign) and s.value is not None]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
            values += [k.value for k in node.keywords if k.arg == "default"]
        for value in values:
            if any(isinstance(sub, ast.Constant) and type(sub.value) in (int, float) and sub.value not in PLAIN_NUMBERS
                   for sub in ast.walk(value)):  # fmt: skip
                found.append(f"{where}:{value.lineno}: {ast.unparse(value)}")
    return found


def test_no_default_is_a_number_written_in_place() -> None:
    """A default of a function, a field or an option is a name from settings (or a format's own limit), so
    that changing it is one line and the docs generated from settings say it."""
    found = [line for p in sorted(PACKAGE.rglob("*.py")) if p != SETTINGS
             for line in literal_defaults(p.read_text(), str(p.relative_to(PACKAGE)))]  # fmt: skip
    assert not found, f"numbers written as defaults (name them in xetfs/base/settings.py): {found}"


def test_the_default_check_finds_each_kind() -> None:
    source = """
def f(size: int = 1, *, timeout: float = 600.0) -> None: ...
class C:
    limit: int = 4 * 1024
p.add_argument("--timeout", type=float, default=30.0)
"""
    assert literal_defaults(source, "m.py") == ["m.py:2: 600.0", "m.py:4: 4 * 1024", "m.py:5: 30.0"]


def test_the_checks_see_a_definition() -> None:
    assert top_level_names(SETTINGS) >= NAMES


def test_a_user_run_with_another_users_home_gets_its_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """mount(8) runs a ``user`` fstab line's helper as the user but with root's HOME: the defaults under a
    home (the disk cache, the log) must be the user's."""
    import pwd

    from xetfs.base.settings import user_home

    nobody = pwd.getpwnam("nobody")
    monkeypatch.setenv("HOME", str(tmp_path))  # (owned by root, who runs the tests)
    monkeypatch.setattr(os, "getuid", lambda: nobody.pw_uid)
    assert user_home() == Path(nobody.pw_dir)
    monkeypatch.setattr(os, "getuid", lambda: 0)
    assert user_home() == tmp_path
