#!/usr/bin/env bash
# Compares two commits' criterion benchmarks as ratios taken in one run.
#
#   scripts/bench-compare.sh [-r ROUNDS] [-b BENCH]... [-t SECONDS] [-f FILTER] BASE [HEAD]
#
# This machine's absolute timings drift by 30 % from hour to hour, so a figure from one hour
# against a figure from another says little. This script builds BASE and HEAD (default: the
# HEAD commit; `.` is the working tree as it is, uncommitted changes included) each in its
# own git worktree with its own target directory, then runs their benchmark binaries
# alternately, ROUNDS rounds (default 5; the order flips every round, so a drift in the
# machine's speed falls on both alike). Each benchmark's figure per side is the median over
# rounds of criterion's median; HEAD/BASE is the ratio of speeds (above 1: HEAD is faster).
# Lines a benchmark prints itself of the form "<what>: <N> bytes ..." (the idle QP footprint)
# are compared too. Last, a column of instructions per message from scripts/instructions.sh
# for both commits (callgrind: a count that does not drift; skipped without valgrind).
#
#   -r ROUNDS   rounds (default 5)
#   -b BENCH    a bench target of the root package; repeatable (default: transport)
#   -t SECONDS  criterion measurement time per benchmark and round (default 3)
#   -f FILTER   criterion filter (a regex over benchmark ids)
#
# Worktrees and builds live in target/bench-compare/ and are reused for the same commit.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

rounds=5
benches=()
secs=3
filter=""
while getopts "r:b:t:f:h" opt; do
  case "$opt" in
    r) rounds=$OPTARG ;;
    b) benches+=("$OPTARG") ;;
    t) secs=$OPTARG ;;
    f) filter=$OPTARG ;;
    *) sed -n '2,20p' "$0"; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
if [ $# -lt 1 ] || [ $# -gt 2 ]; then
  echo "bench-compare: give BASE and optionally HEAD (see the top of $0)" >&2
  exit 2
fi
[ ${#benches[@]} -gt 0 ] || benches=(transport)
base_rev=$1
head_rev=${2:-HEAD}

work=$root/target/bench-compare
mkdir -p "$work"

# Prints the directory to build REV in: a worktree at that commit, or the checkout for `.`.
tree_for() {
  local rev=$1
  if [ "$rev" = "." ]; then
    echo "$root"
    return
  fi
  local sha
  sha=$(git rev-parse --verify "$rev^{commit}") || { echo "bench-compare: no commit $rev" >&2; exit 2; }
  local dir=$work/tree-${sha:0:12}
  if [ ! -d "$dir" ]; then
    git worktree add -q --detach "$dir" "$sha" >&2
  fi
  echo "$dir"
}

# Builds BENCH in TREE and prints its executable.
build() {
  local tree=$1 bench=$2 target
  if [ "$tree" = "$root" ]; then target=$root/target; else target=$tree/target; fi
  (cd "$tree" && CARGO_TARGET_DIR=$target cargo bench --bench "$bench" --no-run \
      --message-format=json 2>/dev/null) |
    python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and "bench" in m["target"]["kind"]:
        print(m["executable"])
' | tail -n 1
}

declare -A bin
for side in base head; do
  rev=$base_rev
  [ "$side" = head ] && rev=$head_rev
  tree=$(tree_for "$rev")
  desc=$rev
  [ "$rev" = "." ] || desc="$rev ($(git rev-parse --short "$rev"))"
  for b in "${benches[@]}"; do
    echo "building $b for $side: $desc" >&2
    exe=$(build "$tree" "$b")
    if [ -z "$exe" ] || [ ! -x "$exe" ]; then
      echo "bench-compare: bench $b did not build at $desc" >&2
      exit 1
    fi
    bin[$side.$b]=$exe
    bin[$side.$b.tree]=$tree
  done
  [ "$side" = base ] && base_desc=$desc || head_desc=$desc
done

out=$work/run-$(date +%Y%m%d-%H%M%S)
mkdir -p "$out"
echo "results: $out" >&2
for ((r = 1; r <= rounds; r++)); do
  order=(base head)
  (( r % 2 == 0 )) && order=(head base)
  for side in "${order[@]}"; do
    for b in "${benches[@]}"; do
      echo "round $r/$rounds: $side $b" >&2
      dir=$out/$side/$r
      mkdir -p "$dir"
      # Criterion reads its CWD-relative paths nowhere we care about; CRITERION_HOME keeps
      # each run's estimates apart.
      (cd "${bin[$side.$b.tree]}" && CRITERION_HOME=$dir/criterion "${bin[$side.$b]}" --bench \
          --warm-up-time 1 --measurement-time "$secs" --noplot ${filter:+"$filter"}) \
        > "$dir/$b.stdout" 2> "$dir/$b.stderr"
    done
  done
done

python3 - "$out" "$rounds" "$base_desc" "$head_desc" <<'EOF'
import glob, json, os, re, statistics, sys

out, rounds, base_desc, head_desc = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]

def figures(side):
    """{benchmark id: [per-round (median ns, throughput)]}, {memory line: [bytes]}"""
    times, mem = {}, {}
    for r in range(1, rounds + 1):
        d = os.path.join(out, side, str(r))
        for est in glob.glob(os.path.join(d, "criterion", "**", "new", "estimates.json"), recursive=True):
            bench = json.load(open(os.path.join(os.path.dirname(est), "benchmark.json")))
            median = json.load(open(est))["median"]["point_estimate"]
            times.setdefault(bench["full_id"], []).append((median, bench.get("throughput")))
        for so in glob.glob(os.path.join(d, "*.stdout")):
            for line in open(so):
                m = re.match(r"^([^:]+): (\d+) bytes", line)
                if m:
                    mem.setdefault(m.group(1), []).append(int(m.group(2)))
    return times, mem

bt, bm = figures("base")
ht, hm = figures("head")

def speed(median_ns, tp):
    """A rate and its unit from criterion's median time per iteration."""
    if tp and "Bytes" in tp:
        return tp["Bytes"] / median_ns * 1e9 / 2**30, "GiB/s"
    if tp and "Elements" in tp:
        return tp["Elements"] / median_ns * 1e9 / 1e6, "M/s"
    return 1e9 / median_ns, "/s"

print(f"BASE {base_desc}  against  HEAD {head_desc}: {rounds} rounds, medians over rounds")
print("HEAD/BASE: ratio of speeds (above 1: HEAD faster); for bytes, ratio of sizes (below 1: HEAD smaller)")
print(f"{'benchmark':<44} {'BASE':>14} {'HEAD':>14} {'HEAD/BASE':>10}")
for bid in sorted(set(bt) | set(ht)):
    if bid not in bt or bid not in ht:
        print(f"{bid:<44} {'only in ' + ('HEAD' if bid in ht else 'BASE'):>30}")
        continue
    tp = bt[bid][0][1]
    b = statistics.median(m for m, _ in bt[bid])
    h = statistics.median(m for m, _ in ht[bid])
    bs, unit = speed(b, tp)
    hs, _ = speed(h, tp)
    print(f"{bid:<44} {bs:>9.3f} {unit:<4} {hs:>9.3f} {unit:<4} {b / h:>10.3f}")
    # The spread, so a reader sees how far one round's ratio strays.
    per_round = [bm_ / hm_ for (bm_, _), (hm_, _) in zip(bt[bid], ht[bid])]
    print(f"{'  per-round ratios':<44} " + " ".join(f"{x:.3f}" for x in per_round))
for what in sorted(set(bm) | set(hm)):
    b = int(statistics.median(bm.get(what, [0])))
    h = int(statistics.median(hm.get(what, [0])))
    ratio = f"{h / b:>10.3f}" if b else ""
    print(f"{what:<44} {b:>9} B    {h:>9} B    {ratio}")
EOF

# Instructions per message, both sides: the figure that does not drift.
if command -v valgrind >/dev/null; then
  scripts/instructions.sh --json "$out/instructions-base.json" "$base_rev" >/dev/null
  scripts/instructions.sh --json "$out/instructions-head.json" "$head_rev" >/dev/null
  python3 - "$out/instructions-base.json" "$out/instructions-head.json" <<'EOF'
import json, sys
b, h = (json.load(open(f)) for f in sys.argv[1:3])
print()
print("instructions (callgrind; HEAD/BASE below 1: HEAD runs fewer)")
rows = [("64 B RC WRITE, both ends, per message", "write64"), ("64 B RC SEND, both ends, per message", "send64"),
        ("64 B RC READ, both ends, per message", "read64"), ("1 MiB WRITE at 4 KiB MTU, per KiB", "write1m")]
for what, k in rows:
    print(f"{what:<44} {b[k]['total']:>9.1f}      {h[k]['total']:>9.1f}      {h[k]['total'] / b[k]['total']:>10.3f}")
print(f"{'an ACK received, per ACK':<44} {b['ack_received']:>9.1f}      {h['ack_received']:>9.1f}      {h['ack_received'] / b['ack_received']:>10.3f}")
EOF
fi
