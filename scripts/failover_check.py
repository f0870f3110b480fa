"""Checks the counters of a failover run, as `ferroce stats --all --json` exports them.

  ferroce stats --all --dir DIR --json | python3 failover_check.py NAME [--moved]

With --moved, each side's QPs need only have moved to port 2 (one migration) and may still be
there: the QPs the export holds are then idle ones (perftest -R's control connection, which
outlives its data QPs; a QP is exported while it lives), whose way home waits on a probe the
run may end before.

Two processes ran one connection through a port going down and up: on each side a QP with an
alternate path moved to port 2 and back (at least two migrations), no work completed in
error, and every QP is home on port 1 after the repair. Prints the moves, probes and resent
packets; exits non-zero otherwise.
"""
import json, sys
name = sys.argv[1]
moved_only = "--moved" in sys.argv[2:]
d = json.load(sys.stdin)
assert len(d) == 2, d
for p in d:
    qps = [q for q in p["qps"].values() if "path_migrations" in q]
    assert qps, (name, "no QP with an alternate path", p)
    for q in qps:
        assert q["path_migrations"] >= (1 if moved_only else 2), (name, q)
        assert q["req_cqe_error"] == 0 and q["resp_cqe_error"] == 0, (name, q)
# Both ends home on port 1 after the repair: a QP probes its primary after the link-up
# event (and again, further apart, while unanswered) and goes home on the answer.
away = [(q["path_active_port"], q["path_migrations"], q["path_probes"]) for p in d for q in p["qps"].values() if "path_migrations" in q and q["path_active_port"] != 1]
assert moved_only or not away, (name, "QPs left on port 2 after the repair (port, moves, probes)", away)
probes = sum(q.get("path_probes", 0) for p in d for q in p["qps"].values())
moves = sum(q.get("path_migrations", 0) for p in d for q in p["qps"].values())
dups = sum(q["duplicate_request"] for p in d for q in p["qps"].values())
resent = sum(q["retransmitted_packets"] for p in d for q in p["qps"].values())
where = "to port 2, both sides" if moved_only else "to port 2 and back, both sides"
print(f"ok: {name}: both exit 0; {moves} moves ({where}; {probes} probes, {len(away)} QPs still on port 2), {resent} packets resent, {dups} duplicates answered, not executed")
