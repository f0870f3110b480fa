//! Varuna mode (seed 001, issue 23), begun: the pieces that classify work requests after a
//! failure, sans-IO.
//!
//! - [`log`]: the request log and the responder's completion log (8-byte entries), and the
//!   classification of every unfinished request as pre-failure (resend) or post-failure
//!   (executed: recover its result, do not resend) from one READ of the completion log.
//! - [`uid`]: the extended-status CAS — UIDs, the per-vQP CAS buffer, and the outcome of a
//!   CAS in flight at a failure (won, lost, not executed), forged and stale UIDs included.
//!
//! - [`vqp`]: a vQP over a default and a backup QP that logs its WRITEs, and after a failure
//!   READs the peer's completion log through the backup and resends only the pre-failure
//!   ones. CAS with extended status, FAA as READ + CAS and the shared backup pool come next.

pub mod log;
pub mod uid;
pub mod vqp;
