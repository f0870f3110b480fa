//! One host: ports, a buffer registered with every right, QPs (each sending on one of the
//! ports), and what they completed.

use std::net::{IpAddr, Ipv4Addr};

use ferroce_drivers::Port;
use ferroce_stack::transport::{
    Access, AddressVector, Counters, Endpoint, MrKeys, MrTable, PdId, Qp, QpConfig, QpType,
    Received, RegisterError, WorkCompletion,
};
use ferroce_stack::wire::{Checks, MacAddr, Qpn};
use hashbrown::HashMap;

/// The protection domain of every host's buffer and QPs.
pub const PD: PdId = PdId(1);

/// Every right a region can have.
const ALL: Access = Access::LOCAL_WRITE
    .with(Access::REMOTE_WRITE)
    .with(Access::REMOTE_READ)
    .with(Access::REMOTE_ATOMIC);

/// A simulated host: ports around one [`Endpoint`], which holds the QPs and memory.
pub struct Host<P> {
    ports: Vec<P>,
    /// Its address (one for all its ports).
    pub ip: Ipv4Addr,
    /// Its QPs and registered memory.
    pub endpoint: Endpoint<Qp>,
    /// The buffer's keys: `len()` bytes with every right in [`PD`], addressed by offset
    /// (iova 0).
    pub keys: MrKeys,
    len: usize,
    /// The port each QP was added on (its `port_num` when the testbed brings it up).
    home: HashMap<u32, usize>,
    /// Completions of every QP, in the order they were taken.
    pub completions: Vec<WorkCompletion>,
    /// The virtual time each completion was taken at.
    pub completed_at: Vec<u64>,
    /// Frames the parser refused that name no QP of this host.
    pub rx_malformed: u64,
    /// Frames for a QP number this host does not have.
    pub rx_unknown_qp: u64,
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
        let endpoint = Endpoint::new(mem, ports.len());
        Self {
            ports,
            ip,
            endpoint,
            keys,
            len: bytes,
            home: HashMap::new(),
            completions: Vec::new(),
            completed_at: Vec::new(),
            rx_malformed: 0,
            rx_unknown_qp: 0,
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

    /// Its registered memory.
    pub fn mem(&self) -> &MrTable {
        &self.endpoint.mem
    }

    /// Its registered memory, mutably.
    pub fn mem_mut(&mut self) -> &mut MrTable {
        &mut self.endpoint.mem
    }

    /// Its QPs, in the order they were added.
    pub fn qps(&self) -> impl Iterator<Item = &Qp> + '_ {
        self.endpoint.qps.iter()
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
        self.endpoint
            .mem
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
        self.endpoint
            .mem
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
        self.endpoint
            .mem
            .register_within(self.keys, offset, len, (pd, offset as u64, access))
            .expect("inside the host's buffer")
    }

    /// Adds a QP numbered `qpn` in RESET, sending on port 0; returns its index.
    pub fn add_qp(&mut self, qpn: u32, qp_type: QpType) -> usize {
        self.insert_qp(Qp::new(QpConfig::new(Qpn::new(qpn), qp_type, PD)), 0)
    }

    /// Adds `qp`, on port `port` (the testbed's bring-up makes that its `port_num`);
    /// returns how many QPs the host has before it.
    ///
    /// # Panics
    /// When the host has no port `port`, or already a QP with that number.
    pub fn insert_qp(&mut self, qp: Qp, port: usize) -> usize {
        assert!(port < self.ports.len(), "no port {port}");
        let qpn = qp.qpn().value();
        let i = self.endpoint.qps.len();
        assert!(
            self.endpoint.qps.insert(qp).is_none(),
            "QP {qpn:#x} added twice"
        );
        self.home.insert(qpn, port);
        i
    }

    /// The QP numbered `qpn`.
    ///
    /// # Panics
    /// When the host has no such QP.
    pub fn qp(&mut self, qpn: u32) -> &mut Qp {
        self.endpoint
            .qps
            .get_mut(qpn)
            .unwrap_or_else(|| panic!("no QP {qpn:#x}"))
    }

    /// The port QP `qpn` was added on, if the host has that QP.
    pub fn port_of(&self, qpn: u32) -> Option<usize> {
        self.home.get(&qpn).copied()
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
        self.endpoint.counters()
    }

    /// One turn at `now`: link changes, then every frame on every port, then every QP's
    /// due timers, frames (each on the port it names) and completions. Returns the frames
    /// sent.
    pub(crate) fn turn(&mut self, now: u64, scratch: &mut [u8]) -> usize {
        let Self {
            ports,
            endpoint,
            rx_malformed,
            rx_unknown_qp,
            completions,
            completed_at,
            ..
        } = self;
        // Only QPs with an alternate path act on link changes, so hosts without one skip
        // looking at the links.
        if endpoint.qps.iter().any(|q| q.active_port().is_some()) {
            for (i, port) in ports.iter().enumerate() {
                let up = port.link_state() == ferroce_drivers::LinkState::Up;
                endpoint.handle_link(now, i as u8, up, |_| {});
            }
        }
        for port in ports.iter_mut() {
            port.rx_burst(usize::MAX, |frame| {
                match endpoint.handle_frame(now, frame, Checks::ALL) {
                    Received::Qp { .. } => {}
                    Received::UnknownQp(_) => *rx_unknown_qp += 1,
                    Received::Malformed { .. } => *rx_malformed += 1,
                }
            });
        }
        let mut sent = 0;
        endpoint.poll_all(
            now,
            scratch,
            usize::MAX,
            |t, frame| {
                let n = t.len();
                // A refused frame (link down, ring full) is a lost frame; the transport
                // recovers it.
                let _ = ports[usize::from(t.port)].tx(n, |b| b.copy_from_slice(&frame[..n]));
                sent += 1;
            },
            |wc| {
                completions.push(wc);
                completed_at.push(now);
            },
        );
        for port in ports.iter_mut() {
            port.flush();
        }
        sent
    }

    /// The earliest QP timer.
    pub(crate) fn next_timeout(&self) -> Option<u64> {
        self.endpoint.poll_timeout()
    }
}
