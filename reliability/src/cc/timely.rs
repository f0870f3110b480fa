//! TIMELY (Mittal et al., SIGCOMM 2015): rate-based congestion control from round-trip
//! times alone — no switch support, no ECN — on the same [`CongestionControl`] seam as
//! DCQCN, fed by the transport's own RTT samples (the acknowledgement of a packet sent once,
//! [`AckEvent::rtt`]). Per sample:
//!
//! - the RTT's change since the last sample is smoothed, `diff ← (1 − α)·diff + α·(rtt −
//!   prev)`, and normalized by the minimum RTT: the gradient;
//! - below `t_low` the rate grows by `δ` (the queue is empty whatever the trend);
//! - above `t_high` it is cut by `β·(1 − t_high/rtt)` (the queue is too long whatever the
//!   trend);
//! - between them, a gradient ≤ 0 grows it by `δ` — `hai_factor·δ` once that happened
//!   `hai_after` times in a row (hyperactive increase) — and a positive one cuts it by
//!   `β·gradient`.
//!
//! The rate stays within `[min_rate, line rate]`; the QP paces at it from the start. After a
//! Go-Back-N rewind the restart window stays a floor beneath it, as with DCQCN.

use ferroce_stack::transport::congestion::{AckEvent, CongestionControl, Loss, NoControl};
use ferroce_stack::wire::Psn;

/// TIMELY's parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TimelyConfig {
    /// The port's rate, bit/s: the start and the ceiling.
    pub line_rate_bps: u64,
    /// Below this RTT, additive increase regardless of the gradient, ns.
    pub t_low_ns: u64,
    /// Above it, multiplicative decrease regardless of the gradient, ns.
    pub t_high_ns: u64,
    /// The RTT the gradient is normalized by (the fabric's propagation RTT), ns.
    pub min_rtt_ns: u64,
    /// EWMA weight of a new RTT difference.
    pub alpha: f64,
    /// Multiplicative decrease factor.
    pub beta: f64,
    /// Additive increase step, bit/s.
    pub delta_bps: u64,
    /// Non-positive gradients in a row before hyperactive increase.
    pub hai_after: u32,
    /// Hyperactive increase: this many steps at once.
    pub hai_factor: u32,
    /// The floor, bit/s.
    pub min_rate_bps: u64,
}

impl TimelyConfig {
    /// The paper's parameters (10 Gbit/s NICs, tens of µs of RTT): `t_low` 50 µs, `t_high`
    /// 500 µs, `α` 0.02, `β` 0.8, `δ` 10 Mbit/s, hyperactive increase ×5 after 5; minimum RTT
    /// 20 µs (as eRPC's reference code takes it).
    pub fn paper(line_rate_bps: u64) -> Self {
        Self {
            line_rate_bps,
            t_low_ns: 50_000,
            t_high_ns: 500_000,
            min_rtt_ns: 20_000,
            alpha: 0.02,
            beta: 0.8,
            delta_bps: 10_000_000,
            hai_after: 5,
            hai_factor: 5,
            min_rate_bps: 10_000_000,
        }
    }

    /// ferroce's default for a fabric of microsecond links: the paper's gains with the
    /// thresholds a tenth of the paper's (a 100 Gbit/s fabric's RTT is a tenth of a 10
    /// Gbit/s one's) and `δ` ten times its (the line rate is).
    pub fn ferroce(line_rate_bps: u64) -> Self {
        Self {
            t_low_ns: 5_000,
            t_high_ns: 50_000,
            min_rtt_ns: 4_000,
            delta_bps: 100_000_000,
            ..Self::paper(line_rate_bps)
        }
    }

    /// These thresholds moved to a path whose base RTT is `base_rtt_ns` instead of
    /// [`ferroce`](Self::ferroce)'s 4 µs: the minimum RTT becomes it, and `t_low` and
    /// `t_high` keep their ratios to it (1.25× and 12.5×). A software path's RTT (a
    /// millisecond through a user-space switch) sits far above a fabric's `t_high`, and
    /// TIMELY would cut for ever.
    pub fn with_base_rtt(self, base_rtt_ns: u64) -> Self {
        let base = base_rtt_ns.max(1);
        Self {
            min_rtt_ns: base,
            t_low_ns: base + base / 4,
            t_high_ns: base * 25 / 2,
            ..self
        }
    }
}

/// TIMELY for one QP (see the module documentation).
#[derive(Clone, Debug)]
pub struct Timely {
    cfg: TimelyConfig,
    rate: f64,
    prev_rtt: Option<u64>,
    diff: f64,
    negative_run: u32,
    restart: NoControl,
    /// RTT samples taken.
    pub samples: u64,
}

impl Timely {
    /// A QP at line rate.
    pub fn new(cfg: TimelyConfig) -> Self {
        Self {
            cfg,
            rate: cfg.line_rate_bps as f64,
            prev_rtt: None,
            diff: 0.0,
            negative_run: 0,
            restart: NoControl::default(),
            samples: 0,
        }
    }

    /// The rate, bit/s.
    pub fn rate_bps(&self) -> u64 {
        self.rate as u64
    }

    /// An RTT sample, ns.
    pub fn rtt(&mut self, rtt: u64) {
        self.samples += 1;
        let c = self.cfg;
        let prev = self.prev_rtt.replace(rtt);
        let new_diff = prev.map_or(0.0, |p| rtt as f64 - p as f64);
        self.diff = (1.0 - c.alpha) * self.diff + c.alpha * new_diff;
        let gradient = self.diff / c.min_rtt_ns.max(1) as f64;
        if rtt < c.t_low_ns {
            self.negative_run = 0;
            self.rate += c.delta_bps as f64;
        } else if rtt > c.t_high_ns {
            self.negative_run = 0;
            self.rate *= 1.0 - c.beta * (1.0 - c.t_high_ns as f64 / rtt as f64);
        } else if gradient <= 0.0 {
            self.negative_run += 1;
            let n = if self.negative_run >= c.hai_after {
                c.hai_factor
            } else {
                1
            };
            self.rate += f64::from(n) * c.delta_bps as f64;
        } else {
            self.negative_run = 0;
            self.rate *= 1.0 - c.beta * gradient.min(1.0);
        }
        self.rate = self
            .rate
            .clamp(c.min_rate_bps as f64, c.line_rate_bps as f64);
    }
}

impl CongestionControl for Timely {
    fn name(&self) -> &'static str {
        "timely"
    }

    fn on_ack(&mut self, now: u64, ack: AckEvent) {
        if let Some(r) = ack.rtt {
            self.rtt(r);
        }
        self.restart.on_ack(now, ack);
    }

    fn on_sent(&mut self, _now: u64, _psn: Psn, _bytes: usize, _retransmission: bool) {}

    fn on_loss(&mut self, now: u64, loss: Loss) {
        self.restart.on_loss(now, loss);
    }

    fn window(&self) -> Option<u32> {
        self.restart.window()
    }

    fn pacing_rate(&self) -> Option<u64> {
        Some((self.rate / 8.0) as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const G100: u64 = 100_000_000_000;

    fn close(a: u64, b: f64) -> bool {
        (a as f64 - b).abs() < 1.0
    }

    /// Below t_low: +δ (capped at the line rate). Above t_high with RTT 1000 µs: the rate
    /// times 1 − 0.8·(1 − 500/1000) = 0.6.
    #[test]
    fn the_thresholds_decide_regardless_of_the_gradient() {
        let mut t = Timely::new(TimelyConfig::paper(G100));
        t.rtt(10_000);
        assert_eq!(t.rate_bps(), G100, "already at the line rate");
        t.rtt(1_000_000);
        assert!(close(t.rate_bps(), 60e9), "{}", t.rate_bps());
        t.rtt(10_000);
        assert!(close(t.rate_bps(), 60e9 + 10e6), "{}", t.rate_bps());
    }

    /// Between the thresholds, by hand (paper parameters): 100 µs then 120 µs: the new
    /// difference 20 µs, smoothed 0.02·20 = 0.4 µs, gradient 0.4/20 = 0.02, the rate times
    /// 1 − 0.8·0.02 = 0.984. Then 110 µs: the difference −10 µs, smoothed
    /// 0.98·0.4 + 0.02·(−10) = 0.192 µs — still positive: ×(1 − 0.8·0.0096).
    #[test]
    fn a_rising_rtt_cuts_by_the_gradient() {
        let mut t = Timely::new(TimelyConfig::paper(G100));
        t.rtt(100_000);
        assert_eq!(t.rate_bps(), G100, "no trend yet: +δ, capped");
        t.rtt(120_000);
        assert!(close(t.rate_bps(), 98.4e9), "{}", t.rate_bps());
        t.rtt(110_000);
        let want = 98.4e9 * (1.0 - 0.8 * (192.0 / 20_000.0));
        assert!(close(t.rate_bps(), want), "{} vs {want}", t.rate_bps());
    }

    /// A falling RTT between the thresholds: +δ each time, +5δ from the fifth in a row.
    #[test]
    fn a_falling_rtt_grows_additively_then_hyperactively() {
        let mut t = Timely::new(TimelyConfig::paper(G100));
        t.rtt(1_000_000); // down to 60 G
        let base = t.rate_bps() as f64;
        let mut rtt = 400_000;
        for k in 1..=6u32 {
            rtt -= 10_000;
            let before = t.rate_bps() as f64;
            t.rtt(rtt);
            let step = if k >= 5 { 5.0 } else { 1.0 } * 10e6;
            assert!(close(t.rate_bps(), before + step), "sample {k}");
        }
        assert!(t.rate_bps() as f64 > base);
    }

    /// The floor holds under any RTT, and the QP paces from the start.
    #[test]
    fn the_floor_and_pacing() {
        let mut t = Timely::new(TimelyConfig::paper(G100));
        assert_eq!(t.pacing_rate(), Some(G100 / 8));
        for _ in 0..200 {
            t.rtt(50_000_000);
        }
        assert_eq!(t.rate_bps(), 10_000_000);
    }

    #[test]
    fn thresholds_move_with_the_base_rtt() {
        let c = TimelyConfig::ferroce(G100).with_base_rtt(4_000);
        assert_eq!(
            (c.min_rtt_ns, c.t_low_ns, c.t_high_ns),
            (4_000, 5_000, 50_000)
        );
        let c = TimelyConfig::ferroce(G100).with_base_rtt(2_000_000);
        assert_eq!(
            (c.min_rtt_ns, c.t_low_ns, c.t_high_ns),
            (2_000_000, 2_500_000, 25_000_000)
        );
        // A 1 ms sample is below t_low there and changes nothing at the line rate; at
        // ferroce's 4 µs it is twenty times t_high, a cut.
        let mut t = Timely::new(c);
        t.rtt(1_000_000);
        assert_eq!(t.rate_bps(), G100);
        let mut t = Timely::new(TimelyConfig::ferroce(G100));
        t.rtt(1_000_000);
        assert!(t.rate_bps() < G100 / 2, "{}", t.rate_bps());
    }
}
