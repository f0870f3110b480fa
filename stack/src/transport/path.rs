//! Which path a packet takes: the policy seam for spraying and failover.
//!
//! A path is a physical port of the device and a UDP source port: an ECMP fabric hashes the
//! source port to pick among equal-cost links, so varying it moves a packet to another path
//! without touching the connection's addresses (RoCEv2's flow entropy, Annex A17.4.3.1), and
//! naming the port lets spraying and failover use several links of the host as well. The
//! requester asks its [`PathSelector`] for every request packet, the responder for every
//! READ response; a receiver that reasons about paths (path-aware loss detection) asks the
//! same selector which path a packet it received came by.

use core::fmt;

use crate::wire::Psn;

/// Where a packet goes out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Path {
    /// The device port (index) it leaves by.
    pub port: u8,
    /// The UDP source port an ECMP fabric hashes.
    pub udp_src_port: u16,
}

/// A path-selection policy. Every method but [`select`](Self::select) describes the
/// selector's paths to a receiver, with defaults for a selector of one path.
pub trait PathSelector: Send + fmt::Debug {
    /// A short name for logs and reports.
    fn name(&self) -> &'static str;

    /// The path of packet `psn`. `base` is the QP's own path (its port and the UDP source
    /// port it was given at connection); `retransmission` is true when `psn` was sent before.
    fn select(&mut self, base: Path, psn: Psn, retransmission: bool) -> Path;

    /// How many paths the selector spreads packets over.
    fn paths(&self) -> u16 {
        1
    }

    /// Which of the selector's paths (`0..paths()`) a packet that came from `udp_src_port`
    /// took. Both ends of a connection run the same selector, so the receiver reads a path
    /// back from the port the sender chose.
    fn path_of(&self, udp_src_port: u16) -> u16 {
        let _ = udp_src_port;
        0
    }

    /// The path `psn` is meant to take when that follows from the PSN alone (PSN-based
    /// spraying), so a receiver knows the path of a PSN it never saw; `None` otherwise.
    fn designated(&self, psn: Psn) -> Option<u16> {
        let _ = psn;
        None
    }

    /// The receiver asks to steer packets away from `path` for a while (it looks broken).
    fn avoid(&mut self, path: u16) {
        let _ = path;
    }
}

/// One path per QP, the one it was connected with: what an RNIC does by default, and what
/// a peer that negotiated nothing gets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ecmp;

impl PathSelector for Ecmp {
    fn name(&self) -> &'static str {
        "ecmp"
    }

    fn select(&mut self, base: Path, _psn: Psn, _retransmission: bool) -> Path {
        base
    }
}
