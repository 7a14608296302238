#!/usr/bin/env bash
# Checks that the README's two commands pass on a fresh clone on a machine with nothing installed
# beforehand but Debian 12's base system:
#   1. debootstrap --variant=minbase bookworm into WORK/root (the smallest Debian: required
#      packages and apt; no compiler, no Python, no sudo);
#   2. `git clone` of this repository's HEAD (committed files only, as a new user gets them) to
#      /src/kvlab inside it, and ../shared (or $KVLAB_SHARED_DIR) mounted read-only at
#      /src/shared next to it, where the tests look for it;
#   3. inside the chroot, as root: the README's first command (scripts/setup.sh installs the
#      Debian packages from the mirror and builds; then the quickstart), then its second command
#      with no network at all (unshare --net): setup.sh must find everything installed, and no
#      test may need the network.
# Prints each phase with its duration and exits non-zero when a command fails. Mounts are
# undone on any exit; the chroot stays in WORK for inspection (--clean removes it afterwards).
#   sudo scripts/fresh_machine_check.sh [--clean] [WORK]     (default WORK: /var/tmp/kvlab-fresh)
#   KVLAB_DEBIAN_MIRROR=url   mirror for debootstrap and apt (default http://deb.debian.org/debian)
# Needs root, debootstrap (apt-get install debootstrap), git and network access to the mirror.
set -euo pipefail
clean=0
if [[ ${1:-} == --clean ]]; then clean=1; shift; fi
repo=$(cd "$(dirname "$0")/.." && pwd)
work=$(realpath -m "${1:-/var/tmp/kvlab-fresh}")
mirror=${KVLAB_DEBIAN_MIRROR:-http://deb.debian.org/debian}
shared=${KVLAB_SHARED_DIR:-$repo/../shared}
root=$work/root
[[ $(id -u) -eq 0 ]] || { echo "fresh_machine_check: needs root (debootstrap, chroot, mounts)" >&2; exit 2; }
command -v debootstrap >/dev/null || { echo "fresh_machine_check: needs debootstrap (apt-get install debootstrap)" >&2; exit 2; }

t0=$SECONDS
phase() { echo "== fresh_machine_check [$((SECONDS - t0)) s] $*"; }

mounted=()
cleanup() {
  local i
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount -R -l "${mounted[i]}" 2>/dev/null || true; done
  if ((clean)); then rm -rf "$work"; fi
}
trap cleanup EXIT
mnt() {  # mnt TARGET MOUNT-ARGS...: mount and remember for cleanup
  local target=$1; shift
  mkdir -p "$target"
  mount "$@" "$target"
  mounted+=("$target")
}

if [[ -e $root ]]; then
  # A root from an earlier run could hold packages installed by that run: never reuse it.
  findmnt -R -n -o TARGET "$root" >/dev/null 2>&1 && { echo "fresh_machine_check: $root has mounts; unmount first" >&2; exit 2; }
  rm -rf "$root"
fi
mkdir -p "$work"
phase "debootstrap --variant=minbase bookworm $root ($mirror)"
debootstrap --variant=minbase bookworm "$root" "$mirror" >"$work/debootstrap.log" 2>&1 ||
  { tail -n 20 "$work/debootstrap.log" >&2; exit 1; }
cat >"$root/etc/apt/sources.list" <<EOF
deb $mirror bookworm main
deb $mirror bookworm-updates main
deb ${mirror%/debian}/debian-security bookworm-security main
EOF
cp /etc/resolv.conf "$root/etc/resolv.conf"
echo "   base system: $(chroot "$root" dpkg-query -W -f='.' | wc -c) packages; compiler: $(chroot "$root" sh -c 'command -v cc || echo none')," \
  "python3: $(chroot "$root" sh -c 'command -v python3 || echo none')"

phase "git clone of $(git -C "$repo" rev-parse --short HEAD) ($(git -C "$repo" log -1 --format=%s | cut -c1-60))"
mkdir -p "$root/src"
git clone -q --no-hardlinks "$repo" "$root/src/kvlab"
git -C "$root/src/kvlab" checkout -q "$(git -C "$repo" rev-parse HEAD)"
if [[ -d $shared ]]; then
  mnt "$root/src/shared" --bind "$shared"
  mount -o remount,bind,ro "$root/src/shared"
  echo "   ../shared: $shared, read-only"
else
  echo "   ../shared: absent ($shared); the tests that need it skip"
fi
mnt "$root/proc" -t proc proc
mnt "$root/sys" --rbind /sys
mount --make-rslave "$root/sys"
mnt "$root/dev" --rbind /dev
mount --make-rslave "$root/dev"

run_in() {  # run_in [unshare-args...] -- COMMAND: in the chroot, at the clone, login-like env
  local pre=()
  while [[ $1 != -- ]]; do pre+=("$1"); shift; done
  shift
  "${pre[@]}" chroot "$root" /usr/bin/env -i HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    LANG=C.UTF-8 TERM=dumb /bin/bash -c "cd /src/kvlab && $1"
}

readme_cmd() {  # the README's n-th command (first ```bash block)
  awk '/^```bash/{b=1; next} /^```/{if (b) exit} b' "$root/src/kvlab/README.md" | sed -n "${1}p"
}
cmd1=$(readme_cmd 1)
cmd2=$(readme_cmd 2)
[[ -n $cmd1 && -n $cmd2 ]] || { echo "fresh_machine_check: README's two commands not found" >&2; exit 1; }

phase "README command 1: $cmd1"
s=$SECONDS
status=0
run_in -- "$cmd1" >"$work/command1.log" 2>&1 || status=$?
tail -n 40 "$work/command1.log"
echo "   command 1: exit $status, $((SECONDS - s)) s (log: $work/command1.log)"
((status == 0)) || exit 1

phase "README command 2 (no network): $cmd2"
s=$SECONDS
status=0
run_in unshare --net -- "$cmd2" >"$work/command2.log" 2>&1 || status=$?
grep -E "tests passed|tests failed|The following tests|Failed|\(Failed\)|\*\*\*" "$work/command2.log" | tail -n 30 || true
echo "   command 2: exit $status, $((SECONDS - s)) s (log: $work/command2.log)"
((status == 0)) || exit 1
phase "done: both README commands pass on a fresh Debian 12 (minbase) clone"
