#!/usr/bin/env bash
# Prepare this checkout (for the test suite, by default); safe to run again and again.
#
#   scripts/setup.sh                what the tests need (the test extras)
#   scripts/setup.sh --bench        and what scripts/bench.py needs (also: XETFS_SETUP_BENCH=1)
#   scripts/setup.sh --extras pack  the runtime and the extras named (comma-separated), e.g.
#                                   pack: what `xetfs pack` needs (scripts/demo.sh uses this)
#
# * as root with apt-get: the FUSE packages, nginx for the remote-store tests (test extras),
#   and fio with --bench (only when one is missing);
# * .venv in the repository root, made with python3 >= 3.11 (PYTHON=... to choose);
# * the project in editable mode with those extras, reinstalled only when
#   pyproject.toml changed or an extra is not installed yet (a stamp in .venv
#   holds their hash); extras installed before stay installed; the package's bytecode compiled.
set -euo pipefail

bench=${XETFS_SETUP_BENCH:-0}
extras=test
while (($#)); do
    case $1 in
    --bench) bench=1 ;;
    --extras)
        [[ $# -ge 2 && $2 =~ ^[a-z]+(,[a-z]+)*$ ]] || {
            echo "setup.sh: --extras takes a comma-separated list, e.g. --extras pack" >&2
            exit 2
        }
        extras=$2
        shift
        ;;
    --extras=*)
        extras=${1#--extras=}
        [[ $extras =~ ^[a-z]+(,[a-z]+)*$ ]] || {
            echo "setup.sh: --extras takes a comma-separated list, e.g. --extras pack" >&2
            exit 2
        }
        ;;
    -h | --help)
        sed -n '2,14p' "$0"
        exit 0
        ;;
    *)
        echo "setup.sh: unknown argument $1 (try --bench or --extras LIST)" >&2
        exit 2
        ;;
    esac
    shift
done
[[ $bench == 1 ]] && extras=$extras,bench

cd "$(dirname "${BASH_SOURCE[0]}")/.."

die() {
    echo "setup.sh: error: $*" >&2
    exit 1
}

# -- system packages ---------------------------------------------------------
PACKAGES=(fuse3 libfuse3-dev pkg-config attr)
[[ ,$extras, == *,test,* ]] && PACKAGES+=(nginx curl) # the remote-store tests
[[ $bench == 1 ]] && PACKAGES+=(fio)
if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null && command -v dpkg >/dev/null; then
    missing=()
    for pkg in "${PACKAGES[@]}"; do
        dpkg -s "$pkg" 2>/dev/null | grep -q '^Status: install ok installed' || missing+=("$pkg")
    done
    if ((${#missing[@]})); then
        echo "setup.sh: installing ${missing[*]}" >&2
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq >/dev/null || die "apt-get update failed"
        apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null ||
            die "apt-get install ${missing[*]} failed"
    fi
fi

# -- virtualenv --------------------------------------------------------------
new_enough() { "$1" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; }

if [[ ! -x .venv/bin/python ]]; then
    python=""
    for candidate in ${PYTHON:-} python3 python3.13 python3.12 python3.11; do
        if command -v "$candidate" >/dev/null && new_enough "$candidate"; then
            python=$candidate
            break
        fi
    done
    [[ -n $python ]] || die "no python3 >= 3.11 found (set PYTHON=/path/to/python3)"
    echo "setup.sh: creating .venv with $("$python" --version 2>&1)" >&2
    "$python" -m venv .venv || die "'$python -m venv .venv' failed (on Debian/Ubuntu: apt-get install python3-venv)"
fi
new_enough .venv/bin/python || die ".venv/bin/python is older than 3.11; remove .venv and run again"

# -- the project -------------------------------------------------------------
stamp=.venv/.xetfs-setup-stamp
# Extras installed before stay: a run that asks for fewer keeps them rather than reinstalling.
if [[ -f $stamp ]]; then
    before=$(sed -n 's/^[^ ]* \[\([a-z,]*\)\] .*/\1/p' "$stamp")
    extras=$extras${before:+,$before}
fi
extras=$(tr ',' '\n' <<<"$extras" | sort -u | paste -sd, -)
want="$(sha256sum pyproject.toml | cut -d' ' -f1) [$extras] $(.venv/bin/python -c 'import sys; print(sys.version)' | head -1)"
if [[ ! -f $stamp || $(<"$stamp") != "$want" ]] || ! .venv/bin/python -c 'import xetfs' 2>/dev/null; then
    echo "setup.sh: installing xetfs[$extras] into .venv" >&2
    log=$(mktemp)
    trap 'rm -f "$log"' EXIT
    if ! .venv/bin/python -m pip install --disable-pip-version-check -q -e ".[$extras]" >"$log" 2>&1; then
        cat "$log" >&2
        die "pip install -e '.[$extras]' failed"
    fi
    printf '%s\n' "$want" >"$stamp"
fi
# An editable install leaves the package's bytecode to be written when it is first imported, which never
# happens where PYTHONDONTWRITEBYTECODE is set (many container images): every daemon, decode worker and
# command would compile the sources again (about 0.15 s of CPU each).  Up to date files are left as they are.
.venv/bin/python -m compileall -q xetfs >/dev/null

# Whether a user who is neither the owner nor in the group can execute FILE (its real path): every
# directory above it must let others search it (root's home, where pyenv puts its Pythons, does not).
others_can_run() {  # FILE [MODE]: others may run FILE (MODE: the pattern its permissions must match)
    local path
    path=$(readlink -f "$1") || return 1
    [[ $(stat -c %A "$path") == ${2:-*x} ]] || return 1
    while [[ $path != / ]]; do
        path=$(dirname "$path")
        [[ $(stat -c %A "$path") == *[xt] ]] || return 1
    done
}

# -- the xetfs command on PATH -------------------------------------------------
# A link to .venv/bin/xetfs in /usr/local/bin (root, when writable) or
# ~/.local/bin, so that a new shell finds `xetfs`.  XETFS_BIN_DIR=DIR picks the
# directory, XETFS_BIN_DIR=none skips this.  A link of another checkout is
# left alone.
target="$PWD/.venv/bin/xetfs"
bin_dir=${XETFS_BIN_DIR:-}
if [[ -z $bin_dir ]]; then
    if [[ $(id -u) -eq 0 && -d /usr/local/bin && -w /usr/local/bin ]]; then
        bin_dir=/usr/local/bin
    else
        bin_dir="$HOME/.local/bin"
    fi
fi
if [[ $bin_dir != none ]]; then
    link="$bin_dir/xetfs"
    if [[ -L $link && $(readlink "$link") == "$target" ]]; then
        : # already ours
    elif [[ -e $link || -L $link ]] && ! { [[ -L $link ]] && [[ ! -e $link ]]; }; then
        echo "setup.sh: $link exists and is not this checkout's; run xetfs here as $target" >&2
    elif mkdir -p "$bin_dir" 2>/dev/null && ln -sfn "$target" "$link" 2>/dev/null; then
        echo "setup.sh: linked $link -> $target" >&2
    else
        echo "setup.sh: could not link $link; run xetfs as $target" >&2
    fi
    if [[ -L $link && $(readlink "$link") == "$target" ]]; then
        case ":$PATH:" in
        *":$bin_dir:"*) ;;
        *) echo "setup.sh: $bin_dir is not on your PATH; add it (export PATH=\"$bin_dir:\$PATH\") or run $target" >&2 ;;
        esac
    fi
fi
# The script, in the checkout, and the venv's Python, wherever it lives: root's setup is often for others too.
if [[ $(id -u) -eq 0 ]] && ! { others_can_run .venv/bin/xetfs '*r?x' && others_can_run .venv/bin/python; }; then
    echo "setup.sh: note: only root can run this xetfs: $target or .venv's Python" \
        "($(readlink -f .venv/bin/python)) is in a directory other users cannot enter.  Nothing to do if root is" \
        "the only user; for other users (or a mount that runs as one), make the venv with a Python everyone can" \
        "run, in a checkout they can read: rm -rf .venv && PYTHON=/usr/bin/python3 scripts/setup.sh" \
        "(see docs/mirrors.md)" >&2
fi
