//! The small verbs programs call around the objects: string helpers, the extended GID query,
//! P_Key query, fork support, and the extended-QP entry point (which a non-extended context
//! answers with NULL, sending programs down the legacy `ibv_post_send` path).

use std::ffi::{c_char, c_int, c_void, CStr};

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
        return libc::EINVAL;
    };
    if gid.0 == [0; 16] {
        return libc::ENODATA;
    }
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

/// `ibv_qp_to_qp_ex`: the extended QP, for a QP created with `send_ops_flags` (NULL for
/// any other, as libibverbs answers).
///
/// # Safety
/// `qp` is null or a live QP.
#[no_mangle]
pub unsafe extern "C" fn ferroce_ibv_qp_to_qp_ex(qp: *mut ffi::ibv_qp) -> *mut ffi::ibv_qp_ex {
    // SAFETY: per the contract.
    match unsafe { crate::objects::object::<crate::qp::Qp, _>(qp) } {
        Some(q) if q.extended => qp as *mut ffi::ibv_qp_ex,
        _ => {
            set_errno(libc::EOPNOTSUPP);
            std::ptr::null_mut()
        }
    }
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

/// `ibv_get_pkey_index`: the index of `pkey` in the port's table (one entry, the default
/// partition), or a negative errno.
///
/// # Safety
/// `ctx` is an open context.
#[no_mangle]
pub unsafe extern "C" fn ferroce_ibv_get_pkey_index(
    ctx: *mut ffi::ibv_context,
    port: u8,
    pkey: u16,
) -> c_int {
    // SAFETY: per the contract.
    let Some(c) = (unsafe { context(ctx) }) else {
        return -libc::EINVAL;
    };
    if c.verbs.query_port_num(port).is_err() {
        return -libc::EINVAL;
    }
    if u16::from_be(pkey) == 0xffff {
        0
    } else {
        -libc::ENOENT
    }
}
symver!(ferroce_ibv_get_pkey_index => "ibv_get_pkey_index" @ "IBVERBS_1.5");

/// `ibv_is_fork_initialized`: `IBV_FORK_UNNEEDED`. No kernel pins registered memory for a
/// ferroce device, so a child's copy-on-write pages never detach a region from the device
/// (the engine reads and writes the parent's pages through its own mappings).
#[no_mangle]
pub extern "C" fn ferroce_ibv_is_fork_initialized() -> ffi::ibv_fork_status {
    ffi::IBV_FORK_UNNEEDED
}
symver!(ferroce_ibv_is_fork_initialized => "ibv_is_fork_initialized" @ "IBVERBS_1.13");

/// `ibv_dontfork_range`: nothing to do (see `ibv_is_fork_initialized`).
#[no_mangle]
pub extern "C" fn ferroce_ibv_dontfork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
}
symver!(ferroce_ibv_dontfork_range => "ibv_dontfork_range" @ "IBVERBS_1.1");

/// `ibv_dofork_range`: nothing to do (see `ibv_is_fork_initialized`).
#[no_mangle]
pub extern "C" fn ferroce_ibv_dofork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
}
symver!(ferroce_ibv_dofork_range => "ibv_dofork_range" @ "IBVERBS_1.1");

/// `ibv_query_ece`: enhanced connection establishment is a vendor option ferroce does not
/// have; `EOPNOTSUPP`, as libibverbs answers for a provider without it.
#[no_mangle]
pub extern "C" fn ferroce_ibv_query_ece(_qp: *mut ffi::ibv_qp, _ece: *mut ffi::ibv_ece) -> c_int {
    set_errno(libc::EOPNOTSUPP);
    libc::EOPNOTSUPP
}
symver!(ferroce_ibv_query_ece => "ibv_query_ece" @ "IBVERBS_1.10");

/// `ibv_set_ece`: as `ibv_query_ece`.
#[no_mangle]
pub extern "C" fn ferroce_ibv_set_ece(_qp: *mut ffi::ibv_qp, _ece: *mut ffi::ibv_ece) -> c_int {
    set_errno(libc::EOPNOTSUPP);
    libc::EOPNOTSUPP
}
symver!(ferroce_ibv_set_ece => "ibv_set_ece" @ "IBVERBS_1.10");

/// `ibv_reg_dmabuf_mr`: a dma-buf is another device's memory (a GPU's), which a software
/// RNIC cannot reach; NULL with `errno` `EOPNOTSUPP`.
#[no_mangle]
pub extern "C" fn ferroce_ibv_reg_dmabuf_mr(
    _pd: *mut ffi::ibv_pd,
    _offset: u64,
    _length: usize,
    _iova: u64,
    _fd: c_int,
    _access: c_int,
) -> *mut ffi::ibv_mr {
    set_errno(libc::EOPNOTSUPP);
    std::ptr::null_mut()
}
symver!(ferroce_ibv_reg_dmabuf_mr => "ibv_reg_dmabuf_mr" @ "IBVERBS_1.12");

/// `ibv_import_dm`: no device memory to import; NULL, `errno` `EOPNOTSUPP`.
#[no_mangle]
pub extern "C" fn ferroce_ibv_import_dm(
    _ctx: *mut ffi::ibv_context,
    _handle: u32,
) -> *mut ffi::ibv_dm {
    set_errno(libc::EOPNOTSUPP);
    std::ptr::null_mut()
}
symver!(ferroce_ibv_import_dm => "ibv_import_dm" @ "IBVERBS_1.13");

/// `ibv_unimport_dm`: nothing was imported.
#[no_mangle]
pub extern "C" fn ferroce_ibv_unimport_dm(_dm: *mut ffi::ibv_dm) {}
symver!(ferroce_ibv_unimport_dm => "ibv_unimport_dm" @ "IBVERBS_1.13");

/// `_ibv_query_gid_table` (what the header's `ibv_query_gid_table` calls): every port's
/// GIDs, as many as fit in `max_entries`; the count, or a negative errno (`-EINVAL` when
/// they do not fit).
///
/// # Safety
/// `ctx` is an open context; `entries` points to `max_entries` entries of `entry_size`.
#[no_mangle]
pub unsafe extern "C" fn ferroce__ibv_query_gid_table(
    ctx: *mut ffi::ibv_context,
    entries: *mut ffi::ibv_gid_entry,
    max_entries: usize,
    flags: u32,
    entry_size: usize,
) -> isize {
    // SAFETY: per the contract.
    let Some(c) = (unsafe { context(ctx) }) else {
        return -(libc::EINVAL as isize);
    };
    if flags != 0 || entry_size < size_of::<ffi::ibv_gid_entry>() {
        return -(libc::EINVAL as isize);
    }
    let ports = c.verbs.query_device().phys_port_cnt;
    let mut n = 0usize;
    for port in 1..=ports {
        let Ok(p) = c.verbs.query_port_num(port) else {
            continue;
        };
        for index in 0..p.gid_tbl_len {
            let mut e = ffi::ibv_gid_entry::default();
            // SAFETY: a live local entry of the right size.
            let r = unsafe {
                ferroce__ibv_query_gid_ex(
                    ctx,
                    u32::from(port),
                    index,
                    &mut e,
                    0,
                    size_of::<ffi::ibv_gid_entry>(),
                )
            };
            if r != 0 {
                continue;
            }
            if n == max_entries {
                return -(libc::EINVAL as isize);
            }
            // SAFETY: `n < max_entries` entries of `entry_size` bytes per the contract.
            unsafe {
                let at = (entries as *mut u8).add(n * entry_size) as *mut ffi::ibv_gid_entry;
                at.write_unaligned(e);
            }
            n += 1;
        }
    }
    n as isize
}
symver!(ferroce__ibv_query_gid_table => "_ibv_query_gid_table" @ "IBVERBS_1.11");

/// `ibv_import_pd`: the PD of handle `handle` (`ibv_pd.handle`) of another context on the
/// same device, as a PD of `ctx`; NULL with `EINVAL` when there is none.
///
/// # Safety
/// `ctx` is an open context.
#[no_mangle]
pub unsafe extern "C" fn ferroce_ibv_import_pd(
    ctx: *mut ffi::ibv_context,
    handle: u32,
) -> *mut ffi::ibv_pd {
    use crate::domain::Pd;
    use crate::objects::{handle_object, publish, HandleKind};
    // SAFETY: per the contract.
    let Some(c) = (unsafe { context(ctx) }) else {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    };
    // SAFETY: handles name live PDs (their dealloc forgets them).
    let orig = handle_object(HandleKind::Pd, handle)
        .and_then(|p| unsafe { crate::objects::object::<Pd, ffi::ibv_pd>(p as *mut ffi::ibv_pd) });
    // SAFETY: PDs are made with a live context.
    let Some(o) = orig.filter(|o| {
        unsafe { crate::context::owner(o.ibv.context) }
            .verbs
            .same_device(&c.verbs)
    }) else {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    };
    publish(Pd {
        ibv: ffi::ibv_pd {
            context: ctx,
            handle,
        },
        pd: o.pd.clone(),
        parent: None,
        children: std::sync::atomic::AtomicU32::new(0),
        imported: true,
    })
}
symver!(ferroce_ibv_import_pd => "ibv_import_pd" @ "IBVERBS_1.10");

/// `ibv_unimport_pd`: forgets an imported PD (the PD itself stays its context's).
///
/// # Safety
/// `pd` came from `ibv_import_pd` and is not used again.
#[no_mangle]
pub unsafe extern "C" fn ferroce_ibv_unimport_pd(pd: *mut ffi::ibv_pd) {
    // SAFETY: per the contract.
    if unsafe { crate::objects::object::<crate::domain::Pd, _>(pd) }.is_some_and(|p| p.imported) {
        // SAFETY: per the contract.
        unsafe { crate::objects::free::<crate::domain::Pd, _>(pd) };
    }
}
symver!(ferroce_ibv_unimport_pd => "ibv_unimport_pd" @ "IBVERBS_1.10");

/// `ibv_import_mr`: the MR of handle `handle` of another context on the same device, as an
/// MR of `pd` (same keys; the address is NULL, as the kernel reports an imported MR's).
///
/// # Safety
/// `pd` is a live PD.
#[no_mangle]
pub unsafe extern "C" fn ferroce_ibv_import_mr(
    pd: *mut ffi::ibv_pd,
    handle: u32,
) -> *mut ffi::ibv_mr {
    use crate::context::owner;
    use crate::domain::Pd;
    use crate::mr::Mr;
    use crate::objects::{handle_object, object, publish, HandleKind};
    // SAFETY: per the contract.
    let Some(p) = (unsafe { object::<Pd, _>(pd) }) else {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    };
    // SAFETY: handles name live MRs (their deregistration forgets them).
    let orig = handle_object(HandleKind::Mr, handle)
        .and_then(|m| unsafe { object::<Mr, ffi::ibv_mr>(m as *mut ffi::ibv_mr) });
    // SAFETY: MRs and PDs are made with live contexts.
    let Some(o) = orig.filter(|o| unsafe {
        owner(o.ibv.context)
            .verbs
            .same_device(&owner(p.ibv.context).verbs)
    }) else {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    };
    publish(Mr {
        ibv: ffi::ibv_mr {
            context: p.ibv.context,
            pd,
            addr: std::ptr::null_mut(),
            length: o.ibv.length,
            handle,
            lkey: o.ibv.lkey,
            rkey: o.ibv.rkey,
        },
        mr: None,
    })
}
symver!(ferroce_ibv_import_mr => "ibv_import_mr" @ "IBVERBS_1.10");

/// `ibv_unimport_mr`: forgets an imported MR (the registration stays its context's).
///
/// # Safety
/// `mr` came from `ibv_import_mr` and is not used again.
#[no_mangle]
pub unsafe extern "C" fn ferroce_ibv_unimport_mr(mr: *mut ffi::ibv_mr) {
    // SAFETY: per the contract.
    if unsafe { crate::objects::object::<crate::mr::Mr, _>(mr) }.is_some_and(|m| m.mr.is_none()) {
        // SAFETY: per the contract.
        unsafe { crate::objects::free::<crate::mr::Mr, _>(mr) };
    }
}
symver!(ferroce_ibv_unimport_mr => "ibv_unimport_mr" @ "IBVERBS_1.10");
