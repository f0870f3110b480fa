//! R2CCL (seed 003, issue 23), begun: the pieces of its failure handling that are not
//! collective-specific, sans-IO.
//!
//! - [`localize`]: bilateral probe triangulation — which component a failed connection's
//!   fault is in, from both ends' zero-byte WRITE probes to each other and to a third node.
//! - [`rollback`]: a chunked transfer's rewind after a failure — the sender to its first
//!   chunk without a completion, the receiver to the chunk after its last confirmed one.
//!
//! The out-of-band notification channel, the proximity order of backup NICs and the
//! collectives on top come next.

pub mod localize;
pub mod rollback;
