#!/usr/bin/env bash
# Proves the README on a brand-new machine: builds a minimal Debian 12
# (debootstrap --variant=minbase bookworm) in a folder, puts a clean clone of
# the committed HEAD inside, and runs the README's two commands exactly as
# the README writes them (the fenced blocks under "## Two commands"): the
# main command, with a short run, then the test command. Needs root.
#
#   scripts/fresh-machine-test.sh             both commands
#   scripts/fresh-machine-test.sh --main-only only the main command
#
# Environment:
#   PTRAIN_FRESH_ROOT   where the machine is built (default
#                       /var/tmp/ptrain-fresh-machine); left in place for
#                       inspection, replaced by the next run
#   PTRAIN_FRESH_CACHE  downloaded .deb files, reused between runs (default
#                       /var/cache/ptrain-fresh-machine)
#   PTRAIN_DEMO_STEPS   steps of the main command's job (default 60)
#
# Prints each phase's time; exits non-zero when any phase fails.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && git rev-parse --show-toplevel)
root=${PTRAIN_FRESH_ROOT:-/var/tmp/ptrain-fresh-machine}
cache=${PTRAIN_FRESH_CACHE:-/var/cache/ptrain-fresh-machine}
demo_steps=${PTRAIN_DEMO_STEPS:-60}
main_only=0
for arg in "$@"; do
  case $arg in
    --main-only) main_only=1 ;;
    *) echo "fresh-machine-test: unknown argument '$arg'" >&2; exit 2 ;;
  esac
done
[[ $(id -u) == 0 ]] || { echo "fresh-machine-test: needs root (debootstrap, chroot, mounts)" >&2; exit 2; }

phases=()
phase_start=$SECONDS
# end_phase NAME: records how long the phase that just ended took.
end_phase() {
  local took=$((SECONDS - phase_start))
  phases+=("$(printf '%-28s %5d s' "$1" "$took")")
  echo "fresh-machine-test: phase '$1' took ${took} s"
  phase_start=$SECONDS
}
summary() {
  local rc=$?
  echo "fresh-machine-test: phase times"
  for p in "${phases[@]}"; do echo "  $p"; done
  printf '  %-28s %5d s\n' total "$SECONDS"
  echo "fresh-machine-test: exit $rc"
}

# The README's two commands, as written.
mapfile -d '' -t blocks < <(awk '
  /^## / { in_section = ($0 == "## Two commands") }
  in_section && /^```sh$/ { in_block = 1; text = ""; next }
  in_section && in_block && /^```$/ { in_block = 0; printf "%s%c", text, 0; next }
  in_section && in_block { text = (text == "" ? $0 : text "\n" $0) }
' "$repo/README.md")
if ((${#blocks[@]} != 2)); then
  echo "fresh-machine-test: README.md must hold exactly two sh blocks under '## Two commands' (found ${#blocks[@]})" >&2
  exit 2
fi
main_cmd=${blocks[0]}
test_cmd=${blocks[1]}
echo "fresh-machine-test: main command: $main_cmd"
echo "fresh-machine-test: test command: $test_cmd"

if ! command -v debootstrap >/dev/null; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
fi

# The archives this machine's apt already uses, read from its sources (both
# the one-line and the deb822 format).
archives=$(grep -rhoE '^(deb|URIs:)[^#]*https?://[^ ]+' /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null \
  | grep -oE 'https?://[^ ]+' | sed 's:/*$::' || true)
mirror=$(grep -E '/debian$' <<<"$archives" | head -n 1 || true)
security=$(grep -E '/debian-security$' <<<"$archives" | head -n 1 || true)
[[ -n $mirror ]] || { echo "fresh-machine-test: no Debian archive in /etc/apt/sources*" >&2; exit 2; }
[[ -n $security ]] || security=${mirror%/debian}/debian-security

# Processes still running inside the machine (a server a test left behind)
# would keep its mounts busy.
kill_inside() {
  local pid link
  for pid in /proc/[0-9]*; do
    link=$(readlink "$pid/root" 2>/dev/null) || continue
    [[ $link == "$root" || $link == "$root/"* ]] && kill -9 "${pid#/proc/}" 2>/dev/null || true
  done
}
unmount_all() {
  kill_inside
  local m
  for m in usr/local/cuda var/cache/apt/archives run/netns dev sys proc; do
    umount -l "$root/$m" 2>/dev/null || true
  done
}
trap 'unmount_all; summary' EXIT

unmount_all
# --one-file-system: never follow a mount that failed to come off.
rm -rf --one-file-system "$root"
mkdir -p "$root" "$cache"
echo "fresh-machine-test: debootstrap --variant=minbase bookworm $mirror -> $root"
if ! debootstrap --variant=minbase --cache-dir="$cache" bookworm "$root" "$mirror" >"$root.debootstrap.log" 2>&1; then
  tail -n 20 "$root.debootstrap.log"
  exit 1
fi
printf 'deb %s bookworm main\ndeb %s bookworm-updates main\ndeb %s bookworm-security main\n' \
  "$mirror" "$mirror" "$security" >"$root/etc/apt/sources.list"
cp /etc/resolv.conf "$root/etc/resolv.conf"
cp /etc/hosts "$root/etc/hosts"
mount -t proc proc "$root/proc"
mount --rbind /sys "$root/sys"
mount --rbind /dev "$root/dev"
mkdir -p "$root/var/cache/apt/archives"
mount --bind "$cache" "$root/var/cache/apt/archives"
# Keep downloaded packages for the next run (Debian's docker-clean-style
# configs would delete them).
echo 'Binary::apt::APT::Keep-Downloaded-Packages "true";' >"$root/etc/apt/apt.conf.d/90keep-debs"
# The CUDA toolkit is part of the machine image here, not a Debian package:
# lend it read-only so that the CUDA code is built as it is on this machine.
if [[ -d /usr/local/cuda/bin ]]; then
  mkdir -p "$root/usr/local/cuda"
  mount --bind -o ro "$(readlink -f /usr/local/cuda)" "$root/usr/local/cuda"
fi
end_phase "debootstrap"

# What any user's machine has before ptrain's own set-up: git, to clone.
chroot "$root" bash -c 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends git ca-certificates >/dev/null'
head=$(git -C "$repo" rev-parse HEAD)
git clone -q --no-hardlinks "$repo" "$root/srv/ptrain"
git -C "$root/srv/ptrain" checkout -q "$head"
echo "fresh-machine-test: clean clone of $head"
end_phase "git + clone"

# in_machine CMD: runs CMD from the clone's root with a clean environment,
# as a user's login shell would.
in_machine() {
  local keep=()
  [[ -n ${OPENBLAS_CORETYPE:-} ]] && keep+=("OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE")
  chroot "$root" env -i HOME=/root TERM=dumb CI=true LANG=C.UTF-8 \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PTRAIN_DEMO_STEPS="$demo_steps" "${keep[@]}" \
    bash -c "cd /srv/ptrain && $1"
}

echo "fresh-machine-test: main command (PTRAIN_DEMO_STEPS=$demo_steps): $main_cmd"
in_machine "$main_cmd"
end_phase "main command"
((main_only)) && exit 0

echo "fresh-machine-test: test command: $test_cmd"
in_machine "$test_cmd"
end_phase "test command"
