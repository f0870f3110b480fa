//! One direction of a simulated link: serialization at a bandwidth, a tail-drop queue,
//! propagation delay, and the impairments (loss, duplication, reordering, corruption, up/down
//! schedule). Each direction draws from its own seeded RNG, so adding traffic on one link never
//! changes the random choices of another.

use rand::{Rng, RngCore};
use rand_xoshiro::Xoshiro256PlusPlus;

/// Bytes a frame occupies on the wire beyond its own: preamble and start delimiter (8),
/// FCS (4) and the minimum inter-frame gap (12). Serialization time counts them, as a real
/// 100 GbE port does.
pub const WIRE_OVERHEAD: usize = 24;

/// How frames get lost.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum Loss {
    /// Nothing is lost.
    #[default]
    None,
    /// Each frame is lost independently with this probability.
    Bernoulli(f64),
    /// Bursty loss: a two-state Markov chain (Gilbert-Elliott). Before each frame the state
    /// moves Good→Bad with `p_good_to_bad` or Bad→Good with `p_bad_to_good`; the frame is then
    /// lost with the current state's loss probability.
    GilbertElliott {
        /// Probability of entering the bad state, per frame.
        p_good_to_bad: f64,
        /// Probability of leaving the bad state, per frame.
        p_bad_to_good: f64,
        /// Loss probability in the good state.
        loss_good: f64,
        /// Loss probability in the bad state.
        loss_bad: f64,
    },
}

impl Loss {
    /// The long-run loss rate the model produces.
    pub fn mean_rate(&self) -> f64 {
        match *self {
            Self::None => 0.0,
            Self::Bernoulli(p) => p,
            Self::GilbertElliott {
                p_good_to_bad,
                p_bad_to_good,
                loss_good,
                loss_bad,
            } => {
                let total = p_good_to_bad + p_bad_to_good;
                if total == 0.0 {
                    return loss_good;
                }
                let bad = p_good_to_bad / total;
                bad * loss_bad + (1.0 - bad) * loss_good
            }
        }
    }
}

/// ECN marking at a direction's egress queue, RED-style (DCQCN's congestion point): a frame
/// that finds `q` bytes queued ahead of it is marked Congestion Experienced with probability
/// 0 up to `kmin_bytes`, rising linearly to `pmax` at `kmax_bytes`, and 1 beyond — if it is
/// ECN-capable (ECT(0) or ECT(1)); a Not-ECT frame is never marked, a CE one stays CE.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Red {
    /// Below this queue, no marking.
    pub kmin_bytes: usize,
    /// Above this queue, every ECN-capable frame is marked.
    pub kmax_bytes: usize,
    /// The marking probability at `kmax_bytes`.
    pub pmax: f64,
}

impl Red {
    /// The DCQCN paper's recommendation for 40 Gbit/s (Kmin 5 KB, Kmax 200 KB, Pmax 1 %),
    /// with the thresholds scaled to `bandwidth_bps` (the same queueing delay).
    pub fn dcqcn(bandwidth_bps: u64) -> Self {
        let scale = bandwidth_bps as f64 / 40e9;
        Self {
            kmin_bytes: (5_000.0 * scale) as usize,
            kmax_bytes: (200_000.0 * scale) as usize,
            pmax: 0.01,
        }
    }

    /// The probability a frame finding `queue_bytes` ahead of it is marked.
    pub fn probability(&self, queue_bytes: usize) -> f64 {
        if queue_bytes <= self.kmin_bytes {
            0.0
        } else if queue_bytes > self.kmax_bytes {
            1.0
        } else {
            let span = (self.kmax_bytes - self.kmin_bytes).max(1) as f64;
            self.pmax * (queue_bytes - self.kmin_bytes) as f64 / span
        }
    }
}

/// The behaviour of one direction of a link.
#[derive(Clone, Debug, PartialEq)]
pub struct LinkModel {
    /// Bits per second; 0 means frames serialize instantly.
    pub bandwidth_bps: u64,
    /// One-way propagation delay in nanoseconds.
    pub delay_ns: u64,
    /// Tail-drop limit on bytes waiting to be serialized; 0 means unlimited.
    pub queue_limit_bytes: usize,
    /// Loss model.
    pub loss: Loss,
    /// Probability that a frame is delivered twice.
    pub duplicate: f64,
    /// Probability that a frame is held back by `reorder_delay_ns`, so later frames overtake it.
    pub reorder: f64,
    /// Extra delay of a reordered frame.
    pub reorder_delay_ns: u64,
    /// Probability that one random bit of a frame is flipped.
    pub corrupt: f64,
    /// Link state changes `(time_ns, up)`, in time order; the link starts up. A frame is lost
    /// if the link is down when it starts serializing or when it would arrive.
    pub schedule: Vec<(u64, bool)>,
    /// Windows `[from, until)` in which the link is down besides the schedule: injected
    /// faults (a NIC, a cable, a switch), which may overlap; the link is up again only when
    /// none covers the time.
    pub outages: Vec<(u64, u64)>,
    /// Windows `[from, until)` in which the link stays up (its carrier says nothing) but
    /// loses every frame offered: a black hole, the failure no link event announces.
    pub blackholes: Vec<(u64, u64)>,
    /// Windows `[from, until, bits per second)` in which the link runs slower than
    /// `bandwidth_bps`: a partial degradation (a port that trained down, lanes lost), which
    /// drops nothing and which only the port's rate tells. The lowest of overlapping ones
    /// holds.
    pub slowdowns: Vec<(u64, u64, u64)>,
    /// ECN marking at this direction's queue; `None`: none (a switch without ECN).
    pub ecn: Option<Red>,
}

impl Default for LinkModel {
    fn default() -> Self {
        Self {
            bandwidth_bps: 100_000_000_000,
            delay_ns: 1_000,
            queue_limit_bytes: 4 << 20,
            loss: Loss::None,
            duplicate: 0.0,
            reorder: 0.0,
            reorder_delay_ns: 5_000,
            corrupt: 0.0,
            schedule: Vec::new(),
            outages: Vec::new(),
            blackholes: Vec::new(),
            slowdowns: Vec::new(),
            ecn: None,
        }
    }
}

impl LinkModel {
    /// A perfect link: `bandwidth_bps` and `delay_ns`, nothing else.
    pub fn new(bandwidth_bps: u64, delay_ns: u64) -> Self {
        Self {
            bandwidth_bps,
            delay_ns,
            ..Self::default()
        }
    }

    /// Whether the link is up at `t`.
    pub fn is_up(&self, t: u64) -> bool {
        // The schedule is sorted: the last change at or before t decides.
        let n = self.schedule.partition_point(|&(at, _)| at <= t);
        (n == 0 || self.schedule[n - 1].1) && !within(&self.outages, t)
    }

    /// Whether frames offered at `t` fall into a black hole.
    pub fn is_blackholed(&self, t: u64) -> bool {
        within(&self.blackholes, t)
    }

    /// The first time after `t` at which the link goes up or down or a black hole opens or
    /// closes: an event the fabric's clock stops at, so a port polled then sees the change.
    pub fn next_change(&self, t: u64) -> Option<u64> {
        let n = self.schedule.partition_point(|&(at, _)| at <= t);
        let scheduled = self.schedule.get(n).map(|&(at, _)| at);
        let holes = self
            .blackholes
            .iter()
            .chain(&self.outages)
            .flat_map(|&(from, until)| [from, until])
            .filter(|&at| at > t)
            .min();
        match (scheduled, holes) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Down from `from` until `until` (an outage; overlapping ones add up).
    pub fn down_between(mut self, from: u64, until: u64) -> Self {
        self.outages.push((from, until));
        self
    }

    /// Down from `t` for `down_ns`, then up again: a flap (on the schedule, which takes
    /// thousands of them cheaply).
    pub fn flap(mut self, t: u64, down_ns: u64) -> Self {
        self.schedule.push((t, false));
        self.schedule.push((t + down_ns, true));
        self.schedule.sort_by_key(|&(at, _)| at);
        self
    }

    /// The rate at `t`: `bandwidth_bps`, or the lowest slowdown covering `t`.
    pub fn rate_at(&self, t: u64) -> u64 {
        self.slowdowns
            .iter()
            .filter(|&&(from, until, _)| from <= t && t < until)
            .map(|&(_, _, bps)| bps)
            .fold(self.bandwidth_bps, u64::min)
    }

    fn serialize_ns(&self, len: usize, t: u64) -> u64 {
        let bps = self.rate_at(t);
        if bps == 0 {
            return 0;
        }
        let bits = (len + WIRE_OVERHEAD) as u128 * 8;
        (bits * 1_000_000_000).div_ceil(u128::from(bps)) as u64
    }
}

/// Whether `t` falls in one of `windows` (`[from, until)`).
fn within(windows: &[(u64, u64)], t: u64) -> bool {
    windows.iter().any(|&(from, until)| from <= t && t < until)
}

ferroce_stack::counter_set! {
    /// Counters of one link direction.
    pub struct LinkStats {
        /// Frames offered to the link.
        offered,
        /// Bytes offered.
        offered_bytes,
        /// Frames that arrived at the far end (duplicates included).
        delivered,
        /// Tail drops at a full queue.
        dropped_queue,
        /// Frames the loss model took.
        dropped_loss,
        /// Frames lost because the link was down.
        dropped_down,
        /// Frames lost in a black hole (the link up).
        dropped_blackhole,
        /// Extra copies delivered.
        duplicated,
        /// Frames held back so later ones overtook them.
        reordered,
        /// Frames with a flipped bit.
        corrupted,
        /// ECN-capable frames marked Congestion Experienced.
        ecn_marked,
    }
}

/// What the channel decided for one frame.
pub(crate) struct Fate {
    /// Arrival time at the far end, or `None` when the frame is lost.
    pub(crate) arrival: Option<u64>,
    /// Arrival time of a duplicate copy.
    pub(crate) duplicate_at: Option<u64>,
    /// Bit to flip, if corrupted.
    pub(crate) flip_bit: Option<usize>,
    /// Mark it Congestion Experienced, if it is ECN-capable.
    pub(crate) mark_ce: bool,
}

/// One direction of a link in flight.
pub(crate) struct Channel {
    pub(crate) model: LinkModel,
    pub(crate) stats: LinkStats,
    rng: Xoshiro256PlusPlus,
    busy_until: u64,
    bad_state: bool,
}

impl Channel {
    pub(super) fn new(model: LinkModel, rng: Xoshiro256PlusPlus) -> Self {
        Self {
            model,
            stats: LinkStats::default(),
            rng,
            busy_until: 0,
            bad_state: false,
        }
    }

    fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && self.rng.random_bool(p.min(1.0))
    }

    fn lost(&mut self) -> bool {
        match self.model.loss {
            Loss::None => false,
            Loss::Bernoulli(p) => self.chance(p),
            Loss::GilbertElliott {
                p_good_to_bad,
                p_bad_to_good,
                loss_good,
                loss_bad,
            } => {
                let flip = if self.bad_state {
                    p_bad_to_good
                } else {
                    p_good_to_bad
                };
                if self.chance(flip) {
                    self.bad_state = !self.bad_state;
                }
                let p = if self.bad_state { loss_bad } else { loss_good };
                self.chance(p)
            }
        }
    }

    /// Decides the fate of a `len`-byte frame offered at `now`. The random draws happen in a
    /// fixed order whatever the outcome, so one frame's fate never shifts another's.
    pub(super) fn offer(&mut self, now: u64, len: usize) -> Fate {
        self.stats.offered += 1;
        self.stats.offered_bytes += len as u64;
        let lost = self.lost();
        let dup = self.chance(self.model.duplicate);
        let reorder = self.chance(self.model.reorder);
        let corrupt = self.chance(self.model.corrupt);
        let bit = self.rng.next_u64() as usize % (len.max(1) * 8);
        // Only a link that marks draws for it, so the streams of the others stay as they were.
        let red_draw = self.model.ecn.map(|_| self.rng.random::<f64>());
        let none = Fate {
            arrival: None,
            duplicate_at: None,
            flip_bit: None,
            mark_ce: false,
        };

        if !self.model.is_up(now) {
            self.stats.dropped_down += 1;
            return none;
        }
        if self.model.is_blackholed(now) {
            self.stats.dropped_blackhole += 1;
            return none;
        }
        let start = now.max(self.busy_until);
        let bps = self.model.rate_at(now);
        if self.model.queue_limit_bytes > 0 && bps > 0 {
            let backlog_ns = start - now;
            let backlog_bytes = (u128::from(backlog_ns) * u128::from(bps) / 8_000_000_000) as usize;
            if backlog_bytes + len > self.model.queue_limit_bytes {
                self.stats.dropped_queue += 1;
                return none;
            }
        }
        let mark_ce = match (self.model.ecn, red_draw) {
            (Some(red), Some(x)) if bps > 0 => {
                let queued = (u128::from(start - now) * u128::from(bps) / 8_000_000_000) as usize;
                x < red.probability(queued)
            }
            _ => false,
        };
        let depart = start + self.model.serialize_ns(len, start);
        self.busy_until = depart;
        if lost {
            self.stats.dropped_loss += 1;
            return none;
        }
        let mut arrival = depart + self.model.delay_ns;
        if reorder {
            self.stats.reordered += 1;
            arrival += self.model.reorder_delay_ns;
        }
        if !self.model.is_up(arrival) {
            self.stats.dropped_down += 1;
            return none;
        }
        self.stats.delivered += 1;
        let duplicate_at = dup.then(|| {
            self.stats.duplicated += 1;
            self.stats.delivered += 1;
            arrival + self.model.serialize_ns(len, depart)
        });
        let flip_bit = corrupt.then(|| {
            self.stats.corrupted += 1;
            bit
        });
        Fate {
            arrival: Some(arrival),
            duplicate_at,
            flip_bit,
            mark_ce,
        }
    }

    /// Whether the direction is up at `t`.
    pub(super) fn is_up(&self, t: u64) -> bool {
        self.model.is_up(t)
    }

    /// Down in `[from, until)`, added while the fabric runs.
    pub(super) fn add_down(&mut self, from: u64, until: u64) {
        self.model.outages.push((from, until));
    }

    /// When this direction next goes up or down or opens or closes a black hole.
    pub(super) fn next_change(&self, t: u64) -> Option<u64> {
        self.model.next_change(t)
    }

    /// A black hole in `[from, until)`, added while the fabric runs.
    pub(super) fn add_blackhole(&mut self, from: u64, until: u64) {
        self.model.blackholes.push((from, until));
    }

    /// A slowdown to `bps` in `[from, until)`, added while the fabric runs.
    pub(super) fn add_slowdown(&mut self, from: u64, until: u64, bps: u64) {
        self.model.slowdowns.push((from, until, bps));
    }

    /// The rate at `t`.
    pub(super) fn rate_at(&self, t: u64) -> u64 {
        self.model.rate_at(t)
    }

    /// Bytes waiting to be serialized at `now` (what a frame offered now finds ahead of it).
    pub(super) fn backlog_bytes(&self, now: u64) -> usize {
        let bps = self.model.rate_at(now);
        let wait = self.busy_until.saturating_sub(now);
        (u128::from(wait) * u128::from(bps) / 8_000_000_000) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    /// RED by hand: nothing up to Kmin, linear to Pmax at Kmax, everything beyond; the
    /// paper's 40 G thresholds scaled to 100 G. A link that marks marks frames that queue
    /// beyond Kmax, never one that finds the queue empty.
    #[test]
    fn red_marks_by_the_queue_it_finds() {
        let red = Red::dcqcn(100_000_000_000);
        assert_eq!((red.kmin_bytes, red.kmax_bytes), (12_500, 500_000));
        assert_eq!(red.probability(12_500), 0.0);
        assert!((red.probability(256_250) - 0.005).abs() < 1e-9);
        assert_eq!(red.probability(500_001), 1.0);
        let mut m = LinkModel::new(1_000_000_000, 0);
        m.queue_limit_bytes = 0;
        m.ecn = Some(Red {
            kmin_bytes: 2_000,
            kmax_bytes: 4_000,
            pmax: 0.5,
        });
        let mut c = Channel::new(m, Xoshiro256PlusPlus::seed_from_u64(3));
        // Ten 1000-byte frames at once: the n-th finds (n · 1024) bytes ahead of it.
        let marks: Vec<bool> = (0..10).map(|_| c.offer(0, 1000).mark_ce).collect();
        assert!(!marks[0] && !marks[1], "{marks:?}");
        assert!(marks[4..].iter().all(|&m| m), "beyond Kmax: {marks:?}");
    }

    /// A slowdown stretches serialization only inside its window, loses nothing, and the
    /// lowest of overlapping ones holds.
    #[test]
    fn a_slowdown_stretches_serialization_in_its_window() {
        let mut m = LinkModel::new(1_000_000_000, 0);
        m.queue_limit_bytes = 0;
        m.slowdowns.push((1_000_000, 2_000_000, 250_000_000));
        m.slowdowns.push((1_500_000, 1_600_000, 100_000_000));
        assert_eq!(m.rate_at(0), 1_000_000_000);
        assert_eq!(m.rate_at(1_000_000), 250_000_000);
        assert_eq!(m.rate_at(1_550_000), 100_000_000);
        assert_eq!(m.rate_at(2_000_000), 1_000_000_000);
        let mut c = Channel::new(m, Xoshiro256PlusPlus::seed_from_u64(1));
        // 1000 bytes + 24 of overhead: 8192 ns at 1 Gbit/s, four times that at 250 Mbit/s.
        assert_eq!(c.offer(0, 1000).arrival, Some(8_192));
        assert_eq!(c.offer(1_000_000, 1000).arrival, Some(1_000_000 + 32_768));
        assert_eq!(c.stats.delivered, 2);
    }

    /// Overlapping faults add up: the link is up only when none covers the time; black holes
    /// keep the carrier; every edge is a change the clock can stop at.
    #[test]
    fn outages_overlap_and_every_edge_is_a_change() {
        let mut m = LinkModel::new(1_000_000_000, 10)
            .down_between(100, 300)
            .down_between(200, 400)
            .flap(1_000, 50);
        m.blackholes.push((500, 600));
        for (t, up) in [
            (99, true),
            (100, false),
            (250, false),
            (350, false),
            (400, true),
        ] {
            assert_eq!(m.is_up(t), up, "t = {t}");
        }
        assert!(m.is_up(550) && m.is_blackholed(550) && !m.is_blackholed(600));
        assert!(!m.is_up(1_020) && m.is_up(1_050));
        let mut t = 0;
        let mut edges = Vec::new();
        while let Some(n) = m.next_change(t) {
            edges.push(n);
            t = n;
        }
        assert_eq!(edges, [100, 200, 300, 400, 500, 600, 1_000, 1_050]);
    }
}
