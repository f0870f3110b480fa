//! The completion-time model of SDR's §4.2 and appendices A–B: the expected and tail time of
//! one Write under selective repeat (with an RTO, or with NACKs) and under erasure coding
//! (MDS or XOR) with selective repeat as the fallback — analytically and by Monte Carlo.
//!
//! Selective repeat. Chunk `i` (1..=M) starts at `t_i = i·T_INJ` and is sent `Y_i` times,
//! `Y_i ~ Geom(1 − p)`; every loss costs `O = RTO + T_INJ`. So `X_i = t_i + O·(Y_i − 1)` and
//! `T_SR = max_i X_i + RTT` (a lower bound once `t_M > RTO`, when retransmissions would
//! interleave with first transmissions, as the paper says).
//!
//! The tail of one chunk: `X_i ≥ q` ⇔ `Y_i ≥ 1 + (q − t_i)/O` ⇔ (Y is an integer)
//! `Y_i ≥ ⌈1 + (q − t_i)/O⌉`, so `P(X_i ≥ q) = p^⌈(q − t_i)/O⌉` for `q > t_i` (and 1 below).
//! Appendix A prints `p^((q − t_i)/O)`, without the ceiling: that is the tail of a continuous
//! variable, and it makes every loss cost anything between 0 and `O` instead of exactly `O`
//! per retransmission. With independent chunks, `P(max X < q) = Π_i (1 − P(X_i ≥ q))`, a
//! step function of `q` whose steps are at `t_i + j·O`; the expectation
//! `E[max X] = t_M + ∫_{t_M}^∞ P(max X ≥ q) dq` is summed exactly over those steps, and a
//! quantile read off them. Between steps the chunks with `⌈(q − t_i)/O⌉ = j` are a run of
//! consecutive `i`, counted without visiting them, so a 1 GiB message costs milliseconds.
//!
//! Erasure coding. `L = ⌈M/k⌉` submessages of `k` data chunks each carry `m` parity chunks;
//! one decodes with probability `P_EC` (appendix B: MDS, any `m` losses; XOR, one loss per
//! group of `k/m` data chunks and their parity chunk), so `f`, the submessages that fail,
//! is Binomial(L, 1 − P_EC). All chunks take `INJ = (M + ⌈M·m/k⌉)·T_INJ`. With `f = 0` the
//! receiver's ACK arrives at `INJ + RTT`. Otherwise the fallback timer, armed when the first
//! chunk arrives for `INJ + β·RTT`, sends a NACK, which reaches the sender at
//! `INJ + (1 + β)·RTT`, and the `f·k` data chunks go again by selective repeat:
//! `T = INJ + (1 + β)·RTT + T_SR(f·k)`. The paper's §4.2.3 leaves the ACK's RTT out of the
//! loss-free case and puts `E[T_SR(E[f]·k)]` where `E[T_SR(f·k)]` averaged over `f` belongs;
//! both are corrected here.

/// What is sent, over what.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Setup {
    /// Message bytes.
    pub bytes: u64,
    /// Bitmap chunk bytes (a multiple of the MTU).
    pub chunk: u64,
    /// MTU bytes.
    pub mtu: u64,
    /// Link rate, Gbit/s.
    pub gbps: f64,
    /// Round-trip time, seconds.
    pub rtt: f64,
    /// Probability a packet is dropped (independently).
    pub p_packet: f64,
    /// The receiver keeps the packets of a chunk that arrived (SDR's per-packet bitmap, as
    /// ferroce's receiver does), so a resent chunk is lost again only if one of its packets
    /// still missing is: [`p_resend`](Self::p_resend). False is the paper's model, where
    /// every send of a chunk is lost with `p_chunk`.
    pub per_packet: bool,
}

impl Setup {
    /// Chunks of the message.
    pub fn chunks(&self) -> u64 {
        self.bytes.div_ceil(self.chunk.max(1))
    }

    /// Seconds to put one chunk on the wire.
    pub fn t_inj(&self) -> f64 {
        self.chunk as f64 * 8.0 / (self.gbps * 1e9)
    }

    /// Probability a resent chunk is lost again: `p_chunk` in the paper's model; with
    /// [`per_packet`](Self::per_packet), the chance one of the packets a lost chunk misses
    /// is lost again, `1 − (1 − p)^(E[missing])`, `E[missing] = n·p / p_chunk` for `n`
    /// packets a chunk (about one packet while `n·p` is small).
    pub fn p_resend(&self) -> f64 {
        let pc = self.p_chunk();
        if !self.per_packet || pc <= 0.0 {
            return pc;
        }
        let n = (self.chunk / self.mtu.max(1)).max(1) as f64;
        let missing = n * self.p_packet / pc;
        1.0 - (1.0 - self.p_packet).powf(missing)
    }

    /// Probability a chunk loses at least one of its packets: `1 − (1 − p)^(chunk/MTU)`.
    pub fn p_chunk(&self) -> f64 {
        let packets = self.chunk.div_ceil(self.mtu.max(1)) as f64;
        1.0 - (1.0 - self.p_packet).powf(packets)
    }

    /// The Write's time on a loss-free link: every chunk, then the ACK's way back.
    pub fn lossless(&self) -> f64 {
        self.chunks() as f64 * self.t_inj() + self.rtt
    }
}

/// A code for EC.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Code {
    /// Reed-Solomon: any `k` of `k + m` chunks decode.
    Mds,
    /// The paper's XOR: one loss per modulo group.
    Xor,
}

/// A reliability scheme.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Scheme {
    /// Selective repeat, chunk timeout `rto_rtts` RTTs (the paper: 3).
    SrRto {
        /// The timeout in RTTs.
        rto_rtts: f64,
    },
    /// Selective repeat with NACKs: a loss is resent one RTT after it happened.
    SrNack,
    /// Erasure coding with selective repeat as the fallback.
    Ec {
        /// Which code.
        code: Code,
        /// Data chunks per submessage.
        k: u32,
        /// Parity chunks per submessage.
        m: u32,
        /// The fallback timer's slack over the injection time, in RTTs (the paper: 1).
        beta: f64,
    },
}

impl Scheme {
    /// The paper's SR with a 3-RTT timeout.
    pub const SR_RTO: Self = Self::SrRto { rto_rtts: 3.0 };

    /// EC(32, 8) with `code` and the paper's β = 1.
    pub const fn ec(code: Code) -> Self {
        Self::Ec {
            code,
            k: 32,
            m: 8,
            beta: 1.0,
        }
    }

    /// Its name in reports: `sr-rto`, `sr-nack`, `ec-mds`, `ec-xor`.
    pub fn name(&self) -> &'static str {
        match self {
            Self::SrRto { .. } => "sr-rto",
            Self::SrNack => "sr-nack",
            Self::Ec {
                code: Code::Mds, ..
            } => "ec-mds",
            Self::Ec {
                code: Code::Xor, ..
            } => "ec-xor",
        }
    }
}

/// Expected and 99.9th-percentile completion time, seconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Prediction {
    /// The mean.
    pub mean: f64,
    /// The 99.9th percentile.
    pub p999: f64,
}

/// The maximum over `n` chunks of `t_i + O·(Y_i − 1)`, `t_i = i·t_inj`, as a step function.
struct SrMax {
    n: u64,
    t_inj: f64,
    o: f64,
    /// A first send is lost with `p`, each resend with `p2`.
    p: f64,
    p2: f64,
    /// Retransmission counts past which a chunk's tail is below 1e-18.
    depth: u64,
}

impl SrMax {
    fn new(n: u64, t_inj: f64, o: f64, (p, p2): (f64, f64)) -> Self {
        let depth = if p <= 0.0 {
            0
        } else if p2 >= 1.0 {
            64
        } else if p2 <= 0.0 {
            1
        } else {
            (1.0 + ((1e-18f64).ln() - p.ln()) / p2.ln())
                .ceil()
                .clamp(1.0, 64.0) as u64
        };
        Self {
            n,
            t_inj,
            o,
            p,
            p2,
            depth,
        }
    }

    /// `P(Y ≥ j + 1)`: the chunk needs at least `j` resends.
    fn tail(&self, j: u64) -> f64 {
        self.p * self.p2.powi(j as i32 - 1)
    }

    /// Chunks `i` in `1..=n` with `lo <= i·t_inj < hi`.
    fn count(&self, lo: f64, hi: f64) -> u64 {
        let first = (lo / self.t_inj).ceil().max(1.0);
        let last = ((hi / self.t_inj).ceil() - 1.0).min(self.n as f64);
        if last < first {
            0
        } else {
            (last - first + 1.0) as u64
        }
    }

    /// `P(max X < q)`, for `q` not on a step.
    fn cdf(&self, q: f64) -> f64 {
        if self.n == 0 {
            return 1.0;
        }
        if q <= self.n as f64 * self.t_inj {
            return 0.0;
        }
        let mut ln = 0.0;
        for j in 1..=self.depth {
            // Chunks with ⌈(q − t_i)/O⌉ = j: q − j·O <= t_i < q − (j − 1)·O.
            let c = self.count(q - j as f64 * self.o, q - (j - 1) as f64 * self.o);
            if c > 0 {
                ln += c as f64 * (1.0 - self.tail(j)).ln();
            }
        }
        ln.exp()
    }

    /// The steps past `t_n`, in order: where some chunk's retransmission count changes.
    fn steps(&self) -> Vec<f64> {
        let t_n = self.n as f64 * self.t_inj;
        let mut s = vec![t_n];
        for j in 1..=self.depth {
            for i in 1..=self.n {
                let at = i as f64 * self.t_inj + j as f64 * self.o;
                if at > t_n {
                    s.push(at);
                }
            }
        }
        s.sort_by(f64::total_cmp);
        s.dedup();
        s
    }

    /// `E[max X]` and the `quantile`-th quantile of `max X`.
    fn mean_and_quantile(&self, quantile: f64) -> (f64, f64) {
        let t_n = self.n as f64 * self.t_inj;
        if self.p <= 0.0 || self.n == 0 {
            return (t_n, t_n);
        }
        let steps = self.steps();
        let mut mean = t_n;
        let mut at = None;
        for w in steps.windows(2) {
            let f = self.cdf(0.5 * (w[0] + w[1]));
            mean += (1.0 - f) * (w[1] - w[0]);
            if at.is_none() && f >= quantile {
                at = Some(w[0]);
            }
        }
        (mean, at.unwrap_or(*steps.last().unwrap_or(&t_n)))
    }
}

/// Selective repeat's `O`, the cost of one loss.
fn sr_overhead(s: &Setup, scheme: Scheme) -> f64 {
    let rto = match scheme {
        Scheme::SrRto { rto_rtts } => rto_rtts * s.rtt,
        _ => s.rtt,
    };
    rto + s.t_inj()
}

/// Probability a submessage decodes (appendix B).
pub fn p_decode(code: Code, k: u32, m: u32, p: f64) -> f64 {
    match code {
        Code::Mds => (0..=m)
            .map(|i| binomial(k + m, i) * p.powi(i as i32) * (1.0 - p).powi((k + m - i) as i32))
            .sum(),
        Code::Xor => {
            let n = (k / m.max(1) + 1) as i32;
            ((1.0 - p).powi(n) + n as f64 * p * (1.0 - p).powi(n - 1)).powi(m as i32)
        }
    }
}

fn binomial(n: u32, k: u32) -> f64 {
    (0..k).fold(1.0, |acc, i| acc * (n - i) as f64 / (i + 1) as f64)
}

/// EC's parts: injection time, submessages, probability one fails, the fallback's fixed cost.
fn ec_parts(s: &Setup, code: Code, k: u32, m: u32, beta: f64) -> (f64, u64, f64, f64) {
    let chunks = s.chunks();
    let parity = (chunks * u64::from(m)).div_ceil(u64::from(k));
    let inj = (chunks + parity) as f64 * s.t_inj();
    let l = chunks.div_ceil(u64::from(k));
    let fail = 1.0 - p_decode(code, k, m, s.p_chunk());
    (inj, l, fail, inj + (1.0 + beta) * s.rtt)
}

/// The model's expected and 99.9th-percentile completion time.
pub fn analytic(s: &Setup, scheme: Scheme) -> Prediction {
    let p = s.p_chunk();
    match scheme {
        Scheme::SrRto { .. } | Scheme::SrNack => {
            let max = SrMax::new(
                s.chunks(),
                s.t_inj(),
                sr_overhead(s, scheme),
                (p, s.p_resend()),
            );
            let (mean, q) = max.mean_and_quantile(0.999);
            Prediction {
                mean: mean + s.rtt,
                p999: q + s.rtt,
            }
        }
        Scheme::Ec { code, k, m, beta } => {
            let (inj, l, fail, fallback) = ec_parts(s, code, k, m, beta);
            // The fallback names the failed submessages: their chunks go again a round trip
            // after a loss, as with NACKs.
            let o = sr_overhead(s, Scheme::SrNack);
            // P(f) for f = 0, 1, ..: Binomial(L, fail), until what is left is negligible.
            let mut pf = (1.0 - fail).powf(l as f64);
            let mut terms = vec![(0u64, pf)];
            let mut left = 1.0 - pf;
            let mut f = 0u64;
            while left > 1e-15 && f < l {
                pf *= (l - f) as f64 / (f + 1) as f64 * fail / (1.0 - fail).max(f64::MIN_POSITIVE);
                f += 1;
                left -= pf;
                terms.push((f, pf));
            }
            // Every send in the fallback is a resend of a chunk that was lost.
            let pr = s.p_resend();
            let sr = |f: u64| SrMax::new(f * u64::from(k), s.t_inj(), o, (pr, pr));
            let mut mean = terms[0].1 * (inj + s.rtt);
            for &(f, pf) in &terms[1..] {
                mean += pf * (fallback + sr(f).mean_and_quantile(0.5).0 + s.rtt);
            }
            // The 99.9th percentile of the mixture, by bisection on its CDF.
            let cdf = |x: f64| {
                let mut c = if x >= inj + s.rtt { terms[0].1 } else { 0.0 };
                for &(f, pf) in &terms[1..] {
                    c += pf * sr(f).cdf(x - fallback - s.rtt);
                }
                c
            };
            let (mut lo, mut hi) = (0.0, inj + s.rtt);
            while cdf(hi) < 0.999 {
                hi *= 2.0;
            }
            for _ in 0..60 {
                let mid = 0.5 * (lo + hi);
                if cdf(mid) >= 0.999 {
                    hi = mid;
                } else {
                    lo = mid;
                }
            }
            Prediction { mean, p999: hi }
        }
    }
}

/// A small deterministic generator (SplitMix64) for the Monte Carlo runs (and the tests).
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1].
    pub(crate) fn unit(&mut self) -> f64 {
        ((self.next() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }

    /// Calls `f` with the index of each of `n` trials that fails, each with `p`, skipping
    /// the successes by geometric draws instead of visiting them.
    fn each_lost(&mut self, n: u64, p: f64, mut f: impl FnMut(&mut Self, u64)) {
        let mut i = self.failures(1.0 - p);
        while i < n {
            f(self, i);
            i = i.saturating_add(1).saturating_add(self.failures(1.0 - p));
        }
    }

    /// Failures before the first success, each trial failing with `p`.
    fn failures(&mut self, p: f64) -> u64 {
        if p <= 0.0 {
            return 0;
        }
        if p >= 1.0 {
            return u64::MAX;
        }
        (self.unit().ln() / p.ln()).floor() as u64
    }
}

/// One draw of `max_i X_i` over `n` chunks.
fn sr_draw(rng: &mut Rng, n: u64, t_inj: f64, o: f64, (p, p2): (f64, f64)) -> f64 {
    let mut max = n as f64 * t_inj;
    // The chunks whose first transmission is lost; chunk `i + 1` starts at `(i + 1)·T_INJ`.
    rng.each_lost(n, p, |rng, i| {
        let losses = 1 + rng.failures(p2);
        max = max.max((i + 1) as f64 * t_inj + losses as f64 * o);
    });
    max
}

/// `runs` simulated Writes' completion times, seconds, in draw order (for a spread, or a
/// test of a sample against the model).
pub fn monte_carlo_draws(s: &Setup, scheme: Scheme, runs: usize, seed: u64) -> Vec<f64> {
    let mut rng = Rng(seed);
    let p = s.p_chunk();
    (0..runs.max(1))
        .map(|_| match scheme {
            Scheme::SrRto { .. } | Scheme::SrNack => {
                let o = sr_overhead(s, scheme);
                sr_draw(&mut rng, s.chunks(), s.t_inj(), o, (p, s.p_resend())) + s.rtt
            }
            Scheme::Ec { code, k, m, beta } => {
                let (inj, l, _, fallback) = ec_parts(s, code, k, m, beta);
                let failed = (0..l)
                    .filter(|_| !ec_submessage(&mut rng, code, k, m, p))
                    .count();
                if failed == 0 {
                    inj + s.rtt
                } else {
                    let o = sr_overhead(s, Scheme::SrNack);
                    let n = failed as u64 * u64::from(k);
                    let pr = s.p_resend();
                    fallback + sr_draw(&mut rng, n, s.t_inj(), o, (pr, pr)) + s.rtt
                }
            }
        })
        .collect()
}

/// The mean and 99.9th percentile of `runs` simulated Writes.
pub fn monte_carlo(s: &Setup, scheme: Scheme, runs: usize, seed: u64) -> Prediction {
    let mut times = monte_carlo_draws(s, scheme, runs, seed);
    times.sort_by(f64::total_cmp);
    let mean = times.iter().sum::<f64>() / times.len() as f64;
    let at = ((times.len() as f64 * 0.999).ceil() as usize).clamp(1, times.len()) - 1;
    Prediction {
        mean,
        p999: times[at],
    }
}

/// Whether one submessage decodes, its `k + m` chunks each lost with `p`.
fn ec_submessage(rng: &mut Rng, code: Code, k: u32, m: u32, p: f64) -> bool {
    let n = k + m;
    let mut lost_data = vec![0u32; m as usize];
    let mut lost_parity = vec![false; m as usize];
    let mut lost = 0u32;
    rng.each_lost(u64::from(n), p, |_, i| {
        let c = i as u32;
        lost += 1;
        if c < k {
            lost_data[(c % m) as usize] += 1;
        } else {
            lost_parity[(c - k) as usize] = true;
        }
    });
    match code {
        Code::Mds => lost <= m,
        Code::Xor => (0..m as usize).all(|g| lost_data[g] + u32::from(lost_parity[g]) <= 1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCHEMES: [Scheme; 4] = [
        Scheme::SR_RTO,
        Scheme::SrNack,
        Scheme::ec(Code::Mds),
        Scheme::ec(Code::Xor),
    ];

    fn setup(bytes: u64, p_packet: f64) -> Setup {
        Setup {
            bytes,
            chunk: 64 << 10,
            mtu: 4096,
            gbps: 400.0,
            rtt: 0.025,
            p_packet,
            per_packet: false,
        }
    }

    #[test]
    fn no_loss_is_the_lossless_time() {
        let s = setup(128 << 20, 0.0);
        for scheme in [Scheme::SR_RTO, Scheme::SrNack] {
            let a = analytic(&s, scheme);
            assert!((a.mean - s.lossless()).abs() < 1e-12, "{a:?}");
            assert!((a.p999 - s.lossless()).abs() < 1e-12, "{a:?}");
        }
        let ec = analytic(&s, Scheme::ec(Code::Mds));
        assert!(
            (ec.mean - (s.lossless() + 512.0 * s.t_inj())).abs() < 1e-9,
            "{ec:?}"
        );
    }

    #[test]
    fn one_chunk_costs_its_expected_retransmissions() {
        // One chunk: E[max X] = T_INJ + O·p/(1 − p).
        let s = Setup {
            bytes: 64 << 10,
            ..setup(0, 0.0)
        };
        let p = 0.1;
        let max = SrMax::new(1, s.t_inj(), 0.075, (p, p));
        let (mean, _) = max.mean_and_quantile(0.999);
        let want = s.t_inj() + 0.075 * p / (1.0 - p);
        assert!((mean - want).abs() < 1e-9, "{mean} vs {want}");
    }

    /// Not a check: the slowdowns at the paper's Figure 10 points, for the record
    /// (`cargo test --release -p ferroce-reliability print_figure_10 -- --ignored --nocapture`).
    #[test]
    #[ignore = "prints a table"]
    fn print_figure_10() {
        for p in [1e-6, 1e-5, 1e-4, 1e-3, 1e-2] {
            let s = setup(128 << 20, p);
            for scheme in SCHEMES {
                let a = analytic(&s, scheme);
                let m = monte_carlo(&s, scheme, 2000, 1);
                eprintln!(
                    "p_packet {p:e} p_chunk {:.2e} {:7}: mean {:.2}x (mc {:.2}x) p99.9 {:.2}x (mc {:.2}x)",
                    s.p_chunk(),
                    scheme.name(),
                    a.mean / s.lossless(),
                    m.mean / s.lossless(),
                    a.p999 / s.lossless(),
                    m.p999 / s.lossless()
                );
            }
        }
    }

    #[test]
    fn the_chunk_drop_probability_follows_the_packets() {
        let s = setup(1 << 20, 1e-5);
        let want = 1.0 - (1.0 - 1e-5f64).powi(16);
        assert!((s.p_chunk() - want).abs() < 1e-15);
    }

    /// Analytic and Monte Carlo means agree within 5 % wherever both apply; the 99.9th
    /// percentiles within 10 % where the quantile is not at a step of the distribution. At
    /// 16 MiB and p_chunk 1.6e-2, `P(max ≥ the three-loss step)` is about 1.03e-3, so the
    /// true quantile is that step (0.25 s) while 4000 draws see about four samples past it
    /// and read the step below (0.175 s): both right, the tail is not compared there.
    #[test]
    fn analytic_agrees_with_monte_carlo() {
        for (bytes, p, tails) in [
            (128u64 << 20, 1e-5, true),
            (128 << 20, 1e-4, true),
            (16 << 20, 1e-3, false),
        ] {
            let s = setup(bytes, p);
            for scheme in SCHEMES {
                let a = analytic(&s, scheme);
                let m = monte_carlo(&s, scheme, 4000, 7);
                let rel = (a.mean - m.mean).abs() / m.mean;
                let tail = (a.p999 - m.p999).abs() / m.p999;
                assert!(
                    rel < 0.05 && (!tails || tail < 0.10),
                    "{} {bytes} {p}: analytic {a:?}, monte carlo {m:?}",
                    scheme.name()
                );
            }
        }
    }

    /// With the per-packet bitmap a resent chunk is about as likely lost as one packet, so
    /// SR's tail shrinks where chunks are often lost, and analytic still agrees with Monte
    /// Carlo.
    #[test]
    fn keeping_packets_makes_resends_cheaper() {
        let paper = setup(128 << 20, 1e-2);
        let kept = Setup {
            per_packet: true,
            ..paper
        };
        assert_eq!(paper.p_resend(), paper.p_chunk());
        assert!(
            (kept.p_resend() - 0.0108).abs() < 5e-4,
            "{}",
            kept.p_resend()
        );
        for scheme in SCHEMES {
            let (a, b) = (analytic(&paper, scheme), analytic(&kept, scheme));
            assert!(
                b.mean <= a.mean + 1e-12,
                "{}: {b:?} vs {a:?}",
                scheme.name()
            );
            let mc = monte_carlo(&kept, scheme, 4000, 9);
            assert!(
                (mc.mean - b.mean).abs() <= 0.05 * b.mean,
                "{}: {mc:?} vs {b:?}",
                scheme.name()
            );
        }
        let sr = |s: &Setup| analytic(s, Scheme::SR_RTO).mean / s.lossless();
        assert!(
            sr(&kept) < 0.8 * sr(&paper),
            "{} vs {}",
            sr(&kept),
            sr(&paper)
        );
    }
}
