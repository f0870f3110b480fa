//! The policy seams of a QP: what a congestion-control policy hears (every request sent,
//! every acknowledgement, CNPs, losses) and how its window and pacing rate hold the requester
//! back; which path a path selector gives each packet.

use std::sync::{Arc, Mutex};

use ferroce_stack::transport::loopback::{connect, drain_frames, Loopback};
use ferroce_stack::transport::{
    Access, AckEvent, CongestionControl, Loss, MrKeys, MrTable, Mtu, Path, PathSelector, Payload,
    PdId, Policies, Qp, QpAttr, QpConfig, QpType, SendFlags, SendWr, Sge, WcStatus, WrOpcode,
};
use ferroce_stack::wire::sample::{sample_frame, sample_repr, SampleAddr};
use ferroce_stack::wire::{Checks, Opcode, Psn, Qpn, RoceRepr};

const PD: PdId = PdId(1);
const ALL: Access = Access::LOCAL_WRITE.with(Access::REMOTE_WRITE);

/// What a recording controller heard.
#[derive(Debug, Default)]
struct Heard {
    sent: Vec<(u64, Psn, usize, bool)>,
    acked: Vec<AckEvent>,
    cnps: u32,
    losses: Vec<Loss>,
    timeouts: u32,
}

/// A controller that records every event and answers a fixed window and rate.
#[derive(Debug)]
struct Recording {
    heard: Arc<Mutex<Heard>>,
    window: Option<u32>,
    rate: Option<u64>,
}

impl CongestionControl for Recording {
    fn name(&self) -> &'static str {
        "recording"
    }
    fn on_sent(&mut self, now: u64, psn: Psn, bytes: usize, retransmission: bool) {
        let mut h = self.heard.lock().unwrap();
        h.sent.push((now, psn, bytes, retransmission));
    }
    fn on_ack(&mut self, _now: u64, ack: AckEvent) {
        self.heard.lock().unwrap().acked.push(ack);
    }
    fn on_cnp(&mut self, _now: u64) {
        self.heard.lock().unwrap().cnps += 1;
    }
    fn on_loss(&mut self, _now: u64, loss: Loss) {
        self.heard.lock().unwrap().losses.push(loss);
    }
    fn on_timeout(&mut self, _now: u64) {
        self.heard.lock().unwrap().timeouts += 1;
    }
    fn window(&self) -> Option<u32> {
        self.window
    }
    fn pacing_rate(&self) -> Option<u64> {
        self.rate
    }
}

struct Rig {
    lo: Loopback,
    ka: MrKeys,
    kb: MrKeys,
    heard: Arc<Mutex<Heard>>,
    _bufs: (Vec<u64>, Vec<u64>),
}

/// QP 1 (requester, running `policies` with a recording controller of `window` and `rate`)
/// connected to QP 2 at MTU 1024, first PSN 100.
fn rig(window: Option<u32>, rate: Option<u64>, path: Option<Box<dyn PathSelector>>) -> Rig {
    let mut a_buf = vec![0u64; 4096];
    let mut b_buf = vec![0u64; 4096];
    let (mut ma, mut mb) = (MrTable::new(1), MrTable::new(2));
    // SAFETY: the Vec heap buffers live in the rig beside the tables and never move.
    let ka = unsafe { ma.register(PD, a_buf.as_mut_ptr().cast(), 32768, 0, ALL) }.unwrap();
    // SAFETY: as above.
    let kb = unsafe { mb.register(PD, b_buf.as_mut_ptr().cast(), 32768, 0, ALL) }.unwrap();
    let heard = Arc::new(Mutex::new(Heard::default()));
    let cc = Recording {
        heard: heard.clone(),
        window,
        rate,
    };
    let mut config = QpConfig::new(Qpn::new(1), QpType::Rc, PD);
    config.policies = Policies::default().with_congestion(Box::new(cc));
    if let Some(p) = path {
        config.policies = config.policies.with_path(p);
    }
    let mut a = Qp::new(config);
    let mut b = Qp::new(QpConfig::new(Qpn::new(2), QpType::Rc, PD));
    let attr = QpAttr {
        qp_access_flags: ALL,
        path_mtu: Mtu::Mtu1024,
        sq_psn: Psn::new(100),
        rq_psn: Psn::new(100),
        timeout: 10,
        ..QpAttr::default()
    };
    connect(&mut a, &mut b, &attr).unwrap();
    Rig {
        lo: Loopback::new(a, b, ma, mb),
        ka,
        kb,
        heard,
        _bufs: (a_buf, b_buf),
    }
}

/// A signaled WRITE of `len` bytes from a's region to b's.
fn write(r: &mut Rig, len: u32) {
    let s = Box::leak(Box::new([Sge {
        addr: 0,
        length: len,
        lkey: r.ka.lkey,
    }]));
    let wr = SendWr::new(7, WrOpcode::Write, Payload::Sges(s))
        .remote(0, r.kb.rkey)
        .flags(SendFlags::SIGNALED);
    r.lo.a.post_send(&wr).unwrap();
}

#[test]
fn congestion_control_hears_every_request_every_ack_and_a_cnp() {
    let mut r = rig(None, None, None);
    write(&mut r, 4096);
    r.lo.run();
    let wc = r.lo.a.poll_completion().unwrap();
    assert_eq!(wc.status, WcStatus::Success);
    {
        let h = r.heard.lock().unwrap();
        let psns: Vec<u32> = h.sent.iter().map(|s| s.1.value()).collect();
        assert_eq!(psns, [100, 101, 102, 103]);
        assert!(h.sent.iter().all(|s| !s.3), "nothing was resent");
        let bytes: usize = h.sent.iter().map(|s| s.2).sum();
        assert_eq!(bytes as u64, r.lo.a.counters().tx_bytes);
        let acked: u32 = h.acked.iter().map(|a| a.acked).sum();
        assert_eq!(acked, 4, "every packet acknowledged, each once");
        assert!(h.losses.is_empty() && h.timeouts == 0);
    }
    // A CNP for QP 1, as a switch-marked flow's receiver sends it.
    let mut cnp = sample_repr(Opcode::CNP, SampleAddr::default(), 0);
    cnp.bth.dest_qpn = Qpn::new(1);
    let frame = sample_frame(&cnp);
    r.lo.a.handle_frame(0, &frame, &mut r.lo.mem_a).unwrap();
    assert_eq!(r.heard.lock().unwrap().cnps, 1);
    assert_eq!(r.lo.a.counters().rp_cnp_handled, 1);
}

#[test]
fn an_acknowledgement_carries_the_round_trip_of_the_newest_packet_it_covers() {
    let mut r = rig(None, None, None);
    write(&mut r, 4096);
    // Requests leave at 1 µs, the coalesced ACK comes back at 6 µs.
    let reqs = drain_frames(&mut r.lo.a, &r.lo.mem_a, 1_000);
    assert_eq!(reqs.len(), 4);
    let rec = r.lo.a.send_record(Psn::new(103)).unwrap();
    assert_eq!((rec.at, rec.resent), (1_000, false));
    assert_eq!(usize::from(rec.bytes), reqs[3].len());
    for f in &reqs {
        r.lo.b.handle_frame(1_000, f, &mut r.lo.mem_b).unwrap();
    }
    let acks = drain_frames(&mut r.lo.b, &r.lo.mem_b, 2_000);
    assert_eq!(acks.len(), 1);
    r.lo.a
        .handle_frame(6_000, &acks[0], &mut r.lo.mem_a)
        .unwrap();
    let h = r.heard.lock().unwrap();
    assert_eq!(
        h.acked,
        [AckEvent {
            acked: 4,
            rtt: Some(5_000)
        }]
    );
}

#[test]
fn a_resent_packet_gives_no_sample_and_a_default_qp_keeps_no_records() {
    let mut r = rig(None, None, None);
    write(&mut r, 1024);
    drain_frames(&mut r.lo.a, &r.lo.mem_a, 0);
    r.lo.now = r.lo.a.poll_timeout().unwrap();
    r.lo.a.handle_timeout(r.lo.now);
    r.lo.run();
    assert!(r.lo.a.send_record(Psn::new(100)).unwrap().resent);
    let h = r.heard.lock().unwrap();
    assert_eq!(
        h.acked,
        [AckEvent {
            acked: 1,
            rtt: None
        }],
        "Karn: the ACK of a resent packet is no round trip"
    );
    assert_eq!(r.lo.b.send_record(Psn::new(100)), None);
}

#[test]
fn a_go_back_n_rewind_and_a_timeout_reach_congestion_control() {
    let mut r = rig(None, None, None);
    write(&mut r, 4096);
    // The first burst is lost; the timer fires and the requester goes back.
    let lost = drain_frames(&mut r.lo.a, &r.lo.mem_a, 0);
    assert_eq!(lost.len(), 4);
    r.lo.now = r.lo.a.poll_timeout().unwrap();
    r.lo.a.handle_timeout(r.lo.now);
    r.lo.run();
    assert_eq!(r.lo.a.poll_completion().unwrap().status, WcStatus::Success);
    let h = r.heard.lock().unwrap();
    assert_eq!(h.timeouts, 1);
    assert_eq!(h.losses, [Loss::GoBack]);
    let resent: Vec<u32> = h.sent.iter().filter(|s| s.3).map(|s| s.1.value()).collect();
    assert_eq!(resent, [100, 101, 102, 103]);
}

#[test]
fn the_controllers_window_bounds_packets_in_flight() {
    let mut r = rig(Some(2), None, None);
    write(&mut r, 8192);
    let first = drain_frames(&mut r.lo.a, &r.lo.mem_a, 0);
    assert_eq!(first.len(), 2, "two packets, then the window is full");
    // The second asks for an acknowledgement: nothing else would, before the timer.
    let bth = |f: &Vec<u8>| RoceRepr::parse(f, Checks::ALL).unwrap().repr.bth;
    assert!(!bth(&first[0]).ack_req && bth(&first[1]).ack_req);
    for f in &first {
        r.lo.b.handle_frame(0, f, &mut r.lo.mem_b).unwrap();
    }
    r.lo.run();
    assert_eq!(r.lo.a.poll_completion().unwrap().status, WcStatus::Success);
    assert_eq!(r.heard.lock().unwrap().sent.len(), 8);
}

#[test]
fn a_pacing_rate_spaces_request_packets() {
    // 1 GB/s: a packet of n bytes holds the next one back n ns.
    let mut r = rig(None, Some(1_000_000_000), None);
    write(&mut r, 3072);
    let mut buf = vec![0u8; 4096];
    let mut now = 0;
    let mut at = Vec::new();
    while at.len() < 3 {
        if let Some(n) = r.lo.a.poll_transmit(now, &mut buf, &r.lo.mem_a) {
            at.push((now, n));
            assert_eq!(
                r.lo.a.poll_transmit(now, &mut buf, &r.lo.mem_a),
                None,
                "paced"
            );
            now = r.lo.a.poll_timeout().unwrap();
            r.lo.a.handle_timeout(now);
        } else {
            panic!("nothing to send at {now}");
        }
    }
    assert_eq!(at[0].0, 0);
    assert_eq!(at[1].0, at[0].1 as u64);
    assert_eq!(at[2].0, (at[0].1 + at[1].1) as u64);
}

/// Sends packet `psn` from UDP source port `base + psn mod 3`.
#[derive(Debug)]
struct ThreeWays;

impl PathSelector for ThreeWays {
    fn name(&self) -> &'static str {
        "three-ways"
    }
    fn select(&mut self, base: Path, psn: Psn, _retransmission: bool) -> Path {
        Path {
            udp_src_port: base.udp_src_port + (psn.value() % 3) as u16,
            ..base
        }
    }
}

#[test]
fn the_path_selector_names_each_packets_udp_source_port() {
    let mut r = rig(None, None, Some(Box::new(ThreeWays)));
    write(&mut r, 5120);
    let frames = drain_frames(&mut r.lo.a, &r.lo.mem_a, 0);
    let ports: Vec<u16> = frames
        .iter()
        .map(|f| RoceRepr::parse(f, Checks::ALL).unwrap().repr.udp_src_port)
        .collect();
    let base = ports[0] - (100 % 3);
    let want: Vec<u16> = (100..105).map(|p| base + p % 3).collect();
    assert_eq!(ports, want);
    assert_eq!(r.lo.a.policy_names(), ["three-ways", "gbn", "recording"]);
}
