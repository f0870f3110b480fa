//! What ferroce's librdmacm does not offer, failing cleanly: multicast joins
//! (`EOPNOTSUPP`: ferroce has no multicast groups on its UD QPs), rsockets (`ENOSYS`: the
//! socket emulation over RDMA is a library of its own, not a CM), and ECE, which no
//! ferroce QP has (the local options are kept; the peer's read as none).

use std::ffi::{c_int, c_void};

use super::err;
use crate::ffi;

/// `rdma_join_multicast`: `EOPNOTSUPP`.
#[no_mangle]
pub extern "C" fn ferroce_rdma_join_multicast(
    _id: *mut ffi::rdma_cm_id,
    _addr: *mut libc::sockaddr,
    _context: *mut c_void,
) -> c_int {
    err(libc::EOPNOTSUPP)
}

/// `rdma_join_multicast_ex`: `EOPNOTSUPP`.
#[no_mangle]
pub extern "C" fn ferroce_rdma_join_multicast_ex(
    _id: *mut ffi::rdma_cm_id,
    _attr: *mut c_void,
    _context: *mut c_void,
) -> c_int {
    err(libc::EOPNOTSUPP)
}

/// `rdma_leave_multicast`: nothing was joined (`EADDRNOTAVAIL`, librdmacm's answer for a
/// group it does not know).
#[no_mangle]
pub extern "C" fn ferroce_rdma_leave_multicast(
    _id: *mut ffi::rdma_cm_id,
    _addr: *mut libc::sockaddr,
) -> c_int {
    err(libc::EADDRNOTAVAIL)
}

/// `rdma_set_local_ece`: checked as librdmacm checks it; ferroce's QPs have no ECE
/// options, so nothing is sent.
///
/// # Safety
/// `id` is null or a live id; `ece` is null or valid.
#[no_mangle]
pub unsafe extern "C" fn ferroce_rdma_set_local_ece(
    id: *mut ffi::rdma_cm_id,
    ece: *mut ffi::ibv_ece,
) -> c_int {
    // SAFETY: per the contract.
    let (Some(i), Some(e)) = (unsafe { id.as_ref() }, unsafe { ece.as_ref() }) else {
        return err(libc::EINVAL);
    };
    if !i.qp.is_null() || e.vendor_id == 0 || e.comp_mask != 0 {
        return err(libc::EINVAL);
    }
    0
}

/// `rdma_get_remote_ece`: the peer's ECE as received: none (vendor 0), as from a peer
/// without ECE.
///
/// # Safety
/// `id` is null or a live id; `ece` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn ferroce_rdma_get_remote_ece(
    id: *mut ffi::rdma_cm_id,
    ece: *mut ffi::ibv_ece,
) -> c_int {
    // SAFETY: per the contract.
    let (Some(i), false) = (unsafe { id.as_ref() }, ece.is_null()) else {
        return err(libc::EINVAL);
    };
    if !i.qp.is_null() {
        return err(libc::EINVAL);
    }
    // SAFETY: per the contract.
    unsafe { ece.write(ffi::ibv_ece::default()) };
    0
}

/// Defines rsockets calls that fail with `ENOSYS`. Each returns -1 in the width of every
/// rsockets return type (`int`, `ssize_t`, `off_t`, `size_t`'s all-ones), and ignores its
/// arguments, which the C calling convention allows.
macro_rules! rsockets {
    ($($name:ident),* $(,)?) => {$(
        #[doc = concat!("`", stringify!($name), "`: rsockets are not offered (`ENOSYS`).")]
        #[no_mangle]
        pub extern "C" fn $name() -> isize {
            crate::device::set_errno(libc::ENOSYS);
            -1
        }
    )*};
}

rsockets!(
    ferroce_rsocket,
    ferroce_rbind,
    ferroce_rlisten,
    ferroce_raccept,
    ferroce_rconnect,
    ferroce_rshutdown,
    ferroce_rclose,
    ferroce_rrecv,
    ferroce_rrecvfrom,
    ferroce_rrecvmsg,
    ferroce_rsend,
    ferroce_rsendto,
    ferroce_rsendmsg,
    ferroce_rread,
    ferroce_rreadv,
    ferroce_rwrite,
    ferroce_rwritev,
    ferroce_rpoll,
    ferroce_rselect,
    ferroce_rgetpeername,
    ferroce_rgetsockname,
    ferroce_rsetsockopt,
    ferroce_rgetsockopt,
    ferroce_rfcntl,
    ferroce_riomap,
    ferroce_riounmap,
    ferroce_riowrite,
);
