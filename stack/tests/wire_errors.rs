//! Every malformed-frame kind is reported as its own error, and the well-formed samples of
//! every opcode parse.

use ferroce_stack::wire::sample::*;
use ferroce_stack::wire::*;

#[test]
fn each_broken_frame_fails_with_its_own_kind() {
    let broken = broken_frames();
    for b in &broken {
        let got = RoceRepr::parse(&b.bytes, Checks::ALL)
            .map(|_| ())
            .map_err(|e| e.kind());
        assert_eq!(got, Err(b.kind), "{}", b.what);
    }
    // Every receive-side error kind appears at least once.
    for kind in [
        "truncated",
        "not_ip",
        "ip_version",
        "ipv4_options",
        "ipv4_ihl",
        "ipv4_fragment",
        "ipv4_checksum",
        "ip_length",
        "not_udp",
        "not_roce",
        "udp_length",
        "tver",
        "reserved_opcode",
        "unsupported_opcode",
        "bad_pad",
        "unexpected_payload",
        "bad_icrc",
    ] {
        assert!(
            broken.iter().any(|b| b.kind == kind),
            "no sample for {kind}"
        );
    }
}

#[test]
fn truncation_names_the_layer() {
    let broken = broken_frames();
    let layers: Vec<Layer> = broken
        .iter()
        .filter_map(|b| match RoceRepr::parse(&b.bytes, Checks::ALL) {
            Err(Error::Truncated { layer, .. }) => Some(layer),
            _ => None,
        })
        .collect();
    assert_eq!(
        layers,
        [Layer::Ethernet, Layer::Ipv4, Layer::Bth, Layer::ExtHeaders]
    );
}

#[test]
fn every_opcode_sample_parses_with_all_checks() {
    for op in Opcode::all() {
        for ip_version in [4, 6] {
            for vlan in [false, true] {
                let addr = SampleAddr {
                    ip_version,
                    vlan,
                    ..Default::default()
                };
                let repr = sample_repr(op, addr, 37);
                let frame = sample_frame(&repr);
                let p = RoceRepr::parse(&frame, Checks::ALL).unwrap();
                assert_eq!(p.repr.bth.opcode, op);
                assert_eq!(p.payload.len(), repr.payload_len);
                assert!(p
                    .payload
                    .iter()
                    .enumerate()
                    .all(|(i, b)| *b == sample_payload_byte(i)));
            }
        }
    }
}

#[test]
fn structural_parse_skips_integrity_checks() {
    let b = broken_frames()
        .into_iter()
        .find(|b| b.kind == "bad_icrc")
        .unwrap();
    let p = RoceRepr::parse(&b.bytes, Checks::NONE).unwrap();
    assert!(matches!(p.icrc_check(), Err(Error::Icrc { .. })));
}

#[test]
fn emit_reports_small_buffers_and_missing_headers() {
    let repr = sample_repr(Opcode::RC_RDMA_WRITE_ONLY, SampleAddr::default(), 100);
    let mut small = vec![0u8; repr.buffer_len() - 1];
    assert!(matches!(
        repr.emit_with_payload(&mut small, &[0; 100]),
        Err(Error::BufferTooSmall { .. })
    ));
    let mut no_reth = repr;
    no_reth.ext.reth = None;
    let mut buf = vec![0u8; repr.buffer_len()];
    assert_eq!(
        no_reth.emit_with_payload(&mut buf, &[0; 100]),
        Err(Error::MissingHeader(0x0a))
    );
    let mut huge = repr;
    huge.payload_len = 70_000;
    let mut big = vec![0u8; huge.buffer_len()];
    assert!(matches!(
        huge.emit(&mut big, |_| {}),
        Err(Error::PayloadTooLong(70_000))
    ));
}
