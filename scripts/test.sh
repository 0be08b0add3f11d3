#!/usr/bin/env bash
# Run the test suite: scripts/test.sh [--unit] [pytest arguments...]
#
#   scripts/test.sh           set up (scripts/setup.sh), then the whole suite: unit, integration, e2e
#   scripts/test.sh --unit    the unit tier only (pytest -m unit): no root, no FUSE, no servers, under a
#                             minute.  Run by a user who is not root, it sets nothing up and uses the
#                             .venv that root's scripts/setup.sh made (see docs/development.md).
#
# The tiers are pytest markers (pyproject.toml); -m picks others, e.g. -m 'not e2e'.  A run that
# collects no tests is a failure, not a pass.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

die() {
    echo "test.sh: error: $*" >&2
    exit 1
}

unit=0
args=()
for arg in "$@"; do
    if [[ $arg == --unit ]]; then unit=1; else args+=("$arg"); fi
done
((unit)) && args=(-m unit "${args[@]}")

if ((unit)) && [[ $(id -u) -ne 0 ]]; then
    # Setting up needs root (apt packages) or write access to .venv: use what is there, or say what to run.
    [[ -e .venv/bin/python || -L .venv/bin/python ]] ||
        die "no .venv here: first run, as root, scripts/setup.sh (PYTHON=/usr/bin/python3 scripts/setup.sh" \
            "makes one other users can run)"
    .venv/bin/python -c 'import xetfs, pytest, hypothesis' 2>/dev/null ||
        die "$(id -un) cannot run .venv/bin/python (its Python is in $(sed -n "s/^home = //p" .venv/pyvenv.cfg)) or it lacks the test" \
            "extra: as root, run scripts/setup.sh, with a Python every user can run: rm -rf .venv &&" \
            "PYTHON=/usr/bin/python3 scripts/setup.sh"
    # pytest keeps its cache in the checkout: without write access there, do without it.
    [[ -w . ]] || args=(-p no:cacheprovider "${args[@]}")
else
    # The suite needs no xetfs on PATH: only demo.sh and setup.sh itself link it there.
    XETFS_BIN_DIR=${XETFS_BIN_DIR:-none} bash scripts/setup.sh
fi

# The whole suite runs in a few processes (pytest-xdist): most tests wait on mounts, servers and
# subprocesses, so one more process than CPUs keeps them busy; at most 4, since each process builds the
# session's stores and starts its servers once.  A file's tests run in one process (--dist loadfile): its
# module's stores are built once.  Arguments that pick tests run them in one process.
parallel=()
if ((${#args[@]} == 0)); then
    procs=$(($(nproc) + 1))
    parallel=(-n $((procs > 4 ? 4 : procs)) --dist loadfile)
fi

status=0
.venv/bin/python -m pytest "${parallel[@]}" "${args[@]}" || status=$?
if ((status == 5)); then
    echo "test.sh: error: pytest collected no tests (arguments: ${*:-none})" >&2
    exit 1
fi
exit "$status"
