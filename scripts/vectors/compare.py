#!/usr/bin/env python3
"""Compare a reference reading (tshark_fields.py or scapy_fields.py output) with
`ferroce decode` output: every key the reference has must carry the same value in ferroce's
object for that frame. Exits 1 on the first disagreement. Usage: compare.py REF.jsonl OURS.jsonl"""
import json
import sys


def load(path):
    rows = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                rows.append(json.loads(line))
    return rows


def main():
    ref, ours = load(sys.argv[1]), load(sys.argv[2])
    if len(ref) != len(ours):
        sys.exit(f"{sys.argv[1]}: {len(ref)} frames, ferroce decoded {len(ours)}")
    fields = 0
    for r, o in zip(ref, ours):
        for k, v in r.items():
            if o.get(k) != v:
                sys.exit(f"frame {r['index']}: {k} is {v!r} for the reference, {o.get(k)!r} for ferroce")
            fields += 1
    print(f"{len(ref)} frames, {fields} fields agree")


if __name__ == "__main__":
    main()
