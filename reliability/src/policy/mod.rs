//! The per-QP policies a connection composes ([`Policies`](crate::Policies)) that decide
//! recovery and paths, and the switch hook one of them was designed against.
//!
//! - [`gbn`]: the IBTA Go-Back-N every QP runs by default (it lives in the stack, which
//!   needs a default, and is re-exported here beside the others).
//! - [`spray`]: path selection: ECMP, random packet spraying, PSN-based spraying, with
//!   per-path avoidance.
//! - [`sr`]: ferroce's selective repeat with path-aware loss detection at the receiver (the
//!   Themis idea at the endpoint).
//! - [`baselines`]: ConnectX-7's selective repeat ("RNIC-SR") and timeout-only recovery, so
//!   schemes run side by side.
//! - [`themis`]: Themis itself, as the paper deployed it: a ToR switch hook on the simulated
//!   fabric in front of RNIC-SR endpoints.

pub mod baselines;
pub mod spray;
pub mod sr;
pub mod themis;

/// Go-Back-N as IBTA Vol 1 §9.7 specifies it: the requester resumes from the first missing
/// PSN; the responder NAKs a gap once and drops until the expected PSN arrives.
pub mod gbn {
    pub use ferroce_stack::transport::recovery::GoBackN;
}
