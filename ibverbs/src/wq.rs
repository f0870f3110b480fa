//! Receive work queues, indirection tables and RSS QPs (`ibv_create_wq`,
//! `ibv_create_rwq_ind_table`, `ibv_create_qp_ex` with `IBV_QP_INIT_ATTR_RX_HASH`): what a
//! DPDK-style receiver uses to spread one flow rule's frames over several queues. A work
//! queue is a raw packet QP that only receives; an RSS QP is a raw QP with no queue of its
//! own whose rules hand each frame to the work queue the Toeplitz hash of its headers picks
//! (see `ferroce_verbs::engine::raw::Rss`).

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use ferroce_stack::transport::QpState;
use ferroce_verbs::RawQueuePair;

use crate::context::context;
use crate::context::owner;
use crate::cq::Cq;
use crate::device::set_errno;
use crate::domain::Pd;
use crate::events::{Kind, Reported};
use crate::ffi;
use crate::objects::{free, init_sync, object, publish};
use crate::qp::{Qp, QpKind};

/// The largest indirection table (log2 of its entries) a device offers.
pub(crate) const MAX_LOG_IND_TBL: u32 = 8;
/// The `IBV_RX_HASH_*` fields ferroce hashes: IPv4 and IPv6 addresses, TCP and UDP ports.
pub(crate) const HASH_FIELDS: u64 = 0xff;

/// A receive work queue as programs hold it.
#[repr(C)]
pub struct Wq {
    pub(crate) ibv: ffi::ibv_wq,
    pub(crate) wq: RawQueuePair,
    /// Indirection tables naming it (it cannot be destroyed while any does).
    users: AtomicU32,
}

/// An indirection table as programs hold it.
#[repr(C)]
pub struct IndTable {
    pub(crate) ibv: ffi::ibv_rwq_ind_table,
    /// Its work queues, in table order (`struct ibv_wq` pointers of this library).
    wqs: Vec<usize>,
    /// RSS QPs using it (each holds a count of its own, see `Qp::table_users`).
    pub(crate) users: Arc<AtomicU32>,
}

/// `ibv_wq.post_recv`.
unsafe extern "C" fn post_recv(
    wq: *mut ffi::ibv_wq,
    wr: *mut ffi::ibv_recv_wr,
    bad: *mut *mut ffi::ibv_recv_wr,
) -> c_int {
    // SAFETY: the header calls this with the program's WQ.
    let Some(w) = (unsafe { object::<Wq, _>(wq) }) else {
        return libc::EINVAL;
    };
    // SAFETY: the program's list and out-pointer.
    unsafe {
        crate::ops::post_recvs(wr, bad, |r| {
            w.wq.post_recv(std::slice::from_ref(r)).map_err(|f| f.error)
        })
    }
}

/// `verbs_context.create_wq`: a receive queue (`IBV_WQT_RQ`) completing on the given CQ,
/// in RESET. Creation flags (VLAN stripping, FCS scatter, ...) are `EOPNOTSUPP`.
pub(crate) unsafe extern "C" fn create_wq(
    ctx: *mut ffi::ibv_context,
    attr: *mut ffi::ibv_wq_init_attr,
) -> *mut ffi::ibv_wq {
    // SAFETY: the inline wrapper passes the program's context and attributes.
    let made = match (unsafe { context(ctx) }, unsafe { attr.as_ref() }) {
        // SAFETY: the attributes' objects are null or live, per the verb's contract.
        (Some(_), Some(a)) => unsafe { make_wq(ctx, a) },
        _ => Err(libc::EINVAL),
    };
    made.unwrap_or_else(|e| {
        set_errno(e);
        std::ptr::null_mut()
    })
}

/// # Safety
/// `a.pd` and `a.cq` are null or live objects.
unsafe fn make_wq(
    ctx: *mut ffi::ibv_context,
    a: &ffi::ibv_wq_init_attr,
) -> Result<*mut ffi::ibv_wq, c_int> {
    if a.comp_mask & !ffi::IBV_WQ_INIT_ATTR_FLAGS != 0 {
        return Err(libc::EINVAL);
    }
    if a.wq_type != ffi::IBV_WQT_RQ {
        return Err(libc::EINVAL);
    }
    if a.comp_mask & ffi::IBV_WQ_INIT_ATTR_FLAGS != 0 && a.create_flags != 0 {
        return Err(libc::EOPNOTSUPP);
    }
    // SAFETY: per the contract.
    let (Some(p), Some(cq)) = (unsafe { object::<Pd, _>(a.pd) }, unsafe {
        object::<Cq, _>(a.cq)
    }) else {
        return Err(libc::EINVAL);
    };
    if p.ibv.context != ctx || cq.ibv.context != ctx {
        return Err(libc::EINVAL);
    }
    // SAFETY: a live context (checked by the caller).
    let dev = unsafe { owner(ctx) }.verbs.query_device();
    if a.max_wr > dev.max_qp_wr || a.max_sge > dev.max_sge {
        return Err(libc::EINVAL);
    }
    let wq =
        p.pd.create_wq(a.max_wr.max(1), a.max_sge.max(1), &cq.cq)
            .map_err(|e| {
                eprintln!("ferroce: ibv_create_wq: {e}");
                libc::EINVAL
            })?;
    let mut ibv = ffi::ibv_wq {
        context: ctx,
        wq_context: a.wq_context,
        pd: a.pd,
        cq: a.cq,
        wq_num: wq.qpn().value(),
        state: ffi::IBV_WQS_RESET,
        wq_type: a.wq_type,
        post_recv: Some(post_recv),
        ..Default::default()
    };
    // SAFETY: fresh, unshared storage.
    unsafe { init_sync(&mut ibv.mutex, &mut ibv.cond) };
    cq.users.fetch_add(1, Ordering::AcqRel);
    // SAFETY: a live PD.
    unsafe { crate::domain::hold_pd(a.pd) };
    Ok(publish(Wq {
        ibv,
        wq,
        users: AtomicU32::new(0),
    }))
}

/// `verbs_context.modify_wq`: the state (RESET, RDY, ERR; `IBV_WQ_ATTR_CURR_STATE` must
/// match), nothing else (`IBV_WQ_ATTR_FLAGS` with a flag is `EOPNOTSUPP`).
pub(crate) unsafe extern "C" fn modify_wq(
    wq: *mut ffi::ibv_wq,
    attr: *mut ffi::ibv_wq_attr,
) -> c_int {
    // SAFETY: the inline wrapper passes the program's WQ and attributes.
    let (Some(w), Some(a)) = (unsafe { object::<Wq, _>(wq) }, unsafe { attr.as_ref() }) else {
        return libc::EINVAL;
    };
    let known = ffi::IBV_WQ_ATTR_STATE | ffi::IBV_WQ_ATTR_CURR_STATE | ffi::IBV_WQ_ATTR_FLAGS;
    if a.attr_mask & !known != 0 {
        return libc::EINVAL;
    }
    if a.attr_mask & ffi::IBV_WQ_ATTR_FLAGS != 0 && a.flags_mask != 0 {
        return libc::EOPNOTSUPP;
    }
    let now = w.ibv.state;
    if a.attr_mask & ffi::IBV_WQ_ATTR_CURR_STATE != 0 && a.curr_wq_state != now {
        return libc::EINVAL;
    }
    if a.attr_mask & ffi::IBV_WQ_ATTR_STATE == 0 {
        return 0;
    }
    let to = match (now, a.wq_state) {
        (_, ffi::IBV_WQS_RESET) => QpState::Reset,
        (_, ffi::IBV_WQS_ERR) => QpState::Err,
        (ffi::IBV_WQS_RESET | ffi::IBV_WQS_RDY, ffi::IBV_WQS_RDY) => QpState::Rts,
        _ => return libc::EINVAL,
    };
    match w.wq.set_wq_state(to) {
        Ok(()) => {
            // SAFETY: the program's own WQ header, as a provider updates it.
            unsafe { (*wq).state = a.wq_state };
            0
        }
        Err(e) => {
            eprintln!("ferroce: ibv_modify_wq on WQ {:#x}: {e}", w.ibv.wq_num);
            libc::EINVAL
        }
    }
}

/// `verbs_context.destroy_wq`: `EBUSY` while an indirection table names it.
pub(crate) unsafe extern "C" fn destroy_wq(wq: *mut ffi::ibv_wq) -> c_int {
    // SAFETY: the inline wrapper passes the program's WQ.
    let Some(w) = (unsafe { object::<Wq, _>(wq) }) else {
        return libc::EINVAL;
    };
    if w.users.load(Ordering::Acquire) != 0 {
        return libc::EBUSY;
    }
    // SAFETY: the WQ's CQ outlives it (its destroy fails with EBUSY until the WQ is gone).
    unsafe { crate::cq::cq_of(w.ibv.cq) }
        .users
        .fetch_sub(1, Ordering::AcqRel);
    // SAFETY: the WQ's PD outlives it.
    unsafe { crate::domain::release_pd(w.ibv.pd) };
    // SAFETY: per the contract, not used again.
    unsafe { free::<Wq, _>(wq) }
}

/// `verbs_context.create_rwq_ind_table`: `1 << log_ind_tbl_size` work queues of this
/// context (one may appear more than once).
pub(crate) unsafe extern "C" fn create_rwq_ind_table(
    ctx: *mut ffi::ibv_context,
    attr: *mut ffi::ibv_rwq_ind_table_init_attr,
) -> *mut ffi::ibv_rwq_ind_table {
    // SAFETY: the inline wrapper passes the program's context and attributes.
    let made = match (unsafe { context(ctx) }, unsafe { attr.as_ref() }) {
        // SAFETY: the table holds live WQs, per the verb's contract.
        (Some(_), Some(a)) => unsafe { make_table(ctx, a) },
        _ => Err(libc::EINVAL),
    };
    made.unwrap_or_else(|e| {
        set_errno(e);
        std::ptr::null_mut()
    })
}

/// # Safety
/// `a.ind_tbl` is null or holds `1 << a.log_ind_tbl_size` live WQ pointers.
unsafe fn make_table(
    ctx: *mut ffi::ibv_context,
    a: &ffi::ibv_rwq_ind_table_init_attr,
) -> Result<*mut ffi::ibv_rwq_ind_table, c_int> {
    if a.comp_mask != 0 || a.ind_tbl.is_null() || a.log_ind_tbl_size > MAX_LOG_IND_TBL {
        return Err(libc::EINVAL);
    }
    let n = 1usize << a.log_ind_tbl_size;
    // SAFETY: per the contract.
    let ptrs = unsafe { std::slice::from_raw_parts(a.ind_tbl, n) };
    let mut wqs = Vec::with_capacity(n);
    for &p in ptrs {
        // SAFETY: per the contract.
        let w = unsafe { object::<Wq, _>(p) }.ok_or(libc::EINVAL)?;
        if w.ibv.context != ctx {
            return Err(libc::EINVAL);
        }
        wqs.push(p as usize);
    }
    for &p in &wqs {
        // SAFETY: checked live just above.
        unsafe { &*(p as *const Wq) }
            .users
            .fetch_add(1, Ordering::AcqRel);
    }
    static NEXT: AtomicU32 = AtomicU32::new(1);
    let num = NEXT.fetch_add(1, Ordering::Relaxed) as c_int;
    Ok(publish(IndTable {
        ibv: ffi::ibv_rwq_ind_table {
            context: ctx,
            ind_tbl_handle: num,
            ind_tbl_num: num,
            comp_mask: 0,
        },
        wqs,
        users: Arc::new(AtomicU32::new(0)),
    }))
}

/// `verbs_context.destroy_rwq_ind_table`: `EBUSY` while an RSS QP uses it.
pub(crate) unsafe extern "C" fn destroy_rwq_ind_table(t: *mut ffi::ibv_rwq_ind_table) -> c_int {
    // SAFETY: the inline wrapper passes the program's table.
    let Some(table) = (unsafe { object::<IndTable, _>(t) }) else {
        return libc::EINVAL;
    };
    if table.users.load(Ordering::Acquire) != 0 {
        return libc::EBUSY;
    }
    for &p in &table.wqs {
        // SAFETY: a WQ cannot be destroyed while the table names it.
        unsafe { &*(p as *const Wq) }
            .users
            .fetch_sub(1, Ordering::AcqRel);
    }
    // SAFETY: per the contract, not used again.
    unsafe { free::<IndTable, _>(t) }
}

/// `ibv_create_qp_ex` of an RSS QP: a raw packet QP that only receives, through `a`'s
/// indirection table, hashing `a.rx_hash_conf` (Toeplitz only; IPsec SPI and inner headers
/// are `EOPNOTSUPP`). It has no CQs and no queue of its own, and needs no modify: its flow
/// rules steer from the moment they are made, as on mlx5.
///
/// # Safety
/// `a`'s PD and table are null or live objects; its key points to `rx_hash_key_len` bytes.
pub(crate) unsafe fn create_rss_qp(
    a: &mut ffi::ibv_qp_init_attr_ex,
) -> Result<*mut ffi::ibv_qp, c_int> {
    let both = ffi::IBV_QP_INIT_ATTR_IND_TABLE | ffi::IBV_QP_INIT_ATTR_RX_HASH;
    if a.comp_mask & both != both || a.qp_type != ffi::IBV_QPT_RAW_PACKET {
        return Err(libc::EINVAL);
    }
    let h = &a.rx_hash_conf;
    if u32::from(h.rx_hash_function) != ffi::IBV_RX_HASH_FUNC_TOEPLITZ
        || h.rx_hash_fields_mask & !HASH_FIELDS != 0
    {
        return Err(libc::EOPNOTSUPP);
    }
    if h.rx_hash_key.is_null() || h.rx_hash_key_len == 0 {
        return Err(libc::EINVAL);
    }
    // SAFETY: per the contract.
    let key = unsafe { std::slice::from_raw_parts(h.rx_hash_key, h.rx_hash_key_len.into()) };
    // SAFETY: per the contract.
    let (Some(p), Some(table)) = (unsafe { object::<Pd, _>(a.pd) }, unsafe {
        object::<IndTable, _>(a.rwq_ind_tbl)
    }) else {
        return Err(libc::EINVAL);
    };
    if table.ibv.context != p.ibv.context {
        return Err(libc::EINVAL);
    }
    // SAFETY: PDs are made with a live context.
    let c = unsafe { owner(p.ibv.context) };
    // SAFETY: a table's WQs outlive it.
    let wqs: Vec<&RawQueuePair> = table
        .wqs
        .iter()
        .map(|&w| unsafe { &(*(w as *const Wq)).wq })
        .collect();
    let raw = c
        .verbs
        .create_rss_qp(&p.pd, &wqs, key.to_vec(), h.rx_hash_fields_mask)
        .map_err(|e| {
            eprintln!("ferroce: ibv_create_qp_ex (RSS): {e}");
            libc::EINVAL
        })?;
    let qpn = raw.qpn().value();
    a.cap = ffi::ibv_qp_cap::default();
    let mut ibv = ffi::ibv_qp_ex {
        qp_base: ffi::ibv_qp {
            context: p.ibv.context,
            qp_context: a.qp_context,
            pd: a.pd,
            qp_num: qpn,
            state: ffi::IBV_QPS_RESET,
            qp_type: a.qp_type,
            ..Default::default()
        },
        ..Default::default()
    };
    // SAFETY: fresh, unshared storage.
    unsafe { init_sync(&mut ibv.qp_base.mutex, &mut ibv.qp_base.cond) };
    table.users.fetch_add(1, Ordering::AcqRel);
    // SAFETY: a live PD.
    unsafe { crate::domain::hold_pd(a.pd) };
    let reported = Reported::default();
    let ptr: *mut ffi::ibv_qp = publish(Qp {
        ibv,
        qp: QpKind::Raw(raw),
        caps: a.cap,
        sq_sig_all: false,
        extended: false,
        send_ops: 0,
        async_reported: reported.clone(),
        batch: std::sync::Mutex::new(crate::wr::Batch::default()),
        table_users: Some(table.users.clone()),
    });
    c.events
        .register(Kind::Qp, qpn, ptr as *mut c_void, reported);
    Ok(ptr)
}

/// The RSS capabilities of `ibv_query_device_ex`.
pub(crate) fn rss_caps() -> ffi::ibv_rss_caps {
    ffi::ibv_rss_caps {
        supported_qpts: 1 << ffi::IBV_QPT_RAW_PACKET,
        max_rwq_indirection_tables: 1 << 16,
        max_rwq_indirection_table_size: 1 << MAX_LOG_IND_TBL,
        rx_hash_fields_mask: HASH_FIELDS,
        rx_hash_function: ffi::IBV_RX_HASH_FUNC_TOEPLITZ as u8,
    }
}
