#!/usr/bin/env bash
# CI's time on a fresh machine, measured on this one (issue 36): a new Debian 12 root from
# debootstrap with only what a fresh machine of this kind brings (gcc, g++, make, git, Debian's
# python3, the CA store, and the host's Rust toolchain bound in, with an empty cargo registry
# and no cargo-fuzz), a fresh clone of COMMIT (default HEAD) in it, and `.ci/run` in a chroot:
# it installs every Debian package, fetches every crate and builds cargo-fuzz itself.
#   scripts/ci-fresh-root.sh [COMMIT]    root only; needs debootstrap (installed if missing)
# The root lives in target/fresh-root (about 3 GB after the run) and is removed at the end
# unless FERROCE_KEEP_ROOT is set; CI's output goes to target/fresh-root.log. Prints CI's exit
# status and wall seconds last.
set -euo pipefail
cd "$(dirname "$0")/.."
commit=$(git rev-parse "${1:-HEAD}")
root=$PWD/target/fresh-root
log=$PWD/target/fresh-root.log
[ "$(id -u)" -eq 0 ] || { echo "ci-fresh-root.sh: run as root (it mounts and chroots)" >&2; exit 2; }
command -v debootstrap >/dev/null ||
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
# The mounts under the root (/dev, /sys and the toolchain are the host's own: removing the
# root with any of them still mounted would remove them).
mounts() { awk -v r="$root" '$2 == r || index($2, r "/") == 1 { print $2 }' /proc/self/mounts; }
remove_root() {
  # A process left in the root (a fuzzer, an engine) keeps its mounts busy.
  for p in /proc/[0-9]*; do
    [ "$(readlink "$p/root" 2>/dev/null)" = "$root" ] && kill -9 "${p#/proc/}" 2>/dev/null
  done
  # Killed processes let go of their mounts once they are gone: a few tries.
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    umount -R "$root" 2>/dev/null || true
    [ -z "$(mounts)" ] && break
    sleep 1
  done
  if [ -n "$(mounts)" ]; then
    echo "ci-fresh-root.sh: still mounted, $root left in place:" $(mounts) >&2
    return 1
  fi
  rm -rf "$root"
}
cleanup() {
  if [ -n "${FERROCE_KEEP_ROOT:-}" ]; then
    umount -R "$root" 2>/dev/null || true
  else
    remove_root || true
  fi
}
remove_root
trap cleanup EXIT
debootstrap --variant=minbase bookworm "$root" http://deb.debian.org/debian >/dev/null
# The root is a mount point of its own: the tests' namespaces run `mount --make-rslave /`.
mount --bind "$root" "$root"
cp /etc/resolv.conf "$root/etc/resolv.conf"
if [ -f /etc/apt/sources.list.d/debian.sources ]; then
  rm -f "$root/etc/apt/sources.list"
  cp /etc/apt/sources.list.d/debian.sources "$root/etc/apt/sources.list.d/"
fi
mount -t proc proc "$root/proc"
mount --rbind /sys "$root/sys" && mount --make-rslave "$root/sys"
mount --rbind /dev "$root/dev" && mount --make-rslave "$root/dev"
mount -t tmpfs tmpfs "$root/run"
rustup_home=${RUSTUP_HOME:-$HOME/.rustup}
mkdir -p "$root/root/.rustup" "$root/root/.cargo/bin"
mount --bind "$rustup_home" "$root/root/.rustup"
for t in cargo rustc rustup rustfmt cargo-fmt cargo-clippy clippy-driver rustdoc; do
  cp -a "${CARGO_HOME:-$HOME/.cargo}/bin/$t" "$root/root/.cargo/bin/"
done
chroot "$root" /bin/bash -c 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends gcc g++ make git ca-certificates python3 curl procps xz-utils file sudo' >/dev/null 2>&1
# This machine's registries are reached through a proxy with its own CA.
if ls /usr/local/share/ca-certificates/*.crt >/dev/null 2>&1; then
  mkdir -p "$root/usr/local/share/ca-certificates"
  cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
  chroot "$root" update-ca-certificates >/dev/null 2>&1
fi
git clone -q "$PWD" "$root/root/ci"
git -C "$root/root/ci" checkout -q "$commit"
echo "fresh root ready; .ci/run of $(git log --oneline -1 "$commit") in it (output: $log)"
rc=0
start=$(date +%s)
chroot "$root" /usr/bin/env -i HOME=/root TERM=dumb \
  PATH=/root/.cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  /bin/bash -c 'cd /root/ci && .ci/run' >"$log" 2>&1 || rc=$?
wall=$(($(date +%s) - start))
sed -n '/^time per step:/,$p' "$log"
echo "fresh-root CI: exit $rc, $wall s ($((wall / 60)) min $((wall % 60)) s)"
exit $rc
