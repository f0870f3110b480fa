//! The extended post API (`ibv_wr_start` ... `ibv_wr_complete`): a QP created with
//! `send_ops_flags` builds work requests one call at a time into a batch, which
//! `ibv_wr_complete` posts in order through the same path as `ibv_post_send` (see
//! [`crate::ops`]) and `ibv_wr_abort` drops. As on mlx5, an error met while building (an
//! operation the QP was not created for, a gather list too long, inline data too large)
//! poisons the batch: `ibv_wr_complete` then posts nothing and returns the error. Inline data
//! is copied when it is set, so the program may reuse its buffer at once.

use std::ffi::{c_int, c_void};

use ferroce_stack::transport::QpType;

use crate::ffi;
use crate::qp::{Qp, MAX_INLINE};
use crate::wr::{Batch, BatchWr, Bind};

/// The operations a QP of type `t` may be created for (`IBV_QP_EX_WITH_*`).
pub(crate) fn supported_send_ops(t: QpType) -> u64 {
    let rdma = ffi::IBV_QP_EX_WITH_SEND
        | ffi::IBV_QP_EX_WITH_SEND_WITH_IMM
        | ffi::IBV_QP_EX_WITH_RDMA_WRITE
        | ffi::IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM;
    u64::from(match t {
        QpType::Rc => {
            rdma | ffi::IBV_QP_EX_WITH_RDMA_READ
                | ffi::IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP
                | ffi::IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD
                | ffi::IBV_QP_EX_WITH_SEND_WITH_INV
                | ffi::IBV_QP_EX_WITH_ATOMIC_WRITE
                | crate::mw::qp_ex_ops()
        }
        QpType::Uc => rdma | crate::mw::qp_ex_ops(),
        QpType::Ud => ffi::IBV_QP_EX_WITH_SEND | ffi::IBV_QP_EX_WITH_SEND_WITH_IMM,
    })
}

/// Fills the `ibv_wr_*` entry points of a QP created with `send_ops_flags`.
pub(crate) fn install(q: &mut ffi::ibv_qp_ex) {
    q.wr_start = Some(wr_start);
    q.wr_complete = Some(wr_complete);
    q.wr_abort = Some(wr_abort);
    q.wr_send = Some(wr_send);
    q.wr_send_imm = Some(wr_send_imm);
    q.wr_send_inv = Some(wr_send_inv);
    q.wr_rdma_write = Some(wr_rdma_write);
    q.wr_rdma_write_imm = Some(wr_rdma_write_imm);
    q.wr_rdma_read = Some(wr_rdma_read);
    q.wr_atomic_cmp_swp = Some(wr_atomic_cmp_swp);
    q.wr_atomic_fetch_add = Some(wr_atomic_fetch_add);
    q.wr_bind_mw = Some(wr_bind_mw);
    q.wr_local_inv = Some(wr_local_inv);
    q.wr_send_tso = Some(wr_send_tso);
    q.wr_atomic_write = Some(wr_atomic_write);
    q.wr_set_sge = Some(wr_set_sge);
    q.wr_set_sge_list = Some(wr_set_sge_list);
    q.wr_set_inline_data = Some(wr_set_inline_data);
    q.wr_set_inline_data_list = Some(wr_set_inline_data_list);
    q.wr_set_ud_addr = Some(wr_set_ud_addr);
    q.wr_set_xrc_srqn = Some(wr_set_xrc_srqn);
}

/// The QP behind an extended QP pointer.
///
/// # Safety
/// `q` is a live QP of this library.
unsafe fn qp<'a>(q: *mut ffi::ibv_qp_ex) -> &'a Qp {
    // SAFETY: per the contract (the extended QP starts the QP object).
    unsafe { &*(q as *const Qp) }
}

/// Runs `f` on the QP's batch.
fn with_batch<T>(q: *mut ffi::ibv_qp_ex, f: impl FnOnce(&Qp, &mut Batch) -> T) -> T {
    // SAFETY: the entry points are called with the program's QP.
    let p = unsafe { qp(q) };
    let mut b = p.batch.lock().unwrap_or_else(|e| e.into_inner());
    f(p, &mut b)
}

/// Poisons the batch with `e` unless an error is there already.
fn fail(b: &mut Batch, e: c_int) {
    if b.error == 0 {
        b.error = e;
    }
}

unsafe extern "C" fn wr_start(q: *mut ffi::ibv_qp_ex) {
    with_batch(q, |_, b| {
        b.open = true;
        b.wrs.clear();
        b.error = 0;
    });
}

unsafe extern "C" fn wr_abort(q: *mut ffi::ibv_qp_ex) {
    with_batch(q, |_, b| {
        b.open = false;
        b.wrs.clear();
        b.error = 0;
    });
}

unsafe extern "C" fn wr_complete(q: *mut ffi::ibv_qp_ex) -> c_int {
    with_batch(q, |p, b| {
        let open = std::mem::take(&mut b.open);
        let error = std::mem::take(&mut b.error);
        let mut wrs = std::mem::take(&mut b.wrs);
        if !open {
            return libc::EINVAL;
        }
        if error != 0 {
            return error;
        }
        // Link the batch as an `ibv_post_send` list, pointing at the batch's own gather
        // lists and inline copies, and post it.
        for w in wrs.iter_mut() {
            if let Some(data) = &w.inline {
                w.sges = vec![ffi::ibv_sge {
                    addr: data.as_ptr() as u64,
                    length: data.len() as u32,
                    lkey: 0,
                }];
                w.wr.send_flags |= ffi::IBV_SEND_INLINE;
            }
            w.wr.sg_list = w.sges.as_mut_ptr();
            w.wr.num_sge = w.sges.len() as c_int;
        }
        for w in &wrs {
            let r = match &w.bind {
                Some(bind) => crate::mw::post_bind(p, &w.wr, bind),
                // SAFETY: the WR's gather list and inline copies live in `wrs`, its AH
                // (UD) is the program's live handle.
                None => unsafe { crate::ops::post_one(p, &w.wr) },
            };
            if let Err(e) = r {
                return e;
            }
        }
        0
    })
}

/// Opens a new WR of the batch with the QP's `wr_id` and `wr_flags` and `opcode`, if the QP
/// was created for the operation `op` (an `IBV_QP_EX_WITH_*` bit).
fn begin(q: *mut ffi::ibv_qp_ex, op: u32, opcode: ffi::ibv_wr_opcode) -> Option<()> {
    // SAFETY: the program's QP; `wr_id` and `wr_flags` are its fields to set.
    let (wr_id, flags) = unsafe { ((*q).wr_id, (*q).wr_flags) };
    with_batch(q, |p, b| {
        if !b.open {
            fail(b, libc::EINVAL);
            return None;
        }
        if p.send_ops & u64::from(op) == 0 {
            fail(b, libc::EOPNOTSUPP);
            return None;
        }
        b.wrs.push(BatchWr {
            wr: ffi::ibv_send_wr {
                wr_id,
                opcode,
                send_flags: flags,
                ..Default::default()
            },
            sges: Vec::new(),
            inline: None,
            bind: None,
        });
        Some(())
    })
}

/// Changes the WR just begun.
fn last(q: *mut ffi::ibv_qp_ex, f: impl FnOnce(&Qp, &mut BatchWr) -> Result<(), c_int>) {
    with_batch(q, |p, b| {
        let r = match b.wrs.last_mut() {
            Some(w) => f(p, w),
            None => Err(libc::EINVAL),
        };
        if let Err(e) = r {
            fail(b, e);
        }
    });
}

unsafe extern "C" fn wr_send(q: *mut ffi::ibv_qp_ex) {
    let _ = begin(q, ffi::IBV_QP_EX_WITH_SEND, ffi::IBV_WR_SEND);
}

unsafe extern "C" fn wr_send_imm(q: *mut ffi::ibv_qp_ex, imm: u32) {
    if begin(
        q,
        ffi::IBV_QP_EX_WITH_SEND_WITH_IMM,
        ffi::IBV_WR_SEND_WITH_IMM,
    )
    .is_some()
    {
        last(q, |_, w| {
            w.wr.__bindgen_anon_1.imm_data = imm;
            Ok(())
        });
    }
}

unsafe extern "C" fn wr_send_inv(q: *mut ffi::ibv_qp_ex, rkey: u32) {
    if begin(
        q,
        ffi::IBV_QP_EX_WITH_SEND_WITH_INV,
        ffi::IBV_WR_SEND_WITH_INV,
    )
    .is_some()
    {
        last(q, |_, w| {
            w.wr.__bindgen_anon_1.invalidate_rkey = rkey;
            Ok(())
        });
    }
}

fn rdma(q: *mut ffi::ibv_qp_ex, op: u32, opcode: ffi::ibv_wr_opcode, rkey: u32, addr: u64) {
    if begin(q, op, opcode).is_some() {
        last(q, |_, w| {
            w.wr.wr.rdma = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 {
                remote_addr: addr,
                rkey,
            };
            Ok(())
        });
    }
}

unsafe extern "C" fn wr_rdma_write(q: *mut ffi::ibv_qp_ex, rkey: u32, addr: u64) {
    rdma(
        q,
        ffi::IBV_QP_EX_WITH_RDMA_WRITE,
        ffi::IBV_WR_RDMA_WRITE,
        rkey,
        addr,
    );
}

unsafe extern "C" fn wr_rdma_write_imm(q: *mut ffi::ibv_qp_ex, rkey: u32, addr: u64, imm: u32) {
    rdma(
        q,
        ffi::IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM,
        ffi::IBV_WR_RDMA_WRITE_WITH_IMM,
        rkey,
        addr,
    );
    last(q, |_, w| {
        w.wr.__bindgen_anon_1.imm_data = imm;
        Ok(())
    });
}

unsafe extern "C" fn wr_rdma_read(q: *mut ffi::ibv_qp_ex, rkey: u32, addr: u64) {
    rdma(
        q,
        ffi::IBV_QP_EX_WITH_RDMA_READ,
        ffi::IBV_WR_RDMA_READ,
        rkey,
        addr,
    );
}

fn atomic(
    q: *mut ffi::ibv_qp_ex,
    op: u32,
    opcode: ffi::ibv_wr_opcode,
    rkey: u32,
    addr: u64,
    compare_add: u64,
    swap: u64,
) {
    if begin(q, op, opcode).is_some() {
        last(q, |_, w| {
            w.wr.wr.atomic = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_2 {
                remote_addr: addr,
                compare_add,
                swap,
                rkey,
            };
            Ok(())
        });
    }
}

unsafe extern "C" fn wr_atomic_cmp_swp(
    q: *mut ffi::ibv_qp_ex,
    rkey: u32,
    addr: u64,
    compare: u64,
    swap: u64,
) {
    atomic(
        q,
        ffi::IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP,
        ffi::IBV_WR_ATOMIC_CMP_AND_SWP,
        rkey,
        addr,
        compare,
        swap,
    );
}

unsafe extern "C" fn wr_atomic_fetch_add(q: *mut ffi::ibv_qp_ex, rkey: u32, addr: u64, add: u64) {
    atomic(
        q,
        ffi::IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD,
        ffi::IBV_WR_ATOMIC_FETCH_AND_ADD,
        rkey,
        addr,
        add,
        0,
    );
}

unsafe extern "C" fn wr_bind_mw(
    q: *mut ffi::ibv_qp_ex,
    mw: *mut ffi::ibv_mw,
    rkey: u32,
    info: *const ffi::ibv_mw_bind_info,
) {
    if begin(q, ffi::IBV_QP_EX_WITH_BIND_MW, ffi::IBV_WR_BIND_MW).is_some() {
        last(q, |_, w| {
            // SAFETY: null or the program's bind information, read now.
            let info = unsafe { info.as_ref() }.ok_or(libc::EINVAL)?;
            w.bind = Some(Bind {
                mw,
                rkey,
                info: *info,
            });
            Ok(())
        });
    }
}

unsafe extern "C" fn wr_local_inv(q: *mut ffi::ibv_qp_ex, rkey: u32) {
    if begin(q, ffi::IBV_QP_EX_WITH_LOCAL_INV, ffi::IBV_WR_LOCAL_INV).is_some() {
        last(q, |_, w| {
            w.wr.__bindgen_anon_1.invalidate_rkey = rkey;
            Ok(())
        });
    }
}

/// TSO is for raw packet QPs on a NIC that segments; not offered.
unsafe extern "C" fn wr_send_tso(q: *mut ffi::ibv_qp_ex, _hdr: *mut c_void, _hs: u16, _mss: u16) {
    let _ = begin(q, ffi::IBV_QP_EX_WITH_TSO, ffi::IBV_WR_TSO);
}

/// RDMA ATOMIC WRITE (IBTA 1.5): the 8 bytes at `data`, copied now, land at `addr` in one
/// store.
unsafe extern "C" fn wr_atomic_write(
    q: *mut ffi::ibv_qp_ex,
    rkey: u32,
    addr: u64,
    data: *const c_void,
) {
    rdma(
        q,
        ffi::IBV_QP_EX_WITH_ATOMIC_WRITE,
        ffi::IBV_WR_ATOMIC_WRITE,
        rkey,
        addr,
    );
    last(q, |_, w| {
        if data.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the program's 8 bytes, per the header's contract, read now.
        w.inline = Some(unsafe { std::slice::from_raw_parts(data as *const u8, 8) }.to_vec());
        Ok(())
    });
}

unsafe extern "C" fn wr_set_sge(q: *mut ffi::ibv_qp_ex, lkey: u32, addr: u64, length: u32) {
    last(q, |_, w| {
        w.sges = vec![ffi::ibv_sge { addr, length, lkey }];
        w.inline = None;
        Ok(())
    });
}

unsafe extern "C" fn wr_set_sge_list(q: *mut ffi::ibv_qp_ex, n: usize, list: *const ffi::ibv_sge) {
    last(q, |p, w| {
        if n > p.caps.max_send_sge as usize || (n > 0 && list.is_null()) {
            return Err(libc::EINVAL);
        }
        w.sges = if n == 0 {
            Vec::new()
        } else {
            // SAFETY: `n` elements per the header's contract.
            unsafe { std::slice::from_raw_parts(list, n) }.to_vec()
        };
        w.inline = None;
        Ok(())
    });
}

unsafe extern "C" fn wr_set_inline_data(q: *mut ffi::ibv_qp_ex, addr: *mut c_void, length: usize) {
    let buf = ffi::ibv_data_buf { addr, length };
    // SAFETY: one live element.
    unsafe { wr_set_inline_data_list(q, 1, &buf) };
}

unsafe extern "C" fn wr_set_inline_data_list(
    q: *mut ffi::ibv_qp_ex,
    n: usize,
    list: *const ffi::ibv_data_buf,
) {
    last(q, |p, w| {
        if n > 0 && list.is_null() {
            return Err(libc::EINVAL);
        }
        let mut data = Vec::new();
        for i in 0..n {
            // SAFETY: `n` elements per the header's contract.
            let b = unsafe { &*list.add(i) };
            let max = p.caps.max_inline_data.min(MAX_INLINE) as usize;
            if data.len() + b.length > max || (b.length > 0 && b.addr.is_null()) {
                return Err(libc::EINVAL);
            }
            if b.length > 0 {
                // SAFETY: the program's `length` readable bytes, copied now.
                data.extend_from_slice(unsafe {
                    std::slice::from_raw_parts(b.addr as *const u8, b.length)
                });
            }
        }
        w.inline = Some(data);
        w.sges.clear();
        Ok(())
    });
}

unsafe extern "C" fn wr_set_ud_addr(
    q: *mut ffi::ibv_qp_ex,
    ah: *mut ffi::ibv_ah,
    qpn: u32,
    qkey: u32,
) {
    last(q, |_, w| {
        w.wr.wr.ud = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_3 {
            ah,
            remote_qpn: qpn,
            remote_qkey: qkey,
        };
        Ok(())
    });
}

/// XRC is not offered.
unsafe extern "C" fn wr_set_xrc_srqn(q: *mut ffi::ibv_qp_ex, _srqn: u32) {
    last(q, |_, _| Err(libc::EOPNOTSUPP));
}
