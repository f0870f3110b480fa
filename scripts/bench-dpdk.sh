#!/usr/bin/env bash
# Issue 5's benchmark, in one run (root; two cores, one busy-polling process per core):
#  1. on a veth pair between two namespaces: kernel TCP (iperf3, 64 KiB writes), ferroce's
#     AF_PACKET driver, and ferroce over DPDK's net_af_packet, copy and zero-copy transmit;
#  2. between two processes over net_memif: RC WRITE goodput at 64 KiB (copy and zero-copy),
#     SDR goodput at 64 KiB and its ratio to WRITE's, RC WRITE message rate at 64 B, and
#     beside them the frame rate of a bare DPDK forwarder (dpdk-testpmd txonly -> rxonly,
#     64 B frames) on the same memif and the ratio of the two (issue 38).
# Installs dpdk-dev (for dpdk-testpmd) and builds the release CLI with the dpdk feature.
#   scripts/bench-dpdk.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-5}
bin=target/release/ferroce
cargo build -q --release -p ferroce-cli --features dpdk
command -v dpdk-testpmd >/dev/null ||
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends dpdk-dev >/dev/null
command -v iperf3 >/dev/null ||
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends iperf3 >/dev/null
p=frbdpdk
tag=$$
cleanup() {
  scripts/netns-pair.sh down $p
  rm -rf /var/run/dpdk/frb-* /tmp/frb-*.sock
}
trap cleanup EXIT
cleanup
scripts/netns-pair.sh up $p >/dev/null
eal() { # core prefix vdev
  echo "-l $1 --no-pci --no-huge -m 512 --file-prefix=frb-$2-$tag --log-level=error --vdev=$3"
}
gbps() { python3 -c 'import json,sys; r=json.load(sys.stdin); assert r["verified"], r; print("%.2f" % r["bw_avg_gbps"])'; }
mmsg() { python3 -c 'import json,sys; r=json.load(sys.stdin); assert r["verified"], r; print("%.2f" % r["msg_rate_mpps"])'; }

# 1. The veth pair.
ip netns exec $p-b iperf3 -s -1 -p 5201 >/dev/null 2>&1 &
sleep 0.5
tcp=$(ip netns exec $p-a iperf3 -c 192.168.77.2 -p 5201 -t "$secs" -l 65536 -J |
  python3 -c 'import json,sys; print("%.2f" % (json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"] / 1e9))')
wait
veth() { # server-device client-device mtu server-address
  ip netns exec $p-b "$bin" perf write bw --device "$1" --server --duration "$secs" --size 65536 \
    --mtu "$3" --port 18600 --json >/dev/null &
  sleep 0.5
  ip netns exec $p-a "$bin" perf write bw --device "$2" --connect "$4" --port 18600 \
    --duration "$secs" --size 65536 --mtu "$3" --json | gbps
  wait
}
afp=$(veth afpacket:$p-vb afpacket:$p-va 4096 192.168.77.2)
afp1k=$(veth afpacket:$p-vb afpacket:$p-va 1024 192.168.77.2)
db="dpdk:$(eal 1 b net_af_packet0,iface=$p-vb) @192.168.77.12"
da="dpdk:$(eal 0 a net_af_packet0,iface=$p-va) @192.168.77.11"
# A DPDK end exchanges QP endpoints over its own smoltcp TCP, at its own address.
dcopy=$(veth "$db" "$da" 1024 192.168.77.12)
dzc=$(veth "$db zerocopy" "$da zerocopy" 1024 192.168.77.12)

# 2. memif between two processes.
memif() { # verb size extra-device-options perf-args... (--iters N in them replaces the duration)
  local sock=/tmp/frb-memif-$tag.sock opt=$3 verb=$1 size=$2
  shift 3
  local run=(--duration "$secs")
  [ "${1:-}" = --iters ] && run=()
  rm -f "$sock"
  "$bin" perf "$verb" bw --device "dpdk:$(eal 1 s net_memif0,role=server,socket=$sock,socket-abstract=no) @10.1.0.2 $opt" \
    --server --size "$size" "${run[@]}" --port 18601 --json "$@" >/dev/null &
  while [ ! -e "$sock" ]; do sleep 0.05; done
  "$bin" perf "$verb" bw --device "dpdk:$(eal 0 c net_memif0,role=client,socket=$sock,socket-abstract=no) @10.1.0.1 $opt" \
    --connect 10.1.0.2 --size "$size" "${run[@]}" --port 18601 --json "$@"
  wait
  rm -f "$sock"
}
m64k=$(memif write 65536 "" | gbps)
# SDR against a plain WRITE stream of the same 64 KiB messages (perf sdr runs a number of
# messages, not a duration: enough for about the same time).
msdr=$(memif sdr 65536 "" --iters $((secs * 25000)) | gbps)
m64kz=$(memif write 65536 zerocopy | gbps)
m64=$(memif write 64 "" --tx-depth 512 | mmsg)
sock=/tmp/frb-tp-$tag.sock
rm -f "$sock"
timeout -s INT $((secs + 4)) dpdk-testpmd -l 0,1 --main-lcore 0 --no-pci --no-huge -m 1024 \
  --file-prefix=frb-tps-$tag --log-level=error --vdev=net_memif0,role=server,socket=$sock,socket-abstract=no \
  -- --forward-mode=rxonly --stats-period=1 --no-mlockall --total-num-mbufs=16384 >/tmp/frb-tps.log 2>&1 &
# (testpmd may crash as its memif peer leaves at the end; its statistics are printed by then.)
while [ ! -e "$sock" ]; do sleep 0.05; done
timeout -s INT "$secs" dpdk-testpmd -l 0,1 --main-lcore 1 --no-pci --no-huge -m 1024 \
  --file-prefix=frb-tpc-$tag --log-level=error --vdev=net_memif0,role=client,socket=$sock,socket-abstract=no \
  -- --forward-mode=txonly --txpkts=64 --stats-period=1 --no-mlockall --total-num-mbufs=16384 >/dev/null 2>&1 || true
{ wait; } 2>/dev/null || true
fwd=$(grep -o 'Rx-pps: *[0-9]*' /tmp/frb-tps.log | awk '{print $2}' | sort -n | tail -1)
fwd=$(python3 -c "print('%.2f' % ($fwd / 1e6))")

cat <<EOF
veth pair between two namespaces, RC WRITE 64 KiB (Gbit/s):
  kernel TCP (iperf3, 64 KiB writes)             $tcp
  ferroce AF_PACKET driver, 4 KiB / 1 KiB MTU    $afp / $afp1k
  ferroce DPDK net_af_packet, 1 KiB MTU, copy    $dcopy
  ferroce DPDK net_af_packet, 1 KiB MTU, zero-copy $dzc
net_memif between two processes:
  RC WRITE 64 KiB, copy / zero-copy (Gbit/s)     $m64k / $m64kz
  SDR 64 KiB (Gbit/s), and against WRITE         $msdr  ($(python3 -c "print('%.2f' % ($msdr / $m64k))")x)
  RC WRITE 64 B (million messages/s)             $m64
  bare forwarder, testpmd txonly->rxonly 64 B (Mpps) $fwd
  RC WRITE 64 B against the forwarder            $(python3 -c "print('%.3f' % ($m64 / $fwd))")x
EOF
