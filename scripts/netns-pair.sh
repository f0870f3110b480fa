#!/usr/bin/env bash
# Creates (up) or removes (down) two network namespaces joined by a veth pair, for two-process
# ferroce runs over AF_PACKET: ferroce-a (fr-a, 192.168.77.1/24) and ferroce-b (fr-b,
# 192.168.77.2/24). IPv6 is off on both ends so a fresh veth sends no stray frames. Root only.
#   scripts/netns-pair.sh up [PREFIX]    scripts/netns-pair.sh down [PREFIX]
set -euo pipefail
p=${2:-ferroce}
a=$p-a; b=$p-b; ia=${p:0:8}-va; ib=${p:0:8}-vb
case "${1:-}" in
  up)
    ip netns add "$a"; ip netns add "$b"
    ip link add "$ia" type veth peer name "$ib"
    ip link set "$ia" netns "$a"; ip link set "$ib" netns "$b"
    for ns in "$a:$ia:1" "$b:$ib:2"; do
      IFS=: read -r n i h <<<"$ns"
      ip netns exec "$n" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1
      ip netns exec "$n" ip link set lo up
      ip netns exec "$n" ip link set "$i" mtu 9000
      ip netns exec "$n" ip addr add "192.168.77.$h/24" dev "$i"
      ip netns exec "$n" ip link set "$i" up
    done
    echo "$a:$ia:192.168.77.1 $b:$ib:192.168.77.2"
    ;;
  down)
    ip netns del "$a" 2>/dev/null || true
    ip netns del "$b" 2>/dev/null || true
    ;;
  *) echo "usage: $0 up|down [PREFIX]" >&2; exit 2 ;;
esac
