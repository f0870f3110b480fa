//! Shared receive queues: create (basic and extended), query, modify (size, limit),
//! destroy. Crossing an armed limit raises `IBV_EVENT_SRQ_LIMIT_REACHED` (see
//! [`crate::events`]). XRC and tag-matching SRQs are not offered (`EOPNOTSUPP`).

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicU32, Ordering};

use ferroce_verbs::SharedReceiveQueue;

use crate::context::context;
use crate::device::set_errno;
use crate::events::{Kind, Reported};
use crate::ffi;
use crate::objects::{destroy, init_sync, object, owner, publish, Pd};

/// A shared receive queue.
#[repr(C)]
pub struct Srq {
    pub(crate) ibv: ffi::ibv_srq,
    pub(crate) srq: SharedReceiveQueue,
    /// Asynchronous events that named it and were taken.
    pub(crate) async_reported: Reported,
    /// QPs using it (it cannot be destroyed while any does).
    pub(crate) users: AtomicU32,
}

/// The SRQ of a live SRQ pointer.
///
/// # Safety
/// `srq` is a live SRQ of this library.
pub(crate) unsafe fn srq_of<'a>(srq: *mut ffi::ibv_srq) -> &'a Srq {
    // SAFETY: per the contract.
    unsafe { &*(srq as *const Srq) }
}

/// Makes an SRQ on PD `pd` with `attr` (written back with what was granted). Err holds
/// the errno.
fn create(
    pd: *mut ffi::ibv_pd,
    srq_context: *mut c_void,
    attr: &mut ffi::ibv_srq_attr,
) -> Result<*mut ffi::ibv_srq, c_int> {
    // SAFETY: null or a live PD, per the callers' contracts.
    let p = unsafe { object::<Pd, _>(pd) }.ok_or(libc::EINVAL)?;
    // SAFETY: PDs are made with a live context.
    let c = unsafe { owner(p.ibv.context) };
    let dev = c.verbs.query_device();
    if attr.max_wr > dev.max_qp_wr || attr.max_sge > dev.max_sge || attr.srq_limit > attr.max_wr {
        return Err(libc::EINVAL);
    }
    let max_wr = attr.max_wr.max(1);
    let max_sge = attr.max_sge.max(1);
    attr.max_wr = max_wr;
    attr.max_sge = max_sge;
    let mut ibv = ffi::ibv_srq {
        context: p.ibv.context,
        srq_context,
        pd,
        ..Default::default()
    };
    // SAFETY: fresh, unshared storage.
    unsafe { init_sync(&mut ibv.mutex, &mut ibv.cond) };
    let srq = p.pd.create_srq(max_wr, max_sge);
    let id = srq.id();
    // SAFETY: a live PD.
    unsafe { crate::objects::hold_pd(pd) };
    let ptr: *mut ffi::ibv_srq = publish(Srq {
        ibv,
        srq,
        async_reported: Reported::default(),
        users: AtomicU32::new(0),
    });
    c.events.register(Kind::Srq, id, ptr as *mut c_void);
    Ok(ptr)
}

/// `ibv_create_srq`; the attributes are written back with what was granted.
///
/// # Safety
/// `pd` is a live PD; `attr` points to a `struct ibv_srq_init_attr`.
#[no_mangle]
pub unsafe extern "C" fn ferroce_ibv_create_srq(
    pd: *mut ffi::ibv_pd,
    attr: *mut ffi::ibv_srq_init_attr,
) -> *mut ffi::ibv_srq {
    // SAFETY: per the contract.
    let Some(a) = (unsafe { attr.as_mut() }) else {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    };
    match create(pd, a.srq_context, &mut a.attr) {
        Ok(p) => p,
        Err(e) => {
            set_errno(e);
            std::ptr::null_mut()
        }
    }
}
symver!(ferroce_ibv_create_srq => "ibv_create_srq" @ "IBVERBS_1.1");

/// `verbs_context.create_srq_ex` (the header's `ibv_create_srq_ex`): a basic SRQ on the PD
/// given; XRC and tag-matching SRQs are `EOPNOTSUPP`.
pub(crate) unsafe extern "C" fn create_srq_ex(
    ctx: *mut ffi::ibv_context,
    attr: *mut ffi::ibv_srq_init_attr_ex,
) -> *mut ffi::ibv_srq {
    // SAFETY: the inline wrapper passes the program's context and attributes.
    let (Some(_), Some(a)) = (unsafe { context(ctx) }, unsafe { attr.as_mut() }) else {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    };
    let known = ffi::IBV_SRQ_INIT_ATTR_TYPE
        | ffi::IBV_SRQ_INIT_ATTR_PD
        | ffi::IBV_SRQ_INIT_ATTR_XRCD
        | ffi::IBV_SRQ_INIT_ATTR_CQ
        | ffi::IBV_SRQ_INIT_ATTR_TM;
    if a.comp_mask & !known != 0 || a.comp_mask & ffi::IBV_SRQ_INIT_ATTR_PD == 0 {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    }
    if a.comp_mask & ffi::IBV_SRQ_INIT_ATTR_TYPE != 0 && a.srq_type != ffi::IBV_SRQT_BASIC {
        set_errno(libc::EOPNOTSUPP);
        return std::ptr::null_mut();
    }
    match create(a.pd, a.srq_context, &mut a.attr) {
        Ok(p) => p,
        Err(e) => {
            set_errno(e);
            std::ptr::null_mut()
        }
    }
}

/// `verbs_context.get_srq_num`: only XRC SRQs have a number a peer names.
pub(crate) unsafe extern "C" fn get_srq_num(_srq: *mut ffi::ibv_srq, _num: *mut u32) -> c_int {
    libc::EOPNOTSUPP
}

/// `ibv_query_srq`.
///
/// # Safety
/// `srq` is a live SRQ; `attr` points to a `struct ibv_srq_attr`.
#[no_mangle]
pub unsafe extern "C" fn ferroce_ibv_query_srq(
    srq: *mut ffi::ibv_srq,
    attr: *mut ffi::ibv_srq_attr,
) -> c_int {
    // SAFETY: per the contract.
    let (Some(s), Some(a)) = (unsafe { object::<Srq, _>(srq) }, unsafe { attr.as_mut() }) else {
        return libc::EINVAL;
    };
    let (max_wr, max_sge, limit) = s.srq.query();
    a.max_wr = max_wr;
    a.max_sge = max_sge;
    a.srq_limit = limit;
    0
}
symver!(ferroce_ibv_query_srq => "ibv_query_srq" @ "IBVERBS_1.1");

/// `ibv_modify_srq`: `IBV_SRQ_MAX_WR` resizes (not below the receives waiting, not beyond
/// the device's maximum), `IBV_SRQ_LIMIT` arms the limit (not above the size; 0 disarms).
///
/// # Safety
/// `srq` is a live SRQ; `attr` points to a `struct ibv_srq_attr`.
#[no_mangle]
pub unsafe extern "C" fn ferroce_ibv_modify_srq(
    srq: *mut ffi::ibv_srq,
    attr: *mut ffi::ibv_srq_attr,
    mask: c_int,
) -> c_int {
    // SAFETY: per the contract.
    let (Some(s), Some(a)) = (unsafe { object::<Srq, _>(srq) }, unsafe { attr.as_ref() }) else {
        return libc::EINVAL;
    };
    let mask = mask as u32;
    if mask & !(ffi::IBV_SRQ_MAX_WR | ffi::IBV_SRQ_LIMIT) != 0 {
        return libc::EINVAL;
    }
    // SAFETY: SRQs are made with a live context.
    let max = unsafe { owner(s.ibv.context) }
        .verbs
        .query_device()
        .max_qp_wr;
    let max_wr = (mask & ffi::IBV_SRQ_MAX_WR != 0).then_some(a.max_wr);
    if max_wr.is_some_and(|m| m == 0 || m > max) {
        return libc::EINVAL;
    }
    let limit = (mask & ffi::IBV_SRQ_LIMIT != 0).then_some(a.srq_limit);
    match s.srq.modify(max_wr, limit) {
        Ok(()) => 0,
        Err(_) => libc::EINVAL,
    }
}
symver!(ferroce_ibv_modify_srq => "ibv_modify_srq" @ "IBVERBS_1.1");

/// `ibv_destroy_srq`: `EBUSY` while a QP uses it; waits until the program acknowledged every
/// asynchronous event it took for it.
///
/// # Safety
/// `srq` came from `ibv_create_srq` and is not used again.
#[no_mangle]
pub unsafe extern "C" fn ferroce_ibv_destroy_srq(srq: *mut ffi::ibv_srq) -> c_int {
    // SAFETY: per the contract.
    let Some(s) = (unsafe { object::<Srq, _>(srq) }) else {
        return libc::EINVAL;
    };
    if s.users.load(Ordering::Acquire) != 0 {
        return libc::EBUSY;
    }
    // SAFETY: SRQs are made with a live context.
    unsafe { owner(s.ibv.context) }
        .events
        .forget(Kind::Srq, s.srq.id());
    // SAFETY: the header's own fields, live until freed below.
    unsafe {
        let h = &mut *srq;
        s.async_reported
            .wait_acked(&mut h.mutex, &mut h.cond, &h.events_completed);
    }
    // SAFETY: the SRQ's PD outlives it.
    unsafe { crate::objects::release_pd(s.ibv.pd) };
    // SAFETY: per the contract.
    drop(unsafe { destroy::<Srq, _>(srq) });
    0
}
symver!(ferroce_ibv_destroy_srq => "ibv_destroy_srq" @ "IBVERBS_1.1");
