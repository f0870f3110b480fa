//! The data path: `ibv_post_send`, `ibv_post_recv`, `ibv_post_srq_recv`, `ibv_poll_cq` and
//! `ibv_req_notify_cq` are inline functions in the header that call through the context's
//! ops table, so these are the table's entries. Work requests are read out of the program's
//! lists at post time (as a NIC reads its WQEs) and handed to ferroce one by one; the first
//! refused one is returned in `bad_wr` with an errno, the ones before it stay posted.

use std::ffi::c_int;

use ferroce_stack::transport::{
    Payload, PostError, RecvWr, SendFlags, SendWr, Sge, UdDest, WrOpcode,
};
use ferroce_stack::wire::Qpn;

use crate::ah::Ah;
use crate::cq::to_wc;
use crate::cq::Cq;
use crate::ffi;
use crate::objects::object;
use crate::qp::{Qp, QpKind, MAX_INLINE};
use crate::srq::Srq;
use crate::wr::errno;

/// Most scatter/gather elements in one WR (the device's `max_sge`).
const MAX_SGE: usize = 30;

/// The errno for a refused receive WR: a full queue is ENOMEM, anything else (too many
/// scatter elements included) EINVAL, as mlx5 gives them.
fn recv_errno(e: PostError) -> c_int {
    match e {
        PostError::QueueFull(_) => libc::ENOMEM,
        _ => libc::EINVAL,
    }
}

fn opcode(op: ffi::ibv_wr_opcode) -> Option<WrOpcode> {
    Some(match op {
        ffi::IBV_WR_RDMA_WRITE => WrOpcode::Write,
        ffi::IBV_WR_RDMA_WRITE_WITH_IMM => WrOpcode::WriteWithImm,
        ffi::IBV_WR_SEND => WrOpcode::Send,
        ffi::IBV_WR_SEND_WITH_IMM => WrOpcode::SendWithImm,
        ffi::IBV_WR_RDMA_READ => WrOpcode::Read,
        ffi::IBV_WR_ATOMIC_CMP_AND_SWP => WrOpcode::CmpSwp,
        ffi::IBV_WR_ATOMIC_FETCH_AND_ADD => WrOpcode::FetchAdd,
        ffi::IBV_WR_SEND_WITH_INV => WrOpcode::SendWithInv,
        ffi::IBV_WR_LOCAL_INV => WrOpcode::LocalInv,
        ffi::IBV_WR_BIND_MW => WrOpcode::BindMw,
        ffi::IBV_WR_ATOMIC_WRITE => WrOpcode::AtomicWrite,
        _ => return None,
    })
}

/// Copies a WR's gather list out of the program's memory.
///
/// # Safety
/// `list` points to `n` `struct ibv_sge` (when `n > 0`).
unsafe fn sges(list: *const ffi::ibv_sge, n: c_int, out: &mut [Sge; MAX_SGE]) -> Option<usize> {
    let n = usize::try_from(n).ok()?;
    if n > MAX_SGE || (n > 0 && list.is_null()) {
        return None;
    }
    for (i, slot) in out.iter_mut().enumerate().take(n) {
        // SAFETY: `i < n` elements per the contract.
        let s = unsafe { &*list.add(i) };
        *slot = Sge {
            addr: s.addr,
            length: s.length,
            lkey: s.lkey,
        };
    }
    Some(n)
}

/// One send WR, posted. Err holds the errno.
///
/// # Safety
/// `w` is a WR the program built: its gather list valid, its AH (UD) live, and for an
/// inline WR each element's bytes readable.
pub(crate) unsafe fn post_one(q: &Qp, w: &ffi::ibv_send_wr) -> Result<(), c_int> {
    let op = opcode(w.opcode).ok_or(libc::EINVAL)?;
    if op == WrOpcode::BindMw {
        // SAFETY: the union's bind member for a bind request.
        let b = unsafe { w.__bindgen_anon_2.bind_mw };
        let bind = crate::wr::Bind {
            mw: b.mw,
            rkey: b.rkey,
            info: b.bind_info,
        };
        return crate::mw::post_bind(q, w, &bind);
    }
    let mut list = [Sge::default(); MAX_SGE];
    // SAFETY: per the contract.
    let n = unsafe { sges(w.sg_list, w.num_sge, &mut list) }.ok_or(
        // More elements than any QP is granted do not fit the WQE: ENOMEM, as mlx5 says.
        if w.num_sge > MAX_SGE as c_int {
            libc::ENOMEM
        } else {
            libc::EINVAL
        },
    )?;
    let flags = w.send_flags;
    // Only an inline WR pays for (and zeroes) the copy buffer.
    let mut inline;
    let payload = if flags & ffi::IBV_SEND_INLINE != 0 && !op.is_read_or_atomic() {
        // Inline data is read from the program's memory now, keys unchecked, as a NIC
        // copies it into the WQE.
        inline = [0u8; MAX_INLINE as usize];
        let mut len = 0usize;
        for s in &list[..n] {
            let l = s.length as usize;
            if len + l > inline.len() {
                return Err(libc::ENOMEM);
            }
            if l > 0 {
                // SAFETY: the program promises `l` readable bytes at `addr` for an inline WR.
                let src = unsafe { std::slice::from_raw_parts(s.addr as *const u8, l) };
                inline[len..len + l].copy_from_slice(src);
            }
            len += l;
        }
        Payload::Inline(&inline[..len])
    } else {
        Payload::Sges(&list[..n])
    };
    // SAFETY: reading the union as the member the opcode selects; all are plain integers.
    let (imm_data, remote_addr, rkey, compare_add, swap) = unsafe {
        let imm = match op {
            WrOpcode::SendWithInv | WrOpcode::LocalInv => w.__bindgen_anon_1.invalidate_rkey,
            // `imm_data` is big-endian in memory; ferroce carries the value the wire shows.
            _ => u32::from_be(w.__bindgen_anon_1.imm_data),
        };
        if op.is_atomic() {
            let a = w.wr.atomic;
            (imm, a.remote_addr, a.rkey, a.compare_add, a.swap)
        } else {
            let r = w.wr.rdma;
            (imm, r.remote_addr, r.rkey, 0, 0)
        }
    };
    let ud = if q.base().qp_type == ffi::IBV_QPT_UD {
        // SAFETY: the union's UD member for a UD QP; the AH is live per the contract.
        let u = unsafe { w.wr.ud };
        let ah = unsafe { object::<Ah, _>(u.ah) }.ok_or(libc::EINVAL)?;
        Some(UdDest {
            av: ah.av,
            remote_qpn: Qpn::new(u.remote_qpn & 0xff_ffff),
            remote_qkey: u.remote_qkey,
        })
    } else {
        None
    };
    let wr = SendWr {
        wr_id: w.wr_id,
        opcode: op,
        flags: SendFlags(
            flags & (ffi::IBV_SEND_FENCE | ffi::IBV_SEND_SIGNALED | ffi::IBV_SEND_SOLICITED),
        ),
        payload,
        imm_data,
        remote_addr,
        rkey,
        compare_add,
        swap,
        ud,
    };
    match &q.qp {
        QpKind::Rdma(r) => r.post_send(&[wr]),
        QpKind::Raw(r) => r.post_send(&[wr]),
    }
    .map_err(|f| errno(f.error))
}

/// `ops.post_send`.
unsafe extern "C" fn post_send(
    qp: *mut ffi::ibv_qp,
    wr: *mut ffi::ibv_send_wr,
    bad: *mut *mut ffi::ibv_send_wr,
) -> c_int {
    // SAFETY: the header calls this with the program's QP.
    let Some(q) = (unsafe { object::<Qp, _>(qp) }) else {
        return libc::EINVAL;
    };
    let mut cur = wr;
    // SAFETY: the program's list of WRs, each valid until this returns.
    while let Some(w) = unsafe { cur.as_ref() } {
        // SAFETY: as above.
        if let Err(e) = unsafe { post_one(q, w) } {
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

/// Reads receive WRs and posts each with `post`; the first refused is reported.
///
/// # Safety
/// `wr` is the program's list; `bad` null or writable.
pub(crate) unsafe fn post_recvs(
    wr: *mut ffi::ibv_recv_wr,
    bad: *mut *mut ffi::ibv_recv_wr,
    post: impl Fn(&RecvWr<'_>) -> Result<(), PostError>,
) -> c_int {
    let mut cur = wr;
    // SAFETY: the program's list, valid until this returns.
    while let Some(w) = unsafe { cur.as_ref() } {
        let mut list = [Sge::default(); MAX_SGE];
        // SAFETY: the WR's own gather list.
        let r = match unsafe { sges(w.sg_list, w.num_sge, &mut list) } {
            Some(n) => post(&RecvWr {
                wr_id: w.wr_id,
                sg_list: &list[..n],
            })
            .map_err(recv_errno),
            None => Err(libc::EINVAL),
        };
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

/// `ops.post_recv`.
unsafe extern "C" fn post_recv(
    qp: *mut ffi::ibv_qp,
    wr: *mut ffi::ibv_recv_wr,
    bad: *mut *mut ffi::ibv_recv_wr,
) -> c_int {
    // SAFETY: the header calls this with the program's QP.
    let Some(q) = (unsafe { object::<Qp, _>(qp) }) else {
        return libc::EINVAL;
    };
    // SAFETY: the program's list and out-pointer.
    unsafe {
        post_recvs(wr, bad, |r| {
            match &q.qp {
                QpKind::Rdma(qp) => qp.post_recv(std::slice::from_ref(r)),
                QpKind::Raw(qp) => qp.post_recv(std::slice::from_ref(r)),
            }
            .map_err(|f| f.error)
        })
    }
}

/// `ops.post_srq_recv`.
unsafe extern "C" fn post_srq_recv(
    srq: *mut ffi::ibv_srq,
    wr: *mut ffi::ibv_recv_wr,
    bad: *mut *mut ffi::ibv_recv_wr,
) -> c_int {
    // SAFETY: the header calls this with the program's SRQ.
    let Some(s) = (unsafe { object::<Srq, _>(srq) }) else {
        return libc::EINVAL;
    };
    // SAFETY: the program's list and out-pointer.
    unsafe {
        post_recvs(wr, bad, |r| {
            s.srq
                .post_recv(std::slice::from_ref(r))
                .map_err(|f| f.error)
        })
    }
}

/// `ops.poll_cq`.
unsafe extern "C" fn poll_cq(cq: *mut ffi::ibv_cq, num: c_int, wc: *mut ffi::ibv_wc) -> c_int {
    // SAFETY: the header calls this with the program's CQ.
    let (Some(c), false) = (unsafe { object::<Cq, _>(cq) }, wc.is_null()) else {
        return -1;
    };
    let mut n = 0;
    while n < num {
        let Some(w) = c.cq.poll_one() else { break };
        // SAFETY: the program's array holds `num` completions.
        unsafe { wc.add(n as usize).write(to_wc(&w)) };
        n += 1;
    }
    if n == 0 {
        // The service this CQ's context is attached to has gone: nothing will come.
        if c.cq.is_fatal() {
            return -1;
        }
        // The engine thread makes the progress this program waits for; a program spinning
        // on an empty CQ must not keep it off a busy machine's cores.
        std::thread::yield_now();
    }
    n
}

/// `ops.req_notify_cq`.
unsafe extern "C" fn req_notify_cq(cq: *mut ffi::ibv_cq, solicited_only: c_int) -> c_int {
    // SAFETY: the header calls this with the program's CQ.
    match unsafe { object::<Cq, _>(cq) } {
        Some(c) => {
            c.cq.req_notify(solicited_only != 0);
            0
        }
        None => libc::EINVAL,
    }
}

/// The ops table of every context.
pub(crate) fn table() -> ffi::ibv_context_ops {
    ffi::ibv_context_ops {
        alloc_mw: Some(crate::mw::alloc_mw),
        bind_mw: Some(crate::mw::bind_mw),
        dealloc_mw: Some(crate::mw::dealloc_mw),
        poll_cq: Some(poll_cq),
        req_notify_cq: Some(req_notify_cq),
        post_srq_recv: Some(post_srq_recv),
        post_send: Some(post_send),
        post_recv: Some(post_recv),
        ..Default::default()
    }
}
