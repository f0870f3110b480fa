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

/// `e` with MACs that are not the port's: a frame to the port's own MAC never leaves it
/// (the engine loops it back, as a ConnectX port does), and the DPDK tests are about the
/// frames DPDK's rings carry. A net_ring hands them back to the port, whose engine takes
/// them by QP number.
pub fn through_the_port(mut e: Endpoint) -> Endpoint {
    e.mac = ferroce_stack::wire::MacAddr([0x02, 0, 0, 0, 0x77, 0x01]);
    if let Some((_, mac)) = e.alt.as_mut() {
        *mac = ferroce_stack::wire::MacAddr([0x02, 0, 0, 0, 0x77, 0x02]);
    }
    e
}
