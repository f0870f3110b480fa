//! The requester half: turns send WQEs into request packets, tracks what the responder has
//! acknowledged, completes WRs, and recovers from loss with the QP's [`Recovery`] policy
//! (IBTA Vol 1 §9.7.4–9.7.6: PSN assignment, ACK/NAK processing, implied NAK, RNR and
//! the local ACK timeout).
//!
//! PSNs are assigned to a WQE when it is first transmitted, so every PSN in `[una, nxt)`
//! belongs to exactly one WQE of `sq[..assigned]`, in order. The transmit cursor
//! `(cur, cur_pkt)` walks that range again after a rewind and then on into unassigned WQEs.

use std::collections::VecDeque;

use super::ring::PsnRing;
use super::{Flush, QpContext, SendWqe, WqeData};

mod responses;

use crate::transport::congestion::{AckEvent, Loss};
use crate::transport::mr::{Access, MrTable};
use crate::transport::path::Path;
use crate::transport::recovery::{Retransmit, SendWindow};
use crate::transport::sg;
use crate::transport::state::{QpState, QpType};
use crate::transport::timers::{rnr_timer_ns, Timer, TimerTable, RNR_RETRY_INFINITE};
use crate::transport::tx::{self, TxOut};
use crate::transport::wr::{SendFlags, WcStatus, WrOpcode};
use crate::wire::{
    AtomicEthRepr, DethRepr, ExtHeaders, IethRepr, ImmDtRepr, Kind, NakCode, Opcode, PacketFields,
    Position, Psn, RethRepr, RocePacket, SackEthRepr, Suffix, Syndrome, Transport,
};
pub(crate) use responses::Responses;

/// The requester asks for an ACK at least every this many packets of a long message (and on
/// every message's last packet), so the window keeps moving without an ACK per packet.
pub const ACK_REQ_EVERY: u32 = 64;

/// `Requester::recovering` when no gap is being recovered (no PSN has 32 bits).
pub(crate) const NOT_RECOVERING: u32 = u32::MAX;

#[derive(Debug)]
pub(crate) struct Requester {
    pub(crate) sq: VecDeque<SendWqe>,
    /// `sq[..assigned]` have PSNs.
    pub(crate) assigned: usize,
    /// Transmit cursor: WQE index and packet within it.
    pub(crate) cur: usize,
    pub(crate) cur_pkt: u32,
    /// Next PSN to assign.
    pub(crate) nxt: Psn,
    /// Oldest PSN not acknowledged.
    pub(crate) una: Psn,
    /// The `una` congestion control last heard of.
    cc_una: Psn,
    /// One past the highest PSN ever transmitted: anything before it is a retransmission.
    pub(crate) sent_hw: Psn,
    pub(crate) rd_atomic_inflight: u32,
    pub(crate) consumers_inflight: u32,
    /// End-to-end credits from the last AETH; `u32::MAX` when the responder reports none
    /// (31): no limit. (A plain `u32`: an idle QP's footprint counts.)
    pub(crate) credits: u32,
    /// The retry, RNR and pacing deadlines.
    pub(crate) timers: TimerTable,
    pub(crate) retries_left: u8,
    pub(crate) rnr_retries_left: u8,
    /// The PSN the last sequence-error rewind resumed from. Responses and NAKs the responder
    /// sent before it saw the retransmission still point at that gap; acting on each of them
    /// would rewind again and again (a retransmission storm), so a gap is acted on once until
    /// `una` moves or the timer fires. A raw PSN, [`NOT_RECOVERING`] for none: an idle QP's
    /// footprint counts.
    pub(crate) recovering: u32,
    /// Placement delivery: what the responder reported arrived ahead of `una` (`None` for
    /// in-order delivery; boxed, so a Go-Back-N QP does not carry it).
    pub(crate) sacks: Option<Box<Sacks>>,
    /// PSNs to resend one by one, before new data (selective repeat and its baselines).
    pub(crate) rtx: VecDeque<Psn>,
    /// Placement delivery: READ responses and atomic ACKs that arrived ahead of `una`
    /// (`None` for in-order delivery, where a response gap is an implied NAK).
    pub(crate) responses: Option<Box<Responses>>,
}

/// Placement delivery: the PSNs past `una` the responder reported arrived.
#[derive(Debug)]
pub(crate) struct Sacks {
    /// PSNs in `[una, nxt)` reported arrived, valid from `floor` on.
    ring: PsnRing,
    floor: Psn,
    /// The last PSN a selective acknowledgement reported arrived.
    highest: Option<Psn>,
}

impl Sacks {
    /// Room for `capacity` PSNs from `floor` on.
    pub(crate) fn new(capacity: u32, floor: Psn) -> Self {
        Self {
            ring: PsnRing::with_capacity(capacity),
            floor,
            highest: None,
        }
    }

    /// Forgets everything before `to`.
    fn slide(&mut self, to: Psn) {
        self.ring.clear_range(self.floor, to);
        self.floor = to;
    }
}

impl Requester {
    /// (Re)starts the retry timer for a request sent, or progress made, at `now`.
    /// Whether the local ACK timer has fired by `now`.
    pub(crate) fn timers_retry_expired(&self, now: u64) -> bool {
        self.timers.expired(Timer::Retry, now)
    }

    /// The QP moved to another path: everything outstanding goes again from `una` on it,
    /// with a fresh retry budget (the old path's silence says nothing of the new one).
    pub(crate) fn restart_on_new_path(&mut self, cx: &mut QpContext, now: u64) {
        self.retries_left = cx.attr.retry_cnt;
        self.recovering = NOT_RECOVERING;
        if self.una != self.nxt {
            self.retransmit(cx, now, Retransmit::From(self.una));
            self.arm_retry(cx, now);
        }
    }

    pub(crate) fn arm_retry(&mut self, cx: &QpContext, now: u64) {
        self.timers.set_or_stop(Timer::Retry, cx.ack_deadline(now));
    }

    /// Starts the retry timer at `now` unless it runs already.
    pub(crate) fn arm_retry_if_idle(&mut self, cx: &QpContext, now: u64) {
        if !self.timers.is_armed(Timer::Retry) {
            self.arm_retry(cx, now);
        }
    }

    /// Fails the QP into ERR: the send WQE at index `failed.0` completes with `failed.1`,
    /// every other one is flushed, in queue order, at once; the QP flushes the receive queue
    /// when the handler returns.
    pub(crate) fn fail(&mut self, cx: &mut QpContext, failed: Option<(usize, WcStatus)>) {
        cx.span()
            .in_scope(|| tracing::debug!(?failed, "QP enters ERR"));
        cx.state = QpState::Err;
        if cx.pending == Flush::None {
            cx.pending = Flush::Receives;
        }
        self.flush(cx, failed);
    }

    /// The send WQE at `idx` failed locally or remotely. RC moves to ERR; UC and UD move to
    /// SQE, where receives keep working.
    pub(crate) fn send_queue_error(&mut self, cx: &mut QpContext, idx: usize, status: WcStatus) {
        if cx.qp_type == QpType::Rc {
            self.fail(cx, Some((idx, status)));
            return;
        }
        cx.span()
            .in_scope(|| tracing::debug!(?status, "QP enters SQE"));
        cx.state = QpState::Sqe;
        self.flush(cx, Some((idx, status)));
    }

    /// Completes every send WQE with a flush error, the one at `failed.0` with `failed.1`,
    /// in queue order, and forgets what was in flight.
    fn flush(&mut self, cx: &mut QpContext, failed: Option<(usize, WcStatus)>) {
        for (i, w) in self.sq.drain(..).enumerate() {
            let status = match failed {
                Some((at, status)) if at == i => status,
                _ => WcStatus::WrFlushErr,
            };
            cx.push_send_completion(&w, status, 0);
        }
        self.clear_in_flight();
    }

    pub(crate) fn new(sq_psn: Psn) -> Self {
        Self {
            sq: VecDeque::new(),
            assigned: 0,
            cur: 0,
            cur_pkt: 0,
            nxt: sq_psn,
            una: sq_psn,
            cc_una: sq_psn,
            sent_hw: sq_psn,
            rd_atomic_inflight: 0,
            consumers_inflight: 0,
            // IBTA §9.7.7.2: a requester starts with no credits, and may always have one
            // message outstanding to learn the count.
            credits: 0,
            timers: TimerTable::default(),
            retries_left: 7,
            rnr_retries_left: 7,
            recovering: NOT_RECOVERING,
            sacks: None,
            rtx: VecDeque::new(),
            responses: None,
        }
    }

    pub(crate) fn clear_in_flight(&mut self) {
        self.rtx.clear();
        if let Some(r) = self.responses.as_mut() {
            r.reset(self.nxt);
        }
        if let Some(s) = self.sacks.as_deref_mut() {
            s.slide(self.nxt);
            s.highest = None;
        }
        self.assigned = 0;
        self.cur = 0;
        self.cur_pkt = 0;
        self.una = self.nxt;
        self.cc_una = self.nxt;
        self.rd_atomic_inflight = 0;
        self.consumers_inflight = 0;
        self.timers = TimerTable::default();
        self.recovering = NOT_RECOVERING;
    }

    fn window(&self) -> SendWindow {
        SendWindow {
            una: self.una,
            nxt: self.nxt,
        }
    }

    /// The PSN the cursor will send next.
    fn cursor_psn(&self) -> Psn {
        if self.cur < self.assigned {
            self.sq[self.cur].first_psn.add(self.cur_pkt)
        } else {
            self.nxt
        }
    }

    /// The WQE (index) and packet within it that PSN `psn` (outstanding) belongs to.
    fn locate(&self, psn: Psn) -> Option<(usize, u32)> {
        let d = psn.distance(self.una);
        if d < 0 || self.nxt.distance(psn) <= 0 {
            return None;
        }
        // WQEs are in PSN order: binary search for the one containing `psn`.
        let (mut lo, mut hi) = (0, self.assigned);
        while lo < hi {
            let mid = (lo + hi) / 2;
            if self.sq[mid].last_psn().distance(self.una) < d {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        let w = self.sq.get(lo).filter(|_| lo < self.assigned)?;
        w.contains(psn)
            .then(|| (lo, psn.distance(w.first_psn) as u32))
    }

    /// `psn` is outstanding and worth sending again when the responder has not
    /// reported it arrived, or it is a READ or atomic, whose arrival says nothing of its
    /// response, or it is the oldest unacknowledged PSN, whose resending doubles as a probe
    /// (the responder answers a duplicate with a fresh acknowledgement, which matters when
    /// the one that covered it was lost).
    /// Where `psn` sits (as [`locate`](Self::locate)), if it needs resending.
    fn resendable(&self, psn: Psn) -> Option<(usize, u32)> {
        let (idx, pkt) = self.locate(psn)?;
        let op = self.sq[idx].op;
        if op.is_read_or_atomic() {
            // Its response, not its request, says whether it needs asking again.
            return (!self.responses.as_ref().is_some_and(|r| r.arrived(psn)))
                .then_some((idx, pkt));
        }
        (psn == self.una || !self.sacks.as_ref().is_some_and(|s| s.ring.get(psn)))
            .then_some((idx, pkt))
    }

    /// Queues `psn` to be resent alone, if it needs it.
    fn push_rtx(&mut self, psn: Psn) {
        if self.resendable(psn).is_some() && !self.rtx.contains(&psn) {
            self.rtx.push_back(psn);
        }
    }

    /// Points the cursor at `psn`, which must lie in `[una, nxt]`.
    fn rewind_to(&mut self, psn: Psn) {
        let psn = if psn.distance(self.una) < 0 || psn.distance(self.nxt) > 0 {
            self.una
        } else {
            psn
        };
        (self.cur, self.cur_pkt) = self.locate(psn).unwrap_or((self.assigned, 0));
    }

    /// Completes the front WQE (acknowledged) with `len` bytes and drops it where it lies:
    /// popping it moved its 152 bytes out only to drop them, once per message.
    fn retire_front(&mut self, cx: &mut QpContext, len: impl FnOnce(&SendWqe) -> u32) {
        let Some(w) = self.sq.front() else {
            return;
        };
        cx.push_send_completion(w, WcStatus::Success, len(w));
        let (rd, cons) = (w.op.is_read_or_atomic(), w.op.consumes_recv());
        self.forget_front(rd, cons);
        self.sq.pop_front();
    }

    /// The bookkeeping of the front WQE leaving: what it held in flight, and the cursor.
    fn forget_front(&mut self, read_or_atomic: bool, consumes_recv: bool) {
        if self.assigned > 0 {
            self.assigned -= 1;
            if read_or_atomic {
                self.rd_atomic_inflight = self.rd_atomic_inflight.saturating_sub(1);
            }
            if consumes_recv {
                self.consumers_inflight = self.consumers_inflight.saturating_sub(1);
            }
        }
        if self.cur > 0 {
            self.cur -= 1;
        } else {
            self.cur_pkt = 0;
        }
    }

    /// Removes the front WQE (acknowledged or failed), keeping the cursor on the same WQE.
    fn pop_front(&mut self) -> Option<SendWqe> {
        let w = self.sq.pop_front()?;
        self.forget_front(w.op.is_read_or_atomic(), w.op.consumes_recv());
        Some(w)
    }
}

/// What acknowledging up to a PSN found.
enum Acked {
    /// Done; `true` when the responder was seen to progress: `una` moved, or (placement)
    /// acknowledgements reached further while responses before them are still on their way.
    Ok(bool),
    /// A READ or atomic before the acknowledged PSN has no response: its responses were
    /// lost (implied NAK, IBTA §9.7.5.1.5).
    ImpliedNak,
}

impl Requester {
    pub(crate) fn may_send(&self, cx: &QpContext) -> bool {
        matches!(cx.state, QpState::Rts | QpState::Sqd)
            && !self.timers.is_armed(Timer::Rnr)
            && (self.cur < self.sq.len()
                || !self.rtx.is_empty()
                || self.responses.as_ref().is_some_and(|r| r.has_rereads()))
    }

    /// Acts on a policy's decision of what to resend.
    fn retransmit(&mut self, cx: &mut QpContext, now: u64, r: Retransmit) {
        let loss = match r {
            Retransmit::From(_) => Loss::GoBack,
            Retransmit::Only(..) | Retransmit::Holes => Loss::Selective,
        };
        self.report_acks(cx, now);
        cx.congestion.on_loss(now, loss);
        match r {
            Retransmit::From(psn) => {
                self.rewind_to(psn);
            }
            Retransmit::Only(a, b) => {
                self.push_rtx(a);
                if let Some(b) = b {
                    self.push_rtx(b);
                }
            }
            Retransmit::Holes => {
                self.rtx.clear();
                let una = self.una;
                self.rtx.push_back(una);
                if let Some(s) = self.sacks.as_deref() {
                    let n = s.highest.map_or(0, |h| h.distance(una).max(0) as u32);
                    for i in 1..n {
                        let p = una.add(i);
                        if !s.ring.get(p) {
                            self.rtx.push_back(p);
                        }
                    }
                }
                // And every gap between the responses that did arrive: each starts a run
                // asked for again up to the next arrival.
                if let Some(r) = self.responses.as_ref() {
                    for p in r.gap_starts(una) {
                        let awaits_response = self
                            .locate(p)
                            .is_some_and(|(i, _)| self.sq[i].op.is_read_or_atomic());
                        if awaits_response && !self.rtx.contains(&p) {
                            self.rtx.push_back(p);
                        }
                    }
                }
            }
        }
    }

    /// The next queued selective retransmission, if any.
    fn retransmission<'m>(
        &mut self,
        cx: &mut QpContext,
        now: u64,
        buf: &mut [u8],
        mem: &'m MrTable,
        split_min: usize,
    ) -> Option<TxOut<'m>> {
        loop {
            // Single responses found lost go first: each is asked for alone.
            let (psn, single) = match self.responses.as_mut().and_then(|r| r.next_reread()) {
                Some(p) => (p, true),
                None => match self.rtx.pop_front() {
                    Some(p) => (p, false),
                    None => return None,
                },
            };
            let Some((idx, pkt)) = self.resendable(psn) else {
                continue;
            };
            let mut read_pkts = u32::MAX;
            if self.sq[idx].op == WrOpcode::Read {
                match self.responses.as_ref() {
                    // In-order responses: only the READ at `una` is worth asking again, for
                    // everything from there on.
                    None if psn != self.una => continue,
                    None => {}
                    Some(_) if single => read_pkts = 1,
                    Some(r) => {
                        // Up to the next response that arrived; queued PSNs inside the run
                        // are covered by it.
                        let left = self.sq[idx].npkts - pkt;
                        read_pkts = r.missing_run(psn, left);
                        let end = psn.add(read_pkts);
                        self.rtx
                            .retain(|p| !(p.distance(psn) > 0 && p.distance(end) < 0));
                    }
                }
            }
            return match self.emit_request(
                cx,
                now,
                idx,
                (pkt, read_pkts, false),
                buf,
                mem,
                split_min,
            ) {
                Ok(n) => {
                    cx.counters.retransmitted_packets += 1;
                    self.arm_retry_if_idle(cx, now);
                    Some(n)
                }
                Err(status) => {
                    self.send_queue_error(cx, idx, status);
                    None
                }
            };
        }
    }

    /// The next request packet, if the window, credits and READ/atomic limits allow one.
    pub(crate) fn transmit<'m>(
        &mut self,
        cx: &mut QpContext,
        now: u64,
        buf: &mut [u8],
        mem: &'m MrTable,
        split_min: usize,
    ) -> Option<TxOut<'m>> {
        if !matches!(cx.state, QpState::Rts | QpState::Sqd) || self.timers.is_armed(Timer::Rnr) {
            return None;
        }
        if let Some(t) = self.timers.get(Timer::Pace) {
            if t > now {
                return None;
            }
            self.timers.stop(Timer::Pace);
        }
        if !self.rtx.is_empty() || self.responses.as_ref().is_some_and(|r| r.has_rereads()) {
            if let Some(out) = self.retransmission(cx, now, buf, mem, split_min) {
                return Some(out);
            }
            if !matches!(cx.state, QpState::Rts | QpState::Sqd) {
                return None;
            }
        }
        let window = cx
            .recovery
            .window()
            .min(cx.congestion.window().unwrap_or(u32::MAX))
            .min(1 << 22) as i32;
        let rc = cx.qp_type == QpType::Rc;
        if self.cur >= self.sq.len() {
            return None;
        }
        if self.cur == self.assigned {
            if cx.state == QpState::Sqd {
                return None;
            }
            let w = &self.sq[self.cur];
            if rc {
                let rd_atomic = w.op.is_read_or_atomic();
                if rd_atomic && self.rd_atomic_inflight >= u32::from(cx.attr.max_rd_atomic.max(1))
                    || w.flags.contains(SendFlags::FENCE) && self.rd_atomic_inflight > 0
                    || w.op.consumes_recv()
                        && self.consumers_inflight > 0
                        && self.consumers_inflight >= self.credits
                    || self.nxt.distance(self.una) >= window
                {
                    return None;
                }
            }
            let needed = if w.op.is_read_or_atomic() {
                Access::LOCAL_WRITE
            } else {
                Access::NONE
            };
            // An RC message of one packet that carries its data is gathered whole by its
            // emit, whose failure is this same send queue error (the QP goes to ERR either
            // way), so the check is left to it: one key lookup per message saved. Others are
            // checked here, before any of their packets leaves: a READ's or atomic's local
            // buffer is written only when the response comes, a longer message's later
            // packets are gathered later, and UC and UD go on sending after SQE.
            let checked_by_emit =
                rc && !w.op.is_read_or_atomic() && (1..=cx.mtu()).contains(&w.len);
            if let WqeData::Sges(s) = &w.data {
                if !checked_by_emit && sg::check(mem, cx.pd, s, needed).is_err() {
                    let at = self.cur;
                    self.send_queue_error(cx, at, WcStatus::LocProtErr);
                    return None;
                }
            }
            if cx.qp_type == QpType::Ud && w.len > cx.mtu() {
                let at = self.cur;
                self.send_queue_error(cx, at, WcStatus::LocLenErr);
                return None;
            }
            let npkts = match w.op {
                WrOpcode::CmpSwp | WrOpcode::FetchAdd => 1,
                _ => w.len.div_ceil(cx.mtu()).max(1),
            };
            let (rd, cons) = (w.op.is_read_or_atomic(), w.op.consumes_recv());
            let w = &mut self.sq[self.cur];
            w.first_psn = self.nxt;
            w.npkts = npkts;
            self.nxt = self.nxt.add(npkts);
            self.assigned += 1;
            self.rd_atomic_inflight += u32::from(rd);
            self.consumers_inflight += u32::from(cons);
        }
        let psn = self.sq[self.cur].first_psn.add(self.cur_pkt);
        if rc && psn.distance(self.una) >= window {
            return None;
        }
        let (idx, pkt) = (self.cur, self.cur_pkt);
        // A window narrower than the AckReq spacing may hold no packet that asks for an
        // acknowledgement, and would stall until the timer fired: the packet that fills it
        // asks, and from four packets on so does one every half window, so the window opens
        // again before it is spent rather than once per round trip. (Wider windows always
        // hold one.)
        let half = (window / 2).max(1) as u32;
        let fills = window < ACK_REQ_EVERY as i32
            && (psn.distance(self.una) + 1 >= window
                || half >= 2 && psn.value() % half == half - 1);
        let n = match self.emit_request(cx, now, idx, (pkt, u32::MAX, fills), buf, mem, split_min) {
            Ok(n) => n,
            Err(status) => {
                self.send_queue_error(cx, idx, status);
                return None;
            }
        };
        let w = &self.sq[idx];
        let (npkts, is_read) = (w.npkts, w.op == WrOpcode::Read);
        let end = if is_read {
            w.first_psn.add(npkts)
        } else {
            psn.add(1)
        };
        if psn.before(self.sent_hw) {
            cx.counters.retransmitted_packets += 1;
        }
        if self.sent_hw.before(end) {
            self.sent_hw = end;
        }
        self.cur_pkt = if is_read { npkts } else { pkt + 1 };
        if self.cur_pkt >= npkts {
            self.cur += 1;
            self.cur_pkt = 0;
            if !rc {
                // UC and UD complete a WR once its last packet is on the wire.
                if let Some(w) = self.pop_front() {
                    let len = w.len;
                    cx.push_send_completion(&w, WcStatus::Success, len);
                }
                self.una = self.nxt;
            }
        }
        if rc {
            self.arm_retry_if_idle(cx, now);
        }
        Some(n)
    }

    /// Writes packet `pkt` of `sq[idx]` into `buf` at `now`; a READ asks for at most
    /// `read_pkts` response packets from there; `ack_req` sets AckReq whatever the packet's
    /// place. Congestion control hears of the packet here, where its length is known.
    #[allow(clippy::too_many_arguments)]
    fn emit_request<'m>(
        &mut self,
        cx: &mut QpContext,
        now: u64,
        idx: usize,
        (pkt, read_pkts, ack_req): (u32, u32, bool),
        buf: &mut [u8],
        mem: &'m MrTable,
        split_min: usize,
    ) -> Result<TxOut<'m>, WcStatus> {
        let mtu = cx.mtu();
        let (first_psn, npkts) = {
            let w = &self.sq[idx];
            (w.first_psn, w.npkts)
        };
        let psn = first_psn.add(pkt);
        let retrans = psn.before(self.sent_hw);
        let path = cx.path.select(cx.base_path(), psn, retrans);
        let sport = path.udp_src_port;
        let w = &self.sq[idx];
        let pos = match (npkts, pkt) {
            (1, _) => Position::Only,
            (_, 0) => Position::First,
            (n, p) if p + 1 == n => Position::Last,
            _ => Position::Middle,
        };
        let last = matches!(pos, Position::Last | Position::Only);
        // Placement delivery: every WRITE packet says where it lands, so it can arrive in
        // any order (ferroce's SR_RDMA_WRITE_* opcodes).
        let placing_write = cx.qp_type == QpType::Rc
            && matches!(w.op, WrOpcode::Write | WrOpcode::WriteWithImm)
            && self.sacks.is_some();
        // The frame: the path's rendered headers, patched, and the extension headers,
        // filled here and written straight into the frame.
        let mut ext = ExtHeaders::default();
        let ud_template;
        let (transport, template) = match (cx.qp_type, w.ud.as_deref()) {
            (QpType::Ud, Some(ud)) => {
                let qkey = if ud.remote_qkey & 0x8000_0000 != 0 {
                    cx.attr.qkey
                } else {
                    ud.remote_qkey
                };
                ud_template = ud.av.template(ud.remote_qpn, sport);
                ext.deth = Some(DethRepr {
                    qkey,
                    src_qp: cx.qpn,
                });
                (Transport::Ud, &ud_template)
            }
            (QpType::Uc, _) => (Transport::Uc, &cx.template),
            // ferroce's SR_RDMA_WRITE_* opcodes.
            _ if placing_write => (Transport::Manufacturer, &cx.template),
            _ => (Transport::Rc, &cx.template),
        };
        let off = pkt * mtu;
        let mut plen = (w.len - off.min(w.len)).min(mtu);
        let (kind, pos, suffix) = match w.op {
            WrOpcode::Send | WrOpcode::SendWithImm | WrOpcode::SendWithInv => {
                match w.op {
                    WrOpcode::SendWithImm if last => ext.imm_dt = Some(ImmDtRepr { imm: w.imm }),
                    WrOpcode::SendWithInv if last => ext.ieth = Some(IethRepr { rkey: w.imm }),
                    _ => {}
                }
                let suffix = match w.op {
                    WrOpcode::SendWithImm if last => Suffix::Immediate,
                    WrOpcode::SendWithInv if last => Suffix::Invalidate,
                    _ => Suffix::Plain,
                };
                (Kind::Send, pos, suffix)
            }
            WrOpcode::Write | WrOpcode::WriteWithImm => {
                let imm = w.op == WrOpcode::WriteWithImm;
                if placing_write {
                    ext.reth = Some(RethRepr {
                        va: w.remote_addr.wrapping_add(u64::from(off)),
                        rkey: w.rkey,
                        dma_len: w.len,
                    });
                } else if matches!(pos, Position::First | Position::Only) {
                    ext.reth = Some(RethRepr {
                        va: w.remote_addr,
                        rkey: w.rkey,
                        dma_len: w.len,
                    });
                }
                if imm && last {
                    ext.imm_dt = Some(ImmDtRepr { imm: w.imm });
                }
                let suffix = if imm && last {
                    Suffix::Immediate
                } else {
                    Suffix::Plain
                };
                (Kind::Write, pos, suffix)
            }
            WrOpcode::Read => {
                // A re-issued READ asks only for what is still missing (§9.7.5.1.5).
                let left = w.len - off.min(w.len);
                ext.reth = Some(RethRepr {
                    va: w.remote_addr.wrapping_add(u64::from(off)),
                    rkey: w.rkey,
                    dma_len: left.min(read_pkts.saturating_mul(mtu)),
                });
                plen = 0;
                (Kind::ReadRequest, Position::Only, Suffix::Plain)
            }
            WrOpcode::CmpSwp | WrOpcode::FetchAdd => {
                let cas = w.op == WrOpcode::CmpSwp;
                ext.atomic_eth = Some(AtomicEthRepr {
                    va: w.remote_addr,
                    rkey: w.rkey,
                    swap_add: if cas { w.swap } else { w.compare_add },
                    compare: if cas { w.compare_add } else { 0 },
                });
                plen = 0;
                let kind = if cas {
                    Kind::CompareSwap
                } else {
                    Kind::FetchAdd
                };
                (kind, Position::Only, Suffix::Plain)
            }
            WrOpcode::AtomicWrite => {
                ext.reth = Some(RethRepr {
                    va: w.remote_addr,
                    rkey: w.rkey,
                    dma_len: 8,
                });
                plen = 8;
                (Kind::AtomicWrite, Position::Only, Suffix::Plain)
            }
            // Posting refuses local operations: they never reach the wire.
            WrOpcode::LocalInv | WrOpcode::BindMw => return Err(WcStatus::LocQpOpErr),
        };
        // Posting refused what a transport cannot carry (a UD WRITE, a UC READ).
        let fields = PacketFields {
            opcode: Opcode::compose(transport, kind, pos, suffix).ok_or(WcStatus::LocQpOpErr)?,
            solicited: last && w.flags.contains(SendFlags::SOLICITED),
            ack_req: cx.qp_type == QpType::Rc
                && (last || ack_req || psn.value() % ACK_REQ_EVERY == ACK_REQ_EVERY - 1),
            psn,
            udp_src_port: sport,
        };
        let pd = cx.pd;
        let image = template.image();
        if let WqeData::Sges(s) = &w.data {
            if plen as usize >= split_min {
                let spans = sg::spans(mem, pd, s, u64::from(off), plen as usize)
                    .map_err(|_| WcStatus::LocProtErr)?;
                let out = tx::emit_split(image, &fields, &ext, plen as usize, buf, spans)
                    .ok_or(WcStatus::LocLenErr)?;
                self.sent(cx, now, psn, out.len(), path, retrans);
                return Ok(out);
            }
        }
        let mut failed = false;
        let n = image
            .emit(buf, &fields, &ext, plen as usize, |dst| match &w.data {
                WqeData::Inline(bytes) => {
                    dst.copy_from_slice(&bytes[off as usize..off as usize + dst.len()]);
                }
                WqeData::Sges(s) => {
                    failed = sg::gather(mem, pd, s, u64::from(off), dst).is_err();
                }
            })
            .map_err(|_| WcStatus::LocLenErr)?;
        if failed {
            return Err(WcStatus::LocProtErr);
        }
        self.sent(cx, now, psn, n, path, retrans);
        Ok(TxOut::Whole(n))
    }

    /// A response (ACK, NAK, READ response, atomic ACK) for the requester.
    pub(crate) fn receive(
        &mut self,
        cx: &mut QpContext,
        now: u64,
        pkt: &RocePacket<'_>,
        mem: &MrTable,
    ) {
        self.dispatch_response(cx, now, pkt, mem);
        self.report_acks(cx, now);
    }

    /// A request packet of `bytes` left at `now`: congestion control hears of it, and under a
    /// pacing rate the next one waits its turn.
    fn sent(
        &mut self,
        cx: &mut QpContext,
        now: u64,
        psn: Psn,
        bytes: usize,
        path: Path,
        retransmission: bool,
    ) {
        let Some(records) = cx.congestion.sends() else {
            return;
        };
        records.note(psn, now, bytes, path, retransmission);
        cx.congestion.on_sent(now, psn, bytes, retransmission);
        if let Some(rate) = cx.congestion.pacing_rate().filter(|&r| r > 0) {
            // Rounded up: a gap a fraction of a nanosecond short, packet after packet, would
            // outrun a link paced at exactly its rate and grow its queue without end.
            let gap = (bytes as u128 * 1_000_000_000).div_ceil(u128::from(rate)) as u64;
            self.timers.set(Timer::Pace, now + gap);
        }
    }

    /// Tells congestion control how far `una` moved since it last heard. Called after each
    /// response, and before a loss is reported, so a controller sees events in their order.
    fn report_acks(&mut self, cx: &mut QpContext, now: u64) {
        let acked = self.una.distance(self.cc_una);
        if acked > 0 {
            self.cc_una = self.una;
            // The newest packet acknowledged gives the sample.
            let newest = self.una.sub(1);
            let rtt = cx.congestion.sends().and_then(|s| s.rtt(newest, now));
            let ack = AckEvent {
                acked: acked as u32,
                rtt,
            };
            cx.congestion.on_ack(now, ack);
        }
    }

    fn dispatch_response(
        &mut self,
        cx: &mut QpContext,
        now: u64,
        pkt: &RocePacket<'_>,
        mem: &MrTable,
    ) {
        let psn = pkt.repr.bth.psn;
        let aeth = pkt.repr.ext.aeth;
        match (pkt.repr.bth.opcode.kind(), aeth) {
            (Some(Kind::Acknowledge), Some(a)) if pkt.repr.bth.opcode == Opcode::SR_ACKNOWLEDGE => {
                if let Some(sack) = pkt.repr.ext.sack_eth {
                    self.on_sack(cx, now, psn, a.syndrome, sack);
                }
            }
            (Some(Kind::Acknowledge), Some(a)) => match Syndrome::from_byte(a.syndrome) {
                Syndrome::Ack { credits } => self.on_ack(cx, now, psn, credits),
                Syndrome::RnrNak { timer } => self.on_rnr_nak(cx, now, psn, timer),
                Syndrome::Nak(code) => self.on_nak(cx, now, psn, code),
                Syndrome::Reserved(_) => self.malformed(cx, psn),
            },
            (Some(Kind::ReadResponse), _) => self.on_read_response(cx, now, pkt, mem),
            (Some(Kind::AtomicAcknowledge), Some(a)) => {
                let orig = pkt.repr.ext.atomic_ack_eth.map_or(0, |x| x.orig_data);
                self.on_atomic_ack(cx, now, psn, a.syndrome, orig, mem);
            }
            _ => cx.counters.rx_dropped += 1,
        }
    }

    /// A response that does not fit what it answers (see `Qp::handle_malformed`, and the
    /// checks of the READ response and atomic ACK paths). One that names nothing outstanding
    /// is a ghost, dropped; otherwise the oldest outstanding request fails with BAD_RESP_ERR
    /// and the QP enters ERR (IBTA §9.9.2: a malformed or unexpected response is a
    /// requester class error, not a loss to retry).
    pub(crate) fn malformed(&mut self, cx: &mut QpContext, psn: Psn) {
        // A NAK-shaped ACKNOWLEDGE may name `nxt`, the PSN the responder expects next.
        if psn.distance(self.una) < 0 || psn.distance(self.nxt) > 0 {
            cx.counters.ghost_responses += 1;
            return;
        }
        let idx = self.locate(psn).map_or(0, |(i, _)| i);
        self.bad_response(cx, idx);
    }

    /// Fails send WQE `idx` with BAD_RESP_ERR; the QP enters ERR and the rest are flushed.
    pub(super) fn bad_response(&mut self, cx: &mut QpContext, idx: usize) {
        cx.counters.bad_responses += 1;
        cx.span()
            .in_scope(|| tracing::debug!(una = self.una.value(), idx, "bad response"));
        self.fail(cx, Some((idx, WcStatus::BadRespErr)));
    }

    /// True when `psn` names a packet sent and not yet acknowledged.
    fn outstanding(&self, psn: Psn) -> bool {
        psn.distance(self.una) >= 0 && self.nxt.distance(psn) > 0
    }

    fn take_credits(&mut self, syndrome: u8) {
        if let Syndrome::Ack { credits } = Syndrome::from_byte(syndrome) {
            self.credits = super::credits_of(credits).unwrap_or(u32::MAX);
        }
    }

    /// Completes every SEND/WRITE whose PSNs all come before `limit`, and moves `una` up to
    /// `limit` inside a partly acknowledged one.
    ///
    /// With placement delivery a READ or atomic at the front instead completes once every one
    /// of its responses arrived, however they were ordered, and the SEND/WRITEs after it up
    /// to the highest `limit` seen then complete too: responses are sprayed, so an
    /// acknowledgement overtaking them says nothing of their loss.
    fn ack_through(&mut self, cx: &mut QpContext, now: u64, limit: Psn) -> Acked {
        let mut moved = false;
        let mut progressed = false;
        let limit = match self.responses.as_mut() {
            Some(r) => {
                let before = r.acknowledged(self.una);
                let after = r.acknowledged(limit);
                progressed = after != before;
                after
            }
            None => limit,
        };
        while self.assigned > 0 {
            let w = &self.sq[0];
            if w.op.is_read_or_atomic() {
                let Some(r) = self.responses.as_ref() else {
                    if self.una.before(limit) {
                        return Acked::ImpliedNak;
                    }
                    break;
                };
                let end = w.last_psn().add(1);
                let una = r.arrived_through(self.una, end);
                if una != self.una {
                    self.una = una;
                    moved = true;
                }
                if una != end {
                    break;
                }
                self.retire_front(cx, |w| if w.op.is_atomic() { 8 } else { w.len });
                continue;
            }
            let last = w.last_psn();
            if last.before(limit) {
                self.una = last.add(1);
                moved = true;
                self.retire_front(cx, |w| w.len);
                continue;
            }
            if self.una.before(limit) {
                self.una = limit;
                moved = true;
            }
            break;
        }
        if moved {
            self.on_progress(cx, now);
        } else if progressed {
            // Not our doing that nothing completed: a response is missing, which its own
            // recovery handles. The retry budget is for a responder that stopped answering.
            self.retries_left = cx.attr.retry_cnt;
        }
        Acked::Ok(moved || progressed)
    }

    fn on_progress(&mut self, cx: &mut QpContext, now: u64) {
        let deadline = cx.ack_deadline(now);
        if let Some(r) = self.responses.as_mut() {
            r.slide(self.una);
        }
        if let Some(s) = self.sacks.as_deref_mut() {
            s.slide(self.una);
            if s.highest.is_some_and(|h| h.before(self.una)) {
                s.highest = None;
            }
        }
        self.retries_left = cx.attr.retry_cnt;
        self.rnr_retries_left = cx.attr.rnr_retry;
        self.recovering = NOT_RECOVERING;
        let pending = self.una != self.nxt;
        self.timers
            .set_or_stop(Timer::Retry, deadline.filter(|_| pending));
        if self.cursor_psn().before(self.una) {
            let una = self.una;
            self.rewind_to(una);
        }
    }

    fn implied_nak(&mut self, cx: &mut QpContext, now: u64) {
        cx.counters.implied_nak_seq_err += 1;
        let una = self.una;
        if self.recovering == una.value() {
            return;
        }
        self.recovering = una.value();
        let r = cx.recovery.on_sequence_error(una, self.window());
        self.retransmit(cx, now, r);
        self.arm_retry(cx, now);
    }

    /// A selective acknowledgement: cumulative up to `psn`, plus which later PSNs arrived, a
    /// PSN the responder declares lost, and a path it asks to avoid.
    fn on_sack(&mut self, cx: &mut QpContext, now: u64, psn: Psn, syndrome: u8, sack: SackEthRepr) {
        cx.counters.sacks_received += 1;
        if self.outstanding(psn) {
            self.take_credits(syndrome);
            if let Acked::ImpliedNak = self.ack_through(cx, now, psn.add(1)) {
                self.implied_nak(cx, now);
            }
        } else if psn.before(self.una) && psn.distance(self.una) > -(1 << 22) {
            self.take_credits(syndrome);
        }
        let (una, nxt) = (self.una, self.nxt);
        let Some(s) = self.sacks.as_deref_mut() else {
            return;
        };
        let base = sack.base;
        for i in 0..SackEthRepr::SPAN {
            if !sack.has(i) {
                continue;
            }
            let p = base.add(1 + i);
            // Outstanding: in `[una, nxt)`.
            if p.distance(una) >= 0 && nxt.distance(p) > 0 {
                s.ring.set(p);
                if s.highest.is_none_or(|h| h.before(p)) {
                    s.highest = Some(p);
                }
            }
        }
        if sack.flags & SackEthRepr::LOST != 0 {
            cx.counters.loss_reports_received += 1;
            cx.span()
                .in_scope(|| tracing::debug!(psn = sack.lost.value(), "loss report"));
            // The responder cannot tell a READ's response PSNs from requests it never saw
            // (it learns the READ's length only from the request): a report inside a READ
            // is about responses, which the requester judges itself.
            let inside_read = self
                .locate(sack.lost)
                .is_some_and(|(i, pkt)| self.sq[i].op == WrOpcode::Read && pkt > 0);
            if !inside_read {
                self.push_rtx(sack.lost);
                self.report_acks(cx, now);
                cx.congestion.on_loss(now, Loss::Selective);
            }
            self.arm_retry_if_idle(cx, now);
        }
        if sack.flags & SackEthRepr::AVOID != 0 {
            cx.counters.path_avoidances += 1;
            cx.path.avoid(u16::from(sack.path));
        }
    }

    fn on_ack(&mut self, cx: &mut QpContext, now: u64, psn: Psn, credits: u8) {
        if !self.outstanding(psn) {
            // Stale (an older ACK overtaken by a newer one) or for nothing we sent.
            if psn.before(self.una) && psn.distance(self.una) > -(1 << 22) {
                self.credits = super::credits_of(credits).unwrap_or(u32::MAX);
            } else {
                cx.counters.ghost_responses += 1;
            }
            return;
        }
        self.credits = super::credits_of(credits).unwrap_or(u32::MAX);
        if let Acked::ImpliedNak = self.ack_through(cx, now, psn.add(1)) {
            self.implied_nak(cx, now);
        }
    }

    /// True for a NAK naming a PSN an acknowledgement already passed: it left the
    /// responder before that acknowledgement and overtook nothing but its own path, so what it
    /// says (the responder expected this PSN then) is out of date. With placement `una` can
    /// stay behind acknowledged PSNs (a READ whose responses are missing holds it), so the
    /// highest acknowledgement is what tells; without placement it is `una`.
    fn stale_nak(&self, psn: Psn) -> bool {
        let acked = self.responses.as_ref().map_or(self.una, |r| r.acked());
        psn.before(acked)
    }

    fn on_rnr_nak(&mut self, cx: &mut QpContext, now: u64, psn: Psn, timer: u8) {
        if !self.outstanding(psn) || self.stale_nak(psn) {
            cx.counters.ghost_responses += 1;
            return;
        }
        if let Acked::ImpliedNak = self.ack_through(cx, now, psn) {
            self.implied_nak(cx, now);
            return;
        }
        cx.counters.rnr_naks_received += 1;
        cx.span()
            .in_scope(|| tracing::debug!(psn = psn.value(), timer, "RNR NAK"));
        if cx.attr.rnr_retry != RNR_RETRY_INFINITE {
            if self.rnr_retries_left == 0 {
                cx.counters.rnr_nak_retry_err += 1;
                self.fail(cx, Some((0, WcStatus::RnrRetryExcErr)));
                return;
            }
            self.rnr_retries_left -= 1;
        }
        self.timers.set(Timer::Rnr, now + rnr_timer_ns(timer));
        self.timers.stop(Timer::Retry);
        self.rewind_to(psn);
    }

    fn on_nak(&mut self, cx: &mut QpContext, now: u64, psn: Psn, code: NakCode) {
        // A NAK names the PSN the responder expected, which may be `nxt` itself.
        if psn.distance(self.una) < 0 || psn.distance(self.nxt) > 0 {
            cx.counters.ghost_responses += 1;
            return;
        }
        let moved = match self.ack_through(cx, now, psn) {
            Acked::Ok(moved) => moved,
            Acked::ImpliedNak => {
                self.implied_nak(cx, now);
                return;
            }
        };
        match code {
            // Sprayed over paths of different delays, NAKs from before an acknowledgement
            // arrive after it; each would be taken for a new gap, resend what arrived and
            // charge `retry_cnt` (seed 2593 of the RNIC-SR exactly-once test spent all seven
            // retries on stale NAKs in 2 µs while a READ's lost response held `una`).
            NakCode::PsnSequenceError if self.stale_nak(psn) => {
                cx.counters.ghost_responses += 1;
            }
            NakCode::PsnSequenceError => {
                cx.counters.packet_seq_err += 1;
                cx.span()
                    .in_scope(|| tracing::debug!(psn = psn.value(), "PSN sequence error NAK"));
                if psn == self.nxt || self.recovering == psn.value() {
                    return;
                }
                self.recovering = psn.value();
                if !moved {
                    if self.retries_left == 0 {
                        self.fail(cx, Some((0, WcStatus::RetryExcErr)));
                        return;
                    }
                    self.retries_left -= 1;
                }
                let r = cx.recovery.on_sequence_error(psn, self.window());
                self.retransmit(cx, now, r);
                self.arm_retry(cx, now);
            }
            NakCode::InvalidRequest => {
                cx.counters.req_remote_invalid_request += 1;
                self.fail(cx, Some((0, WcStatus::RemInvReqErr)));
            }
            NakCode::RemoteAccessError => {
                cx.counters.req_remote_access_errors += 1;
                self.fail(cx, Some((0, WcStatus::RemAccessErr)));
            }
            NakCode::RemoteOperationalError => self.fail(cx, Some((0, WcStatus::RemOpErr))),
            // Invalid RD request is for Reliable Datagram; on RC it, like a reserved code,
            // is a NAK no responder may send.
            NakCode::InvalidRdRequest | NakCode::Reserved(_) => self.bad_response(cx, 0),
        }
    }

    /// The common start of READ response and atomic ACK handling: the response must name an
    /// outstanding PSN, acknowledges the SEND/WRITEs before it, and is for the front WQE.
    /// False when it was dropped or turned out to be an implied NAK.
    fn response_target(&mut self, cx: &mut QpContext, now: u64, psn: Psn) -> bool {
        if !self.outstanding(psn) {
            // Duplicates of responses already placed arrive after every READ re-issue.
            cx.counters.ghost_responses += 1;
            return false;
        }
        if let Acked::ImpliedNak = self.ack_through(cx, now, psn) {
            self.implied_nak(cx, now);
            return false;
        }
        if self.assigned == 0 {
            cx.counters.ghost_responses += 1;
            return false;
        }
        true
    }

    fn on_read_response(
        &mut self,
        cx: &mut QpContext,
        now: u64,
        pkt: &RocePacket<'_>,
        mem: &MrTable,
    ) {
        if self.responses.is_some() {
            self.place_read_response(cx, now, pkt, mem);
            return;
        }
        let psn = pkt.repr.bth.psn;
        if !self.response_target(cx, now, psn) {
            return;
        }
        let Some(w) = self.sq.front() else {
            return;
        };
        if w.op != WrOpcode::Read || !w.contains(psn) {
            // The PSN is outstanding and the WQEs before it acknowledged: it answers a
            // request that is not a READ.
            self.bad_response(cx, 0);
            return;
        }
        if psn != self.una {
            // Earlier responses of this READ are missing.
            self.implied_nak(cx, now);
            return;
        }
        let idx = psn.distance(w.first_psn) as u32;
        let is_last = idx + 1 == w.npkts;
        if !self.land_read_response(cx, 0, idx, pkt, mem, false) {
            return;
        }
        self.una = psn.add(1);
        if is_last {
            if let Some(w) = self.pop_front() {
                let len = w.len;
                cx.push_send_completion(&w, WcStatus::Success, len);
            }
        }
        self.on_progress(cx, now);
    }

    /// Checks READ response `pkt` as packet `i` of `sq[idx]` and writes its payload there;
    /// false when it was dropped or the QP failed. A re-issued READ starts its own
    /// FIRST..LAST sequence, so with `any_position` only the READ's last packet has a fixed
    /// opcode (LAST or ONLY); in order, every position is checked.
    fn land_read_response(
        &mut self,
        cx: &mut QpContext,
        idx: usize,
        i: u32,
        pkt: &RocePacket<'_>,
        mem: &MrTable,
        any_position: bool,
    ) -> bool {
        let w = &self.sq[idx];
        let off = i * cx.mtu();
        // The caller checked the opcode is a READ response.
        let pos = pkt.repr.bth.opcode.position();
        let fits = if i + 1 == w.npkts {
            matches!(pos, Some(Position::Last | Position::Only))
                && pkt.payload.len() as u32 == w.len - off.min(w.len)
        } else {
            let position_ok =
                any_position || matches!(pos, Some(Position::First | Position::Middle));
            position_ok && pkt.payload.len() as u32 == cx.mtu()
        };
        // FIRST, LAST and ONLY carry an AETH, which must say ACK: a responder refuses a
        // READ with an ACKNOWLEDGE packet, never inside the response stream.
        let aeth_ok = pkt.repr.ext.aeth.is_none_or(|a| is_ack(a.syndrome));
        if !fits || !aeth_ok {
            self.bad_response(cx, idx);
            return false;
        }
        let placed = match &w.data {
            WqeData::Sges(s) => sg::scatter(mem, cx.pd, s, u64::from(off), pkt.payload),
            WqeData::Inline(_) => Err(sg::SgError::Length),
        };
        if let Some(a) = pkt.repr.ext.aeth {
            self.take_credits(a.syndrome);
        }
        if placed.is_err() {
            self.fail(cx, Some((0, WcStatus::LocProtErr)));
            return false;
        }
        true
    }

    fn on_atomic_ack(
        &mut self,
        cx: &mut QpContext,
        now: u64,
        psn: Psn,
        syndrome: u8,
        orig: u64,
        mem: &MrTable,
    ) {
        if self.responses.is_some() {
            self.place_atomic_ack(cx, now, psn, syndrome, orig, mem);
            return;
        }
        if !self.response_target(cx, now, psn) {
            return;
        }
        let Some(w) = self.sq.front() else {
            return;
        };
        if !w.op.is_atomic() || w.first_psn != psn || !is_ack(syndrome) {
            self.bad_response(cx, 0);
            return;
        }
        let placed = match &w.data {
            WqeData::Sges(s) => sg::scatter(mem, cx.pd, s, 0, &orig.to_ne_bytes()),
            WqeData::Inline(_) => Err(sg::SgError::Length),
        };
        if placed.is_err() {
            self.fail(cx, Some((0, WcStatus::LocProtErr)));
            return;
        }
        self.take_credits(syndrome);
        self.una = psn.add(1);
        if let Some(w) = self.pop_front() {
            cx.push_send_completion(&w, WcStatus::Success, 8);
        }
        self.on_progress(cx, now);
    }

    pub(crate) fn on_timeout(&mut self, cx: &mut QpContext, now: u64) {
        for t in [Timer::Rnr, Timer::Pace] {
            if self.timers.expired(t, now) {
                self.timers.stop(t);
            }
        }
        if !self.timers.expired(Timer::Retry, now) {
            return;
        }
        if self.una == self.nxt {
            self.timers.stop(Timer::Retry);
            return;
        }
        cx.counters.local_ack_timeout_err += 1;
        let (una, left) = (self.una.value(), self.retries_left);
        cx.span()
            .in_scope(|| tracing::debug!(una, retries_left = left, "local ACK timeout"));
        if self.retries_left == 0 {
            self.fail(cx, Some((0, WcStatus::RetryExcErr)));
            return;
        }
        self.retries_left -= 1;
        self.recovering = NOT_RECOVERING;
        cx.congestion.on_timeout(now);
        let r = cx.recovery.on_timeout(self.window());
        self.retransmit(cx, now, r);
        self.arm_retry(cx, now);
    }
}

/// True for an AETH syndrome that says ACK (the only one a READ response or atomic ACK may
/// carry).
pub(super) fn is_ack(syndrome: u8) -> bool {
    matches!(Syndrome::from_byte(syndrome), Syndrome::Ack { .. })
}
