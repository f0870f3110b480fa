//! The recovery schemes ferroce's selective repeat is measured against, as policies in the
//! same code so they run side by side on the same fabric.
//!
//! - [`RnicSr`]: selective repeat as the Themis paper describes ConnectX-7's: the responder
//!   places out-of-order packets and sends one NAK per expected PSN (naming only that PSN)
//!   the first time a later packet arrives; the sender resends that PSN and the previous one
//!   it sent (read here as the most recent PSN sent, the paper's wording), and on a timeout
//!   the oldest unacknowledged PSN.
//! - [`TimeoutOnly`]: placement without any NAK; only the retransmission timer recovers,
//!   resending the oldest unacknowledged PSN each time it fires.
//!
//! IBTA Go-Back-N is the stack's own [`GoBackN`](crate::policy::gbn::GoBackN). Each runs over
//! whatever path selector the QP has (spraying: [`Spray`](crate::policy::spray::Spray)).

use ferroce_stack::transport::path::PathSelector;
use ferroce_stack::transport::recovery::{
    Arrivals, Delivery, Feedback, LossReport, Recovery, Retransmit, SendWindow,
};
use ferroce_stack::wire::Psn;

/// ConnectX-7's selective repeat ("RNIC-SR").
#[derive(Clone, Copy, Debug)]
pub struct RnicSr {
    window: u32,
}

impl RnicSr {
    /// With a TX window of `window` packets.
    pub fn new(window: u32) -> Self {
        Self { window }
    }
}

/// Recovery by the retransmission timer alone.
#[derive(Clone, Copy, Debug)]
pub struct TimeoutOnly {
    window: u32,
}

impl TimeoutOnly {
    /// With a TX window of `window` packets.
    pub fn new(window: u32) -> Self {
        Self { window }
    }
}

impl Recovery for RnicSr {
    fn name(&self) -> &'static str {
        "rnic-sr"
    }
    fn window(&self) -> u32 {
        self.window
    }
    fn delivery(&self) -> Delivery {
        Delivery::Placement(Feedback::NakExpected)
    }
    fn on_sequence_error(&mut self, missing: Psn, window: SendWindow) -> Retransmit {
        let last = window.nxt.sub(1);
        Retransmit::Only(missing, (last != missing).then_some(last))
    }
    fn on_timeout(&mut self, window: SendWindow) -> Retransmit {
        Retransmit::Only(window.una, None)
    }
    fn on_response_arrival(
        &mut self,
        psn: Psn,
        _udp_src_port: u16,
        _paths: &dyn PathSelector,
        rx: &dyn Arrivals,
        report: &mut LossReport,
    ) {
        // The requester treats a response gap as the responder treats a request gap: the
        // expected PSN is asked for again the first time a later one arrives.
        let epsn = rx.epsn();
        if epsn.before(psn) && !rx.arrived(epsn) && !rx.reported(epsn) {
            report.lost.push(epsn);
        }
    }
}

impl Recovery for TimeoutOnly {
    fn name(&self) -> &'static str {
        "timeout-only"
    }
    fn window(&self) -> u32 {
        self.window
    }
    fn delivery(&self) -> Delivery {
        Delivery::Placement(Feedback::AckOnly)
    }
    fn on_sequence_error(&mut self, missing: Psn, _window: SendWindow) -> Retransmit {
        // Only an implied NAK (a READ response overtaking) gets here.
        Retransmit::Only(missing, None)
    }
    fn on_timeout(&mut self, window: SendWindow) -> Retransmit {
        Retransmit::Only(window.una, None)
    }
}
