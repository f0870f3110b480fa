#!/usr/bin/env bash
# Unmodified librdmacm programs over ferroce's librdmacm.so.1 and libibverbs.so.1 (issue 35):
# builds both libraries into target/rdmacm/, creates two namespaces joined by a veth pair and
# runs each program as a server in one and a client in the other. Every program must exit 0
# on both sides. Then one perftest connection is captured on both veth ends and tshark's
# reading of its CM MADs is checked (scripts/vectors/cm_capture_check.py).
# Root only; needs rdmacm-utils, perftest and tshark (the test command installs them).
#   scripts/rdmacm-test.sh               every check
#   scripts/rdmacm-test.sh --two-ports   only the runs between two-port devices (the offer
#                                        in the CM private data, failover)
set -euo pipefail
two_ports_only=0
[ "${1:-}" = "--two-ports" ] && two_ports_only=1
cd "$(dirname "$0")/.."
# FERROCE_PROFILE (default release) names the cargo profile the programs are built with, and
# FERROCE_BUILD what cargo builds (default the three packages every drop-in script builds, so
# they share one build; CI passes its test build's selection, already built, and ci-test).
profile=${FERROCE_PROFILE:-release}
read -r -a build <<<"${FERROCE_BUILD:--p ferroce-ibverbs -p ferroce-rdmacm -p ferroce-cli}"
cargo build -q --profile "$profile" "${build[@]}"
ferroce=$PWD/target/$profile/ferroce
lib=$PWD/target/rdmacm
mkdir -p "$lib"
rm -f "$lib"/*.so.1
cp "target/$profile/libibverbs.so" "$lib/libibverbs.so.1"
cp "target/$profile/librdmacm.so" "$lib/librdmacm.so.1"

p=${FERROCE_NETNS_PREFIX:-frcm}
logs=$(mktemp -d)
caps=()
cleanup() {
  for c in "${caps[@]}"; do kill "$c" 2>/dev/null || true; done
  scripts/netns-pair.sh down $p
  rm -rf "$logs"
}
trap cleanup EXIT
scripts/netns-pair.sh down $p
scripts/netns-pair.sh up $p >/dev/null
fail() { echo "FAIL: $*" >&2; exit 1; }
# run NS COMMAND...: in namespace NS through both drop-ins, on the device of its first veth
# (of both veths, rails 1 and 2, when two_ports is set).
run() {
  local ns=$1
  shift
  local dev="afpacket:$p-v$ns"
  [ -n "${two_ports:-}" ] && dev="afpacket:$p-v$ns,$p-w$ns"
  ip netns exec "$p-$ns" env LD_LIBRARY_PATH="$lib" FERROCE_DEVICES="$dev" \
    FERROCE_CM_TRACE=1 "$@"
}
# Stops what runs in namespace a, but the captures.
kill_a() {
  local x
  for x in $(ip netns pids $p-a); do
    [[ " ${caps[*]} " == *" $x "* ]] || kill "$x" 2>/dev/null || true
  done
}
# pair NAME "SERVER ARGS" "CLIENT ARGS": the server in a, then (once it listens: its CM
# trace says so, or perftest's TCP port is open) the client in b; both must exit 0.
pair() {
  local name=$1 server=$2 client=$3
  local f
  f=$(printf '%s' "$name" | tr -c 'a-zA-Z0-9' _)
  # shellcheck disable=SC2086
  run a timeout 120 $server >"$logs/$f.server" 2>&1 &
  local spid=$!
  for _ in $(seq 400); do
    grep -q "ferroce cm: listen" "$logs/$f.server" 2>/dev/null && break
    ip netns exec $p-a ss -ltn | grep -q ':18515 ' && break
    sleep 0.05
  done
  local c=0 s=0
  # shellcheck disable=SC2086
  run b timeout 120 $client >"$logs/$f.client" 2>&1 || c=$?
  # perftest -R's client connects its data QPs as soon as the control connection is up,
  # which may be before its server listens for them: the REQ then gets REJ "invalid service
  # ID" (8), as from a kernel CM. Debian's perftest 4.5-0.17 cannot retry from there (it
  # resolves the id it just destroyed), so that run is repeated, up to three times.
  if [ $c -ne 0 ] && [ "${tries:-0}" -lt 3 ] &&
    grep -q "RDMA_CM_EVENT_REJECTED status 8" "$logs/$f.client" && [[ $name == ib_* ]]; then
    kill_a
    wait $spid || true
    echo "retry: $name (perftest's client connected before its server listened)"
    tries=$((${tries:-0} + 1)) pair "$@"
    return
  fi
  # A server that serves until killed (cmtime's) is stopped once its client is done.
  if [ -n "${until_killed:-}" ]; then
    kill_a
  fi
  wait $spid || s=$?
  [ -n "${until_killed:-}" ] && s=0
  if [ $c -ne 0 ] || [ $s -ne 0 ]; then
    echo "--- $name server (exit $s)"; tail -40 "$logs/$f.server"
    echo "--- $name client (exit $c)"; tail -40 "$logs/$f.client"
    fail "$name (server exit $s, client exit $c)"
  fi
  printf 'ok: %-44s %s\n' "$name" "$(grep -v '^ferroce cm' "$logs/$f.client" | tail -1 | tr -s ' \t' ' ' | cut -c1-70)"
}

srv=192.168.77.1
if [ $two_ports_only = 0 ]; then
pair "rping -v -C 100" "rping -s -a $srv -v -C 100" "rping -c -a $srv -v -C 100"
grep -q "rdma-ping-99" "$logs/rping__v__C_100.client" || fail "rping's client did not verify 100 pings"
pair "ucmatose (4 connections)" "ucmatose -c 4" "ucmatose -s $srv -c 4"
pair "udaddy (UD over SIDR)" "udaddy" "udaddy -s $srv"
pair "rdma_server / rdma_client" "rdma_server" "rdma_client -s $srv"
pair "rdma_xserver / rdma_xclient (RC)" "rdma_xserver -c r" "rdma_xclient -s $srv -c r"
# rdma-core 44's cmtime server runs until it is killed.
until_killed=1 pair "cmtime (100 connections)" "cmtime" "cmtime -s $srv"
pair "ib_write_bw -R" "ib_write_bw -R -F" "ib_write_bw -R -F $srv"
pair "ib_send_lat -R" "ib_send_lat -R -F" "ib_send_lat -R -F $srv"
pair "ib_read_bw -R" "ib_read_bw -R -F" "ib_read_bw -R -F $srv"

filter='udp port 4791 and (udp[12:4] & 0xffffff) == 1'

echo "== a disconnect with work outstanding, a REQ nobody listens for, what fails (ibverbs/tests/cm_disconnect.c)"
cc -O2 -Wall -Wextra -Werror -o "$logs/cm_disconnect" ibverbs/tests/cm_disconnect.c -lrdmacm -libverbs
run a timeout 60 "$logs/cm_disconnect" $srv >"$logs/cm_disconnect.out" 2>&1 ||
  { cat "$logs/cm_disconnect.out"; fail "cm_disconnect"; }
echo "ok: $(grep -v '^ferroce cm' "$logs/cm_disconnect.out")"

echo "== several rdma_cm processes on one interface"
# Two servers in a (rping on 7174, ucmatose on 7471), each answering only for its own
# listener; a third process cannot take rping's port; their clients in b connect at once;
# a REQ for a port nobody listens on gets exactly one REJ (captured where it arrives, in b).
run a timeout 60 rping -s -a $srv -v -C 50 >"$logs/multi.rping.server" 2>&1 &
m1=$!
run a timeout 60 ucmatose -c 2 >"$logs/multi.ucmatose.server" 2>&1 &
m2=$!
for _ in $(seq 400); do
  [ "$(cat "$logs"/multi.*.server 2>/dev/null | grep -c "ferroce cm: listen")" = 2 ] && break
  sleep 0.05
done
e=0
run a timeout 10 rping -s -a $srv -C 1 >"$logs/multi.third" 2>&1 || e=$?
[ $e -ne 0 ] && grep -q "Address already in use" "$logs/multi.third" ||
  fail "a second process could listen on rping's port (exit $e)"
echo "ok: a second listener on one address and port gets EADDRINUSE"
ip netns exec $p-b dumpcap -q -i $p-vb -f "$filter" -w "$logs/rej.pcap" >/dev/null 2>&1 &
caps+=($!)
for _ in $(seq 100); do [ -s "$logs/rej.pcap" ] && break; sleep 0.05; done
sleep 0.5
e=0
run b timeout 30 rping -c -a $srv -p 9999 -C 1 >"$logs/multi.nobody" 2>&1 || e=$?
grep -q "RDMA_CM_EVENT_REJECTED, error 8" "$logs/multi.nobody" ||
  fail "a REQ nobody listens for was not rejected (invalid service ID)"
sleep 0.5
kill -INT "${caps[@]}"
wait "${caps[@]}" || true
caps=()
rejs=$(tshark -r "$logs/rej.pcap" 2>/dev/null | grep -c ConnectReject || true)
[ "$rejs" = 1 ] || fail "a REQ nobody listens for got $rejs REJs from the interface's processes"
echo "ok: a REQ nobody listens for gets one REJ (invalid service ID) from the interface's processes"

c1=0 c2=0
run b timeout 60 rping -c -a $srv -v -C 50 >"$logs/multi.rping.client" 2>&1 &
r1=$!
run b timeout 60 ucmatose -s $srv -c 2 >"$logs/multi.ucmatose.client" 2>&1 || c2=$?
wait $r1 || c1=$?
wait $m1 $m2 || fail "a server of the two on one interface failed"
[ $c1 -eq 0 ] && [ $c2 -eq 0 ] || fail "clients of two servers on one interface (rping $c1, ucmatose $c2)"
echo "ok: rping and ucmatose served at once by two processes on one interface"

echo "== two processes on one address connect to each other (QP1 looped between them)"
# both_in_a NAME "SERVER ARGS" "CLIENT ARGS": server and client in namespace a, the client
# connecting to a's own address; both must exit 0.
both_in_a() {
  local name=$1 server=$2 client=$3 c=0 s=0
  # shellcheck disable=SC2086
  run a timeout 60 $server >"$logs/same.server" 2>&1 &
  local spid=$!
  for _ in $(seq 400); do
    grep -q "ferroce cm: listen" "$logs/same.server" 2>/dev/null && break
    sleep 0.05
  done
  # shellcheck disable=SC2086
  run a timeout 60 $client >"$logs/same.client" 2>&1 || c=$?
  wait $spid || s=$?
  if [ $c -ne 0 ] || [ $s -ne 0 ]; then
    tail -20 "$logs/same.server" "$logs/same.client"
    fail "$name on one address (server exit $s, client exit $c)"
  fi
  echo "ok: $name, server and client on $srv"
}
both_in_a "rping -v -C 50" "rping -s -a $srv -v -C 50" "rping -c -a $srv -v -C 50"
both_in_a "ucmatose (2 connections)" "ucmatose -c 2" "ucmatose -s $srv -c 2"
both_in_a "udaddy" "udaddy" "udaddy -s $srv"

echo "== the CM MADs of one connection and disconnection, as tshark reads them"
# A veth end's capture holds what arrives there (ferroce's AF_PACKET transmits bypass the
# capture point), so each side records the other's MADs.
ip netns exec $p-a dumpcap -q -i $p-va -f "$filter" -w "$logs/a.pcap" >/dev/null 2>&1 &
caps+=($!)
ip netns exec $p-b dumpcap -q -i $p-vb -f "$filter" -w "$logs/b.pcap" >/dev/null 2>&1 &
caps+=($!)
for _ in $(seq 100); do
  [ -s "$logs/a.pcap" ] && [ -s "$logs/b.pcap" ] && break
  sleep 0.05
done
sleep 0.5
pair "ib_write_bw -R (captured)" "ib_write_bw -R -F -n 100" "ib_write_bw -R -F -n 100 $srv"
# The capture writes as frames come; wait (up to 5 s) until it holds the DREP.
for _ in $(seq 50); do
  cat "$logs/a.pcap" >"$logs/a.now" 2>/dev/null; cat "$logs/b.pcap" >"$logs/b.now" 2>/dev/null
  for x in a b; do tshark -r "$logs/$x.now" 2>/dev/null; done | grep -q DisconnectReply && break
  sleep 0.1
done
kill -INT "${caps[@]}"
wait "${caps[@]}" || true
caps=()
mergecap -w "$logs/cm.pcap" "$logs/a.pcap" "$logs/b.pcap"
qpn() { grep "$1 address" "$logs/ib_write_bw__R__captured_.client" | sed -E 's/.*QPN (0x[0-9a-f]+).*/\1/'; }
tshark -r "$logs/cm.pcap" -T json 2>/dev/null |
  python3 scripts/vectors/cm_capture_check.py 192.168.77.2 $srv 18515 "$(qpn local)" "$(qpn remote)" ||
  fail "tshark's reading of the CM exchange"
if [ -n "${FERROCE_KEEP_CAPTURE:-}" ]; then
  cp "$logs/cm.pcap" "$FERROCE_KEEP_CAPTURE"
fi
fi

echo "== failover on a connection made through rdma_cm (two ports per device, rail 1 down in seconds 2-5)"
ip link add $p-wa type veth peer name $p-wb
ip link set $p-wa netns $p-a
ip link set $p-wb netns $p-b
for x in a:1 b:2; do
  ns=${x%%:*} h=${x##*:}
  ip netns exec $p-$ns ip link set $p-w$ns mtu 9000
  ip netns exec $p-$ns ip addr add 192.168.78.$h/24 dev $p-w$ns
  ip netns exec $p-$ns ip link set $p-w$ns up
done
echo "== ferroce's offer in the CM private data: path control only with a peer that offers it"
# Both rails of both sides are captured, QP1 and ferroce's PATH_CONTROL opcode (0xd8) only;
# each namespace's captures hold what the other side sent.
ofilter='udp port 4791 and ((udp[12:4] & 0xffffff) == 1 or udp[8] == 0xd8)'
# offer_run NAME SERVER_FAILOVER REQ_FLAG REP_FLAG PATH_CONTROL (see cm_offer_check.py)
offer_run() {
  local name=$1 sfo=$2 x
  for x in a b; do
    # (-f before the first -i filters every interface; after one, only the last -i named.)
    ip netns exec $p-$x dumpcap -q -f "$ofilter" -i $p-v$x -i $p-w$x -w "$logs/o-$x.pcapng" >/dev/null 2>&1 &
    caps+=($!)
  done
  for _ in $(seq 100); do
    [ -s "$logs/o-a.pcapng" ] && [ -s "$logs/o-b.pcapng" ] && break
    sleep 0.05
  done
  sleep 0.5
  two_ports=1 pair "$name" "env FERROCE_FAILOVER=$sfo ib_write_bw -R -F -n 5000" "ib_write_bw -R -F -n 5000 $srv"
  sleep 0.5
  kill -INT "${caps[@]}"
  wait "${caps[@]}" || true
  caps=()
  mergecap -w "$logs/o.pcap" "$logs/o-a.pcapng" "$logs/o-b.pcapng"
  rm -f "$logs"/o-?.pcapng
  tshark -r "$logs/o.pcap" -T json 2>/dev/null |
    python3 scripts/vectors/cm_offer_check.py "$3" "$4" "$5" || fail "$name: ferroce's offer"
}
offer_run "ib_write_bw -R, both offer path control" native 1 1 yes
offer_run "ib_write_bw -R, the server declines" none 1 0 no

run2() {
  local ns=$1
  shift
  ip netns exec "$p-$ns" env LD_LIBRARY_PATH="$lib" FERROCE_DEVICES="afpacket:$p-v$ns,$p-w$ns" \
    FERROCE_STATS_DIR="$logs/fo-stats" FERROCE_CM_TRACE=1 "$@"
}
fo_try() {
  rm -rf "$logs/fo-stats"
  run2 a timeout 60 ib_write_bw -R -F -D 8 --report_gbits >"$logs/fo.server" 2>&1 &
  local spid=$! c=0 s=0
  for _ in $(seq 400); do
    grep -q "ferroce cm: listen" "$logs/fo.server" 2>/dev/null && break
    sleep 0.05
  done
  (sleep 2; ip netns exec $p-a ip link set $p-va down
   sleep 3; ip netns exec $p-a ip link set $p-va up) &
  local fpid=$!
  run2 b timeout 60 ib_write_bw -R -F -D 8 --report_gbits $srv >"$logs/fo.client" 2>&1 || c=$?
  wait $spid || s=$?
  wait $fpid || true
  [ $c -eq 0 ] && [ $s -eq 0 ]
}
ok=0
for try in 1 2 3; do
  if fo_try; then ok=1; break; fi
  # The perftest -R race (above) is the one failure retried.
  grep -q "RDMA_CM_EVENT_REJECTED status 8" "$logs/fo.client" || break
  kill_a
  echo "retry: failover run (perftest's client connected before its server listened)"
done
if [ $ok -ne 1 ]; then
  grep -v "^ferroce cm" "$logs/fo.server" | tail -20; grep -v "^ferroce cm" "$logs/fo.client" | tail -20
  fail "ib_write_bw -R through a port down and up"
fi
# Both exit 0 only if the data QPs came through the fault; the export holds the QPs alive at
# exit, perftest's idle control QPs (see failover_check.py --moved).
"$ferroce" stats --all --dir "$logs/fo-stats" --json |
  python3 scripts/failover_check.py "ib_write_bw -R" --moved || fail "ib_write_bw -R: the counters after the fault"

echo "rdma_cm: every program passed"
