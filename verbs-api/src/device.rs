//! Devices and contexts: a device is an engine over a set of ports (today one); a context is
//! the handle an application opens on it, as `ibv_open_device` returns.

use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::thread::JoinHandle;

use crossbeam::queue::SegQueue;
use ferroce_drivers::sim::Fabric;
use ferroce_drivers::{LinkState, Port};
use ferroce_stack::transport::{Counters, MrTable, PostError, Qp, RecvWr, SendWr};
use ferroce_stack::wire::MacAddr;

use crate::engine::{CqShared, Engine, PortCounters, QpShared};

/// What the verbs layer needs of an engine, with its port type erased.
pub(crate) trait DeviceEngine: Send {
    fn poll(&mut self) -> usize;
    fn mem(&mut self) -> &mut MrTable;
    fn add_qp(&mut self, qp: Qp, shared: Arc<QpShared>, send: Arc<CqShared>, recv: Arc<CqShared>);
    fn remove_qp(&mut self, qpn: u32) -> bool;
    fn with_qp(&mut self, qpn: u32, f: &mut dyn FnMut(&mut Qp)) -> bool;
    fn counters(&self) -> PortCounters;
    fn qp_counters(&self, qpn: u32) -> Option<Counters>;
    fn qp_counters_total(&self) -> Counters;
    fn qp_counters_all(&self) -> Vec<(u32, Counters)>;
    fn next_deadline(&self) -> Option<u64>;
    fn has_pending_work(&self) -> bool;
    fn link_state(&self) -> LinkState;
    fn post_sends(&mut self, qpn: u32, wrs: &[SendWr<'_>]) -> Result<(), (usize, PostError)>;
    fn post_recvs(&mut self, qpn: u32, wrs: &[RecvWr<'_>]) -> Result<(), (usize, PostError)>;
}

impl<P: Port + Send> DeviceEngine for Engine<P> {
    fn poll(&mut self) -> usize {
        Self::poll(self)
    }
    fn mem(&mut self) -> &mut MrTable {
        &mut self.mem
    }
    fn add_qp(&mut self, qp: Qp, shared: Arc<QpShared>, send: Arc<CqShared>, recv: Arc<CqShared>) {
        Self::add_qp(self, qp, shared, send, recv);
    }
    fn remove_qp(&mut self, qpn: u32) -> bool {
        Self::remove_qp(self, qpn)
    }
    fn with_qp(&mut self, qpn: u32, f: &mut dyn FnMut(&mut Qp)) -> bool {
        Self::with_qp(self, qpn, f).is_some()
    }
    fn counters(&self) -> PortCounters {
        Self::counters(self)
    }
    fn qp_counters(&self, qpn: u32) -> Option<Counters> {
        Self::qp_counters(self, qpn)
    }
    fn qp_counters_total(&self) -> Counters {
        Self::qp_counters_total(self)
    }
    fn qp_counters_all(&self) -> Vec<(u32, Counters)> {
        Self::qp_counters_all(self)
    }
    fn next_deadline(&self) -> Option<u64> {
        Self::next_deadline(self)
    }
    fn has_pending_work(&self) -> bool {
        Self::has_pending_work(self)
    }
    fn link_state(&self) -> LinkState {
        self.port().link_state()
    }
    fn post_sends(&mut self, qpn: u32, wrs: &[SendWr<'_>]) -> Result<(), (usize, PostError)> {
        Self::post_sends(self, qpn, wrs)
    }
    fn post_recvs(&mut self, qpn: u32, wrs: &[RecvWr<'_>]) -> Result<(), (usize, PostError)> {
        Self::post_recvs(self, qpn, wrs)
    }
}

/// The shared clock of contexts on one simulated fabric: virtual time moves only when every
/// device on it is idle, and then straight to the next event.
pub(crate) struct SimClock {
    pub(crate) fabric: Fabric,
    pub(crate) devices: Mutex<Vec<Weak<Device>>>,
}

impl SimClock {
    /// One step: every device polls; if none had work, time jumps to the next frame arrival
    /// or QP deadline. Returns false when nothing is left to happen at all.
    pub(crate) fn step(&self) -> bool {
        let mut work = 0;
        let mut deadline: Option<u64> = None;
        let mut pending = false;
        {
            let devices = self.devices.lock().unwrap_or_else(|e| e.into_inner());
            for d in devices.iter().filter_map(Weak::upgrade) {
                let mut e = d.engine();
                work += e.poll();
                pending |= e.has_pending_work();
                if let Some(t) = e.next_deadline() {
                    deadline = Some(deadline.map_or(t, |x: u64| x.min(t)));
                }
            }
        }
        if work > 0 || pending {
            return true;
        }
        let now = self.fabric.now();
        let next = match (self.fabric.next_event(), deadline) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => match a.or(b) {
                Some(t) => t,
                None => return false,
            },
        };
        self.fabric.advance_to(next.max(now + 1));
        true
    }
}

/// One device: its engine, and what applications read without locking it.
pub(crate) struct Device {
    pub(crate) name: String,
    engine: Mutex<Box<dyn DeviceEngine>>,
    pub(crate) doorbells: Arc<SegQueue<u32>>,
    pub(crate) mac: MacAddr,
    pub(crate) ip: IpAddr,
    pub(crate) eth_mtu: usize,
    pub(crate) next_qpn: AtomicU32,
    pub(crate) next_id: AtomicU32,
    pub(crate) sim: Option<Arc<SimClock>>,
    epoch: std::time::Instant,
    pub(crate) thread: Mutex<Option<(Arc<AtomicBool>, JoinHandle<()>)>>,
    pub(crate) threaded: AtomicBool,
    /// TCP through the port's own address, when a control plane serves it.
    pub(crate) control: std::sync::OnceLock<ferroce_drivers::control::tcp::ControlHandle>,
}

impl Device {
    pub(crate) fn new<P: Port + Send + 'static>(
        name: String,
        port: P,
        ip: IpAddr,
        key_seed: u64,
        sim: Option<Arc<SimClock>>,
    ) -> Arc<Self> {
        let mac = port.mac();
        let eth_mtu = port.mtu();
        let mut engine = Engine::new(port, key_seed);
        if sim.is_none() {
            engine.set_clock_stride(32);
        }
        let doorbells = engine.doorbells.clone();
        Arc::new(Self {
            name,
            engine: Mutex::new(Box::new(engine)),
            doorbells,
            mac,
            ip,
            eth_mtu,
            // QPN 0 and 1 are special in IBTA (SMI/GSI); start above them.
            next_qpn: AtomicU32::new(0x100 + (key_seed as u32 & 0xff) * 0x100),
            next_id: AtomicU32::new(1),
            sim,
            epoch: std::time::Instant::now(),
            thread: Mutex::new(None),
            threaded: AtomicBool::new(false),
            control: std::sync::OnceLock::new(),
        })
    }

    pub(crate) fn engine(&self) -> MutexGuard<'_, Box<dyn DeviceEngine>> {
        self.engine.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The engine if no other thread holds it now.
    pub(crate) fn try_engine(&self) -> Option<MutexGuard<'_, Box<dyn DeviceEngine>>> {
        match self.engine.try_lock() {
            Ok(g) => Some(g),
            Err(std::sync::TryLockError::Poisoned(e)) => Some(e.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }

    /// Nanoseconds on the device's clock without taking the engine's lock: virtual time on a
    /// simulated fabric, else time since the device opened.
    pub(crate) fn now(&self) -> u64 {
        match &self.sim {
            Some(clock) => clock.fabric.now(),
            None => self.epoch.elapsed().as_nanos() as u64,
        }
    }

    pub(crate) fn next_id(&self) -> u32 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Makes progress on the caller's thread (run-to-completion), unless an engine thread
    /// owns the loop. Returns false when a simulated fabric has nothing left to do.
    pub(crate) fn progress(&self) -> bool {
        if self.threaded.load(Ordering::Acquire) {
            return true;
        }
        match &self.sim {
            Some(clock) => clock.step(),
            None => {
                self.engine().poll();
                true
            }
        }
    }
}
