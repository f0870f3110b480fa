//! A program's side of `ferroce serve`: the verbs objects as handles on the service's, with
//! the data path in shared memory. Posting writes the request into the QP's ring and rings
//! the service's doorbell only when the service sleeps; polling reads the CQ's ring. No
//! engine, no port and no DPDK live in the program.

use std::collections::HashMap;
use std::os::fd::AsFd;
use std::path::Path;
use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use ferroce_drivers::shm::{self, Consumer, Producer, Region, RingLayout};
use ferroce_stack::transport::{
    Access, AttrMask, PostError, QpAttr, QpCaps, QpState, QpType, RecvWr, SendWr, WorkCompletion,
};
use ferroce_stack::wire::Qpn;

use super::proto::{
    self, DeviceFacts, Handle, Request, Response, WireQpAttr, MAX_MESSAGE, PAGE, SLEEPING,
};
use super::registry::{Pages, PagesError};
use super::slots::{self, Slot, W};
use super::socket::{Channel, Doorbell};
use crate::cm::queue::CmShared;
use crate::error::PostFailure;

/// What can go wrong talking to a service.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// The socket.
    #[error("cannot reach the ferroce service: {0} (is `ferroce serve` running? FERROCE_SERVICE names its socket)")]
    Io(#[from] std::io::Error),
    /// The service is gone: every verb fails from now on (`IBV_EVENT_DEVICE_FATAL`).
    #[error("the ferroce service has gone")]
    Gone,
    /// It refused the request.
    #[error("{message} (errno {errno})")]
    Refused {
        /// errno.
        errno: i32,
        /// Its words.
        message: String,
    },
    /// It answered something this client does not understand.
    #[error("unexpected answer from the service: {0}")]
    Protocol(&'static str),
    /// Shared memory.
    #[error("{0}")]
    Shm(#[from] shm::ShmError),
    /// A ring the service set up does not fit its region.
    #[error("{0}")]
    Ring(#[from] shm::RingError),
}

impl ServiceError {
    /// The errno a C caller gets.
    pub fn errno(&self) -> i32 {
        match self {
            Self::Refused { errno, .. } => *errno,
            Self::Gone | Self::Io(_) => libc::EIO,
            _ => libc::EPROTO,
        }
    }
}

struct Inner {
    /// The process that attached. A child of fork inherits the connection but is not that
    /// program: it never speaks on the socket (the replies would go to whichever process
    /// reads first) and never shuts it down (that would end its parent's session).
    pid: u32,
    chan: Mutex<Channel>,
    doorbell: Doorbell,
    page: Region,
    devices: Vec<String>,
    gone: AtomicBool,
    /// Set when this side closes: the watcher's wakeup is then not the service's death.
    closing: AtomicBool,
    /// Called once when the service goes (the attached devices raise `DEVICE_FATAL`).
    on_gone: Mutex<Vec<Box<dyn Fn() + Send + Sync>>>,
    /// The service's asynchronous events for this program, from its control page.
    events: Mutex<Consumer<2>>,
    /// Who hears them: per device, the attached contexts' handlers.
    on_event: Mutex<Vec<(u32, EventHandler)>>,
    /// Per device, the connection manager events of this program, once it used the CM.
    cm: Mutex<HashMap<u32, Arc<CmShared>>>,
}

type EventHandler = Box<dyn Fn(crate::AsyncEvent) + Send + Sync>;

impl Inner {
    /// Hands the events waiting in the page to their devices' handlers.
    fn deliver_events(&self) {
        let mut cm_waiting = false;
        let mut ring = self.events.lock().unwrap_or_else(|e| e.into_inner());
        while let Ok(Some(w)) = ring.pop() {
            if w == proto::CM_WAITING {
                cm_waiting = true;
                continue;
            }
            let Some((device, e)) = proto::words_event(w) else {
                continue;
            };
            let handlers = self.on_event.lock().unwrap_or_else(|e| e.into_inner());
            for (d, f) in handlers.iter() {
                if *d == device {
                    f(e);
                }
            }
        }
        drop(ring);
        if cm_waiting {
            self.take_cm_events();
        }
    }

    /// Fetches the connection manager events waiting in the service and queues each for
    /// its device's manager.
    fn take_cm_events(&self) {
        loop {
            let Ok((Response::CmEvents { events, more }, _)) =
                self.call(&Request::CmTakeEvents, &[])
            else {
                return;
            };
            for (device, e) in events {
                let to = self
                    .cm
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get(&device)
                    .cloned();
                if let Some(to) = to {
                    to.post(e);
                }
            }
            if !more {
                return;
            }
        }
    }
}

impl Inner {
    /// The service has gone: every verb fails from now on, and whoever asked is told.
    fn lost(&self) {
        if self.gone.swap(true, Ordering::AcqRel) {
            return;
        }
        let calls = std::mem::take(&mut *self.on_gone.lock().unwrap_or_else(|e| e.into_inner()));
        for f in calls {
            f();
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if self.pid != std::process::id() {
            return;
        }
        self.closing.store(true, Ordering::Release);
        self.chan
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .shutdown();
    }
}

/// Waits, on its own thread, for the service's end of the socket to close: the only way a
/// program that is only polling its rings learns the service died. It waits for the hang-up
/// alone (no `POLLIN`), so it never takes a message meant for a verb.
///
/// It also waits on the program's event eventfd, which the service writes after it queues
/// an asynchronous event in the program's page, and hands those events on.
fn watch(inner: std::sync::Weak<Inner>, fd: std::os::fd::OwnedFd, events: std::os::fd::OwnedFd) {
    use rustix::event::{PollFd, PollFlags};
    loop {
        let mut fds = [
            PollFd::new(&fd, PollFlags::RDHUP),
            PollFd::new(&events, PollFlags::IN),
        ];
        match rustix::event::poll(&mut fds, None) {
            Err(rustix::io::Errno::INTR) => continue,
            Err(_) => break,
            Ok(_) => {}
        }
        if !fds[0].revents().is_empty() {
            break;
        }
        if !fds[1].revents().is_empty() {
            let mut b = [0u8; 8];
            let _ = rustix::io::read(&events, &mut b);
            match inner.upgrade() {
                Some(i) => {
                    // Its allocations stay off pages a registration is moving.
                    let _quiet = super::registry::quiet();
                    i.deliver_events();
                }
                None => return,
            }
        }
    }
    if let Some(i) = inner.upgrade() {
        if !i.closing.load(Ordering::Acquire) {
            i.lost();
        }
    }
}

impl Inner {
    /// One request, one answer; the descriptors that came with the answer.
    fn call(
        &self,
        req: &Request,
        fds: &[std::os::fd::BorrowedFd<'_>],
    ) -> Result<(Response, Vec<std::os::fd::OwnedFd>), ServiceError> {
        if self.gone.load(Ordering::Acquire) || self.pid != std::process::id() {
            return Err(ServiceError::Gone);
        }
        let chan = self.chan.lock().unwrap_or_else(|e| e.into_inner());
        let mut buf = Box::new([0u8; MAX_MESSAGE]);
        let r = chan
            .send(&proto::encode(req), fds)
            .and_then(|()| chan.recv(&mut buf));
        match r {
            Ok(Some((n, fds))) => match proto::decode::<Response>(&buf[..n]) {
                Some(Response::Error { errno, message }) => {
                    Err(ServiceError::Refused { errno, message })
                }
                Some(resp) => Ok((resp, fds)),
                None => Err(ServiceError::Protocol("undecodable")),
            },
            Ok(None) | Err(_) => {
                drop(chan);
                self.lost();
                Err(ServiceError::Gone)
            }
        }
    }

    fn ring_if_asleep(&self) {
        // Pairs with the service's store of the flag and its fence before it looks at the
        // rings a last time: either it sees our entry, or we see its flag.
        fence(Ordering::SeqCst);
        if self.page.load_word(SLEEPING, Ordering::Relaxed) == Some(1) {
            self.doorbell.ring();
        }
    }
}

/// A connection to a service.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("devices", &self.inner.devices)
            .finish_non_exhaustive()
    }
}

impl Client {
    /// Attaches to the service at `socket`.
    pub fn connect(socket: &Path) -> Result<Self, ServiceError> {
        Self::attach(Channel::connect(socket)?)
    }

    /// Attaches over a channel already connected to a service.
    pub fn attach(chan: Channel) -> Result<Self, ServiceError> {
        let hello = Request::Hello {
            version: proto::VERSION,
            pid: std::process::id(),
        };
        // The eventfd the service writes when it queues an event for us.
        let events_fd = rustix::event::eventfd(
            0,
            rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
        )
        .map_err(std::io::Error::from)?;
        chan.send(&proto::encode(&hello), &[events_fd.as_fd()])?;
        let mut buf = Box::new([0u8; MAX_MESSAGE]);
        let (n, mut fds) = chan.recv(&mut buf)?.ok_or(ServiceError::Gone)?;
        let devices = match proto::decode::<Response>(&buf[..n]) {
            Some(Response::Welcome { devices, .. }) => devices,
            Some(Response::Error { errno, message }) => {
                return Err(ServiceError::Refused { errno, message })
            }
            _ => return Err(ServiceError::Protocol("no welcome")),
        };
        if fds.len() != 2 {
            return Err(ServiceError::Protocol("welcome without doorbell and page"));
        }
        let page = Region::from_fd(fds.pop().expect("two"), PAGE)?;
        let doorbell = Doorbell::from_fd(fds.pop().expect("two"));
        let watched = chan.as_fd().try_clone_to_owned()?;
        let events = Consumer::new(
            Arc::new(Region::from_fd(page.dup_fd()?, PAGE)?),
            proto::EVENTS,
        )?;
        let inner = Arc::new(Inner {
            pid: std::process::id(),
            chan: Mutex::new(chan),
            doorbell,
            page,
            devices,
            gone: AtomicBool::new(false),
            closing: AtomicBool::new(false),
            on_gone: Mutex::new(Vec::new()),
            events: Mutex::new(events),
            on_event: Mutex::new(Vec::new()),
            cm: Mutex::new(HashMap::new()),
        });
        let weak = Arc::downgrade(&inner);
        std::thread::Builder::new()
            .name("ferroce-watch".into())
            .spawn(move || watch(weak, watched, events_fd))?;
        Ok(Self { inner })
    }

    /// The devices the service serves (index = device number).
    pub fn devices(&self) -> &[String] {
        &self.inner.devices
    }

    /// True once the service has gone (every verb fails).
    pub fn is_gone(&self) -> bool {
        self.inner.gone.load(Ordering::Acquire)
    }

    /// True in the process that attached; false in a child of fork, for which the
    /// connection is its parent's and every call fails: it attaches anew.
    pub fn is_own(&self) -> bool {
        self.inner.pid == std::process::id()
    }

    /// Calls `f`, on another thread, with each asynchronous event the service raises on
    /// device `device` for this program (its port's changes, its QPs' errors and path
    /// migrations).
    pub fn on_event(&self, device: u32, f: Box<dyn Fn(crate::AsyncEvent) + Send + Sync>) {
        self.inner
            .on_event
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((device, f));
    }

    /// Where the connection manager events of device `device` come for this program (the
    /// same queue for every caller).
    pub(crate) fn cm_events(&self, device: u32) -> Arc<CmShared> {
        self.inner
            .cm
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(device)
            .or_default()
            .clone()
    }

    /// A call on the service's connection manager for device `device`.
    pub fn cm_call(&self, device: u32, call: proto::CmCall) -> Result<Response, ServiceError> {
        Ok(self.inner.call(&Request::Cm { device, call }, &[])?.0)
    }

    /// Calls `f` once, on another thread, when the service goes (at once if it has).
    pub fn on_gone(&self, f: Box<dyn Fn() + Send + Sync>) {
        let mut calls = self.inner.on_gone.lock().unwrap_or_else(|e| e.into_inner());
        if self.is_gone() {
            drop(calls);
            f();
        } else {
            calls.push(f);
        }
    }

    /// Device `device`'s facts.
    pub fn query_device(&self, device: u32) -> Result<DeviceFacts, ServiceError> {
        match self.inner.call(&Request::QueryDevice { device }, &[])?.0 {
            Response::Device(f) => Ok(f),
            _ => Err(ServiceError::Protocol("QueryDevice")),
        }
    }

    /// `ibv_alloc_pd` on device `device`.
    pub fn alloc_pd(&self, device: u32) -> Result<RemotePd, ServiceError> {
        match self.inner.call(&Request::AllocPd { device }, &[])?.0 {
            Response::Created { handle } => Ok(RemotePd {
                inner: self.inner.clone(),
                handle,
            }),
            _ => Err(ServiceError::Protocol("AllocPd")),
        }
    }

    /// `ibv_create_cq` on device `device` with room for `cqe` completions, reporting to
    /// `channel` (as CQ `id` there) when armed.
    pub fn create_cq(
        &self,
        device: u32,
        cqe: u32,
        channel: Option<(&RemoteChannel, u32)>,
    ) -> Result<RemoteCq, ServiceError> {
        let req = Request::CreateCq {
            device,
            cqe,
            channel: channel.is_some(),
        };
        let fds: Vec<_> = channel.iter().map(|(c, _)| c.fd.as_fd()).collect();
        let (resp, mut fds) = self.inner.call(&req, &fds)?;
        let Response::Cq { handle, slots } = resp else {
            return Err(ServiceError::Protocol("CreateCq"));
        };
        let fd = fds
            .pop()
            .ok_or(ServiceError::Protocol("CQ without its ring"))?;
        let region = Arc::new(Region::from_fd(fd, proto::cq_region(slots))?);
        let ring = Consumer::new(
            region.clone(),
            RingLayout {
                offset: 0,
                cap: slots,
            },
        )?;
        let (armed, fired) = proto::cq_words(slots);
        if let Some((ch, id)) = channel {
            ch.cqs
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(Arc::new(CqEvents {
                    id,
                    region: region.clone(),
                    fired,
                    seen: AtomicU64::new(0),
                }));
        }
        Ok(RemoteCq {
            inner: self.inner.clone(),
            handle,
            ring: Mutex::new(ring),
            region,
            armed,
            channel: channel.map(|(c, id)| (Arc::downgrade(&c.cqs), id)),
        })
    }
}

/// A CQ's events as its channel counts them.
struct CqEvents {
    id: u32,
    region: Arc<Region>,
    /// Where the service counts the events it fired.
    fired: usize,
    /// Events taken so far.
    seen: AtomicU64,
}

type ChannelCqs = Mutex<Vec<Arc<CqEvents>>>;

/// A completion channel of a context attached to a service: an eventfd in semaphore mode,
/// which the service writes once per event of the channel's CQs, as the kernel's channel fd
/// is readable once per event.
pub struct RemoteChannel {
    fd: std::os::fd::OwnedFd,
    cqs: Arc<ChannelCqs>,
}

impl std::fmt::Debug for RemoteChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteChannel")
            .field("fd", &self.fd)
            .finish_non_exhaustive()
    }
}

impl RemoteChannel {
    /// A new channel.
    pub fn new() -> std::io::Result<Self> {
        use rustix::event::EventfdFlags;
        Ok(Self {
            fd: rustix::event::eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::SEMAPHORE)?,
            cqs: Arc::default(),
        })
    }

    /// Its descriptor: readable once per event (what `ibv_comp_channel.fd` is).
    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Wakes whoever waits on the channel (the service went: its read then finds no CQ).
    pub fn wake(&self) {
        let _ = rustix::io::write(&self.fd, &1u64.to_ne_bytes());
    }

    /// The CQ of an event whose count the caller has read from the descriptor.
    pub fn take_event(&self) -> Option<u32> {
        let cqs = self.cqs.lock().unwrap_or_else(|e| e.into_inner());
        cqs.iter().find_map(|c| {
            let fired = c.region.load_word(c.fired, Ordering::Acquire)?;
            c.seen
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |s| {
                    (s < fired).then_some(s + 1)
                })
                .ok()
                .map(|_| c.id)
        })
    }

    /// Waits up to `timeout` for an event: reads its count and names its CQ.
    pub fn wait_event(&self, timeout: std::time::Duration) -> Option<u32> {
        if !super::socket::readable(self.fd.as_fd(), timeout) {
            return None;
        }
        let mut b = [0u8; 8];
        rustix::io::read(&self.fd, &mut b).ok()?;
        self.take_event()
    }
}

/// A device of a service, as a verbs [`Context`](crate::Context) attached to it holds it.
#[derive(Clone, Debug)]
pub struct RemoteDevice {
    /// The connection.
    pub client: Client,
    /// Its number in the service's list.
    pub device: u32,
    /// Its facts when attached.
    pub facts: DeviceFacts,
}

fn destroy(inner: &Inner, req: Request) {
    let _ = inner.call(&req, &[]);
}

/// A protection domain in the service.
pub struct RemotePd {
    inner: Arc<Inner>,
    handle: Handle,
}

impl std::fmt::Debug for RemotePd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemotePd")
            .field("handle", &self.handle)
            .finish_non_exhaustive()
    }
}

impl Drop for RemotePd {
    fn drop(&mut self) {
        destroy(&self.inner, Request::DeallocPd { pd: self.handle });
    }
}

impl RemotePd {
    /// `ibv_reg_mr`: the pages of `addr .. addr + len` move onto shared memory at the same
    /// addresses (`shm::adopt`), which the service maps: its engine reads and writes this
    /// buffer with no copy. Deregistering (drop) moves them back to private memory.
    ///
    /// # Safety
    /// As `ibv_reg_mr`: the buffer stays allocated while registered. Also, as
    /// [`shm::adopt`] requires: no other thread touches those pages during this call (a
    /// store between the copy and the remap would be lost).
    pub unsafe fn reg_mr(
        &self,
        addr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<RemoteMr, ServiceError> {
        // SAFETY: the caller's promise, passed on.
        unsafe { self.reg_mr_iova(addr, len, addr as u64, access) }
    }

    /// `ibv_reg_mr_iova2`: as [`reg_mr`](Self::reg_mr), addressed as `iova`.
    ///
    /// # Safety
    /// As [`reg_mr`](Self::reg_mr).
    pub unsafe fn reg_mr_iova(
        &self,
        addr: *mut u8,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Result<RemoteMr, ServiceError> {
        // SAFETY: the caller's promise, passed on.
        let pages = unsafe { Pages::share(addr as usize, len) }.map_err(|e| match e {
            PagesError::Shm(e) => ServiceError::Shm(e),
            e @ PagesError::TooManyPieces => ServiceError::Refused {
                errno: libc::ENOMEM,
                message: e.to_string(),
            },
        })?;
        let r = pages.with_pieces(|pieces| {
            let req = Request::RegMr {
                pd: self.handle,
                addr: addr as u64,
                iova,
                len: len as u64,
                offset: pages.offset,
                pieces: pieces.iter().map(|&(_, o, l)| (o, l)).collect(),
                access: access.0,
            };
            let fds: Vec<_> = pieces.iter().map(|&(fd, _, _)| fd).collect();
            self.inner.call(&req, &fds)
        });
        match r {
            Ok((Response::Mr { handle, lkey, rkey }, _)) => Ok(RemoteMr {
                inner: self.inner.clone(),
                handle,
                lkey,
                rkey,
                addr: iova,
                len,
                pages: Some(pages),
            }),
            other => {
                // SAFETY: the pages we just shared, given back; the caller's promise holds.
                unsafe { pages.unshare() };
                Err(match other {
                    Err(e) => e,
                    Ok(_) => ServiceError::Protocol("RegMr"),
                })
            }
        }
    }

    /// `ibv_create_srq`.
    pub fn create_srq(&self, max_wr: u32, max_sge: u32) -> Result<RemoteSrq, ServiceError> {
        let req = Request::CreateSrq {
            pd: self.handle,
            max_wr,
            max_sge,
        };
        let (resp, mut fds) = self.inner.call(&req, &[])?;
        let Response::Srq { handle, slots } = resp else {
            return Err(ServiceError::Protocol("CreateSrq"));
        };
        let fd = fds
            .pop()
            .ok_or(ServiceError::Protocol("SRQ without its ring"))?;
        let region = Arc::new(Region::from_fd(fd, RingLayout::bytes::<W>(slots))?);
        let ring = Producer::new(
            region,
            RingLayout {
                offset: 0,
                cap: slots,
            },
        )?;
        Ok(RemoteSrq {
            inner: self.inner.clone(),
            handle,
            max_wr,
            ring: Mutex::new((ring, Vec::new())),
        })
    }

    /// `ibv_create_qp` (taking receives from `srq` if given).
    pub fn create_qp(
        &self,
        qp_type: QpType,
        caps: QpCaps,
        send_cq: &RemoteCq,
        recv_cq: &RemoteCq,
        srq: Option<&RemoteSrq>,
    ) -> Result<RemoteQp, ServiceError> {
        self.create_qp_of(qp_type.into(), caps, send_cq, recv_cq, srq, 0)
    }

    /// `ibv_create_qp` with `IBV_QPT_RAW_PACKET` (the service allows it a program running
    /// as root only): frames of up to `max_frame` bytes in, frames out, through the same
    /// rings.
    pub fn create_raw_qp(
        &self,
        caps: QpCaps,
        send_cq: &RemoteCq,
        recv_cq: &RemoteCq,
        max_frame: usize,
    ) -> Result<RemoteQp, ServiceError> {
        self.create_qp_of(
            proto::WireQpType::Raw,
            caps,
            send_cq,
            recv_cq,
            None,
            max_frame,
        )
    }

    fn create_qp_of(
        &self,
        wire_type: proto::WireQpType,
        caps: QpCaps,
        send_cq: &RemoteCq,
        recv_cq: &RemoteCq,
        srq: Option<&RemoteSrq>,
        max_frame: usize,
    ) -> Result<RemoteQp, ServiceError> {
        let req = Request::CreateQp {
            pd: self.handle,
            send_cq: send_cq.handle,
            recv_cq: recv_cq.handle,
            qp_type: wire_type,
            caps: caps.into(),
            srq: srq.map(|q| q.handle),
        };
        let (resp, mut fds) = self.inner.call(&req, &[])?;
        let Response::Qp {
            handle,
            qpn,
            caps,
            sq_slots,
            rq_slots,
        } = resp
        else {
            return Err(ServiceError::Protocol("CreateQp"));
        };
        let fd = fds
            .pop()
            .ok_or(ServiceError::Protocol("QP without its rings"))?;
        let sq_bytes = RingLayout::bytes::<W>(sq_slots).next_multiple_of(64);
        let need = proto::qp_region(sq_slots, rq_slots);
        let region = Arc::new(Region::from_fd(fd, need)?);
        let words = (region.clone(), proto::qp_words(sq_slots, rq_slots));
        let sq = Producer::new(
            region.clone(),
            RingLayout {
                offset: 0,
                cap: sq_slots,
            },
        )?;
        let rq = Producer::new(
            region,
            RingLayout {
                offset: sq_bytes,
                cap: rq_slots,
            },
        )?;
        Ok(RemoteQp {
            inner: self.inner.clone(),
            handle,
            qpn: Qpn::new(qpn),
            qp_type: wire_type.into(),
            raw: wire_type == proto::WireQpType::Raw,
            max_frame,
            port: std::sync::atomic::AtomicU8::new(1),
            caps: caps.into(),
            srq: srq.is_some(),
            state: std::sync::atomic::AtomicU8::new(0),
            words,
            recvs_posted: AtomicU64::new(0),
            sq: Mutex::new((sq, Vec::new())),
            rq: Mutex::new((rq, Vec::new())),
        })
    }
}

/// A registered memory region; dropping it deregisters and gives the pages back to private
/// memory.
pub struct RemoteMr {
    inner: Arc<Inner>,
    handle: Handle,
    lkey: u32,
    rkey: u32,
    addr: u64,
    len: usize,
    pages: Option<Pages>,
}

impl RemoteMr {
    /// Local key.
    pub fn lkey(&self) -> u32 {
        self.lkey
    }
    /// Remote key.
    pub fn rkey(&self) -> u32 {
        self.rkey
    }
    /// Start (iova = the buffer's address).
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
    /// A gather element for `len` bytes at `offset`.
    pub fn sge(&self, offset: usize, len: usize) -> ferroce_stack::transport::Sge {
        ferroce_stack::transport::Sge {
            addr: self.addr + offset as u64,
            length: len as u32,
            lkey: self.lkey,
        }
    }
}

impl std::fmt::Debug for RemoteMr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteMr")
            .field("handle", &self.handle)
            .finish_non_exhaustive()
    }
}

impl Drop for RemoteMr {
    fn drop(&mut self) {
        destroy(&self.inner, Request::DeregMr { mr: self.handle });
        if let Some(p) = self.pages.take() {
            // SAFETY: the registration's pages, given back (those no other registration
            // uses move back to private memory); ibv_dereg_mr's caller does not use the
            // buffer during the call.
            unsafe { p.unshare() };
        }
    }
}

/// A completion queue: its completions arrive in a ring in shared memory.
pub struct RemoteCq {
    inner: Arc<Inner>,
    handle: Handle,
    ring: Mutex<Consumer<W>>,
    region: Arc<Region>,
    /// Where it is armed (see [`proto::cq_words`]).
    armed: usize,
    /// Its channel's list of CQs, and its id there.
    channel: Option<(std::sync::Weak<ChannelCqs>, u32)>,
}

impl RemoteCq {
    /// True once the service has gone: no completion will come.
    pub fn is_gone(&self) -> bool {
        self.inner.gone.load(Ordering::Acquire)
    }

    /// `ibv_req_notify_cq`: the next completion (or the next solicited one) fires the
    /// channel. A store in shared memory, no system call.
    pub fn req_notify(&self, solicited_only: bool) {
        self.region.store_word(
            self.armed,
            if solicited_only { 2 } else { 1 },
            Ordering::Release,
        );
        // Pairs with the service's fence between pushing a completion and reading this
        // word: either it sees the arming, or the program's next poll sees the completion
        // (a Dekker pair: without both fences each side could read the other's old value,
        // and the event would be lost).
        fence(Ordering::SeqCst);
    }

    /// `ibv_poll_cq`: up to `max` completions appended to `out`. No system call.
    pub fn poll(&self, out: &mut Vec<WorkCompletion>, max: usize) -> usize {
        let mut ring = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        let mut n = 0;
        while n < max {
            match ring.pop() {
                Ok(Some(s)) => {
                    out.push(slots::decode_wc(&s));
                    n += 1;
                }
                _ => break,
            }
        }
        n
    }
}

impl RemoteCq {
    /// Completions waiting in its ring.
    pub fn len(&self) -> usize {
        let ring = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        ring.len().unwrap_or(0) as usize
    }

    /// True when none waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl std::fmt::Debug for RemoteCq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteCq")
            .field("handle", &self.handle)
            .finish_non_exhaustive()
    }
}

impl Drop for RemoteCq {
    fn drop(&mut self) {
        if let Some((cqs, id)) = &self.channel {
            if let Some(cqs) = cqs.upgrade() {
                cqs.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .retain(|c| c.id != *id);
            }
        }
        destroy(&self.inner, Request::DestroyCq { cq: self.handle });
    }
}

type RingAndScratch = (Producer<W>, Vec<Slot>);

/// A shared receive queue: posting writes its ring.
pub struct RemoteSrq {
    inner: Arc<Inner>,
    handle: Handle,
    max_wr: u32,
    ring: Mutex<RingAndScratch>,
}

impl std::fmt::Debug for RemoteSrq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteSrq")
            .field("handle", &self.handle)
            .finish_non_exhaustive()
    }
}

impl RemoteSrq {
    /// `ibv_post_srq_recv`.
    pub fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<(), PostFailure> {
        post_recvs(&self.inner, &self.ring, wrs, self.max_wr)
    }

    /// `ibv_query_srq`: size, elements per receive, armed limit.
    pub fn query(&self) -> Result<(u32, u32, u32), ServiceError> {
        match self
            .inner
            .call(&Request::QuerySrq { srq: self.handle }, &[])?
            .0
        {
            Response::SrqAttr(a, b, c) => Ok((a, b, c)),
            _ => Err(ServiceError::Protocol("QuerySrq")),
        }
    }

    /// `ibv_modify_srq`: `Ok(Err(..))` when the SRQ refuses the values.
    pub fn modify(
        &self,
        max_wr: Option<u32>,
        limit: Option<u32>,
    ) -> Result<Result<(), ferroce_stack::transport::SrqModifyError>, ServiceError> {
        use ferroce_stack::transport::SrqModifyError as E;
        let req = Request::ModifySrq {
            srq: self.handle,
            max_wr,
            limit,
        };
        match self.inner.call(&req, &[])?.0 {
            Response::Ok => Ok(Ok(())),
            Response::SrqRefused {
                limit_too_high: true,
                asked,
                bound,
            } => Ok(Err(E::LimitTooHigh {
                limit: asked,
                max_wr: bound as u32,
            })),
            Response::SrqRefused { asked, bound, .. } => Ok(Err(E::TooSmall {
                max_wr: asked,
                queued: bound as usize,
            })),
            _ => Err(ServiceError::Protocol("ModifySrq")),
        }
    }
}

impl Drop for RemoteSrq {
    fn drop(&mut self) {
        destroy(&self.inner, Request::DestroySrq { srq: self.handle });
    }
}

/// A queue pair: posting writes its rings.
pub struct RemoteQp {
    inner: Arc<Inner>,
    handle: Handle,
    qpn: Qpn,
    qp_type: QpType,
    /// A raw packet QP (its `qp_type` is UD's).
    raw: bool,
    /// A raw QP's longest frame.
    max_frame: usize,
    /// Its port (from 1) as this program last set it.
    port: std::sync::atomic::AtomicU8,
    caps: QpCaps,
    /// It takes receives from a shared receive queue.
    srq: bool,
    /// Its state as this program last set or read it (an index into [`QpState::ALL`]):
    /// posts are checked against it as the QP would check them, so what the QP would refuse
    /// fails at post time here too. The service may have moved it to ERR since (a
    /// transport error), which posting accepts anyway.
    state: std::sync::atomic::AtomicU8,
    /// Its region, and where the service counts the receives it retired in it.
    words: (Arc<Region>, usize),
    /// Receives posted: with those retired, how many are outstanding.
    recvs_posted: AtomicU64,
    sq: Mutex<RingAndScratch>,
    rq: Mutex<RingAndScratch>,
}

impl RemoteQp {
    /// Its number.
    pub fn qpn(&self) -> Qpn {
        self.qpn
    }
    /// Its type.
    pub fn qp_type(&self) -> QpType {
        self.qp_type
    }
    /// The capacities granted.
    pub fn caps(&self) -> QpCaps {
        self.caps
    }

    /// `ibv_modify_qp`.
    pub fn modify(&self, attr: &QpAttr, mask: AttrMask) -> Result<(), ServiceError> {
        let req = Request::ModifyQp {
            qp: self.handle,
            attr: WireQpAttr::from(*attr),
            mask: mask.0,
        };
        self.inner.call(&req, &[])?;
        if mask.contains(AttrMask::STATE) {
            self.set_state(attr.qp_state);
        }
        if mask.contains(AttrMask::PORT) {
            self.port.store(attr.port_num, Ordering::Relaxed);
        }
        Ok(())
    }

    /// True for a raw packet QP.
    pub fn is_raw(&self) -> bool {
        self.raw
    }

    /// Its port (from 1), as this program last set it.
    pub fn port_num(&self) -> u8 {
        self.port.load(Ordering::Relaxed)
    }

    /// `ibv_create_flow` on a raw packet QP: frames on its port that match `rule` come to it.
    pub fn create_flow(
        &self,
        rule: crate::engine::raw::FlowRule,
    ) -> Result<RemoteFlow, ServiceError> {
        let req = Request::CreateFlow {
            qp: self.handle,
            rule,
        };
        match self.inner.call(&req, &[])?.0 {
            Response::Created { handle } => Ok(RemoteFlow {
                inner: self.inner.clone(),
                handle,
            }),
            _ => Err(ServiceError::Protocol("CreateFlow")),
        }
    }

    /// `ibv_query_qp`.
    pub fn query(&self) -> Result<QpAttr, ServiceError> {
        match self
            .inner
            .call(&Request::QueryQp { qp: self.handle }, &[])?
            .0
        {
            Response::QpAttr(a) => {
                let a = QpAttr::try_from(a).map_err(|_| ServiceError::Protocol("QueryQp"))?;
                self.set_state(a.qp_state);
                Ok(a)
            }
            _ => Err(ServiceError::Protocol("QueryQp")),
        }
    }

    fn set_state(&self, s: QpState) {
        let i = QpState::ALL.iter().position(|&x| x == s).unwrap_or(0);
        self.state.store(i as u8, Ordering::Relaxed);
    }

    /// Its state as this program last set or read it.
    pub fn state(&self) -> QpState {
        QpState::ALL
            .get(usize::from(self.state.load(Ordering::Relaxed)))
            .copied()
            .unwrap_or(QpState::Reset)
    }

    /// `ibv_post_send`: each WR into the send ring; the first that the QP would refuse (its
    /// state, an opcode its type lacks, more elements or inline bytes than its caps) or that
    /// does not fit stops the list, as on the QP itself. What only the service can see (a
    /// key of another PD) completes with an error instead.
    pub fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<(), PostFailure> {
        self.post_sends(wrs.iter())
    }

    fn post_sends<'a, 'b: 'a>(
        &self,
        wrs: impl Iterator<Item = &'a SendWr<'b>>,
    ) -> Result<(), PostFailure> {
        gone(&self.inner)?;
        let mut guard = self.sq.lock().unwrap_or_else(|e| e.into_inner());
        let (ring, scratch) = &mut *guard;
        let mut result = Ok(());
        let state = self.state();
        for (index, wr) in wrs.enumerate() {
            let fail = |error| PostFailure { index, error };
            let checked = if self.raw {
                crate::engine::raw::check_send(state, &self.caps, wr, self.max_frame)
            } else {
                ferroce_stack::transport::check_send(state, self.qp_type, &self.caps, wr)
                    .map(|_| ())
            };
            if let Err(e) = checked {
                result = Err(fail(e));
                break;
            }
            scratch.clear();
            if let Err(e) = slots::encode_send(wr, scratch) {
                result = Err(fail(match e {
                    slots::SlotError::Contents(n) => PostError::TooManySges {
                        got: n,
                        max: slots::MAX_SGE as u32,
                    },
                    _ => PostError::InvalidState(ferroce_stack::transport::QpState::Err),
                }));
                break;
            }
            if !push_all(ring, scratch) {
                result = Err(fail(PostError::QueueFull(self.caps.max_send_wr)));
                break;
            }
        }
        drop(guard);
        self.inner.ring_if_asleep();
        result
    }

    /// `ibv_post_recv`.
    pub fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<(), PostFailure> {
        let state = self.state();
        let refused = wrs.iter().enumerate().find_map(|(index, wr)| {
            ferroce_stack::transport::check_recv(state, &self.caps, self.srq, wr)
                .err()
                .map(|error| PostFailure { index, error })
        });
        // As ibv_post_recv: the WRs before a refused one are posted.
        let ok = refused.as_ref().map_or(wrs.len(), |f| f.index);
        // No more outstanding than the queue holds (ENOMEM past it, as the QP says).
        let (region, at) = &self.words;
        let retired = region.load_word(*at, Ordering::Acquire).unwrap_or(0);
        let outstanding = self
            .recvs_posted
            .load(Ordering::Relaxed)
            .saturating_sub(retired);
        let room = u64::from(self.caps.max_recv_wr).saturating_sub(outstanding) as usize;
        let n = ok.min(room);
        let posted = post_recvs(&self.inner, &self.rq, &wrs[..n], self.caps.max_recv_wr);
        let done = posted.as_ref().map_or_else(|f| f.index, |()| n);
        self.recvs_posted.fetch_add(done as u64, Ordering::Relaxed);
        posted?;
        if n < ok {
            return Err(PostFailure {
                index: n,
                error: PostError::QueueFull(self.caps.max_recv_wr),
            });
        }
        refused.map_or(Ok(()), Err)
    }
}

/// A flow rule of a raw QP in the service; dropping it destroys it.
pub struct RemoteFlow {
    inner: Arc<Inner>,
    handle: Handle,
}

impl std::fmt::Debug for RemoteFlow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteFlow")
            .field("handle", &self.handle)
            .finish()
    }
}

impl Drop for RemoteFlow {
    fn drop(&mut self) {
        destroy(&self.inner, Request::DestroyFlow { flow: self.handle });
    }
}

/// The failure of every post once the service has gone.
fn gone(inner: &Inner) -> Result<(), PostFailure> {
    if inner.gone.load(Ordering::Acquire) {
        return Err(PostFailure {
            index: 0,
            error: PostError::InvalidState(ferroce_stack::transport::QpState::Err),
        });
    }
    Ok(())
}

/// `ibv_post_recv` into a receive ring (a QP's or an SRQ's) of `max` receives.
fn post_recvs(
    inner: &Inner,
    ring: &Mutex<RingAndScratch>,
    wrs: &[RecvWr<'_>],
    max: u32,
) -> Result<(), PostFailure> {
    gone(inner)?;
    let mut guard = ring.lock().unwrap_or_else(|e| e.into_inner());
    let (ring, scratch) = &mut *guard;
    let mut result = Ok(());
    for (index, wr) in wrs.iter().enumerate() {
        scratch.clear();
        let error = if slots::encode_recv(wr.wr_id, wr.sg_list, scratch).is_err() {
            PostError::TooManySges {
                got: wr.sg_list.len(),
                max: slots::MAX_SGE as u32,
            }
        } else if !push_all(ring, scratch) {
            PostError::QueueFull(max)
        } else {
            continue;
        };
        result = Err(PostFailure { index, error });
        break;
    }
    drop(guard);
    inner.ring_if_asleep();
    result
}

/// Pushes a request's slots, all or none.
fn push_all(ring: &mut Producer<W>, slots: &[Slot]) -> bool {
    if ring.free().map_or(true, |f| (f as usize) < slots.len()) {
        return false;
    }
    ring.push_all(slots).unwrap_or(false)
}

impl std::fmt::Debug for RemoteQp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteQp")
            .field("handle", &self.handle)
            .finish_non_exhaustive()
    }
}

impl Drop for RemoteQp {
    fn drop(&mut self) {
        destroy(&self.inner, Request::DestroyQp { qp: self.handle });
    }
}
