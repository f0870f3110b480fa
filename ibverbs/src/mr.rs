//! Memory regions: registration, re-registration and deregistration.

use std::ffi::{c_int, c_void};
use std::sync::Mutex;

use ferroce_stack::transport::Access;
use ferroce_verbs::MemoryRegion;

use crate::device::set_errno;
use crate::domain::{hold_pd, release_pd, Pd};
use crate::ffi;
use crate::objects::{forget_handle, free, object, publish, register_handle, HandleKind};

/// A registered memory region.
#[repr(C)]
pub struct Mr {
    pub(crate) ibv: ffi::ibv_mr,
    /// The registration; none for an MR `ibv_import_mr` made, whose registration is
    /// another context's.
    pub(crate) mr: Option<Mutex<MemoryRegion>>,
}

/// The rights ferroce keeps with a region: local write, the remote rights and
/// `IBV_ACCESS_MW_BIND` (windows may be bound to it). The other `IBV_ACCESS_*` bits (relaxed
/// ordering, on-demand paging, huge pages, zero-based addressing, which is applied when
/// registering) ask nothing of a software RNIC.
const ACCESS_BITS: u32 = 0x1f;

/// Access bits libibverbs defines: the eight mandatory ones and the optional range (bits
/// 20..30, which a device without them ignores); any other is `EINVAL`.
const KNOWN_ACCESS: u32 = 0xff | (0x3ff * ffi::IBV_ACCESS_OPTIONAL_FIRST);

fn reg(
    pd: *mut ffi::ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_int,
) -> *mut ffi::ibv_mr {
    // SAFETY: `pd` is null or a live PD (the caller's contract).
    let Some(p) = (unsafe { object::<Pd, _>(pd) }) else {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    };
    let access = access as u32;
    if access & !KNOWN_ACCESS != 0 {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    }
    // Implicit on-demand paging (the whole address space, `addr` NULL and `length`
    // SIZE_MAX) is not offered: a peer's access to an unmapped page could not be refused
    // without faulting on it.
    if access & ffi::IBV_ACCESS_ON_DEMAND != 0 && addr.is_null() && length == usize::MAX {
        set_errno(libc::EOPNOTSUPP);
        return std::ptr::null_mut();
    }
    let iova = if access & ffi::IBV_ACCESS_ZERO_BASED != 0 {
        0
    } else {
        iova
    };
    // SAFETY: the program registers memory it owns and keeps valid until `ibv_dereg_mr`, as
    // libibverbs requires of it.
    let mr = unsafe {
        p.pd.reg_mr_iova(addr as *mut u8, length, iova, Access(access & ACCESS_BITS))
    };
    match mr {
        Ok(mr) => {
            let m: *mut ffi::ibv_mr = publish(Mr {
                ibv: ffi::ibv_mr {
                    context: p.ibv.context,
                    pd,
                    addr,
                    length,
                    handle: 0,
                    lkey: mr.lkey(),
                    rkey: mr.rkey(),
                },
                mr: Some(Mutex::new(mr)),
            });
            // SAFETY: just made, not yet the program's; a live PD.
            unsafe {
                (*m).handle = register_handle(HandleKind::Mr, m.cast());
                hold_pd(pd);
            }
            m
        }
        Err(e) => {
            eprintln!("ferroce: ibv_reg_mr: {e}");
            set_errno(libc::EINVAL);
            std::ptr::null_mut()
        }
    }
}

/// `ibv_reg_mr`: the region is addressed by its virtual address.
///
/// # Safety
/// `pd` is a live PD; `addr .. addr + length` stays valid until `ibv_dereg_mr`.
#[no_mangle]
pub unsafe extern "C" fn ferroce_ibv_reg_mr(
    pd: *mut ffi::ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> *mut ffi::ibv_mr {
    reg(pd, addr, length, addr as u64, access)
}
symver!(ferroce_ibv_reg_mr => "ibv_reg_mr" @ "IBVERBS_1.1");

/// `ibv_reg_mr_iova2` (what the header's `ibv_reg_mr` calls for some flags): addressed
/// as `iova`.
///
/// # Safety
/// As `ibv_reg_mr`.
#[no_mangle]
pub unsafe extern "C" fn ferroce_ibv_reg_mr_iova2(
    pd: *mut ffi::ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: u32,
) -> *mut ffi::ibv_mr {
    reg(pd, addr, length, iova, access as c_int)
}
symver!(ferroce_ibv_reg_mr_iova2 => "ibv_reg_mr_iova2" @ "IBVERBS_1.8");

/// `ibv_reg_mr_iova`.
///
/// # Safety
/// As `ibv_reg_mr`.
#[no_mangle]
pub unsafe extern "C" fn ferroce_ibv_reg_mr_iova(
    pd: *mut ffi::ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_int,
) -> *mut ffi::ibv_mr {
    reg(pd, addr, length, iova, access)
}
symver!(ferroce_ibv_reg_mr_iova => "ibv_reg_mr_iova" @ "IBVERBS_1.7");

/// `ibv_dereg_mr`: the keys stop working at once; a later access by a peer fails with a
/// remote access error.
///
/// # Safety
/// `mr` came from `ibv_reg_mr` and is not used again.
#[no_mangle]
pub unsafe extern "C" fn ferroce_ibv_dereg_mr(mr: *mut ffi::ibv_mr) -> c_int {
    // SAFETY: per the contract.
    if let Some(m) = unsafe { object::<Mr, _>(mr) } {
        if m.mr.is_some() {
            forget_handle(m.ibv.handle);
            // SAFETY: the region's PD outlives it.
            unsafe { release_pd(m.ibv.pd) };
        }
    }
    // SAFETY: per the contract.
    unsafe { free::<Mr, _>(mr) }
}
symver!(ferroce_ibv_dereg_mr => "ibv_dereg_mr" @ "IBVERBS_1.1");

/// `ibv_rereg_mr`: in place, keeping the region's keys (so a peer's copy of its rkey stays
/// good): `IBV_REREG_MR_CHANGE_TRANSLATION` moves it to `length` bytes at `addr`,
/// `_CHANGE_PD` to another protection domain of the context, `_CHANGE_ACCESS` to new rights.
/// 0, or libibverbs' negative `IBV_REREG_MR_ERR_*` code (the region unchanged).
///
/// # Safety
/// `mr` is a live MR; `pd` null or a live PD; new memory stays valid until deregistration.
#[no_mangle]
pub unsafe extern "C" fn ferroce_ibv_rereg_mr(
    mr: *mut ffi::ibv_mr,
    flags: c_int,
    pd: *mut ffi::ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> c_int {
    let input = ffi::IBV_REREG_MR_ERR_INPUT;
    // SAFETY: per the contract.
    let Some(m) = (unsafe { object::<Mr, _>(mr) }) else {
        return input;
    };
    let flags = flags as u32;
    if flags == 0 || flags & !ffi::IBV_REREG_MR_FLAGS_SUPPORTED != 0 {
        return input;
    }
    let new_pd = if flags & ffi::IBV_REREG_MR_CHANGE_PD != 0 {
        // SAFETY: per the contract.
        match unsafe { object::<Pd, _>(pd) } {
            Some(p) if p.ibv.context == m.ibv.context => Some(p),
            _ => return input,
        }
    } else {
        None
    };
    let memory = if flags & ffi::IBV_REREG_MR_CHANGE_TRANSLATION != 0 {
        if addr.is_null() || length == 0 {
            return input;
        }
        Some((addr as *mut u8, length, addr as u64))
    } else {
        None
    };
    let rights = if flags & ffi::IBV_REREG_MR_CHANGE_ACCESS != 0 {
        let a = access as u32;
        if a & !KNOWN_ACCESS != 0 {
            return input;
        }
        Some(Access(a & ACCESS_BITS))
    } else {
        None
    };
    let Some(r) = &m.mr else {
        return input;
    };
    let mut r = r.lock().unwrap_or_else(|e| e.into_inner());
    // SAFETY: new memory is the program's, per the contract.
    if let Err(e) = unsafe { r.rereg(new_pd.map(|p| &p.pd), memory, rights) } {
        eprintln!("ferroce: ibv_rereg_mr: {e}");
        return ffi::IBV_REREG_MR_ERR_CMD;
    }
    drop(r);
    // SAFETY: the program's MR header; libibverbs updates it the same way.
    unsafe {
        if new_pd.is_some() {
            release_pd((*mr).pd);
            hold_pd(pd);
            (*mr).pd = pd;
        }
        if memory.is_some() {
            (*mr).addr = addr;
            (*mr).length = length;
        }
    }
    0
}
symver!(ferroce_ibv_rereg_mr => "ibv_rereg_mr" @ "IBVERBS_1.1");

/// `IB_UVERBS_ADVISE_MR_FLAG_FLUSH` (rdma/ib_user_ioctl_verbs.h): the advice completes
/// before the call returns.
const ADVISE_MR_FLAG_FLUSH: u32 = 1;

/// `verbs_context.advise_mr` (the header's `ibv_advise_mr`): prefetch advice for regions of
/// `pd`. Registered memory of a software RNIC is never paged out from under it, so there
/// is nothing to fetch; each element is checked as a local access would be (its key in this
/// PD, its range inside the region, local write for `PREFETCH_WRITE`).
pub(crate) unsafe extern "C" fn advise_mr(
    pd: *mut ffi::ibv_pd,
    advice: ffi::ib_uverbs_advise_mr_advice,
    flags: u32,
    sg_list: *mut ffi::ibv_sge,
    num_sge: u32,
) -> c_int {
    // SAFETY: the inline wrapper passes the program's PD.
    let Some(p) = (unsafe { object::<Pd, _>(pd) }) else {
        return libc::EINVAL;
    };
    let write = match advice {
        ffi::IB_UVERBS_ADVISE_MR_ADVICE_PREFETCH
        | ffi::IB_UVERBS_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT => false,
        ffi::IB_UVERBS_ADVISE_MR_ADVICE_PREFETCH_WRITE => true,
        _ => return libc::EINVAL,
    };
    if flags & !ADVISE_MR_FLAG_FLUSH != 0 || num_sge == 0 || sg_list.is_null() {
        return libc::EINVAL;
    }
    for i in 0..num_sge as usize {
        // SAFETY: `num_sge` elements per the header's contract.
        let s = unsafe { &*sg_list.add(i) };
        let sge = ferroce_stack::transport::Sge {
            addr: s.addr,
            length: s.length,
            lkey: s.lkey,
        };
        if p.pd.check_local(&sge, write).is_err() {
            return libc::EINVAL;
        }
    }
    0
}
