//! Themis (seed 002) as the paper built it: logic in the ToR switches in front of commodity
//! RNICs that run RNIC-SR, here as a [`SwitchHook`] of the simulated fabric, so the paper's own
//! setup runs beside ferroce's endpoint selective repeat on the same workload.
//!
//! One [`ThemisTor`] per ToR plays both roles:
//!
//! - Themis-S, on requests coming up from a local host towards another rack: PSN-based
//!   spraying over the uplinks, `path = (PSN mod N + base) mod N` with `base` the uplink ECMP
//!   would have picked; the PSN a NACK last named goes another way (retransmission
//!   rerouting); a path flagged by a path-avoidance signal is skipped for a window of packets.
//! - Themis-D, on requests going down to a local host and on NACKs coming up from it: a proxy
//!   bitmap of the PSNs handed to the host and the highest PSN seen per path. A NACK whose
//!   expected PSN the host already has is invalid and dropped; one whose path has since
//!   carried a later PSN is valid and passes; any other is undetermined: it is stashed (one
//!   per QP) and released when a later PSN on its path arrives, discarded when its own PSN
//!   arrives, and released with the path-avoidance bit set when the out-of-order degree
//!   passes a threshold.
//!
//! Departures from the Tofino prototype, none of which changes a decision: a stashed NACK is
//! kept whole and sent again as it was (a switch keeps only the ePSN and rebuilds the packet
//! from a mirror); the proxy bitmap is a ring of PSN tags rather than the double-length
//! bitmap of Appendix A (same answers, no clearing); state is keyed by the address pair of the
//! connection, because data packets name the receiver's QPN and NACKs the sender's (the
//! prototype maps them through a control-plane table) — so one RC connection per host pair;
//! and the hook runs as the frame enters the switch, not after egress queuing (the
//! scenario's host links do not drop).
//!
//! The path-avoidance signal is bit 0 of BTH byte 4 (resv8a), which the ICRC masks, so
//! setting and clearing it needs no CRC update.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use ferroce_stack::switch::{HookCtx, SwitchHook, Verdict};
use ferroce_stack::wire::{Checks, IpRepr, NakCode, Opcode, Psn, RoceRepr, Syndrome, Transport};

/// The BTH byte-4 bit Themis-D sets on a NACK to tell Themis-S to avoid a path.
pub const AVOID_SIGNAL: u8 = 0x01;

/// Themis' knobs, with the paper's testbed values as defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ThemisConfig {
    /// Equal-cost paths between racks (`N` in the spraying formula).
    pub paths: u16,
    /// The senders' TX window in packets: the proxy bitmap covers twice this.
    pub window: u32,
    /// Out-of-order degree (PSN minus stashed ePSN) past which a path is declared bad.
    pub ooo_threshold: u32,
    /// Packets a bad path is skipped for.
    pub avoidance_window: u32,
    /// Seed of the random alternative paths.
    pub seed: u64,
}

impl Default for ThemisConfig {
    fn default() -> Self {
        Self {
            paths: 2,
            window: 512,
            ooo_threshold: 448,
            avoidance_window: 2_000_000,
            seed: 0x7e31,
        }
    }
}

ferroce_stack::counter_set! {
    /// What one ToR's Themis did; the hook counts into [`SharedStats`].
    pub struct ThemisStats, atomic SharedStats {
        /// Requests Themis-S steered by PSN.
        sprayed,
        /// Retransmissions sent away from their designated path.
        rerouted,
        /// Requests moved off a path under avoidance.
        avoided,
        /// NACKs passed as valid.
        nacks_valid,
        /// NACKs dropped as invalid (their PSN had reached the host).
        nacks_invalid,
        /// NACKs stashed as undetermined.
        nacks_stashed,
        /// Stashed NACKs released because a later PSN on their path arrived.
        stash_released,
        /// Stashed NACKs discarded because their PSN arrived (or a later NACK replaced them).
        stash_discarded,
        /// Stashed NACKs released with the path-avoidance signal.
        avoidance_signals,
        /// Path-avoidance signals Themis-S acted on.
        paths_avoided,
    }
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// Connection key: (data sender's address, data receiver's address).
type Conn = ([u8; 16], [u8; 16]);

#[derive(Debug)]
struct Source {
    /// The uplink index ECMP gives the connection.
    base: usize,
    last_nack: Option<Psn>,
    /// Per uplink: packets still to steer elsewhere.
    avoid: Vec<u32>,
}

#[derive(Debug)]
struct Dest {
    /// Proxy bitmap as a ring of PSN tags: slot `psn mod len` holds the last PSN delivered
    /// there, so "delivered" is an equality test and nothing needs clearing.
    seen: Box<[u32]>,
    path_max: Vec<Option<Psn>>,
    /// The undetermined NACK held back: its ePSN, the frame, and where its BTH starts.
    stash: Option<(Psn, Vec<u8>, usize)>,
}

impl Dest {
    fn delivered(&self, psn: Psn) -> bool {
        self.seen[psn.value() as usize % self.seen.len()] == psn.value()
    }
}

/// Themis-S and Themis-D in one ToR switch hook.
#[derive(Debug)]
pub struct ThemisTor {
    cfg: ThemisConfig,
    src: HashMap<Conn, Source>,
    dst: HashMap<Conn, Dest>,
    out: Vec<Vec<u8>>,
    stats: Arc<SharedStats>,
    rng: u64,
}

/// A parsed frame as Themis needs it.
struct Seen {
    psn: Psn,
    nak: bool,
    request: bool,
    conn: Conn,
    bth_at: usize,
}

impl ThemisTor {
    /// A ToR with `cfg`.
    pub fn new(cfg: ThemisConfig) -> Self {
        Self {
            rng: cfg.seed ^ 0x9e37_79b9_7f4a_7c15,
            cfg: ThemisConfig {
                paths: cfg.paths.max(1),
                ..cfg
            },
            src: HashMap::new(),
            dst: HashMap::new(),
            out: Vec::new(),
            stats: Arc::default(),
        }
    }

    /// The counters, readable while the fabric owns the hook.
    pub fn stats(&self) -> Arc<SharedStats> {
        Arc::clone(&self.stats)
    }

    /// SplitMix64: cheap, and reproducible from the seed.
    fn next_random(&mut self) -> u64 {
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn classify(frame: &[u8]) -> Option<Seen> {
        let pkt = RoceRepr::parse(frame, Checks::NONE).ok()?;
        let bth = pkt.repr.bth;
        // Data is RC requests and the placed WRITEs of an adaptive-routing sender (ferroce's
        // SR opcodes: a RETH in every packet, as ConnectX-7's AR mode sends them).
        let placed = bth.opcode.is_selective_repeat() && bth.opcode != Opcode::SR_ACKNOWLEDGE;
        if bth.opcode.transport() != Transport::Rc && !placed {
            return None;
        }
        let response = !placed && bth.opcode.is_response();
        let nak = bth.opcode == Opcode::RC_ACKNOWLEDGE
            && pkt.repr.ext.aeth.is_some_and(|a| {
                Syndrome::from_byte(a.syndrome) == Syndrome::Nak(NakCode::PsnSequenceError)
            });
        let (src, dst) = match pkt.repr.ip {
            IpRepr::V4(ip) => (
                ip.src.to_ipv6_mapped().octets(),
                ip.dst.to_ipv6_mapped().octets(),
            ),
            IpRepr::V6(ip) => (ip.src.octets(), ip.dst.octets()),
        };
        // A request flows sender -> receiver; a NACK receiver -> sender.
        let conn = if response { (dst, src) } else { (src, dst) };
        Some(Seen {
            psn: bth.psn,
            nak,
            request: !response,
            conn,
            bth_at: pkt.repr.eth.header_len() + pkt.repr.ip.header_len() + 8,
        })
    }

    /// Themis-S on a request leaving for another rack.
    fn spray(&mut self, ctx: &HookCtx<'_>, s: &Seen) -> Verdict {
        let n = ctx.candidates.len();
        let base = ctx
            .ecmp_choice
            .and_then(|c| ctx.candidates.iter().position(|&p| p == c))
            .unwrap_or(0);
        let r = self.next_random();
        let src = self.src.entry(s.conn).or_insert_with(|| Source {
            base,
            last_nack: None,
            avoid: vec![0; n],
        });
        src.base = base;
        let mut path = (s.psn.value() as usize % n + base) % n;
        let rerouted = src.last_nack == Some(s.psn);
        let avoided = !rerouted && src.avoid.get(path).is_some_and(|&a| a > 0);
        if avoided {
            src.avoid[path] -= 1;
        }
        if rerouted || avoided {
            // A random other path among those not avoided, if there is one.
            let healthy = |p: &usize| *p != path && src.avoid.get(*p).is_none_or(|&a| a == 0);
            let k = (0..n).filter(healthy).count();
            if k > 0 {
                path = (0..n)
                    .filter(healthy)
                    .nth((r % k as u64) as usize)
                    .expect("counted");
            }
        }
        bump(&self.stats.sprayed);
        if rerouted {
            bump(&self.stats.rerouted);
        }
        if avoided {
            bump(&self.stats.avoided);
        }
        Verdict::ForwardVia(ctx.candidates[path])
    }

    /// Themis-S on a NACK going down to its sender.
    fn note_nack(&mut self, s: &Seen, frame: &mut [u8]) {
        let Some(src) = self.src.get_mut(&s.conn) else {
            return;
        };
        src.last_nack = Some(s.psn);
        let flag = &mut frame[s.bth_at + 4];
        if *flag & AVOID_SIGNAL != 0 {
            *flag &= !AVOID_SIGNAL;
            let n = src.avoid.len();
            let path = (s.psn.value() as usize % n + src.base) % n;
            src.avoid[path] = self.cfg.avoidance_window;
            bump(&self.stats.paths_avoided);
        }
    }

    /// Themis-D on a request about to be handed to the local host.
    fn deliver(&mut self, s: &Seen) {
        let n = u32::from(self.cfg.paths);
        let len = (2 * self.cfg.window.max(1)).next_power_of_two() as usize;
        let dst = self.dst.entry(s.conn).or_insert_with(|| Dest {
            seen: vec![u32::MAX; len].into_boxed_slice(),
            path_max: vec![None; usize::from(self.cfg.paths)],
            stash: None,
        });
        dst.seen[s.psn.value() as usize % len] = s.psn.value();
        let path = (s.psn.value() % n) as usize;
        if dst.path_max[path].is_none_or(|m| m.before(s.psn)) {
            dst.path_max[path] = Some(s.psn);
        }
        let Some((sepsn, _, _)) = &dst.stash else {
            return;
        };
        let sepsn = *sepsn;
        if s.psn == sepsn {
            dst.stash = None;
            bump(&self.stats.stash_discarded);
        } else if sepsn.before(s.psn) && s.psn.value() % n == sepsn.value() % n {
            let (_, frame, _) = dst.stash.take().expect("checked");
            self.out.push(frame);
            bump(&self.stats.stash_released);
        } else if s.psn.distance(sepsn) > self.cfg.ooo_threshold as i32 {
            let (_, mut frame, bth_at) = dst.stash.take().expect("checked");
            frame[bth_at + 4] |= AVOID_SIGNAL;
            self.out.push(frame);
            bump(&self.stats.avoidance_signals);
        }
    }

    /// Themis-D on a NACK leaving the local host: pass, drop, or stash.
    fn validate(&mut self, s: &Seen, frame: &[u8]) -> Verdict {
        let n = u32::from(self.cfg.paths);
        let Some(dst) = self.dst.get_mut(&s.conn) else {
            // Nothing seen of this connection: nothing to judge by.
            return Verdict::Forward;
        };
        // A later NACK means the host got the PSN an earlier one was waiting for.
        if dst.stash.take().is_some() {
            bump(&self.stats.stash_discarded);
        }
        if dst.delivered(s.psn) {
            bump(&self.stats.nacks_invalid);
            return Verdict::Drop;
        }
        let path = (s.psn.value() % n) as usize;
        if dst.path_max[path].is_some_and(|m| s.psn.before(m)) {
            bump(&self.stats.nacks_valid);
            return Verdict::Forward;
        }
        dst.stash = Some((s.psn, frame.to_vec(), s.bth_at));
        bump(&self.stats.nacks_stashed);
        Verdict::Drop
    }
}

impl SwitchHook for ThemisTor {
    fn on_frame(&mut self, ctx: &HookCtx<'_>, frame: &mut Vec<u8>) -> Verdict {
        let Some(s) = Self::classify(frame) else {
            return Verdict::Forward;
        };
        let from_host = ctx.host_ports.get(ctx.ingress).copied().unwrap_or(false);
        let to_host = ctx
            .ecmp_choice
            .and_then(|p| ctx.host_ports.get(p).copied())
            .unwrap_or(false);
        match (s.request, s.nak, from_host, to_host) {
            (true, _, true, false) if ctx.candidates.len() > 1 => self.spray(ctx, &s),
            (true, _, false, true) => {
                self.deliver(&s);
                Verdict::Forward
            }
            (false, true, true, false) => self.validate(&s, frame),
            (false, true, false, true) => {
                self.note_nack(&s, frame);
                Verdict::Forward
            }
            _ => Verdict::Forward,
        }
    }

    fn poll_emit(&mut self) -> Option<Vec<u8>> {
        self.out.pop()
    }
}
