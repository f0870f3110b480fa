//! `librdmacm.so.1` over ferroce. Programs linked against rdma-core's librdmacm import
//! `rdma_create_id@RDMACM_1.0` and the like; this library defines each of those names as a
//! jump to `ferroce_<name>` in ferroce's libibverbs.so.1, where librdmacm's functions are
//! implemented (see `ferroce-ibverbs`'s `rdmacm` module). They live there so a process has
//! one copy of ferroce, whose contexts the ids' `verbs` are.
//!
//! A jump passes every argument and the return value through untouched, whatever the
//! signature (variadic `rfcntl` included), so nothing here restates one.

/// Defines `$name@@$ver` as a jump to `ferroce_$name` through the PLT.
macro_rules! forward {
    ($($ver:literal: $($name:ident)*;)*) => {$($(
        core::arch::global_asm!(concat!(
            ".globl ferroce_fwd_", stringify!($name), "\n",
            ".type ferroce_fwd_", stringify!($name), ", @function\n",
            "ferroce_fwd_", stringify!($name), ":\n",
            "    jmp ferroce_", stringify!($name), "@PLT\n",
            ".size ferroce_fwd_", stringify!($name), ", . - ferroce_fwd_", stringify!($name), "\n",
            ".symver ferroce_fwd_", stringify!($name), ", ", stringify!($name), "@@", $ver, "\n",
        ));
    )*)*};
}

forward! {
    "RDMACM_1.0":
        rdma_create_event_channel rdma_destroy_event_channel rdma_create_id rdma_destroy_id
        rdma_bind_addr rdma_resolve_addr rdma_resolve_route rdma_create_qp rdma_create_qp_ex
        rdma_destroy_qp rdma_connect rdma_listen rdma_accept rdma_reject rdma_notify
        rdma_disconnect rdma_join_multicast rdma_leave_multicast rdma_get_cm_event
        rdma_ack_cm_event rdma_get_src_port rdma_get_dst_port rdma_set_option
        rdma_migrate_id rdma_get_devices rdma_free_devices rdma_event_str rdma_getaddrinfo
        rdma_freeaddrinfo rdma_create_ep rdma_destroy_ep rdma_get_request rdma_create_srq
        rdma_create_srq_ex rdma_destroy_srq
        rsocket rbind rlisten raccept rconnect rshutdown rclose rrecv rrecvfrom rrecvmsg
        rsend rsendto rsendmsg rread rreadv rwrite rwritev rpoll rselect rgetpeername
        rgetsockname rsetsockopt rgetsockopt rfcntl riomap riounmap riowrite;
    "RDMACM_1.1":
        rdma_join_multicast_ex;
    "RDMACM_1.2":
        rdma_establish rdma_init_qp_attr;
    "RDMACM_1.3":
        rdma_set_local_ece rdma_get_remote_ece rdma_reject_ece;
}
