//! A minimal engine for transport tests on the simulated fabric: hosts with one port, a
//! registered memory buffer and some QPs; a loop that moves frames between ports and QPs and
//! fires QP timers in virtual time. The real engine (verbs-api) does the same with more care
//! for batching; here clarity wins.
#![allow(dead_code, unreachable_pub)]

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::panic::{catch_unwind, AssertUnwindSafe};

use ferroce::drivers::sim::{Fabric, FabricBuilder, HostId, LinkModel};
use ferroce::drivers::Port;
use ferroce::stack::transport::{
    required_mask, Access, AddressVector, MrKeys, MrTable, Mtu, PdId, Policies, Qp, QpAttr,
    QpConfig, QpState, QpType, WorkCompletion,
};
use ferroce::stack::wire::{Checks, Psn, Qpn, RoceRepr};

/// Runs `f` for each seed (or only `FERROCE_SEED`), naming the seed if it fails.
pub fn seeded(default: impl IntoIterator<Item = u64>, mut f: impl FnMut(u64)) {
    let seeds: Vec<u64> = match std::env::var("FERROCE_SEED") {
        Ok(s) => vec![s.parse().expect("FERROCE_SEED is a number")],
        Err(_) => default.into_iter().collect(),
    };
    for seed in seeds {
        if let Err(e) = catch_unwind(AssertUnwindSafe(|| f(seed))) {
            eprintln!("failed with seed {seed}; replay with FERROCE_SEED={seed}");
            std::panic::resume_unwind(e);
        }
    }
}

/// A small deterministic generator for test choices (SplitMix64).
#[derive(Clone, Debug)]
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo).max(1)
    }

    pub fn chance(&mut self, p: f64) -> bool {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }
}

pub const PD: PdId = PdId(1);
pub const ALL: Access = Access::LOCAL_WRITE
    .with(Access::REMOTE_WRITE)
    .with(Access::REMOTE_READ)
    .with(Access::REMOTE_ATOMIC);

/// One simulated host.
pub struct Host<P> {
    pub port: P,
    pub mem: MrTable,
    /// Backing store of the host's registered memory (u64 so atomics are aligned).
    pub buf: Box<[u64]>,
    /// The whole buffer, registered with every right in `PD`; iova = byte offset.
    pub keys: MrKeys,
    pub ip: Ipv4Addr,
    pub qps: Vec<Qp>,
    by_qpn: HashMap<u32, usize>,
    pub completions: Vec<WorkCompletion>,
    pub rx_malformed: u64,
    pub rx_unknown_qp: u64,
}

impl<P: Port> Host<P> {
    pub fn new(port: P, bytes: usize, ip: Ipv4Addr, seed: u64) -> Self {
        let mut buf = vec![0u64; bytes.div_ceil(8)].into_boxed_slice();
        let mut mem = MrTable::new(seed);
        // SAFETY: `buf` is a heap allocation owned by the host next to the table; it never
        // moves (boxed slice) and outlives every access the table makes, because both are
        // dropped together and the table is dropped first (field order).
        let keys =
            unsafe { mem.register(PD, buf.as_mut_ptr().cast(), buf.len() * 8, 0, ALL) }.unwrap();
        Self {
            port,
            mem,
            buf,
            keys,
            ip,
            qps: Vec::new(),
            by_qpn: HashMap::new(),
            completions: Vec::new(),
            rx_malformed: 0,
            rx_unknown_qp: 0,
        }
    }

    pub fn bytes(&self) -> &[u8] {
        // SAFETY: u64 storage viewed as bytes: same allocation, alignment 1 <= 8, and
        // length in bytes.
        unsafe { std::slice::from_raw_parts(self.buf.as_ptr().cast(), self.buf.len() * 8) }
    }

    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`, with the exclusive borrow of the storage.
        unsafe { std::slice::from_raw_parts_mut(self.buf.as_mut_ptr().cast(), self.buf.len() * 8) }
    }

    pub fn word(&self, byte_offset: usize) -> u64 {
        self.buf[byte_offset / 8]
    }

    pub fn add_qp(&mut self, qpn: u32, qp_type: QpType) -> usize {
        let qp = Qp::new(QpConfig::new(Qpn::new(qpn), qp_type, PD));
        self.by_qpn.insert(qpn, self.qps.len());
        self.qps.push(qp);
        self.qps.len() - 1
    }

    pub fn qp(&mut self, qpn: u32) -> &mut Qp {
        let i = self.by_qpn[&qpn];
        &mut self.qps[i]
    }

    pub fn av_to(
        &self,
        peer_mac: ferroce::stack::wire::MacAddr,
        peer_ip: Ipv4Addr,
    ) -> AddressVector {
        AddressVector {
            smac: self.port.mac(),
            dmac: peer_mac,
            src: IpAddr::V4(self.ip),
            dst: IpAddr::V4(peer_ip),
            ..AddressVector::default()
        }
    }

    /// Receives, handles timers, transmits. Returns frames sent.
    fn pump(&mut self, now: u64, scratch: &mut [u8]) -> usize {
        let Self {
            port,
            mem,
            qps,
            by_qpn,
            rx_malformed,
            rx_unknown_qp,
            completions,
            ..
        } = self;
        port.rx_burst(usize::MAX, |frame| {
            match RoceRepr::parse(frame, Checks::ALL) {
                Ok(pkt) => match by_qpn.get(&pkt.repr.bth.dest_qpn.value()) {
                    Some(&i) => qps[i].handle_packet(now, &pkt, mem),
                    None => *rx_unknown_qp += 1,
                },
                Err(_) => *rx_malformed += 1,
            }
        });
        let mut sent = 0;
        for qp in qps.iter_mut() {
            if qp.poll_timeout().is_some_and(|t| t <= now) {
                qp.handle_timeout(now);
            }
            while let Some(n) = qp.poll_transmit(now, scratch, mem) {
                let frame = &scratch[..n];
                // A down link refuses; the transport's retry covers it.
                let _ = port.tx(n, |b| b.copy_from_slice(frame));
                sent += 1;
            }
            while let Some(wc) = qp.poll_completion() {
                completions.push(wc);
            }
        }
        port.flush();
        sent
    }

    fn next_timeout(&self) -> Option<u64> {
        self.qps.iter().filter_map(Qp::poll_timeout).min()
    }
}

/// Hosts on a fabric, and the loop that runs them.
pub struct World<P> {
    pub fabric: Fabric,
    pub hosts: Vec<Host<P>>,
    scratch: Vec<u8>,
}

impl<P: Port> World<P> {
    pub fn new(fabric: Fabric, hosts: Vec<Host<P>>) -> Self {
        Self {
            fabric,
            hosts,
            scratch: vec![0; 16 * 1024],
        }
    }

    /// Runs until nothing is left to do (no frame in flight, no timer armed) or virtual time
    /// passes `until`. Returns true when it went idle.
    pub fn run(&mut self, until: u64) -> bool {
        loop {
            let now = self.fabric.now();
            let mut sent = 0;
            for h in &mut self.hosts {
                sent += h.pump(now, &mut self.scratch);
            }
            if sent > 0 {
                // Frames sent at `now` may already be deliverable at `now` (zero-delay links).
                continue;
            }
            let next_event = self.fabric.next_event();
            let next_timer = self.hosts.iter().filter_map(Host::next_timeout).min();
            let next = match (next_event, next_timer) {
                (Some(a), Some(b)) => a.min(b),
                (a, b) => match a.or(b) {
                    Some(t) => t,
                    None => return true,
                },
            };
            if next > until {
                return false;
            }
            self.fabric.advance_to(next.max(now));
            if next <= now && next_event.is_none_or(|e| e > now) {
                // A timer due now that did nothing: advance a nanosecond to avoid spinning.
                self.fabric.advance_to(now + 1);
            }
        }
    }
}

/// Connection parameters both ends of a pair use.
#[derive(Clone, Copy, Debug)]
pub struct ConnOpts {
    pub mtu: Mtu,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub min_rnr_timer: u8,
    pub max_rd_atomic: u8,
    pub access: Access,
    pub qkey: u32,
}

impl Default for ConnOpts {
    fn default() -> Self {
        Self {
            mtu: Mtu::Mtu1024,
            timeout: 6,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 1,
            max_rd_atomic: 8,
            access: Access::REMOTE_WRITE
                .with(Access::REMOTE_READ)
                .with(Access::REMOTE_ATOMIC),
            qkey: 0x1111_1111,
        }
    }
}

/// Brings `(host, qpn)` to RTS towards `(peer_host, peer_qpn)` with PSNs `sq_psn`/`rq_psn`.
pub fn bring_up<P: Port>(
    w: &mut World<P>,
    (h, qpn): (usize, u32),
    (ph, peer_qpn): (usize, u32),
    sq_psn: u32,
    rq_psn: u32,
    o: ConnOpts,
) {
    let peer_mac = w.hosts[ph].port.mac();
    let peer_ip = w.hosts[ph].ip;
    let av = w.hosts[h].av_to(peer_mac, peer_ip);
    let qp = w.hosts[h].qp(qpn);
    let t = qp.qp_type();
    let a = QpAttr {
        qp_access_flags: o.access,
        qkey: o.qkey,
        ah_attr: av,
        path_mtu: o.mtu,
        dest_qp_num: Qpn::new(peer_qpn),
        rq_psn: Psn::new(rq_psn),
        max_dest_rd_atomic: o.max_rd_atomic,
        min_rnr_timer: o.min_rnr_timer,
        sq_psn: Psn::new(sq_psn),
        timeout: o.timeout,
        retry_cnt: o.retry_cnt,
        rnr_retry: o.rnr_retry,
        max_rd_atomic: o.max_rd_atomic,
        ..QpAttr::default()
    };
    for (from, to) in [
        (QpState::Reset, QpState::Init),
        (QpState::Init, QpState::Rtr),
        (QpState::Rtr, QpState::Rts),
    ] {
        let mask = required_mask(t, from, to).unwrap();
        qp.modify(&QpAttr { qp_state: to, ..a }, mask).unwrap();
    }
    if t == QpType::Ud {
        // UD has no path; its MTU is the port's.
        qp.set_port_mtu(o.mtu);
    }

    assert_eq!(qp.state(), QpState::Rts);
}

/// Two hosts `a` (10.0.0.1) and `b` (10.0.0.2) on one link with `model` both ways.
pub fn two_hosts(
    seed: u64,
    model: LinkModel,
    mem_bytes: usize,
) -> World<ferroce::drivers::sim::SimPort> {
    let mut b = FabricBuilder::new(seed);
    b.rx_ring(1 << 16);
    let ha: HostId = b.host("a", 1);
    let hb: HostId = b.host("b", 1);
    b.link((ha, 0), (hb, 0), model);
    hosts_a_and_b(b, (ha, hb), seed, mem_bytes)
}

/// A connected RC/UC pair: QP `qpn_a` on host 0 and `qpn_b` on host 1.
pub fn connect_pair<P: Port>(
    w: &mut World<P>,
    t: QpType,
    qpn_a: u32,
    qpn_b: u32,
    psn_a: u32,
    psn_b: u32,
    o: ConnOpts,
) {
    connect_pair_with(w, t, (qpn_a, qpn_b), (psn_a, psn_b), o, None);
}

/// Makes the reliability policy of one end of a connection (both ends get their own).
pub type PolicyFn = fn() -> Policies;

/// [`connect_pair`] with both ends running `policy` (Go-Back-N when `None`).
pub fn connect_pair_with<P: Port>(
    w: &mut World<P>,
    t: QpType,
    (qpn_a, qpn_b): (u32, u32),
    (psn_a, psn_b): (u32, u32),
    o: ConnOpts,
    policy: Option<PolicyFn>,
) {
    w.hosts[0].add_qp(qpn_a, t);
    w.hosts[1].add_qp(qpn_b, t);
    if let Some(make) = policy {
        w.hosts[0].qp(qpn_a).set_policies(make());
        w.hosts[1].qp(qpn_b).set_policies(make());
    }
    bring_up(w, (0, qpn_a), (1, qpn_b), psn_a, psn_b, o);
    bring_up(w, (1, qpn_b), (0, qpn_a), psn_b, psn_a, o);
}

/// Hosts `a` and `b` joined through two switches by one parallel path per model: path `i`
/// is the `i`-th link between the switches, which pick it as `UDP source port mod n`. The
/// hosts' own links are clean and fast.
pub fn multipath_hosts(seed: u64, paths: Vec<LinkModel>, mem_bytes: usize) -> SimWorld {
    let both = paths.into_iter().map(|m| (m.clone(), m)).collect();
    multipath_hosts_asym(seed, both, mem_bytes)
}

/// [`multipath_hosts`] with each path's two directions apart: `(a to b, b to a)`.
pub fn multipath_hosts_asym(
    seed: u64,
    paths: Vec<(LinkModel, LinkModel)>,
    mem_bytes: usize,
) -> SimWorld {
    let mut b = FabricBuilder::new(seed);
    b.rx_ring(1 << 16);
    b.ecmp(ferroce::drivers::sim::EcmpHash::SourcePortModulo);
    let ha: HostId = b.host("a", 1);
    let hb: HostId = b.host("b", 1);
    let s0 = b.switch("s0");
    let s1 = b.switch("s1");
    let edge = |m: &LinkModel| {
        let mut e = LinkModel::new(m.bandwidth_bps, 100);
        e.queue_limit_bytes = m.queue_limit_bytes;
        e
    };
    b.link((ha, 0), s0, edge(&paths[0].0));
    b.link((hb, 0), s1, edge(&paths[0].0));
    for (ab, ba) in paths {
        b.link_asym(s0, s1, ab, ba);
    }
    hosts_a_and_b(b, (ha, hb), seed, mem_bytes)
}

/// Builds the fabric and puts hosts 10.0.0.1 and 10.0.0.2 with `mem_bytes` of registered
/// memory on port 0 of `ha` and `hb`.
fn hosts_a_and_b(
    b: FabricBuilder,
    (ha, hb): (HostId, HostId),
    seed: u64,
    mem_bytes: usize,
) -> SimWorld {
    let fabric = b.build().unwrap();
    let pa = fabric.port(ha, 0);
    let pb = fabric.port(hb, 0);
    let hosts = vec![
        Host::new(pa, mem_bytes, Ipv4Addr::new(10, 0, 0, 1), seed ^ 0xa),
        Host::new(pb, mem_bytes, Ipv4Addr::new(10, 0, 0, 2), seed ^ 0xb),
    ];
    World::new(fabric, hosts)
}

/// The world of the simulated fabric.
pub type SimWorld = World<ferroce::drivers::sim::SimPort>;

impl<P: Port> Host<P> {
    pub fn port_mac(&self) -> ferroce::stack::wire::MacAddr {
        self.port.mac()
    }
}
