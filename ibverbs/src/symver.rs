//! Symbol versions. Programs linked against rdma-core import `name@IBVERBS_x.y`; a Rust
//! cdylib exports plain names under rustc's own version script, so each exported function is
//! defined under a private name (`ferroce_<name>`) and bound to its public versioned name with
//! an assembler `.symver` directive. The version nodes themselves come from the version script
//! `build.rs` writes.

/// Binds the `#[no_mangle]` function `$imp` to `$name@@$ver` (the default version).
macro_rules! symver {
    ($imp:ident => $name:literal @ $ver:literal) => {
        ::core::arch::global_asm!(concat!(
            ".symver ",
            stringify!($imp),
            ", ",
            $name,
            "@@",
            $ver
        ));
    };
}
