//! The verbs objects: Context, ProtectionDomain, MemoryRegion, CompletionQueue,
//! CompletionChannel, QueuePair, AddressHandle — libibverbs' shapes with Rust ownership.
//! Data-path calls (`post_send`, `post_recv`, `poll`) never take the engine's lock: work goes
//! through lock-free inboxes and completions come back through lock-free queues.

use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use ferroce_drivers::LinkState;
use ferroce_stack::transport::{
    Access, AddressVector, AttrMask, Counters, Mtu, PdId, PostError, Qp, QpAttr, QpCaps, QpConfig,
    QpState, QpType, RecvWr, SendWr, WorkCompletion,
};
use ferroce_stack::wire::{MacAddr, Qpn};
use smallvec::SmallVec;

use crate::device::Device;
use crate::service::client::{Client, RemoteDevice, RemoteMr, RemotePd, ServiceError};

/// A service's refusal as a verbs error.
fn service_error(e: ServiceError) -> VerbsError {
    VerbsError::Service {
        errno: e.errno(),
        message: e.to_string(),
    }
}
use crate::engine::{state_code, ChannelShared, CqShared, Op, OwnedSend, PortCounters, QpShared};
pub use crate::error::{PostFailure, VerbsError};

/// Device attributes, as `ibv_query_device`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceAttr {
    /// Vendor id: 0, which keeps libibverbs users on the generic verbs paths.
    pub vendor_id: u32,
    /// Most QPs.
    pub max_qp: u32,
    /// Most outstanding WRs per queue.
    pub max_qp_wr: u32,
    /// Most scatter/gather elements per WR.
    pub max_sge: u32,
    /// Most CQ entries.
    pub max_cqe: u32,
    /// Largest MR.
    pub max_mr_size: u64,
    /// Most outstanding READ/atomic per QP, either side.
    pub max_qp_rd_atom: u32,
    /// Physical ports.
    pub phys_port_cnt: u8,
}

/// Port attributes, as `ibv_query_port`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortAttr {
    /// ACTIVE when the link is up.
    pub state: PortState,
    /// Largest path MTU the port carries.
    pub max_mtu: Mtu,
    /// The active MTU (same).
    pub active_mtu: Mtu,
    /// Always Ethernet (RoCE).
    pub link_layer_ethernet: bool,
    /// GIDs in the table (one: RoCEv2 from the port's IP address).
    pub gid_tbl_len: u32,
}

/// Port state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortState {
    /// Link down.
    Down,
    /// Link up.
    Active,
}

/// Entries in a port's GID table: index 0 holds the port's address, the others are empty.
pub const GID_TABLE_LEN: u32 = 16;

/// A 16-byte GID: for RoCEv2, the port's IPv6 address or `::ffff:a.b.c.d`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The GID of an IP address.
    pub fn from_ip(ip: IpAddr) -> Self {
        Self(match ip {
            IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
            IpAddr::V6(v6) => v6.octets(),
        })
    }

    /// The IP address it names.
    pub fn ip(&self) -> IpAddr {
        let v6 = std::net::Ipv6Addr::from(self.0);
        match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        }
    }
}

/// An open device (`ibv_context`). Cheap to clone; every object keeps its context alive.
#[derive(Clone)]
pub struct Context {
    pub(crate) dev: Arc<Device>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("device", &self.dev.name)
            .finish()
    }
}

impl Context {
    /// The device's name (its specification, e.g. `sim:a` or `afpacket:veth0`).
    pub fn name(&self) -> &str {
        &self.dev.name
    }

    /// Device `device` of the service `client` is attached to (`ferroce serve`): its
    /// objects live in the service, work and completions cross in shared memory, and this
    /// process runs no engine for it. What a service does not carry (SRQs, memory windows,
    /// raw packet QPs, owned MRs, policies) is refused with [`VerbsError::NotThroughService`].
    pub fn attach(client: &Client, device: u32) -> Result<Self, VerbsError> {
        let facts = client.query_device(device).map_err(service_error)?;
        let dev = Device::attached(RemoteDevice {
            client: client.clone(),
            device,
            facts,
        });
        let events = dev.events.clone();
        client.on_gone(Box::new(move || {
            events.emit(crate::AsyncEvent::DeviceFatal)
        }));
        let events = dev.events.clone();
        client.on_event(device, Box::new(move |e| events.emit(e)));
        Ok(Self { dev })
    }

    /// Work the device's first engine thread does each turn beside its engine (a
    /// service's forwarder); set before the thread starts.
    pub(crate) fn set_poller(&self, p: Arc<dyn crate::slot::Poller>) {
        let _ = self.dev.engines[0].poller.set(p);
    }

    /// True for a context attached to a service.
    pub fn is_attached(&self) -> bool {
        self.dev.remote.is_some()
    }

    fn remote(&self) -> Option<&RemoteDevice> {
        self.dev.remote.as_ref()
    }

    /// The port's Ethernet MTU (IP and above).
    pub fn eth_mtu(&self) -> usize {
        self.dev.eth_mtu
    }

    /// True when `other` is a context of the same open device.
    pub fn same_device(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.dev, &other.dev)
    }

    /// `ibv_query_device`. Attached to a service, the service's limits: what its rings
    /// carry ([`service::proto::MAX_DEPTH`](crate::service::proto::MAX_DEPTH) entries,
    /// [`service::slots::MAX_SGE`](crate::service::slots::MAX_SGE) elements per request).
    pub fn query_device(&self) -> DeviceAttr {
        let attached = self.dev.remote.is_some();
        DeviceAttr {
            vendor_id: 0,
            max_qp: 1 << 16,
            max_qp_wr: 1 << 15,
            max_sge: if attached {
                crate::service::slots::MAX_SGE as u32
            } else {
                30
            },
            max_cqe: if attached {
                crate::service::proto::MAX_DEPTH
            } else {
                1 << 22
            },
            max_mr_size: 1 << 40,
            max_qp_rd_atom: 16,
            phys_port_cnt: self.dev.ports.len() as u8,
        }
    }

    /// `ibv_query_port` (port 1).
    pub fn query_port(&self) -> PortAttr {
        self.query_port_num(1).expect("every device has port 1")
    }

    /// `ibv_query_port` for port `port_num` (from 1).
    pub fn query_port_num(&self, port_num: u8) -> Result<PortAttr, VerbsError> {
        let i = self.port_index(port_num)?;
        let up = match self.remote() {
            // The service's port, as it is now (the facts from attaching, if it does not
            // answer).
            Some(r) => r
                .client
                .query_device(r.device)
                .map_or(r.facts.ports[i].up, |f| {
                    f.ports.get(i).is_some_and(|p| p.up)
                }),
            None => self.dev.engine().port_at(i).link_state() == LinkState::Up,
        };
        let mtu = Mtu::for_ethernet_mtu(self.dev.eth_mtu);
        Ok(PortAttr {
            state: if up {
                PortState::Active
            } else {
                PortState::Down
            },
            max_mtu: mtu,
            active_mtu: mtu,
            link_layer_ethernet: true,
            gid_tbl_len: GID_TABLE_LEN,
        })
    }

    /// The index (from 0) of port `port_num` (from 1), if the device has it.
    fn port_index(&self, port_num: u8) -> Result<usize, VerbsError> {
        let n = self.dev.ports.len();
        match usize::from(port_num) {
            p @ 1.. if p <= n => Ok(p - 1),
            _ => Err(VerbsError::NoSuchPort {
                port: port_num,
                ports: n as u8,
            }),
        }
    }

    /// `ibv_query_gid` on port 1: index 0 is the RoCEv2 GID of the port's IP address.
    pub fn query_gid(&self, index: u32) -> Result<Gid, VerbsError> {
        self.query_gid_on(1, index)
    }

    /// `ibv_query_gid` on port `port_num`: index 0 is the RoCEv2 GID of its IP address;
    /// the rest of the table ([`GID_TABLE_LEN`] entries) is empty, all zeros, as a RoCE
    /// port's table is past its addresses.
    pub fn query_gid_on(&self, port_num: u8, index: u32) -> Result<Gid, VerbsError> {
        let i = self.port_index(port_num)?;
        match index {
            0 => Ok(Gid::from_ip(self.dev.ports[i].1)),
            i if i < GID_TABLE_LEN => Ok(Gid([0; 16])),
            _ => Err(VerbsError::GidIndex(index)),
        }
    }

    /// The MAC address of port `port_num`.
    pub fn port_mac(&self, port_num: u8) -> Result<MacAddr, VerbsError> {
        Ok(self.dev.ports[self.port_index(port_num)?].0)
    }

    /// The device's clock in nanoseconds (virtual time on a simulated fabric).
    pub fn now(&self) -> u64 {
        self.dev.now()
    }

    /// The engine's clock in nanoseconds (its port's): what completion timestamps count
    /// ([`CompletionQueue::poll_one_stamped`]).
    pub fn clock_ns(&self) -> u64 {
        self.dev.engine().port().now_ns()
    }

    /// TCP through the port's own address, when the device's port has a control plane of
    /// its own (a DPDK port): what the out-of-band exchange uses instead of kernel sockets.
    pub fn control(&self) -> Option<&ferroce_drivers::control::tcp::ControlHandle> {
        self.dev.control.get()
    }

    /// The port's MAC address (what a peer puts in its address vector).
    pub fn mac(&self) -> MacAddr {
        self.dev.mac
    }

    /// `ibv_alloc_pd`.
    ///
    /// # Panics
    /// On an attached context whose service refuses: use [`try_alloc_pd`](Self::try_alloc_pd).
    pub fn alloc_pd(&self) -> ProtectionDomain {
        self.try_alloc_pd().expect("the service refused a PD")
    }

    /// `ibv_alloc_pd`, which only a service can refuse.
    pub fn try_alloc_pd(&self) -> Result<ProtectionDomain, VerbsError> {
        let remote = match self.remote() {
            Some(r) => Some(Arc::new(
                r.client.alloc_pd(r.device).map_err(service_error)?,
            )),
            None => None,
        };
        Ok(ProtectionDomain {
            ctx: self.clone(),
            id: PdId(self.dev.next_id()),
            remote,
        })
    }

    /// `ibv_create_comp_channel`.
    ///
    /// # Panics
    /// On an attached context that cannot make an eventfd: use
    /// [`try_create_comp_channel`](Self::try_create_comp_channel).
    pub fn create_comp_channel(&self) -> CompletionChannel {
        self.try_create_comp_channel()
            .expect("cannot make a completion channel")
    }

    /// `ibv_create_comp_channel`, which fails only on an attached context without a
    /// descriptor to spare.
    pub fn try_create_comp_channel(&self) -> Result<CompletionChannel, VerbsError> {
        let shared = ChannelShared::default();
        if self.is_attached() {
            let ch = crate::service::RemoteChannel::new().map_err(|e| VerbsError::Service {
                errno: e.raw_os_error().unwrap_or(libc::EMFILE),
                message: e.to_string(),
            })?;
            let _ = shared.remote.set(ch);
        }
        let shared = Arc::new(shared);
        if let Some(r) = self.remote() {
            // A program blocked on the channel wakes when the service goes.
            let weak = Arc::downgrade(&shared);
            r.client.on_gone(Box::new(move || {
                if let Some(ch) = weak.upgrade() {
                    if let Some(r) = ch.remote.get() {
                        r.wake();
                    }
                }
            }));
        }
        Ok(CompletionChannel {
            ctx: self.clone(),
            shared,
        })
    }

    /// `ibv_create_cq` with room for `cqe` completions.
    ///
    /// # Panics
    /// On an attached context whose service refuses: use [`try_create_cq`](Self::try_create_cq).
    pub fn create_cq(&self, cqe: usize, channel: Option<&CompletionChannel>) -> CompletionQueue {
        self.try_create_cq(cqe, channel)
            .expect("the service refused a CQ")
    }

    /// A CQ a service serves: its completions are stamped from `order` (shared by the
    /// service's CQs) instead of the clock, so that completions of several CQs can be put
    /// back in the order they were made ([`CompletionQueue::poll_one_stamped`]).
    pub(crate) fn create_ordered_cq(
        &self,
        cqe: usize,
        channel: Option<&CompletionChannel>,
        order: Arc<std::sync::atomic::AtomicU64>,
    ) -> CompletionQueue {
        let mut shared = CqShared::new(
            self.dev.next_id(),
            cqe.max(1),
            channel.map(|c| c.shared.clone()),
        )
        .with_events(self.dev.events.clone());
        shared.order = Some(order);
        CompletionQueue {
            ctx: self.clone(),
            shared: Arc::new(shared),
        }
    }

    /// `ibv_create_cq`, which only a service can refuse.
    pub fn try_create_cq(
        &self,
        cqe: usize,
        channel: Option<&CompletionChannel>,
    ) -> Result<CompletionQueue, VerbsError> {
        let mut shared = CqShared::new(
            self.dev.next_id(),
            cqe.max(1),
            channel.map(|c| c.shared.clone()),
        )
        .with_events(self.dev.events.clone());
        if let Some(r) = self.remote() {
            let cqe = u32::try_from(cqe.max(1)).unwrap_or(u32::MAX);
            let ch = channel.and_then(|c| c.shared.remote.get().map(|r| (r, shared.id)));
            shared.remote = Some(
                r.client
                    .create_cq(r.device, cqe, ch)
                    .map_err(service_error)?,
            );
        }
        Ok(CompletionQueue {
            ctx: self.clone(),
            shared: Arc::new(shared),
        })
    }

    /// Sends this device's asynchronous events (port changes, QP errors the transport
    /// raised, CQ overruns, SRQ limits) to `f`, which runs on the thread that raised each
    /// (an engine's). Set once; later calls return false and change nothing.
    pub fn set_async_handler(&self, f: Box<dyn Fn(crate::AsyncEvent) + Send + Sync>) -> bool {
        self.dev.events.set(f)
    }

    /// `ibv_create_qp_ex` of an RSS raw packet QP: it only receives, and the frames its
    /// flow rules match go to one of `wqs` (work queues of this device, in indirection table
    /// order), picked by the Toeplitz hash of `fields` (`IBV_RX_HASH_*`) under `key`.
    pub fn create_rss_qp(
        &self,
        pd: &ProtectionDomain,
        wqs: &[&RawQueuePair],
        key: Vec<u8>,
        fields: u64,
    ) -> Result<RawQueuePair, VerbsError> {
        if wqs.iter().any(|w| !Arc::ptr_eq(&w.ctx.dev, &self.dev)) {
            return Err(VerbsError::WrongDevice("a work queue"));
        }
        let qpn = self.dev.next_qpn();
        let shared = Arc::new(QpShared::new(qpn, QpType::Ud, QpCaps::default()));
        // Its own CQ is never written: every frame goes to a work queue.
        let cq = Arc::new(CqShared::new(self.dev.next_id(), 1, None));
        let mut raw = crate::engine::raw::RawQp::new(shared.clone(), pd.id, cq.clone(), cq);
        raw.rss = Some(crate::engine::raw::Rss {
            wqs: wqs.iter().map(|w| w.shared.qpn).collect(),
            key,
            fields,
        });
        self.dev.engine().core_mut().add_raw(raw);
        Ok(RawQueuePair {
            ctx: self.clone(),
            shared,
            eth_mtu: self.dev.eth_mtu,
        })
    }

    /// Runs the engine once on this thread (run-to-completion mode). Returns false only on a
    /// simulated fabric with nothing left to happen. A no-op while an engine thread runs.
    pub fn progress(&self) -> bool {
        self.dev.progress()
    }

    /// Evens the load of a multi-engine device's engines once (see [`set_balance_interval`]
    /// (Self::set_balance_interval) for when it happens by itself): when the busiest engine's
    /// QPs carried more than 1.5 times the packets of the idlest's since the last call, the
    /// QP whose move brings them closest together moves to the idlest, with everything it
    /// holds. The move made, as (QPN, from, to).
    pub fn rebalance(&self) -> Option<(Qpn, usize, usize)> {
        self.dev
            .rebalance()
            .map(|(qpn, from, to)| (Qpn::new(qpn), from, to))
    }

    /// How often the engine threads of a multi-engine device even its engines' load (every
    /// 100 ms unless set; `None`: never, as for a program that places its QPs itself).
    pub fn set_balance_interval(&self, every: Option<std::time::Duration>) {
        self.dev.set_balance_interval(every);
    }

    /// How many QPs live on each engine of the device. A new QP goes to the engine whose
    /// QPs carried the fewest packets in the last balance interval, then to the one with the
    /// fewest QPs.
    pub fn engine_qp_counts(&self) -> Vec<usize> {
        self.dev.engine_qp_counts()
    }

    /// Hands the loop to an engine thread: from now on posts and polls never run the engine
    /// on the caller's thread. Not for simulated devices, whose virtual clock the caller
    /// drives.
    pub fn start_engine_thread(&self) -> Result<(), VerbsError> {
        if self.is_attached() {
            // The service's engine threads run the device.
            return Ok(());
        }
        crate::threads::start(&self.dev)
    }

    /// Stops the engine thread, if one runs; progress returns to the caller's thread.
    pub fn stop_engine_thread(&self) {
        if self.is_attached() {
            return;
        }
        crate::threads::stop(&self.dev);
    }

    /// Port counters.
    pub fn port_counters(&self) -> PortCounters {
        self.dev.counters()
    }

    /// Every QP's transport counters, summed.
    pub fn qp_counters_total(&self) -> Counters {
        self.dev.qp_counters_total()
    }

    /// Each QP's number and transport counters.
    pub fn qp_counters_all(&self) -> Vec<(u32, Counters)> {
        self.dev.qp_counters_all()
    }

    /// Writes this device's counters where `ferroce stats` finds them: one file per process
    /// and device in `FERROCE_STATS_DIR` (default `/tmp/ferroce-stats`), replaced atomically.
    /// A simple key=value text, so any tool can read it.
    pub fn export_stats(&self) -> std::io::Result<std::path::PathBuf> {
        crate::stats::export(&self.dev)
    }

    /// An address handle for UD sends to `gid` at `dmac` (RoCE resolves the MAC by ARP or
    /// neighbour discovery; ferroce takes it from the caller or the connection exchange).
    pub fn create_ah(&self, gid: Gid, dmac: MacAddr) -> AddressHandle {
        AddressHandle {
            av: AddressVector {
                smac: self.dev.mac,
                dmac,
                src: self.dev.ip,
                dst: gid.ip(),
                ..AddressVector::default()
            },
        }
    }

    /// The address vector of a connected QP's path to (`gid`, `dmac`).
    pub fn path_to(&self, gid: Gid, dmac: MacAddr) -> AddressVector {
        self.create_ah(gid, dmac).av
    }

    /// The address vector of a path from port `port_num` to (`gid`, `dmac`).
    pub fn path_on(
        &self,
        port_num: u8,
        gid: Gid,
        dmac: MacAddr,
    ) -> Result<AddressVector, VerbsError> {
        let (smac, src) = self.dev.ports[self.port_index(port_num)?];
        Ok(AddressVector {
            smac,
            src,
            ..self.path_to(gid, dmac)
        })
    }
}

/// A protection domain.
#[derive(Debug, Clone)]
pub struct ProtectionDomain {
    ctx: Context,
    id: PdId,
    /// The service's PD, on an attached context.
    remote: Option<Arc<RemotePd>>,
}

impl ProtectionDomain {
    /// Its id.
    pub fn id(&self) -> PdId {
        self.id
    }

    /// The context it belongs to.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// `ibv_reg_mr` over caller memory: `len` bytes at `addr`, which peers address as
    /// `addr` (the iova is the virtual address, as libibverbs' `ibv_reg_mr` does).
    ///
    /// # Safety
    /// `addr .. addr + len` must stay valid for reads and writes until the returned region
    /// is dropped, and the application must not rely on its contents while the device may
    /// write them (as with any RDMA NIC).
    pub unsafe fn reg_mr(
        &self,
        addr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<MemoryRegion, VerbsError> {
        // SAFETY: the caller's promise, passed on.
        unsafe { self.reg_mr_iova(addr, len, addr as u64, access) }
    }

    /// `ibv_reg_mr_iova2`: as [`reg_mr`](Self::reg_mr), but peers and local gather lists
    /// address the region as `iova .. iova + len`.
    ///
    /// # Safety
    /// As [`reg_mr`](Self::reg_mr).
    pub unsafe fn reg_mr_iova(
        &self,
        addr: *mut u8,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Result<MemoryRegion, VerbsError> {
        if let Some(r) = &self.remote {
            // SAFETY: the caller's promise above, passed on (and it covers the move of the
            // pages onto shared memory: the buffer is not in use while it is registered).
            let mr = unsafe { r.reg_mr_iova(addr, len, iova, access) }.map_err(service_error)?;
            return Ok(MemoryRegion {
                ctx: self.ctx.clone(),
                pd: self.id,
                addr: iova,
                len,
                lkey: mr.lkey(),
                rkey: mr.rkey(),
                access,
                backing: None,
                remote: Some(mr),
            });
        }
        // SAFETY: the caller's promise above, passed on; it covers the copies of the
        // registration the device's other engines adopt.
        let (keys, ()) = self.ctx.dev.register(|mem| {
            unsafe { mem.register(self.id, addr, len, iova, access) }.map(|k| (k, ()))
        })?;
        Ok(MemoryRegion {
            ctx: self.ctx.clone(),
            pd: self.id,
            addr: iova,
            len,
            lkey: keys.lkey,
            rkey: keys.rkey,
            access,
            backing: None,
            remote: None,
        })
    }

    /// `Err` on an attached context: what a service does not carry.
    fn local(&self, what: &'static str) -> Result<(), VerbsError> {
        match self.remote {
            Some(_) => Err(VerbsError::NotThroughService(what)),
            None => Ok(()),
        }
    }

    /// `ibv_reg_mr_iova2` over shared memory: `len` bytes at byte `offset` of `region`
    /// (another process's buffer, moved onto a memfd: see `ferroce serve`), addressed as
    /// `iova`. Safe: the region stays mapped for as long as the registration lives.
    pub fn reg_shared(
        &self,
        region: Arc<dyn ferroce_drivers::shm::Mapped>,
        offset: usize,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Result<MemoryRegion, VerbsError> {
        self.local("shared memory registration")?;
        if offset.checked_add(len).is_none_or(|end| end > region.len()) {
            return Err(VerbsError::OutsideRegion {
                offset,
                len,
                region: region.len(),
            });
        }
        // SAFETY: `offset .. offset + len` lies inside the region's mapping (checked above),
        // which the returned MR holds (`backing`) and drops only after it deregisters.
        let mut mr = unsafe { self.reg_mr_iova(region.as_ptr().add(offset), len, iova, access) }?;
        mr.backing = Some(region);
        Ok(mr)
    }

    /// Allocates `len` zeroed bytes and registers them: memory the region owns, which the
    /// application reads and writes through [`MemoryRegion::read`] / [`MemoryRegion::write`].
    pub fn alloc_mr(&self, len: usize, access: Access) -> Result<MemoryRegion, VerbsError> {
        self.local("an MR the library allocates")?;
        let (keys, addr) = self
            .ctx
            .dev
            .register(|mem| mem.register_owned(self.id, len, access))?;
        Ok(MemoryRegion {
            ctx: self.ctx.clone(),
            pd: self.id,
            addr,
            len,
            lkey: keys.lkey,
            rkey: keys.rkey,
            access,
            backing: None,
            remote: None,
        })
    }

    /// Checks that a local gather element names registered memory of this PD, with local
    /// write if `write` (what `ibv_advise_mr`'s prefetch asks: registered memory of a
    /// software RNIC is always present, so there is nothing to fault in).
    pub fn check_local(
        &self,
        sge: &ferroce_stack::transport::Sge,
        write: bool,
    ) -> Result<(), ferroce_stack::transport::AccessError> {
        let needed = if write {
            Access::LOCAL_WRITE
        } else {
            Access::NONE
        };
        if self.remote.is_some() {
            // The service checks every element when the WR runs.
            return Ok(());
        }
        self.ctx.dev.engine().core_mut().mem().check_access(
            sge.lkey,
            self.id,
            sge.addr,
            u64::from(sge.length),
            needed,
        )
    }

    /// `ibv_create_qp` with `IBV_QPT_RAW_PACKET`: a QP that sends whole Ethernet frames
    /// and receives what its flow rules ([`RawQueuePair::create_flow`]) match (see
    /// [`engine::raw`](crate::engine::raw)).
    pub fn create_raw_qp(
        &self,
        caps: QpCaps,
        send_cq: &CompletionQueue,
        recv_cq: &CompletionQueue,
    ) -> Result<RawQueuePair, VerbsError> {
        if !Arc::ptr_eq(&send_cq.ctx.dev, &self.ctx.dev)
            || !Arc::ptr_eq(&recv_cq.ctx.dev, &self.ctx.dev)
        {
            return Err(VerbsError::WrongDevice("a CQ"));
        }
        if let Some(pd) = &self.remote {
            let (Some(scq), Some(rcq)) = (&send_cq.shared.remote, &recv_cq.shared.remote) else {
                return Err(VerbsError::WrongDevice("a CQ"));
            };
            let qp = pd
                .create_raw_qp(caps, scq, rcq, self.ctx.dev.eth_mtu + 18)
                .map_err(service_error)?;
            let mut shared = QpShared::new(qp.qpn().value(), QpType::Ud, qp.caps());
            shared.events = self.ctx.dev.events.clone();
            shared.remote = Some(qp);
            return Ok(RawQueuePair {
                ctx: self.ctx.clone(),
                shared: Arc::new(shared),
                eth_mtu: self.ctx.dev.eth_mtu,
            });
        }
        let qpn = self.ctx.dev.next_qpn();
        let shared = Arc::new(QpShared::new(qpn, QpType::Ud, caps));
        let raw = crate::engine::raw::RawQp::new(
            shared.clone(),
            self.id,
            send_cq.shared.clone(),
            recv_cq.shared.clone(),
        );
        self.ctx.dev.engine().core_mut().add_raw(raw);
        Ok(RawQueuePair {
            ctx: self.ctx.clone(),
            shared,
            eth_mtu: self.ctx.dev.eth_mtu,
        })
    }

    /// `ibv_create_wq`: a receive work queue of `max_wr` receives of up to `max_sge`
    /// elements, completing on `cq`: what an RSS QP's indirection table spreads frames over
    /// ([`Context::create_rss_qp`]). It is a raw QP that only receives, in RESET until
    /// [`RawQueuePair::set_wq_ready`].
    pub fn create_wq(
        &self,
        max_wr: u32,
        max_sge: u32,
        cq: &CompletionQueue,
    ) -> Result<RawQueuePair, VerbsError> {
        let caps = QpCaps {
            max_recv_wr: max_wr,
            max_recv_sge: max_sge,
            ..QpCaps::default()
        };
        self.create_raw_qp(caps, cq, cq)
    }

    /// `ibv_alloc_mw`: a memory window of this PD, type 2 (bound by
    /// [`SendWr::bind_mw`](ferroce_stack::transport::SendWr::bind_mw) on a QP, to that QP,
    /// and invalidated by key) or type 1. Unbound, its key opens nothing.
    pub fn alloc_mw(&self, type2: bool) -> Result<MemoryWindow, VerbsError> {
        self.local("a memory window")?;
        let key = self.ctx.dev.alloc_window(self.id, type2)?;
        Ok(MemoryWindow {
            ctx: self.ctx.clone(),
            key,
            type2,
        })
    }

    /// `ibv_create_srq`: a shared receive queue of `max_wr` receives of up to `max_sge`
    /// elements, for QPs created with [`create_qp_with_srq`](Self::create_qp_with_srq).
    ///
    /// # Panics
    /// On an attached context whose service refuses: use [`try_create_srq`](Self::try_create_srq).
    pub fn create_srq(&self, max_wr: u32, max_sge: u32) -> SharedReceiveQueue {
        self.try_create_srq(max_wr, max_sge)
            .expect("the service refused an SRQ")
    }

    /// `ibv_create_srq`, which only a service can refuse.
    pub fn try_create_srq(
        &self,
        max_wr: u32,
        max_sge: u32,
    ) -> Result<SharedReceiveQueue, VerbsError> {
        let remote = match &self.remote {
            Some(pd) => Some(Arc::new(
                pd.create_srq(max_wr, max_sge).map_err(service_error)?,
            )),
            None => None,
        };
        let srq = ferroce_stack::transport::Srq::new(max_wr, max_sge);
        let id = self.ctx.dev.next_id();
        let events = self.ctx.dev.events.clone();
        srq.set_limit_handler(Box::new(move || {
            events.emit(crate::AsyncEvent::SrqLimitReached(id))
        }));
        Ok(SharedReceiveQueue {
            srq,
            id,
            tm_cq: None,
            remote,
        })
    }

    /// `ibv_create_srq_ex` of a tag matching SRQ (`IBV_SRQT_TM`): ordinary receives, and a
    /// list of up to `max_tags` tagged buffers (one element each), whose operations
    /// ([`SharedReceiveQueue::post_tag_op`]) complete on `cq`. Messages to its QPs are
    /// matched by their tag matching header (see `ferroce_stack::transport::tm`).
    pub fn create_tm_srq(
        &self,
        max_wr: u32,
        max_sge: u32,
        max_tags: u32,
        cq: &CompletionQueue,
    ) -> SharedReceiveQueue {
        let srq = ferroce_stack::transport::Srq::with_tag_matching(max_wr, max_sge, max_tags, 1);
        let id = self.ctx.dev.next_id();
        let events = self.ctx.dev.events.clone();
        srq.set_limit_handler(Box::new(move || {
            events.emit(crate::AsyncEvent::SrqLimitReached(id))
        }));
        SharedReceiveQueue {
            srq,
            id,
            tm_cq: Some((cq.ctx.clone(), cq.shared.clone())),
            remote: None,
        }
    }

    /// `ibv_create_qp` with `srq` set: receives come from the shared queue.
    pub fn create_qp_with_srq(
        &self,
        qp_type: QpType,
        caps: QpCaps,
        send_cq: &CompletionQueue,
        recv_cq: &CompletionQueue,
        srq: &SharedReceiveQueue,
    ) -> Result<QueuePair, VerbsError> {
        if self.remote.is_some() {
            return match &srq.remote {
                Some(r) => self.create_remote(qp_type, caps, send_cq, recv_cq, Some(r)),
                None => Err(VerbsError::NotThroughService("a tag matching SRQ")),
            };
        }
        // A tag matching SRQ reports its QPs' receives on its own CQ, as rdma-core has it.
        let tm_cq = srq.tm_cq.as_ref().map(|(ctx, shared)| CompletionQueue {
            ctx: ctx.clone(),
            shared: shared.clone(),
        });
        let recv_cq = tm_cq.as_ref().unwrap_or(recv_cq);
        self.create(qp_type, caps, send_cq, recv_cq, Some(srq.srq.clone()))
    }

    /// `ibv_create_qp`: a QP of `qp_type` with `caps`, completing sends on `send_cq` and
    /// receives on `recv_cq`.
    pub fn create_qp(
        &self,
        qp_type: QpType,
        caps: QpCaps,
        send_cq: &CompletionQueue,
        recv_cq: &CompletionQueue,
    ) -> Result<QueuePair, VerbsError> {
        self.create(qp_type, caps, send_cq, recv_cq, None)
    }

    /// A QP of the service this PD's context is attached to.
    fn create_remote(
        &self,
        qp_type: QpType,
        caps: QpCaps,
        send_cq: &CompletionQueue,
        recv_cq: &CompletionQueue,
        srq: Option<&crate::service::RemoteSrq>,
    ) -> Result<QueuePair, VerbsError> {
        let Some(pd) = &self.remote else {
            return Err(VerbsError::NotThroughService("a QP of a local PD"));
        };
        let (Some(scq), Some(rcq)) = (&send_cq.shared.remote, &recv_cq.shared.remote) else {
            return Err(VerbsError::WrongDevice("a CQ"));
        };
        let qp = pd
            .create_qp(qp_type, caps, scq, rcq, srq)
            .map_err(service_error)?;
        let mut shared = QpShared::new(qp.qpn().value(), qp_type, qp.caps());
        shared.events = self.ctx.dev.events.clone();
        shared.has_srq = srq.is_some();
        shared.remote = Some(qp);
        Ok(QueuePair {
            ctx: self.ctx.clone(),
            shared: Arc::new(shared),
        })
    }

    fn create(
        &self,
        qp_type: QpType,
        caps: QpCaps,
        send_cq: &CompletionQueue,
        recv_cq: &CompletionQueue,
        srq: Option<ferroce_stack::transport::Srq>,
    ) -> Result<QueuePair, VerbsError> {
        if !Arc::ptr_eq(&send_cq.ctx.dev, &self.ctx.dev)
            || !Arc::ptr_eq(&recv_cq.ctx.dev, &self.ctx.dev)
        {
            return Err(VerbsError::WrongDevice("a CQ"));
        }
        if self.remote.is_some() {
            return self.create_remote(qp_type, caps, send_cq, recv_cq, None);
        }
        let (qpn, engine) = self.ctx.dev.place_qp();
        let mut config = QpConfig::new(Qpn::new(qpn), qp_type, self.id);
        config.caps = caps;
        let has_srq = srq.is_some();
        config.srq = srq;
        let mut qp = Qp::new(config);
        if qp_type == QpType::Ud {
            qp.set_port_mtu(Mtu::for_ethernet_mtu(self.ctx.dev.eth_mtu));
        }
        let mut shared = QpShared::new(qpn, qp_type, caps);
        shared.has_srq = has_srq;
        shared.events = self.ctx.dev.events.clone();
        let shared = Arc::new(shared);
        send_cq.shared.serves_engine(engine);
        recv_cq.shared.serves_engine(engine);
        self.ctx.dev.slot(qpn).lock().core_mut().add_qp(
            qp,
            shared.clone(),
            send_cq.shared.clone(),
            recv_cq.shared.clone(),
        );
        self.ctx.dev.claim_qpn(qpn);
        Ok(QueuePair {
            ctx: self.ctx.clone(),
            shared,
        })
    }
}

/// A raw packet QP (`IBV_QPT_RAW_PACKET`). Dropping it destroys it and its flow rules.
#[derive(Debug)]
pub struct RawQueuePair {
    ctx: Context,
    shared: Arc<QpShared>,
    eth_mtu: usize,
}

/// A flow rule attached to a raw QP. Dropping it detaches it.
#[derive(Debug)]
pub struct Flow {
    ctx: Context,
    id: u64,
    /// The service's, on an attached context (it goes with this).
    remote: Option<crate::service::RemoteFlow>,
}

impl Drop for Flow {
    fn drop(&mut self) {
        if self.remote.is_none() {
            self.ctx.dev.engine().core_mut().detach_flow(self.id);
        }
    }
}

impl RawQueuePair {
    /// Its number.
    pub fn qpn(&self) -> Qpn {
        Qpn::new(self.shared.qpn)
    }

    /// Its state.
    pub fn state(&self) -> QpState {
        match &self.shared.remote {
            Some(r) => r.state(),
            None => self.shared.state(),
        }
    }

    /// Its capabilities.
    pub fn caps(&self) -> QpCaps {
        self.shared.caps
    }

    fn with<T>(
        &self,
        f: impl FnOnce(&mut crate::engine::raw::RawQp, &ferroce_stack::transport::MrTable, u64) -> T,
    ) -> Result<T, VerbsError> {
        let slot = &self.ctx.dev.engines[0];
        let out = slot
            .lock()
            .core_mut()
            .with_raw(self.shared.qpn, f)
            .ok_or(VerbsError::NoSuchQp(self.shared.qpn))?;
        slot.idle.wake();
        Ok(out)
    }

    /// `ibv_modify_qp`: to `state`, INIT on port `port_num` (from 1).
    pub fn modify(&self, state: QpState, port_num: Option<u8>) -> Result<(), VerbsError> {
        if let Some(r) = &self.shared.remote {
            let mut mask = AttrMask::STATE;
            if port_num.is_some() {
                mask = mask.with(AttrMask::PORT);
            }
            let attr = QpAttr {
                qp_state: state,
                port_num: port_num.unwrap_or(1),
                ..QpAttr::default()
            };
            return r.modify(&attr, mask).map_err(service_error);
        }
        let port = match port_num {
            Some(p) => Some(self.ctx.port_index(p)? as u8),
            None => None,
        };
        if self.with(|raw, _, now| raw.modify(state, port, now))? {
            Ok(())
        } else {
            Err(VerbsError::Modify(
                ferroce_stack::transport::ModifyError::IllegalTransition {
                    qp_type: QpType::Ud,
                    from: self.state(),
                    to: state,
                },
            ))
        }
    }

    /// `ibv_modify_wq` of a work queue (or an RSS QP): ready (receiving, as RTS), or back
    /// to RESET, or ERR (flushing its receives).
    pub fn set_wq_state(&self, state: QpState) -> Result<(), VerbsError> {
        if self.shared.remote.is_some() {
            return Err(VerbsError::NotThroughService("a work queue"));
        }
        self.with(|raw, _, now| raw.force_state(state, now))
    }

    /// Its port (from 1).
    pub fn port_num(&self) -> Result<u8, VerbsError> {
        if let Some(r) = &self.shared.remote {
            return Ok(r.port_num());
        }
        self.with(|raw, _, _| raw.port() + 1)
    }

    /// `ibv_post_send`: each WR a SEND whose gather list (or inline data) is a whole
    /// Ethernet frame, read now.
    pub fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<(), PostFailure> {
        if let Some(r) = &self.shared.remote {
            return r.post_send(wrs);
        }
        let max = self.eth_mtu + 18;
        let (state, caps) = (self.state(), self.shared.caps);
        let r = self.with(|raw, mem, _| {
            for (index, wr) in wrs.iter().enumerate() {
                let fail = |error| PostFailure { index, error };
                crate::engine::raw::check_send(state, &caps, wr, max).map_err(fail)?;
                let signaled = wr
                    .flags
                    .contains(ferroce_stack::transport::SendFlags::SIGNALED);
                let (sges, inline) = match wr.payload {
                    ferroce_stack::transport::Payload::Sges(s) => (s, None),
                    ferroce_stack::transport::Payload::Inline(b) => (&[][..], Some(b)),
                };
                raw.post_send(mem, wr.wr_id, signaled, sges, inline, max)
                    .map_err(fail)?;
            }
            Ok(())
        });
        r.unwrap_or(Err(PostFailure {
            index: 0,
            error: PostError::InvalidState(QpState::Reset),
        }))
    }

    /// `ibv_post_recv`: buffers for whole received frames.
    pub fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<(), PostFailure> {
        if let Some(r) = &self.shared.remote {
            return r.post_recv(wrs);
        }
        let r = self.with(|raw, _, _| {
            for (index, wr) in wrs.iter().enumerate() {
                raw.post_recv(wr.wr_id, wr.sg_list)
                    .map_err(|error| PostFailure { index, error })?;
            }
            Ok(())
        });
        r.unwrap_or(Err(PostFailure {
            index: 0,
            error: PostError::InvalidState(QpState::Reset),
        }))
    }

    /// `ibv_create_flow`: frames arriving on the QP's port that match `rule` (and no rule
    /// attached before it) come to this QP.
    pub fn create_flow(&self, rule: crate::engine::raw::FlowRule) -> Result<Flow, VerbsError> {
        if let Some(r) = &self.shared.remote {
            let flow = r.create_flow(rule).map_err(service_error)?;
            return Ok(Flow {
                ctx: self.ctx.clone(),
                id: 0,
                remote: Some(flow),
            });
        }
        let id = self.ctx.dev.engines[0]
            .lock()
            .core_mut()
            .attach_flow(self.shared.qpn, rule)
            .ok_or(VerbsError::NoSuchQp(self.shared.qpn))?;
        Ok(Flow {
            ctx: self.ctx.clone(),
            id,
            remote: None,
        })
    }
}

impl Drop for RawQueuePair {
    fn drop(&mut self) {
        // A service's goes with the shared part, which holds it.
        if self.shared.remote.is_none() {
            self.ctx.dev.engine().core_mut().remove_raw(self.shared.qpn);
        }
    }
}

/// A memory window. Dropping it deallocates it: later accesses with any of its keys fail
/// with a remote access error.
#[derive(Debug)]
pub struct MemoryWindow {
    ctx: Context,
    key: u32,
    type2: bool,
}

impl MemoryWindow {
    /// Its key as allocated; a bind moves it to another (in the low eight bits).
    pub fn rkey(&self) -> u32 {
        self.key
    }

    /// True for a type 2 window.
    pub fn is_type2(&self) -> bool {
        self.type2
    }
}

impl Drop for MemoryWindow {
    fn drop(&mut self) {
        self.ctx.dev.dealloc_window(self.key);
    }
}

/// A registered memory region. Dropping it deregisters: later remote accesses with its keys
/// fail cleanly with a remote access error.
pub struct MemoryRegion {
    ctx: Context,
    pd: PdId,
    addr: u64,
    len: usize,
    lkey: u32,
    rkey: u32,
    access: Access,
    /// The shared memory it registers, kept mapped until after it deregisters (dropped
    /// after `drop` has run).
    backing: Option<Arc<dyn ferroce_drivers::shm::Mapped>>,
    /// The service's registration, on an attached context.
    remote: Option<RemoteMr>,
}

impl std::fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("len", &self.len)
            .field("lkey", &format_args!("{:#010x}", self.lkey))
            .finish()
    }
}

impl MemoryRegion {
    /// Where the region starts in the address space peers and gather lists use: the
    /// virtual address, unless it was registered with [`ProtectionDomain::reg_mr_iova`].
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a zero-length region.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Local key.
    pub fn lkey(&self) -> u32 {
        self.lkey
    }

    /// Remote key.
    pub fn rkey(&self) -> u32 {
        self.rkey
    }

    /// Access rights.
    pub fn access(&self) -> Access {
        self.access
    }

    /// A scatter/gather element for `len` bytes at `offset`.
    pub fn sge(&self, offset: usize, len: usize) -> ferroce_stack::transport::Sge {
        ferroce_stack::transport::Sge {
            addr: self.addr + offset as u64,
            length: len as u32,
            lkey: self.lkey,
        }
    }

    /// `ibv_rereg_mr`: the region keeps its keys and moves to protection domain `pd`, to
    /// `len` bytes at `addr` addressed as `iova`, and/or to `access`, whichever are given.
    ///
    /// # Safety
    /// New memory is under [`ProtectionDomain::reg_mr`]'s promise from now on.
    pub unsafe fn rereg(
        &mut self,
        pd: Option<&ProtectionDomain>,
        memory: Option<(*mut u8, usize, u64)>,
        access: Option<Access>,
    ) -> Result<(), VerbsError> {
        if self.remote.is_some() {
            return Err(VerbsError::NotThroughService("ibv_rereg_mr"));
        }
        if pd.is_some_and(|p| !Arc::ptr_eq(&p.ctx.dev, &self.ctx.dev)) {
            return Err(VerbsError::WrongDevice("the PD"));
        }
        let keys = ferroce_stack::transport::MrKeys {
            lkey: self.lkey,
            rkey: self.rkey,
        };
        // SAFETY: the caller's promise, passed on.
        unsafe {
            self.ctx
                .dev
                .reregister(keys, pd.map(|p| p.id), memory, access)
        }?;
        if let Some(p) = pd {
            self.pd = p.id;
        }
        if let Some((_, len, iova)) = memory {
            self.addr = iova;
            self.len = len;
        }
        if let Some(a) = access {
            self.access = a;
        }
        Ok(())
    }

    /// Copies out of the region through the same checked accessor the engine uses (for an
    /// owned region from [`ProtectionDomain::alloc_mr`], the only way to read it).
    pub fn read(&self, offset: usize, out: &mut [u8]) -> bool {
        if self.remote.is_some() {
            return false;
        }
        self.ctx
            .dev
            .engine()
            .core_mut()
            .mem()
            .read(
                self.lkey,
                self.pd,
                self.addr + offset as u64,
                out,
                Access::NONE,
            )
            .is_ok()
    }

    /// Copies into the region (needs LOCAL_WRITE).
    pub fn write(&self, offset: usize, data: &[u8]) -> bool {
        if self.remote.is_some() {
            return false;
        }
        self.ctx
            .dev
            .engine()
            .core_mut()
            .mem()
            .write(
                self.lkey,
                self.pd,
                self.addr + offset as u64,
                data,
                Access::LOCAL_WRITE,
            )
            .is_ok()
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        if self.remote.is_some() {
            // The service's registration goes with `remote`.
            return;
        }
        let keys = ferroce_stack::transport::MrKeys {
            lkey: self.lkey,
            rkey: self.rkey,
        };
        self.ctx.dev.deregister(keys);
    }
}

/// A completion channel: a thread waits on it instead of spinning on CQs.
#[derive(Debug, Clone)]
pub struct CompletionChannel {
    ctx: Context,
    shared: Arc<ChannelShared>,
}

impl CompletionChannel {
    /// `ibv_get_cq_event`: waits up to `timeout` for an armed CQ to get a completion;
    /// returns that CQ's id. Needs an engine thread (or another thread calling progress).
    pub fn get_event(&self, timeout: Duration) -> Option<u32> {
        let _ = &self.ctx;
        if let Some(r) = self.shared.remote.get() {
            return r.wait_event(timeout);
        }
        self.shared.wait(timeout)
    }

    /// On an attached context: the descriptor the service makes readable once per event
    /// (the drop-in hands it to the program as the channel's fd).
    pub fn remote_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.shared.remote.get().map(|r| r.fd())
    }

    /// On an attached context: the CQ of an event whose count the caller read from
    /// [`remote_fd`](Self::remote_fd).
    pub fn take_remote_event(&self) -> Option<u32> {
        self.shared.remote.get().and_then(|r| r.take_event())
    }

    /// Calls `f` after every event the channel receives, on the thread that completed the
    /// work (the engine's): for a waiter that sleeps on something other than the channel,
    /// such as a file descriptor. Set once; later calls return false and change nothing.
    pub fn set_notify(&self, f: Box<dyn Fn() + Send + Sync>) -> bool {
        self.shared.notify.set(f).is_ok()
    }
}

/// A completion queue.
#[derive(Debug, Clone)]
pub struct CompletionQueue {
    ctx: Context,
    shared: Arc<CqShared>,
}

impl CompletionQueue {
    /// Its id (what a completion channel event names).
    pub fn id(&self) -> u32 {
        self.shared.id
    }

    /// `ibv_poll_cq`: up to `max` completions appended to `out`, oldest first. In
    /// run-to-completion mode this first turns the engine once.
    pub fn poll(&self, out: &mut Vec<WorkCompletion>, max: usize) -> usize {
        if let Some(r) = &self.shared.remote {
            return r.poll(out, max);
        }
        if self.shared.queue.is_empty() {
            self.ctx.dev.progress_for(&self.shared);
        }
        let mut n = 0;
        while n < max {
            match self.shared.queue.pop() {
                Some((wc, _)) => {
                    out.push(wc);
                    n += 1;
                }
                None => break,
            }
        }
        if max > 0 {
            self.ctx.dev.polled(n > 0);
        }
        n
    }

    /// One completion, if any.
    pub fn poll_one(&self) -> Option<WorkCompletion> {
        self.poll_one_stamped().map(|(wc, _)| wc)
    }

    /// One completion and when the engine made it (its clock, ns: see
    /// [`Context::clock_ns`]), if any.
    pub fn poll_one_stamped(&self) -> Option<(WorkCompletion, u64)> {
        if let Some(r) = &self.shared.remote {
            let mut one = Vec::with_capacity(1);
            r.poll(&mut one, 1);
            return one.pop().map(|wc| (wc, self.ctx.now()));
        }
        if self.shared.queue.is_empty() {
            self.ctx.dev.progress_for(&self.shared);
        }
        let wc = self.shared.queue.pop();
        self.ctx.dev.polled(wc.is_some());
        wc
    }

    /// One completion and its stamp, if one waits, without turning the engine (the
    /// service's forwarder, which runs on the engine thread between turns).
    pub(crate) fn take_stamped(&self) -> Option<(WorkCompletion, u64)> {
        self.shared.queue.pop()
    }

    /// Completions waiting.
    pub fn len(&self) -> usize {
        match &self.shared.remote {
            Some(r) => r.len(),
            None => self.shared.queue.len(),
        }
    }

    /// True when no completion waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// True when no completion will ever come: the service the CQ's context is attached
    /// to has gone (`ibv_poll_cq` then fails).
    pub fn is_fatal(&self) -> bool {
        self.shared.remote.as_ref().is_some_and(|r| r.is_gone())
    }

    /// Entries the CQ holds at most.
    pub fn capacity(&self) -> usize {
        self.shared.capacity.load(Ordering::Relaxed)
    }

    /// `ibv_resize_cq`: room for `cqe` completions from now on; refused when more than that
    /// wait (they would be lost).
    pub fn resize(&self, cqe: usize) -> Result<(), VerbsError> {
        if self.shared.remote.is_some() {
            return Err(VerbsError::NotThroughService("ibv_resize_cq"));
        }
        let cqe = cqe.max(1);
        let waiting = self.shared.queue.len();
        if waiting > cqe {
            return Err(VerbsError::CqTooSmall { cqe, waiting });
        }
        self.shared.capacity.store(cqe, Ordering::Relaxed);
        Ok(())
    }

    /// `ibv_req_notify_cq`: the next completion (or the next solicited one) posts an event
    /// on the CQ's channel.
    pub fn req_notify(&self, solicited_only: bool) {
        if let Some(r) = &self.shared.remote {
            r.req_notify(solicited_only);
            return;
        }
        self.shared
            .armed
            .store(if solicited_only { 2 } else { 1 }, Ordering::Release);
    }

    /// Completions lost because the CQ was full.
    pub fn overruns(&self) -> usize {
        self.shared.overruns.load(Ordering::Relaxed)
    }
}

/// A shared receive queue.
#[derive(Debug, Clone)]
pub struct SharedReceiveQueue {
    srq: ferroce_stack::transport::Srq,
    id: u32,
    /// A tag matching SRQ's CQ: where its tag list operations complete.
    tm_cq: Option<(Context, Arc<CqShared>)>,
    /// The service's SRQ, on an attached context (`srq` is then unused).
    remote: Option<Arc<crate::service::RemoteSrq>>,
}

/// A tag list operation on a tag matching SRQ (`struct ibv_ops_wr`): each may report the
/// count of unexpected messages software has handled (`IBV_OPS_TM_SYNC`; an add or remove
/// without one goes by the count last reported), and completes on the SRQ's CQ when
/// `signaled` (or when it fails).
#[derive(Clone, Copy, Debug)]
pub enum TagOp<'a> {
    /// `IBV_WR_TAG_ADD`: a buffer for messages whose tag agrees with `tag` under `mask`,
    /// completed as `recv_wr_id`.
    Add {
        /// The operation's id.
        wr_id: u64,
        /// Unexpected messages handled, if reported.
        unexpected: Option<u32>,
        /// The tag.
        tag: u64,
        /// Its mask.
        mask: u64,
        /// The id its receive completions carry.
        recv_wr_id: u64,
        /// The buffer.
        sg_list: &'a [ferroce_stack::transport::Sge],
        /// Complete it on success too.
        signaled: bool,
    },
    /// `IBV_WR_TAG_DEL`: removes the tag with `handle`.
    Del {
        /// The operation's id.
        wr_id: u64,
        /// Unexpected messages handled, if reported.
        unexpected: Option<u32>,
        /// The tag's handle (from its add).
        handle: u32,
        /// Complete it on success too.
        signaled: bool,
    },
    /// `IBV_WR_TAG_SYNC`: reports the count.
    Sync {
        /// The operation's id.
        wr_id: u64,
        /// Unexpected messages handled.
        unexpected: u32,
        /// Complete it on success too.
        signaled: bool,
    },
}

impl SharedReceiveQueue {
    /// Its id (what an `SrqLimitReached` event names).
    pub fn id(&self) -> u32 {
        self.id
    }

    /// `ibv_query_srq`: its size, elements per receive and armed limit (0: none).
    pub fn query(&self) -> (u32, u32, u32) {
        match &self.remote {
            // A service that has gone answers nothing: a queue of no size.
            Some(r) => r.query().unwrap_or((0, 0, 0)),
            None => self.srq.attr(),
        }
    }

    /// `ibv_modify_srq`: resize it (not below the receives waiting) and/or arm its limit
    /// (not above its size; 0 disarms). Crossing an armed limit raises
    /// [`AsyncEvent::SrqLimitReached`](crate::AsyncEvent) once.
    pub fn modify(
        &self,
        max_wr: Option<u32>,
        limit: Option<u32>,
    ) -> Result<(), ferroce_stack::transport::SrqModifyError> {
        match &self.remote {
            // A service that has gone refuses everything; this error type has no word for
            // that, and the smallest refusal stands in for it.
            Some(r) => r.modify(max_wr, limit).unwrap_or(Err(
                ferroce_stack::transport::SrqModifyError::TooSmall {
                    max_wr: 0,
                    queued: 0,
                },
            )),
            None => self.srq.modify(max_wr, limit),
        }
    }

    /// `ibv_post_srq_recv` for a list of WRs; the first refused one stops the list.
    pub fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<(), PostFailure> {
        if let Some(r) = &self.remote {
            return r.post_recv(wrs);
        }
        for (index, wr) in wrs.iter().enumerate() {
            self.srq
                .post_recv(wr)
                .map_err(|error| PostFailure { index, error })?;
        }
        Ok(())
    }

    /// `ibv_post_srq_ops` for one operation: the added tag's handle (0 for the others).
    /// A failed add or remove (a stale unexpected count, a handle a message consumed)
    /// completes with `IBV_WC_TM_ERR`; a full list or too many elements is refused here.
    /// Completions carry `IBV_WC_TM_SYNC_REQ` while software is behind.
    pub fn post_tag_op(&self, op: &TagOp<'_>) -> Result<u32, PostError> {
        use ferroce_stack::transport::{TmError, WcFlags, WcOpcode, WcStatus, WorkCompletion};
        let Some((ctx, cq)) = &self.tm_cq else {
            return Err(PostError::UsesSrq);
        };
        let (wr_id, signaled, opcode, done): (_, _, _, Result<u32, TmError>) = match *op {
            TagOp::Add {
                wr_id,
                unexpected,
                tag,
                mask,
                recv_wr_id,
                sg_list,
                signaled,
            } => (
                wr_id,
                signaled,
                WcOpcode::TmAdd,
                self.srq
                    .add_tag(unexpected, tag, mask, recv_wr_id, sg_list)
                    .expect("a tag matching SRQ"),
            ),
            TagOp::Del {
                wr_id,
                unexpected,
                handle,
                signaled,
            } => (
                wr_id,
                signaled,
                WcOpcode::TmDel,
                self.srq
                    .remove_tag(unexpected, handle)
                    .expect("a tag matching SRQ")
                    .map(|()| 0),
            ),
            TagOp::Sync {
                wr_id,
                unexpected,
                signaled,
            } => {
                self.srq.sync_tags(unexpected);
                (wr_id, signaled, WcOpcode::TmSync, Ok(0))
            }
        };
        let status = match done {
            Err(e @ (TmError::Full(_) | TmError::TooManySges { .. })) => return Err(e.into()),
            Err(_) => WcStatus::TmErr,
            Ok(_) => WcStatus::Success,
        };
        if signaled || status != WcStatus::Success {
            let mut wc = WorkCompletion::of_request(wr_id, status, opcode, 0);
            if self.srq.tag_sync_required() {
                wc.wc_flags = WcFlags::TM_SYNC_REQ;
            }
            cq.push(wc, ctx.dev.now());
        }
        Ok(done.unwrap_or(0))
    }

    /// Receives waiting.
    pub fn len(&self) -> usize {
        self.srq.len()
    }

    /// True when no receive waits.
    pub fn is_empty(&self) -> bool {
        self.srq.is_empty()
    }
}

/// A UD destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddressHandle {
    /// The path.
    pub av: AddressVector,
}

/// A queue pair.
#[derive(Debug, Clone)]
pub struct QueuePair {
    ctx: Context,
    shared: Arc<QpShared>,
}

impl QueuePair {
    /// Its number.
    pub fn qpn(&self) -> Qpn {
        Qpn::new(self.shared.qpn)
    }

    /// Its type.
    pub fn qp_type(&self) -> QpType {
        self.shared.qp_type
    }

    /// The state as of the engine's last turn.
    pub fn state(&self) -> QpState {
        self.shared.state()
    }

    /// `ibv_modify_qp`.
    pub fn modify(&self, attr: &QpAttr, mask: AttrMask) -> Result<(), VerbsError> {
        if let Some(r) = &self.shared.remote {
            r.modify(attr, mask).map_err(service_error)?;
            if mask.contains(AttrMask::STATE) {
                self.shared
                    .state
                    .store(state_code(attr.qp_state), Ordering::Release);
            }
            return Ok(());
        }
        // On a device with several ports, the path leaves from the QP's port (PORT in the
        // same call, or port 1): its MAC and address are the source.
        let mut fixed;
        let attr = if mask.contains(AttrMask::AV) && self.ctx.dev.ports.len() > 1 {
            fixed = *attr;
            let port = if mask.contains(AttrMask::PORT) {
                attr.port_num
            } else {
                self.with_qp(|qp| qp.query().port_num)?
            };
            let (smac, src) = self.ctx.dev.ports[self.ctx.port_index(port.max(1))?];
            fixed.ah_attr.smac = smac;
            fixed.ah_attr.src = src;
            &fixed
        } else {
            attr
        };
        let mut result = Ok(());
        let mut state = None;
        let slot = self.ctx.dev.slot(self.shared.qpn);
        let found = slot
            .lock()
            .core_mut()
            .with_qp(self.shared.qpn, |qp| {
                result = qp.modify(attr, mask);
                state = Some(qp.state());
            })
            .is_some();
        // A QP moved to RTS (or to ERR, flushing) has frames or completions for the engine.
        slot.idle.wake();
        if !found {
            return Err(VerbsError::NoSuchQp(self.shared.qpn));
        }
        if let Some(s) = state {
            self.shared.state.store(state_code(s), Ordering::Release);
            // A QP reset leaves nothing of its past in its CQs, as an RNIC's driver cleans
            // them (mlx5 removes the QP's CQEs when it resets it).
            if s == QpState::Reset && result.is_ok() && mask.contains(AttrMask::STATE) {
                let qpn = self.shared.qpn;
                slot.lock().core_mut().clean_cqs(qpn);
            }
        }
        Ok(result?)
    }

    /// ferroce's extended attribute: the QP's policies (path selection, loss recovery and
    /// delivery, congestion control; see `ferroce-reliability`), in RESET or INIT. Both ends
    /// of a connection must run recovery policies with the same
    /// [`Delivery`](ferroce_stack::transport::Delivery): agree on it at connection setup, as
    /// the QP numbers are. ECMP, Go-Back-N and no congestion control are the default.
    pub fn set_reliability(
        &self,
        policy: ferroce_stack::transport::Policies,
    ) -> Result<(), VerbsError> {
        self.with_qp(|qp| match qp.state() {
            QpState::Reset | QpState::Init => {
                qp.set_policies(policy);
                Ok(())
            }
            s => Err(VerbsError::PolicyAfterRtr(s)),
        })?
    }

    /// ferroce's extension for protocols above UC (SDR): this UC QP's
    /// WRITE_ONLY_WITH_IMMEDIATE packets go to `sink` instead of its receive queue (see
    /// [`WriteImmSink`](ferroce_stack::transport::WriteImmSink)).
    pub fn set_write_imm_sink(
        &self,
        sink: Box<dyn ferroce_stack::transport::WriteImmSink>,
    ) -> Result<(), VerbsError> {
        Ok(self.with_qp(|qp| qp.set_write_imm_sink(Some(sink)).map(|_| ()))??)
    }

    /// Runs `f` on the transport QP under its engine's lock.
    fn with_qp<T>(&self, f: impl FnOnce(&mut Qp) -> T) -> Result<T, VerbsError> {
        self.ctx
            .dev
            .slot(self.shared.qpn)
            .lock()
            .core_mut()
            .with_qp(self.shared.qpn, f)
            .ok_or(VerbsError::NoSuchQp(self.shared.qpn))
    }

    /// The engine of its device this QP lives on (0 on a device with one engine).
    pub fn engine(&self) -> usize {
        self.ctx.dev.engine_of(self.shared.qpn)
    }

    /// Moves this QP to another engine of its device, with its queues, outstanding work,
    /// timers and CQs, in any state: the step failover takes when it moves a QP onto the
    /// engine of another port. Posting, polling and the peer's frames carry on unchanged.
    pub fn move_to_engine(&self, engine: usize) -> Result<(), VerbsError> {
        self.ctx.dev.move_qp(self.shared.qpn, engine)
    }

    /// Gives this connected QP (RTR or RTS) an alternate path from port `port_num` to the
    /// peer's (`gid`, `dmac`), where native failover moves it (`IBV_QP_ALT_PATH`);
    /// `peer_max_dest_rd_atomic` is the peer's replay depth, which must cover this QP's
    /// `max_rd_atomic` (see [`Qp::set_alternate_path`]).
    pub fn set_alternate_path(
        &self,
        port_num: u8,
        gid: Gid,
        dmac: MacAddr,
        peer_max_dest_rd_atomic: u8,
    ) -> Result<(), VerbsError> {
        let mut av = self.ctx.path_on(port_num, gid, dmac)?;
        Ok(self.with_qp(|qp| {
            av.udp_src_port = qp.query().ah_attr.udp_src_port;
            qp.set_alternate_path(av, port_num, peer_max_dest_rd_atomic)
        })??)
    }

    /// Offers port `port_num` of this QP's device to a ferroce peer in band: the QP
    /// announces it when it reaches RTS and takes the peer's other port as its alternate
    /// path when the peer announces one (see [`Qp::offer_alternate_port`]). What the
    /// libibverbs drop-in does for programs that set no alternate path, on a device with
    /// two ports.
    pub fn offer_alternate_port(&self, port_num: u8) -> Result<(), VerbsError> {
        let i = self.ctx.port_index(port_num)?;
        let (mac, ip) = self.ctx.dev.ports[i];
        let local = ferroce_stack::transport::LocalPort {
            port: i as u8,
            mac,
            ip,
        };
        self.with_qp(|qp| qp.offer_alternate_port(local))?;
        self.ctx.dev.slot(self.shared.qpn).idle.wake();
        Ok(())
    }

    /// Where native failover has this QP now: its active port (from 1; `None` without an
    /// alternate path), and how often it moved.
    pub fn path_state(&self) -> Result<(Option<u8>, u64), VerbsError> {
        self.with_qp(|qp| (qp.active_port().map(|p| p + 1), qp.path_migrations()))
    }

    /// What this QP's in-band path control exchange did (announces, moves followed).
    pub fn path_control_stats(
        &self,
    ) -> Result<ferroce_stack::transport::PathControlStats, VerbsError> {
        self.with_qp(|qp| qp.path_control_stats())
    }

    /// `ibv_query_qp_data_in_order`: true when its data lands in order (its recovery policy
    /// delivers in PSN order); placement policies write a message's packets as they come.
    pub fn data_in_order(&self) -> Result<bool, VerbsError> {
        self.with_qp(|qp| qp.delivery() == ferroce_stack::transport::Delivery::InOrder)
    }

    /// `ibv_query_qp`.
    pub fn query(&self) -> Result<QpAttr, VerbsError> {
        if let Some(r) = &self.shared.remote {
            let a = r.query().map_err(service_error)?;
            self.shared
                .state
                .store(state_code(a.qp_state), Ordering::Release);
            return Ok(a);
        }
        self.with_qp(|qp| qp.query())
    }

    /// This QP's transport counters.
    pub fn counters(&self) -> Option<Counters> {
        self.ctx
            .dev
            .slot(self.shared.qpn)
            .lock()
            .core()
            .qp_counters(self.shared.qpn)
    }

    /// `ibv_post_send` for a list of WRs: each is checked and queued in order; the first
    /// one refused stops the list and is reported with its index (libibverbs' `bad_wr`).
    pub fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<(), PostFailure> {
        let sh = &self.shared;
        if let Some(r) = &sh.remote {
            return r.post_send(wrs);
        }
        // When nothing of this QP waits in its inbox and no thread holds the engine, post
        // straight into the QP: the QP checks everything this path does, and the WRs skip
        // their copies through the inbox and wait for no engine turn.
        let slot = self.ctx.dev.slot(sh.qpn);
        if sh.inbox.is_empty() {
            if let Some(mut e) = slot.try_lock() {
                // Not there: the QP is moving to another engine; the inbox travels with it.
                if let Some(r) = sh
                    .inbox
                    .is_empty()
                    .then(|| e.core_mut().post_sends(sh.qpn, wrs))
                    .flatten()
                {
                    let r = r.map_err(|(index, error)| PostFailure { index, error });
                    // The requests leave now, on this thread, rather than when an engine
                    // thread next turns (or, asleep, is woken and scheduled).
                    if slot.sleep_capable() {
                        slot.app_turn(&mut **e);
                    }
                    return r;
                }
            }
        }
        for (index, wr) in wrs.iter().enumerate() {
            let fail = |error| PostFailure { index, error };
            check_send(sh, wr).map_err(fail)?;
            if !QpShared::reserve(&sh.sq_used, sh.caps.max_send_wr) {
                return Err(fail(PostError::QueueFull(sh.caps.max_send_wr)));
            }
            if sh.submit(Op::Send(OwnedSend::from_wr(wr)), &slot.doorbells) {
                self.ctx.dev.ring_again_if_moved(sh, slot);
            }
        }
        slot.idle.wake();
        Ok(())
    }

    /// `ibv_post_recv` for a list of WRs.
    pub fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<(), PostFailure> {
        let sh = &self.shared;
        if let Some(r) = &sh.remote {
            return r.post_recv(wrs);
        }
        // As in `post_send`.
        let slot = self.ctx.dev.slot(sh.qpn);
        if sh.inbox.is_empty() {
            if let Some(mut e) = slot.try_lock() {
                if let Some(r) = sh
                    .inbox
                    .is_empty()
                    .then(|| e.core_mut().post_recvs(sh.qpn, wrs))
                    .flatten()
                {
                    return r.map_err(|(index, error)| PostFailure { index, error });
                }
            }
        }
        for (index, wr) in wrs.iter().enumerate() {
            let fail = |error| PostFailure { index, error };
            ferroce_stack::transport::check_recv(sh.state(), &sh.caps, sh.has_srq, wr)
                .map_err(fail)?;
            if !QpShared::reserve(&sh.rq_used, sh.caps.max_recv_wr) {
                return Err(fail(PostError::QueueFull(sh.caps.max_recv_wr)));
            }
            let op = Op::Recv(wr.wr_id, SmallVec::from_slice(wr.sg_list));
            if sh.submit(op, &slot.doorbells) {
                self.ctx.dev.ring_again_if_moved(sh, slot);
            }
        }
        slot.idle.wake();
        Ok(())
    }
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        // The last handle destroys the QP (`ibv_destroy_qp`); a service's QP goes with
        // the shared part, which holds it.
        if Arc::strong_count(&self.shared) == 2 && self.shared.remote.is_none() {
            self.ctx.dev.destroy_qp(self.shared.qpn);
        }
    }
}

/// The checks `post_send` makes before queuing (the engine's QP repeats them): the QP's
/// own (`ferroce_stack::transport::check_send`), but for the local operations (memory
/// window binds, local invalidates), which the engine carries out itself on any connected
/// QP.
fn check_send(sh: &QpShared, wr: &SendWr<'_>) -> Result<(), PostError> {
    if !wr.opcode.is_local() {
        return ferroce_stack::transport::check_send(sh.state(), sh.qp_type, &sh.caps, wr)
            .map(|_| ());
    }
    match sh.state() {
        QpState::Rts | QpState::Sqd | QpState::Sqe | QpState::Err => {}
        s => return Err(PostError::InvalidState(s)),
    }
    if sh.qp_type == QpType::Ud {
        return Err(PostError::UnsupportedOpcode {
            opcode: wr.opcode,
            qp_type: sh.qp_type,
        });
    }
    Ok(())
}
