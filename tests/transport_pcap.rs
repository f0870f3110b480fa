//! A capture of a mixed run — every RC operation, UC, UD, and the ACKs, NAKs and
//! retransmissions a lossy link causes — written as a pcap that tools nobody here wrote can
//! judge. This test checks that every captured frame parses and checks (ICRC included) and
//! that the run produced every packet kind; `scripts/check-vectors.sh` then has tshark and
//! scapy read the same file (`target/tmp/transport-mixed.pcap`) and compares them with
//! `ferroce decode`.

mod support;

use std::collections::BTreeSet;
use std::io::Write;
use std::net::Ipv4Addr;

use ferroce::drivers::pcap::{Direction, PcapTee};
use ferroce::drivers::sim::{FabricBuilder, LinkModel, Loss, SimPort};
use ferroce::stack::transport::{
    Mtu, Payload, QpType, RecvWr, SendWr, Sge, UdDest, WcStatus, WrOpcode,
};
use ferroce::stack::wire::{Checks, Opcode, Qpn, RoceRepr, Syndrome};
use support::*;

type Tee = PcapTee<SimPort, Box<dyn Write>>;

fn capture(seed: u64, path: &std::path::Path) -> Testbed<Tee> {
    let mut b = FabricBuilder::new(seed);
    let ha = b.host("a", 1);
    let hb = b.host("b", 1);
    let model = LinkModel {
        loss: Loss::Bernoulli(0.03),
        reorder: 0.01,
        ..LinkModel::new(25_000_000_000, 2_000)
    };
    b.link((ha, 0), (hb, 0), model);
    let fabric = b.build().unwrap();
    let file: Box<dyn Write> = Box::new(std::io::BufWriter::new(
        std::fs::File::create(path).unwrap(),
    ));
    let sink: Box<dyn Write> = Box::new(std::io::sink());
    let pa = PcapTee::new(fabric.port(ha, 0), file, Direction::Both).unwrap();
    let pb = PcapTee::new(fabric.port(hb, 0), sink, Direction::Both).unwrap();
    let hosts = vec![
        Host::new(pa, 1 << 20, Ipv4Addr::new(10, 0, 0, 1), 1),
        Host::new(pb, 1 << 20, Ipv4Addr::new(10, 0, 0, 2), 2),
    ];
    Testbed::new(fabric, hosts)
}

#[test]
fn mixed_run_capture_parses_and_covers_every_packet_kind() {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let path = dir.join("transport-mixed.pcap");
    let seed = 5;
    let mut w = capture(seed, &path);
    let o = ConnOpts {
        mtu: Mtu::Mtu512,
        timeout: 8,
        ..ConnOpts::default()
    };
    w.connect(
        QpType::Rc,
        ((0, 0x11), (1, 0x21)),
        (0xff_fff0, 100),
        &o,
        None,
    );
    w.connect(QpType::Uc, ((0, 0x12), (1, 0x22)), (7, 9), &o, None);
    w.hosts[0].add_qp(0x13, QpType::Ud);
    w.hosts[1].add_qp(0x23, QpType::Ud);
    w.bring_up((0, 0x13), (1, 0x23), (0, 0), &o);
    w.bring_up((1, 0x23), (0, 0x13), (0, 0), &o);
    let fill: Vec<u8> = (0..8192).map(|i| i as u8).collect();
    w.hosts[0].write(0, &fill);
    let (ak, bk) = (w.hosts[0].keys, w.hosts[1].keys);
    for (qpn, n) in [(0x21u32, 30u64), (0x22, 10), (0x23, 10)] {
        for i in 0..n {
            let s = [Sge {
                addr: 0x1_0000 + i * 2048,
                length: 2048,
                lkey: bk.lkey,
            }];
            w.hosts[1]
                .qp(qpn)
                .post_recv(&RecvWr {
                    wr_id: i,
                    sg_list: &s,
                })
                .unwrap();
        }
    }
    let src = |len| {
        [Sge {
            addr: 0,
            length: len,
            lkey: ak.lkey,
        }]
    };
    let (one, three) = (src(400), src(1400));
    let back = [Sge {
        addr: 0x4_0000,
        length: 1400,
        lkey: ak.lkey,
    }];
    let small_back = [Sge {
        addr: 0x4_0000,
        length: 400,
        lkey: ak.lkey,
    }];
    let res = [Sge {
        addr: 0x5_0000,
        length: 8,
        lkey: ak.lkey,
    }];
    let mut id = 0;
    for round in 0..4 {
        let q = w.hosts[0].qp(0x11);
        let mut post = |wr: SendWr<'_>| {
            id += 1;
            q.post_send(&SendWr { wr_id: id, ..wr }).unwrap();
        };
        for s in [&one, &three] {
            post(SendWr::new(0, WrOpcode::Send, Payload::Sges(s)));
            post(SendWr::new(0, WrOpcode::SendWithImm, Payload::Sges(s)).imm(round));
            post(SendWr::new(0, WrOpcode::Write, Payload::Sges(s)).remote(0x8_0000, bk.rkey));
            post(
                SendWr::new(0, WrOpcode::WriteWithImm, Payload::Sges(s))
                    .remote(0x9_0000, bk.rkey)
                    .imm(1),
            );
            post(SendWr::new(0, WrOpcode::Read, Payload::Sges(&back)).remote(0x8_0000, bk.rkey));
        }
        post(SendWr::new(0, WrOpcode::Read, Payload::Sges(&small_back)).remote(0x8_0000, bk.rkey));
        post(SendWr {
            compare_add: 3,
            ..SendWr::new(0, WrOpcode::FetchAdd, Payload::Sges(&res)).remote(0xa_0000, bk.rkey)
        });
        post(SendWr {
            compare_add: 0,
            swap: 1,
            ..SendWr::new(0, WrOpcode::CmpSwp, Payload::Sges(&res)).remote(0xa_0008, bk.rkey)
        });
        // RDMA ATOMIC WRITE (IBTA 1.5): its 8 bytes inline.
        let eight = (0x1122_3344_5566_7788u64 + round as u64).to_le_bytes();
        post(
            SendWr::new(0, WrOpcode::AtomicWrite, Payload::Inline(&eight))
                .remote(0xa_0010, bk.rkey),
        );
    }
    // SEND_WITH_INV (one packet and three) on regions b registers for them.
    for (i, s) in [&one, &three].into_iter().enumerate() {
        let at = 0xc_0000 + 0x1000 * i;
        let inv = w.hosts[1].register_window(PD, at, 64, ALL).unwrap();
        let wr = SendWr::new(100 + i as u64, WrOpcode::SendWithInv, Payload::Sges(s)).imm(inv.rkey);
        w.hosts[0].qp(0x11).post_send(&wr).unwrap();
    }
    let uq = w.hosts[0].qp(0x12);
    for (i, s) in [&one, &three].into_iter().enumerate() {
        uq.post_send(&SendWr::new(i as u64, WrOpcode::Send, Payload::Sges(s)))
            .unwrap();
        uq.post_send(&SendWr::new(9, WrOpcode::SendWithImm, Payload::Sges(s)).imm(2))
            .unwrap();
        uq.post_send(&SendWr::new(9, WrOpcode::Write, Payload::Sges(s)).remote(0x8_0000, bk.rkey))
            .unwrap();
        uq.post_send(
            &SendWr::new(9, WrOpcode::WriteWithImm, Payload::Sges(s))
                .remote(0x8_0000, bk.rkey)
                .imm(3),
        )
        .unwrap();
    }
    let av = w.hosts[0].av_to(w.hosts[1].mac(), w.hosts[1].ip);
    let ud = UdDest {
        av,
        remote_qpn: Qpn::new(0x23),
        remote_qkey: o.qkey,
    };
    let uq = w.hosts[0].qp(0x13);
    uq.post_send(&SendWr {
        ud: Some(ud),
        ..SendWr::new(1, WrOpcode::Send, Payload::Sges(&one))
    })
    .unwrap();
    uq.post_send(&SendWr {
        ud: Some(ud),
        ..SendWr::new(2, WrOpcode::SendWithImm, Payload::Sges(&one)).imm(4)
    })
    .unwrap();

    assert!(w.drive_until(10_000_000_000));
    let rc: Vec<_> = w.hosts[0]
        .completions
        .iter()
        .filter(|c| c.qp_num == Qpn::new(0x11))
        .collect();
    assert_eq!(rc.len(), 58);
    assert!(rc.iter().all(|c| c.status == WcStatus::Success), "{rc:#?}");
    let hosts = std::mem::take(&mut w.hosts);
    for h in hosts {
        let port = h.into_ports().remove(0);
        let (_, mut sink) = port.finish().unwrap();
        sink.flush().unwrap();
    }

    // Every frame in the capture is valid RoCEv2, and every kind of packet is there.
    let data = std::fs::read(&path).unwrap();
    let mut reader = pcap_file::pcap::PcapReader::new(&data[..]).unwrap();
    let mut opcodes = BTreeSet::new();
    let mut syndromes = BTreeSet::new();
    let mut frames = 0;
    while let Some(p) = reader.next_packet() {
        let p = p.unwrap();
        let pkt = RoceRepr::parse(&p.data, Checks::ALL).expect("a captured frame fails to parse");
        opcodes.insert(pkt.repr.bth.opcode.0);
        if let Some(a) = pkt.repr.ext.aeth {
            syndromes.insert(match Syndrome::from_byte(a.syndrome) {
                Syndrome::Ack { .. } => "ack",
                Syndrome::RnrNak { .. } => "rnr",
                Syndrome::Nak(_) => "nak",
                Syndrome::Reserved(_) => "reserved",
            });
        }
        frames += 1;
    }
    // Every opcode ferroce speaks except the CNP, which congestion control (not this issue)
    // sends, ferroce's selective-repeat opcodes, which only negotiated peers use, and its
    // path control, which only QPs with a second port send (tests/transport_failover.rs).
    let want: BTreeSet<u8> = Opcode::all()
        .filter(|o| !o.is_selective_repeat())
        .map(|o| o.0)
        .filter(|&o| o != Opcode::CNP.0 && o != Opcode::PATH_CONTROL.0)
        .collect();
    let missing: Vec<_> = want
        .difference(&opcodes)
        .map(|&o| Opcode(o).name())
        .collect();
    assert!(missing.is_empty(), "capture lacks {missing:?}");
    assert!(
        syndromes.contains("nak"),
        "no NAK in the capture: {syndromes:?}"
    );
    assert!(frames > 300, "{frames} frames");
}
