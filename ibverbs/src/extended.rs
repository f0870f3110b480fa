//! The extended verbs a context offers through `struct verbs_context` (see
//! [`crate::context`]), and the device capabilities they add.

use crate::ffi;

/// Fills the extended entry points of a new context.
pub(crate) fn install(v: &mut ffi::verbs_context) {
    v.create_cq_ex = Some(crate::cq::create_cq_ex);
    v.create_qp_ex = Some(crate::qp::create_qp_ex);
    v.create_srq_ex = Some(crate::srq::create_srq_ex);
    v.get_srq_num = Some(crate::srq::get_srq_num);
    v.alloc_td = Some(crate::domain::alloc_td);
    v.dealloc_td = Some(crate::domain::dealloc_td);
    v.alloc_parent_domain = Some(crate::domain::alloc_parent_domain);
}

/// The `device_cap_flags` the extended verbs add.
pub(crate) fn device_cap_flags() -> u64 {
    u64::from(
        ffi::IBV_DEVICE_SRQ_RESIZE
            | ffi::IBV_DEVICE_RESIZE_MAX_WR
            | ffi::IBV_DEVICE_MEM_WINDOW
            | ffi::IBV_DEVICE_MEM_WINDOW_TYPE_2B
            | ffi::IBV_DEVICE_MEM_MGT_EXTENSIONS,
    )
}

/// Memory windows a device offers.
pub(crate) fn max_mw() -> i32 {
    crate::mw::MAX_MW
}

/// Fills what the extended verbs add to `ibv_device_attr_ex`.
pub(crate) fn fill_device_attr_ex(_attr: &mut ffi::ibv_device_attr_ex) {}
