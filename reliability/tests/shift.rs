//! SHIFT mode between two hosts of the rails testbed: each host's default QP on rail 0,
//! its backup and control QPs on rail 1, driven by the testbed's `ShiftPair`; a rail is cut
//! (or one direction of it) with a switch hook on its ToR. Fallback with the handshake,
//! skipping SENDs whose acknowledgement was lost, the safety rule, probing and switch-back
//! with the fence.

use ferroce_drivers::sim::LinkModel;
use ferroce_drivers::Port;
use ferroce_reliability::failover::shift::{RecvState, SendState, ShiftConfig, NO_RESEND};
use ferroce_stack::transport::{
    Access, Payload, RecvWr, SendFlags, SendWr, Sge, WcStatus, WorkCompletion, WrOpcode,
};
use ferroce_testbed::{rails, ConnOpts, Cut, RailQps, Rails, ShiftPair, Step, Testbed};

const LEN: usize = 1 << 20;

/// Each rail's QP pair (default, backup, control) and first PSNs.
const QPS: RailQps = RailQps {
    qpns: [[0x10, 0x20], [0x11, 0x21], [0x12, 0x22]],
    psns: [[0, 0], [0, 0], [0, 0]],
};

/// Two hosts on two rails, SHIFT mode on both (host 0 leads, a probe every 200 µs), 1 MiB
/// registered on each, a fast retry budget (an error after three tries of 8 µs).
struct Rig {
    w: Testbed,
    r: Rails,
    pair: ShiftPair,
}

impl Rig {
    fn new() -> Self {
        let (mut w, r) = rails(1, LinkModel::new(100_000_000_000, 500), LEN);
        let o = ConnOpts {
            timeout: 1,
            retry_cnt: 2,
            access: Access::REMOTE_WRITE
                .with(Access::REMOTE_READ)
                .with(Access::REMOTE_ATOMIC),
            ..ConnOpts::default()
        };
        for (rail, port) in [(0, 0), (1, 1), (2, 1)] {
            let [a, b] = QPS.qpns[rail];
            let [pa, pb] = QPS.psns[rail];
            w.connect_rc_on(port, ((0, a), (1, b)), (pa, pb), &o);
        }
        let config = |leader| ShiftConfig {
            probe_interval_ns: 200_000,
            leader,
        };
        let pair = ShiftPair::new(&mut w, QPS, o, [config(true), config(false)]);
        Self { w, r, pair }
    }

    /// What host `s`'s side gave its application so far.
    fn app(&self, s: usize) -> Vec<WorkCompletion> {
        self.pair.shown[s].iter().map(|x| x.0).collect()
    }

    /// Rail `wire` carries frames (`up`) or loses them all.
    fn set_up(&mut self, wire: usize, up: bool) {
        let tor = self.r.tors[wire];
        if up {
            self.w.fabric.clear_hook(tor);
        } else {
            self.w.fabric.set_hook(tor, Cut(None));
        }
    }

    /// Rail `wire` loses the frames host `s` sends on it (one direction only).
    fn drop_from(&mut self, s: usize, wire: usize) {
        let mac = self.w.hosts[s].port(wire).mac();
        self.w.fabric.set_hook(self.r.tors[wire], Cut(Some(mac)));
    }

    /// One microsecond of virtual time: frames, timers, completions handed to the sides,
    /// their probes.
    fn step(&mut self) {
        let target = self.w.now() + 1_000;
        loop {
            let sent = self.w.turn();
            let acted = self.pair.turn(&mut self.w);
            if sent > 0 || acted {
                continue;
            }
            let now = self.w.now();
            if now >= target {
                return;
            }
            let horizon = self
                .pair
                .next_timeout()
                .map_or(target, |t| t.clamp(now + 1, target));
            match self.w.advance(horizon) {
                Step::Worked | Step::Advanced => {}
                Step::Idle | Step::Beyond => self.w.fabric.advance_to(horizon),
            }
        }
    }

    fn run_until(&mut self, limit_us: u64, mut done: impl FnMut(&Self) -> bool) -> bool {
        for _ in 0..limit_us {
            if done(self) {
                return true;
            }
            self.step();
        }
        done(self)
    }

    fn post_send(&mut self, s: usize, wr: &SendWr<'_>) {
        self.pair.post_send(&mut self.w, s, wr).unwrap();
    }

    fn write(&mut self, id: u64, at: u64, len: u32) {
        let sge = [Sge {
            addr: 0,
            length: len,
            lkey: self.w.hosts[0].keys.lkey,
        }];
        let wr = SendWr::new(id, WrOpcode::Write, Payload::Sges(&sge))
            .remote(at, self.w.hosts[1].keys.rkey)
            .flags(SendFlags::SIGNALED);
        self.post_send(0, &wr);
    }

    fn send(&mut self, id: u64, len: u32) {
        let sge = [Sge {
            addr: 0,
            length: len,
            lkey: self.w.hosts[0].keys.lkey,
        }];
        let wr = SendWr::new(id, WrOpcode::Send, Payload::Sges(&sge)).flags(SendFlags::SIGNALED);
        self.post_send(0, &wr);
    }

    fn recv(&mut self, id: u64, at: u64, len: u32) {
        let sge = [Sge {
            addr: at,
            length: len,
            lkey: self.w.hosts[1].keys.lkey,
        }];
        let wr = RecvWr {
            wr_id: id,
            sg_list: &sge,
        };
        self.pair.post_recv(&mut self.w, 1, &wr).unwrap();
    }

    fn read_b(&self, at: u64, len: usize) -> Vec<u8> {
        self.w.hosts[1].read(at as usize, len)
    }

    fn fill_a(&mut self, len: usize, seed: u8) -> Vec<u8> {
        let data: Vec<u8> = (0..len)
            .map(|i| (i as u8).wrapping_mul(31) ^ seed)
            .collect();
        self.w.hosts[0].write(0, &data);
        data
    }
}

fn ids(wcs: &[WorkCompletion]) -> Vec<u64> {
    wcs.iter().map(|c| c.wr_id).collect()
}

/// Rail 0 fails under WRITEs and SENDs: side 0 gets its error, falls back with the
/// handshake, and every WR completes successfully on the backup — in order, each SEND
/// received once — with nothing reported as an error.
#[test]
fn a_failed_default_rail_falls_back_and_every_wr_completes() {
    let mut r = Rig::new();
    let data = r.fill_a(8192, 7);
    for i in 0..6 {
        r.recv(100 + i, 0x1_0000 + 8192 * i, 8192);
    }
    for i in 0..6 {
        r.write(i * 2, 0x8_0000 + 8192 * i, 8192);
        r.send(i * 2 + 1, 8192);
    }
    r.step();
    r.set_up(0, false);
    assert!(r.run_until(5_000, |r| r.app(0).len() == 12 && r.app(1).len() == 6));
    assert!(
        r.app(0).iter().all(|c| c.status == WcStatus::Success),
        "{:?}",
        r.app(0)
    );
    assert_eq!(ids(&r.app(0)), (0..12).collect::<Vec<_>>());
    assert_eq!(ids(&r.app(1)), (100..106).collect::<Vec<_>>());
    for i in 0..6 {
        assert_eq!(r.read_b(0x8_0000 + 8192 * i, 8192), data);
        assert_eq!(r.read_b(0x1_0000 + 8192 * i, 8192), data);
    }
    for s in 0..2 {
        assert_eq!(
            r.pair.sides[s].send_state(),
            SendState::Fallback,
            "side {s}"
        );
        assert_eq!(
            r.pair.sides[s].recv_state(),
            RecvState::Fallback,
            "side {s}"
        );
        assert_eq!(r.pair.sides[s].stats().fallbacks, 1, "side {s}");
    }
    assert!(r.pair.sides[0].stats().resent_wrs > 0);
}

/// A SEND arrived but its acknowledgement was lost (side 1's frames on rail 0 are dropped):
/// the peer's receive counter says so, and side 0 completes it without a resend and resends
/// only those that did not arrive, so no receive is consumed twice.
#[test]
fn sends_whose_acks_were_lost_are_not_sent_again() {
    let mut r = Rig::new();
    r.fill_a(1024, 3);
    for i in 0..4 {
        r.recv(100 + i, 0x1_0000 + 1024 * i, 1024);
    }
    r.drop_from(1, 0);
    for i in 0..3 {
        r.send(i, 1024);
    }
    // The SENDs land; their ACKs do not: side 0's retries run out.
    assert!(r.run_until(5_000, |r| r.app(0).len() == 3));
    assert!(
        r.app(0).iter().all(|c| c.status == WcStatus::Success),
        "{:?}",
        r.app(0)
    );
    // Without ACKs the requester has no receive credits and sends one SEND at a time: the
    // first arrived, the others did not; the counter tells them apart.
    let st = r.pair.sides[0].stats();
    assert_eq!((st.skipped_wrs, st.resent_wrs), (1, 2), "{st:?}");
    // Exactly three receives were used; the fourth still waits (on the backup now).
    assert_eq!(ids(&r.app(1)), [100, 101, 102]);
    r.send(3, 1024);
    assert!(r.run_until(5_000, |r| r.app(1).len() == 4));
    assert_eq!(r.app(1)[3].wr_id, 103);
}

/// An atomic outstanding when the default rail fails: the safety rule fails every
/// outstanding WR back to the application instead of resending (SHIFT must not run an
/// atomic twice); so does a WR the application marked NO_RESEND.
#[test]
fn an_outstanding_atomic_or_hinted_wr_fails_instead_of_resending() {
    for hinted in [false, true] {
        let mut r = Rig::new();
        r.write(0, 0x8_0000, 4096);
        let res = [Sge {
            addr: 0x100,
            length: 8,
            lkey: r.w.hosts[0].keys.lkey,
        }];
        let wr = if hinted {
            SendWr::new(1, WrOpcode::Write, Payload::Sges(&res))
                .remote(0x9_0000, r.w.hosts[1].keys.rkey)
                .flags(SendFlags(SendFlags::SIGNALED.0 | NO_RESEND.0))
        } else {
            let mut wr = SendWr::new(1, WrOpcode::FetchAdd, Payload::Sges(&res))
                .remote(0x9_0000, r.w.hosts[1].keys.rkey)
                .flags(SendFlags::SIGNALED);
            wr.compare_add = 1;
            wr
        };
        r.post_send(0, &wr);
        r.set_up(0, false);
        assert!(
            r.run_until(5_000, |r| r.app(0).len() == 2),
            "hinted {hinted}"
        );
        assert!(
            r.app(0).iter().all(|c| c.status != WcStatus::Success),
            "{:?}",
            r.app(0)
        );
        assert!(r.pair.sides[0].failed());
        assert_eq!(r.pair.sides[0].stats().refused, 1);
        assert_eq!(r.pair.sides[0].stats().resent_wrs, 0);
    }
}

/// The default rail comes back: a probe succeeds, the next signaled WR is the fence on the
/// backup, later WRs wait, and after the fence completes the traffic is on the default QP
/// again (both directions), every WRITE in place.
#[test]
fn after_a_good_probe_the_fence_brings_traffic_home() {
    let mut r = Rig::new();
    let data = r.fill_a(4096, 9);
    r.set_up(0, false);
    for i in 0..4 {
        r.write(i, 0x8_0000 + 4096 * i, 4096);
    }
    assert!(r.run_until(5_000, |r| r.app(0).len() == 4));
    assert_eq!(r.pair.sides[0].send_state(), SendState::Fallback);
    r.set_up(0, true);
    // A stream keeps two WRITEs outstanding; the next probe (every 200 µs) succeeds while
    // some are on the backup, so the next signaled WR is the fence (WaitSignaled), the ones
    // after it are held (WaitDrained) until it completes, and then go on the default QP.
    let mut next = 4;
    let mut states = Vec::new();
    for _ in 0..3_000 {
        if r.pair.sides[0].outstanding_sends() < 2 {
            r.write(next, 0x8_0000 + 4096 * (next % 8), 4096);
            next += 1;
        }
        let st = r.pair.sides[0].send_state();
        if states.last() != Some(&st) {
            states.push(st);
        }
        if st == SendState::Default && states.len() > 1 {
            break;
        }
        r.step();
    }
    assert_eq!(
        states,
        [
            SendState::Fallback,
            SendState::WaitDrained,
            SendState::Default
        ],
        "(WaitSignaled lasts until the next post, within one step)"
    );
    assert!(r.run_until(2_000, |r| r.app(0).len() == next as usize));
    assert_eq!(ids(&r.app(0)), (0..next).collect::<Vec<_>>());
    assert!(r.app(0).iter().all(|c| c.status == WcStatus::Success));
    assert_eq!(r.pair.sides[0].send_state(), SendState::Default);
    assert_eq!(r.pair.sides[0].stats().switchbacks, 1);
    // The receiver went home too, and its own (empty) send direction.
    assert!(r.run_until(2_000, |r| r.pair.sides[1].send_state()
        == SendState::Default
        && r.pair.sides[1].recv_state() == RecvState::Default));
    for i in 0..8 {
        assert_eq!(r.read_b(0x8_0000 + 4096 * i, 4096), data);
    }
    // And the default rail carries the next WRITE.
    let sent = r.w.hosts[0].qp(0x10).counters().tx_packets;
    let n = r.app(0).len();
    r.write(next, 0x8_0000, 4096);
    assert!(r.run_until(2_000, |r| r.app(0).len() == n + 1));
    assert!(r.w.hosts[0].qp(0x10).counters().tx_packets > sent);
}

/// Both rails dead: the fallback's notify fails too, and every WR errors out in bounded
/// time instead of hanging.
#[test]
fn both_rails_dead_end_in_errors() {
    let mut r = Rig::new();
    for i in 0..3 {
        r.write(i, 0x8_0000 + 4096 * i, 4096);
    }
    r.set_up(0, false);
    r.set_up(1, false);
    assert!(r.run_until(20_000, |r| r.app(0).len() == 3));
    assert!(r.app(0).iter().all(|c| c.status != WcStatus::Success));
    assert!(r.pair.sides[0].failed());
}

/// Seeded runs: WRITEs (each its own pattern and slot) and SENDs into posted receives,
/// streamed from side 0, while rail 0 goes down and comes back at random moments (rail 1
/// stays up). Every WR completes successfully and in order, every SEND lands in the next
/// receive exactly once, every WRITE's bytes are in place. `FERROCE_SEED=N` replays one,
/// `FERROCE_SEEDS=N` runs seeds 0..N (default 64).
#[test]
fn random_faults_on_the_default_rail_lose_nothing() {
    let seeds: Vec<u64> = match std::env::var("FERROCE_SEED") {
        Ok(s) => vec![s.parse().expect("FERROCE_SEED is a number")],
        Err(_) => {
            (0..std::env::var("FERROCE_SEEDS").map_or(64, |n| n.parse().unwrap_or(64))).collect()
        }
    };
    let (runs, mut fallbacks, mut switchbacks) = (seeds.len() as u64, 0, 0);
    for seed in seeds {
        let mut rng = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let mut r = Rig::new();
        // Source: 64 patterns of 2 KiB.
        let src: Vec<u8> = (0..64 * 2048)
            .map(|i| (i as u64 * 7 + seed) as u8)
            .collect();
        r.w.hosts[0].write(0, &src);
        let n = 48u64;
        let kinds: Vec<bool> = (0..n).map(|_| next() % 3 == 0).collect(); // true: SEND
        let sends = kinds.iter().filter(|&&k| k).count() as u64;
        for i in 0..sends {
            r.recv(1000 + i, 0x4_0000 + 2048 * i, 2048);
        }
        // Faults: rail 0 down and up, one to three times, over the first 3 ms.
        let mut events: Vec<(u64, bool)> = Vec::new();
        let mut t = next() % 300;
        for _ in 0..1 + next() % 3 {
            events.push((t, false));
            t += 50 + next() % 600;
            events.push((t, true));
            t += 50 + next() % 600;
        }
        let (mut posted, mut send_no) = (0u64, 0u64);
        let mut step_no = 0u64;
        while r.app(0).len() < n as usize && step_no < 60_000 {
            for &(at, up) in &events {
                if at == step_no {
                    r.set_up(0, up);
                }
            }
            if posted < n && r.pair.sides[0].outstanding_sends() < 4 && next() % 48 == 0 {
                let sge = [Sge {
                    addr: 2048 * (posted % 64),
                    length: 2048,
                    lkey: r.w.hosts[0].keys.lkey,
                }];
                let wr = if kinds[posted as usize] {
                    send_no += 1;
                    SendWr::new(posted, WrOpcode::Send, Payload::Sges(&sge))
                } else {
                    SendWr::new(posted, WrOpcode::Write, Payload::Sges(&sge))
                        .remote(0x8_0000 + 2048 * posted, r.w.hosts[1].keys.rkey)
                }
                .flags(SendFlags::SIGNALED);
                r.post_send(0, &wr);
                posted += 1;
            }
            r.step();
            step_no += 1;
        }
        let ctx = format!("seed {seed} (replay: FERROCE_SEED={seed})");
        let ctx = format!(
            "{ctx}; events {events:?}; side 0 {:?}/{:?} {:?}, side 1 {:?}/{:?} {:?}; outstanding {}",
            r.pair.sides[0].send_state(),
            r.pair.sides[0].recv_state(),
            r.pair.sides[0].stats(),
            r.pair.sides[1].send_state(),
            r.pair.sides[1].recv_state(),
            r.pair.sides[1].stats(),
            r.pair.sides[0].outstanding_sends()
        );
        assert_eq!(send_no, sends, "{ctx}");
        assert!(
            r.run_until(20_000, |r| r.app(1).len() == sends as usize),
            "{ctx}: receives {:?}",
            ids(&r.app(1))
        );
        assert_eq!(ids(&r.app(0)), (0..n).collect::<Vec<_>>(), "{ctx}");
        assert!(
            r.app(0).iter().all(|c| c.status == WcStatus::Success),
            "{ctx}: {:?}",
            r.app(0)
        );
        assert_eq!(
            ids(&r.app(1)),
            (1000..1000 + sends).collect::<Vec<_>>(),
            "{ctx}"
        );
        let mut k = 0;
        for i in 0..n {
            let pat = &src[2048 * (i as usize % 64)..][..2048];
            if kinds[i as usize] {
                assert_eq!(r.read_b(0x4_0000 + 2048 * k, 2048), pat, "{ctx}: SEND {i}");
                k += 1;
            } else {
                assert_eq!(r.read_b(0x8_0000 + 2048 * i, 2048), pat, "{ctx}: WRITE {i}");
            }
        }
        fallbacks += r.pair.sides[0].stats().fallbacks;
        switchbacks += r.pair.sides[0].stats().switchbacks;
    }
    // The faults did hit traffic: most runs fell back, and came home.
    eprintln!("{runs} runs: {fallbacks} fallbacks, {switchbacks} switch-backs");
    assert!(
        fallbacks >= runs / 2 && switchbacks >= runs / 2,
        "{fallbacks} {switchbacks}"
    );
}
