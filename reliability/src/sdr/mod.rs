//! SDR-RDMA (seed 004): partial-completion messaging over UC with reliability layered on
//! the receive bitmap — selective repeat, or erasure coding with an SR fallback.
//!
//! Built in pieces (issue 21); so far the erasure codecs EC runs on ([`codec`]) and the
//! per-packet immediate ([`imm`]), the completion-time model ([`model`]) the receive side's message table ([`recv`]) and the send side's packetizer ([`send`]).

pub mod ack;
pub mod auto;
pub mod codec;
pub mod imm;
pub mod model;
pub mod receiver;
pub mod recv;
pub mod reliable;
pub mod send;

pub use imm::{ImmLayout, SdrImm};
