#!/usr/bin/env python3
"""Side-by-side benchmark: xetfs against hf_xet, a zero-work FUSE filesystem and plain files.

    .venv/bin/python scripts/bench.py              # 1 GiB per data set, 5 rounds (long)
    .venv/bin/python scripts/bench.py --quick      # a few minutes: 64 MiB, 3 rounds
    .venv/bin/python scripts/bench.py --quick --only load,parquet,fio,same-file
    .venv/bin/python scripts/bench.py --only cold,load --baseline main --json out.json

Needs root, /dev/fuse, fio, nginx and curl, and the bench extra (``scripts/setup.sh
--bench`` installs all of it).  Everything runs in one invocation on the same
machine and the same data.  Sections (``--only``), each in
``scripts/benchkit/sections/``:

  plain, peer, ceiling, cold, warm, random, parallel   whole-file dd and 4 KiB preads
  mount      `xetfs mount` time for many files and many terms
  load       a safetensors model: safe_open + get_tensor of every key
  parquet    duckdb and pyarrow, projection + filter
  fio        4 KiB randread (1 and 4 jobs) and 1 MiB sequential read
  same-file  1, 2 and 4 readers of one file at once
  parts      the parts alone: read, decode and hash every chunk in one loop
  remote     a store over nginx: curl (the wire), two HTTP clients, remote, disk-cache and local mounts
  remote-load  the load model over nginx and from the store directory (also run by remote)
  hub        a Hugging Face cache: import (pack --hub-cache), then load by repo id via a mount
  small-files  sha256sum of 3,000 small files (xetfs, over nginx too, the ceiling, plain files; cold and again),
               cp -r of them (local and over nginx);
               ls -lR, find and stat over 100,000 files; the daemon's memory per file
  first-read   a read started right after `xetfs mount` returns: first byte, first 100 MB, whole file
  serve      hf_hub_download through `xetfs serve`, beside hf_xet local:// and curl from nginx

Every section reports CPU seconds per GiB (the daemon, its decode workers,
the reading process; hf_xet and the ceiling daemon for reference) and, for
xetfs, its CPU per GiB over the ceiling daemon's plus the parts alone, and
how busy the cores were: (CPU seconds / cores) / wall seconds, in percent.

Rounds are interleaved: every round runs every measurement once, in a
rotated order, after unrecorded warm-up rounds; each cell is the median and
the spread [min-max] over the rounds, and ratios are taken per round.
``--baseline REF`` installs xetfs at commit REF into a temporary venv and
runs it in every xetfs measurement beside the working tree.

Two quirks of virtual machines with DAMON pageout are handled rather than
measured: files idle for ~30 s leave the page cache, so every input is read
again right before its measurement; and memory handed back to the host is
slow to touch again, so a reserve of touched memory is freed right before
each measurement (the memory primer; --no-primer to see the raw machine).
Every mount is unmounted when a measurement ends, fails or is interrupted.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchkit.cli import main

if __name__ == "__main__":
    sys.exit(main())
