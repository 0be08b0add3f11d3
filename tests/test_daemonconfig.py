"""The mount's configuration: one set of defaults, and the whole of it handed to the daemon as JSON."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from xetfs.base import settings
from xetfs.commands.cli import build_parser
from xetfs.commands.mount import _config, daemon_argv
from xetfs.fuse.daemonconfig import ConfigError, dump_config, load_config
from xetfs.fuse.launch import MountConfig

pytestmark = pytest.mark.unit

EVERY_FIELD_SET = MountConfig(
    store="https://user:pw@host/store?sig=x",
    mountpoint=Path("/mnt/x"),
    options=frozenset({"allow_other", "nonempty"}),
    uid=1000,
    gid=1001,
    direct_io=True,
    cache_size=3 << 30,
    names=Path("/srv/names.json"),
    read_ahead_kb=4096,
    strict=True,
    prefetch=False,
    io_mode="thread",
    io_timeout=7.5,
    workers=3,
    layout="hash",
    cache_dir=Path("/var/cache/x"),
    disk_cache_size=5 << 20,
    headers=("Authorization: Bearer t0ken", "X-A: b"),
    refresh_every=90.0,
)


def test_every_field_goes_through_json_to_the_daemon() -> None:
    default = MountConfig(store="", mountpoint=Path("/"))
    fields = [f.name for f in dataclasses.fields(MountConfig) if f.name not in ("store", "mountpoint")]
    unchanged = [name for name in fields if getattr(default, name) == getattr(EVERY_FIELD_SET, name)]
    assert not unchanged, f"give these fields a value other than their default here: {unchanged}"
    assert load_config(dump_config(EVERY_FIELD_SET)) == EVERY_FIELD_SET
    assert load_config(dump_config(default)) == default


def test_a_config_from_another_version_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"unknown fields \[.from_the_future.\]"):
        load_config(b'{"store": "/s", "mountpoint": "/m", "from_the_future": 3}')
    with pytest.raises(ConfigError, match="not JSON"):
        load_config(b"{")


def test_the_command_line_defaults_are_mount_configs(tmp_path: Path) -> None:
    args = build_parser().parse_args(["mount", str(tmp_path), str(tmp_path)])
    assert _config(args) == MountConfig(store=str(tmp_path.resolve()), mountpoint=tmp_path.resolve())
    assert (args.cache_size, args.io_timeout, args.disk_cache_size) == (
        settings.CACHE_SIZE, settings.IO_TIMEOUT, settings.DISK_CACHE_SIZE)  # fmt: skip


def test_the_daemon_argv_spells_no_option(tmp_path: Path) -> None:
    args = build_parser().parse_args(["mount", str(tmp_path), str(tmp_path), "--cache-size", "2G", "--workers", "2",
                                      "--strict", "--log-level", "info"])  # fmt: skip
    config = _config(args)
    assert (config.cache_size, config.workers, config.strict) == (2 << 30, 2, True)
    argv = daemon_argv(args, config)
    assert argv[-6:] == ["mount", str(tmp_path.resolve()), str(tmp_path.resolve()), "--log-level", "info",
                         "--drop-clean-log"]  # fmt: skip
