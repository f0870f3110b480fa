//! Generates the C types of `<infiniband/verbs.h>` with bindgen (the layout the programs were
//! compiled against, with bindgen's size and offset assertions), and the version nodes the
//! exported symbols are bound to (`IBVERBS_1.0` … `IBVERBS_1.14`, `IBVERBS_PRIVATE_34`): a
//! program linked against rdma-core asks for `ibv_open_device@IBVERBS_1.1`, not just the
//! name.

use std::env;
use std::path::PathBuf;

/// rdma-core's version nodes, each inheriting the one before.
const NODES: &[&str] = &[
    "IBVERBS_1.0",
    "IBVERBS_1.1",
    "IBVERBS_1.5",
    "IBVERBS_1.6",
    "IBVERBS_1.7",
    "IBVERBS_1.8",
    "IBVERBS_1.9",
    "IBVERBS_1.10",
    "IBVERBS_1.11",
    "IBVERBS_1.12",
    "IBVERBS_1.13",
    "IBVERBS_1.14",
];

fn main() {
    println!("cargo:rerun-if-changed=wrapper.h");
    println!("cargo:rerun-if-changed=build.rs");
    let out = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR"));

    let header = "/usr/include/infiniband/verbs.h";
    if !std::path::Path::new(header).exists() {
        panic!(
            "{header} is missing: install libibverbs-dev (apt-get install libibverbs-dev) to build \
             ferroce's libibverbs"
        );
    }
    bindgen::Builder::default()
        .header("wrapper.h")
        .allowlist_type("ibv_.*|_ibv_.*|_compat_ibv_.*|verbs_.*|ib_uverbs_qp_attr|ib_uverbs_ah_attr|ib_user_path_rec")
        .allowlist_type("rdma_.*")
        .allowlist_var("IBV_.*|IBV_WC_.*|RDMA_.*|RAI_.*")
        .derive_default(true)
        .derive_debug(false)
        .layout_tests(true)
        .generate_comments(false)
        .prepend_enum_name(false)
        .generate()
        .expect("bindgen could not read <infiniband/verbs.h>")
        .write_to_file(out.join("verbs.rs"))
        .expect("cannot write verbs.rs");

    let mut map = String::new();
    let mut prev: Option<&str> = None;
    for node in NODES {
        match prev {
            Some(p) => map.push_str(&format!("{node} {{ }} {p};\n")),
            None => map.push_str(&format!("{node} {{ }};\n")),
        }
        prev = Some(node);
    }
    map.push_str("IBVERBS_PRIVATE_34 { };\n");
    let path = out.join("ibverbs.map");
    std::fs::write(&path, map).expect("cannot write the version script");
    println!(
        "cargo:rustc-cdylib-link-arg=-Wl,--version-script={}",
        path.display()
    );
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libibverbs.so.1");
}
