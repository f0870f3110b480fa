//! Failover layered above the transport, for peers whose transport cannot move a QP (a
//! hardware RNIC). ferroce's own, native failover moves the whole QP inside the transport
//! (`ferroce_stack::transport::qp::failover`); these are the papers' schemes, which work at
//! work requests or connections instead.
//!
//! - [`shift`]: SHIFT mode: work requests over a default and a backup QP.
//! - [`varuna`]: Varuna mode: virtual QPs with a completion log, CAS for exactly-once
//!   atomics, and a pool of backup connections.
//! - [`r2ccl`]: R2CCL's pieces: failure localization by probes, rollback, the out-of-band
//!   notice, and the decomposition of a collective's traffic onto the remaining rails.

pub mod r2ccl;
pub mod shift;
pub mod varuna;
