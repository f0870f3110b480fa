//! ferroce — a software RNIC.
//!
//! ferroce runs RoCEv2 on raw NIC queues in poll mode and owns the whole RDMA transport in
//! software. This facade crate re-exports the workspace's crates under short names, so a user
//! links one crate; see `docs/ARCHITECTURE.md` for how they fit together.

pub use ferroce_drivers as drivers;
pub use ferroce_isal as isal;
pub use ferroce_reliability as reliability;
pub use ferroce_stack as stack;
pub use ferroce_testbed as testbed;
pub use ferroce_verbs as verbs;

/// The libdpdk version pkg-config found when this crate was built, or `None` when the build
/// machine has no libdpdk (the DPDK driver cannot be built there).
pub fn libdpdk_version() -> Option<&'static str> {
    let v = env!("FERROCE_LIBDPDK_VERSION");
    if cfg!(ferroce_libdpdk) && !v.is_empty() {
        Some(v)
    } else {
        None
    }
}
