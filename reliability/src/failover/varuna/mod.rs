//! Varuna mode (seed 001, issue 23), begun: the pieces that classify work requests after a
//! failure, sans-IO.
//!
//! - [`log`]: the request log and the responder's completion log (8-byte entries), and the
//!   classification of every unfinished request as pre-failure (resend) or post-failure
//!   (executed: recover its result, do not resend) from one READ of the completion log.
//! - [`uid`]: the extended-status CAS — UIDs, the per-vQP CAS buffer, and the outcome of a
//!   CAS in flight at a failure (won, lost, not executed), forged and stale UIDs included.
//!
//! - [`vqp`]: a vQP over a default and a backup QP that logs its WRITEs, runs CAS with
//!   extended status and FETCH_ADD as READ + CAS, and after a failure READs the peer's
//!   completion log (and every in-flight CAS's target) through the backup, resending only
//!   what never ran.
//! - [`pool`]: shared backup channels used first at a failover, each vQP's own backup QP
//!   rebuilt in the background and taken once the vQP is quiescent.

pub mod log;
pub mod pool;
pub mod uid;
pub mod vqp;
