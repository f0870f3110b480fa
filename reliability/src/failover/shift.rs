//! SHIFT mode (seed 000, §3–4): cross-NIC fault tolerance for peers whose transport is in
//! hardware. A connection is two RC QPs, a *default* one on one port and a *backup* one on
//! the other, each connected to its peer's twin; the transport of each is left alone (no
//! native failover, no state carried over), and failover happens one level up, at work
//! requests:
//!
//! - **Fallback** (State 1 → 2): an error completion on the default QP starts it. The
//!   retransmission-safety rule comes first: an outstanding atomic, or a WR the application
//!   marked [`NO_RESEND`], fails every outstanding WR back to the application instead. Else
//!   the side reposts its outstanding receives on the backup QP, tells the peer with a
//!   WRITE_WITH_IMM on the backup (its receive counter in the immediate: the *notify*), and
//!   the peer does the same and answers (the *ack*, its counter). Each side then resubmits
//!   its outstanding sends on the backup, skipping the SENDs the other's counter shows
//!   arrived (their acknowledgements were lost), so none is delivered twice. This is the
//!   paper's CQ-event handshake; a side that detects the failure itself while the peer's
//!   notify is on its way takes that notify as the ack.
//! - **Probing**: while in Fallback, a zero-length WRITE on the (reset) default QP every
//!   [`ShiftConfig::probe_interval_ns`]; it succeeds only if the default path carries the
//!   request and its ACK. A failed probe resets the default QP again.
//! - **Switch-back** (2 → 3 → 4 → 1): after a good probe, the side keeps sending on the
//!   backup until the application posts a signaled WR — the *fence* — (WaitSignaled), then
//!   holds every later WR back (WaitDrained); when the fence completes on the backup (so
//!   every WR before it has), it sends a switch-back notify on the default QP, and when that
//!   completes, releases the held WRs there. The peer, on the notify, reposts its
//!   outstanding receives on the default QP. A side with nothing outstanding needs no fence.
//!
//! Departures from the paper, because ferroce is software: the outstanding WRs are kept
//! here (a few dozen bytes each, gather lists by reference) rather than copied back out of a
//! hardware work queue; and both ports of a device share one memory-key table, so the
//! resubmitted WRs need no key translation. What SHIFT cannot do, this mode does not do
//! either: a resubmitted WRITE runs again (the paper's overwrite boundary), and atomics
//! are refused — native failover (`stack::transport::failover`) has neither limit.
//!
//! Sans-IO: the caller owns the two QPs and implements [`ShiftIo`]; it feeds every
//! completion of either QP to [`ShiftSide::on_completion`], which returns what the
//! application sees, and calls [`ShiftSide::poll`] for the probe timer.

use std::collections::VecDeque;

use ferroce_stack::transport::{
    OwnedSendWr, Payload, PostError, RecvWr, SendFlags, SendWr, Sge, WcOpcode, WcStatus,
    WorkCompletion, WrOpcode,
};

/// The application's hint (SHIFT §3.1): a WR with this flag must not be resent after a
/// failure — it fails instead. A bit IBTA leaves unused in `send_flags`.
pub const NO_RESEND: SendFlags = SendFlags(1 << 30);

/// Which of the two QPs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Rail {
    /// The default QP (the application's).
    Default = 0,
    /// The backup QP, on the other port: resubmitted and new WRs while in Fallback.
    Backup = 1,
    /// A third QP on the backup port, for the fallback handshake only. It is never reset
    /// and holds no application receive, so the handshake can always run on it: the data
    /// backup QP is reset by both sides at each fallback (clearing receives a switch-back
    /// moved home, and keeping both ends' PSNs in step), which a QP carrying the handshake
    /// itself could not be.
    Control = 2,
}

/// The send side's state (SHIFT §4.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SendState {
    /// State 1: the default QP carries everything.
    Default,
    /// State 2: the backup QP does; the default one is probed.
    Fallback,
    /// State 3: the default path is back; waiting for the application's next signaled WR.
    WaitSignaled,
    /// State 4: the fence is on the backup QP; later WRs wait for it to complete.
    WaitDrained,
}

/// The receive side's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RecvState {
    /// Receives are posted on the default QP.
    Default,
    /// On the backup QP.
    Fallback,
}

/// What the mode needs from whoever owns the QPs.
pub trait ShiftIo {
    /// Posts a send WR on `rail`'s QP.
    fn post_send(&mut self, rail: Rail, wr: &SendWr<'_>) -> Result<(), PostError>;
    /// Posts a receive WR on `rail`'s QP.
    fn post_recv(&mut self, rail: Rail, wr: &RecvWr<'_>) -> Result<(), PostError>;
    /// Resets `rail`'s QP (its queues dropped without completions) and brings it back to RTS
    /// with the attributes it was set up with, as SHIFT does to make an errored QP usable.
    /// The mode resets a default or backup QP only where its peer resets its twin before
    /// anything else is sent on it, so the two stay in step.
    fn reconnect(&mut self, rail: Rail);
    /// The clock, in nanoseconds.
    fn now(&self) -> u64;
}

/// Settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShiftConfig {
    /// Between probes of the default path while in Fallback.
    pub probe_interval_ns: u64,
    /// The side that probes and leads the switch-back (exactly one of the two). The other
    /// follows the leader's switch-back notify, fencing its own sends, and answers with its
    /// own notify. A departure from the paper, where each direction probes on its own: a
    /// probe that fails resets the QP, and a reset sets *both* directions' PSNs back, so
    /// two sides probing one QP pair put its PSNs out of step (a message then arrives as a
    /// duplicate and is acknowledged without running). One prober keeps them in step.
    pub leader: bool,
}

impl Default for ShiftConfig {
    fn default() -> Self {
        Self {
            probe_interval_ns: 1_000_000,
            leader: true,
        }
    }
}

ferroce_stack::counter_set! {
    /// What a side did.
    pub struct ShiftStats {
        /// Fallbacks to the backup QP.
        fallbacks,
        /// Returns to the default QP.
        switchbacks,
        /// Send WRs resubmitted on the backup QP.
        resent_wrs,
        /// Bytes those carried.
        resent_bytes,
        /// Outstanding SENDs the peer's counter showed delivered: completed, not resent.
        skipped_wrs,
        /// Failures that the safety rule turned into errors (an atomic or a hinted WR was
        /// outstanding).
        refused,
        /// Probes sent, and those that came back.
        probes,
        /// Probes that succeeded.
        probes_ok,
    }
}

/// Receives the control QP keeps posted (one is reposted for each message taken).
const CONTROL_RECVS: usize = 4;

/// Work request ids the mode keeps for itself (the application's must stay below).
pub const CONTROL_WR_IDS: u64 = 0xffff_ffff_ffff_ff00;
const CTL_RECV: u64 = CONTROL_WR_IDS;
const CTL_NOTIFY: u64 = CONTROL_WR_IDS + 1;
const CTL_ACK: u64 = CONTROL_WR_IDS + 2;
const CTL_SWITCH: u64 = CONTROL_WR_IDS + 3;
const CTL_PROBE: u64 = CONTROL_WR_IDS + 4;

/// The immediate of a control message: its kind in the top two bits, a receive counter
/// (modulo 2^30) below.
const IMM_NOTIFY: u32 = 1 << 30;
const IMM_ACK: u32 = 2 << 30;
const IMM_SWITCH: u32 = 3 << 30;
const COUNTER_MASK: u32 = (1 << 30) - 1;

/// A send WR as the mode keeps it: the WR, and the QP it was handed to (`None`: held back).
#[derive(Clone, Debug)]
struct OwnedSend {
    wr: OwnedSendWr,
    on: Option<Rail>,
}

impl OwnedSend {
    fn of(wr: &SendWr<'_>) -> Self {
        Self {
            wr: OwnedSendWr::from_wr(wr),
            on: None,
        }
    }

    fn wr_id(&self) -> u64 {
        self.wr.wr_id()
    }

    fn opcode(&self) -> WrOpcode {
        self.wr.opcode()
    }

    fn flags(&self) -> SendFlags {
        self.wr.flags()
    }

    /// The WR to post, without the mode's own hint bit.
    fn wr(&self) -> SendWr<'_> {
        let wr = self.wr.as_wr();
        let flags = SendFlags(wr.flags.0 & !NO_RESEND.0);
        wr.flags(flags)
    }

    /// Consumes a receive at the peer.
    fn two_sided(&self) -> bool {
        matches!(
            self.opcode(),
            WrOpcode::Send | WrOpcode::SendWithImm | WrOpcode::SendWithInv | WrOpcode::WriteWithImm
        )
    }

    /// The application's completion of it, successful.
    fn success(&self) -> WorkCompletion {
        WorkCompletion::of_request(
            self.wr_id(),
            WcStatus::Success,
            self.opcode().wc_opcode(),
            self.wr.byte_len() as u32,
        )
    }
}

/// A receive WR as the mode keeps it.
#[derive(Clone, Debug)]
struct OwnedRecv {
    wr_id: u64,
    sges: Vec<Sge>,
}

/// One end of a SHIFT connection (see the module documentation).
#[derive(Debug)]
pub struct ShiftSide {
    config: ShiftConfig,
    send_state: SendState,
    recv_state: RecvState,
    sends: VecDeque<OwnedSend>,
    recvs: VecDeque<OwnedRecv>,
    /// SENDs (and WRITE_WITH_IMMs) completed, and receives completed: the counters of the
    /// handshake (modulo 2^30 on the wire).
    sends_done: u32,
    recvs_done: u32,
    /// This side sent its notify and waits for the peer's ack (or notify).
    awaiting_ack: bool,
    /// The fence WR's id (WaitDrained), once it is on the backup QP.
    fence: Option<u64>,
    /// The switch-back notify is out; held WRs go when it completes.
    switching: bool,
    /// A probe is in flight; the next one is due at `probe_at`.
    probing: bool,
    probe_at: u64,
    /// The safety rule failed the connection: everything errors from now on.
    failed: bool,
    stats: ShiftStats,
}

impl ShiftSide {
    /// A side whose two QPs are connected (RTS) and have nothing posted: posts the control
    /// receive the backup QP keeps at the head of its receive queue for the handshake (the
    /// default QP gets one each time it is reset, when no application receive is on it).
    pub fn new(config: ShiftConfig, io: &mut impl ShiftIo) -> Self {
        let mut side = Self::new_unposted(config);
        side.arm(io);
        side
    }

    /// A side that has not posted its control receives yet: for QPs that are connected
    /// later. Call [`arm`](Self::arm) once they are.
    pub fn new_unposted(config: ShiftConfig) -> Self {
        Self {
            config,
            send_state: SendState::Default,
            recv_state: RecvState::Default,
            sends: VecDeque::new(),
            recvs: VecDeque::new(),
            sends_done: 0,
            recvs_done: 0,
            awaiting_ack: false,
            fence: None,
            switching: false,
            probing: false,
            probe_at: 0,
            failed: false,
            stats: ShiftStats::default(),
        }
    }

    /// Posts the control QP's receives (the QPs are connected now).
    pub fn arm(&mut self, io: &mut impl ShiftIo) {
        for _ in 0..CONTROL_RECVS {
            let _ = io.post_recv(Rail::Control, &control_recv());
        }
    }

    /// The send side's state.
    pub fn send_state(&self) -> SendState {
        self.send_state
    }

    /// The receive side's state.
    pub fn recv_state(&self) -> RecvState {
        self.recv_state
    }

    /// What the side did so far.
    pub fn stats(&self) -> ShiftStats {
        self.stats
    }

    /// Whether the safety rule ended the connection.
    pub fn failed(&self) -> bool {
        self.failed
    }

    /// Send WRs posted and not yet completed.
    pub fn outstanding_sends(&self) -> usize {
        self.sends.len()
    }

    /// `ibv_post_send` for one WR: kept, and handed to the QP the state says (or held).
    pub fn post_send(&mut self, io: &mut impl ShiftIo, wr: &SendWr<'_>) -> Result<(), PostError> {
        if wr.wr_id >= CONTROL_WR_IDS {
            return Err(PostError::Destination);
        }
        let mut s = OwnedSend::of(wr);
        let rail = match self.send_state {
            _ if self.awaiting_ack || self.switching => None,
            SendState::Default => Some(Rail::Default),
            SendState::Fallback => Some(Rail::Backup),
            SendState::WaitSignaled => {
                if s.flags().contains(SendFlags::SIGNALED) {
                    self.fence = Some(s.wr_id());
                    self.send_state = SendState::WaitDrained;
                }
                Some(Rail::Backup)
            }
            SendState::WaitDrained => None,
        };
        if let Some(r) = rail {
            io.post_send(r, &s.wr())?;
        }
        s.on = rail;
        self.sends.push_back(s);
        Ok(())
    }

    /// `ibv_post_recv` for one WR: kept, and posted on the QP receives go to now.
    pub fn post_recv(&mut self, io: &mut impl ShiftIo, wr: &RecvWr<'_>) -> Result<(), PostError> {
        if wr.wr_id >= CONTROL_WR_IDS {
            return Err(PostError::Destination);
        }
        let r = OwnedRecv {
            wr_id: wr.wr_id,
            sges: wr.sg_list.to_vec(),
        };
        io.post_recv(self.recv_rail(), &recv_wr(&r))?;
        self.recvs.push_back(r);
        Ok(())
    }

    fn recv_rail(&self) -> Rail {
        match self.recv_state {
            RecvState::Default => Rail::Default,
            RecvState::Fallback => Rail::Backup,
        }
    }

    fn send_rail(&self) -> Rail {
        match self.send_state {
            SendState::Default => Rail::Default,
            _ => Rail::Backup,
        }
    }

    /// Runs the probe timer. Call it when [`next_timeout`](Self::next_timeout) is due.
    pub fn poll(&mut self, io: &mut impl ShiftIo) {
        if self.failed
            || !self.config.leader
            || self.send_state != SendState::Fallback
            || self.awaiting_ack
            || self.probing
            || io.now() < self.probe_at
        {
            return;
        }
        let probe =
            SendWr::new(CTL_PROBE, WrOpcode::Write, Payload::Sges(&[])).flags(SendFlags::SIGNALED);
        if io.post_send(Rail::Default, &probe).is_ok() {
            self.probing = true;
            self.stats.probes += 1;
        } else {
            io.reconnect(Rail::Default);
            let _ = io.post_recv(Rail::Default, &control_recv());
            self.probe_at = io.now() + self.config.probe_interval_ns;
        }
    }

    /// When [`poll`](Self::poll) has work next, if ever.
    pub fn next_timeout(&self) -> Option<u64> {
        (self.config.leader
            && !self.failed
            && self.send_state == SendState::Fallback
            && !self.awaiting_ack
            && !self.probing)
            .then_some(self.probe_at)
    }

    /// A completion from `rail`'s QP; returns the application's completions it makes (none
    /// for the mode's own traffic and for errors it recovers from).
    pub fn on_completion(
        &mut self,
        io: &mut impl ShiftIo,
        rail: Rail,
        wc: &WorkCompletion,
    ) -> Vec<WorkCompletion> {
        let mut out = Vec::new();
        if wc.wr_id >= CONTROL_WR_IDS {
            self.on_control(io, rail, wc, &mut out);
            return out;
        }
        if wc.status != WcStatus::Success {
            self.on_error(io, rail, wc, &mut out);
            return out;
        }
        if wc.opcode.is_recv() {
            if let Some(i) = self.recvs.iter().position(|r| r.wr_id == wc.wr_id) {
                self.recvs.remove(i);
            }
            self.recvs_done = self.recvs_done.wrapping_add(1);
            out.push(*wc);
            return out;
        }
        // RC completes in order: every WR before this one on its QP is done too.
        let Some(i) = self
            .sends
            .iter()
            .position(|s| s.wr_id() == wc.wr_id && s.on == Some(rail))
        else {
            return out;
        };
        for s in self.sends.drain(..=i) {
            if s.two_sided() {
                self.sends_done = self.sends_done.wrapping_add(1);
            }
        }
        out.push(*wc);
        if self.fence == Some(wc.wr_id) {
            self.fence = None;
            self.begin_switch(io);
        }
        out
    }

    fn on_error(
        &mut self,
        io: &mut impl ShiftIo,
        rail: Rail,
        wc: &WorkCompletion,
        out: &mut Vec<WorkCompletion>,
    ) {
        if self.failed {
            out.extend(self.fail_all(wc));
            return;
        }
        let active = rail == self.send_rail()
            || (rail == Rail::Default && self.send_state == SendState::Default)
            || (wc.opcode.is_recv() && rail == self.recv_rail());
        if !active || self.awaiting_ack {
            // A flush of a QP already left behind, or of one being left: its WRs are
            // resubmitted, not failed.
            return;
        }
        if rail != Rail::Default || wc.status != WcStatus::RetryExcErr {
            // The backup failed too (nothing left to fall back to), or the error is the
            // application's (an access or length error is no network failure, and a resend
            // would fail the same way): reported as an RNIC would.
            self.failed = true;
            out.extend(self.fail_all(wc));
            return;
        }
        self.fall_back(io, wc, out, true);
    }

    /// Fallback (State 1 → 2), first half: the safety rule, receives to the backup, the
    /// default QP reset, the notify (or, `initiator == false`, the ack) to the peer.
    fn fall_back(
        &mut self,
        io: &mut impl ShiftIo,
        wc: &WorkCompletion,
        out: &mut Vec<WorkCompletion>,
        initiator: bool,
    ) {
        let unsafe_wr = self.sends.iter().any(|s| {
            s.on.is_some()
                && (s.opcode().is_read_or_atomic() && s.opcode() != WrOpcode::Read
                    || s.flags().contains(NO_RESEND))
        });
        if unsafe_wr {
            self.stats.refused += 1;
            self.failed = true;
            out.extend(self.fail_all(wc));
            return;
        }
        self.stats.fallbacks += 1;
        // Both QPs of data start afresh (the peer does the same before it answers, and
        // nothing goes on either until it has): the default one for probing and the
        // switch-back notify, the backup one for the receives and sends from now on.
        io.reconnect(Rail::Default);
        let _ = io.post_recv(Rail::Default, &control_recv());
        io.reconnect(Rail::Backup);
        for r in &self.recvs {
            let _ = io.post_recv(Rail::Backup, &recv_wr(r));
        }
        self.recv_state = RecvState::Fallback;
        let kind = if initiator { IMM_NOTIFY } else { IMM_ACK };
        let id = if initiator { CTL_NOTIFY } else { CTL_ACK };
        let _ = io.post_send(
            Rail::Control,
            &control_write(id, kind | self.recvs_done & COUNTER_MASK),
        );
        for s in &mut self.sends {
            s.on = None;
        }
        self.awaiting_ack = initiator;
        self.fence = None;
        self.switching = false;
        self.probing = false;
        self.probe_at = io.now() + self.config.probe_interval_ns;
        self.send_state = SendState::Fallback;
    }

    /// Fallback, second half: the peer's counter says how many of this side's SENDs it
    /// received; those complete without a resend, and everything after goes on the backup.
    fn resubmit(&mut self, io: &mut impl ShiftIo, peer_recvs: u32, out: &mut Vec<WorkCompletion>) {
        let mut delivered = peer_recvs.wrapping_sub(self.sends_done & COUNTER_MASK) & COUNTER_MASK;
        // Everything up to the last SEND the peer has is done (RC executes in order).
        let mut done = 0;
        if delivered > 0 {
            for (i, s) in self.sends.iter().enumerate() {
                if s.two_sided() {
                    delivered -= 1;
                    if delivered == 0 {
                        done = i + 1;
                        break;
                    }
                }
            }
        }
        for s in self.sends.drain(..done) {
            self.stats.skipped_wrs += 1;
            if s.two_sided() {
                self.sends_done = self.sends_done.wrapping_add(1);
            }
            if s.flags().contains(SendFlags::SIGNALED) {
                out.push(s.success());
            }
        }
        for s in &mut self.sends {
            if io.post_send(Rail::Backup, &s.wr()).is_ok() {
                self.stats.resent_wrs += 1;
                self.stats.resent_bytes += s.wr.byte_len();
                s.on = Some(Rail::Backup);
            }
        }
        self.awaiting_ack = false;
    }

    fn on_control(
        &mut self,
        io: &mut impl ShiftIo,
        rail: Rail,
        wc: &WorkCompletion,
        out: &mut Vec<WorkCompletion>,
    ) {
        let ok = wc.status == WcStatus::Success;
        if wc.wr_id == CTL_RECV && rail == Rail::Control && ok {
            let _ = io.post_recv(Rail::Control, &control_recv());
        }
        match wc.wr_id {
            CTL_RECV if ok => {
                let counter = wc.imm_data & COUNTER_MASK;
                match wc.imm_data & !COUNTER_MASK {
                    IMM_NOTIFY if self.awaiting_ack => self.resubmit(io, counter, out),
                    IMM_NOTIFY => {
                        // The peer fell back: so does this side, answering with its counter.
                        if self.failed {
                            return;
                        }
                        self.fall_back(io, wc, out, false);
                        if !self.failed {
                            self.resubmit(io, counter, out);
                        }
                    }
                    IMM_ACK if self.awaiting_ack => self.resubmit(io, counter, out),
                    IMM_SWITCH => {
                        // The peer's sends are back on the default QP: so are the receives.
                        for r in &self.recvs {
                            let _ = io.post_recv(Rail::Default, &recv_wr(r));
                        }
                        self.recv_state = RecvState::Default;
                        // A follower's sends follow the leader home (the leader's probe
                        // showed the path works): fenced, or at once with nothing out.
                        if self.send_state == SendState::Fallback && !self.awaiting_ack {
                            self.send_state = SendState::WaitSignaled;
                            if self.sends.is_empty() {
                                self.send_state = SendState::WaitDrained;
                                self.begin_switch(io);
                            }
                        }
                    }
                    _ => {}
                }
            }
            // A control receive flushed by a reset: nothing to do.
            CTL_RECV => {}
            CTL_PROBE => {
                self.probing = false;
                if ok {
                    self.stats.probes_ok += 1;
                    if self.send_state == SendState::Fallback {
                        self.send_state = SendState::WaitSignaled;
                        if self.sends.is_empty() {
                            // Nothing outstanding: no fence needed.
                            self.send_state = SendState::WaitDrained;
                            self.begin_switch(io);
                        }
                    }
                } else {
                    io.reconnect(Rail::Default);
                    let _ = io.post_recv(Rail::Default, &control_recv());
                    self.probe_at = io.now() + self.config.probe_interval_ns;
                }
            }
            CTL_SWITCH if ok => {
                // The peer knows; the held WRs go on the default QP, in order.
                self.switching = false;
                self.send_state = SendState::Default;
                self.stats.switchbacks += 1;
                for s in &mut self.sends {
                    if s.on.is_none() && io.post_send(Rail::Default, &s.wr()).is_ok() {
                        s.on = Some(Rail::Default);
                    }
                }
            }
            CTL_SWITCH if !self.failed => {
                // The default path failed again under the notify, which the peer may or may
                // not have taken: a whole new fallback puts both ends back in step.
                self.switching = false;
                self.fall_back(io, wc, out, true);
            }
            CTL_NOTIFY | CTL_ACK if !ok => {
                // The backup cannot reach the peer either.
                self.failed = true;
                out.extend(self.fail_all(wc));
            }
            _ => {}
        }
    }

    /// WaitDrained with nothing left on the backup: the switch-back notify on the default QP.
    fn begin_switch(&mut self, io: &mut impl ShiftIo) {
        self.switching = true;
        let _ = io.post_send(
            Rail::Default,
            &control_write(CTL_SWITCH, IMM_SWITCH | self.recvs_done & COUNTER_MASK),
        );
    }

    /// Every outstanding WR completes with `wc`'s status (the first) or flushed (the rest),
    /// as an RNIC without failover would report them.
    fn fail_all(&mut self, wc: &WorkCompletion) -> Vec<WorkCompletion> {
        let mut out = Vec::new();
        let mut status = if wc.status == WcStatus::WrFlushErr {
            WcStatus::RetryExcErr
        } else {
            wc.status
        };
        for s in self.sends.drain(..) {
            let mut c = s.success();
            c.qp_num = wc.qp_num;
            c.status = status;
            status = WcStatus::WrFlushErr;
            out.push(c);
        }
        for r in self.recvs.drain(..) {
            let mut c = *wc;
            c.wr_id = r.wr_id;
            c.status = WcStatus::WrFlushErr;
            c.opcode = WcOpcode::Recv;
            out.push(c);
        }
        out
    }
}

fn control_recv() -> RecvWr<'static> {
    RecvWr {
        wr_id: CTL_RECV,
        sg_list: &[],
    }
}

fn recv_wr(r: &OwnedRecv) -> RecvWr<'_> {
    RecvWr {
        wr_id: r.wr_id,
        sg_list: &r.sges,
    }
}

/// A zero-length WRITE_WITH_IMM: a control message that consumes the peer's control receive.
fn control_write(id: u64, imm: u32) -> SendWr<'static> {
    SendWr::new(id, WrOpcode::WriteWithImm, Payload::Sges(&[]))
        .imm(imm)
        .flags(SendFlags::SIGNALED)
}

// Its tests run it on the testbed's rails: reliability/tests/shift.rs.
