#!/usr/bin/env bash
# What native failover costs while nothing fails (issue 22): `ferroce perf write bw` on the
# simulated fabric, two ports per host, with and without a backup configured (every QP with
# the other port as its alternate path), interleaved ROUNDS times in one run; prints each
# pair's wall-clock message rate and the median ratio with/without (the machine's timings
# drift, a ratio taken in one run does not). A one-port run is printed beside for what the
# second port itself costs the simulator and the engine. Default: 64-byte WRITEs, 400000.
#   scripts/failover-cost.sh [ROUNDS] [SIZE] [ITERS]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5} size=${2:-64} iters=${3:-400000}
cargo build -q --release -p ferroce-cli
ferroce=target/release/ferroce
rate() {
  "$ferroce" perf write bw --size "$size" --iters "$iters" --json "$@" |
    python3 -c 'import json,sys; d=json.load(sys.stdin); assert d["verified"]; print(d["wall_msg_rate_mpps"])'
}
ratios=()
ports=()
for r in $(seq "$rounds"); do
  one=$(rate)
  without=$(rate --ports 2)
  with=$(rate --backup)
  ratio=$(python3 -c "print(f'{$with / $without:.4f}')")
  ratios+=("$ratio")
  ports+=("$(python3 -c "print(f'{$without / $one:.4f}')")")
  echo "round $r: one port $one, two ports $without, two ports with a backup $with M msg/s; backup/no backup $ratio"
done
python3 - "${ratios[*]}" "${ports[*]}" <<'PY'
import statistics, sys
r = [float(x) for x in sys.argv[1].split()]
p = [float(x) for x in sys.argv[2].split()]
print(f"median ratio with a backup / without (two ports each): {statistics.median(r):.4f}")
print(f"median ratio two ports / one port (no backup): {statistics.median(p):.4f}")
PY
