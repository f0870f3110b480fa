//! ferroce's drivers: the [`Port`] trait every NIC queue implements, and its implementations.
//!
//! - [`sim`]: an in-process fabric in virtual time (hosts, switches, impaired links, ECMP
//!   paths, a switch hook), deterministic from a seed;
//! - [`pcap`]: a tee that records any port's traffic to a pcap file;
//! - AF_PACKET/TAP (issue 4) and DPDK (issue 5, cargo feature `dpdk`) come later.
//!
//! Drivers use `ferroce_stack::wire` and nothing else of the stack: they move Ethernet frames.
#![warn(missing_docs)]

pub mod afpacket;
#[cfg(feature = "dpdk")]
pub mod dpdk;
pub mod pcap;
pub mod pipe;
mod port;
pub mod sim;
pub mod tap;

pub use port::{LinkState, Port, PortCapabilities, TxError};
