//! A Varuna vQP between two hosts of the rails testbed: its default QP pair on rail 0, its
//! backup pair on rail 1; a rail is cut (or, on rail 0, only what host 1 sends: ACKs and
//! READ responses) with a switch hook on its ToR. The vQP's IO is the testbed's
//! `VarunaRails`.

use ferroce_drivers::sim::LinkModel;
use ferroce_drivers::Port;
use ferroce_reliability::failover::shift::Rail;
use ferroce_reliability::failover::varuna::uid::{CasBuffer, Uid, UidRegion, SLOT_BYTES};
use ferroce_reliability::failover::varuna::vqp::{VarunaConfig, VarunaQp};
use ferroce_stack::transport::{
    Access, AttrMask, Payload, PostError, QpAttr, QpState, SendFlags, SendWr, Sge, WcStatus,
    WorkCompletion, WrOpcode,
};
use ferroce_testbed::{rails, ConnOpts, Cut, Rails, Step, Testbed, VarunaRails};

const LEN: usize = 1 << 20;
/// The vQP's QPs on host 0 (default, backup) and their peers on host 1.
const QPN: [u32; 2] = [0x10, 0x11];
const PEER: [u32; 2] = [0x20, 0x21];
const LOG: u64 = 0xf_0000;
const SLOTS: usize = 64;
/// At the responder: the CAS buffer and the CAS target.
const CAS_BUF: u64 = 0xd_0000;
const TARGET: u64 = 0xc_0000;
/// At the requester: CAS results.
const RESULTS: u64 = 0x9_0000;

/// `FERROCE_SEED=N` replays one seed; `FERROCE_SEEDS=N` runs 0..N (default 64).
fn seeds() -> Vec<u64> {
    match std::env::var("FERROCE_SEED") {
        Ok(s) => vec![s.parse().expect("FERROCE_SEED is a number")],
        Err(_) => {
            (0..std::env::var("FERROCE_SEEDS").map_or(64, |n| n.parse().unwrap_or(64))).collect()
        }
    }
}

/// A xorshift stream from `seed` (`salt` keeps tests' streams apart).
fn xorshift(seed: u64, salt: u64) -> impl FnMut() -> u64 {
    let mut rng = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | salt;
    move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    }
}

struct Rig {
    w: Testbed,
    r: Rails,
    o: ConnOpts,
    vqp: VarunaQp,
    app: Vec<WorkCompletion>,
    /// Host 0's completions handed to the vQP so far.
    seen: usize,
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
        for rail in 0..2 {
            w.connect_rc_on(rail, ((0, QPN[rail]), (1, PEER[rail])), (0, 0), &o);
        }
        let (lkey, rkey) = (w.hosts[0].keys.lkey, w.hosts[1].keys.rkey);
        let vqp = VarunaQp::new(VarunaConfig {
            slots: SLOTS,
            log_addr: LOG,
            log_rkey: rkey,
            staging_addr: LOG,
            staging_lkey: lkey,
            cas: Some((
                CasBuffer {
                    base: CAS_BUF,
                    slots: 16,
                    qp: 0x10,
                },
                rkey,
            )),
            uids: Some(UidRegion {
                base: CAS_BUF,
                len: 0x1000,
                rkey,
            }),
        });
        Self {
            w,
            r,
            o,
            vqp,
            app: Vec::new(),
            seen: 0,
        }
    }

    fn io(&mut self) -> (&mut VarunaQp, VarunaRails<'_>) {
        (
            &mut self.vqp,
            VarunaRails {
                w: &mut self.w,
                h: 0,
                qpns: QPN,
                pool: None,
            },
        )
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

    /// Rail 0 loses only what host 1 sends (ACKs, READ responses).
    fn lose_acks(&mut self) {
        let mac = self.w.hosts[1].port(0).mac();
        self.w.fabric.set_hook(self.r.tors[0], Cut(Some(mac)));
    }

    /// Host 0's new completions to the vQP; true when there were any.
    fn hand_over(&mut self) -> bool {
        let fresh: Vec<WorkCompletion> = self.w.hosts[0].completions[self.seen..].to_vec();
        self.seen += fresh.len();
        for wc in &fresh {
            let rail = if wc.qp_num.value() == QPN[0] {
                Rail::Default
            } else {
                Rail::Backup
            };
            let (v, mut io) = self.io();
            let out = v.on_completion(&mut io, rail, wc);
            self.app.extend(out);
        }
        !fresh.is_empty()
    }

    /// One microsecond of virtual time.
    fn step(&mut self) {
        let target = self.w.now() + 1_000;
        loop {
            let sent = self.w.turn();
            if sent > 0 || self.hand_over() {
                continue;
            }
            let now = self.w.now();
            if now >= target {
                return;
            }
            match self.w.advance(target) {
                Step::Worked | Step::Advanced => {}
                Step::Idle | Step::Beyond => self.w.fabric.advance_to(target),
            }
        }
    }

    fn keys(&self, h: usize) -> (u32, u32) {
        (self.w.hosts[h].keys.lkey, self.w.hosts[h].keys.rkey)
    }

    /// Posts through the vQP a signaled one-sided `opcode` of `len` bytes between host 0's
    /// `local` and host 1's `remote`, set further by `tweak`.
    fn one_sided(
        &mut self,
        (id, opcode): (u64, WrOpcode),
        (local, len, remote): (u64, u32, u64),
        tweak: impl FnOnce(&mut SendWr<'_>),
    ) -> Result<(), PostError> {
        let sge = [Sge {
            addr: local,
            length: len,
            lkey: self.keys(0).0,
        }];
        let mut wr = SendWr::new(id, opcode, Payload::Sges(&sge))
            .remote(remote, self.keys(1).1)
            .flags(SendFlags::SIGNALED);
        tweak(&mut wr);
        let (v, mut io) = self.io();
        v.post_send(&mut io, &wr)
    }

    fn write(&mut self, id: u64, src: u64, dst: u64, len: u32) -> Result<(), PostError> {
        self.one_sided((id, WrOpcode::Write), (src, len, dst), |_| {})
    }

    fn read(&mut self, id: u64, dst: u64, src: u64, len: u32) -> Result<(), PostError> {
        self.one_sided((id, WrOpcode::Read), (dst, len, src), |_| {})
    }

    fn cas(&mut self, id: u64, result: u64, compare: u64, swap: u64) -> Result<(), PostError> {
        self.one_sided((id, WrOpcode::CmpSwp), (result, 8, TARGET), |wr| {
            wr.compare_add = compare;
            wr.swap = swap;
        })
    }

    fn word(&self, side: usize, at: u64) -> u64 {
        u64::from_le_bytes(self.read_mem(side, at, 8).try_into().unwrap())
    }

    fn read_mem(&self, side: usize, at: u64, len: usize) -> Vec<u8> {
        self.w.hosts[side].read(at as usize, len)
    }

    /// WRITEs executed by host 1's responders, log writes included.
    fn writes_executed(&mut self) -> u64 {
        PEER.iter()
            .map(|&q| self.w.hosts[1].qp(q).counters().rx_write_requests)
            .sum()
    }

    fn poke(&mut self, at: u64, v: u64) {
        self.w.hosts[1].write(at as usize, &v.to_le_bytes());
    }
}

/// Every logged WRITE adds one 8-byte completion-log WRITE behind it; with nothing failing
/// the vQP is the plain QP plus that.
#[test]
fn a_logged_write_costs_one_eight_byte_write() {
    let mut r = Rig::new();
    for i in 0..10 {
        r.write(i, 0, 0x1000 * i, 4096).unwrap();
    }
    for _ in 0..200 {
        r.step();
    }
    assert_eq!(
        r.app.iter().map(|c| c.wr_id).collect::<Vec<_>>(),
        (0..10).collect::<Vec<_>>()
    );
    assert_eq!(r.vqp.stats().log_bytes, 80);
    assert_eq!(r.writes_executed(), 20);
    // The completion log holds the ten entries.
    let log = r.read_mem(1, LOG, 80);
    assert!(log.chunks(8).all(|w| w != [0; 8]));
}

/// Seeded: WRITEs (each its own pattern and place) and READs, the default wire cut at a
/// random moment for good. Every WR completes successfully and in order, every byte is in
/// place, and no WRITE the completion log showed as executed ran again: the responder
/// executed at most 2 × (WRITEs + resent) WRITE messages (each with its log write), and
/// exactly that when no log write was lost after its request.
#[test]
fn random_cuts_resend_only_what_never_ran() {
    let seeds = seeds();
    let (mut post, mut pre) = (0, 0);
    for seed in seeds {
        let mut next = xorshift(seed, 1);
        let mut r = Rig::new();
        let src: Vec<u8> = (0..32 * 4096)
            .map(|i| (i as u64 * 13 + seed) as u8)
            .collect();
        r.w.hosts[0].write(0, &src);
        // Side 1's READ source.
        let far: Vec<u8> = (0..4096).map(|i| (i as u64 * 7 + seed) as u8).collect();
        r.w.hosts[1].write(0xe_0000, &far);
        let n = 40u64;
        let reads: Vec<bool> = (0..n).map(|_| next().is_multiple_of(4)).collect();
        let cut = next() % 60;
        let mut posted = 0;
        let mut step = 0u64;
        while r.app.len() < n as usize && step < 50_000 {
            // The cut: first only the responses (what is in flight then runs, its completion
            // is lost), a few steps later everything.
            if step == cut {
                r.lose_acks();
            }
            if step == cut + 3 {
                r.set_up(0, false);
            }
            if posted < n && r.vqp.outstanding() < 6 && next().is_multiple_of(3) {
                let i = posted;
                if reads[i as usize] {
                    r.read(i, 0x8_0000 + 4096 * i, 0xe_0000, 4096).unwrap();
                } else {
                    r.write(i, 4096 * (i % 32), 0x1_0000 + 4096 * i, 4096)
                        .unwrap();
                }
                posted += 1;
            }
            r.step();
            step += 1;
        }
        let ctx = format!(
            "seed {seed} (replay: FERROCE_SEED={seed}), cut at {cut}: {:?}",
            r.vqp.stats()
        );
        assert_eq!(
            r.app.iter().map(|c| c.wr_id).collect::<Vec<_>>(),
            (0..n).collect::<Vec<_>>(),
            "{ctx}"
        );
        assert!(r.app.iter().all(|c| c.status == WcStatus::Success), "{ctx}");
        for i in 0..n {
            if reads[i as usize] {
                assert_eq!(
                    r.read_mem(0, 0x8_0000 + 4096 * i, 4096),
                    far,
                    "{ctx}: READ {i}"
                );
            } else {
                let pat = &src[4096 * (i as usize % 32)..][..4096];
                assert_eq!(
                    r.read_mem(1, 0x1_0000 + 4096 * i, 4096),
                    pat,
                    "{ctx}: WRITE {i}"
                );
            }
        }
        let st = r.vqp.stats();
        let writes = reads.iter().filter(|&&x| !x).count() as u64;
        assert!(
            r.writes_executed() <= 2 * (writes + st.resent_pre_failure),
            "{ctx}"
        );
        post += st.recovered_post_failure;
        pre += st.resent_pre_failure;
    }
    // The cuts did land among WRITEs in flight: some ran (not resent), some did not.
    assert!(
        post > 0 && pre > 0,
        "post-failure {post}, pre-failure {pre}"
    );
}

/// The backup dead too: every WR errors out, nothing hangs.
#[test]
fn both_wires_dead_end_in_errors() {
    let mut r = Rig::new();
    for i in 0..4 {
        r.write(i, 0, 0x1000 * i, 4096).unwrap();
    }
    r.set_up(0, false);
    r.set_up(1, false);
    for _ in 0..20_000 {
        r.step();
        if r.app.len() == 4 {
            break;
        }
    }
    assert_eq!(r.app.len(), 4);
    assert!(r.app.iter().all(|c| c.status != WcStatus::Success));
}

/// A compare-and-swap chain — CAS(target, i, i + 1), each posted once the one before
/// completed, WRITEs streaming beside it — with the default wire cut at a random moment
/// (responses first). Every CAS reports success with the old value i, however the cut fell:
/// before it ran, after it ran and before its completion, between its occupy and its
/// confirm; and the target ends at the chain's length (each CAS ran once and was confirmed:
/// no UID left behind). A resend-only scheme would report a post-failure CAS as failed, or
/// run it twice.
#[test]
fn a_cas_chain_survives_a_cut_exactly_once() {
    let seeds = seeds();
    let (mut won, mut lost, mut resent) = (0, 0, 0);
    for seed in seeds {
        let mut next = xorshift(seed, 1);
        let mut r = Rig::new();
        let k = 12u64;
        let cut = 5 + next() % 80;
        // Half the cuts take both directions at once: a confirm posted just before can be
        // lost after its CAS completed (recovery posts it again).
        let at_once = next().is_multiple_of(2);
        let (mut cas_posted, mut writes_posted) = (0u64, 0u64);
        let mut step = 0u64;
        let done = |r: &Rig| r.app.iter().filter(|c| c.wr_id >= 1000).count() as u64;
        while done(&r) < k && step < 50_000 {
            if step == cut {
                r.lose_acks();
            }
            if step == cut + if at_once { 0 } else { 3 } {
                r.set_up(0, false);
            }
            // The chain: the next CAS once the last one completed.
            if cas_posted < k && done(&r) == cas_posted && next().is_multiple_of(2) {
                let i = cas_posted;
                r.cas(1000 + i, RESULTS + 8 * i, i, i + 1).unwrap();
                cas_posted += 1;
            }
            if writes_posted < 20 && r.vqp.outstanding() < 4 && next().is_multiple_of(3) {
                let i = writes_posted;
                r.write(i, 0, 0x1_0000 + 4096 * i, 4096).unwrap();
                writes_posted += 1;
            }
            r.step();
            step += 1;
        }
        for _ in 0..2_000 {
            r.step();
        }
        let st = r.vqp.stats();
        let ctx = format!(
            "seed {seed} (replay: FERROCE_SEED={seed}), cut at {cut} (at once: {at_once}): {st:?}"
        );
        assert_eq!(done(&r), k, "{ctx}");
        assert!(
            r.app.iter().all(|c| c.status == WcStatus::Success),
            "{ctx}: {:?}",
            r.app
        );
        for i in 0..k {
            assert_eq!(r.word(0, RESULTS + 8 * i), i, "{ctx}: CAS {i}'s old value");
        }
        assert_eq!(r.word(1, TARGET), k, "{ctx}: the target after the chain");
        won += st.cas_won;
        lost += st.cas_lost;
        resent += st.cas_resent;
    }
    eprintln!("recovered CASes: {won} won, {lost} lost, {resent} resent");
    assert!(won > 0 && resent > 0, "won {won}, resent {resent}");
    assert_eq!(lost, 0, "a chain's CAS never loses");
}

impl Rig {
    fn faa(&mut self, id: u64, result: u64, add: u64) -> Result<(), PostError> {
        self.one_sided((id, WrOpcode::FetchAdd), (result, 8, COUNTER), |wr| {
            wr.compare_add = add;
        })
    }
}

/// At the responder: the FETCH_ADD counter.
const COUNTER: u64 = 0xc_1000;

/// FETCH_ADDs as READ + CAS, posted in bursts among WRITEs (each FAA holds what follows it),
/// with the default wire cut at a random moment (responses first): every FAA completes
/// successfully, in posting order, the results are exactly 0..n (each ran once: none lost,
/// none doubled — whether the cut fell in its READ, between its CAS and the CAS's
/// completion, or between the occupy and the confirm), and the counter ends at n with no
/// UID left in it.
#[test]
fn fetch_adds_run_once_across_a_cut() {
    let seeds = seeds();
    let (mut won, mut resent, mut reread) = (0, 0, 0);
    for seed in seeds {
        let mut next = xorshift(seed, 3);
        let mut r = Rig::new();
        let n = 16u64;
        let cut = 5 + next() % 120;
        // Half the cuts take both directions at once (a CAS attempt in flight never runs),
        // half the responses first (it runs, its completion is lost).
        let at_once = next().is_multiple_of(2);
        let mut posted = 0u64;
        let mut step = 0u64;
        let mut order = Vec::new();
        while r.app.len() < 2 * n as usize && step < 50_000 {
            if step == cut {
                r.lose_acks();
            }
            if step == cut + if at_once { 0 } else { 3 } {
                r.set_up(0, false);
            }
            if posted < n && r.vqp.outstanding() < 8 && next().is_multiple_of(3) {
                let i = posted;
                r.faa(1000 + i, RESULTS + 8 * i, 1).unwrap();
                r.write(i, 0, 0x1_0000 + 4096 * i, 4096).unwrap();
                order.extend([1000 + i, i]);
                posted += 1;
            }
            r.step();
            step += 1;
        }
        for _ in 0..2_000 {
            r.step();
        }
        let st = r.vqp.stats();
        let ctx = format!(
            "seed {seed} (replay: FERROCE_SEED={seed}), cut at {cut} (at once: {at_once}): {st:?}"
        );
        assert_eq!(
            r.app.iter().map(|c| c.wr_id).collect::<Vec<_>>(),
            order,
            "{ctx}"
        );
        assert!(
            r.app.iter().all(|c| c.status == WcStatus::Success),
            "{ctx}: {:?}",
            r.app
        );
        assert!(r
            .app
            .iter()
            .filter(|c| c.wr_id >= 1000)
            .all(|c| c.opcode == ferroce_stack::transport::WcOpcode::FetchAdd));
        let mut seen: Vec<u64> = (0..n).map(|i| r.word(0, RESULTS + 8 * i)).collect();
        seen.sort_unstable();
        assert_eq!(seen, (0..n).collect::<Vec<_>>(), "{ctx}: FAA results");
        assert_eq!(r.word(1, COUNTER), n, "{ctx}: the counter");
        won += st.cas_won;
        resent += st.cas_resent;
        reread += st.reads_reissued;
    }
    eprintln!("recovered FAAs: {won} won, {resent} CAS resent, {reread} READs again");
    assert!(
        won > 0 && resent > 0 && reread > 0,
        "won {won}, resent {resent}, reread {reread}"
    );
}

/// After a failover, the default wire repaired and its QP pair rebuilt: the vQP moves back
/// only when quiescent, later WRITEs run on the default QP, and a second failure fails over
/// again (recovering from the same completion log).
#[test]
fn a_rebuilt_default_qp_takes_the_traffic_back() {
    let mut r = Rig::new();
    r.write(0, 0, 0x1_0000, 4096).unwrap();
    r.set_up(0, false);
    for _ in 0..5_000 {
        r.step();
        if r.app.len() == 1 {
            break;
        }
    }
    assert_eq!(r.app.len(), 1);
    assert_eq!(r.vqp.rail(), Rail::Backup);
    // Outstanding work: no move.
    r.write(1, 0, 0x1_1000, 4096).unwrap();
    assert!(
        !r.vqp.switch_to(Rail::Default),
        "not while a request is out"
    );
    for _ in 0..200 {
        r.step();
    }
    assert_eq!(r.app.len(), 2);
    // The rail comes back; the default pair is rebuilt (reset, connected afresh).
    r.set_up(0, true);
    let reset = QpAttr {
        qp_state: QpState::Reset,
        ..QpAttr::default()
    };
    r.w.hosts[0]
        .qp(QPN[0])
        .modify(&reset, AttrMask::STATE)
        .unwrap();
    r.w.hosts[1]
        .qp(PEER[0])
        .modify(&reset, AttrMask::STATE)
        .unwrap();
    let o = r.o;
    r.w.bring_up((0, QPN[0]), (1, PEER[0]), (0, 0), &o);
    r.w.bring_up((1, PEER[0]), (0, QPN[0]), (0, 0), &o);
    assert!(r.vqp.switch_to(Rail::Default));
    assert_eq!(r.vqp.stats().switchbacks, 1);
    let before = r.w.hosts[1].qp(PEER[0]).counters().rx_write_requests;
    r.write(2, 0, 0x1_2000, 4096).unwrap();
    for _ in 0..200 {
        r.step();
    }
    assert_eq!(r.app.len(), 3);
    assert!(r.app.iter().all(|c| c.status == WcStatus::Success));
    assert_eq!(
        r.w.hosts[1].qp(PEER[0]).counters().rx_write_requests - before,
        2,
        "the WRITE and its log write ran on the default QP"
    );
    // A second failure fails over again.
    r.set_up(0, false);
    r.write(3, 0, 0x1_3000, 4096).unwrap();
    for _ in 0..5_000 {
        r.step();
        if r.app.len() == 4 {
            break;
        }
    }
    assert_eq!(r.app.len(), 4);
    assert!(r.app.iter().all(|c| c.status == WcStatus::Success));
    assert_eq!(r.vqp.stats().failovers, 2);
    assert_eq!(r.read_mem(1, 0x1_3000, 4096), r.read_mem(0, 0, 4096));
}

/// Another requester's CAS buffer in the same region: its QP id and one of its slots.
const FOREIGN_QP: u16 = 0x77;
const FOREIGN_SLOT: u64 = CAS_BUF + 0x800 + 3 * SLOT_BYTES;

/// A FETCH_ADD finds another requester's UID in the counter — that requester occupied it
/// and never confirmed (it died) — with the default wire cut at a random moment or not at
/// all: it resolves the UID (the slot's value, the slot marked with the UID, the UID
/// swapped for the value in the owner's stead) and adds to the value, exactly once. Taken
/// as a number, the UID would have been added to.
#[test]
fn a_fetch_add_resolves_a_foreign_uid_exactly_once() {
    let foreign = CasBuffer {
        base: CAS_BUF + 0x800,
        slots: 16,
        qp: FOREIGN_QP,
    }
    .uid(3, 5);
    assert_eq!(foreign.slot_addr, FOREIGN_SLOT);
    for seed in seeds() {
        let mut next = xorshift(seed, 7);
        let mut r = Rig::new();
        r.poke(FOREIGN_SLOT, 1000);
        r.poke(FOREIGN_SLOT + 8, 0x1234);
        r.poke(COUNTER, foreign.to_word());
        let cut = if next().is_multiple_of(4) {
            u64::MAX
        } else {
            next() % 40
        };
        r.faa(1, RESULTS, 5).unwrap();
        r.faa(2, RESULTS + 8, 1).unwrap();
        let mut step = 0;
        while r.app.len() < 2 && step < 20_000 {
            if step == cut {
                r.lose_acks();
            }
            if step == cut.saturating_add(2) {
                r.set_up(0, false);
            }
            r.step();
            step += 1;
        }
        for _ in 0..2_000 {
            r.step();
        }
        let st = r.vqp.stats();
        let ctx = format!("seed {seed} (replay: FERROCE_SEED={seed}), cut at {cut}: {st:?}");
        assert_eq!(r.app.len(), 2, "{ctx}");
        assert!(r.app.iter().all(|c| c.status == WcStatus::Success), "{ctx}");
        assert_eq!(r.word(0, RESULTS), 1000, "{ctx}: the first FAA's old value");
        assert_eq!(r.word(0, RESULTS + 8), 1005, "{ctx}: the second's");
        assert_eq!(r.word(1, COUNTER), 1006, "{ctx}: the counter");
        assert_eq!(
            r.word(1, FOREIGN_SLOT + 8),
            foreign.to_word(),
            "{ctx}: the mark"
        );
        assert!(st.uids_resolved >= 1, "{ctx}");
    }
}

/// This vQP's CAS wins, its completion is lost, and before its recovery reads the target
/// another requester resolves the UID (marks the slot, swaps in the value): recovery finds
/// the mark and counts the CAS as won — the old value is `compare`, nothing is resent.
/// Without the mark it would see a logged CAS without its UID in the target: lost.
#[test]
fn a_cas_resolved_by_another_still_counts_as_won() {
    let mut r = Rig::new();
    r.lose_acks();
    r.cas(9, RESULTS, 0, 77).unwrap();
    let mut step = 0;
    while r.word(1, TARGET) == 0 && step < 100 {
        r.step();
        step += 1;
    }
    let uid = r.word(1, TARGET);
    assert_ne!(uid, 0, "the occupy landed");
    // The helper: the mark first, then the value for the UID.
    let slot = Uid::from_word(uid).slot_addr;
    r.poke(slot + 8, uid);
    r.poke(TARGET, 77);
    r.set_up(0, false);
    while r.app.is_empty() && step < 20_000 {
        r.step();
        step += 1;
    }
    let st = r.vqp.stats();
    assert_eq!(r.app.len(), 1, "{st:?}");
    assert_eq!(r.app[0].status, WcStatus::Success);
    assert_eq!(r.word(0, RESULTS), 0, "the old value is compare: {st:?}");
    assert_eq!(r.word(1, TARGET), 77);
    assert_eq!(
        (st.cas_won, st.cas_won_resolved, st.cas_resent),
        (1, 1, 0),
        "{st:?}"
    );
}
