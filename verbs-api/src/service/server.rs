//! `ferroce serve`'s side: the devices it owns, a control thread per program, and the
//! forwarder that carries work between the programs' rings and the engines.
//!
//! Each program's objects live in its [`Session`]; every handle in a request is looked up
//! there, so a program can only name what it created. When a program goes (it closed the
//! socket, or died and the kernel closed it), or when it breaks its rings, its session is
//! dropped: QPs first (destroyed in the engine, so their peers' next packets meet no QP),
//! then CQs, MRs (deregistered, so no later access reaches its memory) and PDs.

use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ferroce_drivers::shm::{Consumer, Producer, Region, RingLayout};
use ferroce_stack::transport::{
    Access, OwnedSendWr, QpAttr, QpCaps, Sge, WcStatus, WorkCompletion,
};
use ferroce_stack::wire::Qpn;
use smallvec::SmallVec;

use super::cm_route::CmRoutes;
use super::proto::{
    self, DeviceFacts, Handle, PortFacts, Request, Response, WireCaps, MAX_DEPTH, MAX_MESSAGE,
    PAGE, SLEEPING,
};
use super::slots::{self, Slot, W};
use super::socket::{Channel, Doorbell, Listener};
use crate::verbs::{
    CompletionChannel, CompletionQueue, Context, MemoryRegion, PortState, ProtectionDomain,
    QueuePair, RawQueuePair,
};

/// Objects of each kind one program may hold.
const MAX_OBJECTS: usize = 1 << 14;
/// Requests the forwarder moves from one ring per turn.
const BURST: usize = 32;

/// The service's counters (`ferroce serve --json` prints them at exit).
#[derive(Debug, Default)]
pub struct ServiceCounters {
    /// Programs that connected.
    pub sessions: AtomicU64,
    /// Sessions dropped because the program broke a ring or sent what cannot be decoded.
    pub sessions_dropped: AtomicU64,
    /// Requests refused (a bad handle, a bad value).
    pub requests_refused: AtomicU64,
    /// Work requests moved from programs' rings to QPs.
    pub wrs_forwarded: AtomicU64,
    /// Completions moved from CQs to programs' rings.
    pub wcs_forwarded: AtomicU64,
    /// Times the engine thread that runs the forwarder slept.
    pub sleeps: AtomicU64,
}

struct ServedCq {
    device: usize,
    real: CompletionQueue,
    ring: Producer<W>,
    /// The ring's region, whose notification words follow the ring.
    region: Arc<Region>,
    /// Where they are (see [`proto::cq_words`]).
    words: (usize, usize),
    /// The program's completion channel, when the CQ has one.
    channel: Option<Doorbell>,
    /// Completions taken from the CQ that did not go into the ring yet, with their order
    /// stamps.
    held: VecDeque<(WorkCompletion, u64)>,
    /// QPs that use it.
    users: usize,
}

/// A served QP: an RDMA QP, or a raw packet QP.
enum Real {
    Rdma(QueuePair),
    Raw(RawQueuePair),
}

impl Real {
    fn qpn(&self) -> Qpn {
        match self {
            Self::Rdma(q) => q.qpn(),
            Self::Raw(q) => q.qpn(),
        }
    }

    fn post_send(
        &self,
        wrs: &[ferroce_stack::transport::SendWr<'_>],
    ) -> Result<(), crate::PostFailure> {
        match self {
            Self::Rdma(q) => q.post_send(wrs),
            Self::Raw(q) => q.post_send(wrs),
        }
    }

    fn post_recv(
        &self,
        wrs: &[ferroce_stack::transport::RecvWr<'_>],
    ) -> Result<(), crate::PostFailure> {
        match self {
            Self::Rdma(q) => q.post_recv(wrs),
            Self::Raw(q) => q.post_recv(wrs),
        }
    }
}

struct ServedQp {
    real: Real,
    pd: Handle,
    sq: Consumer<W>,
    rq: Consumer<W>,
    /// Requests taken from the send ring that the QP did not accept yet (its queue was full).
    sends: VecDeque<OwnedSendWr>,
    recvs: VecDeque<(u64, SmallVec<[Sge; 2]>)>,
    send_cq: Handle,
    recv_cq: Handle,
    /// Its shared receive queue, if any.
    srq: Option<Handle>,
    /// The MAC and address its packets leave from (port 1's until a modify names another).
    port: (ferroce_stack::wire::MacAddr, std::net::IpAddr),
}

/// Where a QP's receives retired are counted for the program ([`proto::qp_words`]).
struct Retired {
    region: Arc<Region>,
    at: usize,
    count: u64,
}

struct ServedSrq {
    real: crate::verbs::SharedReceiveQueue,
    pd: Handle,
    ring: Consumer<W>,
    /// Receives taken from the ring that the SRQ did not accept yet (it was full).
    recvs: VecDeque<(u64, SmallVec<[Sge; 2]>)>,
    /// QPs that take receives from it.
    users: usize,
}

struct ServedMr {
    pd: Handle,
    /// Dropped first: deregistration happens before the mapping goes.
    _mr: MemoryRegion,
}

/// One program's objects.
struct Session {
    pid: u32,
    /// Its asynchronous events' way out.
    events: Arc<EventOut>,
    /// Its control socket: shut down when the service stops, so the program sees it go.
    chan: Arc<Channel>,
    page: Arc<Region>,
    pds: HashMap<Handle, (usize, ProtectionDomain)>,
    mrs: HashMap<Handle, ServedMr>,
    cqs: HashMap<Handle, ServedCq>,
    qps: HashMap<Handle, ServedQp>,
    /// Per QP number, where its receives retired are counted.
    retired: HashMap<u32, Retired>,
    /// Its flow rules, with their raw QPs.
    flows: HashMap<Handle, (Handle, crate::verbs::Flow)>,
    /// The program's user: a raw packet QP is root's only.
    uid: u32,
    srqs: HashMap<Handle, ServedSrq>,
    next: Handle,
    /// The program broke its rings: the forwarder skips it until the control thread drops
    /// it.
    broken: bool,
}

impl Session {
    fn handle(&mut self) -> Handle {
        self.next = self.next.wrapping_add(1).max(1);
        self.next
    }

    /// Everything, in the order that keeps the engine from reaching freed memory.
    fn clear(&mut self) {
        self.flows.clear();
        self.qps.clear();
        self.retired.clear();
        self.srqs.clear();
        self.cqs.clear();
        self.mrs.clear();
        self.pds.clear();
    }
}

/// The programs served now.
type Sessions = Vec<Arc<Mutex<Session>>>;

/// What the threads of a service share.
struct Shared {
    devices: Vec<Context>,
    /// One channel per device: every served CQ reports to it, and it rings the doorbell.
    channels: Vec<CompletionChannel>,
    sessions: Mutex<Sessions>,
    doorbell: Arc<Doorbell>,
    stop: AtomicBool,
    counters: ServiceCounters,
    /// Where asynchronous events go: each program's event ring, and which program owns each
    /// QP number. Locked by the engine threads that raise events (with their engine held),
    /// so nothing takes an engine while holding it.
    routes: Mutex<Routes>,
    /// Where every served CQ takes its completions' order stamps.
    order: Arc<AtomicU64>,
}

/// A program's asynchronous events: a ring in its control page, and its eventfd.
struct EventOut {
    ring: Mutex<Producer<2>>,
    bell: Doorbell,
}

impl EventOut {
    /// Queues an event and wakes the program; false when its ring was full.
    fn send(&self, words: [u64; 2]) -> bool {
        let sent = lock(&self.ring).push(&words).unwrap_or(false);
        if sent {
            self.bell.ring();
        }
        sent
    }
}

#[derive(Default)]
struct Routes {
    programs: Vec<std::sync::Weak<EventOut>>,
    qps: HashMap<u32, std::sync::Weak<EventOut>>,
}

/// Hands a device's event to the program it concerns (a port's: every program).
fn route(shared: &std::sync::Weak<Shared>, device: u32, e: crate::AsyncEvent) {
    let Some(shared) = shared.upgrade() else {
        return;
    };
    let Some(words) = proto::event_words(device, e) else {
        return;
    };
    use crate::AsyncEvent as E;
    let mut routes = lock(&shared.routes);
    match e {
        E::PortActive(_) | E::PortError(_) => {
            routes.programs.retain(|w| w.strong_count() > 0);
            for p in routes.programs.iter().filter_map(std::sync::Weak::upgrade) {
                p.send(words);
            }
        }
        E::QpFatal(q)
        | E::QpRequestError(q)
        | E::QpAccessError(q)
        | E::QpLastWqeReached(q)
        | E::PathMigrated(q) => {
            if let Some(p) = routes
                .qps
                .get(&q.value())
                .and_then(std::sync::Weak::upgrade)
            {
                p.send(words);
            }
        }
        _ => {}
    }
}

/// Forgets where a program's QPs' events go (its QPs are going).
fn forget_qps(shared: &Shared, s: &Session) {
    let mut routes = lock(&shared.routes);
    for q in s.qps.values() {
        routes.qps.remove(&q.real.qpn().value());
    }
}

/// A running service.
pub struct Service {
    shared: Arc<Shared>,
    listener: Arc<Listener>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

/// Why a service did not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The socket.
    #[error("cannot listen at {path}: {source}")]
    Listen {
        /// Where.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// An eventfd or a thread.
    #[error("{0}")]
    Os(#[from] std::io::Error),
    /// An engine thread.
    #[error("{0}")]
    Engine(#[from] crate::VerbsError),
}

impl Service {
    /// Serves `devices` at `socket`, which users matching `mode` may connect to. Each device
    /// runs its engine thread; one forwarder thread moves work between the programs' rings
    /// and the devices' QPs and CQs.
    pub fn start(devices: Vec<Context>, socket: PathBuf, mode: u32) -> Result<Self, ServeError> {
        let listener =
            Arc::new(
                Listener::bind(&socket, mode).map_err(|source| ServeError::Listen {
                    path: socket.clone(),
                    source,
                })?,
            );
        let doorbell = Arc::new(Doorbell::new()?);
        let channels = devices
            .iter()
            .map(|d| {
                let ch = d.create_comp_channel();
                let bell = doorbell.clone();
                ch.set_notify(Box::new(move || bell.ring()));
                ch
            })
            .collect();
        let shared = Arc::new(Shared {
            devices,
            channels,
            sessions: Mutex::new(Vec::new()),
            doorbell,
            stop: AtomicBool::new(false),
            counters: ServiceCounters::default(),
            routes: Mutex::new(Routes::default()),
            order: Arc::new(AtomicU64::new(1)),
        });
        for (i, d) in shared.devices.iter().enumerate() {
            let weak = Arc::downgrade(&shared);
            d.set_async_handler(Box::new(move |e| route(&weak, i as u32, e)));
        }
        let forwarder = Arc::new(Forwarder {
            shared: Arc::downgrade(&shared),
            doorbell: shared.doorbell.clone(),
        });
        if let Some(first) = shared.devices.first() {
            first.set_poller(forwarder);
        }
        for d in &shared.devices {
            d.start_engine_thread()?;
        }
        let mut threads = Vec::new();
        let sh = shared.clone();
        let l = listener.clone();
        threads.push(
            std::thread::Builder::new()
                .name("ferroce-control".into())
                .spawn(move || control(&sh, &l))?,
        );
        Ok(Self {
            shared,
            listener,
            threads,
        })
    }

    /// Where it listens.
    pub fn socket(&self) -> &std::path::Path {
        self.listener.path()
    }

    /// Its counters.
    pub fn counters(&self) -> &ServiceCounters {
        &self.shared.counters
    }

    /// Programs connected now.
    pub fn sessions(&self) -> usize {
        lock(&self.shared.sessions).len()
    }

    /// The devices it serves.
    pub fn devices(&self) -> &[Context] {
        &self.shared.devices
    }

    /// Stops serving: the programs see the socket close.
    pub fn stop(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.listener.shutdown();
        self.shared.doorbell.ring();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        for s in lock(&self.shared.sessions).drain(..) {
            let mut s = lock(&s);
            s.clear();
            s.chan.shutdown();
        }
        for d in &self.shared.devices {
            d.stop_engine_thread();
        }
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        self.halt();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A connection the control thread serves: before its Hello, a channel alone.
struct Conn {
    chan: Arc<Channel>,
    session: Option<Arc<Mutex<Session>>>,
    /// Names the program in the connection manager's routes.
    sid: u64,
}

/// The control thread: one for every program, so that a program costs the service no thread
/// (and no allocator arena) of its own. It waits on the listening socket and every
/// program's socket, accepts, and carries out each request as it comes; a program that
/// closes its socket, dies, or sends what cannot be decoded loses its objects.
fn control(shared: &Arc<Shared>, listener: &Listener) {
    use rustix::event::{PollFd, PollFlags};
    let mut conns: Vec<Conn> = Vec::new();
    let mut buf = Box::new([0u8; MAX_MESSAGE]);
    let Ok(mut cm) = CmRoutes::new(shared.devices.len()) else {
        tracing::error!("no eventfd for the connection manager: not serving");
        return;
    };
    let mut sids = 0u64;
    let tick = rustix::event::Timespec {
        tv_sec: 0,
        tv_nsec: 50_000_000,
    };
    while !shared.stop.load(Ordering::Acquire) {
        let (listening, cm_events, readable) = {
            let mut fds = Vec::with_capacity(conns.len() + 2);
            fds.push(PollFd::new(listener, PollFlags::IN));
            fds.push(PollFd::new(cm.fd(), PollFlags::IN));
            for c in &conns {
                fds.push(PollFd::new(&*c.chan, PollFlags::IN));
            }
            match rustix::event::poll(&mut fds, Some(&tick)) {
                Ok(0) => continue,
                Ok(_) => {}
                Err(rustix::io::Errno::INTR) => continue,
                Err(_) => {
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
            }
            let ready = |f: &PollFd<'_>| !f.revents().is_empty();
            (
                ready(&fds[0]),
                ready(&fds[1]),
                fds[2..].iter().map(ready).collect::<Vec<_>>(),
            )
        };
        if cm_events {
            cm.pump();
        }
        let mut gone = Vec::new();
        for (i, c) in conns.iter_mut().enumerate() {
            if readable[i] && !serve_message(shared, &mut cm, c, &mut buf) {
                gone.push(i);
            }
        }
        for i in gone.into_iter().rev() {
            let c = conns.swap_remove(i);
            detach(shared, &mut cm, c);
        }
        if listening {
            while let Ok(Some(chan)) = listener.accept_nonblocking() {
                sids += 1;
                conns.push(Conn {
                    chan: Arc::new(chan),
                    session: None,
                    sid: sids,
                });
            }
        }
    }
    for c in conns {
        detach(shared, &mut cm, c);
    }
}

/// A program's connection ends: its connections end on the wire, and its objects go.
fn detach(shared: &Shared, cm: &mut CmRoutes, c: Conn) {
    cm.leave(c.sid);
    c.chan.shutdown();
    if let Some(session) = c.session {
        lock(&shared.sessions).retain(|s| !Arc::ptr_eq(s, &session));
        let mut s = lock(&session);
        tracing::info!(pid = s.pid, qps = s.qps.len(), "program detached");
        forget_qps(shared, &s);
        s.clear();
    }
}

/// Takes one message from a program whose socket is readable and answers it: false when
/// the connection is over (closed, broken, or a message that cannot be decoded).
fn serve_message(
    shared: &Shared,
    cm: &mut CmRoutes,
    c: &mut Conn,
    buf: &mut [u8; MAX_MESSAGE],
) -> bool {
    let (n, fds) = match c.chan.try_recv(buf) {
        Ok(Some(Some(m))) => m,
        Ok(Some(None)) => return true, // nothing after all
        Ok(None) => return false,
        Err(e) => {
            if e.kind() == std::io::ErrorKind::InvalidData {
                shared
                    .counters
                    .sessions_dropped
                    .fetch_add(1, Ordering::Relaxed);
            }
            return false;
        }
    };
    let Some(req) = proto::decode::<Request>(&buf[..n]) else {
        shared
            .counters
            .sessions_dropped
            .fetch_add(1, Ordering::Relaxed);
        return false;
    };
    let Some(session) = &c.session else {
        return hello(shared, c, req, fds);
    };
    if shared.stop.load(Ordering::Acquire) || lock(session).broken {
        return false;
    }
    let (resp, out) = {
        let mut s = lock(session);
        match req {
            Request::Cm { device, call } => {
                let events = s.events.clone();
                let signal = move || -> Box<dyn Fn() -> bool + Send> {
                    Box::new(move || events.send(proto::CM_WAITING))
                };
                let owns_qp = |qpn: u32| {
                    s.qps.values().any(|q| {
                        q.real.qpn().value() == qpn
                            && s.pds.get(&q.pd).map(|p| p.0) == Some(device as usize)
                    })
                };
                let r = cm.call(&shared.devices, c.sid, signal, device, call, owns_qp);
                (r, Vec::new())
            }
            Request::CmTakeEvents => (cm.take(c.sid), Vec::new()),
            req => handle(shared, &mut s, req, fds),
        }
    };
    if matches!(resp, Response::Error { .. }) {
        shared
            .counters
            .requests_refused
            .fetch_add(1, Ordering::Relaxed);
    }
    let borrowed: Vec<_> = out.iter().map(|f| f.as_fd()).collect();
    send(&c.chan, &resp, &borrowed).is_ok()
}

/// A program's first message must be a Hello of this protocol's version: it gets its
/// session, its control page and the doorbell.
fn hello(shared: &Shared, c: &mut Conn, req: Request, mut fds: Vec<OwnedFd>) -> bool {
    let pid = match req {
        Request::Hello { version, pid } if version == proto::VERSION => pid,
        Request::Hello { version, .. } => {
            let why = format!(
                "protocol version {version}; this service speaks {}",
                proto::VERSION
            );
            let _ = send(&c.chan, &refuse(libc::EPROTO, why), &[]);
            return false;
        }
        _ => {
            shared
                .counters
                .sessions_dropped
                .fetch_add(1, Ordering::Relaxed);
            return false;
        }
    };
    let Ok(page) = Region::new(c"ferroce-page", PAGE) else {
        return false;
    };
    let page = Arc::new(page);
    let (Some(bell), Ok(ring)) = (fds.pop(), Producer::new(page.clone(), proto::EVENTS)) else {
        let _ = send(
            &c.chan,
            &refuse(libc::EINVAL, "a hello carries the program's event eventfd"),
            &[],
        );
        return false;
    };
    let events = Arc::new(EventOut {
        ring: Mutex::new(ring),
        bell: Doorbell::from_fd(bell),
    });
    lock(&shared.routes).programs.push(Arc::downgrade(&events));
    let welcome = Response::Welcome {
        version: proto::VERSION,
        devices: shared.devices.iter().map(|d| d.name().to_owned()).collect(),
    };
    let Ok(page_fd) = page.dup_fd() else {
        return false;
    };
    if send(
        &c.chan,
        &welcome,
        &[shared.doorbell.as_fd(), page_fd.as_fd()],
    )
    .is_err()
    {
        return false;
    }
    let session = Arc::new(Mutex::new(Session {
        pid,
        events,
        chan: c.chan.clone(),
        page,
        pds: HashMap::new(),
        mrs: HashMap::new(),
        cqs: HashMap::new(),
        qps: HashMap::new(),
        retired: HashMap::new(),
        flows: HashMap::new(),
        uid: rustix::net::sockopt::socket_peercred(&*c.chan).map_or(u32::MAX, |u| u.uid.as_raw()),
        srqs: HashMap::new(),
        next: 0,
        broken: false,
    }));
    shared.counters.sessions.fetch_add(1, Ordering::Relaxed);
    lock(&shared.sessions).push(session.clone());
    tracing::info!(pid, "program attached");
    c.session = Some(session);
    true
}

fn send(
    chan: &Channel,
    resp: &Response,
    fds: &[std::os::fd::BorrowedFd<'_>],
) -> std::io::Result<()> {
    chan.send(&proto::encode(resp), fds)
}

fn refuse(errno: i32, message: impl Into<String>) -> Response {
    Response::Error {
        errno,
        message: message.into(),
    }
}

fn no_such(what: &str, h: Handle) -> Response {
    refuse(libc::EINVAL, format!("no {what} with handle {h}"))
}

fn full(s: &Session) -> bool {
    s.pds.len() + s.mrs.len() + s.cqs.len() + s.qps.len() + s.srqs.len() >= MAX_OBJECTS
}

/// Carries out one request of a program.
fn handle(
    shared: &Shared,
    s: &mut Session,
    req: Request,
    mut fds: Vec<OwnedFd>,
) -> (Response, Vec<OwnedFd>) {
    let device = |d: u32| shared.devices.get(d as usize);
    let r = match req {
        Request::Hello { .. } => refuse(libc::EPROTO, "hello twice"),
        Request::CreateFlow { qp, rule } => match s.qps.get(&qp).map(|q| &q.real) {
            Some(Real::Raw(r)) if s.flows.len() < MAX_OBJECTS => match r.create_flow(rule) {
                Ok(flow) => {
                    let h = s.handle();
                    s.flows.insert(h, (qp, flow));
                    Response::Created { handle: h }
                }
                Err(e) => refuse(libc::EINVAL, e.to_string()),
            },
            Some(Real::Raw(_)) => refuse(libc::ENOMEM, "too many flows"),
            Some(Real::Rdma(_)) => refuse(libc::EINVAL, "a flow steers frames to a raw packet QP"),
            None => no_such("QP", qp),
        },
        Request::DestroyFlow { flow } => match s.flows.remove(&flow) {
            Some(_) => Response::Ok,
            None => no_such("flow", flow),
        },
        // Carried by the control thread's connection manager routes before this.
        Request::Cm { .. } | Request::CmTakeEvents => refuse(libc::EPROTO, "not here"),
        Request::QueryDevice { device: d } => match device(d) {
            None => refuse(libc::ENODEV, format!("no device {d}")),
            Some(ctx) => {
                let ports = (1..=ctx.query_device().phys_port_cnt)
                    .filter_map(|p| {
                        let a = ctx.query_port_num(p).ok()?;
                        Some(PortFacts {
                            mac: ctx.port_mac(p).ok()?.0,
                            gid: ctx.query_gid_on(p, 0).ok()?.0,
                            up: a.state == PortState::Active,
                            mtu: a.active_mtu as u8,
                            eth_mtu: ctx.eth_mtu() as u32,
                        })
                    })
                    .collect();
                Response::Device(DeviceFacts {
                    name: ctx.name().to_owned(),
                    ports,
                })
            }
        },
        Request::AllocPd { device: d } => match device(d) {
            None => refuse(libc::ENODEV, format!("no device {d}")),
            Some(_) if full(s) => refuse(libc::ENOMEM, "too many objects"),
            Some(ctx) => {
                let h = s.handle();
                s.pds.insert(h, (d as usize, ctx.alloc_pd()));
                Response::Created { handle: h }
            }
        },
        Request::DeallocPd { pd } => {
            if s.mrs.values().any(|m| m.pd == pd) || s.qps.values().any(|q| q.pd == pd) {
                refuse(libc::EBUSY, "the PD still has objects")
            } else if s.pds.remove(&pd).is_some() {
                Response::Ok
            } else {
                no_such("PD", pd)
            }
        }
        Request::RegMr {
            pd,
            addr: _,
            iova,
            len,
            offset,
            pieces,
            access,
        } => reg_mr(s, pd, iova, len, offset, &pieces, access, &fds),
        Request::DeregMr { mr } => match s.mrs.remove(&mr) {
            Some(_) => Response::Ok,
            None => no_such("MR", mr),
        },
        Request::CreateCq {
            device: d,
            cqe,
            channel,
        } => match device(d) {
            None => refuse(libc::ENODEV, format!("no device {d}")),
            Some(_) if cqe == 0 || cqe > MAX_DEPTH => {
                refuse(libc::EINVAL, format!("cqe {cqe}: 1 ..= {MAX_DEPTH}"))
            }
            Some(_) if channel && fds.len() != 1 => {
                refuse(libc::EINVAL, "a CQ with a channel carries its eventfd")
            }
            Some(_) if full(s) => refuse(libc::ENOMEM, "too many objects"),
            Some(ctx) => {
                let slots = cqe.next_power_of_two();
                let region = match Region::new(c"ferroce-cq", proto::cq_region(slots)) {
                    Ok(r) => Arc::new(r),
                    Err(e) => return (refuse(libc::ENOMEM, e.to_string()), Vec::new()),
                };
                let layout = RingLayout {
                    offset: 0,
                    cap: slots,
                };
                let Ok(ring) = Producer::new(region.clone(), layout) else {
                    return (refuse(libc::ENOMEM, "ring"), Vec::new());
                };
                let real = ctx.create_ordered_cq(
                    slots as usize,
                    Some(&shared.channels[d as usize]),
                    shared.order.clone(),
                );
                real.req_notify(false);
                let h = s.handle();
                s.cqs.insert(
                    h,
                    ServedCq {
                        device: d as usize,
                        real,
                        ring,
                        region: region.clone(),
                        words: proto::cq_words(slots),
                        channel: channel.then(|| fds.pop()).flatten().map(Doorbell::from_fd),
                        held: VecDeque::new(),
                        users: 0,
                    },
                );
                let fd = region.dup_fd().ok();
                return (Response::Cq { handle: h, slots }, fd.into_iter().collect());
            }
        },
        Request::DestroyCq { cq } => match s.cqs.get(&cq) {
            None => no_such("CQ", cq),
            Some(c) if c.users > 0 => refuse(libc::EBUSY, "QPs still use the CQ"),
            Some(_) => {
                s.cqs.remove(&cq);
                Response::Ok
            }
        },
        Request::CreateQp {
            pd,
            send_cq,
            recv_cq,
            qp_type,
            caps,
            srq,
        } => return create_qp(shared, s, pd, send_cq, recv_cq, qp_type, caps, srq),
        Request::CreateSrq {
            pd,
            max_wr,
            max_sge,
        } => return create_srq(s, pd, max_wr, max_sge),
        Request::ModifySrq { srq, max_wr, limit } => match s.srqs.get(&srq) {
            None => no_such("SRQ", srq),
            Some(q) => match q.real.modify(max_wr, limit) {
                Ok(()) => Response::Ok,
                Err(ferroce_stack::transport::SrqModifyError::LimitTooHigh { limit, max_wr }) => {
                    Response::SrqRefused {
                        limit_too_high: true,
                        asked: limit,
                        bound: u64::from(max_wr),
                    }
                }
                Err(ferroce_stack::transport::SrqModifyError::TooSmall { max_wr, queued }) => {
                    Response::SrqRefused {
                        limit_too_high: false,
                        asked: max_wr,
                        bound: queued as u64,
                    }
                }
            },
        },
        Request::QuerySrq { srq } => match s.srqs.get(&srq) {
            None => no_such("SRQ", srq),
            Some(q) => {
                let (a, b, c) = q.real.query();
                Response::SrqAttr(a, b, c)
            }
        },
        Request::DestroySrq { srq } => match s.srqs.get(&srq) {
            None => no_such("SRQ", srq),
            Some(q) if q.users > 0 => refuse(libc::EBUSY, "QPs still use the SRQ"),
            Some(_) => {
                s.srqs.remove(&srq);
                Response::Ok
            }
        },
        Request::ModifyQp { qp, attr, mask } => match s.qps.get_mut(&qp) {
            None => no_such("QP", qp),
            Some(q) => match QpAttr::try_from(attr) {
                Err(e) => refuse(libc::EINVAL, e.to_string()),
                Ok(mut a) => {
                    let mask = proto::mask(mask);
                    let dev = s.pds.get(&q.pd).map_or(0, |p| p.0);
                    if mask.contains(ferroce_stack::transport::AttrMask::PORT) {
                        q.port = ctx_port(&shared.devices[dev], a.port_num);
                    }
                    // A program's packets leave from its QP's port: the source in a path
                    // is the port's, whatever the program wrote.
                    a.ah_attr.smac = q.port.0;
                    a.ah_attr.src = q.port.1;
                    let port = mask
                        .contains(ferroce_stack::transport::AttrMask::PORT)
                        .then_some(a.port_num);
                    let done = match &q.real {
                        Real::Rdma(r) => r.modify(&a, mask),
                        Real::Raw(r)
                            if mask.contains(ferroce_stack::transport::AttrMask::STATE) =>
                        {
                            r.modify(a.qp_state, port)
                        }
                        Real::Raw(_) => Ok(()),
                    };
                    match done {
                        Ok(()) => Response::Ok,
                        Err(e) => refuse(libc::EINVAL, e.to_string()),
                    }
                }
            },
        },
        Request::QueryQp { qp } => match s.qps.get(&qp) {
            None => no_such("QP", qp),
            Some(q) => match &q.real {
                Real::Rdma(r) => match r.query() {
                    Ok(a) => Response::QpAttr(a.into()),
                    Err(e) => refuse(libc::EINVAL, e.to_string()),
                },
                // A raw QP has a state and a port, nothing else.
                Real::Raw(r) => Response::QpAttr(
                    QpAttr {
                        qp_state: r.state(),
                        port_num: r.port_num().unwrap_or(1),
                        ..QpAttr::default()
                    }
                    .into(),
                ),
            },
        },
        Request::DestroyQp { qp } => match s.qps.remove(&qp) {
            None => no_such("QP", qp),
            Some(q) => {
                lock(&shared.routes).qps.remove(&q.real.qpn().value());
                s.retired.remove(&q.real.qpn().value());
                s.flows.retain(|_, (on, _)| *on != qp);
                for c in [q.send_cq, q.recv_cq] {
                    if let Some(c) = s.cqs.get_mut(&c) {
                        c.users -= 1;
                    }
                }
                if let Some(r) = q.srq.and_then(|h| s.srqs.get_mut(&h)) {
                    r.users -= 1;
                }
                Response::Ok
            }
        },
    };
    drop(fds);
    (r, Vec::new())
}

#[allow(clippy::too_many_arguments)]
fn reg_mr(
    s: &mut Session,
    pd: Handle,
    iova: u64,
    len: u64,
    offset: u64,
    pieces: &[(u64, u64)],
    access: u32,
    fds: &[OwnedFd],
) -> Response {
    let Some((_, pdo)) = s.pds.get(&pd) else {
        return no_such("PD", pd);
    };
    if fds.is_empty() || fds.len() != pieces.len() {
        return refuse(
            libc::EINVAL,
            "a registration carries a descriptor per piece",
        );
    }
    if full(s) {
        return refuse(libc::ENOMEM, "too many objects");
    }
    let (Ok(offset), Ok(len)) = (usize::try_from(offset), usize::try_from(len)) else {
        return refuse(libc::EINVAL, "offset or length too large");
    };
    let pieces: Vec<_> = fds
        .iter()
        .zip(pieces)
        .map(|(fd, &(offset, len))| ferroce_drivers::shm::Piece {
            fd: fd.as_fd(),
            offset,
            len,
        })
        .collect();
    // Each memfd must be sealed against shrinking: a program that truncated one under us
    // would turn the engine's next access into SIGBUS.
    let mapping = match ferroce_drivers::shm::Stitched::new(&pieces) {
        Ok(m) => Arc::new(m),
        Err(e) => return refuse(libc::EINVAL, e.to_string()),
    };
    match pdo.reg_shared(mapping, offset, len, iova, Access(access)) {
        Err(e) => refuse(libc::EINVAL, e.to_string()),
        Ok(mr) => {
            let (lkey, rkey) = (mr.lkey(), mr.rkey());
            let h = s.handle();
            s.mrs.insert(h, ServedMr { pd, _mr: mr });
            Response::Mr {
                handle: h,
                lkey,
                rkey,
            }
        }
    }
}

fn create_srq(s: &mut Session, pd: Handle, max_wr: u32, max_sge: u32) -> (Response, Vec<OwnedFd>) {
    let Some((_, pdo)) = s.pds.get(&pd) else {
        return (no_such("PD", pd), Vec::new());
    };
    if max_wr == 0 || max_wr > MAX_DEPTH || max_sge as usize > slots::MAX_SGE {
        return (
            refuse(
                libc::EINVAL,
                format!(
                    "an SRQ of 1 ..= {MAX_DEPTH} receives of up to {} elements",
                    slots::MAX_SGE
                ),
            ),
            Vec::new(),
        );
    }
    if full(s) {
        return (refuse(libc::ENOMEM, "too many objects"), Vec::new());
    }
    let slots = (max_wr * (1 + slots::MAX_EXTRA as u32)).next_power_of_two();
    let (region, layouts) = match ring_region(&[slots], 0) {
        Ok(r) => r,
        Err(e) => return (refuse(libc::ENOMEM, e), Vec::new()),
    };
    let Ok(ring) = Consumer::new(region.clone(), layouts[0]) else {
        return (refuse(libc::ENOMEM, "ring"), Vec::new());
    };
    let real = pdo.create_srq(max_wr, max_sge);
    let h = s.handle();
    s.srqs.insert(
        h,
        ServedSrq {
            real,
            pd,
            ring,
            recvs: VecDeque::new(),
            users: 0,
        },
    );
    let fd = region.dup_fd().ok();
    (Response::Srq { handle: h, slots }, fd.into_iter().collect())
}

/// Port `port`'s MAC and address (port 1's for a port the device does not have).
fn ctx_port(ctx: &Context, port: u8) -> (ferroce_stack::wire::MacAddr, std::net::IpAddr) {
    let p = if ctx.port_mac(port).is_ok() { port } else { 1 };
    (
        ctx.port_mac(p).unwrap_or(ctx.mac()),
        ctx.query_gid_on(p, 0)
            .map_or(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), |g| {
                g.ip()
            }),
    )
}

/// A region holding rings of `slots` entries each, one after another, then `extra` bytes.
fn ring_region(slots: &[u32], extra: usize) -> Result<(Arc<Region>, Vec<RingLayout>), String> {
    let mut layouts = Vec::new();
    let mut at = 0usize;
    for &cap in slots {
        layouts.push(RingLayout { offset: at, cap });
        at += RingLayout::bytes::<W>(cap).next_multiple_of(64);
    }
    let region = Region::new(c"ferroce-ring", at + extra).map_err(|e| e.to_string())?;
    Ok((Arc::new(region), layouts))
}

#[allow(clippy::too_many_arguments)]
fn create_qp(
    shared: &Shared,
    s: &mut Session,
    pd: Handle,
    send_cq: Handle,
    recv_cq: Handle,
    qp_type: proto::WireQpType,
    caps: WireCaps,
    srq: Option<Handle>,
) -> (Response, Vec<OwnedFd>) {
    let Some(&(dev, ref pdo)) = s.pds.get(&pd) else {
        return (no_such("PD", pd), Vec::new());
    };
    let dev = &dev;
    let (Some(scq), Some(rcq)) = (s.cqs.get(&send_cq), s.cqs.get(&recv_cq)) else {
        return (refuse(libc::EINVAL, "no such CQ"), Vec::new());
    };
    if scq.device != *dev || rcq.device != *dev {
        return (
            refuse(libc::EINVAL, "the CQs belong to another device"),
            Vec::new(),
        );
    }
    if full(s) {
        return (refuse(libc::ENOMEM, "too many objects"), Vec::new());
    }
    let bad = caps.max_send_wr > MAX_DEPTH
        || caps.max_recv_wr > MAX_DEPTH
        || caps.max_send_sge as usize > slots::MAX_SGE
        || caps.max_recv_sge as usize > slots::MAX_SGE
        || caps.max_inline_data as usize > slots::MAX_INLINE;
    if bad {
        return (
            refuse(
                libc::EINVAL,
                format!(
                    "caps past the service's limits: {MAX_DEPTH} WRs, {} SGEs, {} inline bytes",
                    slots::MAX_SGE,
                    slots::MAX_INLINE
                ),
            ),
            Vec::new(),
        );
    }
    let caps = QpCaps::from(caps);
    // Each WR takes up to 1 + MAX_EXTRA slots.
    let per = 1 + slots::MAX_EXTRA as u32;
    let sq_slots = (caps.max_send_wr.max(1) * per).next_power_of_two();
    let rq_slots = (caps.max_recv_wr.max(1) * per).next_power_of_two();
    let (region, layouts) = match ring_region(&[sq_slots, rq_slots], 64) {
        Ok(r) => r,
        Err(e) => return (refuse(libc::ENOMEM, e), Vec::new()),
    };
    let (Ok(sq), Ok(rq)) = (
        Consumer::new(region.clone(), layouts[0]),
        Consumer::new(region.clone(), layouts[1]),
    ) else {
        return (refuse(libc::ENOMEM, "ring"), Vec::new());
    };
    let srq_obj = match srq.map(|h| s.srqs.get(&h).filter(|q| q.pd == pd)) {
        Some(None) => return (refuse(libc::EINVAL, "no such SRQ in this PD"), Vec::new()),
        Some(Some(q)) => Some(&q.real),
        None => None,
    };
    let made = match (qp_type, srq_obj) {
        (proto::WireQpType::Raw, _) if s.uid != 0 => {
            let why = "a raw packet QP sends frames as the program wrote them: only a program \
                       running as root may make one (the kernel asks CAP_NET_RAW)";
            return (refuse(libc::EPERM, why), Vec::new());
        }
        (proto::WireQpType::Raw, Some(_)) => {
            return (
                refuse(libc::EINVAL, "a raw packet QP has no SRQ"),
                Vec::new(),
            )
        }
        (proto::WireQpType::Raw, None) => {
            pdo.create_raw_qp(caps, &scq.real, &rcq.real).map(Real::Raw)
        }
        (_, Some(q)) => pdo
            .create_qp_with_srq(qp_type.into(), caps, &scq.real, &rcq.real, q)
            .map(Real::Rdma),
        (_, None) => pdo
            .create_qp(qp_type.into(), caps, &scq.real, &rcq.real)
            .map(Real::Rdma),
    };
    let real = match made {
        Ok(q) => q,
        Err(e) => return (refuse(libc::EINVAL, e.to_string()), Vec::new()),
    };
    let qpn = real.qpn().value();
    lock(&shared.routes)
        .qps
        .insert(qpn, Arc::downgrade(&s.events));
    let h = s.handle();
    s.qps.insert(
        h,
        ServedQp {
            real,
            pd,
            sq,
            rq,
            sends: VecDeque::new(),
            recvs: VecDeque::new(),
            send_cq,
            recv_cq,
            srq,
            port: (ctx_port(&shared.devices[*dev], 1)),
        },
    );
    s.retired.insert(
        qpn,
        Retired {
            region: region.clone(),
            at: proto::qp_words(sq_slots, rq_slots),
            count: 0,
        },
    );
    for c in [send_cq, recv_cq] {
        if let Some(c) = s.cqs.get_mut(&c) {
            c.users += 1;
        }
    }
    if let Some(r) = srq.and_then(|h| s.srqs.get_mut(&h)) {
        r.users += 1;
    }
    let fd = region.dup_fd().ok();
    (
        Response::Qp {
            handle: h,
            qpn,
            caps: caps.into(),
            sq_slots,
            rq_slots,
        },
        fd.into_iter().collect(),
    )
}

/// The forwarder: moves requests from the programs' rings to their QPs and completions from
/// their CQs to the programs' rings. It runs on the first device's engine thread, each turn
/// after the engine's, so a service adds no thread to the data path: the engine thread that
/// sends a request is the one that took it from the ring. When the engine thread sleeps, it
/// also sleeps on the service's doorbell, which a program rings after posting to a sleeping
/// service, and which every served CQ's channel rings when a completion comes.
struct Forwarder {
    shared: std::sync::Weak<Shared>,
    doorbell: Arc<Doorbell>,
}

impl Forwarder {
    fn sessions(&self) -> Option<(Arc<Shared>, Sessions)> {
        let shared = self.shared.upgrade()?;
        let sessions = lock(&shared.sessions).clone();
        Some((shared, sessions))
    }
}

impl crate::slot::Poller for Forwarder {
    fn poll(&self) -> usize {
        let Some((shared, sessions)) = self.sessions() else {
            return 0;
        };
        let mut moved = 0;
        for s in &sessions {
            let Ok(mut s) = s.try_lock() else {
                moved += 1; // the control thread has it: come back soon
                continue;
            };
            if s.broken {
                continue;
            }
            match turn(&shared, &mut s) {
                Ok(n) => moved += n,
                Err(why) => {
                    tracing::warn!(
                        pid = s.pid,
                        why,
                        "program broke its rings; dropping its objects"
                    );
                    shared
                        .counters
                        .sessions_dropped
                        .fetch_add(1, Ordering::Relaxed);
                    s.broken = true;
                    forget_qps(&shared, &s);
                    s.clear();
                }
            }
        }
        moved
    }

    /// Says "asleep" in every program's page, arms the CQs, then looks once more: a program
    /// that pushed before it saw the flag is caught here; one that pushes after rings.
    fn prepare_sleep(&self) -> bool {
        let Some((shared, sessions)) = self.sessions() else {
            return false;
        };
        for s in &sessions {
            let s = lock(s);
            s.page.store_word(SLEEPING, 1, Ordering::Relaxed);
            for c in s.cqs.values() {
                c.real.req_notify(false);
            }
        }
        fence(Ordering::SeqCst);
        let pending = sessions.iter().any(|s| {
            let s = lock(s);
            s.qps
                .values()
                .any(|q| !q.sq.is_empty().unwrap_or(true) || !q.rq.is_empty().unwrap_or(true))
                || s.srqs.values().any(|q| !q.ring.is_empty().unwrap_or(true))
                || s.cqs
                    .values()
                    .any(|c| !c.real.is_empty() || !c.held.is_empty())
        });
        if !pending {
            shared.counters.sleeps.fetch_add(1, Ordering::Relaxed);
        }
        pending
    }

    fn woke(&self) {
        self.doorbell.drain();
        let Some((shared, sessions)) = self.sessions() else {
            return;
        };
        for ch in &shared.channels {
            while ch.get_event(Duration::ZERO).is_some() {}
        }
        for s in &sessions {
            lock(s).page.store_word(SLEEPING, 0, Ordering::Relaxed);
        }
    }

    fn fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd as _;
        self.doorbell.as_fd().as_raw_fd()
    }
}

/// One pass over a program's QPs and CQs: what moved, or why its rings are broken.
fn turn(shared: &Shared, s: &mut Session) -> Result<usize, &'static str> {
    let mut moved = 0;
    let Session {
        qps,
        cqs,
        srqs,
        retired,
        ..
    } = s;
    for q in qps.values_mut() {
        // Take what the program posted.
        while q.sends.len() < BURST {
            let Some(h) = q.sq.pop().map_err(|_| "send ring index")? else {
                break;
            };
            let extra = take_extra(&mut q.sq, &h)?;
            match slots::decode_send(&h, &extra) {
                Ok(mut wr) => {
                    // A datagram leaves from the QP's port: its source is the port's,
                    // whatever the program wrote.
                    if let Some(mut ud) = wr.ud() {
                        ud.av.smac = q.port.0;
                        ud.av.src = q.port.1;
                        wr.set_ud(ud);
                    }
                    q.sends.push_back(wr);
                }
                Err(_) => fail_send(cqs, q.send_cq, h[1], q.real.qpn(), WcStatus::LocQpOpErr),
            }
            moved += 1;
        }
        let (real, send_cq) = (&q.real, q.send_cq);
        drain_posts(
            &mut q.sends,
            &shared.counters.wrs_forwarded,
            |sends| {
                let wrs: SmallVec<[_; BURST]> = sends.iter().map(|w| w.as_wr()).collect();
                real.post_send(&wrs)
            },
            // Refused: the program learns it from a completion (a post through a service
            // cannot return the error; docs/service.md).
            |w| fail_send(cqs, send_cq, w.wr_id(), real.qpn(), WcStatus::LocQpOpErr),
        );
        while q.recvs.len() < BURST {
            let Some(h) = q.rq.pop().map_err(|_| "receive ring index")? else {
                break;
            };
            let extra = take_extra(&mut q.rq, &h)?;
            match slots::decode_recv(&h, &extra) {
                Ok(r) => q.recvs.push_back(r),
                Err(_) => fail_recv(cqs, q.recv_cq, h[1], q.real.qpn()),
            }
            moved += 1;
        }
        let (real, recv_cq) = (&q.real, q.recv_cq);
        drain_posts(
            &mut q.recvs,
            &shared.counters.wrs_forwarded,
            |recvs| {
                let wrs: SmallVec<[_; BURST]> = recvs
                    .iter()
                    .map(|(id, sg)| ferroce_stack::transport::RecvWr {
                        wr_id: *id,
                        sg_list: sg,
                    })
                    .collect();
                real.post_recv(&wrs)
            },
            |(id, _)| fail_recv(cqs, recv_cq, id, real.qpn()),
        );
    }
    for q in srqs.values_mut() {
        while q.recvs.len() < BURST {
            let Some(h) = q.ring.pop().map_err(|_| "SRQ ring index")? else {
                break;
            };
            let extra = take_extra(&mut q.ring, &h)?;
            // A receive that does not decode is dropped: an SRQ has no CQ of its own to
            // say so.
            if let Ok(r) = slots::decode_recv(&h, &extra) {
                q.recvs.push_back(r);
            }
            moved += 1;
        }
        while let Some((id, sg)) = q.recvs.front() {
            let wr = ferroce_stack::transport::RecvWr {
                wr_id: *id,
                sg_list: sg,
            };
            match q.real.post_recv(&[wr]) {
                Err(f) if matches!(f.error, ferroce_stack::transport::PostError::QueueFull(_)) => {
                    break
                }
                _ => {
                    q.recvs.pop_front();
                    shared
                        .counters
                        .wrs_forwarded
                        .fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
    // Completions go to the rings, and fire their channels, in the order the engine made
    // them across the program's CQs: a program that waits on one channel for a send CQ and
    // a receive CQ (perftest's latency tests with events) takes the first event for the
    // first completion. First take what each ring has room for...
    for c in cqs.values_mut() {
        let free = c.ring.free().map_err(|_| "completion ring index")? as usize;
        let mut room = free.saturating_sub(c.held.len()).min(BURST);
        while room > 0 {
            let Some(wc) = c.real.take_stamped() else {
                break;
            };
            c.held.push_back(wc);
            room -= 1;
        }
    }
    // ...then hand them on oldest first.
    loop {
        let next = cqs
            .iter()
            .filter_map(|(h, c)| c.held.front().map(|(_, stamp)| (*stamp, *h)))
            .min();
        let Some((_, h)) = next else { break };
        let c = cqs.get_mut(&h).expect("just found");
        let Some((wc, _)) = c.held.front() else { break };
        if c.ring.free().map_err(|_| "completion ring index")? == 0 {
            // This ring is full: the program has not polled. The others wait with it, so
            // the order holds; the program's next poll makes room.
            break;
        }
        if matches!(
            wc.opcode,
            ferroce_stack::transport::WcOpcode::Recv
                | ferroce_stack::transport::WcOpcode::RecvRdmaWithImm
        ) {
            // The receive's slot in the QP's queue is free again: say so to the program,
            // before the completion shows (the push below releases this store with it), so
            // a program that reposts as soon as it polls finds the room there.
            if let Some(r) = retired.get_mut(&wc.qp_num.value()) {
                r.count += 1;
                r.region.store_word(r.at, r.count, Ordering::Release);
            }
        }
        if !c
            .ring
            .push(&slots::encode_wc(wc))
            .map_err(|_| "completion ring index")?
        {
            return Err("completion ring full after it had room");
        }
        let solicited = wc.solicited || wc.status != WcStatus::Success;
        c.held.pop_front();
        moved += 1;
        shared
            .counters
            .wcs_forwarded
            .fetch_add(1, Ordering::Relaxed);
        notify(c, solicited);
    }
    Ok(moved)
}

/// Fires a CQ's channel if the program armed it for this completion: disarms it, counts the
/// event in the CQ's words, then makes the channel's eventfd readable (the program reads the
/// count first, so an event it sees is always counted).
fn notify(c: &ServedCq, solicited: bool) {
    let Some(ch) = &c.channel else { return };
    let (armed, fired) = c.words;
    // Pairs with the fence after the program arms: either this load sees the arming, or
    // the program's next poll sees the completion just pushed (a Dekker pair: without both
    // fences each side could read the other's old value and the event would be lost).
    fence(Ordering::SeqCst);
    let want = match c.region.load_word(armed, Ordering::Acquire) {
        Some(1) => true,
        Some(2) => solicited,
        _ => false,
    };
    if want && c.region.swap_word(armed, 0).is_some_and(|a| a != 0) {
        c.region.add_word(fired, 1);
        ch.ring();
    }
}

/// Posts what waits in `queue` (a list at a time, with `post`) until it is empty or the
/// queue it goes into is full; a request refused for another reason goes to `refused`.
fn drain_posts<T>(
    queue: &mut VecDeque<T>,
    forwarded: &AtomicU64,
    mut post: impl FnMut(&VecDeque<T>) -> Result<(), crate::PostFailure>,
    mut refused: impl FnMut(T),
) {
    while !queue.is_empty() {
        match post(queue) {
            Ok(()) => {
                forwarded.fetch_add(queue.len() as u64, Ordering::Relaxed);
                queue.clear();
            }
            Err(f) => {
                forwarded.fetch_add(f.index as u64, Ordering::Relaxed);
                queue.drain(..f.index.min(queue.len()));
                if matches!(f.error, ferroce_stack::transport::PostError::QueueFull(_)) {
                    break;
                }
                if let Some(x) = queue.pop_front() {
                    refused(x);
                }
            }
        }
    }
}

fn take_extra(ring: &mut Consumer<W>, h: &Slot) -> Result<SmallVec<[Slot; 4]>, &'static str> {
    let n = slots::extra_slots(h).map_err(|_| "a request claims too many slots")?;
    let mut extra = SmallVec::new();
    for _ in 0..n {
        match ring.pop().map_err(|_| "ring index")? {
            Some(x) => extra.push(x),
            None => return Err("a request's slots were not published with it"),
        }
    }
    Ok(extra)
}

fn fail_send(cqs: &mut HashMap<Handle, ServedCq>, cq: Handle, wr_id: u64, qpn: Qpn, st: WcStatus) {
    if let Some(c) = cqs.get_mut(&cq) {
        let mut wc =
            WorkCompletion::of_request(wr_id, st, ferroce_stack::transport::WcOpcode::Send, 0);
        wc.qp_num = qpn;
        // A refusal is the program's own doing, just now: ahead of what the engine made.
        c.held.push_back((wc, 0));
    }
}

fn fail_recv(cqs: &mut HashMap<Handle, ServedCq>, cq: Handle, wr_id: u64, qpn: Qpn) {
    if let Some(c) = cqs.get_mut(&cq) {
        let mut wc = WorkCompletion::of_request(
            wr_id,
            WcStatus::LocQpOpErr,
            ferroce_stack::transport::WcOpcode::Recv,
            0,
        );
        wc.qp_num = qpn;
        // A refusal is the program's own doing, just now: ahead of what the engine made.
        c.held.push_back((wc, 0));
    }
}
