//! The sans-IO RDMA transport (issue 3). So far: the QP state machine's legal transitions and
//! the attributes each one requires and allows ([`state`]). Requester and responder halves,
//! reliability and completions build on it.

pub mod state;

pub use state::{check_modify, AttrMask, ModifyError, QpState, QpType};
