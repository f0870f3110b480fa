//! The interface of in-network logic: what a switch shows a hook for each frame it forwards
//! and what the hook may decide. It lives here, beside the wire types it needs and below
//! both sides that meet at it, so a fabric (the simulated one in `ferroce-drivers`) calls
//! hooks without knowing any policy, and a policy (Themis' ToR in `ferroce-reliability`, ECN
//! marking, in-network failover) implements one without depending on a driver. Sans-IO like
//! the transport: time comes in [`HookCtx::now`], frames are byte buffers.

/// What a switch hook decided for a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Forward on the port ECMP chose.
    Forward,
    /// Forward on this switch port instead (any port, not only the equal-cost ones).
    ForwardVia(usize),
    /// Drop the frame.
    Drop,
}

/// What a hook sees besides the frame.
#[derive(Debug)]
pub struct HookCtx<'a> {
    /// Virtual time.
    pub now: u64,
    /// The switch's index in the fabric.
    pub switch: usize,
    /// The switch port the frame came in on.
    pub ingress: usize,
    /// The equal-cost egress ports toward the frame's destination (empty: no route).
    pub candidates: &'a [usize],
    /// The port ECMP picked among `candidates`.
    pub ecmp_choice: Option<usize>,
    /// Per switch port: true when a host is at the other end of its link (a ToR's downlinks).
    pub host_ports: &'a [bool],
}

/// In-network logic at a switch: inspect, rewrite, reroute or drop each frame it forwards
/// (Themis' ToR logic runs here). The frame is a `Vec` so a hook may change its length.
pub trait SwitchHook: Send {
    /// Called for every frame the switch receives, before it is forwarded.
    fn on_frame(&mut self, ctx: &HookCtx<'_>, frame: &mut Vec<u8>) -> Verdict;

    /// A frame the hook originates (a NACK it held back and now releases, say), asked for
    /// after every `on_frame` until it returns `None`. The switch forwards it by its
    /// destination MAC as ECMP would, without calling the hook on it again.
    fn poll_emit(&mut self) -> Option<Vec<u8>> {
        None
    }
}
