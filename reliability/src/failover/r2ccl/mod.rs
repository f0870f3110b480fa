//! R2CCL (seed 003, issue 23): its failure handling and its AllReduce decomposition,
//! sans-IO. The experiments that drive them over RC QPs on the testbed are the scenarios
//! crate's `allreduce` (the collective) and `failover` (its `r2ccl` scheme, a WR stream).
//!
//! - [`conn`]: the protocol of one failed connection, per end — the error, the
//!   out-of-band notice, both ends' probes, the results sent back, the sender's verdict,
//!   the move announced — behind a small IO trait.
//! - [`oob`]: bilateral failure awareness — the messages the two ends of a failed
//!   connection swap over the out-of-band (bootstrap TCP) connection.
//! - [`localize`]: probe triangulation — which component a failed connection's fault is
//!   in, from both ends' zero-byte WRITE probes to each other and to a third node.
//! - [`proximity`]: the backup NIC a connection moves to, by PCIe proximity.
//! - [`rollback`]: a chunked transfer's rewind after a failure — the sender to its first
//!   chunk without a completion, the receiver to the chunk after its last confirmed one.
//! - [`decompose`]: R2CCL-AllReduce — when and how to split an AllReduce into a global and
//!   a partial ring and a broadcast around a node that lost bandwidth.

pub mod conn;
pub mod decompose;
pub mod localize;
pub mod oob;
pub mod proximity;
pub mod rollback;
