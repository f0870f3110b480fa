#!/usr/bin/env python3
"""Turn `tshark -T json` output for a RoCEv2 capture into one JSON object per frame, with the
key names `ferroce decode` uses, so the two can be compared field by field.

Only what Wireshark's own dissector shows is written; nothing is computed here beyond renaming,
hex-to-integer conversion, and one subtraction: tshark's data length includes the pad bytes,
so payload_len = data length - pad count. Known limits of tshark 4.0's InfiniBand dissector,
which simply leave fields out: AtomicETH's address and key are shown under reth.*, CNP (0x81)
is "unknown opcode" with its bytes as vendor data, and SEND_WITH_INVALIDATE payloads go to the
RPC-over-RDMA heuristic (so neither payload nor ICRC are shown for them).

Usage: tshark -r FILE.pcap -T json | tshark_fields.py > tshark.jsonl
"""
import json
import sys


def num(v):
    return int(v, 0)


def hex_bytes_to_int(v):
    return int(v.replace(":", ""), 16)


def flat(tree, out):
    """Collect every 'a.b.c': value pair of a tshark JSON layer tree."""
    for k, v in tree.items():
        if isinstance(v, dict):
            flat(v, out)
        elif k not in out:
            out[k] = v
    return out


def frame(layers):
    f = {}
    for name in ("frame", "vlan", "ip", "ipv6", "udp", "infiniband", "data"):
        if name in layers and isinstance(layers[name], dict):
            flat(layers[name], f)
        elif name in layers:
            f[name] = layers[name]
    o = {"index": num(f["frame.number"])}
    if "vlan.id" in f:
        o["vlan_id"] = num(f["vlan.id"])
        o["vlan_pcp"] = num(f["vlan.priority"])
    if "ip.src" in f:
        o["ip_version"] = 4
        o["src_ip"] = f["ip.src"]
        o["dst_ip"] = f["ip.dst"]
        o["dscp"] = num(f["ip.dsfield.dscp"])
        o["ttl"] = num(f["ip.ttl"])
        o["ecn"] = num(f["ip.dsfield.ecn"])
    elif "ipv6.src" in f:
        o["ip_version"] = 6
        o["src_ip"] = f["ipv6.src"]
        o["dst_ip"] = f["ipv6.dst"]
        o["dscp"] = num(f["ipv6.tclass.dscp"])
        o["flow_label"] = num(f["ipv6.flow"])
        o["hop_limit"] = num(f["ipv6.hlim"])
        o["ecn"] = num(f["ipv6.tclass.ecn"])
    o["udp_sport"] = num(f["udp.srcport"])
    o["opcode"] = num(f["infiniband.bth.opcode"])
    o["solicited"] = f["infiniband.bth.se"] == "1"
    o["mig_req"] = f["infiniband.bth.m"] == "1"
    o["pad"] = num(f["infiniband.bth.padcnt"])
    o["pkey"] = num(f["infiniband.bth.p_key"])
    o["dest_qpn"] = num(f["infiniband.bth.destqp"])
    o["ack_req"] = f["infiniband.bth.a"] == "1"
    o["psn"] = num(f["infiniband.bth.psn"])
    if "infiniband.deth.q_key" in f:
        o["deth_qkey"] = num(f["infiniband.deth.q_key"])
        o["deth_src_qp"] = num(f["infiniband.deth.srcqp"])
    if "infiniband.atomiceth.swapdt" in f:
        o["atomic_va"] = "0x%016x" % num(f["infiniband.reth.va"])
        o["atomic_rkey"] = num(f["infiniband.reth.r_key"])
        o["atomic_swap_add"] = "0x%016x" % num(f["infiniband.atomiceth.swapdt"])
        o["atomic_compare"] = "0x%016x" % num(f["infiniband.atomiceth.cmpdt"])
    elif "infiniband.reth.va" in f:
        o["reth_va"] = "0x%016x" % num(f["infiniband.reth.va"])
        o["reth_rkey"] = num(f["infiniband.reth.r_key"])
        o["reth_len"] = num(f["infiniband.reth.dmalen"])
    if "infiniband.aeth.syndrome" in f:
        o["aeth_syndrome"] = num(f["infiniband.aeth.syndrome"])
        o["aeth_msn"] = num(f["infiniband.aeth.msn"])
    if "infiniband.atomicacketh.origremdt" in f:
        o["atomic_orig_data"] = "0x%016x" % num(f["infiniband.atomicacketh.origremdt"])
    if "infiniband.immdt" in f:
        o["imm"] = hex_bytes_to_int(f["infiniband.immdt"])
    if "infiniband.ieth" in f:
        o["ieth_rkey"] = hex_bytes_to_int(f["infiniband.ieth"])
    if "infiniband.invariant.crc" in f:
        o["icrc"] = "0x%08x" % num(f["infiniband.invariant.crc"])
        if "data.len" in f:
            o["payload_len"] = num(f["data.len"]) - o["pad"]
        elif "infiniband.payload" in f:
            o["payload_len"] = len(f["infiniband.payload"].split(":")) - o["pad"]
        else:
            o["payload_len"] = 0
    return o


def main():
    for p in json.load(sys.stdin):
        print(json.dumps(frame(p["_source"]["layers"]), separators=(",", ":")))


if __name__ == "__main__":
    main()
