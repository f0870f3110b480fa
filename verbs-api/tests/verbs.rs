//! The verbs API end to end: on the simulated fabric (run-to-completion, virtual time) and
//! on an in-memory pipe with engine threads (real time, lock-free posting from the test
//! thread).

use std::time::{Duration, Instant};

use ferroce_drivers::sim::{LinkModel, Loss};
use ferroce_verbs::connect::{connect_qp, ConnectOpts, Endpoint};
use ferroce_verbs::sim::{pipe_pair, pipe_pair_queues, SimNet};
use ferroce_verbs::*;

mod common;
use common::{endpoint, End};

fn end(ctx: &Context, len: usize, t: QpType) -> End {
    let pd = ctx.alloc_pd();
    let all = Access::LOCAL_WRITE
        .with(Access::REMOTE_WRITE)
        .with(Access::REMOTE_READ)
        .with(Access::REMOTE_ATOMIC);
    let mr = pd.alloc_mr(len, all).unwrap();
    let cq = ctx.create_cq(4096, None);
    let qp = pd.create_qp(t, QpCaps::default(), &cq, &cq).unwrap();
    End {
        ctx: ctx.clone(),
        cq,
        qp,
        mr,
        _pd: pd,
    }
}

fn wire(a: &End, b: &End) {
    let o = ConnectOpts::default();
    let (ea, eb) = (endpoint(a, 0x10), endpoint(b, 0xff_fff0));
    connect_qp(&a.ctx, &a.qp, ea.psn, &eb, &o).unwrap();
    connect_qp(&b.ctx, &b.qp, eb.psn, &ea, &o).unwrap();
    assert_eq!(a.qp.state(), QpState::Rts);
}

/// One chain from `a`: a SEND into a receive on `b`, a WRITE to `b`, a READ of it back; all
/// complete in order and every copy holds the same 64 KiB.
fn send_write_read(net: &SimNet, a: &End, b: &End, seed: u32) {
    let data: Vec<u8> = (0..65536u32).map(|i| (i * seed + 1) as u8).collect();
    assert!(a.mr.write(0, &data));
    b.qp.post_recv(&[RecvWr {
        wr_id: 7,
        sg_list: &[b.mr.sge(0x10000, 65536)],
    }])
    .unwrap();
    let s = [a.mr.sge(0, 65536)];
    let back = [a.mr.sge(0x20000, 65536)];
    let wrs = [
        SendWr::new(1, WrOpcode::Send, Payload::Sges(&s)),
        SendWr::new(2, WrOpcode::Write, Payload::Sges(&s))
            .remote(b.mr.addr() + 0x40000, b.mr.rkey()),
        SendWr::new(3, WrOpcode::Read, Payload::Sges(&back))
            .remote(b.mr.addr() + 0x40000, b.mr.rkey()),
    ];
    a.qp.post_send(&wrs).unwrap();
    let (mut got, mut got_b) = (Vec::new(), Vec::new());
    assert!(net.run_until(|| {
        a.cq.poll(&mut got, 16);
        b.cq.poll(&mut got_b, 16);
        got.len() == 3 && got_b.len() == 1
    }));
    assert!(got.iter().all(|c| c.status == WcStatus::Success), "{got:?}");
    assert_eq!(got.iter().map(|c| c.wr_id).collect::<Vec<_>>(), [1, 2, 3]);
    assert_eq!((got_b[0].wr_id, got_b[0].byte_len), (7, 65536));
    let mut out = vec![0u8; 65536];
    for (mr, at) in [(&b.mr, 0x10000), (&b.mr, 0x40000), (&a.mr, 0x20000)] {
        assert!(mr.read(at, &mut out));
        assert_eq!(out, data, "at {at:#x}");
    }
}

#[test]
fn device_queries() {
    let (_net, a, _b) = SimNet::pair(1, LinkModel::default(), 1500, None).unwrap();
    let p = a.query_port();
    assert_eq!(p.state, PortState::Active);
    assert_eq!(p.active_mtu, Mtu::Mtu1024);
    let gid = a.query_gid(0).unwrap();
    assert_eq!(&gid.0[..12], &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff]);
    assert_eq!(&gid.0[12..], &[10, 0, 0, 1]);
    // The rest of the table is empty, and ends at its length.
    assert_eq!(p.gid_tbl_len, ferroce_verbs::GID_TABLE_LEN);
    assert_eq!(a.query_gid(1).unwrap().0, [0; 16]);
    assert!(a.query_gid(ferroce_verbs::GID_TABLE_LEN).is_err());
    assert_eq!(a.query_device().vendor_id, 0);
}

#[test]
fn rc_traffic_on_the_sim_with_loss() {
    let model = LinkModel {
        loss: Loss::Bernoulli(0.02),
        ..LinkModel::new(25_000_000_000, 2_000)
    };
    let (net, ca, cb) = SimNet::pair(3, model, 9000, None).unwrap();
    let (a, b) = (end(&ca, 1 << 20, QpType::Rc), end(&cb, 1 << 20, QpType::Rc));
    wire(&a, &b);
    send_write_read(&net, &a, &b, 13);
    assert!(ca.qp_counters_total().retransmitted_packets > 0);
}

/// The extended attribute: both ends run ferroce's selective repeat (set before RTR; refused
/// after), and the same chain completes over a lossy link with the WRITE placed packet by
/// packet.
#[test]
fn selective_repeat_through_the_verbs_api() {
    use ferroce_reliability::{
        policy::{spray::Spray, sr},
        Policies,
    };
    let model = LinkModel {
        loss: Loss::Bernoulli(0.02),
        ..LinkModel::new(25_000_000_000, 2_000)
    };
    let (net, ca, cb) = SimNet::pair(5, model, 9000, None).unwrap();
    let (a, b) = (end(&ca, 1 << 20, QpType::Rc), end(&cb, 1 << 20, QpType::Rc));
    let policy = || {
        let sr = sr::SelectiveRepeat::new(sr::SrConfig::default());
        Policies::recovery(Box::new(sr)).with_path(Box::new(Spray::ecmp()))
    };
    a.qp.set_reliability(policy()).unwrap();
    b.qp.set_reliability(policy()).unwrap();
    wire(&a, &b);
    let late = a.qp.set_reliability(policy()).unwrap_err();
    assert!(
        matches!(late, VerbsError::PolicyAfterRtr(QpState::Rts)),
        "{late}"
    );
    send_write_read(&net, &a, &b, 7);
    let (qa, qb) = (ca.qp_counters_total(), cb.qp_counters_total());
    assert!(
        qa.sacks_received > 0 && qa.retransmitted_packets > 0,
        "{qa:?}"
    );
    // One WRITE message, completed once however its packets came.
    assert_eq!(qb.rx_write_requests, 1, "{qb:?}");
}

#[test]
fn a_chain_stops_at_the_first_bad_wr() {
    let (_net, ca, cb) = SimNet::pair(4, LinkModel::default(), 1500, None).unwrap();
    let (a, b) = (end(&ca, 4096, QpType::Rc), end(&cb, 4096, QpType::Rc));
    let s = [a.mr.sge(0, 8)];
    let wr = SendWr::new(1, WrOpcode::Send, Payload::Sges(&s));
    assert_eq!(
        a.qp.post_send(&[wr]).unwrap_err(),
        PostFailure {
            index: 0,
            error: PostError::InvalidState(QpState::Reset)
        }
    );
    wire(&a, &b);
    let too_many = [a.mr.sge(0, 1); 17];
    let wrs = [
        wr,
        wr,
        SendWr::new(3, WrOpcode::Send, Payload::Sges(&too_many)),
        wr,
    ];
    let err = a.qp.post_send(&wrs).unwrap_err();
    assert_eq!(err.index, 2);
    assert!(matches!(
        err.error,
        PostError::TooManySges { got: 17, max: 16 }
    ));
}

#[test]
fn deregistered_memory_fails_remote_access_cleanly() {
    let (net, ca, cb) = SimNet::pair(5, LinkModel::default(), 1500, None).unwrap();
    let (a, b) = (end(&ca, 4096, QpType::Rc), end(&cb, 4096, QpType::Rc));
    wire(&a, &b);
    let pd = cb.alloc_pd();
    let extra = b
        ._pd
        .alloc_mr(4096, Access::LOCAL_WRITE.with(Access::REMOTE_WRITE))
        .unwrap();
    let (addr, rkey) = (extra.addr(), extra.rkey());
    drop(extra);
    drop(pd);
    let s = [a.mr.sge(0, 8)];
    a.qp.post_send(&[SendWr::new(1, WrOpcode::Write, Payload::Sges(&s)).remote(addr, rkey)])
        .unwrap();
    let mut got = Vec::new();
    assert!(net.run_until(|| a.cq.poll(&mut got, 4) > 0 || !got.is_empty()));
    assert_eq!(got[0].status, WcStatus::RemAccessErr);
}

#[test]
fn engine_threads_on_a_pipe_with_a_completion_channel() {
    let (ca, cb) = pipe_pair(4200);
    let (a, b) = (end(&ca, 1 << 20, QpType::Rc), end(&cb, 1 << 20, QpType::Rc));
    // b waits on a channel instead of spinning.
    let ch = cb.create_comp_channel();
    let bcq = cb.create_cq(1024, Some(&ch));
    let bqp = b
        ._pd
        .create_qp(QpType::Rc, QpCaps::default(), &bcq, &bcq)
        .unwrap();
    let b = End {
        qp: bqp,
        cq: bcq,
        ..b
    };
    wire(&a, &b);
    ca.start_engine_thread().unwrap();
    cb.start_engine_thread().unwrap();
    let n = 200u64;
    for i in 0..n {
        b.qp.post_recv(&[RecvWr {
            wr_id: i,
            sg_list: &[b.mr.sge(4096 * i as usize, 4096)],
        }])
        .unwrap();
    }
    b.cq.req_notify(false);
    let s = [a.mr.sge(0, 4096)];
    for i in 0..n {
        let wr = SendWr::new(i, WrOpcode::SendWithImm, Payload::Sges(&s)).imm(i as u32);
        while let Err(e) = a.qp.post_send(&[wr]) {
            assert!(matches!(e.error, PostError::QueueFull(_)), "{e}");
            std::thread::yield_now();
        }
    }
    assert!(
        ch.get_event(Duration::from_secs(10)).is_some(),
        "no completion event"
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    let (mut got_a, mut got_b) = (Vec::new(), Vec::new());
    while (got_a.len() < n as usize || got_b.len() < n as usize) && Instant::now() < deadline {
        a.cq.poll(&mut got_a, 64);
        b.cq.poll(&mut got_b, 64);
        std::thread::yield_now();
    }
    ca.stop_engine_thread();
    cb.stop_engine_thread();
    assert_eq!(got_a.len(), n as usize);
    assert_eq!(got_b.len(), n as usize);
    assert!(got_b
        .iter()
        .enumerate()
        .all(|(i, c)| c.wr_id == i as u64 && c.imm_data == i as u32));
}

/// A send queue of one WR, as ibv_rc_pingpong has: the moment a send's completion is
/// visible the next post must find room. (The engine once pushed completions before it
/// published the freed slot, so a thread woken by the completion saw a full queue.)
#[test]
fn a_completed_send_frees_its_slot_before_the_completion_is_seen() {
    let (ca, cb) = pipe_pair(4200);
    let a = end(&ca, 1 << 16, QpType::Rc);
    let b = end(&cb, 1 << 16, QpType::Rc);
    let caps = QpCaps {
        max_send_wr: 1,
        max_recv_wr: 1,
        ..QpCaps::default()
    };
    let qp = a._pd.create_qp(QpType::Rc, caps, &a.cq, &a.cq).unwrap();
    let a = End { qp, ..a };
    wire(&a, &b);
    ca.start_engine_thread().unwrap();
    cb.start_engine_thread().unwrap();
    let s = [a.mr.sge(0, 64)];
    let deadline = Instant::now() + Duration::from_secs(30);
    for i in 0..2000u64 {
        let wr =
            SendWr::new(i, WrOpcode::Write, Payload::Sges(&s)).remote(b.mr.addr(), b.mr.rkey());
        if let Err(e) = a.qp.post_send(&[wr]) {
            ca.stop_engine_thread();
            cb.stop_engine_thread();
            panic!("post {i} right after the previous completion: {e}");
        }
        let wc = loop {
            if let Some(wc) = a.cq.poll_one() {
                break wc;
            }
            assert!(Instant::now() < deadline, "write {i} never completed");
            std::hint::spin_loop();
        };
        assert_eq!((wc.wr_id, wc.status), (i, WcStatus::Success));
    }
    ca.stop_engine_thread();
    cb.stop_engine_thread();
}

/// Refilling a receive queue to the brim while the engine thread drains the posts (as
/// ibv_rc_pingpong does when one receive is left): every post fits. (The count of slots in
/// use once read two counters the engine moved a WR between, and saw one WR twice.)
#[test]
fn a_receive_queue_refills_to_the_brim_while_the_engine_drains_it() {
    let (ca, cb) = pipe_pair(4200);
    let a = end(&ca, 1 << 16, QpType::Rc);
    let b = end(&cb, 1 << 16, QpType::Rc);
    let depth = 16u32;
    let caps = QpCaps {
        max_recv_wr: depth,
        ..QpCaps::default()
    };
    let qp = b._pd.create_qp(QpType::Rc, caps, &b.cq, &b.cq).unwrap();
    let b = End { qp, ..b };
    wire(&a, &b);
    ca.start_engine_thread().unwrap();
    cb.start_engine_thread().unwrap();
    let s = [a.mr.sge(0, 64)];
    let r = [b.mr.sge(0, 64)];
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut left = 0u32;
    let mut failure = None;
    'rounds: for round in 0..300u64 {
        while left < depth {
            if let Err(e) = b.qp.post_recv(&[RecvWr {
                wr_id: round,
                sg_list: &r,
            }]) {
                failure = Some(format!("round {round}: refill with {left} left: {e}"));
                break 'rounds;
            }
            left += 1;
        }
        let n = depth - 1;
        for i in 0..n {
            let wr = SendWr::new(u64::from(i), WrOpcode::Send, Payload::Sges(&s));
            while let Err(e) = a.qp.post_send(&[wr]) {
                assert!(matches!(e.error, PostError::QueueFull(_)), "{e}");
                std::thread::yield_now();
            }
        }
        let mut got = 0;
        while got < n {
            if let Some(wc) = b.cq.poll_one() {
                assert_eq!(wc.status, WcStatus::Success);
                got += 1;
            }
            while a.cq.poll_one().is_some() {}
            assert!(
                Instant::now() < deadline,
                "round {round}: sends never arrived"
            );
        }
        left -= n;
    }
    ca.stop_engine_thread();
    cb.stop_engine_thread();
    assert!(failure.is_none(), "{}", failure.unwrap_or_default());
}

#[test]
fn two_qps_share_one_receive_queue_under_loss() {
    let model = LinkModel {
        loss: Loss::Bernoulli(0.01),
        ..LinkModel::new(25_000_000_000, 2_000)
    };
    let (net, ca, cb) = SimNet::pair(8, model, 1500, None).unwrap();
    let pa = ca.alloc_pd();
    let pb = cb.alloc_pd();
    let all = Access::LOCAL_WRITE.with(Access::REMOTE_WRITE);
    let src = pa.alloc_mr(8192, all).unwrap();
    let dst = pb.alloc_mr(100 * 4096, all).unwrap();
    let (cqa, cqb) = (ca.create_cq(1024, None), cb.create_cq(1024, None));
    let srq = pb.create_srq(128, 2);
    for i in 0..100 {
        srq.post_recv(&[RecvWr {
            wr_id: i,
            sg_list: &[dst.sge(4096 * i as usize, 4096)],
        }])
        .unwrap();
    }
    let o = ConnectOpts {
        mtu: Mtu::Mtu1024,
        ..ConnectOpts::default()
    };
    let mut senders = Vec::new();
    for q in 0..2u8 {
        let qa = pa
            .create_qp(QpType::Rc, QpCaps::default(), &cqa, &cqa)
            .unwrap();
        let qb = pb
            .create_qp_with_srq(QpType::Rc, QpCaps::default(), &cqb, &cqb, &srq)
            .unwrap();
        let ea = Endpoint {
            qpn: qa.qpn().value(),
            psn: 7,
            gid: ca.query_gid(0).unwrap(),
            mac: ca.mac(),
            addr: 0,
            len: 0,
            rkey: 0,
            offers: ferroce_verbs::connect::Capabilities::NONE,
            alt: None,
            rd_atomic: 16,
        };
        let eb = Endpoint {
            qpn: qb.qpn().value(),
            psn: 9,
            gid: cb.query_gid(0).unwrap(),
            mac: cb.mac(),
            addr: 0,
            len: 0,
            rkey: 0,
            offers: ferroce_verbs::connect::Capabilities::NONE,
            alt: None,
            rd_atomic: 16,
        };
        connect_qp(&ca, &qa, 7, &eb, &o).unwrap();
        connect_qp(&cb, &qb, 9, &ea, &o).unwrap();
        // A QP on a shared queue takes no receives of its own.
        let err = qb
            .post_recv(&[RecvWr {
                wr_id: 0,
                sg_list: &[dst.sge(0, 8)],
            }])
            .unwrap_err();
        assert_eq!(err.error, PostError::UsesSrq);
        src.write(4096 * q as usize, &vec![q + 1; 3000]);
        senders.push((qa, qb));
    }
    // Interleave 40 three-packet SENDs from each QP.
    for n in 0..40u64 {
        for (q, (qa, _)) in senders.iter().enumerate() {
            let s = [src.sge(4096 * q, 3000)];
            qa.post_send(&[SendWr::new(n, WrOpcode::SendWithImm, Payload::Sges(&s)).imm(q as u32)])
                .unwrap();
        }
    }
    let (mut got_a, mut got_b) = (Vec::new(), Vec::new());
    assert!(net.run_until(|| {
        cqa.poll(&mut got_a, 64);
        cqb.poll(&mut got_b, 64);
        got_a.len() == 80 && got_b.len() == 80
    }));
    assert!(got_a
        .iter()
        .chain(&got_b)
        .all(|c| c.status == WcStatus::Success));
    assert_eq!(srq.len(), 20);
    let mut ids: Vec<u64> = got_b.iter().map(|c| c.wr_id).collect();
    ids.sort_unstable();
    assert_eq!(
        ids,
        (0..80).collect::<Vec<_>>(),
        "each shared receive used once"
    );
    for c in &got_b {
        assert_eq!(c.byte_len, 3000);
        let mut buf = vec![0u8; 3000];
        assert!(dst.read(4096 * c.wr_id as usize, &mut buf));
        assert!(
            buf.iter().all(|&b| u32::from(b) == c.imm_data + 1),
            "receive {} mixed data",
            c.wr_id
        );
    }
    for (q, (_, qb)) in senders.iter().enumerate() {
        assert_eq!(
            got_b.iter().filter(|c| c.qp_num == qb.qpn()).count(),
            40,
            "QP {q}"
        );
    }
    assert!(ca.qp_counters_total().retransmitted_packets > 0);
}

/// A QP moved between the engines of its device in the middle of a transfer, at both ends,
/// loses nothing: every SEND lands once and in order, and the frames that reach the engine
/// a QP left are handed on to the one it lives on.
#[test]
fn a_qp_moved_between_engines_mid_transfer_loses_nothing() {
    let (ca, cb) = pipe_pair_queues(4200, 2);
    let (a, b) = (end(&ca, 1 << 20, QpType::Rc), end(&cb, 1 << 20, QpType::Rc));
    assert_eq!(a.qp.engine(), a.qp.qpn().value() as usize % 2);
    assert_eq!(b.qp.engine(), b.qp.qpn().value() as usize % 2);
    wire(&a, &b);
    let data: Vec<u8> = (0..200 * 1024u32).map(|i| (i * 7 + 3) as u8).collect();
    assert!(a.mr.write(0, &data));
    let n = 200u64;
    for i in 0..n {
        b.qp.post_recv(&[RecvWr {
            wr_id: i,
            sg_list: &[b.mr.sge(1024 * i as usize, 1024)],
        }])
        .unwrap();
    }
    let (mut got_a, mut got_b) = (Vec::new(), Vec::new());
    let deadline = Instant::now() + Duration::from_secs(20);
    for i in 0..n {
        let s = [a.mr.sge(1024 * i as usize, 1024)];
        let wr = SendWr::new(i, WrOpcode::SendWithImm, Payload::Sges(&s)).imm(i as u32);
        while let Err(e) = a.qp.post_send(&[wr]) {
            assert!(matches!(e.error, PostError::QueueFull(_)), "{e}");
            a.cq.poll(&mut got_a, 64);
            b.cq.poll(&mut got_b, 64);
            assert!(Instant::now() < deadline, "stuck at WR {i}");
        }
        // Both ends move while requests and ACKs are on their way.
        if i == 60 {
            a.qp.move_to_engine(1 - a.qp.engine()).unwrap();
        }
        if i == 120 {
            b.qp.move_to_engine(1 - b.qp.engine()).unwrap();
            a.qp.move_to_engine(1 - a.qp.engine()).unwrap();
        }
    }
    while (got_a.len() < n as usize || got_b.len() < n as usize) && Instant::now() < deadline {
        a.cq.poll(&mut got_a, 64);
        b.cq.poll(&mut got_b, 64);
    }
    assert_eq!(got_a.len(), n as usize);
    assert!(got_a.iter().all(|c| c.status == WcStatus::Success));
    assert_eq!(got_b.len(), n as usize);
    assert!(got_b
        .iter()
        .enumerate()
        .all(|(i, c)| c.wr_id == i as u64 && c.imm_data == i as u32));
    let mut landed = vec![0u8; data.len()];
    assert!(b.mr.read(0, &mut landed));
    assert!(landed == data, "payload differs");
    // Moved twice, a is back on its first engine; b moved once.
    assert_eq!(a.qp.engine(), a.qp.qpn().value() as usize % 2);
    assert_eq!(b.qp.engine(), 1 - b.qp.qpn().value() as usize % 2);
    // A frame arrives on the queue its sender's engine is piped to; whenever that is not
    // the engine of the QP it names, it is handed over.
    assert!(ca.port_counters().rx_forwarded + cb.port_counters().rx_forwarded > 0);
    assert_eq!(
        ca.port_counters().rx_unknown_qp + cb.port_counters().rx_unknown_qp,
        0
    );
    assert!(matches!(
        a.qp.move_to_engine(2),
        Err(VerbsError::NoSuchEngine {
            engine: 2,
            engines: 2
        })
    ));
}

/// QPs go to the least-loaded engine, and the balancer moves one off an engine busier than
/// the others: four RC pairs between two-engine devices alternate between the engines;
/// SENDs on the two pairs of engine 0 only make it the busiest of each device, and
/// `rebalance` in the middle of the stream moves one QP of each device to engine 1 with its
/// requests and ACKs on their way. Every SEND arrives once, in order, with its payload.
#[test]
fn the_balancer_moves_a_qp_off_a_busy_engine_and_loses_nothing() {
    let (ca, cb) = pipe_pair_queues(4200, 2);
    let pairs: Vec<(End, End)> = (0..4)
        .map(|_| {
            let (a, b) = (end(&ca, 1 << 20, QpType::Rc), end(&cb, 1 << 20, QpType::Rc));
            wire(&a, &b);
            (a, b)
        })
        .collect();
    let engines = |side: fn(&(End, End)) -> &End| -> Vec<usize> {
        pairs.iter().map(|p| side(p).qp.engine()).collect()
    };
    assert_eq!(engines(|p| &p.0), [0, 1, 0, 1]);
    assert_eq!(engines(|p| &p.1), [0, 1, 0, 1]);
    assert_eq!(ca.engine_qp_counts(), [2, 2]);
    // Nothing carried yet: nothing to even.
    assert_eq!(ca.rebalance(), None);
    assert_eq!(cb.rebalance(), None);

    let busy = [&pairs[0], &pairs[2]];
    let n = 800u64;
    let data: Vec<u8> = (0..n as u32 * 256).map(|i| (i * 13 + 5) as u8).collect();
    for (k, (a, b)) in busy.iter().enumerate() {
        assert!(a.mr.write(0, &data));
        for i in 0..n {
            b.qp.post_recv(&[RecvWr {
                wr_id: i,
                sg_list: &[b.mr.sge(256 * i as usize, 256)],
            }])
            .unwrap();
        }
        assert_eq!(a.qp.engine(), 0, "busy pair {k}");
    }
    let (mut got_a, mut got_b) = (vec![Vec::new(); 2], vec![Vec::new(); 2]);
    let mut moved = (None, None);
    let deadline = Instant::now() + Duration::from_secs(30);
    for i in 0..n {
        for (k, (a, b)) in busy.iter().enumerate() {
            let s = [a.mr.sge(256 * i as usize, 256)];
            let wr = SendWr::new(i, WrOpcode::SendWithImm, Payload::Sges(&s)).imm(i as u32);
            while let Err(e) = a.qp.post_send(&[wr]) {
                assert!(matches!(e.error, PostError::QueueFull(_)), "{e}");
                a.cq.poll(&mut got_a[k], 64);
                b.cq.poll(&mut got_b[k], 64);
                assert!(Instant::now() < deadline, "stuck at WR {i} of pair {k}");
            }
            a.cq.poll(&mut got_a[k], 64);
            b.cq.poll(&mut got_b[k], 64);
        }
        if i == n / 2 {
            moved = (ca.rebalance(), cb.rebalance());
        }
    }
    while got_b.iter().chain(&got_a).any(|g| g.len() < n as usize) && Instant::now() < deadline {
        for (k, (a, b)) in busy.iter().enumerate() {
            a.cq.poll(&mut got_a[k], 64);
            b.cq.poll(&mut got_b[k], 64);
        }
    }
    // One QP of each device moved from engine 0 to engine 1: one of the busy pairs'.
    let busy_qpns = |side: fn(&(End, End)) -> &End| -> Vec<_> {
        busy.iter().map(|p| side(p).qp.qpn()).collect()
    };
    let (Some((qa, 0, 1)), Some((qb, 0, 1))) = moved else {
        panic!("no move, or not off engine 0: {moved:?}");
    };
    assert!(busy_qpns(|p| &p.0).contains(&qa), "{qa:?}");
    assert!(busy_qpns(|p| &p.1).contains(&qb), "{qb:?}");
    assert_eq!(ca.engine_qp_counts(), [1, 3]);
    assert_eq!(cb.engine_qp_counts(), [1, 3]);
    assert_eq!(
        busy.iter().map(|p| p.0.qp.engine()).sum::<usize>(),
        1,
        "one busy QP of a on each engine"
    );
    for k in 0..2 {
        assert_eq!(got_a[k].len(), n as usize, "pair {k}");
        assert!(got_a[k].iter().all(|c| c.status == WcStatus::Success));
        assert_eq!(got_b[k].len(), n as usize, "pair {k}");
        assert!(
            got_b[k]
                .iter()
                .enumerate()
                .all(|(i, c)| c.wr_id == i as u64 && c.imm_data == i as u32 && c.byte_len == 256),
            "pair {k}: a receive out of order, twice, or of the wrong length"
        );
        let mut landed = vec![0u8; data.len()];
        assert!(busy[k].1.mr.read(0, &mut landed));
        assert!(landed == data, "pair {k}: payload differs");
    }
    // The last interval's load steers placement: engine 1 carried nothing then, so a new
    // QP goes there although it has more QPs.
    let extra = end(&ca, 4096, QpType::Rc);
    assert_eq!(extra.qp.engine(), 1);
    assert_eq!(
        ca.port_counters().rx_unknown_qp + cb.port_counters().rx_unknown_qp,
        0
    );
}

/// With engine threads, the first engine's thread evens the load by itself every balance
/// interval: WRITEs on two pairs of engine 0 until a QP of each device has moved.
#[test]
fn engine_threads_even_the_load_by_themselves() {
    let (ca, cb) = pipe_pair_queues(1500, 2);
    let pairs: Vec<(End, End)> = (0..4)
        .map(|_| {
            let (a, b) = (end(&ca, 4096, QpType::Rc), end(&cb, 4096, QpType::Rc));
            wire(&a, &b);
            (a, b)
        })
        .collect();
    for c in [&ca, &cb] {
        c.set_balance_interval(Some(Duration::from_millis(20)));
        c.start_engine_thread().unwrap();
    }
    let busy = [&pairs[0], &pairs[2]];
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut posted = 0u64;
    while ca.engine_qp_counts() != [1, 3] || cb.engine_qp_counts() != [1, 3] {
        assert!(
            Instant::now() < deadline,
            "no move: {:?} {:?}",
            ca.engine_qp_counts(),
            cb.engine_qp_counts()
        );
        for (a, b) in busy {
            let s = [a.mr.sge(0, 64)];
            let wr = SendWr::new(posted, WrOpcode::Write, Payload::Sges(&s))
                .remote(b.mr.addr(), b.mr.rkey());
            if a.qp.post_send(&[wr]).is_ok() {
                posted += 1;
            }
            a.cq.poll(&mut got, 64);
        }
    }
    while got.len() < posted as usize {
        assert!(Instant::now() < deadline, "{} of {posted}", got.len());
        for (a, _) in busy {
            a.cq.poll(&mut got, 64);
        }
    }
    assert!(got.iter().all(|c| c.status == WcStatus::Success));
    for c in [&ca, &cb] {
        c.stop_engine_thread();
    }
}

/// A device with two ports (two rails between two simulated hosts): the connection exchange
/// carries both ports' addresses, each QP gets the peer's second port as its alternate path,
/// and when rail 1's link fails in the middle of a WRITE stream with FETCH_ADDs among it the
/// QPs move to port 2 on the link event and every WR completes, once. The device raises the
/// port's error and the QP's path migration as asynchronous events.
#[test]
fn a_two_port_device_moves_its_qps_when_a_link_fails() {
    let (net, links, ca, cb) =
        SimNet::rails(21, LinkModel::new(25_000_000_000, 2_000), 4096).unwrap();
    let events = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = events.clone();
    assert!(ca.set_async_handler(Box::new(move |e| sink.lock().unwrap().push(e))));
    assert_eq!(ca.query_device().phys_port_cnt, 2);
    assert_eq!(&ca.query_gid_on(2, 0).unwrap().0[12..], &[10, 0, 1, 1]);
    assert_ne!(ca.port_mac(1).unwrap(), ca.port_mac(2).unwrap());
    assert!(matches!(
        ca.query_port_num(3),
        Err(VerbsError::NoSuchPort { port: 3, ports: 2 })
    ));
    let (a, b) = (end(&ca, 4 << 20, QpType::Rc), end(&cb, 4 << 20, QpType::Rc));
    let (ea, eb) = (endpoint(&a, 0x10), endpoint(&b, 0x20));
    assert!(ea.alt.is_some() && eb.alt.is_some());
    let o = ConnectOpts::default();
    connect_qp(&a.ctx, &a.qp, ea.psn, &eb, &o).unwrap();
    connect_qp(&b.ctx, &b.qp, eb.psn, &ea, &o).unwrap();
    assert_eq!(a.qp.path_state().unwrap(), (Some(1), 0));
    let data: Vec<u8> = (0..65536u32).map(|i| (i * 13 + 5) as u8).collect();
    assert!(a.mr.write(0, &data));
    // 48 WRITEs of 64 KiB (about a millisecond at 25 Gbit/s), a FETCH_ADD after every
    // fourth; rail 1 fails at 300 µs, for good.
    let s = [a.mr.sge(0, 65536)];
    let mut wrs = Vec::new();
    let results: Vec<[Sge; 1]> = (0..12).map(|i| [a.mr.sge(0x30_0000 + 8 * i, 8)]).collect();
    for i in 0..48u64 {
        wrs.push(
            SendWr::new(i, WrOpcode::Write, Payload::Sges(&s))
                .remote(b.mr.addr() + 0x10000 * (i % 32), b.mr.rkey()),
        );
        if i % 4 == 3 {
            let mut fa = SendWr::new(
                1000 + i,
                WrOpcode::FetchAdd,
                Payload::Sges(&results[i as usize / 4]),
            )
            .remote(b.mr.addr() + 0x3f_0000, b.mr.rkey());
            fa.compare_add = 1;
            wrs.push(fa);
        }
    }
    let t = net.now();
    net.fabric().fail_link(links[0], t + 300_000, u64::MAX / 4);
    a.qp.post_send(&wrs).unwrap();
    let mut got = Vec::new();
    assert!(net.run_until(|| {
        a.cq.poll(&mut got, 64);
        got.len() == wrs.len()
    }));
    assert!(got.iter().all(|c| c.status == WcStatus::Success), "{got:?}");
    assert_eq!(a.qp.path_state().unwrap().0, Some(2), "moved to port 2");
    assert_eq!(b.qp.path_state().unwrap().0, Some(2), "the peer too");
    let events = events.lock().unwrap().clone();
    assert!(events.contains(&AsyncEvent::PortError(1)), "{events:?}");
    assert_eq!(
        events
            .iter()
            .filter(|e| **e == AsyncEvent::PathMigrated(a.qp.qpn()))
            .count(),
        1,
        "{events:?}"
    );
    // Each FETCH_ADD ran once: the results are 0..12 and the counter is 12.
    let mut seen: Vec<u64> = (0..12)
        .map(|i| {
            let mut v = [0u8; 8];
            assert!(a.mr.read(0x30_0000 + 8 * i, &mut v));
            u64::from_le_bytes(v)
        })
        .collect();
    seen.sort_unstable();
    assert_eq!(seen, (0..12).collect::<Vec<_>>());
    let mut v = [0u8; 8];
    assert!(b.mr.read(0x3f_0000, &mut v));
    assert_eq!(u64::from_le_bytes(v), 12);
    let mut out = vec![0u8; 65536];
    assert!(b.mr.read(0x10000 * 31, &mut out));
    assert_eq!(out, data);
}

/// SHIFT mode on two-port devices (no native failover: plain QPs, one per rail, plus a
/// control QP): rail 1 fails under a WRITE stream, the default QP's retries run out, the
/// WRs go again on the backup QP after the handshake, every one completes successfully and
/// in order, and once rail 1 is back a probe brings the traffic home.
#[test]
fn shift_mode_resubmits_on_the_backup_qp_and_comes_home() {
    use ferroce_reliability::failover::shift::{SendState, ShiftConfig};
    use ferroce_verbs::shift::ShiftQp;
    let (net, links, ca, cb) =
        SimNet::rails(31, LinkModel::new(25_000_000_000, 2_000), 4096).unwrap();
    let all = Access::LOCAL_WRITE
        .with(Access::REMOTE_WRITE)
        .with(Access::REMOTE_READ);
    let (pa, pb) = (ca.alloc_pd(), cb.alloc_pd());
    let (ma, mb) = (
        pa.alloc_mr(1 << 20, all).unwrap(),
        pb.alloc_mr(4 << 20, all).unwrap(),
    );
    let cfg = |leader| ShiftConfig {
        probe_interval_ns: 200_000,
        leader,
    };
    let sa = ShiftQp::new(&pa, QpCaps::default(), cfg(true)).unwrap();
    let sb = ShiftQp::new(&pb, QpCaps::default(), cfg(false)).unwrap();
    let (ea, eb) = (sa.endpoints(&ma, 0x100), sb.endpoints(&mb, 0x200));
    let o = ConnectOpts {
        timeout: 8, // 1 ms
        retry_cnt: 2,
        ..ConnectOpts::default()
    };
    sa.connect(0x100, &eb, &o).unwrap();
    sb.connect(0x200, &ea, &o).unwrap();
    let data: Vec<u8> = (0..65536u32).map(|i| (i * 11 + 3) as u8).collect();
    assert!(ma.write(0, &data));
    let t0 = net.now();
    net.fabric()
        .fail_link(links[0], t0 + 200_000, t0 + 6_000_000);
    let s = [ma.sge(0, 65536)];
    let (mut posted, mut got) = (0u64, Vec::new());
    let mut b_got = Vec::new();
    let done = net.run_until(|| {
        while posted < 64 && posted - (got.len() as u64) < 8 {
            let wr = SendWr::new(posted, WrOpcode::Write, Payload::Sges(&s))
                .remote(mb.addr() + 65536 * (posted % 64), mb.rkey());
            sa.post_send(&wr).unwrap();
            posted += 1;
        }
        sa.poll(&mut got);
        sb.poll(&mut b_got);
        got.len() == 64
    });
    assert!(done, "{} of 64 completed: {:?}", got.len(), sa.stats());
    assert!(got.iter().all(|c| c.status == WcStatus::Success), "{got:?}");
    assert_eq!(
        got.iter().map(|c| c.wr_id).collect::<Vec<_>>(),
        (0..64).collect::<Vec<_>>()
    );
    let st = sa.stats();
    assert_eq!(st.fallbacks, 1, "{st:?}");
    assert!(st.resent_wrs > 0, "{st:?}");
    // Rail 1 comes back at 6 ms: the next probe succeeds and the traffic goes home. (The
    // probe timer is the mode's, above the engines: when nothing else happens, virtual time
    // moves to it here.)
    for _ in 0..100_000 {
        sa.poll(&mut got);
        sb.poll(&mut b_got);
        if sa.state().0 == SendState::Default {
            break;
        }
        if !net.step() {
            let to = sa.next_timeout().unwrap_or(net.now() + 100_000);
            net.fabric().advance_to(to.max(net.now() + 1));
        }
    }
    assert_eq!(sa.state().0, SendState::Default, "{:?}", sa.stats());
    assert_eq!(sa.stats().switchbacks, 1);
    let mut out = vec![0u8; 65536];
    for i in 0..64 {
        assert!(mb.read(65536 * i, &mut out));
        assert_eq!(out, data, "WRITE {i}");
    }
}

/// An RSS QP (`ibv_create_qp_ex` with an indirection table) hands every frame its rule
/// matches to the work queue the Toeplitz hash of the IPv4 addresses picks, as a NIC does:
/// frames from 32 sources land spread over the four queues, each where the hash says.
#[test]
fn rss_spreads_frames_over_work_queues_by_toeplitz_hash() {
    let (net, ca, cb) = SimNet::pair(11, LinkModel::default(), 1500, None).unwrap();
    let (pa, pb) = (ca.alloc_pd(), cb.alloc_pd());
    let (cqa, cqb) = (ca.create_cq(64, None), cb.create_cq(256, None));
    let sender = pa.create_raw_qp(QpCaps::default(), &cqa, &cqa).unwrap();
    sender.modify(QpState::Init, Some(1)).unwrap();
    sender.modify(QpState::Rtr, None).unwrap();
    sender.modify(QpState::Rts, None).unwrap();
    let wqs: Vec<RawQueuePair> = (0..4).map(|_| pb.create_wq(64, 1, &cqb).unwrap()).collect();
    for w in &wqs {
        w.set_wq_state(QpState::Rts).unwrap();
    }
    let key: Vec<u8> = (0..40u8).map(|i| i.wrapping_mul(37) ^ 0x5a).collect();
    let rss = cb
        .create_rss_qp(&pb, &wqs.iter().collect::<Vec<_>>(), key.clone(), 0b11)
        .unwrap();
    let dst = cb.mac().0;
    let _flow = rss
        .create_flow(FlowRule {
            specs: vec![FlowSpec::Eth {
                dst,
                dst_mask: [0xff; 6],
                src: [0; 6],
                src_mask: [0; 6],
                ether_type: 0,
                ether_type_mask: 0,
                vlan_tag: 0,
                vlan_mask: 0,
            }],
        })
        .unwrap();
    let rx = pb.alloc_mr(256 * 128, Access::LOCAL_WRITE).unwrap();
    for (i, w) in wqs.iter().enumerate() {
        for j in 0..32 {
            let at = (i * 32 + j) * 128;
            w.post_recv(&[RecvWr {
                wr_id: (i * 1000 + j) as u64,
                sg_list: &[rx.sge(at, 128)],
            }])
            .unwrap();
        }
    }
    let tx = pa.alloc_mr(32 * 128, Access::LOCAL_WRITE).unwrap();
    let mut want = [0usize; 4];
    for i in 0..32u8 {
        let src_ip = [i, i + 1, i + 2, i + 3];
        let dst_ip = [10, 0, 0, 2];
        let mut f = Vec::new();
        f.extend_from_slice(&dst);
        f.extend_from_slice(&ca.mac().0);
        f.extend_from_slice(&[0x08, 0x00, 0x45, 0, 0, 36, 0, 0, 0x40, 0, 64, 17, 0, 0]);
        f.extend_from_slice(&src_ip);
        f.extend_from_slice(&dst_ip);
        f.extend_from_slice(&[0x30, 0x39, 0x30, 0x3a, 0, 16, 0, 0]);
        f.extend_from_slice(b"rss test");
        let at = usize::from(i) * 128;
        assert!(tx.write(at, &f));
        let mut input = src_ip.to_vec();
        input.extend_from_slice(&dst_ip);
        want[toeplitz(&key, &input) as usize % 4] += 1;
        let s = [tx.sge(at, f.len())];
        sender
            .post_send(
                &[SendWr::new(u64::from(i), WrOpcode::Send, Payload::Sges(&s))
                    .flags(SendFlags::SIGNALED)],
            )
            .unwrap();
    }
    let (mut sent, mut got) = (Vec::new(), Vec::new());
    assert!(net.run_until(|| {
        cqa.poll(&mut sent, 64);
        cqb.poll(&mut got, 64);
        sent.len() == 32 && got.len() == 32
    }));
    assert!(got.iter().all(|c| c.status == WcStatus::Success), "{got:?}");
    let mut per_wq = [0usize; 4];
    for c in &got {
        let i = wqs.iter().position(|w| w.qpn() == c.qp_num).unwrap();
        assert_eq!(c.wr_id / 1000, i as u64);
        per_wq[i] += 1;
    }
    assert_eq!(per_wq, want);
    assert!(per_wq.iter().filter(|&&n| n > 0).count() > 1, "{per_wq:?}");
}

/// Tag matching (`IBV_SRQT_TM`) between two simulated hosts: `b`'s QP sits on a tag
/// matching SRQ with tagged buffers. An eager message lands in the buffer its tag matches,
/// without its header, across packets; one no tag matches goes whole to an ordinary receive
/// and makes adds fail until software synchronizes; one sent without a tag too; a
/// rendezvous request is completed as matched at once, its data read from the sender into
/// the buffer (a second completion, `TM_DATA_VALID`), and a FIN carrying its headers reaches
/// the sender; a buffer too small for a rendezvous gets its headers and
/// `TM_RNDV_INCOMPLETE`.
#[test]
fn tag_matching_srq_matches_eager_and_rendezvous_messages() {
    let (net, ca, cb) = SimNet::pair(41, LinkModel::default(), 1500, None).unwrap();
    let a = end(&ca, 1 << 20, QpType::Rc);
    let pb = cb.alloc_pd();
    let all = Access::LOCAL_WRITE
        .with(Access::REMOTE_WRITE)
        .with(Access::REMOTE_READ);
    let mb = pb.alloc_mr(1 << 20, all).unwrap();
    let cqb = cb.create_cq(256, None);
    let srq = pb.create_tm_srq(64, 1, 16, &cqb);
    let qb = pb
        .create_qp_with_srq(QpType::Rc, QpCaps::default(), &cqb, &cqb, &srq)
        .unwrap();
    let b = End {
        ctx: cb.clone(),
        cq: cqb,
        qp: qb,
        mr: mb,
        _pd: pb,
    };
    wire(&a, &b);
    for i in 0..4u64 {
        srq.post_recv(&[RecvWr {
            wr_id: 200 + i,
            sg_list: &[b.mr.sge(0x1_0000 + 0x1000 * i as usize, 0x1000)],
        }])
        .unwrap();
    }
    let add = |tag: u64, unexpected: Option<u32>, at: usize, len: usize| {
        let sge = [b.mr.sge(at, len)];
        srq.post_tag_op(&TagOp::Add {
            wr_id: 900 + tag,
            unexpected,
            tag,
            mask: u64::MAX,
            recv_wr_id: 100 + tag,
            sg_list: &sge,
            signaled: true,
        })
        .unwrap()
    };
    for tag in 1..=4u64 {
        assert_ne!(
            add(tag, Some(0), 0x4_0000 + 0x1000 * tag as usize, 0x1000),
            0
        );
    }
    let mut got = Vec::new();
    b.cq.poll(&mut got, 16);
    assert_eq!(got.len(), 4);
    assert!(got.iter().all(|c| c.opcode == WcOpcode::TmAdd
        && c.status == WcStatus::Success
        && c.wc_flags == WcFlags(0)));
    // IBV_TMH_NO_TAG 0, _RNDV 1, _FIN 2, _EAGER 3.
    let tmh = |op: u8, tag: u64| {
        let mut h = vec![op, 0, 0, 0, 0, 0, 0, 0x77];
        h.extend_from_slice(&tag.to_be_bytes());
        h
    };
    // Sends `msg` from a's memory at 0 and runs until b has `n` completions (a's SEND
    // completion taken too).
    let send = |msg: &[u8], n: usize| -> Vec<WorkCompletion> {
        assert!(a.mr.write(0, msg));
        a.qp.post_send(&[
            SendWr::new(1, WrOpcode::Send, Payload::Sges(&[a.mr.sge(0, msg.len())]))
                .flags(SendFlags::SIGNALED),
        ])
        .unwrap();
        let (mut sa, mut sb) = (Vec::new(), Vec::new());
        assert!(net.run_until(|| {
            a.cq.poll(&mut sa, 16);
            b.cq.poll(&mut sb, 16);
            sa.iter().any(|c| c.opcode == WcOpcode::Send) && sb.len() >= n
        }));
        assert!(sa.iter().all(|c| c.status == WcStatus::Success), "{sa:?}");
        sb
    };

    // Eager, tag 3, two packets of payload: into tag 3's buffer, header stripped.
    let data: Vec<u8> = (0..2000u32).map(|i| (i * 7 + 1) as u8).collect();
    let mut m = tmh(3, 3);
    m.extend_from_slice(&data);
    let c = send(&m, 1);
    assert_eq!(c.len(), 1, "{c:?}");
    let c = c[0];
    assert_eq!(
        (c.wr_id, c.opcode, c.status),
        (103, WcOpcode::TmRecv, WcStatus::Success)
    );
    assert_eq!(c.wc_flags, WcFlags::TM_MATCH.with(WcFlags::TM_DATA_VALID));
    assert_eq!((c.byte_len, c.tag, c.imm_data), (2000, 3, 0x77));
    let mut out = vec![0u8; 2000];
    assert!(b.mr.read(0x4_3000, &mut out));
    assert_eq!(out, data);

    // No tag matches 99: whole, into the first ordinary receive; adds now need a sync.
    let m = tmh(3, 99);
    let c = send(&m, 1)[0];
    assert_eq!(
        (c.wr_id, c.opcode, c.wc_flags),
        (200, WcOpcode::TmRecv, WcFlags(0))
    );
    assert_eq!((c.byte_len, c.tag), (16, 0));
    let mut out = vec![0u8; 16];
    assert!(b.mr.read(0x1_0000, &mut out));
    assert_eq!(out, m);
    add(5, None, 0x4_5000, 0x1000);
    let mut got = Vec::new();
    b.cq.poll(&mut got, 4);
    assert_eq!(got.len(), 1);
    assert_eq!(
        (got[0].opcode, got[0].status),
        (WcOpcode::TmAdd, WcStatus::TmErr)
    );
    assert_eq!(got[0].wc_flags, WcFlags::TM_SYNC_REQ);
    srq.post_tag_op(&TagOp::Sync {
        wr_id: 7,
        unexpected: 1,
        signaled: true,
    })
    .unwrap();
    got.clear();
    b.cq.poll(&mut got, 4);
    assert_eq!(
        (got[0].opcode, got[0].status, got[0].wc_flags),
        (WcOpcode::TmSync, WcStatus::Success, WcFlags(0))
    );

    // Without a tag: an ordinary receive, TM_NO_TAG.
    let c = send(&tmh(0, 4), 1)[0];
    assert_eq!(
        (c.wr_id, c.opcode, c.wc_flags),
        (201, WcOpcode::TmNoTag, WcFlags(0))
    );

    // Rendezvous for tag 7 (a 16 KiB buffer): 8000 bytes read from a, then a FIN to a.
    add(7, None, 0x8_0000, 0x4000);
    b.cq.poll(&mut got, 4);
    let payload: Vec<u8> = (0..8000u32).map(|i| (i * 13 + 5) as u8).collect();
    assert!(a.mr.write(0x5_0000, &payload));
    a.qp.post_recv(&[RecvWr {
        wr_id: 55,
        sg_list: &[a.mr.sge(0x6_0000, 64)],
    }])
    .unwrap();
    let rndv = |tag: u64| {
        let mut m = tmh(1, tag);
        m.extend_from_slice(&(a.mr.addr() + 0x5_0000).to_be_bytes());
        m.extend_from_slice(&a.mr.rkey().to_be_bytes());
        m.extend_from_slice(&8000u32.to_be_bytes());
        m.extend_from_slice(b"meta data");
        m
    };
    let m = rndv(7);
    let c = send(&m, 2);
    assert_eq!(c.len(), 2, "{c:?}");
    assert_eq!(
        (c[0].wr_id, c[0].opcode, c[0].wc_flags, c[0].tag),
        (107, WcOpcode::TmRecv, WcFlags::TM_MATCH, 7)
    );
    assert_eq!(
        (c[1].wr_id, c[1].opcode, c[1].wc_flags, c[1].byte_len),
        (107, WcOpcode::TmRecv, WcFlags::TM_DATA_VALID, 8000)
    );
    assert!(c.iter().all(|c| c.status == WcStatus::Success));
    let mut out = vec![0u8; 8000];
    assert!(b.mr.read(0x8_0000, &mut out));
    assert_eq!(out, payload);
    let mut fin = Vec::new();
    assert!(net.run_until(|| {
        a.cq.poll(&mut fin, 4);
        fin.iter().any(|c| c.opcode == WcOpcode::Recv)
    }));
    let f = fin.iter().find(|c| c.opcode == WcOpcode::Recv).unwrap();
    assert_eq!((f.wr_id, f.byte_len, f.status), (55, 32, WcStatus::Success));
    let mut h = vec![0u8; 32];
    assert!(a.mr.read(0x6_0000, &mut h));
    assert_eq!(h[0], 2, "the FIN opcode");
    assert_eq!(h[1..32], m[1..32]);

    // Tag 1's buffer holds 4 KiB: a rendezvous of 8000 bytes gets only its headers.
    let m = rndv(1);
    let c = send(&m, 1)[0];
    assert_eq!(
        (c.wr_id, c.opcode, c.status, c.tag),
        (101, WcOpcode::TmRecv, WcStatus::TmRndvIncomplete, 1)
    );
    let mut out = vec![0u8; 32];
    assert!(b.mr.read(0x4_1000, &mut out));
    assert_eq!(out, m[..32]);
    assert_eq!(a.qp.state(), QpState::Rts);
    assert_eq!(b.qp.state(), QpState::Rts);
}

/// Two QPs connected through the communication manager on QP1 (REQ, REP, RTU as a kernel
/// CM exchanges them), each moved to RTS with the numbers the other sent, then a SEND,
/// WRITE and READ chain, then DREQ / DREP and time wait on both sides.
#[test]
fn qps_connect_and_disconnect_through_the_communication_manager() {
    use ferroce_stack::wire::mad::{port_space, service_id, CmPath};
    use ferroce_verbs::cm::*;
    let (net, ca, cb) = SimNet::pair(51, LinkModel::default(), 1500, None).unwrap();
    let (a, b) = (end(&ca, 4 << 20, QpType::Rc), end(&cb, 4 << 20, QpType::Rc));
    let (cma, cmb) = (ca.connection_manager(), cb.connection_manager());
    let svc = service_id(port_space::TCP, 7471);
    cmb.listen(svc).unwrap();
    let (pa, pb) = (cma.local_peer(), cmb.local_peer());
    let params = ConnectParams {
        service_id: svc,
        qpn: a.qp.qpn().value(),
        psn: 0x100,
        responder_resources: 4,
        initiator_depth: 4,
        retry_count: 7,
        rnr_retry_count: 7,
        path_mtu: 3,
        transport_service_type: 0,
        srq: false,
        path: CmPath {
            local_lid: 0xffff,
            remote_lid: 0xffff,
            local_gid: pa.gid,
            remote_gid: pb.gid,
            hop_limit: 64,
            local_ack_timeout: 14,
            ..CmPath::default()
        },
        response_timeout: 16,
        max_cm_retries: 15,
        private_data: b"hello b".to_vec(),
    };
    let conn = cma.connect(pb, &params).unwrap();
    let take = |cm: &ConnectionManager, evs: &mut Vec<CmEvent>| {
        while let Some(e) = cm.try_next_event() {
            evs.push(e);
        }
    };
    let (mut ea, mut eb) = (Vec::new(), Vec::new());
    assert!(net.run_until(|| {
        take(&cmb, &mut eb);
        !eb.is_empty()
    }));
    let CmEvent::Request {
        conn: bc,
        peer,
        req,
    } = eb.remove(0)
    else {
        panic!("{eb:?}");
    };
    assert_eq!((peer, req.qpn, req.psn), (pa, a.qp.qpn().value(), 0x100));
    assert_eq!(&req.private_data[..7], b"hello b");
    let ep = |qpn, psn, p: Peer| Endpoint {
        qpn,
        psn,
        gid: Gid(p.gid),
        mac: p.mac,
        addr: 0,
        len: 0,
        rkey: 0,
        offers: Default::default(),
        alt: None,
        rd_atomic: 4,
    };
    let o = ConnectOpts::default();
    connect_qp(&cb, &b.qp, 0x200, &ep(req.qpn, req.psn, peer), &o).unwrap();
    cmb.accept(
        bc,
        &AcceptParams {
            qpn: b.qp.qpn().value(),
            psn: 0x200,
            responder_resources: 4,
            initiator_depth: 4,
            rnr_retry_count: 7,
            srq: false,
            private_data: b"hello a".to_vec(),
        },
    )
    .unwrap();
    assert!(net.run_until(|| {
        take(&cma, &mut ea);
        !ea.is_empty()
    }));
    let CmEvent::Reply { conn: c, rep } = ea.remove(0) else {
        panic!("{ea:?}");
    };
    assert_eq!((c, rep.qpn, rep.psn), (conn, b.qp.qpn().value(), 0x200));
    assert_eq!(&rep.private_data[..7], b"hello a");
    connect_qp(&ca, &a.qp, 0x100, &ep(rep.qpn, rep.psn, pb), &o).unwrap();
    cma.ready_to_use(conn, &[]).unwrap();
    assert!(net.run_until(|| {
        take(&cma, &mut ea);
        take(&cmb, &mut eb);
        !ea.is_empty() && !eb.is_empty()
    }));
    assert_eq!(ea.remove(0), CmEvent::Established { conn });
    assert_eq!(eb.remove(0), CmEvent::Established { conn: bc });
    send_write_read(&net, &a, &b, 5);
    cma.disconnect(conn, b"bye").unwrap();
    assert!(net.run_until(|| {
        take(&cma, &mut ea);
        take(&cmb, &mut eb);
        ea.len() == 2 && eb.len() == 2
    }));
    assert_eq!(
        ea,
        [
            CmEvent::Disconnected { conn },
            CmEvent::TimewaitExit { conn }
        ]
    );
    assert_eq!(
        eb,
        [
            CmEvent::Disconnected { conn: bc },
            CmEvent::TimewaitExit { conn: bc }
        ]
    );
    assert_eq!(cma.connections() + cmb.connections(), 0);
}
