//! An in-process Ethernet fabric in virtual time.
//!
//! Hosts have ports; links join a host port to a switch or to another host port; switches
//! forward by destination MAC along shortest paths and spread flows over equal-cost ports by
//! hashing the UDP source port (with the rest of the 5-tuple). Every link direction has its own
//! [`LinkModel`]: bandwidth, delay, queue limit, independent or Gilbert-Elliott loss,
//! duplication, reordering, bit corruption and an up/down schedule. Several parallel links
//! between two switches are several paths, each with its own delay and loss. A
//! [`SwitchHook`] lets in-network logic inspect, rewrite, reroute or drop frames.
//!
//! Time moves only when the harness says so ([`Fabric::advance_to`], [`Fabric::step`]), in
//! the manner of quinn's test `Pair`: poll every endpoint, then jump to the earliest of the
//! next arrival and the endpoints' own timers. Events are ordered by (time, sequence number)
//! and every random draw comes from a per-link-direction generator seeded from the fabric's
//! seed, so the same seed and the same calls give the same run, byte for byte.

mod link;
mod switch;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use ferroce_stack::switch::{HookCtx, SwitchHook, Verdict};
use ferroce_stack::wire::{Checks, MacAddr};
use rand::SeedableRng;
use rand_xoshiro::Xoshiro256PlusPlus;

pub use link::{LinkModel, LinkStats, Loss, Red, WIRE_OVERHEAD};
pub use switch::{EcmpHash, FlowKey, SwitchStats};

use crate::{LinkState, Port, PortCapabilities, TxError};
use link::Channel;

/// A host of the fabric.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HostId(pub usize);

/// What [`Fabric::advance_idle`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Idle {
    /// Time moved to the next arrival or deadline.
    Advanced,
    /// Nothing is in flight and no deadline is armed: nothing will ever happen again.
    Done,
    /// The next thing happens after the harness's horizon; time stayed.
    Beyond,
}

/// A switch of the fabric.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SwitchId(pub usize);

/// A link (both directions) of the fabric.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LinkId(pub usize);

/// One end of a link being built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    /// Port `index` of a host.
    Host(HostId, usize),
    /// A new port of a switch.
    Switch(SwitchId),
}

impl From<(HostId, usize)> for End {
    fn from((h, i): (HostId, usize)) -> Self {
        Self::Host(h, i)
    }
}

impl From<SwitchId> for End {
    fn from(s: SwitchId) -> Self {
        Self::Switch(s)
    }
}

/// Why a topology could not be built.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BuildError {
    /// A host port is named that the host does not have.
    #[error("host {host} has {ports} ports, there is no port {index}")]
    NoSuchPort {
        /// The host's name.
        host: String,
        /// Ports it has.
        ports: usize,
        /// Port asked for.
        index: usize,
    },
    /// A host port is joined to two links.
    #[error("port {index} of host {host} is already linked")]
    PortInUse {
        /// The host's name.
        host: String,
        /// The port.
        index: usize,
    },
}

ferroce_stack::counter_set! {
    /// Counters of one host port, named like a NIC's.
    pub struct PortStats {
        /// Frames handed to the stack.
        rx_frames,
        /// Bytes handed to the stack.
        rx_bytes,
        /// Frames sent.
        tx_frames,
        /// Bytes sent.
        tx_bytes,
        /// Frames dropped because the receive ring was full (a NIC's `rx_missed`).
        rx_dropped,
        /// Frames dropped because they were addressed to another MAC.
        rx_filtered,
        /// Frames sent on a port that has no link.
        tx_unconnected,
    }
}

/// Topology and settings, turned into a [`Fabric`] by [`build`](Self::build).
pub struct FabricBuilder {
    seed: u64,
    ecmp: EcmpHash,
    mtu: usize,
    rx_ring: usize,
    hosts: Vec<(String, usize)>,
    switches: Vec<String>,
    links: Vec<(End, End, LinkModel, LinkModel)>,
}

impl FabricBuilder {
    /// An empty fabric whose every random choice derives from `seed`.
    pub fn new(seed: u64) -> Self {
        Self {
            seed,
            ecmp: EcmpHash::default(),
            mtu: 9000,
            rx_ring: 4096,
            hosts: Vec::new(),
            switches: Vec::new(),
            links: Vec::new(),
        }
    }

    /// How switches choose among equal-cost ports (default: 5-tuple hash).
    pub fn ecmp(&mut self, hash: EcmpHash) -> &mut Self {
        self.ecmp = hash;
        self
    }

    /// IP MTU of every host port (default 9000, enough for RoCE's 4096-byte path MTU).
    pub fn mtu(&mut self, mtu: usize) -> &mut Self {
        self.mtu = mtu;
        self
    }

    /// Frames a host port's receive ring holds before it drops (default 4096).
    pub fn rx_ring(&mut self, frames: usize) -> &mut Self {
        self.rx_ring = frames.max(1);
        self
    }

    /// Adds a host with `ports` ports. Port `i` of host `h` has MAC `02:00:00:hh:hh:ii`.
    pub fn host(&mut self, name: &str, ports: usize) -> HostId {
        self.hosts.push((name.to_owned(), ports));
        HostId(self.hosts.len() - 1)
    }

    /// Adds a switch; it gains a port with every link attached to it.
    pub fn switch(&mut self, name: &str) -> SwitchId {
        self.switches.push(name.to_owned());
        SwitchId(self.switches.len() - 1)
    }

    /// Joins `a` and `b` with a link behaving as `model` in both directions.
    pub fn link(&mut self, a: impl Into<End>, b: impl Into<End>, model: LinkModel) -> LinkId {
        self.link_asym(a, b, model.clone(), model)
    }

    /// Joins `a` and `b` with `a_to_b` and `b_to_a` as the two directions' models.
    pub fn link_asym(
        &mut self,
        a: impl Into<End>,
        b: impl Into<End>,
        a_to_b: LinkModel,
        b_to_a: LinkModel,
    ) -> LinkId {
        self.links.push((a.into(), b.into(), a_to_b, b_to_a));
        LinkId(self.links.len() - 1)
    }

    /// Builds the fabric and its routes.
    pub fn build(self) -> Result<Fabric, BuildError> {
        let mut ports = Vec::new();
        let mut hosts = Vec::new();
        for (h, (name, n)) in self.hosts.iter().enumerate() {
            let slots = (0..*n)
                .map(|i| {
                    ports.push(PortSlot::new(
                        Owner::Host,
                        MacAddr([0x02, 0, 0, (h >> 8) as u8, h as u8, i as u8]),
                    ));
                    ports.len() - 1
                })
                .collect();
            hosts.push(HostSlot {
                name: name.clone(),
                ports: slots,
            });
        }
        let mut switches: Vec<SwitchSlot> = self
            .switches
            .iter()
            .enumerate()
            .map(|(i, name)| SwitchSlot {
                name: name.clone(),
                ports: Vec::new(),
                routes: HashMap::new(),
                host_ports: Vec::new(),
                hook: None,
                stats: SwitchStats::default(),
                salt: (self.seed as u32) ^ (i as u32).wrapping_mul(0x9e37_79b9),
            })
            .collect();

        let mut links = Vec::new();
        for (li, (a, b, ab, ba)) in self.links.into_iter().enumerate() {
            let mut ends = [0usize; 2];
            for (k, end) in [a, b].into_iter().enumerate() {
                ends[k] = match end {
                    End::Host(HostId(h), i) => {
                        let (name, n) = &self.hosts[h];
                        let slot =
                            *hosts[h]
                                .ports
                                .get(i)
                                .ok_or_else(|| BuildError::NoSuchPort {
                                    host: name.clone(),
                                    ports: *n,
                                    index: i,
                                })?;
                        if ports[slot].peer.is_some() {
                            return Err(BuildError::PortInUse {
                                host: name.clone(),
                                index: i,
                            });
                        }
                        slot
                    }
                    End::Switch(SwitchId(s)) => {
                        let index = switches[s].ports.len();
                        ports.push(PortSlot::new(Owner::Switch(s, index), MacAddr::default()));
                        switches[s].ports.push(ports.len() - 1);
                        ports.len() - 1
                    }
                };
                ports[ends[k]].peer = Some((li, k));
            }
            let rng = |dir: usize| {
                Xoshiro256PlusPlus::seed_from_u64(splitmix64(
                    self.seed ^ splitmix64((li * 2 + dir) as u64 + 1),
                ))
            };
            links.push(LinkSlot {
                ends,
                dirs: [Channel::new(ab, rng(0)), Channel::new(ba, rng(1))],
            });
        }

        let mut core = Core {
            now: 0,
            seq: 0,
            events: BinaryHeap::new(),
            ports,
            links,
            hosts,
            switches,
            ecmp: self.ecmp,
            mtu: self.mtu,
            rx_ring: self.rx_ring,
            pool: Vec::new(),
        };
        core.compute_routes();
        core.mark_host_ports();
        Ok(Fabric {
            core: Arc::new(Mutex::new(core)),
        })
    }
}

/// The fabric: a cheap handle (clone it freely) onto shared state.
#[derive(Clone)]
pub struct Fabric {
    core: Arc<Mutex<Core>>,
}

impl Fabric {
    fn lock(&self) -> MutexGuard<'_, Core> {
        self.core.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A port handle for port `index` of `host`. Two handles on one port share its queues.
    ///
    /// # Panics
    /// If the host has no such port: topologies are built by the program, not read from the
    /// wire.
    pub fn port(&self, host: HostId, index: usize) -> SimPort {
        let core = self.lock();
        let slot = core.hosts[host.0].ports[index];
        SimPort {
            core: Arc::clone(&self.core),
            slot,
            mac: core.ports[slot].mac,
            mtu: core.mtu,
            pending: Vec::new(),
            spare: Vec::new(),
            batch: Vec::new(),
        }
    }

    /// The MAC of port `index` of `host`.
    pub fn mac(&self, host: HostId, index: usize) -> MacAddr {
        let core = self.lock();
        core.ports[core.hosts[host.0].ports[index]].mac
    }

    /// Virtual time now, in nanoseconds.
    pub fn now(&self) -> u64 {
        self.lock().now
    }

    /// When the next frame arrives anywhere, if one is in flight.
    pub fn next_event(&self) -> Option<u64> {
        self.lock().events.peek().map(|e| e.0.time)
    }

    /// When a link next goes up or down, or a black hole opens or closes.
    pub fn next_link_change(&self) -> Option<u64> {
        self.lock().next_change()
    }

    /// Takes link `link` down both ways in `[from, until)` (ns): a cable pulled, or the port
    /// at either end failing. Overlapping faults add up.
    pub fn fail_link(&self, link: LinkId, from: u64, until: u64) {
        let mut core = self.lock();
        if let Some(l) = core.links.get_mut(link.0) {
            for d in &mut l.dirs {
                d.add_down(from, until);
            }
        }
    }

    /// Makes link `link` lose every frame both ways in `[from, until)` while its carrier
    /// stays up: a black hole, which only the endpoints' own evidence can find.
    pub fn blackhole_link(&self, link: LinkId, from: u64, until: u64) {
        let mut core = self.lock();
        if let Some(l) = core.links.get_mut(link.0) {
            for d in &mut l.dirs {
                d.add_blackhole(from, until);
            }
        }
    }

    /// Slows link `link` to `bps` both ways in `[from, until)` (ns): a partial degradation
    /// (a port that trained down to fewer lanes), which loses nothing and shows only in the
    /// rate ([`port_rate`](Self::port_rate)).
    pub fn degrade_link(&self, link: LinkId, from: u64, until: u64, bps: u64) {
        let mut core = self.lock();
        if let Some(l) = core.links.get_mut(link.0) {
            for d in &mut l.dirs {
                d.add_slowdown(from, until, bps);
            }
        }
    }

    /// The rate of port `index` of host `host` now, in bits per second (what
    /// `ibv_query_port`'s active speed and width say): its link's outgoing rate, 0 when it
    /// is down or not connected.
    pub fn port_rate(&self, host: HostId, index: usize) -> u64 {
        let core = self.lock();
        let Some(&slot) = core.hosts.get(host.0).and_then(|h| h.ports.get(index)) else {
            return 0;
        };
        match core.ports[slot].peer {
            Some((l, dir)) if core.links[l].dirs[dir].is_up(core.now) => {
                core.links[l].dirs[dir].rate_at(core.now)
            }
            _ => 0,
        }
    }

    /// Bytes queued now in direction `dir` of link `link` (`dir` 0 carries frames from the
    /// link's first end, as it was built, to its second): a switch port's egress queue when
    /// the second end is a host.
    pub fn queue_bytes(&self, link: LinkId, dir: usize) -> usize {
        let core = self.lock();
        core.links
            .get(link.0)
            .and_then(|l| l.dirs.get(dir))
            .map_or(0, |d| d.backlog_bytes(core.now))
    }

    /// Fails switch `s` in `[from, until)`: every link it has goes down.
    pub fn fail_switch(&self, s: SwitchId, from: u64, until: u64) {
        for l in self.links_of_switch(s) {
            self.fail_link(l, from, until);
        }
    }

    /// Fails port `index` of host `host` (its NIC) in `[from, until)`: its link goes down.
    pub fn fail_port(&self, host: HostId, index: usize, from: u64, until: u64) {
        if let Some(l) = self.link_of_port(host, index) {
            self.fail_link(l, from, until);
        }
    }

    /// The link on port `index` of host `host`, if it is connected.
    pub fn link_of_port(&self, host: HostId, index: usize) -> Option<LinkId> {
        let core = self.lock();
        let slot = *core.hosts.get(host.0)?.ports.get(index)?;
        core.ports[slot].peer.map(|(l, _)| LinkId(l))
    }

    /// Every link with an end on switch `s`.
    pub fn links_of_switch(&self, s: SwitchId) -> Vec<LinkId> {
        let core = self.lock();
        let Some(sw) = core.switches.get(s.0) else {
            return Vec::new();
        };
        sw.ports
            .iter()
            .filter_map(|&slot| core.ports[slot].peer.map(|(l, _)| LinkId(l)))
            .collect()
    }

    /// Delivers every frame due by `t` in order, then sets the clock to `t`. Time never goes
    /// back: an earlier `t` delivers nothing.
    pub fn advance_to(&self, t: u64) {
        let mut core = self.lock();
        while core.events.peek().is_some_and(|e| e.0.time <= t) {
            let Reverse(ev) = core.events.pop().expect("peeked");
            core.now = core.now.max(ev.time);
            core.deliver(ev);
        }
        core.now = core.now.max(t);
    }

    /// Jumps to the next arrival time and delivers everything due then; returns that time,
    /// or `None` when nothing is in flight.
    pub fn step(&self) -> Option<u64> {
        let t = self.next_event()?;
        self.advance_to(t);
        Some(t)
    }

    /// The one rule every harness on this fabric follows when its endpoints had nothing to
    /// do: jump to the earliest of the next arrival, `deadline` (the endpoints' earliest
    /// timer) and a link change before them, delivering what is due then, unless that is past
    /// `until`. A deadline due now that did nothing moves time on by a nanosecond, so a
    /// harness never spins in place.
    pub fn advance_idle(&self, deadline: Option<u64>, until: u64) -> Idle {
        let now = self.now();
        let next_event = self.next_event();
        let Some(next) = [next_event, deadline].into_iter().flatten().min() else {
            return Idle::Done;
        };
        // While something is still to happen, the clock also stops where a link changes
        // before it, so whoever polls the port then sees the new state. (A link change alone,
        // with nothing in flight and no timer, changes nothing anyone waits for.)
        let next = self.next_link_change().map_or(next, |c| next.min(c));
        if next > until {
            return Idle::Beyond;
        }
        self.advance_to(next.max(now));
        if next <= now && next_event.is_none_or(|e| e > now) {
            self.advance_to(now + 1);
        }
        Idle::Advanced
    }

    /// Counters of a link: `[a→b, b→a]` in the order the link was built.
    pub fn link_stats(&self, link: LinkId) -> [LinkStats; 2] {
        let core = self.lock();
        let l = &core.links[link.0];
        [l.dirs[0].stats, l.dirs[1].stats]
    }

    /// Counters of a host port.
    pub fn port_stats(&self, host: HostId, index: usize) -> PortStats {
        let core = self.lock();
        core.ports[core.hosts[host.0].ports[index]].stats
    }

    /// Counters of a switch.
    pub fn switch_stats(&self, switch: SwitchId) -> SwitchStats {
        self.lock().switches[switch.0].stats
    }

    /// Name of a host, as given to the builder.
    pub fn host_name(&self, host: HostId) -> String {
        self.lock().hosts[host.0].name.clone()
    }

    /// Name of a switch, as given to the builder.
    pub fn switch_name(&self, switch: SwitchId) -> String {
        self.lock().switches[switch.0].name.clone()
    }

    /// Installs (replacing any other) the hook a switch runs on every frame.
    pub fn set_hook(&self, switch: SwitchId, hook: impl SwitchHook + 'static) {
        self.lock().switches[switch.0].hook = Some(Box::new(hook));
    }

    /// Removes a switch's hook.
    pub fn clear_hook(&self, switch: SwitchId) {
        self.lock().switches[switch.0].hook = None;
    }
}

/// A host port of the fabric, as a [`Port`].
pub struct SimPort {
    core: Arc<Mutex<Core>>,
    slot: usize,
    mac: MacAddr,
    mtu: usize,
    /// Frames written by `tx`, sent at `flush`.
    pending: Vec<Vec<u8>>,
    /// Buffers to reuse, so steady traffic does not allocate.
    spare: Vec<Vec<u8>>,
    /// Frames taken from the ring by the current `rx_burst`.
    batch: Vec<Vec<u8>>,
}

/// Most frames one burst moves, as a DPDK burst of 32 or 64 would.
const MAX_BURST: usize = 64;
/// Most spare buffers a port keeps.
const MAX_SPARE: usize = 1024;

impl SimPort {
    fn lock(&self) -> MutexGuard<'_, Core> {
        self.core.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// This port's counters.
    pub fn stats(&self) -> PortStats {
        self.lock().ports[self.slot].stats
    }
}

impl Port for SimPort {
    fn rx_burst<F: FnMut(&[u8])>(&mut self, max: usize, mut f: F) -> usize {
        {
            let mut core = self.core.lock().unwrap_or_else(|e| e.into_inner());
            let rx = &mut core.ports[self.slot].rx;
            let n = max.min(rx.len());
            self.batch.extend(rx.drain(..n));
        }
        // The lock is released before user code runs: it may flush another port.
        let n = self.batch.len();
        for frame in self.batch.drain(..) {
            f(&frame);
            if self.spare.len() < MAX_SPARE {
                self.spare.push(frame);
            }
        }
        n
    }

    fn tx<F: FnOnce(&mut [u8])>(&mut self, len: usize, fill: F) -> Result<(), TxError> {
        let max = self.mtu + 18;
        if len > max {
            return Err(TxError::TooLong { len, max });
        }
        if self.pending.len() >= MAX_BURST {
            self.flush();
        }
        let mut buf = self.spare.pop().unwrap_or_default();
        buf.clear();
        buf.resize(len, 0);
        fill(&mut buf);
        self.pending.push(buf);
        Ok(())
    }

    fn flush(&mut self) -> usize {
        if self.pending.is_empty() {
            return 0;
        }
        let n = self.pending.len();
        let mut core = self.core.lock().unwrap_or_else(|e| e.into_inner());
        for frame in self.pending.drain(..) {
            core.send(self.slot, frame);
        }
        n
    }

    fn link_state(&self) -> LinkState {
        let core = self.lock();
        match core.ports[self.slot].peer {
            Some((l, dir)) if core.links[l].dirs[dir].is_up(core.now) => LinkState::Up,
            _ => LinkState::Down,
        }
    }

    fn mac(&self) -> MacAddr {
        self.mac
    }

    fn mtu(&self) -> usize {
        self.mtu
    }

    fn capabilities(&self) -> PortCapabilities {
        PortCapabilities {
            max_burst: MAX_BURST,
            rx_checks: Checks::ALL,
            tx_split_min: None,
        }
    }

    fn now_ns(&self) -> u64 {
        self.lock().now
    }
}

enum Owner {
    Host,
    /// A switch and the port's number on it.
    Switch(usize, usize),
}

struct PortSlot {
    owner: Owner,
    mac: MacAddr,
    /// The link this port is on and the index of its outgoing direction.
    peer: Option<(usize, usize)>,
    rx: VecDeque<Vec<u8>>,
    stats: PortStats,
}

impl PortSlot {
    fn new(owner: Owner, mac: MacAddr) -> Self {
        Self {
            owner,
            mac,
            peer: None,
            rx: VecDeque::new(),
            stats: PortStats::default(),
        }
    }
}

struct HostSlot {
    name: String,
    ports: Vec<usize>,
}

struct SwitchSlot {
    name: String,
    /// Port slots, indexed by switch port number.
    ports: Vec<usize>,
    /// Equal-cost egress switch ports per destination MAC.
    routes: HashMap<MacAddr, Vec<usize>>,
    /// Per switch port: a host at the other end.
    host_ports: Vec<bool>,
    hook: Option<Box<dyn SwitchHook>>,
    stats: SwitchStats,
    salt: u32,
}

struct LinkSlot {
    /// Port slots at either end; `dirs[k]` carries frames from `ends[k]` to `ends[1 - k]`.
    ends: [usize; 2],
    dirs: [Channel; 2],
}

/// A frame due to arrive at a port.
struct Event {
    time: u64,
    seq: u64,
    to: usize,
    frame: Vec<u8>,
}

impl PartialEq for Event {
    fn eq(&self, o: &Self) -> bool {
        (self.time, self.seq) == (o.time, o.seq)
    }
}
impl Eq for Event {}
impl PartialOrd for Event {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Event {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.time, self.seq).cmp(&(o.time, o.seq))
    }
}

struct Core {
    now: u64,
    seq: u64,
    events: BinaryHeap<Reverse<Event>>,
    ports: Vec<PortSlot>,
    links: Vec<LinkSlot>,
    hosts: Vec<HostSlot>,
    switches: Vec<SwitchSlot>,
    ecmp: EcmpHash,
    mtu: usize,
    rx_ring: usize,
    pool: Vec<Vec<u8>>,
}

impl Core {
    /// The first link change after now.
    fn next_change(&self) -> Option<u64> {
        self.links
            .iter()
            .flat_map(|l| l.dirs.iter())
            .filter_map(|d| d.next_change(self.now))
            .min()
    }

    fn schedule(&mut self, time: u64, to: usize, frame: Vec<u8>) {
        self.seq += 1;
        self.events.push(Reverse(Event {
            time,
            seq: self.seq,
            to,
            frame,
        }));
    }

    fn recycle(&mut self, frame: Vec<u8>) {
        if self.pool.len() < MAX_SPARE {
            self.pool.push(frame);
        }
    }

    /// Puts a frame on the link of port `from` at the current time.
    fn send(&mut self, from: usize, mut frame: Vec<u8>) {
        let Some((link, dir)) = self.ports[from].peer else {
            self.ports[from].stats.tx_unconnected += 1;
            return;
        };
        self.ports[from].stats.tx_frames += 1;
        self.ports[from].stats.tx_bytes += frame.len() as u64;
        let now = self.now;
        let to = self.links[link].ends[1 - dir];
        let fate = self.links[link].dirs[dir].offer(now, frame.len());
        let Some(arrival) = fate.arrival else {
            self.recycle(frame);
            return;
        };
        if let Some(bit) = fate.flip_bit {
            if let Some(b) = frame.get_mut(bit / 8) {
                *b ^= 1 << (bit % 8);
            }
        }
        if fate.mark_ce && mark_ce(&mut frame) {
            self.links[link].dirs[dir].stats.ecn_marked += 1;
        }
        if let Some(t) = fate.duplicate_at {
            let mut copy = self.pool.pop().unwrap_or_default();
            copy.clear();
            copy.extend_from_slice(&frame);
            self.schedule(t, to, copy);
        }
        self.schedule(arrival, to, frame);
    }

    fn deliver(&mut self, ev: Event) {
        match self.ports[ev.to].owner {
            Owner::Host => self.deliver_to_host(ev.to, ev.frame),
            Owner::Switch(s, ingress) => self.forward(s, ingress, ev.frame),
        }
    }

    fn deliver_to_host(&mut self, slot: usize, frame: Vec<u8>) {
        let port = &mut self.ports[slot];
        let dst = frame
            .get(..6)
            .map(|d| MacAddr(d.try_into().expect("6 bytes")));
        let for_us = dst.is_some_and(|d| d == port.mac || d.is_multicast());
        if !for_us {
            port.stats.rx_filtered += 1;
        } else if port.rx.len() >= self.rx_ring {
            port.stats.rx_dropped += 1;
        } else {
            port.stats.rx_frames += 1;
            port.stats.rx_bytes += frame.len() as u64;
            port.rx.push_back(frame);
            return;
        }
        self.recycle(frame);
    }

    fn forward(&mut self, s: usize, ingress: usize, mut frame: Vec<u8>) {
        let sw = &mut self.switches[s];
        let (candidates, ecmp_choice) = ecmp(&sw.routes, sw.salt, self.ecmp, &frame);
        let mut emitted = Vec::new();
        let verdict = match sw.hook.as_mut() {
            Some(hook) => {
                let ctx = HookCtx {
                    now: self.now,
                    switch: s,
                    ingress,
                    candidates,
                    ecmp_choice,
                    host_ports: &sw.host_ports,
                };
                let verdict = hook.on_frame(&ctx, &mut frame);
                while let Some(f) = hook.poll_emit() {
                    emitted.push(f);
                }
                verdict
            }
            None => Verdict::Forward,
        };
        match verdict {
            Verdict::Drop => {
                sw.stats.hook_dropped += 1;
                self.recycle(frame);
            }
            Verdict::ForwardVia(p) if p < sw.ports.len() => self.output(s, Some(p), frame),
            Verdict::ForwardVia(_) | Verdict::Forward => self.output(s, ecmp_choice, frame),
        }
        for f in emitted {
            self.switches[s].stats.hook_emitted += 1;
            let sw = &self.switches[s];
            let egress = ecmp(&sw.routes, sw.salt, self.ecmp, &f).1;
            self.output(s, egress, f);
        }
    }

    /// Sends a frame out of switch port `egress`; `None` counts it as unroutable.
    fn output(&mut self, s: usize, egress: Option<usize>, frame: Vec<u8>) {
        let sw = &mut self.switches[s];
        match egress {
            Some(p) => {
                sw.stats.forwarded += 1;
                let out = sw.ports[p];
                self.send(out, frame);
            }
            None => {
                sw.stats.no_route += 1;
                self.recycle(frame);
            }
        }
    }

    /// Marks the switch ports whose link leads to a host.
    fn mark_host_ports(&mut self) {
        for sw in &mut self.switches {
            sw.host_ports = sw
                .ports
                .iter()
                .map(|&slot| {
                    self.ports[slot].peer.is_some_and(|(l, dir)| {
                        matches!(self.ports[self.links[l].ends[1 - dir]].owner, Owner::Host)
                    })
                })
                .collect();
        }
    }

    /// Shortest paths (in hops) from every switch to every host port; all equal-cost egress
    /// ports are kept for ECMP. Hosts never forward.
    fn compute_routes(&mut self) {
        let peer_of = |ports: &[PortSlot], links: &[LinkSlot], slot: usize| {
            ports[slot].peer.map(|(l, dir)| links[l].ends[1 - dir])
        };
        let n = self.switches.len();
        for h in 0..self.hosts.len() {
            for &target in &self.hosts[h].ports {
                let mac = self.ports[target].mac;
                // dist[s]: hops from switch s to the target port.
                let mut dist = vec![usize::MAX; n];
                let mut queue = VecDeque::new();
                if let Some(p) = peer_of(&self.ports, &self.links, target) {
                    if let Owner::Switch(s, _) = self.ports[p].owner {
                        dist[s] = 1;
                        queue.push_back(s);
                    }
                }
                while let Some(s) = queue.pop_front() {
                    for &slot in &self.switches[s].ports {
                        if let Some(p) = peer_of(&self.ports, &self.links, slot) {
                            if let Owner::Switch(t, _) = self.ports[p].owner {
                                if dist[t] == usize::MAX {
                                    dist[t] = dist[s] + 1;
                                    queue.push_back(t);
                                }
                            }
                        }
                    }
                }
                for s in 0..n {
                    if dist[s] == usize::MAX {
                        continue;
                    }
                    let mut egress = Vec::new();
                    for (i, &slot) in self.switches[s].ports.iter().enumerate() {
                        let Some(p) = peer_of(&self.ports, &self.links, slot) else {
                            continue;
                        };
                        let next_hop = match self.ports[p].owner {
                            Owner::Host => p == target,
                            Owner::Switch(t, _) => dist[t] != usize::MAX && dist[t] + 1 == dist[s],
                        };
                        if next_hop {
                            egress.push(i);
                        }
                    }
                    self.switches[s].routes.insert(mac, egress);
                }
            }
        }
    }
}

/// The equal-cost egress ports toward a frame's destination MAC and the one the flow hash
/// picks among them.
fn ecmp<'a>(
    routes: &'a HashMap<MacAddr, Vec<usize>>,
    salt: u32,
    hash: EcmpHash,
    frame: &[u8],
) -> (&'a [usize], Option<usize>) {
    let dst = frame
        .get(..6)
        .map(|d| MacAddr(d.try_into().expect("6 bytes")));
    let candidates: &[usize] = dst
        .and_then(|d| routes.get(&d))
        .map_or(&[], |v| v.as_slice());
    let choice = (!candidates.is_empty())
        .then(|| candidates[FlowKey::of(frame).pick(hash, salt, candidates.len())]);
    (candidates, choice)
}

/// SplitMix64, to spread one seed into independent per-stream seeds.
fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Marks an IP frame's ECN field Congestion Experienced if it is ECN-capable (ECT(0) or
/// ECT(1)), as a switch's egress queue does: IPv4's header checksum is written again (the
/// RoCE ICRC masks the TOS byte and the checksum, so it stays valid); IPv6 has none. A
/// Not-ECT or CE frame, or one that is not IP, is left alone. True when it marked.
pub fn mark_ce(frame: &mut [u8]) -> bool {
    let Some(mut ethertype) = frame.get(12..14).map(|b| u16::from_be_bytes([b[0], b[1]])) else {
        return false;
    };
    let mut l3 = 14;
    if ethertype == 0x8100 {
        let Some(b) = frame.get(16..18) else {
            return false;
        };
        ethertype = u16::from_be_bytes([b[0], b[1]]);
        l3 = 18;
    }
    match ethertype {
        0x0800 => {
            let Some(&vihl) = frame.get(l3) else {
                return false;
            };
            let hlen = usize::from(vihl & 0x0f) * 4;
            let Some(h) = frame.get_mut(l3..l3 + hlen) else {
                return false;
            };
            if hlen < 20 || !matches!(h[1] & 0b11, 0b01 | 0b10) {
                return false;
            }
            h[1] |= 0b11;
            h[10] = 0;
            h[11] = 0;
            let c = ferroce_stack::wire::internet_checksum(h);
            h[10..12].copy_from_slice(&c.to_be_bytes());
            true
        }
        0x86dd => {
            let Some(b1) = frame.get_mut(l3 + 1) else {
                return false;
            };
            if !matches!((*b1 >> 4) & 0b11, 0b01 | 0b10) {
                return false;
            }
            *b1 |= 0b11 << 4;
            true
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferroce_stack::wire::{
        internet_checksum, BthRepr, Checks, Ecn, EthernetRepr, ExtHeaders, IpRepr, Ipv4Repr,
        Opcode, Psn, Qpn, RoceRepr, ETHERTYPE_IPV4,
    };

    fn frame(ecn: Ecn) -> Vec<u8> {
        let repr = RoceRepr {
            eth: EthernetRepr {
                dst: MacAddr([2, 0, 0, 0, 0, 2]),
                src: MacAddr([2, 0, 0, 0, 0, 1]),
                vlan: None,
                ethertype: ETHERTYPE_IPV4,
            },
            ip: IpRepr::V4(Ipv4Repr {
                src: "10.0.0.1".parse().unwrap(),
                dst: "10.0.0.2".parse().unwrap(),
                dscp: 26,
                ecn,
                ident: 7,
                dont_frag: true,
                ttl: 64,
            }),
            udp_src_port: 0xc000,
            bth: BthRepr::new(Opcode::RC_SEND_ONLY, Qpn::new(0x12), Psn::new(5)),
            ext: ExtHeaders::default(),
            payload_len: 8,
        };
        let mut buf = vec![0u8; 128];
        let n = repr.emit(&mut buf, |p| p.fill(0xab)).unwrap();
        buf.truncate(n);
        buf
    }

    /// ECT(0) and ECT(1) become CE with a valid IPv4 checksum and a still-valid ICRC (it
    /// masks the TOS byte); Not-ECT and CE are left as they are.
    #[test]
    fn mark_ce_marks_only_ecn_capable_frames() {
        for ecn in [Ecn::Ect0, Ecn::Ect1] {
            let mut f = frame(ecn);
            assert!(mark_ce(&mut f));
            assert_eq!(internet_checksum(&f[14..34]), 0, "checksum valid");
            let p = RoceRepr::parse(&f, Checks::ALL).expect("ICRC still valid");
            assert_eq!(p.repr.ip.ecn(), Ecn::Ce);
        }
        for ecn in [Ecn::NotEct, Ecn::Ce] {
            let mut f = frame(ecn);
            let before = f.clone();
            assert!(!mark_ce(&mut f));
            assert_eq!(f, before);
        }
        assert!(!mark_ce(&mut [0u8; 10]), "too short");
    }
}
