//! ferroce's drivers: the [`Port`] trait every NIC queue implements, and its implementations.
//!
//! - [`sim`]: an in-process fabric in virtual time (hosts, switches, impaired links, ECMP
//!   paths, a switch hook), deterministic from a seed;
//! - [`pcap`]: a tee that records any port's traffic to a pcap file;
//! - [`control`]: smoltcp answering ARP, ICMP and TCP on a port no kernel serves;
//! - [`mapped`] and [`affinity`]: helpers for drivers on a NIC (memory mapped for DMA, engine
//!   threads pinned to cores);
//! - [`afpacket`] and [`tap`] on Linux interfaces, [`pipe`] between two processes, and
//!   `dpdk` (cargo feature `dpdk`) on DPDK's poll-mode drivers;
//! - [`wait`]: how an idle engine thread sleeps until a port has frames;
//! - [`shm`]: sealed shared-memory regions and the rings in them between the engine and
//!   the programs it serves (`ferroce serve`).
//!
//! Drivers move Ethernet frames; of the stack they use its wire formats, and the transport's
//! split frames for zero-copy transmit.
#![warn(missing_docs)]

pub mod affinity;
pub mod afpacket;
pub mod control;
#[cfg(feature = "dpdk")]
pub mod dpdk;
pub mod mapped;
pub mod pcap;
pub mod pipe;
mod port;
pub mod shm;
pub mod sim;
pub mod tap;
pub mod wait;

pub use port::{LinkState, MapError, Port, PortCapabilities, TxError};
