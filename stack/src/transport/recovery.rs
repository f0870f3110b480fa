//! The loss-recovery policy a reliable QP consults: how far ahead it can track, how its
//! responder treats packets that arrive ahead of the expected PSN, what to resend after a NAK
//! or a timeout, and, for selective repeat, when a missing PSN counts as lost. Which path a
//! packet takes is [`PathSelector`]'s to say, how much the network takes
//! [`CongestionControl`](super::CongestionControl)'s.
//!
//! The QP keeps the mechanism (PSN bookkeeping, memory, completions, the wire, the arrival
//! and acknowledgement bitmaps); a policy only decides. [`GoBackN`] is the IBTA behaviour and
//! the default, and the only one a hardware peer understands; selective repeat and the RNIC
//! baselines implement this trait in the `reliability` crate. It lives here rather than there
//! because the QP needs its default and `reliability` depends on this crate.

use core::fmt;

use smallvec::SmallVec;

use super::path::PathSelector;
use crate::wire::Psn;

/// The requester's PSN window when a policy is asked to decide.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendWindow {
    /// Oldest PSN not yet acknowledged.
    pub una: Psn,
    /// Next PSN never sent.
    pub nxt: Psn,
}

/// What the responder does with a request whose PSN is ahead of the expected one, in
/// Go-Back-N delivery.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutOfOrder {
    /// Drop it silently.
    Drop,
    /// Drop it and NAK with a PSN sequence error naming the expected PSN.
    NakAndDrop,
}

/// How request packets are delivered at the responder: both ends of a connection must agree
/// (it is negotiated at connection setup), because placement changes the WRITE opcodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Delivery {
    /// IBTA: in PSN order only; packets ahead of the expected PSN are dropped and the policy's
    /// [`Recovery::on_out_of_order`] says whether to NAK.
    InOrder,
    /// Direct data placement: every WRITE packet carries its own placement (ferroce's
    /// `SR_RDMA_WRITE_*` opcodes, as ConnectX's adaptive-routing mode puts a RETH in every
    /// packet) and lands on arrival, whatever its order; other requests that arrive early
    /// wait in a bounded buffer for their turn. Completions stay in order. The responder keeps
    /// a bitmap of arrivals and tells the requester what `Feedback` says.
    Placement(Feedback),
}

/// What a placing responder tells the requester beyond cumulative ACKs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Feedback {
    /// One NAK (PSN sequence error naming the expected PSN) per expected PSN, the first time
    /// a later packet arrives: ConnectX-7's selective repeat ("RNIC-SR").
    NakExpected,
    /// Nothing: recovery is the requester's timer alone ("timeout-only").
    AckOnly,
    /// Selective acknowledgements (`SR_ACKNOWLEDGE`: cumulative PSN, an arrival bitmap) with
    /// explicit loss reports decided by [`Recovery::on_arrival`], and path-avoidance signals.
    Selective,
}

/// What the requester resends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Retransmit {
    /// Go back: resend everything from this PSN on (Go-Back-N).
    From(Psn),
    /// Resend these PSNs only, then carry on with new data.
    Only(Psn, Option<Psn>),
    /// Resend the oldest unacknowledged PSN and every PSN after it that the responder has not
    /// reported arrived, up to the last one it reported (the holes of its bitmap).
    Holes,
}

/// The responder's arrival state, as a policy sees it when a packet arrives.
pub trait Arrivals {
    /// The expected PSN: everything before it arrived.
    fn epsn(&self) -> Psn;
    /// True when `psn` (at or after `epsn`) arrived.
    fn arrived(&self, psn: Psn) -> bool;
    /// True when `psn` was already reported lost.
    fn reported(&self, psn: Psn) -> bool;
    /// How many packets after `epsn`, up to and including `psn`, arrived: the out-of-order
    /// degree in packets. It is not the PSN distance, because a READ takes one PSN per
    /// response packet but crosses the request direction as one packet.
    fn ahead(&self, psn: Psn) -> u32 {
        let n = psn.distance(self.epsn()).max(0) as u32;
        (1..=n)
            .filter(|&i| self.arrived(self.epsn().add(i)))
            .count() as u32
    }
}

/// What a policy decided on an arrival: PSNs to report lost, a path the requester should
/// avoid for a while.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LossReport {
    /// PSNs now known lost.
    pub lost: SmallVec<[Psn; 4]>,
    /// A path (index) that looks broken.
    pub avoid: Option<u8>,
}

/// A reliability policy. Every method has the IBTA default except the two recovery
/// decisions, which are the point of a policy.
pub trait Recovery: Send + fmt::Debug {
    /// A short name for logs and reports.
    fn name(&self) -> &'static str;

    /// Most packets the requester keeps unacknowledged before it stops sending new ones:
    /// how far ahead the policy can track (a selective-repeat bitmap's size). Congestion
    /// control may allow less.
    fn window(&self) -> u32 {
        DEFAULT_WINDOW
    }

    /// How the responder delivers requests; both ends must agree.
    fn delivery(&self) -> Delivery {
        Delivery::InOrder
    }

    /// The responder reported `missing` as the first PSN it lacks (a PSN sequence error NAK,
    /// or an implied NAK: a response for a later PSN). Says what to resend, inside `window`.
    fn on_sequence_error(&mut self, missing: Psn, window: SendWindow) -> Retransmit;

    /// The local ACK timer expired with packets outstanding. Says what to resend.
    fn on_timeout(&mut self, window: SendWindow) -> Retransmit;

    /// Responder, in-order delivery: request `psn` arrived while `epsn` was expected (`psn`
    /// is ahead of it). `nak_outstanding` is true when a sequence NAK for `epsn` was already
    /// sent. The default is IBTA's (§9.7.5.1.2): one NAK per sequence error, later
    /// out-of-order packets dropped silently until the expected PSN arrives.
    fn on_out_of_order(&mut self, epsn: Psn, psn: Psn, nak_outstanding: bool) -> OutOfOrder {
        let _ = (epsn, psn);
        if nak_outstanding {
            OutOfOrder::Drop
        } else {
            OutOfOrder::NakAndDrop
        }
    }

    /// Responder, selective feedback: request `psn` arrived (recorded in `rx` already) from
    /// UDP source port `udp_src_port`; `paths` is the QP's path selector, which says which
    /// path that was and which path a PSN was meant for. Fills `report` with PSNs now known
    /// lost and a path to avoid. The default reports nothing: recovery then waits for the
    /// requester's timer.
    fn on_arrival(
        &mut self,
        psn: Psn,
        udp_src_port: u16,
        paths: &dyn PathSelector,
        rx: &dyn Arrivals,
        report: &mut LossReport,
    ) {
        let _ = (psn, udp_src_port, paths, rx, report);
    }

    /// Requester, placement delivery: READ response (or atomic ACK) `psn` arrived (recorded
    /// in `rx` already, whose `epsn` is the oldest unacknowledged PSN) from UDP source port
    /// `udp_src_port`. The responder sprays READ responses over the paths as the requester
    /// sprays requests, so the same reasoning finds their losses; PSNs put in `report.lost`
    /// are asked for again, one each. The response direction has no channel back to the
    /// responder's path choice, so `report.avoid` is ignored here. The default reports
    /// nothing: a missing response then waits for the requester's timer. Keep this state
    /// apart from [`on_arrival`](Self::on_arrival)'s: the two directions number their PSNs
    /// independently.
    fn on_response_arrival(
        &mut self,
        psn: Psn,
        udp_src_port: u16,
        paths: &dyn PathSelector,
        rx: &dyn Arrivals,
        report: &mut LossReport,
    ) {
        let _ = (psn, udp_src_port, paths, rx, report);
    }
}

/// The default send window in packets: deep enough for 8 MiB in flight at 4 KiB MTU, which
/// covers the bandwidth-delay product of a 100 Gbit/s link with a 500 µs RTT, and small
/// enough that a Go-Back-N rewind after a loss resends a bounded amount.
pub const DEFAULT_WINDOW: u32 = 2048;

/// IBTA Go-Back-N: resume from the first missing PSN; the responder NAKs the first gap once
/// and drops everything until the expected PSN arrives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GoBackN {
    window: u32,
}

impl Default for GoBackN {
    fn default() -> Self {
        Self::with_window(DEFAULT_WINDOW)
    }
}

impl GoBackN {
    /// Go-Back-N keeping at most `window` packets unacknowledged.
    pub fn with_window(window: u32) -> Self {
        Self { window }
    }
}

impl Recovery for GoBackN {
    fn name(&self) -> &'static str {
        "gbn"
    }

    fn window(&self) -> u32 {
        self.window
    }

    fn on_sequence_error(&mut self, missing: Psn, _window: SendWindow) -> Retransmit {
        Retransmit::From(missing)
    }

    fn on_timeout(&mut self, window: SendWindow) -> Retransmit {
        Retransmit::From(window.una)
    }
}
