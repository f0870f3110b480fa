//! Transport mechanics frame by frame, with two QPs back to back in memory and the test in
//! the middle deciding what reaches whom: ACK coalescing, credits, READ/atomic depth,
//! duplicate handling (atomic replay, READ re-execution, re-ACK), RNR timing and error flush.

use ferroce_stack::transport::loopback::{connect, drain_frames as frames, Loopback};
use ferroce_stack::transport::{
    Access, MrKeys, MrTable, Mtu, Payload, PdId, Qp, QpAttr, QpConfig, QpState, QpType, RecvWr,
    SendFlags, SendWr, Sge, WcStatus, WrOpcode,
};
use ferroce_stack::wire::{Checks, Opcode, Psn, Qpn, RoceRepr, Syndrome};

const PD: PdId = PdId(1);
const ALL: Access = Access::LOCAL_WRITE
    .with(Access::REMOTE_WRITE)
    .with(Access::REMOTE_READ)
    .with(Access::REMOTE_ATOMIC);

struct Rig {
    lo: Loopback,
    ka: MrKeys,
    kb: MrKeys,
    a_buf: Vec<u64>,
    b_buf: Vec<u64>,
}

fn rig(attr: QpAttr) -> Rig {
    let mut a_buf = vec![0u64; 8192];
    let mut b_buf = vec![0u64; 8192];
    let (mut ma, mut mb) = (MrTable::new(1), MrTable::new(2));
    // SAFETY: the Vec heap buffers live in the rig beside the tables and never move.
    let ka = unsafe { ma.register(PD, a_buf.as_mut_ptr().cast(), 65536, 0, ALL) }.unwrap();
    // SAFETY: as above.
    let kb = unsafe { mb.register(PD, b_buf.as_mut_ptr().cast(), 65536, 0, ALL) }.unwrap();
    let mut a = Qp::new(QpConfig::new(Qpn::new(1), QpType::Rc, PD));
    let mut b = Qp::new(QpConfig::new(Qpn::new(2), QpType::Rc, PD));
    connect(&mut a, &mut b, &attr).unwrap();
    Rig {
        lo: Loopback::new(a, b, ma, mb),
        ka,
        kb,
        a_buf,
        b_buf,
    }
}

fn default_attr() -> QpAttr {
    QpAttr {
        qp_access_flags: ALL,
        path_mtu: Mtu::Mtu1024,
        sq_psn: Psn::new(100),
        rq_psn: Psn::new(500),
        timeout: 10,
        min_rnr_timer: 1,
        ..QpAttr::default()
    }
}

fn frames_from_a(r: &mut Rig) -> Vec<Vec<u8>> {
    frames(&mut r.lo.a, &r.lo.mem_a, r.lo.now)
}

fn frames_from_b(r: &mut Rig) -> Vec<Vec<u8>> {
    frames(&mut r.lo.b, &r.lo.mem_b, r.lo.now)
}

fn to_b(r: &mut Rig, f: &[u8]) {
    r.lo.b.handle_frame(r.lo.now, f, &mut r.lo.mem_b).unwrap();
}

fn to_a(r: &mut Rig, f: &[u8]) {
    r.lo.a.handle_frame(r.lo.now, f, &mut r.lo.mem_a).unwrap();
}

fn aeth_of(f: &[u8]) -> ferroce_stack::wire::AethRepr {
    RoceRepr::parse(f, Checks::ALL)
        .unwrap()
        .repr
        .ext
        .aeth
        .unwrap()
}

fn opcode(f: &[u8]) -> Opcode {
    RoceRepr::parse(f, Checks::ALL).unwrap().repr.bth.opcode
}

fn write(r: &Rig, id: u64, at: u64, len: u32) -> SendWr<'static> {
    let s = Box::leak(Box::new([Sge {
        addr: 0,
        length: len,
        lkey: r.ka.lkey,
    }]));
    SendWr::new(id, WrOpcode::Write, Payload::Sges(s)).remote(at, r.kb.rkey)
}

#[test]
fn a_burst_of_writes_gets_one_coalesced_ack() {
    let mut r = rig(default_attr());
    for i in 0..100 {
        let wr = write(&r, i, 8 * i, 8).flags(SendFlags(0));
        r.lo.a.post_send(&wr).unwrap();
    }
    let burst = frames_from_a(&mut r);
    assert_eq!(burst.len(), 100);
    for f in &burst {
        to_b(&mut r, f);
    }
    let acks = frames_from_b(&mut r);
    assert_eq!(acks.len(), 1, "one ACK for the whole burst");
    let ack = RoceRepr::parse(&acks[0], Checks::ALL).unwrap();
    assert_eq!(ack.repr.bth.psn, Psn::new(100 + 99));
    // MSN counts the 100 messages.
    assert_eq!(ack.repr.ext.aeth.unwrap().msn.value(), 100);
    to_a(&mut r, &acks[0]);
    assert_eq!(r.lo.a.send_queue_len(), 0);
}

#[test]
fn credits_limit_sends_to_posted_receives() {
    let mut r = rig(default_attr());
    let s = [Sge {
        addr: 0,
        length: 16,
        lkey: r.ka.lkey,
    }];
    for i in 0..10 {
        r.lo.a
            .post_send(&SendWr::new(i, WrOpcode::Send, Payload::Sges(&s)))
            .unwrap();
    }
    // No credits known yet: one SEND goes out to learn the count.
    assert_eq!(frames_from_a(&mut r).len(), 1);
    // b has no receive: RNR NAK with credits... after the RNR wait, b posts 3 receives.
    let rb = [Sge {
        addr: 0x100,
        length: 64,
        lkey: r.kb.lkey,
    }];
    for i in 0..3 {
        r.lo.b
            .post_recv(&RecvWr {
                wr_id: i,
                sg_list: &rb,
            })
            .unwrap();
    }
    // Resend the first SEND by timing out (its frame was dropped by us above).
    r.lo.now += 10_000_000;
    r.lo.a.handle_timeout(r.lo.now);
    let f = frames_from_a(&mut r);
    assert_eq!(f.len(), 1);
    to_b(&mut r, &f[0]);
    let ack = frames_from_b(&mut r);
    let aeth = aeth_of(&ack[0]);
    // Two receives left: credit code 2.
    assert_eq!(
        Syndrome::from_byte(aeth.syndrome),
        Syndrome::Ack { credits: 2 }
    );
    to_a(&mut r, &ack[0]);
    // Now exactly two more SENDs may go.
    assert_eq!(frames_from_a(&mut r).len(), 2);
}

#[test]
fn read_depth_is_bounded_by_max_rd_atomic() {
    let mut r = rig(QpAttr {
        max_rd_atomic: 2,
        ..default_attr()
    });
    let to = [Sge {
        addr: 0x1000,
        length: 8,
        lkey: r.ka.lkey,
    }];
    for i in 0..5 {
        let wr = SendWr::new(i, WrOpcode::Read, Payload::Sges(&to)).remote(0, r.kb.rkey);
        r.lo.a.post_send(&wr).unwrap();
    }
    let reqs = frames_from_a(&mut r);
    assert_eq!(reqs.len(), 2);
    assert!(reqs
        .iter()
        .all(|f| opcode(f) == Opcode::RC_RDMA_READ_REQUEST));
    r.lo.run();
    let mut done = 0;
    while let Some(c) = r.lo.a.poll_completion() {
        assert_eq!(c.status, WcStatus::Success);
        done += 1;
    }
    // The two frames taken above never reached b; the timer resends them.
    assert_eq!(done, 0);
    r.lo.now += 10_000_000;
    r.lo.a.handle_timeout(r.lo.now);
    r.lo.run();
    while let Some(c) = r.lo.a.poll_completion() {
        assert_eq!(c.status, WcStatus::Success);
        done += 1;
    }
    assert_eq!(done, 5);
}

#[test]
fn a_duplicated_atomic_executes_once_and_replays_its_result() {
    let mut r = rig(default_attr());
    r.b_buf[4] = 1000;
    let res = [Sge {
        addr: 0x2000,
        length: 8,
        lkey: r.ka.lkey,
    }];
    let wr = SendWr {
        compare_add: 7,
        ..SendWr::new(1, WrOpcode::FetchAdd, Payload::Sges(&res)).remote(32, r.kb.rkey)
    };
    r.lo.a.post_send(&wr).unwrap();
    let req = frames_from_a(&mut r);
    assert_eq!(req.len(), 1);
    to_b(&mut r, &req[0]);
    to_b(&mut r, &req[0]);
    to_b(&mut r, &req[0]);
    let acks = frames_from_b(&mut r);
    assert_eq!(acks.len(), 3);
    for f in &acks {
        let p = RoceRepr::parse(f, Checks::ALL).unwrap();
        assert_eq!(p.repr.bth.opcode, Opcode::RC_ATOMIC_ACKNOWLEDGE);
        assert_eq!(p.repr.ext.atomic_ack_eth.unwrap().orig_data, 1000);
    }
    let c = *r.lo.b.counters();
    assert_eq!(
        (c.rx_atomic_requests, c.atomic_replays, c.duplicate_request),
        (1, 2, 2)
    );
    to_a(&mut r, &acks[2]);
    to_a(&mut r, &acks[0]);
    let wc = r.lo.a.poll_completion().unwrap();
    assert_eq!((wc.status, wc.byte_len), (WcStatus::Success, 8));
    assert!(r.lo.a.poll_completion().is_none());
    drop(r.lo);
    assert_eq!(r.b_buf[4], 1007, "executed once");
    assert_eq!(r.a_buf[0x2000 / 8], 1000);
}

#[test]
fn duplicate_writes_are_acked_not_executed_and_reads_re_execute() {
    let mut r = rig(default_attr());
    r.lo.a.post_send(&write(&r, 1, 0x100, 8)).unwrap();
    let w = frames_from_a(&mut r);
    to_b(&mut r, &w[0]);
    r.lo.run();
    // b's memory changes after the WRITE; a replayed WRITE must not write again.
    r.b_buf[0x100 / 8] = 0xfeed;
    to_b(&mut r, &w[0]);
    let ack = frames_from_b(&mut r);
    assert_eq!(ack.len(), 1);
    assert_eq!(opcode(&ack[0]), Opcode::RC_ACKNOWLEDGE);
    assert_eq!(r.lo.b.counters().duplicate_request, 1);
    // A READ answered, then asked again: executed again, on current memory.
    let to = [Sge {
        addr: 0x3000,
        length: 8,
        lkey: r.ka.lkey,
    }];
    let rd = SendWr::new(2, WrOpcode::Read, Payload::Sges(&to)).remote(0x100, r.kb.rkey);
    r.lo.a.post_send(&rd).unwrap();
    let req = frames_from_a(&mut r);
    to_b(&mut r, &req[0]);
    let first = frames_from_b(&mut r);
    r.b_buf[0x100 / 8] = 0xbeef;
    to_b(&mut r, &req[0]);
    let again = frames_from_b(&mut r);
    assert_eq!(
        RoceRepr::parse(&first[0], Checks::ALL).unwrap().payload,
        0xfeedu64.to_ne_bytes()
    );
    assert_eq!(
        RoceRepr::parse(&again[0], Checks::ALL).unwrap().payload,
        0xbeefu64.to_ne_bytes()
    );
    assert_eq!(r.lo.b.counters().rx_read_requests, 2);
}

#[test]
fn a_gap_is_naked_once_and_go_back_n_resends_from_it() {
    let mut r = rig(default_attr());
    for i in 0..5 {
        r.lo.a.post_send(&write(&r, i, 0, 8)).unwrap();
    }
    let f = frames_from_a(&mut r);
    // PSN 100 is lost; 101..104 arrive.
    for x in &f[1..] {
        to_b(&mut r, x);
    }
    let naks = frames_from_b(&mut r);
    assert_eq!(naks.len(), 1, "one NAK per gap");
    let nak = RoceRepr::parse(&naks[0], Checks::ALL).unwrap();
    assert_eq!(nak.repr.bth.psn, Psn::new(100));
    assert!(matches!(
        Syndrome::from_byte(nak.repr.ext.aeth.unwrap().syndrome),
        Syndrome::Nak(_)
    ));
    assert_eq!(r.lo.b.counters().out_of_sequence, 4);
    to_a(&mut r, &naks[0]);
    let resent = frames_from_a(&mut r);
    let psns: Vec<u32> = resent
        .iter()
        .map(|x| {
            RoceRepr::parse(x, Checks::ALL)
                .unwrap()
                .repr
                .bth
                .psn
                .value()
        })
        .collect();
    assert_eq!(psns, [100, 101, 102, 103, 104]);
    for x in &resent {
        to_b(&mut r, x);
    }
    r.lo.run();
    assert_eq!(r.lo.a.send_queue_len(), 0);
}

/// A rig whose responder sends RNR NAKs with timer 14 (1.28 ms), and the first frame of a
/// 16-byte SEND its requester posted (no receive is posted at the responder).
fn rnr_rig_with_a_send() -> (Rig, Vec<u8>) {
    let mut r = rig(QpAttr {
        min_rnr_timer: 14,
        ..default_attr()
    });
    let s = [Sge {
        addr: 0,
        length: 16,
        lkey: r.ka.lkey,
    }];
    r.lo.a
        .post_send(&SendWr::new(1, WrOpcode::Send, Payload::Sges(&s)))
        .unwrap();
    let first = frames_from_a(&mut r).remove(0);
    (r, first)
}

#[test]
fn rnr_waits_the_timer_before_resending() {
    let (mut r, first) = rnr_rig_with_a_send();
    to_b(&mut r, &first);
    let rnr = frames_from_b(&mut r);
    let aeth = aeth_of(&rnr[0]);
    assert_eq!(
        Syndrome::from_byte(aeth.syndrome),
        Syndrome::RnrNak { timer: 14 }
    );
    to_a(&mut r, &rnr[0]);
    assert!(frames_from_a(&mut r).is_empty());
    assert_eq!(r.lo.a.poll_timeout(), Some(r.lo.now + 1_280_000));
    r.lo.now += 1_279_999;
    r.lo.a.handle_timeout(r.lo.now);
    assert!(frames_from_a(&mut r).is_empty());
    r.lo.now += 1;
    r.lo.a.handle_timeout(r.lo.now);
    assert_eq!(frames_from_a(&mut r).len(), 1);
}

/// `f` with its PSN replaced (the frame emitted again, ICRC and all).
fn with_psn(f: &[u8], psn: Psn) -> Vec<u8> {
    let p = RoceRepr::parse(f, Checks::ALL).unwrap();
    let mut repr = p.repr;
    repr.bth.psn = psn;
    let mut out = vec![0u8; repr.buffer_len()];
    repr.emit_with_payload(&mut out, p.payload).unwrap();
    out
}

/// A SEND at the expected PSN finds no receive, and the next SEND arrives in the same
/// receive burst, before the responder transmits: the RNR NAK must go out, not a sequence
/// error NAK in its place (which a requester resends at once, against its retry budget).
/// Nothing else is NAKed until the requester resends the PSN the RNR NAK named.
#[test]
fn an_rnr_nak_survives_a_later_psn_in_the_same_burst() {
    let (mut r, first) = rnr_rig_with_a_send();
    let epsn = RoceRepr::parse(&first, Checks::ALL).unwrap().repr.bth.psn;
    to_b(&mut r, &first);
    to_b(&mut r, &with_psn(&first, epsn.add(1)));
    let out = frames_from_b(&mut r);
    assert_eq!(out.len(), 1, "one NAK for the burst");
    let p = RoceRepr::parse(&out[0], Checks::ALL).unwrap();
    assert_eq!(p.repr.bth.psn, epsn);
    assert_eq!(
        Syndrome::from_byte(p.repr.ext.aeth.unwrap().syndrome),
        Syndrome::RnrNak { timer: 14 }
    );
    // Later PSNs keep arriving while the requester waits: dropped without another NAK.
    to_b(&mut r, &with_psn(&first, epsn.add(2)));
    assert!(frames_from_b(&mut r).is_empty());
    // The resend of the named PSN is served once a receive exists.
    let rb = [Sge {
        addr: 0x200,
        length: 64,
        lkey: r.kb.lkey,
    }];
    r.lo.b
        .post_recv(&RecvWr {
            wr_id: 7,
            sg_list: &rb,
        })
        .unwrap();
    to_b(&mut r, &first);
    let ack = frames_from_b(&mut r);
    assert_eq!(ack.len(), 1);
    assert_eq!(
        Syndrome::from_byte(aeth_of(&ack[0]).syndrome),
        Syndrome::Ack { credits: 0 }
    );
    let wc = r.lo.b.poll_completion().unwrap();
    assert_eq!((wc.wr_id, wc.status), (7, WcStatus::Success));
}

#[test]
fn modify_to_error_flushes_everything_in_order() {
    let mut r = rig(default_attr());
    for i in 0..3 {
        r.lo.a.post_send(&write(&r, i, 0, 8)).unwrap();
    }
    let rb = [Sge {
        addr: 0x100,
        length: 64,
        lkey: r.ka.lkey,
    }];
    r.lo.a
        .post_recv(&RecvWr {
            wr_id: 9,
            sg_list: &rb,
        })
        .unwrap();
    let _ = frames_from_a(&mut r);
    let err = QpAttr {
        qp_state: QpState::Err,
        ..QpAttr::default()
    };
    r.lo.a
        .modify(&err, ferroce_stack::transport::AttrMask::STATE)
        .unwrap();
    let got: Vec<_> = std::iter::from_fn(|| r.lo.a.poll_completion())
        .map(|c| (c.wr_id, c.status))
        .collect();
    assert_eq!(got, [0, 1, 2, 9].map(|i| (i, WcStatus::WrFlushErr)),);
    assert_eq!(r.lo.a.poll_timeout(), None);
    assert!(frames_from_a(&mut r).is_empty());
}

/// Takes every frame `qp` wants to send now, through the zero-copy path: frames whose payload
/// is at least `split_min` bytes come back split and are assembled here as a port would.
fn frames_split(qp: &mut Qp, mem: &MrTable, now: u64, split_min: usize) -> (Vec<Vec<u8>>, usize) {
    use ferroce_stack::transport::TxOut;
    let mut out = Vec::new();
    let mut split = 0;
    let mut buf = vec![0u8; 9000];
    while let Some(tx) = qp.poll_transmit_split(now, &mut buf, mem, split_min) {
        match tx {
            TxOut::Whole(n) => out.push(buf[..n].to_vec()),
            TxOut::Split(s) => {
                split += 1;
                let mut f = vec![0u8; s.len()];
                s.copy_to(&buf, &mut f);
                out.push(f);
            }
        }
    }
    (out, split)
}

#[test]
fn split_frames_are_the_same_bytes_as_whole_ones() {
    // Two identical rigs: one emits whole frames, the other split ones (headers apart from
    // payload in place). Every frame must be the same bytes, ICRC included.
    let mut whole = rig(default_attr());
    let mut split = rig(default_attr());
    for r in [&mut whole, &mut split] {
        for (i, w) in r.a_buf.iter_mut().enumerate() {
            *w = (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
        for (i, w) in r.b_buf.iter_mut().enumerate() {
            *w = !(i as u64).wrapping_mul(0x2545_f491_4f6c_dd1d);
        }
        // A WRITE over two elements whose boundary falls inside a packet, with a length that
        // needs pad, then a READ of 2.5 packets.
        let sges = Box::leak(Box::new([
            Sge {
                addr: 0x10,
                length: 1500,
                lkey: r.ka.lkey,
            },
            Sge {
                addr: 0x4000,
                length: 1499,
                lkey: r.ka.lkey,
            },
        ]));
        let wr = SendWr::new(1, WrOpcode::Write, Payload::Sges(sges)).remote(0x800, r.kb.rkey);
        r.lo.a.post_send(&wr).unwrap();
        let to = Box::leak(Box::new([Sge {
            addr: 0x8000,
            length: 2561,
            lkey: r.ka.lkey,
        }]));
        let rd = SendWr::new(2, WrOpcode::Read, Payload::Sges(to)).remote(0x6003, r.kb.rkey);
        r.lo.a.post_send(&rd).unwrap();
    }
    let w_req = frames_from_a(&mut whole);
    let (s_req, n_split) = frames_split(&mut split.lo.a, &split.lo.mem_a, split.lo.now, 1);
    assert_eq!(w_req, s_req);
    assert_eq!(n_split, 3, "three WRITE packets carry payload");
    for f in &w_req {
        to_b(&mut whole, f);
        to_b(&mut split, f);
    }
    let w_resp = frames_from_b(&mut whole);
    let (s_resp, n_split) = frames_split(&mut split.lo.b, &split.lo.mem_b, split.lo.now, 1);
    assert_eq!(w_resp, s_resp);
    assert_eq!(n_split, 3, "three READ responses carry payload");
    for f in &s_resp {
        RoceRepr::parse(f, Checks::ALL).expect("split frame parses, ICRC good");
        to_a(&mut split, f);
    }
    split.lo.run();
    let a = bytemuck_bytes(&split.a_buf);
    let b = bytemuck_bytes(&split.b_buf);
    assert_eq!(&b[0x800..0x800 + 1500], &a[0x10..0x10 + 1500]);
    assert_eq!(&b[0x800 + 1500..0x800 + 2999], &a[0x4000..0x4000 + 1499]);
    assert_eq!(&a[0x8000..0x8000 + 2561], &b[0x6003..0x6003 + 2561]);
    // Below the threshold nothing is split.
    let mut r = rig(default_attr());
    r.lo.a.post_send(&write(&r, 3, 0, 64)).unwrap();
    let (f, n_split) = frames_split(&mut r.lo.a, &r.lo.mem_a, r.lo.now, 65);
    assert_eq!((f.len(), n_split), (1, 0));
}

fn bytemuck_bytes(words: &[u64]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_ne_bytes()).collect()
}

#[test]
fn ipv4_identification_is_the_psn_s_low_sixteen_bits() {
    // Consecutive packets of a QP carry consecutive identifications, across the 16-bit wrap,
    // so a run of them is what UDP segmentation offload cuts from one datagram (and a
    // retransmission repeats its original's). ACKs follow the PSN they acknowledge.
    let mut attr = default_attr();
    attr.sq_psn = Psn::new(0x1_fffe);
    let mut r = rig(attr);
    r.lo.a.post_send(&write(&r, 1, 0, 4096)).unwrap();
    let f = frames_from_a(&mut r);
    assert_eq!(f.len(), 4);
    for (i, frame) in f.iter().enumerate() {
        let p = RoceRepr::parse(frame, Checks::ALL).unwrap();
        let ferroce_stack::wire::IpRepr::V4(ip) = p.repr.ip else {
            panic!("IPv4 expected")
        };
        let psn = 0x1_fffe + i as u32;
        assert_eq!(p.repr.bth.psn, Psn::new(psn));
        assert_eq!(ip.ident, psn as u16, "packet {i}");
    }
    for frame in &f {
        to_b(&mut r, frame);
    }
    let acks = frames_from_b(&mut r);
    let p = RoceRepr::parse(acks.last().unwrap(), Checks::ALL).unwrap();
    let ferroce_stack::wire::IpRepr::V4(ip) = p.repr.ip else {
        panic!("IPv4 expected")
    };
    assert_eq!(ip.ident, p.repr.bth.psn.value() as u16);
}

#[test]
fn a_go_back_n_rewind_restarts_with_a_small_window_and_widens_on_acks() {
    // Ten 64 KiB WRITEs at a 1 KiB MTU: 640 packets, all inside the policy's window. One is
    // lost; after the sequence NAK the requester resends from the gap but at most 128 packets
    // past it, and each acknowledged packet lets one more go (slow start).
    let mut r = rig(default_attr());
    for id in 0..10 {
        r.lo.a.post_send(&write(&r, id, 0, 65536)).unwrap();
    }
    let first = frames_from_a(&mut r);
    assert_eq!(first.len(), 640);
    let psn = |f: &[u8]| RoceRepr::parse(f, Checks::ALL).unwrap().repr.bth.psn;
    for (i, f) in first.iter().enumerate() {
        if i != 10 {
            to_b(&mut r, f);
        }
    }
    let naks = frames_from_b(&mut r);
    for f in &naks {
        to_a(&mut r, f);
    }
    let again = frames_from_a(&mut r);
    assert_eq!(psn(&again[0]), psn(&first[10]), "resent from the gap");
    assert_eq!(again.len(), 128, "the restart window");
    // Deliver the resent packets; the ACKs widen the window by what they acknowledge.
    for f in &again {
        to_b(&mut r, f);
    }
    let acks = frames_from_b(&mut r);
    assert!(!acks.is_empty());
    for f in &acks {
        to_a(&mut r, f);
    }
    let acked = psn(acks.last().unwrap()).distance(psn(&first[10])) as usize + 1;
    let more = frames_from_a(&mut r);
    assert_eq!(psn(&more[0]), psn(&again[127]).add(1));
    assert_eq!(acked, 128);
    assert_eq!(more.len(), 128 + acked, "one more packet per packet acked");
    // Everything completes.
    for f in &more {
        to_b(&mut r, f);
    }
    r.lo.run();
    let done = std::iter::from_fn(|| r.lo.a.poll_completion()).count();
    assert_eq!(done, 10);
}

/// A gather list the requester may not read fails its WR with a local protection error
/// before any of its packets leaves, flushes the WRs behind it, and moves an RC QP to ERR:
/// whether the requester checks it when it first takes the WR (a multi-packet message, a
/// READ's local buffer) or when it gathers the one packet of a short message.
#[test]
fn a_gather_list_the_requester_may_not_read_fails_before_any_packet_leaves() {
    for (len, op) in [
        (64u32, WrOpcode::Write),
        (64, WrOpcode::Send),
        (3000, WrOpcode::Write),
        (64, WrOpcode::Read),
        // Past the region's end by one byte: the key is good, the range is not.
        (65537, WrOpcode::Write),
    ] {
        let mut r = rig(default_attr());
        let good = write(&r, 1, 0, 64).flags(SendFlags::SIGNALED);
        r.lo.a.post_send(&good).unwrap();
        let bad_key = if len > 65536 {
            r.ka.lkey
        } else {
            r.ka.lkey ^ 0x0100_0000
        };
        let sge = [Sge {
            addr: 0,
            length: len.min(65537),
            lkey: bad_key,
        }];
        let mut wr = SendWr::new(2, op, Payload::Sges(&sge)).flags(SendFlags::SIGNALED);
        if op != WrOpcode::Send {
            wr = wr.remote(0, r.kb.rkey);
        }
        r.lo.a.post_send(&wr).unwrap();
        let behind = write(&r, 3, 0, 64).flags(SendFlags::SIGNALED);
        r.lo.a.post_send(&behind).unwrap();
        let sent = frames_from_a(&mut r);
        assert_eq!(sent.len(), 1, "{op:?} {len}: only the good WRITE leaves");
        let mut wcs = Vec::new();
        while let Some(c) = r.lo.a.poll_completion() {
            wcs.push((c.wr_id, c.status));
        }
        assert_eq!(
            wcs,
            [
                (1, WcStatus::WrFlushErr),
                (2, WcStatus::LocProtErr),
                (3, WcStatus::WrFlushErr)
            ],
            "{op:?} {len}"
        );
        assert_eq!(r.lo.a.state(), QpState::Err, "{op:?} {len}");
    }
}
