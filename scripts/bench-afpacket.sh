#!/usr/bin/env bash
# ferroce over AF_PACKET against kernel TCP on the same veth pair between two namespaces, in
# the same run: `ferroce perf write bw` at 64 KiB messages, one packet per frame and with the
# port's `gso` option (runs of packets leave as one segmented UDP datagram), versus iperf3
# with 64 KiB writes. Root only. Prints the rates and the ratios (issue 4's target: ferroce
# >= 0.8 x TCP).
#   scripts/bench-afpacket.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-5}
bin=target/release/ferroce
[ -x "$bin" ] || cargo build -q --release -p ferroce-cli
p=frbench
trap 'scripts/netns-pair.sh down $p' EXIT
scripts/netns-pair.sh down $p
scripts/netns-pair.sh up $p >/dev/null
ip netns exec $p-b iperf3 -s -1 -p 5201 >/dev/null 2>&1 &
sleep 0.5
tcp=$(ip netns exec $p-a iperf3 -c 192.168.77.2 -p 5201 -t "$secs" -l 65536 -J |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"] / 1e9)')
wait
roce() { # $1: device option
  ip netns exec $p-b "$bin" perf write bw --device "afpacket:$p-vb $1" --server --duration "$secs" \
    --size 65536 --json >/dev/null &
  sleep 0.3
  ip netns exec $p-a "$bin" perf write bw --device "afpacket:$p-va $1" --connect 192.168.77.2 \
    --duration "$secs" --size 65536 --json |
    python3 -c 'import json,sys; r=json.load(sys.stdin); assert r["verified"], r; print(r["bw_avg_gbps"])'
  wait
}
plain=$(roce "")
gso=$(roce gso)
python3 -c "
t, p, g = $tcp, $plain, $gso
print(f'kernel TCP (iperf3, 64 KiB writes):            {t:6.2f} Gbit/s')
print(f'ferroce RC WRITE 64 KiB, a frame per packet:   {p:6.2f} Gbit/s  ratio {p/t:.2f}')
print(f'ferroce RC WRITE 64 KiB, gso:                  {g:6.2f} Gbit/s  ratio {g/t:.2f} (target 0.8)')"
