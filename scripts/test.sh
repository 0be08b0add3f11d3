#!/usr/bin/env bash
# Run the test suite: scripts/test.sh [pytest arguments...]
# Sets up the environment first (scripts/setup.sh).  A run that collects no
# tests is a failure, not a pass.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

# The suite needs no xetfs on PATH: only demo.sh and setup.sh itself link it there.
XETFS_BIN_DIR=${XETFS_BIN_DIR:-none} bash scripts/setup.sh

status=0
.venv/bin/python -m pytest "$@" || status=$?
if ((status == 5)); then
    echo "test.sh: error: pytest collected no tests (arguments: ${*:-none})" >&2
    exit 1
fi
exit "$status"
