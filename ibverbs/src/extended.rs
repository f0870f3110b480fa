//! The extended verbs a context offers through `struct verbs_context` (see
//! [`crate::context`]), and the device capabilities they add.

use crate::ffi;

/// Fills the extended entry points of a new context.
pub(crate) fn install(v: &mut ffi::verbs_context) {
    v.create_cq_ex = Some(crate::cq::create_cq_ex);
    v.create_qp_ex = Some(crate::qp::create_qp_ex);
    v.create_srq_ex = Some(crate::srq::create_srq_ex);
    v.get_srq_num = Some(crate::srq::get_srq_num);
    v.post_srq_ops = Some(crate::srq::post_srq_ops);
    v.alloc_td = Some(crate::domain::alloc_td);
    v.dealloc_td = Some(crate::domain::dealloc_td);
    v.alloc_parent_domain = Some(crate::domain::alloc_parent_domain);
    v.advise_mr = Some(crate::mr::advise_mr);
    v.ibv_create_flow = Some(crate::flow::create_flow);
    v.ibv_destroy_flow = Some(crate::flow::destroy_flow);
    v.create_wq = Some(crate::wq::create_wq);
    v.modify_wq = Some(crate::wq::modify_wq);
    v.destroy_wq = Some(crate::wq::destroy_wq);
    v.create_rwq_ind_table = Some(crate::wq::create_rwq_ind_table);
    v.destroy_rwq_ind_table = Some(crate::wq::destroy_rwq_ind_table);
}

/// The `device_cap_flags` the extended verbs add.
pub(crate) fn device_cap_flags() -> u64 {
    u64::from(
        ffi::IBV_DEVICE_SRQ_RESIZE
            | ffi::IBV_DEVICE_RESIZE_MAX_WR
            | ffi::IBV_DEVICE_MEM_WINDOW
            | ffi::IBV_DEVICE_MEM_WINDOW_TYPE_2B
            | ffi::IBV_DEVICE_MEM_MGT_EXTENSIONS
            | ffi::IBV_DEVICE_MANAGED_FLOW_STEERING,
    )
}

/// Memory windows a device offers.
pub(crate) fn max_mw() -> i32 {
    crate::mw::MAX_MW
}

/// Fills what the extended verbs add to `ibv_device_attr_ex`: on-demand paging over a
/// given range for every operation of RC, UC and UD (registered memory is never pinned, so
/// an ODP region is a region like any other; the implicit whole-address-space form is not
/// offered, see `ibv_reg_mr`).
pub(crate) fn fill_device_attr_ex(a: &mut ffi::ibv_device_attr_ex) {
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
