//! Memory windows (`ibv_alloc_mw`, `ibv_bind_mw`, `IBV_WR_BIND_MW`, `IBV_WR_LOCAL_INV`,
//! `ibv_wr_bind_mw`, `ibv_wr_local_inv`, and a peer's SEND_WITH_INV).
//!
//! A window opens a range of a region (registered with `IBV_ACCESS_MW_BIND`) to peers under
//! its own key and rights. A type 1 window is bound with `ibv_bind_mw`, which moves its key
//! to the next; a type 2 window is bound by a work request under the key the program chose
//! (the window's, new in its low eight bits), to the QP that bound it, and is invalidated
//! by key, locally or by a peer's SEND_WITH_INV. Binds and local invalidates run in the
//! engine in send queue order and complete as `IBV_WC_BIND_MW` / `IBV_WC_LOCAL_INV`; a
//! refused one completes with `IBV_WC_MW_BIND_ERR` and fails the QP. The responder checks a
//! window's range, rights and QP as it checks a region's (see ferroce-stack's `MrTable`).

use std::ffi::c_int;

use ferroce_stack::transport::{Access, SendFlags, SendWr, WindowBind};
use ferroce_verbs::MemoryWindow;

use crate::device::set_errno;
use crate::domain::{hold_pd, release_pd, Pd};
use crate::ffi;
use crate::objects::{free, object, publish};
use crate::qp::Qp;
use crate::wr::Bind;

/// The `ibv_wr_*` operations memory windows add (`IBV_QP_EX_WITH_BIND_MW`, `_LOCAL_INV`).
pub(crate) fn qp_ex_ops() -> u32 {
    ffi::IBV_QP_EX_WITH_BIND_MW | ffi::IBV_QP_EX_WITH_LOCAL_INV
}

/// A memory window.
#[repr(C)]
pub struct Mw {
    pub(crate) ibv: ffi::ibv_mw,
    pub(crate) mw: MemoryWindow,
}

/// `ops.alloc_mw` (the header's `ibv_alloc_mw`): a window of type 1 or 2.
pub(crate) unsafe extern "C" fn alloc_mw(
    pd: *mut ffi::ibv_pd,
    t: ffi::ibv_mw_type,
) -> *mut ffi::ibv_mw {
    // SAFETY: the inline wrapper passes the program's PD.
    let Some(p) = (unsafe { object::<Pd, _>(pd) }) else {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    };
    let type2 = match t {
        ffi::IBV_MW_TYPE_1 => false,
        ffi::IBV_MW_TYPE_2 => true,
        _ => {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        }
    };
    match p.pd.alloc_mw(type2) {
        Ok(mw) => {
            // SAFETY: a live PD.
            unsafe { hold_pd(pd) };
            publish(Mw {
                ibv: ffi::ibv_mw {
                    context: p.ibv.context,
                    pd,
                    rkey: mw.rkey(),
                    handle: 0,
                    type_: t,
                },
                mw,
            })
        }
        Err(e) => {
            eprintln!("ferroce: ibv_alloc_mw: {e}");
            set_errno(libc::ENOMEM);
            std::ptr::null_mut()
        }
    }
}

/// `ops.dealloc_mw`: the window's keys stop working at once.
pub(crate) unsafe extern "C" fn dealloc_mw(mw: *mut ffi::ibv_mw) -> c_int {
    // SAFETY: the inline wrapper passes the program's window, not used again.
    if let Some(w) = unsafe { object::<Mw, _>(mw) } {
        // SAFETY: the window's PD outlives it.
        unsafe { release_pd(w.ibv.pd) };
    }
    // SAFETY: as above.
    unsafe { free::<Mw, _>(mw) }
}

/// The key after `key`: the same window, the next value of the low eight bits (what
/// libibverbs' `ibv_inc_rkey` computes).
fn inc_rkey(key: u32) -> u32 {
    (key & !0xff) | (key.wrapping_add(1) & 0xff)
}

/// Posts a bind of `b` on `q` as request `wr_id` with `flags`. Err holds the errno.
fn post(q: &Qp, wr_id: u64, flags: u32, b: &Bind) -> Result<(), c_int> {
    // SAFETY: the program's window and region, live while bound (the contract of
    // `ibv_bind_mw` and of posting a bind).
    let (mw, mr) = unsafe { (b.mw.as_ref(), b.info.mr.as_ref()) };
    let mw = mw.ok_or(libc::EINVAL)?;
    if q.base().pd.is_null() || mw.pd.is_null() {
        return Err(libc::EINVAL);
    }
    let unbind = mr.is_none();
    if unbind && (b.info.addr != 0 || b.info.length != 0) {
        return Err(libc::EINVAL);
    }
    let bind = WindowBind {
        mw_key: mw.rkey,
        new_key: b.rkey,
        mr_key: mr.map_or(0, |m| m.lkey),
        addr: b.info.addr,
        len: if unbind { 0 } else { b.info.length },
        access: Access(b.info.mw_access_flags),
        qpn: q.base().qp_num,
    };
    let mut wr = SendWr::bind_mw(wr_id, &bind);
    wr.flags = SendFlags(flags & (ffi::IBV_SEND_SIGNALED | ffi::IBV_SEND_FENCE));
    q.qp.rdma()
        .ok_or(libc::EINVAL)?
        .post_send(&[wr])
        .map_err(|f| crate::wr::errno(f.error))
}

/// An `IBV_WR_BIND_MW` request of `ibv_post_send` (or `ibv_wr_bind_mw`, as `b`).
pub(crate) fn post_bind(q: &Qp, wr: &ffi::ibv_send_wr, b: &Bind) -> Result<(), c_int> {
    // SAFETY: the program's window.
    if unsafe { b.mw.as_ref() }.is_some_and(|m| m.type_ != ffi::IBV_MW_TYPE_2) {
        return Err(libc::EINVAL);
    }
    post(q, wr.wr_id, wr.send_flags, b)
}

/// `ops.bind_mw` (the header's `ibv_bind_mw`, type 1 windows): the window's key moves to
/// the next, written back into `mw->rkey` at once, as libibverbs' providers do.
pub(crate) unsafe extern "C" fn bind_mw(
    qp: *mut ffi::ibv_qp,
    mw: *mut ffi::ibv_mw,
    bind: *mut ffi::ibv_mw_bind,
) -> c_int {
    // SAFETY: the inline wrapper passes the program's objects.
    let (Some(q), Some(m), Some(b)) = (
        unsafe { object::<Qp, _>(qp) },
        unsafe { mw.as_mut() },
        unsafe { bind.as_ref() },
    ) else {
        return libc::EINVAL;
    };
    if m.type_ != ffi::IBV_MW_TYPE_1 {
        return libc::EINVAL;
    }
    let new_key = inc_rkey(m.rkey);
    let bind = Bind {
        mw,
        rkey: new_key,
        info: b.bind_info,
    };
    match post(q, b.wr_id, b.send_flags, &bind) {
        Ok(()) => {
            m.rkey = new_key;
            0
        }
        Err(e) => e,
    }
}

/// Windows a device offers (`max_mw`).
pub(crate) const MAX_MW: i32 = 1 << 16;
