//! Queue pairs: modify, query, destroy; creating one is [`create`]'s, which sits above the
//! modules a new QP takes its entry points from (the extended post API, RSS). `ibv_qp_attr`
//! and ferroce's `QpAttr` share the mask bits and the values of every enumeration, so
//! translation is field by field; the address vector is the one exception (a GID in, a full
//! path out: see [`path_of`](crate::ah::path_of)).

pub mod create;

use std::ffi::c_int;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use ferroce_stack::transport::{Access, AttrMask, Mtu, QpAttr, QpState, QpType};
use ferroce_stack::wire::{Psn, Qpn};
use ferroce_verbs::{Gid, QueuePair, RawQueuePair, VerbsError};

use crate::ah::path_of;
use crate::context::owner;
use crate::events::{Kind, Reported};
use crate::ffi;
use crate::objects::{free, object};
use crate::wr::Batch;

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
    pub(crate) batch: std::sync::Mutex<Batch>,
    /// An RSS QP's hold on its indirection table (whose destroy is `EBUSY` while held).
    pub(crate) table_users: Option<Arc<AtomicU32>>,
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

pub(crate) fn qp_type(t: ffi::ibv_qp_type) -> Option<QpType> {
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
        if let Some(users) = &q.table_users {
            users.fetch_sub(1, Ordering::AcqRel);
        }
        crate::domain::release_pd(h.pd);
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
