//! Opening a device (`struct ibv_context`) and querying it.
//!
//! The context is not "extended" (`abi_compat` is null), so the header's inline wrappers take
//! their legacy paths: `ibv_query_port` reaches the exported function, which writes the
//! legacy 48-byte attributes after the wrapper zeroed the rest. Opening a device starts its
//! engine thread: a perftest server blocks in a TCP read for the whole test, so nothing of the
//! program's drives the transport.

use std::ffi::{c_int, c_uint};

use ferroce_verbs::{Context as VerbsContext, PortState};

use crate::device::{lookup, set_errno, Device};
use crate::ffi;

/// An open device as programs see it (`ibv_context` first) and the ferroce context behind it.
#[repr(C)]
pub struct Context {
    pub(crate) ibv: ffi::ibv_context,
    /// The ferroce context.
    pub verbs: VerbsContext,
    pub(crate) dev: &'static Device,
}

/// Bytes of `struct ibv_port_attr` a program compiled against the legacy layout reserves (up
/// to `flags`); the exported `ibv_query_port` writes no more.
pub const LEGACY_PORT_ATTR_LEN: usize = 48;

/// Firmware version string `ibv_devinfo` prints.
const FW_VER: &str = concat!("ferroce ", env!("CARGO_PKG_VERSION"));

/// The context behind a pointer a program holds.
///
/// # Safety
/// `ctx` is null or came from `ibv_open_device` and was not closed.
pub(crate) unsafe fn context<'a>(ctx: *mut ffi::ibv_context) -> Option<&'a Context> {
    // SAFETY: per the contract, a non-null `ctx` is the first field of a live `Context`.
    unsafe { (ctx as *const Context).as_ref() }
}

fn eventfd() -> c_int {
    // SAFETY: plain system call; a failure returns -1, which programs see as a closed fd.
    unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) }
}

/// `ibv_open_device`: opens the ferroce device and starts its engine thread. Null with
/// `errno` set when the device cannot be opened (its message goes to stderr: a missing
/// interface or missing privileges is something the user must fix).
///
/// # Safety
/// `dev` is null or a device from `ibv_get_device_list`.
#[no_mangle]
pub unsafe extern "C" fn ferroce_ibv_open_device(
    dev: *mut ffi::ibv_device,
) -> *mut ffi::ibv_context {
    let Some(d) = lookup(dev) else {
        set_errno(libc::ENODEV);
        return std::ptr::null_mut();
    };
    let verbs = match ferroce_verbs::spec::open_device(&d.spec) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("ferroce: cannot open {}: {e}", d.spec);
            set_errno(libc::ENODEV);
            return std::ptr::null_mut();
        }
    };
    if let Err(e) = verbs.start_engine_thread() {
        eprintln!("ferroce: {}: {e}", d.spec);
        set_errno(libc::EIO);
        return std::ptr::null_mut();
    }
    let mut ibv = ffi::ibv_context {
        device: dev,
        cmd_fd: eventfd(),
        async_fd: eventfd(),
        num_comp_vectors: 1,
        ops: crate::ops::table(),
        ..Default::default()
    };
    // SAFETY: initializing a zeroed mutex in place before anyone can see it.
    unsafe {
        libc::pthread_mutex_init(
            &mut ibv.mutex as *mut _ as *mut libc::pthread_mutex_t,
            std::ptr::null(),
        )
    };
    let ctx = Box::new(Context { ibv, verbs, dev: d });
    Box::into_raw(ctx) as *mut ffi::ibv_context
}
symver!(ferroce_ibv_open_device => "ibv_open_device" @ "IBVERBS_1.1");

/// `ibv_close_device`: stops the engine thread and frees the context.
///
/// # Safety
/// `ctx` came from `ibv_open_device` and is not used again.
#[no_mangle]
pub unsafe extern "C" fn ferroce_ibv_close_device(ctx: *mut ffi::ibv_context) -> c_int {
    if ctx.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: per the contract, `ctx` is a `Context` from `Box::into_raw`, closed once.
    let ctx = unsafe { Box::from_raw(ctx as *mut Context) };
    ctx.verbs.stop_engine_thread();
    for fd in [ctx.ibv.cmd_fd, ctx.ibv.async_fd] {
        if fd >= 0 {
            // SAFETY: our own eventfds, closed once.
            unsafe { libc::close(fd) };
        }
    }
    0
}
symver!(ferroce_ibv_close_device => "ibv_close_device" @ "IBVERBS_1.1");

/// The device attributes of a context.
pub(crate) fn device_attr(ctx: &Context) -> ffi::ibv_device_attr {
    let a = ctx.verbs.query_device();
    let mut out = ffi::ibv_device_attr {
        node_guid: ctx.dev.guid,
        sys_image_guid: ctx.dev.guid,
        max_mr_size: a.max_mr_size,
        page_size_cap: 0xffff_f000,
        vendor_id: a.vendor_id,
        max_qp: a.max_qp as c_int,
        max_qp_wr: a.max_qp_wr as c_int,
        device_cap_flags: ffi::IBV_DEVICE_RC_RNR_NAK_GEN as c_uint,
        max_sge: a.max_sge as c_int,
        max_sge_rd: a.max_sge as c_int,
        max_cq: 1 << 16,
        max_cqe: a.max_cqe as c_int,
        max_mr: 1 << 16,
        max_pd: 1 << 16,
        max_qp_rd_atom: a.max_qp_rd_atom as c_int,
        max_res_rd_atom: (a.max_qp_rd_atom * 1024) as c_int,
        max_qp_init_rd_atom: a.max_qp_rd_atom as c_int,
        atomic_cap: ffi::IBV_ATOMIC_HCA,
        max_srq: 1 << 16,
        max_srq_wr: a.max_qp_wr as c_int,
        max_srq_sge: a.max_sge as c_int,
        max_pkeys: 1,
        local_ca_ack_delay: 16,
        phys_port_cnt: a.phys_port_cnt,
        ..Default::default()
    };
    for (d, &b) in out.fw_ver.iter_mut().zip(FW_VER.as_bytes()) {
        *d = b as _;
    }
    out
}

/// `ibv_query_device`.
///
/// # Safety
/// `ctx` is an open context, `attr` points to a `struct ibv_device_attr`.
#[no_mangle]
pub unsafe extern "C" fn ferroce_ibv_query_device(
    ctx: *mut ffi::ibv_context,
    attr: *mut ffi::ibv_device_attr,
) -> c_int {
    // SAFETY: per the contract.
    let (Some(c), false) = (unsafe { context(ctx) }, attr.is_null()) else {
        return libc::EINVAL;
    };
    // SAFETY: `attr` points to a whole `ibv_device_attr` (its size has not changed since
    // rdma-core 1.0).
    unsafe { attr.write(device_attr(c)) };
    0
}
symver!(ferroce_ibv_query_device => "ibv_query_device" @ "IBVERBS_1.1");

/// The attributes of port 1.
pub(crate) fn port_attr(ctx: &Context, port: u8) -> Option<ffi::ibv_port_attr> {
    let p = ctx.verbs.query_port_num(port).ok()?;
    let active = p.state == PortState::Active;
    Some(ffi::ibv_port_attr {
        state: if active {
            ffi::IBV_PORT_ACTIVE
        } else {
            ffi::IBV_PORT_DOWN
        },
        max_mtu: p.max_mtu as ffi::ibv_mtu,
        active_mtu: p.active_mtu as ffi::ibv_mtu,
        gid_tbl_len: p.gid_tbl_len as c_int,
        port_cap_flags: 0,
        max_msg_sz: 1 << 31,
        pkey_tbl_len: 1,
        max_vl_num: 1,
        // 1X at 100 Gb/s-class speed: what perftest prints, not a promise.
        active_width: 1,
        active_speed: 64,
        // 5: LinkUp, 3: Disabled.
        phys_state: if active { 5 } else { 3 },
        link_layer: ffi::IBV_LINK_LAYER_ETHERNET as u8,
        ..Default::default()
    })
}

/// `ibv_query_port`: writes the legacy 48 bytes (the header's inline wrapper zeroes the
/// rest of a newer caller's structure first).
///
/// # Safety
/// `ctx` is an open context, `attr` points to at least 48 writable bytes.
#[no_mangle]
pub unsafe extern "C" fn ferroce_ibv_query_port(
    ctx: *mut ffi::ibv_context,
    port: u8,
    attr: *mut u8,
) -> c_int {
    // SAFETY: per the contract.
    let (Some(c), false) = (unsafe { context(ctx) }, attr.is_null()) else {
        return libc::EINVAL;
    };
    let Some(a) = port_attr(c, port) else {
        return libc::EINVAL;
    };
    // SAFETY: `a` is a whole `ibv_port_attr` (larger than 48 bytes); `attr` has room for
    // the legacy 48 per the contract; the two do not overlap.
    unsafe {
        std::ptr::copy_nonoverlapping(
            &a as *const ffi::ibv_port_attr as *const u8,
            attr,
            LEGACY_PORT_ATTR_LEN,
        )
    };
    0
}
symver!(ferroce_ibv_query_port => "ibv_query_port" @ "IBVERBS_1.1");

/// `ibv_query_gid`: index 0 is the RoCEv2 GID of the port's address.
///
/// # Safety
/// `ctx` is an open context, `gid` points to a `union ibv_gid`.
#[no_mangle]
pub unsafe extern "C" fn ferroce_ibv_query_gid(
    ctx: *mut ffi::ibv_context,
    port: u8,
    index: c_int,
    gid: *mut ffi::ibv_gid,
) -> c_int {
    // SAFETY: per the contract.
    let (Some(c), false) = (unsafe { context(ctx) }, gid.is_null()) else {
        return -1;
    };
    if index < 0 {
        return -1;
    }
    let Ok(g) = c.verbs.query_gid_on(port, index as u32) else {
        return -1;
    };
    // SAFETY: `gid` points to 16 writable bytes per the contract.
    unsafe { (*gid).raw = g.0 };
    0
}
symver!(ferroce_ibv_query_gid => "ibv_query_gid" @ "IBVERBS_1.1");

/// `ibv_query_gid_type` (rdma-core's private ABI, which `ibv_devinfo` uses): every GID is
/// RoCE v2 (`IBV_GID_TYPE_SYSFS_ROCE_V2`, 1).
///
/// # Safety
/// `ctx` is an open context, `kind` points to an `int`-sized enum.
#[no_mangle]
pub unsafe extern "C" fn ferroce_ibv_query_gid_type(
    ctx: *mut ffi::ibv_context,
    port: u8,
    index: c_uint,
    kind: *mut c_int,
) -> c_int {
    // SAFETY: per the contract.
    let (Some(c), false) = (unsafe { context(ctx) }, kind.is_null()) else {
        return libc::EINVAL;
    };
    if c.verbs.query_gid_on(port, index).is_err() {
        return libc::EINVAL;
    }
    // SAFETY: per the contract.
    unsafe { kind.write(1) };
    0
}
symver!(ferroce_ibv_query_gid_type => "ibv_query_gid_type" @ "IBVERBS_PRIVATE_34");

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn layouts_programs_rely_on() {
        // The legacy port attributes end where `port_cap_flags2` begins.
        assert_eq!(
            offset_of!(ffi::ibv_port_attr, port_cap_flags2),
            LEGACY_PORT_ATTR_LEN
        );
        // `union ibv_gid` forces 8-byte alignment into `ibv_ah_attr`, so `ibv_qp_attr` is
        // 144 bytes.
        assert_eq!(size_of::<ffi::ibv_qp_attr>(), 144);
        // A program's `ibv_context *` is ours.
        assert_eq!(offset_of!(Context, ibv), 0);
        // The ops programs call through inline, at the header's offsets.
        assert_eq!(offset_of!(ffi::ibv_context, ops), 8);
        assert_eq!(
            offset_of!(ffi::ibv_context_ops, post_send),
            offset_of!(ffi::ibv_context_ops, _compat_destroy_qp) + 8
        );
    }
}
