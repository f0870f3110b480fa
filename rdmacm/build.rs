//! The version nodes of rdma-core 44's librdmacm (`RDMACM_1.0` … `RDMACM_1.3`, each
//! inheriting the one before), the soname, and a dependency on libibverbs.so.1, where the
//! functions this library forwards to live.

use std::env;
use std::path::PathBuf;

const NODES: &[&str] = &["RDMACM_1.0", "RDMACM_1.1", "RDMACM_1.2", "RDMACM_1.3"];

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let out = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR"));
    let mut map = String::new();
    let mut prev: Option<&str> = None;
    for node in NODES {
        match prev {
            Some(p) => map.push_str(&format!("{node} {{ }} {p};\n")),
            None => map.push_str(&format!("{node} {{ }};\n")),
        }
        prev = Some(node);
    }
    let path = out.join("rdmacm.map");
    std::fs::write(&path, map).expect("cannot write the version script");
    println!(
        "cargo:rustc-cdylib-link-arg=-Wl,--version-script={}",
        path.display()
    );
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,librdmacm.so.1");
    // The forwarded-to functions are in ferroce's libibverbs.so.1, found at run time; the
    // link only records the dependency (any libibverbs.so.1 on the build machine will do).
    println!("cargo:rustc-cdylib-link-arg=-Wl,--no-as-needed");
    println!("cargo:rustc-cdylib-link-arg=-l:libibverbs.so.1");
}
