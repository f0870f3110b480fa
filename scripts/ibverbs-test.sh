#!/usr/bin/env bash
# Unmodified rdma-core programs over ferroce's libibverbs.so.1 (issue 7): builds the library,
# puts it alone in target/ibverbs/, creates two namespaces joined by a veth pair and runs the
# programs there with LD_LIBRARY_PATH pointing at it and FERROCE_DEVICES naming the veth end.
# Every check fails the script. Root only; needs ibverbs-utils (the test command installs it).
#   scripts/ibverbs-test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build -q --release -p ferroce-ibverbs
lib=$PWD/target/ibverbs
mkdir -p "$lib"
cp target/release/libibverbs.so "$lib/libibverbs.so.1"

p=fribv
trap 'scripts/netns-pair.sh down $p' EXIT
scripts/netns-pair.sh down $p
scripts/netns-pair.sh up $p >/dev/null
fail() { echo "FAIL: $*" >&2; exit 1; }
# run NS DEVICE PROGRAM ARGS...: PROGRAM in namespace NS over ferroce device DEVICE.
run() {
  local ns=$1 dev=$2
  shift 2
  ip netns exec "$p-$ns" env LD_LIBRARY_PATH="$lib" FERROCE_DEVICES="$dev" "$@"
}

echo "== ibv_devices"
out=$(run a afpacket:$p-va ibv_devices)
echo "$out"
grep -Eq '^\s+ferroce0\s+[0-9a-f]{16}$' <<<"$out" || fail "ibv_devices does not list ferroce0"

echo "== ibv_devinfo -v"
out=$(run a afpacket:$p-va ibv_devinfo -v)
grep -q 'fw_ver:.*ferroce' <<<"$out" || fail "ibv_devinfo did not load ferroce's library"
grep -q 'state:.*PORT_ACTIVE' <<<"$out" || fail "port not active"
grep -q 'link_layer:.*Ethernet' <<<"$out" || fail "link layer not Ethernet"
grep -q 'active_mtu:.*4096' <<<"$out" || fail "active MTU is not 4096 on a 9000-byte veth"
grep -q 'GID\[  0\]:.*::ffff:192.168.77.1, RoCE v2' <<<"$out" || fail "GID 0 is not the RoCEv2 GID of 192.168.77.1"
echo "$out" | grep -E 'hca_id|fw_ver|state|link_layer|active_mtu|GID'

echo "== a device that does not exist"
if run a afpacket:nosuchif ibv_devinfo >/dev/null 2>/tmp/ferroce-ibv-err; then
  fail "ibv_devinfo opened a missing interface"
fi
grep -q "no network interface named 'nosuchif'" /tmp/ferroce-ibv-err || fail "no clear message: $(cat /tmp/ferroce-ibv-err)"
echo "ok: $(head -1 /tmp/ferroce-ibv-err)"
echo "libibverbs drop-in: all checks passed"
