//! Direct data placement at the responder, for the delivery modes beside Go-Back-N
//! ([`Delivery::Placement`]): a WRITE packet lands in memory when it arrives, in whatever
//! order (it carries its own placement), other requests that arrive early are held until the
//! expected PSN reaches them, and the expected PSN advances over every contiguous arrival,
//! completing messages in order. What the requester hears about early arrivals is the
//! policy's [`Feedback`]: nothing, one NAK per expected PSN (RNIC-SR), or selective
//! acknowledgements with loss reports decided by the policy (ferroce's selective repeat).

use super::*;

impl Responder {
    /// A request packet on an RC QP whose responder places.
    pub(super) fn placing_rx(
        &mut self,
        cx: &mut QpContext,
        pkt: &RocePacket<'_>,
        mem: &mut MrTable,
    ) {
        let psn = pkt.repr.bth.psn;
        let epsn = self.epsn;
        let d = psn.distance(epsn);
        if d < 0 {
            self.duplicate(cx, pkt, mem);
            return;
        }
        let Some(ooo) = self.ooo.as_ref() else {
            return;
        };
        if d as u32 >= ooo.arrived.capacity() {
            // Beyond what the bitmap can hold: the requester's window is wider than ours.
            cx.counters.out_of_sequence += 1;
            cx.counters.rx_dropped += 1;
            return;
        }
        if d > 0 && ooo.arrived.get(psn) {
            cx.counters.duplicate_request += 1;
            self.ack_pending = true;
            return;
        }
        if d > 0 {
            cx.counters.out_of_sequence += 1;
        }
        // Whether the expected PSN moves past this packet only in the drain below.
        let drained_itself = d == 0 && pkt.repr.bth.opcode.is_selective_repeat();
        if pkt.repr.bth.opcode.is_selective_repeat() {
            match self.place_write(cx, pkt, mem) {
                Ok(end) => {
                    if let Some(o) = self.ooo.as_mut() {
                        o.arrived.set(psn);
                        if let Some(e) = end {
                            o.ends.insert(psn.value(), e);
                        }
                    }
                    if d > 0 {
                        cx.counters.ooo_placed += 1;
                    }
                    if pkt.repr.bth.ack_req {
                        self.ack_pending = true;
                    }
                }
                // In its turn: refused now, as in order.
                Err(f) if d == 0 => {
                    self.fault(cx, psn, f);
                    return;
                }
                // Early and refused: refused in its turn, after everything before it.
                Err(_) => {
                    if !self.hold(cx, pkt) {
                        return;
                    }
                }
            }
        } else if d == 0 {
            self.nak_outstanding = false;
            if let Err(f) = self.execute(cx, pkt, mem) {
                self.fault(cx, psn, f);
                return;
            }
        } else if !self.hold(cx, pkt) {
            return;
        }
        let before = self.epsn;
        self.drain(cx, mem);
        if self.epsn.distance(before) > i32::from(drained_itself) {
            // A hole filled and the expected PSN moved over early arrivals: tell the
            // requester how far it now reaches (a READ's responses, which acknowledge what
            // came before it, say nothing of what came after).
            self.ack_pending = true;
        }
        self.feedback(cx, psn, d > 0, pkt.repr.udp_src_port);
    }

    /// Keeps an early request for its turn; false when the buffer is full and it was dropped
    /// (the requester resends it).
    fn hold(&mut self, cx: &mut QpContext, pkt: &RocePacket<'_>) -> bool {
        let psn = pkt.repr.bth.psn;
        let Some(o) = self.ooo.as_mut() else {
            return false;
        };
        if o.held.len() >= HELD_MAX {
            cx.counters.rx_dropped += 1;
            return false;
        }
        o.held.insert(
            psn.value(),
            Held {
                repr: pkt.repr,
                payload: pkt.payload.to_vec(),
            },
        );
        o.arrived.set(psn);
        cx.counters.ooo_held += 1;
        true
    }

    /// Checks one WRITE packet that carries its placement and writes it. Returns what its
    /// message owes at completion when it is the last packet.
    fn place_write(
        &mut self,
        cx: &mut QpContext,
        pkt: &RocePacket<'_>,
        mem: &mut MrTable,
    ) -> Result<Option<WriteEnd>, Fault> {
        let Some(reth) = pkt.repr.ext.reth else {
            return Err(Fault::Fatal(NakCode::InvalidRequest, None));
        };
        if !cx.attr.qp_access_flags.contains(Access::REMOTE_WRITE) {
            return Err(Fault::Fatal(NakCode::InvalidRequest, None));
        }
        let pos = pkt.repr.bth.opcode.position().unwrap_or(Position::Only);
        let plen = pkt.payload.len() as u32;
        let len_ok = match pos {
            Position::First | Position::Middle => plen == cx.mtu() && reth.dma_len > cx.mtu(),
            Position::Last => plen > 0 && plen <= cx.mtu() && reth.dma_len > cx.mtu(),
            Position::Only => plen <= cx.mtu() && reth.dma_len == plen,
        };
        if !len_ok || reth.dma_len > 1 << 31 {
            cx.counters.resp_local_length_error += 1;
            return Err(Fault::Fatal(NakCode::InvalidRequest, None));
        }
        let allowed = if mem.window_allows(reth.rkey, cx.qpn.value()) {
            Ok(())
        } else {
            Err(crate::transport::mr::AccessError::InvalidKey(reth.rkey))
        };
        let placed = allowed
            .and_then(|_| {
                mem.check_access(
                    reth.rkey,
                    cx.pd,
                    reth.va,
                    u64::from(plen),
                    Access::REMOTE_WRITE,
                )
            })
            .and_then(|_| mem.write(reth.rkey, cx.pd, reth.va, pkt.payload, Access::REMOTE_WRITE));
        if placed.is_err() {
            cx.counters.resp_remote_access_errors += 1;
            return Err(Fault::Fatal(NakCode::RemoteAccessError, None));
        }
        Ok(
            matches!(pos, Position::Last | Position::Only).then(|| WriteEnd {
                imm: pkt.repr.ext.imm_dt.map(|i| i.imm),
                len: reth.dma_len,
                solicited: pkt.repr.bth.solicited,
            }),
        )
    }

    /// Advances the expected PSN over every arrival in a row: completes WRITE messages whose
    /// last packet it passes, and executes held requests in their turn.
    fn drain(&mut self, cx: &mut QpContext, mem: &mut MrTable) {
        loop {
            let epsn = self.epsn;
            let Some(o) = self.ooo.as_mut() else {
                return;
            };
            if let Some(h) = o.held.remove(&epsn.value()) {
                o.arrived.clear(epsn);
                let pkt = RocePacket {
                    repr: h.repr,
                    payload: &h.payload,
                    icrc_input: &[],
                    icrc: 0,
                };
                self.nak_outstanding = false;
                if pkt.repr.bth.opcode.is_selective_repeat() {
                    // A WRITE refused when it came early is refused now, in order.
                    match self.place_write(cx, &pkt, mem) {
                        Ok(end) => {
                            if let Some(o) = self.ooo.as_mut() {
                                o.arrived.set(epsn);
                                if let Some(e) = end {
                                    o.ends.insert(epsn.value(), e);
                                }
                            }
                            continue;
                        }
                        Err(f) => {
                            self.fault(cx, epsn, f);
                            return;
                        }
                    }
                }
                if let Err(f) = self.execute(cx, &pkt, mem) {
                    self.fault(cx, epsn, f);
                    return;
                }
                continue;
            }
            if !o.arrived.get(epsn) {
                return;
            }
            o.arrived.clear(epsn);
            o.reported.clear(epsn);
            if let Some(end) = o.ends.remove(&epsn.value()) {
                if !self.complete_write(cx, epsn, end) {
                    return;
                }
            }
            self.epsn = epsn.add(1);
            self.nak_outstanding = false;
        }
    }

    /// Completes a WRITE message whose packets have all arrived; false when a WRITE with
    /// immediate finds no receive (RNR NAK: the requester resends its last packet later,
    /// which lands on the same bytes again).
    fn complete_write(&mut self, cx: &mut QpContext, psn: Psn, end: WriteEnd) -> bool {
        if let Some(imm) = end.imm {
            let Some(w) = self.take_recv() else {
                cx.counters.out_of_buffer += 1;
                self.nak_rnr(cx.attr.min_rnr_timer, psn);
                return false;
            };
            let mut wc = WorkCompletion::new(
                w.wr_id,
                WcStatus::Success,
                WcOpcode::RecvRdmaWithImm,
                cx.qpn,
            );
            wc.byte_len = end.len;
            wc.imm_data = imm;
            wc.wc_flags = WcFlags::WITH_IMM;
            wc.solicited = end.solicited;
            cx.completions.push_back(wc);
        }
        self.msn = self.msn.next();
        cx.counters.rx_write_requests += 1;
        true
    }

    /// What the requester hears about an arrival, by the policy's feedback.
    fn feedback(&mut self, cx: &mut QpContext, psn: Psn, early: bool, udp_src_port: u16) {
        let Some(feedback) = self.ooo.as_ref().map(|o| o.feedback) else {
            return;
        };
        match feedback {
            Feedback::AckOnly => {}
            Feedback::NakExpected => {
                if early && !self.nak_outstanding && cx.state != QpState::Err {
                    let epsn = self.epsn;
                    self.nak_sequence(epsn);
                }
            }
            Feedback::Selective => {
                let Some(o) = self.ooo.as_mut() else {
                    return;
                };
                let mut report = LossReport::default();
                let view = View {
                    epsn: self.epsn,
                    ooo: o,
                };
                cx.recovery
                    .on_arrival(psn, udp_src_port, cx.path.get(), &view, &mut report);
                let epsn = self.epsn;
                for lost in report.lost {
                    let d = lost.distance(epsn);
                    let inside = d >= 0 && (d as u32) < o.arrived.capacity();
                    if inside && !o.arrived.get(lost) && !o.reported.get(lost) {
                        o.reported.set(lost);
                        o.lost.push_back(lost);
                    }
                }
                if report.avoid.is_some() {
                    o.avoid = report.avoid;
                }
            }
        }
    }

    /// Selective feedback: the next `SR_ACKNOWLEDGE`, when an ACK is due or a loss report or
    /// avoidance signal waits.
    pub(super) fn emit_sack<'m>(
        &mut self,
        cx: &mut QpContext,
        buf: &mut [u8],
    ) -> Option<TxOut<'m>> {
        let epsn = self.epsn;
        let credits = self.credits();
        let o = self.ooo.as_mut()?;
        if !self.ack_pending && o.lost.is_empty() && o.avoid.is_none() {
            return None;
        }
        let mut sack = SackEthRepr {
            base: epsn,
            ..SackEthRepr::default()
        };
        for i in 0..SackEthRepr::SPAN.min(o.arrived.capacity().saturating_sub(1)) {
            if o.arrived.get(epsn.add(1 + i)) {
                sack.set(i);
            }
        }
        if let Some(lost) = o.lost.pop_front() {
            sack.flags |= SackEthRepr::LOST;
            sack.lost = lost;
            cx.counters.loss_reports_sent += 1;
        }
        if let Some(path) = o.avoid.take() {
            sack.flags |= SackEthRepr::AVOID;
            sack.path = path;
        }
        self.ack_pending = false;
        cx.counters.acks_sent += 1;
        let ext = ExtHeaders {
            aeth: Some(AethRepr {
                syndrome: Syndrome::Ack { credits }.to_byte(),
                msn: self.msn,
            }),
            sack_eth: Some(sack),
            ..ExtHeaders::default()
        };
        let fields = cx.fields(Opcode::SR_ACKNOWLEDGE, epsn.sub(1));
        cx.template
            .image()
            .emit(buf, &fields, &ext, 0, |_| {})
            .ok()
            .map(TxOut::Whole)
    }
}
