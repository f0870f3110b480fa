//! Switch hooks the testbeds' experiments inject faults with.

use ferroce_stack::switch::{HookCtx, SwitchHook, Verdict};
use ferroce_stack::wire::MacAddr;

/// Drops every frame between two MACs, both ways, and forwards the rest: a fault on the
/// path between two hosts that their paths to anyone else avoid (R2CCL's `link`, which
/// only a third node's probes tell from either end's NIC).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PairCut(pub MacAddr, pub MacAddr);

impl SwitchHook for PairCut {
    fn on_frame(&mut self, _ctx: &HookCtx<'_>, frame: &mut Vec<u8>) -> Verdict {
        if frame.len() < 12 {
            return Verdict::Forward;
        }
        let (dst, src) = (&frame[0..6], &frame[6..12]);
        let (a, b) = (&self.0 .0[..], &self.1 .0[..]);
        if (dst == a && src == b) || (dst == b && src == a) {
            Verdict::Drop
        } else {
            Verdict::Forward
        }
    }
}

/// Drops the frames through a switch — all of them (`Cut(None)`: a rail that carries
/// nothing while its carrier stays up), or those from one MAC (`Cut(Some(mac))`: one
/// direction of a path, an end's ACKs and READ responses) — and forwards the rest. Set on a
/// ToR and cleared again, it cuts and heals a rail at any moment a test chooses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cut(pub Option<MacAddr>);

impl SwitchHook for Cut {
    fn on_frame(&mut self, _ctx: &HookCtx<'_>, frame: &mut Vec<u8>) -> Verdict {
        match self.0 {
            Some(mac) if frame.get(6..12) != Some(&mac.0[..]) => Verdict::Forward,
            _ => Verdict::Drop,
        }
    }
}
