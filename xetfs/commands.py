"""Sub-commands that need the FUSE side (mount, umount, stats, pack)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any


def register(sub: Any, add_common: Callable[[argparse.ArgumentParser], None]) -> None:
    """Add the mount-related sub-commands to ``sub``."""
