//! One host: ports, a buffer registered with every right, QPs (each sending on one of the
//! ports), and what they completed.

use std::net::{IpAddr, Ipv4Addr};

use ferroce_drivers::Port;
use ferroce_stack::transport::{
    Access, AddressVector, Counters, MrKeys, MrTable, PdId, Qp, QpConfig, QpType, RegisterError,
    WorkCompletion,
};
use ferroce_stack::wire::{Checks, MacAddr, Qpn, RoceRepr};
use hashbrown::HashMap;

/// The protection domain of every host's buffer and QPs.
pub const PD: PdId = PdId(1);

/// Every right a region can have.
const ALL: Access = Access::LOCAL_WRITE
    .with(Access::REMOTE_WRITE)
    .with(Access::REMOTE_READ)
    .with(Access::REMOTE_ATOMIC);

/// A simulated host.
pub struct Host<P> {
    ports: Vec<P>,
    /// Its address (one for all its ports).
    pub ip: Ipv4Addr,
    /// Its registered memory.
    pub mem: MrTable,
    /// The buffer's keys: `len()` bytes with every right in [`PD`], addressed by offset
    /// (iova 0).
    pub keys: MrKeys,
    len: usize,
    /// Its QPs, in the order they were added.
    pub qps: Vec<Qp>,
    /// The port each QP sends on.
    qp_port: Vec<usize>,
    by_qpn: HashMap<u32, usize>,
    /// Completions of every QP, in the order they were taken.
    pub completions: Vec<WorkCompletion>,
    /// The virtual time each completion was taken at.
    pub completed_at: Vec<u64>,
    /// Frames the parser refused.
    pub rx_malformed: u64,
    /// Frames for a QP number this host does not have.
    pub rx_unknown_qp: u64,
    /// Each port's link state as the QPs last heard it (up), for link events.
    link_up: Vec<bool>,
}

impl<P: Port> Host<P> {
    /// A host with one port, `bytes` of registered memory, address `ip`, memory keys from
    /// `seed`.
    pub fn new(port: P, bytes: usize, ip: Ipv4Addr, seed: u64) -> Self {
        Self::with_ports(vec![port], bytes, ip, seed)
    }

    /// A host with several ports (failover and multi-port spraying send on each).
    pub fn with_ports(ports: Vec<P>, bytes: usize, ip: Ipv4Addr, seed: u64) -> Self {
        assert!(!ports.is_empty(), "a host needs a port");
        let mut mem = MrTable::new(seed);
        let keys = mem
            .register_owned_at(PD, bytes, 0, ALL)
            .expect("a fresh table registers");
        Self {
            ports,
            ip,
            mem,
            keys,
            len: bytes,
            qps: Vec::new(),
            qp_port: Vec::new(),
            by_qpn: HashMap::new(),
            completions: Vec::new(),
            completed_at: Vec::new(),
            rx_malformed: 0,
            rx_unknown_qp: 0,
            link_up: Vec::new(),
        }
    }

    /// Port `i`.
    pub fn port(&self, i: usize) -> &P {
        &self.ports[i]
    }

    /// Port `i`, mutably.
    pub fn port_mut(&mut self, i: usize) -> &mut P {
        &mut self.ports[i]
    }

    /// Its ports, the host taken apart (to finish a pcap tee, say).
    pub fn into_ports(self) -> Vec<P> {
        self.ports
    }

    /// How many ports it has.
    pub fn port_count(&self) -> usize {
        self.ports.len()
    }

    /// The MAC of its first port.
    pub fn mac(&self) -> MacAddr {
        self.ports[0].mac()
    }

    /// Bytes of its buffer.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when its buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// A copy of `len` bytes of the buffer at `offset`.
    pub fn read(&self, offset: usize, len: usize) -> Vec<u8> {
        let mut out = vec![0; len];
        self.mem
            .read(self.keys.lkey, PD, offset as u64, &mut out, Access::NONE)
            .expect("inside the host's buffer");
        out
    }

    /// A copy of the whole buffer.
    pub fn bytes(&self) -> Vec<u8> {
        self.read(0, self.len)
    }

    /// Writes `data` into the buffer at `offset`.
    pub fn write(&mut self, offset: usize, data: &[u8]) {
        self.mem
            .write(self.keys.lkey, PD, offset as u64, data, Access::LOCAL_WRITE)
            .expect("inside the host's buffer");
    }

    /// The native-endian 64-bit word at `offset` (where atomics land).
    pub fn word(&self, offset: usize) -> u64 {
        let b = self.read(offset, 8);
        u64::from_ne_bytes(b.try_into().expect("eight bytes"))
    }

    /// Registers `len` bytes of the buffer at `offset` again, in `pd` with `access`,
    /// addressed as `offset ..` like the buffer: a region to invalidate, or one with fewer
    /// rights.
    pub fn register_window(
        &mut self,
        pd: PdId,
        offset: usize,
        len: usize,
        access: Access,
    ) -> Result<MrKeys, RegisterError> {
        self.mem
            .register_within(self.keys, offset, len, (pd, offset as u64, access))
            .expect("inside the host's buffer")
    }

    /// Adds a QP numbered `qpn` in RESET, sending on port 0; returns its index.
    pub fn add_qp(&mut self, qpn: u32, qp_type: QpType) -> usize {
        self.insert_qp(Qp::new(QpConfig::new(Qpn::new(qpn), qp_type, PD)), 0)
    }

    /// Adds `qp`, sending on port `port`; returns its index.
    pub fn insert_qp(&mut self, qp: Qp, port: usize) -> usize {
        assert!(port < self.ports.len(), "no port {port}");
        self.by_qpn.insert(qp.qpn().value(), self.qps.len());
        self.qps.push(qp);
        self.qp_port.push(port);
        self.qps.len() - 1
    }

    /// The QP numbered `qpn`.
    pub fn qp(&mut self, qpn: u32) -> &mut Qp {
        let i = self.by_qpn[&qpn];
        &mut self.qps[i]
    }

    /// The port QP `qpn` sends on, if the host has that QP.
    pub fn port_of(&self, qpn: u32) -> Option<usize> {
        self.by_qpn.get(&qpn).map(|&i| self.qp_port[i])
    }

    /// The address vector from its first port to `peer_mac` / `peer_ip`.
    pub fn av_to(&self, peer_mac: MacAddr, peer_ip: Ipv4Addr) -> AddressVector {
        self.av_from(0, peer_mac, peer_ip)
    }

    /// The address vector from port `port` to `peer_mac` / `peer_ip`.
    pub fn av_from(&self, port: usize, peer_mac: MacAddr, peer_ip: Ipv4Addr) -> AddressVector {
        AddressVector {
            smac: self.ports[port].mac(),
            dmac: peer_mac,
            src: IpAddr::V4(self.ip),
            dst: IpAddr::V4(peer_ip),
            ..AddressVector::default()
        }
    }

    /// Every QP's counters, summed.
    pub fn counters(&self) -> Counters {
        let mut c = Counters::default();
        for q in &self.qps {
            c.accumulate(q.counters());
        }
        c
    }

    /// One turn at `now`: receive on every port, run due timers, transmit, take
    /// completions. Returns the frames sent.
    pub(crate) fn turn(&mut self, now: u64, scratch: &mut [u8]) -> usize {
        let Self {
            ports,
            mem,
            qps,
            qp_port,
            by_qpn,
            rx_malformed,
            rx_unknown_qp,
            completions,
            completed_at,
            link_up,
            ..
        } = self;
        // Link events: every QP hears of a port that went down or came back (only QPs with
        // an alternate path act on them, so hosts without one skip the polling).
        link_up.resize(ports.len(), true);
        let listening = qps.iter().any(|q| q.active_port().is_some());
        for (i, port) in ports.iter().enumerate().filter(|_| listening) {
            let up = port.link_state() == ferroce_drivers::LinkState::Up;
            if up != link_up[i] {
                link_up[i] = up;
                for qp in qps.iter_mut() {
                    qp.on_port_event(now, i as u8, up);
                }
            }
        }
        for port in ports.iter_mut() {
            port.rx_burst(usize::MAX, |frame| {
                match RoceRepr::parse(frame, Checks::ALL) {
                    Ok(pkt) => match by_qpn.get(&pkt.repr.bth.dest_qpn.value()) {
                        Some(&i) => qps[i].handle_packet(now, &pkt, mem),
                        None => *rx_unknown_qp += 1,
                    },
                    Err(_) => *rx_malformed += 1,
                }
            });
        }
        let mut sent = 0;
        for (qp, &p) in qps.iter_mut().zip(qp_port.iter()) {
            if qp.poll_timeout().is_some_and(|t| t <= now) {
                qp.handle_timeout(now);
            }
            // A probe (or its answer) leaves from its own path's port.
            if let Some((p, n)) = qp.poll_transmit_side(scratch) {
                if let Some(port) = ports.get_mut(usize::from(p)) {
                    let frame = &scratch[..n];
                    let _ = port.tx(n, |b| b.copy_from_slice(frame));
                    sent += 1;
                }
            }
            // A QP with an alternate path says which port it sends on now.
            let p = qp
                .active_port()
                .map(usize::from)
                .filter(|&a| a < ports.len())
                .unwrap_or(p);
            let port = &mut ports[p];
            while let Some(n) = qp.poll_transmit(now, scratch, mem) {
                let frame = &scratch[..n];
                // A refused frame (link down, ring full) is a lost frame; the transport
                // recovers it.
                let _ = port.tx(n, |b| b.copy_from_slice(frame));
                sent += 1;
            }
            while let Some(wc) = qp.poll_completion() {
                completions.push(wc);
                completed_at.push(now);
            }
        }
        for port in ports.iter_mut() {
            port.flush();
        }
        sent
    }

    /// The earliest QP timer.
    pub(crate) fn next_timeout(&self) -> Option<u64> {
        self.qps.iter().filter_map(Qp::poll_timeout).min()
    }
}
