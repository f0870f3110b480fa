//! Shared receive queues: create (basic and extended), query, modify (size, limit),
//! destroy. Crossing an armed limit raises `IBV_EVENT_SRQ_LIMIT_REACHED` (see
//! [`crate::events`]). Tag matching SRQs (`IBV_SRQT_TM`) hold tagged buffers besides their
//! receives, manipulated by `ibv_post_srq_ops` and completed on the SRQ's CQ (see
//! `ferroce_stack::transport::tm`); XRC SRQs are not offered (`EOPNOTSUPP`).

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicU32, Ordering};

use ferroce_verbs::SharedReceiveQueue;

use crate::context::context;
use crate::context::owner;
use crate::device::set_errno;
use crate::domain::Pd;
use crate::events::{Kind, Reported};
use crate::ffi;
use crate::objects::{destroy, init_sync, object, publish};

/// A shared receive queue.
#[repr(C)]
pub struct Srq {
    pub(crate) ibv: ffi::ibv_srq,
    pub(crate) srq: SharedReceiveQueue,
    /// Asynchronous events that named it and were taken.
    pub(crate) async_reported: Reported,
    /// QPs using it (it cannot be destroyed while any does).
    pub(crate) users: AtomicU32,
    /// A tag matching SRQ's CQ (its address; 0 for others), which it keeps from going.
    tm_cq: usize,
}

/// Tagged buffers a tag matching SRQ holds at most, operations outstanding, elements per
/// tagged buffer, and the largest rendezvous request (`tm_caps`, as mlx5 reports them).
pub(crate) const TM_MAX_TAGS: u32 = 127;
pub(crate) const TM_MAX_OPS: u32 = 1 << 15;
pub(crate) const TM_MAX_SGE: u32 = 1;
pub(crate) const TM_MAX_RNDV_HDR: u32 = 64;

/// The tag matching capabilities of `ibv_query_device_ex`.
pub(crate) fn tm_caps() -> ffi::ibv_tm_caps {
    ffi::ibv_tm_caps {
        max_rndv_hdr_size: TM_MAX_RNDV_HDR,
        max_num_tags: TM_MAX_TAGS,
        flags: ffi::IBV_TM_CAP_RC,
        max_ops: TM_MAX_OPS,
        max_sge: TM_MAX_SGE,
    }
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
    tm: Option<(u32, *mut ffi::ibv_cq)>,
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
    let tm_cq = tm.map_or(0, |(_, cq)| cq as usize);
    let srq = match tm {
        None => {
            p.pd.try_create_srq(max_wr, max_sge)
                .map_err(|e| crate::service::errno(&e))?
        }
        Some((max_tags, cq)) => {
            // SAFETY: null or a live CQ, per the callers' contracts.
            let cq = unsafe { object::<crate::cq::Cq, _>(cq) }.ok_or(libc::EINVAL)?;
            if cq.ibv.context != p.ibv.context || max_tags > TM_MAX_TAGS {
                return Err(libc::EINVAL);
            }
            cq.users.fetch_add(1, Ordering::AcqRel);
            p.pd.create_tm_srq(max_wr, max_sge, max_tags.max(1), &cq.cq)
        }
    };
    let id = srq.id();
    // SAFETY: a live PD.
    unsafe { crate::domain::hold_pd(pd) };
    let reported = Reported::default();
    let ptr: *mut ffi::ibv_srq = publish(Srq {
        ibv,
        srq,
        async_reported: reported.clone(),
        users: AtomicU32::new(0),
        tm_cq,
    });
    c.events
        .register(Kind::Srq, id, ptr as *mut c_void, reported);
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
    match create(pd, a.srq_context, &mut a.attr, None) {
        Ok(p) => p,
        Err(e) => {
            set_errno(e);
            std::ptr::null_mut()
        }
    }
}
symver!(ferroce_ibv_create_srq => "ibv_create_srq" @ "IBVERBS_1.1");

/// `verbs_context.create_srq_ex` (the header's `ibv_create_srq_ex`): a basic SRQ on the PD
/// given, or a tag matching one (`IBV_SRQT_TM` with `IBV_SRQ_INIT_ATTR_TM` and its CQ);
/// XRC SRQs are `EOPNOTSUPP`.
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
    let srq_type = if a.comp_mask & ffi::IBV_SRQ_INIT_ATTR_TYPE != 0 {
        a.srq_type
    } else {
        ffi::IBV_SRQT_BASIC
    };
    let tm = match srq_type {
        ffi::IBV_SRQT_BASIC => None,
        ffi::IBV_SRQT_TM => {
            let need = ffi::IBV_SRQ_INIT_ATTR_TM | ffi::IBV_SRQ_INIT_ATTR_CQ;
            if a.comp_mask & need != need || a.tm_cap.max_ops > TM_MAX_OPS {
                set_errno(libc::EINVAL);
                return std::ptr::null_mut();
            }
            Some((a.tm_cap.max_num_tags, a.cq))
        }
        _ => {
            set_errno(libc::EOPNOTSUPP);
            return std::ptr::null_mut();
        }
    };
    match create(a.pd, a.srq_context, &mut a.attr, tm) {
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
    // SAFETY: the SRQ's PD and CQ outlive it.
    unsafe {
        crate::domain::release_pd(s.ibv.pd);
        if s.tm_cq != 0 {
            crate::cq::cq_of(s.tm_cq as *mut ffi::ibv_cq)
                .users
                .fetch_sub(1, Ordering::AcqRel);
        }
    }
    // SAFETY: per the contract.
    drop(unsafe { destroy::<Srq, _>(srq) });
    0
}
symver!(ferroce_ibv_destroy_srq => "ibv_destroy_srq" @ "IBVERBS_1.1");

/// `verbs_context.post_srq_ops` (the header's `ibv_post_srq_ops`): tag list operations on a
/// tag matching SRQ, in order; an add writes its handle into the WR. The first refused is
/// returned in `bad_wr`: a full list is `ENOMEM`, a bad opcode, element count or an SRQ
/// without tag matching `EINVAL`.
pub(crate) unsafe extern "C" fn post_srq_ops(
    srq: *mut ffi::ibv_srq,
    wr: *mut ffi::ibv_ops_wr,
    bad: *mut *mut ffi::ibv_ops_wr,
) -> c_int {
    // SAFETY: the inline wrapper passes the program's SRQ.
    let Some(s) = (unsafe { object::<Srq, _>(srq) }) else {
        return libc::EINVAL;
    };
    let mut cur = wr;
    // SAFETY: the program's list of WRs, each valid until this returns.
    while let Some(w) = unsafe { cur.as_mut() } {
        // SAFETY: as above; the gather list is the program's.
        let r = unsafe { post_op(s, w) };
        if let Err(e) = r {
            if !bad.is_null() {
                // SAFETY: the program's out-pointer.
                unsafe { *bad = cur };
            }
            return e;
        }
        cur = w.next;
    }
    0
}

/// One tag list operation.
///
/// # Safety
/// `w`'s gather list holds `num_sge` elements.
unsafe fn post_op(s: &Srq, w: &mut ffi::ibv_ops_wr) -> Result<(), c_int> {
    if s.tm_cq == 0 {
        return Err(libc::EINVAL);
    }
    let signaled = w.flags & ffi::IBV_OPS_SIGNALED as c_int != 0;
    let unexpected = (w.flags & ffi::IBV_OPS_TM_SYNC as c_int != 0).then_some(w.tm.unexpected_cnt);
    let mut list = [ferroce_verbs::Sge::default(); TM_MAX_SGE as usize];
    let op = match w.opcode {
        ffi::IBV_WR_TAG_ADD => {
            let a = w.tm.add;
            let n = usize::try_from(a.num_sge).map_err(|_| libc::EINVAL)?;
            if n > list.len() || (n > 0 && a.sg_list.is_null()) {
                return Err(libc::EINVAL);
            }
            for (i, slot) in list.iter_mut().enumerate().take(n) {
                // SAFETY: `i < n` elements, per the contract.
                let e = unsafe { &*a.sg_list.add(i) };
                *slot = ferroce_verbs::Sge {
                    addr: e.addr,
                    length: e.length,
                    lkey: e.lkey,
                };
            }
            ferroce_verbs::TagOp::Add {
                wr_id: w.wr_id,
                unexpected,
                tag: a.tag,
                mask: a.mask,
                recv_wr_id: a.recv_wr_id,
                sg_list: &list[..n],
                signaled,
            }
        }
        ffi::IBV_WR_TAG_DEL => ferroce_verbs::TagOp::Del {
            wr_id: w.wr_id,
            unexpected,
            handle: w.tm.handle,
            signaled,
        },
        ffi::IBV_WR_TAG_SYNC => ferroce_verbs::TagOp::Sync {
            wr_id: w.wr_id,
            unexpected: w.tm.unexpected_cnt,
            signaled,
        },
        _ => return Err(libc::EINVAL),
    };
    match s.srq.post_tag_op(&op) {
        Ok(handle) => {
            if w.opcode == ffi::IBV_WR_TAG_ADD {
                w.tm.handle = handle;
            }
            Ok(())
        }
        Err(ferroce_verbs::PostError::QueueFull(_)) => Err(libc::ENOMEM),
        Err(_) => Err(libc::EINVAL),
    }
}
