//! Native failover (issue 22): a connected QP with an alternate path moves to it and back
//! with its whole transport state — PSNs, outstanding work, the responder's duplicate
//! detection and atomic replay cache — so the peer sees anything resent it already executed
//! as a duplicate and every work request runs exactly once, atomics included.
//!
//! What moves a QP: its own evidence (a local ACK timeout on the active path), a link event
//! on the active path's port (the driver reports it, [`Qp::on_port_event`](super::Qp)), or
//! the peer's (a request or response arriving from the peer's other address: the peer moved,
//! so replies follow). A move onto a path resends everything outstanding from the oldest
//! unacknowledged PSN with a fresh retry budget. Two guards keep it bounded: a QP that moved
//! and made no progress since does not move again on its own evidence (both paths dead ends
//! in the retry budget's error, as without failover), and evidence from the path it just left
//! is ignored for a damping interval (late packets of the old path do not pull it back).
//!
//! Going home is checked first. A QP on its alternate path probes its primary — a
//! `PATH_CONTROL` probe from its primary address to the peer's, which the peer answers on the
//! same path — and moves home when the answer comes: the path carries both ways and the peer
//! is there, so no data waits on a path that may still be dead. It probes after a link-up
//! event of the primary's port (once), and while it has work outstanding and made progress on
//! the alternate (the primary may have failed beyond the port — a switch, the peer's NIC, a
//! black hole — where no link event says it is back); the first probe waits a damping
//! interval after the last move, and each unanswered one doubles the wait before the next, up
//! to [`HOME_BACKOFF_MAX`] doublings. A move home may fall back once without progress (a
//! fault can return under it).

use core::net::IpAddr;

use super::av::{AddressVector, Template};
use crate::wire::{MacAddr, PathControlKind, Psn};

/// One of a device's other ports, as a QP announces it to a ferroce peer
/// ([`Qp::offer_alternate_port`](super::Qp::offer_alternate_port)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LocalPort {
    /// Its index on the device (from 0; `ibv` port number minus one).
    pub port: u8,
    /// Its MAC.
    pub mac: MacAddr,
    /// Its address (the RoCEv2 GID).
    pub ip: IpAddr,
}

/// How a QP learns its peer's other port in band: it announces its own
/// (`PATH_CONTROL` announce) when it reaches RTS and every [`ANNOUNCE_INTERVAL_NS`] until it
/// hears the peer's, for at most [`ANNOUNCE_TRIES`] times; an announce is answered with a
/// reply, so whichever side reaches RTS last completes the exchange.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Discovery {
    pub(crate) local: LocalPort,
    /// The peer's announce (or reply) arrived.
    pub(crate) heard: bool,
    /// When to announce again.
    pub(crate) next_at: Option<u64>,
    pub(crate) tries: u8,
}

/// Between announces while the peer's is not heard.
pub(crate) const ANNOUNCE_INTERVAL_NS: u64 = 1_000_000;
/// Announces before giving up (the peer is no ferroce QP with another port, or gone).
pub(crate) const ANNOUNCE_TRIES: u8 = 16;

impl Discovery {
    pub(crate) fn new(local: LocalPort) -> Self {
        Self {
            local,
            heard: false,
            next_at: None,
            tries: 0,
        }
    }

    /// The announce went out at `now`: the next one, if still unheard.
    pub(crate) fn sent(&mut self, now: u64) {
        self.tries = self.tries.saturating_add(1);
        self.next_at = (self.tries < ANNOUNCE_TRIES).then_some(now + ANNOUNCE_INTERVAL_NS);
    }
}

/// Doublings of the wait between unanswered probes (64 damping intervals at most).
pub(crate) const HOME_BACKOFF_MAX: u8 = 6;

/// A path control message waiting to leave.
pub(crate) type PendingControl = Option<PathControlKind>;

/// The two paths of a QP with an alternate, and which one it uses.
#[derive(Debug)]
pub(crate) struct Paths {
    /// The path not in use: its template, its port (index), the peer's MAC on it.
    pub(crate) standby: Template,
    pub(crate) standby_port: u8,
    pub(crate) standby_peer: MacAddr,
    /// The path in use: its port and the peer's MAC on it.
    pub(crate) active_port: u8,
    pub(crate) active_peer: MacAddr,
    /// Whether the active path is the alternate.
    pub(crate) on_alternate: bool,
    /// When the QP last moved, and the oldest unacknowledged PSN then.
    pub(crate) moved_at: Option<u64>,
    pub(crate) una_at_move: Option<Psn>,
    /// Moves so far, either way.
    pub(crate) migrations: u64,
    /// Ports (bit per index, up to 64) whose link is known down from link events: no move
    /// goes onto one.
    pub(crate) ports_down: u64,
    /// When a packet last came from the peer's active address.
    pub(crate) heard_active: u64,
    /// The QP moved home and has not left since: it may fall back once without progress.
    pub(crate) trial: bool,
    /// Unanswered probes and failed moves home in a row (the wait before the next probe is
    /// doubled this many times).
    pub(crate) home_backoff: u8,
    /// When the last probe since the last move went out (unanswered: an answer moves the QP).
    pub(crate) probe_sent_at: Option<u64>,
    /// A link-up event of the standby path's port asks for a probe.
    pub(crate) probe_wanted: bool,
    /// A probe to send on the standby path.
    pub(crate) probe_out: bool,
    /// A probe to answer: the peer address it came from (names the path to answer on).
    pub(crate) reply_out: Option<MacAddr>,
    /// The peer's replay depth (`max_dest_rd_atomic`) the path was given with.
    pub(crate) peer_depth: u8,
    /// The path came from the peer's announce: a depth above the peer's set later (RTR to
    /// RTS) is lowered to it, not refused.
    pub(crate) in_band: bool,
}

impl Paths {
    /// A QP on its primary path (`primary_port`, peer MAC `primary_peer`) with the
    /// alternate `alt` on `alt_port`.
    pub(crate) fn new(
        primary_port: u8,
        primary_peer: MacAddr,
        alt: &AddressVector,
        alt_template: Template,
        alt_port: u8,
    ) -> Self {
        Self {
            standby: alt_template,
            standby_port: alt_port,
            standby_peer: alt.dmac,
            active_port: primary_port,
            active_peer: primary_peer,
            on_alternate: false,
            moved_at: None,
            una_at_move: None,
            migrations: 0,
            ports_down: 0,
            heard_active: 0,
            trial: false,
            home_backoff: 0,
            probe_sent_at: None,
            probe_wanted: false,
            probe_out: false,
            reply_out: None,
            peer_depth: u8::MAX,
            in_band: false,
        }
    }

    /// Records a link event on `port`.
    pub(crate) fn note_link(&mut self, port: u8, up: bool) {
        let bit = 1u64.checked_shl(u32::from(port)).unwrap_or(0);
        if up {
            self.ports_down &= !bit;
        } else {
            self.ports_down |= bit;
        }
    }

    /// Whether the standby path's port is known up (or not known down).
    pub(crate) fn standby_usable(&self) -> bool {
        self.ports_down >> self.standby_port & 1 == 0 || self.standby_port >= 64
    }

    /// A packet from `src` arrived at `now`: whether it says the peer moved — it comes from
    /// the peer's other address, and the active one has been silent for `silence_ns` (frames
    /// of a path just left, still draining from its queues, interleave with the new path's
    /// for a while; following them would pull the QP back and forth).
    pub(crate) fn peer_moved(&mut self, src: MacAddr, now: u64, silence_ns: u64) -> bool {
        if src == self.active_peer {
            self.heard_active = now;
            return false;
        }
        src == self.standby_peer
            && self.standby_usable()
            && now.saturating_sub(self.heard_active) >= silence_ns
    }

    /// Whether a move is in its damping interval at `now`.
    pub(crate) fn damped(&self, now: u64, damping_ns: u64) -> bool {
        self.moved_at
            .is_some_and(|t| now < t.saturating_add(damping_ns))
    }

    /// When a QP on its alternate path probes its primary next, if it does: the primary's
    /// port is not known down, and a link-up event asked for a probe or work is outstanding
    /// and the alternate carried some since the move (a QP that hears nothing on either path
    /// is left to its retry budget; an idle one does not probe forever).
    pub(crate) fn probe_at(&self, damping_ns: u64, una: Psn, nxt: Psn) -> Option<u64> {
        if !self.on_alternate || !self.standby_usable() {
            return None;
        }
        let busy = una != nxt && self.una_at_move != Some(una);
        if !busy && !self.probe_wanted {
            return None;
        }
        let first = self.moved_at?.saturating_add(damping_ns);
        Some(match self.probe_sent_at {
            None => first,
            Some(t) => first.max(t.saturating_add(damping_ns << self.home_backoff)),
        })
    }

    /// A probe goes out at `now`; the one before it went unanswered, if there was one.
    pub(crate) fn send_probe(&mut self, now: u64) {
        if self.probe_sent_at.is_some() {
            self.home_backoff = (self.home_backoff + 1).min(HOME_BACKOFF_MAX);
        }
        self.probe_sent_at = Some(now);
        self.probe_wanted = false;
        self.probe_out = true;
    }

    /// Whether a timeout at oldest unacknowledged PSN `una` may move the QP: it made
    /// progress since its last move, or that move took it home.
    pub(crate) fn may_leave(&self, una: Psn) -> bool {
        self.una_at_move != Some(una) || self.trial
    }

    /// Whether a packet came from the peer's active address since the last move.
    pub(crate) fn heard_since_move(&self) -> bool {
        self.moved_at.is_some_and(|t| self.heard_active >= t)
    }

    /// Swaps the active and standby paths (the caller swaps the templates with
    /// [`core::mem::swap`] on `standby`). Leaving home before the alternate's next move
    /// counts as a failed return unless the peer was heard on the primary meanwhile.
    pub(crate) fn swap_ends(&mut self, now: u64, una: Psn) {
        self.probe_sent_at = None;
        self.probe_wanted = false;
        self.probe_out = false;
        if self.on_alternate {
            self.trial = true;
        } else if core::mem::take(&mut self.trial) {
            self.home_backoff = if self.heard_since_move() {
                0
            } else {
                (self.home_backoff + 1).min(HOME_BACKOFF_MAX)
            };
        }
        core::mem::swap(&mut self.active_port, &mut self.standby_port);
        core::mem::swap(&mut self.active_peer, &mut self.standby_peer);
        self.on_alternate = !self.on_alternate;
        self.moved_at = Some(now);
        self.una_at_move = Some(una);
        self.migrations += 1;
    }
}
