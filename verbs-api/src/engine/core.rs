//! The port-independent half of an engine: its QPs with their shared halves and CQs, the
//! device's registered memory, the timer wheel and the counters. Everything here is the
//! same for every driver, so it is compiled once and reached through
//! [`DeviceEngine::core`](crate::slot::DeviceEngine::core) without knowing the port.

use hashbrown::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use std::collections::VecDeque;

use ferroce_stack::transport::{
    AttrMask, Counters, Endpoint, ErrorCause, Hosted, MrTable, OwnedSendWr, PostError, Qp, QpAttr,
    QpState, RecvWr, SendFlags, SendWr, WcStatus, WorkCompletion, WrOpcode,
};
use ferroce_stack::wire::Checks;

use super::mailbox::Mailbox;
use super::raw::{FlowRule, RawQp};
use super::shared::{state_code, CqShared, Op, QpShared};
use super::steer::Steer;
use super::PortCounters;
use crate::events::{AsyncEvent, EventSink};
use crate::timer::TimerWheel;

/// A QP on its way from one engine to another: the QP with its shared half and CQs.
pub(crate) struct TakenQp(Slot);

pub(super) struct Slot {
    pub(super) qp: Qp,
    pub(super) shared: Arc<QpShared>,
    pub(super) send_cq: Arc<CqShared>,
    pub(super) recv_cq: Arc<CqShared>,
    /// The deadline the wheel holds for this QP.
    pub(super) armed: Option<u64>,
    pub(super) active: bool,
    /// The QP's send and receive queue lengths as of the last settle plus the WRs added
    /// since: what `settle` compares with the QP's to release slots.
    pub(super) sq_known: u32,
    pub(super) rq_known: u32,
    /// Send WRs held back behind a local operation (a memory window bind or a local
    /// invalidate), which runs once everything posted before it has completed: send queue
    /// order, for the operations the engine carries out itself. Empty almost always.
    pub(super) parked: VecDeque<OwnedSendWr>,
    /// The QP's path migrations as of the last settle: one more raises
    /// `IBV_EVENT_PATH_MIG`.
    pub(super) migrations: u64,
}

impl Hosted for Slot {
    #[inline]
    fn qp(&self) -> &Qp {
        &self.qp
    }

    #[inline]
    fn qp_mut(&mut self) -> &mut Qp {
        &mut self.qp
    }

    /// What the program posted to the QP and the engine has not taken yet is taken first.
    #[inline]
    fn before_frame(&mut self, mem: &mut MrTable, now: u64) {
        if !self.shared.inbox.is_empty() {
            EngineCore::take_posted(self, mem, now);
        }
    }

    /// The QP gets a turn to send in this engine turn, once.
    #[inline]
    fn touched(&mut self) -> bool {
        !std::mem::replace(&mut self.active, true)
    }
}

impl Slot {
    /// The send queue's length as posters count it: the QP's and what waits behind a local
    /// operation.
    fn sq_len(&self) -> u32 {
        self.qp.send_queue_len() as u32 + self.parked.len() as u32
    }
}

/// An engine's QPs, memory, timers and counters: everything but the port.
pub struct EngineCore {
    /// The QPs and the device's registered memory: the transport's sans-IO endpoint, which
    /// hands each frame to its QP and names the port of each frame a QP sends.
    pub(super) ep: Endpoint<Slot>,
    pub(super) wheel: TimerWheel,
    pub(super) active: Vec<u32>,
    pub(crate) doorbells: Arc<Mailbox<u32>>,
    pub(super) frame: Box<[u8]>,
    pub(super) counters: PortCounters,
    pub(super) checks: Checks,
    /// Read the port's clock on every `clock_stride`-th idle turn only (and on every turn
    /// after one that did work): on a real port the clock is a system call's worth of time,
    /// and a busy-polling loop spent more on it than on frames. QP timers are milliseconds,
    /// so a clock a few idle turns stale changes nothing. 1 on a simulated port, whose
    /// virtual time moves between turns.
    pub(super) clock_stride: u32,
    pub(super) idle_turns: u32,
    pub(super) now: u64,
    /// Payloads of at least this many bytes are sent in place (the port's
    /// `tx_split_min`; `usize::MAX` when it copies).
    pub(super) split_min: usize,
    /// Completions between a QP and its CQs (reused; see `settle`).
    pub(super) done: Vec<WorkCompletion>,
    /// Set on the engines of a multi-queue device.
    pub(super) steer: Option<Steer>,
    /// Where the device's port events go.
    pub(crate) events: EventSink,
    /// Frames other engines of the process looped to this one (real ports only).
    pub(crate) looped: Option<Arc<super::looped::LoopInbox>>,
    /// Raw packet QPs (a device's first engine holds them all).
    pub(super) raws: HashMap<u32, RawQp>,
    /// Flow rules steering received frames to raw QPs, in the order they were attached:
    /// (rule id, QP, rule).
    pub(super) flows: Vec<(u64, u32, FlowRule)>,
    pub(super) next_flow: u64,
    /// Some raw QP has frames to send.
    pub(super) raw_pending: bool,
    /// QP1 and the communication manager (a device's first engine, once asked for).
    pub(crate) gsi: Option<Box<super::gsi::Gsi>>,
}

impl EngineCore {
    pub(super) fn new(
        now: u64,
        key_seed: u64,
        checks: Checks,
        split_min: usize,
        links: Vec<bool>,
    ) -> Self {
        Self {
            ep: Endpoint::with_links(MrTable::new(key_seed), links),
            wheel: TimerWheel::new(now),
            active: Vec::new(),
            doorbells: Arc::new(Mailbox::new()),
            frame: vec![0; 16 * 1024].into_boxed_slice(),
            counters: PortCounters::default(),
            checks,
            clock_stride: 1,
            idle_turns: 0,
            now,
            split_min,
            done: Vec::new(),
            steer: None,
            events: EventSink::default(),
            looped: None,
            raws: HashMap::new(),
            flows: Vec::new(),
            next_flow: 1,
            raw_pending: false,
            gsi: None,
        }
    }

    /// Takes what the program posted to a QP (its doorbell rang): each WR into the QP, in
    /// order. The poster reserved the WR's slot; it stays in use while the QP holds the WR,
    /// and is released here only if the QP refuses it. The work done.
    pub(super) fn take_posted(slot: &mut Slot, mem: &mut MrTable, now: u64) -> usize {
        let mut work = 0;
        slot.shared.answered();
        while let Some(op) = slot.shared.inbox.pop() {
            work += 1;
            let r = match &op {
                Op::Send(s) => {
                    let r = Self::submit_send(slot, mem, now, &s.as_wr());
                    match r {
                        Ok(()) => slot.sq_known += 1,
                        Err(_) => _ = slot.shared.sq_used.fetch_sub(1, Ordering::AcqRel),
                    }
                    r
                }
                Op::Recv(id, sges) => {
                    let r = slot.qp.post_recv(&RecvWr {
                        wr_id: *id,
                        sg_list: sges,
                    });
                    match r {
                        Ok(()) => slot.rq_known += 1,
                        Err(_) => _ = slot.shared.rq_used.fetch_sub(1, Ordering::AcqRel),
                    }
                    r
                }
            };
            if let Err(e) = r {
                // Checked at post time; only a race with a state change gets here.
                let qpn = slot.qp.qpn().value();
                tracing::debug!(qpn, %e, "engine refused a posted WR");
                let wr_id = match op {
                    Op::Send(s) => s.wr_id(),
                    Op::Recv(id, _) => id,
                };
                let mut wc = WorkCompletion {
                    wr_id,
                    ..empty_wc(qpn)
                };
                wc.status = ferroce_stack::transport::WcStatus::LocQpOpErr;
                slot.send_cq.push(wc, now);
            }
        }
        work
    }

    /// Makes this engine one of several sharing a port's queues (see [`Steer`]).
    pub(crate) fn set_steer(&mut self, steer: Steer) {
        self.steer = Some(steer);
    }

    /// Reads the port's clock only every `stride`-th idle turn (see the field's comment).
    pub fn set_clock_stride(&mut self, stride: u32) {
        self.clock_stride = stride.max(1);
    }

    /// Counts a sleep of the engine thread, and whether it overslept work (see
    /// [`PortCounters::engine_missed_wakeups`]).
    pub(crate) fn count_sleep(&mut self, missed: bool) {
        self.counters.engine_sleeps += 1;
        self.counters.engine_missed_wakeups += u64::from(missed);
    }

    /// Makes the next turn read the port's clock: the turns before it may be far in the past
    /// (an engine thread that slept, an application thread that turns the engine now and
    /// then), and a deadline armed from a stale clock would fire early.
    pub fn resume(&mut self) {
        self.idle_turns = 0;
    }

    /// Port `port`'s link (index from 0) is `up`: if that is news, every QP hears of it
    /// (those with an alternate path act) and gets a turn to send, and the device's event
    /// handler hears too. True when it was news.
    pub(super) fn port_event(&mut self, now: u64, port: u8, up: bool) -> bool {
        let active = &mut self.active;
        if !self.ep.handle_link(now, port, up, |qpn| active.push(qpn)) {
            return false;
        }
        self.events.emit(if up {
            AsyncEvent::PortActive(port + 1)
        } else {
            AsyncEvent::PortError(port + 1)
        });
        true
    }

    /// Port counters.
    pub fn counters(&self) -> PortCounters {
        self.counters
    }

    /// The transport counters of QP `qpn`.
    pub fn qp_counters(&self, qpn: u32) -> Option<Counters> {
        self.ep.qps.get(qpn).map(|s| *s.qp.counters())
    }

    /// Every QP's number and counters.
    pub fn qp_counters_all(&self) -> Vec<(u32, Counters)> {
        let mut v: Vec<_> = self
            .ep
            .qps
            .iter()
            .map(|s| (s.qp.qpn().value(), *s.qp.counters()))
            .collect();
        v.sort_by_key(|&(n, _)| n);
        v
    }

    /// Each QP with an alternate path: its number, active port (from 0), moves so far and
    /// in-band path control exchange.
    pub fn qp_paths_all(&self) -> Vec<(u32, u8, u64, ferroce_stack::transport::PathControlStats)> {
        let mut v: Vec<_> = self
            .ep
            .qps
            .iter()
            .filter_map(|s| {
                let port = s.qp.active_port()?;
                let n = s.qp.qpn().value();
                Some((n, port, s.qp.path_migrations(), s.qp.path_control_stats()))
            })
            .collect();
        v.sort_by_key(|x| x.0);
        v
    }

    /// Every QP's counters, summed.
    pub fn qp_counters_total(&self) -> Counters {
        let mut c = Counters::default();
        for s in self.ep.qps.iter() {
            c.accumulate(s.qp.counters());
        }
        c
    }

    /// The device's registered memory, as this engine holds it.
    pub(crate) fn mem(&mut self) -> &mut MrTable {
        &mut self.ep.mem
    }

    pub(crate) fn add_qp(
        &mut self,
        qp: Qp,
        shared: Arc<QpShared>,
        send_cq: Arc<CqShared>,
        recv_cq: Arc<CqShared>,
    ) {
        let migrations = qp.path_migrations();
        self.ep.qps.insert(Slot {
            migrations,
            qp,
            shared,
            send_cq,
            recv_cq,
            armed: None,
            active: false,
            sq_known: 0,
            rq_known: 0,
            parked: VecDeque::new(),
        });
    }

    pub(crate) fn remove_qp(&mut self, qpn: u32) -> bool {
        self.ep.qps.remove(qpn).is_some()
    }

    /// Takes QP `qpn` out of this engine, with its shared half and CQs, to be inserted into
    /// another ([`insert_qp`](Self::insert_qp)). Its wheel entry stays behind and finds
    /// nothing when it fires.
    pub(crate) fn take_qp(&mut self, qpn: u32) -> Option<TakenQp> {
        self.ep.qps.remove(qpn).map(TakenQp)
    }

    /// Serves a QP taken from another engine of the device (this is engine `engine`, which
    /// its CQs now turn when polled). Its next turn here settles it
    /// (arming its timer on this wheel), and its doorbell rings here in case a poster rang
    /// the old engine while the QP was on its way: the inbox travels with the QP.
    pub(crate) fn insert_qp(&mut self, TakenQp(mut slot): TakenQp, engine: usize) {
        let qpn = slot.qp.qpn().value();
        slot.send_cq.serves_engine(engine);
        slot.recv_cq.serves_engine(engine);
        slot.armed = None;
        slot.active = true;
        slot.shared.ring(&self.doorbells);
        self.ep.qps.insert(slot);
        self.active.push(qpn);
    }

    /// Runs `f` on QP `qpn` (control path: modify, query), then publishes what changed.
    pub(crate) fn with_qp<T>(&mut self, qpn: u32, f: impl FnOnce(&mut Qp) -> T) -> Option<T> {
        let slot = self.ep.qps.get_mut(qpn)?;
        let out = f(&mut slot.qp);
        Self::settle(slot, &mut self.wheel, &mut self.done, self.now);
        if !slot.active {
            slot.active = true;
            self.active.push(qpn);
        }
        Some(out)
    }

    /// Serves a raw packet QP.
    pub(crate) fn add_raw(&mut self, raw: RawQp) {
        self.raws.insert(raw.shared.qpn, raw);
    }

    /// Destroys raw QP `qpn` and its flow rules.
    pub(crate) fn remove_raw(&mut self, qpn: u32) {
        self.raws.remove(&qpn);
        self.flows.retain(|f| f.1 != qpn);
    }

    /// Runs `f` on raw QP `qpn`, with the engine's memory table and clock.
    pub(crate) fn with_raw<T>(
        &mut self,
        qpn: u32,
        f: impl FnOnce(&mut RawQp, &MrTable, u64) -> T,
    ) -> Option<T> {
        let now = self.now;
        let raw = self.raws.get_mut(&qpn)?;
        let out = f(raw, &self.ep.mem, now);
        self.raw_pending |= raw.has_sends();
        Some(out)
    }

    /// Attaches a flow rule to raw QP `qpn`; returns its id.
    pub(crate) fn attach_flow(&mut self, qpn: u32, rule: FlowRule) -> Option<u64> {
        if !self.raws.contains_key(&qpn) {
            return None;
        }
        let id = self.next_flow;
        self.next_flow += 1;
        self.flows.push((id, qpn, rule));
        Some(id)
    }

    /// Detaches flow rule `id`; false if there is none.
    pub(crate) fn detach_flow(&mut self, id: u64) -> bool {
        let before = self.flows.len();
        self.flows.retain(|f| f.0 != id);
        self.flows.len() != before
    }

    /// Removes QP `qpn`'s completions from its CQs (it was reset).
    pub(crate) fn clean_cqs(&mut self, qpn: u32) {
        if let Some(slot) = self.ep.qps.get(qpn) {
            slot.send_cq.remove_qp(qpn);
            if !Arc::ptr_eq(&slot.send_cq, &slot.recv_cq) {
                slot.recv_cq.remove_qp(qpn);
            }
        }
    }

    /// Posts send WRs straight into QP `qpn`, for a poster that holds the engine (no inbox,
    /// no copies on the way); stops at the first WR the QP refuses and says which. `None`
    /// when the QP is not on this engine (it moved, or is gone): the poster goes through the
    /// QP's inbox instead.
    pub(crate) fn post_sends(
        &mut self,
        qpn: u32,
        wrs: &[SendWr<'_>],
    ) -> Option<Result<(), (usize, PostError)>> {
        let now = self.now;
        let slot = self.ep.qps.get_mut(qpn)?;
        let shared = slot.shared.clone();
        let (used, max) = (&shared.sq_used, shared.caps.max_send_wr);
        let mut r = Ok(());
        for (i, wr) in wrs.iter().enumerate() {
            // Reserve as a poster through the inbox does, so the two paths share one count.
            if !QpShared::reserve(used, max) {
                r = Err((i, PostError::QueueFull(max)));
                break;
            }
            match Self::submit_send(slot, &mut self.ep.mem, now, wr) {
                Ok(()) => slot.sq_known += 1,
                Err(e) => {
                    used.fetch_sub(1, Ordering::AcqRel);
                    r = Err((i, e));
                    break;
                }
            }
        }
        Self::settle(slot, &mut self.wheel, &mut self.done, now);
        if !slot.active {
            slot.active = true;
            self.active.push(qpn);
        }
        Some(r)
    }

    /// Hands a send WR to the QP of `slot`, or carries out a local operation (memory window
    /// bind, local invalidate) at once when nothing posted before it is outstanding; else
    /// the WR waits in `parked`, behind the local operation, for its turn.
    pub(super) fn submit_send(
        slot: &mut Slot,
        mem: &mut MrTable,
        now: u64,
        wr: &SendWr<'_>,
    ) -> Result<(), PostError> {
        let behind = !slot.parked.is_empty();
        if wr.opcode.is_local() || behind {
            match slot.qp.state() {
                QpState::Rts | QpState::Sqd | QpState::Sqe | QpState::Err => {}
                s => return Err(PostError::InvalidState(s)),
            }
        }
        if behind || (wr.opcode.is_local() && slot.qp.send_queue_len() > 0) {
            slot.parked.push_back(OwnedSendWr::from_wr(wr));
            return Ok(());
        }
        if wr.opcode.is_local() {
            Self::run_local(slot, mem, now, wr);
            return Ok(());
        }
        slot.qp.post_send(wr)
    }

    /// Posts what waited behind local operations, as far as the send queue lets it: a
    /// local operation runs only once the QP's send queue is empty.
    pub(super) fn run_parked(slot: &mut Slot, mem: &mut MrTable, now: u64) {
        while let Some(front) = slot.parked.front() {
            if front.opcode().is_local() && slot.qp.send_queue_len() > 0 {
                return;
            }
            let Some(op) = slot.parked.pop_front() else {
                return;
            };
            let wr = op.as_wr();
            if wr.opcode.is_local() {
                Self::run_local(slot, mem, now, &wr);
            } else if slot.qp.post_send(&wr).is_err() {
                // Checked at post time; only a state change since gets here.
                let mut wc = WorkCompletion::of_request(
                    wr.wr_id,
                    WcStatus::LocQpOpErr,
                    wr.opcode.wc_opcode(),
                    0,
                );
                wc.qp_num = slot.qp.qpn();
                slot.send_cq.push(wc, now);
            }
        }
    }

    /// Carries out a memory window bind or local invalidate on the device's memory table
    /// and completes it (when signaled, or in error). A refusal completes with
    /// `MwBindErr` and fails the QP, as an RNIC does; a QP in the error state flushes it.
    fn run_local(slot: &mut Slot, mem: &mut MrTable, now: u64, wr: &SendWr<'_>) {
        let qpn = slot.qp.qpn();
        let status = if matches!(slot.qp.state(), QpState::Err | QpState::Sqe) {
            WcStatus::WrFlushErr
        } else {
            let pd = slot.qp.pd();
            let done = match wr.opcode {
                WrOpcode::LocalInv => mem.invalidate(wr.imm_data, pd).is_ok(),
                _ => wr
                    .window_bind(qpn.value())
                    .is_some_and(|b| mem.bind_window(pd, b).is_ok()),
            };
            if done {
                WcStatus::Success
            } else {
                WcStatus::MwBindErr
            }
        };
        let signaled = wr.flags.contains(SendFlags::SIGNALED) || slot.shared.caps.sq_sig_all;
        if status != WcStatus::Success || signaled {
            let mut wc = WorkCompletion::of_request(wr.wr_id, status, wr.opcode.wc_opcode(), 0);
            wc.qp_num = qpn;
            slot.send_cq.push(wc, now);
        }
        if status == WcStatus::MwBindErr {
            let attr = QpAttr {
                qp_state: QpState::Err,
                ..QpAttr::default()
            };
            let _ = slot.qp.modify(&attr, AttrMask::STATE);
        }
    }

    /// [`post_sends`](Self::post_sends) for receive WRs.
    pub(crate) fn post_recvs(
        &mut self,
        qpn: u32,
        wrs: &[RecvWr<'_>],
    ) -> Option<Result<(), (usize, PostError)>> {
        self.post_each(qpn, wrs, false, Qp::post_recv)
    }

    fn post_each<W>(
        &mut self,
        qpn: u32,
        wrs: &[W],
        send: bool,
        post: impl Fn(&mut Qp, &W) -> Result<(), PostError>,
    ) -> Option<Result<(), (usize, PostError)>> {
        let slot = self.ep.qps.get_mut(qpn)?;
        // Borrowed apart: the QP mutably, its shared half and one queue's count beside it.
        let Slot {
            qp,
            shared,
            sq_known,
            rq_known,
            ..
        } = &mut *slot;
        let (used, max, known) = if send {
            (&shared.sq_used, shared.caps.max_send_wr, sq_known)
        } else {
            (&shared.rq_used, shared.caps.max_recv_wr, rq_known)
        };
        let r = wrs.iter().enumerate().try_for_each(|(i, wr)| {
            // Reserve as a poster through the inbox does, so the two paths share one count.
            if !QpShared::reserve(used, max) {
                return Err((i, PostError::QueueFull(max)));
            }
            post(qp, wr).map(|()| *known += 1).map_err(|e| {
                used.fetch_sub(1, Ordering::AcqRel);
                (i, e)
            })
        });
        Self::settle(slot, &mut self.wheel, &mut self.done, self.now);
        if !slot.active {
            slot.active = true;
            self.active.push(qpn);
        }
        Some(r)
    }

    /// The earliest QP deadline armed since the last call (see
    /// [`TimerWheel::take_earliest_new`]).
    pub(crate) fn take_earliest_new_deadline(&mut self) -> Option<u64> {
        self.wheel.take_earliest_new()
    }

    /// The earliest QP deadline, for a simulator deciding how far virtual time may jump.
    pub fn next_deadline(&self) -> Option<u64> {
        let cm = self.gsi.as_ref().and_then(|g| g.agent.poll_timeout());
        self.ep
            .qps
            .iter()
            .filter_map(|s| s.qp.poll_timeout())
            .chain(cm)
            .min()
    }

    /// True when some QP has work the next `poll` would do without new input.
    pub fn has_pending_work(&self) -> bool {
        !self.doorbells.is_empty()
            || !self.active.is_empty()
            || self.steer.as_ref().is_some_and(|s| !s.inbox().is_empty())
            || self.looped.as_ref().is_some_and(|l| !l.is_empty())
            || self.raw_pending
            || self.gsi.as_ref().is_some_and(|g| g.pending())
    }

    /// Moves a QP's completions to its CQs, publishes its state and queue depths, and keeps
    /// its wheel entry in step with its deadline. The depths are published before the
    /// completions: a thread that sees a send complete and posts the next at once (a queue
    /// of one, as ibv_rc_pingpong has) must find its slot free.
    pub(super) fn settle(
        slot: &mut Slot,
        wheel: &mut TimerWheel,
        done: &mut Vec<WorkCompletion>,
        now: u64,
    ) {
        while let Some(wc) = slot.qp.poll_completion() {
            done.push(wc);
        }
        let sh = &slot.shared;
        let state = state_code(slot.qp.state());
        if sh.state.swap(state, Ordering::AcqRel) != state && slot.qp.state() == QpState::Err {
            Self::entered_error(slot);
        }
        let moves = slot.qp.path_migrations();
        if moves != slot.migrations {
            slot.migrations = moves;
            slot.shared
                .events
                .emit(AsyncEvent::PathMigrated(slot.qp.qpn()));
        }
        let sh = &slot.shared;
        // Release the slots of the WRs the QP let go since the last settle.
        let (sq, rq) = (slot.sq_len(), slot.qp.recv_queue_len() as u32);
        sh.sq_used
            .fetch_sub(slot.sq_known.saturating_sub(sq), Ordering::AcqRel);
        sh.rq_used
            .fetch_sub(slot.rq_known.saturating_sub(rq), Ordering::AcqRel);
        (slot.sq_known, slot.rq_known) = (sq, rq);
        for wc in done.drain(..) {
            if wc.opcode.is_recv() {
                slot.recv_cq.push(wc, now);
            } else {
                slot.send_cq.push(wc, now);
            }
        }
        let deadline = slot.qp.poll_timeout();
        if let Some(d) = deadline {
            wheel.note(d);
            if slot.armed.is_none_or(|a| d < a) {
                wheel.insert(d, slot.qp.qpn().value());
                slot.armed = Some(d);
            }
        }
    }
}

impl EngineCore {
    /// A QP just entered the error state: the affiliated events an RNIC raises. The
    /// responder's reason, if it failed the QP (a requester's error completes its WR with
    /// the reason instead); and for a QP on a shared receive queue, that it takes no more of
    /// the queue's receives.
    #[cold]
    fn entered_error(slot: &mut Slot) {
        let qpn = slot.qp.qpn();
        let events = &slot.shared.events;
        if let Some(cause) = slot.qp.take_error_cause() {
            events.emit(match cause {
                ErrorCause::InvalidRequest => AsyncEvent::QpRequestError(qpn),
                ErrorCause::AccessViolation => AsyncEvent::QpAccessError(qpn),
                ErrorCause::Catastrophic => AsyncEvent::QpFatal(qpn),
            });
        }
        if slot.shared.has_srq {
            events.emit(AsyncEvent::QpLastWqeReached(qpn));
        }
    }
}

pub(super) fn empty_wc(qpn: u32) -> WorkCompletion {
    WorkCompletion {
        wr_id: 0,
        status: ferroce_stack::transport::WcStatus::Success,
        opcode: ferroce_stack::transport::WcOpcode::Send,
        qp_num: ferroce_stack::wire::Qpn::new(qpn),
        byte_len: 0,
        imm_data: 0,
        wc_flags: ferroce_stack::transport::WcFlags(0),
        src_qp: ferroce_stack::wire::Qpn::new(0),
        smac: ferroce_stack::wire::MacAddr([0; 6]),
        solicited: false,
        tag: 0,
    }
}

/// Hands a received frame to the raw QP whose flow rule matches it first; false when none
/// does (the frame is RoCE's).
#[inline]
pub(super) fn steer_raw(
    flows: &[(u64, u32, FlowRule)],
    raws: &mut HashMap<u32, RawQp>,
    mem: &MrTable,
    frame: &[u8],
    now: u64,
) -> bool {
    let Some(qpn) = flows.iter().find(|f| f.2.matches(frame)).map(|f| f.1) else {
        return false;
    };
    // An RSS QP hands the frame to the work queue its hash picks.
    let to = match raws.get(&qpn).and_then(|r| r.rss.as_ref()) {
        Some(rss) => rss.pick(frame),
        None => Some(qpn),
    };
    if let Some(raw) = to.and_then(|q| raws.get_mut(&q)) {
        raw.receive(mem, frame, now);
    }
    true
}
