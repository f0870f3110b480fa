//! The responder half: checks each request's PSN, opcode sequence, rights and lengths,
//! executes it on registered memory exactly once, and answers with ACKs, NAKs, READ
//! responses and atomic ACKs in PSN order (IBTA Vol 1 §9.7.5, and §9.7.5.1.3 for duplicates).
//!
//! Errors follow the spec's classes as Linux rxe implements them: a PSN gap is NAKed once
//! and dropped; an empty receive queue is an RNR NAK; an invalid request, a remote access
//! violation or an operational error is NAKed and moves the QP to ERR. On UC every error just
//! drops the message; UD drops the packet.

use std::collections::VecDeque;

use super::ring::PsnRing;
use super::{ErrorCause, QpContext, RecvWqe};
use crate::transport::mr::{Access, AccessError, MrTable};
use crate::transport::recovery::{Arrivals, Feedback, LossReport, OutOfOrder};
use crate::transport::sg::{self, SgError};
use crate::transport::sink::Sunk;
use crate::transport::srq::Srq;
use crate::transport::state::{QpState, QpType};
use crate::transport::tm::{Taken, TMH_LEN};
use crate::transport::tx::{self, TxOut};
use crate::transport::wr::{WcFlags, WcOpcode, WcStatus, WorkCompletion};
use crate::wire::{
    AethRepr, AtomicAckEthRepr, ExtHeaders, Kind, Msn, NakCode, Opcode, Position, Psn, RocePacket,
    RoceRepr, SackEthRepr, Syndrome,
};

mod placement;

/// Bytes of the GRH a UD receive buffer starts with (IBTA §11.4.1.1).
pub(crate) const GRH_LEN: usize = 40;

/// Duplicate READs and atomics queued beyond `max_dest_rd_atomic` before more are dropped:
/// duplication on the wire must not grow the reply queue without bound.
const DUPLICATE_SLACK: usize = 16;

/// Requests other than WRITE packets that a placing responder holds when they arrive ahead
/// of their turn. More are dropped (and resent by the requester): early arrivals must not
/// grow memory without bound.
const HELD_MAX: usize = 64;

/// The completion a WRITE message owes once every packet before its last has arrived.
#[derive(Clone, Copy, Debug)]
struct WriteEnd {
    imm: Option<u32>,
    len: u32,
    solicited: bool,
}

/// A request that arrived ahead of its turn, kept whole until the expected PSN reaches it.
#[derive(Clone, Debug)]
struct Held {
    repr: RoceRepr,
    payload: Vec<u8>,
}

/// A placing responder's state beyond the expected PSN (direct data placement).
#[derive(Debug)]
pub(crate) struct Ooo {
    /// What the requester hears (the policy's, fixed at RTR).
    feedback: Feedback,
    /// PSNs at or after `epsn` that arrived (placed, or held).
    arrived: PsnRing,
    /// PSNs reported lost to the requester.
    reported: PsnRing,
    /// WRITE messages whose last packet arrived early, by PSN.
    ends: hashbrown::HashMap<u32, WriteEnd>,
    /// Early requests that cannot be placed, by PSN.
    held: hashbrown::HashMap<u32, Held>,
    /// Loss reports waiting to go out (selective feedback).
    lost: VecDeque<Psn>,
    /// A path to ask the requester to avoid.
    avoid: Option<u8>,
}

impl Ooo {
    pub(crate) fn new(feedback: Feedback, capacity: u32) -> Self {
        Self {
            feedback,
            arrived: PsnRing::with_capacity(capacity),
            reported: PsnRing::with_capacity(capacity),
            ends: hashbrown::HashMap::new(),
            held: hashbrown::HashMap::new(),
            lost: VecDeque::new(),
            avoid: None,
        }
    }

    fn heap_bytes(&self) -> usize {
        self.arrived.heap_bytes()
            + self.reported.heap_bytes()
            + self.ends.capacity() * core::mem::size_of::<(u32, WriteEnd)>()
            + self.held.capacity() * core::mem::size_of::<(u32, Held)>()
            + self.lost.capacity() * core::mem::size_of::<Psn>()
    }
}

/// The arrival state a policy reads.
struct View<'a> {
    epsn: Psn,
    ooo: &'a Ooo,
}

impl Arrivals for View<'_> {
    fn epsn(&self) -> Psn {
        self.epsn
    }
    fn arrived(&self, psn: Psn) -> bool {
        psn.distance(self.epsn) >= 0 && self.ooo.arrived.get(psn)
    }
    fn reported(&self, psn: Psn) -> bool {
        psn.distance(self.epsn) >= 0 && self.ooo.reported.get(psn)
    }
    fn ahead(&self, psn: Psn) -> u32 {
        self.ooo.arrived.count(self.epsn.add(1), psn.add(1))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum MsgKind {
    Send,
    Write,
    Read,
    Atomic,
    AtomicWrite,
}

/// The message being received.
#[derive(Clone, Copy, Debug)]
enum InMsg {
    Send {
        offset: u32,
        /// The rest of a rendezvous request a tagged buffer took at its first packet: the
        /// data comes by READ, these bytes land nowhere.
        discard: bool,
    },
    Write {
        va: u64,
        rkey: u32,
        len: u32,
        offset: u32,
    },
}

impl InMsg {
    fn kind(&self) -> MsgKind {
        match self {
            Self::Send { .. } => MsgKind::Send,
            Self::Write { .. } => MsgKind::Write,
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum ReplyKind {
    Read {
        va: u64,
        rkey: u32,
        len: u32,
        sent: u32,
    },
    Atomic {
        orig: u64,
    },
}

/// A READ response stream or an atomic ACK waiting to go out, in PSN order.
#[derive(Clone, Copy, Debug)]
struct Reply {
    psn: Psn,
    msn: Msn,
    kind: ReplyKind,
    /// A re-execution for a duplicate request: does not count against max_dest_rd_atomic.
    duplicate: bool,
}

#[derive(Debug)]
pub(crate) struct Responder {
    pub(crate) rq: VecDeque<RecvWqe>,
    /// The shared receive queue receives come from instead of `rq`, if any.
    pub(crate) srq: Option<Srq>,
    /// The receive the SEND (or WRITE with immediate) in progress fills: taken at its first
    /// packet, so packets of other QPs' messages cannot take it from a shared queue.
    pub(crate) cur_recv: Option<RecvWqe>,
    pub(crate) epsn: Psn,
    msn: Msn,
    msg: Option<InMsg>,
    nak_outstanding: bool,
    ack_pending: bool,
    /// A NAK to send, with the PSN it names; `final_nak` when the QP went to ERR after it.
    nak: Option<(Syndrome, Psn)>,
    final_nak: bool,
    replies: VecDeque<Reply>,
    /// The atomic replay cache: (PSN, original value) of the latest atomics executed.
    atomics: VecDeque<(Psn, u64)>,
    /// Placement delivery only (boxed: Go-Back-N QPs carry a pointer, not the state).
    pub(crate) ooo: Option<Box<Ooo>>,
}

impl Responder {
    /// Flushes every receive WQE (the one a message was landing in first) and clears what
    /// the responder held, keeping a final NAK queued.
    pub(crate) fn flush(&mut self, cx: &mut QpContext) {
        if let Some(w) = self.cur_recv.take() {
            cx.push_recv_flush(&w);
        }
        while let Some(w) = self.rq.pop_front() {
            cx.push_recv_flush(&w);
        }
        self.clear_for_error();
    }

    pub(crate) fn new(epsn: Psn, srq: Option<Srq>) -> Self {
        Self {
            rq: VecDeque::new(),
            srq,
            cur_recv: None,
            epsn,
            msn: Msn::new(0),
            msg: None,
            nak_outstanding: false,
            ack_pending: false,
            nak: None,
            final_nak: false,
            replies: VecDeque::new(),
            atomics: VecDeque::new(),
            ooo: None,
        }
    }

    fn take_recv(&mut self) -> Option<RecvWqe> {
        match &self.srq {
            Some(srq) => srq.pop(),
            None => self.rq.pop_front(),
        }
    }

    fn has_recv(&self) -> bool {
        match &self.srq {
            Some(srq) => !srq.is_empty(),
            None => !self.rq.is_empty(),
        }
    }

    /// Gives back the receive of a dropped message, first in line.
    fn return_recv(&mut self) {
        if let Some(w) = self.cur_recv.take() {
            match &self.srq {
                Some(srq) => srq.push_front(w),
                None => self.rq.push_front(w),
            }
        }
    }

    /// Queues a PSN sequence error NAK naming the expected PSN `epsn` (IBTA §9.7.5.2.1, class
    /// B), unless a NAK is already waiting. The responder has one NAK slot and every NAK it
    /// can hold names the expected PSN, so the one already there wins: an RNR NAK tells the
    /// requester to resend from that PSN after its timer, which a sequence error arriving next
    /// would turn into an immediate resend counted against its retry budget. Either way no
    /// second NAK goes out until the expected PSN arrives again.
    fn nak_sequence(&mut self, epsn: Psn) {
        self.nak_outstanding = true;
        if self.nak.is_none() {
            self.nak = Some((Syndrome::Nak(NakCode::PsnSequenceError), epsn));
        }
    }

    /// Queues an RNR NAK for `psn`, the expected PSN, whose request found no receive. Packets
    /// behind it are then dropped without a NAK of their own until the requester resends
    /// `psn` (the rule IBTA gives after a sequence error NAK, which an RNR NAK resembles: the
    /// requester resends from that PSN, and more NAKs for it would only cost retries).
    fn nak_rnr(&mut self, timer: u8, psn: Psn) {
        self.nak_outstanding = true;
        self.nak = Some((Syndrome::RnrNak { timer }, psn));
    }

    /// Drops the message in progress (UC loss): its receive is reused by the next message.
    fn abort_msg(&mut self) {
        self.msg = None;
        self.return_recv();
    }

    /// The AETH credit code: free receives, or 31 (no flow control) on a shared queue, as
    /// the spec asks of SRQ-attached responders.
    fn credits(&self) -> u8 {
        match &self.srq {
            Some(_) => 31,
            None => super::credit_code(self.rq.len()),
        }
    }

    pub(crate) fn has_output(&self) -> bool {
        !self.replies.is_empty()
            || self.nak.is_some()
            || self.ack_pending
            || self
                .ooo
                .as_ref()
                .is_some_and(|o| !o.lost.is_empty() || o.avoid.is_some())
    }

    pub(crate) fn heap_bytes(&self) -> usize {
        self.replies.capacity() * core::mem::size_of::<Reply>()
            + self.atomics.capacity() * core::mem::size_of::<(Psn, u64)>()
            + self.ooo.as_ref().map_or(0, |o| o.heap_bytes())
    }

    pub(crate) fn clear_for_error(&mut self) {
        self.replies.clear();
        self.ack_pending = false;
        self.msg = None;
        if let Some(o) = self.ooo.as_mut() {
            **o = Ooo::new(o.feedback, o.arrived.capacity());
        }
        if !self.final_nak {
            self.nak = None;
        }
    }
}

/// How a request failed.
enum Fault {
    /// NAK with this code, complete the receive in progress (if any) with this status, and
    /// move to ERR (RC); drop the message (UC).
    Fatal(NakCode, Option<WcStatus>),
    /// No receive WQE: RNR NAK (RC), drop (UC).
    NoReceive,
}

impl Responder {
    /// A request packet (RC, UC or UD) for the responder.
    pub(crate) fn receive(&mut self, cx: &mut QpContext, pkt: &RocePacket<'_>, mem: &mut MrTable) {
        match cx.qp_type {
            QpType::Ud => self.ud_rx(cx, pkt, mem),
            QpType::Rc if self.ooo.is_some() => self.placing_rx(cx, pkt, mem),
            QpType::Rc => {
                let psn = pkt.repr.bth.psn;
                let d = psn.distance(self.epsn);
                if d > 0 {
                    cx.counters.out_of_sequence += 1;
                    let epsn = self.epsn;
                    let outstanding = self.nak_outstanding;
                    if cx.recovery.on_out_of_order(epsn, psn, outstanding) == OutOfOrder::NakAndDrop
                    {
                        self.nak_sequence(epsn);
                    }
                } else if d < 0 {
                    self.duplicate(cx, pkt, mem);
                } else {
                    self.nak_outstanding = false;
                    if let Err(f) = self.execute(cx, pkt, mem) {
                        self.fault(cx, psn, f);
                    }
                }
            }
            QpType::Uc
                if cx.ext.as_ref().is_some_and(|e| e.sink.is_some()) && Self::for_sink(pkt) =>
            {
                self.sink_rx(cx, pkt, mem)
            }
            QpType::Uc => {
                let psn = pkt.repr.bth.psn;
                if psn != self.epsn {
                    // Lost packets: the message in progress is dropped; a new one may start
                    // here (C9-? UC responder rules).
                    if self.msg.is_some() {
                        cx.counters.out_of_sequence += 1;
                    }
                    self.abort_msg();
                    self.epsn = psn;
                }
                if self.execute(cx, pkt, mem).is_err() {
                    self.abort_msg();
                    self.epsn = psn.add(1);
                }
            }
        }
    }

    /// A packet a sink takes: a WRITE_ONLY_WITH_IMMEDIATE (RETH and immediate present).
    fn for_sink(pkt: &RocePacket<'_>) -> bool {
        pkt.repr.bth.opcode == Opcode::UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE
            && pkt.repr.ext.reth.is_some()
            && pkt.repr.ext.imm_dt.is_some()
    }

    /// Hands a packet to the sink. A message in progress is cut off by it, as by any packet
    /// that does not continue it; the next expected PSN follows this one.
    fn sink_rx(&mut self, cx: &mut QpContext, pkt: &RocePacket<'_>, mem: &MrTable) {
        if self.msg.is_some() {
            cx.counters.out_of_sequence += 1;
            self.abort_msg();
        }
        self.epsn = pkt.repr.bth.psn.add(1);
        let pd = cx.pd;
        let (Some(reth), Some(imm), Some(sink)) = (
            pkt.repr.ext.reth,
            pkt.repr.ext.imm_dt,
            cx.ext.as_mut().and_then(|e| e.sink.as_mut()),
        ) else {
            return;
        };
        match sink.on_write_imm(reth, imm.imm, pkt.payload, pd, mem) {
            Sunk::Placed => cx.counters.rx_write_requests += 1,
            Sunk::Dropped => cx.counters.rx_dropped += 1,
        }
    }

    /// A request the parser refused after its BTH (see `Qp::handle_malformed`). The PSN is
    /// checked first, as for any request (IBTA §9.7.5.1: sequence before validity): ahead of
    /// the expected PSN it is an early packet (a sequence NAK, by the policy; a placing
    /// responder drops it, and the requester's recovery resends it into its turn), behind it
    /// a duplicate dropped without an answer; in its turn, NAK invalid request and ERR (RC),
    /// the message in progress dropped (UC), the datagram dropped (UD).
    pub(crate) fn malformed(&mut self, cx: &mut QpContext, psn: Psn) {
        cx.counters.malformed_requests += 1;
        match cx.qp_type {
            QpType::Ud => cx.counters.rx_dropped += 1,
            QpType::Uc => {
                // Whatever its PSN, it cannot continue or start a message.
                self.abort_msg();
                self.epsn = psn.add(1);
            }
            QpType::Rc => {
                let epsn = self.epsn;
                let d = psn.distance(epsn);
                if d < 0 {
                    cx.counters.duplicate_request += 1;
                } else if d > 0 {
                    cx.counters.out_of_sequence += 1;
                    if self.ooo.is_none() {
                        let outstanding = self.nak_outstanding;
                        if cx.recovery.on_out_of_order(epsn, psn, outstanding)
                            == OutOfOrder::NakAndDrop
                        {
                            self.nak_sequence(epsn);
                        }
                    }
                } else {
                    self.nak_outstanding = false;
                    let in_send = matches!(self.msg, Some(InMsg::Send { .. }));
                    self.fault(
                        cx,
                        psn,
                        Fault::Fatal(
                            NakCode::InvalidRequest,
                            in_send.then_some(WcStatus::RemInvReqErr),
                        ),
                    );
                }
            }
        }
    }

    fn fault(&mut self, cx: &mut QpContext, psn: Psn, f: Fault) {
        match f {
            Fault::NoReceive => {
                cx.counters.out_of_buffer += 1;
                self.nak_rnr(cx.attr.min_rnr_timer, psn);
            }
            Fault::Fatal(code, recv_status) => {
                cx.span().in_scope(|| {
                    tracing::debug!(psn = psn.value(), ?code, ?recv_status, "request refused")
                });
                if let Some(status) = recv_status {
                    cx.counters.resp_cqe_error += 1;
                    let w = match self.cur_recv.take() {
                        Some(w) => Some(w),
                        None => self.take_recv(),
                    };
                    if let Some(w) = w {
                        cx.completions.push_back(WorkCompletion::new(
                            w.wr_id,
                            status,
                            WcOpcode::Recv,
                            cx.qpn,
                        ));
                    }
                }
                self.nak = Some((Syndrome::Nak(code), psn));
                self.final_nak = true;
                cx.enter_error();
                cx.error_cause = Some(match code {
                    NakCode::RemoteAccessError => ErrorCause::AccessViolation,
                    NakCode::RemoteOperationalError => ErrorCause::Catastrophic,
                    _ => ErrorCause::InvalidRequest,
                });
            }
        }
    }

    /// Executes an RDMA ATOMIC WRITE: exactly 8 bytes, to an 8-byte aligned address the RETH
    /// names, written in one store (IBTA 1.5). Acknowledged as a WRITE; a duplicate is answered
    /// without writing again.
    fn exec_atomic_write(
        cx: &mut QpContext,
        pkt: &RocePacket<'_>,
        mem: &MrTable,
    ) -> Result<(), Fault> {
        let (Some(reth), Ok(data)) = (pkt.repr.ext.reth, <[u8; 8]>::try_from(pkt.payload)) else {
            return Err(Fault::Fatal(NakCode::InvalidRequest, None));
        };
        if reth.dma_len != 8 {
            return Err(Fault::Fatal(NakCode::InvalidRequest, None));
        }
        if mem.atomic_write(reth.rkey, cx.pd, reth.va, data).is_err() {
            cx.counters.resp_remote_access_errors += 1;
            return Err(Fault::Fatal(NakCode::RemoteAccessError, None));
        }
        Ok(())
    }

    /// Checks and executes the expected request. Advances `epsn` on success.
    fn execute(
        &mut self,
        cx: &mut QpContext,
        pkt: &RocePacket<'_>,
        mem: &mut MrTable,
    ) -> Result<(), Fault> {
        let rc = cx.qp_type == QpType::Rc;
        let bth = pkt.repr.bth;
        let kind = match bth.opcode.kind() {
            Some(Kind::Send) => MsgKind::Send,
            Some(Kind::Write) => MsgKind::Write,
            Some(Kind::ReadRequest) => MsgKind::Read,
            Some(Kind::CompareSwap | Kind::FetchAdd) => MsgKind::Atomic,
            Some(Kind::AtomicWrite) if rc => MsgKind::AtomicWrite,
            _ => return Err(Fault::Fatal(NakCode::InvalidRequest, None)),
        };
        let pos = bth.opcode.position().unwrap_or(Position::Only);
        let starts = matches!(pos, Position::First | Position::Only);
        let last = matches!(pos, Position::Last | Position::Only);
        match (self.msg, starts) {
            (None, true) => {}
            (Some(m), false) if m.kind() == kind => {}
            // UC: a new message aborts the one in progress.
            (Some(_), true) if !rc => self.abort_msg(),
            _ => {
                let in_send = matches!(self.msg, Some(InMsg::Send { .. }));
                return Err(Fault::Fatal(
                    NakCode::InvalidRequest,
                    in_send.then_some(WcStatus::RemInvReqErr),
                ));
            }
        }
        let plen = pkt.payload.len() as u32;
        let len_ok = match pos {
            Position::First | Position::Middle => plen == cx.mtu(),
            Position::Last => plen > 0 && plen <= cx.mtu(),
            Position::Only => plen <= cx.mtu(),
        };
        if !len_ok {
            cx.counters.resp_local_length_error += 1;
            let in_send = kind == MsgKind::Send && !starts;
            return Err(Fault::Fatal(
                NakCode::InvalidRequest,
                in_send.then_some(WcStatus::LocLenErr),
            ));
        }
        let rights = cx.attr.qp_access_flags;
        let needed = match kind {
            MsgKind::Send => Access::NONE,
            MsgKind::Write | MsgKind::AtomicWrite => Access::REMOTE_WRITE,
            MsgKind::Read => Access::REMOTE_READ,
            MsgKind::Atomic => Access::REMOTE_ATOMIC,
        };
        if starts && !rights.contains(needed) {
            return Err(Fault::Fatal(NakCode::InvalidRequest, None));
        }
        if starts && kind != MsgKind::Send {
            // A type 2 memory window answers only the QP it is bound to.
            let ext = &pkt.repr.ext;
            let key = ext.reth.map(|r| r.rkey).or(ext.atomic_eth.map(|a| a.rkey));
            if key.is_some_and(|k| !mem.window_allows(k, cx.qpn.value())) {
                cx.counters.resp_remote_access_errors += 1;
                return Err(Fault::Fatal(NakCode::RemoteAccessError, None));
            }
        }
        match kind {
            MsgKind::Send => self.exec_send(cx, pkt, mem, starts, last)?,
            MsgKind::Write => self.exec_write(cx, pkt, mem, starts, last)?,
            MsgKind::AtomicWrite => Self::exec_atomic_write(cx, pkt, mem)?,
            MsgKind::Read | MsgKind::Atomic => return self.exec_read_atomic(cx, pkt, mem, kind),
        }
        self.epsn = self.epsn.add(1);
        if rc && bth.ack_req {
            self.ack_pending = true;
        }
        Ok(())
    }

    fn exec_send(
        &mut self,
        cx: &mut QpContext,
        pkt: &RocePacket<'_>,
        mem: &mut MrTable,
        starts: bool,
        last: bool,
    ) -> Result<(), Fault> {
        if starts {
            // A receive left from a message UC dropped goes back first (tag matching is RC
            // only, so such a receive is an ordinary one).
            if take_tm(cx).is_none() {
                self.return_recv();
            }
            self.cur_recv = match &self.srq {
                Some(srq) => match srq.take_message(pkt.payload) {
                    Some((w, Taken::Plain)) => Some(w),
                    Some((w, t)) => {
                        cx.ext.get_or_insert_with(Default::default).tm_taken = Some(t);
                        Some(w)
                    }
                    None => None,
                },
                None => self.rq.pop_front(),
            };
            if matches!(tm_of(cx), Some(Taken::Rndv { .. })) {
                return self.start_rendezvous(cx, pkt, mem, last);
            }
        }
        let (offset, discard) = match self.msg {
            Some(InMsg::Send { offset, discard }) if !starts => (offset, discard),
            _ => (0, false),
        };
        if discard {
            if last {
                self.msg = None;
                self.msn = self.msn.next();
            }
            return Ok(());
        }
        let Some(wqe) = self.cur_recv.as_ref() else {
            return Err(Fault::NoReceive);
        };
        // A matched eager message lands without its tag matching header.
        let (data, at) = match tm_of(cx) {
            Some(Taken::Eager { .. }) => {
                let skip = (TMH_LEN as u32).saturating_sub(offset) as usize;
                let at = (offset as usize + skip - TMH_LEN) as u64;
                (pkt.payload.get(skip..).unwrap_or(&[]), at)
            }
            _ => (pkt.payload, u64::from(offset)),
        };
        match sg::scatter(mem, cx.pd, &wqe.sges, at, data) {
            Ok(()) => {}
            Err(SgError::Length) => {
                cx.counters.resp_local_length_error += 1;
                return Err(Fault::Fatal(
                    NakCode::InvalidRequest,
                    Some(WcStatus::LocLenErr),
                ));
            }
            Err(SgError::Access(_)) => {
                return Err(Fault::Fatal(
                    NakCode::RemoteOperationalError,
                    Some(WcStatus::LocProtErr),
                ));
            }
        }
        let offset = offset + pkt.payload.len() as u32;
        if !last {
            self.msg = Some(InMsg::Send {
                offset,
                discard: false,
            });
            return Ok(());
        }
        let ext = &pkt.repr.ext;
        let mut flags = WcFlags(0);
        let mut imm = 0;
        if let Some(i) = ext.imm_dt {
            flags = flags.with(WcFlags::WITH_IMM);
            imm = i.imm;
        }
        if let Some(ieth) = ext.ieth {
            if mem.invalidate(ieth.rkey, cx.pd).is_err() {
                return Err(Fault::Fatal(
                    NakCode::InvalidRequest,
                    Some(WcStatus::RemInvReqErr),
                ));
            }
            flags = flags.with(WcFlags::WITH_INV);
            imm = ieth.rkey;
        }
        let Some(w) = self.cur_recv.take() else {
            return Err(Fault::NoReceive);
        };
        let (opcode, byte_len, tag) = match take_tm(cx) {
            None | Some(Taken::Plain | Taken::Rndv { .. }) => (WcOpcode::Recv, offset, 0),
            Some(Taken::NoTag) => (WcOpcode::TmNoTag, offset, 0),
            Some(Taken::Unexpected) => (WcOpcode::TmRecv, offset, 0),
            Some(Taken::Eager { tag, app_ctx }) => {
                flags = flags.with(WcFlags::TM_MATCH).with(WcFlags::TM_DATA_VALID);
                if ext.imm_dt.is_none() && ext.ieth.is_none() {
                    imm = app_ctx;
                }
                (WcOpcode::TmRecv, offset.saturating_sub(TMH_LEN as u32), tag)
            }
        };
        let mut wc = WorkCompletion::new(w.wr_id, WcStatus::Success, opcode, cx.qpn);
        wc.byte_len = byte_len;
        wc.imm_data = imm;
        wc.wc_flags = flags;
        wc.tag = tag;
        wc.solicited = pkt.repr.bth.solicited;
        cx.completions.push_back(wc);
        self.msg = None;
        self.msn = self.msn.next();
        Ok(())
    }

    /// A rendezvous request a tagged buffer took: the match completes now (`TM_MATCH`,
    /// no data yet) and the QP reads the data into the buffer ([`QpContext::tm_read`]),
    /// completing it again with `TM_DATA_VALID` and telling the sender with a FIN. A buffer
    /// too small for the data gets the headers instead, completed `TM_RNDV_INCOMPLETE` for
    /// software to finish. The rest of the request's packets land nowhere.
    #[cold]
    fn start_rendezvous(
        &mut self,
        cx: &mut QpContext,
        pkt: &RocePacket<'_>,
        mem: &mut MrTable,
        last: bool,
    ) -> Result<(), Fault> {
        let (Some(w), Some(Taken::Rndv { tag, app_ctx, read })) =
            (self.cur_recv.take(), take_tm(cx))
        else {
            return Err(Fault::NoReceive);
        };
        let room = sg::total_len(&w.sges);
        let mut wc = WorkCompletion::new(w.wr_id, WcStatus::Success, WcOpcode::TmRecv, cx.qpn);
        wc.wc_flags = WcFlags::TM_MATCH;
        wc.tag = tag;
        wc.imm_data = app_ctx;
        if u64::from(read.len) > room {
            let headers = &pkt.payload[..pkt.payload.len().min(read.headers.len())];
            wc.status = match sg::scatter(mem, cx.pd, &w.sges, 0, headers) {
                Ok(()) => WcStatus::TmRndvIncomplete,
                Err(SgError::Length) => WcStatus::LocLenErr,
                Err(SgError::Access(_)) => WcStatus::LocProtErr,
            };
            wc.byte_len = headers.len() as u32;
            cx.completions.push_back(wc);
        } else {
            cx.completions.push_back(wc);
            cx.tm_read(w, read);
        }
        if last {
            self.msg = None;
            self.msn = self.msn.next();
        } else {
            self.msg = Some(InMsg::Send {
                offset: pkt.payload.len() as u32,
                discard: true,
            });
        }
        Ok(())
    }

    fn exec_write(
        &mut self,
        cx: &mut QpContext,
        pkt: &RocePacket<'_>,
        mem: &mut MrTable,
        starts: bool,
        last: bool,
    ) -> Result<(), Fault> {
        let rc = cx.qp_type == QpType::Rc;
        let (va, rkey, len, offset) = match (self.msg, starts) {
            (
                Some(InMsg::Write {
                    va,
                    rkey,
                    len,
                    offset,
                }),
                false,
            ) => (va, rkey, len, offset),
            _ => {
                let Some(reth) = pkt.repr.ext.reth else {
                    return Err(Fault::Fatal(NakCode::InvalidRequest, None));
                };
                let plen = pkt.payload.len() as u32;
                let consistent = if last {
                    reth.dma_len == plen
                } else {
                    reth.dma_len > cx.mtu()
                };
                if !consistent {
                    return Err(Fault::Fatal(NakCode::InvalidRequest, None));
                }
                // A WRITE_ONLY without immediate writes its whole range next, and that write
                // checks exactly this (same key, range and rights, same refusal): one lookup
                // instead of two for the commonest small request. With an immediate the
                // range is checked first, before the receive it needs (RNR).
                let checked = if last && pkt.repr.ext.imm_dt.is_none() {
                    Ok(())
                } else {
                    mem.check_access(
                        reth.rkey,
                        cx.pd,
                        reth.va,
                        u64::from(reth.dma_len),
                        Access::REMOTE_WRITE,
                    )
                };
                if checked.is_err() {
                    if rc {
                        cx.counters.resp_remote_access_errors += 1;
                    }
                    return Err(Fault::Fatal(NakCode::RemoteAccessError, None));
                }
                (reth.va, reth.rkey, reth.dma_len, 0)
            }
        };
        let with_imm = pkt.repr.ext.imm_dt;
        if last && with_imm.is_some() && !self.has_recv() {
            // Keep the message state: the retried packet continues it.
            self.msg = Some(InMsg::Write {
                va,
                rkey,
                len,
                offset,
            });
            return Err(Fault::NoReceive);
        }
        let end = offset + pkt.payload.len() as u32;
        if end > len || (last && end != len) {
            return Err(Fault::Fatal(NakCode::InvalidRequest, None));
        }
        let at = va.wrapping_add(u64::from(offset));
        if mem
            .write(rkey, cx.pd, at, pkt.payload, Access::REMOTE_WRITE)
            .is_err()
        {
            if rc {
                cx.counters.resp_remote_access_errors += 1;
            }
            return Err(Fault::Fatal(NakCode::RemoteAccessError, None));
        }
        if !last {
            self.msg = Some(InMsg::Write {
                va,
                rkey,
                len,
                offset: end,
            });
            return Ok(());
        }
        self.msg = None;
        self.msn = self.msn.next();
        cx.counters.rx_write_requests += 1;
        if let Some(i) = with_imm {
            if let Some(w) = self.take_recv() {
                let mut wc = WorkCompletion::new(
                    w.wr_id,
                    WcStatus::Success,
                    WcOpcode::RecvRdmaWithImm,
                    cx.qpn,
                );
                wc.byte_len = len;
                wc.imm_data = i.imm;
                wc.wc_flags = WcFlags::WITH_IMM;
                wc.solicited = pkt.repr.bth.solicited;
                cx.completions.push_back(wc);
            }
        }
        Ok(())
    }

    fn reply_capacity(&self, cx: &QpContext) -> usize {
        usize::from(cx.attr.max_dest_rd_atomic.max(1))
    }

    fn exec_read_atomic(
        &mut self,
        cx: &mut QpContext,
        pkt: &RocePacket<'_>,
        mem: &mut MrTable,
        kind: MsgKind,
    ) -> Result<(), Fault> {
        let psn = pkt.repr.bth.psn;
        let outstanding = self.replies.iter().filter(|r| !r.duplicate).count();
        if outstanding >= self.reply_capacity(cx) {
            // More outstanding than max_dest_rd_atomic allows (C9-? too many requests).
            return Err(Fault::Fatal(NakCode::InvalidRequest, None));
        }
        let msn = self.msn.next();
        if kind == MsgKind::Read {
            let Some(reth) = pkt.repr.ext.reth else {
                return Err(Fault::Fatal(NakCode::InvalidRequest, None));
            };
            if reth.dma_len > 1 << 31
                || mem
                    .check_access(
                        reth.rkey,
                        cx.pd,
                        reth.va,
                        u64::from(reth.dma_len),
                        Access::REMOTE_READ,
                    )
                    .is_err()
            {
                cx.counters.resp_remote_access_errors += 1;
                return Err(Fault::Fatal(NakCode::RemoteAccessError, None));
            }
            self.replies.push_back(Reply {
                psn,
                msn,
                kind: ReplyKind::Read {
                    va: reth.va,
                    rkey: reth.rkey,
                    len: reth.dma_len,
                    sent: 0,
                },
                duplicate: false,
            });
            self.epsn = psn.add(reth.dma_len.div_ceil(cx.mtu()).max(1));
            cx.counters.rx_read_requests += 1;
        } else {
            let Some(a) = pkt.repr.ext.atomic_eth else {
                return Err(Fault::Fatal(NakCode::InvalidRequest, None));
            };
            let result = if pkt.repr.bth.opcode.kind() == Some(Kind::CompareSwap) {
                mem.compare_swap(a.rkey, cx.pd, a.va, a.compare, a.swap_add)
            } else {
                mem.fetch_add(a.rkey, cx.pd, a.va, a.swap_add)
            };
            let orig = match result {
                Ok(v) => v,
                Err(AccessError::Misaligned(_)) => {
                    return Err(Fault::Fatal(NakCode::InvalidRequest, None))
                }
                Err(_) => {
                    cx.counters.resp_remote_access_errors += 1;
                    return Err(Fault::Fatal(NakCode::RemoteAccessError, None));
                }
            };
            if self.atomics.len() >= self.reply_capacity(cx) {
                self.atomics.pop_front();
            }
            self.atomics.push_back((psn, orig));
            self.replies.push_back(Reply {
                psn,
                msn,
                kind: ReplyKind::Atomic { orig },
                duplicate: false,
            });
            self.epsn = psn.add(1);
            cx.counters.rx_atomic_requests += 1;
        }
        self.msn = msn;
        // The response acknowledges everything before it.
        self.ack_pending = false;
        Ok(())
    }

    /// A request with a PSN before the expected one (IBTA §9.7.5.1.3): SEND and WRITE are
    /// acknowledged again without executing, READ is executed again, an atomic returns the
    /// value of its one execution from the replay cache.
    fn duplicate(&mut self, cx: &mut QpContext, pkt: &RocePacket<'_>, mem: &MrTable) {
        cx.counters.duplicate_request += 1;
        let psn = pkt.repr.bth.psn;
        let crowded = self.replies.len() >= self.reply_capacity(cx) + DUPLICATE_SLACK;
        match pkt.repr.bth.opcode.kind() {
            Some(Kind::ReadRequest) => {
                let Some(reth) = pkt.repr.ext.reth else {
                    return;
                };
                let npkts = reth.dma_len.div_ceil(cx.mtu()).max(1);
                let inside = self.epsn.distance(psn.add(npkts)) >= 0;
                let allowed = mem
                    .check_access(
                        reth.rkey,
                        cx.pd,
                        reth.va,
                        u64::from(reth.dma_len),
                        Access::REMOTE_READ,
                    )
                    .is_ok();
                if inside && allowed && !crowded && reth.dma_len <= 1 << 31 {
                    cx.counters.rx_read_requests += 1;
                    self.replies.push_back(Reply {
                        psn,
                        msn: self.msn,
                        kind: ReplyKind::Read {
                            va: reth.va,
                            rkey: reth.rkey,
                            len: reth.dma_len,
                            sent: 0,
                        },
                        duplicate: true,
                    });
                }
            }
            Some(Kind::CompareSwap | Kind::FetchAdd) => {
                let cached = self.atomics.iter().find(|(p, _)| *p == psn);
                if let (Some(&(_, orig)), false) = (cached, crowded) {
                    cx.counters.atomic_replays += 1;
                    self.replies.push_back(Reply {
                        psn,
                        msn: self.msn,
                        kind: ReplyKind::Atomic { orig },
                        duplicate: true,
                    });
                }
            }
            _ => self.ack_pending = true,
        }
    }

    /// The next response frame: queued READ responses and atomic ACKs first, then a NAK, then
    /// a coalesced ACK for everything received so far.
    pub(crate) fn transmit<'m>(
        &mut self,
        cx: &mut QpContext,
        buf: &mut [u8],
        mem: &'m MrTable,
        split_min: usize,
    ) -> Option<TxOut<'m>> {
        if cx.state == QpState::Err {
            let (syndrome, psn) = self.nak.take()?;
            self.final_nak = false;
            return self.emit_ack(cx, buf, syndrome, psn);
        }
        if cx.qp_type != QpType::Rc
            || !matches!(
                cx.state,
                QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
            )
        {
            return None;
        }
        if let Some(reply) = self.replies.front().copied() {
            return self.emit_reply(cx, reply, buf, mem, split_min);
        }
        if let Some((syndrome, psn)) = self.nak.take() {
            self.ack_pending = false;
            return self.emit_ack(cx, buf, syndrome, psn);
        }
        if self
            .ooo
            .as_ref()
            .is_some_and(|o| o.feedback == Feedback::Selective)
        {
            return self.emit_sack(cx, buf);
        }
        if self.ack_pending {
            self.ack_pending = false;
            let syndrome = Syndrome::Ack {
                credits: self.credits(),
            };
            return self.emit_ack(cx, buf, syndrome, self.epsn.sub(1));
        }
        None
    }

    fn emit_ack<'m>(
        &mut self,
        cx: &mut QpContext,
        buf: &mut [u8],
        syndrome: Syndrome,
        psn: Psn,
    ) -> Option<TxOut<'m>> {
        if matches!(syndrome, Syndrome::Ack { .. }) {
            cx.counters.acks_sent += 1;
        } else {
            cx.counters.naks_sent += 1;
        }
        let ext = ExtHeaders {
            aeth: Some(AethRepr {
                syndrome: syndrome.to_byte(),
                msn: self.msn,
            }),
            ..ExtHeaders::default()
        };
        let fields = cx.fields(Opcode::RC_ACKNOWLEDGE, psn);
        cx.template
            .image()
            .emit(buf, &fields, &ext, 0, |_| {})
            .ok()
            .map(TxOut::Whole)
    }

    fn emit_reply<'m>(
        &mut self,
        cx: &mut QpContext,
        reply: Reply,
        buf: &mut [u8],
        mem: &'m MrTable,
        split_min: usize,
    ) -> Option<TxOut<'m>> {
        let credits = self.credits();
        let aeth = AethRepr {
            syndrome: Syndrome::Ack { credits }.to_byte(),
            msn: reply.msn,
        };
        match reply.kind {
            ReplyKind::Atomic { orig } => {
                self.replies.pop_front();
                let ext = ExtHeaders {
                    aeth: Some(aeth),
                    atomic_ack_eth: Some(AtomicAckEthRepr { orig_data: orig }),
                    ..ExtHeaders::default()
                };
                let fields = cx.fields(Opcode::RC_ATOMIC_ACKNOWLEDGE, reply.psn);
                cx.template
                    .image()
                    .emit(buf, &fields, &ext, 0, |_| {})
                    .ok()
                    .map(TxOut::Whole)
            }
            ReplyKind::Read {
                va,
                rkey,
                len,
                sent,
            } => {
                let mtu = cx.mtu();
                let remaining = len - sent;
                let plen = remaining.min(mtu);
                let opcode = match (sent == 0, remaining <= mtu) {
                    (true, true) => Opcode::RC_RDMA_READ_RESPONSE_ONLY,
                    (true, false) => Opcode::RC_RDMA_READ_RESPONSE_FIRST,
                    (false, true) => Opcode::RC_RDMA_READ_RESPONSE_LAST,
                    (false, false) => Opcode::RC_RDMA_READ_RESPONSE_MIDDLE,
                };
                let psn = reply.psn.add(sent / mtu);
                let mut fields = cx.fields(opcode, psn);
                if self.ooo.is_some() {
                    // The requester places responses in any order: they take the paths
                    // requests take, and a response sent again takes another.
                    fields.udp_src_port = cx
                        .path
                        .select(cx.base_path(), psn, reply.duplicate)
                        .udp_src_port;
                }
                let mut ext = ExtHeaders::default();
                if opcode != Opcode::RC_RDMA_READ_RESPONSE_MIDDLE {
                    ext.aeth = Some(aeth);
                }
                let pd = cx.pd;
                let at = va.wrapping_add(u64::from(sent));
                let image = cx.template.image();
                let plen_bytes = plen as usize;
                let n = if plen_bytes >= split_min {
                    mem.span(rkey, pd, at, plen_bytes, Access::REMOTE_READ)
                        .ok()
                        .and_then(|s| {
                            let spans = smallvec::smallvec![s];
                            tx::emit_split(image, &fields, &ext, plen_bytes, buf, spans)
                        })
                } else {
                    let mut read = Ok(());
                    image
                        .emit(buf, &fields, &ext, plen_bytes, |dst| {
                            read = mem.read(rkey, pd, at, dst, Access::REMOTE_READ)
                        })
                        .ok()
                        .filter(|_| read.is_ok())
                        .map(TxOut::Whole)
                };
                if n.is_none() {
                    // The region went away under a READ in progress.
                    self.replies.clear();
                    cx.counters.resp_remote_access_errors += 1;
                    self.nak = Some((Syndrome::Nak(NakCode::RemoteAccessError), psn));
                    self.final_nak = true;
                    cx.enter_error();
                    cx.error_cause = Some(ErrorCause::AccessViolation);
                    return None;
                }
                let sent = sent + plen;
                if sent >= len {
                    self.replies.pop_front();
                } else if let Some(front) = self.replies.front_mut() {
                    front.kind = ReplyKind::Read {
                        va,
                        rkey,
                        len,
                        sent,
                    };
                }
                n
            }
        }
    }

    /// A UD datagram: Q_Key check, then the GRH and payload into the next receive.
    fn ud_rx(&mut self, cx: &mut QpContext, pkt: &RocePacket<'_>, mem: &MrTable) {
        let Some(deth) = pkt.repr.ext.deth else {
            cx.counters.rx_dropped += 1;
            return;
        };
        if deth.qkey != cx.attr.qkey {
            cx.counters.qkey_violations += 1;
            return;
        }
        let Some(w) = self.take_recv() else {
            cx.counters.out_of_buffer += 1;
            return;
        };
        // The GRH area holds the IP header as received: IPv6's 40 bytes, or 20 zero bytes
        // then the IPv4 header (as mlx5 and rxe do for RoCEv2).
        let mut grh = [0u8; GRH_LEN];
        let ip = pkt
            .icrc_input
            .get(crate::wire::icrc::LRH_STAND_IN..)
            .unwrap_or(&[]);
        match pkt.repr.ip.version() {
            4 => {
                let n = 20.min(ip.len());
                grh[20..20 + n].copy_from_slice(&ip[..n]);
            }
            _ => {
                let n = GRH_LEN.min(ip.len());
                grh[..n].copy_from_slice(&ip[..n]);
            }
        }
        let placed = sg::scatter(mem, cx.pd, &w.sges, 0, &grh)
            .and_then(|()| sg::scatter(mem, cx.pd, &w.sges, GRH_LEN as u64, pkt.payload));
        let status = match placed {
            Ok(()) => WcStatus::Success,
            Err(SgError::Length) => {
                cx.counters.resp_local_length_error += 1;
                WcStatus::LocLenErr
            }
            Err(SgError::Access(_)) => WcStatus::LocProtErr,
        };
        if status != WcStatus::Success {
            cx.counters.resp_cqe_error += 1;
        }
        let mut wc = WorkCompletion::new(w.wr_id, status, WcOpcode::Recv, cx.qpn);
        wc.byte_len = (GRH_LEN + pkt.payload.len()) as u32;
        wc.wc_flags = WcFlags::GRH;
        if let Some(i) = pkt.repr.ext.imm_dt {
            wc.wc_flags = wc.wc_flags.with(WcFlags::WITH_IMM);
            wc.imm_data = i.imm;
        }
        wc.src_qp = deth.src_qp;
        wc.smac = pkt.repr.eth.src;
        wc.solicited = pkt.repr.bth.solicited;
        cx.completions.push_back(wc);
    }
}

/// What tag matching made of the message being taken, if anything.
fn tm_of(cx: &QpContext) -> Option<&Taken> {
    cx.ext.as_deref().and_then(|e| e.tm_taken.as_ref())
}

/// Takes what tag matching made of the message being taken.
fn take_tm(cx: &mut QpContext) -> Option<Taken> {
    cx.ext.as_deref_mut().and_then(|e| e.tm_taken.take())
}
