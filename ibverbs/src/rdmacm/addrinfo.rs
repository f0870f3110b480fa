//! The synchronous, socket-like side of librdmacm: `rdma_getaddrinfo` and
//! `rdma_freeaddrinfo`, `rdma_create_ep` / `rdma_destroy_ep`, `rdma_get_request`.

use std::ffi::{c_char, c_int, c_void};

use super::id::{
    create_id, ferroce_rdma_bind_addr, ferroce_rdma_destroy_id, ferroce_rdma_resolve_addr,
    ferroce_rdma_resolve_route,
};
use super::qp::{ferroce_rdma_create_qp, ferroce_rdma_destroy_qp, ferroce_rdma_destroy_srq};
use super::{cma, err, CmId};
use crate::ffi;

/// A copy of `len` bytes of an address, malloc'd (freed by `rdma_freeaddrinfo`).
///
/// # Safety
/// `src` points to `len` readable bytes.
unsafe fn copy_addr(src: *const libc::sockaddr, len: libc::socklen_t) -> *mut ffi::sockaddr {
    // SAFETY: malloc of `len` bytes, checked; then a copy of `len` readable bytes.
    unsafe {
        let p = libc::malloc(len as usize);
        if !p.is_null() {
            std::ptr::copy_nonoverlapping(src as *const u8, p as *mut u8, len as usize);
        }
        p as *mut ffi::sockaddr
    }
}

/// `rdma_getaddrinfo`: `getaddrinfo` for the node and service, as librdmacm maps it (a
/// passive lookup gives the source address, an active one the destination; the QP type and
/// port space follow the socket type and protocol unless the hints set them). Returns 0, or
/// -1 with `errno`, or `getaddrinfo`'s error code.
///
/// # Safety
/// `node` and `service` are null or C strings; `hints` is null or valid; `res` points to
/// writable storage for a pointer.
#[no_mangle]
pub unsafe extern "C" fn ferroce_rdma_getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const ffi::rdma_addrinfo,
    res: *mut *mut ffi::rdma_addrinfo,
) -> c_int {
    if (node.is_null() && service.is_null() && hints.is_null()) || res.is_null() {
        return err(libc::EINVAL);
    }
    // SAFETY: per the contract.
    let h = unsafe { hints.as_ref() }.copied().unwrap_or_default();
    if h.ai_flags & 0x10 != 0 {
        // RAI_SA: an IB subnet administrator query.
        return err(libc::EOPNOTSUPP);
    }
    // SAFETY: calloc of one structure, checked.
    let rai =
        unsafe { libc::calloc(1, size_of::<ffi::rdma_addrinfo>()) } as *mut ffi::rdma_addrinfo;
    if rai.is_null() {
        return err(libc::ENOMEM);
    }
    // SAFETY: just allocated, zeroed.
    let r = unsafe { &mut *rai };
    if !node.is_null() || !service.is_null() {
        let mut ai_hints: libc::addrinfo = unsafe { std::mem::zeroed() };
        if h.ai_flags & ffi::RAI_PASSIVE as c_int != 0 {
            ai_hints.ai_flags = libc::AI_PASSIVE;
        }
        if h.ai_flags & ffi::RAI_NUMERICHOST as c_int != 0 {
            ai_hints.ai_flags |= libc::AI_NUMERICHOST;
        }
        ai_hints.ai_family = h.ai_family;
        ai_hints.ai_socktype = match h.ai_qp_type as u32 {
            ffi::IBV_QPT_RC | ffi::IBV_QPT_UC => libc::SOCK_STREAM,
            ffi::IBV_QPT_UD => libc::SOCK_DGRAM,
            _ => 0,
        };
        ai_hints.ai_protocol = match h.ai_port_space as u32 {
            ffi::RDMA_PS_TCP => libc::IPPROTO_TCP,
            ffi::RDMA_PS_UDP | ffi::RDMA_PS_IPOIB => libc::IPPROTO_UDP,
            _ => 0,
        };
        let mut ai: *mut libc::addrinfo = std::ptr::null_mut();
        // SAFETY: C strings per the contract, hints on the stack, result pointer.
        let ret = unsafe {
            libc::getaddrinfo(
                node,
                service,
                if hints.is_null() {
                    std::ptr::null()
                } else {
                    &ai_hints
                },
                &mut ai,
            )
        };
        if ret != 0 {
            // SAFETY: ours, allocated above.
            unsafe { libc::free(rai as *mut c_void) };
            return ret;
        }
        // SAFETY: a successful getaddrinfo's first entry.
        let a = unsafe { &*ai };
        r.ai_qp_type = if h.ai_qp_type != 0 {
            h.ai_qp_type
        } else if a.ai_socktype == libc::SOCK_DGRAM {
            ffi::IBV_QPT_UD as c_int
        } else {
            ffi::IBV_QPT_RC as c_int
        };
        r.ai_port_space = if h.ai_port_space != 0 {
            h.ai_port_space
        } else if a.ai_protocol == libc::IPPROTO_UDP {
            ffi::RDMA_PS_UDP as c_int
        } else {
            ffi::RDMA_PS_TCP as c_int
        };
        r.ai_family = a.ai_family;
        if a.ai_flags & libc::AI_PASSIVE != 0 || h.ai_flags & ffi::RAI_PASSIVE as c_int != 0 {
            r.ai_flags = ffi::RAI_PASSIVE as c_int;
            r.ai_src_len = a.ai_addrlen;
            // SAFETY: the entry's address of `ai_addrlen` bytes.
            r.ai_src_addr = unsafe { copy_addr(a.ai_addr, a.ai_addrlen) };
        } else {
            r.ai_dst_len = a.ai_addrlen;
            // SAFETY: as above.
            r.ai_dst_addr = unsafe { copy_addr(a.ai_addr, a.ai_addrlen) };
        }
        // SAFETY: the list getaddrinfo returned.
        unsafe { libc::freeaddrinfo(ai) };
    } else {
        r.ai_flags = h.ai_flags;
        r.ai_family = h.ai_family;
        r.ai_qp_type = h.ai_qp_type;
        r.ai_port_space = h.ai_port_space;
        if h.ai_dst_len > 0 && !h.ai_dst_addr.is_null() {
            r.ai_dst_len = h.ai_dst_len;
            // SAFETY: the hints' address of `ai_dst_len` bytes.
            r.ai_dst_addr =
                unsafe { copy_addr(h.ai_dst_addr as *const libc::sockaddr, h.ai_dst_len) };
        }
    }
    if r.ai_src_len == 0 && h.ai_src_len > 0 && !h.ai_src_addr.is_null() {
        r.ai_src_len = h.ai_src_len;
        // SAFETY: the hints' address of `ai_src_len` bytes.
        r.ai_src_addr = unsafe { copy_addr(h.ai_src_addr as *const libc::sockaddr, h.ai_src_len) };
    }
    // SAFETY: per the contract.
    unsafe { res.write(rai) };
    0
}

/// `rdma_freeaddrinfo`.
///
/// # Safety
/// `res` is null or a list from `rdma_getaddrinfo`.
#[no_mangle]
pub unsafe extern "C" fn ferroce_rdma_freeaddrinfo(mut res: *mut ffi::rdma_addrinfo) {
    while !res.is_null() {
        // SAFETY: per the contract, every pointer in the entry is malloc'd or null.
        unsafe {
            let r = &*res;
            let next = r.ai_next;
            for p in [
                r.ai_connect,
                r.ai_route,
                r.ai_src_canonname as *mut c_void,
                r.ai_dst_canonname as *mut c_void,
                r.ai_src_addr as *mut c_void,
                r.ai_dst_addr as *mut c_void,
            ] {
                libc::free(p);
            }
            libc::free(res as *mut c_void);
            res = next;
        }
    }
}

/// `rdma_create_ep`: a synchronous id from `rdma_getaddrinfo`'s result: bound (passive,
/// with the QP attributes kept for each request), or with its address and route resolved
/// and a QP made (active).
///
/// # Safety
/// `id` points to writable storage for a pointer; `res` is valid; `pd` is null or a PD;
/// `qp_init_attr` is null or valid.
#[no_mangle]
pub unsafe extern "C" fn ferroce_rdma_create_ep(
    id: *mut *mut ffi::rdma_cm_id,
    res: *mut ffi::rdma_addrinfo,
    pd: *mut ffi::ibv_pd,
    qp_init_attr: *mut ffi::ibv_qp_init_attr,
) -> c_int {
    // SAFETY: per the contract.
    let Some(r) = (unsafe { res.as_ref() }) else {
        return err(libc::EINVAL);
    };
    if id.is_null() {
        return err(libc::EINVAL);
    }
    let mut cm_id = std::ptr::null_mut();
    // SAFETY: a new synchronous id.
    let ret = unsafe {
        create_id(
            std::ptr::null_mut(),
            &mut cm_id,
            std::ptr::null_mut(),
            r.ai_port_space as ffi::rdma_port_space,
            r.ai_qp_type as ffi::ibv_qp_type,
        )
    };
    if ret != 0 {
        return ret;
    }
    // SAFETY: the id just made.
    let ret = unsafe { make_ep(cm_id, r, pd, qp_init_attr) };
    if ret != 0 {
        let e = std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EINVAL);
        // SAFETY: the id just made, not yet the program's.
        unsafe { ferroce_rdma_destroy_ep(cm_id) };
        return err(e);
    }
    // SAFETY: per the contract.
    unsafe { id.write(cm_id) };
    0
}

/// The steps of `rdma_create_ep` after the id exists.
///
/// # Safety
/// As [`ferroce_rdma_create_ep`], with `cm_id` the new id.
unsafe fn make_ep(
    cm_id: *mut ffi::rdma_cm_id,
    r: &ffi::rdma_addrinfo,
    pd: *mut ffi::ibv_pd,
    qp_init_attr: *mut ffi::ibv_qp_init_attr,
) -> c_int {
    if r.ai_flags & ffi::RAI_PASSIVE as c_int != 0 {
        // SAFETY: the id, and the result's source address.
        let ret = unsafe { ferroce_rdma_bind_addr(cm_id, r.ai_src_addr as *mut libc::sockaddr) };
        if ret != 0 {
            return ret;
        }
        // SAFETY: the id just made.
        let cm = unsafe { &mut *(cm_id as *mut CmId) };
        if !pd.is_null() {
            cm.id.pd = pd;
        }
        // SAFETY: per the contract.
        if let Some(a) = unsafe { qp_init_attr.as_ref() } {
            let mut a = *a;
            a.qp_type = r.ai_qp_type as ffi::ibv_qp_type;
            let Ok(mut c) = cma() else {
                return -1;
            };
            if let Some(s) = c.ids.get_mut(&(cm_id as usize)) {
                s.qp_init_attr = Some(a);
            }
        }
        return 0;
    }
    // SAFETY: the id and the result's addresses.
    let ret = unsafe {
        ferroce_rdma_resolve_addr(
            cm_id,
            r.ai_src_addr as *mut libc::sockaddr,
            r.ai_dst_addr as *mut libc::sockaddr,
            2000,
        )
    };
    if ret != 0 {
        return ret;
    }
    // SAFETY: the id.
    let ret = unsafe { ferroce_rdma_resolve_route(cm_id, 2000) };
    if ret != 0 {
        return ret;
    }
    // SAFETY: per the contract.
    if let Some(a) = unsafe { qp_init_attr.as_mut() } {
        a.qp_type = r.ai_qp_type as ffi::ibv_qp_type;
        // SAFETY: the id, a PD or null, and the program's attributes.
        let ret = unsafe { ferroce_rdma_create_qp(cm_id, pd, a) };
        if ret != 0 {
            return ret;
        }
    }
    if r.ai_connect_len > 0 && !r.ai_connect.is_null() {
        // SAFETY: `ai_connect_len` readable bytes.
        let blob =
            unsafe { std::slice::from_raw_parts(r.ai_connect as *const u8, r.ai_connect_len) };
        let Ok(mut c) = cma() else {
            return -1;
        };
        if let Some(s) = c.ids.get_mut(&(cm_id as usize)) {
            s.connect_blob = blob.to_vec();
        }
    }
    0
}

/// `rdma_destroy_ep`: the id's QP, SRQ and the CQs made for them, then the id.
///
/// # Safety
/// `id` is a live id, not used again.
#[no_mangle]
pub unsafe extern "C" fn ferroce_rdma_destroy_ep(id: *mut ffi::rdma_cm_id) {
    if id.is_null() {
        return;
    }
    // SAFETY: per the contract.
    unsafe {
        if !(*id).qp.is_null() {
            ferroce_rdma_destroy_qp(id);
        }
        if !(*id).srq.is_null() {
            ferroce_rdma_destroy_srq(id);
        }
        ferroce_rdma_destroy_id(id);
    }
}

/// `rdma_get_request`: the next connection request of a synchronous listener, with a QP
/// made from the listener's attributes when `rdma_create_ep` was given some.
///
/// # Safety
/// `listen` is a live listening id; `id` points to writable storage for a pointer.
#[no_mangle]
pub unsafe extern "C" fn ferroce_rdma_get_request(
    listen: *mut ffi::rdma_cm_id,
    id: *mut *mut ffi::rdma_cm_id,
) -> c_int {
    let key = listen as usize;
    let attr = {
        let Ok(c) = cma() else {
            return -1;
        };
        match c.ids.get(&key) {
            Some(s) if s.sync => s.qp_init_attr,
            _ => return err(libc::EINVAL),
        }
    };
    // SAFETY: per the contract.
    let l = unsafe { &mut *listen };
    if !l.event.is_null() {
        // SAFETY: the listener's kept event.
        unsafe { super::event::ferroce_rdma_ack_cm_event(l.event) };
        l.event = std::ptr::null_mut();
    }
    let mut ev = std::ptr::null_mut();
    // SAFETY: the listener's own channel.
    if unsafe { super::event::ferroce_rdma_get_cm_event(l.channel, &mut ev) } != 0 {
        return -1;
    }
    // SAFETY: just returned.
    let e = unsafe { &*ev };
    let mut fail = |code| {
        l.event = ev;
        err(code)
    };
    if e.event == ffi::RDMA_CM_EVENT_REJECTED {
        return fail(libc::ECONNREFUSED);
    }
    if e.status != 0 {
        return fail(e.status.abs());
    }
    if e.event != ffi::RDMA_CM_EVENT_CONNECT_REQUEST {
        return fail(libc::EINVAL);
    }
    if let Some(mut a) = attr {
        // SAFETY: the request's new id, the listener's PD, attributes on the stack.
        if unsafe { ferroce_rdma_create_qp(e.id, l.pd, &mut a) } != 0 {
            let code = std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EINVAL);
            return fail(code);
        }
    }
    // SAFETY: per the contract; the request's id keeps its event, as librdmacm's does.
    unsafe {
        id.write(e.id);
        (*e.id).event = ev;
    }
    0
}
