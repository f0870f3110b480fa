#!/usr/bin/env bash
# Checks ferroce's wire format against tools nobody here wrote.
#
# 1. Wireshark's InfiniBand dissector (tshark) and scapy's RoCE layer read
#    tests/vectors/golden.pcap; their readings must equal the committed tshark.jsonl and
#    scapy.jsonl (which the Rust test cli/tests/golden.rs compares with `ferroce decode`).
#    With --bless, the readings are written instead.
# 2. scapy must find every golden ICRC correct, and tshark every IPv4 header checksum.
# 3. A fresh capture from the simulated fabric (`ferroce demo --pcap`) must read the same in
#    tshark and in `ferroce decode`, field by field.
# 4. A mixed transport run and 5. CM MADs on QP1 (below, where each is run).
#
# Needs: tshark, and a python with scapy >= 2.6 (SCAPY_PYTHON, default python3).
set -euo pipefail
cd "$(dirname "$0")/.."
py=${SCAPY_PYTHON:-python3}
ferroce=${FERROCE_BIN:-target/release/ferroce}
vectors=tests/vectors
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

tshark -r "$vectors/golden.pcap" -T json 2>/dev/null | python3 scripts/vectors/tshark_fields.py >"$tmp/tshark.jsonl"
"$py" scripts/vectors/scapy_fields.py "$vectors/golden.pcap" >"$tmp/scapy.jsonl"
if [ "${1:-}" = "--bless" ]; then
  cp "$tmp/tshark.jsonl" "$tmp/scapy.jsonl" "$vectors/"
  echo "check-vectors: wrote $vectors/tshark.jsonl and $vectors/scapy.jsonl"
fi
diff -u "$vectors/tshark.jsonl" "$tmp/tshark.jsonl"
diff -u "$vectors/scapy.jsonl" "$tmp/scapy.jsonl"
frames=$(wc -l <"$tmp/scapy.jsonl")
good=$(grep -c '"icrc_ok":true' "$tmp/scapy.jsonl" || true)
[ "$frames" -gt 0 ] && [ "$good" -eq "$frames" ] || { echo "check-vectors: scapy finds $good of $frames golden ICRCs correct"; exit 1; }
bad_sum=$(tshark -r "$vectors/golden.pcap" -o ip.check_checksum:TRUE -Y 'ip.checksum.status == "Bad"' 2>/dev/null | wc -l)
[ "$bad_sum" -eq 0 ] || { echo "check-vectors: tshark finds $bad_sum bad IPv4 checksums in golden.pcap"; exit 1; }
# In broken.pcap, frame 8 is the one with a wrong IPv4 checksum (frame 5, with IHL 6, also
# fails tshark's check, which sums the 24 bytes that IHL claims).
bad_frames=$(tshark -r "$vectors/broken.pcap" -o ip.check_checksum:TRUE -Y 'ip.checksum.status == "Bad"' -T fields -e frame.number 2>/dev/null | tr '\n' ' ')
[ "$bad_frames" = "5 8 " ] || { echo "check-vectors: tshark finds bad IPv4 checksums in broken.pcap frames '$bad_frames', expected '5 8 '"; exit 1; }
echo "check-vectors: tshark and scapy readings of golden.pcap unchanged; $good/$frames ICRCs correct per scapy"
# cnp.pcap: the CNP ferroce builds from a public generator's fields (byte for byte, a unit
# test). tshark 4.0 knows no name for opcode 0x81 but reads its fields; ferroce decode names it.
cnp=$(tshark -r "$vectors/cnp.pcap" -T fields -e infiniband.bth.opcode -e infiniband.bth.p_key -e infiniband.bth.destqp -e infiniband.bth.psn 2>/dev/null | tr '\t' ' ')
[ "$cnp" = "129 65535 0x0000d2 0" ] || { echo "check-vectors: tshark reads the CNP as '$cnp'"; exit 1; }
"$ferroce" decode "$vectors/cnp.pcap" | grep -q '"opcode_name":"CNP".*"becn":true.*"icrc_ok":true' || { echo "check-vectors: ferroce decode does not read cnp.pcap as a CNP with BECN and a good ICRC"; exit 1; }
echo "check-vectors: the CNP reads the same in tshark (opcode 129, P_Key 65535, QP 0xd2, PSN 0) and in ferroce decode"

"$ferroce" demo --frames 3000 --corrupt 0 --seed 7 --pcap "$tmp/demo.pcap" --json >/dev/null
"$ferroce" decode "$tmp/demo.pcap" >"$tmp/demo-decode.jsonl"
tshark -r "$tmp/demo.pcap" -T json 2>/dev/null | python3 scripts/vectors/tshark_fields.py >"$tmp/demo-tshark.jsonl"
"$py" scripts/vectors/scapy_fields.py "$tmp/demo.pcap" >"$tmp/demo-scapy.jsonl"
printf 'check-vectors: demo capture vs tshark: '
python3 scripts/vectors/compare.py "$tmp/demo-tshark.jsonl" "$tmp/demo-decode.jsonl"
printf 'check-vectors: demo capture vs scapy: '
python3 scripts/vectors/compare.py "$tmp/demo-scapy.jsonl" "$tmp/demo-decode.jsonl"

# 4. A mixed transport run (every RC operation, UC, UD, ACKs, NAKs, retransmissions),
#    captured by tests/transport_pcap.rs: tshark and scapy must read what `ferroce decode`
#    reads, and scapy must find every ICRC correct.
mixed=target/tmp/transport-mixed.pcap
[ -f "$mixed" ] || cargo test -q --test transport_pcap >/dev/null
"$ferroce" decode "$mixed" >"$tmp/mixed-decode.jsonl"
tshark -r "$mixed" -T json 2>/dev/null | python3 scripts/vectors/tshark_fields.py >"$tmp/mixed-tshark.jsonl"
"$py" scripts/vectors/scapy_fields.py "$mixed" >"$tmp/mixed-scapy.jsonl"
printf 'check-vectors: transport capture vs tshark: '
python3 scripts/vectors/compare.py "$tmp/mixed-tshark.jsonl" "$tmp/mixed-decode.jsonl"
printf 'check-vectors: transport capture vs scapy: '
python3 scripts/vectors/compare.py "$tmp/mixed-scapy.jsonl" "$tmp/mixed-decode.jsonl"
frames=$(wc -l <"$tmp/mixed-scapy.jsonl")
good=$(grep -c '"icrc_ok":true' "$tmp/mixed-scapy.jsonl" || true)
[ "$frames" -gt 0 ] && [ "$good" -eq "$frames" ] || { echo "check-vectors: scapy finds $good of $frames transport ICRCs correct"; exit 1; }
bad_sum=$(tshark -r "$mixed" -o ip.check_checksum:TRUE -Y 'ip.checksum.status == "Bad"' 2>/dev/null | wc -l)
[ "$bad_sum" -eq 0 ] || { echo "check-vectors: tshark finds $bad_sum bad IPv4 checksums in the transport capture"; exit 1; }
malformed=$(tshark -r "$mixed" -Y '_ws.malformed || _ws.expert.severity >= "error"' 2>/dev/null | wc -l)
[ "$malformed" -eq 0 ] || { echo "check-vectors: tshark flags $malformed transport frames as malformed"; exit 1; }
echo "check-vectors: transport capture: $good/$frames ICRCs correct per scapy, tshark finds no malformed frame"

# 5. Communication management MADs on QP1 (REQ, MRA, REP, RTU, DREQ, DREP, REJ, SIDR_REQ,
#    SIDR_REP with the rdma_cm IP header), captured by tests/cm_wire.rs: tshark must read
#    every field ferroce meant (tests/cm_wire.rs writes the expectation beside the capture),
#    and flag no frame as malformed.
cm=target/tmp/cm-mads.pcap
[ -f "$cm" ] || cargo test -q --test cm_wire >/dev/null
printf 'check-vectors: CM MADs vs tshark: '
tshark -r "$cm" -T json 2>/dev/null | python3 scripts/vectors/cm_check.py target/tmp/cm-mads.expect.json
malformed=$(tshark -r "$cm" -Y '_ws.malformed || _ws.expert.severity >= "error"' 2>/dev/null | wc -l)
[ "$malformed" -eq 0 ] || { echo "check-vectors: tshark flags $malformed CM frames as malformed"; exit 1; }
