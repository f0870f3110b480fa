//! With the `dpdk` feature: generates Rust bindings for the DPDK calls ferroce makes from the
//! system's libdpdk headers (found with pkg-config, whose whole `--cflags` output both bindgen
//! and the C compiler get: it carries `-include rte_config.h` and `-march`), compiles the small
//! C shim that gives DPDK's static inline functions a linkable body, and links libdpdk.
//! Without the feature it does nothing.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    #[cfg(feature = "dpdk")]
    dpdk::build();
}

#[cfg(feature = "dpdk")]
mod dpdk {
    use std::path::PathBuf;
    use std::process::Command;

    fn pkg_config(arg: &str) -> Vec<String> {
        let out = Command::new("pkg-config")
            .args([arg, "libdpdk"])
            .output()
            .expect("pkg-config must be installed to build the dpdk feature");
        assert!(
            out.status.success(),
            "pkg-config cannot find libdpdk; install libdpdk-dev (Debian 12 ships 22.11)"
        );
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .map(str::to_owned)
            .collect()
    }

    pub(super) fn build() {
        println!("cargo:rerun-if-changed=src/dpdk/shim.h");
        println!("cargo:rerun-if-changed=src/dpdk/shim.c");
        let cflags = pkg_config("--cflags");
        let bindings = bindgen::Builder::default()
            .header("src/dpdk/shim.h")
            .clang_args(&cflags)
            .allowlist_function("fr_.*")
            .allowlist_function("rte_eal_init")
            .allowlist_function("rte_eal_cleanup")
            .allowlist_function("rte_eth_dev_count_avail")
            .allowlist_function("rte_eth_macaddr_get")
            .allowlist_function("rte_eth_link_get_nowait")
            .allowlist_function("rte_eth_dev_set_link_up")
            .allowlist_function("rte_eth_dev_set_link_down")
            .allowlist_function("rte_eth_dev_get_mtu")
            .allowlist_function("rte_pktmbuf_pool_create")
            .allowlist_function("rte_socket_id")
            .allowlist_type("rte_ether_addr")
            .allowlist_type("rte_eth_link")
            .opaque_type("rte_mbuf_ext_shared_info")
            .opaque_type("rte_mbuf")
            .opaque_type("rte_mempool")
            .layout_tests(true)
            // DPDK's comments hold C examples that rustdoc would try to run as doctests.
            .generate_comments(false)
            .generate()
            .expect("bindgen could not read the DPDK headers");
        let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
        bindings
            .write_to_file(out.join("dpdk_bindings.rs"))
            .expect("write the DPDK bindings");
        let mut cc = cc::Build::new();
        cc.file("src/dpdk/shim.c").warnings(false);
        for f in &cflags {
            cc.flag(f);
        }
        cc.compile("ferroce_dpdk_shim");
        for l in pkg_config("--libs") {
            if let Some(lib) = l.strip_prefix("-l") {
                println!("cargo:rustc-link-lib=dylib={lib}");
            } else if let Some(dir) = l.strip_prefix("-L") {
                println!("cargo:rustc-link-search=native={dir}");
            }
        }
    }
}
