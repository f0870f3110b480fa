//! The policies a QP runs and how it holds them.
//!
//! [`Policies`] is what a user composes: a path selector, a recovery policy and a congestion
//! controller, each `None` for the default (IBTA's behaviour, what a hardware peer expects).
//! The QP holds the path selector and the controller in slots that call the defaults
//! directly: they are consulted for every packet, and a default that does nothing then costs
//! nothing, neither a call through a vtable nor an allocation per QP.

use crate::transport::congestion::{AckEvent, CongestionControl, Loss, NoControl};
use crate::transport::path::{Ecmp, Path, PathSelector};
use crate::transport::recovery::{GoBackN, Recovery};
use crate::wire::Psn;

use super::sends::SendRecords;

/// The policies of one QP, composed per QP on the model of quinn-proto's congestion
/// `Controller`s: which path each packet takes, what to resend and when, and how much may be
/// in flight at what rate. `None` is the default: one path ([`Ecmp`]), Go-Back-N
/// ([`GoBackN`]), no congestion control ([`NoControl`]).
#[derive(Debug, Default)]
pub struct Policies {
    /// Path choice.
    pub path: Option<Box<dyn PathSelector>>,
    /// Loss recovery, receiver-side loss detection and the delivery mode.
    pub recovery: Option<Box<dyn Recovery>>,
    /// Congestion control.
    pub congestion: Option<Box<dyn CongestionControl>>,
}

impl Policies {
    /// `recovery` with the default path choice and congestion control.
    pub fn recovery(recovery: Box<dyn Recovery>) -> Self {
        Self {
            recovery: Some(recovery),
            ..Self::default()
        }
    }

    /// The same with path choice `path`.
    pub fn with_path(self, path: Box<dyn PathSelector>) -> Self {
        Self {
            path: Some(path),
            ..self
        }
    }

    /// The same with congestion control `congestion`.
    pub fn with_congestion(self, congestion: Box<dyn CongestionControl>) -> Self {
        Self {
            congestion: Some(congestion),
            ..self
        }
    }
}

/// What a QP holds for `p`: the path selector's slot, the recovery policy (Go-Back-N for
/// `None`; consulted per burst, not per packet, so an ordinary box) and the controller's
/// slot, whose send records are as deep as the recovery's window.
pub(crate) fn install(p: Policies) -> (PathSlot, Box<dyn Recovery>, CongestionSlot) {
    let recovery = p.recovery.unwrap_or_else(|| Box::new(GoBackN::default()));
    let congestion = CongestionSlot::new(p.congestion, recovery.window());
    (PathSlot::new(p.path), recovery, congestion)
}

/// A QP's path selector.
#[derive(Debug)]
pub(crate) enum PathSlot {
    Ecmp,
    Custom(Box<dyn PathSelector>),
}

impl PathSlot {
    fn new(p: Option<Box<dyn PathSelector>>) -> Self {
        p.map_or(Self::Ecmp, Self::Custom)
    }

    /// The selector, for a receiver that asks about paths.
    pub(crate) fn get(&self) -> &dyn PathSelector {
        match self {
            Self::Ecmp => &Ecmp,
            Self::Custom(p) => &**p,
        }
    }

    pub(crate) fn name(&self) -> &'static str {
        self.get().name()
    }

    #[inline]
    pub(crate) fn select(&mut self, base: Path, psn: Psn, retransmission: bool) -> Path {
        match self {
            Self::Ecmp => base,
            Self::Custom(p) => p.select(base, psn, retransmission),
        }
    }

    pub(crate) fn avoid(&mut self, path: u16) {
        if let Self::Custom(p) = self {
            p.avoid(path);
        }
    }
}

/// A QP's congestion controller. One that hears sends gets the QP's send records beside it,
/// for its RTT samples.
#[derive(Debug)]
pub(crate) enum CongestionSlot {
    None(NoControl),
    Custom(Box<Controlled>),
}

/// A controller and the records of what it heard sent.
#[derive(Debug)]
pub(crate) struct Controlled {
    cc: Box<dyn CongestionControl>,
    pub(crate) sends: SendRecords,
}

impl CongestionSlot {
    /// `c`, or the default; `window` bounds how many packets are ever in flight (the
    /// recovery's window), which sizes the send records.
    fn new(c: Option<Box<dyn CongestionControl>>, window: u32) -> Self {
        c.map_or(Self::None(NoControl::default()), |cc| {
            Self::Custom(Box::new(Controlled {
                cc,
                sends: SendRecords::new(window),
            }))
        })
    }

    fn get_mut(&mut self) -> &mut dyn CongestionControl {
        match self {
            Self::None(n) => n,
            Self::Custom(c) => &mut *c.cc,
        }
    }

    /// The send records, for a controller that hears sends.
    #[inline]
    pub(crate) fn sends(&mut self) -> Option<&mut SendRecords> {
        match self {
            Self::None(_) => None,
            Self::Custom(c) => Some(&mut c.sends),
        }
    }

    /// The same, to read.
    pub(crate) fn records(&self) -> Option<&SendRecords> {
        match self {
            Self::None(_) => None,
            Self::Custom(c) => Some(&c.sends),
        }
    }

    pub(crate) fn name(&self) -> &'static str {
        match self {
            Self::None(n) => n.name(),
            Self::Custom(c) => c.cc.name(),
        }
    }

    #[inline]
    pub(crate) fn on_sent(&mut self, now: u64, psn: Psn, bytes: usize, retransmission: bool) {
        // `NoControl` ignores it.
        if let Self::Custom(c) = self {
            c.cc.on_sent(now, psn, bytes, retransmission);
        }
    }

    #[inline]
    pub(crate) fn on_ack(&mut self, now: u64, ack: AckEvent) {
        match self {
            Self::None(n) => n.on_ack(now, ack),
            Self::Custom(c) => c.cc.on_ack(now, ack),
        }
    }

    pub(crate) fn on_cnp(&mut self, now: u64) {
        self.get_mut().on_cnp(now);
    }

    pub(crate) fn on_loss(&mut self, now: u64, loss: Loss) {
        self.get_mut().on_loss(now, loss);
    }

    pub(crate) fn on_timeout(&mut self, now: u64) {
        self.get_mut().on_timeout(now);
    }

    #[inline]
    pub(crate) fn window(&self) -> Option<u32> {
        match self {
            Self::None(n) => n.window(),
            Self::Custom(c) => c.cc.window(),
        }
    }

    #[inline]
    pub(crate) fn pacing_rate(&self) -> Option<u64> {
        match self {
            Self::None(_) => None,
            Self::Custom(c) => c.cc.pacing_rate(),
        }
    }
}
