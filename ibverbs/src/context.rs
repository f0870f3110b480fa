//! An open device (`struct ibv_context`) as every verb finds it, its ports and GIDs
//! (`ibv_query_port`, `ibv_query_gid`) and its asynchronous events (`ibv_get_async_event`).
//! Opening and closing one is [`crate::open`]'s, querying the device [`crate::caps`]'s: both
//! reach the whole library (the ops tables, every object's capabilities), which itself
//! reaches contexts only through this module.

use std::ffi::{c_int, c_uint};
use std::mem::offset_of;

use ferroce_verbs::{Context as VerbsContext, PortState};

use crate::device::{set_errno, Device};
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

/// Bytes of `struct ibv_port_attr` a program compiled against the legacy layout reserves (up
/// to `flags`); the exported `ibv_query_port` writes no more.
pub const LEGACY_PORT_ATTR_LEN: usize = 48;

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

/// The context behind an object's `context` field.
///
/// # Safety
/// `ctx` is the `context` field of a live object of this library.
pub(crate) unsafe fn owner<'a>(ctx: *mut ffi::ibv_context) -> &'a Context {
    // SAFETY: objects are only made with a live context, which outlives them.
    unsafe { context(ctx) }.expect("object without a context")
}

impl Context {
    /// The pointer programs hold.
    pub(crate) fn ibv(&self) -> *mut ffi::ibv_context {
        &self.vctx.context as *const ffi::ibv_context as *mut ffi::ibv_context
    }
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
pub(crate) unsafe extern "C" fn query_port_ex(
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

/// `ibv_get_async_event`: the next event of the context, waiting for one unless the program
/// made `async_fd` non-blocking (then -1 with `errno` `EAGAIN` when none waits).
///
/// # Safety
/// `ctx` is an open context; `event` points to a writable `struct ibv_async_event`.
#[no_mangle]
pub unsafe extern "C" fn ferroce_ibv_get_async_event(
    ctx: *mut ffi::ibv_context,
    event: *mut ffi::ibv_async_event,
) -> c_int {
    // SAFETY: per the contract.
    let (Some(c), false) = (unsafe { context(ctx) }, event.is_null()) else {
        set_errno(libc::EINVAL);
        return -1;
    };
    // SAFETY: per the contract.
    unsafe { c.events.take(event) }
}
symver!(ferroce_ibv_get_async_event => "ibv_get_async_event" @ "IBVERBS_1.1");

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
