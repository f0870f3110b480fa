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
//! - [`SprayedGoBackN`]: IBTA Go-Back-N over any path policy.

use ferroce_stack::transport::recovery::{
    Arrivals, Delivery, Feedback, LossReport, Recovery, Retransmit, SendWindow,
};
use ferroce_stack::wire::Psn;

use crate::spray::Spray;

macro_rules! sprayed_policy {
    ($(#[$m:meta])* $name:ident, $label:literal) => {
        $(#[$m])*
        #[derive(Debug)]
        pub struct $name {
            spray: Spray,
            window: u32,
        }

        impl $name {
            /// Over `spray`'s paths with a TX window of `window` packets.
            pub fn new(spray: Spray, window: u32) -> Self {
                Self { spray, window }
            }
        }
    };
}

sprayed_policy!(
    /// ConnectX-7's selective repeat ("RNIC-SR").
    RnicSr,
    "rnic-sr"
);
sprayed_policy!(
    /// Recovery by the retransmission timer alone.
    TimeoutOnly,
    "timeout-only"
);
sprayed_policy!(
    /// Go-Back-N on any path policy.
    SprayedGoBackN,
    "gbn"
);

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
    fn udp_src_port(&mut self, base: u16, psn: Psn, retransmission: bool) -> u16 {
        self.spray.port(base, psn, retransmission)
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
    fn udp_src_port(&mut self, base: u16, psn: Psn, retransmission: bool) -> u16 {
        self.spray.port(base, psn, retransmission)
    }
    fn on_sequence_error(&mut self, missing: Psn, _window: SendWindow) -> Retransmit {
        // Only an implied NAK (a READ response overtaking) gets here.
        Retransmit::Only(missing, None)
    }
    fn on_timeout(&mut self, window: SendWindow) -> Retransmit {
        Retransmit::Only(window.una, None)
    }
}

impl Recovery for SprayedGoBackN {
    fn name(&self) -> &'static str {
        "gbn"
    }
    fn window(&self) -> u32 {
        self.window
    }
    fn udp_src_port(&mut self, base: u16, psn: Psn, retransmission: bool) -> u16 {
        self.spray.port(base, psn, retransmission)
    }
    fn on_sequence_error(&mut self, missing: Psn, _window: SendWindow) -> Retransmit {
        Retransmit::From(missing)
    }
    fn on_timeout(&mut self, window: SendWindow) -> Retransmit {
        Retransmit::From(window.una)
    }
    // The responder's out-of-order rule is the trait's default: IBTA's.
}
