//! Reliability policies plugged into the sans-IO transport of `ferroce-stack`.
//!
//! A QP runs three policies, composed per QP
//! ([`Policies`](ferroce_stack::transport::Policies)): a [`PathSelector`] says which path
//! each packet takes, a [`Recovery`] how the responder delivers early packets, what to
//! resend after a gap or a timeout and when a missing PSN counts as lost, and a
//! [`CongestionControl`] how much may be in flight at what rate. The QP keeps the mechanism
//! (PSNs, memory, completions, the wire, arrival bitmaps, timers).
//!
//! - [`gbn`]: the IBTA Go-Back-N behaviour every QP runs by default (it lives in the stack,
//!   which needs a default, and is re-exported here beside the others).
//! - [`spray`]: path selection: ECMP, random packet spraying, PSN-based spraying, with
//!   per-path avoidance.
//! - [`sr`]: ferroce's selective repeat with path-aware loss detection at the receiver (the
//!   Themis idea at the endpoint).
//! - [`baselines`]: ConnectX-7's selective repeat ("RNIC-SR") and timeout-only recovery, so
//!   schemes run side by side.
//! - [`themis`]: Themis itself, as the paper deployed it: a ToR switch hook on the simulated
//!   fabric in front of RNIC-SR endpoints.
//!
//! - [`sdr`]: SDR-RDMA's partial-completion messaging, begun: erasure codecs, the per-packet
//!   immediate, the completion-time model, the receive table and the send packetizer, all
//!   sans-IO; not yet wired to the engine. SDR is a layer above UC QPs, not a `Recovery`.
//!
//! - [`shift`]: SHIFT mode, failover at work requests over a default and a backup QP for
//!   peers whose transport is in hardware (native failover lives in the transport:
//!   `ferroce_stack::transport::failover`).
//!
//! - [`varuna`], [`r2ccl`]: Varuna mode and R2CCL's failure handling (issue 23).
//! - [`dcqcn`]: DCQCN's reaction point behind the `CongestionControl` seam (issue 24);
//!   [`timely`]: TIMELY, delay-based, on the same seam.

#![forbid(unsafe_code)]

pub mod baselines;
pub mod dcqcn;
pub mod r2ccl;
pub mod sdr;
pub mod shift;
pub mod spray;
pub mod sr;
pub mod themis;
pub mod timely;
pub mod varuna;

pub use ferroce_stack::transport::congestion::{AckEvent, CongestionControl, Loss, NoControl};
pub use ferroce_stack::transport::path::{Ecmp, Path, PathSelector};
pub use ferroce_stack::transport::recovery::{
    Arrivals, Delivery, Feedback, LossReport, OutOfOrder, Recovery, Retransmit, SendWindow,
};
pub use ferroce_stack::transport::Policies;

/// Go-Back-N as IBTA Vol 1 §9.7 specifies it: the requester resumes from the first missing
/// PSN; the responder NAKs a gap once and drops until the expected PSN arrives.
pub mod gbn {
    pub use ferroce_stack::transport::recovery::GoBackN;
}
