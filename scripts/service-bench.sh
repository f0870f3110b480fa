#!/usr/bin/env bash
# The price of the service (issue 37 item 6): unmodified perftest through `ferroce serve`
# against the same programs with the drop-in's engine in their own process, on the same veth
# pair, in one run, rounds alternating: ib_write_bw at 64 KiB (bandwidth), ib_write_bw at
# 64 B (message rate), ib_write_lat at 2 B (latency). Prints each round and the ratios
# (service / in-process). Root only.
#   scripts/service-bench.sh [ROUNDS]        (default 3)
#   FERROCE_PIN=1 scripts/service-bench.sh   services' engine threads on CPU 0, programs on CPU 1
# Then four ib_write_bw pairs at once through the same two services (one QP each, 64 KiB):
# each pair's bandwidth and Jain's fairness index over them.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
profile=${FERROCE_PROFILE:-release}
cargo build -q --profile "$profile" -p ferroce-cli -p ferroce-ibverbs
ferroce=$PWD/target/$profile/ferroce
lib=$PWD/target/ibverbs-bench
mkdir -p "$lib"
rm -f "$lib"/*.so.1
cp "target/$profile/libibverbs.so" "$lib/libibverbs.so.1"
p=frsvb
logs=$(mktemp -d)
svcs=()
cleanup() {
  for s in "${svcs[@]}"; do kill "$s" 2>/dev/null || true; done
  wait 2>/dev/null || true
  scripts/netns-pair.sh down $p
  rm -rf "$logs"
}
trap cleanup EXIT
scripts/netns-pair.sh down $p
scripts/netns-pair.sh up $p >/dev/null
pin_prog=()
pin_svc=()
if [ "${FERROCE_PIN:-0}" = 1 ]; then
  pin_svc=(taskset -c 0)
  pin_prog=(taskset -c 1)
fi
for ns in a b; do
  ip netns exec $p-$ns "${pin_svc[@]}" "$ferroce" serve --device "afpacket:$p-v$ns" \
    --socket "$logs/$ns.sock" --mode 0600 >/dev/null 2>&1 &
  svcs+=($!)
done
for ns in a b; do
  for _ in $(seq 200); do [ -S "$logs/$ns.sock" ] && break; sleep 0.05; done
done
# run MODE NS PROGRAM...: MODE "inproc" (the engine in the program) or "service".
run() {
  local mode=$1 ns=$2
  shift 2
  local env=(LD_LIBRARY_PATH="$lib")
  if [ "$mode" = service ]; then
    env+=(FERROCE_SERVICE="$logs/$ns.sock")
  else
    env+=(FERROCE_DEVICES="afpacket:$p-v$ns")
  fi
  ip netns exec $p-$ns env "${env[@]}" "${pin_prog[@]}" timeout 120 "$@"
}
# measure MODE PROGRAM ARGS...: the figure of one run (MB/s average, Mpps, or typical us).
measure() {
  local mode=$1
  shift
  run "$mode" a "$@" >"$logs/s.out" 2>&1 &
  local spid=$!
  for _ in $(seq 200); do ip netns exec $p-a ss -ltn | grep -q ':18515 ' && break; sleep 0.05; done
  run "$mode" b "$@" 192.168.77.1 >"$logs/c.out" 2>&1 || { cat "$logs/c.out" >&2; exit 1; }
  wait $spid || { cat "$logs/s.out" >&2; exit 1; }
  awk '/#bytes/ { lat = /t_typical/; getline; if (lat) print $5; else print $4 " " $5 }' "$logs/c.out"
}
declare -A sum
tests=(bw64k rate64 lat)
for r in $(seq "$rounds"); do
  for mode in inproc service; do
    bw=$(measure $mode ib_write_bw -x 0 -s 65536 -D 3 | awk '{print $1}')
    rate=$(measure $mode ib_write_bw -x 0 -s 64 -D 3 | awk '{print $2}')
    lat=$(measure $mode ib_write_lat -x 0 -s 2 -n 5000)
    printf 'round %d %-8s  64 KiB %9.1f MB/s   64 B %7.4f Mpps   latency %8.2f us typical\n' "$r" "$mode" "$bw" "$rate" "$lat"
    sum[$mode.bw64k]=$(python3 -c "print(${sum[$mode.bw64k]:-0} + $bw)")
    sum[$mode.rate64]=$(python3 -c "print(${sum[$mode.rate64]:-0} + $rate)")
    sum[$mode.lat]=$(python3 -c "print(${sum[$mode.lat]:-0} + $lat)")
  done
done
for t in "${tests[@]}"; do
  python3 -c "
i, s = ${sum[inproc.$t]}, ${sum[service.$t]}
name = {'bw64k': 'bandwidth at 64 KiB', 'rate64': 'message rate at 64 B', 'lat': 'typical latency at 2 B'}['$t']
print('%-24s service / in-process = %.3f  (means %.4g / %.4g over $rounds rounds)' % (name, s / i, s / $rounds, i / $rounds))"
done

echo "four programs on each side, one QP each, at once through the same services (ib_write_bw 64 KiB, 5 s)"
spids=()
for i in 0 1 2 3; do
  run service a ib_write_bw -x 0 -s 65536 -D 5 -p $((18600 + i)) >"$logs/f$i.s" 2>&1 &
  spids+=($!)
done
sleep 1
cpids=()
for i in 0 1 2 3; do
  run service b ib_write_bw -x 0 -s 65536 -D 5 -p $((18600 + i)) 192.168.77.1 >"$logs/f$i.c" 2>&1 &
  cpids+=($!)
done
for c in "${cpids[@]}" "${spids[@]}"; do wait "$c"; done
python3 - "$logs" <<'PY'
import sys
bws = []
for i in range(4):
    lines = open(f"{sys.argv[1]}/f{i}.c").read().splitlines()
    at = next(n for n, l in enumerate(lines) if "#bytes" in l)
    bws.append(float(lines[at + 1].split()[3]))
jain = sum(bws) ** 2 / (len(bws) * sum(b * b for b in bws))
print("  MB/s per program:", ", ".join("%.1f" % b for b in bws), "  sum %.1f" % sum(bws))
print("  Jain's fairness index %.4f" % jain)
PY
