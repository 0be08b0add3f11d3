#!/usr/bin/env bash
# Set everything up, mount the bundled sample store, read files through the
# mount with ordinary tools, show the live counters, and unmount.  Installs
# the runtime and what `xetfs pack` needs (the pack extra), not the test tools.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --extras pack
user_path=$PATH
export PATH="$PWD/.venv/bin:$PATH"

store="$PWD/sample/store"
mnt="$(mktemp -d /tmp/xetfs-demo.XXXXXX)"
cleanup() {
    if grep -qs " $mnt fuse" /proc/mounts; then xetfs umount "$mnt"; fi
    rmdir "$mnt" 2>/dev/null || true
}
trap cleanup EXIT

run() { printf '\n$ %s\n' "$*"; "$@"; }

run xetfs mount "$store" "$mnt"
run ls -la "$mnt" "$mnt/model"
run head -c 300 "$mnt/README.md"
echo
run cat "$mnt/model/config.json"
printf '\n$ sha256sum through the mount, checked against the sums recorded in the store\n'
(cd "$mnt" && xetfs_sums="$(python3 -c '
import json, sys
for e in json.load(open(sys.argv[1])):
    if e.get("type") == "file":
        print(e["lfs"]["oid"] + "  " + e["path"])
' "$store/xetfs-manifest.json")" && sha256sum -c <<<"$xetfs_sums")
run getfattr -n user.xet.hash --absolute-names "$mnt/model/model.safetensors"
run dd if="$mnt/data/random.bin" of=/dev/null bs=1M
run xetfs stats "$mnt"
run xetfs umount "$mnt"
ours=$PWD/.venv/bin/xetfs
if ! found=$(PATH=$user_path command -v xetfs); then
    printf '\nxetfs is not on your PATH: run it as %s (%s mount STORE MOUNTPOINT, %s umount MOUNTPOINT)\n' \
        "$ours" "$ours" "$ours"
elif [[ $(readlink -f "$found") == "$(readlink -f "$ours")" ]]; then
    printf '\nxetfs is on your PATH (%s): try xetfs --help (xetfs mount STORE MOUNTPOINT, xetfs umount MOUNTPOINT)\n' \
        "$found"
else
    printf '\nthe xetfs on your PATH (%s) is not this checkout'"'"'s: run this one as %s (%s mount STORE MOUNTPOINT, %s umount MOUNTPOINT)\n' \
        "$found" "$ours" "$ours" "$ours"
fi
