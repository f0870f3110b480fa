//! Queue pairs: create, modify, query, destroy. `ibv_qp_attr` and ferroce's `QpAttr` share
//! the mask bits and the values of every enumeration, so translation is field by field; the
//! address vector is the one exception (a GID in, a full path out: see
//! [`path_of`](crate::objects::path_of)).

use std::ffi::{c_int, c_void};
use std::net::IpAddr;
use std::sync::atomic::Ordering;

use ferroce_stack::transport::{Access, AttrMask, Mtu, QpAttr, QpCaps, QpState, QpType};
use ferroce_stack::wire::{Psn, Qpn};
use ferroce_verbs::{Gid, QueuePair, RawQueuePair, VerbsError};

use crate::context::context;
use crate::cq::Cq;
use crate::device::set_errno;
use crate::events::{Kind, Reported};
use crate::ffi;
use crate::objects::{free, init_sync, object, owner, path_of, publish, Pd};
use crate::srq::Srq;

/// The largest inline payload a QP offers (what `ibv_create_qp` grants at most).
pub const MAX_INLINE: u32 = 1024;

/// A queue pair. Every QP is an extended one (`struct ibv_qp_ex`, whose first part is
/// `struct ibv_qp`); `ibv_qp_to_qp_ex` hands out the extended part, with its `ibv_wr_*`
/// entry points, only for a QP created with `send_ops_flags`, as libibverbs does.
#[repr(C)]
pub struct Qp {
    pub(crate) ibv: ffi::ibv_qp_ex,
    pub(crate) qp: QpKind,
    pub(crate) caps: ffi::ibv_qp_cap,
    pub(crate) sq_sig_all: bool,
    /// Created with `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`: the `ibv_wr_*` API is on.
    pub(crate) extended: bool,
    /// The operations `send_ops_flags` allowed (`IBV_QP_EX_WITH_*`).
    pub(crate) send_ops: u64,
    /// Asynchronous events that named it and were taken.
    pub(crate) async_reported: Reported,
    /// The work requests an `ibv_wr_start` batch builds (see [`crate::qpex`]).
    pub(crate) batch: std::sync::Mutex<crate::qpex::Batch>,
    /// An RSS QP's indirection table (its address), else 0.
    pub(crate) ind_table: usize,
}

/// A QP of the transport (RC, UC, UD) or a raw packet QP.
pub(crate) enum QpKind {
    Rdma(QueuePair),
    Raw(RawQueuePair),
}

impl QpKind {
    /// The transport QP, if it is one.
    pub(crate) fn rdma(&self) -> Option<&QueuePair> {
        match self {
            Self::Rdma(q) => Some(q),
            Self::Raw(_) => None,
        }
    }
}

impl Qp {
    /// The program's pointer to its `struct ibv_qp`.
    pub(crate) fn base(&self) -> &ffi::ibv_qp {
        &self.ibv.qp_base
    }
}

/// The QP of a live QP pointer.
///
/// # Safety
/// `qp` is a live QP of this library.
pub(crate) unsafe fn object_of<'a>(qp: *mut ffi::ibv_qp) -> &'a Qp {
    // SAFETY: per the contract.
    unsafe { &*(qp as *const Qp) }
}

fn qp_type(t: ffi::ibv_qp_type) -> Option<QpType> {
    Some(match t {
        ffi::IBV_QPT_RC => QpType::Rc,
        ffi::IBV_QPT_UC => QpType::Uc,
        ffi::IBV_QPT_UD => QpType::Ud,
        _ => return None,
    })
}

fn state(s: ffi::ibv_qp_state) -> Option<QpState> {
    QpState::ALL.get(s as usize).copied()
}

pub(crate) fn state_code(s: QpState) -> ffi::ibv_qp_state {
    QpState::ALL.iter().position(|&x| x == s).unwrap_or(0) as ffi::ibv_qp_state
}

fn mtu(m: ffi::ibv_mtu) -> Option<Mtu> {
    Some(match m {
        1 => Mtu::Mtu256,
        2 => Mtu::Mtu512,
        3 => Mtu::Mtu1024,
        4 => Mtu::Mtu2048,
        5 => Mtu::Mtu4096,
        _ => return None,
    })
}

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
    unsafe { crate::objects::hold_pd(a.pd) };
    if let Some(s) = srq {
        s.users.fetch_add(1, Ordering::AcqRel);
    }
    let ptr: *mut ffi::ibv_qp = publish(Qp {
        ibv,
        qp,
        caps: *cap,
        sq_sig_all: a.sq_sig_all,
        extended: a.send_ops.is_some(),
        send_ops: a.send_ops.unwrap_or(0),
        async_reported: Reported::default(),
        batch: std::sync::Mutex::new(crate::qpex::Batch::default()),
        ind_table: 0,
    });
    c.events.register(Kind::Qp, qpn, ptr as *mut c_void);
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

/// `ibv_destroy_qp`: waits until the program acknowledged every asynchronous event it took
/// for the QP, as libibverbs does.
///
/// # Safety
/// `qp` came from `ibv_create_qp` and is not used again.
#[no_mangle]
pub unsafe extern "C" fn ferroce_ibv_destroy_qp(qp: *mut ffi::ibv_qp) -> c_int {
    // SAFETY: per the contract.
    let Some(q) = (unsafe { object::<Qp, _>(qp) }) else {
        return libc::EINVAL;
    };
    // SAFETY: QPs are made with a live context.
    let c = unsafe { owner(q.base().context) };
    // The QP's counters go with it: export the device's first, so `ferroce stats --all`
    // shows what a finished program's QPs did.
    let _ = c.verbs.export_stats();
    c.events.forget(Kind::Qp, q.base().qp_num);
    crate::schemes::forget_peer(q.base().context, q.base().qp_num);
    // SAFETY: the header's own fields, live until freed below; the CQs and SRQ outlive the
    // QP (their destroys fail with EBUSY until it is gone).
    unsafe {
        let h = &mut (*qp);
        q.async_reported
            .wait_acked(&mut h.mutex, &mut h.cond, &h.events_completed);
        for cq in [h.send_cq, h.recv_cq] {
            if !cq.is_null() {
                crate::cq::cq_of(cq).users.fetch_sub(1, Ordering::AcqRel);
            }
        }
        crate::wq::release_table(q.ind_table);
        crate::objects::release_pd(h.pd);
        if !h.srq.is_null() {
            crate::srq::srq_of(h.srq)
                .users
                .fetch_sub(1, Ordering::AcqRel);
        }
    }
    // SAFETY: per the contract.
    unsafe { free::<Qp, _>(qp) }
}
symver!(ferroce_ibv_destroy_qp => "ibv_destroy_qp" @ "IBVERBS_1.1");

/// The ferroce attributes of an `ibv_qp_attr` for the bits of `mask`. Err holds the errno.
fn to_attr(q: &Qp, a: &ffi::ibv_qp_attr, mask: AttrMask) -> Result<QpAttr, c_int> {
    let mut out = QpAttr::default();
    if mask.contains(AttrMask::STATE) {
        out.qp_state = state(a.qp_state).ok_or(libc::EINVAL)?;
    }
    if mask.contains(AttrMask::PATH_MTU) {
        out.path_mtu = mtu(a.path_mtu).ok_or(libc::EINVAL)?;
    }
    if mask.contains(AttrMask::PORT) {
        // SAFETY: QPs are made with a live context.
        let c = unsafe { owner(q.base().context) };
        if c.verbs.query_port_num(a.port_num).is_err() {
            eprintln!(
                "ferroce: port {} does not exist (the device has {})",
                a.port_num,
                c.verbs.query_device().phys_port_cnt
            );
            return Err(libc::EINVAL);
        }
        out.port_num = a.port_num;
    }
    if mask.contains(AttrMask::AV) {
        // SAFETY: QPs are made with a live context.
        let c = unsafe { owner(q.base().context) };
        out.ah_attr = path_of(c, &a.ah_attr)?;
    }
    out.qp_access_flags = Access(a.qp_access_flags & 0xf);
    out.pkey_index = a.pkey_index;
    out.qkey = a.qkey;
    out.timeout = a.timeout;
    out.retry_cnt = a.retry_cnt;
    out.rnr_retry = a.rnr_retry;
    out.rq_psn = Psn::new(a.rq_psn & 0xff_ffff);
    out.sq_psn = Psn::new(a.sq_psn & 0xff_ffff);
    out.max_rd_atomic = a.max_rd_atomic;
    out.max_dest_rd_atomic = a.max_dest_rd_atomic;
    out.min_rnr_timer = a.min_rnr_timer;
    out.dest_qp_num = Qpn::new(a.dest_qp_num & 0xff_ffff);
    Ok(out)
}

/// On a device with two ports, a connected QP entering RTR offers its other port to the
/// peer (see [`QueuePair::offer_alternate_port`](ferroce_verbs::QueuePair)): programs
/// written for one port (perftest) get native failover with a ferroce peer unchanged. A QP
/// connected through rdma_cm offers it only if the peer's CM messages said it speaks
/// ferroce: a kernel CM's peer (a ConnectX) would take the message for a bad opcode.
fn offer_failover(q: &Qp) {
    // SAFETY: QPs are made with a live context.
    let c = unsafe { owner(q.base().context) };
    let peer = crate::schemes::peer(q.base().context, q.base().qp_num);
    if c.verbs.query_device().phys_port_cnt < 2 || q.base().qp_type == ffi::IBV_QPT_UD {
        return;
    }
    if !crate::schemes::failover_wanted() || peer.is_some_and(|p| !p.path_control) {
        return;
    }
    let Some(rdma) = q.qp.rdma() else {
        return;
    };
    let primary = rdma.query().map_or(1, |a| a.port_num.max(1));
    let other = if primary == 1 { 2 } else { 1 };
    if let Err(e) = rdma.offer_alternate_port(other) {
        eprintln!("ferroce: QP {:#x}: no failover: {e}", q.base().qp_num);
    }
}

/// `ibv_modify_qp`: the spec's transition rules, as ferroce's QP enforces them; a refusal
/// says why on stderr (libibverbs only returns EINVAL, which leaves a user guessing).
///
/// # Safety
/// `qp` is a live QP; `attr` points to a `struct ibv_qp_attr`.
#[no_mangle]
pub unsafe extern "C" fn ferroce_ibv_modify_qp(
    qp: *mut ffi::ibv_qp,
    attr: *mut ffi::ibv_qp_attr,
    mask: c_int,
) -> c_int {
    // SAFETY: per the contract.
    let (Some(q), Some(a)) = (unsafe { object::<Qp, _>(qp) }, unsafe { attr.as_ref() }) else {
        return libc::EINVAL;
    };
    let mask = AttrMask(mask as u32);
    let rdma = match &q.qp {
        QpKind::Rdma(r) => r,
        QpKind::Raw(r) => return modify_raw(qp, r, a, mask),
    };
    let attr = match to_attr(q, a, mask) {
        Ok(x) => x,
        Err(e) => return e,
    };
    let to_rtr = mask.contains(AttrMask::STATE) && attr.qp_state == QpState::Rtr;
    if to_rtr {
        // The schemes go in while the QP is still in INIT (both ends' agree from RTR on).
        let peer = crate::schemes::peer(q.base().context, q.base().qp_num);
        crate::schemes::apply(rdma, q.base().qp_type, peer);
    }
    match rdma.modify(&attr, mask) {
        Ok(()) => {
            if mask.contains(AttrMask::STATE) {
                // SAFETY: the program's own QP header; libibverbs updates it the same way.
                unsafe { (*qp).state = a.qp_state };
                if attr.qp_state == QpState::Rtr {
                    offer_failover(q);
                }
            }
            0
        }
        Err(VerbsError::Modify(e)) => {
            eprintln!("ferroce: ibv_modify_qp on QP {:#x}: {e}", q.base().qp_num);
            libc::EINVAL
        }
        Err(e) => {
            eprintln!("ferroce: ibv_modify_qp on QP {:#x}: {e}", q.base().qp_num);
            libc::EINVAL
        }
    }
}
symver!(ferroce_ibv_modify_qp => "ibv_modify_qp" @ "IBVERBS_1.1");

/// `ibv_modify_qp` of a raw packet QP: its state (INIT takes the port), nothing else.
fn modify_raw(
    qp: *mut ffi::ibv_qp,
    r: &RawQueuePair,
    a: &ffi::ibv_qp_attr,
    mask: AttrMask,
) -> c_int {
    if !mask.contains(AttrMask::STATE) {
        return 0;
    }
    let Some(to) = state(a.qp_state) else {
        return libc::EINVAL;
    };
    let port = mask.contains(AttrMask::PORT).then_some(a.port_num);
    match r.modify(to, port) {
        Ok(()) => {
            // SAFETY: the program's own QP header; libibverbs updates it the same way.
            unsafe { (*qp).state = a.qp_state };
            0
        }
        Err(e) => {
            eprintln!(
                "ferroce: ibv_modify_qp on raw QP {:#x}: {e}",
                r.qpn().value()
            );
            libc::EINVAL
        }
    }
}

/// `ibv_query_qp`: every attribute, whatever the mask (as providers do).
///
/// # Safety
/// `qp` is a live QP; `attr` and `init` point to their structures.
#[no_mangle]
pub unsafe extern "C" fn ferroce_ibv_query_qp(
    qp: *mut ffi::ibv_qp,
    attr: *mut ffi::ibv_qp_attr,
    _mask: c_int,
    init: *mut ffi::ibv_qp_init_attr,
) -> c_int {
    // SAFETY: per the contract.
    let (Some(q), false, false) = (
        unsafe { object::<Qp, _>(qp) },
        attr.is_null(),
        init.is_null(),
    ) else {
        return libc::EINVAL;
    };
    let rdma = match &q.qp {
        QpKind::Rdma(r) => r,
        QpKind::Raw(r) => {
            let out = ffi::ibv_qp_attr {
                qp_state: state_code(r.state()),
                cur_qp_state: state_code(r.state()),
                port_num: r.port_num().unwrap_or(1),
                cap: q.caps,
                ..Default::default()
            };
            // SAFETY: per the contract, both point to whole structures.
            unsafe {
                attr.write(out);
                fill_init(q, &mut *init);
            }
            return 0;
        }
    };
    let Ok(x) = rdma.query() else {
        return libc::EINVAL;
    };
    let mut out = ffi::ibv_qp_attr {
        qp_state: state_code(x.qp_state),
        cur_qp_state: state_code(x.qp_state),
        path_mtu: x.path_mtu as ffi::ibv_mtu,
        qkey: x.qkey,
        rq_psn: x.rq_psn.value(),
        sq_psn: x.sq_psn.value(),
        dest_qp_num: x.dest_qp_num.value(),
        qp_access_flags: x.qp_access_flags.0,
        cap: q.caps,
        pkey_index: x.pkey_index,
        max_rd_atomic: x.max_rd_atomic,
        max_dest_rd_atomic: x.max_dest_rd_atomic,
        min_rnr_timer: x.min_rnr_timer,
        port_num: x.port_num.max(1),
        timeout: x.timeout,
        retry_cnt: x.retry_cnt,
        rnr_retry: x.rnr_retry,
        ..Default::default()
    };
    let av = x.ah_attr;
    if !matches!(av.dst, IpAddr::V4(a) if a.is_unspecified()) {
        out.ah_attr.is_global = 1;
        out.ah_attr.port_num = 1;
        out.ah_attr.grh.dgid.raw = Gid::from_ip(av.dst).0;
        out.ah_attr.grh.hop_limit = av.hop_limit;
        out.ah_attr.grh.traffic_class = av.traffic_class;
        out.ah_attr.grh.flow_label = av.flow_label;
    }
    // SAFETY: per the contract, both point to whole structures.
    unsafe {
        attr.write(out);
        fill_init(q, &mut *init);
    }
    0
}

/// The creation attributes `ibv_query_qp` returns.
fn fill_init(q: &Qp, i: &mut ffi::ibv_qp_init_attr) {
    i.qp_context = q.base().qp_context;
    i.send_cq = q.base().send_cq;
    i.recv_cq = q.base().recv_cq;
    i.srq = q.base().srq;
    i.cap = q.caps;
    i.qp_type = q.base().qp_type;
    i.sq_sig_all = c_int::from(q.sq_sig_all);
}
symver!(ferroce_ibv_query_qp => "ibv_query_qp" @ "IBVERBS_1.1");

/// `ibv_query_qp_data_in_order`: 1 when the QP's data lands in order (its recovery policy
/// delivers in PSN order, Go-Back-N by default), 0 when a placement policy writes a message's
/// packets as they come (selective repeat, spraying).
///
/// # Safety
/// `qp` is a live QP.
#[no_mangle]
pub unsafe extern "C" fn ferroce_ibv_query_qp_data_in_order(
    qp: *mut ffi::ibv_qp,
    _op: ffi::ibv_wr_opcode,
    flags: u32,
) -> c_int {
    // SAFETY: per the contract.
    let Some(q) = (unsafe { object::<Qp, _>(qp) }) else {
        return 0;
    };
    if flags != 0 {
        return 0;
    }
    c_int::from(
        q.qp.rdma()
            .is_some_and(|r| r.data_in_order().unwrap_or(false)),
    )
}
symver!(ferroce_ibv_query_qp_data_in_order => "ibv_query_qp_data_in_order" @ "IBVERBS_1.14");
