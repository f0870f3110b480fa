//! Work requests and work completions, shaped like libibverbs' `ibv_send_wr`, `ibv_recv_wr`
//! and `ibv_wc` (same opcode, flag and status values), so the verbs layer and the libibverbs
//! shim translate one to one.

use core::fmt;

use crate::wire::{MacAddr, Qpn};

use super::av::AddressVector;

/// One scatter/gather element: `length` bytes at `addr` in the region of `lkey`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Sge {
    /// Start address (the region's iova space).
    pub addr: u64,
    /// Bytes.
    pub length: u32,
    /// Local key of the region.
    pub lkey: u32,
}

/// Send work request opcodes (`enum ibv_wr_opcode` values).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum WrOpcode {
    /// RDMA WRITE.
    Write = 0,
    /// RDMA WRITE with immediate: also consumes a receive at the peer.
    WriteWithImm = 1,
    /// SEND.
    Send = 2,
    /// SEND with immediate.
    SendWithImm = 3,
    /// RDMA READ.
    Read = 4,
    /// Atomic compare-and-swap.
    CmpSwp = 5,
    /// Atomic fetch-and-add.
    FetchAdd = 6,
    /// Local invalidate of a memory region or type 2 window key (`imm_data`): a local
    /// operation, carried out by the verbs engine in send queue order, never on the wire.
    LocalInv = 7,
    /// Bind of a memory window (see [`SendWr::bind_mw`]): local, as `LocalInv`.
    BindMw = 8,
    /// SEND with invalidate: the peer invalidates `invalidate_rkey`.
    SendWithInv = 9,
    /// RDMA ATOMIC WRITE (IBTA 1.5, RC): the 8-byte payload lands at `remote_addr` in one
    /// store.
    AtomicWrite = 15,
}

impl WrOpcode {
    /// True for the operations that read back from the responder (READ and atomics); they
    /// count against `max_rd_atomic`.
    pub const fn is_read_or_atomic(self) -> bool {
        matches!(self, Self::Read | Self::CmpSwp | Self::FetchAdd)
    }

    /// True for atomics.
    pub const fn is_atomic(self) -> bool {
        matches!(self, Self::CmpSwp | Self::FetchAdd)
    }

    /// True for the local operations (memory window bind, local invalidate), which the verbs
    /// engine carries out itself; a transport QP refuses them.
    pub const fn is_local(self) -> bool {
        matches!(self, Self::LocalInv | Self::BindMw)
    }

    /// True for operations that consume a receive WQE at the responder.
    pub const fn consumes_recv(self) -> bool {
        matches!(
            self,
            Self::Send | Self::SendWithImm | Self::SendWithInv | Self::WriteWithImm
        )
    }

    /// The completion opcode this request reports.
    pub const fn wc_opcode(self) -> WcOpcode {
        match self {
            Self::Write | Self::WriteWithImm => WcOpcode::RdmaWrite,
            Self::Send | Self::SendWithImm | Self::SendWithInv => WcOpcode::Send,
            Self::Read => WcOpcode::RdmaRead,
            Self::CmpSwp => WcOpcode::CompSwap,
            Self::FetchAdd => WcOpcode::FetchAdd,
            Self::LocalInv => WcOpcode::LocalInv,
            Self::BindMw => WcOpcode::BindMw,
            Self::AtomicWrite => WcOpcode::AtomicWrite,
        }
    }
}

/// Send flags (`IBV_SEND_*` bit values).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SendFlags(pub u32);

flag_set!(SendFlags);

impl SendFlags {
    /// Wait for earlier READs and atomics to complete before starting.
    pub const FENCE: Self = Self(1);
    /// Generate a completion on success.
    pub const SIGNALED: Self = Self(2);
    /// Set the solicited-event bit on the last packet.
    pub const SOLICITED: Self = Self(4);
    /// The payload is carried in the request (copied at post time).
    pub const INLINE: Self = Self(8);
    /// A request the QP made itself (a tag matching rendezvous READ or FIN): its completion
    /// is the QP's to handle, never the program's. Not a flag programs can set: `post_send`
    /// clears it.
    pub(crate) const INTERNAL: Self = Self(1 << 31);
    /// With `INTERNAL`: the READ of a matched rendezvous request's data.
    pub(crate) const TM_READ: Self = Self(1 << 30);
}

/// Where a UD send goes: the peer's address vector, QPN and Q_Key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UdDest {
    /// Addressing of the path to the peer.
    pub av: AddressVector,
    /// Destination QP.
    pub remote_qpn: Qpn,
    /// Q_Key to send; when its top bit is set the QP's own Q_Key is sent instead
    /// (IBTA §10.2.5 "controlled Q_Key").
    pub remote_qkey: u32,
}

/// A send WR copied out of the caller's structures, as a NIC reads a WQE at post time: for
/// whoever keeps a WR beyond the call that posts it (the verbs engine's inboxes, a failover
/// mode that may resubmit it).
#[derive(Clone, Debug)]
pub struct OwnedSendWr {
    wr_id: u64,
    opcode: WrOpcode,
    flags: SendFlags,
    sges: smallvec::SmallVec<[Sge; 2]>,
    inline: Option<smallvec::SmallVec<[u8; 64]>>,
    imm_data: u32,
    remote_addr: u64,
    rkey: u32,
    compare_add: u64,
    swap: u64,
    ud: Option<UdDest>,
}

impl OwnedSendWr {
    /// A copy of `wr`, gather list or inline bytes included.
    pub fn from_wr(wr: &SendWr<'_>) -> Self {
        let (sges, inline) = match wr.payload {
            Payload::Sges(s) => (smallvec::SmallVec::from_slice(s), None),
            Payload::Inline(b) => (
                smallvec::SmallVec::new(),
                Some(smallvec::SmallVec::from_slice(b)),
            ),
        };
        Self {
            wr_id: wr.wr_id,
            opcode: wr.opcode,
            flags: wr.flags,
            sges,
            inline,
            imm_data: wr.imm_data,
            remote_addr: wr.remote_addr,
            rkey: wr.rkey,
            compare_add: wr.compare_add,
            swap: wr.swap,
            ud: wr.ud,
        }
    }

    /// The WR again, borrowing this copy.
    pub fn as_wr(&self) -> SendWr<'_> {
        SendWr {
            wr_id: self.wr_id,
            opcode: self.opcode,
            flags: self.flags,
            payload: match &self.inline {
                Some(b) => Payload::Inline(b),
                None => Payload::Sges(&self.sges),
            },
            imm_data: self.imm_data,
            remote_addr: self.remote_addr,
            rkey: self.rkey,
            compare_add: self.compare_add,
            swap: self.swap,
            ud: self.ud,
        }
    }

    /// The UD destination.
    pub fn ud(&self) -> Option<UdDest> {
        self.ud
    }

    /// Sets the UD destination (a service sets the source to its port's).
    pub fn set_ud(&mut self, ud: UdDest) {
        self.ud = Some(ud);
    }

    /// The caller's id.
    pub fn wr_id(&self) -> u64 {
        self.wr_id
    }

    /// The operation.
    pub fn opcode(&self) -> WrOpcode {
        self.opcode
    }

    /// The flags.
    pub fn flags(&self) -> SendFlags {
        self.flags
    }

    /// Bytes the WR carries (gather list or inline).
    pub fn byte_len(&self) -> u64 {
        match &self.inline {
            Some(b) => b.len() as u64,
            None => self.sges.iter().map(|s| u64::from(s.length)).sum(),
        }
    }
}

/// The payload of a send: a gather list in registered memory, or inline bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Payload<'a> {
    /// Gather from these elements (each checked against its lkey at transmit time).
    Sges(&'a [Sge]),
    /// Copy these bytes into the request now; they need no registration (`IBV_SEND_INLINE`).
    Inline(&'a [u8]),
}

/// A send work request. Borrowed: `post_send` copies what it keeps, as a NIC reads the WQE
/// out of the ring at post time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendWr<'a> {
    /// Caller's id, returned in the completion.
    pub wr_id: u64,
    /// The operation.
    pub opcode: WrOpcode,
    /// Flags.
    pub flags: SendFlags,
    /// What to send (for READ and atomics: where the result lands).
    pub payload: Payload<'a>,
    /// Immediate data (WITH_IMM) or the rkey to invalidate (SEND_WITH_INV).
    pub imm_data: u32,
    /// Remote address (WRITE, READ, atomics).
    pub remote_addr: u64,
    /// Remote key (WRITE, READ, atomics).
    pub rkey: u32,
    /// CMP_SWP's compare value or FETCH_ADD's addend.
    pub compare_add: u64,
    /// CMP_SWP's swap value.
    pub swap: u64,
    /// UD destination.
    pub ud: Option<UdDest>,
}

impl<'a> SendWr<'a> {
    /// A signaled request with everything else zero.
    pub const fn new(wr_id: u64, opcode: WrOpcode, payload: Payload<'a>) -> Self {
        Self {
            wr_id,
            opcode,
            flags: SendFlags::SIGNALED,
            payload,
            imm_data: 0,
            remote_addr: 0,
            rkey: 0,
            compare_add: 0,
            swap: 0,
            ud: None,
        }
    }

    /// A memory window bind (`IBV_WR_BIND_MW`): window `b.mw_key` onto `b.len` bytes at
    /// `b.addr` of region `b.mr_key` with `b.access`, under the key `b.new_key` from then
    /// on. The bind travels in the request's own fields (the window's key in `imm_data`, its
    /// new key in `rkey`, the range in `remote_addr` and `compare_add`, the region's key and
    /// the rights in `swap`), so a bind moves through every queue a WR does.
    pub const fn bind_mw(wr_id: u64, b: &crate::transport::mr::WindowBind) -> Self {
        let mut wr = Self::new(wr_id, WrOpcode::BindMw, Payload::Sges(&[]));
        wr.imm_data = b.mw_key;
        wr.rkey = b.new_key;
        wr.remote_addr = b.addr;
        wr.compare_add = b.len;
        wr.swap = (b.mr_key as u64) << 32 | b.access.0 as u64;
        wr
    }

    /// The bind a `BindMw` request carries (see [`bind_mw`](Self::bind_mw)), for QP `qpn`.
    pub const fn window_bind(&self, qpn: u32) -> Option<crate::transport::mr::WindowBind> {
        if !matches!(self.opcode, WrOpcode::BindMw) {
            return None;
        }
        Some(crate::transport::mr::WindowBind {
            mw_key: self.imm_data,
            new_key: self.rkey,
            mr_key: (self.swap >> 32) as u32,
            addr: self.remote_addr,
            len: self.compare_add,
            access: crate::transport::mr::Access(self.swap as u32),
            qpn,
        })
    }

    /// Sets the remote address and key.
    pub const fn remote(mut self, addr: u64, rkey: u32) -> Self {
        self.remote_addr = addr;
        self.rkey = rkey;
        self
    }

    /// Sets the immediate (or the rkey to invalidate).
    pub const fn imm(mut self, imm: u32) -> Self {
        self.imm_data = imm;
        self
    }

    /// Sets the flags.
    pub const fn flags(mut self, flags: SendFlags) -> Self {
        self.flags = flags;
        self
    }
}

/// A receive work request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecvWr<'a> {
    /// Caller's id, returned in the completion.
    pub wr_id: u64,
    /// Where received data lands (needs LOCAL_WRITE).
    pub sg_list: &'a [Sge],
}

/// Completion status (`enum ibv_wc_status` values).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum WcStatus {
    /// Success.
    Success = 0,
    /// A message did not fit the receive buffer, or a UD send exceeded the MTU.
    LocLenErr = 1,
    /// Local QP operation error (malformed receive WQE).
    LocQpOpErr = 2,
    /// A local gather/scatter element failed its lkey, PD, rights or bounds check.
    LocProtErr = 4,
    /// Flushed because the QP is in the error state.
    WrFlushErr = 5,
    /// The responder refused the request as invalid (NAK invalid request).
    RemInvReqErr = 9,
    /// The responder refused the access (NAK remote access error).
    RemAccessErr = 10,
    /// The responder failed to complete the operation (NAK remote operational error).
    RemOpErr = 11,
    /// The transport retry counter ran out (no ACK within timeout, retry_cnt times).
    RetryExcErr = 12,
    /// The RNR retry counter ran out.
    RnrRetryExcErr = 13,
    /// An unexpected response (bad opcode sequence from the responder).
    BadRespErr = 7,
    /// A memory window bind or a local invalidate was refused (memory management
    /// operation error).
    MwBindErr = 6,
    /// A tag matching list operation failed: a tag added while the queue's unexpected
    /// count was stale, a tag removed that a message had consumed.
    TmErr = 22,
    /// A rendezvous request matched a tagged buffer too small for its data: the headers
    /// are in the buffer, the data was not read.
    TmRndvIncomplete = 23,
}

impl WcStatus {
    /// libibverbs' `ibv_wc_status_str` wording.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Success => "success",
            Self::LocLenErr => "local length error",
            Self::LocQpOpErr => "local QP operation error",
            Self::LocProtErr => "local protection error",
            Self::WrFlushErr => "Work Request Flushed Error",
            Self::BadRespErr => "bad response error",
            Self::MwBindErr => "memory management operation error",
            Self::RemInvReqErr => "remote invalid request error",
            Self::RemAccessErr => "remote access error",
            Self::RemOpErr => "remote operation error",
            Self::RetryExcErr => "transport retry counter exceeded",
            Self::RnrRetryExcErr => "RNR retry counter exceeded",
            Self::TmErr => "TM error",
            Self::TmRndvIncomplete => "TM software rendezvous",
        }
    }
}

impl fmt::Display for WcStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Completion opcodes (`enum ibv_wc_opcode` values).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum WcOpcode {
    /// A SEND finished.
    Send = 0,
    /// A WRITE finished.
    RdmaWrite = 1,
    /// A READ finished.
    RdmaRead = 2,
    /// A CMP_SWP finished.
    CompSwap = 3,
    /// A FETCH_ADD finished.
    FetchAdd = 4,
    /// A memory window bind finished.
    BindMw = 5,
    /// A local invalidate finished.
    LocalInv = 6,
    /// An RDMA ATOMIC WRITE finished.
    AtomicWrite = 9,
    /// A receive consumed by a SEND.
    Recv = 128,
    /// A receive consumed by a WRITE with immediate.
    RecvRdmaWithImm = 129,
    /// A tag was added to a tag matching SRQ's list.
    TmAdd = 130,
    /// A tag was removed from the list.
    TmDel = 131,
    /// The list's unexpected count was synchronized.
    TmSync = 132,
    /// A tag matching message: matched to a tagged buffer (`wc_flags` say how far), or
    /// unexpected (no flags; in an ordinary receive of the SRQ).
    TmRecv = 133,
    /// A message sent without a tag, in an ordinary receive of the SRQ.
    TmNoTag = 134,
}

impl WcOpcode {
    /// True for receive-queue completions.
    pub const fn is_recv(self) -> bool {
        self as u32 & 128 != 0
    }
}

/// Completion flags (`IBV_WC_*` bit values).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct WcFlags(pub u32);

flag_set!(WcFlags);

impl WcFlags {
    /// The first 40 bytes of the receive buffer hold the GRH (UD).
    pub const GRH: Self = Self(1);
    /// `imm_data` is valid.
    pub const WITH_IMM: Self = Self(2);
    /// `invalidated_rkey` is valid.
    pub const WITH_INV: Self = Self(8);
    /// The tag matching SRQ's unexpected count is behind: synchronize before adding tags.
    pub const TM_SYNC_REQ: Self = Self(16);
    /// A tagged buffer took the message ([`WorkCompletion::tag`] is its tag).
    pub const TM_MATCH: Self = Self(32);
    /// All of the matched message's data is in the tagged buffer.
    pub const TM_DATA_VALID: Self = Self(64);
}

/// A work completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkCompletion {
    /// The request's id.
    pub wr_id: u64,
    /// Outcome.
    pub status: WcStatus,
    /// What completed. For a flushed or failed WR it is still the WR's opcode.
    pub opcode: WcOpcode,
    /// The QP it belongs to.
    pub qp_num: Qpn,
    /// Bytes received (receives) or read (READ); 8 for atomics.
    pub byte_len: u32,
    /// Immediate data, or the invalidated rkey, per `wc_flags`.
    pub imm_data: u32,
    /// Flags.
    pub wc_flags: WcFlags,
    /// UD: the sender's QP.
    pub src_qp: Qpn,
    /// UD: the sender's MAC (as mlx5's `ibv_wc_read_smac`).
    pub smac: MacAddr,
    /// The solicited-event bit of the message's last packet.
    pub solicited: bool,
    /// A matched tag matching message: the tag its header carried (its `app_ctx` is in
    /// `imm_data`), as `ibv_wc_read_tm_info` reads them.
    pub tag: u64,
}

impl WorkCompletion {
    /// A completion of request `wr_id` with nothing but the request's facts set: for a layer
    /// above the QP that completes requests itself (a failover mode completing a request it
    /// knows ran, or failing one it will not resend).
    pub const fn of_request(wr_id: u64, status: WcStatus, opcode: WcOpcode, byte_len: u32) -> Self {
        let mut c = Self::new(wr_id, status, opcode, Qpn::new(0));
        c.byte_len = byte_len;
        c
    }

    pub(crate) const fn new(wr_id: u64, status: WcStatus, opcode: WcOpcode, qp_num: Qpn) -> Self {
        Self {
            wr_id,
            status,
            opcode,
            qp_num,
            byte_len: 0,
            imm_data: 0,
            wc_flags: WcFlags(0),
            src_qp: Qpn::new(0),
            smac: MacAddr([0; 6]),
            solicited: false,
            tag: 0,
        }
    }
}

/// Why `post_send` / `post_recv` refused a request (the WR is not queued and produces no
/// completion; libibverbs returns the errno and the bad WR).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PostError {
    /// The QP's state does not accept this queue's requests yet (RESET, INIT or RTR for sends).
    #[error("QP in state {0} does not accept this request")]
    InvalidState(super::QpState),
    /// The queue is full (ENOMEM).
    #[error("queue full ({0} outstanding)")]
    QueueFull(u32),
    /// More gather/scatter elements than the QP's capability.
    #[error("{got} scatter/gather elements, the QP allows {max}")]
    TooManySges {
        /// Elements given.
        got: usize,
        /// Capability.
        max: u32,
    },
    /// Inline data longer than `max_inline_data`.
    #[error("{got} bytes of inline data, the QP allows {max}")]
    InlineTooLong {
        /// Bytes given.
        got: usize,
        /// Capability.
        max: u32,
    },
    /// The opcode is not valid on this QP type (READ on UC, WRITE on UD, ...).
    #[error("{opcode:?} is not supported on a {qp_type:?} QP")]
    UnsupportedOpcode {
        /// The opcode.
        opcode: WrOpcode,
        /// The QP type.
        qp_type: super::QpType,
    },
    /// A UD send without a destination, or a connected send with one.
    #[error("UD sends need a destination, connected sends must not have one")]
    Destination,
    /// An atomic's local buffer is not exactly 8 bytes.
    #[error("atomic operations need an 8-byte local buffer")]
    AtomicLength,
    /// Receives go to the QP's shared receive queue, not the QP.
    #[error("the QP takes its receives from a shared receive queue; post there")]
    UsesSrq,
    /// A message longer than 2^31 bytes.
    #[error("message of {0} bytes exceeds 2^31")]
    MessageTooLong(u64),
    /// A gather element read at post time (a raw packet QP's frame) is not registered
    /// memory of the QP's PD.
    #[error("a gather element is not registered memory of the QP's protection domain")]
    LocalAccess,
    /// A raw frame shorter than an Ethernet header or longer than the port's largest.
    #[error("a {0}-byte frame does not fit the port")]
    FrameLength(usize),
}

/// A posted receive WR (as a QP or SRQ keeps it).
#[derive(Clone, Debug)]
pub(crate) struct RecvWqe {
    pub(crate) wr_id: u64,
    pub(crate) sges: smallvec::SmallVec<[Sge; 2]>,
}
