//! Reliability policies plugged into the sans-IO transport of `ferroce-stack`.
//!
//! A policy implements [`Recovery`]: the QP keeps the mechanism (PSNs, memory, completions,
//! the wire) and asks the policy how far ahead to send, which path a packet takes, where to
//! resume after a gap or a timeout, and what its responder does with an early packet.
//!
//! Today: [`gbn`], the IBTA Go-Back-N behaviour every QP runs by default (it lives in the
//! stack, which needs a default, and is re-exported here beside the others). Selective repeat,
//! spraying and path-aware loss detection (Themis), SDR-RDMA's partial-completion messaging
//! with SR and erasure coding, and multi-port failover (native, SHIFT, Varuna, R2CCL) arrive
//! with later issues as more implementations of the same trait.

pub use ferroce_stack::transport::recovery::{OutOfOrder, Recovery, SendWindow};

/// Go-Back-N as IBTA Vol 1 §9.7 specifies it: the requester resumes from the first missing
/// PSN; the responder NAKs a gap once and drops until the expected PSN arrives.
pub mod gbn {
    pub use ferroce_stack::transport::recovery::GoBackN;
}
