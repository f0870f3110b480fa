//! Event channels and events: `rdma_create_event_channel`, `rdma_get_cm_event`,
//! `rdma_ack_cm_event`, and the dispatcher that takes each device agent's events to the
//! channel of the id they belong to.
//!
//! A channel's `fd` is an eventfd in semaphore mode counting queued events, so a program may
//! `poll()` it or make it non-blocking, as it does the kernel's `rdma_cm` fd. What the agent
//! reports is queued raw; `rdma_get_cm_event` turns it into the program's event on the
//! program's thread, and makes there the moves librdmacm makes in the same place: the QP to
//! RTR and RTS and the RTU when a REP comes to an id with a QP (the event is then
//! ESTABLISHED), the QP to the error state when the connection ends.

use std::collections::VecDeque;
use std::ffi::{c_char, c_int, c_void};
use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;
use std::time::Duration;

use ferroce_stack::cm::{reason, CmEvent, ConnId, Peer, ReqInfo};
use ferroce_stack::wire::mad::{service_port, CmaHeader, CMA_HEADER_LEN};
use ferroce_verbs::cm::{ConnectionManager, Offer};

use super::{cma, err, same_ip, CmId, Cma, CmaDevice, IdState, St};
use crate::context::context;
use crate::ffi;

/// What happened to an id, as the agent or this library reported it.
pub(crate) enum Raw {
    AddrResolved,
    AddrError(c_int),
    RouteResolved,
    Cm(CmEvent),
}

/// A queued event: the id (the program's pointer) and what happened.
pub(crate) struct Pending {
    pub(crate) id: usize,
    pub(crate) raw: Raw,
}

/// `struct rdma_event_channel` and its queue.
#[repr(C)]
pub struct Channel {
    ch: ffi::rdma_event_channel,
    queue: Mutex<VecDeque<Pending>>,
}

impl Channel {
    /// The channel behind a program's pointer.
    ///
    /// # Safety
    /// `ch` came from `rdma_create_event_channel` (or an id's own) and is not destroyed.
    pub(crate) unsafe fn from_ptr<'a>(ch: *mut ffi::rdma_event_channel) -> Option<&'a Self> {
        // SAFETY: per the contract; `ch` is the first field of a live `Channel`.
        unsafe { (ch as *const Self).as_ref() }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Pending>> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn signal(&self) {
        let one = 1u64;
        // SAFETY: writes 8 bytes from a live u64 to the channel's eventfd.
        unsafe { libc::write(self.ch.fd, &one as *const u64 as *const c_void, 8) };
    }

    /// Queues an event and makes the fd readable for it.
    pub(crate) fn push(&self, p: Pending) {
        self.lock().push_back(p);
        self.signal();
    }

    /// Takes out every queued event of `id` (destroyed, or moving to another channel).
    pub(crate) fn take_for(&self, id: usize) -> Vec<Pending> {
        let mut q = self.lock();
        let (mine, rest): (Vec<_>, Vec<_>) = q.drain(..).partition(|p| p.id == id);
        q.extend(rest);
        mine
    }

    /// True when an event of `id` waits.
    pub(crate) fn has_for(&self, id: usize) -> bool {
        self.lock().iter().any(|p| p.id == id)
    }

    /// A new channel, boxed; the pointer the program holds (null, `errno` set, on failure).
    pub(crate) fn create() -> *mut ffi::rdma_event_channel {
        // SAFETY: plain system call; -1 on failure.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_SEMAPHORE) };
        if fd < 0 {
            return std::ptr::null_mut();
        }
        Box::into_raw(Box::new(Self {
            ch: ffi::rdma_event_channel { fd },
            queue: Mutex::new(VecDeque::new()),
        })) as *mut ffi::rdma_event_channel
    }

    /// Frees a channel made by [`Channel::create`].
    ///
    /// # Safety
    /// `ch` came from [`Channel::create`] and is not used again.
    pub(crate) unsafe fn destroy(ch: *mut ffi::rdma_event_channel) {
        // SAFETY: per the contract.
        let c = unsafe { Box::from_raw(ch as *mut Self) };
        // SAFETY: the channel's own fd, closed once.
        unsafe { libc::close(c.ch.fd) };
    }
}

/// Opens every device `FERROCE_DEVICES` names, with its agent.
pub(crate) fn open_devices() -> Vec<CmaDevice> {
    let mut out = Vec::new();
    for d in crate::device::devices() {
        // SAFETY: a device of this library's list.
        let ctx = unsafe {
            crate::open::ferroce_ibv_open_device(&d.ibv as *const _ as *mut ffi::ibv_device)
        };
        // SAFETY: just opened (or null).
        let Some(c) = (unsafe { context(ctx) }) else {
            continue;
        };
        let cm = c.verbs.connection_manager();
        let me = cm.local_peer();
        let ip = super::id::ip_of_gid(me.gid);
        let active_mtu = c.verbs.query_port_num(1).map_or(3, |p| p.active_mtu as u8);
        let max = c.verbs.query_device().max_qp_rd_atom.min(255) as u8;
        let iface = crate::neigh::interface(&d.spec).map(str::to_owned);
        let registry = std::sync::Arc::new(super::registry::Registry::new(iface.as_deref(), ip));
        let r = registry.clone();
        cm.set_unclaimed_policy(Box::new(move |u| r.answers(u)));
        // SAFETY: the context just opened.
        let pd = unsafe { crate::domain::ferroce_ibv_alloc_pd(ctx) };
        out.push(CmaDevice {
            ctx,
            cm,
            pd,
            ip,
            mac: me.mac,
            iface,
            registry,
            active_mtu,
            max_responder_resources: max,
            max_initiator_depth: max,
        });
    }
    out
}

/// Starts the thread that takes device `dev`'s agent events to their ids' channels.
pub(crate) fn start_dispatcher(dev: usize, cm: ConnectionManager) {
    let _ = std::thread::Builder::new()
        .name(format!("ferroce-cma{dev}"))
        .spawn(move || loop {
            if let Some(e) = cm.next_event(Duration::from_secs(1)) {
                if let Ok(mut c) = cma() {
                    // After the table's lock, as a program's thread that registers memory
                    // holding it takes them: routing allocates, and no page may move under it.
                    let _quiet = ferroce_verbs::service::quiet();
                    route(&mut c, dev, e);
                }
            }
        });
}

/// The id `e` belongs to, and the event queued on its channel. A request gets a new id
/// (its listener's channel and context) at once, so what follows for its connection finds
/// it; a request nobody listens for here any longer is rejected.
fn route(c: &mut Cma, dev: usize, mut e: CmEvent) {
    super::cm_trace!("dev {dev}: {e:?}");
    let conn = match &mut e {
        CmEvent::Request { conn, peer, req } => {
            let (conn, peer) = (*conn, *peer);
            let svc = req.service_id;
            let hdr = CmaHeader::parse(&req.private_data).ok();
            // The peer's offer of ferroce's schemes, taken off what the program sees.
            let offer = Offer::take_from(&mut req.private_data);
            match new_request_id(c, dev, svc, conn, peer, hdr, false, Some(req.clone())) {
                Some(id) => {
                    c.ids.get_mut(&id).expect("just made").peer_offer = offer;
                    queue(id, Raw::Cm(e));
                }
                None => {
                    let _ = c.devs[dev].cm.reject(conn, reason::INVALID_SERVICE_ID, &[]);
                }
            }
            return;
        }
        CmEvent::SidrRequest {
            conn,
            peer,
            service_id,
            private_data,
        } => {
            let hdr = CmaHeader::parse(private_data).ok();
            match new_request_id(c, dev, *service_id, *conn, *peer, hdr, true, None) {
                Some(id) => queue(id, Raw::Cm(e)),
                None => {
                    let _ = c.devs[dev].cm.sidr_reply(*conn, 1, 0, 0, &[]);
                }
            }
            return;
        }
        CmEvent::Reply { conn, .. }
        | CmEvent::Established { conn }
        | CmEvent::Rejected { conn, .. }
        | CmEvent::Unreachable { conn }
        | CmEvent::ConnectError { conn }
        | CmEvent::Disconnected { conn }
        | CmEvent::TimewaitExit { conn }
        | CmEvent::SidrReply { conn, .. } => *conn,
    };
    let Some(&id) = c.conns.get(&(dev, conn)) else {
        super::cm_trace!("dev {dev}: no id has connection {conn:#x}; dropped");
        return;
    };
    if matches!(e, CmEvent::TimewaitExit { .. }) {
        c.conns.remove(&(dev, conn));
    }
    queue(id, Raw::Cm(e));
}

/// Queues `raw` on the channel of `id`.
pub(crate) fn queue(id: usize, raw: Raw) {
    // SAFETY: `id` is a live id of the state (the caller holds it), whose channel lives
    // as long as it.
    let ch = unsafe { (*(id as *mut ffi::rdma_cm_id)).channel };
    // SAFETY: as above.
    if let Some(ch) = unsafe { Channel::from_ptr(ch) } {
        ch.push(Pending { id, raw });
    }
}

/// The listener of service `svc` on `dev` for an address (a bound listener before a
/// wildcard one).
fn listener_for(c: &Cma, dev: usize, svc: u64, dst: Option<IpAddr>) -> Option<usize> {
    let mut wildcard = None;
    for (&id, s) in &c.ids {
        if s.st != St::Listen || !s.listening.contains(&(dev, svc)) {
            continue;
        }
        match (s.src.map(|a| a.ip()), dst) {
            (Some(ip), _) if ip.is_unspecified() => wildcard = Some(id),
            (Some(ip), Some(d)) if same_ip(ip, d) => return Some(id),
            (Some(_), Some(_)) => {}
            _ => wildcard = Some(id),
        }
    }
    wildcard
}

/// Makes the id of a connection request to a listener of `svc` on `dev`.
#[allow(clippy::too_many_arguments)]
fn new_request_id(
    c: &mut Cma,
    dev: usize,
    svc: u64,
    conn: ConnId,
    peer: Peer,
    hdr: Option<CmaHeader>,
    ud: bool,
    req: Option<ReqInfo>,
) -> Option<usize> {
    let l = listener_for(c, dev, svc, hdr.map(|h| h.dst))?;
    // SAFETY: a live id of the state.
    let lid = unsafe { &*(l as *const ffi::rdma_cm_id) };
    let port = service_port(svc).map_or(0, |(_, p)| p);
    let d = &c.devs[dev];
    let src = SocketAddr::new(hdr.map_or(d.ip, |h| h.dst), port);
    let dst = match hdr {
        Some(h) => SocketAddr::new(h.src, h.src_port),
        None => SocketAddr::new(super::id::ip_of_gid(peer.gid), 0),
    };
    let id = CmId::alloc(lid.channel, lid.context, lid.ps, lid.qp_type);
    // SAFETY: just made, not yet shared.
    let cm_id = unsafe { &mut *(id as *mut CmId) };
    super::id::fill_addresses(cm_id, d, src, dst, peer.gid);
    super::id::fill_path(cm_id, d, 64, 0);
    let mut s = IdState::new(false, ud);
    s.st = St::Request;
    s.dev = Some(dev);
    s.src = Some(src);
    s.dst = Some(dst);
    s.peer = Some(peer);
    s.conn = Some(conn);
    s.listener = Some(l);
    s.path_mtu = d.active_mtu;
    if let Some(r) = &req {
        // The request's numbers, from this side: what the peer takes is what we may issue.
        s.initiator_depth = r.responder_resources;
        s.responder_resources = r.initiator_depth;
        s.retry_count = r.retry_count;
        s.rnr_retry_count = r.rnr_retry_count;
        s.path_mtu = r.path_mtu.min(d.active_mtu);
        s.ack_timeout = r.path.local_ack_timeout;
        s.tos = r.path.traffic_class;
    }
    s.req = req;
    // This end's first PSN, fixed with the id as the kernel fixes `seq_num`: what
    // `rdma_init_qp_attr` gives for RTS before the accept and what the REP then carries.
    s.psn = (c.random() & 0xff_ffff) as u32;
    let key = id as usize;
    c.ids.insert(key, s);
    c.conns.insert((dev, conn), key);
    Some(key)
}

/// An event as the program gets it, with room for its private data.
#[repr(C)]
struct EventBox {
    ev: ffi::rdma_cm_event,
    data: [u8; 256],
}

/// Private data carried after rdma_cm's IP header in a request of this port space.
fn after_header(ps: ffi::rdma_port_space, data: &[u8]) -> &[u8] {
    if ps == ffi::RDMA_PS_IB || data.len() < CMA_HEADER_LEN {
        data
    } else {
        &data[CMA_HEADER_LEN..]
    }
}

/// `rdma_create_event_channel`.
#[no_mangle]
pub extern "C" fn ferroce_rdma_create_event_channel() -> *mut ffi::rdma_event_channel {
    if cma().is_err() {
        return std::ptr::null_mut();
    }
    Channel::create()
}

/// `rdma_destroy_event_channel`.
///
/// # Safety
/// `ch` came from `rdma_create_event_channel`, and no id uses it any more.
#[no_mangle]
pub unsafe extern "C" fn ferroce_rdma_destroy_event_channel(ch: *mut ffi::rdma_event_channel) {
    if !ch.is_null() {
        // SAFETY: per the contract.
        unsafe { Channel::destroy(ch) };
    }
}

/// `rdma_get_cm_event`: the next event of the channel, waiting for one unless its fd is
/// non-blocking (then -1 with `EAGAIN`).
///
/// # Safety
/// `ch` is a live channel, `event` points to writable storage for a pointer.
#[no_mangle]
pub unsafe extern "C" fn ferroce_rdma_get_cm_event(
    ch: *mut ffi::rdma_event_channel,
    event: *mut *mut ffi::rdma_cm_event,
) -> c_int {
    if event.is_null() {
        return err(libc::EINVAL);
    }
    // SAFETY: per the contract.
    let Some(chan) = (unsafe { Channel::from_ptr(ch) }) else {
        return err(libc::EINVAL);
    };
    loop {
        let mut n = 0u64;
        // SAFETY: reads 8 bytes into a live u64 from the channel's eventfd.
        let r = unsafe { libc::read(chan.ch.fd, &mut n as *mut u64 as *mut c_void, 8) };
        if r != 8 {
            // errno is the read's (EAGAIN for a non-blocking fd, EINTR).
            return -1;
        }
        let Ok(mut c) = cma() else {
            return -1;
        };
        let Some(p) = chan.lock().pop_front() else {
            // The count of an event taken out with its id: wait for a real one.
            continue;
        };
        if let Some(e) = process(&mut c, p) {
            // SAFETY: per the contract.
            unsafe { event.write(e) };
            return 0;
        }
    }
}

/// Turns a queued event into the program's, making librdmacm's moves on the way. `None`
/// for an event the program does not see (its id is gone).
fn process(c: &mut Cma, p: Pending) -> Option<*mut ffi::rdma_cm_event> {
    let id = p.id;
    if !c.ids.contains_key(&id) {
        return None;
    }
    let e = process_inner(c, p);
    if let Some(e) = e {
        // SAFETY: just made.
        let ev = unsafe { &*e };
        super::cm_trace!(
            "id {id:#x}: {} status {}",
            // SAFETY: a static C string.
            unsafe { std::ffi::CStr::from_ptr(ferroce_rdma_event_str(ev.event)) }.to_string_lossy(),
            ev.status
        );
    }
    e
}

fn process_inner(c: &mut Cma, p: Pending) -> Option<*mut ffi::rdma_cm_event> {
    let id = p.id;
    let mut b = Box::new(EventBox {
        ev: ffi::rdma_cm_event {
            id: id as *mut ffi::rdma_cm_id,
            ..Default::default()
        },
        data: [0; 256],
    });
    let data_ptr = b.data.as_ptr() as *const c_void;
    // SAFETY: a live id of the state.
    let cm_id = unsafe { &mut *(id as *mut CmId) };
    let ps = cm_id.id.ps;
    let copy = |b: &mut EventBox, d: &[u8]| -> u8 {
        let n = d.len().min(255);
        b.data[..n].copy_from_slice(&d[..n]);
        n as u8
    };
    let conn_param = |b: &mut EventBox, d: &[u8]| {
        let n = copy(b, d);
        // Plain writes to the `conn` member of the parameter union.
        b.ev.param.conn.private_data = if n > 0 { data_ptr } else { std::ptr::null() };
        b.ev.param.conn.private_data_len = n;
    };
    let s = c.ids.get_mut(&id).expect("checked");
    match p.raw {
        Raw::AddrResolved => {
            b.ev.event = ffi::RDMA_CM_EVENT_ADDR_RESOLVED;
        }
        Raw::AddrError(e) => {
            b.ev.event = ffi::RDMA_CM_EVENT_ADDR_ERROR;
            b.ev.status = -e;
        }
        Raw::RouteResolved => {
            b.ev.event = ffi::RDMA_CM_EVENT_ROUTE_RESOLVED;
        }
        Raw::Cm(CmEvent::Request { req, .. }) => {
            b.ev.event = ffi::RDMA_CM_EVENT_CONNECT_REQUEST;
            b.ev.listen_id = s.listener.take().unwrap_or(0) as *mut ffi::rdma_cm_id;
            conn_param(&mut b, after_header(ps, &req.private_data));
            // SAFETY: the `conn` member, as above.
            unsafe {
                let pc = &mut b.ev.param.conn;
                pc.responder_resources = req.initiator_depth;
                pc.initiator_depth = req.responder_resources;
                pc.flow_control = 1;
                pc.retry_count = req.retry_count;
                pc.rnr_retry_count = req.rnr_retry_count;
                pc.srq = u8::from(req.srq);
                pc.qp_num = req.qpn;
            }
            adopt_sync(c, id, b.ev.listen_id as usize);
        }
        Raw::Cm(CmEvent::SidrRequest { private_data, .. }) => {
            b.ev.event = ffi::RDMA_CM_EVENT_CONNECT_REQUEST;
            b.ev.listen_id = s.listener.take().unwrap_or(0) as *mut ffi::rdma_cm_id;
            let n = copy(&mut b, after_header(ps, &private_data));
            b.ev.param.ud.private_data = data_ptr;
            b.ev.param.ud.private_data_len = n;
            adopt_sync(c, id, b.ev.listen_id as usize);
        }
        Raw::Cm(CmEvent::Reply { conn, mut rep }) => {
            // Whether the peer speaks ferroce (its REP carries an offer), before the QP's
            // RTR reads it; the offer's bytes are not the program's.
            let offer = Offer::take_from(&mut rep.private_data);
            let peer =
                crate::schemes::Peer::agreed(&crate::schemes::my_offer(true), offer.as_ref());
            if let Some(dev) = s.dev {
                crate::schemes::set_peer(c.devs[dev].ctx, s.qpn, peer);
            }
            conn_param(&mut b, &rep.private_data);
            // SAFETY: the `conn` member, as above.
            unsafe {
                let pc = &mut b.ev.param.conn;
                pc.responder_resources = rep.initiator_depth;
                pc.initiator_depth = rep.responder_resources;
                pc.flow_control = 1;
                pc.rnr_retry_count = rep.rnr_retry_count;
                pc.srq = u8::from(rep.srq);
                pc.qp_num = rep.qpn;
            }
            s.responder_resources = s.responder_resources.min(rep.initiator_depth);
            s.initiator_depth = s.initiator_depth.min(rep.responder_resources);
            s.rnr_retry_count = rep.rnr_retry_count;
            s.rep = Some(rep);
            if cm_id.id.qp.is_null() {
                s.st = St::Response;
                b.ev.event = ffi::RDMA_CM_EVENT_CONNECT_RESPONSE;
            } else {
                match super::qp::to_rts(c, id) {
                    Ok(()) => {
                        let s = c.ids.get_mut(&id).expect("checked");
                        s.st = St::Connected;
                        let dev = s.dev.expect("connected ids have a device");
                        let _ = c.devs[dev].cm.ready_to_use(conn, &[]);
                        b.ev.event = ffi::RDMA_CM_EVENT_ESTABLISHED;
                    }
                    Err(e) => {
                        super::qp::to_err(cm_id);
                        let s = c.ids.get_mut(&id).expect("checked");
                        let dev = s.dev.expect("connected ids have a device");
                        let _ = c.devs[dev].cm.reject(conn, reason::CONSUMER_REJECT, &[]);
                        s.st = St::Disconnected;
                        b.ev.event = ffi::RDMA_CM_EVENT_CONNECT_ERROR;
                        b.ev.status = -e;
                    }
                }
            }
        }
        Raw::Cm(CmEvent::Established { .. }) => {
            // The active side (no request) reported its ESTABLISHED with the REP, when the RTU
            // went (or, without a QP, the program's `rdma_establish` settled it).
            s.req.as_ref()?;
            s.st = St::Connected;
            b.ev.event = ffi::RDMA_CM_EVENT_ESTABLISHED;
        }
        Raw::Cm(CmEvent::Rejected {
            reason,
            private_data,
            ..
        }) => {
            s.st = St::Disconnected;
            b.ev.event = ffi::RDMA_CM_EVENT_REJECTED;
            b.ev.status = c_int::from(reason);
            conn_param(&mut b, &private_data);
            super::qp::to_err(cm_id);
        }
        Raw::Cm(CmEvent::Unreachable { .. }) => {
            s.st = St::Disconnected;
            b.ev.event = ffi::RDMA_CM_EVENT_UNREACHABLE;
            b.ev.status = -libc::ETIMEDOUT;
            super::qp::to_err(cm_id);
        }
        Raw::Cm(CmEvent::ConnectError { .. }) => {
            s.st = St::Disconnected;
            b.ev.event = ffi::RDMA_CM_EVENT_CONNECT_ERROR;
            b.ev.status = -libc::ETIMEDOUT;
            super::qp::to_err(cm_id);
        }
        Raw::Cm(CmEvent::Disconnected { .. }) => {
            s.st = St::Disconnected;
            b.ev.event = ffi::RDMA_CM_EVENT_DISCONNECTED;
            // The connection is over: outstanding work flushes, as the program's own
            // `rdma_disconnect` would make it.
            super::qp::to_err(cm_id);
        }
        Raw::Cm(CmEvent::TimewaitExit { .. }) => {
            b.ev.event = ffi::RDMA_CM_EVENT_TIMEWAIT_EXIT;
        }
        Raw::Cm(CmEvent::SidrReply {
            status,
            qpn,
            qkey,
            private_data,
            ..
        }) => {
            let n = copy(&mut b, &private_data);
            if status == 0 {
                s.st = St::Connected;
                b.ev.event = ffi::RDMA_CM_EVENT_ESTABLISHED;
                let dgid = s.peer.map_or([0; 16], |p| p.gid);
                // SAFETY: writing the `ud` member of the parameter union.
                unsafe {
                    let ud = &mut b.ev.param.ud;
                    ud.private_data = data_ptr;
                    ud.private_data_len = n;
                    ud.qp_num = qpn;
                    ud.qkey = qkey;
                    ud.ah_attr = super::qp::ah_attr(dgid, s.tos);
                }
            } else {
                s.st = St::Disconnected;
                b.ev.event = ffi::RDMA_CM_EVENT_UNREACHABLE;
                b.ev.status = c_int::from(status);
                b.ev.param.ud.private_data = data_ptr;
                b.ev.param.ud.private_data_len = n;
            }
        }
    }
    Some(Box::into_raw(b) as *mut ffi::rdma_cm_event)
}

/// A request to a synchronous listener makes a synchronous id, with its own channel (as
/// librdmacm migrates it), so `rdma_accept` on it waits for its own events.
fn adopt_sync(c: &mut Cma, id: usize, listener: usize) {
    let sync = c.ids.get(&listener).is_some_and(|l| l.sync);
    if !sync {
        return;
    }
    let ch = Channel::create();
    if ch.is_null() {
        return;
    }
    // SAFETY: a live id of the state; its old channel is the listener's, still live.
    let cm_id = unsafe { &mut *(id as *mut ffi::rdma_cm_id) };
    // SAFETY: as above.
    let moved = unsafe { Channel::from_ptr(cm_id.channel) }.map(|old| old.take_for(id));
    cm_id.channel = ch;
    // SAFETY: just made.
    let new = unsafe { Channel::from_ptr(ch) }.expect("just made");
    for p in moved.into_iter().flatten() {
        new.push(p);
    }
    if let Some(s) = c.ids.get_mut(&id) {
        s.sync = true;
    }
}

/// `rdma_ack_cm_event`: frees the event.
///
/// # Safety
/// `event` came from `rdma_get_cm_event` and is not used again.
#[no_mangle]
pub unsafe extern "C" fn ferroce_rdma_ack_cm_event(event: *mut ffi::rdma_cm_event) -> c_int {
    if event.is_null() {
        return err(libc::EINVAL);
    }
    // SAFETY: per the contract, a boxed `EventBox` (its event first).
    drop(unsafe { Box::from_raw(event as *mut EventBox) });
    0
}

/// librdmacm's `ucma_complete`: for a synchronous id, waits for the event of the call just
/// made and keeps it in `id->event`; its status becomes the call's `errno`.
///
/// # Safety
/// `id` is a live id.
pub(crate) unsafe fn complete(id: *mut ffi::rdma_cm_id) -> c_int {
    let sync = cma().is_ok_and(|c| c.ids.get(&(id as usize)).is_some_and(|s| s.sync));
    if !sync {
        return 0;
    }
    // SAFETY: per the contract.
    let cm_id = unsafe { &mut *id };
    if !cm_id.event.is_null() {
        // SAFETY: the id's kept event, from `rdma_get_cm_event`.
        unsafe { ferroce_rdma_ack_cm_event(cm_id.event) };
        cm_id.event = std::ptr::null_mut();
    }
    let mut ev = std::ptr::null_mut();
    // SAFETY: the id's own channel.
    if unsafe { ferroce_rdma_get_cm_event(cm_id.channel, &mut ev) } != 0 {
        return -1;
    }
    cm_id.event = ev;
    // SAFETY: just returned by `rdma_get_cm_event`.
    let e = unsafe { &*ev };
    if e.status != 0 {
        return if e.event == ffi::RDMA_CM_EVENT_REJECTED {
            err(libc::ECONNREFUSED)
        } else {
            err(e.status.abs())
        };
    }
    0
}

/// `rdma_event_str`.
#[no_mangle]
pub extern "C" fn ferroce_rdma_event_str(event: ffi::rdma_cm_event_type) -> *const c_char {
    let s: &'static std::ffi::CStr = match event {
        ffi::RDMA_CM_EVENT_ADDR_RESOLVED => c"RDMA_CM_EVENT_ADDR_RESOLVED",
        ffi::RDMA_CM_EVENT_ADDR_ERROR => c"RDMA_CM_EVENT_ADDR_ERROR",
        ffi::RDMA_CM_EVENT_ROUTE_RESOLVED => c"RDMA_CM_EVENT_ROUTE_RESOLVED",
        ffi::RDMA_CM_EVENT_ROUTE_ERROR => c"RDMA_CM_EVENT_ROUTE_ERROR",
        ffi::RDMA_CM_EVENT_CONNECT_REQUEST => c"RDMA_CM_EVENT_CONNECT_REQUEST",
        ffi::RDMA_CM_EVENT_CONNECT_RESPONSE => c"RDMA_CM_EVENT_CONNECT_RESPONSE",
        ffi::RDMA_CM_EVENT_CONNECT_ERROR => c"RDMA_CM_EVENT_CONNECT_ERROR",
        ffi::RDMA_CM_EVENT_UNREACHABLE => c"RDMA_CM_EVENT_UNREACHABLE",
        ffi::RDMA_CM_EVENT_REJECTED => c"RDMA_CM_EVENT_REJECTED",
        ffi::RDMA_CM_EVENT_ESTABLISHED => c"RDMA_CM_EVENT_ESTABLISHED",
        ffi::RDMA_CM_EVENT_DISCONNECTED => c"RDMA_CM_EVENT_DISCONNECTED",
        ffi::RDMA_CM_EVENT_DEVICE_REMOVAL => c"RDMA_CM_EVENT_DEVICE_REMOVAL",
        ffi::RDMA_CM_EVENT_MULTICAST_JOIN => c"RDMA_CM_EVENT_MULTICAST_JOIN",
        ffi::RDMA_CM_EVENT_MULTICAST_ERROR => c"RDMA_CM_EVENT_MULTICAST_ERROR",
        ffi::RDMA_CM_EVENT_ADDR_CHANGE => c"RDMA_CM_EVENT_ADDR_CHANGE",
        ffi::RDMA_CM_EVENT_TIMEWAIT_EXIT => c"RDMA_CM_EVENT_TIMEWAIT_EXIT",
        _ => c"UNKNOWN EVENT",
    };
    s.as_ptr()
}
