#!/usr/bin/env python3
"""Read a RoCEv2 capture with scapy's RoCE layer (scapy.contrib.roce, scapy >= 2.6 for IPv6
ICRC) and print one JSON object per frame with the key names `ferroce decode` uses.

icrc_ok is scapy's own verdict: the frame is rebuilt with the ICRC left for scapy to compute,
and the result compared with the trailer. scapy models BTH, AETH (on ACKs) and the CNP's
reserved block; other extension headers stay raw bytes and are not reported here.

Usage: scapy_fields.py FILE.pcap > scapy.jsonl
"""
import json
import sys

from scapy.all import IP, UDP, Dot1Q, Ether, IPv6, rdpcap
from scapy.contrib.roce import AETH, BTH


def frame(index, pkt):
    o = {"index": index}
    if Dot1Q in pkt:
        o["vlan_id"] = pkt[Dot1Q].vlan
        o["vlan_pcp"] = pkt[Dot1Q].prio
    if IP in pkt:
        ip = pkt[IP]
        o.update(ip_version=4, src_ip=ip.src, dst_ip=ip.dst, dscp=ip.tos >> 2, ttl=ip.ttl,
                 ecn=ip.tos & 3)
    else:
        ip = pkt[IPv6]
        o.update(ip_version=6, src_ip=ip.src, dst_ip=ip.dst, dscp=ip.tc >> 2,
                 flow_label=ip.fl, hop_limit=ip.hlim, ecn=ip.tc & 3)
    o["udp_sport"] = pkt[UDP].sport
    b = pkt[BTH]
    o.update(opcode=b.opcode, solicited=bool(b.solicited), mig_req=bool(b.migreq),
             pad=b.padcount, pkey=b.pkey, fecn=bool(b.fecn), becn=bool(b.becn),
             dest_qpn=b.dqpn, ack_req=bool(b.ackreq), psn=b.psn)
    if AETH in pkt:
        o["aeth_syndrome"] = pkt[AETH].syndrome
        o["aeth_msn"] = pkt[AETH].msn
    wire = bytes(pkt)
    o["icrc"] = "0x%08x" % int.from_bytes(wire[-4:], "big")
    again = Ether(wire)
    again[BTH].icrc = None
    o["icrc_ok"] = bytes(again)[-4:] == wire[-4:]
    return o


def main():
    for i, pkt in enumerate(rdpcap(sys.argv[1]), start=1):
        print(json.dumps(frame(i, pkt), separators=(",", ":")))


if __name__ == "__main__":
    main()
