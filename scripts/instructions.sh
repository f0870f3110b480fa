#!/usr/bin/env bash
# Instructions per message on the per-packet paths (issue 38), counted by callgrind: the same
# binary and input give the same count whatever else the machine does, so a small gain shows
# where timings drifting by 30 % hide it.
#
#   scripts/instructions.sh [COMMIT]     default: the working tree as it is
#   scripts/instructions.sh --json F ... also writes the figures as JSON to F
#
# Builds examples/instructions.rs (release profile) at COMMIT, in bench-compare's worktree for
# it (target/bench-compare/tree-*; this script's copy of the example goes in when the commit
# has none), then runs each case under `valgrind --tool=callgrind` twice, with N1 and N2
# messages, and reports (I(N2) - I(N1)) / (N2 - N1): set-up falls out. Cases: 64 B RC WRITE,
# SEND and READ, both ends in one process (every frame built with its ICRC, parsed and
# checked); per KiB of a 1 MiB WRITE at 4 KiB MTU; and what the requester spends per ACK it
# receives (the inclusive cost of the example's `requester_receives` over the ACKs it took,
# in the 64 B WRITE case).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
json=""
if [ "${1:-}" = "--json" ]; then
  json=$2
  shift 2
fi
rev=${1:-.}
command -v valgrind >/dev/null || { echo "instructions.sh: needs valgrind (apt-get install valgrind)" >&2; exit 2; }

if [ "$rev" = "." ]; then
  tree=$root
  desc="the working tree ($(git rev-parse --short HEAD)+)"
else
  sha=$(git rev-parse --verify "$rev^{commit}") || { echo "instructions.sh: no commit $rev" >&2; exit 2; }
  tree=$root/target/bench-compare/tree-${sha:0:12}
  [ -d "$tree" ] || git worktree add -q --detach "$tree" "$sha" >&2
  desc="$rev ($(git rev-parse --short "$sha"))"
  # An older commit without the example measures with this one's (public API only), so
  # both sides of a comparison run the same program.
  git cat-file -e "$sha:examples/instructions.rs" 2>/dev/null ||
    cp examples/instructions.rs "$tree/examples/instructions.rs"
fi
(cd "$tree" && CARGO_TARGET_DIR=$tree/target cargo build -q --release --example instructions)
exe=$tree/target/release/examples/instructions
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# count CASE N: one line "CASE N TOTAL ACK_INCLUSIVE JSON" for the table.
count() {
  local case=$1 n=$2 out=$work/$1.$2
  valgrind --tool=callgrind --callgrind-out-file="$out.cg" "$exe" "$case" "$n" >"$out.json" 2>"$out.err" ||
    { cat "$out.err" >&2; exit 1; }
  local total acks
  total=$(awk '/^summary:/ { print $2 }' "$out.cg")
  # The four steps' inclusive costs, in the order the table wants them.
  local steps
  steps=$(callgrind_annotate --inclusive=yes "$out.cg" 2>/dev/null | awk '
    /instructions::(requester_sends|responder_receives|responder_sends|requester_receives) / {
      for (i = 1; i <= NF; i++) if ($i ~ /instructions::/) { f = $i; sub(/.*instructions::/, "", f); sub(/ .*/, "", f) }
      gsub(",", "", $1)
      if (!(f in cost)) cost[f] = $1
    }
    END { printf "%d %d %d %d", cost["requester_sends"], cost["responder_receives"], cost["responder_sends"], cost["requester_receives"] }')
  echo "$case $n $total $steps $(cat "$out.json")"
}

{
  for c in write64 send64 read64; do
    count $c 1024
    count $c 3072
  done
  count write1m 64
  count write1m 128
} >"$work/counts"

python3 - "$desc" "$json" "$work/counts" <<'PY'
import json, sys
desc, out, counts = sys.argv[1], sys.argv[2], sys.argv[3]
runs = {}
STEPS = ["requester_sends", "responder_receives", "responder_sends", "requester_receives"]
for line in open(counts):
    f = line.split(" ", 7)
    case, n, total = f[0], int(f[1]), int(f[2])
    steps = dict(zip(STEPS, map(int, f[3:7])))
    runs.setdefault(case, []).append((n, total, steps, json.loads(f[7])))
fig = {}
def per(case, unit):
    """Instructions per unit over the difference of the two runs, the total and each step."""
    (n1, t1, s1, j1), (n2, t2, s2, j2) = sorted(runs[case], key=lambda r: r[0])
    d = (n2 - n1) * unit
    return (t2 - t1) / d, {k: (s2[k] - s1[k]) / d for k in STEPS}, (j1, j2)
for case, unit in [("write64", 1), ("send64", 1), ("read64", 1), ("write1m", 1024)]:
    total, steps, js = per(case, unit)
    fig[case] = {"total": total, **steps}
    if case == "write64":
        (j1, j2) = js
        messages = sorted(runs[case], key=lambda r: r[0])
        acks = j2["frames_b_to_a"] - j1["frames_b_to_a"]
        n = messages[1][0] - messages[0][0]
        fig["ack_received"] = steps["requester_receives"] * n / acks
        fig["acks_per_write64"] = acks / n
print(f"instructions (callgrind), {desc}")
print(f"  {'per message (1 MiB WRITE: per KiB)':<36} {'total':>8} {'req. sends':>11} {'resp. rx':>9} {'resp. sends':>12} {'req. rx':>8}")
names = {"write64": "64 B RC WRITE, both ends", "send64": "64 B RC SEND, both ends",
         "read64": "64 B RC READ, both ends", "write1m": "1 MiB WRITE at 4 KiB MTU, per KiB"}
for case in ["write64", "send64", "read64", "write1m"]:
    x = fig[case]
    print(f"  {names[case]:<36} {x['total']:>8.1f} " + " ".join(f"{x[k]:>{w}.1f}" for k, w in zip(STEPS, [11, 9, 12, 8])))
print(f"  an ACK received (requester), per ACK: {fig['ack_received']:.1f} ({fig['acks_per_write64']:.4f} ACKs per 64 B WRITE)")
if out:
    json.dump({"commit": desc, **fig}, open(out, "w"), indent=1)
PY
