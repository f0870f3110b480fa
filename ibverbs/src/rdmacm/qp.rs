//! QPs on ids: `rdma_create_qp` (with the CQs librdmacm makes when the program gives none),
//! `rdma_destroy_qp`, SRQs, `rdma_init_qp_attr`, and the transitions the CM exchange drives.
//!
//! The attributes are what Linux's CM computes for the same exchange: INIT with no remote
//! access until a connection says otherwise (then REMOTE_WRITE, and READ and ATOMIC when the
//! local side takes READs); RTR with the peer's QPN and first PSN, the smaller MTU, the
//! responder resources agreed, an RNR timer of 12; RTS with the local first PSN, the ACK
//! timeout of the path, the requester's retry count, the RNR retries the peer asked for and
//! the initiator depth agreed. A UD id's QP goes straight to RTS with the port space's
//! Q_Key.

use std::ffi::c_int;

use super::{cma, err, CmId, Cma, UDP_QKEY};
use crate::ffi;

/// The address vector of a RoCE peer: its GID through the port's first GID.
pub(crate) fn ah_attr(dgid: [u8; 16], tos: u8) -> ffi::ibv_ah_attr {
    let mut a = ffi::ibv_ah_attr {
        is_global: 1,
        port_num: 1,
        ..Default::default()
    };
    a.grh.dgid.raw = dgid;
    a.grh.sgid_index = 0;
    a.grh.hop_limit = 64;
    a.grh.traffic_class = tos;
    a
}

/// The attributes of the transition to `state` for the id's QP, and their mask.
fn attrs(
    c: &Cma,
    key: usize,
    state: ffi::ibv_qp_state,
) -> Result<(ffi::ibv_qp_attr, c_int), c_int> {
    let s = c.ids.get(&key).ok_or(libc::EINVAL)?;
    // SAFETY: a live id of the state.
    let cm = unsafe { &*(key as *const CmId) };
    let uc = cm.id.qp_type == ffi::IBV_QPT_UC;
    let mut a = ffi::ibv_qp_attr {
        qp_state: state,
        ..Default::default()
    };
    let m = |x: u32| x as c_int;
    let mask = match state {
        ffi::IBV_QPS_INIT => {
            a.pkey_index = 0;
            a.port_num = 1;
            let base = m(ffi::IBV_QP_STATE | ffi::IBV_QP_PKEY_INDEX | ffi::IBV_QP_PORT);
            if s.ud {
                a.qkey = UDP_QKEY;
                base | m(ffi::IBV_QP_QKEY)
            } else {
                let connected = s.req.is_some() || s.rep.is_some();
                if connected {
                    a.qp_access_flags = ffi::IBV_ACCESS_REMOTE_WRITE;
                    if s.responder_resources > 0 && !uc {
                        a.qp_access_flags |=
                            ffi::IBV_ACCESS_REMOTE_READ | ffi::IBV_ACCESS_REMOTE_ATOMIC;
                    }
                }
                base | m(ffi::IBV_QP_ACCESS_FLAGS)
            }
        }
        ffi::IBV_QPS_RTR => {
            let (qpn, psn) = match (&s.req, &s.rep) {
                (Some(r), _) => (r.qpn, r.psn),
                (None, Some(r)) => (r.qpn, r.psn),
                _ => return Err(libc::EINVAL),
            };
            a.path_mtu = s.path_mtu as ffi::ibv_mtu;
            a.dest_qp_num = qpn;
            a.rq_psn = psn;
            a.ah_attr = ah_attr(s.peer.ok_or(libc::EINVAL)?.gid, s.tos);
            let base = m(ffi::IBV_QP_STATE
                | ffi::IBV_QP_AV
                | ffi::IBV_QP_PATH_MTU
                | ffi::IBV_QP_DEST_QPN
                | ffi::IBV_QP_RQ_PSN);
            if uc {
                base
            } else {
                a.max_dest_rd_atomic = s.responder_resources;
                a.min_rnr_timer = 12;
                base | m(ffi::IBV_QP_MAX_DEST_RD_ATOMIC | ffi::IBV_QP_MIN_RNR_TIMER)
            }
        }
        ffi::IBV_QPS_RTS => {
            a.sq_psn = s.psn;
            if uc {
                m(ffi::IBV_QP_STATE | ffi::IBV_QP_SQ_PSN)
            } else {
                a.timeout = s.ack_timeout;
                a.retry_cnt = s.retry_count.min(7);
                a.rnr_retry = s.rnr_retry_count.min(7);
                a.max_rd_atomic = s.initiator_depth;
                m(ffi::IBV_QP_STATE
                    | ffi::IBV_QP_SQ_PSN
                    | ffi::IBV_QP_TIMEOUT
                    | ffi::IBV_QP_RETRY_CNT
                    | ffi::IBV_QP_RNR_RETRY
                    | ffi::IBV_QP_MAX_QP_RD_ATOMIC)
            }
        }
        _ => return Err(libc::EINVAL),
    };
    Ok((a, mask))
}

/// Modifies the id's QP to `state` with the CM's attributes.
fn modify(c: &Cma, key: usize, state: ffi::ibv_qp_state) -> Result<(), c_int> {
    // SAFETY: a live id of the state.
    let qp = unsafe { (*(key as *const CmId)).id.qp };
    let (mut a, mask) = attrs(c, key, state)?;
    // SAFETY: the id's live QP, and attributes on the stack.
    match unsafe { crate::qp::ferroce_ibv_modify_qp(qp, &mut a, mask) } {
        0 => Ok(()),
        e => Err(e),
    }
}

/// The id's QP (if it has one) from INIT to RTS with the exchange's numbers.
pub(crate) fn to_rts(c: &Cma, key: usize) -> Result<(), c_int> {
    // SAFETY: a live id of the state.
    if unsafe { (*(key as *const CmId)).id.qp }.is_null() {
        return Ok(());
    }
    modify(c, key, ffi::IBV_QPS_INIT)?;
    modify(c, key, ffi::IBV_QPS_RTR)?;
    modify(c, key, ffi::IBV_QPS_RTS)
}

/// The id's QP (if any) to the error state: its outstanding work completes flushed.
pub(crate) fn to_err(cm: &CmId) {
    if cm.id.qp.is_null() {
        return;
    }
    let mut a = ffi::ibv_qp_attr {
        qp_state: ffi::IBV_QPS_ERR,
        ..Default::default()
    };
    // SAFETY: the id's live QP.
    unsafe { crate::qp::ferroce_ibv_modify_qp(cm.id.qp, &mut a, ffi::IBV_QP_STATE as c_int) };
}

/// `rdma_init_qp_attr`: the attributes (and mask) of the transition to
/// `qp_attr->qp_state` the CM would make.
///
/// # Safety
/// `id` is a live id; `qp_attr` and `mask` point to writable structures.
#[no_mangle]
pub unsafe extern "C" fn ferroce_rdma_init_qp_attr(
    id: *mut ffi::rdma_cm_id,
    qp_attr: *mut ffi::ibv_qp_attr,
    mask: *mut c_int,
) -> c_int {
    if qp_attr.is_null() || mask.is_null() {
        return err(libc::EINVAL);
    }
    let Ok(c) = cma() else {
        return -1;
    };
    // SAFETY: per the contract.
    let state = unsafe { (*qp_attr).qp_state };
    match attrs(&c, id as usize, state) {
        Ok((a, m)) => {
            // SAFETY: per the contract.
            unsafe {
                qp_attr.write(a);
                mask.write(m);
            }
            0
        }
        Err(e) => err(e),
    }
}

/// Makes the CQs (and their completion channels) the program did not give: librdmacm's
/// `ucma_create_cqs`.
fn create_cqs(cm: &mut CmId, send: u32, recv: u32) -> Result<(), c_int> {
    let ctx = cm.id.verbs;
    let ctx_arg = cm as *const CmId as *mut std::ffi::c_void;
    let make = |n: u32| -> Result<(*mut ffi::ibv_comp_channel, *mut ffi::ibv_cq), c_int> {
        // SAFETY: the id's context, open for the process.
        let ch = unsafe { crate::cq::ferroce_ibv_create_comp_channel(ctx) };
        if ch.is_null() {
            return Err(libc::ENOMEM);
        }
        // SAFETY: as above, with the channel just made.
        let cq =
            unsafe { crate::cq::ferroce_ibv_create_cq(ctx, n.max(1) as c_int, ctx_arg, ch, 0) };
        if cq.is_null() {
            // SAFETY: just made, unused.
            unsafe { crate::cq::ferroce_ibv_destroy_comp_channel(ch) };
            return Err(libc::ENOMEM);
        }
        Ok((ch, cq))
    };
    if recv > 0 {
        let (ch, cq) = make(recv)?;
        cm.id.recv_cq_channel = ch;
        cm.id.recv_cq = cq;
    }
    if send > 0 {
        match make(send) {
            Ok((ch, cq)) => {
                cm.id.send_cq_channel = ch;
                cm.id.send_cq = cq;
            }
            Err(e) => {
                destroy_cqs(cm);
                return Err(e);
            }
        }
    }
    Ok(())
}

/// Destroys the CQs [`create_cqs`] made.
fn destroy_cqs(cm: &mut CmId) {
    // SAFETY: CQs and channels this library made for the id, destroyed once.
    unsafe {
        if !cm.id.recv_cq.is_null() {
            crate::cq::ferroce_ibv_destroy_cq(cm.id.recv_cq);
            if !cm.id.send_cq.is_null() && cm.id.send_cq != cm.id.recv_cq {
                crate::cq::ferroce_ibv_destroy_cq(cm.id.send_cq);
            }
        } else if !cm.id.send_cq.is_null() {
            crate::cq::ferroce_ibv_destroy_cq(cm.id.send_cq);
        }
        if !cm.id.recv_cq_channel.is_null() {
            crate::cq::ferroce_ibv_destroy_comp_channel(cm.id.recv_cq_channel);
            if !cm.id.send_cq_channel.is_null() && cm.id.send_cq_channel != cm.id.recv_cq_channel {
                crate::cq::ferroce_ibv_destroy_comp_channel(cm.id.send_cq_channel);
            }
        } else if !cm.id.send_cq_channel.is_null() {
            crate::cq::ferroce_ibv_destroy_comp_channel(cm.id.send_cq_channel);
        }
    }
    cm.id.recv_cq = std::ptr::null_mut();
    cm.id.send_cq = std::ptr::null_mut();
    cm.id.recv_cq_channel = std::ptr::null_mut();
    cm.id.send_cq_channel = std::ptr::null_mut();
}

/// `rdma_create_qp_ex`: a QP on the id's device (CQs made when not given), moved to INIT
/// (a UD QP to RTS) as librdmacm does.
///
/// # Safety
/// `id` is a live id; `attr` points to a valid `struct ibv_qp_init_attr_ex`.
#[no_mangle]
pub unsafe extern "C" fn ferroce_rdma_create_qp_ex(
    id: *mut ffi::rdma_cm_id,
    attr: *mut ffi::ibv_qp_init_attr_ex,
) -> c_int {
    let key = id as usize;
    // SAFETY: per the contract.
    let (Some(a), Some(cm)) = (unsafe { attr.as_mut() }, unsafe {
        (id as *mut CmId).as_mut()
    }) else {
        return err(libc::EINVAL);
    };
    if !cm.id.qp.is_null() || cm.id.verbs.is_null() {
        return err(libc::EINVAL);
    }
    if a.comp_mask & ffi::IBV_QP_INIT_ATTR_PD == 0 || a.pd.is_null() {
        a.comp_mask |= ffi::IBV_QP_INIT_ATTR_PD;
        a.pd = cm.id.pd;
    // SAFETY: the program's PD.
    } else if unsafe { (*a.pd).context } != cm.id.verbs {
        return err(libc::EINVAL);
    }
    if a.pd.is_null() {
        return err(libc::EINVAL);
    }
    if (!cm.id.recv_cq.is_null() && !a.recv_cq.is_null() && cm.id.recv_cq != a.recv_cq)
        || (!cm.id.send_cq.is_null() && !a.send_cq.is_null() && cm.id.send_cq != a.send_cq)
    {
        return err(libc::EINVAL);
    }
    let send = if a.send_cq.is_null() && cm.id.send_cq.is_null() {
        a.cap.max_send_wr
    } else {
        0
    };
    let recv = if a.recv_cq.is_null() && cm.id.recv_cq.is_null() {
        a.cap.max_recv_wr
    } else {
        0
    };
    if let Err(e) = create_cqs(cm, send, recv) {
        return err(e);
    }
    if a.send_cq.is_null() {
        a.send_cq = cm.id.send_cq;
    }
    if a.recv_cq.is_null() {
        a.recv_cq = cm.id.recv_cq;
    }
    if !cm.id.srq.is_null() && a.srq.is_null() {
        a.srq = cm.id.srq;
    }
    // SAFETY: the id's context and the program's attributes.
    let qp = unsafe { crate::qp::create::create_qp_ex(cm.id.verbs, a) };
    if qp.is_null() {
        let e = std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EINVAL);
        destroy_cqs(cm);
        return err(e);
    }
    cm.id.qp = qp;
    let Ok(c) = cma() else {
        return -1;
    };
    let ud = c.ids.get(&key).is_some_and(|s| s.ud);
    let r = if ud {
        modify(&c, key, ffi::IBV_QPS_INIT).and_then(|()| {
            let mut x = ffi::ibv_qp_attr {
                qp_state: ffi::IBV_QPS_RTR,
                ..Default::default()
            };
            // SAFETY: the QP just made.
            let e =
                unsafe { crate::qp::ferroce_ibv_modify_qp(qp, &mut x, ffi::IBV_QP_STATE as c_int) };
            if e != 0 {
                return Err(e);
            }
            x.qp_state = ffi::IBV_QPS_RTS;
            x.sq_psn = 0;
            // SAFETY: as above.
            match unsafe {
                crate::qp::ferroce_ibv_modify_qp(
                    qp,
                    &mut x,
                    (ffi::IBV_QP_STATE | ffi::IBV_QP_SQ_PSN) as c_int,
                )
            } {
                0 => Ok(()),
                e => Err(e),
            }
        })
    } else {
        // INIT with no remote access: the connection's attributes come with RTR.
        let mut x = ffi::ibv_qp_attr {
            qp_state: ffi::IBV_QPS_INIT,
            pkey_index: 0,
            port_num: 1,
            ..Default::default()
        };
        // SAFETY: the QP just made.
        match unsafe {
            crate::qp::ferroce_ibv_modify_qp(
                qp,
                &mut x,
                (ffi::IBV_QP_STATE
                    | ffi::IBV_QP_PKEY_INDEX
                    | ffi::IBV_QP_PORT
                    | ffi::IBV_QP_ACCESS_FLAGS) as c_int,
            )
        } {
            0 => Ok(()),
            e => Err(e),
        }
    };
    drop(c);
    if let Err(e) = r {
        // SAFETY: the QP just made, not yet the program's.
        unsafe { crate::qp::ferroce_ibv_destroy_qp(qp) };
        cm.id.qp = std::ptr::null_mut();
        destroy_cqs(cm);
        return err(e);
    }
    // SAFETY: the QP just made.
    cm.id.pd = unsafe { (*qp).pd };
    0
}

/// `rdma_create_qp`.
///
/// # Safety
/// `id` is a live id; `pd` is null or a PD of the id's context; `init` is valid.
#[no_mangle]
pub unsafe extern "C" fn ferroce_rdma_create_qp(
    id: *mut ffi::rdma_cm_id,
    pd: *mut ffi::ibv_pd,
    init: *mut ffi::ibv_qp_init_attr,
) -> c_int {
    // SAFETY: per the contract.
    let Some(i) = (unsafe { init.as_mut() }) else {
        return err(libc::EINVAL);
    };
    let mut ex = ffi::ibv_qp_init_attr_ex {
        qp_context: i.qp_context,
        send_cq: i.send_cq,
        recv_cq: i.recv_cq,
        srq: i.srq,
        cap: i.cap,
        qp_type: i.qp_type,
        sq_sig_all: i.sq_sig_all,
        comp_mask: ffi::IBV_QP_INIT_ATTR_PD,
        // SAFETY: per the contract.
        pd: if pd.is_null() {
            unsafe { (*id).pd }
        } else {
            pd
        },
        ..Default::default()
    };
    // SAFETY: per the contract.
    let r = unsafe { ferroce_rdma_create_qp_ex(id, &mut ex) };
    i.send_cq = ex.send_cq;
    i.recv_cq = ex.recv_cq;
    i.srq = ex.srq;
    i.cap = ex.cap;
    r
}

/// `rdma_destroy_qp`: the QP, and the CQs librdmacm made for it.
///
/// # Safety
/// `id` is a live id.
#[no_mangle]
pub unsafe extern "C" fn ferroce_rdma_destroy_qp(id: *mut ffi::rdma_cm_id) {
    // SAFETY: per the contract.
    let Some(cm) = (unsafe { (id as *mut CmId).as_mut() }) else {
        return;
    };
    if !cm.id.qp.is_null() {
        // SAFETY: the id's QP, destroyed once.
        unsafe { crate::qp::ferroce_ibv_destroy_qp(cm.id.qp) };
        cm.id.qp = std::ptr::null_mut();
    }
    destroy_cqs(cm);
}

/// `rdma_create_srq_ex`: a basic SRQ on the id's PD (XRC SRQs are not offered:
/// `EOPNOTSUPP`).
///
/// # Safety
/// `id` is a live id; `attr` is valid.
#[no_mangle]
pub unsafe extern "C" fn ferroce_rdma_create_srq_ex(
    id: *mut ffi::rdma_cm_id,
    attr: *mut ffi::ibv_srq_init_attr_ex,
) -> c_int {
    // SAFETY: per the contract.
    let (Some(a), Some(cm)) = (unsafe { attr.as_mut() }, unsafe {
        (id as *mut CmId).as_mut()
    }) else {
        return err(libc::EINVAL);
    };
    if a.comp_mask & ffi::IBV_SRQ_INIT_ATTR_TYPE == 0 {
        return err(libc::EINVAL);
    }
    if a.srq_type == ffi::IBV_SRQT_XRC {
        return err(libc::EOPNOTSUPP);
    }
    if a.comp_mask & ffi::IBV_SRQ_INIT_ATTR_PD == 0 || a.pd.is_null() {
        a.pd = cm.id.pd;
        a.comp_mask |= ffi::IBV_SRQ_INIT_ATTR_PD;
    }
    // SAFETY: the id's context and the program's attributes.
    let srq = unsafe { crate::srq::create_srq_ex(cm.id.verbs, a) };
    if srq.is_null() {
        return -1;
    }
    if cm.id.pd.is_null() {
        cm.id.pd = a.pd;
    }
    cm.id.srq = srq;
    0
}

/// `rdma_create_srq`.
///
/// # Safety
/// `id` is a live id; `pd` is null or a PD of its context; `attr` is valid.
#[no_mangle]
pub unsafe extern "C" fn ferroce_rdma_create_srq(
    id: *mut ffi::rdma_cm_id,
    pd: *mut ffi::ibv_pd,
    attr: *mut ffi::ibv_srq_init_attr,
) -> c_int {
    // SAFETY: per the contract.
    let Some(i) = (unsafe { attr.as_mut() }) else {
        return err(libc::EINVAL);
    };
    let mut ex = ffi::ibv_srq_init_attr_ex {
        srq_context: i.srq_context,
        attr: i.attr,
        comp_mask: ffi::IBV_SRQ_INIT_ATTR_TYPE | ffi::IBV_SRQ_INIT_ATTR_PD,
        srq_type: ffi::IBV_SRQT_BASIC,
        pd,
        ..Default::default()
    };
    // SAFETY: per the contract.
    let r = unsafe { ferroce_rdma_create_srq_ex(id, &mut ex) };
    i.attr = ex.attr;
    r
}

/// `rdma_destroy_srq`.
///
/// # Safety
/// `id` is a live id.
#[no_mangle]
pub unsafe extern "C" fn ferroce_rdma_destroy_srq(id: *mut ffi::rdma_cm_id) {
    // SAFETY: per the contract.
    let Some(cm) = (unsafe { (id as *mut CmId).as_mut() }) else {
        return;
    };
    if !cm.id.srq.is_null() {
        // SAFETY: the id's SRQ, destroyed once.
        unsafe { crate::srq::ferroce_ibv_destroy_srq(cm.id.srq) };
        cm.id.srq = std::ptr::null_mut();
    }
    destroy_cqs(cm);
}
