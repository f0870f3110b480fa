#!/usr/bin/env bash
# Unmodified programs through `ferroce serve` (issue 37): each namespace of a veth pair runs a
# service that owns its port, and rdma-core's pingpongs and perftest run in both namespaces
# with the drop-in libibverbs.so.1 as a thin client (FERROCE_SERVICE names the service's
# socket; the library is built without the DPDK driver, so no DPDK library is in the
# programs' processes). Three kinds of port under the services: AF_PACKET on the veth ends,
# DPDK's net_af_packet on the same ends, and DPDK's net_memif between two services. Also
# checks that the DPDK service's process has the mlx5 PMD and the system's rdma-core
# (libibverbs.so.1 of rdma-core) loaded, and a program's process ferroce's client library and no
# DPDK. librdmacm's programs (rping, udaddy, ucmatose, rdma_server/rdma_client) and perftest -R
# run the same way, with ferroce's librdmacm.so.1 beside it: the CM agent is the service's.
# Every program must exit 0 on both sides. Root only.
# Each section prints its wall time.
#   scripts/service-test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
profile=${FERROCE_PROFILE:-release}
read -r -a build <<<"${FERROCE_BUILD:--p ferroce-cli --features dpdk}"
cargo build -q --profile "$profile" "${build[@]}"
ferroce=$PWD/target/$profile/ferroce
# The thin clients: the drop-ins without the DPDK driver.
cargo build -q --profile "$profile" -p ferroce-ibverbs -p ferroce-rdmacm
lib=$PWD/target/ibverbs-thin
mkdir -p "$lib"
rm -f "$lib"/*.so.1
cp "target/$profile/libibverbs.so" "$lib/libibverbs.so.1"
cp "target/$profile/librdmacm.so" "$lib/librdmacm.so.1"
for l in libibverbs librdmacm; do
  if ldd "$lib/$l.so.1" | grep -q librte_; then
    echo "FAIL: the thin client $l.so.1 links DPDK" >&2
    exit 1
  fi
done

p=frsvc
logs=$(mktemp -d)
services=()
cleanup() {
  for s in "${services[@]}"; do kill "$s" 2>/dev/null || true; done
  wait 2>/dev/null || true
  scripts/netns-pair.sh down $p
  rm -rf "$logs" /var/run/dpdk/ferroce-svc-* 2>/dev/null || true
}
trap cleanup EXIT
scripts/netns-pair.sh down $p
scripts/netns-pair.sh up $p >/dev/null
fail() { echo "FAIL: $*" >&2; exit 1; }

# serve NS NAME DEVICE...: a service in namespace NS at $logs/NAME.sock, its JSON summary in
# $logs/NAME.json when it stops; waits until it listens.
serve() {
  local ns=$1 name=$2
  shift 2
  local devs=()
  for d in "$@"; do devs+=(--device "$d"); done
  ip netns exec "$p-$ns" "$ferroce" serve "${devs[@]}" --socket "$logs/$name.sock" --mode 0600 \
    --json >"$logs/$name.json" 2>"$logs/$name.err" &
  services+=($!)
  for _ in $(seq 400); do [ -S "$logs/$name.sock" ] && return 0; sleep 0.05; done
  cat "$logs/$name.err"
  fail "service $name did not start"
}
# stop NAME: stops the last service started and checks its summary.
stop() {
  local name=$1 pid=${services[-1]}
  kill -TERM "$pid"
  wait "$pid" || fail "service $name exited $?"
  unset 'services[-1]'
  python3 - "$logs/$name.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["sessions"] >= 2 and r["wrs_forwarded"] > 0 and r["wcs_forwarded"] > 0, r
assert r["sessions_dropped"] == 0, r
print("   service %s: %d programs, %d WRs and %d completions through its rings" % (
    sys.argv[1].split("/")[-1][:-5], r["sessions"], r["wrs_forwarded"], r["wcs_forwarded"]))
PY
}
# pair NAME SERVER_SOCK CLIENT_SOCK ADDR PROGRAM ARGS...: PROGRAM as the server in a (through
# SERVER_SOCK), then as the client in b (through CLIENT_SOCK) connecting to ADDR.
extra_env=()
pair() {
  local name=$1 ssock=$2 csock=$3 addr=$4
  shift 4
  ip netns exec $p-a env LD_LIBRARY_PATH="$lib" FERROCE_SERVICE="$ssock" "${extra_env[@]}" \
    timeout 120 "$@" >"$logs/$name.server" 2>&1 &
  local spid=$!
  for _ in $(seq 200); do
    ip netns exec $p-a ss -ltn | grep -q ':18515 ' && break
    sleep 0.05
  done
  local c=0 s=0
  ip netns exec $p-b env LD_LIBRARY_PATH="$lib" FERROCE_SERVICE="$csock" "${extra_env[@]}" \
    timeout 120 "$@" "$addr" >"$logs/$name.client" 2>&1 || c=$?
  wait $spid || s=$?
  if [ $c -ne 0 ] || [ $s -ne 0 ]; then
    echo "--- $name server (exit $s)"; cat "$logs/$name.server"
    echo "--- $name client (exit $c)"; cat "$logs/$name.client"
    fail "$* (server exit $s, client exit $c)"
  fi
  # perftest's figure line: bandwidth (MB/s average) or latency (typical, us).
  local fig
  fig=$(awk '/#bytes/ { lat = /t_typical/; getline;
    if (lat) print $1 " B, typical " $5 " us"; else print $1 " B, " $4 " MB/s" }' "$logs/$name.client")
  echo "ok: $* ${fig:+($fig)}"
}
# cm_pair NAME SERVER_SOCK CLIENT_SOCK CLIENT_NS "SERVER ARGS" "CLIENT ARGS": an rdma_cm
# program as the server in namespace a through SERVER_SOCK, then, once its CM listens (its
# trace says so, or perftest's TCP port is open), the client in CLIENT_NS through
# CLIENT_SOCK; both must exit 0. librdmacm.so.1 is ferroce's thin client too: the CM agent
# is the service's.
cm_pair() {
  local name=$1 ssock=$2 csock=$3 cns=$4 server=$5 client=$6
  local f
  f=cm-$(printf '%s' "$name" | tr -c 'a-zA-Z0-9' _)
  # shellcheck disable=SC2086
  ip netns exec $p-a env LD_LIBRARY_PATH="$lib" FERROCE_SERVICE="$ssock" FERROCE_CM_TRACE=1 \
    "${extra_env[@]}" timeout 120 $server >"$logs/$f.server" 2>&1 &
  local spid=$! c=0 s=0
  for _ in $(seq 400); do
    grep -q "ferroce cm: listen" "$logs/$f.server" 2>/dev/null && break
    ip netns exec $p-a ss -ltn | grep -q ':18515 ' && break
    sleep 0.05
  done
  # shellcheck disable=SC2086
  ip netns exec "$p-$cns" env LD_LIBRARY_PATH="$lib" FERROCE_SERVICE="$csock" FERROCE_CM_TRACE=1 \
    "${extra_env[@]}" timeout 120 $client >"$logs/$f.client" 2>&1 || c=$?
  # perftest -R's client may connect its data QPs before its server listens for them (REJ,
  # invalid service ID, as from a kernel CM) and Debian's perftest cannot retry: run again
  # (see scripts/rdmacm-test.sh).
  if [ $c -ne 0 ] && [ "${tries:-0}" -lt 3 ] &&
    grep -q "RDMA_CM_EVENT_REJECTED status 8" "$logs/$f.client" && [[ $name == ib_* ]]; then
    kill "$spid" 2>/dev/null || true
    wait "$spid" || true
    echo "retry: $name (perftest's client connected before its server listened)"
    tries=$((${tries:-0} + 1)) cm_pair "$@"
    return
  fi
  wait $spid || s=$?
  if [ $c -ne 0 ] || [ $s -ne 0 ]; then
    echo "--- $name server (exit $s)"; grep -v '^ferroce cm' "$logs/$f.server" | tail -20
    echo "--- $name client (exit $c)"; grep -v '^ferroce cm' "$logs/$f.client" | tail -20
    fail "rdma_cm: $name (server exit $s, client exit $c)"
  fi
  local fig
  fig=$(awk '/#bytes/ { lat = /t_typical/; getline;
    if (lat) print $1 " B, typical " $5 " us"; else print $1 " B, " $4 " MB/s" }' "$logs/$f.client")
  [ -n "$fig" ] || fig=$(grep -v '^ferroce cm' "$logs/$f.client" | tail -1 | tr -s ' \t' ' ' | cut -c1-60)
  printf 'ok: %-40s %s\n' "$name" "$fig"
}
# cm_suite SERVER_SOCK CLIENT_SOCK CLIENT_NS ADDR: librdmacm's own programs and perftest -R.
cm_suite() {
  local ss=$1 cs=$2 ns=$3 a=$4
  cm_pair "rping -v -C 100" "$ss" "$cs" "$ns" "rping -s -a $a -v -C 100" "rping -c -a $a -v -C 100"
  grep -q "rdma-ping-99" "$logs/cm-rping__v__C_100.client" || fail "rping's client did not verify 100 pings"
  cm_pair "udaddy (UD over SIDR)" "$ss" "$cs" "$ns" "udaddy -b $a" "udaddy -s $a"
  cm_pair "ib_write_bw -R" "$ss" "$cs" "$ns" "ib_write_bw -R -F -n 2000" "ib_write_bw -R -F -n 2000 $a"
}

# The DPDK engines poll without sleeping, beside the programs, on two cores: the same
# programs with fewer iterations there.
short_suite() { # SERVER_SOCK CLIENT_SOCK ADDR
  pair rc "$@" ibv_rc_pingpong -g 0 -n 500
  pair rc-events "$@" ibv_rc_pingpong -e -g 0 -n 500
  pair uc "$@" ibv_uc_pingpong -g 0 -n 500
  pair ud "$@" ibv_ud_pingpong -g 0 -n 200
  pair srq "$@" ibv_srq_pingpong -g 0 -n 200
  pair write "$@" ib_write_bw -x 0 -n 1000
  pair read "$@" ib_read_bw -x 0 -n 1000
  pair send "$@" ib_send_bw -x 0 -n 1000
  pair atomic "$@" ib_atomic_bw -x 0 -n 1000
  pair write4 "$@" ib_write_bw -x 0 -q 4 -n 1000
  pair writelat "$@" ib_write_lat -x 0 -n 1000
  pair sendlat-events "$@" ib_send_lat -e -x 0 -n 1000
  pair readlat "$@" ib_read_lat -x 0 -n 1000
  pair atomiclat "$@" ib_atomic_lat -x 0 -n 1000
}
suite() { # SERVER_SOCK CLIENT_SOCK ADDR
  pair rc "$@" ibv_rc_pingpong -g 0 -n 500
  pair rc-events "$@" ibv_rc_pingpong -e -g 0 -n 500
  pair uc "$@" ibv_uc_pingpong -g 0 -n 500
  pair ud "$@" ibv_ud_pingpong -g 0 -n 200
  pair srq "$@" ibv_srq_pingpong -g 0 -n 200
  pair write "$@" ib_write_bw -x 0 -n 2000
  pair read "$@" ib_read_bw -x 0 -n 2000
  pair send "$@" ib_send_bw -x 0 -n 2000
  pair atomic "$@" ib_atomic_bw -x 0 -n 2000
  pair write4 "$@" ib_write_bw -x 0 -q 4 -n 2000
  pair writelat "$@" ib_write_lat -x 0 -n 2000
  pair sendlat "$@" ib_send_lat -x 0 -n 2000
  pair sendlat-events "$@" ib_send_lat -e -x 0 -n 2000
  pair readlat "$@" ib_read_lat -x 0 -n 2000
  pair atomiclat "$@" ib_atomic_lat -x 0 -n 2000
}

echo "== through a service on each veth end (AF_PACKET)"
SECONDS=0
serve a afp-a "afpacket:$p-va"
serve b afp-b "afpacket:$p-vb"
suite "$logs/afp-a.sock" "$logs/afp-b.sock" 192.168.77.1
echo "   rdma_cm through the services"
cm_suite "$logs/afp-a.sock" "$logs/afp-b.sock" b 192.168.77.1
cm_pair "ucmatose (4 connections)" "$logs/afp-a.sock" "$logs/afp-b.sock" b "ucmatose -c 4" "ucmatose -s 192.168.77.1 -c 4"
cm_pair "rdma_server / rdma_client" "$logs/afp-a.sock" "$logs/afp-b.sock" b "rdma_server" "rdma_client -s 192.168.77.1"
cm_pair "ib_send_lat -R" "$logs/afp-a.sock" "$logs/afp-b.sock" b "ib_send_lat -R -F -n 2000" "ib_send_lat -R -F -n 2000 192.168.77.1"
cm_pair "ib_read_bw -R" "$logs/afp-a.sock" "$logs/afp-b.sock" b "ib_read_bw -R -F -n 2000" "ib_read_bw -R -F -n 2000 192.168.77.1"
# A program killed with its connection up: the service ends the connection for it (a DREQ),
# so its peer hears RDMA_CM_EVENT_DISCONNECTED rather than a transport error.
ip netns exec $p-a env LD_LIBRARY_PATH="$lib" FERROCE_SERVICE="$logs/afp-a.sock" FERROCE_CM_TRACE=1 \
  timeout 60 rping -s -a 192.168.77.1 -C 100000 >"$logs/killed.server" 2>&1 &
victim=$!
for _ in $(seq 400); do grep -q "ferroce cm: listen" "$logs/killed.server" && break; sleep 0.05; done
ip netns exec $p-b env LD_LIBRARY_PATH="$lib" FERROCE_SERVICE="$logs/afp-b.sock" FERROCE_CM_TRACE=1 \
  timeout 60 rping -c -a 192.168.77.1 -C 100000 >"$logs/killed.client" 2>&1 &
peer=$!
for _ in $(seq 400); do grep -q "ESTABLISHED" "$logs/killed.client" && break; sleep 0.05; done
sleep 0.5
# The connected client: ferroce's two thin clients, no DPDK, no engine thread.
client=$(pgrep -x rping -P "$peer") || fail "no rping client running"
grep -q "target/ibverbs-thin/librdmacm.so.1" /proc/"$client"/maps || fail "rping without ferroce's librdmacm.so.1"
grep -q "target/ibverbs-thin/libibverbs.so.1" /proc/"$client"/maps || fail "rping without ferroce's libibverbs.so.1"
grep -q librte_ /proc/"$client"/maps && fail "DPDK in an rdma_cm program's process"
threads=$(cat /proc/"$client"/task/*/comm)
grep -q "^ferroce-engine" <<<"$threads" && fail "an engine thread in an rdma_cm program's process"
grep -q "^ferroce-watch" <<<"$threads" || fail "an rdma_cm program not attached to its service"
echo "ok: an rdma_cm program's process: ferroce's librdmacm.so.1 and libibverbs.so.1, no DPDK, no engine ($(wc -l <<<"$threads") threads)"
# `timeout` runs rping as its child.
kill -9 "$(pgrep -x rping -P "$victim")" || fail "no rping server to kill"
wait $victim 2>/dev/null || true
wait $peer 2>/dev/null || true
grep -q "ESTABLISHED" "$logs/killed.client" || { cat "$logs/killed.client"; fail "the killed program's peer never connected"; }
grep -q "RDMA_CM_EVENT_DISCONNECTED" "$logs/killed.client" ||
  { tail -20 "$logs/killed.client"; fail "kill -9 of an rdma_cm program: its peer heard no DREQ"; }
echo "ok: kill -9 of an rping server mid-run: the service sent its DREQ, the client heard RDMA_CM_EVENT_DISCONNECTED"
stop afp-b
stop afp-a
echo "   ($SECONDS s)"
SECONDS=0

echo "== through a service on each veth end (DPDK net_af_packet, the mlx5 PMD loaded beside it)"
eal="--no-pci --no-huge -m 256 --log-level=error"
mac_b=$(ip netns exec $p-b cat /sys/class/net/$p-vb/address)
mac_a=$(ip netns exec $p-a cat /sys/class/net/$p-va/address)
serve a dpdk-a "dpdk:-l 0 $eal --file-prefix=ferroce-svc-a-$$ --vdev=net_af_packet0,iface=$p-va @192.168.77.11"
serve b dpdk-b "dpdk:-l 1 $eal --file-prefix=ferroce-svc-b-$$ --vdev=net_af_packet0,iface=$p-vb @192.168.77.12"
# The service: DPDK's mlx5 PMD and rdma-core's own libibverbs.so.1 in its process.
svc_maps=$(cat /proc/"${services[-1]}"/maps)
grep -q "librte_net_mlx5" <<<"$svc_maps" || fail "the DPDK service has no mlx5 PMD loaded"
grep -E "libibverbs\.so\.1" <<<"$svc_maps" | grep -qv ferroce || fail "the DPDK service has no rdma-core libibverbs.so.1"
grep -q "target/ibverbs-thin" <<<"$svc_maps" && fail "ferroce's client library is in the service"
echo "ok: the DPDK service has $(grep -c librte_ <<<"$svc_maps") DPDK mappings, the mlx5 PMD among them, and rdma-core's $(grep -oE '/[^ ]*libibverbs\.so\.1[^ ]*' <<<"$svc_maps" | sort -u | head -1)"
# A program: ferroce's libibverbs.so.1, no DPDK.
ip netns exec $p-a env LD_LIBRARY_PATH="$lib" FERROCE_SERVICE="$logs/dpdk-a.sock" \
  sh -c 'ibv_devinfo >/dev/null && cat /proc/$$/maps' >"$logs/prog.maps" 2>&1 || true
ip netns exec $p-a env LD_LIBRARY_PATH="$lib" FERROCE_SERVICE="$logs/dpdk-a.sock" \
  ibv_rc_pingpong -g 0 -n 2000000 >/dev/null 2>&1 &
prog=$!
sleep 0.5
grep -q "target/ibverbs-thin/libibverbs.so.1" /proc/$prog/maps || fail "a program without ferroce's client library"
grep -q librte_ /proc/$prog/maps && fail "DPDK in a program's process"
kill $prog 2>/dev/null || true
wait $prog 2>/dev/null || true
echo "ok: a program's process has ferroce's libibverbs.so.1 and no DPDK"
extra_env=(FERROCE_NEIGH="192.168.77.11=$mac_a;192.168.77.12=$mac_b")
short_suite "$logs/dpdk-a.sock" "$logs/dpdk-b.sock" 192.168.77.1
cm_suite "$logs/dpdk-a.sock" "$logs/dpdk-b.sock" b 192.168.77.11
stop dpdk-b
stop dpdk-a
echo "   ($SECONDS s)"
SECONDS=0

echo "== through two services joined by DPDK net_memif (one namespace)"
msock="$logs/memif.sock"
serve a memif-s "dpdk:-l 1 $eal --file-prefix=ferroce-svc-ms-$$ --vdev=net_memif0,role=server,socket=$msock,socket-abstract=no,mac=02:00:00:00:78:02 @10.78.0.2"
serve a memif-c "dpdk:-l 0 $eal --file-prefix=ferroce-svc-mc-$$ --vdev=net_memif0,role=client,socket=$msock,socket-abstract=no,mac=02:00:00:00:78:01 @10.78.0.1"
extra_env=(FERROCE_NEIGH="10.78.0.1=02:00:00:00:78:01;10.78.0.2=02:00:00:00:78:02")
mpair() { # NAME PROGRAM ARGS...: server through memif-s, client through memif-c, both in a
  local name=$1
  shift
  ip netns exec $p-a env LD_LIBRARY_PATH="$lib" FERROCE_SERVICE="$logs/memif-s.sock" "${extra_env[@]}" \
    timeout 120 "$@" >"$logs/$name.server" 2>&1 &
  local spid=$! c=0 s=0
  for _ in $(seq 200); do ip netns exec $p-a ss -ltn | grep -q ':18515 ' && break; sleep 0.05; done
  ip netns exec $p-a env LD_LIBRARY_PATH="$lib" FERROCE_SERVICE="$logs/memif-c.sock" "${extra_env[@]}" \
    timeout 120 "$@" 127.0.0.1 >"$logs/$name.client" 2>&1 || c=$?
  wait $spid || s=$?
  if [ $c -ne 0 ] || [ $s -ne 0 ]; then
    cat "$logs/$name.server" "$logs/$name.client"
    fail "$* over memif (server exit $s, client exit $c)"
  fi
  echo "ok: $* over memif"
}
mpair m-rc ibv_rc_pingpong -g 0 -n 500
mpair m-ud ibv_ud_pingpong -g 0 -n 200
mpair m-write ib_write_bw -x 0 -n 2000
mpair m-read ib_read_bw -x 0 -n 2000
mpair m-send ib_send_bw -x 0 -n 2000
mpair m-atomic ib_atomic_bw -x 0 -n 1000
mpair m-write4 ib_write_bw -x 0 -q 4 -n 1000
mpair m-lat ib_write_lat -x 0 -n 2000
mpair m-sendlat ib_send_lat -x 0 -n 1000
mpair m-readlat ib_read_lat -x 0 -n 1000
mpair m-atomiclat ib_atomic_lat -x 0 -n 1000
cm_suite "$logs/memif-s.sock" "$logs/memif-c.sock" a 10.78.0.2
stop memif-c
stop memif-s
echo "   ($SECONDS s)"
echo "service-test: every program ran through a service"
