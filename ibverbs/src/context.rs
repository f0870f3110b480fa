//! Opening a device (`struct ibv_context`) and querying it.
//!
//! The context is an *extended* one, as every rdma-core provider's: `struct verbs_context`
//! with the program's `struct ibv_context` as its last field and `abi_compat` set to
//! libibverbs' marker, so the header's inline wrappers find the extended entry points
//! (`ibv_query_port` with the whole attribute structure, `ibv_query_device_ex`,
//! `ibv_create_cq_ex`, `ibv_create_qp_ex`, thread and parent domains, flow steering) in it.
//! An entry left null makes its inline wrapper fail with `EOPNOTSUPP`, as libibverbs does
//! for a provider without the feature. Opening a device starts its engine thread: a
//! perftest server blocks in a TCP read for the whole test, so nothing of the program's
//! drives the transport.

use std::ffi::{c_int, c_uint, c_void};
use std::mem::offset_of;

use ferroce_verbs::{Context as VerbsContext, PortState};

use crate::device::{lookup, set_errno, Device};
use crate::events::AsyncEvents;
use crate::ffi;

/// An open device as programs see it (`verbs_context`, whose last field is the program's
/// `ibv_context`) and the ferroce context behind it.
#[repr(C)]
pub struct Context {
    pub(crate) vctx: ffi::verbs_context,
    /// The ferroce context.
    pub verbs: VerbsContext,
    pub(crate) dev: &'static Device,
    /// Asynchronous events (`ibv_get_async_event`) and the objects they name.
    pub(crate) events: AsyncEvents,
    /// Made by `ibv_import_device`: another handle on a context this process opened.
    pub(crate) imported: bool,
}

/// The process's open contexts by the inode of their `cmd_fd` (a memfd, unique to the
/// context, and the same through a `dup` of it): what `ibv_import_device` finds one by.
static BY_CMD_FD: std::sync::LazyLock<std::sync::Mutex<std::collections::HashMap<u64, usize>>> =
    std::sync::LazyLock::new(Default::default);

/// The inode behind an fd.
fn inode(fd: c_int) -> Option<u64> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::zeroed();
    // SAFETY: fstat writes a whole `struct stat` into the zeroed storage, or fails.
    (unsafe { libc::fstat(fd, st.as_mut_ptr()) } == 0).then(|| {
        // SAFETY: written by a successful fstat.
        unsafe { st.assume_init() }.st_ino
    })
}

/// Bytes of `struct ibv_port_attr` a program compiled against the legacy layout reserves (up
/// to `flags`); the exported `ibv_query_port` writes no more.
pub const LEGACY_PORT_ATTR_LEN: usize = 48;

/// Firmware version string `ibv_devinfo` prints.
const FW_VER: &str = concat!("ferroce ", env!("CARGO_PKG_VERSION"));

/// The vendor id ferroce reports: not an IEEE OUI, the value Linux's software RoCE device
/// (rxe) reports too. Programs key vendor-specific paths on known ids (mlx5's 0x02c9,
/// Amazon's, Chelsio's, Intel's) and take the generic verbs for any other.
pub const VENDOR_ID: u32 = 0x00ff_ffff;

/// The environment variable setting the vendor part id ferroce reports (default 0). Some
/// programs choose their code path by part id: perftest takes its `ibv_wr_*` post path only
/// for the part ids of ConnectX-4 and later (ConnectX-7 is 4129), and ferroce implements that
/// path for every program; the variable only lets such a program choose it.
pub const VENDOR_PART_ID_ENV: &str = "FERROCE_VENDOR_PART_ID";

/// The vendor part id ferroce reports (see [`VENDOR_PART_ID_ENV`]).
fn vendor_part_id() -> u32 {
    static ID: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *ID.get_or_init(|| {
        std::env::var(VENDOR_PART_ID_ENV)
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    })
}

/// libibverbs' marker in `ibv_context.abi_compat` for an extended context
/// (`__VERBS_ABI_IS_EXTENDED`, `(void *)UINTPTR_MAX`).
const ABI_IS_EXTENDED: *mut c_void = usize::MAX as *mut c_void;

/// The context behind a pointer a program holds.
///
/// # Safety
/// `ctx` is null or came from `ibv_open_device` and was not closed.
pub(crate) unsafe fn context<'a>(ctx: *mut ffi::ibv_context) -> Option<&'a Context> {
    if ctx.is_null() {
        return None;
    }
    // SAFETY: per the contract, a non-null `ctx` is the `context` field of the
    // `verbs_context` that starts a live `Context`.
    unsafe {
        let vctx = (ctx as *mut u8).sub(offset_of!(ffi::verbs_context, context));
        (vctx as *const Context).as_ref()
    }
}

impl Context {
    /// The pointer programs hold.
    pub(crate) fn ibv(&self) -> *mut ffi::ibv_context {
        &self.vctx.context as *const ffi::ibv_context as *mut ffi::ibv_context
    }
}

/// A context's `cmd_fd`: a memfd, whose inode names the context (see `BY_CMD_FD`). A
/// software RNIC takes no commands through it; programs only pass it around.
fn cmd_fd() -> c_int {
    // SAFETY: plain system call on a NUL-terminated name; -1 on failure, which programs
    // see as a closed fd.
    unsafe { libc::memfd_create(c"ferroce-context".as_ptr(), libc::MFD_CLOEXEC) }
}

/// The extended entry points of every context.
fn extended_ops(ibv: ffi::ibv_context) -> ffi::verbs_context {
    ffi::verbs_context {
        query_port: Some(query_port_ex),
        query_device_ex: Some(query_device_ex),
        query_rt_values: Some(query_rt_values),
        sz: size_of::<ffi::verbs_context>(),
        context: ibv,
        ..Default::default()
    }
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
    let verbs = match d.open() {
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
    let events = match AsyncEvents::new(d, &verbs) {
        Ok(e) => e,
        Err(errno) => {
            if !d.is_shared() {
                verbs.stop_engine_thread();
            }
            set_errno(errno);
            return std::ptr::null_mut();
        }
    };
    let ibv = ffi::ibv_context {
        device: dev,
        cmd_fd: cmd_fd(),
        async_fd: events.fd(),
        num_comp_vectors: 1,
        ops: crate::ops::table(),
        abi_compat: ABI_IS_EXTENDED,
        ..Default::default()
    };
    let mut vctx = extended_ops(ibv);
    crate::extended::install(&mut vctx);
    // SAFETY: initializing a zeroed mutex in place before anyone can see it.
    unsafe {
        libc::pthread_mutex_init(
            &mut vctx.context.mutex as *mut _ as *mut libc::pthread_mutex_t,
            std::ptr::null(),
        )
    };
    publish_context(vctx, verbs, d, events, false)
}

/// Makes a context the program holds.
fn publish_context(
    vctx: ffi::verbs_context,
    verbs: VerbsContext,
    dev: &'static Device,
    events: AsyncEvents,
    imported: bool,
) -> *mut ffi::ibv_context {
    let fd = vctx.context.cmd_fd;
    let ctx = Box::into_raw(Box::new(Context {
        vctx,
        verbs,
        dev,
        events,
        imported,
    }));
    // SAFETY: just made; it lives until `ibv_close_device`.
    let ctx = unsafe { &*ctx };
    ctx.events.attach(ctx.ibv());
    if !imported {
        if let Some(ino) = inode(fd) {
            BY_CMD_FD
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(ino, ctx as *const Context as usize);
        }
    }
    ctx.ibv()
}
symver!(ferroce_ibv_open_device => "ibv_open_device" @ "IBVERBS_1.1");

/// `ibv_close_device`: stops the engine thread and frees the context.
///
/// # Safety
/// `ctx` came from `ibv_open_device` and is not used again.
#[no_mangle]
pub unsafe extern "C" fn ferroce_ibv_close_device(ctx: *mut ffi::ibv_context) -> c_int {
    // SAFETY: per the contract.
    let Some(c) = (unsafe { context(ctx) }) else {
        return libc::EINVAL;
    };
    // SAFETY: per the contract, `c` is a `Context` from `Box::into_raw`, closed once.
    let c = unsafe { Box::from_raw(c as *const Context as *mut Context) };
    c.events.detach();
    if !c.imported {
        if let Some(ino) = inode(c.vctx.context.cmd_fd) {
            BY_CMD_FD
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&ino);
        }
    }
    // A shared device outlives its contexts (its port is the process's, see
    // `Device::open`); an imported context is a second handle on another's device.
    if !c.dev.is_shared() && !c.imported {
        c.verbs.stop_engine_thread();
    }
    if c.vctx.context.cmd_fd >= 0 {
        // SAFETY: the context's own fd, closed once (the async fd is closed with `events`).
        unsafe { libc::close(c.vctx.context.cmd_fd) };
    }
    0
}
symver!(ferroce_ibv_close_device => "ibv_close_device" @ "IBVERBS_1.1");

/// `ibv_import_device`: another context on the device of the context whose `cmd_fd` this
/// is (or a `dup` of it), in this process; it takes `cmd_fd` as its own and closes it. Its
/// PDs and MRs are reached with `ibv_import_pd` / `ibv_import_mr`. A context of another
/// process cannot be imported (its engine is in that process; `EOPNOTSUPP`).
#[no_mangle]
pub extern "C" fn ferroce_ibv_import_device(cmd_fd: c_int) -> *mut ffi::ibv_context {
    let found = inode(cmd_fd).and_then(|ino| {
        BY_CMD_FD
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&ino)
            .copied()
    });
    let Some(orig) = found else {
        set_errno(if inode(cmd_fd).is_some() {
            libc::EOPNOTSUPP
        } else {
            libc::EBADF
        });
        return std::ptr::null_mut();
    };
    // SAFETY: registered contexts are live until their close removes them, which takes
    // the registry's lock; reading a few fields here races no close that matters to a
    // program importing a context it is closing.
    let o = unsafe { &*(orig as *const Context) };
    let verbs = o.verbs.clone();
    let events = match AsyncEvents::new(o.dev, &verbs) {
        Ok(e) => e,
        Err(errno) => {
            set_errno(errno);
            return std::ptr::null_mut();
        }
    };
    let mut vctx = extended_ops(ffi::ibv_context {
        device: o.vctx.context.device,
        cmd_fd,
        async_fd: events.fd(),
        num_comp_vectors: o.vctx.context.num_comp_vectors,
        ops: crate::ops::table(),
        abi_compat: ABI_IS_EXTENDED,
        ..Default::default()
    });
    crate::extended::install(&mut vctx);
    // SAFETY: initializing a zeroed mutex in place before anyone can see it.
    unsafe {
        libc::pthread_mutex_init(
            &mut vctx.context.mutex as *mut _ as *mut libc::pthread_mutex_t,
            std::ptr::null(),
        )
    };
    publish_context(vctx, verbs, o.dev, events, true)
}
symver!(ferroce_ibv_import_device => "ibv_import_device" @ "IBVERBS_1.10");

/// What the device offers beyond the basic verbs (`device_cap_flags`).
fn device_cap_flags() -> u64 {
    u64::from(
        ffi::IBV_DEVICE_RC_RNR_NAK_GEN
            | ffi::IBV_DEVICE_PORT_ACTIVE_EVENT
            | ffi::IBV_DEVICE_SYS_IMAGE_GUID
            | ffi::IBV_DEVICE_N_NOTIFY_CQ,
    ) | crate::extended::device_cap_flags()
}

/// The device attributes of a context.
pub(crate) fn device_attr(ctx: &Context) -> ffi::ibv_device_attr {
    let a = ctx.verbs.query_device();
    let mut out = ffi::ibv_device_attr {
        node_guid: ctx.dev.guid,
        sys_image_guid: ctx.dev.guid,
        max_mr_size: a.max_mr_size,
        page_size_cap: 0xffff_f000,
        vendor_id: VENDOR_ID,
        vendor_part_id: vendor_part_id(),
        max_qp: a.max_qp as c_int,
        max_qp_wr: a.max_qp_wr as c_int,
        device_cap_flags: device_cap_flags() as c_uint,
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
        max_mw: crate::extended::max_mw(),
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

/// The extended device attributes.
pub(crate) fn device_attr_ex(c: &Context) -> ffi::ibv_device_attr_ex {
    let orig = device_attr(c);
    let mut out = ffi::ibv_device_attr_ex {
        orig_attr: orig,
        completion_timestamp_mask: u64::MAX,
        // The completion timestamps are the engine's clock, in nanoseconds: 1 GHz.
        hca_core_clock: 1_000_000,
        device_cap_flags_ex: device_cap_flags(),
        phys_port_cnt_ex: u32::from(orig.phys_port_cnt),
        ..Default::default()
    };
    crate::extended::fill_device_attr_ex(&mut out);
    out
}

/// `verbs_context.query_device_ex`: the extended attributes, as much of the program's
/// structure as it has room for (`attr_size`; older programs pass a shorter one).
unsafe extern "C" fn query_device_ex(
    ctx: *mut ffi::ibv_context,
    input: *const ffi::ibv_query_device_ex_input,
    attr: *mut ffi::ibv_device_attr_ex,
    attr_size: usize,
) -> c_int {
    // SAFETY: the inline wrapper passes the program's context.
    let Some(c) = (unsafe { context(ctx) }) else {
        return libc::EINVAL;
    };
    // SAFETY: null or the program's input.
    if unsafe { input.as_ref() }.is_some_and(|i| i.comp_mask != 0) {
        return libc::EINVAL;
    }
    if attr.is_null() || attr_size < size_of::<ffi::ibv_device_attr>() {
        return libc::EINVAL;
    }
    let a = device_attr_ex(c);
    let n = attr_size.min(size_of::<ffi::ibv_device_attr_ex>());
    // SAFETY: `attr` has `attr_size` writable bytes per the header's contract; `a` is a
    // whole structure of at least `n` bytes; the two do not overlap.
    unsafe {
        std::ptr::copy_nonoverlapping(
            &a as *const ffi::ibv_device_attr_ex as *const u8,
            attr as *mut u8,
            n,
        )
    };
    0
}

/// `verbs_context.query_rt_values`: the device's clock now (what completion timestamps
/// count), in `raw_clock` as seconds and nanoseconds.
unsafe extern "C" fn query_rt_values(
    ctx: *mut ffi::ibv_context,
    values: *mut ffi::ibv_values_ex,
) -> c_int {
    // SAFETY: the inline wrapper passes the program's context and structure.
    let (Some(c), Some(v)) = (unsafe { context(ctx) }, unsafe { values.as_mut() }) else {
        return libc::EINVAL;
    };
    if v.comp_mask & !ffi::IBV_VALUES_MASK_RAW_CLOCK != 0 {
        return libc::EINVAL;
    }
    if v.comp_mask & ffi::IBV_VALUES_MASK_RAW_CLOCK != 0 {
        let now = c.verbs.now();
        v.raw_clock.tv_sec = (now / 1_000_000_000) as _;
        v.raw_clock.tv_nsec = (now % 1_000_000_000) as _;
    }
    0
}

/// The attributes of port `port`.
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
        // A RoCE port: no subnet manager, IP-based GIDs, capability mask 2 present.
        port_cap_flags: ffi::IBV_PORT_CM_SUP | ffi::IBV_PORT_IP_BASED_GIDS,
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

/// `ibv_query_port` (the exported, legacy entry): writes the legacy 48 bytes (the header's
/// inline wrapper of an old program zeroed the rest of its structure first).
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

/// `verbs_context.query_port`: what the header's `ibv_query_port` calls on an extended
/// context, with the size of the program's structure (at least the legacy 48 bytes).
unsafe extern "C" fn query_port_ex(
    ctx: *mut ffi::ibv_context,
    port: u8,
    attr: *mut ffi::ibv_port_attr,
    len: usize,
) -> c_int {
    // SAFETY: the inline wrapper passes the program's context.
    let (Some(c), false) = (unsafe { context(ctx) }, attr.is_null()) else {
        return libc::EINVAL;
    };
    if len < LEGACY_PORT_ATTR_LEN {
        return libc::EINVAL;
    }
    let Some(a) = port_attr(c, port) else {
        return libc::EINVAL;
    };
    let n = len.min(size_of::<ffi::ibv_port_attr>());
    // SAFETY: `attr` has `len` writable bytes per the header's contract.
    unsafe {
        std::ptr::write_bytes(attr as *mut u8, 0, len);
        std::ptr::copy_nonoverlapping(
            &a as *const ffi::ibv_port_attr as *const u8,
            attr as *mut u8,
            n,
        )
    };
    0
}

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
    // An empty entry has no type (its sysfs attribute cannot be read).
    if c.verbs
        .query_gid_on(port, index)
        .is_ok_and(|g| g.0 == [0; 16])
        || c.verbs.query_gid_on(port, index).is_err()
    {
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
        // The program's `ibv_context` ends the extended context, whose size field sits just
        // before it, and the extended context starts ours.
        assert_eq!(offset_of!(Context, vctx), 0);
        assert_eq!(
            offset_of!(ffi::verbs_context, context) + size_of::<ffi::ibv_context>(),
            size_of::<ffi::verbs_context>()
        );
        assert_eq!(
            offset_of!(ffi::verbs_context, sz) + 8,
            offset_of!(ffi::verbs_context, context)
        );
        // The ops programs call through inline, at the header's offsets.
        assert_eq!(offset_of!(ffi::ibv_context, ops), 8);
        assert_eq!(
            offset_of!(ffi::ibv_context_ops, post_send),
            offset_of!(ffi::ibv_context_ops, _compat_destroy_qp) + 8
        );
    }
}
