"""Compares tshark's reading of cm-mads.pcap with what ferroce meant to write.

  tshark -r cm-mads.pcap -T json | python3 cm_check.py cm-mads.expect.json

The expectation (written by tests/cm_wire.rs) is one object per frame: tshark field name ->
value, a number (tshark's hex or decimal text is read as an integer) or a string (compared
as tshark prints it). Every expected field must be present and agree; exits 1 otherwise.
"""
import json
import sys


def flatten(node, out):
    if isinstance(node, dict):
        for k, v in node.items():
            if isinstance(v, (dict, list)):
                flatten(v, out)
            else:
                out.setdefault(k, v)
    elif isinstance(node, list):
        for v in node:
            flatten(v, out)
    return out


def main():
    expected = json.load(open(sys.argv[1]))
    frames = json.load(sys.stdin)
    if len(frames) != len(expected):
        print(f"tshark read {len(frames)} frames, {len(expected)} expected")
        return 1
    bad, fields = [], 0
    for i, (frame, want) in enumerate(zip(frames, expected), 1):
        got = flatten(frame["_source"]["layers"], {})
        for name, value in want.items():
            fields += 1
            if name not in got:
                bad.append(f"frame {i}: tshark has no {name}")
                continue
            text = got[name]
            ok = int(text, 0) == value if isinstance(value, int) else text == value
            if not ok:
                bad.append(f"frame {i}: {name} is {text}, ferroce meant {value}")
    if bad:
        print("\n".join(bad))
        return 1
    print(f"{len(frames)} CM MADs, {fields} fields agree")
    return 0


if __name__ == "__main__":
    sys.exit(main())
