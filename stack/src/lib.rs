//! ferroce's protocol core: RoCEv2 wire formats and (from issue 3 on) the sans-IO RDMA transport.
//!
//! Everything here is mechanism without I/O: no sockets, no clock, no threads. Frames come in as
//! byte slices and go out into buffers the caller owns, so the same code runs over DPDK, AF_PACKET
//! and the simulated fabric.
#![warn(missing_docs)]

pub mod cm;
mod counter_set;
pub mod switch;
pub mod transport;
pub mod wire;
