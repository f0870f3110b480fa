//! rdma-core's private ABI (`IBVERBS_PRIVATE_34`): what provider libraries (libmlx5, libefa,
//! ... and DPDK's mlx5 PMD through libmlx5) import from libibverbs. A provider registers
//! itself from a constructor when it is loaded and later turns its own devices' verbs into
//! kernel commands with `ibv_cmd_*`. Over ferroce no kernel device exists for a provider to
//! match, so registration is accepted and forgotten, and every command fails with
//! `EOPNOTSUPP`: a program that loads a provider beside this library (perftest links
//! libmlx5 and libefa, pyverbs imports them, DPDK's EAL loads its mlx5 PMD) loads, and the
//! provider simply finds no device of its own. `ibv_query_gid_type`, also private, is a
//! real query ([`crate::context`]).

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::device::set_errno;
use crate::ffi;

/// Providers that registered (what `verbs_register_driver_34` was called with), counted for
/// tests: none of them is ever asked to match a ferroce device.
static REGISTERED: AtomicUsize = AtomicUsize::new(0);

/// How many providers have registered in this process.
pub fn providers_registered() -> usize {
    REGISTERED.load(Ordering::Relaxed)
}

/// `verbs_register_driver_34`: a provider's constructor announcing itself. Accepted and
/// forgotten: ferroce's devices are matched by no provider.
#[no_mangle]
pub extern "C" fn ferroce_verbs_register_driver_34(_ops: *const c_void) {
    REGISTERED.fetch_add(1, Ordering::Relaxed);
}
symver!(ferroce_verbs_register_driver_34 => "verbs_register_driver_34" @ "IBVERBS_PRIVATE_34");

/// `verbs_allow_disassociate_destroy`: libibverbs' flag that lets destroy verbs succeed on
/// a device the kernel took away. A data symbol; no device here is ever disassociated.
#[no_mangle]
pub static mut ferroce_verbs_allow_disassociate_destroy: bool = false;
symver!(ferroce_verbs_allow_disassociate_destroy => "verbs_allow_disassociate_destroy" @ "IBVERBS_PRIVATE_34");

/// Defines private entry points that fail: `errno` ones return `EOPNOTSUPP` (the `ibv_cmd_*`
/// convention: an errno as the result), `null` ones a null pointer with `errno` set, `void`
/// ones nothing. Their C parameters are ignored, which the x86-64 and AArch64 calling
/// conventions allow (the caller owns its arguments).
macro_rules! private_stubs {
    ($($kind:ident $imp:ident => $name:literal;)+) => {$(
        private_stubs!(@one $kind $imp $name);
        symver!($imp => $name @ "IBVERBS_PRIVATE_34");
    )+};
    (@one errno $imp:ident $name:literal) => {
        #[doc = concat!("`", $name, "`: a kernel command for a provider's device; `EOPNOTSUPP`.")]
        #[no_mangle]
        pub extern "C" fn $imp() -> c_int {
            libc::EOPNOTSUPP
        }
    };
    (@one null $imp:ident $name:literal) => {
        #[doc = concat!("`", $name, "`: no provider context is ever made; NULL, `errno` `EOPNOTSUPP`.")]
        #[no_mangle]
        pub extern "C" fn $imp() -> *mut c_void {
            set_errno(libc::EOPNOTSUPP);
            core::ptr::null_mut()
        }
    };
    (@one void $imp:ident $name:literal) => {
        #[doc = concat!("`", $name, "`: nothing to do for a provider context that never exists.")]
        #[no_mangle]
        pub extern "C" fn $imp() {}
    };
}

private_stubs! {
    null ferroce__verbs_init_and_alloc_context => "_verbs_init_and_alloc_context";
    void ferroce_verbs_uninit_context => "verbs_uninit_context";
    void ferroce_verbs_set_ops => "verbs_set_ops";
    void ferroce___verbs_log => "__verbs_log";
    errno ferroce_execute_ioctl => "execute_ioctl";
    errno ferroce_ibv_cmd_advise_mr => "ibv_cmd_advise_mr";
    errno ferroce_ibv_cmd_alloc_dm => "ibv_cmd_alloc_dm";
    errno ferroce_ibv_cmd_alloc_mw => "ibv_cmd_alloc_mw";
    errno ferroce_ibv_cmd_alloc_pd => "ibv_cmd_alloc_pd";
    errno ferroce_ibv_cmd_attach_mcast => "ibv_cmd_attach_mcast";
    errno ferroce_ibv_cmd_close_xrcd => "ibv_cmd_close_xrcd";
    errno ferroce_ibv_cmd_create_ah => "ibv_cmd_create_ah";
    errno ferroce_ibv_cmd_create_counters => "ibv_cmd_create_counters";
    errno ferroce_ibv_cmd_create_cq => "ibv_cmd_create_cq";
    errno ferroce_ibv_cmd_create_cq_ex => "ibv_cmd_create_cq_ex";
    errno ferroce_ibv_cmd_create_flow => "ibv_cmd_create_flow";
    errno ferroce_ibv_cmd_create_flow_action_esp => "ibv_cmd_create_flow_action_esp";
    errno ferroce_ibv_cmd_create_qp => "ibv_cmd_create_qp";
    errno ferroce_ibv_cmd_create_qp_ex => "ibv_cmd_create_qp_ex";
    errno ferroce_ibv_cmd_create_qp_ex2 => "ibv_cmd_create_qp_ex2";
    errno ferroce_ibv_cmd_create_rwq_ind_table => "ibv_cmd_create_rwq_ind_table";
    errno ferroce_ibv_cmd_create_srq => "ibv_cmd_create_srq";
    errno ferroce_ibv_cmd_create_srq_ex => "ibv_cmd_create_srq_ex";
    errno ferroce_ibv_cmd_create_wq => "ibv_cmd_create_wq";
    errno ferroce_ibv_cmd_dealloc_mw => "ibv_cmd_dealloc_mw";
    errno ferroce_ibv_cmd_dealloc_pd => "ibv_cmd_dealloc_pd";
    errno ferroce_ibv_cmd_dereg_mr => "ibv_cmd_dereg_mr";
    errno ferroce_ibv_cmd_destroy_ah => "ibv_cmd_destroy_ah";
    errno ferroce_ibv_cmd_destroy_counters => "ibv_cmd_destroy_counters";
    errno ferroce_ibv_cmd_destroy_cq => "ibv_cmd_destroy_cq";
    errno ferroce_ibv_cmd_destroy_flow => "ibv_cmd_destroy_flow";
    errno ferroce_ibv_cmd_destroy_flow_action => "ibv_cmd_destroy_flow_action";
    errno ferroce_ibv_cmd_destroy_qp => "ibv_cmd_destroy_qp";
    errno ferroce_ibv_cmd_destroy_rwq_ind_table => "ibv_cmd_destroy_rwq_ind_table";
    errno ferroce_ibv_cmd_destroy_srq => "ibv_cmd_destroy_srq";
    errno ferroce_ibv_cmd_destroy_wq => "ibv_cmd_destroy_wq";
    errno ferroce_ibv_cmd_detach_mcast => "ibv_cmd_detach_mcast";
    errno ferroce_ibv_cmd_free_dm => "ibv_cmd_free_dm";
    errno ferroce_ibv_cmd_get_context => "ibv_cmd_get_context";
    errno ferroce_ibv_cmd_modify_cq => "ibv_cmd_modify_cq";
    errno ferroce_ibv_cmd_modify_flow_action_esp => "ibv_cmd_modify_flow_action_esp";
    errno ferroce_ibv_cmd_modify_qp => "ibv_cmd_modify_qp";
    errno ferroce_ibv_cmd_modify_qp_ex => "ibv_cmd_modify_qp_ex";
    errno ferroce_ibv_cmd_modify_srq => "ibv_cmd_modify_srq";
    errno ferroce_ibv_cmd_modify_wq => "ibv_cmd_modify_wq";
    errno ferroce_ibv_cmd_open_qp => "ibv_cmd_open_qp";
    errno ferroce_ibv_cmd_open_xrcd => "ibv_cmd_open_xrcd";
    errno ferroce_ibv_cmd_poll_cq => "ibv_cmd_poll_cq";
    errno ferroce_ibv_cmd_post_recv => "ibv_cmd_post_recv";
    errno ferroce_ibv_cmd_post_send => "ibv_cmd_post_send";
    errno ferroce_ibv_cmd_post_srq_recv => "ibv_cmd_post_srq_recv";
    errno ferroce_ibv_cmd_query_context => "ibv_cmd_query_context";
    errno ferroce_ibv_cmd_query_device_any => "ibv_cmd_query_device_any";
    errno ferroce_ibv_cmd_query_mr => "ibv_cmd_query_mr";
    errno ferroce_ibv_cmd_query_port => "ibv_cmd_query_port";
    errno ferroce_ibv_cmd_query_qp => "ibv_cmd_query_qp";
    errno ferroce_ibv_cmd_query_srq => "ibv_cmd_query_srq";
    errno ferroce_ibv_cmd_read_counters => "ibv_cmd_read_counters";
    errno ferroce_ibv_cmd_reg_dm_mr => "ibv_cmd_reg_dm_mr";
    errno ferroce_ibv_cmd_reg_dmabuf_mr => "ibv_cmd_reg_dmabuf_mr";
    errno ferroce_ibv_cmd_reg_mr => "ibv_cmd_reg_mr";
    errno ferroce_ibv_cmd_req_notify_cq => "ibv_cmd_req_notify_cq";
    errno ferroce_ibv_cmd_rereg_mr => "ibv_cmd_rereg_mr";
    errno ferroce_ibv_cmd_resize_cq => "ibv_cmd_resize_cq";
}

/// `verbs_init_cq`: a provider filling in its own CQ's header. Done as libibverbs does it,
/// since it asks nothing of a device.
///
/// # Safety
/// `cq` points to a writable `struct ibv_cq`.
#[no_mangle]
pub unsafe extern "C" fn ferroce_verbs_init_cq(
    cq: *mut ffi::ibv_cq,
    context: *mut ffi::ibv_context,
    channel: *mut ffi::ibv_comp_channel,
    cq_context: *mut c_void,
) {
    // SAFETY: per the contract.
    if let Some(cq) = unsafe { cq.as_mut() } {
        cq.context = context;
        cq.channel = channel;
        cq.cq_context = cq_context;
        cq.comp_events_completed = 0;
        cq.async_events_completed = 0;
        // SAFETY: the header's own mutex and condition variable, in place.
        unsafe { crate::objects::init_sync(&mut cq.mutex, &mut cq.cond) };
    }
}
symver!(ferroce_verbs_init_cq => "verbs_init_cq" @ "IBVERBS_PRIVATE_34");

/// `verbs_open_device`: libibverbs' own opening of a device (what `ibv_open_device` is, and
/// what direct-verbs libraries call with their private data). A ferroce device opens as
/// with `ibv_open_device`; anything else is no device.
///
/// # Safety
/// `dev` is null or a device from `ibv_get_device_list`.
#[no_mangle]
pub unsafe extern "C" fn ferroce_verbs_open_device(
    dev: *mut ffi::ibv_device,
    _private_data: *mut c_void,
) -> *mut ffi::ibv_context {
    // SAFETY: per the contract.
    unsafe { crate::open::ferroce_ibv_open_device(dev) }
}
symver!(ferroce_verbs_open_device => "verbs_open_device" @ "IBVERBS_PRIVATE_34");

/// `__ioctl_final_num_attrs`: how many attributes a provider's command buffer chain holds.
/// Only a provider building a kernel command asks; the count it passed is the answer.
#[no_mangle]
pub extern "C" fn ferroce___ioctl_final_num_attrs(num_attrs: c_uint, _link: *mut c_void) -> c_uint {
    num_attrs
}
symver!(ferroce___ioctl_final_num_attrs => "__ioctl_final_num_attrs" @ "IBVERBS_PRIVATE_34");

/// `ibv_read_ibdev_sysfs_file`: a provider reading its kernel device's sysfs; ferroce
/// devices have none, so it fails as for a missing file.
#[no_mangle]
pub extern "C" fn ferroce_ibv_read_ibdev_sysfs_file(
    _buf: *mut c_char,
    _size: usize,
    _sysfs_dev: *mut c_void,
    _fnfmt: *const c_char,
) -> c_int {
    set_errno(libc::ENOENT);
    -1
}
symver!(ferroce_ibv_read_ibdev_sysfs_file => "ibv_read_ibdev_sysfs_file" @ "IBVERBS_PRIVATE_34");
