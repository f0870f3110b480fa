//! Choosing the reliability scheme per message with the completion-time model (issue 21,
//! item 5): before each message the sender asks the model which of selective repeat (with
//! NACKs) and the connection's EC(k, m) finishes sooner on average, at the RTT and chunk drop
//! rate it measured so far, and sends the message that way.
//!
//! The measurements: the RTT from each acknowledgement (the time since the newest chunk it
//! is first to show left), smoothed as TCP smooths it (7/8 old, 1/8 new); the chunk drop
//! rate from each completed message — chunks sent again plus chunks the receiver rebuilt,
//! over its data chunks — with older messages' counts halved at each new one, so a change of
//! conditions shows within a few messages. Before any loss was seen, SR is the choice: EC's
//! parity then buys nothing.

use super::model::{self, Scheme};

ferroce_stack::counter_set! {
    /// What the chooser decided.
    pub struct AutoStats {
        /// Messages sent with selective repeat.
        chose_sr,
        /// Messages sent with the erasure code.
        chose_ec,
    }
}

/// One decision and why.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Decision {
    /// EC (true) or SR with NACKs.
    pub ec: bool,
    /// The RTT it assumed, ns.
    pub rtt_ns: f64,
    /// The chunk drop probability it assumed.
    pub p_chunk: f64,
    /// The model's mean completion time under SR, s.
    pub sr_mean: f64,
    /// The same under EC, s.
    pub ec_mean: f64,
}

/// The per-connection chooser.
#[derive(Clone, Debug)]
pub struct Chooser {
    gbps: f64,
    chunk: u64,
    mtu: u64,
    ec: Scheme,
    srtt: f64,
    chunks_seen: f64,
    chunks_lost: f64,
    stats: AutoStats,
    last: Option<Decision>,
}

impl Chooser {
    /// Chooses between SR with NACKs and `ec` on a `gbps` link, starting from `rtt_ns`.
    pub fn new(ec: Scheme, gbps: f64, rtt_ns: u64, chunk: u64, mtu: u64) -> Self {
        Self {
            gbps,
            chunk,
            mtu,
            ec,
            srtt: rtt_ns as f64,
            chunks_seen: 0.0,
            chunks_lost: 0.0,
            stats: AutoStats::default(),
            last: None,
        }
    }

    /// An RTT sample, ns.
    pub fn observe_rtt(&mut self, ns: u64) {
        self.srtt = 0.875 * self.srtt + 0.125 * ns as f64;
    }

    /// A message of `chunks` data chunks completed after `lost` of them were lost.
    pub fn observe_message(&mut self, chunks: u32, lost: u32) {
        self.chunks_seen = self.chunks_seen / 2.0 + f64::from(chunks);
        self.chunks_lost = self.chunks_lost / 2.0 + f64::from(lost.min(chunks));
    }

    /// The chunk drop rate measured so far.
    pub fn p_chunk(&self) -> f64 {
        if self.chunks_seen > 0.0 {
            self.chunks_lost / self.chunks_seen
        } else {
            0.0
        }
    }

    /// Decides for a message of `bytes`.
    pub fn choose(&mut self, bytes: u64) -> Decision {
        let p_chunk = self.p_chunk().min(0.5);
        // The model takes a packet drop rate; invert p_chunk = 1 − (1 − p)^(chunk/MTU).
        let packets = (self.chunk / self.mtu.max(1)).max(1) as f64;
        let p_packet = 1.0 - (1.0 - p_chunk).powf(1.0 / packets);
        let setup = model::Setup {
            bytes,
            chunk: self.chunk,
            mtu: self.mtu,
            gbps: self.gbps,
            rtt: self.srtt * 1e-9,
            p_packet,
            // ferroce's receiver keeps the packets of a partly arrived chunk.
            per_packet: true,
        };
        let sr_mean = model::analytic(&setup, Scheme::SrNack).mean;
        let ec_mean = model::analytic(&setup, self.ec).mean;
        let ec = ec_mean < sr_mean;
        if ec {
            self.stats.chose_ec += 1;
        } else {
            self.stats.chose_sr += 1;
        }
        let d = Decision {
            ec,
            rtt_ns: self.srtt,
            p_chunk,
            sr_mean,
            ec_mean,
        };
        self.last = Some(d);
        d
    }

    /// The latest decision.
    pub fn last(&self) -> Option<Decision> {
        self.last
    }

    /// The counters.
    pub fn stats(&self) -> AutoStats {
        self.stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sdr::model::Code;

    fn chooser() -> Chooser {
        Chooser::new(Scheme::ec(Code::Mds), 400.0, 25_000_000, 64 * 1024, 4096)
    }

    #[test]
    fn sr_while_nothing_is_lost_ec_once_losses_show_and_back_when_they_stop() {
        let mut c = chooser();
        let big = 128 << 20;
        assert!(!c.choose(big).ec, "no loss seen: parity buys nothing");
        // 2048 chunks, 30 lost: p_chunk ≈ 1.5 %, where SR pays RTTs and EC(32, 8) does not.
        c.observe_message(2048, 30);
        let d = c.choose(big);
        assert!(d.ec && d.ec_mean < d.sr_mean, "{d:?}");
        // Conditions clear up: after a few clean messages SR is back.
        for _ in 0..12 {
            c.observe_message(2048, 0);
        }
        assert!(!c.choose(big).ec, "{:?}", c.last());
        assert_eq!(
            c.stats(),
            AutoStats {
                chose_sr: 2,
                chose_ec: 1
            }
        );
    }

    #[test]
    fn a_short_rtt_makes_sr_cheap_again() {
        let mut c = chooser();
        c.observe_message(2048, 3);
        assert!(c.choose(128 << 20).ec);
        for _ in 0..200 {
            c.observe_rtt(2_000);
        }
        // At a few µs of RTT a resend costs less than a quarter more bytes on the wire.
        assert!(!c.choose(128 << 20).ec, "{:?}", c.last());
    }
}
