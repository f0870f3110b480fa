//! Stand-ins for the libraries perftest links beside libibverbs: `libmlx5.so.1`,
//! `libefa.so.1` and `librdmacm.so.1`. perftest is linked with immediate binding, so every
//! symbol it imports from them must resolve when it loads, although it calls them only on an
//! mlx5 or EFA device or with `-R` (rdma_cm). The real libraries would pull in the real
//! libibverbs' private ABI; instead the test directory holds links with their names to this
//! library, which defines their version nodes (see `build.rs`) and these symbols. Each fails
//! with `EOPNOTSUPP` and says so once on stderr.

use std::ffi::c_char;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::device::set_errno;

/// Says once per process that a stand-in was called.
fn unsupported(name: &str) {
    static SAID: AtomicBool = AtomicBool::new(false);
    if !SAID.swap(true, Ordering::Relaxed) {
        eprintln!("ferroce: {name} is not supported (no mlx5dv, efadv or rdma_cm over ferroce)");
    }
    set_errno(libc::EOPNOTSUPP);
}

/// Defines stand-ins: `null` ones return a null pointer, `fail` ones -1, `void` ones nothing.
macro_rules! stand_ins {
    ($($kind:ident $imp:ident => $name:literal @ $ver:literal;)+) => {$(
        stand_ins!(@one $kind $imp $name);
        symver!($imp => $name @ $ver);
    )+};
    (@one null $imp:ident $name:literal) => {
        #[doc = concat!("Stand-in for `", $name, "`: NULL, errno EOPNOTSUPP.")]
        #[no_mangle]
        pub extern "C" fn $imp() -> *mut core::ffi::c_void {
            unsupported($name);
            core::ptr::null_mut()
        }
    };
    (@one fail $imp:ident $name:literal) => {
        #[doc = concat!("Stand-in for `", $name, "`: -1, errno EOPNOTSUPP.")]
        #[no_mangle]
        pub extern "C" fn $imp() -> core::ffi::c_int {
            unsupported($name);
            -1
        }
    };
    (@one void $imp:ident $name:literal) => {
        #[doc = concat!("Stand-in for `", $name, "`: does nothing.")]
        #[no_mangle]
        pub extern "C" fn $imp() {
            unsupported($name);
        }
    };
}

stand_ins! {
    null ferroce_mlx5dv_create_mkey => "mlx5dv_create_mkey" @ "MLX5_1.10";
    fail ferroce_mlx5dv_destroy_mkey => "mlx5dv_destroy_mkey" @ "MLX5_1.10";
    null ferroce_mlx5dv_qp_ex_from_ibv_qp_ex => "mlx5dv_qp_ex_from_ibv_qp_ex" @ "MLX5_1.10";
    fail ferroce_mlx5dv_crypto_login => "mlx5dv_crypto_login" @ "MLX5_1.21";
    null ferroce_mlx5dv_dek_create => "mlx5dv_dek_create" @ "MLX5_1.21";
    fail ferroce_mlx5dv_dek_destroy => "mlx5dv_dek_destroy" @ "MLX5_1.21";
    null ferroce_mlx5dv_create_qp => "mlx5dv_create_qp" @ "MLX5_1.3";
    fail ferroce_mlx5dv_devx_general_cmd => "mlx5dv_devx_general_cmd" @ "MLX5_1.7";
    null ferroce_mlx5dv_open_device => "mlx5dv_open_device" @ "MLX5_1.7";
    fail ferroce_mlx5dv_is_supported => "mlx5dv_is_supported" @ "MLX5_1.8";
    null ferroce_efadv_create_qp_ex => "efadv_create_qp_ex" @ "EFA_1.1";
    fail ferroce_efadv_query_device => "efadv_query_device" @ "EFA_1.1";
    fail ferroce_rdma_accept => "rdma_accept" @ "RDMACM_1.0";
    fail ferroce_rdma_ack_cm_event => "rdma_ack_cm_event" @ "RDMACM_1.0";
    fail ferroce_rdma_bind_addr => "rdma_bind_addr" @ "RDMACM_1.0";
    fail ferroce_rdma_connect => "rdma_connect" @ "RDMACM_1.0";
    null ferroce_rdma_create_event_channel => "rdma_create_event_channel" @ "RDMACM_1.0";
    fail ferroce_rdma_create_id => "rdma_create_id" @ "RDMACM_1.0";
    fail ferroce_rdma_create_qp => "rdma_create_qp" @ "RDMACM_1.0";
    fail ferroce_rdma_create_qp_ex => "rdma_create_qp_ex" @ "RDMACM_1.0";
    void ferroce_rdma_destroy_event_channel => "rdma_destroy_event_channel" @ "RDMACM_1.0";
    fail ferroce_rdma_destroy_id => "rdma_destroy_id" @ "RDMACM_1.0";
    void ferroce_rdma_destroy_qp => "rdma_destroy_qp" @ "RDMACM_1.0";
    fail ferroce_rdma_disconnect => "rdma_disconnect" @ "RDMACM_1.0";
    void ferroce_rdma_freeaddrinfo => "rdma_freeaddrinfo" @ "RDMACM_1.0";
    fail ferroce_rdma_get_cm_event => "rdma_get_cm_event" @ "RDMACM_1.0";
    fail ferroce_rdma_getaddrinfo => "rdma_getaddrinfo" @ "RDMACM_1.0";
    fail ferroce_rdma_listen => "rdma_listen" @ "RDMACM_1.0";
    fail ferroce_rdma_reject => "rdma_reject" @ "RDMACM_1.0";
    fail ferroce_rdma_resolve_addr => "rdma_resolve_addr" @ "RDMACM_1.0";
    fail ferroce_rdma_resolve_route => "rdma_resolve_route" @ "RDMACM_1.0";
    fail ferroce_rdma_set_option => "rdma_set_option" @ "RDMACM_1.0";
}

/// Stand-in for `rdma_event_str`: a string, since programs print it.
#[no_mangle]
pub extern "C" fn ferroce_rdma_event_str(_event: core::ffi::c_int) -> *const c_char {
    c"RDMA_CM_EVENT_UNSUPPORTED".as_ptr()
}
symver!(ferroce_rdma_event_str => "rdma_event_str" @ "RDMACM_1.0");

/// The names the test directory links to this library.
pub const SHADOWED: &[&str] = &["libmlx5.so.1", "libefa.so.1", "librdmacm.so.1"];
