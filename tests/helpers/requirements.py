"""What a test needs from the machine, and the tiers of the suite.

Every test belongs to one tier, from a marker on the test or its module:

* ``unit``: one component in this process; no root, no FUSE, no servers; the tier runs in
  well under a minute (``scripts/test.sh --unit``);
* ``integration``: parts together without a mount or a server (stores written by ``hf_xet``,
  the command in subprocesses, decode worker processes, ruff and mypy);
* ``e2e``: real mounts, nginx, the S3 server, ``xetfs serve``, Hugging Face clients.  Every test
  marked ``fuse`` is ``e2e``, without saying so again.

A test marked ``fuse`` needs root and a readable and writable ``/dev/fuse``; one marked ``root``
needs root.  Where one is missing the test is skipped with the reason; under ``CI=true`` that skip
is a failure (``conftest.py``), so a CI machine that lacks them cannot pass by skipping.
"""

from __future__ import annotations

import os

TIERS = ("unit", "integration", "e2e")
FUSE_DEVICE = "/dev/fuse"


def in_ci() -> bool:
    """``CI=true`` in the environment (what CI services set)."""
    return os.environ.get("CI", "").lower() == "true"


def missing_root() -> str | None:
    """Why this process cannot do what needs root, or None when it can."""
    if os.geteuid() != 0:
        return f"needs root (running as uid {os.geteuid()})"
    return None


def missing_fuse() -> str | None:
    """Why this process cannot mount with FUSE as the suite does (as root), or None when it can."""
    if not os.path.exists(FUSE_DEVICE):
        return f"needs {FUSE_DEVICE}, which does not exist (load the fuse module, or give the container the device)"
    if not os.access(FUSE_DEVICE, os.R_OK | os.W_OK):
        return f"needs {FUSE_DEVICE} readable and writable, which it is not for uid {os.geteuid()}"
    return missing_root()


def tier_of(markers: set[str]) -> str | None:
    """The tier of a test carrying ``markers`` (its own and its module's), or None when it has none.

    Raises ValueError when they name more than one tier (``fuse`` counts as ``e2e``).
    """
    tiers = {name for name in markers if name in TIERS}
    if "fuse" in markers:
        tiers.add("e2e")
    if len(tiers) > 1:
        raise ValueError(f"more than one tier: {', '.join(sorted(tiers, key=TIERS.index))}")
    return next(iter(tiers), None)
