#!/usr/bin/env bash
# Congestion control between two ferroce processes over real ports (issue 24, item 6): the
# sender (namespace $p-a) and the receiver ($p-b) meet at a switch in a third namespace
# ($p-m) whose port towards the receiver is the bottleneck: RATE Gbit/s, a LIMIT-byte queue,
# tail drop. The client runs QPS RC QPs of 64 KiB WRITEs for SECS seconds under each
# congestion control in CCS; the table gives each run's goodput, every QP's share (Jain's
# index over the QPs), what the switch dropped and marked, the CNPs the receiver sent and
# the sender heard, and the packets it resent.
#
# Two switches (SWITCHES, default both):
#   tc       a Linux bridge whose egress is shaped with tc: tbf, and `red ... ecn` under it
#            where the kernel has red (this project's CI kernel has no red, codel, fq_codel
#            or pie: no marks, so DCQCN hears nothing there — said in the output);
#   ferroce  `ferroce switch`: the same queue in user space, marking RED-style (Kmin LIMIT/20,
#            Kmax LIMIT/2, Pmax 0.2), as the simulated fabric does.
# (The switch is a third namespace and not the sender's own veth because ferroce's AF_PACKET
# port sends past the qdisc layer.) Root only; cleans its namespaces up on exit.
#   scripts/cc-veth.sh [RATE_GBIT] [SECS] [QPS] [CCS]
#     (defaults 1 3 4 "none dcqcn dcqcn-ferroce timely"; BASE_RTT_US 2000 for dcqcn-ferroce)
set -euo pipefail
cd "$(dirname "$0")/.."
rate=${1:-1}
secs=${2:-3}
qps=${3:-4}
ccs=${4:-none dcqcn dcqcn-ferroce timely}
# dcqcn-ferroce's window: one BDP at this round trip (this machine's paths are software ones,
# a user-space switch among busy-polling processes on two cores: a millisecond or two).
base_rtt_us=${BASE_RTT_US:-2000}
limit=${LIMIT:-1000000}
profile=${FERROCE_PROFILE:-release}
bin=target/$profile/ferroce
read -r -a build <<<"${FERROCE_BUILD:--p ferroce-ibverbs -p ferroce-rdmacm -p ferroce-cli}"
[ -x "$bin" ] || cargo build -q --profile "$profile" "${build[@]}"
p=frcc
a=$p-a; m=$p-m; b=$p-b
switches=${SWITCHES:-tc ferroce}
down() {
  [ -n "${swpid:-}" ] && kill "$swpid" 2>/dev/null && wait "$swpid" 2>/dev/null
  swpid=
  for n in $a $m $b; do
    # A server whose client never came would poll on forever: nothing outlives its namespace.
    ip netns pids "$n" 2>/dev/null | xargs -r kill 2>/dev/null || true
    ip netns del "$n" 2>/dev/null || true
  done
}
trap down EXIT
up() { # $1: tc | ferroce
  down
  for n in $a $m $b; do
    ip netns add "$n"
    ip netns exec "$n" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1
    ip netns exec "$n" ip link set lo up
  done
  ip link add $p-va type veth peer name $p-ma
  ip link add $p-mb type veth peer name $p-vb
  ip link set $p-va netns $a; ip link set $p-ma netns $m
  ip link set $p-mb netns $m; ip link set $p-vb netns $b
  for i in $p-ma $p-mb; do ip netns exec $m ip link set $i mtu 9000 up; done
  for x in "$a:$p-va:1" "$b:$p-vb:2"; do
    IFS=: read -r n i h <<<"$x"
    ip netns exec "$n" ip link set "$i" mtu 9000
    ip netns exec "$n" ip addr add "192.168.78.$h/24" dev "$i"
    ip netns exec "$n" ip link set "$i" up
  done
  if [ "$1" = tc ]; then
    ip netns exec $m ip link add br0 type bridge stp_state 0 forward_delay 0
    for i in $p-ma $p-mb; do ip netns exec $m ip link set $i master br0; done
    ip netns exec $m ip link set br0 up
    ip netns exec $m tc qdisc add dev $p-mb root handle 1: tbf rate "${rate}gbit" burst 64kb limit "$limit"
    marking="none: this kernel has no red, codel or pie qdisc"
    if ip netns exec $m tc qdisc add dev $p-mb parent 1:1 handle 10: red limit "$limit" \
        min $((limit / 20)) max $((limit / 2)) avpkt 4200 burst 30 probability 0.2 \
        bandwidth "${rate}gbit" ecn 2>/dev/null; then
      marking="red ecn under tbf (Kmin $((limit / 20)) B, Kmax $((limit / 2)) B, Pmax 0.2)"
    fi
    echo "switch tc: a bridge, tbf ${rate} Gbit/s, ${limit}-byte queue; ECN marking: $marking"
  else
    # The kernel's own frames (the connection exchange's TCP) must leave whole and with
    # their checksums written: a user-space switch forwards bytes, not offload promises.
    for x in "$a:$p-va" "$b:$p-vb"; do
      IFS=: read -r n i <<<"$x"
      ip netns exec "$n" ethtool -K "$i" tx off tso off gso off >/dev/null 2>&1
    done
    # It prints what its queue did once a second; stopped after the test, its last line
    # says it all.
    ip netns exec $m "$bin" switch --from "afpacket:$p-ma" --to "afpacket:$p-mb" --gbps "$rate" \
      --buffer "$limit" --pmax 0.2 --duration 3600 --json >/tmp/$p-switch.json &
    swpid=$!
    sleep 0.3
    echo "switch ferroce: user space, ${rate} Gbit/s, ${limit}-byte queue; RED marking (Kmin $((limit / 20)) B, Kmax $((limit / 2)) B, Pmax 0.2)"
  fi
  ip netns exec $a ping -c 1 -W 2 192.168.78.2 >/dev/null
}
stats() { # the switch's drops and marks so far, as text with "dropped N" and "marked M"
  if [ -n "${swpid:-}" ]; then
    echo "dropped 0 marked 0"
  else
    ip netns exec $m tc -s qdisc show dev $p-mb
  fi
}
run() { # $1: congestion control
  local before
  before=$(stats)
  ip netns exec $b "$bin" perf write bw --device "afpacket:$p-vb" --server --qps "$qps" \
    --duration "$secs" --size 65536 --json >/tmp/$p-server.json &
  local srv=$!
  sleep 0.3
  ip netns exec $a "$bin" perf write bw --device "afpacket:$p-va" --connect 192.168.78.2 \
    --qps "$qps" --duration "$secs" --size 65536 --cc "$1" --gbps "$rate" --base-rtt-us "$base_rtt_us" --json >/tmp/$p-client.json
  wait "$srv"
  local after
  if [ -n "${swpid:-}" ]; then
    sleep 1.2
    kill "$swpid"
    wait "$swpid" || true
    swpid=
    after=$(tail -1 /tmp/$p-switch.json | python3 -c 'import json, sys; s = json.load(sys.stdin); print("dropped", s["dropped"], "marked", s["marked"])')
  else
    after=$(stats)
  fi
  python3 - "$1" "$before" "$after" <<'EOF'
import json, re, sys
cc, before, after = sys.argv[1], sys.argv[2], sys.argv[3]
c = json.load(open('/tmp/frcc-client.json'))
s = json.load(open('/tmp/frcc-server.json'))
def tc(text, key):
    # tbf's line: "Sent N bytes M pkt (dropped D, overlimits O requeues R)"; red's: "marked K".
    v = re.findall(key + r'[ :]+(\d+)', text)
    return int(v[0]) if v else 0
drops = tc(after, 'dropped') - tc(before, 'dropped')
marked = tc(after, 'marked') - tc(before, 'marked')
per = c.get('per_qp_messages', [])
secs = c['virtual_seconds']
shares = ' '.join(f'{m * 65536 * 8 / secs / 1e9:.2f}' for m in per)
assert c['verified'], f'{cc}: the client did not verify its run'
# Each process reports its own end.
cl, sv = c['counters']['client'], s['counters']['server']
print(f"{cc:>13} {c['bw_avg_gbps']:7.3f} {c['jain']:6.3f} {drops:7} {marked:7} "
      f"{sv.get('np_cnp_sent', 0):6} {cl.get('rp_cnp_handled', 0):6} "
      f"{cl.get('retransmitted_packets', 0):8} {cl.get('local_ack_timeout_err', 0):7} "
      f"{str(c['verified']):>8}  {shares}")
EOF
}
for sw in $switches; do
  first=1
  for cc in $ccs; do
    up "$sw" >/tmp/$p-up.txt
    if [ $first = 1 ]; then
      echo; cat /tmp/$p-up.txt
      echo "           cc    Gb/s   jain   drops  marked   cnps  heard resent_p timeouts verified  per-QP Gb/s"
      first=0
    fi
    run "$cc"
  done
done
