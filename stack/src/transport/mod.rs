//! The sans-IO RDMA transport: QPs that are fed packets and time and asked for frames,
//! timeouts and completions ([`qp`]), the work requests and completions they speak ([`wr`]),
//! the policies they consult (path choice in [`path`], loss recovery in [`recovery`],
//! congestion control in [`congestion`]), the state machine's rules
//! ([`state`]), registered memory with its checked accessor ([`mr`]), counters and the spec's
//! timer encodings.

/// `with` and `contains` for a bit-set newtype over `u32` (access rights, attribute masks,
/// send and completion flags), which all combine the same way.
macro_rules! flag_set {
    ($t:ident) => {
        impl $t {
            /// Both sets.
            pub const fn with(self, o: Self) -> Self {
                Self(self.0 | o.0)
            }

            /// True when every bit of `o` is in `self`.
            pub const fn contains(self, o: Self) -> bool {
                self.0 & o.0 == o.0
            }
        }
    };
}

pub mod av;
pub mod congestion;
pub mod counters;
pub mod endpoint;
#[cfg(any(test, feature = "test-support"))]
pub mod hostile;
#[cfg(any(test, feature = "test-support"))]
pub mod loopback;
pub mod mr;
pub use qp::notify;
pub mod path;
pub mod qp;
pub mod recovery;
pub(crate) mod sg;
pub mod sink;
pub mod srq;
pub mod state;
pub mod timers;
pub mod tm;
pub mod tx;
pub mod wr;

pub use congestion::{AckEvent, CongestionControl, FixedRate, Loss, NoControl};
pub use counters::Counters;
pub use endpoint::{Endpoint, Hosted, Received};
pub use mr::{
    Access, AccessError, MemSpan, MrKeys, MrTable, PdId, RegionShare, RegisterError, SlotTarget,
    Slotted, WindowBind, WindowError, ACCESS_MW_BIND,
};
pub use notify::NpConfig;
pub use path::{Ecmp, Path, PathSelector};
pub use qp::failover::LocalPort;
pub use qp::{
    bring_up, check_recv, check_send, AddressVector, ErrorCause, Mtu, PathControlStats, Policies,
    Qp, QpAttr, QpCaps, QpConfig, SendRecord,
};
pub use recovery::{
    Arrivals, Delivery, Feedback, GoBackN, LossReport, OutOfOrder, Recovery, Retransmit, SendWindow,
};
pub use sg::{scatter_from_start, SgError};
pub use sink::{Sunk, WriteImmSink};
pub use srq::{Srq, SrqModifyError};
pub use state::{check_modify, required_mask, AttrMask, ModifyError, QpState, QpType};
pub use tm::TmError;
pub use tx::{Transmit, TxOut};
pub use wr::{
    OwnedSendWr, Payload, PostError, RecvWr, SendFlags, SendWr, Sge, UdDest, WcFlags, WcOpcode,
    WcStatus, WorkCompletion, WrOpcode,
};
