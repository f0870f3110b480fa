//! Probes the system for libdpdk with pkg-config and, when found, sets `cfg(ferroce_libdpdk)`.
//!
//! Only the probe happens here: nothing is linked, so a machine without DPDK builds the whole
//! workspace. The DPDK driver (cargo feature `dpdk` of ferroce-drivers) does its own bindgen and
//! linking; this cfg lets the facade and the tests know whether that driver can be built here.

fn main() {
    println!("cargo::rerun-if-env-changed=PKG_CONFIG_PATH");
    println!("cargo::rustc-check-cfg=cfg(ferroce_libdpdk)");
    let probe = pkg_config::Config::new()
        .cargo_metadata(false)
        .env_metadata(false)
        .probe("libdpdk");
    match probe {
        Ok(lib) => {
            println!("cargo::rustc-cfg=ferroce_libdpdk");
            println!("cargo::rustc-env=FERROCE_LIBDPDK_VERSION={}", lib.version);
        }
        Err(_) => println!("cargo::rustc-env=FERROCE_LIBDPDK_VERSION="),
    }
}
