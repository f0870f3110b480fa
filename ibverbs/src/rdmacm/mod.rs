//! librdmacm over ferroce: `rdma_create_id`, `rdma_resolve_addr`, `rdma_connect`,
//! `rdma_listen`, `rdma_accept`, ... as rdma-core 44's librdmacm offers them, speaking the
//! IBTA communication manager on each device's QP1 through ferroce's own agent
//! ([`ferroce_verbs::cm`]), the same MADs the Linux kernel's rdma_cm sends for a ConnectX.
//!
//! The functions live here, in the libibverbs drop-in, under private names
//! (`ferroce_rdma_create_id`, ...): a process has one copy of ferroce, and the ids' devices
//! are this library's contexts. The `librdmacm.so.1` the project builds (crate
//! `ferroce-rdmacm`) only forwards rdma-core's versioned names to them.
//!
//! What librdmacm splits between itself and the kernel's `rdma_ucm` is all here: the ids and
//! their event channels ([`event`]), address and route resolution (the neighbour lookup the
//! drop-in's verbs use), the QP transitions librdmacm makes with the numbers the exchange
//! carried ([`qp`]). The device's agent runs in its engine; one dispatcher thread per device
//! takes the agent's events and queues each on the channel of the id it belongs to.
//!
//! Locks: the process's [`Cma`] state, then a channel's queue. A program's call may hold the
//! state while it calls the agent (which takes the engine's lock); the engine never takes
//! the state, and the dispatcher takes only the state, so no cycle exists.

pub mod addrinfo;
pub mod event;
pub mod id;
pub mod qp;
pub mod registry;
pub mod unsupported;

use std::collections::{HashMap, HashSet};
use std::ffi::c_int;
use std::net::{IpAddr, SocketAddr};
use std::sync::{LazyLock, Mutex, MutexGuard};

use ferroce_stack::cm::{ConnId, Peer, RepInfo, ReqInfo};
use ferroce_stack::wire::MacAddr;
use ferroce_verbs::cm::{ConnectionManager, Offer};

use crate::device::set_errno;
use crate::ffi;

pub use event::Channel;

/// The Q_Key of RDMA_PS_UDP and RDMA_PS_IPOIB ids (`RDMA_UDP_QKEY`).
pub const UDP_QKEY: u32 = 0x0123_4567;

/// An open device as the CM sees it: the context ids hand programs (`id->verbs`), its
/// agent, and the port's address.
pub(crate) struct CmaDevice {
    /// Opened by this library on first use and kept for the process, as librdmacm keeps
    /// its devices.
    pub(crate) ctx: *mut ffi::ibv_context,
    pub(crate) cm: ConnectionManager,
    /// The PD an id on the device has until the program gives its own (librdmacm's
    /// per-device PD), kept for the process.
    pub(crate) pd: *mut ffi::ibv_pd,
    pub(crate) ip: IpAddr,
    pub(crate) mac: MacAddr,
    /// The Linux interface, for the neighbour table.
    pub(crate) iface: Option<String>,
    /// The listeners and the answerer of the port's address across processes.
    pub(crate) registry: std::sync::Arc<registry::Registry>,
    /// `enum ibv_mtu` of port 1.
    pub(crate) active_mtu: u8,
    /// The device's limits on READs and atomics in flight.
    pub(crate) max_responder_resources: u8,
    pub(crate) max_initiator_depth: u8,
}

/// Where an id stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum St {
    Idle,
    Bound,
    AddrResolved,
    RouteResolved,
    Listen,
    /// Active: REQ (or SIDR_REQ) sent.
    Connect,
    /// Passive: a request came; the program has not answered.
    Request,
    /// Passive: REP sent.
    Accepted,
    /// Active: REP came, no QP on the id; the program sends the RTU with `rdma_establish`.
    Response,
    Connected,
    Disconnected,
}

/// The CM's view of one id (the program's view is its `rdma_cm_id`).
pub(crate) struct IdState {
    pub(crate) st: St,
    /// Index into [`Cma::devs`] once the id has a device.
    pub(crate) dev: Option<usize>,
    pub(crate) src: Option<SocketAddr>,
    pub(crate) dst: Option<SocketAddr>,
    pub(crate) peer: Option<Peer>,
    pub(crate) conn: Option<ConnId>,
    /// The services it listens on, per device.
    pub(crate) listening: Vec<(usize, u64)>,
    /// Made with no event channel: calls wait for their own event (`ucma_complete`).
    pub(crate) sync: bool,
    /// A SIDR exchange (UDP port space) rather than a connection.
    pub(crate) ud: bool,
    pub(crate) req: Option<ReqInfo>,
    pub(crate) rep: Option<RepInfo>,
    /// The local QP's first PSN (random, as the kernel's).
    pub(crate) psn: u32,
    pub(crate) responder_resources: u8,
    pub(crate) initiator_depth: u8,
    pub(crate) retry_count: u8,
    /// The RNR retries the peer asked us to make.
    pub(crate) rnr_retry_count: u8,
    pub(crate) path_mtu: u8,
    pub(crate) tos: u8,
    pub(crate) ack_timeout: u8,
    /// Private data `rdma_create_ep` took from `ai_connect`, sent before the program's.
    pub(crate) connect_blob: Vec<u8>,
    /// A passive endpoint's QP attributes (`rdma_create_ep` with `RAI_PASSIVE`).
    pub(crate) qp_init_attr: Option<ffi::ibv_qp_init_attr>,
    /// For a request's id: the listener, until the program has taken the request.
    pub(crate) listener: Option<usize>,
    /// The `(port space, port)` the id took when it was bound.
    pub(crate) owned_port: Option<(u16, u16)>,
    /// A request's: what the peer offered beyond IBTA in its REQ (`None`: a peer that
    /// offered nothing, as a kernel CM's).
    pub(crate) peer_offer: Option<Offer>,
    /// The local QP the connection is for (its number).
    pub(crate) qpn: u32,
}

impl IdState {
    fn new(sync: bool, ud: bool) -> Self {
        Self {
            st: St::Idle,
            dev: None,
            src: None,
            dst: None,
            peer: None,
            conn: None,
            listening: Vec::new(),
            sync,
            ud,
            req: None,
            rep: None,
            psn: 0,
            responder_resources: 0,
            initiator_depth: 0,
            retry_count: 7,
            rnr_retry_count: 7,
            path_mtu: 3,
            tos: 0,
            ack_timeout: DEFAULT_ACK_TIMEOUT,
            connect_blob: Vec::new(),
            qp_init_attr: None,
            listener: None,
            owned_port: None,
            peer_offer: None,
            qpn: 0,
        }
    }
}

/// The local ACK timeout (4.096 µs × 2^n, about 1.07 s) of a connection made through the CM
/// when the program sets none (`RDMA_OPTION_ID_ACK_TIMEOUT`): the order of what Linux's CM
/// puts in a RoCE REQ, whose path records carry a packet lifetime of 16 to 18 by kernel
/// version. The QPs' transport timeout is this.
pub(crate) const DEFAULT_ACK_TIMEOUT: u8 = 18;

/// The process's CM: its devices and every id.
pub(crate) struct Cma {
    pub(crate) devs: Vec<CmaDevice>,
    /// By the program's `rdma_cm_id` pointer.
    pub(crate) ids: HashMap<usize, IdState>,
    /// A device's connection to the id it belongs to.
    pub(crate) conns: HashMap<(usize, ConnId), usize>,
    /// `(port space, port)` pairs ids are bound to.
    pub(crate) ports: HashSet<(u16, u16)>,
    rng: u64,
    /// The process that made the state: a child forked from it inherits the state and the
    /// `atexit` handler, but not the connections, which stay its parent's.
    pub(crate) pid: u32,
}

// SAFETY: the context pointers are this library's own contexts, which live for the process
// and are used only through this library's thread-safe verbs.
unsafe impl Send for Cma {}

impl Cma {
    /// A pseudo-random number (xorshift over the clock and pid): PSNs and ephemeral ports.
    pub(crate) fn random(&mut self) -> u64 {
        let mut x = self.rng;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng = x;
        x
    }

    /// An unused port of `ps` from the ephemeral range, taken.
    pub(crate) fn ephemeral_port(&mut self, ps: u16) -> Option<u16> {
        for _ in 0..4096 {
            let p = 32768 + (self.random() % 28232) as u16;
            if self.ports.insert((ps, p)) {
                return Some(p);
            }
        }
        None
    }

    /// The device whose port has address `ip`.
    pub(crate) fn dev_of_ip(&self, ip: IpAddr) -> Option<usize> {
        self.devs.iter().position(|d| same_ip(d.ip, ip))
    }
}

/// Equal as addresses, an IPv4-mapped IPv6 address equal to its IPv4 one.
pub(crate) fn same_ip(a: IpAddr, b: IpAddr) -> bool {
    a.to_canonical() == b.to_canonical()
}

/// The state, once the devices are open (`ENODEV` when `FERROCE_DEVICES` names none that
/// opens, as librdmacm without an RDMA device).
static CMA: LazyLock<Result<Mutex<Cma>, c_int>> = LazyLock::new(|| {
    let devs = event::open_devices();
    if devs.is_empty() {
        return Err(libc::ENODEV);
    }
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0x5eed, |d| d.as_nanos() as u64)
        ^ u64::from(std::process::id()) << 40
        | 1;
    let cms: Vec<ConnectionManager> = devs.iter().map(|d| d.cm.clone()).collect();
    let cma = Mutex::new(Cma {
        devs,
        ids: HashMap::new(),
        conns: HashMap::new(),
        ports: HashSet::new(),
        rng: seed,
        pid: std::process::id(),
    });
    for (i, cm) in cms.into_iter().enumerate() {
        event::start_dispatcher(i, cm);
    }
    // SAFETY: registers a function with no arguments that lives as long as the library
    // (glibc runs a library's handlers when it is unloaded, too).
    if unsafe { libc::atexit(id::at_exit) } != 0 {
        eprintln!("ferroce: atexit failed: connections open at exit will not be ended");
    }
    Ok(cma)
});

/// The state if it can be had now: `None` when there is none (no device), `Some(Err(()))`
/// when another thread holds it.
pub(crate) fn try_cma() -> Option<Result<MutexGuard<'static, Cma>, ()>> {
    let m = CMA.as_ref().ok()?;
    Some(match m.try_lock() {
        Ok(g) => Ok(g),
        Err(std::sync::TryLockError::Poisoned(p)) => Ok(p.into_inner()),
        Err(std::sync::TryLockError::WouldBlock) => Err(()),
    })
}

/// The state, locked; `Err(errno)` (and `errno` set) when there is no device.
pub(crate) fn cma() -> Result<MutexGuard<'static, Cma>, c_int> {
    match &*CMA {
        Ok(m) => Ok(m.lock().unwrap_or_else(|e| e.into_inner())),
        Err(e) => {
            set_errno(*e);
            Err(*e)
        }
    }
}

/// True when `FERROCE_CM_TRACE` is set: each CM event and call is printed to stderr, to see
/// where an unmodified program's connection goes.
pub(crate) fn trace_on() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("FERROCE_CM_TRACE").is_some())
}

/// Prints a CM trace line when [`trace_on`] says so.
macro_rules! cm_trace {
    ($($t:tt)*) => {
        if $crate::rdmacm::trace_on() {
            eprintln!("ferroce cm: {}", format_args!($($t)*));
        }
    };
}
pub(crate) use cm_trace;

/// librdmacm's error convention: `errno` set, -1 returned.
pub(crate) fn err(e: c_int) -> c_int {
    set_errno(e);
    -1
}

/// A `struct sockaddr` the program passed, read as an address (IPv4 and IPv6).
///
/// # Safety
/// `sa` is null or points to a `sockaddr_in` or `sockaddr_in6` as its family says.
pub(crate) unsafe fn read_sockaddr(sa: *const libc::sockaddr) -> Option<SocketAddr> {
    if sa.is_null() {
        return None;
    }
    // SAFETY: per the contract, the family field is readable and says what follows.
    unsafe {
        match c_int::from((*sa).sa_family) {
            libc::AF_INET => {
                let s = &*(sa as *const libc::sockaddr_in);
                Some(SocketAddr::new(
                    IpAddr::V4(u32::from_be(s.sin_addr.s_addr).into()),
                    u16::from_be(s.sin_port),
                ))
            }
            libc::AF_INET6 => {
                let s = &*(sa as *const libc::sockaddr_in6);
                Some(SocketAddr::new(
                    IpAddr::V6(s.sin6_addr.s6_addr.into()),
                    u16::from_be(s.sin6_port),
                ))
            }
            _ => None,
        }
    }
}

/// Writes `a` as a `sockaddr_in` / `sockaddr_in6` into `dst` (a `sockaddr_storage`).
pub(crate) fn write_sockaddr(dst: &mut ffi::sockaddr_storage, a: SocketAddr) {
    // SAFETY: a sockaddr_storage is large and aligned enough for either, and is plain data.
    unsafe {
        std::ptr::write_bytes(dst as *mut ffi::sockaddr_storage, 0, 1);
        match a {
            SocketAddr::V4(v4) => {
                let s = &mut *(dst as *mut ffi::sockaddr_storage as *mut libc::sockaddr_in);
                s.sin_family = libc::AF_INET as libc::sa_family_t;
                s.sin_port = v4.port().to_be();
                s.sin_addr.s_addr = u32::from(*v4.ip()).to_be();
            }
            SocketAddr::V6(v6) => {
                let s = &mut *(dst as *mut ffi::sockaddr_storage as *mut libc::sockaddr_in6);
                s.sin6_family = libc::AF_INET6 as libc::sa_family_t;
                s.sin6_port = v6.port().to_be();
                s.sin6_addr.s6_addr = v6.ip().octets();
                s.sin6_scope_id = v6.scope_id();
            }
        }
    }
}

/// The GID of an IP address (IPv4-mapped for IPv4), as the port's GID table has it.
pub(crate) fn gid_of(ip: IpAddr) -> [u8; 16] {
    ferroce_verbs::Gid::from_ip(ip).0
}

/// The `rdma_cm_id` a program holds, as this library made it: the program's structure
/// first, then what this library keeps beside it.
#[repr(C)]
pub(crate) struct CmId {
    pub(crate) id: ffi::rdma_cm_id,
    /// `id.route.path_rec` points here once the route is resolved.
    pub(crate) path: ffi::ibv_sa_path_rec,
}

impl CmId {
    /// A new id on `channel`, boxed; the pointer the program holds.
    pub(crate) fn alloc(
        channel: *mut ffi::rdma_event_channel,
        context: *mut std::ffi::c_void,
        ps: ffi::rdma_port_space,
        qp_type: ffi::ibv_qp_type,
    ) -> *mut ffi::rdma_cm_id {
        let b = Box::new(Self {
            id: ffi::rdma_cm_id {
                channel,
                context,
                ps,
                qp_type,
                ..Default::default()
            },
            path: ffi::ibv_sa_path_rec::default(),
        });
        Box::into_raw(b) as *mut ffi::rdma_cm_id
    }
}
