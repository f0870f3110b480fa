#!/usr/bin/env bash
# What native failover costs while nothing fails (issue 22): `ferroce perf write bw` on the
# simulated fabric with and without a backup port configured (every QP with an alternate
# path), interleaved, ROUNDS times each, in one run; prints each pair's wall-clock message
# rate and the median ratio with/without (the machine's timings drift, the ratio taken in
# one run does not). Size and iterations as given (default 64-byte WRITEs, 200000).
#   scripts/failover-cost.sh [ROUNDS] [SIZE] [ITERS]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5} size=${2:-64} iters=${3:-200000}
cargo build -q --release -p ferroce-cli
ferroce=target/release/ferroce
ratios=()
for r in $(seq "$rounds"); do
  without=$("$ferroce" perf write bw --size "$size" --iters "$iters" --json | python3 -c 'import json,sys; d=json.load(sys.stdin); assert d["verified"]; print(d["wall_msg_rate_mpps"])')
  with=$("$ferroce" perf write bw --size "$size" --iters "$iters" --backup --json | python3 -c 'import json,sys; d=json.load(sys.stdin); assert d["verified"] and d["backup"]; print(d["wall_msg_rate_mpps"])')
  ratio=$(python3 -c "print(f'{$with / $without:.4f}')")
  ratios+=("$ratio")
  echo "round $r: without $without M msg/s, with a backup $with M msg/s, ratio $ratio"
done
python3 -c "import statistics,sys; print('median ratio (with/without):', statistics.median(map(float, sys.argv[1:])))" "${ratios[@]}"
