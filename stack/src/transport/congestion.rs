//! Congestion control: how much a QP may have in flight and how fast it may send.
//!
//! Sans-IO like [`Recovery`](super::Recovery), on the model of quinn-proto's
//! `congestion::Controller`: the QP reports what happens (a packet sent, packets
//! acknowledged with an RTT sample, a CNP, a loss, a timeout) and asks for a window and a
//! pacing rate. The requester sends no new packet past the smaller of this window and the
//! recovery policy's, and (when a rate is given) none before its pacing time. The window a
//! recovery policy keeps is how far ahead it can track (a selective-repeat bitmap's size);
//! the one here is how far ahead the network can take.

use core::fmt;

use crate::wire::Psn;

/// What an acknowledgement told the sender.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AckEvent {
    /// Packets newly acknowledged (the oldest unacknowledged PSN moved by this much).
    pub acked: u32,
    /// Round-trip time of the newest packet this acknowledgement covers, in ns, when that
    /// packet was sent once (a retransmitted packet gives no sample: Karn's rule).
    pub rtt: Option<u64>,
}

/// How a loss was found, which tells a controller how much was resent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Loss {
    /// The requester went back and resends everything from the first missing PSN on.
    GoBack,
    /// The requester resends single packets.
    Selective,
}

/// A congestion-control policy. All events default to doing nothing, so an implementation
/// overrides what it reacts to.
pub trait CongestionControl: Send + fmt::Debug {
    /// A short name for logs and reports.
    fn name(&self) -> &'static str;

    /// Packet `psn` of `bytes` bytes (the whole frame) left at `now`.
    fn on_sent(&mut self, now: u64, psn: Psn, bytes: usize, retransmission: bool) {
        let _ = (now, psn, bytes, retransmission);
    }

    /// An acknowledgement moved the window.
    fn on_ack(&mut self, now: u64, ack: AckEvent) {
        let _ = (now, ack);
    }

    /// A congestion notification packet arrived for this QP.
    fn on_cnp(&mut self, now: u64) {
        let _ = now;
    }

    /// The recovery policy found a loss and the requester resends.
    fn on_loss(&mut self, now: u64, loss: Loss) {
        let _ = (now, loss);
    }

    /// The local ACK timer expired.
    fn on_timeout(&mut self, now: u64) {
        let _ = now;
    }

    /// Most packets past the oldest unacknowledged one; `None`: no limit of its own.
    fn window(&self) -> Option<u32> {
        None
    }

    /// Bytes per second the QP may send at; `None`: unpaced.
    fn pacing_rate(&self) -> Option<u64> {
        None
    }
}

/// Packets a requester may have past `una` right after a Go-Back-N rewind, widened by one for
/// each packet acknowledged (slow start) until the recovery policy's window is back.
/// Resending the whole window at once into a receiver that has just dropped part of it — an
/// AF_PACKET ring whose engine thread waited for a core — loses again, and enough rounds of
/// that exhaust `retry_cnt` (seen with perftest's `ib_write_bw -q 4`: four QPs of 128 × 64 KiB).
/// At least 64, so the restart window always holds a packet with AckReq set (every 64th PSN
/// has it).
pub const RESTART_WINDOW: u32 = 128;

/// No congestion control: no window or rate of its own, except a restart window after a
/// Go-Back-N rewind ([`RESTART_WINDOW`]). What every QP ran before congestion control
/// existed, and the default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NoControl {
    /// After a rewind: the window, grown by one per packet acknowledged since.
    restart: Option<u32>,
}

impl CongestionControl for NoControl {
    fn name(&self) -> &'static str {
        "none"
    }

    fn on_ack(&mut self, _now: u64, ack: AckEvent) {
        if let Some(w) = self.restart.as_mut() {
            *w = w.saturating_add(ack.acked);
        }
    }

    fn on_loss(&mut self, _now: u64, loss: Loss) {
        if loss == Loss::GoBack {
            self.restart = Some(RESTART_WINDOW);
        }
    }

    fn window(&self) -> Option<u32> {
        self.restart
    }
}

/// A fixed pacing rate and no window: a sender that must not outrun its link on its own — a
/// UC QP has no window, and SDR's one-shot send of a large message would otherwise put every
/// packet into the first switch queue at once (issue 21).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FixedRate {
    /// Bytes per second of frames (headers included, the wire's preamble and gap not).
    pub bytes_per_sec: u64,
}

impl FixedRate {
    /// The frame rate that fills `gbps` of link with `frame`-byte frames, each costing
    /// `overhead` more bytes of wire time (preamble, FCS, gap: 24 on Ethernet).
    pub fn filling(gbps: f64, frame: usize, overhead: usize) -> Self {
        let share = frame as f64 / (frame + overhead) as f64;
        Self {
            bytes_per_sec: (gbps * 1e9 / 8.0 * share) as u64,
        }
    }
}

impl CongestionControl for FixedRate {
    fn name(&self) -> &'static str {
        "fixed-rate"
    }

    fn pacing_rate(&self) -> Option<u64> {
        Some(self.bytes_per_sec)
    }
}
