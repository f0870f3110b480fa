#!/usr/bin/env bash
# ferroce over AF_PACKET against kernel TCP on the same veth pair between two namespaces, in
# the same run: `ferroce perf write bw` at 64 KiB messages versus iperf3 with 64 KiB writes.
# Root only. Prints both rates and their ratio (issue 4's target: ferroce >= 0.8 x TCP).
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
ip netns exec $p-b "$bin" perf write bw --device afpacket:$p-vb --server --duration "$secs" --size 65536 --json >/dev/null &
sleep 0.3
roce=$(ip netns exec $p-a "$bin" perf write bw --device afpacket:$p-va --connect 192.168.77.2 \
  --duration "$secs" --size 65536 --json |
  python3 -c 'import json,sys; r=json.load(sys.stdin); assert r["verified"], r; print(r["bw_avg_gbps"])')
wait
python3 -c "t=$tcp; r=$roce; print(f'kernel TCP (iperf3, 64 KiB writes): {t:.2f} Gbit/s'); print(f'ferroce RC WRITE over AF_PACKET, 64 KiB: {r:.2f} Gbit/s'); print(f'ratio: {r/t:.2f} (target 0.8)')"
