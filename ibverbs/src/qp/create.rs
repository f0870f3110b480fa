//! Creating a queue pair (`ibv_create_qp`, `ibv_create_qp_ex`): what the program asked for,
//! checked against what the device grants, with the extended post API's entry points for a
//! QP created with `send_ops_flags` and an RSS QP for an indirection table (see
//! [`crate::wq`]).

use std::ffi::{c_int, c_void};
use std::sync::atomic::Ordering;

use ferroce_stack::transport::{QpCaps, QpType};

use crate::context::{context, owner};
use crate::cq::Cq;
use crate::device::set_errno;
use crate::domain::Pd;
use crate::events::{Kind, Reported};
use crate::ffi;
use crate::objects::{init_sync, object, publish};
use crate::srq::Srq;
use crate::wr::Batch;

use super::{qp_type, Qp, QpKind, MAX_INLINE};

/// What creating a QP takes, from `ibv_qp_init_attr` or `ibv_qp_init_attr_ex`.
pub(crate) struct Create<'a> {
    pub(crate) pd: *mut ffi::ibv_pd,
    pub(crate) qp_context: *mut std::ffi::c_void,
    pub(crate) send_cq: *mut ffi::ibv_cq,
    pub(crate) recv_cq: *mut ffi::ibv_cq,
    pub(crate) srq: *mut ffi::ibv_srq,
    pub(crate) cap: &'a mut ffi::ibv_qp_cap,
    pub(crate) qp_type: ffi::ibv_qp_type,
    pub(crate) sq_sig_all: bool,
    /// `Some(send_ops_flags)` for a QP created with them.
    pub(crate) send_ops: Option<u64>,
}

/// Makes a QP; its capabilities are written back with what was granted. Err holds the
/// errno.
pub(crate) fn create(a: Create<'_>) -> Result<*mut ffi::ibv_qp, c_int> {
    // SAFETY: null or live objects, per the callers' contracts.
    let (p, scq, rcq, srq) = unsafe {
        (
            object::<Pd, _>(a.pd),
            object::<Cq, _>(a.send_cq),
            object::<Cq, _>(a.recv_cq),
            object::<Srq, _>(a.srq),
        )
    };
    let p = p.ok_or(libc::EINVAL)?;
    let raw = a.qp_type == ffi::IBV_QPT_RAW_PACKET;
    let t = if raw {
        Some(QpType::Ud)
    } else {
        qp_type(a.qp_type)
    };
    let Some(t) = t else {
        return Err(match a.qp_type {
            ffi::IBV_QPT_RC | ffi::IBV_QPT_UC | ffi::IBV_QPT_UD => libc::EINVAL,
            _ => libc::EOPNOTSUPP,
        });
    };
    let (Some(scq), Some(rcq)) = (scq, rcq) else {
        return Err(libc::EINVAL);
    };
    if !a.srq.is_null() && srq.is_none() {
        return Err(libc::EINVAL);
    }
    // SAFETY: PDs are made with a live context.
    let c = unsafe { owner(p.ibv.context) };
    if scq.ibv.context != p.ibv.context || rcq.ibv.context != p.ibv.context {
        return Err(libc::EINVAL);
    }
    let dev = c.verbs.query_device();
    let cap = a.cap;
    if cap.max_send_wr > dev.max_qp_wr
        || cap.max_recv_wr > dev.max_qp_wr
        || cap.max_send_sge > dev.max_sge
        || cap.max_recv_sge > dev.max_sge
        || cap.max_inline_data > MAX_INLINE
    {
        return Err(libc::EINVAL);
    }
    if let Some(ops) = a.send_ops {
        let supported = if raw {
            u64::from(ffi::IBV_QP_EX_WITH_SEND)
        } else {
            crate::qpex::supported_send_ops(t)
        };
        if ops & !supported != 0 {
            return Err(libc::EOPNOTSUPP);
        }
    }
    if raw && srq.is_some() {
        return Err(libc::EOPNOTSUPP);
    }
    // Grant at least one of everything (a queue of zero is still a queue to post to, as on
    // mlx5), and inline room for what the gather list could carry, or what the program asked
    // if more: a WQE holds either, so a NIC's inline capacity follows its SGE count (Linux's
    // rxe grants exactly this; mlx5 rounds up further). rdma-core's rdma_xclient posts 16
    // inline bytes on a QP that asked for none.
    cap.max_send_wr = cap.max_send_wr.max(1);
    cap.max_send_sge = cap.max_send_sge.max(1);
    cap.max_inline_data = cap
        .max_inline_data
        .max(16 * cap.max_send_sge)
        .min(MAX_INLINE);
    if srq.is_none() {
        cap.max_recv_wr = cap.max_recv_wr.max(1);
        cap.max_recv_sge = cap.max_recv_sge.max(1);
    } else {
        cap.max_recv_wr = 0;
        cap.max_recv_sge = 0;
    }
    let caps = QpCaps {
        max_send_wr: cap.max_send_wr,
        max_recv_wr: cap.max_recv_wr,
        max_send_sge: cap.max_send_sge,
        max_recv_sge: cap.max_recv_sge,
        max_inline_data: cap.max_inline_data,
        sq_sig_all: a.sq_sig_all,
    };
    let made = match srq {
        _ if raw => p.pd.create_raw_qp(caps, &scq.cq, &rcq.cq).map(QpKind::Raw),
        Some(s) => {
            p.pd.create_qp_with_srq(t, caps, &scq.cq, &rcq.cq, &s.srq)
                .map(QpKind::Rdma)
        }
        None => p.pd.create_qp(t, caps, &scq.cq, &rcq.cq).map(QpKind::Rdma),
    };
    let qp = made.map_err(|e| {
        eprintln!("ferroce: ibv_create_qp: {e}");
        libc::EINVAL
    })?;
    let qpn = match &qp {
        QpKind::Rdma(q) => q.qpn().value(),
        QpKind::Raw(r) => r.qpn().value(),
    };
    let mut ibv = ffi::ibv_qp_ex {
        qp_base: ffi::ibv_qp {
            context: p.ibv.context,
            qp_context: a.qp_context,
            pd: a.pd,
            send_cq: a.send_cq,
            recv_cq: a.recv_cq,
            srq: a.srq,
            qp_num: qpn,
            state: ffi::IBV_QPS_RESET,
            qp_type: a.qp_type,
            ..Default::default()
        },
        ..Default::default()
    };
    if a.send_ops.is_some() {
        crate::qpex::install(&mut ibv);
    }
    // SAFETY: fresh, unshared storage.
    unsafe { init_sync(&mut ibv.qp_base.mutex, &mut ibv.qp_base.cond) };
    scq.users.fetch_add(1, Ordering::AcqRel);
    rcq.users.fetch_add(1, Ordering::AcqRel);
    // SAFETY: a live PD.
    unsafe { crate::domain::hold_pd(a.pd) };
    if let Some(s) = srq {
        s.users.fetch_add(1, Ordering::AcqRel);
    }
    let reported = Reported::default();
    let ptr: *mut ffi::ibv_qp = publish(Qp {
        ibv,
        qp,
        caps: *cap,
        sq_sig_all: a.sq_sig_all,
        extended: a.send_ops.is_some(),
        send_ops: a.send_ops.unwrap_or(0),
        async_reported: reported.clone(),
        batch: std::sync::Mutex::new(Batch::default()),
        table_users: None,
    });
    c.events
        .register(Kind::Qp, qpn, ptr as *mut c_void, reported);
    Ok(ptr)
}

/// `ibv_create_qp`: the capabilities are written back with what was granted.
///
/// # Safety
/// `pd` is a live PD; `init` points to a `struct ibv_qp_init_attr` whose CQs (and SRQ) are
/// live objects of the same context.
#[no_mangle]
pub unsafe extern "C" fn ferroce_ibv_create_qp(
    pd: *mut ffi::ibv_pd,
    init: *mut ffi::ibv_qp_init_attr,
) -> *mut ffi::ibv_qp {
    // SAFETY: per the contract.
    let Some(a) = (unsafe { init.as_mut() }) else {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    };
    let made = create(Create {
        pd,
        qp_context: a.qp_context,
        send_cq: a.send_cq,
        recv_cq: a.recv_cq,
        srq: a.srq,
        cap: &mut a.cap,
        qp_type: a.qp_type,
        sq_sig_all: a.sq_sig_all != 0,
        send_ops: None,
    });
    match made {
        Ok(p) => p,
        Err(e) => {
            set_errno(e);
            std::ptr::null_mut()
        }
    }
}
symver!(ferroce_ibv_create_qp => "ibv_create_qp" @ "IBVERBS_1.1");

/// `verbs_context.create_qp_ex` (the header's `ibv_create_qp_ex` when more than a PD is
/// given): the PD is required (XRC is not offered); creation flags and TSO headers are
/// `EOPNOTSUPP`; an indirection table with a hash makes an RSS QP (see [`crate::wq`]);
/// `send_ops_flags` turns the `ibv_wr_*` API on.
pub(crate) unsafe extern "C" fn create_qp_ex(
    ctx: *mut ffi::ibv_context,
    attr: *mut ffi::ibv_qp_init_attr_ex,
) -> *mut ffi::ibv_qp {
    // SAFETY: the inline wrapper passes the program's context and attributes.
    let (Some(_), Some(a)) = (unsafe { context(ctx) }, unsafe { attr.as_mut() }) else {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    };
    let known = ffi::IBV_QP_INIT_ATTR_PD
        | ffi::IBV_QP_INIT_ATTR_XRCD
        | ffi::IBV_QP_INIT_ATTR_CREATE_FLAGS
        | ffi::IBV_QP_INIT_ATTR_MAX_TSO_HEADER
        | ffi::IBV_QP_INIT_ATTR_IND_TABLE
        | ffi::IBV_QP_INIT_ATTR_RX_HASH
        | ffi::IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    let fail = |e| {
        set_errno(e);
        std::ptr::null_mut()
    };
    if a.comp_mask & !known != 0 {
        return fail(libc::EINVAL);
    }
    if a.comp_mask & ffi::IBV_QP_INIT_ATTR_PD == 0 {
        return fail(if a.comp_mask & ffi::IBV_QP_INIT_ATTR_XRCD != 0 {
            libc::EOPNOTSUPP
        } else {
            libc::EINVAL
        });
    }
    if a.comp_mask & (ffi::IBV_QP_INIT_ATTR_IND_TABLE | ffi::IBV_QP_INIT_ATTR_RX_HASH) != 0 {
        // SAFETY: the program's attributes name live objects, per the verb's contract.
        return unsafe { crate::wq::create_rss_qp(a) }.unwrap_or_else(fail);
    }
    if a.comp_mask & ffi::IBV_QP_INIT_ATTR_MAX_TSO_HEADER != 0
        || (a.comp_mask & ffi::IBV_QP_INIT_ATTR_CREATE_FLAGS != 0 && a.create_flags != 0)
    {
        return fail(libc::EOPNOTSUPP);
    }
    let send_ops =
        (a.comp_mask & ffi::IBV_QP_INIT_ATTR_SEND_OPS_FLAGS != 0).then_some(a.send_ops_flags);
    match create(Create {
        pd: a.pd,
        qp_context: a.qp_context,
        send_cq: a.send_cq,
        recv_cq: a.recv_cq,
        srq: a.srq,
        cap: &mut a.cap,
        qp_type: a.qp_type,
        sq_sig_all: a.sq_sig_all != 0,
        send_ops,
    }) {
        Ok(p) => p,
        Err(e) => fail(e),
    }
}
