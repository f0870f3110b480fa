//! Reliability policies plugged into the sans-IO transport of `ferroce-stack`.
//!
//! A QP runs three policies, composed per QP
//! ([`Policies`](ferroce_stack::transport::Policies)): a [`PathSelector`] says which path
//! each packet takes, a [`Recovery`] how the responder delivers early packets, what to
//! resend after a gap or a timeout and when a missing PSN counts as lost, and a
//! [`CongestionControl`] how much may be in flight at what rate. The QP keeps the mechanism
//! (PSNs, memory, completions, the wire, arrival bitmaps, timers).
//!
//! By role:
//!
//! - [`policy`]: recovery and path selection ([`gbn`](policy::gbn), [`sr`](policy::sr),
//!   [`spray`](policy::spray), [`baselines`](policy::baselines)) and the Themis switch hook
//!   ([`themis`](policy::themis)).
//! - [`cc`]: congestion control on the same seam ([`dcqcn`](cc::dcqcn),
//!   [`timely`](cc::timely)).
//! - [`sdr`]: SDR-RDMA's partial-completion messaging: a layer above UC QPs (not a
//!   `Recovery`), driven by the verbs API (`ferroce_verbs::sdr`) and the scenario.
//! - [`failover`]: failover above the transport for hardware peers ([`shift`](failover::shift),
//!   [`varuna`](failover::varuna), [`r2ccl`](failover::r2ccl)); native failover lives in
//!   the transport (`ferroce_stack::transport::qp::failover`).

#![forbid(unsafe_code)]

pub mod cc;
pub mod failover;
pub mod policy;
pub mod schemes;
pub mod sdr;

pub use ferroce_stack::transport::congestion::{AckEvent, CongestionControl, Loss, NoControl};
pub use ferroce_stack::transport::path::{Ecmp, Path, PathSelector};
pub use ferroce_stack::transport::recovery::{
    Arrivals, Delivery, Feedback, LossReport, OutOfOrder, Recovery, Retransmit, SendWindow,
};
pub use ferroce_stack::transport::Policies;
