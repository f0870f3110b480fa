//! The sans-IO RDMA transport (issue 3). So far: the QP state machine's legal transitions and
//! the attributes each one requires and allows ([`state`]), registered memory with its checked
//! accessor ([`mr`]), and the spec's timer encodings ([`timers`]). Requester and responder
//! halves, reliability and completions build on them.

pub mod mr;
pub mod state;
pub mod timers;

pub use mr::{Access, AccessError, MrKeys, MrTable, PdId, RegisterError};
pub use state::{check_modify, AttrMask, ModifyError, QpState, QpType};
