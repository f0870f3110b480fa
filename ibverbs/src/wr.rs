//! Send work requests as this library holds them between a program's calls: the batch an
//! `ibv_wr_start` opens (see [`crate::qpex`]), a memory window bind (see [`crate::mw`]), and
//! the errno a refused one returns. Plain data, beneath the QP that holds them and the verbs
//! that fill and post them.

use std::ffi::c_int;

use ferroce_stack::transport::PostError;

use crate::ffi;

/// The errno for a refused send WR, as mlx5 gives it: a full queue, more gather elements or
/// inline bytes than the QP was granted are ENOMEM (the WQE does not fit); the rest EINVAL.
pub(crate) fn errno(e: PostError) -> c_int {
    match e {
        PostError::QueueFull(_)
        | PostError::TooManySges { .. }
        | PostError::InlineTooLong { .. } => libc::ENOMEM,
        _ => libc::EINVAL,
    }
}

/// A bind built by `ibv_wr_bind_mw` or read from an `IBV_WR_BIND_MW` request.
#[derive(Clone, Copy)]
pub(crate) struct Bind {
    pub(crate) mw: *mut ffi::ibv_mw,
    pub(crate) rkey: u32,
    pub(crate) info: ffi::ibv_mw_bind_info,
}

/// One work request of a batch.
#[derive(Clone)]
pub(crate) struct BatchWr {
    pub(crate) wr: ffi::ibv_send_wr,
    pub(crate) sges: Vec<ffi::ibv_sge>,
    /// Inline data, copied when set.
    pub(crate) inline: Option<Vec<u8>>,
    /// A memory window bind (`IBV_WR_BIND_MW`).
    pub(crate) bind: Option<Bind>,
}

/// The batch an `ibv_wr_start` opened.
#[derive(Default)]
pub(crate) struct Batch {
    pub(crate) open: bool,
    pub(crate) wrs: Vec<BatchWr>,
    /// The first error met while building, which `ibv_wr_complete` returns.
    pub(crate) error: c_int,
}
