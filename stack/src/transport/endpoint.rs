//! One host's transport without I/O: its QPs found by number, its registered memory, and
//! its ports' link state, fed frames, link events and time, and asked for frames (each
//! naming the port it leaves on) and completions. quinn-proto's `Endpoint` is the model:
//! every driver — the simulated testbed's hosts, the verbs engine over a real port — holds
//! one and does only the I/O around it.
//!
//! What stays the driver's: which ports exist and how frames reach them, the clock, and
//! which QPs to visit when (a simulator visits them all each turn, in the order they were
//! added, so a run replays from its seed; the verbs engine visits the QPs that had work,
//! found by its timer wheel and doorbells). What the endpoint fixes, so no driver can get
//! it wrong: a frame reaches the QP its BTH names (or the one a malformed frame still
//! names); every QP hears of every link change once; a QP's frames come with their port
//! ([`Transmit`]), its side frames first.
//!
//! A driver keeps its own per-QP state beside each QP (the verbs engine: the queues the
//! program posts to, the CQs) by storing its own type `S` that implements [`Hosted`]; a
//! plain [`Qp`] is one.

use hashbrown::HashMap;

use super::counters::Counters;
use super::mr::MrTable;
use super::qp::Qp;
use super::tx::Transmit;
use super::wr::WorkCompletion;
use crate::wire::{Checks, Malformed, RocePacket, RoceRepr};

/// What a driver keeps per QP in an [`Endpoint`]: the QP, and whatever the driver needs
/// beside it.
pub trait Hosted {
    /// The QP.
    fn qp(&self) -> &Qp;

    /// The QP, mutably.
    fn qp_mut(&mut self) -> &mut Qp;

    /// Runs before a frame is handed to the QP. A driver whose program posts work outside
    /// the QP (the verbs engine's lock-free inboxes) takes it in here: a receive posted
    /// before the frame's sender was told to send must be there for it, as a WQE a program
    /// wrote is there for a NIC at once.
    #[inline]
    fn before_frame(&mut self, _mem: &mut MrTable, _now: u64) {}

    /// Runs after the QP took a frame or heard of a link change; true when the driver had
    /// not yet planned to visit it (it was idle), so the caller adds it to its work list.
    #[inline]
    fn touched(&mut self) -> bool {
        true
    }
}

impl Hosted for Qp {
    #[inline]
    fn qp(&self) -> &Qp {
        self
    }

    #[inline]
    fn qp_mut(&mut self) -> &mut Qp {
        self
    }
}

/// What became of a received frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Received {
    /// QP `qpn` took it (a malformed frame that still names the QP included: the QP decides
    /// what it means); `woke` when the QP had been idle ([`Hosted::touched`]).
    Qp {
        /// The QP.
        qpn: u32,
        /// The QP was idle until now.
        woke: bool,
    },
    /// It names QP `qpn`, which this endpoint does not have.
    UnknownQp(u32),
    /// The parser refused it and it names no QP that could answer (a bad ICRC, a broken
    /// header below the BTH); `icrc` when the ICRC was what was wrong.
    Malformed {
        /// The ICRC did not match.
        icrc: bool,
    },
}

/// The QPs of one endpoint: found by number, visited in the order they were added.
#[derive(Debug)]
pub struct QpTable<S> {
    /// Insertion order; a removed QP leaves a hole the next insert fills.
    slots: Vec<Option<S>>,
    free: Vec<usize>,
    by_qpn: HashMap<u32, usize>,
}

impl<S> Default for QpTable<S> {
    fn default() -> Self {
        Self {
            slots: Vec::new(),
            free: Vec::new(),
            by_qpn: HashMap::new(),
        }
    }
}

impl<S: Hosted> QpTable<S> {
    /// Adds `s` under its QP's number; returns what had that number before, if anything.
    pub fn insert(&mut self, s: S) -> Option<S> {
        let qpn = s.qp().qpn().value();
        if let Some(&i) = self.by_qpn.get(&qpn) {
            return self.slots[i].replace(s);
        }
        let i = match self.free.pop() {
            Some(i) => {
                self.slots[i] = Some(s);
                i
            }
            None => {
                self.slots.push(Some(s));
                self.slots.len() - 1
            }
        };
        self.by_qpn.insert(qpn, i);
        None
    }

    /// Takes QP `qpn` out.
    pub fn remove(&mut self, qpn: u32) -> Option<S> {
        let i = self.by_qpn.remove(&qpn)?;
        self.free.push(i);
        self.slots[i].take()
    }

    /// QP `qpn`.
    #[inline]
    pub fn get(&self, qpn: u32) -> Option<&S> {
        let &i = self.by_qpn.get(&qpn)?;
        self.slots[i].as_ref()
    }

    /// QP `qpn`, mutably.
    #[inline]
    pub fn get_mut(&mut self, qpn: u32) -> Option<&mut S> {
        let &i = self.by_qpn.get(&qpn)?;
        self.slots[i].as_mut()
    }

    /// True when QP `qpn` is here.
    pub fn contains(&self, qpn: u32) -> bool {
        self.by_qpn.contains_key(&qpn)
    }

    /// How many QPs there are.
    pub fn len(&self) -> usize {
        self.by_qpn.len()
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.by_qpn.is_empty()
    }

    /// Every QP, in the order they were added.
    pub fn iter(&self) -> impl Iterator<Item = &S> + '_ {
        self.slots.iter().flatten()
    }

    /// Every QP, mutably, in the order they were added.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut S> + '_ {
        self.slots.iter_mut().flatten()
    }
}

/// One host's QPs, registered memory and link state (see the module docs).
pub struct Endpoint<S = Qp> {
    /// The QPs.
    pub qps: QpTable<S>,
    /// The registered memory every QP of the endpoint reaches.
    pub mem: MrTable,
    /// Each port's link as the QPs last heard of it.
    links: Vec<bool>,
}

impl<S: Hosted> Endpoint<S> {
    /// An endpoint with no QPs over `mem`, its `ports` ports' links up.
    pub fn new(mem: MrTable, ports: usize) -> Self {
        Self {
            qps: QpTable::default(),
            mem,
            links: vec![true; ports],
        }
    }

    /// An endpoint with no QPs over `mem`, with one port per entry of `links`, each up or
    /// down as given (what the ports said when the endpoint was made: no QP hears of it).
    pub fn with_links(mem: MrTable, links: Vec<bool>) -> Self {
        Self {
            qps: QpTable::default(),
            mem,
            links,
        }
    }

    /// How many ports the endpoint sends on.
    pub fn port_count(&self) -> usize {
        self.links.len()
    }

    /// Port `port`'s link as the QPs last heard of it.
    pub fn link_up(&self, port: u8) -> bool {
        self.links.get(usize::from(port)).copied().unwrap_or(false)
    }

    /// Port `port`'s link is `up` at `now`: if that is news, every QP hears of it once
    /// ([`Qp::on_port_event`]; only QPs with an alternate path act) and `touched` runs on
    /// each (`woke` gets the numbers of those that were idle). True when it was news.
    pub fn handle_link(&mut self, now: u64, port: u8, up: bool, mut woke: impl FnMut(u32)) -> bool {
        let Some(seen) = self.links.get_mut(usize::from(port)) else {
            return false;
        };
        if *seen == up {
            return false;
        }
        *seen = up;
        for s in self.qps.iter_mut() {
            s.qp_mut().on_port_event(now, port, up);
            if s.touched() {
                woke(s.qp().qpn().value());
            }
        }
        true
    }

    /// Parses `frame` with `checks` and hands it to the QP it is for.
    pub fn handle_frame(&mut self, now: u64, frame: &[u8], checks: Checks) -> Received {
        // By reference: binding the packet by value moved its 300 bytes out of the result,
        // a memcpy per frame.
        match &RoceRepr::parse(frame, checks) {
            Ok(pkt) => self.deliver(now, pkt),
            Err(e) => {
                let icrc = matches!(e, crate::wire::Error::Icrc { .. });
                match RoceRepr::attribute(frame, checks, *e) {
                    Some(m) => self.deliver_malformed(now, &m),
                    None => Received::Malformed { icrc },
                }
            }
        }
    }

    /// Hands a parsed packet to the QP its BTH names.
    #[inline]
    pub fn deliver(&mut self, now: u64, pkt: &RocePacket<'_>) -> Received {
        let qpn = pkt.repr.bth.dest_qpn.value();
        let Some(s) = self.qps.get_mut(qpn) else {
            return Received::UnknownQp(qpn);
        };
        s.before_frame(&mut self.mem, now);
        s.qp_mut().handle_packet(now, pkt, &mut self.mem);
        Received::Qp {
            qpn,
            woke: s.touched(),
        }
    }

    /// Hands a frame the parser refused after a sound BTH ([`RoceRepr::attribute`]) to the
    /// QP it names, which decides what it means.
    pub fn deliver_malformed(&mut self, now: u64, m: &Malformed) -> Received {
        let qpn = m.bth.dest_qpn.value();
        let Some(s) = self.qps.get_mut(qpn) else {
            return Received::UnknownQp(qpn);
        };
        s.before_frame(&mut self.mem, now);
        s.qp_mut().handle_malformed(now, m);
        Received::Qp {
            qpn,
            woke: s.touched(),
        }
    }

    /// Runs QP `qpn`'s timers if one is due at `now`; true when one was.
    pub fn handle_timeout(&mut self, now: u64, qpn: u32) -> bool {
        let Some(s) = self.qps.get_mut(qpn) else {
            return false;
        };
        let qp = s.qp_mut();
        if qp.poll_timeout().is_some_and(|t| t <= now) {
            qp.handle_timeout(now);
            return true;
        }
        false
    }

    /// QP `qpn`'s next frame, written into `buf` (a payload of `split_min` bytes or more
    /// left in registered memory), with the port it leaves on; `None` when it has nothing
    /// to send, or no such QP is here. A port the endpoint does not have (an alternate
    /// path set up on a port that is not there) becomes port 0.
    #[inline]
    pub fn poll_transmit(
        &mut self,
        now: u64,
        qpn: u32,
        buf: &mut [u8],
        split_min: usize,
    ) -> Option<Transmit<'_>> {
        let s = self.qps.get_mut(qpn)?;
        let mut t = s
            .qp_mut()
            .poll_transmit_any(now, buf, &self.mem, split_min)?;
        if usize::from(t.port) >= self.links.len() {
            t.port = 0;
        }
        Some(t)
    }

    /// One turn over every QP, in the order they were added: its timers if due, then every
    /// frame it has to send (handed to `tx` with the buffer its headers were written in;
    /// the port named, as in [`poll_transmit`](Self::poll_transmit)), then its completions
    /// (handed to `wc`). The turn a simulator takes, which replays exactly from a seed; the
    /// verbs engine visits only the QPs that had work, through the same per-QP calls.
    pub fn poll_all(
        &mut self,
        now: u64,
        buf: &mut [u8],
        split_min: usize,
        mut tx: impl FnMut(&Transmit<'_>, &[u8]),
        mut wc: impl FnMut(WorkCompletion),
    ) {
        let ports = self.links.len();
        for s in self.qps.slots.iter_mut().flatten() {
            let qp = s.qp_mut();
            if qp.poll_timeout().is_some_and(|t| t <= now) {
                qp.handle_timeout(now);
            }
            while let Some(mut t) = qp.poll_transmit_any(now, buf, &self.mem, split_min) {
                if usize::from(t.port) >= ports {
                    t.port = 0;
                }
                tx(&t, buf);
            }
            while let Some(c) = qp.poll_completion() {
                wc(c);
            }
        }
    }

    /// QP `qpn`'s next completion.
    pub fn poll_completion(&mut self, qpn: u32) -> Option<WorkCompletion> {
        self.qps.get_mut(qpn)?.qp_mut().poll_completion()
    }

    /// The earliest deadline of any QP.
    pub fn poll_timeout(&self) -> Option<u64> {
        self.qps.iter().filter_map(|s| s.qp().poll_timeout()).min()
    }

    /// Every QP's counters, summed.
    pub fn counters(&self) -> Counters {
        let mut c = Counters::default();
        for s in self.qps.iter() {
            c.accumulate(s.qp().counters());
        }
        c
    }
}

#[cfg(test)]
mod tests {
    use core::net::{IpAddr, Ipv4Addr};

    use super::*;
    use crate::transport::loopback::connect;
    use crate::transport::{
        AddressVector, Payload, PdId, QpAttr, QpConfig, QpType, SendWr, TxOut, WrOpcode,
    };
    use crate::wire::{MacAddr, Opcode, PathControl, PathControlKind, Qpn};

    /// Port 0's MAC (the connection's primary path) and port 1's (the alternate).
    const MACS: [MacAddr; 2] = [MacAddr([2, 0, 0, 0, 0, 1]), MacAddr([2, 0, 0, 0, 1, 1])];

    /// An endpoint on two ports holding RC QP 0x11 at RTS, connected to a peer (not in the
    /// endpoint) on port 0 and given an alternate path from port 1, and the peer.
    fn rig() -> (Endpoint<Qp>, Qp) {
        let mut a = Qp::new(QpConfig::new(Qpn::new(0x11), QpType::Rc, PdId(1)));
        let mut b = Qp::new(QpConfig::new(Qpn::new(0x22), QpType::Rc, PdId(1)));
        let attr = QpAttr {
            timeout: 14,
            ..QpAttr::default()
        };
        connect(&mut a, &mut b, &attr).unwrap();
        let alt = AddressVector {
            smac: MACS[1],
            dmac: MacAddr([2, 0, 0, 0, 1, 2]),
            src: IpAddr::V4(Ipv4Addr::new(10, 0, 1, 1)),
            dst: IpAddr::V4(Ipv4Addr::new(10, 0, 1, 2)),
            ..AddressVector::default()
        };
        a.set_alternate_path(alt, 2, 16).unwrap();
        let mut ep = Endpoint::new(MrTable::new(7), 2);
        assert!(ep.qps.insert(a).is_none());
        (ep, b)
    }

    /// What a turn of `ep` at `now` sent: each frame's port, source MAC, opcode and (for a
    /// `PATH_CONTROL`) kind.
    fn turn(
        ep: &mut Endpoint<Qp>,
        now: u64,
    ) -> Vec<(u8, MacAddr, Opcode, Option<PathControlKind>)> {
        let mut out = Vec::new();
        let mut buf = vec![0u8; 9000];
        ep.poll_all(
            now,
            &mut buf,
            usize::MAX,
            |t, frame| {
                let TxOut::Whole(n) = t.out else {
                    panic!("split with split_min usize::MAX")
                };
                let p = RoceRepr::parse(&frame[..n], Checks::ALL).expect("a valid frame");
                let kind = (p.repr.bth.opcode == Opcode::PATH_CONTROL)
                    .then(|| PathControl::parse(p.payload).expect("a valid message").kind);
                out.push((t.port, p.repr.eth.src, p.repr.bth.opcode, kind));
            },
            |_| {},
        );
        out
    }

    /// The driver sends each frame on the port the endpoint names, and that port is the one
    /// whose MAC the frame carries: data on the active path's port before and after a move,
    /// the moved notice on the new path, and the probe of the primary (after its link comes
    /// back) on the primary's port while data still leaves on the alternate's.
    #[test]
    fn every_frame_names_the_port_of_its_path() {
        let (mut ep, _peer) = rig();
        let write = |ep: &mut Endpoint<Qp>, id| {
            let mut wr = SendWr::new(id, WrOpcode::Write, Payload::Inline(&[5; 16]));
            wr.remote_addr = 0x1000;
            wr.rkey = 9;
            ep.qps.get_mut(0x11).unwrap().post_send(&wr).unwrap();
        };
        let mut all = Vec::new();
        write(&mut ep, 1);
        let first = turn(&mut ep, 0);
        assert!(first.iter().any(|f| f.2 == Opcode::RC_RDMA_WRITE_ONLY));
        all.extend(first.iter().copied());
        assert!(first.iter().all(|f| f.0 == 0), "{first:?}");

        // Port 0 goes down: the QP moves, and says so on port 1.
        assert!(ep.handle_link(10, 0, false, |_| {}));
        assert!(!ep.handle_link(11, 0, false, |_| {}), "not news twice");
        write(&mut ep, 2);
        let moved = turn(&mut ep, 20);
        assert!(moved.contains(&(
            1,
            MACS[1],
            Opcode::PATH_CONTROL,
            Some(PathControlKind::Moved)
        )));
        assert!(moved.iter().all(|f| f.0 == 1), "{moved:?}");
        all.extend(moved.iter().copied());

        // Port 0 is back: a probe of it goes out there, once the damping interval is over,
        // while the data stays on port 1.
        assert!(ep.handle_link(30, 0, true, |_| {}));
        let mut probes = 0;
        for now in (40..200_000_000).step_by(1_000_000) {
            write(&mut ep, now);
            let frames = turn(&mut ep, now);
            probes += frames
                .iter()
                .filter(|f| f.3 == Some(PathControlKind::Probe))
                .count();
            all.extend(frames);
            if probes > 0 {
                break;
            }
        }
        assert_eq!(probes, 1, "one probe of the primary");
        for (port, src, op, kind) in &all {
            assert_eq!(
                *src,
                MACS[usize::from(*port)],
                "{op:?} {kind:?} left on port {port}"
            );
            if *kind == Some(PathControlKind::Probe) {
                assert_eq!(*port, 0, "the probe goes on the path it probes");
            }
        }
        let last_write = all
            .iter()
            .rev()
            .find(|f| f.2 == Opcode::RC_RDMA_WRITE_ONLY)
            .unwrap();
        assert_eq!(
            last_write.0, 1,
            "data stays on the alternate until the probe is answered"
        );
    }

    /// Frames reach the QP their BTH names; others are counted as unknown or malformed, and
    /// a QP taken out is no longer reached.
    #[test]
    fn frames_reach_the_qp_they_name() {
        let (mut ep, mut peer) = rig();
        let peer_mem = MrTable::new(3);
        peer.post_send(&SendWr::new(1, WrOpcode::Send, Payload::Inline(&[1; 8])))
            .unwrap();
        let frames = crate::transport::loopback::drain_frames(&mut peer, &peer_mem, 0);
        assert_eq!(frames.len(), 1);
        let r = ep.handle_frame(0, &frames[0], Checks::ALL);
        assert_eq!(
            r,
            Received::Qp {
                qpn: 0x11,
                woke: true
            }
        );
        assert_eq!(ep.qps.get(0x11).unwrap().counters().rx_packets, 1);

        let mut bad = frames[0].clone();
        let last = bad.len() - 1;
        bad[last] ^= 1;
        assert_eq!(
            ep.handle_frame(0, &bad, Checks::ALL),
            Received::Malformed { icrc: true }
        );
        assert_eq!(ep.qps.get(0x11).unwrap().counters().rx_packets, 1);

        let a = ep.qps.remove(0x11).unwrap();
        assert_eq!(
            ep.handle_frame(0, &frames[0], Checks::ALL),
            Received::UnknownQp(0x11)
        );
        assert!(ep.qps.is_empty());
        assert!(ep.qps.insert(a).is_none());
        assert_eq!(ep.qps.len(), 1);
    }
}
