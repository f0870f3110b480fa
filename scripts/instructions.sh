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
  # An older commit without the example measures with this one's (public API only).
  cp -n examples/instructions.rs "$tree/examples/instructions.rs"
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
  acks=$(callgrind_annotate --inclusive=yes "$out.cg" 2>/dev/null |
    awk '/requester_receives/ && !found { gsub(",", "", $1); print $1; found = 1 }')
  echo "$case $n $total ${acks:-0} $(cat "$out.json")"
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
for line in open(counts):
    case, n, total, acks, js = line.split(" ", 4)
    runs.setdefault(case, []).append((int(n), int(total), int(acks), json.loads(js)))
fig = {}
def per(case, unit):
    (n1, t1, a1, j1), (n2, t2, a2, j2) = sorted(runs[case])
    return (t2 - t1) / ((n2 - n1) * unit), (a2 - a1), (j2["frames_b_to_a"] - j1["frames_b_to_a"])
fig["write64_per_message"], ack_instr, acks = per("write64", 1)
fig["ack_received"] = ack_instr / acks
messages = sorted(runs["write64"])[1][0] - sorted(runs["write64"])[0][0]
fig["acks_per_message_write64"] = acks / messages
fig["ack_received_per_message"] = ack_instr / messages
fig["send64_per_message"], _, _ = per("send64", 1)
fig["read64_per_message"], _, _ = per("read64", 1)
fig["write1m_per_kib"], _, _ = per("write1m", 1024)
print(f"instructions (callgrind), {desc}")
rows = [
    ("64 B RC WRITE, both ends, per message", "write64_per_message"),
    ("64 B RC SEND, both ends, per message", "send64_per_message"),
    ("64 B RC READ, both ends, per message", "read64_per_message"),
    ("an ACK received (requester), per ACK", "ack_received"),
    ("  the same, per 64 B WRITE it acknowledges", "ack_received_per_message"),
    ("1 MiB WRITE at 4 KiB MTU, per KiB", "write1m_per_kib"),
]
for what, k in rows:
    print(f"  {what:<42} {fig[k]:>10.1f}")
print(f"  ({fig['acks_per_message_write64']:.3f} ACKs per 64 B WRITE)")
if out:
    json.dump({"commit": desc, **fig}, open(out, "w"), indent=1)
PY
