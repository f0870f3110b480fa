//! The small verbs programs call around the objects: string helpers, the extended GID query,
//! P_Key query, fork support, and the extended-QP entry point (which a non-extended context
//! answers with NULL, sending programs down the legacy `ibv_post_send` path).

use std::ffi::{c_char, c_int, CStr};

use crate::context::context;
use crate::device::set_errno;
use crate::ffi;

/// `ibv_wc_status_str`: libibverbs' wording.
#[no_mangle]
pub extern "C" fn ferroce_ibv_wc_status_str(status: ffi::ibv_wc_status) -> *const c_char {
    const NAMES: [&CStr; 23] = [
        c"success",
        c"local length error",
        c"local QP operation error",
        c"local EE context operation error",
        c"local protection error",
        c"Work Request Flushed Error",
        c"memory management operation error",
        c"bad response error",
        c"local access error",
        c"remote invalid request error",
        c"remote access error",
        c"remote operation error",
        c"transport retry counter exceeded",
        c"RNR retry counter exceeded",
        c"local RDD violation error",
        c"remote invalid RD request",
        c"aborted error",
        c"invalid EE context number",
        c"invalid EE context state",
        c"fatal error",
        c"response timeout error",
        c"general error",
        c"TM error",
    ];
    NAMES
        .get(status as usize)
        .copied()
        .unwrap_or(c"unknown")
        .as_ptr()
}
symver!(ferroce_ibv_wc_status_str => "ibv_wc_status_str" @ "IBVERBS_1.1");

/// `ibv_port_state_str`.
#[no_mangle]
pub extern "C" fn ferroce_ibv_port_state_str(state: ffi::ibv_port_state) -> *const c_char {
    const NAMES: [&CStr; 6] = [
        c"PORT_NOP",
        c"PORT_DOWN",
        c"PORT_INIT",
        c"PORT_ARMED",
        c"PORT_ACTIVE",
        c"PORT_ACTIVE_DEFER",
    ];
    NAMES
        .get(state as usize)
        .copied()
        .unwrap_or(c"invalid state")
        .as_ptr()
}
symver!(ferroce_ibv_port_state_str => "ibv_port_state_str" @ "IBVERBS_1.1");

/// `ibv_node_type_str`.
#[no_mangle]
pub extern "C" fn ferroce_ibv_node_type_str(t: ffi::ibv_node_type) -> *const c_char {
    match t {
        ffi::IBV_NODE_CA => c"InfiniBand channel adapter",
        ffi::IBV_NODE_RNIC => c"iWARP NIC",
        _ => c"unknown",
    }
    .as_ptr()
}
symver!(ferroce_ibv_node_type_str => "ibv_node_type_str" @ "IBVERBS_1.1");

/// `_ibv_query_gid_ex` (what the header's `ibv_query_gid_ex` calls): GID 0, RoCE v2, on the
/// interface the device sends through.
///
/// # Safety
/// `ctx` is an open context; `entry` points to `entry_size` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn ferroce__ibv_query_gid_ex(
    ctx: *mut ffi::ibv_context,
    port_num: u32,
    gid_index: u32,
    entry: *mut ffi::ibv_gid_entry,
    _flags: u32,
    entry_size: usize,
) -> c_int {
    // SAFETY: per the contract.
    let Some(c) = (unsafe { context(ctx) }) else {
        return libc::EINVAL;
    };
    let Ok(port) = u8::try_from(port_num) else {
        return libc::EINVAL;
    };
    if entry.is_null()
        || entry_size < size_of::<ffi::ibv_gid_entry>()
        || c.verbs.query_port_num(port).is_err()
    {
        return libc::EINVAL;
    }
    let Ok(gid) = c.verbs.query_gid_on(port, gid_index) else {
        return libc::ENODATA;
    };
    let ifindex = crate::neigh::interface_of(&c.dev.spec, port)
        .and_then(|i| std::ffi::CString::new(i).ok())
        // SAFETY: a NUL-terminated name.
        .map_or(0, |i| unsafe { libc::if_nametoindex(i.as_ptr()) });
    let e = ffi::ibv_gid_entry {
        gid: ffi::ibv_gid { raw: gid.0 },
        gid_index,
        port_num,
        gid_type: ffi::IBV_GID_TYPE_ROCE_V2,
        ndev_ifindex: ifindex,
    };
    // SAFETY: per the contract, room for a whole entry (checked above).
    unsafe { entry.write(e) };
    0
}
symver!(ferroce__ibv_query_gid_ex => "_ibv_query_gid_ex" @ "IBVERBS_1.11");

/// `ibv_query_pkey`: one partition, the default key.
///
/// # Safety
/// `ctx` is an open context; `pkey` points to a `__be16`.
#[no_mangle]
pub unsafe extern "C" fn ferroce_ibv_query_pkey(
    ctx: *mut ffi::ibv_context,
    port: u8,
    index: c_int,
    pkey: *mut u16,
) -> c_int {
    // SAFETY: per the contract.
    // SAFETY: per the contract.
    let Some(c) = (unsafe { context(ctx) }) else {
        return -1;
    };
    if pkey.is_null() || c.verbs.query_port_num(port).is_err() || index != 0 {
        return -1;
    }
    // SAFETY: per the contract.
    unsafe { pkey.write(0xffffu16.to_be()) };
    0
}
symver!(ferroce_ibv_query_pkey => "ibv_query_pkey" @ "IBVERBS_1.1");

/// `ibv_fork_init`: nothing to do — registered memory is never pinned for a device, so a
/// fork cannot break it. (A child must not use the parent's verbs objects; see
/// docs/ibverbs.md.)
#[no_mangle]
pub extern "C" fn ferroce_ibv_fork_init() -> c_int {
    0
}
symver!(ferroce_ibv_fork_init => "ibv_fork_init" @ "IBVERBS_1.1");

/// `ibv_qp_to_qp_ex`: NULL — contexts are not extended, so programs post with
/// `ibv_post_send` (perftest decides this from the vendor id before it asks).
#[no_mangle]
pub extern "C" fn ferroce_ibv_qp_to_qp_ex(_qp: *mut ffi::ibv_qp) -> *mut ffi::ibv_qp_ex {
    set_errno(libc::EOPNOTSUPP);
    std::ptr::null_mut()
}
symver!(ferroce_ibv_qp_to_qp_ex => "ibv_qp_to_qp_ex" @ "IBVERBS_1.6");

/// `ibv_attach_mcast`: multicast is not implemented.
#[no_mangle]
pub extern "C" fn ferroce_ibv_attach_mcast(
    _qp: *mut ffi::ibv_qp,
    _gid: *const ffi::ibv_gid,
    _lid: u16,
) -> c_int {
    libc::EOPNOTSUPP
}
symver!(ferroce_ibv_attach_mcast => "ibv_attach_mcast" @ "IBVERBS_1.1");

/// `ibv_detach_mcast`: as `ibv_attach_mcast`.
#[no_mangle]
pub extern "C" fn ferroce_ibv_detach_mcast(
    _qp: *mut ffi::ibv_qp,
    _gid: *const ffi::ibv_gid,
    _lid: u16,
) -> c_int {
    libc::EOPNOTSUPP
}
symver!(ferroce_ibv_detach_mcast => "ibv_detach_mcast" @ "IBVERBS_1.1");
