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
