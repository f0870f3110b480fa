//! Devices and contexts: a device is one engine per queue of its port (one queue unless the
//! driver opened several); a context is the handle an application opens on it, as
//! `ibv_open_device` returns.

use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::thread::JoinHandle;

use ferroce_drivers::sim::{Fabric, Idle};
use ferroce_drivers::Port;
use ferroce_stack::transport::{Counters, MrKeys, MrTable};
use ferroce_stack::wire::MacAddr;

use crate::engine::looped::{self, LoopInbox};
use crate::engine::{Engine, PortCounters, QpEngines, QpShared, Steer};
use crate::events::EventSink;
use crate::slot::{DeviceEngine, EngineSlot};

/// An engine over `port`, boxed for a device; `real` for a port on the machine's clock
/// (read every few idle turns), not a simulated fabric's.
pub(crate) fn boxed_engine<P: Port + Send + 'static>(
    port: P,
    key_seed: u64,
    real: bool,
) -> Box<dyn DeviceEngine> {
    let mut engine = Engine::new(port, key_seed);
    if real {
        engine.set_clock_stride(32);
    }
    Box::new(engine)
}

/// The shared clock of contexts on one simulated fabric: virtual time moves only when every
/// device on it is idle, and then straight to the next event.
pub(crate) struct SimClock {
    pub(crate) fabric: Fabric,
    pub(crate) devices: Mutex<Vec<Weak<Device>>>,
}

impl SimClock {
    /// One step: every device polls; if none had work, time moves as
    /// [`Fabric::advance_idle`] says (the testbed's rule too), to the next frame arrival or QP
    /// deadline. Returns false when nothing is left to happen at all.
    pub(crate) fn step(&self) -> bool {
        let mut work = 0;
        let mut deadline: Option<u64> = None;
        let mut pending = false;
        {
            let devices = self.devices.lock().unwrap_or_else(|e| e.into_inner());
            for d in devices.iter().filter_map(Weak::upgrade) {
                for slot in d.engines.iter() {
                    let mut e = slot.lock();
                    work += e.poll();
                    pending |= e.core().has_pending_work();
                    if let Some(t) = e.core().next_deadline() {
                        deadline = Some(deadline.map_or(t, |x: u64| x.min(t)));
                    }
                }
            }
        }
        if work > 0 || pending {
            return true;
        }
        self.fabric.advance_idle(deadline, u64::MAX) != Idle::Done
    }
}

/// The flag that stops a device's engine threads, and the threads.
pub(crate) type EngineThreads = (Arc<AtomicBool>, Vec<JoinHandle<()>>);

/// One device: its engines (one per queue of the port), and what applications read without
/// locking them. A QP lives on one engine, which `homes` names, and can be moved to another;
/// every engine holds a copy of every memory registration, made when the region is
/// registered, so each looks keys up in its own table without a lock.
pub(crate) struct Device {
    pub(crate) name: String,
    pub(crate) engines: Box<[EngineSlot]>,
    homes: Arc<QpEngines>,
    pub(crate) mac: MacAddr,
    pub(crate) ip: IpAddr,
    /// Every port's MAC and address, port 1 first (`mac` and `ip` are port 1's).
    pub(crate) ports: Vec<(MacAddr, IpAddr)>,
    pub(crate) eth_mtu: usize,
    pub(crate) next_qpn: AtomicU32,
    pub(crate) next_id: AtomicU32,
    pub(crate) sim: Option<Arc<SimClock>>,
    epoch: std::time::Instant,
    /// The engine threads, one per engine, and the flag that stops them.
    pub(crate) thread: Mutex<Option<EngineThreads>>,
    pub(crate) threaded: AtomicBool,
    /// TCP through the port's own address, when a control plane serves it.
    pub(crate) control: std::sync::OnceLock<ferroce_drivers::control::tcp::ControlHandle>,
    /// CPUs the engine threads are pinned to, engine i to the i-th (none: not pinned).
    pub(crate) cores: std::sync::OnceLock<Vec<usize>>,
    /// Where the device's asynchronous events go.
    pub(crate) events: EventSink,
    /// On a real port: where other devices of the process loop frames for this device's
    /// QPs (its first engine's inbox; a multi-engine device hands them on by QPN).
    pub(crate) looped: std::sync::OnceLock<Arc<LoopInbox>>,
    /// The last counters of the QPs destroyed lately (the newest [`RETIRED_KEPT`]), so a
    /// counters export after a program's data QPs are gone still shows what they did.
    pub(crate) retired: Mutex<std::collections::VecDeque<(u32, Counters)>>,
    /// Set on a device of a service (`ferroce serve`): its objects live there, and this
    /// device's own engine (over a plug, never started) carries nothing.
    pub(crate) remote: Option<crate::service::client::RemoteDevice>,
    /// Each QP's packets when the balancer last looked (see [`Device::rebalance`]).
    balance: Mutex<hashbrown::HashMap<u32, u64>>,
    /// [`Device::balance_interval`] in ns; 0: never.
    balance_every_ns: std::sync::atomic::AtomicU64,
}

/// Destroyed QPs whose counters a device keeps for its exports.
pub(crate) const RETIRED_KEPT: usize = 64;

/// How much busier than the idlest engine the busiest must be before a QP moves (see
/// [`Device::rebalance`]).
pub(crate) const BALANCE_RATIO: f64 = 1.5;

/// The least difference, in packets per interval, between the busiest and the idlest engine
/// for a move: below it, the load is too light to matter.
pub(crate) const BALANCE_MIN_PACKETS: u64 = 1000;

/// How often a multi-engine device's first engine thread evens its engines' load, unless
/// told otherwise.
pub(crate) const BALANCE_EVERY: std::time::Duration = std::time::Duration::from_millis(100);

impl Device {
    pub(crate) fn new<P: Port + Send + 'static>(
        name: String,
        port: P,
        ip: IpAddr,
        key_seed: u64,
        sim: Option<Arc<SimClock>>,
    ) -> Arc<Self> {
        let engine = boxed_engine(port, key_seed, sim.is_none());
        Self::with_engines(name, vec![engine], ip, key_seed, sim)
    }

    /// A device over several engines, one per queue of one port (the first engine's port
    /// gives the MAC and MTU). Only the first engine makes memory keys; the others hold
    /// copies of its registrations.
    pub(crate) fn with_engines(
        name: String,
        mut engines: Vec<Box<dyn DeviceEngine>>,
        ip: IpAddr,
        key_seed: u64,
        sim: Option<Arc<SimClock>>,
    ) -> Arc<Self> {
        assert!(!engines.is_empty(), "a device needs an engine");
        let homes = Arc::new(QpEngines::new(engines.len()));
        if engines.len() > 1 {
            let group = Steer::group(engines.len(), &homes);
            for (e, steer) in engines.iter_mut().zip(group) {
                e.core_mut().set_steer(steer);
            }
        }
        let (mac, eth_mtu) = (engines[0].port().mac(), engines[0].port().mtu());
        let events = EventSink::default();
        for e in engines.iter_mut() {
            e.core_mut().events = events.clone();
        }
        let engines = engines.into_iter().map(EngineSlot::new).collect();
        Arc::new(Self {
            name,
            engines,
            homes,
            mac,
            ip,
            ports: vec![(mac, ip)],
            eth_mtu,
            // QPN 0 and 1 are special in IBTA (SMI/GSI); start above them.
            next_qpn: AtomicU32::new(0x100 + (key_seed as u32 & 0xff) * 0x100),
            next_id: AtomicU32::new(1),
            sim,
            epoch: std::time::Instant::now(),
            thread: Mutex::new(None),
            threaded: AtomicBool::new(false),
            control: std::sync::OnceLock::new(),
            cores: std::sync::OnceLock::new(),
            events,
            looped: std::sync::OnceLock::new(),
            retired: Mutex::new(std::collections::VecDeque::new()),
            remote: None,
            balance: Mutex::new(hashbrown::HashMap::new()),
            balance_every_ns: std::sync::atomic::AtomicU64::new(BALANCE_EVERY.as_nanos() as u64),
        })
    }

    /// Device `remote.device` of a service, attached: its ports' addresses are the
    /// service's.
    pub(crate) fn attached(remote: crate::service::client::RemoteDevice) -> Arc<Self> {
        let facts = remote.facts.clone();
        let eth_mtu = facts.ports.first().map_or(1500, |p| p.eth_mtu as usize);
        let port = ferroce_drivers::pipe::plug(eth_mtu);
        let ports: Vec<(MacAddr, IpAddr)> = facts
            .ports
            .iter()
            .map(|p| (MacAddr(p.mac), crate::service::proto::gid_ip(p.gid)))
            .collect();
        let (mac, ip) = ports
            .first()
            .copied()
            .unwrap_or((MacAddr([0; 6]), IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED)));
        let mut dev = Self::new(facts.name.clone(), port, ip, 1, None);
        let d = Arc::get_mut(&mut dev).expect("a new device has no other owner");
        d.mac = mac;
        d.ports = ports;
        d.eth_mtu = eth_mtu;
        d.remote = Some(remote);
        dev
    }

    /// Joins the process's loopback (see [`looped`]): what a device on a real port does when
    /// it opens, before it has QPs. A simulated host's frames to itself are the fabric's to
    /// carry, and its QP numbers stay its own (replayable from the seed).
    pub(crate) fn join_loopback(self: &Arc<Self>) {
        let lb = LoopInbox::new();
        let dev = Arc::downgrade(self);
        lb.set_wake(Box::new(move || {
            if let Some(d) = dev.upgrade() {
                d.engines[0].idle.wake();
            }
        }));
        self.engines[0].lock().core_mut().looped = Some(lb.clone());
        for (mac, _) in &self.ports {
            looped::join_port(mac.0, &lb);
        }
        let _ = self.looped.set(lb);
    }

    /// A device with several ports on one engine (`ips[i]` is port i+1's address): a QP
    /// with an alternate path sends on its active port (native failover).
    pub(crate) fn multi_port<P: Port + Send + 'static>(
        name: String,
        ports: Vec<P>,
        ips: Vec<IpAddr>,
        key_seed: u64,
        sim: Option<Arc<SimClock>>,
    ) -> Arc<Self> {
        assert_eq!(ports.len(), ips.len(), "an address per port");
        let addrs: Vec<_> = ports
            .iter()
            .map(Port::mac)
            .zip(ips.iter().copied())
            .collect();
        let mut engine = Engine::with_ports(ports, key_seed);
        if sim.is_none() {
            engine.set_clock_stride(32);
        }
        let mut dev = Self::with_engines(name, vec![Box::new(engine)], ips[0], key_seed, sim);
        Arc::get_mut(&mut dev)
            .expect("a new device has no other owner")
            .ports = addrs;
        dev
    }

    /// The first engine: the one that owns the port's link and makes memory keys.
    pub(crate) fn engine(&self) -> MutexGuard<'_, Box<dyn DeviceEngine>> {
        self.engines[0].lock()
    }

    /// The engine (and doorbells) of QP `qpn`.
    #[inline]
    pub(crate) fn slot(&self, qpn: u32) -> &EngineSlot {
        &self.engines[self.homes.owner(qpn)]
    }

    /// The index of the engine QP `qpn` lives on.
    pub(crate) fn engine_of(&self, qpn: u32) -> usize {
        self.homes.owner(qpn)
    }

    /// Makes the first engine the home of QP1, where the communication manager runs: a MAD
    /// that receive-side scaling puts on another engine's queue is handed to it, as a frame
    /// for a QP of another engine is.
    pub(crate) fn home_gsi_on_first_engine(&self) {
        self.homes.set(ferroce_stack::wire::mad::GSI_QPN, 0);
    }

    /// Moves QP `qpn` to engine `to` with everything it holds (queues, inbox, timers, CQs):
    /// what failover onto another port's engine does. Posts and frames follow it: a post
    /// that finds the QP gone from the engine it locked goes through the QP's inbox, which
    /// travels with it, and a frame an engine no longer serves is handed on.
    pub(crate) fn move_qp(&self, qpn: u32, to: usize) -> Result<(), crate::error::VerbsError> {
        let engines = self.engines.len();
        if to >= engines {
            return Err(crate::error::VerbsError::NoSuchEngine {
                engine: to,
                engines,
            });
        }
        let from = self.homes.owner(qpn);
        if from == to {
            return Ok(());
        }
        let taken = self.engines[from].lock().core_mut().take_qp(qpn);
        let taken = taken.ok_or(crate::error::VerbsError::NoSuchQp(qpn))?;
        // Entered before the QP arrives: a post in between finds it on neither engine and
        // queues in its inbox, which the arrival rings for.
        self.homes.set(qpn, to);
        self.homes.left(from);
        self.homes.arrived(to);
        let mut engine = self.engines[to].lock();
        engine.core_mut().insert_qp(taken, to);
        drop(engine);
        self.engines[to].idle.wake();
        Ok(())
    }

    /// Evens the engines' load: each engine's QPs' packets since the last call are its
    /// load (which also steers [`place_qp`](Self::place_qp)), and when the busiest engine
    /// carried more than [`BALANCE_RATIO`] times the idlest's (and at least
    /// [`BALANCE_MIN_PACKETS`] more), the one QP of the busiest whose move brings the two
    /// closest together moves to the idlest. One move per call, so a QP that fills an
    /// engine alone is not thrown back and forth; calls come every
    /// [`balance interval`](Self::set_balance_interval) from the first engine's thread, or
    /// from a program ([`Context::rebalance`](crate::Context::rebalance)). The move made:
    /// (QP, from, to).
    pub(crate) fn rebalance(&self) -> Option<(u32, usize, usize)> {
        let engines = self.engines.len();
        if engines < 2 || self.remote.is_some() {
            return None;
        }
        let mut last = self.balance.lock().unwrap_or_else(PoisonError::into_inner);
        let mut seen = hashbrown::HashMap::new();
        let mut load = vec![0u64; engines];
        let mut qps: Vec<Vec<(u32, u64)>> = vec![Vec::new(); engines];
        for (e, slot) in self.engines.iter().enumerate() {
            let counters = slot.lock().core().qp_counters_all();
            for (qpn, c) in counters {
                let packets = c.tx_packets + c.rx_packets;
                let delta = packets.saturating_sub(last.get(&qpn).copied().unwrap_or(0));
                seen.insert(qpn, packets);
                load[e] += delta;
                qps[e].push((qpn, delta));
            }
        }
        *last = seen;
        drop(last);
        self.homes.set_load(&load);
        let busiest = (0..engines).max_by_key(|&e| load[e])?;
        let idlest = (0..engines).min_by_key(|&e| load[e])?;
        let (hi, lo) = (load[busiest], load[idlest]);
        if hi < lo.saturating_add(BALANCE_MIN_PACKETS) || (hi as f64) < BALANCE_RATIO * lo as f64 {
            return None;
        }
        // The QP whose packets come closest to half the gap; only a move that lowers the
        // busier of the two engines is made.
        let half = (hi - lo) / 2;
        let (qpn, d) = qps[busiest]
            .iter()
            .copied()
            .filter(|&(qpn, d)| d > 0 && qpn != ferroce_stack::wire::mad::GSI_QPN)
            .min_by_key(|&(_, d)| d.abs_diff(half))?;
        if (lo + d).max(hi - d) >= hi {
            return None;
        }
        self.move_qp(qpn, idlest).ok()?;
        tracing::debug!(
            qpn,
            from = busiest,
            to = idlest,
            packets = d,
            "qp moved to even the engines' load"
        );
        Some((qpn, busiest, idlest))
    }

    /// How often the first engine's thread evens the engines' load (see
    /// [`rebalance`](Self::rebalance)); `None` stops it.
    pub(crate) fn set_balance_interval(&self, every: Option<std::time::Duration>) {
        let ns = every.map_or(0, |d| d.as_nanos().clamp(1, u64::MAX as u128) as u64);
        self.balance_every_ns.store(ns, Ordering::Relaxed);
    }

    /// The balance interval, if any.
    pub(crate) fn balance_interval(&self) -> Option<std::time::Duration> {
        match self.balance_every_ns.load(Ordering::Relaxed) {
            0 => None,
            ns => Some(std::time::Duration::from_nanos(ns)),
        }
    }

    /// The QPs on each engine.
    pub(crate) fn engine_qp_counts(&self) -> Vec<usize> {
        self.homes.qp_counts()
    }

    /// Destroys QP `qpn`: out of its engine and the engine table (and loopback's).
    pub(crate) fn destroy_qp(&self, qpn: u32) {
        if self.looped.get().is_some() {
            looped::release(qpn);
        }
        let last = {
            let mut e = self.slot(qpn).lock();
            let last = e.core().qp_counters(qpn);
            e.core_mut().remove_qp(qpn);
            last
        };
        let engine = self.homes.owner(qpn);
        self.homes.forget(qpn);
        if last.is_some() {
            self.homes.left(engine);
        }
        if let Some(c) = last {
            let mut r = self.retired.lock().unwrap_or_else(|p| p.into_inner());
            if r.len() == RETIRED_KEPT {
                r.pop_front();
            }
            r.push_back((qpn, c));
        }
    }

    /// Enters a new QP where loopback finds it.
    pub(crate) fn claim_qpn(&self, qpn: u32) {
        if let Some(lb) = self.looped.get() {
            looped::claim(qpn, lb);
        }
    }

    /// After a post rang `rung` for QP `sh`: if the QP moved to another engine meanwhile,
    /// rings that one too (the old engine drops a doorbell for a QP it no longer holds).
    #[inline]
    pub(crate) fn ring_again_if_moved(&self, sh: &QpShared, rung: &EngineSlot) {
        let now = self.slot(sh.qpn);
        if !std::ptr::eq(now, rung) {
            sh.ring(&now.doorbells);
        }
    }

    /// Registers memory with the first engine's table (`f` returns the keys and whatever
    /// else the caller wants back), lets the port map it (a zero-copy DPDK port on a NIC),
    /// and enters the region in every other engine's table under the same keys.
    pub(crate) fn register<T, E: Into<crate::error::VerbsError>>(
        &self,
        f: impl FnOnce(&mut MrTable) -> Result<(MrKeys, T), E>,
    ) -> Result<(MrKeys, T), crate::error::VerbsError> {
        let mut first = self.engine();
        let (keys, out) = f(first.core_mut().mem()).map_err(Into::into)?;
        if let Some((addr, len)) = first.core_mut().mem().extent(keys.lkey) {
            if let Err(e) = first.port_mut().map_memory(addr, len) {
                first.core_mut().mem().deregister(keys);
                return Err(e.into());
            }
        }
        if self.engines.len() > 1 {
            if let Some(share) = first.core_mut().mem().share(keys) {
                drop(first);
                for slot in &self.engines[1..] {
                    slot.lock().core_mut().mem().adopt(&share);
                }
            }
        }
        Ok((keys, out))
    }

    /// Re-registers `keys` in place in every engine's table (see
    /// [`MrTable::reregister`]), moving the port's mapping with new memory.
    ///
    /// # Safety
    /// As [`MrTable::reregister`].
    pub(crate) unsafe fn reregister(
        &self,
        keys: MrKeys,
        pd: Option<ferroce_stack::transport::PdId>,
        memory: Option<(*mut u8, usize, u64)>,
        access: Option<ferroce_stack::transport::Access>,
    ) -> Result<(), crate::error::VerbsError> {
        {
            let mut first = self.engine();
            let old = first.core_mut().mem().extent(keys.lkey);
            // SAFETY: the caller's promise, passed on.
            unsafe { first.core_mut().mem().reregister(keys, pd, memory, access) }?;
            if let (Some((addr, len)), Some((base, new_len, _))) = (old, memory) {
                first.port_mut().unmap_memory(addr, len);
                first.port_mut().map_memory(base as usize, new_len)?;
            }
        }
        for slot in &self.engines[1..] {
            // SAFETY: as above.
            unsafe {
                slot.lock()
                    .core_mut()
                    .mem()
                    .reregister(keys, pd, memory, access)
            }?;
        }
        Ok(())
    }

    /// Allocates a memory window in every engine's table (the first makes the key).
    pub(crate) fn alloc_window(
        &self,
        pd: ferroce_stack::transport::PdId,
        type2: bool,
    ) -> Result<u32, crate::error::VerbsError> {
        let mut first = self.engine();
        let key = first.core_mut().mem().alloc_window(pd, type2)?;
        if self.engines.len() > 1 {
            let keys = MrKeys {
                lkey: key,
                rkey: key,
            };
            if let Some(share) = first.core_mut().mem().share(keys) {
                drop(first);
                for slot in &self.engines[1..] {
                    slot.lock().core_mut().mem().adopt(&share);
                }
            }
        }
        Ok(key)
    }

    /// Deallocates a memory window (under any of its keys) in every engine's table.
    pub(crate) fn dealloc_window(&self, key: u32) {
        for slot in self.engines.iter() {
            slot.lock().core_mut().mem().dealloc_window(key);
        }
    }

    /// Forgets a registration in every engine's table, and the port's mapping of it.
    pub(crate) fn deregister(&self, keys: MrKeys) {
        {
            let mut first = self.engine();
            if let Some((addr, len)) = first.core_mut().mem().extent(keys.lkey) {
                first.port_mut().unmap_memory(addr, len);
            }
        }
        for slot in self.engines.iter() {
            slot.lock().core_mut().mem().deregister(keys);
        }
    }

    /// Port counters, summed over the engines.
    pub(crate) fn counters(&self) -> PortCounters {
        let mut c = PortCounters::default();
        for slot in self.engines.iter() {
            c.accumulate(&slot.lock().core().counters());
        }
        c
    }

    /// Every QP's transport counters, summed over the engines.
    pub(crate) fn qp_counters_total(&self) -> Counters {
        let mut c = Counters::default();
        for slot in self.engines.iter() {
            c.accumulate(&slot.lock().core().qp_counters_total());
        }
        c
    }

    /// Every QP's number and counters, in QPN order.
    pub(crate) fn qp_counters_all(&self) -> Vec<(u32, Counters)> {
        let mut v: Vec<_> = self
            .engines
            .iter()
            .flat_map(|slot| slot.lock().core().qp_counters_all())
            .collect();
        v.sort_by_key(|&(n, _)| n);
        v
    }

    /// Nanoseconds on the device's clock without taking the engine's lock: virtual time on a
    /// simulated fabric, else time since the device opened.
    pub(crate) fn now(&self) -> u64 {
        match &self.sim {
            Some(clock) => clock.fabric.now(),
            None => self.epoch.elapsed().as_nanos() as u64,
        }
    }

    /// The next QP number. QPN 0 and 1 are the SMI and GSI; 0xFFFFFF is the multicast QPN,
    /// which only UD packets may name (a packet to it is nobody's on RC/UC). None of the
    /// three is handed out, also when the 24-bit count wraps. On a real port the number is
    /// the process's (see [`looped`]), so that loopback finds every QP by it.
    pub(crate) fn next_qpn(&self) -> u32 {
        if self.looped.get().is_some() {
            return looped::next_qpn();
        }
        loop {
            let n = self.next_qpn.fetch_add(1, Ordering::Relaxed) & 0xff_ffff;
            if n > 1 && n != 0xff_ffff {
                return n;
            }
        }
    }

    /// A number for a new QP, and the engine it is to live on: the least-loaded one (see
    /// [`QpEngines::place`]), counted there. The number is drawn so that the engine is the
    /// one it starts on; when other threads take the numbers that would be (it is drawn a
    /// few times at most), the QP is entered in the table instead.
    pub(crate) fn place_qp(&self) -> (u32, usize) {
        let engines = self.homes.len();
        if engines == 1 {
            self.homes.arrived(0);
            return (self.next_qpn(), 0);
        }
        let engine = self.homes.place();
        let mut qpn = self.next_qpn();
        for _ in 0..4 * engines {
            if self.homes.starts_on(qpn, engine) {
                break;
            }
            qpn = self.next_qpn();
        }
        if !self.homes.starts_on(qpn, engine) {
            self.homes.set(qpn, engine);
        }
        self.homes.arrived(engine);
        (qpn, engine)
    }

    pub(crate) fn next_id(&self) -> u32 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Makes progress on the caller's thread (run-to-completion), unless an engine thread
    /// owns the loop. Returns false when a simulated fabric has nothing left to do.
    ///
    /// With engine threads that sleep when idle, the caller turns an engine no thread is
    /// turning: a program in a verb (post, poll, a wait for an event) is where the work is,
    /// and it should not wait for a sleeping engine thread to be woken and scheduled.
    pub(crate) fn progress(&self) -> bool {
        if self.threaded.load(Ordering::Acquire) {
            for slot in self.engines.iter() {
                slot.turn_if_free();
            }
            return true;
        }
        match &self.sim {
            Some(clock) => clock.step(),
            None => {
                for slot in self.engines.iter() {
                    slot.lock().poll();
                }
                true
            }
        }
    }
}

/// How long a thread polls CQs that stay empty, while engine threads run, before it yields
/// its CPU at every fourth further empty poll. Longer than a round trip on a veth pair, so a
/// typical wait never yields. On two cores a program polling in a loop can share its CPU
/// with the engine thread it waits for, woken by the very frame the program wants: the
/// program turns the engine only when that thread does not hold it, and the thread, holding
/// it, waits for the program's scheduler turn to end, milliseconds away.
const POLL_SPIN: std::time::Duration = std::time::Duration::from_micros(50);

thread_local! {
    /// This thread's empty CQ polls in a row, and when the first of them after the sixteenth
    /// was (see [`POLL_SPIN`]).
    static EMPTY_POLLS: std::cell::Cell<(u32, Option<std::time::Instant>)> =
        const { std::cell::Cell::new((0, None)) };
}

impl Device {
    /// After a CQ poll by a program thread: `found` whether it returned a completion. Yields
    /// the CPU when the thread has polled empty CQs for longer than [`POLL_SPIN`] while
    /// engine threads run.
    pub(crate) fn polled(&self, found: bool) {
        EMPTY_POLLS.with(|e| {
            let (n, since) = e.get();
            if found {
                if n != 0 {
                    e.set((0, None));
                }
                return;
            }
            let n = n.saturating_add(1);
            let since = match since {
                Some(t) => t,
                None if n >= 16 && self.threaded.load(Ordering::Relaxed) => {
                    std::time::Instant::now()
                }
                None => {
                    e.set((n, None));
                    return;
                }
            };
            e.set((n, Some(since)));
            if n.is_multiple_of(4) && since.elapsed() > POLL_SPIN {
                std::thread::yield_now();
            }
        });
    }
}

/// A poll of a CQ on a multi-engine device turns the engines of the CQ's QPs every time and
/// the others on every this-many-th poll of the thread: a frame that receive-side scaling put
/// on another engine's queue reaches the QP when that engine hands it on, and a thread that
/// polls only its own engines' CQs (one per core) keeps off the others' cache lines.
const OTHER_ENGINES_EVERY: u32 = 64;

impl Device {
    /// [`progress`](Self::progress) for a poll of `cq`: see [`OTHER_ENGINES_EVERY`].
    pub(crate) fn progress_for(&self, cq: &crate::engine::CqShared) -> bool {
        let mask = cq.engines.load(Ordering::Relaxed);
        if self.engines.len() == 1 || mask == 0 || self.sim.is_some() {
            return self.progress();
        }
        thread_local! {
            static POLLS: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
        }
        let others = POLLS.with(|n| {
            let v = n.get().wrapping_add(1);
            n.set(v);
            v.is_multiple_of(OTHER_ENGINES_EVERY)
        });
        let threaded = self.threaded.load(Ordering::Acquire);
        for (i, slot) in self.engines.iter().enumerate() {
            let mine = mask & (1 << i.min(63)) != 0;
            match (mine, threaded) {
                (_, true) if mine || others => {
                    slot.turn_if_free();
                }
                (true, false) => {
                    slot.lock().poll();
                }
                (false, false) if others => {
                    if let Some(mut e) = slot.try_lock() {
                        e.poll();
                    }
                }
                _ => {}
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    #[test]
    fn qpns_skip_the_smi_gsi_and_multicast_numbers_when_they_wrap() {
        let (ctx, _other) = crate::sim::pipe_pair(1500);
        ctx.dev.next_qpn.store(0xff_fffd, Ordering::Relaxed);
        let got: Vec<u32> = (0..4).map(|_| ctx.dev.next_qpn()).collect();
        assert_eq!(got, [0xff_fffd, 0xff_fffe, 2, 3]);
    }
}
