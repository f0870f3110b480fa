//! The loss-recovery policy a reliable QP consults: how far ahead it may send, which path
//! (UDP source port) a packet takes, where to resume after a sequence error or a timeout, and
//! what its responder does with a request that arrives ahead of the expected PSN.
//!
//! The QP keeps the mechanism (PSN bookkeeping, memory, completions, the wire); a policy only
//! decides. [`GoBackN`] is the IBTA behaviour and the default, and the only one a hardware
//! peer understands; selective repeat, spraying and failover implement this trait in the
//! `reliability` crate. It lives here rather than there because the QP needs its default and
//! `reliability` depends on this crate.

use core::fmt;

use crate::wire::Psn;

/// The requester's PSN window when a policy is asked to decide.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendWindow {
    /// Oldest PSN not yet acknowledged.
    pub una: Psn,
    /// Next PSN never sent.
    pub nxt: Psn,
}

/// What the responder does with a request whose PSN is ahead of the expected one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutOfOrder {
    /// Drop it silently.
    Drop,
    /// Drop it and NAK with a PSN sequence error naming the expected PSN.
    NakAndDrop,
}

/// A reliability policy. Every method has the IBTA default except the two recovery
/// decisions, which are the point of a policy.
pub trait Recovery: Send + fmt::Debug {
    /// A short name for logs and reports.
    fn name(&self) -> &'static str;

    /// Most packets the requester keeps unacknowledged before it stops sending new ones.
    fn window(&self) -> u32 {
        DEFAULT_WINDOW
    }

    /// The UDP source port (the path, to an ECMP fabric) for a request packet. `base` is the
    /// QP's own port; `retransmission` is true when the PSN was sent before.
    fn udp_src_port(&mut self, base: u16, psn: Psn, retransmission: bool) -> u16 {
        let _ = (psn, retransmission);
        base
    }

    /// The responder reported `missing` as the first PSN it lacks (a PSN sequence error NAK,
    /// or an implied NAK: a response for a later PSN). Returns the PSN to resume from, inside
    /// `window`.
    fn on_sequence_error(&mut self, missing: Psn, window: SendWindow) -> Psn;

    /// The local ACK timer expired with packets outstanding. Returns the PSN to resume from.
    fn on_timeout(&mut self, window: SendWindow) -> Psn;

    /// Responder: request `psn` arrived while `epsn` was expected (`psn` is ahead of it).
    /// `nak_outstanding` is true when a sequence NAK for `epsn` was already sent.
    fn on_out_of_order(&mut self, epsn: Psn, psn: Psn, nak_outstanding: bool) -> OutOfOrder;
}

/// The default send window in packets: deep enough for 8 MiB in flight at 4 KiB MTU, which
/// covers the bandwidth-delay product of a 100 Gbit/s link with a 500 µs RTT, and small
/// enough that a Go-Back-N rewind after a loss resends a bounded amount.
pub const DEFAULT_WINDOW: u32 = 2048;

/// IBTA Go-Back-N: resume from the first missing PSN; the responder NAKs the first gap once
/// and drops everything until the expected PSN arrives.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GoBackN;

impl Recovery for GoBackN {
    fn name(&self) -> &'static str {
        "gbn"
    }

    fn on_sequence_error(&mut self, missing: Psn, _window: SendWindow) -> Psn {
        missing
    }

    fn on_timeout(&mut self, window: SendWindow) -> Psn {
        window.una
    }

    fn on_out_of_order(&mut self, _epsn: Psn, _psn: Psn, nak_outstanding: bool) -> OutOfOrder {
        // C9-? of §9.7.5.1.2: one NAK per sequence error; later out-of-order packets are
        // dropped silently until the expected PSN arrives.
        if nak_outstanding {
            OutOfOrder::Drop
        } else {
            OutOfOrder::NakAndDrop
        }
    }
}
