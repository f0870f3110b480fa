//! A seam for a protocol above UC that takes WRITE-with-immediates packet by packet.
//!
//! SDR (issue 21) sends every packet as its own UC RDMA WRITE_ONLY_WITH_IMMEDIATE whose
//! immediate names the message and the packet. Through the ordinary responder each would
//! take a receive WQE and make a completion — and an empty receive queue would drop it
//! unseen, which looks like loss. A QP with a [`WriteImmSink`] hands such packets to the
//! sink instead, after the transport's own checks (header, opcode, QP state): the sink
//! decides whether and where the payload lands, places it through the [`MrTable`], and
//! records it in its own tables, which its owner polls. PSNs do not matter to it: every
//! packet is a whole message, so a gap loses nothing the next packet needs.

use core::fmt;

use super::mr::{MrTable, PdId};
use crate::wire::RethRepr;

/// What a sink did with one packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sunk {
    /// The payload was placed.
    Placed,
    /// The packet was refused or was not needed (a duplicate, a late packet, an offset past
    /// the message): nothing was written.
    Dropped,
}

/// Takes a UC QP's WRITE_ONLY_WITH_IMMEDIATE packets in place of the receive queue.
pub trait WriteImmSink: Send + fmt::Debug {
    /// One packet: its RETH, its immediate and its payload, on a QP of protection domain
    /// `pd`. The sink writes only through `mem`, with `pd`, so the table's checks hold.
    fn on_write_imm(
        &mut self,
        reth: RethRepr,
        imm: u32,
        payload: &[u8],
        pd: PdId,
        mem: &MrTable,
    ) -> Sunk;
}
