//! ferroce's verbs API and poll-mode engine: libibverbs' objects (device context, protection
//! domain, memory region, completion queue and channel, queue pair, address handle) over the
//! sans-IO transport of `ferroce-stack` and the ports of `ferroce-drivers`.
//!
//! The engine ([`engine::Engine`]) is one device's poll loop: rx burst → parse → demux by QPN
//! → QP; timers from a wheel; transmit; flush; completions to CQs. It runs either on the
//! application's thread (run-to-completion: [`Context::progress`], and `poll` on a CQ turns it
//! once) or on an engine thread ([`Context::start_engine_thread`]); in both, posting and polling
//! go through lock-free queues. Deviations from libibverbs are listed in `docs/verbs.md`.

pub mod cm;
pub mod connect;
pub mod engine;
pub mod sdr;
pub mod service;
pub mod shift;
pub mod sim;
pub mod spec;
pub mod timer;

mod device;
mod error;
mod events;
mod slot;
mod stats;
mod threads;
mod verbs;

pub use engine::raw::{toeplitz, FlowRule, FlowSpec};
pub use engine::{Engine, PortCounters};
pub use events::AsyncEvent;
pub use ferroce_stack::transport::{
    Access, AddressVector, AttrMask, Counters, Delivery, Mtu, Payload, Policies, PostError, QpAttr,
    QpCaps, QpState, QpType, Recovery, RecvWr, SendFlags, SendWr, Sge, UdDest, WcFlags, WcOpcode,
    WcStatus, WorkCompletion, WrOpcode,
};
pub use verbs::{
    AddressHandle, CompletionChannel, CompletionQueue, Context, DeviceAttr, Flow, Gid,
    MemoryRegion, MemoryWindow, PortAttr, PortState, PostFailure, ProtectionDomain, QueuePair,
    RawQueuePair, SharedReceiveQueue, TagOp, VerbsError, GID_TABLE_LEN,
};
