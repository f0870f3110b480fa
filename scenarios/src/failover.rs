//! `ferroce scenario failover`: SHIFT's experiment (seed 000, Figure 7) on the simulated
//! fabric in virtual time. Two hosts with two 100 Gbit/s NICs each on two rails; a
//! perftest-like WRITE stream (64 KiB messages, 32 outstanding, every 16th WR a FETCH_ADD on
//! a counter) on rail 0; a fault at 5 ms — a NIC on either side, a host link, the rail's
//! ToR, or a black hole that no link event announces — healed at 10 ms; the run ends at
//! 15 ms. Schemes: `native` (the QP moves to rail 1 with its transport state and comes back),
//! `shift` (SHIFT mode, `ferroce_reliability::failover::shift`: a default QP on rail 0, a backup and a
//! control QP on rail 1, WR-level resubmission after the default QP's retries run out; the
//! transport's own failover off), `varuna` (Varuna mode, `ferroce_reliability::failover::varuna`: the
//! vQP logs its WRITEs, runs the FETCH_ADDs as READ + CAS, and after the default QP's
//! retries run out recovers from the peer's completion log on a backup QP on rail 1; after
//! the repair it rebuilds its default QP (500 µs) and moves back once drained),
//! `r2ccl` (R2CCL, [`crate::r2ccl_side`]: the error told out of band, both ends probe each
//! other and a third node, a component blamed, the stream rolled back onto a backup QP) and
//! `none` (an RNIC without failover: the QP exhausts its retries and dies). The testbed has a
//! third host on both rails, idle but for R2CCL's probes.

use ferroce_drivers::sim::LinkModel;
use ferroce_reliability::failover::shift::{Rail, ShiftConfig};
use ferroce_reliability::failover::varuna::uid::CasBuffer;
use ferroce_reliability::failover::varuna::vqp::{VarunaConfig, VarunaQp};
use ferroce_stack::transport::{
    AttrMask, Payload, Qp, QpAttr, QpConfig, QpState, QpType, SendFlags, SendWr, Sge, WcOpcode,
    WcStatus, WorkCompletion, WrOpcode,
};
use ferroce_stack::wire::Qpn;
use ferroce_testbed::{rails_n, ConnOpts, RailQps, ShiftPair, Testbed, VarunaRails, PD};

use crate::r2ccl_side::{self, R2ccl};

const QPN: [u32; 2] = [0x10, 0x20];
/// Memory: the source message, the destination ring, the counter, the atomic results.
const SRC: usize = 0;
const DST: usize = 1 << 20;
const COUNTER: usize = 8 << 20;
const RESULTS: usize = (8 << 20) + 4096;
const MEM: usize = 16 << 20;

/// Where the fault is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Fault {
    /// The sender's NIC on rail 0.
    LocalNic,
    /// The receiver's NIC on rail 0.
    RemoteNic,
    /// The receiver's cable to the ToR of rail 0 (the ToR port goes down with it).
    Link,
    /// The ToR of rail 0.
    Tor,
    /// Rail 0 loses everything while every link stays up.
    Blackhole,
}

impl Fault {
    pub const ALL: [Self; 5] = [
        Self::LocalNic,
        Self::RemoteNic,
        Self::Link,
        Self::Tor,
        Self::Blackhole,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Self::LocalNic => "local-nic",
            Self::RemoteNic => "remote-nic",
            Self::Link => "link",
            Self::Tor => "tor",
            Self::Blackhole => "blackhole",
        }
    }
}

/// How the endpoints react.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Scheme {
    /// ferroce's native failover.
    Native,
    /// SHIFT mode (seed 000): WR-level resubmission on a backup QP.
    Shift,
    /// Varuna mode (seed 001): logged WRITEs, FETCH_ADD as READ + CAS, recovery from the
    /// completion log on a backup QP.
    Varuna,
    /// R2CCL (seed 003): out-of-band notice, probe triangulation, rollback to the first WR
    /// without a completion on a backup QP.
    R2ccl,
    /// No failover (an RNIC's RC QP).
    None,
}

impl Scheme {
    pub fn name(self) -> &'static str {
        match self {
            Self::Native => "native",
            Self::Shift => "shift",
            Self::Varuna => "varuna",
            Self::R2ccl => "r2ccl",
            Self::None => "none",
        }
    }
}

/// SHIFT's extra QPs: the backup and the control QP of each host, both on rail 1.
const BACKUP: [u32; 2] = [0x11, 0x21];
const CONTROL: [u32; 2] = [0x12, 0x22];
/// Their first PSNs (each host's send side first).
const PSNS: [[u32; 2]; 3] = [[1, 2], [11, 12], [21, 22]];

/// The rails' QPs as SHIFT mode and Varuna mode see them.
const RAIL_QPS: RailQps = RailQps {
    qpns: [QPN, BACKUP, CONTROL],
    psns: PSNS,
};

/// Host 0's vQP as Varuna mode sees it: its default and backup QPs, no pool.
fn varuna_io(w: &mut Testbed) -> VarunaRails<'_> {
    VarunaRails {
        w,
        h: 0,
        qpns: [QPN[0], BACKUP[0]],
        pool: None,
    }
}

/// Varuna's regions: at host 1 the completion log and the CAS buffer, at host 0 the
/// staging words; slots for twice the stream's depth.
const VARUNA_LOG: usize = 12 << 20;
const VARUNA_CAS: usize = (12 << 20) + 0x1000;
const VARUNA_STAGING: usize = 12 << 20;
const VARUNA_SLOTS: usize = 64;
/// Varuna: rebuilding the default QP on the repaired rail (creation, address exchange, state
/// transitions) before traffic goes back to it.
const VARUNA_REBUILD_NS: u64 = 500_000;

/// Host 0's completions since `seen`, with their times; `seen` moves past them.
fn completions_since(w: &Testbed, seen: &mut usize) -> Vec<(WorkCompletion, u64)> {
    let h = &w.hosts[0];
    let fresh: Vec<(WorkCompletion, u64)> = h.completions[*seen..]
        .iter()
        .copied()
        .zip(h.completed_at[*seen..].iter().copied())
        .collect();
    *seen += fresh.len();
    fresh
}

/// How long the end of a run waits for what is still out.
const DRAIN_NS: u64 = 50_000_000;

/// One run's parameters.
#[derive(Clone, Copy, Debug)]
pub struct Setup {
    pub scheme: Scheme,
    pub fault: Fault,
    pub gbps: f64,
    pub delay_ns: u64,
    pub size: usize,
    pub depth: usize,
    /// Local ACK timeout exponent: the detection threshold for a black hole.
    pub timeout: u8,
    pub fault_at: u64,
    pub heal_at: u64,
    pub end: u64,
    pub bin_ns: u64,
    pub seed: u64,
    /// Every n-th WR a FETCH_ADD (0: none).
    pub atomic_every: u64,
}

/// What one run measured.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    /// Bytes of WRITEs completed per bin.
    pub bins: Vec<u64>,
    /// From the fault to the QP's first move.
    pub detect_ns: Option<u64>,
    /// From the fault to the first completion after the move.
    pub failover_ns: Option<u64>,
    pub resent_bytes: u64,
    pub duplicates_executed: u64,
    pub atomics_ok: bool,
    pub verified: bool,
    pub completed: u64,
    pub errors: u64,
    pub migrations: u64,
    /// SHIFT: failures the retransmission-safety rule turned into errors (an atomic was
    /// outstanding).
    pub refused: u64,
    /// Varuna: completion-log and CAS-buffer bytes written.
    pub log_bytes: u64,
    /// R2CCL: the component blamed (`local-nic`, `remote-nic`, `link`, `tor`; `none` when
    /// every probe got through), and when (from the fault).
    pub localized: Option<&'static str>,
    pub localize_ns: Option<u64>,
}

fn is_atomic(s: &Setup, n: u64) -> bool {
    s.atomic_every > 0 && n % s.atomic_every == s.atomic_every - 1
}

/// WR `n` of the stream, handed to `post`.
fn post(w: &mut Testbed, s: &Setup, n: u64, post: impl FnOnce(&mut Testbed, &SendWr<'_>)) {
    let (lkey, rkey) = (w.hosts[0].keys.lkey, w.hosts[1].keys.rkey);
    if is_atomic(s, n) {
        let sge = [Sge {
            addr: (RESULTS + 8 * (n / s.atomic_every) as usize) as u64,
            length: 8,
            lkey,
        }];
        let mut wr = SendWr::new(n, WrOpcode::FetchAdd, Payload::Sges(&sge))
            .remote(COUNTER as u64, rkey)
            .flags(SendFlags::SIGNALED);
        wr.compare_add = 1;
        post(w, &wr);
    } else {
        let sge = [Sge {
            addr: SRC as u64,
            length: s.size as u32,
            lkey,
        }];
        let at = DST + (n as usize % s.depth) * s.size;
        let wr = SendWr::new(n, WrOpcode::Write, Payload::Sges(&sge))
            .remote(at as u64, rkey)
            .flags(SendFlags::SIGNALED);
        post(w, &wr);
    }
}

/// Runs one (scheme, fault).
pub fn run(s: &Setup) -> Outcome {
    let (mut w, r) = rails_n(
        s.seed,
        3,
        LinkModel::new((s.gbps * 1e9) as u64, s.delay_ns),
        MEM,
    );
    let o = ConnOpts {
        mtu: ferroce_stack::transport::Mtu::Mtu4096,
        timeout: s.timeout,
        ..ConnOpts::default()
    };
    let rails: &[(Rail, [u32; 2], usize)] = match s.scheme {
        Scheme::Shift => &[
            (Rail::Default, QPN, 0),
            (Rail::Backup, BACKUP, 1),
            (Rail::Control, CONTROL, 1),
        ],
        Scheme::Varuna | Scheme::R2ccl => &[(Rail::Default, QPN, 0), (Rail::Backup, BACKUP, 1)],
        Scheme::Native | Scheme::None => &[(Rail::Default, QPN, 0)],
    };
    for &(rail, qpns, port) in rails {
        for (h, &qpn) in qpns.iter().enumerate() {
            w.hosts[h].insert_qp(Qp::new(QpConfig::new(Qpn::new(qpn), QpType::Rc, PD)), port);
        }
        let p = PSNS[rail as usize];
        w.bring_up((0, qpns[0]), (1, qpns[1]), (p[0], p[1]), &o);
        w.bring_up((1, qpns[1]), (0, qpns[0]), (p[1], p[0]), &o);
    }
    if s.scheme == Scheme::R2ccl {
        // Probe QPs: short timers, so a probe fails in about 65 µs.
        let po = ConnOpts {
            timeout: 3,
            retry_cnt: 1,
            ..o
        };
        for ((ha, qa), (hb, qb)) in r2ccl_side::PROBE_PAIRS {
            w.connect_rc_on(0, ((ha, qa), (hb, qb)), (1, 2), &po);
        }
    }
    if s.scheme == Scheme::Native {
        w.set_alternate((0, QPN[0]), 1, (1, 1));
        w.set_alternate((1, QPN[1]), 0, (1, 1));
    }
    // SHIFT: host 0 leads (probes, starts the switch-back); a probe every 500 µs.
    let mut pair = (s.scheme == Scheme::Shift).then(|| {
        let config = |leader| ShiftConfig {
            probe_interval_ns: 500_000,
            leader,
        };
        ShiftPair::new(&mut w, RAIL_QPS, o, [config(true), config(false)])
    });
    let pattern: Vec<u8> = (0..s.size).map(|i| (i * 13 + 7) as u8).collect();
    w.hosts[0].write(SRC, &pattern);
    let (from, until) = (s.fault_at, s.heal_at);
    match s.fault {
        Fault::LocalNic => w.fabric.fail_port(r.hosts[0], 0, from, until),
        Fault::RemoteNic => w.fabric.fail_port(r.hosts[1], 0, from, until),
        Fault::Link => w.fabric.fail_link(r.links[1][0], from, until),
        Fault::Tor => w.fabric.fail_switch(r.tors[0], from, until),
        Fault::Blackhole => w.fabric.blackhole_link(r.links[0][0], from, until),
    }
    let mut out = Outcome {
        bins: vec![0; (s.end / s.bin_ns) as usize + 1],
        ..Outcome::default()
    };
    let (mut posted, mut done_n, mut fetch_adds) = (0u64, 0u64, 0u64);
    let mut moved_at: Option<u64> = None;
    let mut seen = 0usize;
    let shift = s.scheme == Scheme::Shift;
    let (lkey, rkey) = (w.hosts[0].keys.lkey, w.hosts[1].keys.rkey);
    let mut vqp = (s.scheme == Scheme::Varuna).then(|| {
        VarunaQp::new(VarunaConfig {
            slots: VARUNA_SLOTS,
            log_addr: VARUNA_LOG as u64,
            log_rkey: rkey,
            staging_addr: VARUNA_STAGING as u64,
            staging_lkey: lkey,
            cas: Some((
                CasBuffer {
                    base: VARUNA_CAS as u64,
                    slots: VARUNA_SLOTS as u32,
                    qp: 1,
                },
                rkey,
            )),
            uids: None,
        })
    });
    let mut seen_varuna = 0usize;
    // Varuna: the default QP rebuilt after the repair; traffic goes back once the vQP drained.
    let mut varuna_rebuilt = false;
    let mut r2 = (s.scheme == Scheme::R2ccl).then(|| R2ccl::new(QPN[0], BACKUP[0]));
    // What the application on host 0 sees: the QP's completions, or SHIFT's.
    let mut app: Vec<(WorkCompletion, u64)> = Vec::new();
    loop {
        let now = w.now();
        // At the end nothing new is posted and what is out completes (a bounded while), so
        // the atomics are counted exactly: every FETCH_ADD either completed or failed.
        if now >= s.end && (posted == done_n || now >= s.end + DRAIN_NS) {
            break;
        }
        let dead = if shift {
            pair.as_ref().is_some_and(|p| p.sides[0].failed())
        } else if let Some(v) = vqp.as_ref() {
            v.failed()
        } else if let Some(x) = r2.as_ref() {
            x.failed()
        } else {
            w.hosts[0].qp(QPN[0]).state() == QpState::Err
        };
        let draining_for_switch =
            varuna_rebuilt && vqp.as_ref().is_some_and(|v| v.rail() == Rail::Backup);
        while !dead
            && now < s.end
            && posted - done_n < s.depth as u64
            && r2.as_ref().is_none_or(R2ccl::may_post)
            && !draining_for_switch
        {
            if let Some(p) = pair.as_mut() {
                post(&mut w, s, posted, |w, wr| {
                    let _ = p.post_send(w, 0, wr);
                });
            } else if let Some(v) = vqp.as_mut() {
                post(&mut w, s, posted, |w, wr| {
                    let _ = v.post_send(&mut varuna_io(w), wr);
                });
            } else if let Some(x) = r2.as_mut() {
                post(&mut w, s, posted, |w, wr| {
                    let _ = x.post(w, wr);
                });
            } else {
                post(&mut w, s, posted, |w, wr| {
                    let _ = w.hosts[0].qp(QPN[0]).post_send(wr);
                });
            }
            posted += 1;
        }
        // SHIFT's probe timer is an event too.
        let end = if now >= s.end {
            s.end + DRAIN_NS
        } else {
            s.end
        };
        let horizon = pair
            .as_ref()
            .and_then(ShiftPair::next_timeout)
            .map_or(end, |t| t.clamp(now + 1, end));
        // A turn, then (SHIFT) its completions, which may post, before time moves.
        let sent = w.turn();
        let mut acted = false;
        if let Some(p) = pair.as_mut() {
            acted |= p.turn(&mut w);
            if moved_at.is_none() {
                moved_at = p.fell_back_at[0];
            }
            app.append(&mut p.shown[0]);
            p.shown[1].clear();
        }
        if let Some(x) = r2.as_mut() {
            let fresh = completions_since(&w, &mut seen_varuna);
            acted |= !fresh.is_empty();
            for (wc, at) in fresh {
                let shown = x.on_completion(&mut w, 0, &wc, at);
                app.extend(shown.into_iter().map(|c| (c, at)));
            }
            let now = w.now();
            acted |= x.poll(&mut w, now);
            if moved_at.is_none() && x.migrated() {
                moved_at = Some(now);
            }
        }
        if let Some(v) = vqp.as_mut() {
            // The repaired rail: rebuild the default QP pair, then move back when drained.
            let now = w.now();
            if v.rail() == Rail::Backup
                && !varuna_rebuilt
                && now >= until.saturating_add(VARUNA_REBUILD_NS)
            {
                let reset = QpAttr {
                    qp_state: QpState::Reset,
                    ..QpAttr::default()
                };
                for (h, &q) in QPN.iter().enumerate() {
                    let _ = w.hosts[h].qp(q).modify(&reset, AttrMask::STATE);
                }
                w.bring_up((0, QPN[0]), (1, QPN[1]), (31, 32), &o);
                w.bring_up((1, QPN[1]), (0, QPN[0]), (32, 31), &o);
                varuna_rebuilt = true;
                acted = true;
            }
            if varuna_rebuilt && v.rail() == Rail::Backup && v.switch_to(Rail::Default) {
                acted = true;
            }
            let fresh = completions_since(&w, &mut seen_varuna);
            acted |= !fresh.is_empty();
            for (wc, at) in fresh {
                let rail = if wc.qp_num.value() == QPN[0] {
                    Rail::Default
                } else {
                    Rail::Backup
                };
                let before = v.stats().failovers;
                let shown = v.on_completion(&mut varuna_io(&mut w), rail, &wc);
                if moved_at.is_none() && v.stats().failovers > before {
                    moved_at = Some(at);
                }
                app.extend(shown.into_iter().map(|c| (c, at)));
            }
        }
        // Varuna's rebuild after the repair is an event too.
        let horizon =
            if vqp.is_some() && !varuna_rebuilt && now < until.saturating_add(VARUNA_REBUILD_NS) {
                horizon.min(until.saturating_add(VARUNA_REBUILD_NS).clamp(now + 1, end))
            } else {
                horizon
            };
        // R2CCL's out-of-band messages are events too (set during this turn).
        let horizon = r2
            .as_ref()
            .and_then(R2ccl::next_timeout)
            .map_or(horizon, |t| horizon.min(t.clamp(now + 1, end)));
        let step = if sent > 0 || acted {
            ferroce_testbed::Step::Worked
        } else {
            w.advance(horizon)
        };
        match step {
            ferroce_testbed::Step::Worked | ferroce_testbed::Step::Advanced => {}
            // Nothing in flight and no timer: time still passes (a link may come back).
            ferroce_testbed::Step::Idle | ferroce_testbed::Step::Beyond => {
                let next = w.fabric.next_link_change().filter(|&c| c < horizon);
                w.fabric.advance_to(next.unwrap_or(horizon).max(now + 1));
            }
        }
        let t = w.now();
        if !shift && vqp.is_none() && r2.is_none() {
            if moved_at.is_none() && w.hosts[0].qp(QPN[0]).path_migrations() > 0 {
                moved_at = Some(t);
            }
            let host = &w.hosts[0];
            app.extend(
                host.completions[seen..]
                    .iter()
                    .copied()
                    .zip(host.completed_at[seen..].iter().copied()),
            );
            seen = host.completions.len();
        }
        for (wc, at) in app.drain(..) {
            done_n += 1;
            if wc.status != WcStatus::Success {
                out.errors += 1;
                continue;
            }
            out.completed += 1;
            if wc.opcode == WcOpcode::FetchAdd {
                fetch_adds += 1;
            } else if let Some(b) = out.bins.get_mut((at / s.bin_ns) as usize) {
                *b += s.size as u64;
            }
            if out.failover_ns.is_none() && moved_at.is_some_and(|m| at >= m) && at >= from {
                out.failover_ns = Some(at - from);
            }
        }
        if dead && posted == done_n {
            // The QP is gone; nothing more will happen on it.
            break;
        }
    }
    // Frames still out land (Varuna's last confirm: the application saw its FETCH_ADD
    // complete when the CAS did), so the counter is read settled.
    let now = w.now();
    w.drive_until(now + DRAIN_NS);
    out.detect_ns = moved_at.map(|m| m.saturating_sub(from));
    let qp = w.hosts[0].qp(QPN[0]);
    out.migrations = qp.path_migrations();
    out.resent_bytes = qp.counters().retransmitted_packets * 4096;
    if let Some(x) = r2.as_ref() {
        out.migrations = u64::from(x.migrated());
        out.resent_bytes = x.resent * s.size as u64
            + w.hosts[0].qp(BACKUP[0]).counters().retransmitted_packets * 4096;
        if let Some((blame, at)) = x.verdict {
            out.localized = Some(blame.map_or("none", |b| b.name()));
            out.localize_ns = Some(at.saturating_sub(from));
        }
    }
    if let Some(v) = vqp.as_ref() {
        let st = v.stats();
        out.migrations = st.failovers + st.switchbacks;
        // What the vQP sent again, and what the backup QP's transport resent on its own.
        out.resent_bytes = (st.resent_pre_failure + st.reads_reissued) * s.size as u64
            + w.hosts[0].qp(BACKUP[0]).counters().retransmitted_packets * 4096;
        out.log_bytes = st.log_bytes;
    }
    if let Some(p) = pair.as_ref() {
        let st = p.sides[0].stats();
        out.migrations = st.fallbacks + st.switchbacks;
        out.refused = st.refused;
        // WRs resubmitted, and what the backup QP's transport resent on its own.
        out.resent_bytes +=
            st.resent_bytes + w.hosts[0].qp(BACKUP[0]).counters().retransmitted_packets * 4096;
    }
    // Every FETCH_ADD that completed added 1 once: results 0..n, the counter at n (FETCH_ADDs
    // still in flight at the end may have executed too: the counter may be ahead by those).
    let atomics = posted.checked_div(s.atomic_every).unwrap_or(0);
    let mut results: Vec<u64> = (0..atomics)
        .map(|i| w.hosts[0].word(RESULTS + 8 * i as usize))
        .take(fetch_adds as usize)
        .collect();
    results.sort_unstable();
    let counter = w.hosts[1].word(COUNTER);
    let in_flight = atomics - fetch_adds;
    out.atomics_ok = results.windows(2).all(|p| p[0] != p[1])
        && results.iter().all(|&r| r < counter)
        && counter <= fetch_adds + in_flight;
    out.duplicates_executed = counter.saturating_sub(fetch_adds + in_flight)
        + results.windows(2).filter(|p| p[0] == p[1]).count() as u64;
    // The WRITE ring holds the pattern wherever a WRITE completed.
    let slots = (posted.min(s.depth as u64)) as usize;
    out.verified = (0..slots as u64)
        .filter(|&i| !is_atomic(s, i))
        .all(|i| w.hosts[1].read(DST + i as usize * s.size, s.size) == pattern)
        && (s.scheme == Scheme::None || out.errors == 0 || out.refused > 0);
    out
}
