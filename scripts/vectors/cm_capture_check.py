"""Checks a capture of one rdma_cm connection and disconnection, as tshark reads it.

  tshark -r cm.pcap -T json | python3 cm_capture_check.py CLIENT_IP SERVER_IP PORT CLIENT_QPN SERVER_QPN

The capture holds the QP1 frames of both sides (the CM MADs). Every frame must be a CM MAD
as a kernel CM sends it over RoCEv2: a UD SEND only to QP1 from QP1, GSI Q_Key 0x80010000,
P_Key 0xffff, management class 7 version 2, method Send. Among them must be the connection of
the client's QP: a REQ from it (service ID of the TCP port space and PORT, rdma_cm's IP header
naming both addresses and the client's port, the path's GIDs), the server's REP naming the
REQ's communication ID and the server's QP, the RTU, and a DREQ / DREP pair with the same two
communication IDs, and ferroce's offer (path control) at the end of the REQ's and REP's
private data. Prints those frames as tshark read them; exits 1 on any disagreement.
"""
import json
import sys
import zlib

from cm_check import flatten  # the same reading of tshark's JSON


def num(x):
    return int(x, 0) if isinstance(x, str) else x


def offer(private):
    """ferroce's offer in the last 24 bytes of a CM message's private data (tshark's
    colon-separated hex), as ferroce_verbs::cm::Offer lays it out: None when absent, else
    (path control flag, [(kind, parameter)])."""
    b = bytes.fromhex((private or "").replace(":", ""))
    if len(b) < 24:
        return None
    t = b[-24:]
    if t[:4] != b"FRCE" or t[4] < 1 or zlib.crc32(t[:20]) != int.from_bytes(t[20:], "big"):
        return None
    caps = tuple((t[8 + 5 * i], int.from_bytes(t[9 + 5 * i:13 + 5 * i], "big")) for i in range(t[6]))
    return (t[5] & 1, caps)


NAMES = {0x10: "REQ", 0x13: "REP", 0x14: "RTU", 0x15: "DREQ", 0x16: "DREP", 0x12: "REJ", 0x11: "MRA"}


def main():
    client, server, port, cqpn, sqpn = sys.argv[1:6]
    port, cqpn, sqpn = int(port), int(cqpn, 0), int(sqpn, 0)
    frames = [flatten(f["_source"]["layers"], {}) for f in json.load(sys.stdin)]
    bad = []
    for i, f in enumerate(frames, 1):
        want = {
            "infiniband.bth.opcode": 100,
            "infiniband.bth.destqp": 1,
            "infiniband.bth.p_key": 0xFFFF,
            "infiniband.deth.q_key": 0x80010000,
            "infiniband.deth.srcqp": 1,
            "infiniband.mad.mgmtclass": 7,
            "infiniband.mad.classversion": 2,
            "infiniband.mad.method": 3,
        }
        for k, v in want.items():
            if k not in f or num(f[k]) != v:
                bad.append(f"frame {i}: {k} is {f.get(k)}, a CM MAD has {v:#x}")
        f["kind"] = NAMES.get(num(f.get("infiniband.mad.attributeid", "0")), "?")
        # The sender's communication ID opens every CM message's data.
        f["local"] = int(f.get("infiniband.mad.data", "0" * 8).replace(":", "")[:8], 16)
    req = next((f for f in frames if f["kind"] == "REQ"
                and num(f.get("infiniband.cm.req.localqpn", "0")) == cqpn), None)
    if req is None:
        print(f"no REQ from QP {cqpn:#x}")
        return 1
    checks = {
        "infiniband.cm.req.serviceid.prefix": "00:00:00:00:01",
        "infiniband.cm.req.serviceid.protocol": 0x06,
        "infiniband.cm.req.serviceid.dport": port,
        "infiniband.cm.req.ip_cm.ipv": 4,
        "infiniband.cm.req.ip_cm.sip4": client,
        "infiniband.cm.req.ip_cm.dip4": server,
        "infiniband.cm.req.prim_localgid_ipv4": client,
        "infiniband.cm.req.prim_remotegid_ipv4": server,
        "infiniband.cm.req.pkey": 0xFFFF,
        "infiniband.cm.req.maxcmretr": 15,
        "infiniband.cm.req.remoteresptout": 20,
    }
    for k, v in checks.items():
        got = req.get(k)
        ok = got is not None and (num(got) == v if isinstance(v, int) else got == v)
        if not ok:
            bad.append(f"REQ: {k} is {got}, expected {v}")
    rc = req["local"]
    rep = next((f for f in frames if f["kind"] == "REP"
                and num(f.get("infiniband.cm.rep.remotecommid", "0")) == rc), None)
    if rep is None or num(rep.get("infiniband.cm.rep.localqpn", "0")) != sqpn:
        print("\n".join(bad + [f"no REP to {rc:#x} from QP {sqpn:#x}"]))
        return 1
    pc = rep["local"]
    rtu = [f for f in frames if f["kind"] == "RTU"
           and num(f["infiniband.cm.rtu.localcommid"]) == rc
           and num(f["infiniband.cm.rtu.remotecommid"]) == pc]
    dreq = [f for f in frames if f["kind"] == "DREQ"
            and {num(f["infiniband.cm.dreq.localcommid"]), num(f["infiniband.cm.dreq.remotecommid"])} == {rc, pc}]
    drep = [f for f in frames if f["kind"] == "DREP"
            and {num(f["infiniband.cm.drsp.localcommid"]), num(f["infiniband.cm.drsp.remotecommid"])} == {rc, pc}]
    for name, got in (("RTU", rtu), ("DREQ", dreq), ("DREP", drep)):
        if not got:
            bad.append(f"no {name} between {rc:#x} and {pc:#x}")
    if dreq and drep and num(dreq[0]["infiniband.cm.dreq.localcommid"]) != num(drep[0]["infiniband.cm.drsp.remotecommid"]):
        bad.append("the DREP does not answer the DREQ's sender")
    # ferroce's offer rides at the end of the private data: both ends speak path control.
    req_offer = offer(req.get("infiniband.cm.req.ip_cm.private"))
    rep_offer = offer(rep.get("infiniband.cm.rep.private"))
    for name, got in (("REQ", req_offer), ("REP", rep_offer)):
        if got != (1, ()):
            bad.append(f"{name}: ferroce's offer is {got}, expected path control and no scheme")
    if bad:
        print("\n".join(bad))
        return 1
    for f in [req, rep] + rtu[:1] + dreq[:1] + drep[:1]:
        print(f"  frame {f['frame.number']:>3}  {f['ip.src']} -> {f['ip.dst']}  {f['kind']:<4}"
              f"  comm id {f['local']:#010x}  tid {f['infiniband.mad.transactionid']}")
    print(f"  REQ: QPN {cqpn:#x}, service {req['infiniband.cm.req.serviceid.prefix']}"
          f"/{num(req['infiniband.cm.req.serviceid.protocol']):#04x}/port {port}, IP CM header "
          f"{client}:{num(req['infiniband.cm.req.ip_cm.sport'])} -> {server}; REP: QPN {sqpn:#x}")
    print(f"  ferroce's offer at the end of the private data: REQ {req_offer}, REP {rep_offer}"
          " (path control flag, schemes)")
    print(f"{len(frames)} CM MADs on QP1; the connection and disconnection of QP {cqpn:#x} agree")
    return 0


if __name__ == "__main__":
    sys.exit(main())
