//! Devices on a simulated fabric: every host a device, one virtual clock for all, advanced
//! only when every device is idle. `ferroce perf` runs both ends of a test this way in one
//! process, and tests use it to drive the verbs API in virtual time.

use std::io::{BufWriter, Write};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Mutex};

use ferroce_drivers::pcap::{Direction, PcapTee};
use ferroce_drivers::sim::{Fabric, FabricBuilder, LinkId, LinkModel};

use crate::device::{Device, SimClock};
use crate::verbs::{Context, VerbsError};

/// A simulated fabric and the devices on it.
pub struct SimNet {
    clock: Arc<SimClock>,
    link: LinkId,
}

impl SimNet {
    /// Two hosts, `a` (10.0.0.1) and `b` (10.0.0.2), on one link with `model` both ways, as
    /// devices `sim:a` and `sim:b`. With `pcap`, host a's port is recorded both ways.
    pub fn pair(
        seed: u64,
        model: LinkModel,
        eth_mtu: usize,
        pcap: Option<Box<dyn Write + Send>>,
    ) -> Result<(Self, Context, Context), VerbsError> {
        let mut b = FabricBuilder::new(seed);
        b.mtu(eth_mtu).rx_ring(1 << 16);
        let ha = b.host("a", 1);
        let hb = b.host("b", 1);
        let link = b.link((ha, 0), (hb, 0), model);
        let fabric = b
            .build()
            .map_err(|e| VerbsError::Open(format!("cannot build the simulated fabric: {e}")))?;
        let (pa, pb) = (fabric.port(ha, 0), fabric.port(hb, 0));
        let clock = Arc::new(SimClock {
            fabric,
            devices: Mutex::new(Vec::new()),
        });
        let ip = |n| IpAddr::V4(Ipv4Addr::new(10, 0, 0, n));
        let da = match pcap {
            Some(sink) => {
                let tee = PcapTee::new(pa, BufWriter::new(sink), Direction::Both)
                    .map_err(|e| VerbsError::Open(format!("cannot write the pcap: {e}")))?;
                Device::new("sim:a".into(), tee, ip(1), seed ^ 0xa, Some(clock.clone()))
            }
            None => Device::new("sim:a".into(), pa, ip(1), seed ^ 0xa, Some(clock.clone())),
        };
        let db = Device::new("sim:b".into(), pb, ip(2), seed ^ 0xb, Some(clock.clone()));
        {
            let mut d = clock.devices.lock().unwrap_or_else(|e| e.into_inner());
            d.push(Arc::downgrade(&da));
            d.push(Arc::downgrade(&db));
        }
        Ok((
            Self { clock, link },
            Context { dev: da },
            Context { dev: db },
        ))
    }

    /// Two hosts with two ports each, as devices `sim:a` (10.0.0.1 on port 1, 10.0.1.1 on
    /// port 2) and `sim:b` (10.0.0.2, 10.0.1.2): port 1 of both on one link, port 2 on
    /// another, `model` on each — two rails, for native failover between ports. `link()`
    /// is rail 1's link; [`rail_links`](Self::rail_links) has both.
    pub fn rails(
        seed: u64,
        model: LinkModel,
        eth_mtu: usize,
    ) -> Result<(Self, [LinkId; 2], Context, Context), VerbsError> {
        let mut b = FabricBuilder::new(seed);
        b.mtu(eth_mtu).rx_ring(1 << 16);
        let ha = b.host("a", 2);
        let hb = b.host("b", 2);
        let l0 = b.link((ha, 0), (hb, 0), model.clone());
        let l1 = b.link((ha, 1), (hb, 1), model);
        let fabric = b
            .build()
            .map_err(|e| VerbsError::Open(format!("cannot build the simulated fabric: {e}")))?;
        let ports = |h| vec![fabric.port(h, 0), fabric.port(h, 1)];
        let (pa, pb) = (ports(ha), ports(hb));
        let clock = Arc::new(SimClock {
            fabric,
            devices: Mutex::new(Vec::new()),
        });
        let ips = |n| {
            vec![
                IpAddr::V4(Ipv4Addr::new(10, 0, 0, n)),
                IpAddr::V4(Ipv4Addr::new(10, 0, 1, n)),
            ]
        };
        let da = Device::multi_port("sim:a".into(), pa, ips(1), seed ^ 0xa, Some(clock.clone()));
        let db = Device::multi_port("sim:b".into(), pb, ips(2), seed ^ 0xb, Some(clock.clone()));
        {
            let mut d = clock.devices.lock().unwrap_or_else(|e| e.into_inner());
            d.push(Arc::downgrade(&da));
            d.push(Arc::downgrade(&db));
        }
        Ok((
            Self { clock, link: l0 },
            [l0, l1],
            Context { dev: da },
            Context { dev: db },
        ))
    }

    /// Virtual time now, in nanoseconds.
    pub fn now(&self) -> u64 {
        self.clock.fabric.now()
    }

    /// The link between the two hosts.
    pub fn link(&self) -> LinkId {
        self.link
    }

    /// The fabric (link statistics, hooks).
    pub fn fabric(&self) -> &Fabric {
        &self.clock.fabric
    }

    /// One step of every device (and of virtual time if all were idle). False when nothing
    /// is left to happen.
    pub fn step(&self) -> bool {
        self.clock.step()
    }

    /// Steps until `done()` holds or nothing is left to happen; returns `done()`.
    pub fn run_until(&self, mut done: impl FnMut() -> bool) -> bool {
        loop {
            if done() {
                return true;
            }
            if !self.step() {
                return done();
            }
        }
    }
}

/// Two devices joined by an in-memory pipe on the real clock (`pipe:a`, `pipe:b`): the
/// engine runs for real, on the caller's thread or an engine thread, with no simulator.
pub fn pipe_pair(eth_mtu: usize) -> (Context, Context) {
    let (pa, pb) = ferroce_drivers::pipe::pair(eth_mtu);
    let ip = |n| IpAddr::V4(Ipv4Addr::new(10, 0, 1, n));
    (
        Context {
            dev: Device::new("pipe:a".into(), pa, ip(1), 0xa, None),
        },
        Context {
            dev: Device::new("pipe:b".into(), pb, ip(2), 0xb, None),
        },
    )
}

/// [`pipe_pair`] with `queues` engines per device, as a multi-queue port has: engine i of
/// one device is piped to engine i of the other, so a frame lands on the engine of the
/// sender's queue and is handed to the engine of its QP when that is another, as receive-side
/// scaling on a NIC does. For testing QP placement and moves without DPDK.
pub fn pipe_pair_queues(eth_mtu: usize, queues: usize) -> (Context, Context) {
    let ip = |n| IpAddr::V4(Ipv4Addr::new(10, 0, 1, n));
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for _ in 0..queues.max(1) {
        let (pa, pb) = ferroce_drivers::pipe::pair(eth_mtu);
        a.push(crate::device::boxed_engine(pa, 0xa, true));
        b.push(crate::device::boxed_engine(pb, 0xb, true));
    }
    (
        Context {
            dev: Device::with_engines("pipe:a".into(), a, ip(1), 0xa, None),
        },
        Context {
            dev: Device::with_engines("pipe:b".into(), b, ip(2), 0xb, None),
        },
    )
}
