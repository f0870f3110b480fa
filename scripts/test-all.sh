#!/usr/bin/env bash
# The full ferroce test suite, as CI runs it (.ci/run calls exactly this).
#
# On a fresh Debian 12 machine it first installs what it needs: Debian packages (libdpdk-dev,
# libclang-dev and pkg-config for the DPDK driver's build, libibverbs-dev and librdmacm-dev for the drop-ins'
# types, ibverbs-utils, rdmacm-utils, perftest and python3-pyverbs (rdma-core's own tests) to
# run over it, binutils to compare its ABI, tshark for wire checks, python3-venv), scapy from PyPI into target/ci-venv, and cargo-fuzz from crates.io. Then:
# format, lint and the crates' import circles; every test of the workspace (the DPDK driver
# built in, the 2^24-PSN run included); the unmodified-program suites over the drop-ins; the
# wire cross-check against tshark and scapy; the scenarios' checks; a bounded fuzz run; a build
# of every benchmark.
#
# One build serves it all: the whole workspace, every target, the DPDK driver built in, in the
# `ci-test` profile (dev's debug assertions and overflow checks at opt-level 1). The tests run
# from it, and the scripts run its programs (FERROCE_PROFILE and FERROCE_BUILD tell them), so
# the drop-ins run under unmodified programs with their debug assertions on. The fuzzers run
# one at a time, niced, beside the steps after the build, which leave a core idle.
#
# Environment: FUZZ_SECONDS (default 90) bounds the frame-parser fuzz run; the QP target gets
# half of it. The fuzzers share the machine with the steps beside them, so a second of theirs
# runs about half the inputs a second alone did. At 120 the fuzz lane outlasted every other
# step by 30 s on a fresh machine; at 90 it ends before them.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never
export FERROCE_PROFILE=ci-test
export FERROCE_BUILD="--workspace --all-targets --features dpdk"
bin=target/ci-test/ferroce
# Each step says how long the one before it took; the end lists them all (where CI's time
# goes).
timings=()
step_name=""
step_start=$SECONDS
# cpu_s: the CPU seconds (user + system) of every child the script has waited for so far, in
# $cpu. `times` must run in this shell: in a subshell it counts only the subshell's children.
cpu_file=$(mktemp)
cpu=0
cpu_s() {
  times >"$cpu_file"
  cpu=$(awk 'NR == 2 { t = 0; for (i = 1; i <= 2; i++) { split($i, a, /[ms]/); t += a[1] * 60 + a[2] } printf "%d", t }' "$cpu_file")
}
step_cpu=0
step() {
  if [ -n "$step_name" ]; then
    local took=$((SECONDS - step_start))
    cpu_s
    local used=$((cpu - step_cpu))
    printf '    (%d s, %d CPU s)\n' "$took" "$used"
    timings+=("$(printf '%5d s %5d CPU s  %s' "$took" "$used" "$step_name")")
  fi
  step_name=$1
  step_start=$SECONDS
  cpu_s
  step_cpu=$cpu
  printf '\n==> %s\n' "$*"
}

step "system packages (the crates and cargo-fuzz fetched meanwhile)"
bg_logs=$(mktemp -d)
cargo fetch -q >"$bg_logs/fetch" 2>&1 &
fetch_pid=$!
fuzz_pid=""
if ! command -v cargo-fuzz >/dev/null 2>&1; then
  cargo install -q --locked cargo-fuzz >"$bg_logs/cargo-fuzz" 2>&1 &
  fuzz_pid=$!
fi
need_pkgs=()
for p in pkg-config libdpdk-dev libisal-dev libclang-dev libibverbs-dev librdmacm-dev rdmacm-utils ibverbs-utils perftest python3-pyverbs binutils tshark python3-venv python3-pip iproute2 iperf3 iputils-ping ethtool; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need_pkgs+=("$p")
done
if [ ${#need_pkgs[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "installing: ${need_pkgs[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}" >/dev/null
else
  echo "all present"
fi
wait $fetch_pid || { cat "$bg_logs/fetch"; exit 1; }

step "python venv with scapy"
venv=target/ci-venv
if ! "$venv/bin/python" -c 'import scapy.contrib.roce, scapy; assert tuple(map(int, scapy.VERSION.split(".")[:2])) >= (2, 6)' 2>/dev/null; then
  py=/usr/bin/python3
  [ -x "$py" ] || py=python3
  mkdir -p target
  "$py" -m venv "$venv"
  "$venv/bin/pip" install -q 'scapy==2.8.0'
fi
"$venv/bin/python" -c 'import scapy; print("scapy", scapy.VERSION)'

step "cargo tools"
if [ -n "$fuzz_pid" ]; then
  wait $fuzz_pid || { cat "$bg_logs/cargo-fuzz"; exit 1; }
fi
cargo fuzz --version

step "format, lint, and import circles within each crate"
cargo fmt --all -- --check
scripts/module-cycles.py */src
cargo clippy -q --workspace --all-targets -- -D warnings
cargo clippy -q --workspace --all-targets --features dpdk,isal -- -D warnings

step "the build: every target of the workspace (benchmarks and examples included), the DPDK driver built in"
read -r -a build <<<"$FERROCE_BUILD"
cargo build -q --profile ci-test "${build[@]}"

# The fuzzers: built, then run one after another, niced, on what CPU the steps from here on
# leave (the tests and the drop-in suites mostly wait on each other's programs); the fuzz
# step at the end waits for them. fuzz_run TARGET SECONDS: one fuzzer; its summary lines, and
# 1 when it found a failing input.
mkdir -p fuzz/corpus/parse_frame fuzz/corpus/qp_frames fuzz/corpus/gso_split fuzz/corpus/sdr_packets fuzz/seeds/sdr_packets fuzz/corpus/cm_mad fuzz/seeds/cm_mad fuzz/corpus/shm_ring fuzz/corpus/service_msgs fuzz/seeds/service_msgs
fuzz_run() {
  (cd fuzz && nice -n 19 cargo fuzz run "$1" -s none "corpus/$1" "seeds/$1" -- \
    -max_total_time="$2" -print_final_stats=1 2>&1 | grep -E "^(#[0-9]+ +DONE|stat::number_of_executed_units|Done )|ERROR|panicked" ) || {
    echo "fuzzing $1 found a failing input (see fuzz/artifacts/$1/)"; return 1; }
}
f=${FUZZ_SECONDS:-90}
( (cd fuzz && nice -n 19 cargo fuzz build -s none) && fuzz_run parse_frame "$f" &&
  fuzz_run qp_frames "$((f / 2))" && fuzz_run gso_split "$((f / 3))" &&
  fuzz_run sdr_packets "$((f / 3))" && fuzz_run cm_mad "$((f / 4))" &&
  fuzz_run shm_ring "$((f / 6))" && fuzz_run service_msgs "$((f / 6))") >"$bg_logs/fuzz" 2>&1 &
fuzz_lane=$!

step "tests (DPDK: bindgen + shim against the system libdpdk; net_ring, net_af_packet, memif, tap and virtio-user vdevs, no hugepages)"
cargo test --profile ci-test --workspace --features dpdk
# The run through the whole 24-bit PSN space: 2^24 packets, ignored where debug assertions
# are on unless asked for.
cargo test -q --profile ci-test --workspace --features dpdk --test transport_psn_wrap -- --ignored 2>&1 | grep -E "test result|panicked|FAILED"
# EAL keeps a runtime directory per --file-prefix; the tests' prefixes all start ferroce-.
rm -rf /var/run/dpdk/ferroce-* 2>/dev/null || true

step "SDR's erasure codec on the system ISA-L (libisal-dev, bindgen): the codec's test and every SDR test of the libraries and the CLI"
# The whole workspace's selection with ISA-L added, so only what ISA-L changes is rebuilt.
cargo test -q --profile ci-test --workspace --features dpdk,isal --lib --test cli --test library -- rebuilds_any_m_losses sdr 2>&1 |
  grep -E "test result: ok. [1-9]|panicked|FAILED"


step "libibverbs drop-in: unmodified rdma-core programs over ferroce (two namespaces, veth)"
scripts/ibverbs-test.sh

step "librdmacm drop-in: unmodified rdma_cm programs (rping, ucmatose, udaddy, cmtime, perftest -R) and tshark on their CM MADs"
scripts/rdmacm-test.sh

step "the drop-in's schemes: ib_write_bw -R with FERROCE_SCHEME=sr,spray=4 through a lossy user-space switch, against IBTA's"
scripts/scheme-veth.sh

step "rdma-core's own test suite (python3-pyverbs, rdma-core 44) on the drop-in, veth in a namespace"
/usr/bin/python3 scripts/rdma-core-tests.py --json target/rdma-core-tests.json

step "ferroce serve: unmodified pingpongs, perftest and rdma_cm programs through a service (AF_PACKET, DPDK net_af_packet with the mlx5 PMD loaded, DPDK memif), the drop-ins as thin clients"
scripts/service-test.sh

step "rdma-core's own tests through a service (the modules it carries whole; docs/service.md has the full table)"
/usr/bin/python3 scripts/rdma-core-tests.py --lib target/ibverbs-thin --service "target/$FERROCE_PROFILE/ferroce" \
  test_addr test_atomic test_cq_events test_cqex test_device test_flow test_fork test_parent_domain \
  test_pd test_qp test_rdmacm test_relaxed_ordering test_shared_pd

step "wire cross-check with tshark and scapy"
SCAPY_PYTHON="$venv/bin/python" FERROCE_BIN=$bin scripts/check-vectors.sh

step "perf on the simulated fabric (the README's main job)"
$bin perf write bw
$bin perf write bw --json | "$venv/bin/python" -c '
import json, sys
r = json.load(sys.stdin)
assert r["verified"] and r["iterations"] == 5000 and r["bw_avg_gbps"] > 50, r
print("perf write bw:", round(r["bw_avg_gbps"], 2), "Gb/s virtual,", round(r["wall_gbps"], 2), "Gb/s processed per wall-clock second")'

step "congestion control between two ferroce processes over veth: a tc-shaped bridge and ferroce's switch"
scripts/cc-veth.sh 1 2 4 dcqcn-ferroce

step "SDR: the cross-continent scenario, short grid, measured against the completion-time model"
$bin scenario sdr --size 8MiB,32MiB --drop 1e-4,1e-3,1e-2 --runs 40 --check --json | "$venv/bin/python" -c '
import json, sys
r = json.load(sys.stdin)
for p in r["points"]:
    assert p["verified"], p
    assert p["model_checked"] is not False, p
    print("%-7s %6.0e %5dMiB mean %5.2fx model %5.2fx inflation %.3f" % (p["scheme"], p["drop"], p["size_bytes"] >> 20, p["mean_slowdown"], p["model_mean_slowdown"], p["inflation"]))'

step "examples/rc_pingpong (ibv_rc_pingpong on ferroce's verbs API, simulated fabric)"
target/ci-test/examples/rc_pingpong

step "demo"
$bin demo --json | "$venv/bin/python" -c '
import json, sys
r = json.load(sys.stdin)
assert r["frames_sent"] == 20000 and r["receiver"]["valid"] > 0, r
print("demo:", r["receiver"]["valid"], "valid frames of", r["frames_sent"])'

step "fuzz the frame parser for ${FUZZ_SECONDS:-90} s, the QP for half that, the gso splitter and the SDR receiver for a third each, the CM MAD parser for a quarter, the service's shared ring and its messages for a sixth each (built and run beside the steps since the build)"
fuzz_rc=0
wait $fuzz_lane || fuzz_rc=$?
cat "$bg_logs/fuzz"
[ $fuzz_rc -eq 0 ] || exit 1

step "done"
echo "time per step:"
printf '%s\n' "${timings[@]}"
printf '%5d s  in all\n' "$SECONDS"
echo
echo "test-all: every step passed"
