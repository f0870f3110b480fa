#!/usr/bin/env bash
# Congestion control between two ferroce processes over real ports (issue 24, item 6): the
# sender (namespace $p-a) and the receiver ($p-b) meet at a Linux bridge in a third namespace
# ($p-m), the "switch", whose port towards the receiver is shaped with tc (tbf, RATE Gbit/s,
# a LIMIT-byte queue, tail drop). The client runs QPS RC QPs of 64 KiB WRITEs for SECS
# seconds under each congestion control in CCS; the table gives each run's goodput, every
# QP's share (Jain's index over the QPs), what the shaper dropped and marked, the CNPs the
# receiver sent and the packets the sender resent. The switch is the bridge and not the
# sender's own veth because ferroce's AF_PACKET port sends past the qdisc layer.
#
# ECN marking needs a marking qdisc (red, codel, fq_codel, pie); where the kernel has `red`
# (with ecn) the script puts it under tbf, otherwise it says so and DCQCN gets no marks. Root
# only; cleans its namespaces up on exit.
#   scripts/cc-veth.sh [RATE_GBIT] [SECS] [QPS] [CCS]      (defaults 1 3 4 "none dcqcn timely")
set -euo pipefail
cd "$(dirname "$0")/.."
rate=${1:-1}
secs=${2:-3}
qps=${3:-4}
ccs=${4:-none dcqcn timely}
limit=${LIMIT:-1000000}
bin=target/release/ferroce
[ -x "$bin" ] || cargo build -q --release -p ferroce-cli
p=frcc
a=$p-a; m=$p-m; b=$p-b
down() { for n in $a $m $b; do ip netns del "$n" 2>/dev/null || true; done; }
trap down EXIT
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
ip netns exec $m ip link add br0 type bridge stp_state 0 forward_delay 0
for i in $p-ma $p-mb; do
  ip netns exec $m ip link set $i mtu 9000 master br0 up
done
ip netns exec $m ip link set br0 up
for x in "$a:$p-va:1" "$b:$p-vb:2"; do
  IFS=: read -r n i h <<<"$x"
  ip netns exec "$n" ip link set "$i" mtu 9000
  ip netns exec "$n" ip addr add "192.168.78.$h/24" dev "$i"
  ip netns exec "$n" ip link set "$i" up
done
ip netns exec $m tc qdisc add dev $p-mb root handle 1: tbf rate "${rate}gbit" burst 64kb limit "$limit"
marking="none (the kernel has no red/codel/pie qdisc)"
if ip netns exec $m tc qdisc add dev $p-mb parent 1:1 handle 10: red limit "$limit" \
    min $((limit / 20)) max $((limit / 2)) avpkt 4200 burst 30 probability 0.2 \
    bandwidth "${rate}gbit" ecn 2>/dev/null; then
  marking="red ecn under tbf (Kmin $((limit / 20)) B, Kmax $((limit / 2)) B, Pmax 0.2)"
fi
echo "switch: tbf ${rate} Gbit/s, ${limit}-byte queue, tail drop; ECN marking: $marking"
ip netns exec $a ping -c 1 -W 2 192.168.78.2 >/dev/null
stats() { ip netns exec $m tc -s qdisc show dev $p-mb; }
run() { # $1: congestion control
  local before
  before=$(stats)
  ip netns exec $b "$bin" perf write bw --device "afpacket:$p-vb" --server --qps "$qps" \
    --duration "$secs" --size 65536 --json >/tmp/$p-server.json &
  sleep 0.3
  ip netns exec $a "$bin" perf write bw --device "afpacket:$p-va" --connect 192.168.78.2 \
    --qps "$qps" --duration "$secs" --size 65536 --cc "$1" --gbps "$rate" --json >/tmp/$p-client.json
  wait
  python3 - "$1" "$before" "$(stats)" <<'EOF'
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
cl, sv = c['counters']['client'], c['counters']['server']
print(f"{cc:>7} {c['bw_avg_gbps']:7.3f} {c['jain']:6.3f} {drops:7} {marked:7} "
      f"{sv.get('np_cnp_sent', 0):6} {cl.get('rp_cnp_handled', 0):6} "
      f"{cl.get('retransmitted_packets', 0):8} {cl.get('local_ack_timeout_err', 0):7} "
      f"{str(c['verified']):>8}  {shares}")
EOF
}
echo "     cc    Gb/s   jain   drops  marked   cnps  heard resent_p timeouts verified  per-QP Gb/s"
for cc in $ccs; do run "$cc"; done
