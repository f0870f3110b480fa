//! The poll-mode engine of one device: a port, its QPs, the device's registered memory and a
//! timer wheel. One call to [`Engine::poll`] is one turn of the loop: take posted work from
//! the lock-free inboxes, receive a burst and hand each packet to its QP, run due timers,
//! let every QP with something to say transmit, flush the burst, and move completions to their
//! CQs. The engine never blocks; who calls `poll` (the application thread, run-to-completion,
//! or the engine thread) is the verbs layer's choice.

use ferroce_drivers::Port;
use ferroce_stack::transport::{Endpoint, Received, TxOut};
use ferroce_stack::wire::mad::GSI_QPN;
use ferroce_stack::wire::{Checks, RoceRepr};

use self::core::steer_raw;

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
        /// Frames sent to the port's own address, handed to a QP of this process without
        /// leaving (loopback).
        tx_looped,
        /// Frames that reached this engine by loopback.
        rx_looped,
        /// Frames a flow rule steered to a raw packet QP.
        rx_raw,
        /// Frames raw packet QPs sent.
        tx_raw,
        /// Frames to the port's own address for a QP number no QP of this process has.
        tx_looped_unknown_qp,
        /// Times the engine thread slept, idle, on the port's descriptor.
        engine_sleeps,
        /// Sleeps that ran to their longest allowed length although work waited: something
        /// that needed the engine did not wake it. Zero unless a wakeup is missing.
        engine_missed_wakeups,
    }
}

mod core;
pub(crate) mod gsi;
pub(crate) mod looped;
mod mailbox;
pub mod raw;
mod shared;
mod steer;

pub use self::core::EngineCore;
pub(crate) use mailbox::Mailbox;
pub(crate) use shared::{state_code, ChannelShared, CqShared, Op, OwnedSend, QpShared};
pub(crate) use steer::{QpEngines, Steer};

/// The engine of one device over port `P`: the port (or the ports, of a multi-port device:
/// a QP sends on its active one, and frames are taken from all), and the QPs, memory and
/// timers it serves ([`EngineCore`], which the engine dereferences to).
pub struct Engine<P> {
    ports: Vec<P>,
    /// Each port's MAC: a frame to it loops back when the engine has a loopback inbox.
    macs: Vec<[u8; 6]>,
    core: EngineCore,
    /// When the ports' links were last looked at (each one's state as last seen is the
    /// endpoint's).
    links_seen_at: u64,
}

/// How often a multi-port engine on the real clock reads its ports' link state (a system
/// call per port on AF_PACKET, a register read on DPDK): the delay with which a carrier
/// change reaches the QPs, well inside the 50 µs failover budget's slack for a local fault.
const LINK_POLL_NS: u64 = 20_000;

/// How often a single-port engine on the real clock reads its port's link state: only the
/// port events a program may wait for (`IBV_EVENT_PORT_ACTIVE` / `PORT_ERR`) depend on it,
/// so a system call every few milliseconds is enough.
const LINK_POLL_SINGLE_NS: u64 = 5_000_000;

impl<P> std::ops::Deref for Engine<P> {
    type Target = EngineCore;
    fn deref(&self) -> &EngineCore {
        &self.core
    }
}

impl<P> std::ops::DerefMut for Engine<P> {
    fn deref_mut(&mut self) -> &mut EngineCore {
        &mut self.core
    }
}

impl<P: Port> Engine<P> {
    /// An engine over `port`, with memory keys derived from `key_seed`.
    pub fn new(port: P, key_seed: u64) -> Self {
        Self::with_ports(vec![port], key_seed)
    }

    /// An engine over several ports of one device (port 1 first): QPs with an alternate
    /// path send on their active port, and each port's link changes reach every QP
    /// ([`Qp::on_port_event`](ferroce_stack::transport::Qp::on_port_event)). The first
    /// port's clock is the engine's; checks and in-place sends are the weakest port's.
    ///
    /// # Panics
    /// With no port.
    pub fn with_ports(ports: Vec<P>, key_seed: u64) -> Self {
        assert!(!ports.is_empty(), "an engine needs a port");
        let mut checks = Checks::NONE;
        let mut split_min = 0usize;
        for p in &ports {
            let c = p.capabilities();
            checks.icrc |= c.rx_checks.icrc;
            checks.ipv4_checksum |= c.rx_checks.ipv4_checksum;
            split_min = split_min.max(c.tx_split_min.unwrap_or(usize::MAX));
        }
        let links = ports
            .iter()
            .map(|p| p.link_state() == ferroce_drivers::LinkState::Up)
            .collect();
        let core = EngineCore::new(ports[0].now_ns(), key_seed, checks, split_min, links);
        let macs = ports.iter().map(|p| p.mac().0).collect();
        Self {
            ports,
            macs,
            core,
            links_seen_at: 0,
        }
    }

    /// The port (port 1 of a multi-port engine).
    pub fn port(&self) -> &P {
        &self.ports[0]
    }

    /// The port, mutably (to finish a pcap tee, say).
    pub fn port_mut(&mut self) -> &mut P {
        &mut self.ports[0]
    }

    /// Every port, port 1 first.
    pub fn ports(&self) -> &[P] {
        &self.ports
    }

    /// Every port, mutably.
    pub fn ports_mut(&mut self) -> &mut [P] {
        &mut self.ports
    }

    /// The port's clock.
    pub fn now(&self) -> u64 {
        self.ports[0].now_ns()
    }

    /// The engine looks at its ports' links (on the real clock every [`LINK_POLL_NS`] with
    /// several ports, every [`LINK_POLL_SINGLE_NS`] with one; on a simulated clock at every
    /// new instant) and tells every QP, and the device's event handler, of a change.
    fn watch_links(&mut self, now: u64) -> usize {
        // A simulated link changes only when virtual time moves, which it does only between
        // idle turns: once per new instant is enough.
        let real = self.core.clock_stride > 1;
        let every = if self.ports.len() > 1 {
            LINK_POLL_NS
        } else {
            LINK_POLL_SINGLE_NS
        };
        let due = if real {
            now.saturating_sub(self.links_seen_at) >= every
        } else {
            now != self.links_seen_at
        };
        if !due {
            return 0;
        }
        self.links_seen_at = now;
        let mut work = 0;
        for (i, port) in self.ports.iter().enumerate() {
            let up = port.link_state() == ferroce_drivers::LinkState::Up;
            if self.core.port_event(now, i as u8, up) {
                tracing::info!(port = i + 1, up, "link change");
                work += 1;
            }
        }
        work
    }

    /// Sends what raw packet QPs queued: each frame on the QP's port, and, when it is to a
    /// multicast or broadcast address or to the port's own, to the process's raw QPs on the
    /// port as well (a frame to the port's own MAC does not leave).
    fn transmit_raw(&mut self, now: u64) -> usize {
        self.core.raw_pending = false;
        let mut work = 0;
        let looping = self.core.looped.is_some();
        let EngineCore { raws, counters, .. } = &mut self.core;
        for raw in raws.values_mut() {
            if !raw.has_sends() {
                continue;
            }
            let pi = usize::from(raw.port()).min(self.ports.len() - 1);
            let mac = self.macs[pi];
            let sends: Vec<_> = raw.take_sends().collect();
            for (wr_id, signaled, frame) in sends {
                work += 1;
                let multicast = frame[0] & 1 != 0;
                let own = frame[..6] == mac;
                if looping && (multicast || own) {
                    looped::deliver_raw(mac, &frame);
                }
                let ok = own
                    || self.ports[pi]
                        .tx(frame.len(), |b| b.copy_from_slice(&frame))
                        .is_ok();
                counters.tx_raw += 1;
                if signaled || !ok {
                    raw.complete_send(wr_id, ok, frame.len(), now);
                }
            }
        }
        work
    }

    /// One turn of the loop. Returns how many things happened (frames received and sent,
    /// WRs taken, timers run), so a caller can back off when it is zero.
    pub fn poll(&mut self) -> usize {
        if self.core.idle_turns.is_multiple_of(self.core.clock_stride) {
            self.core.now = self.ports[0].now_ns();
        }
        let now = self.core.now;
        let mut work = self.watch_links(now);

        // 1. Posted work.
        while let Some(qpn) = self.core.doorbells.pop() {
            let Endpoint { qps, mem, .. } = &mut self.core.ep;
            let Some(slot) = qps.get_mut(qpn) else {
                continue;
            };
            work += EngineCore::take_posted(slot, mem, now);
            if !slot.active {
                slot.active = true;
                self.core.active.push(qpn);
            }
        }

        // 2. Receive: frames other engines forwarded, then a burst from each port.
        let EngineCore {
            ep,
            active,
            counters,
            checks,
            steer,
            looped,
            raws,
            flows,
            gsi,
            ..
        } = &mut self.core;
        let checks = *checks;
        if let Some(lb) = looped.as_ref() {
            let mut n = 0;
            while n < RX_BURST {
                let Some((buf, raw)) = lb.pop() else { break };
                n += 1;
                counters.rx_looped += 1;
                if !flows.is_empty() && steer_raw(flows, raws, &ep.mem, &buf, now) {
                    counters.rx_raw += 1;
                    lb.recycle(buf);
                    continue;
                }
                if raw {
                    // A raw frame no rule of this engine takes.
                    lb.recycle(buf);
                    continue;
                }
                match RoceRepr::parse(&buf, Checks::NONE) {
                    Ok(pkt) => {
                        let qpn = pkt.repr.bth.dest_qpn.value();
                        if qpn == GSI_QPN {
                            if let Some(g) = gsi.as_mut() {
                                g.receive(&pkt);
                            }
                        } else if !took(ep.deliver(now, &pkt), active) {
                            let forwarded = steer
                                .as_ref()
                                .is_some_and(|st| st.forward_to_owner(qpn, &buf, counters));
                            if !forwarded {
                                counters.rx_unknown_qp += 1;
                            }
                        }
                    }
                    Err(_) => counters.rx_malformed += 1,
                }
                lb.recycle(buf);
            }
            work += n;
        }
        if let Some(st) = steer.as_ref() {
            let mut n = 0;
            while n < RX_BURST {
                let Some(buf) = st.inbox().pop() else { break };
                n += 1;
                // Checked where it arrived; parsed again only to borrow its fields. `None`:
                // delivered; `Some(qpn)`: QP `qpn` is not here.
                let missing = match RoceRepr::parse(&buf, Checks::NONE) {
                    Ok(pkt) if pkt.repr.bth.dest_qpn.value() == GSI_QPN && gsi.is_some() => {
                        // A MAD that arrived on another engine's queue.
                        if let Some(g) = gsi.as_mut() {
                            g.receive(&pkt);
                        }
                        None
                    }
                    Ok(pkt) => {
                        let qpn = pkt.repr.bth.dest_qpn.value();
                        (!took(ep.deliver(now, &pkt), active)).then_some(qpn)
                    }
                    // A malformed frame attributed to one of this engine's QPs.
                    Err(e) => RoceRepr::attribute(&buf, Checks::NONE, e).and_then(|m| {
                        let qpn = m.bth.dest_qpn.value();
                        (!took(ep.deliver_malformed(now, &m), active)).then_some(qpn)
                    }),
                };
                // A QP that moved on since the frame was handed over: on to where it lives.
                if let Some(qpn) = missing {
                    if !st.forward_to_owner(qpn, &buf, counters) {
                        counters.rx_unknown_qp += 1;
                    }
                }
                let _ = st.spare.push(buf);
            }
            work += n;
        }
        let multi = self.ports.len() > 1;
        for (i, port) in self.ports.iter_mut().enumerate() {
            // A port whose link is down delivers nothing: not asked (a system call saved).
            if multi && !ep.link_up(i as u8) {
                continue;
            }
            work += port.rx_burst(RX_BURST, |frame| {
                counters.rx_frames += 1;
                counters.rx_bytes += frame.len() as u64;
                if !flows.is_empty() && steer_raw(flows, raws, &ep.mem, frame, now) {
                    counters.rx_raw += 1;
                    return;
                }
                // By reference: a packet bound by value is moved out of the result, a
                // 300-byte copy per frame.
                match &RoceRepr::parse(frame, checks) {
                    Ok(pkt) => {
                        let qpn = pkt.repr.bth.dest_qpn.value();
                        if qpn == GSI_QPN {
                            if let Some(g) = gsi.as_mut() {
                                g.receive(pkt);
                                return;
                            }
                        }
                        if took(ep.deliver(now, pkt), active) {
                            return;
                        }
                        let forwarded = steer
                            .as_ref()
                            .is_some_and(|st| st.forward_to_owner(qpn, frame, counters));
                        if !forwarded {
                            counters.rx_unknown_qp += 1;
                        }
                    }
                    &Err(e) => {
                        counters.rx_malformed += 1;
                        if matches!(e, ferroce_stack::wire::Error::Icrc { .. }) {
                            counters.rx_icrc_errors += 1;
                        }
                        // Refused after a sound BTH with a good ICRC: the QP it names decides.
                        let Some(m) = RoceRepr::attribute(frame, checks, e) else {
                            return;
                        };
                        let qpn = m.bth.dest_qpn.value();
                        if took(ep.deliver_malformed(now, &m), active) {
                            return;
                        }
                        if let Some(st) = steer.as_ref() {
                            st.forward_to_owner(qpn, frame, counters);
                        }
                    }
                }
            });
        }

        // QP1: what the communication manager received, its deadlines, what it sends.
        if let Some(g) = self.core.gsi.as_mut() {
            if g.busy(now) {
                let port = &mut self.ports[0];
                let counters = &mut self.core.counters;
                work += g.turn(now, &mut self.core.frame, |f| {
                    match port.tx(f.len(), |b| b.copy_from_slice(f)) {
                        Ok(()) => {
                            counters.tx_frames += 1;
                            counters.tx_bytes += f.len() as u64;
                        }
                        Err(_) => counters.tx_errors += 1,
                    }
                });
            }
        }

        // 3. Timers.
        let wheel = &mut self.core.wheel;
        let mut due = Vec::new();
        wheel.expire(now, |qpn| due.push(qpn));
        for qpn in due {
            if let Some(slot) = self.core.ep.qps.get_mut(qpn) {
                slot.armed = None;
                if slot.qp.poll_timeout().is_some_and(|t| t <= now) {
                    slot.qp.handle_timeout(now);
                    work += 1;
                }
                if !slot.active {
                    slot.active = true;
                    self.core.active.push(qpn);
                }
            }
        }

        // 4. Transmit, completions, re-arm.
        let active = std::mem::take(&mut self.core.active);
        let EngineCore {
            ep,
            frame,
            counters,
            looped,
            split_min,
            wheel,
            done,
            ..
        } = &mut self.core;
        let Endpoint { qps, mem, .. } = ep;
        let looping = looped.is_some();
        let nports = self.ports.len();
        for &qpn in &active {
            let Some(slot) = qps.get_mut(qpn) else {
                continue;
            };
            slot.active = false;
            if !slot.parked.is_empty() {
                EngineCore::run_parked(slot, mem, now);
            }
            // Each frame on the port the QP names: a QP with an alternate path sends on its
            // active port, and a probe of the other path (or the answer to one) on that
            // path's; a port the device does not have is port 1.
            while let Some(t) = slot.qp.poll_transmit_any(now, frame, mem, *split_min) {
                let pi = usize::from(t.port);
                let pi = if pi < nports { pi } else { 0 };
                let n = t.len();
                let sent = match &t.out {
                    _ if looping && frame[..6] == self.macs[pi] => match &t.out {
                        TxOut::Whole(n) => loop_back(counters, &frame[..*n], *n, |b| {
                            b.copy_from_slice(&frame[..*n])
                        }),
                        TxOut::Split(s) => {
                            loop_back(counters, frame, s.len(), |b| s.copy_to(frame, b))
                        }
                    },
                    TxOut::Whole(n) => {
                        let frame = &frame[..*n];
                        self.ports[pi].tx(*n, |b| b.copy_from_slice(frame))
                    }
                    TxOut::Split(s) => {
                        let r = self.ports[pi].tx_split(frame, s);
                        counters.tx_zero_copy += u64::from(r.is_ok());
                        r
                    }
                };
                match sent {
                    Ok(()) => {
                        counters.tx_frames += 1;
                        counters.tx_bytes += n as u64;
                    }
                    Err(_) => counters.tx_errors += 1,
                }
                work += 1;
            }
            EngineCore::settle(slot, wheel, done, now);
        }
        self.core.active = active;
        self.core.active.clear();
        if self.core.raw_pending {
            work += self.transmit_raw(now);
        }
        for port in self.ports.iter_mut() {
            port.flush();
        }
        self.core.idle_turns = if work == 0 {
            self.core.idle_turns.wrapping_add(1)
        } else {
            0
        };
        work
    }
}

/// True when a QP took the frame; one that had been idle joins the turn's work list.
#[inline]
fn took(r: Received, active: &mut Vec<u32>) -> bool {
    match r {
        Received::Qp { qpn, woke } => {
            if woke {
                active.push(qpn);
            }
            true
        }
        _ => false,
    }
}

/// Hands a frame to the port's own address (`len` bytes, written by `fill`; `head` holds
/// its headers) to the QP of this process it names, instead of the wire. A frame no QP of the
/// process takes is dropped, counted, as the wire would drop it at the port's own MAC.
fn loop_back(
    counters: &mut PortCounters,
    head: &[u8],
    len: usize,
    fill: impl FnOnce(&mut [u8]),
) -> Result<(), ferroce_drivers::TxError> {
    use looped::Looped;
    let got = looped::dest_qpn(head).map_or(Looped::NoOwner, |q| looped::deliver(q, len, fill));
    match got {
        Looped::Delivered => {
            counters.tx_looped += 1;
            Ok(())
        }
        Looped::Dropped => Err(ferroce_drivers::TxError::RingFull),
        Looped::NoOwner => {
            counters.tx_looped_unknown_qp += 1;
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferroce_drivers::pipe::{pair, PipePort};
    use ferroce_stack::transport::loopback::connect;
    use ferroce_stack::transport::{
        MrTable, Payload, PdId, Qp, QpAttr, QpCaps, QpConfig, QpState, QpType, SendWr, WrOpcode,
    };
    use ferroce_stack::wire::sample::reseal;
    use ferroce_stack::wire::{NakCode, Opcode, Psn, Qpn, Syndrome, ETHERNET_LEN, IPV4_LEN};
    use std::sync::Arc;

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
