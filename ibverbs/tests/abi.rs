//! The drop-in's ABI against rdma-core's own `libibverbs.so.1`: every symbol the system
//! library exports at its default version (`name@@VERSION`, what a program or a provider
//! linked against it imports), functions and data, must be exported by ours with the same
//! version, and every version node the system library defines must exist in ours. The old
//! `IBVERBS_1.0` compatibility versions of symbols whose default is newer (`name@VERSION`,
//! hidden) are left out, as the issue allows: nothing built since rdma-core 13 imports them.
//!
//! Read with `objdump` (binutils) from the system library Debian's libibverbs1 installs.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;

const SYSTEM: &str = "/usr/lib/x86_64-linux-gnu/libibverbs.so.1";

/// The built drop-in: cargo builds the crate's cdylib beside this test in `deps/` (it
/// copies it up to `target/<profile>/` only for `cargo build`).
fn ours() -> PathBuf {
    let exe = std::env::current_exe().expect("test path");
    let deps = exe.parent().expect("deps dir");
    let beside = deps.join("libibverbs.so");
    if beside.exists() {
        return beside;
    }
    deps.parent().expect("target dir").join("libibverbs.so")
}

/// `(version, name)` of every function and object a library exports at its default version.
fn exports(lib: &str) -> BTreeSet<(String, String)> {
    let out = Command::new("objdump")
        .args(["-T", lib])
        .output()
        .expect("objdump (binutils) runs");
    assert!(out.status.success(), "objdump -T {lib} failed");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.contains("*UND*") && (l.contains(" DF ") || l.contains(" DO ")))
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let (ver, name) = (f.get(f.len().checked_sub(2)?)?, f.last()?);
            // "(VERSION)" marks a hidden, non-default version; *ABS* lines are the
            // version nodes themselves.
            (!ver.starts_with('(') && !l.contains("*ABS*"))
                .then(|| (ver.to_string(), name.to_string()))
        })
        .collect()
}

/// The version nodes a library defines.
fn version_nodes(lib: &str) -> BTreeSet<String> {
    let out = Command::new("objdump")
        .args(["-p", lib])
        .output()
        .expect("objdump (binutils) runs");
    let text = String::from_utf8_lossy(&out.stdout);
    let Some(defs) = text.split("Version definitions:").nth(1) else {
        return BTreeSet::new();
    };
    defs.lines()
        .skip(1)
        .take_while(|l| !l.trim().is_empty() && !l.starts_with("Version References"))
        .filter_map(|l| l.split_whitespace().nth(3).map(str::to_string))
        .filter(|n| !n.starts_with("libibverbs"))
        .collect()
}

#[test]
fn every_default_symbol_and_version_node_of_rdma_core_resolves_in_the_drop_in() {
    if !std::path::Path::new(SYSTEM).exists() {
        panic!("{SYSTEM} is missing: install libibverbs1 (the test command does)");
    }
    let ours = ours();
    assert!(ours.exists(), "{} was not built", ours.display());
    let ours = ours.to_str().expect("utf-8 path");
    let system = exports(SYSTEM);
    let mine = exports(ours);
    assert!(
        system.len() >= 140,
        "only {} symbols read from {SYSTEM}",
        system.len()
    );
    let missing: Vec<_> = system.difference(&mine).collect();
    assert!(
        missing.is_empty(),
        "{} of rdma-core's {} default symbols are missing from the drop-in: {missing:?}",
        missing.len(),
        system.len()
    );
    let nodes = version_nodes(SYSTEM);
    let my_nodes = version_nodes(ours);
    let missing: Vec<_> = nodes.difference(&my_nodes).collect();
    assert!(missing.is_empty(), "version nodes missing: {missing:?}");
    // The provider-facing private ABI in particular (what libmlx5 and libefa import).
    assert!(mine.contains(&(
        "IBVERBS_PRIVATE_34".to_string(),
        "verbs_register_driver_34".to_string()
    )));
    assert!(mine.contains(&(
        "IBVERBS_PRIVATE_34".to_string(),
        "verbs_allow_disassociate_destroy".to_string()
    )));
}
