//! Hosts on the simulated fabric driven in virtual time: each host is one port, one registered
//! buffer and some QPs; the loop moves frames between ports and QPs and fires QP timers, then
//! jumps to the next arrival or timer. Everything is sans-IO and single-threaded, so a run is
//! a pure function of its seed.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};

use ferroce_drivers::sim::{Fabric, HostId, SimPort};
use ferroce_drivers::Port;
use ferroce_stack::transport::{
    required_mask, Access, AddressVector, Counters, MrKeys, MrTable, Mtu, PdId, Policies, Qp,
    QpAttr, QpConfig, QpState, QpType, WorkCompletion,
};
use ferroce_stack::wire::{Checks, Psn, Qpn, RoceRepr};

const PD: PdId = PdId(1);

/// One host: a port, a buffer registered with every right, its QPs and what they completed.
pub(crate) struct Node {
    port: SimPort,
    pub(crate) mem: MrTable,
    pub(crate) keys: MrKeys,
    /// Address (and iova) of the buffer.
    pub(crate) base: u64,
    ip: Ipv4Addr,
    qps: Vec<Qp>,
    by_qpn: HashMap<u32, usize>,
    /// Completions with the virtual time they were polled at.
    pub(crate) completions: Vec<(u64, WorkCompletion)>,
}

impl Node {
    /// `bytes` of registered memory on `port`, addressed as `ip`.
    pub(crate) fn new(port: SimPort, bytes: usize, ip: Ipv4Addr, seed: u64) -> Self {
        let mut mem = MrTable::new(seed);
        let access = Access::LOCAL_WRITE
            .with(Access::REMOTE_WRITE)
            .with(Access::REMOTE_READ);
        let (keys, base) = mem
            .register_owned(PD, bytes, access)
            .expect("a fresh table registers");
        Self {
            port,
            mem,
            keys,
            base,
            ip,
            qps: Vec::new(),
            by_qpn: HashMap::new(),
            completions: Vec::new(),
        }
    }

    /// The QP numbered `qpn`.
    pub(crate) fn qp(&mut self, qpn: u32) -> &mut Qp {
        let i = self.by_qpn[&qpn];
        &mut self.qps[i]
    }

    /// Counters of every QP, summed.
    pub(crate) fn counters(&self) -> Counters {
        let mut c = Counters::default();
        for q in &self.qps {
            c.accumulate(q.counters());
        }
        c
    }

    fn pump(&mut self, now: u64, scratch: &mut [u8]) -> usize {
        let Self {
            port,
            mem,
            qps,
            by_qpn,
            completions,
            ..
        } = self;
        port.rx_burst(usize::MAX, |frame| {
            // What does not parse, or names no QP here, is dropped as a NIC would.
            if let Ok(pkt) = RoceRepr::parse(frame, Checks::ALL) {
                if let Some(&i) = by_qpn.get(&pkt.repr.bth.dest_qpn.value()) {
                    qps[i].handle_packet(now, &pkt, mem);
                }
            }
        });
        let mut sent = 0;
        for qp in qps.iter_mut() {
            if qp.poll_timeout().is_some_and(|t| t <= now) {
                qp.handle_timeout(now);
            }
            while let Some(n) = qp.poll_transmit(now, scratch, mem) {
                let frame = &scratch[..n];
                // A refused frame is a lost frame; the transport recovers it.
                let _ = port.tx(n, |b| b.copy_from_slice(frame));
                sent += 1;
            }
            while let Some(wc) = qp.poll_completion() {
                completions.push((now, wc));
            }
        }
        port.flush();
        sent
    }
}

/// Connection settings shared by both ends.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Link {
    pub(crate) mtu: Mtu,
    /// Local ACK timeout exponent: 4.096 µs × 2^timeout.
    pub(crate) timeout: u8,
    pub(crate) retry_cnt: u8,
}

/// The fabric and its hosts.
pub(crate) struct World {
    pub(crate) fabric: Fabric,
    pub(crate) nodes: Vec<Node>,
    hosts: Vec<HostId>,
    scratch: Vec<u8>,
}

impl World {
    pub(crate) fn new(fabric: Fabric, hosts: Vec<HostId>, nodes: Vec<Node>) -> Self {
        Self {
            fabric,
            nodes,
            hosts,
            scratch: vec![0; 16 * 1024],
        }
    }

    /// The fabric's id of node `i`.
    pub(crate) fn host(&self, i: usize) -> HostId {
        self.hosts[i]
    }

    /// An RC QP `qpn` on node `from`, at RTS towards QP `peer_qpn` on node `to`, running
    /// `policies` and sending from UDP port `udp_src_port`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn connect(
        &mut self,
        (from, qpn): (usize, u32),
        (to, peer_qpn): (usize, u32),
        (sq_psn, rq_psn): (u32, u32),
        udp_src_port: u16,
        policies: Policies,
        l: Link,
    ) {
        let av = AddressVector {
            smac: self.nodes[from].port.mac(),
            dmac: self.nodes[to].port.mac(),
            src: IpAddr::V4(self.nodes[from].ip),
            dst: IpAddr::V4(self.nodes[to].ip),
            udp_src_port: Some(udp_src_port),
            ..AddressVector::default()
        };
        let mut qp = Qp::new(QpConfig::new(Qpn::new(qpn), QpType::Rc, PD));
        qp.set_policies(policies);
        let a = QpAttr {
            qp_access_flags: Access::REMOTE_WRITE.with(Access::REMOTE_READ),
            ah_attr: av,
            path_mtu: l.mtu,
            dest_qp_num: Qpn::new(peer_qpn),
            rq_psn: Psn::new(rq_psn),
            max_dest_rd_atomic: 16,
            min_rnr_timer: 1,
            sq_psn: Psn::new(sq_psn),
            timeout: l.timeout,
            retry_cnt: l.retry_cnt,
            rnr_retry: 7,
            max_rd_atomic: 16,
            ..QpAttr::default()
        };
        for (from_state, to_state) in [
            (QpState::Reset, QpState::Init),
            (QpState::Init, QpState::Rtr),
            (QpState::Rtr, QpState::Rts),
        ] {
            let mask = required_mask(QpType::Rc, from_state, to_state).expect("RC path");
            qp.modify(
                &QpAttr {
                    qp_state: to_state,
                    ..a
                },
                mask,
            )
            .expect("a valid RC bring-up");
        }
        let node = &mut self.nodes[from];
        node.by_qpn.insert(qpn, node.qps.len());
        node.qps.push(qp);
    }

    /// Runs until nothing is left to do (no frame in flight, no timer armed) or virtual time
    /// passes `until`. Returns true when it went idle.
    pub(crate) fn run(&mut self, until: u64) -> bool {
        loop {
            let now = self.fabric.now();
            let mut sent = 0;
            for n in &mut self.nodes {
                sent += n.pump(now, &mut self.scratch);
            }
            if sent > 0 {
                continue;
            }
            let next_event = self.fabric.next_event();
            let next_timer = self
                .nodes
                .iter()
                .flat_map(|n| n.qps.iter().filter_map(Qp::poll_timeout))
                .min();
            let Some(next) = [next_event, next_timer].into_iter().flatten().min() else {
                return true;
            };
            if next > until {
                return false;
            }
            self.fabric.advance_to(next.max(now));
            if next <= now && next_event.is_none_or(|e| e > now) {
                // A timer due now that did nothing: step a nanosecond rather than spin.
                self.fabric.advance_to(now + 1);
            }
        }
    }
}
