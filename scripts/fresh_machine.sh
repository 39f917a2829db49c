#!/usr/bin/env bash
# Runs the README's two commands (or any command) on a fresh Debian 12, as a new user meets remat:
# a minimal root made now by debootstrap (--variant=minbase bookworm), the commit at HEAD cloned
# into it, and the command run there as root (chroot inside a mount and PID namespace of its own,
# so its mounts and processes end with it). Nothing installed on this machine reaches the run: the
# root has Debian's base system only, and scripts/setup.sh installs the rest inside it. Besides
# name resolution and the certificate authorities this machine added to its own
# (/usr/local/share/ca-certificates: a network's TLS proxy), two things
# come from outside, read-only or as a cache: the CUDA toolkit (not a Debian package) where this
# machine has one at /usr/local/cuda, and downloaded .deb files (REMAT_DEB_CACHE, default
# /var/cache/remat-fresh: linked into the root before the run and back after it, so that runs side
# by side do not share apt's lock), so a second run does not download them again.
#
#   scripts/fresh_machine.sh                      scripts/demo.sh, then scripts/test.sh (CI)
#   scripts/fresh_machine.sh -- bash scripts/demo.sh --epochs 5
#   scripts/fresh_machine.sh --keep DIR -- CMD    build the root in DIR and keep it afterwards
#
# Needs: root, the right to make mount namespaces (unshare) and debootstrap (installed here when
# missing), and about 6 GiB of disk for the root and its builds. The work tree's uncommitted changes
# are not in the clone: commit first.
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$PWD"

keep=""
while [ $# -gt 0 ]; do
  case "$1" in
    --keep) keep="$2"; shift 2 ;;
    --) shift; break ;;
    -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) break ;;
  esac
done
if [ $# -eq 0 ]; then set -- bash -c 'bash scripts/demo.sh && bash scripts/test.sh'; fi

say() { printf 'fresh_machine: %s\n' "$*" >&2; }
if [ "$(id -u)" -ne 0 ]; then
  say "needs root (debootstrap, chroot and mounts): run it as root or under sudo"; exit 2
fi
if ! unshare --mount --pid --fork true 2>/dev/null; then
  say "needs the right to make mount and PID namespaces (unshare --mount --pid; in a container:"
  say "--privileged or CAP_SYS_ADMIN), which this machine refuses"; exit 2
fi
if ! command -v debootstrap >/dev/null 2>&1; then
  say "installing debootstrap (Debian's package) on this machine"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null 2>&1 ||
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null; }
fi
if [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then
  say "the work tree has uncommitted changes; the fresh machine gets HEAD ($(git rev-parse --short HEAD)) only"
fi

mirror="${REMAT_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
cache="${REMAT_DEB_CACHE:-/var/cache/remat-fresh}"
mkdir -p "$cache/debootstrap" "$cache/apt"
if [ -n "$keep" ]; then
  mkdir -p "$keep"; base="$(cd "$keep" && pwd)"
else
  base="$(mktemp -d /var/tmp/remat-fresh.XXXXXX)"
fi
root="$base/root"

cleanup() {
  local status=$?
  # The namespace's mounts went with it; refuse to delete through one that did not.
  if [ -d "$root" ] && findmnt -rn -o TARGET | grep -q "^$root"; then
    say "mounts remain under $root; not deleting it"; exit "$status"
  fi
  if [ -z "$keep" ]; then rm -rf --one-file-system "$base"; fi
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

start=$SECONDS
if [ ! -x "$root/usr/bin/apt-get" ]; then
  say "debootstrap --variant=minbase bookworm into $root"
  debootstrap --variant=minbase --cache-dir="$cache/debootstrap" bookworm "$root" "$mirror" >"$base/debootstrap.log" 2>&1 ||
    { tail -20 "$base/debootstrap.log" >&2; exit 1; }
fi
# What a Debian 12 installation has besides the base: the updates and security suites, a hosts
# file, name resolution.
cat >"$root/etc/apt/sources.list" <<EOF
deb $mirror bookworm main
deb $mirror bookworm-updates main
deb ${REMAT_DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security} bookworm-security main
EOF
printf '127.0.0.1\tlocalhost\n::1\t\tlocalhost ip6-localhost ip6-loopback\n' >"$root/etc/hosts"
cp -L /etc/resolv.conf "$root/etc/resolv.conf"
# The certificate authorities this machine added itself (Debian's place for them): a network whose
# TLS goes through a proxy of its own needs its authority on every machine in it. The root's
# ca-certificates, once scripts/setup.sh installs it, takes them in from there (scripts/onednn3.sh
# fetches from PyPI over TLS).
if [ -d /usr/local/share/ca-certificates ]; then
  mkdir -p "$root/usr/local/share/ca-certificates"
  cp -r /usr/local/share/ca-certificates/. "$root/usr/local/share/ca-certificates/"
fi
rm -rf "$root/root/remat"
git clone -q --no-local --no-hardlinks "$repo" "$root/root/remat"
git -C "$root/root/remat" checkout -q "$(git rev-parse HEAD)"
say "root ready in $((SECONDS - start)) s; running: $*"

# The .deb cache: hard links where the cache and the root share a file system, copies otherwise.
share_debs() { find "$1" -maxdepth 1 -name '*.deb' -exec cp -n -l -t "$2" {} + 2>/dev/null ||
                 find "$1" -maxdepth 1 -name '*.deb' -exec cp -n -t "$2" {} +; }
share_debs "$cache/apt" "$root/var/cache/apt/archives"

# The CUDA toolkit as its installer leaves it: at /usr/local/cuda, its libraries known to the
# dynamic linker (an nvcc-built program finds libcudart through ld.so.conf.d, not an rpath).
cuda=""
if [ -x /usr/local/cuda/bin/nvcc ]; then
  cuda="$(readlink -f /usr/local/cuda)"
  printf '/usr/local/cuda/lib64\n' >"$root/etc/ld.so.conf.d/zz-cuda.conf"
fi
# The environment of a new login, plus CI's flag and the OpenBLAS settings this machine needs
# (older OpenBLAS builds compute wrong results on some processors without them).
envs=(PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root TERM=dumb LANG=C.UTF-8)
for v in CI OPENBLAS_CORETYPE OPENBLAS_L2_SIZE; do
  if [ -n "${!v:-}" ]; then envs+=("$v=${!v}"); fi
done

status=0
unshare --mount --pid --fork --kill-child --propagation private /usr/bin/env \
  ROOT="$root" CUDA="$cuda" bash -euc '
  mount -t proc proc "$ROOT/proc"
  mount -t sysfs -o ro sys "$ROOT/sys"
  mount --rbind /dev "$ROOT/dev"
  if [ -n "$CUDA" ]; then
    mkdir -p "$ROOT/usr/local/cuda"
    mount --rbind "$CUDA" "$ROOT/usr/local/cuda"
    mount -o remount,bind,ro "$ROOT/usr/local/cuda"
    chroot "$ROOT" /sbin/ldconfig
  fi
  envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  exec chroot "$ROOT" /usr/bin/env -i "${envs[@]}" bash -c "cd /root/remat && exec \"\$@\"" bash "$@"
' bash "${envs[@]}" -- "$@" || status=$?
share_debs "$root/var/cache/apt/archives" "$cache/apt" || true
exit "$status"
