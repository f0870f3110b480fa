//! DCQCN's reaction point (Zhu et al., SIGCOMM 2015), as ConnectX firmware runs it and mlx5
//! exposes it: a per-QP current rate `Rc` and target rate `Rt`, a congestion estimate `α`,
//! a rate cut on CNPs and a rate recovery on a timer and a byte counter. Sans-IO behind the
//! [`CongestionControl`] seam: the QP reports sends and CNPs, and paces its packets at
//! [`pacing_rate`](CongestionControl::pacing_rate).
//!
//! Every quantity is an integer as in the firmware — rates in bit/s, `α` in 1/1024 — so the
//! timers can be **evaluated lazily**: nothing ticks; each event first catches the state up
//! with every timer boundary since the last one, in time order, and the result is the same,
//! to the bit, as evaluating every boundary as it passes (a test shows it).
//!
//! - **α** (`dce_tcp_g`, `dce_tcp_rtt`, `initial_alpha_value`): from the first CNP on, every
//!   `dce_tcp_rtt` α becomes `α·g/1024 + (1024 − g)` if a CNP came in the period, `α·g/1024`
//!   if not.
//! - **Cut** (`rate_reduce_monitor_period`, `rpg_gd`, `rpg_min_dec_fac`, `rpg_min_rate`,
//!   `rate_to_set_on_first_cnp`): on a CNP, at most once per monitor period (CNPs within one
//!   are folded into a cut at its end), `Rt ← Rc`, `Rc ← Rc − Rc·α/2^(rpg_gd − 10)/1024`,
//!   never below `rpg_min_dec_fac` % of the old rate nor `rpg_min_rate`; the recovery
//!   counters restart.
//! - **Recovery** (`rpg_time_reset`, `rpg_byte_reset`, `rpg_threshold`, `rpg_ai_rate`,
//!   `rpg_hai_rate`): each `rpg_time_reset` since the last cut counts `T`, each
//!   `rpg_byte_reset` bytes sent counts `BC`; on each count, with `F = rpg_threshold`: while
//!   `max(T, BC) ≤ F` **fast recovery** `Rc ← (Rt + Rc)/2`; once both exceed `F` **hyper
//!   increase** `Rt += (min(T, BC) − F)·rpg_hai_rate` then halve the gap; otherwise
//!   **additive increase** `Rt += rpg_ai_rate` then halve the gap. `Rt` never exceeds the
//!   line rate.
//!
//! A QP is not rate-limited until its first CNP (as on a ConnectX). After a Go-Back-N rewind
//! the requester's restart window ([`NoControl`]) still applies beneath the rate: DCQCN
//! paces, it does not replace the floor that keeps a rewind from flooding a receiver.

use ferroce_stack::transport::congestion::{AckEvent, CongestionControl, Loss, NoControl};
use ferroce_stack::wire::Psn;

/// DCQCN's parameters, by their mlx5 names (`/sys/kernel/debug/mlx5/<dev>/cc_params/rp_*`,
/// `mlxconfig` `ROCE_CC_*`), with ConnectX's defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DcqcnConfig {
    /// The port's rate, bit/s: where `Rt` stops.
    pub line_rate_bps: u64,
    /// α's gain `g`, in 1/1024 (1019: α keeps 1019/1024 of itself each period).
    pub dce_tcp_g: u32,
    /// α's update period, ns (1 µs).
    pub dce_tcp_rtt_ns: u64,
    /// α on the first CNP, in 1/1024 (1023).
    pub initial_alpha_value: u32,
    /// At most one cut per this period, ns (4 µs).
    pub rate_reduce_monitor_period_ns: u64,
    /// The cut is `Rc·α/2^(rpg_gd − 10)`: 11 halves it (`Rc·α/2`).
    pub rpg_gd: u32,
    /// A cut keeps at least this percentage of the rate (50).
    pub rpg_min_dec_fac: u32,
    /// The rate never goes below this, bit/s (1 Mbit/s).
    pub rpg_min_rate_bps: u64,
    /// If not 0, the first CNP sets `Rc` and `Rt` to this instead of cutting, bit/s (0).
    pub rate_to_set_on_first_cnp_bps: u64,
    /// The recovery timer, ns (300 µs).
    pub rpg_time_reset_ns: u64,
    /// The recovery byte counter, bytes (32767).
    pub rpg_byte_reset: u64,
    /// `F`: counts of fast recovery before additive increase (1).
    pub rpg_threshold: u32,
    /// Additive increase, bit/s (5 Mbit/s).
    pub rpg_ai_rate_bps: u64,
    /// Hyper increase step, bit/s (50 Mbit/s).
    pub rpg_hai_rate_bps: u64,
    /// Not a ConnectX parameter (0 there: no window). If not 0, the fabric's base RTT
    /// (ns): the QP keeps at most one bandwidth-delay product (`line_rate_bps` × this) in
    /// flight, as the HPCC simulator runs DCQCN with its window option (`HAS_WIN`). A rate
    /// cannot take back what left before the first CNP came back; the window bounds it, so
    /// `n` flows starting together put at most `n` BDPs into the bottleneck's buffer.
    pub window_rtt_ns: u64,
}

impl DcqcnConfig {
    /// ConnectX's defaults (NVIDIA's DCQCN parameter page and public `mlxconfig` dumps)
    /// on a port of `line_rate_bps`.
    pub const fn mlx5(line_rate_bps: u64) -> Self {
        Self {
            line_rate_bps,
            dce_tcp_g: 1019,
            dce_tcp_rtt_ns: 1_000,
            initial_alpha_value: 1023,
            rate_reduce_monitor_period_ns: 4_000,
            rpg_gd: 11,
            rpg_min_dec_fac: 50,
            rpg_min_rate_bps: 1_000_000,
            rate_to_set_on_first_cnp_bps: 0,
            rpg_time_reset_ns: 300_000,
            rpg_byte_reset: 32_767,
            rpg_threshold: 1,
            rpg_ai_rate_bps: 5_000_000,
            rpg_hai_rate_bps: 50_000_000,
            window_rtt_ns: 0,
        }
    }
}

impl DcqcnConfig {
    /// ferroce's defaults, chosen on the incast scenario (docs/congestion.md): ConnectX's,
    /// with the DCQCN paper's structure — α updated every 55 µs with g = 1/256, `F` = 5 —
    /// its 40 Gbit/s steps scaled to 100 (100 Mbit/s additive, 500 hyper, a 25 MB byte
    /// counter), a 15 µs recovery timer, and at most one cut per 35 µs (the paper's 50 µs
    /// CNP interval takes 2.5 ms to bring sixteen flows down to their share: each cut is
    /// mostly undone by fast recovery before the next).
    /// And a window of one bandwidth-delay product at a 5 µs base RTT (a 100 G fabric of
    /// two 1 µs hops, as the simulated one, has 4.7): without it, whatever a QP has
    /// outstanding leaves at line rate before the first CNP can come back. Set
    /// `window_rtt_ns` to the fabric's base RTT, or 0 where RTTs are not known.
    pub const fn ferroce(line_rate_bps: u64) -> Self {
        Self {
            window_rtt_ns: 5_000,
            rate_reduce_monitor_period_ns: 35_000,
            dce_tcp_rtt_ns: 55_000,
            dce_tcp_g: 1020,
            rpg_time_reset_ns: 15_000,
            rpg_byte_reset: 25 << 20,
            rpg_threshold: 5,
            rpg_ai_rate_bps: 100_000_000,
            rpg_hai_rate_bps: 500_000_000,
            ..Self::mlx5(line_rate_bps)
        }
    }
}

/// Where the rate machine is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DcqcnState {
    /// Current rate, bit/s.
    pub rc: u64,
    /// Target rate, bit/s.
    pub rt: u64,
    /// α, in 1/1024.
    pub alpha: u32,
    /// Recovery timer counts since the last cut.
    pub t: u32,
    /// Recovery byte counts since the last cut.
    pub bc: u32,
}

ferroce_stack::counter_set! {
    /// What it did, named like the mlx5 counters where one exists.
    pub struct DcqcnStats {
        /// CNPs heard (`rp_cnp_handled`).
        rp_cnp_handled,
        /// CNPs folded into a cut already made in the same monitor period (`rp_cnp_ignored`).
        rp_cnp_ignored,
        /// Rate cuts.
        cuts,
        /// Recovery steps of each kind.
        fast_recovery,
        /// Additive increases.
        additive,
        /// Hyper increases.
        hyper,
    }
}

/// DCQCN's reaction point for one QP (see the module documentation).
#[derive(Clone, Debug)]
pub struct Dcqcn {
    cfg: DcqcnConfig,
    s: DcqcnState,
    /// Rate-limited (a CNP came).
    limited: bool,
    /// The next α boundary, and whether a CNP came in the current period.
    alpha_next: u64,
    cnp_in_period: bool,
    /// The last cut, and a CNP waiting for the monitor period to end.
    last_cut: u64,
    cut_pending: bool,
    /// The next recovery timer count, and bytes since the last byte count.
    timer_next: u64,
    bytes: u64,
    /// Events are caught up to here.
    now: u64,
    /// The largest frame sent: the window's unit; and the window in those frames, worked
    /// out when it grows rather than per packet.
    frame: u32,
    win: Option<u32>,
    restart: NoControl,
    stats: DcqcnStats,
}

impl Dcqcn {
    /// A QP at line rate, not yet limited.
    pub fn new(cfg: DcqcnConfig) -> Self {
        Self {
            cfg,
            s: DcqcnState {
                rc: cfg.line_rate_bps,
                rt: cfg.line_rate_bps,
                alpha: cfg.initial_alpha_value,
                t: 0,
                bc: 0,
            },
            limited: false,
            alpha_next: 0,
            cnp_in_period: false,
            last_cut: 0,
            cut_pending: false,
            timer_next: 0,
            bytes: 0,
            now: 0,
            frame: 0,
            win: rate_window(&cfg, 0),
            restart: NoControl::default(),
            stats: DcqcnStats::default(),
        }
    }

    /// The rate machine's state.
    pub fn state(&self) -> DcqcnState {
        self.s
    }

    /// What it did.
    pub fn stats(&self) -> DcqcnStats {
        self.stats
    }

    /// Whether a CNP has limited the QP yet.
    pub fn limited(&self) -> bool {
        self.limited
    }

    /// Catches up with every timer boundary up to `now`, in time order. Calling it at
    /// every boundary or only at events gives the same state.
    pub fn advance(&mut self, now: u64) {
        if now < self.now {
            return;
        }
        self.now = now;
        if !self.limited {
            return;
        }
        loop {
            let cut_at = self
                .cut_pending
                .then(|| self.last_cut + self.cfg.rate_reduce_monitor_period_ns);
            let next = [Some(self.alpha_next), cut_at, Some(self.timer_next)]
                .into_iter()
                .flatten()
                .min()
                .unwrap_or(u64::MAX);
            if next > now {
                break;
            }
            // Ties: α first (the period ends), then the folded cut, then recovery.
            if next == self.alpha_next {
                self.alpha_boundary(now);
            } else if Some(next) == cut_at {
                self.cut(next);
            } else {
                self.timer_boundary(now);
            }
        }
    }

    fn alpha_boundary(&mut self, now: u64) {
        let g = self.cfg.dce_tcp_g.min(1024);
        let period = self.cfg.dce_tcp_rtt_ns.max(1);
        if self.cnp_in_period {
            self.s.alpha = (self.s.alpha * g) / 1024 + (1024 - g);
            self.cnp_in_period = false;
            self.alpha_next += period;
            return;
        }
        if self.s.alpha == 0 {
            // Nothing changes until a CNP: jump past `now`.
            let behind = (now - self.alpha_next) / period + 1;
            self.alpha_next += behind * period;
            return;
        }
        self.s.alpha = (self.s.alpha * g) / 1024;
        self.alpha_next += period;
    }

    fn timer_boundary(&mut self, now: u64) {
        let period = self.cfg.rpg_time_reset_ns.max(1);
        let at_line = self.s.rc == self.cfg.line_rate_bps && self.s.rt == self.cfg.line_rate_bps;
        if at_line && self.s.t > self.cfg.rpg_threshold {
            // Back at line rate and past fast recovery: further counts change nothing.
            let behind = (now - self.timer_next) / period + 1;
            self.timer_next += behind * period;
            self.s.t = self.s.t.saturating_add(behind as u32);
            return;
        }
        self.timer_next += period;
        self.s.t = self.s.t.saturating_add(1);
        self.increase();
    }

    /// One recovery step after a count.
    fn increase(&mut self) {
        let f = self.cfg.rpg_threshold;
        let (t, bc) = (self.s.t, self.s.bc);
        let line = self.cfg.line_rate_bps;
        if t.max(bc) <= f {
            self.stats.fast_recovery += 1;
        } else if t.min(bc) > f {
            self.stats.hyper += 1;
            let i = u64::from(t.min(bc) - f);
            self.s.rt = self
                .s
                .rt
                .saturating_add(i.saturating_mul(self.cfg.rpg_hai_rate_bps))
                .min(line);
        } else {
            self.stats.additive += 1;
            self.s.rt = self.s.rt.saturating_add(self.cfg.rpg_ai_rate_bps).min(line);
        }
        self.s.rc = (self.s.rt + self.s.rc).div_ceil(2).min(self.s.rt);
    }

    /// The cut, at `at`.
    fn cut(&mut self, at: u64) {
        self.cut_pending = false;
        self.last_cut = at;
        self.stats.cuts += 1;
        let rc = self.s.rc;
        let shift = self.cfg.rpg_gd.saturating_sub(10).min(20);
        let dec = ((u128::from(rc) * u128::from(self.s.alpha) / 1024) >> shift) as u64;
        let floor = (u128::from(rc) * u128::from(self.cfg.rpg_min_dec_fac.min(100)) / 100) as u64;
        self.s.rt = rc;
        self.s.rc = rc
            .saturating_sub(dec)
            .max(floor)
            .max(self.cfg.rpg_min_rate_bps.min(rc));
        self.s.t = 0;
        self.s.bc = 0;
        self.bytes = 0;
        self.timer_next = at + self.cfg.rpg_time_reset_ns.max(1);
    }

    /// A CNP at `now`.
    pub fn cnp(&mut self, now: u64) {
        self.advance(now);
        self.stats.rp_cnp_handled += 1;
        if !self.limited {
            self.limited = true;
            self.s.alpha = self.cfg.initial_alpha_value.min(1024);
            self.alpha_next = now + self.cfg.dce_tcp_rtt_ns.max(1);
            self.cnp_in_period = false;
            if self.cfg.rate_to_set_on_first_cnp_bps > 0 {
                let r = self
                    .cfg
                    .rate_to_set_on_first_cnp_bps
                    .min(self.cfg.line_rate_bps);
                self.s.rc = r;
                self.s.rt = r;
                self.last_cut = now;
                self.s.t = 0;
                self.s.bc = 0;
                self.bytes = 0;
                self.timer_next = now + self.cfg.rpg_time_reset_ns.max(1);
                return;
            }
            self.cut(now);
            return;
        }
        self.cnp_in_period = true;
        if now >= self.last_cut + self.cfg.rate_reduce_monitor_period_ns && !self.cut_pending {
            self.cut(now);
        } else if self.cut_pending {
            self.stats.rp_cnp_ignored += 1;
        } else {
            // Within the period of the last cut: one more cut at its end.
            self.cut_pending = true;
        }
    }

    /// `bytes` left at `now`: the byte counter.
    pub fn sent(&mut self, now: u64, bytes: usize) {
        self.advance(now);
        if !self.limited {
            return;
        }
        self.bytes += bytes as u64;
        let per = self.cfg.rpg_byte_reset.max(1);
        while self.bytes >= per {
            self.bytes -= per;
            self.s.bc = self.s.bc.saturating_add(1);
            self.increase();
        }
    }
}

/// Packets of `frame` bytes (at least 64) one window holds (at least one), if it is on.
fn rate_window(cfg: &DcqcnConfig, frame: u32) -> Option<u32> {
    if cfg.window_rtt_ns == 0 {
        return None;
    }
    let bytes = u128::from(cfg.line_rate_bps) * u128::from(cfg.window_rtt_ns) / 8_000_000_000;
    Some(
        bytes
            .div_ceil(u128::from(frame.max(64)))
            .clamp(1, u128::from(u32::MAX)) as u32,
    )
}

impl CongestionControl for Dcqcn {
    fn name(&self) -> &'static str {
        "dcqcn"
    }

    fn on_sent(&mut self, now: u64, _psn: Psn, bytes: usize, _retransmission: bool) {
        let frame = bytes.min(1 << 16) as u32;
        if frame > self.frame {
            self.frame = frame;
            self.win = rate_window(&self.cfg, frame);
        }
        self.sent(now, bytes);
    }

    fn on_ack(&mut self, now: u64, ack: AckEvent) {
        self.advance(now);
        self.restart.on_ack(now, ack);
    }

    fn on_cnp(&mut self, now: u64) {
        self.cnp(now);
    }

    fn on_loss(&mut self, now: u64, loss: Loss) {
        self.advance(now);
        self.restart.on_loss(now, loss);
    }

    fn window(&self) -> Option<u32> {
        let own = self.win;
        match (own, self.restart.window()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn pacing_rate(&self) -> Option<u64> {
        // Bytes per second of frames.
        self.limited.then_some(self.s.rc / 8)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const G100: u64 = 100_000_000_000;

    fn cfg() -> DcqcnConfig {
        DcqcnConfig::mlx5(G100)
    }

    /// α = 1 (1024/1024) at 100 Gbit/s: one CNP halves the rate; α = 1023/1024 (the default)
    /// cuts to 100·(1 − 1023/2048) = 50.048828125 Gbit/s; the target keeps the old rate.
    #[test]
    fn one_cnp_halves_the_rate_at_alpha_one() {
        let mut d = Dcqcn::new(DcqcnConfig {
            initial_alpha_value: 1024,
            ..cfg()
        });
        assert_eq!(d.pacing_rate(), None, "unlimited before a CNP");
        d.cnp(10_000);
        assert_eq!(d.state().rc, 50_000_000_000);
        assert_eq!(d.state().rt, G100);
        assert_eq!(d.pacing_rate(), Some(50_000_000_000 / 8));
        let mut d = Dcqcn::new(cfg());
        d.cnp(10_000);
        assert_eq!(d.state().rc, 50_048_828_125);
    }

    /// `rpg_min_dec_fac` bounds a cut (25 %: a cut keeps ≥ 75 %), `rpg_min_rate` floors the
    /// rate through any number of cuts.
    #[test]
    fn min_dec_fac_and_the_floor_hold() {
        let mut d = Dcqcn::new(DcqcnConfig {
            initial_alpha_value: 1024,
            rpg_min_dec_fac: 75,
            ..cfg()
        });
        d.cnp(0);
        assert_eq!(d.state().rc, 75_000_000_000, "a half cut bounded at 75 %");
        let mut d = Dcqcn::new(DcqcnConfig {
            initial_alpha_value: 1024,
            rpg_min_rate_bps: 20_000_000_000,
            ..cfg()
        });
        // A CNP every monitor period: α stays near 1, each cut halves, down to the floor.
        for k in 0..10 {
            d.cnp(k * 4_000);
        }
        assert_eq!(d.state().rc, 20_000_000_000);
        assert_eq!(d.stats().cuts, 10);
    }

    /// α by hand: after the first CNP (α = 1023), a period without a CNP gives
    /// ⌊1023·1019/1024⌋ = 1018, then ⌊1018·1019/1024⌋ = 1013; a period with a CNP gives
    /// ⌊1013·1019/1024⌋ + 5 = 1013.
    #[test]
    fn alpha_decays_per_period_and_rises_with_cnps() {
        let mut d = Dcqcn::new(cfg());
        d.cnp(0);
        d.advance(1_000);
        assert_eq!(d.state().alpha, 1018);
        d.advance(2_000);
        assert_eq!(d.state().alpha, 1013);
        d.cnp(2_500); // within the monitor period: folded into a cut at 4 µs
        d.advance(3_000);
        assert_eq!(d.state().alpha, 1013);
        // Long quiet: α decays to zero and stays.
        d.advance(10_000_000);
        assert_eq!(d.state().alpha, 0);
    }

    /// Recovery by the formulas, F = rpg_threshold = 1: the first timer count is fast
    /// recovery (halve the gap to Rt), the next additive (Rt + 5 Mbit/s), and once the byte
    /// counter has counted past F too, hyper (Rt + (min − F)·50 Mbit/s).
    #[test]
    fn fast_recovery_then_additive_then_hyper() {
        let mut d = Dcqcn::new(DcqcnConfig {
            initial_alpha_value: 1024,
            ..cfg()
        });
        d.cnp(0); // Rc 50 G, Rt 100 G
        d.advance(300_000); // T = 1: fast recovery
        let s = d.state();
        assert_eq!((s.t, s.rc, s.rt), (1, 75_000_000_000, G100));
        d.advance(600_000); // T = 2: additive, Rt clamps at the line rate
        let s = d.state();
        assert_eq!((s.t, s.rt, s.rc), (2, G100, 87_500_000_000));
        assert_eq!(d.stats().additive, 1);
        // Again from a lower rate: a fresh cut, then counts of both kinds.
        let mut d = Dcqcn::new(DcqcnConfig {
            initial_alpha_value: 1024,
            line_rate_bps: 10 * G100,
            ..cfg()
        });
        d.cnp(0); // Rc 500 G, Rt 1000 G
        d.cnp(4_000); // α 1024·1019/1024 + 5 ... the rate cut again
        let s = d.state();
        let (rc0, rt0) = (s.rc, s.rt);
        assert_eq!(rt0, 500_000_000_000);
        d.sent(4_001, 32_767); // BC = 1: fast recovery
        assert_eq!(d.state().rc, (rt0 + rc0).div_ceil(2));
        d.sent(4_002, 32_767); // BC = 2, T = 0: additive
        let s = d.state();
        assert_eq!(s.rt, rt0 + 5_000_000);
        d.advance(4_000 + 300_000); // T = 1
        d.advance(4_000 + 600_000); // T = 2: both past F: hyper, i = 1
        let s = d.state();
        assert_eq!((s.t, s.bc), (2, 2));
        assert_eq!(d.stats().hyper, 1);
        assert_eq!(s.rt, rt0 + 5_000_000 + 5_000_000 + 50_000_000);
    }

    /// Lazy and step-by-step evaluation agree to the bit: one controller is advanced at
    /// every microsecond, the other only at its events (CNPs and sends at random moments),
    /// and their states match after every event.
    #[test]
    fn lazy_timers_equal_stepwise_evaluation() {
        for seed in 1..40u64 {
            let mut rng = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
            let mut next = move || {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                rng
            };
            let c = DcqcnConfig {
                rpg_time_reset_ns: 20_000 + next() % 100_000,
                ..cfg()
            };
            let (mut lazy, mut step) = (Dcqcn::new(c), Dcqcn::new(c));
            let mut t = 0u64;
            let mut ticked = 0u64;
            for _ in 0..400 {
                t += 1 + next() % 50_000;
                while ticked + 1_000 <= t {
                    ticked += 1_000;
                    step.advance(ticked);
                }
                if next().is_multiple_of(3) {
                    lazy.cnp(t);
                    step.cnp(t);
                } else {
                    let b = 1 + (next() % 9000) as usize;
                    lazy.sent(t, b);
                    step.sent(t, b);
                }
                assert_eq!(lazy.state(), step.state(), "seed {seed} at {t}");
                assert_eq!(lazy.stats(), step.stats(), "seed {seed} at {t}");
            }
        }
    }

    /// After a rewind the restart window applies under the rate.
    #[test]
    fn the_restart_window_stays_a_floor() {
        let mut d = Dcqcn::new(cfg());
        assert_eq!(d.window(), None);
        d.on_loss(5, Loss::GoBack);
        assert_eq!(
            d.window(),
            Some(ferroce_stack::transport::congestion::RESTART_WINDOW)
        );
        d.on_ack(
            6,
            AckEvent {
                acked: 10,
                rtt: None,
            },
        );
        assert_eq!(
            d.window(),
            Some(ferroce_stack::transport::congestion::RESTART_WINDOW + 10)
        );
    }

    /// ferroce's window: one BDP at the line rate, in frames of the largest size sent,
    /// whatever the rate; under the restart window's after a rewind.
    #[test]
    fn the_window_is_one_bdp_of_frames() {
        let mut d = Dcqcn::new(DcqcnConfig::ferroce(100_000_000_000));
        // 100 Gbit/s × 5 µs = 62 500 bytes: 15 frames of 4 170 bytes (14.99), 977 of 64.
        assert_eq!(d.window(), Some(977));
        d.on_sent(0, Psn::new(0), 4170, false);
        assert_eq!(d.window(), Some(15));
        d.on_sent(1, Psn::new(1), 100, false);
        assert_eq!(d.window(), Some(15));
        d.on_cnp(2);
        assert!(d.state().rc < 100_000_000_000);
        assert_eq!(d.window(), Some(15), "the rate does not move it");
        d.on_loss(3, Loss::GoBack);
        assert_eq!(d.window(), Some(15), "smaller than the restart window");
        let off = DcqcnConfig {
            window_rtt_ns: 0,
            ..DcqcnConfig::ferroce(100_000_000_000)
        };
        assert_eq!(Dcqcn::new(off).window(), None);
        let long = DcqcnConfig {
            window_rtt_ns: 200_000,
            ..DcqcnConfig::ferroce(100_000_000_000)
        };
        let mut d = Dcqcn::new(long);
        d.on_sent(0, Psn::new(0), 4170, false);
        assert_eq!(d.window(), Some(600));
        d.on_loss(3, Loss::GoBack);
        assert_eq!(
            d.window(),
            Some(ferroce_stack::transport::congestion::RESTART_WINDOW)
        );
    }
}
