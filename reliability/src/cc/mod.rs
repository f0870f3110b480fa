//! Congestion control behind the transport's [`CongestionControl`](crate::CongestionControl)
//! seam: how much a QP may have in flight, at what rate.
//!
//! - [`dcqcn`]: DCQCN's reaction point, as a ConnectX runs it (the notification point that
//!   sends the CNPs is in every QP: `ferroce_stack::transport::notify`).
//! - [`timely`]: TIMELY, delay-based, on the same seam.

pub mod dcqcn;
pub mod timely;
