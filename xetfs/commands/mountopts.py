"""Mount options in ``-o`` form, and the command line ``mount -t fuse.xetfs`` runs.

``mount -t fuse.xetfs STORE MNT -o OPTS`` (and an ``/etc/fstab`` line of
type ``fuse.xetfs``) makes ``mount.fuse3`` run ``xetfs STORE MNT -o OPTS``:
no sub-command, and every option in ``-o``.  So:

* ``helper_argv`` reads that form as ``xetfs mount STORE MNT -o OPTS``;
* every long option of ``xetfs mount`` has an ``-o`` spelling, derived from
  the parser itself: ``--cache-size 2G`` is ``-o cache_size=2G``, the flag
  ``--no-prefetch`` is ``-o no_prefetch``; ``expand_options`` rewrites them;
* the options that ``mount(8)`` and ``fstab`` add for themselves
  (``defaults``, ``rw``, ``_netdev``, ``nofail``, ``x-systemd.*``, ...) are
  accepted and ignored, as other helpers do; ``nodev``, ``nosuid`` and
  ``noexec`` are given to FUSE, and ``ro`` is what every xetfs mount is;
* what remains (``allow_other``, ``allow_root``, ``nonempty``, ...) goes to
  FUSE through ``launch.parse_options``.
"""

from __future__ import annotations

import argparse
import logging
import re
from collections.abc import Sequence

log = logging.getLogger(__name__)

# What mount(8), mount.fuse3 or an fstab line may add, with no meaning for xetfs: accepted, ignored.
IGNORED = frozenset({
    "defaults", "rw", "auto", "noauto", "user", "users", "nouser", "owner", "group", "_netdev", "nofail",
    "dev", "suid", "exec", "async", "sync", "atime", "noatime", "relatime", "norelatime", "strictatime",
    "lazytime", "nolazytime", "diratime", "nodiratime", "dirsync", "silent", "loud", "nosymfollow",
})  # fmt: skip
IGNORED_PREFIXES = ("x-", "comment=", "helper=")
NOT_AS_OPTIONS = frozenset({"help", "foreground", "ready_fd"})  # long options of mount with no -o spelling


def helper_argv(argv: Sequence[str], commands: Sequence[str]) -> list[str]:
    """``argv`` with ``mount`` in front when it is the form ``mount.fuse3`` runs: ``STORE MNT [-o OPTS]``.

    That form starts with an argument that is neither an option nor one of
    the ``commands``; anything else is returned as it is.
    """
    args = list(argv)
    if args and not args[0].startswith("-") and args[0] not in commands and len(args) >= 2:
        return ["mount", *args]
    return args


def option_table(mount_parser: argparse.ArgumentParser) -> dict[str, tuple[str, bool]]:
    """``-o`` name -> (long option, takes a value), for every long option of ``mount_parser``."""
    table: dict[str, tuple[str, bool]] = {}
    for action in mount_parser._actions:
        longs = [s for s in action.option_strings if s.startswith("--")]
        if not longs or action.help == argparse.SUPPRESS:
            continue
        name = longs[0][2:].replace("-", "_")
        if name not in NOT_AS_OPTIONS:
            table[name] = (longs[0], action.nargs != 0)
    return table


def split_options(text: str) -> list[str]:
    """``a=1,b,c=x\\,y`` -> ``["a=1", "b", "c=x,y"]`` (a backslash keeps a comma in a value)."""
    parts = re.split(r"(?<!\\),", text)
    return [p.replace("\\,", ",").strip() for p in parts if p.strip()]


def expand_options(args: Sequence[str], table: dict[str, tuple[str, bool]]) -> list[str]:
    """The arguments of ``xetfs mount`` with each ``-o`` list rewritten.

    xetfs options become their long options in place; ignored generic ones
    are dropped; the rest stay in one ``-o`` (checked by ``launch.parse_options``).
    Raises ``argparse.ArgumentTypeError`` for an xetfs option without its value,
    or a flag given one.
    """
    out: list[str] = []
    rest: list[str] = []
    items = list(args)
    i = 0
    while i < len(items):
        arg = items[i]
        if arg == "-o" and i + 1 < len(items):
            values, i = items[i + 1], i + 2
        elif arg.startswith("-o") and arg != "-o" and not arg.startswith("--"):
            values, i = arg[2:], i + 1
        else:
            out.append(arg)
            i += 1
            continue
        for option in split_options(values):
            name, sep, value = option.partition("=")
            key = name.replace("-", "_")
            if key in table:
                flag, takes_value = table[key]
                if takes_value and not sep:
                    raise argparse.ArgumentTypeError(f"mount option {name} needs a value ({name}=...)")
                if not takes_value and sep:
                    raise argparse.ArgumentTypeError(f"mount option {name} takes no value (got {option!r})")
                out += [flag, value] if takes_value else [flag]
            elif key == "foreground":
                raise argparse.ArgumentTypeError("mount option foreground: not as -o (mount(8) would wait for "
                                                 "the mount to end); give -f")  # fmt: skip
            elif option in IGNORED or option.startswith(IGNORED_PREFIXES):
                log.debug("mount option %s ignored", option)
            else:
                rest.append(option)
    if rest:
        out += ["-o", ",".join(rest)]
    return out


def expand_mount_argv(argv: Sequence[str], parser: argparse.ArgumentParser) -> list[str]:
    """``argv`` of the ``xetfs`` command with a ``mount`` sub-command's ``-o`` lists expanded (else as is)."""
    args = list(argv)
    if not args or args[0] != "mount":
        return args
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return ["mount", *expand_options(args[1:], option_table(sub.choices["mount"]))]
