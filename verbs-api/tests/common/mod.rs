//! What the verbs tests share: one end of a connection and how it is described to the other.
#![allow(dead_code, unreachable_pub)]

use ferroce_verbs::connect::Endpoint;
use ferroce_verbs::*;

/// One end: a context with a CQ, a QP and a memory region (the PD kept alive).
pub struct End {
    pub ctx: Context,
    pub cq: CompletionQueue,
    pub qp: QueuePair,
    pub mr: MemoryRegion,
    pub _pd: ProtectionDomain,
}

/// `e` as its peer connects to it, starting at `psn`.
pub fn endpoint(e: &End, psn: u32) -> Endpoint {
    Endpoint::of(&e.ctx, &e.qp, &e.mr, psn)
}
