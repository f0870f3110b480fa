//! Placement of READ responses and atomic ACKs at the requester, for the delivery modes beside
//! Go-Back-N ([`Delivery::Placement`](crate::transport::recovery::Delivery)).
//!
//! A placing responder sprays READ responses over the paths as the requester sprays requests,
//! so they arrive in any order. Each response says where it lands (its PSN's offset in the
//! READ), so it is written on arrival; `una` then advances over every contiguous arrival and
//! a READ completes once all of its responses are in. A gap is not an implied NAK here: the
//! policy decides from the arrivals when a response is lost
//! ([`Recovery::on_response_arrival`](crate::transport::recovery::Recovery::on_response_arrival)),
//! and the READ is re-issued for that one PSN; the timer re-issues every gap.

use std::collections::VecDeque;

use super::{Acked, PsnRing, QpContext, Requester, WqeData};
use crate::transport::mr::MrTable;
use crate::transport::recovery::{Arrivals, LossReport};
use crate::transport::sg;
use crate::transport::wr::{WcStatus, WrOpcode};
use crate::wire::{Psn, RocePacket};

/// PSNs past `una` the requester accepts responses for, at least (the send window, if wider,
/// takes over). A READ can span far more PSNs than the window, and its responses stream at
/// line rate while a loss is found and repaired; what arrives beyond this is dropped and
/// asked for again.
pub(crate) const RESPONSE_SPAN: u32 = 4096;

/// Responses that arrived ahead of `una`, and what was asked for again.
#[derive(Debug)]
pub(crate) struct Responses {
    arrived: PsnRing,
    /// PSNs found lost and asked for again (so each is asked for once until the timer).
    reported: PsnRing,
    /// Bits are valid from here (`una` when last slid).
    floor: Psn,
    /// The highest PSN an acknowledgement reached (exclusive): SEND/WRITEs before it complete
    /// once the READs and atomics before them have all their responses.
    acked: Psn,
    /// The highest response PSN that arrived.
    highest: Option<Psn>,
    /// Single responses to ask for again.
    rereads: VecDeque<Psn>,
}

impl Responses {
    pub(crate) fn new(window: u32, psn: Psn) -> Self {
        let capacity = window.clamp(RESPONSE_SPAN, 1 << 16);
        Self {
            arrived: PsnRing::with_capacity(capacity),
            reported: PsnRing::with_capacity(capacity),
            floor: psn,
            acked: psn,
            highest: None,
            rereads: VecDeque::new(),
        }
    }

    /// Forgets everything in flight; the next PSN is `psn`.
    pub(crate) fn reset(&mut self, psn: Psn) {
        self.arrived.clear_all();
        self.reported.clear_all();
        self.floor = psn;
        self.acked = psn;
        self.highest = None;
        self.rereads.clear();
    }

    fn inside(&self, psn: Psn) -> bool {
        let d = psn.distance(self.floor);
        d >= 0 && (d as u32) < self.arrived.capacity()
    }

    pub(crate) fn arrived(&self, psn: Psn) -> bool {
        self.inside(psn) && self.arrived.get(psn)
    }

    fn reported(&self, psn: Psn) -> bool {
        self.inside(psn) && self.reported.get(psn)
    }

    pub(crate) fn has_rereads(&self) -> bool {
        !self.rereads.is_empty()
    }

    pub(crate) fn next_reread(&mut self) -> Option<Psn> {
        self.rereads.pop_front()
    }

    /// The highest PSN acknowledgements reached (exclusive).
    pub(crate) fn acked(&self) -> Psn {
        self.acked
    }

    /// Records that acknowledgements reached `limit`; returns the highest they reached.
    pub(crate) fn acknowledged(&mut self, limit: Psn) -> Psn {
        if self.acked.before(limit) {
            self.acked = limit;
        }
        self.acked
    }

    /// The first PSN from `una` on, short of `end`, whose response has not arrived.
    pub(crate) fn arrived_through(&self, una: Psn, end: Psn) -> Psn {
        let mut p = una;
        while p != end && self.arrived(p) {
            p = p.add(1);
        }
        p
    }

    /// `una` moved to `una`: bits behind it are cleared for the PSNs the ring will stand for
    /// next.
    pub(crate) fn slide(&mut self, una: Psn) {
        let floor = self.floor;
        self.arrived.clear_range(floor, una);
        self.reported.clear_range(floor, una);
        self.floor = una;
        if self.acked.before(una) {
            self.acked = una;
        }
        if self.highest.is_some_and(|h| h.before(una)) {
            self.highest = None;
        }
    }

    /// How many PSNs from `psn` (at most `left`) are missing in a row: the run a re-issued
    /// READ asks for. Past the last arrival, that is all the rest.
    pub(crate) fn missing_run(&self, psn: Psn, left: u32) -> u32 {
        if self.highest.is_none_or(|h| !psn.before(h)) {
            return left;
        }
        let mut n = 1;
        while n < left && !self.arrived(psn.add(n)) {
            n += 1;
        }
        n
    }

    /// Where each gap after `una` starts, up to just past the highest arrival.
    pub(crate) fn gap_starts(&self, una: Psn) -> impl Iterator<Item = Psn> + '_ {
        let n = self
            .highest
            .map_or(0, |h| h.distance(una).max(0) as u32 + 1);
        (1..=n)
            .map(move |i| una.add(i))
            .filter(|&p| !self.arrived(p) && self.arrived(p.sub(1)))
    }
}

/// The arrivals a policy reads at the requester: PSNs that carry no response (SEND and
/// WRITE packets) count as arrived, so they are never reported lost.
struct View<'a> {
    req: &'a Requester,
    r: &'a Responses,
}

impl Arrivals for View<'_> {
    fn epsn(&self) -> Psn {
        self.req.una
    }
    fn arrived(&self, psn: Psn) -> bool {
        self.r.arrived(psn)
            || self
                .req
                .locate(psn)
                .is_none_or(|(i, _)| !self.req.sq[i].op.is_read_or_atomic())
    }
    fn reported(&self, psn: Psn) -> bool {
        self.r.reported(psn)
    }
    fn ahead(&self, psn: Psn) -> u32 {
        self.r.arrived.count(self.req.una.add(1), psn.add(1))
    }
}

impl Requester {
    /// Checks that response `psn` is for an outstanding READ or atomic whose response has not
    /// arrived and that the ring can hold, and acknowledges what the responder executed
    /// before it. The WQE index and packet within it, or `None` when it was dropped.
    fn response_slot(
        &mut self,
        cx: &mut QpContext,
        now: u64,
        psn: Psn,
        read: bool,
    ) -> Option<(usize, u32)> {
        let Some((idx, _)) = self.locate(psn) else {
            cx.counters.ghost_responses += 1;
            return None;
        };
        // The responder executes in PSN order: everything before this WQE was executed.
        // (With placement, acknowledging never finds an implied NAK.)
        let first = self.sq[idx].first_psn;
        let _: Acked = self.ack_through(cx, now, first);
        let Some((idx, pkt)) = self.locate(psn) else {
            // Completed by what the acknowledgement found: a duplicate.
            cx.counters.ghost_responses += 1;
            return None;
        };
        let op = self.sq[idx].op;
        let fits = if read {
            op == WrOpcode::Read
        } else {
            op.is_atomic()
        };
        if !fits {
            // An outstanding PSN of a request this response cannot answer.
            self.bad_response(cx, idx);
            return None;
        }
        let r = self.responses.as_deref()?;
        if r.arrived(psn) {
            cx.counters.ghost_responses += 1;
            return None;
        }
        if !r.inside(psn) {
            // Too far ahead of `una`: asked for again once `una` gets near.
            cx.counters.out_of_sequence += 1;
            cx.counters.rx_dropped += 1;
            return None;
        }
        Some((idx, pkt))
    }

    /// A READ response with placement delivery: written where its PSN says, in any order.
    pub(super) fn place_read_response(
        &mut self,
        cx: &mut QpContext,
        now: u64,
        pkt: &RocePacket<'_>,
        mem: &MrTable,
    ) {
        let psn = pkt.repr.bth.psn;
        let Some((idx, i)) = self.response_slot(cx, now, psn, true) else {
            return;
        };
        if !self.land_read_response(cx, idx, i, pkt, mem, true) {
            return;
        }
        self.response_arrived(cx, now, psn, pkt.repr.udp_src_port);
    }

    /// An atomic ACK with placement delivery: its original value lands at once, and the
    /// atomic completes in its turn.
    pub(super) fn place_atomic_ack(
        &mut self,
        cx: &mut QpContext,
        now: u64,
        psn: Psn,
        syndrome: u8,
        orig: u64,
        mem: &MrTable,
    ) {
        let Some((idx, _)) = self.response_slot(cx, now, psn, false) else {
            return;
        };
        if !super::is_ack(syndrome) {
            self.bad_response(cx, idx);
            return;
        }
        let placed = match &self.sq[idx].data {
            WqeData::Sges(s) => sg::scatter(mem, cx.pd, s, 0, &orig.to_ne_bytes()),
            WqeData::Inline(_) => Err(sg::SgError::Length),
        };
        if placed.is_err() {
            self.fail(cx, Some((0, WcStatus::LocProtErr)));
            return;
        }
        self.take_credits(syndrome);
        // Atomic ACKs keep the QP's own path: they tell nothing of the sprayed ones.
        self.response_arrived(cx, now, psn, cx.template.udp_src_port());
    }

    /// Records response `psn` (from `udp_src_port`), lets the policy find losses, and
    /// completes whatever is now whole.
    fn response_arrived(&mut self, cx: &mut QpContext, now: u64, psn: Psn, udp_src_port: u16) {
        let Some(r) = self.responses.as_deref_mut() else {
            return;
        };
        r.arrived.set(psn);
        if r.highest.is_none_or(|h| h.before(psn)) {
            r.highest = Some(psn);
        }
        if psn != self.una {
            cx.counters.ooo_responses_placed += 1;
        }
        let mut report = LossReport::default();
        if let Some(r) = self.responses.as_deref() {
            let view = View { req: self, r };
            cx.recovery
                .on_response_arrival(psn, udp_src_port, cx.path.get(), &view, &mut report);
        }
        if let Some(r) = self.responses.as_deref_mut() {
            for &lost in &report.lost {
                if r.inside(lost) && !r.reported.get(lost) {
                    r.reported.set(lost);
                    r.rereads.push_back(lost);
                    cx.counters.response_losses_detected += 1;
                }
            }
        }
        if !report.lost.is_empty() {
            self.arm_retry_if_idle(cx, now);
        }
        let una = self.una;
        let _: Acked = self.ack_through(cx, now, una);
    }
}
