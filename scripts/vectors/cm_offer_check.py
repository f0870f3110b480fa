"""Checks what ferroce offered in one rdma_cm connection's REQ and REP, and whether the
connection then carried ferroce's in-band path control, as tshark reads a capture of it.

  tshark -r run.pcap -T json | python3 cm_offer_check.py REQ_FLAG REP_FLAG PATH_CONTROL

REQ_FLAG / REP_FLAG: the path control flag expected in the offer at the end of the REQ's /
REP's private data (1 or 0), or "none" for no offer. PATH_CONTROL: "yes" when PATH_CONTROL
frames (ferroce's opcode 0xd8) must appear, "no" when none may: an end sends them only to a
peer whose offer said it speaks them. Exits 1 on any disagreement.
"""
import json
import sys

from cm_check import flatten
from cm_capture_check import num, offer


def main():
    want_req, want_rep, want_pc = sys.argv[1:4]
    frames = [flatten(f["_source"]["layers"], {}) for f in json.load(sys.stdin)]
    attr = lambda f: num(f.get("infiniband.mad.attributeid", "0"))
    reqs = [f for f in frames if attr(f) == 0x10]
    reps = [f for f in frames if attr(f) == 0x13]
    if not reqs or not reps:
        print("no REQ and REP in the capture")
        return 1
    # Every connection of the run (perftest -R makes two): each REQ and REP carries one.
    got_req = {offer(f.get("infiniband.cm.req.ip_cm.private")) for f in reqs}
    got_rep = {offer(f.get("infiniband.cm.rep.private")) for f in reps}
    pc = sum(1 for f in frames if num(f.get("infiniband.bth.opcode", "0")) == 0xD8)
    bad = []
    for name, got, want in (("REQ", got_req, want_req), ("REP", got_rep, want_rep)):
        flags = {"none" if o is None else str(o[0]) for o in got}
        if flags != {want}:
            bad.append(f"{name}s: offers {got}, expected path control flag {want}")
    if (pc > 0) != (want_pc == "yes"):
        bad.append(f"{pc} PATH_CONTROL frames, expected {'some' if want_pc == 'yes' else 'none'}")
    if bad:
        print("\n".join(bad))
        return 1
    print(f"  {len(reqs)} REQs offer {got_req.pop()}, {len(reps)} REPs offer {got_rep.pop()}"
          f" (path control flag, schemes); {pc} PATH_CONTROL frames")
    return 0


if __name__ == "__main__":
    sys.exit(main())
