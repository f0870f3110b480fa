//! Golden vectors: `tests/vectors/golden.pcap` holds a well-formed frame of every opcode over
//! IPv4 and IPv6 (some 802.1Q-tagged), `broken.pcap` one frame per way of being malformed.
//! The pcaps are built here and must stay byte-identical (`FERROCE_BLESS=1` rewrites them).
//! `tshark.jsonl` and `scapy.jsonl` are what Wireshark's InfiniBand dissector and scapy's RoCE
//! layer made of golden.pcap (regenerated and diffed in CI by `scripts/check-vectors.sh`);
//! `ferroce decode` must agree with both, field by field.

use std::path::PathBuf;
use std::process::Command;

use ferroce_drivers::pcap;
use ferroce_stack::wire::sample::{broken_frames, sample_frame, sample_repr, SampleAddr};
use ferroce_stack::wire::{Ecn, IpRepr, Opcode, Psn, Qpn, RoceRepr, SackEthRepr};
use serde_json::Value;

fn vectors() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/vectors")
}

/// The frames of golden.pcap: every opcode twice, with fields varied so a decoder that mixes
/// two of them up disagrees somewhere.
fn golden_frames() -> Vec<Vec<u8>> {
    const LENS: [usize; 7] = [0, 1, 2, 3, 13, 64, 256];
    const SYNDROMES: [u8; 7] = [0x1f, 0x00, 0x21, 0x60, 0x61, 0x62, 0x63];
    let mut out = Vec::new();
    // IBTA's opcodes the ones tshark and scapy know. ferroce's own opcodes (selective
    // repeat, path control) are not IBTA's, and IBTA 1.5's RDMA ATOMIC WRITE is newer than
    // Debian 12's tshark (4.0) and scapy's RoCE layer: neither has anything to agree with
    // (tests/transport_pcap.rs captures ATOMIC WRITE, whose BTH both read).
    for (i, op) in Opcode::all()
        .filter(|o| {
            !o.is_selective_repeat() && *o != Opcode::PATH_CONTROL && *o != Opcode::RC_ATOMIC_WRITE
        })
        .enumerate()
    {
        for ip_version in [4u8, 6] {
            let k = i * 2 + usize::from(ip_version == 6);
            let addr = SampleAddr {
                ip_version,
                vlan: ip_version == 6 && i % 3 == 0,
                udp_src_port: 49152 + k as u16,
            };
            let mut r: RoceRepr = sample_repr(op, addr, LENS[k % 7] + 4 * (i % 5));
            r.bth.psn = Psn::new(0xff_fff0u32.wrapping_add(k as u32 * 3));
            r.bth.dest_qpn = Qpn::new(0x11 + k as u32 * 7919);
            r.bth.solicited = k % 2 == 1;
            r.bth.mig_req = k % 3 == 0;
            r.bth.pkey = if k % 4 == 0 { 0x7fff } else { 0xffff };
            let ecn = Ecn::from_bits(k as u8);
            r.ip.set_ecn(ecn);
            if let IpRepr::V4(ip) = &mut r.ip {
                ip.ident = k as u16;
            }
            if let Some(a) = &mut r.ext.aeth {
                a.syndrome = SYNDROMES[k % 7];
                a.msn = ferroce_stack::wire::Msn::new(k as u32 * 1000);
            }
            if let Some(d) = &mut r.ext.deth {
                d.qkey = 0x8001_0000 + k as u32;
            }
            out.push(sample_frame(&r));
        }
    }
    out
}

fn pcap_bytes(frames: &[Vec<u8>]) -> Vec<u8> {
    let mut w = pcap::writer(Vec::new()).unwrap();
    for (i, f) in frames.iter().enumerate() {
        pcap::write_frame(&mut w, 1_000_000_000 + i as u64 * 1_000, f).unwrap();
    }
    w.into_writer()
}

fn check_or_bless(name: &str, bytes: &[u8]) {
    let path = vectors().join(name);
    if std::env::var_os("FERROCE_BLESS").is_some() {
        std::fs::write(&path, bytes).unwrap();
    }
    let committed = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(committed == bytes, "{name} differs from what the stack emits now; if the change is intended, rerun with FERROCE_BLESS=1 and recheck with scripts/check-vectors.sh");
}

#[test]
fn golden_pcaps_are_what_the_stack_emits() {
    check_or_bless("golden.pcap", &pcap_bytes(&golden_frames()));
    let broken: Vec<Vec<u8>> = broken_frames().into_iter().map(|b| b.bytes).collect();
    check_or_bless("broken.pcap", &pcap_bytes(&broken));
}

fn decode(name: &str) -> (Vec<serde_json::Map<String, Value>>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ferroce"))
        .arg("decode")
        .arg(vectors().join(name))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let (objects, summary) = text.trim_end().rsplit_once('\n').unwrap();
    (parse_jsonl(objects), summary.to_owned())
}

fn parse_jsonl(text: &str) -> Vec<serde_json::Map<String, Value>> {
    text.lines()
        .map(|l| match serde_json::from_str::<Value>(l).unwrap() {
            Value::Object(o) => o,
            other => panic!("not a JSON object: {other}"),
        })
        .collect()
}

fn read_jsonl(name: &str) -> Vec<serde_json::Map<String, Value>> {
    let path = vectors().join(name);
    parse_jsonl(
        &std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())),
    )
}

/// Compares every key the reference has with ferroce's value for it, and checks ferroce
/// reports no extension-header field the reference lacks.
fn agree(
    tool: &str,
    reference: &[serde_json::Map<String, Value>],
    ours: &[serde_json::Map<String, Value>],
) {
    assert_eq!(reference.len(), ours.len(), "{tool}: frame count");
    let mut compared = 0;
    for (r, o) in reference.iter().zip(ours) {
        for (k, v) in r {
            let mine = o.get(k).unwrap_or_else(|| {
                panic!(
                    "{tool}: frame {} has {k} = {v}, ferroce has no {k}",
                    r["index"]
                )
            });
            assert_eq!(mine, v, "{tool}: frame {} field {k}", r["index"]);
            compared += 1;
        }
        for k in o.keys() {
            let ext = ["reth_", "aeth_", "atomic_", "imm", "ieth_", "deth_"];
            if ext.iter().any(|p| k.starts_with(p)) && tool == "tshark" {
                let known = ["atomic_va", "atomic_rkey"]; // tshark 4.0 does not show these
                assert!(
                    r.contains_key(k) || known.contains(&k.as_str()),
                    "{tool}: frame {} lacks {k}",
                    o["index"]
                );
            }
        }
    }
    assert!(
        compared > ours.len() * 10,
        "{tool}: only {compared} fields compared"
    );
}

#[test]
fn decode_agrees_with_tshark_field_by_field() {
    let (ours, summary) = decode("golden.pcap");
    assert_eq!(summary, format!("{} decoded, 0 rejected", ours.len()));
    agree("tshark", &read_jsonl("tshark.jsonl"), &ours);
}

#[test]
fn decode_agrees_with_scapy_field_by_field() {
    let (ours, _) = decode("golden.pcap");
    agree("scapy", &read_jsonl("scapy.jsonl"), &ours);
}

#[test]
fn decode_flags_every_broken_frame() {
    let (ours, summary) = decode("broken.pcap");
    let broken = broken_frames();
    assert_eq!(summary, format!("0 decoded, {} rejected", broken.len()));
    for (o, b) in ours.iter().zip(&broken) {
        let err = o["error"].as_str().unwrap();
        assert!(
            err.starts_with(&format!("{}: ", b.kind)),
            "{}: {err}",
            b.what
        );
    }
    // The ICRC failures keep their fields and say so.
    let icrc: Vec<_> = ours.iter().filter(|o| o.contains_key("icrc_ok")).collect();
    assert_eq!(icrc.len(), 2);
    assert!(icrc.iter().all(|o| o["icrc_ok"] == Value::Bool(false)));
}

#[test]
fn decode_fails_cleanly_on_unreadable_input() {
    let run = |path: &std::path::Path| {
        Command::new(env!("CARGO_BIN_EXE_ferroce"))
            .arg("decode")
            .arg(path)
            .output()
            .unwrap()
    };
    let missing = run(std::path::Path::new("/nonexistent/x.pcap"));
    assert_eq!(missing.status.code(), Some(2));
    let msg = String::from_utf8(missing.stderr).unwrap();
    assert_eq!(msg.lines().count(), 1, "{msg}");
    assert!(msg.starts_with("ferroce: cannot open /nonexistent/x.pcap"));

    let dir = std::env::temp_dir().join(format!("ferroce-decode-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let junk = dir.join("junk.pcap");
    std::fs::write(&junk, b"this is not a capture file at all").unwrap();
    let out = run(&junk);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(String::from_utf8(out.stderr).unwrap().lines().count(), 1);

    // A capture cut in the middle of a record: what was read is printed, then exit 2.
    let golden = std::fs::read(vectors().join("golden.pcap")).unwrap();
    let cut = dir.join("cut.pcap");
    std::fs::write(&cut, &golden[..golden.len() - 10]).unwrap();
    let out = run(&cut);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8(out.stdout).unwrap().lines().count() > 10);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// ferroce's selective-repeat frames (manufacturer-specific opcodes, which tshark and scapy do
/// not know) decode with their own fields: the per-packet placement of a WRITE and the
/// SackETH of an acknowledgement.
#[test]
fn decode_shows_selective_repeat_frames() {
    let write = sample_repr(Opcode::SR_RDMA_WRITE_MIDDLE, SampleAddr::default(), 64);
    let ack = sample_repr(Opcode::SR_ACKNOWLEDGE, SampleAddr::default(), 0);
    let frames = vec![sample_frame(&write), sample_frame(&ack)];
    let path = std::env::temp_dir().join(format!("ferroce-sr-{}.pcap", std::process::id()));
    std::fs::write(&path, pcap_bytes(&frames)).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_ferroce"))
        .arg("decode")
        .arg(&path)
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&path);
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<Value> = text
        .lines()
        .take(2)
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(text.lines().last(), Some("2 decoded, 0 rejected"));
    assert_eq!(lines[0]["opcode_name"], "SR_RDMA_WRITE_MIDDLE");
    assert_eq!(lines[0]["reth_rkey"], write.ext.reth.unwrap().rkey);
    assert_eq!(lines[0]["icrc_ok"], true);
    let sack = ack.ext.sack_eth.unwrap();
    assert_eq!(lines[1]["opcode_name"], "SR_ACKNOWLEDGE");
    assert_eq!(lines[1]["sack_base"], sack.base.value());
    assert_eq!(lines[1]["sack_lost"], sack.lost.value());
    let arrived: Vec<u32> = (0..SackEthRepr::SPAN)
        .filter(|&i| sack.has(i))
        .map(|i| sack.base.add(1 + i).value())
        .collect();
    assert_eq!(lines[1]["sack_arrived"], serde_json::json!(arrived));
    assert!(lines[1].get("sack_avoid_path").is_none());
}

/// `--sdr` reads a UC WRITE-with-immediate's immediate as SDR's message id, packet offset
/// and user bits (the paper's 10 + 18 + 4 split, or `--sdr-layout`'s); without it the
/// fields are not there, and a bad layout is one line.
#[test]
fn decode_shows_sdr_fields_when_asked() {
    let mut write = sample_repr(
        Opcode::UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE,
        SampleAddr::default(),
        64,
    );
    let imm = 5 << 22 | 77 << 4 | 9;
    write.ext.imm_dt.as_mut().unwrap().imm = imm;
    let path = std::env::temp_dir().join(format!("ferroce-sdr-{}.pcap", std::process::id()));
    std::fs::write(&path, pcap_bytes(&[sample_frame(&write)])).unwrap();
    let run = |extra: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_ferroce"))
            .arg("decode")
            .arg(&path)
            .args(extra)
            .output()
            .unwrap()
    };
    let first = |out: &std::process::Output| -> Value {
        serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().next().unwrap()).unwrap()
    };
    let plain = first(&run(&[]));
    assert_eq!(plain["imm"], imm);
    assert!(plain.get("sdr").is_none());
    let sdr = first(&run(&["--sdr"]));
    assert_eq!(
        sdr["sdr"],
        serde_json::json!({"msg_id": 5, "offset": 77, "user": 9})
    );
    let wide = first(&run(&["--sdr-layout", "8,22,2"]));
    assert_eq!(
        wide["sdr"],
        serde_json::json!({"msg_id": imm >> 24, "offset": (imm >> 2) & 0x3f_ffff, "user": imm & 3})
    );
    let bad = run(&["--sdr-layout", "10,18,5"]);
    let _ = std::fs::remove_file(&path);
    assert_eq!(bad.status.code(), Some(2));
    let err = String::from_utf8_lossy(&bad.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
}
