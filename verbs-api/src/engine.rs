//! The poll-mode engine of one device: a port, its QPs, the device's registered memory and a
//! timer wheel. One call to [`Engine::poll`] is one turn of the loop: take posted work from
//! the lock-free inboxes, receive a burst and hand each packet to its QP, run due timers,
//! let every QP with something to say transmit, flush the burst, and move completions to their
//! CQs. The engine never blocks; who calls `poll` (the application thread, run-to-completion,
//! or the engine thread) is the verbs layer's choice.

use hashbrown::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use crossbeam::queue::{ArrayQueue, SegQueue};
use ferroce_drivers::Port;
use ferroce_stack::transport::{Counters, PostError, QpCaps, SendFlags, TxOut};
use ferroce_stack::transport::{
    MrTable, Payload, Qp, QpState, QpType, RecvWr, SendWr, Sge, UdDest, WorkCompletion, WrOpcode,
};
use ferroce_stack::wire::{Checks, RoceRepr};
use smallvec::SmallVec;

use crate::timer::TimerWheel;

/// Frames taken from the port per receive burst.
pub const RX_BURST: usize = 32;

ferroce_stack::counter_set! {
    /// Port-level counters (the per-QP ones are the transport's).
    pub struct PortCounters {
        /// Frames received.
        rx_frames,
        /// Bytes received.
        rx_bytes,
        /// Frames sent.
        tx_frames,
        /// Bytes sent.
        tx_bytes,
        /// Frames that were not valid RoCEv2 (any parse or ICRC error).
        rx_malformed,
        /// Of those, frames whose ICRC was wrong (Linux: `rx_icrc_encapsulated`).
        rx_icrc_errors => "rx_icrc_encapsulated",
        /// Valid frames for a QP number this device does not have.
        rx_unknown_qp,
        /// Frames the port refused to send (link down, ring full).
        tx_errors,
        /// Of the frames sent, those whose payload left from registered memory in place.
        tx_zero_copy,
        /// Frames received on this engine's queue for a QP of another engine of the device,
        /// handed over to it (a multi-queue device: the port's receive-side scaling picks the
        /// queue from addresses and UDP ports, not from the destination QP).
        rx_forwarded,
        /// Of those, frames dropped because the other engine's inbox was full.
        rx_forward_drops,
        /// Times the engine thread slept, idle, on the port's descriptor.
        engine_sleeps,
        /// Sleeps that ran to their longest allowed length although work waited: something
        /// that needed the engine did not wake it. Zero unless a wakeup is missing.
        engine_missed_wakeups,
    }
}

/// Frames an engine's inbox holds for it from the other engines of its device.
const STEER_INBOX: usize = 4096;

/// How the engines of a multi-queue device pass each other frames. A QP lives on engine
/// `qpn % engines` (QPNs are handed out in turn, so QPs spread evenly), and a frame that
/// arrived on another engine's queue is copied into the owner's inbox, as a NIC without a
/// flow rule on the BTH would have to: receive-side scaling hashes addresses and UDP ports,
/// and the peer picks the source port. The frame was checked on arrival (ICRC included), so
/// the owner does not check it again.
pub(crate) struct Steer {
    index: usize,
    inboxes: Arc<[ArrayQueue<Vec<u8>>]>,
    /// Buffers of delivered frames, for the next forward to reuse.
    spare: Arc<ArrayQueue<Vec<u8>>>,
}

impl Steer {
    /// One `Steer` for each of `n` engines.
    pub(crate) fn group(n: usize) -> Vec<Self> {
        let inboxes: Arc<[ArrayQueue<Vec<u8>>]> =
            (0..n).map(|_| ArrayQueue::new(STEER_INBOX)).collect();
        let spare = Arc::new(ArrayQueue::new(STEER_INBOX));
        (0..n)
            .map(|index| Self {
                index,
                inboxes: inboxes.clone(),
                spare: spare.clone(),
            })
            .collect()
    }

    /// The engine that owns QP `qpn`.
    pub(crate) fn owner(qpn: u32, engines: usize) -> usize {
        qpn as usize % engines.max(1)
    }

    /// Hands `frame` to engine `to`; false if its inbox is full.
    fn forward(&self, to: usize, frame: &[u8]) -> bool {
        let mut buf = self.spare.pop().unwrap_or_default();
        buf.clear();
        buf.extend_from_slice(frame);
        match self.inboxes[to].push(buf) {
            Ok(()) => true,
            Err(buf) => {
                // Dropped like a frame on a full ring; its buffer serves the next forward.
                let _ = self.spare.push(buf);
                false
            }
        }
    }

    /// Hands `frame`, for QP `qpn`, to the engine that owns that QP when that is another
    /// engine (counted, as a drop too if its inbox is full); false when it is this one.
    fn forward_to_owner(&self, qpn: u32, frame: &[u8], counters: &mut PortCounters) -> bool {
        let to = Self::owner(qpn, self.inboxes.len());
        if to == self.index {
            return false;
        }
        counters.rx_forwarded += 1;
        if !self.forward(to, frame) {
            counters.rx_forward_drops += 1;
        }
        true
    }

    fn inbox(&self) -> &ArrayQueue<Vec<u8>> {
        &self.inboxes[self.index]
    }
}

/// A completion queue's shared half: the engine pushes, any thread pops, without a lock.
#[derive(Debug)]
pub struct CqShared {
    pub(crate) id: u32,
    pub(crate) queue: SegQueue<WorkCompletion>,
    pub(crate) capacity: usize,
    /// 0: not armed; 1: next completion; 2: next solicited completion.
    pub(crate) armed: AtomicU8,
    pub(crate) channel: Option<Arc<ChannelShared>>,
    /// Completions dropped because the CQ was full (the CQ overran).
    pub(crate) overruns: AtomicUsize,
}

impl CqShared {
    pub(crate) fn new(id: u32, capacity: usize, channel: Option<Arc<ChannelShared>>) -> Self {
        Self {
            id,
            queue: SegQueue::new(),
            capacity,
            armed: AtomicU8::new(0),
            channel,
            overruns: AtomicUsize::new(0),
        }
    }

    fn push(&self, wc: WorkCompletion) {
        if self.queue.len() >= self.capacity {
            self.overruns.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let solicited = wc.solicited || wc.status != ferroce_stack::transport::WcStatus::Success;
        self.queue.push(wc);
        let fire = match self.armed.load(Ordering::Acquire) {
            1 => true,
            2 => solicited,
            _ => false,
        };
        if fire && self.armed.swap(0, Ordering::AcqRel) != 0 {
            if let Some(ch) = &self.channel {
                ch.post(self.id);
            }
        }
    }
}

/// A completion channel: CQ ids whose notification fired, for a thread that waits.
#[derive(Default)]
pub struct ChannelShared {
    events: Mutex<std::collections::VecDeque<u32>>,
    ready: Condvar,
    /// Called after each event is queued (the libibverbs shim makes the channel's fd
    /// readable with it).
    pub(crate) notify: std::sync::OnceLock<Box<dyn Fn() + Send + Sync>>,
}

impl std::fmt::Debug for ChannelShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChannelShared")
            .field("events", &self.events)
            .finish_non_exhaustive()
    }
}

impl ChannelShared {
    fn post(&self, cq: u32) {
        let mut q = self.events.lock().unwrap_or_else(|e| e.into_inner());
        q.push_back(cq);
        self.ready.notify_all();
        drop(q);
        if let Some(f) = self.notify.get() {
            f();
        }
    }

    /// Waits up to `timeout` for a CQ event; returns the CQ's id.
    pub(crate) fn wait(&self, timeout: std::time::Duration) -> Option<u32> {
        let q = self.events.lock().unwrap_or_else(|e| e.into_inner());
        let (mut q, _) = self
            .ready
            .wait_timeout_while(q, timeout, |q| q.is_empty())
            .unwrap_or_else(|e| e.into_inner());
        q.pop_front()
    }
}

/// A send WR copied out of the caller's structures, as a NIC reads a WQE at post time.
#[derive(Clone, Debug)]
pub(crate) struct OwnedSend {
    pub(crate) wr_id: u64,
    pub(crate) opcode: WrOpcode,
    pub(crate) flags: SendFlags,
    pub(crate) sges: SmallVec<[Sge; 2]>,
    pub(crate) inline: Option<SmallVec<[u8; 64]>>,
    pub(crate) imm_data: u32,
    pub(crate) remote_addr: u64,
    pub(crate) rkey: u32,
    pub(crate) compare_add: u64,
    pub(crate) swap: u64,
    pub(crate) ud: Option<UdDest>,
}

impl OwnedSend {
    pub(crate) fn from_wr(wr: &SendWr<'_>) -> Self {
        let (sges, inline) = match wr.payload {
            Payload::Sges(s) => (SmallVec::from_slice(s), None),
            Payload::Inline(b) => (SmallVec::new(), Some(SmallVec::from_slice(b))),
        };
        Self {
            wr_id: wr.wr_id,
            opcode: wr.opcode,
            flags: wr.flags,
            sges,
            inline,
            imm_data: wr.imm_data,
            remote_addr: wr.remote_addr,
            rkey: wr.rkey,
            compare_add: wr.compare_add,
            swap: wr.swap,
            ud: wr.ud,
        }
    }

    fn as_wr(&self) -> SendWr<'_> {
        SendWr {
            wr_id: self.wr_id,
            opcode: self.opcode,
            flags: self.flags,
            payload: match &self.inline {
                Some(b) => Payload::Inline(b),
                None => Payload::Sges(&self.sges),
            },
            imm_data: self.imm_data,
            remote_addr: self.remote_addr,
            rkey: self.rkey,
            compare_add: self.compare_add,
            swap: self.swap,
            ud: self.ud,
        }
    }
}

/// Work posted by an application thread, waiting for the engine.
#[derive(Debug)]
pub(crate) enum Op {
    Send(OwnedSend),
    Recv(u64, SmallVec<[Sge; 2]>),
}

/// What application threads see of a QP without taking the engine lock.
#[derive(Debug)]
pub struct QpShared {
    pub(crate) qpn: u32,
    pub(crate) qp_type: QpType,
    pub(crate) caps: QpCaps,
    pub(crate) inbox: SegQueue<Op>,
    /// The QP's state as of the engine's last turn (or the last modify).
    pub(crate) state: AtomicU8,
    /// Slots in use in the send and receive queues: WRs reserved by a poster (on their way
    /// through the inbox) plus WRs in the QP. One counter per queue, reserved with a
    /// compare-and-swap before a WR is queued and released by the engine when the QP lets
    /// the WR go, so no poster ever sees a queue fuller or emptier than it is.
    pub(crate) sq_used: AtomicU32,
    pub(crate) rq_used: AtomicU32,
    /// Receives come from a shared receive queue.
    pub(crate) has_srq: bool,
    rung: AtomicBool,
}

impl QpShared {
    pub(crate) fn new(qpn: u32, qp_type: QpType, caps: QpCaps) -> Self {
        Self {
            qpn,
            qp_type,
            caps,
            inbox: SegQueue::new(),
            state: AtomicU8::new(state_code(QpState::Reset)),
            sq_used: AtomicU32::new(0),
            rq_used: AtomicU32::new(0),
            has_srq: false,
            rung: AtomicBool::new(false),
        }
    }

    /// Reserves a slot in a queue of `max` whose use `used` counts; false when it is full.
    pub(crate) fn reserve(used: &AtomicU32, max: u32) -> bool {
        used.fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
            (u < max).then_some(u + 1)
        })
        .is_ok()
    }

    pub(crate) fn state(&self) -> QpState {
        QpState::ALL[usize::from(self.state.load(Ordering::Acquire)).min(6)]
    }

    /// Queues `op` and rings the doorbell the engine watches.
    pub(crate) fn submit(&self, op: Op, doorbells: &SegQueue<u32>) {
        self.inbox.push(op);
        if !self.rung.swap(true, Ordering::AcqRel) {
            doorbells.push(self.qpn);
        }
    }
}

pub(crate) fn state_code(s: QpState) -> u8 {
    QpState::ALL.iter().position(|&x| x == s).unwrap_or(0) as u8
}

struct Slot {
    qp: Qp,
    shared: Arc<QpShared>,
    send_cq: Arc<CqShared>,
    recv_cq: Arc<CqShared>,
    /// The deadline the wheel holds for this QP.
    armed: Option<u64>,
    active: bool,
    /// The QP's send and receive queue lengths as of the last settle plus the WRs added
    /// since: what `settle` compares with the QP's to release slots.
    sq_known: u32,
    rq_known: u32,
}

/// The engine of one device over port `P`.
pub struct Engine<P> {
    port: P,
    pub(crate) mem: MrTable,
    qps: HashMap<u32, Slot>,
    wheel: TimerWheel,
    active: Vec<u32>,
    pub(crate) doorbells: Arc<SegQueue<u32>>,
    frame: Box<[u8]>,
    counters: PortCounters,
    checks: Checks,
    /// Read the port's clock on every `clock_stride`-th idle turn only (and on every turn
    /// after one that did work): on a real port the clock is a system call's worth of time,
    /// and a busy-polling loop spent more on it than on frames. QP timers are milliseconds,
    /// so a clock a few idle turns stale changes nothing. 1 on a simulated port, whose
    /// virtual time moves between turns.
    clock_stride: u32,
    idle_turns: u32,
    now: u64,
    /// Payloads of at least this many bytes are sent in place (the port's
    /// `tx_split_min`; `usize::MAX` when it copies).
    split_min: usize,
    /// Completions between a QP and its CQs (reused; see `settle`).
    done: Vec<WorkCompletion>,
    /// Set on the engines of a multi-queue device.
    steer: Option<Steer>,
}

impl<P: Port> Engine<P> {
    /// An engine over `port`, with memory keys derived from `key_seed`.
    pub fn new(port: P, key_seed: u64) -> Self {
        let now = port.now_ns();
        let checks = port.capabilities().rx_checks;
        let split_min = port.capabilities().tx_split_min.unwrap_or(usize::MAX);
        Self {
            port,
            mem: MrTable::new(key_seed),
            qps: HashMap::new(),
            wheel: TimerWheel::new(now),
            active: Vec::new(),
            doorbells: Arc::new(SegQueue::new()),
            frame: vec![0; 16 * 1024].into_boxed_slice(),
            counters: PortCounters::default(),
            checks,
            clock_stride: 1,
            idle_turns: 0,
            now,
            split_min,
            done: Vec::new(),
            steer: None,
        }
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

    /// The port.
    pub fn port(&self) -> &P {
        &self.port
    }

    /// The port, mutably (to finish a pcap tee, say).
    pub fn port_mut(&mut self) -> &mut P {
        &mut self.port
    }

    /// Port counters.
    pub fn counters(&self) -> PortCounters {
        self.counters
    }

    /// The transport counters of QP `qpn`.
    pub fn qp_counters(&self, qpn: u32) -> Option<Counters> {
        self.qps.get(&qpn).map(|s| *s.qp.counters())
    }

    /// Every QP's number and counters.
    pub fn qp_counters_all(&self) -> Vec<(u32, Counters)> {
        let mut v: Vec<_> = self
            .qps
            .iter()
            .map(|(&n, s)| (n, *s.qp.counters()))
            .collect();
        v.sort_by_key(|&(n, _)| n);
        v
    }

    /// Every QP's counters, summed.
    pub fn qp_counters_total(&self) -> Counters {
        let mut c = Counters::default();
        for s in self.qps.values() {
            c.accumulate(s.qp.counters());
        }
        c
    }

    /// The port's clock.
    pub fn now(&self) -> u64 {
        self.port.now_ns()
    }

    pub(crate) fn add_qp(
        &mut self,
        qp: Qp,
        shared: Arc<QpShared>,
        send_cq: Arc<CqShared>,
        recv_cq: Arc<CqShared>,
    ) {
        let qpn = qp.qpn().value();
        self.qps.insert(
            qpn,
            Slot {
                qp,
                shared,
                send_cq,
                recv_cq,
                armed: None,
                active: false,
                sq_known: 0,
                rq_known: 0,
            },
        );
    }

    pub(crate) fn remove_qp(&mut self, qpn: u32) -> bool {
        self.qps.remove(&qpn).is_some()
    }

    /// Runs `f` on QP `qpn` (control path: modify, query), then publishes what changed.
    pub(crate) fn with_qp<T>(&mut self, qpn: u32, f: impl FnOnce(&mut Qp) -> T) -> Option<T> {
        let slot = self.qps.get_mut(&qpn)?;
        let out = f(&mut slot.qp);
        Self::settle(slot, &mut self.wheel, &mut self.done);
        if !slot.active {
            slot.active = true;
            self.active.push(qpn);
        }
        Some(out)
    }

    /// Posts send WRs straight into QP `qpn`, for a poster that holds the engine (no inbox,
    /// no copies on the way); stops at the first WR the QP refuses and says which.
    pub(crate) fn post_sends(
        &mut self,
        qpn: u32,
        wrs: &[SendWr<'_>],
    ) -> Result<(), (usize, PostError)> {
        self.post_each(qpn, wrs, true, Qp::post_send)
    }

    /// [`post_sends`](Self::post_sends) for receive WRs.
    pub(crate) fn post_recvs(
        &mut self,
        qpn: u32,
        wrs: &[RecvWr<'_>],
    ) -> Result<(), (usize, PostError)> {
        self.post_each(qpn, wrs, false, Qp::post_recv)
    }

    fn post_each<W>(
        &mut self,
        qpn: u32,
        wrs: &[W],
        send: bool,
        post: impl Fn(&mut Qp, &W) -> Result<(), PostError>,
    ) -> Result<(), (usize, PostError)> {
        let Some(slot) = self.qps.get_mut(&qpn) else {
            return Err((0, PostError::InvalidState(QpState::Reset)));
        };
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
        Self::settle(slot, &mut self.wheel, &mut self.done);
        if !slot.active {
            slot.active = true;
            self.active.push(qpn);
        }
        r
    }

    /// The earliest QP deadline armed since the last call (see
    /// [`TimerWheel::take_earliest_new`]).
    pub(crate) fn take_earliest_new_deadline(&mut self) -> Option<u64> {
        self.wheel.take_earliest_new()
    }

    /// The earliest QP deadline, for a simulator deciding how far virtual time may jump.
    pub fn next_deadline(&self) -> Option<u64> {
        self.qps.values().filter_map(|s| s.qp.poll_timeout()).min()
    }

    /// True when some QP has work the next `poll` would do without new input.
    pub fn has_pending_work(&self) -> bool {
        !self.doorbells.is_empty()
            || !self.active.is_empty()
            || self.steer.as_ref().is_some_and(|s| !s.inbox().is_empty())
    }

    /// One turn of the loop. Returns how many things happened (frames received and sent,
    /// WRs taken, timers run), so a caller can back off when it is zero.
    pub fn poll(&mut self) -> usize {
        if self.idle_turns.is_multiple_of(self.clock_stride) {
            self.now = self.port.now_ns();
        }
        let now = self.now;
        let mut work = 0;

        // 1. Posted work.
        while let Some(qpn) = self.doorbells.pop() {
            let Some(slot) = self.qps.get_mut(&qpn) else {
                continue;
            };
            slot.shared.rung.store(false, Ordering::Release);
            while let Some(op) = slot.shared.inbox.pop() {
                work += 1;
                // The poster reserved the WR's slot; it stays in use while the QP holds the
                // WR, and is released here only if the QP refuses it.
                let sh = &slot.shared;
                let r = match &op {
                    Op::Send(s) => {
                        let r = slot.qp.post_send(&s.as_wr());
                        match r {
                            Ok(()) => slot.sq_known += 1,
                            Err(_) => _ = sh.sq_used.fetch_sub(1, Ordering::AcqRel),
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
                            Err(_) => _ = sh.rq_used.fetch_sub(1, Ordering::AcqRel),
                        }
                        r
                    }
                };
                if let Err(e) = r {
                    // Checked at post time; only a race with a state change gets here.
                    tracing::debug!(qpn, %e, "engine refused a posted WR");
                    let wr_id = match op {
                        Op::Send(s) => s.wr_id,
                        Op::Recv(id, _) => id,
                    };
                    let mut wc = WorkCompletion {
                        wr_id,
                        ..empty_wc(qpn)
                    };
                    wc.status = ferroce_stack::transport::WcStatus::LocQpOpErr;
                    slot.send_cq.push(wc);
                }
            }
            if !slot.active {
                slot.active = true;
                self.active.push(qpn);
            }
        }

        // 2. Receive: frames other engines forwarded, then a burst from the port.
        let Self {
            port,
            mem,
            qps,
            active,
            counters,
            checks,
            steer,
            ..
        } = self;
        let checks = *checks;
        if let Some(st) = steer.as_ref() {
            let mut n = 0;
            while n < RX_BURST {
                let Some(buf) = st.inbox().pop() else { break };
                n += 1;
                // Checked where it arrived; parsed again only to borrow its fields.
                let delivered = match RoceRepr::parse(&buf, Checks::NONE) {
                    Ok(pkt) => {
                        let qpn = pkt.repr.bth.dest_qpn.value();
                        deliver(qps, active, qpn, |qp| qp.handle_packet(now, &pkt, mem))
                    }
                    // A malformed frame attributed to one of this engine's QPs.
                    Err(e) => RoceRepr::attribute(&buf, Checks::NONE, e).is_some_and(|m| {
                        let qpn = m.bth.dest_qpn.value();
                        deliver(qps, active, qpn, |qp| qp.handle_malformed(now, &m))
                    }),
                };
                if !delivered {
                    counters.rx_unknown_qp += 1;
                }
                let _ = st.spare.push(buf);
            }
            work += n;
        }
        work += port.rx_burst(RX_BURST, |frame| {
            counters.rx_frames += 1;
            counters.rx_bytes += frame.len() as u64;
            match RoceRepr::parse(frame, checks) {
                Ok(pkt) => {
                    let qpn = pkt.repr.bth.dest_qpn.value();
                    if deliver(qps, active, qpn, |qp| qp.handle_packet(now, &pkt, mem)) {
                        return;
                    }
                    let forwarded = steer
                        .as_ref()
                        .is_some_and(|st| st.forward_to_owner(qpn, frame, counters));
                    if !forwarded {
                        counters.rx_unknown_qp += 1;
                    }
                }
                Err(e) => {
                    counters.rx_malformed += 1;
                    if matches!(e, ferroce_stack::wire::Error::Icrc { .. }) {
                        counters.rx_icrc_errors += 1;
                    }
                    // Refused after a sound BTH with a good ICRC: the QP it names decides.
                    let Some(m) = RoceRepr::attribute(frame, checks, e) else {
                        return;
                    };
                    let qpn = m.bth.dest_qpn.value();
                    if deliver(qps, active, qpn, |qp| qp.handle_malformed(now, &m)) {
                        return;
                    }
                    if let Some(st) = steer.as_ref() {
                        st.forward_to_owner(qpn, frame, counters);
                    }
                }
            }
        });

        // 3. Timers.
        let wheel = &mut self.wheel;
        let mut due = Vec::new();
        wheel.expire(now, |qpn| due.push(qpn));
        for qpn in due {
            if let Some(slot) = self.qps.get_mut(&qpn) {
                slot.armed = None;
                if slot.qp.poll_timeout().is_some_and(|t| t <= now) {
                    slot.qp.handle_timeout(now);
                    work += 1;
                }
                if !slot.active {
                    slot.active = true;
                    self.active.push(qpn);
                }
            }
        }

        // 4. Transmit, completions, re-arm.
        let active = std::mem::take(&mut self.active);
        for &qpn in &active {
            let Some(slot) = self.qps.get_mut(&qpn) else {
                continue;
            };
            slot.active = false;
            while let Some(out) =
                slot.qp
                    .poll_transmit_split(now, &mut self.frame, &self.mem, self.split_min)
            {
                let n = out.len();
                let sent = match &out {
                    TxOut::Whole(n) => {
                        let frame = &self.frame[..*n];
                        self.port.tx(*n, |b| b.copy_from_slice(frame))
                    }
                    TxOut::Split(s) => {
                        let r = self.port.tx_split(&self.frame, s);
                        self.counters.tx_zero_copy += u64::from(r.is_ok());
                        r
                    }
                };
                match sent {
                    Ok(()) => {
                        self.counters.tx_frames += 1;
                        self.counters.tx_bytes += n as u64;
                    }
                    Err(_) => self.counters.tx_errors += 1,
                }
                work += 1;
            }
            Self::settle(slot, &mut self.wheel, &mut self.done);
        }
        self.active = active;
        self.active.clear();
        self.port.flush();
        self.idle_turns = if work == 0 {
            self.idle_turns.wrapping_add(1)
        } else {
            0
        };
        work
    }

    /// Moves a QP's completions to its CQs, publishes its state and queue depths, and keeps
    /// its wheel entry in step with its deadline. The depths are published before the
    /// completions: a thread that sees a send complete and posts the next at once (a queue
    /// of one, as ibv_rc_pingpong has) must find its slot free.
    fn settle(slot: &mut Slot, wheel: &mut TimerWheel, done: &mut Vec<WorkCompletion>) {
        while let Some(wc) = slot.qp.poll_completion() {
            done.push(wc);
        }
        let sh = &slot.shared;
        sh.state
            .store(state_code(slot.qp.state()), Ordering::Release);
        // Release the slots of the WRs the QP let go since the last settle.
        let (sq, rq) = (
            slot.qp.send_queue_len() as u32,
            slot.qp.recv_queue_len() as u32,
        );
        sh.sq_used
            .fetch_sub(slot.sq_known.saturating_sub(sq), Ordering::AcqRel);
        sh.rq_used
            .fetch_sub(slot.rq_known.saturating_sub(rq), Ordering::AcqRel);
        (slot.sq_known, slot.rq_known) = (sq, rq);
        for wc in done.drain(..) {
            if wc.opcode.is_recv() {
                slot.recv_cq.push(wc);
            } else {
                slot.send_cq.push(wc);
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

/// Hands a received frame to QP `qpn` (`handle` is `handle_packet` or `handle_malformed`)
/// and marks the QP active; false if no QP here has that number.
#[inline]
fn deliver(
    qps: &mut HashMap<u32, Slot>,
    active: &mut Vec<u32>,
    qpn: u32,
    handle: impl FnOnce(&mut Qp),
) -> bool {
    let Some(slot) = qps.get_mut(&qpn) else {
        return false;
    };
    handle(&mut slot.qp);
    if !slot.active {
        slot.active = true;
        active.push(qpn);
    }
    true
}

fn empty_wc(qpn: u32) -> WorkCompletion {
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
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferroce_drivers::pipe::{pair, PipePort};
    use ferroce_stack::transport::loopback::connect;
    use ferroce_stack::transport::{PdId, QpAttr, QpConfig};
    use ferroce_stack::wire::sample::reseal;
    use ferroce_stack::wire::{NakCode, Opcode, Psn, Qpn, Syndrome, ETHERNET_LEN, IPV4_LEN};

    /// An engine over one end of a pipe with RC QP 0x123 in RTS, the pipe's other end, and
    /// a frame that QP's peer would send it (a SEND_ONLY at the expected PSN).
    fn rig() -> (Engine<PipePort>, PipePort, Vec<u8>) {
        let (ours, theirs) = pair(9000);
        let mut engine = Engine::new(ours, 1);
        let mut qp = Qp::new(QpConfig::new(Qpn::new(0x123), QpType::Rc, PdId(1)));
        let mut peer = Qp::new(QpConfig::new(Qpn::new(0x456), QpType::Rc, PdId(1)));
        let attr = QpAttr {
            sq_psn: Psn::new(10),
            rq_psn: Psn::new(20),
            ..QpAttr::default()
        };
        connect(&mut qp, &mut peer, &attr).unwrap();
        peer.post_send(&SendWr::new(1, WrOpcode::Send, Payload::Inline(&[7; 32])))
            .unwrap();
        let mut buf = vec![0u8; 9000];
        let n = peer.poll_transmit(0, &mut buf, &MrTable::new(9)).unwrap();
        buf.truncate(n);
        let shared = Arc::new(QpShared::new(0x123, QpType::Rc, QpCaps::default()));
        let cq = Arc::new(CqShared::new(1, 16, None));
        engine.add_qp(qp, shared, cq.clone(), cq);
        (engine, theirs, buf)
    }

    fn send(port: &mut PipePort, frame: &[u8]) {
        port.tx(frame.len(), |b| b.copy_from_slice(frame)).unwrap();
        port.flush();
    }

    fn received(port: &mut PipePort) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        port.rx_burst(64, |f| out.push(f.to_vec()));
        out
    }

    /// A request the parser refuses after a sound BTH, with a good ICRC, reaches the QP it
    /// names through the engine: NAK invalid request, QP in ERR. With a bad ICRC it is
    /// nobody's: dropped and counted, no answer.
    #[test]
    fn a_malformed_request_reaches_its_qp_and_is_naked() {
        let (mut engine, mut peer, good) = rig();
        let bth = ETHERNET_LEN + IPV4_LEN + 8;
        let mut bad_icrc = good.clone();
        bad_icrc[bth] = 0x1f;
        send(&mut peer, &bad_icrc);
        engine.poll();
        assert!(received(&mut peer).is_empty());
        // The parser stops at the opcode before the ICRC; attribution checks the ICRC.
        assert_eq!(engine.counters().rx_malformed, 1);
        assert_eq!(engine.qp_counters(0x123).unwrap().malformed_requests, 0);

        let mut reserved = good.clone();
        reserved[bth] = 0x1f;
        reseal(&mut reserved);
        send(&mut peer, &reserved);
        engine.poll();
        let out = received(&mut peer);
        assert_eq!(out.len(), 1);
        let p = RoceRepr::parse(&out[0], Checks::ALL).unwrap();
        assert_eq!(p.repr.bth.opcode, Opcode::RC_ACKNOWLEDGE);
        assert_eq!(p.repr.bth.psn, Psn::new(20));
        assert_eq!(
            Syndrome::from_byte(p.repr.ext.aeth.unwrap().syndrome),
            Syndrome::Nak(NakCode::InvalidRequest)
        );
        assert_eq!(engine.counters().rx_malformed, 2);
        assert_eq!(engine.qp_counters(0x123).unwrap().malformed_requests, 1);
        let state = engine.with_qp(0x123, |qp| qp.state()).unwrap();
        assert_eq!(state, QpState::Err);
    }

    /// An RC packet to QPN 0xFFFFFF (the multicast QPN) is nobody's: dropped, no answer.
    #[test]
    fn an_rc_packet_to_the_multicast_qpn_is_dropped() {
        let (mut engine, mut peer, good) = rig();
        let mut f = good.clone();
        let at = ETHERNET_LEN + IPV4_LEN + 8 + 5;
        f[at..at + 3].copy_from_slice(&[0xff; 3]);
        reseal(&mut f);
        assert_eq!(
            RoceRepr::parse(&f, Checks::ALL).unwrap().repr.bth.dest_qpn,
            Qpn::new(0xff_ffff)
        );
        send(&mut peer, &f);
        engine.poll();
        assert!(received(&mut peer).is_empty());
        assert_eq!(engine.counters().rx_unknown_qp, 1);
        // The QP it was not for is untouched, and takes its own SEND next (an RNR NAK:
        // no receive is posted).
        send(&mut peer, &good);
        engine.poll();
        let out = received(&mut peer);
        assert_eq!(out.len(), 1);
        let p = RoceRepr::parse(&out[0], Checks::ALL).unwrap();
        assert!(matches!(
            Syndrome::from_byte(p.repr.ext.aeth.unwrap().syndrome),
            Syndrome::RnrNak { .. }
        ));
    }
}
