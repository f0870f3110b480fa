//! The sans-IO RDMA transport: QPs that are fed packets and time and asked for frames,
//! timeouts and completions ([`qp`]), the work requests and completions they speak ([`wr`]),
//! the loss-recovery policy they consult ([`recovery`]), the state machine's rules
//! ([`state`]), registered memory with its checked accessor ([`mr`]), counters and the spec's
//! timer encodings.

pub mod counters;
pub mod loopback;
pub mod mr;
pub mod qp;
pub mod recovery;
pub(crate) mod sg;
pub mod state;
pub mod timers;
pub mod wr;

pub use counters::Counters;
pub use mr::{Access, AccessError, MrKeys, MrTable, PdId, RegisterError};
pub use qp::{AddressVector, Mtu, Qp, QpAttr, QpCaps, QpConfig};
pub use recovery::{GoBackN, OutOfOrder, Recovery, SendWindow};
pub use state::{check_modify, AttrMask, ModifyError, QpState, QpType};
pub use wr::{
    Payload, PostError, RecvWr, SendFlags, SendWr, Sge, UdDest, WcFlags, WcOpcode, WcStatus,
    WorkCompletion, WrOpcode,
};
