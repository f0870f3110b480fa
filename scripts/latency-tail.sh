#!/usr/bin/env bash
# The latency tail (issue 39): rounds of perftest's ib_{write,send,read}_lat through the drop-in
# and of `ferroce perf {write,send,read} lat`, between two namespaces joined by a veth pair
# (AF_PACKET), in both directions (server in a and client in b, then the other way round).
# Prints each round's min / typical / p99 / p99.9 / max in µs (for ferroce perf the typical is
# its p50) and, per test and direction, how many rounds kept p99.9 within 100 µs, the median
# and worst typical, and the typical against ferroce perf's p50 for the same operation.
# Exits 1 when a program fails; the figures themselves never fail it (they are measurements).
# Root only; needs perftest.
#   scripts/latency-tail.sh [ROUNDS] [TEST...]    (ROUNDS default 20; TEST e.g. ib_write_lat or
#                                                 perf-write; default all six)
# Environment: FERROCE_PROFILE (default release), ITERS (round trips per round, default 5000),
# LAT_JSON=FILE (every round as JSON lines), FERROCE_BIN (the `ferroce` binary to measure, by
# default this tree's; another build's, to compare two in one sitting), and any FERROCE_*
# setting, which reaches every program (e.g. FERROCE_ENGINE_SCHED=nice to raise engine
# threads).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-20}
shift || true
tests=("$@")
[ ${#tests[@]} -eq 0 ] && tests=(ib_write_lat ib_send_lat ib_read_lat perf-write perf-send perf-read)
iters=${ITERS:-5000}
profile=${FERROCE_PROFILE:-release}
read -r -a build <<<"${FERROCE_BUILD:--p ferroce-ibverbs -p ferroce-rdmacm -p ferroce-cli}"
cargo build -q --profile "$profile" "${build[@]}"
lib=$PWD/target/latency-tail-lib
mkdir -p "$lib"
rm -f "$lib"/*.so.1
cp "target/$profile/libibverbs.so" "$lib/libibverbs.so.1"
ferroce=${FERROCE_BIN:-$PWD/target/$profile/ferroce}

p=frlat
logs=$(mktemp -d)
trap 'scripts/netns-pair.sh down $p; rm -rf "$logs"' EXIT
scripts/netns-pair.sh down $p
scripts/netns-pair.sh up $p >/dev/null
addr() { [ "$1" = a ] && echo 192.168.77.1 || echo 192.168.77.2; }
other() { [ "$1" = a ] && echo b || echo a; }

# round TEST SERVER_NS N: one round; appends a JSON line to $logs/rounds.
round() {
  local t=$1 sns=$2 n=$3 cns
  cns=$(other "$sns")
  local out=$logs/$t.$sns.$n s=0 c=0
  case $t in
    ib_*)
      ip netns exec "$p-$sns" env LD_LIBRARY_PATH="$lib" FERROCE_DEVICES="afpacket:$p-v$sns" \
        timeout 120 "$t" -s 2 -n "$iters" >"$out.server" 2>&1 &
      local spid=$!
      for _ in $(seq 200); do
        ip netns exec "$p-$sns" ss -ltn | grep -q ':18515 ' && break
        sleep 0.05
      done
      ip netns exec "$p-$cns" env LD_LIBRARY_PATH="$lib" FERROCE_DEVICES="afpacket:$p-v$cns" \
        timeout 120 "$t" -s 2 -n "$iters" "$(addr "$sns")" >"$out.client" 2>&1 || c=$?
      wait $spid || s=$?
      ;;
    perf-*)
      local v=${t#perf-}
      ip netns exec "$p-$sns" timeout 120 "$ferroce" perf "$v" lat --size 2 --iters "$iters" \
        --device "afpacket:$p-v$sns" --server --json >"$out.server" 2>&1 &
      local spid=$!
      sleep 0.3
      ip netns exec "$p-$cns" timeout 120 "$ferroce" perf "$v" lat --size 2 --iters "$iters" \
        --device "afpacket:$p-v$cns" --connect "$(addr "$sns")" --json >"$out.client" \
        2>"$out.err" || c=$?
      wait $spid || s=$?
      ;;
    *) echo "unknown test $t" >&2; exit 2 ;;
  esac
  if [ $c -ne 0 ] || [ $s -ne 0 ]; then
    cat "$out".* >&2
    echo "FAIL: $t round $n, server in $sns (server exit $s, client exit $c)" >&2
    exit 1
  fi
  python3 - "$t" "$sns" "$n" "$out.client" "$logs/rounds" <<'EOF'
import json, sys
t, sns, n, path, rounds = sys.argv[1:]
text = open(path).read()
if t.startswith("ib_"):
    lines = text.splitlines()
    i = next(i for i, l in enumerate(lines) if l.strip().startswith("#bytes"))
    # bytes iters t_min t_max t_typical t_avg t_stdev p99 p99.9
    f = [float(x) for x in lines[i + 1].split()]
    r = dict(min=f[2], typ=f[4], p99=f[7], p999=f[8], max=f[3])
else:
    j = json.loads(text)
    assert j["verified"], j
    r = dict(min=j["lat_min_us"], typ=j["lat_p50_us"], p99=j["lat_p99_us"],
             p999=j["lat_p999_us"], max=j["lat_max_us"])
r.update(test=t, dir=f"server in {sns}", round=int(n))
with open(rounds, "a") as f:
    print(json.dumps(r), file=f)
figs = " ".join(f"{r[k]:>9.1f}" for k in ("min", "typ", "p99", "p999", "max"))
print(f"{t:<13} {r['dir']:<12} {r['round']:>3} {figs}")
EOF
}

printf '%-13s %-12s %3s %9s %9s %9s %9s %9s\n' test direction n min typical p99 p99.9 max
for t in "${tests[@]}"; do
  for sns in a b; do
    for n in $(seq "$rounds"); do
      round "$t" "$sns" "$n"
    done
  done
done
[ -n "${LAT_JSON:-}" ] && cp "$logs/rounds" "$LAT_JSON"

python3 - "$logs/rounds" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
groups = {}
for r in rows:
    groups.setdefault((r["test"], r["dir"]), []).append(r)
p50 = {}
for (t, d), rs in groups.items():
    if t.startswith("perf-"):
        p50.setdefault(t[5:], []).extend(r["typ"] for r in rs)
print()
print(f"{'test':<13} {'direction':<12} {'p99.9<=100':>10} {'typ med':>8} {'typ max':>8} "
      f"{'typ>2xmed':>9} {'p99.9 med':>9} {'p99.9 max':>9} {'typ/p50':>8}")
for (t, d), rs in groups.items():
    typs = [r["typ"] for r in rs]
    med = statistics.median(typs)
    ok = sum(r["p999"] <= 100 for r in rs)
    over = sum(x > 2 * med for x in typs)
    op = t[3:-4] if t.startswith("ib_") else t[5:]
    ratio = med / statistics.median(p50[op]) if op in p50 else float("nan")
    p999 = [r["p999"] for r in rs]
    print(f"{t:<13} {d:<12} {ok:>6}/{len(rs):<3} {med:>8.1f} {max(typs):>8.1f} {over:>9} "
          f"{statistics.median(p999):>9.1f} {max(p999):>9.1f} {ratio:>8.2f}")
EOF
