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

use ferroce_stack::transport::path::PathSelector;
use ferroce_stack::transport::recovery::{
    Arrivals, Delivery, Feedback, LossReport, Recovery, Retransmit, SendWindow,
};
use ferroce_stack::wire::Psn;

/// Thresholds of [`SelectiveRepeat`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SrConfig {
    /// Packets in flight before the sender waits (the TX window).
    pub window: u32,
    /// Out-of-order degree (packets that arrived past the stuck expected PSN) beyond which
    /// the expected PSN is declared lost without proof and its path avoided (for as long as
    /// the sender's path selector avoids a path: [`Spray::avoiding`](crate::policy::spray::Spray::avoiding)).
    pub ooo_threshold: u32,
}

impl Default for SrConfig {
    fn default() -> Self {
        Self {
            window: 512,
            ooo_threshold: 256,
        }
    }
}

/// ferroce's selective repeat, with path-aware loss detection at the receiver. It learns
/// the paths from the QP's path selector (run it with PSN-based spraying for the path-aware
/// part: [`Spray::psn`](crate::policy::spray::Spray::psn)).
#[derive(Debug)]
pub struct SelectiveRepeat {
    config: SrConfig,
    /// Responder: the highest request PSN that arrived on each path.
    path_max: Vec<Option<Psn>>,
    /// Requester: the highest READ response PSN that arrived on each path.
    response_path_max: Vec<Option<Psn>>,
}

impl SelectiveRepeat {
    /// Selective repeat with `config`'s thresholds.
    pub fn new(config: SrConfig) -> Self {
        Self {
            config,
            path_max: Vec::new(),
            response_path_max: Vec::new(),
        }
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
        paths: &dyn PathSelector,
        rx: &dyn Arrivals,
        report: &mut LossReport,
    ) {
        detect(
            paths,
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
        paths: &dyn PathSelector,
        rx: &dyn Arrivals,
        report: &mut LossReport,
    ) {
        detect(
            paths,
            self.config,
            &mut self.response_path_max,
            (psn, udp_src_port),
            rx,
            report,
        );
    }
}

/// Path-aware loss detection for one direction: `(psn, port)` arrived, `path_max` is that
/// direction's highest PSN per path.
fn detect(
    paths: &dyn PathSelector,
    config: SrConfig,
    path_max: &mut Vec<Option<Psn>>,
    (psn, port): (Psn, u16),
    rx: &dyn Arrivals,
    report: &mut LossReport,
) {
    let epsn = rx.epsn();
    // Path-aware detection needs to know the path of a PSN that never arrived: PSN-based
    // spraying says it.
    let psn_sprayed = paths.designated(psn).is_some();
    if psn_sprayed {
        let path = paths.path_of(port);
        if path_max.len() < usize::from(paths.paths()) {
            path_max.resize(usize::from(paths.paths()), None);
        }
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
                if paths.designated(m) == Some(path) && !rx.arrived(m) && !rx.reported(m) {
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
        report.avoid = paths.designated(epsn).map(|p| p as u8);
    }
}
