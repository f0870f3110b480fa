//! What a device offers: `ibv_query_device`, `ibv_query_device_ex` and the device's clock
//! (`ibv_query_rt_values_ex`). The capabilities are the library's: each object's module says
//! what it can do (memory windows, RSS, tag matching), so this module sits above them.

use std::ffi::{c_int, c_uint};

use crate::context::{context, Context};
use crate::ffi;

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

/// What the device offers beyond the basic verbs (`device_cap_flags`).
fn device_cap_flags() -> u64 {
    u64::from(
        ffi::IBV_DEVICE_RC_RNR_NAK_GEN
            | ffi::IBV_DEVICE_PORT_ACTIVE_EVENT
            | ffi::IBV_DEVICE_SYS_IMAGE_GUID
            | ffi::IBV_DEVICE_N_NOTIFY_CQ,
    ) | extended_cap_flags()
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
        max_mw: crate::mw::MAX_MW,
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
    fill_device_attr_ex(&mut out);
    out
}

/// `verbs_context.query_device_ex`: the extended attributes, as much of the program's
/// structure as it has room for (`attr_size`; older programs pass a shorter one).
pub(crate) unsafe extern "C" fn query_device_ex(
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
pub(crate) unsafe extern "C" fn query_rt_values(
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

/// The `device_cap_flags` the extended verbs add.
fn extended_cap_flags() -> u64 {
    u64::from(
        ffi::IBV_DEVICE_SRQ_RESIZE
            | ffi::IBV_DEVICE_RESIZE_MAX_WR
            | ffi::IBV_DEVICE_MEM_WINDOW
            | ffi::IBV_DEVICE_MEM_WINDOW_TYPE_2B
            | ffi::IBV_DEVICE_MEM_MGT_EXTENSIONS
            | ffi::IBV_DEVICE_MANAGED_FLOW_STEERING,
    )
}

/// Fills what the extended verbs add to `ibv_device_attr_ex`: on-demand paging over a
/// given range for every operation of RC, UC and UD (registered memory is never pinned, so
/// an ODP region is a region like any other; the implicit whole-address-space form is not
/// offered, see `ibv_reg_mr`).
fn fill_device_attr_ex(a: &mut ffi::ibv_device_attr_ex) {
    let max_qp = a.orig_attr.max_qp as u32;
    let send_recv = ffi::IBV_ODP_SUPPORT_SEND | ffi::IBV_ODP_SUPPORT_RECV;
    a.odp_caps.general_caps = u64::from(ffi::IBV_ODP_SUPPORT);
    a.odp_caps.per_transport_caps.rc_odp_caps = send_recv
        | ffi::IBV_ODP_SUPPORT_WRITE
        | ffi::IBV_ODP_SUPPORT_READ
        | ffi::IBV_ODP_SUPPORT_ATOMIC
        | ffi::IBV_ODP_SUPPORT_SRQ_RECV;
    a.odp_caps.per_transport_caps.uc_odp_caps = send_recv | ffi::IBV_ODP_SUPPORT_WRITE;
    a.odp_caps.per_transport_caps.ud_odp_caps = send_recv;
    a.rss_caps = crate::wq::rss_caps();
    a.tm_caps = crate::srq::tm_caps();
    a.max_wq_type_rq = max_qp;
}
