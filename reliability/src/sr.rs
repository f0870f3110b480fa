//! Selective repeat between two ferroce endpoints, with Themis' path-aware loss detection
//! moved from the switch into the receiver.
//!
//! The responder places WRITE packets as they arrive and acknowledges with a cumulative PSN
//! plus an arrival bitmap (`SR_ACKNOWLEDGE`); the requester resends only what is reported
//! lost, or, when its timer fires, the holes of the bitmap. A missing PSN is declared lost
//! only when a packet sent later on the same path has arrived (paths are FIFO, so it cannot
//! still be on its way): with PSN-based spraying the receiver knows the path of a PSN it never
//! saw, and it keeps the highest PSN that arrived on each path. Until then the loss is
//! undetermined and waits (the lazy part). A resent PSN takes another path than the one that
//! lost it. When the expected PSN is stuck while later ones keep arriving (the out-of-order
//! degree passes a threshold), its path is probably broken: the receiver declares the PSN
//! lost without proof and asks the sender to avoid that path for a while.

use ferroce_stack::transport::recovery::{
    Arrivals, Delivery, Feedback, LossReport, Recovery, Retransmit, SendWindow,
};
use ferroce_stack::wire::Psn;

use crate::spray::{Spray, SprayMode};

/// Thresholds of [`SelectiveRepeat`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SrConfig {
    /// Packets in flight before the sender waits (the TX window).
    pub window: u32,
    /// Out-of-order degree (packets that arrived past the stuck expected PSN) beyond which
    /// the expected PSN is declared lost without proof and its path avoided.
    pub ooo_threshold: u32,
    /// Packets a path is avoided for after the receiver signals it.
    pub avoid_packets: u32,
}

impl Default for SrConfig {
    fn default() -> Self {
        Self {
            window: 512,
            ooo_threshold: 256,
            avoid_packets: 1024,
        }
    }
}

/// ferroce's selective repeat, with path-aware loss detection at the receiver.
#[derive(Debug)]
pub struct SelectiveRepeat {
    spray: Spray,
    config: SrConfig,
    /// Responder: the highest request PSN that arrived on each path.
    path_max: Vec<Option<Psn>>,
    /// Requester: the highest READ response PSN that arrived on each path.
    response_path_max: Vec<Option<Psn>>,
}

impl SelectiveRepeat {
    /// Selective repeat over `spray`'s paths.
    pub fn new(spray: Spray, config: SrConfig) -> Self {
        let n = usize::from(spray.paths());
        Self {
            spray,
            config,
            path_max: vec![None; n],
            response_path_max: vec![None; n],
        }
    }

    /// The path policy.
    pub fn spray(&self) -> &Spray {
        &self.spray
    }
}

impl Recovery for SelectiveRepeat {
    fn name(&self) -> &'static str {
        "sr"
    }

    fn window(&self) -> u32 {
        self.config.window
    }

    fn delivery(&self) -> Delivery {
        Delivery::Placement(Feedback::Selective)
    }

    fn udp_src_port(&mut self, base: u16, psn: Psn, retransmission: bool) -> u16 {
        self.spray.port(base, psn, retransmission)
    }

    fn on_sequence_error(&mut self, missing: Psn, _window: SendWindow) -> Retransmit {
        Retransmit::Only(missing, None)
    }

    fn on_timeout(&mut self, _window: SendWindow) -> Retransmit {
        Retransmit::Holes
    }

    fn on_arrival(
        &mut self,
        psn: Psn,
        udp_src_port: u16,
        rx: &dyn Arrivals,
        report: &mut LossReport,
    ) {
        detect(
            &self.spray,
            self.config,
            &mut self.path_max,
            (psn, udp_src_port),
            rx,
            report,
        );
    }

    fn on_response_arrival(
        &mut self,
        psn: Psn,
        udp_src_port: u16,
        rx: &dyn Arrivals,
        report: &mut LossReport,
    ) {
        detect(
            &self.spray,
            self.config,
            &mut self.response_path_max,
            (psn, udp_src_port),
            rx,
            report,
        );
    }

    fn on_avoid_path(&mut self, path: u8) {
        self.spray.avoid(u16::from(path), self.config.avoid_packets);
    }
}

/// Path-aware loss detection for one direction: `(psn, port)` arrived, `path_max` is that
/// direction's highest PSN per path.
fn detect(
    spray: &Spray,
    config: SrConfig,
    path_max: &mut [Option<Psn>],
    (psn, port): (Psn, u16),
    rx: &dyn Arrivals,
    report: &mut LossReport,
) {
    let epsn = rx.epsn();
    let n = spray.paths();
    let psn_sprayed = spray.mode() == SprayMode::Psn && n > 1;
    if psn_sprayed {
        let path = spray.path_of_port(port);
        let slot = &mut path_max[usize::from(path)];
        let prev = *slot;
        if prev.is_none_or(|p| p.before(psn)) {
            *slot = Some(psn);
            // Every PSN meant for this path, sent before `psn` and still missing, is lost:
            // the path delivers in order.
            let start = match prev {
                Some(p) if !p.before(epsn) => p.add(1),
                _ => epsn,
            };
            let span = psn.distance(start).max(0) as u32;
            for i in 0..span {
                let m = start.add(i);
                if spray.designated(m) == path && !rx.arrived(m) && !rx.reported(m) {
                    report.lost.push(m);
                }
            }
        }
    }
    // The PSN distance bounds the degree from above, so the count is taken only past it.
    let stuck = !rx.arrived(epsn) && !rx.reported(epsn);
    if stuck
        && psn.distance(epsn) > config.ooo_threshold as i32
        && rx.ahead(psn) > config.ooo_threshold
    {
        report.lost.push(epsn);
        if psn_sprayed {
            report.avoid = Some(spray.designated(epsn) as u8);
        }
    }
}
