#!/usr/bin/env bash
# ferroce over AF_PACKET against kernel TCP on the same veth pair between two namespaces:
# `ferroce perf write bw` at 64 KiB messages, one packet per frame and with the port's `gso`
# option (runs of packets leave as one segmented UDP datagram), versus iperf3 with 64 KiB
# writes. The three alternate for ROUNDS rounds, so a noisy machine skews all of them alike;
# prints each round, the medians and their ratio, and the median of the rounds' ratios (each
# round's runs are next to each other in time). Root only. Issue 4's target: ferroce >= 0.8 x
# TCP.
#   scripts/bench-afpacket.sh [SECONDS] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-5}
rounds=${2:-3}
bin=target/release/ferroce
[ -x "$bin" ] || cargo build -q --release -p ferroce-cli
p=frbench
trap 'scripts/netns-pair.sh down $p' EXIT
scripts/netns-pair.sh down $p
scripts/netns-pair.sh up $p >/dev/null
tcp() {
  ip netns exec $p-b iperf3 -s -1 -p 5201 >/dev/null 2>&1 &
  sleep 0.5
  ip netns exec $p-a iperf3 -c 192.168.77.2 -p 5201 -t "$secs" -l 65536 -J |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"] / 1e9)'
  wait
}
roce() { # $1: device option
  ip netns exec $p-b "$bin" perf write bw --device "afpacket:$p-vb $1" --server --duration "$secs" \
    --size 65536 --json >/dev/null &
  sleep 0.3
  ip netns exec $p-a "$bin" perf write bw --device "afpacket:$p-va $1" --connect 192.168.77.2 \
    --duration "$secs" --size 65536 --json |
    python3 -c 'import json,sys; r=json.load(sys.stdin); assert r["verified"], r; print(r["bw_avg_gbps"])'
  wait
}
rows=""
for r in $(seq "$rounds"); do
  rows="$rows($(tcp),$(roce ""),$(roce gso)),"
done
python3 -c "
import statistics as st
rows = [$rows]
print('round  kernel TCP  ferroce/frame  ferroce/gso   gso/TCP   (Gbit/s, 64 KiB messages/writes)')
for i, (t, p, g) in enumerate(rows, 1):
    print(f'{i:5}  {t:10.2f}  {p:13.2f}  {g:11.2f}  {g/t:8.2f}')
t, p, g = (st.median(c) for c in zip(*rows))
print(f'median {t:9.2f}  {p:13.2f}  {g:11.2f}  {g/t:8.2f}')
print(f'ratio of medians: a frame per packet {p/t:.2f}, gso {g/t:.2f} (target 0.8)')
print(f'median of the rounds\' gso/TCP ratios: {st.median(g / t for t, _, g in rows):.2f}')"
