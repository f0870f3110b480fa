//! Selective repeat over sprayed paths, beyond exactly-once (which `transport_exactly_once`
//! covers for every policy): with paths that only reorder, ferroce's selective repeat resends
//! nothing; with a path that dies, the receiver asks the sender to avoid it and the traffic
//! finishes. Host `a` streams WRITEs (some with immediate) and SENDs to host `b` over four
//! parallel paths of different delays; `b` checks every byte and completion.
//!
//! `FERROCE_SEED=N` replays one seed.

mod support;

use ferroce::drivers::sim::LinkModel;
use ferroce::reliability::policy::spray::Spray;
use ferroce::reliability::policy::sr::{SelectiveRepeat, SrConfig};
use ferroce::stack::transport::{
    Counters, Mtu, Payload, Policies, QpType, RecvWr, SendWr, Sge, WcOpcode, WcStatus, WrOpcode,
};
use support::*;

const MEM: usize = 16 << 20;
const SRC_LEN: usize = 1 << 20;
const DST: usize = 2 << 20;
const RECVS: usize = 14 << 20;

fn sr() -> Policies {
    let sr = SelectiveRepeat::new(SrConfig::default());
    Policies::recovery(Box::new(sr)).with_path(Box::new(Spray::psn(4)))
}

/// A receive of `len` bytes at `at` on host b's QP `qpn`.
fn post_recv(w: &mut Testbed, qpn: u32, wr_id: u64, at: usize, len: u32) {
    let s = [Sge {
        addr: at as u64,
        length: len,
        lkey: w.hosts[1].keys.lkey,
    }];
    w.hosts[1]
        .qp(qpn)
        .post_recv(&RecvWr { wr_id, sg_list: &s })
        .unwrap();
}

/// What the stream left: the requester's and the responder's counters.
struct Outcome {
    req: Counters,
    resp: Counters,
}

/// Streams `messages` messages per QP pair (two pairs) from `a` to `b` over `paths` and
/// checks that every byte landed and every WR completed once, successfully, in order.
fn stream(seed: u64, paths: Vec<(LinkModel, LinkModel)>, messages: usize) -> Outcome {
    let mut rng = Rng(seed);
    let mut w = multipath_asym(seed, paths, MEM);
    let fill: Vec<u8> = (0..SRC_LEN).map(|_| rng.next() as u8).collect();
    w.hosts[0].write(0, &fill);
    let o = ConnOpts {
        mtu: Mtu::Mtu1024,
        timeout: 14,
        ..ConnOpts::default()
    };
    let pairs = [(0x10u32, 0x20u32), (0x11, 0x21)];
    for (i, &(qa, qb)) in pairs.iter().enumerate() {
        let psn = (1 << 24) - 100 - 1000 * i as u32;
        w.connect(QpType::Rc, ((0, qa), (1, qb)), (psn, 77), &o, Some(sr));
    }
    let (lkey, rkey) = (w.hosts[0].keys.lkey, w.hosts[1].keys.rkey);
    let mut dst = DST;
    let mut recv = RECVS;
    // (qp, wr_id, src, dst, len, consumes a receive)
    let mut expect = Vec::new();
    for &(qa, qb) in &pairs {
        for k in 0..messages as u64 {
            let len = rng.range(1, 16 * 1024 + 1) as usize;
            let src = rng.range(0, (SRC_LEN - len) as u64) as usize;
            let sge = [Sge {
                addr: src as u64,
                length: len as u32,
                lkey,
            }];
            let kind = rng.range(0, 10);
            let wr = match kind {
                // Mostly WRITEs, which spray and land in place; some with immediate; a few
                // small SENDs, held by the responder when they arrive early.
                0 => {
                    let len = len.min(512);
                    let sge = [Sge {
                        addr: src as u64,
                        length: len as u32,
                        lkey,
                    }];
                    post_recv(&mut w, qb, k, recv, 512);
                    expect.push((qa, k, src, recv, len, true));
                    recv += 512;
                    w.hosts[0]
                        .qp(qa)
                        .post_send(&SendWr::new(k, WrOpcode::Send, Payload::Sges(&sge)))
                        .unwrap();
                    continue;
                }
                1 => {
                    post_recv(&mut w, qb, k, recv, 0);
                    SendWr::new(k, WrOpcode::WriteWithImm, Payload::Sges(&sge))
                        .remote(dst as u64, rkey)
                        .imm(k as u32)
                }
                _ => SendWr::new(k, WrOpcode::Write, Payload::Sges(&sge)).remote(dst as u64, rkey),
            };
            w.hosts[0].qp(qa).post_send(&wr).unwrap();
            expect.push((qa, k, src, dst, len, kind == 1));
            dst += len;
        }
    }
    assert!(dst < RECVS && recv < MEM);
    assert!(
        w.drive_until(60_000_000_000),
        "did not finish in 60 s of virtual time"
    );

    check_send_completions(&w, &pairs, messages);
    let (a, b) = (&w.hosts[0], &w.hosts[1]);
    for &(qa, wr_id, src, at, len, recv) in &expect {
        assert_eq!(
            &b.read(at, len)[..],
            &a.read(src, len)[..],
            "QP {qa:#x} WR {wr_id}: bytes differ"
        );
        if recv {
            let c = b
                .completions
                .iter()
                .find(|c| c.qp_num.value() == qa + 0x10 && c.wr_id == wr_id)
                .unwrap_or_else(|| panic!("QP {qa:#x} WR {wr_id}: no receive completion"));
            assert_eq!(c.status, WcStatus::Success);
            if c.opcode == WcOpcode::RecvRdmaWithImm {
                assert_eq!(c.imm_data, wr_id as u32);
            }
        }
    }
    // Receives complete in posting order: completions stay in order.
    for &(_, qb) in &pairs {
        let ids: Vec<u64> = b
            .completions
            .iter()
            .filter(|c| c.qp_num.value() == qb)
            .map(|c| c.wr_id)
            .collect();
        assert!(ids.windows(2).all(|p| p[0] < p[1]), "{ids:?}");
    }
    outcome(&w)
}

/// Every send WR of host `a`'s QPs in `pairs` completed once, successfully, in posting order.
fn check_send_completions(w: &Testbed, pairs: &[(u32, u32)], messages: usize) {
    for &(qa, _) in pairs {
        let done: Vec<_> = w.hosts[0]
            .completions
            .iter()
            .filter(|c| c.qp_num.value() == qa)
            .collect();
        assert_eq!(done.len(), messages, "QP {qa:#x}: one completion per WR");
        for (k, c) in done.iter().enumerate() {
            assert_eq!((c.wr_id, c.status), (k as u64, WcStatus::Success), "{c:?}");
        }
    }
}

/// Host `a`'s (requester) and host `b`'s (responder) counters, summed over their QPs.
fn outcome(w: &Testbed) -> Outcome {
    let (mut req, mut resp) = (Counters::default(), Counters::default());
    for q in w.hosts[0].qps() {
        req.accumulate(q.counters());
    }
    for q in w.hosts[1].qps() {
        resp.accumulate(q.counters());
    }
    Outcome { req, resp }
}

fn path(delay_ns: u64) -> LinkModel {
    let mut m = LinkModel::new(100_000_000_000, delay_ns);
    m.queue_limit_bytes = 16 << 20;
    m
}

#[test]
fn reordering_alone_never_makes_selective_repeat_resend() {
    seeded(0..8, |seed| {
        // Four paths 1, 3, 6 and 10 µs long: packets overtake each other all the time.
        let paths = [1_000, 3_000, 6_000, 10_000]
            .map(|d| (path(d), path(d)))
            .to_vec();
        let out = stream(seed, paths, 300);
        assert!(
            out.resp.ooo_placed > 1000,
            "paths reordered too little to prove anything: {}",
            out.resp.ooo_placed
        );
        assert!(out.resp.ooo_held > 0, "no SEND arrived early");
        assert_eq!(out.req.retransmitted_packets, 0, "{:?}", out.req);
        assert_eq!(out.resp.loss_reports_sent, 0);
        assert_eq!(out.resp.duplicate_request, 0);
        assert_eq!(out.req.local_ack_timeout_err, 0);
    });
}

#[test]
fn losses_are_reported_by_path_and_resent_once() {
    seeded(0..8, |seed| {
        // Path 1 loses 2 % of what it carries; the others are clean and faster or slower.
        let mut lossy = path(3_000);
        lossy.loss = ferroce::drivers::sim::Loss::Bernoulli(0.02);
        let paths = vec![
            (path(1_000), path(1_000)),
            (lossy, path(3_000)),
            (path(6_000), path(6_000)),
            (path(10_000), path(10_000)),
        ];
        let out = stream(seed, paths, 300);
        assert!(out.req.loss_reports_received > 0);
        // Every retransmission a loss report asked for answered a real loss: the responder
        // sees a PSN twice only when the timer resent it (the oldest PSN goes out again as a
        // probe, whatever is known of it).
        let (req, resp) = (&out.req, &out.resp);
        let by_timer = req.retransmitted_packets - req.loss_reports_received;
        if req.local_ack_timeout_err == 0 {
            assert_eq!(resp.duplicate_request, 0, "{resp:?} {req:?}");
        } else {
            assert!(resp.duplicate_request <= by_timer, "{resp:?} {req:?}");
        }
        // Losses are found by later packets on the same path, not by the timer; only a loss
        // at the tail of a QP's stream (nothing sent after it on its path) waits for one.
        assert!(out.req.local_ack_timeout_err <= 2, "{:?}", out.req);
    });
}

#[test]
fn a_dead_path_is_avoided_and_the_traffic_recovers() {
    seeded(0..8, |seed| {
        // Path 2 stops carrying anything from a to b 200 µs in, for good; its other
        // direction (and so the ACKs it may carry) stays up.
        let dead = path(3_000).flap(200_000, u64::MAX / 4);
        let paths = vec![
            (path(1_000), path(1_000)),
            (path(2_000), path(2_000)),
            (dead, path(3_000)),
            (path(4_000), path(4_000)),
        ];
        let out = stream(seed, paths, 400);
        assert!(out.req.path_avoidances > 0, "{:?}", out.req);
        assert!(out.resp.loss_reports_sent > 0);
    });
}

/// Host `a` READs `messages` blocks of random length from `b` on each of two QP pairs, with a
/// WRITE now and then between them (whose acknowledgements overtake the sprayed responses),
/// and checks every byte and that every WR completed once, successfully, in order.
fn read_stream(seed: u64, paths: Vec<(LinkModel, LinkModel)>, messages: usize) -> Outcome {
    let mut rng = Rng(seed);
    let mut w = multipath_asym(seed, paths, MEM);
    for h in 0..2 {
        let fill: Vec<u8> = (0..SRC_LEN).map(|_| rng.next() as u8).collect();
        w.hosts[h].write(0, &fill);
    }
    let o = ConnOpts {
        mtu: Mtu::Mtu1024,
        timeout: 14,
        ..ConnOpts::default()
    };
    let pairs = [(0x10u32, 0x20u32), (0x11, 0x21)];
    for (i, &(qa, qb)) in pairs.iter().enumerate() {
        let psn = (1 << 24) - 300 - 1000 * i as u32;
        w.connect(QpType::Rc, ((0, qa), (1, qb)), (psn, 77), &o, Some(sr));
    }
    let (lkey, rkey) = (w.hosts[0].keys.lkey, w.hosts[1].keys.rkey);
    let mut at = DST;
    // (qp, wr_id, READ, src, dst, len): a READ copies b's src to a's dst, a WRITE a's src
    // to b's dst.
    let mut expect = Vec::new();
    for &(qa, _) in &pairs {
        for k in 0..messages as u64 {
            let len = rng.range(1, 64 * 1024 + 1) as usize;
            let src = rng.range(0, (SRC_LEN - len) as u64) as usize;
            let read = rng.range(0, 8) != 0;
            let sge = [Sge {
                addr: if read { at } else { src } as u64,
                length: len as u32,
                lkey,
            }];
            let (op, remote) = if read {
                (WrOpcode::Read, src)
            } else {
                (WrOpcode::Write, at)
            };
            let wr = SendWr::new(k, op, Payload::Sges(&sge)).remote(remote as u64, rkey);
            w.hosts[0].qp(qa).post_send(&wr).unwrap();
            expect.push((qa, k, read, src, at, len));
            at += len;
        }
    }
    assert!(at < MEM);
    assert!(
        w.drive_until(60_000_000_000),
        "did not finish in 60 s of virtual time"
    );
    check_send_completions(&w, &pairs, messages);
    let (a, b) = (&w.hosts[0], &w.hosts[1]);
    for &(qa, wr_id, read, src, at, len) in &expect {
        let (from, to) = if read { (b, a) } else { (a, b) };
        assert_eq!(
            &to.read(at, len)[..],
            &from.read(src, len)[..],
            "QP {qa:#x} WR {wr_id} (READ: {read}): bytes differ"
        );
    }
    outcome(&w)
}

#[test]
fn sprayed_read_responses_land_out_of_order_and_reordering_alone_resends_nothing() {
    seeded(0..8, |seed| {
        let paths = [1_000, 3_000, 6_000, 10_000]
            .map(|d| (path(d), path(d)))
            .to_vec();
        let out = read_stream(seed, paths, 120);
        let (req, resp) = (&out.req, &out.resp);
        assert!(
            req.ooo_responses_placed > 1000,
            "responses reordered too little to prove anything: {req:?}"
        );
        assert_eq!(req.retransmitted_packets, 0, "{req:?}");
        assert_eq!(req.response_losses_detected, 0);
        assert_eq!(req.local_ack_timeout_err, 0);
        assert_eq!(req.implied_nak_seq_err, 0);
        assert_eq!(req.ghost_responses, 0, "a response arrived twice: {req:?}");
        assert_eq!(resp.duplicate_request, 0, "{resp:?}");
    });
}

#[test]
fn lost_read_responses_are_found_by_path_and_asked_for_alone() {
    seeded(0..8, |seed| {
        // Path 1 loses 2 % of the responses it carries back to the requester.
        let mut lossy = path(3_000);
        lossy.loss = ferroce::drivers::sim::Loss::Bernoulli(0.02);
        let paths = vec![
            (path(1_000), path(1_000)),
            (path(3_000), lossy),
            (path(6_000), path(6_000)),
            (path(10_000), path(10_000)),
        ];
        let out = read_stream(seed, paths, 120);
        let (req, resp) = (&out.req, &out.resp);
        assert!(req.response_losses_detected > 0, "{req:?}");
        assert!(req.ooo_responses_placed > 1000, "{req:?}");
        if req.local_ack_timeout_err == 0 {
            // Every response asked for again was lost, and was asked for alone: no response
            // arrived twice, and each re-issued READ is one duplicate at the responder.
            assert_eq!(req.ghost_responses, 0, "{req:?}");
            assert_eq!(
                req.retransmitted_packets, req.response_losses_detected,
                "{req:?}"
            );
            assert_eq!(
                resp.duplicate_request, req.retransmitted_packets,
                "{resp:?}"
            );
        }
        // Losses are found by later responses on the same path, not by the timer; only a
        // loss at the tail of a QP's stream waits for it.
        assert!(req.local_ack_timeout_err <= 2, "{req:?}");
    });
}
