#!/usr/bin/env bash
# The full ferroce test suite, as CI runs it (.ci/run calls exactly this).
#
# On a fresh Debian 12 machine it first installs what it needs: Debian packages (libdpdk-dev,
# libclang-dev and pkg-config for the DPDK driver's build, libibverbs-dev and librdmacm-dev for the drop-ins'
# types, ibverbs-utils, rdmacm-utils, perftest and python3-pyverbs (rdma-core's own tests) to
# run over it, binutils to compare its ABI, tshark for wire checks, python3-venv), scapy from PyPI into target/ci-venv, and cargo-fuzz from crates.io. Then:
# format and lint, every test of the workspace, the wire cross-check against tshark and
# scapy, a bounded fuzz run, the demo, a build of every benchmark, and the 2^24-PSN run
# optimized.
#
# Environment: FUZZ_SECONDS (default 60) bounds the frame-parser fuzz run; the QP target gets
# half of it.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never
# Each step says how long the one before it took; the end lists them all (where CI's time
# goes).
timings=()
step_name=""
step_start=$SECONDS
# cpu_s: the CPU seconds (user + system) of every child the script has waited for so far.
cpu_s() {
  times | awk 'NR == 2 { t = 0; for (i = 1; i <= 2; i++) { split($i, a, /[ms]/); t += a[1] * 60 + a[2] } printf "%d", t }'
}
step_cpu=0
step() {
  if [ -n "$step_name" ]; then
    local took=$((SECONDS - step_start)) cpu
    cpu=$(( $(cpu_s) - step_cpu ))
    printf '    (%d s, %d CPU s)\n' "$took" "$cpu"
    timings+=("$(printf '%5d s %5d CPU s  %s' "$took" "$cpu" "$step_name")")
  fi
  step_name=$1
  step_start=$SECONDS
  step_cpu=$(cpu_s)
  printf '\n==> %s\n' "$*"
}

step "system packages"
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
command -v cargo-fuzz >/dev/null 2>&1 || cargo install -q --locked cargo-fuzz
cargo fuzz --version

step "format and lint"
cargo fmt --all -- --check
cargo clippy -q --workspace --all-targets -- -D warnings
cargo clippy -q --workspace --all-targets --features dpdk -- -D warnings
cargo clippy -q --workspace --all-targets --features isal -- -D warnings

step "tests"
cargo test --workspace

step "SDR's erasure codec on the system ISA-L (libisal-dev, bindgen)"
cargo test -q -p ferroce-isal --features isal 2>&1 | grep -E "test result|panicked|FAILED"
cargo test -q -p ferroce-cli --features isal --test cli scenario_sdr 2>&1 | grep -E "test result|panicked|FAILED"

step "DPDK driver (bindgen + shim against the system libdpdk; net_ring vdevs, no hugepages)"
cargo test -q -p ferroce-drivers --features dpdk --test dpdk 2>&1 | grep -E "test result|panicked|FAILED"
cargo test -q -p ferroce-drivers --features dpdk --test dpdk_queues 2>&1 | grep -E "test result|panicked|FAILED"
cargo test -q -p ferroce-verbs --features dpdk --test dpdk 2>&1 | grep -E "test result|panicked|FAILED"
cargo test -q -p ferroce-verbs --features dpdk --test dpdk_queues 2>&1 | grep -E "test result|panicked|FAILED"
# Two DPDK processes (net_af_packet on a veth pair in two namespaces), and DPDK against AF_PACKET.
cargo test -q -p ferroce-cli --features dpdk --test dpdk_netns -- --test-threads=1 2>&1 | grep -E "test result|panicked|FAILED|skipped"
# EAL keeps a runtime directory per --file-prefix; the tests' prefixes all start ferroce-.
rm -rf /var/run/dpdk/ferroce-* 2>/dev/null || true

step "libibverbs drop-in: unmodified rdma-core programs over ferroce (two namespaces, veth)"
scripts/ibverbs-test.sh

step "librdmacm drop-in: unmodified rdma_cm programs (rping, ucmatose, udaddy, cmtime, perftest -R) and tshark on their CM MADs"
scripts/rdmacm-test.sh

step "the drop-in's schemes: ib_write_bw -R with FERROCE_SCHEME=sr,spray=4 through a lossy user-space switch, against IBTA's"
scripts/scheme-veth.sh

step "rdma-core's own test suite (python3-pyverbs, rdma-core 44) on the drop-in, veth in a namespace"
/usr/bin/python3 scripts/rdma-core-tests.py --json target/rdma-core-tests.json

step "wire cross-check with tshark and scapy"
cargo build -q --release -p ferroce-cli
SCAPY_PYTHON="$venv/bin/python" FERROCE_BIN=target/release/ferroce scripts/check-vectors.sh

step "perf on the simulated fabric (the README's main job)"
target/release/ferroce perf write bw
target/release/ferroce perf write bw --json | "$venv/bin/python" -c '
import json, sys
r = json.load(sys.stdin)
assert r["verified"] and r["iterations"] == 5000 and r["bw_avg_gbps"] > 50, r
print("perf write bw:", round(r["bw_avg_gbps"], 2), "Gb/s virtual,", round(r["wall_gbps"], 2), "Gb/s processed per wall-clock second")'

step "congestion control between two ferroce processes over veth: a tc-shaped bridge and ferroce's switch"
scripts/cc-veth.sh 1 2 4 dcqcn-ferroce

step "SDR: the cross-continent scenario, short grid, measured against the completion-time model"
target/release/ferroce scenario sdr --size 8MiB,32MiB --drop 1e-4,1e-3,1e-2 --runs 40 --check --json | "$venv/bin/python" -c '
import json, sys
r = json.load(sys.stdin)
for p in r["points"]:
    assert p["verified"], p
    assert p["model_checked"] is not False, p
    print("%-7s %6.0e %5dMiB mean %5.2fx model %5.2fx inflation %.3f" % (p["scheme"], p["drop"], p["size_bytes"] >> 20, p["mean_slowdown"], p["model_mean_slowdown"], p["inflation"]))'

step "examples/rc_pingpong (ibv_rc_pingpong on ferroce's verbs API, simulated fabric)"
cargo run -q --release --example rc_pingpong

step "demo"
target/release/ferroce demo --json | "$venv/bin/python" -c '
import json, sys
r = json.load(sys.stdin)
assert r["frames_sent"] == 20000 and r["receiver"]["valid"] > 0, r
print("demo:", r["receiver"]["valid"], "valid frames of", r["frames_sent"])'

step "fuzz the frame parser for ${FUZZ_SECONDS:-60} s, the QP for half that, the gso splitter and the SDR receiver for a third each, the CM MAD parser for a quarter"
mkdir -p fuzz/corpus/parse_frame fuzz/corpus/qp_frames fuzz/corpus/gso_split fuzz/corpus/sdr_packets fuzz/seeds/sdr_packets fuzz/corpus/cm_mad fuzz/seeds/cm_mad
fuzz_run() {
  (cd fuzz && cargo fuzz run "$1" -s none "corpus/$1" "seeds/$1" -- \
    -max_total_time="$2" -print_final_stats=1 2>&1 | grep -E "^(#[0-9]+ +DONE|stat::number_of_executed_units|Done )|ERROR|panicked" ) || {
    echo "fuzzing $1 found a failing input (see fuzz/artifacts/$1/)"; exit 1; }
}
fuzz_run parse_frame "${FUZZ_SECONDS:-60}"
fuzz_run qp_frames "$(( ${FUZZ_SECONDS:-60} / 2 ))"
fuzz_run gso_split "$(( ${FUZZ_SECONDS:-60} / 3 ))"
fuzz_run sdr_packets "$(( ${FUZZ_SECONDS:-60} / 3 ))"
fuzz_run cm_mad "$(( ${FUZZ_SECONDS:-60} / 4 ))"

step "benchmarks build"
cargo bench --workspace --no-run -q 2>&1 | tail -n 2

step "a run through the whole 24-bit PSN space (optimized build; minutes in debug)"
cargo test -q --profile bench --test transport_psn_wrap 2>&1 | grep -E "test result|panicked|FAILED"

step "done"
echo "time per step:"
printf '%s\n' "${timings[@]}"
printf '%5d s  in all\n' "$SECONDS"
echo
echo "test-all: every step passed"
