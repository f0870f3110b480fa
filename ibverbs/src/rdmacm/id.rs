//! Ids: create and destroy, addresses and routes, listen, connect, accept, reject,
//! disconnect, and the small calls around them.
//!
//! An id's address comes from the program (`rdma_bind_addr`, or the source of
//! `rdma_resolve_addr`) or, as the kernel picks it, from the route to the destination; its
//! device is the one whose port has that address. The peer's MAC is resolved when the
//! address is (the drop-in's neighbour lookup), so a failure is `ADDR_ERROR`, as on Linux.

use std::ffi::{c_int, c_void};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};

use ferroce_stack::cm::{reason, AcceptParams, ConnectParams, Peer};
use ferroce_stack::wire::mad::{private_len, service_id, CmPath, CmaHeader, CMA_HEADER_LEN};
use ferroce_stack::wire::MacAddr;
use ferroce_verbs::cm::CmCallError;

use super::event::{complete, queue, Channel, Raw};
use super::{
    cma, err, gid_of, read_sockaddr, same_ip, write_sockaddr, CmId, Cma, CmaDevice, IdState, St,
    UDP_QKEY,
};
use crate::ffi;

/// The IP address of a GID (IPv4-mapped ones as IPv4).
pub(crate) fn ip_of_gid(gid: [u8; 16]) -> IpAddr {
    ferroce_verbs::Gid(gid).ip()
}

/// Sets the id's device and addresses as the program reads them (`id->verbs`,
/// `id->route.addr`).
pub(crate) fn fill_addresses(
    c: &mut CmId,
    d: &CmaDevice,
    src: SocketAddr,
    dst: SocketAddr,
    dgid: [u8; 16],
) {
    c.id.verbs = d.ctx;
    c.id.port_num = 1;
    if c.id.pd.is_null() {
        c.id.pd = d.pd;
    }
    let a = &mut c.id.route.addr;
    // SAFETY: plain-data unions of the header: the storage member is the whole of each.
    unsafe {
        write_sockaddr(&mut a.__bindgen_anon_1.src_storage, src);
        write_sockaddr(&mut a.__bindgen_anon_2.dst_storage, dst);
        a.addr.ibaddr.sgid.raw = gid_of(d.ip);
        a.addr.ibaddr.dgid.raw = dgid;
        a.addr.ibaddr.pkey = 0xffffu16.to_be();
    }
}

/// Fills the id's one path record (`id->route.path_rec`), as a RoCE route has it.
pub(crate) fn fill_path(c: &mut CmId, d: &CmaDevice, hop_limit: u8, tos: u8) {
    // SAFETY: the address union as `fill_addresses` wrote it.
    let (sgid, dgid) = unsafe {
        (
            c.id.route.addr.addr.ibaddr.sgid,
            c.id.route.addr.addr.ibaddr.dgid,
        )
    };
    c.path = ffi::ibv_sa_path_rec {
        dgid,
        sgid,
        reversible: 1,
        numb_path: 1,
        pkey: 0xffffu16.to_be(),
        hop_limit,
        traffic_class: tos,
        mtu_selector: 2,
        mtu: d.active_mtu,
        rate_selector: 2,
        rate: 3,
        packet_life_time_selector: 2,
        packet_life_time: 16,
        ..Default::default()
    };
    c.id.route.path_rec = &mut c.path;
    c.id.route.num_paths = 1;
}

/// The port space of an id, as the wire's service ID uses it.
fn ps_of(c: &CmId) -> u16 {
    c.id.ps as u16
}

/// `rdma_create_id`.
///
/// # Safety
/// `channel` is null or a live channel; `id` points to writable storage for a pointer.
#[no_mangle]
pub unsafe extern "C" fn ferroce_rdma_create_id(
    channel: *mut ffi::rdma_event_channel,
    id: *mut *mut ffi::rdma_cm_id,
    context: *mut c_void,
    ps: ffi::rdma_port_space,
) -> c_int {
    let qp_type = if ps == ffi::RDMA_PS_UDP || ps == ffi::RDMA_PS_IPOIB {
        ffi::IBV_QPT_UD
    } else {
        ffi::IBV_QPT_RC
    };
    // SAFETY: per the contract.
    unsafe { create_id(channel, id, context, ps, qp_type) }
}

/// `rdma_create_id` with a QP type (`rdma_create_ep`'s).
///
/// # Safety
/// As [`ferroce_rdma_create_id`].
pub(crate) unsafe fn create_id(
    channel: *mut ffi::rdma_event_channel,
    id: *mut *mut ffi::rdma_cm_id,
    context: *mut c_void,
    ps: ffi::rdma_port_space,
    qp_type: ffi::ibv_qp_type,
) -> c_int {
    if id.is_null() {
        return err(libc::EINVAL);
    }
    if ![
        ffi::RDMA_PS_TCP,
        ffi::RDMA_PS_UDP,
        ffi::RDMA_PS_IB,
        ffi::RDMA_PS_IPOIB,
    ]
    .contains(&ps)
    {
        return err(libc::EINVAL);
    }
    let Ok(mut c) = cma() else {
        return -1;
    };
    let sync = channel.is_null();
    let channel = if sync { Channel::create() } else { channel };
    if channel.is_null() {
        return -1;
    }
    let p = CmId::alloc(channel, context, ps, qp_type);
    c.ids
        .insert(p as usize, IdState::new(sync, qp_type == ffi::IBV_QPT_UD));
    // SAFETY: per the contract.
    unsafe { id.write(p) };
    0
}

/// `rdma_destroy_id`: leaves what the id is in (a connection gets its DREQ, a request its
/// REJ, a listener stops), drops its queued events, and frees it.
///
/// # Safety
/// `id` is a live id, not used again.
#[no_mangle]
pub unsafe extern "C" fn ferroce_rdma_destroy_id(id: *mut ffi::rdma_cm_id) -> c_int {
    super::cm_trace!("destroy id {:#x}", id as usize);
    let Ok(mut c) = cma() else {
        return -1;
    };
    if !c.ids.contains_key(&(id as usize)) {
        return err(libc::EINVAL);
    }
    // Requests queued for a listener have ids of their own the program has not seen:
    // they go first (rejected), while the listener's channel still exists.
    let key = id as usize;
    let orphans: Vec<usize> = c
        .ids
        .iter()
        .filter(|(_, t)| t.listener == Some(key))
        .map(|(&k, _)| k)
        .collect();
    for k in orphans.into_iter().chain([key]) {
        let Some(s) = c.ids.remove(&k) else {
            continue;
        };
        leave(&mut c, k, &s);
        // SAFETY: a live id until freed below.
        let cm = unsafe { &mut *(k as *mut CmId) };
        // SAFETY: the id's channel outlives it.
        if let Some(ch) = unsafe { Channel::from_ptr(cm.id.channel) } {
            ch.take_for(k);
        }
        if !cm.id.event.is_null() {
            // SAFETY: the id's kept event.
            unsafe { super::event::ferroce_rdma_ack_cm_event(cm.id.event) };
        }
        if s.sync {
            // SAFETY: the id's own channel, used by nothing else.
            unsafe { Channel::destroy(cm.id.channel) };
        }
        // SAFETY: made by `CmId::alloc`, freed once.
        drop(unsafe { Box::from_raw(k as *mut CmId) });
    }
    0
}

/// Waits (briefly) until what the call just queued has gone to the port, as the kernel's
/// CM has posted its MAD when the call returns: a program may exit at once (Python's
/// multiprocessing children leave with `_exit`, which runs no `atexit`), and the engine
/// thread that would send it ends with the process.
pub(crate) fn flushed(cm: &ferroce_verbs::cm::ConnectionManager) {
    cm.flush(std::time::Duration::from_millis(50));
}

/// Ends what an id is doing, on the wire, as it goes.
fn leave(c: &mut Cma, key: usize, s: &IdState) {
    for &(dev, svc) in &s.listening {
        c.devs[dev].cm.stop_listening(svc);
        c.devs[dev].registry.stop_listening(svc);
    }
    if let (Some(dev), Some(conn)) = (s.dev, s.conn) {
        let cm = &c.devs[dev].cm;
        match s.st {
            St::Request if s.ud => {
                let _ = cm.sidr_reply(conn, 1, 0, 0, &[]);
            }
            St::Request => {
                let _ = cm.reject(conn, reason::CONSUMER_REJECT, &[]);
            }
            St::Connect | St::Accepted | St::Response | St::Connected if !s.ud => {
                let _ = cm.disconnect(conn, &[]);
            }
            _ => {}
        }
        flushed(cm);
        c.conns.retain(|_, v| *v != key);
    }
    if let Some(p) = s.owned_port {
        c.ports.remove(&p);
    }
}

/// What the kernel's rdma_cm does when a process's file closes, done at `exit` (registered
/// with `atexit` when the state is made): every connection still open ends on the wire — a
/// DREQ, or a REJ for a request never answered — every listener goes, and what the CM had
/// queued to send (a DREQ just asked for) leaves before the process does, so a peer learns at
/// once that the process is gone rather than from its transport's retries, or never (an idle
/// QP). The ids stay allocated (other threads of the program may still hold them as the
/// process ends). A process killed by a signal runs no `atexit`: its peers learn from their
/// transport, as today.
pub(crate) extern "C" fn at_exit() {
    // A thread may hold the state as `exit` runs (a call in flight): wait for it a little,
    // never hang the exit.
    let until = std::time::Instant::now() + std::time::Duration::from_millis(100);
    let mut c = loop {
        match super::try_cma() {
            Some(Ok(c)) => break c,
            None => return,
            Some(Err(())) if std::time::Instant::now() < until => {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            Some(Err(())) => return,
        }
    };
    if c.pid != std::process::id() {
        // A forked child leaving: the ids are its parent's, which keeps them open.
        return;
    }
    let keys: Vec<usize> = c.ids.keys().copied().collect();
    for k in keys {
        let Some(mut s) = c.ids.remove(&k) else {
            continue;
        };
        leave(&mut c, k, &s);
        s.st = St::Disconnected;
        s.listening.clear();
        s.conn = None;
        s.owned_port = None;
        c.ids.insert(k, s);
    }
    // What went before exit too (a DREQ of an `rdma_disconnect` just made) leaves now or
    // never: the engine thread that sends it ends with the process.
    let cms: Vec<_> = c.devs.iter().map(|d| d.cm.clone()).collect();
    drop(c);
    for cm in cms {
        cm.flush(std::time::Duration::from_millis(100));
    }
}

/// Binds an id to `a` (a port of 0 takes an ephemeral one).
fn bind(c: &mut Cma, key: usize, a: SocketAddr) -> Result<(), c_int> {
    // SAFETY: a live id of the state.
    let cm = unsafe { &mut *(key as *mut CmId) };
    let ps = ps_of(cm);
    let s = c.ids.get(&key).ok_or(libc::EINVAL)?;
    if s.st != St::Idle {
        return Err(libc::EINVAL);
    }
    let dev = if a.ip().is_unspecified() {
        None
    } else {
        Some(c.dev_of_ip(a.ip()).ok_or(libc::EADDRNOTAVAIL)?)
    };
    let port = if a.port() == 0 {
        c.ephemeral_port(ps).ok_or(libc::EADDRINUSE)?
    } else if c.ports.insert((ps, a.port())) {
        a.port()
    } else {
        return Err(libc::EADDRINUSE);
    };
    let src = SocketAddr::new(a.ip(), port);
    let s = c.ids.get_mut(&key).expect("checked");
    s.st = St::Bound;
    s.dev = dev;
    s.src = Some(src);
    s.owned_port = Some((ps, port));
    // SAFETY: the source member of the address union, as storage.
    unsafe { write_sockaddr(&mut cm.id.route.addr.__bindgen_anon_1.src_storage, src) };
    if let Some(d) = dev {
        let d = &c.devs[d];
        cm.id.verbs = d.ctx;
        cm.id.port_num = 1;
        if cm.id.pd.is_null() {
            cm.id.pd = d.pd;
        }
        cm.id.route.addr.addr.ibaddr.sgid.raw = gid_of(d.ip);
        cm.id.route.addr.addr.ibaddr.pkey = 0xffffu16.to_be();
    }
    Ok(())
}

/// `rdma_bind_addr`.
///
/// # Safety
/// `id` is a live id; `addr` points to a `sockaddr_in` or `sockaddr_in6`.
#[no_mangle]
pub unsafe extern "C" fn ferroce_rdma_bind_addr(
    id: *mut ffi::rdma_cm_id,
    addr: *mut libc::sockaddr,
) -> c_int {
    // SAFETY: per the contract.
    let Some(a) = (unsafe { read_sockaddr(addr) }) else {
        return err(libc::EAFNOSUPPORT);
    };
    let Ok(mut c) = cma() else {
        return -1;
    };
    match bind(&mut c, id as usize, a) {
        Ok(()) => 0,
        Err(e) => err(e),
    }
}

/// The source address the kernel would use to reach `dst`.
fn route_source(dst: IpAddr) -> Option<IpAddr> {
    let any: SocketAddr = match dst {
        IpAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        IpAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let s = UdpSocket::bind(any).ok()?;
    s.connect((dst, 9)).ok()?;
    s.local_addr().ok().map(|a| a.ip())
}

/// `rdma_resolve_addr`: picks the device and source address, resolves the peer's MAC, and
/// queues `ADDR_RESOLVED` (or `ADDR_ERROR`).
///
/// # Safety
/// `id` is a live id; `src` is null or an address, `dst` an address.
#[no_mangle]
pub unsafe extern "C" fn ferroce_rdma_resolve_addr(
    id: *mut ffi::rdma_cm_id,
    src: *mut libc::sockaddr,
    dst: *mut libc::sockaddr,
    _timeout_ms: c_int,
) -> c_int {
    // SAFETY: per the contract.
    let (src, Some(dst)) = (unsafe { read_sockaddr(src) }, unsafe { read_sockaddr(dst) }) else {
        super::cm_trace!("resolve_addr id {:#x}: no destination address", id as usize);
        return err(libc::EINVAL);
    };
    let key = id as usize;
    // What the lookup needs, then the lookup without the state's lock (it may wait for
    // the kernel's neighbour resolution).
    let (dev, devs) = {
        let Ok(mut c) = cma() else {
            return -1;
        };
        let Some(s) = c.ids.get(&key) else {
            return err(libc::EINVAL);
        };
        if s.st == St::Idle {
            let a = src.unwrap_or_else(|| {
                let any = match dst.ip() {
                    IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
                    IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
                };
                SocketAddr::new(any, 0)
            });
            if let Err(e) = bind(&mut c, key, a) {
                return err(e);
            }
        } else if c.ids[&key].st != St::Bound {
            super::cm_trace!("resolve_addr id {key:#x}: in state {:?}", c.ids[&key].st);
            return err(libc::EINVAL);
        }
        let devs: Vec<(IpAddr, MacAddr, Option<String>)> = c
            .devs
            .iter()
            .map(|d| (d.ip, d.mac, d.iface.clone()))
            .collect();
        (c.ids[&key].dev, devs)
    };
    let dev = dev.or_else(|| {
        let ip = route_source(dst.ip())?;
        devs.iter().position(|d| same_ip(d.0, ip))
    });
    let dev = dev.or((devs.len() == 1).then_some(0));
    let mac = dev.and_then(|i| {
        if let Some(own) = devs.iter().find(|d| same_ip(d.0, dst.ip())) {
            return Some(own.1);
        }
        crate::neigh::configured(dst.ip())
            .or_else(|| crate::neigh::resolve(devs[i].2.as_deref()?, dst.ip()))
    });
    {
        let Ok(mut c) = cma() else {
            return -1;
        };
        let mtu = dev.map_or(3, |d| c.devs[d].active_mtu);
        let Some(s) = c.ids.get_mut(&key) else {
            return err(libc::EINVAL);
        };
        match (dev, mac) {
            (Some(d), Some(mac)) => {
                let src_ip = match s.src.map(|a| a.ip()) {
                    Some(ip) if !ip.is_unspecified() => ip,
                    _ => devs[d].0,
                };
                let src = SocketAddr::new(src_ip, s.src.map_or(0, |a| a.port()));
                s.src = Some(src);
                s.dst = Some(dst);
                s.dev = Some(d);
                s.st = St::AddrResolved;
                s.peer = Some(Peer {
                    gid: gid_of(dst.ip()),
                    mac,
                });
                s.path_mtu = mtu;
                // SAFETY: a live id of the state.
                let cm = unsafe { &mut *(key as *mut CmId) };
                fill_addresses(cm, &c.devs[d], src, dst, gid_of(dst.ip()));
                queue(key, Raw::AddrResolved);
            }
            (None, _) => {
                s.st = St::Bound;
                queue(key, Raw::AddrError(libc::ENODEV));
            }
            (Some(_), None) => {
                s.st = St::Bound;
                queue(key, Raw::AddrError(libc::EHOSTUNREACH));
            }
        }
    }
    // SAFETY: per the contract.
    unsafe { complete(id) }
}

/// `rdma_resolve_route`: a RoCE route is the resolved address's; queues
/// `ROUTE_RESOLVED`.
///
/// # Safety
/// `id` is a live id.
#[no_mangle]
pub unsafe extern "C" fn ferroce_rdma_resolve_route(
    id: *mut ffi::rdma_cm_id,
    _timeout_ms: c_int,
) -> c_int {
    let key = id as usize;
    {
        let Ok(mut c) = cma() else {
            return -1;
        };
        let Some(s) = c.ids.get_mut(&key) else {
            return err(libc::EINVAL);
        };
        if s.st != St::AddrResolved {
            return err(libc::EINVAL);
        }
        s.st = St::RouteResolved;
        let (d, tos) = (s.dev.expect("resolved"), s.tos);
        // SAFETY: a live id of the state.
        let cm = unsafe { &mut *(key as *mut CmId) };
        fill_path(cm, &c.devs[d], 64, tos);
        queue(key, Raw::RouteResolved);
    }
    // SAFETY: per the contract.
    unsafe { complete(id) }
}

/// `rdma_listen`: takes requests for the id's service on its device, or on every device
/// for a wildcard address.
///
/// # Safety
/// `id` is a live id.
#[no_mangle]
pub unsafe extern "C" fn ferroce_rdma_listen(id: *mut ffi::rdma_cm_id, _backlog: c_int) -> c_int {
    let key = id as usize;
    let Ok(mut c) = cma() else {
        return -1;
    };
    let Some(s) = c.ids.get(&key) else {
        return err(libc::EINVAL);
    };
    if s.st == St::Idle {
        if let Err(e) = bind(&mut c, key, (Ipv4Addr::UNSPECIFIED, 0).into()) {
            return err(e);
        }
    }
    let s = &c.ids[&key];
    if s.st != St::Bound {
        return err(libc::EINVAL);
    }
    // SAFETY: a live id of the state.
    let ps = ps_of(unsafe { &*(key as *const CmId) });
    let svc = service_id(ps, s.src.map_or(0, |a| a.port()));
    let devs: Vec<usize> = match s.dev {
        Some(d) => vec![d],
        None => (0..c.devs.len()).collect(),
    };
    let mut done: Vec<(usize, u64)> = Vec::new();
    for d in devs {
        // Another process's listener on the address counts as this process's would.
        let dev = &c.devs[d];
        let r = dev.registry.listen(svc).and_then(|()| {
            dev.cm.listen(svc).map_err(|_| {
                dev.registry.stop_listening(svc);
                libc::EADDRINUSE
            })
        });
        if let Err(e) = r {
            for &(d, svc) in &done {
                c.devs[d].cm.stop_listening(svc);
                c.devs[d].registry.stop_listening(svc);
            }
            return err(e);
        }
        done.push((d, svc));
    }
    super::cm_trace!("listen id {key:#x} on service {svc:#x}");
    let s = c.ids.get_mut(&key).expect("checked");
    s.listening = done;
    s.st = St::Listen;
    0
}

/// The program's connection parameters, read.
struct Param {
    private: Vec<u8>,
    responder_resources: u8,
    initiator_depth: u8,
    retry_count: u8,
    rnr_retry_count: u8,
    srq: bool,
    qp_num: u32,
}

/// Reads `struct rdma_conn_param` (null: none).
///
/// # Safety
/// `p` is null or a valid parameter structure whose private data is readable.
unsafe fn read_param(p: *const ffi::rdma_conn_param) -> Option<Param> {
    // SAFETY: per the contract.
    let p = unsafe { p.as_ref() }?;
    let private = if p.private_data.is_null() || p.private_data_len == 0 {
        Vec::new()
    } else {
        // SAFETY: per the contract, `private_data_len` bytes are readable.
        unsafe {
            std::slice::from_raw_parts(p.private_data as *const u8, p.private_data_len.into())
        }
        .to_vec()
    };
    Some(Param {
        private,
        responder_resources: p.responder_resources,
        initiator_depth: p.initiator_depth,
        retry_count: p.retry_count,
        rnr_retry_count: p.rnr_retry_count,
        srq: p.srq != 0,
        qp_num: p.qp_num,
    })
}

/// The QP a connection is for, and whether it takes receives from an SRQ: the id's own QP,
/// or (an id without one) what the program's parameters say.
fn qp_of(cm: &CmId, p: Option<&Param>) -> (u32, bool) {
    // SAFETY: the id's QP, if any, is a live QP of this library.
    match unsafe { cm.id.qp.as_ref() } {
        Some(q) => (q.qp_num, !q.srq.is_null()),
        None => p.map_or((0, false), |p| (p.qp_num, p.srq)),
    }
}

/// librdmacm's check of a TCP id's parameters against the device.
fn valid_param(cm: &CmId, d: &CmaDevice, p: Option<&Param>) -> bool {
    if cm.id.ps != ffi::RDMA_PS_TCP {
        return true;
    }
    let Some(p) = p else {
        return !cm.id.qp.is_null();
    };
    (p.responder_resources == 0xff || p.responder_resources <= d.max_responder_resources)
        && (p.initiator_depth == 0xff || p.initiator_depth <= d.max_initiator_depth)
}

/// The private data of a request: rdma_cm's IP header (not in the IB port space), then the
/// program's.
fn request_private(cm: &CmId, s: &IdState, user: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(CMA_HEADER_LEN + user.len());
    if cm.id.ps != ffi::RDMA_PS_IB {
        let (src, dst) = (s.src.expect("resolved"), s.dst.expect("resolved"));
        let mut h = [0u8; CMA_HEADER_LEN];
        CmaHeader {
            src_port: src.port(),
            src: src.ip(),
            dst: dst.ip(),
        }
        .emit(&mut h);
        v.extend_from_slice(&h);
    }
    v.extend_from_slice(&s.connect_blob);
    v.extend_from_slice(user);
    v
}

/// The errno of a refused agent call.
fn cm_errno(e: CmCallError) -> c_int {
    e.errno()
}

/// `rdma_connect`: a REQ (a SIDR_REQ for a UD id) with the id's QP and the program's
/// parameters; a synchronous id waits until it is connected.
///
/// # Safety
/// `id` is a live id; `param` is null or valid.
#[no_mangle]
pub unsafe extern "C" fn ferroce_rdma_connect(
    id: *mut ffi::rdma_cm_id,
    param: *mut ffi::rdma_conn_param,
) -> c_int {
    let key = id as usize;
    // SAFETY: per the contract.
    let p = unsafe { read_param(param) };
    {
        let Ok(mut c) = cma() else {
            return -1;
        };
        let Some(s) = c.ids.get(&key) else {
            return err(libc::EINVAL);
        };
        if s.st != St::RouteResolved {
            return err(libc::EINVAL);
        }
        // SAFETY: a live id of the state.
        let cm = unsafe { &*(key as *const CmId) };
        let d = s.dev.expect("resolved");
        if !valid_param(cm, &c.devs[d], p.as_ref()) {
            return err(libc::EINVAL);
        }
        let psn = (c.random() & 0xff_ffff) as u32;
        let dev = &c.devs[d];
        let s = &c.ids[&key];
        let mut private = request_private(cm, s, p.as_ref().map_or(&[], |p| &p.private));
        if !s.ud {
            // After the program's bytes, if it left the room (see `ferroce_verbs::cm::Offer`).
            // Its QP cannot be past INIT before the REP names the peer's: it may switch.
            crate::schemes::my_offer(true).append_to(&mut private, private_len::REQ);
        }
        let peer = s.peer.expect("resolved");
        let svc = service_id(ps_of(cm), s.dst.map_or(0, |a| a.port()));
        let res = if s.ud {
            dev.cm.sidr_request(peer, svc, &private)
        } else {
            let initiator_depth = match &p {
                Some(p) if p.initiator_depth != 0xff => p.initiator_depth,
                _ => dev.max_initiator_depth,
            };
            let responder_resources = match &p {
                Some(p) if p.responder_resources != 0xff => p.responder_resources,
                _ => dev.max_responder_resources,
            };
            let (qpn, srq) = qp_of(cm, p.as_ref());
            let (retry_count, rnr_retry_count) = p
                .as_ref()
                .map_or((7, 7), |p| (p.retry_count, p.rnr_retry_count));
            let src = s.src.expect("resolved").ip();
            let params = ConnectParams {
                service_id: svc,
                qpn,
                psn,
                responder_resources,
                initiator_depth,
                retry_count: retry_count.min(7),
                rnr_retry_count: rnr_retry_count.min(7),
                path_mtu: s.path_mtu,
                transport_service_type: u8::from(cm.id.qp_type == ffi::IBV_QPT_UC),
                srq,
                path: CmPath {
                    local_lid: 0xffff,
                    remote_lid: 0xffff,
                    local_gid: gid_of(src),
                    remote_gid: peer.gid,
                    hop_limit: 64,
                    traffic_class: s.tos,
                    local_ack_timeout: s.ack_timeout,
                    ..CmPath::default()
                },
                response_timeout: 20,
                max_cm_retries: 15,
                private_data: private,
            };
            let r = dev.cm.connect(peer, &params);
            flushed(&dev.cm);
            if r.is_ok() {
                let s = c.ids.get_mut(&key).expect("checked");
                s.responder_resources = responder_resources;
                s.initiator_depth = initiator_depth;
                s.retry_count = params.retry_count;
                s.qpn = qpn;
            }
            r
        };
        super::cm_trace!("connect id {key:#x}: {res:?}");
        match res {
            Ok(conn) => {
                c.conns.insert((d, conn), key);
                let s = c.ids.get_mut(&key).expect("checked");
                s.conn = Some(conn);
                s.psn = psn;
                s.st = St::Connect;
                s.connect_blob.clear();
            }
            Err(e) => return err(cm_errno(e)),
        }
    }
    // SAFETY: per the contract.
    unsafe { complete(id) }
}

/// `rdma_accept`: moves the id's QP to RTS with the request's numbers and answers with a
/// REP (a SIDR_REP with the QP and Q_Key for a UD id); a synchronous id waits for the RTU.
///
/// # Safety
/// `id` is a live id; `param` is null or valid.
#[no_mangle]
pub unsafe extern "C" fn ferroce_rdma_accept(
    id: *mut ffi::rdma_cm_id,
    param: *mut ffi::rdma_conn_param,
) -> c_int {
    let key = id as usize;
    // SAFETY: per the contract.
    let p = unsafe { read_param(param) };
    {
        let Ok(mut c) = cma() else {
            return -1;
        };
        let Some(s) = c.ids.get(&key) else {
            return err(libc::EINVAL);
        };
        if s.st != St::Request {
            return err(libc::EINVAL);
        }
        let (d, conn, ud) = (s.dev.expect("requests have a device"), s.conn, s.ud);
        let conn = conn.expect("requests have a connection");
        // SAFETY: a live id of the state.
        let cm = unsafe { &mut *(key as *mut CmId) };
        let (qpn, srq) = qp_of(cm, p.as_ref());
        let mut private = p.as_ref().map_or(Vec::new(), |p| p.private.clone());
        if ud {
            // librdmacm's Q_Key for every UD id.
            let r = c.devs[d].cm.sidr_reply(conn, 0, qpn, UDP_QKEY, &private);
            if let Err(e) = r {
                return err(cm_errno(e));
            }
            flushed(&c.devs[d].cm);
            c.ids.get_mut(&key).expect("checked").st = St::Connected;
            if s_sync(&c, key) && !cm.id.event.is_null() {
                // SAFETY: the id's kept event.
                unsafe { super::event::ferroce_rdma_ack_cm_event(cm.id.event) };
                cm.id.event = std::ptr::null_mut();
            }
            return 0;
        }
        let dev = &c.devs[d];
        if !valid_param(cm, dev, p.as_ref()) {
            return err(libc::EINVAL);
        }
        let (max_init, max_resp) = (dev.max_initiator_depth, dev.max_responder_resources);
        let ctx = dev.ctx;
        let s = c.ids.get_mut(&key).expect("checked");
        // Chosen when the request's id was made (the kernel's `seq_num`), so a program that
        // moved its own QP to RTS with `rdma_init_qp_attr` before accepting sends from it.
        let psn = s.psn;
        s.initiator_depth = match &p {
            Some(p) if p.initiator_depth != 0xff => p.initiator_depth,
            _ => s.initiator_depth.min(max_init),
        };
        s.responder_resources = match &p {
            Some(p) if p.responder_resources != 0xff => p.responder_resources,
            _ => s.responder_resources.min(max_resp),
        };
        s.qpn = qpn;
        // A peer that offered ferroce's schemes gets this end's offer in the REP and what
        // both offer; one that offered nothing (a kernel CM) gets a plain IBTA connection.
        // Selective repeat only for a QP still in INIT: one the program moved on itself
        // (`rdma_init_qp_attr` before accepting) or one the CM does not hold keeps Go-Back-N.
        // SAFETY: the id's QP, if any, is a live QP of this library.
        let can_switch = unsafe { cm.id.qp.as_ref() }.is_some_and(|q| q.state <= ffi::IBV_QPS_INIT);
        let mine = crate::schemes::my_offer(can_switch);
        if s.peer_offer.is_some() {
            mine.append_to(&mut private, private_len::REP);
        }
        let peer = crate::schemes::Peer::agreed(&mine, s.peer_offer.as_ref());
        crate::schemes::set_peer(ctx, qpn, peer);
        if let Err(e) = super::qp::to_rts(&c, key) {
            super::qp::to_err(cm);
            return err(e);
        }
        let s = &c.ids[&key];
        let ap = AcceptParams {
            qpn,
            psn,
            responder_resources: s.responder_resources,
            initiator_depth: s.initiator_depth,
            rnr_retry_count: p.as_ref().map_or(7, |p| p.rnr_retry_count.min(7)),
            srq,
            private_data: private,
        };
        if let Err(e) = c.devs[d].cm.accept(conn, &ap) {
            super::qp::to_err(cm);
            return err(cm_errno(e));
        }
        flushed(&c.devs[d].cm);
        c.ids.get_mut(&key).expect("checked").st = St::Accepted;
    }
    // SAFETY: per the contract.
    unsafe { complete(id) }
}

fn s_sync(c: &Cma, key: usize) -> bool {
    c.ids.get(&key).is_some_and(|s| s.sync)
}

/// Refuses a request (or a reply an id without a QP took) with `why`.
fn reject_with(id: *mut ffi::rdma_cm_id, data: *const c_void, len: u8, why: u16) -> c_int {
    let key = id as usize;
    let Ok(mut c) = cma() else {
        return -1;
    };
    let Some(s) = c.ids.get(&key) else {
        return err(libc::EINVAL);
    };
    let (Some(d), Some(conn)) = (s.dev, s.conn) else {
        return err(libc::EINVAL);
    };
    if !matches!(s.st, St::Request | St::Response) {
        return err(libc::EINVAL);
    }
    let private = if data.is_null() || len == 0 {
        Vec::new()
    } else {
        // SAFETY: the caller's contract: `len` readable bytes.
        unsafe { std::slice::from_raw_parts(data as *const u8, len.into()) }.to_vec()
    };
    let ud = s.ud;
    let cm = &c.devs[d].cm;
    let r = if ud {
        cm.sidr_reply(conn, 1, 0, 0, &private)
    } else {
        cm.reject(conn, why, &private)
    };
    if let Err(e) = r {
        return err(cm_errno(e));
    }
    flushed(cm);
    c.ids.get_mut(&key).expect("checked").st = St::Disconnected;
    0
}

/// `rdma_reject`.
///
/// # Safety
/// `id` is a live id; `data` is null or `len` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn ferroce_rdma_reject(
    id: *mut ffi::rdma_cm_id,
    data: *const c_void,
    len: u8,
) -> c_int {
    reject_with(id, data, len, reason::CONSUMER_REJECT)
}

/// `rdma_reject_ece`: a REJ with reason 35 (vendor option not supported).
///
/// # Safety
/// As [`ferroce_rdma_reject`].
#[no_mangle]
pub unsafe extern "C" fn ferroce_rdma_reject_ece(
    id: *mut ffi::rdma_cm_id,
    data: *const c_void,
    len: u8,
) -> c_int {
    reject_with(id, data, len, 35)
}

/// `rdma_disconnect`: the QP to the error state (its work flushes) and a DREQ; a
/// synchronous id waits for `DISCONNECTED`.
///
/// # Safety
/// `id` is a live id.
#[no_mangle]
pub unsafe extern "C" fn ferroce_rdma_disconnect(id: *mut ffi::rdma_cm_id) -> c_int {
    super::cm_trace!("disconnect id {:#x}", id as usize);
    let key = id as usize;
    let wait = {
        let Ok(mut c) = cma() else {
            return -1;
        };
        let Some(s) = c.ids.get(&key) else {
            return err(libc::EINVAL);
        };
        // SAFETY: a live id of the state.
        let cm = unsafe { &mut *(key as *mut CmId) };
        if cm.id.verbs.is_null() {
            return err(libc::EINVAL);
        }
        super::qp::to_err(cm);
        let (Some(d), Some(conn)) = (s.dev, s.conn) else {
            return err(libc::EINVAL);
        };
        let sent = !s.ud
            && matches!(
                s.st,
                St::Connect | St::Accepted | St::Response | St::Connected
            )
            && c.devs[d].cm.disconnect(conn, &[]).is_ok();
        flushed(&c.devs[d].cm);
        // SAFETY: the id's channel outlives it.
        let queued = unsafe { Channel::from_ptr(cm.id.channel) }.is_some_and(|ch| ch.has_for(key));
        if sent {
            c.ids.get_mut(&key).expect("checked").st = St::Disconnected;
        }
        sent || queued
    };
    if wait {
        // SAFETY: per the contract.
        unsafe { complete(id) }
    } else {
        0
    }
}

/// `rdma_establish`: the RTU for an id that took a REP without a QP on it.
///
/// # Safety
/// `id` is a live id.
#[no_mangle]
pub unsafe extern "C" fn ferroce_rdma_establish(id: *mut ffi::rdma_cm_id) -> c_int {
    let key = id as usize;
    let Ok(mut c) = cma() else {
        return -1;
    };
    // SAFETY: per the contract.
    if !unsafe { (*id).qp }.is_null() {
        return err(libc::EINVAL);
    }
    let Some(s) = c.ids.get(&key) else {
        return err(libc::EINVAL);
    };
    let (Some(d), Some(conn), St::Response) = (s.dev, s.conn, s.st) else {
        return err(libc::EINVAL);
    };
    if let Err(e) = c.devs[d].cm.ready_to_use(conn, &[]) {
        return err(cm_errno(e));
    }
    flushed(&c.devs[d].cm);
    c.ids.get_mut(&key).expect("checked").st = St::Connected;
    0
}

/// `rdma_set_option`: the id options rdma_cm has (type of service, reuse of addresses,
/// IPv6 only, ACK timeout); an IB path record is not taken (`ENOSYS`, as a kernel without
/// it).
///
/// # Safety
/// `id` is a live id; `val` points to `len` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn ferroce_rdma_set_option(
    id: *mut ffi::rdma_cm_id,
    level: c_int,
    name: c_int,
    val: *mut c_void,
    len: usize,
) -> c_int {
    let Ok(mut c) = cma() else {
        return -1;
    };
    let Some(s) = c.ids.get_mut(&(id as usize)) else {
        return err(libc::EINVAL);
    };
    if val.is_null() || len == 0 {
        return err(libc::EINVAL);
    }
    // SAFETY: per the contract, at least one byte is readable.
    let byte = unsafe { *(val as *const u8) };
    match (level as u32, name as u32) {
        (ffi::RDMA_OPTION_ID, ffi::RDMA_OPTION_ID_TOS) => s.tos = byte,
        (ffi::RDMA_OPTION_ID, ffi::RDMA_OPTION_ID_ACK_TIMEOUT) => s.ack_timeout = byte.min(31),
        (ffi::RDMA_OPTION_ID, ffi::RDMA_OPTION_ID_REUSEADDR | ffi::RDMA_OPTION_ID_AFONLY) => {}
        _ => return err(libc::ENOSYS),
    }
    0
}

/// `rdma_migrate_id`: moves the id (and its queued events) to another channel, or to a
/// channel of its own (null: the id becomes synchronous).
///
/// # Safety
/// `id` is a live id; `channel` is null or a live channel.
#[no_mangle]
pub unsafe extern "C" fn ferroce_rdma_migrate_id(
    id: *mut ffi::rdma_cm_id,
    channel: *mut ffi::rdma_event_channel,
) -> c_int {
    let key = id as usize;
    let Ok(mut c) = cma() else {
        return -1;
    };
    let Some(s) = c.ids.get_mut(&key) else {
        return err(libc::EINVAL);
    };
    if s.sync && channel.is_null() {
        return err(libc::EINVAL);
    }
    let sync = channel.is_null();
    let channel = if sync { Channel::create() } else { channel };
    if channel.is_null() {
        return -1;
    }
    // SAFETY: a live id of the state.
    let cm = unsafe { &mut *(key as *mut CmId) };
    let old = cm.id.channel;
    // SAFETY: both channels are live.
    let moved = unsafe { Channel::from_ptr(old) }.map(|o| o.take_for(key));
    // SAFETY: as above.
    let new = unsafe { Channel::from_ptr(channel) }.expect("live");
    for p in moved.into_iter().flatten() {
        new.push(p);
    }
    if s.sync {
        if !cm.id.event.is_null() {
            // SAFETY: the id's kept event.
            unsafe { super::event::ferroce_rdma_ack_cm_event(cm.id.event) };
            cm.id.event = std::ptr::null_mut();
        }
        // SAFETY: the id's own channel, now unused.
        unsafe { Channel::destroy(old) };
    }
    cm.id.channel = channel;
    s.sync = sync;
    0
}

/// `rdma_notify`: the program saw its QP's first completion. The CM needs nothing of it
/// (the RTU, or traffic, settles the passive side), so it succeeds for a connected id.
///
/// # Safety
/// `id` is a live id.
#[no_mangle]
pub unsafe extern "C" fn ferroce_rdma_notify(id: *mut ffi::rdma_cm_id, _event: c_int) -> c_int {
    let Ok(c) = cma() else {
        return -1;
    };
    match c.ids.get(&(id as usize)) {
        Some(s) if s.conn.is_some() => 0,
        Some(_) => err(libc::EINVAL),
        None => err(libc::EINVAL),
    }
}

/// The port of an id's address, network order.
///
/// # Safety
/// `sa` is the id's address storage.
unsafe fn port_of(sa: *const libc::sockaddr) -> u16 {
    // SAFETY: per the contract.
    unsafe { read_sockaddr(sa) }.map_or(0, |a| a.port().to_be())
}

/// `rdma_get_src_port` (network order).
///
/// # Safety
/// `id` is a live id.
#[no_mangle]
pub unsafe extern "C" fn ferroce_rdma_get_src_port(id: *mut ffi::rdma_cm_id) -> u16 {
    // SAFETY: per the contract; the union's storage member is the whole address.
    unsafe {
        let a = &(*id).route.addr.__bindgen_anon_1.src_storage;
        port_of(a as *const ffi::sockaddr_storage as *const libc::sockaddr)
    }
}

/// `rdma_get_dst_port` (network order).
///
/// # Safety
/// `id` is a live id.
#[no_mangle]
pub unsafe extern "C" fn ferroce_rdma_get_dst_port(id: *mut ffi::rdma_cm_id) -> u16 {
    // SAFETY: as above.
    unsafe {
        let a = &(*id).route.addr.__bindgen_anon_2.dst_storage;
        port_of(a as *const ffi::sockaddr_storage as *const libc::sockaddr)
    }
}

/// `rdma_get_devices`: the contexts ids are made on, NULL-terminated (free with
/// `rdma_free_devices`).
///
/// # Safety
/// `num` is null or points to an `int`.
#[no_mangle]
pub unsafe extern "C" fn ferroce_rdma_get_devices(num: *mut c_int) -> *mut *mut ffi::ibv_context {
    let list: Vec<*mut ffi::ibv_context> = match cma() {
        Ok(c) => c.devs.iter().map(|d| d.ctx).collect(),
        Err(_) => Vec::new(),
    };
    // SAFETY: calloc of n+1 pointers, checked for null.
    let arr = unsafe { libc::calloc(list.len() + 1, size_of::<*mut ffi::ibv_context>()) }
        as *mut *mut ffi::ibv_context;
    if arr.is_null() {
        return arr;
    }
    for (i, &p) in list.iter().enumerate() {
        // SAFETY: within the n+1 allocated.
        unsafe { arr.add(i).write(p) };
    }
    if !num.is_null() {
        // SAFETY: per the contract.
        unsafe { num.write(list.len() as c_int) };
    }
    arr
}

/// `rdma_free_devices`.
///
/// # Safety
/// `list` came from `rdma_get_devices`.
#[no_mangle]
pub unsafe extern "C" fn ferroce_rdma_free_devices(list: *mut *mut ffi::ibv_context) {
    // SAFETY: per the contract, a calloc'd array.
    unsafe { libc::free(list as *mut c_void) };
}
