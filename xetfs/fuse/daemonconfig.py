"""The whole ``MountConfig`` handed from ``xetfs mount`` to its daemon, over a pipe.

The daemon is started as ``python -m xetfs mount STORE MNT --config-fd N``
(the store as ``mount`` shows it, without secrets) and reads its
configuration, header lines included, as JSON from file descriptor ``N``:
nothing of it is on a command line, in ``/proc/PID/cmdline`` or in the
environment.  Every field of ``MountConfig`` goes through, so a new option
needs no code here; ``load_config`` refuses a field it does not know, so a
daemon of another version fails plainly instead of guessing.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from xetfs.base.errors import XetfsError
from xetfs.fuse.launch import MountConfig

MAX_CONFIG_BYTES = 1024 * 1024


class ConfigError(XetfsError):
    """The daemon's configuration could not be read."""


def dump_config(config: MountConfig) -> bytes:
    """``config`` as JSON: paths as strings, sets and tuples as lists."""
    doc: dict[str, Any] = {}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if isinstance(value, Path):
            value = str(value)
        elif isinstance(value, frozenset):
            value = sorted(value)
        elif isinstance(value, tuple):
            value = list(value)
        doc[f.name] = value
    return json.dumps(doc).encode()


def load_config(data: bytes) -> MountConfig:
    """The ``MountConfig`` that ``dump_config`` wrote (each value converted back by its field's type).

    Raises ``ConfigError`` for bad JSON or an unknown field.
    """
    try:
        doc = json.loads(data)
    except ValueError as exc:
        raise ConfigError(f"mount configuration: not JSON: {exc}") from None
    known = {f.name: str(f.type) for f in dataclasses.fields(MountConfig)}
    if not isinstance(doc, dict) or set(doc) - set(known):
        extra = sorted(set(doc) - set(known)) if isinstance(doc, dict) else type(doc).__name__
        raise ConfigError(f"mount configuration: unknown fields {extra}")
    return MountConfig(**{name: _typed(known[name], value) for name, value in doc.items()})


def _typed(annotation: str, value: Any) -> Any:
    """``value`` from JSON as the field annotated ``annotation`` holds it (a store stays a string)."""
    if value is None:
        return None
    if annotation in ("Path", "Path | None"):
        return Path(value)
    if annotation.startswith("frozenset"):
        return frozenset(value)
    if annotation.startswith("tuple"):
        return tuple(value)
    return value


def read_config(fd: int) -> MountConfig:
    """Read the configuration from ``fd`` up to its end, close it, and return it."""
    with open(fd, "rb") as f:
        data = f.read(MAX_CONFIG_BYTES + 1)
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"mount configuration on fd {fd}: more than {MAX_CONFIG_BYTES} bytes")
    return load_config(data)
