//! build.rs finds libdpdk exactly when pkg-config does, so the DPDK driver's cfg is trustworthy.

use std::process::Command;

#[test]
fn libdpdk_probe_matches_pkg_config() {
    let out = Command::new("pkg-config")
        .args(["--modversion", "libdpdk"])
        .output();
    let expected = match out {
        Ok(o) if o.status.success() => Some(String::from_utf8(o.stdout).unwrap().trim().to_owned()),
        _ => None,
    };
    assert_eq!(ferroce::libdpdk_version().map(str::to_owned), expected);
}
