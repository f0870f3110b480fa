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
//! event of the primary's port ([`LINK_PROBES`] times at most while unanswered: a port just
//! up may not carry yet, and an idle pair has no other way home), and while it has work
//! outstanding and made progress on the alternate (the primary may have failed beyond the
//! port — a switch, the peer's NIC, a black hole — where no link event says it is back); the
//! first probe waits a damping interval after the last move, and each unanswered one doubles
//! the wait before the next, up to [`HOME_BACKOFF_MAX`] doublings. A link-up event starts
//! that schedule over. A move home may fall back once without progress (a fault can return
//! under it).

use core::net::IpAddr;

use crate::transport::av::{AddressVector, Template};
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

/// Probes a link-up event asks for while they go unanswered: waits of 0, 1, 2, .., 64
/// damping intervals, 127 in all (8.5 s at perftest's ACK timeout of 67 ms). On Linux the
/// first can be lost on a working path: a veth or NIC reports its carrier a moment before
/// its queue discipline is attached, and the peer's end of the link comes up on its own
/// schedule.
pub(crate) const LINK_PROBES: u8 = HOME_BACKOFF_MAX + 2;

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
    /// Probes a link-up event of the standby path's port still asks for.
    pub(crate) link_probes: u8,
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
            link_probes: 0,
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
    /// port is not known down, and a link-up event asked for probes it has not all sent or
    /// work is outstanding and the alternate carried some since the move (a QP that hears
    /// nothing on either path is left to its retry budget; an idle one does not probe
    /// forever).
    pub(crate) fn probe_at(&self, damping_ns: u64, una: Psn, nxt: Psn) -> Option<u64> {
        if !self.on_alternate || !self.standby_usable() {
            return None;
        }
        let busy = una != nxt && self.una_at_move != Some(una);
        if !busy && self.link_probes == 0 {
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
        self.link_probes = self.link_probes.saturating_sub(1);
        self.probe_out = true;
    }

    /// The standby path's port came up while the QP is away: probes go now and again while
    /// unanswered, on a schedule started over (a backoff built while the port was down, or
    /// the path dead beyond it, says nothing of the path now).
    pub(crate) fn want_link_probes(&mut self) {
        self.link_probes = LINK_PROBES;
        self.probe_sent_at = None;
        self.home_backoff = 0;
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
        self.link_probes = 0;
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

/// Native failover's behaviour, beside its data: the alternate path, the in-band exchange
/// (announce, move, probe), port events and the moves they cause.
mod behaviour {
    use super::super::*;

    impl Qp {
        /// Gives a connected QP (RTR, RTS or SQD) an alternate path — `av` from port
        /// `port_num` (from 1, as `ibv_qp_attr.alt_port_num`) — where native failover moves it;
        /// the QP stays on its primary path until then. (IBTA's `ALT_PATH` attributes: kept out
        /// of [`QpAttr`] and boxed, so a QP without one pays a pointer.)
        ///
        /// `peer_max_dest_rd_atomic` is the peer's replay depth: its responder keeps that many
        /// atomic results to answer a resent atomic without running it again. A QP that keeps
        /// more atomics outstanding (`max_rd_atomic`) could, after a move, resend one whose
        /// result the peer no longer holds and have it run twice, so such a QP is refused
        /// ([`ModifyError::ReplayTooShallow`]): native failover is exactly-once or not offered.
        pub fn set_alternate_path(
            &mut self,
            av: AddressVector,
            port_num: u8,
            peer_max_dest_rd_atomic: u8,
        ) -> Result<(), ModifyError> {
            if self.cx.qp_type == QpType::Ud
                || !matches!(self.cx.state, QpState::Rtr | QpState::Rts | QpState::Sqd)
                || port_num == 0
            {
                return Err(ModifyError::NoAlternatePath(self.cx.qp_type, self.cx.state));
            }
            // Both ends treat a depth of 0 as 1 (one READ or atomic at a time). A QP in RTR sets
            // its own depth on the way to RTS, and is checked then.
            if self.cx.qp_type == QpType::Rc
                && self.cx.state != QpState::Rtr
                && self.cx.attr.max_rd_atomic.max(1) > peer_max_dest_rd_atomic.max(1)
            {
                return Err(ModifyError::ReplayTooShallow {
                    max_rd_atomic: self.cx.attr.max_rd_atomic,
                    peer_max_dest_rd_atomic,
                });
            }
            let a = &self.cx.attr;
            let udp = av.udp_src_port.unwrap_or(self.cx.template.udp_src_port());
            let template = av.template(a.dest_qp_num, udp);
            let mut paths = Paths::new(
                a.port_num.saturating_sub(1),
                a.ah_attr.dmac,
                &av,
                template,
                port_num - 1,
            );
            paths.peer_depth = peer_max_dest_rd_atomic;
            self.cx.ext.get_or_insert_with(Box::default).paths = Some(paths);
            Ok(())
        }

        /// Announces `local`, another port of this QP's device, to the peer in band (a
        /// `PATH_CONTROL` message when the QP reaches RTS, or now if it is there) and takes the
        /// peer's other port as the alternate path when the peer announces one. For QPs whose
        /// application set no alternate path (perftest through the libibverbs drop-in); only a
        /// ferroce peer understands the message — a hardware RNIC would refuse the opcode, so
        /// offer it only to ferroce peers.
        pub fn offer_alternate_port(&mut self, local: LocalPort) {
            if self.cx.qp_type == QpType::Ud {
                return;
            }
            let rts = self.cx.state == QpState::Rts;
            let e = self.cx.ext.get_or_insert_with(Box::default);
            e.discovery = Some(Discovery::new(local));
            if rts {
                e.control_out = Some(PathControlKind::Announce);
            }
        }

        /// What the QP's path control exchange did so far.
        pub fn path_control_stats(&self) -> PathControlStats {
            self.cx
                .ext
                .as_ref()
                .map_or_else(Default::default, |e| e.control)
        }

        /// The port (index from 0) the QP sends on now, when it has an alternate path; `None`
        /// for a QP with one path (its driver's choice).
        pub fn active_port(&self) -> Option<u8> {
            self.cx.paths().map(|p| p.active_port)
        }

        /// The port (index from 0) the QP's frames leave from: its active path's with an
        /// alternate path, else the port it was set up on (`port_num`, from 1).
        #[inline]
        pub fn send_port(&self) -> u8 {
            match self.cx.paths() {
                Some(p) => p.active_port,
                None => self.cx.attr.port_num.saturating_sub(1),
            }
        }

        /// Moves between the primary and the alternate path so far (native failover).
        pub fn path_migrations(&self) -> u64 {
            self.cx.paths().map_or(0, |p| p.migrations)
        }

        /// Whether the QP runs on its alternate path now.
        pub fn on_alternate_path(&self) -> bool {
            self.cx.paths().is_some_and(|p| p.on_alternate)
        }

        /// A link event on port `port` (index from 0): the active path's port going down moves
        /// the QP to the other path at once (if that is on another port); the primary's port
        /// coming back has it probe the primary (once the damping interval since the last move
        /// is over) and go home on the answer.
        pub fn on_port_event(&mut self, now: u64, port: u8, up: bool) {
            let live = self.path_live();
            let Some(p) = self.cx.ext.as_mut().and_then(|e| e.paths.as_mut()) else {
                return;
            };
            p.note_link(port, up);
            if !live {
                return;
            }
            if !up && p.active_port == port && p.standby_port != port && p.standby_usable() {
                self.migrate(now, true);
            } else if up && p.on_alternate && p.standby_port == port {
                // The port is back; whether the path is (the peer's port, the switches, the
                // peer's receive queue) the probe's answer says.
                p.want_link_probes();
            }
        }

        /// The peer sends from its other address, and no longer from this one: it moved, and
        /// replies follow.
        #[cold]
        pub(in crate::transport::qp) fn follow_peer(&mut self, now: u64, pkt: &RocePacket<'_>) {
            let damping = self.damping_ns();
            let live = self.path_live();
            let Some(p) = self.cx.ext.as_mut().and_then(|e| e.paths.as_mut()) else {
                return;
            };
            if p.peer_moved(pkt.repr.eth.src, now, damping / 8) && live && !p.damped(now, damping) {
                self.migrate_telling(now, true, false);
            }
        }

        /// A `PATH_CONTROL` message from the peer: an announce of its other port (taken as the
        /// alternate path when this QP offered one of its own and the atomic depths allow
        /// exactly-once resends), or news that it moved (followed at once, if it moved onto
        /// this QP's standby path).
        #[cold]
        pub(in crate::transport::qp) fn on_path_control(&mut self, now: u64, pkt: &RocePacket<'_>) {
            let state = self.cx.state;
            let Ok(msg) = PathControl::parse(pkt.payload) else {
                self.cx.counters.rx_dropped += 1;
                return;
            };
            if self.cx.qp_type == QpType::Ud
                || !matches!(state, QpState::Rtr | QpState::Rts | QpState::Sqd)
            {
                self.cx.counters.rx_dropped += 1;
                return;
            }
            let Some(e) = self.cx.ext.as_mut() else {
                self.cx.counters.rx_dropped += 1;
                return;
            };
            e.control.received += 1;
            match msg.kind {
                PathControlKind::Announce | PathControlKind::AnnounceReply => {
                    let Some(d) = e.discovery.as_mut() else {
                        return;
                    };
                    let first = !d.heard;
                    d.heard = true;
                    d.next_at = None;
                    let local = d.local;
                    if msg.kind == PathControlKind::Announce {
                        e.control_out = Some(PathControlKind::AnnounceReply);
                    }
                    if !first || e.paths.is_some() {
                        return;
                    }
                    let mut av = self.cx.attr.ah_attr;
                    av.smac = local.mac;
                    av.src = local.ip;
                    av.dmac = msg.mac;
                    av.dst = msg.ip;
                    av.udp_src_port = Some(self.cx.template.udp_src_port());
                    // A QP that would keep more atomics outstanding than the peer replays is
                    // held to the peer's depth instead of going without failover: a program
                    // that sets the depths apart but posts no atomic (perftest's WRITE server)
                    // loses nothing, and one that does post them stays exactly-once.
                    let depth = msg.max_dest_rd_atomic.max(1);
                    if self.cx.qp_type == QpType::Rc && self.cx.attr.max_rd_atomic.max(1) > depth {
                        self.cx.attr.max_rd_atomic = depth;
                        if let Some(e) = self.cx.ext.as_mut() {
                            e.control.clamped += 1;
                        }
                    }
                    let r = self.set_alternate_path(av, local.port + 1, depth);
                    if let Some(p) = self.cx.ext.as_mut().and_then(|e| e.paths.as_mut()) {
                        p.in_band = true;
                    }
                    if let Err(err) = r {
                        self.cx.span().in_scope(
                            || tracing::warn!(%err, "the peer's alternate port is not taken"),
                        );
                    }
                }
                PathControlKind::Moved => {
                    let Some(p) = e.paths.as_ref() else {
                        return;
                    };
                    if msg.mac == p.standby_peer && p.standby_usable() {
                        e.control.followed += 1;
                        self.migrate_telling(now, true, false);
                    }
                }
                PathControlKind::Probe => {
                    // Answered on the path it came on, whichever of the two that is.
                    let src = pkt.repr.eth.src;
                    if let Some(p) = e.paths.as_mut() {
                        if src == p.active_peer || src == p.standby_peer {
                            p.reply_out = Some(src);
                            e.control.probes_answered += 1;
                        }
                    }
                }
                PathControlKind::ProbeReply => {
                    // The primary carries both ways and the peer is there: home, resending what
                    // is outstanding on it (its copies arrive in order ahead of the alternate's
                    // still queued ones, which the responder then takes as duplicates; without
                    // the resend they would interleave, and every gap costs a NAK and a
                    // rewind). The peer follows on the moved message.
                    let Some(p) = e.paths.as_mut() else {
                        return;
                    };
                    if p.on_alternate && pkt.repr.eth.src == p.standby_peer && p.standby_usable() {
                        p.home_backoff = 0;
                        self.migrate(now, true);
                    }
                }
            }
        }

        /// The path control message waiting to leave, if any, into `buf`.
        #[cold]
        pub(in crate::transport::qp) fn transmit_control(
            &mut self,
            now: u64,
            buf: &mut [u8],
        ) -> Option<usize> {
            if !matches!(self.cx.state, QpState::Rtr | QpState::Rts | QpState::Sqd) {
                return None;
            }
            let e = self.cx.ext.as_mut()?;
            let kind = e.control_out.take()?;
            let (port, mac, ip) = match kind {
                PathControlKind::Announce | PathControlKind::AnnounceReply => {
                    let d = e.discovery.as_mut()?;
                    if kind == PathControlKind::Announce {
                        d.sent(now);
                    }
                    (d.local.port, d.local.mac, d.local.ip)
                }
                PathControlKind::Moved => {
                    let p = e.paths.as_ref()?;
                    let (mac, ip) = self.cx.template.source();
                    (p.active_port, mac, ip)
                }
                // Sent on a path of their own (`poll_transmit_side`).
                PathControlKind::Probe | PathControlKind::ProbeReply => return None,
            };
            e.control.sent += 1;
            self.emit_control(kind, port, (mac, ip), buf)
        }

        /// A `PATH_CONTROL` frame saying `kind` of the sender's port `port` at `(mac, ip)`, with
        /// this QP's atomic depths, from the header template in use.
        pub(in crate::transport::qp) fn emit_control(
            &self,
            kind: PathControlKind,
            port: u8,
            (mac, ip): (crate::wire::MacAddr, core::net::IpAddr),
            buf: &mut [u8],
        ) -> Option<usize> {
            let msg = PathControl {
                kind,
                port,
                max_rd_atomic: self.cx.attr.max_rd_atomic,
                max_dest_rd_atomic: self.cx.attr.max_dest_rd_atomic,
                ip,
                mac,
            };
            let repr = self
                .cx
                .repr(Opcode::PATH_CONTROL, Psn::new(0), PathControl::LEN);
            repr.emit(buf, |p| msg.emit(p)).ok()
        }

        /// A probe or a probe's answer to send on a path the QP may not be using, and that
        /// path's port (index from 0): [`poll_transmit_any`](Self::poll_transmit_any) asks
        /// for it before the frames that leave from [`send_port`](Self::send_port).
        #[inline]
        pub(in crate::transport::qp) fn poll_transmit_side(
            &mut self,
            buf: &mut [u8],
        ) -> Option<(u8, usize)> {
            // Called for every QP every turn; only one with an alternate path has anything.
            self.cx.ext.as_ref()?;
            self.transmit_side(buf)
        }

        #[cold]
        pub(in crate::transport::qp) fn transmit_side(
            &mut self,
            buf: &mut [u8],
        ) -> Option<(u8, usize)> {
            if !self.path_live() {
                return None;
            }
            let p = self.cx.ext.as_mut()?.paths.as_mut()?;
            let (kind, on_standby) = if core::mem::take(&mut p.probe_out) {
                (PathControlKind::Probe, true)
            } else {
                let to = p.reply_out.take()?;
                (PathControlKind::ProbeReply, to == p.standby_peer)
            };
            let port = if on_standby {
                p.standby_port
            } else {
                p.active_port
            };
            // The frame is built from the standby path's template: swapped in for the call.
            if on_standby {
                core::mem::swap(&mut p.standby, &mut self.cx.template);
            }
            let n = self.emit_control(kind, port, self.cx.template.source(), buf);
            let e = self.cx.ext.as_mut()?;
            if on_standby {
                if let Some(p) = e.paths.as_mut() {
                    core::mem::swap(&mut p.standby, &mut self.cx.template);
                }
            }
            let n = n?;
            e.control.sent += 1;
            self.cx.counters.tx_packets += 1;
            self.cx.counters.tx_bytes += n as u64;
            Some((port, n))
        }

        pub(in crate::transport::qp) fn damping_ns(&self) -> u64 {
            self.cx.ack_timeout_ns().unwrap_or(1_000_000)
        }

        /// Moves to the standby path; with `restart`, everything outstanding goes again from the
        /// oldest unacknowledged PSN on it, with a fresh retry budget. A move on the QP's own
        /// evidence tells the peer (`PATH_CONTROL` moved, on the new path), so its replies
        /// follow at once instead of after its own timeout; following the peer does not.
        pub(in crate::transport::qp) fn migrate(&mut self, now: u64, restart: bool) {
            self.migrate_telling(now, restart, true);
        }

        pub(in crate::transport::qp) fn migrate_telling(
            &mut self,
            now: u64,
            restart: bool,
            tell: bool,
        ) {
            let una = self.req.una;
            let Some(e) = self.cx.ext.as_mut() else {
                return;
            };
            let Some(p) = e.paths.as_mut() else {
                return;
            };
            core::mem::swap(&mut p.standby, &mut self.cx.template);
            p.swap_ends(now, una);
            if tell {
                e.control_out = Some(PathControlKind::Moved);
            }
            let (port, alt) = (p.active_port, p.on_alternate);
            self.cx
                .span()
                .in_scope(|| tracing::debug!(port, alternate = alt, restart, "path migration"));
            if restart {
                self.req.restart_on_new_path(&mut self.cx, now);
            }
        }

        /// Whether a timeout on the active path moves the QP: it has another path, and made
        /// progress since it last moved (a QP that moved and still hears nothing has no better
        /// path to go to: its retry budget decides).
        pub(in crate::transport::qp) fn migrates_on_timeout(&self, now: u64) -> bool {
            let Some(p) = self.cx.paths() else {
                return false;
            };
            self.req.timers_retry_expired(now)
                && self.req.una != self.req.nxt
                && p.may_leave(self.req.una)
                && p.standby_usable()
        }

        /// When this QP probes its primary path next (see `Paths::probe_at`).
        pub(in crate::transport::qp) fn probe_at(&self) -> Option<u64> {
            let p = self.cx.paths()?;
            p.probe_at(self.damping_ns(), self.req.una, self.req.nxt)
        }

        /// When the next announce of this QP's other port is due (its peer's unheard).
        pub(in crate::transport::qp) fn announce_at(&self) -> Option<u64> {
            self.cx.ext.as_ref()?.discovery?.next_at
        }

        pub(in crate::transport::qp) fn probe_if_due(&mut self, now: u64) {
            if self.probe_at().is_some_and(|t| t <= now) {
                if let Some(e) = self.cx.ext.as_mut() {
                    if let Some(p) = e.paths.as_mut() {
                        p.send_probe(now);
                        e.control.probes += 1;
                    }
                }
            }
        }

        /// Whether the QP takes part in failover: from RTR on (a responder answers on a path
        /// before, or without ever, reaching RTS) until ERR.
        pub(in crate::transport::qp) fn path_live(&self) -> bool {
            matches!(self.cx.state, QpState::Rtr | QpState::Rts | QpState::Sqd)
        }
    }
}
