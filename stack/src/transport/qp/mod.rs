//! The queue pair as a sans-IO state machine.
//!
//! A [`Qp`] is driven only by calls: work requests in ([`post_send`](Qp::post_send),
//! [`post_recv`](Qp::post_recv)), packets in ([`handle_packet`](Qp::handle_packet)), frames out
//! ([`poll_transmit`](Qp::poll_transmit)), time in ([`poll_timeout`](Qp::poll_timeout),
//! [`handle_timeout`](Qp::handle_timeout)) and completions out
//! ([`poll_completion`](Qp::poll_completion)). It never reads a clock or touches a socket, so
//! the engine, the simulator and the benchmarks drive the same code. Registered memory is a
//! device-wide table passed into the calls that move data, since every QP of a device shares
//! it.
//!
//! A QP is three parts: the [`Requester`](requester::Requester) (send queue, PSNs, window,
//! retransmission, timers, READ responses; `requester/`, with out-of-order responses in
//! `requester/responses.rs`), the [`Responder`](responder::Responder) (receive queue,
//! expected PSN, execution, ACKs and replies; `responder/`, with out-of-order placement in
//! `responder/placement.rs`), and the [`QpContext`] both take in every handler: attributes,
//! header template, policies, completions and counters. Neither half sees the other; what
//! needs both (the state machine, entering ERR, which half transmits first) is here.
//! Native failover, which moves the whole QP between paths, is `failover.rs`: its data (the
//! paths, the alternate-port discovery) and its half of `impl Qp` (the alternate path, the
//! in-band exchange, port events and moves).

mod policies;
mod requester;
mod responder;
mod ring;
mod sends;

use std::collections::VecDeque;

use smallvec::SmallVec;

use super::counters::Counters;
pub(crate) mod failover;
pub mod notify;
use super::mr::{Access, MrTable, PdId};
use super::path::Path;
use super::recovery::{Delivery, Recovery};
use super::sink::WriteImmSink;
use super::state::{check_modify, required_mask, AttrMask, ModifyError, QpState, QpType};
use super::timers::local_ack_timeout_ns;
use super::tx::{Transmit, TxOut};
use super::wr::{
    Payload, PostError, RecvWr, SendFlags, SendWr, Sge, UdDest, WcFlags, WcOpcode, WcStatus,
    WorkCompletion, WrOpcode,
};
use crate::wire::{
    Checks, Malformed, Opcode, PathControl, PathControlKind, Psn, Qpn, RocePacket, RoceRepr,
};
use failover::{Discovery, LocalPort, Paths, PendingControl};

pub use super::av::AddressVector;
use super::av::Template;
pub(crate) use super::wr::RecvWqe;
pub use policies::Policies;
use policies::{CongestionSlot, PathSlot};
pub use requester::ACK_REQ_EVERY;
pub use sends::SendRecord;

/// Path MTU (`enum ibv_mtu` values 1..=5).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Mtu {
    /// 256 bytes.
    Mtu256 = 1,
    /// 512 bytes.
    Mtu512 = 2,
    /// 1024 bytes.
    #[default]
    Mtu1024 = 3,
    /// 2048 bytes.
    Mtu2048 = 4,
    /// 4096 bytes.
    Mtu4096 = 5,
}

impl Mtu {
    /// Payload bytes per packet.
    pub const fn bytes(self) -> u32 {
        128 << (self as u32)
    }

    /// The MTU for `bytes`, if it is one of the five.
    pub const fn from_bytes(bytes: u32) -> Option<Self> {
        Some(match bytes {
            256 => Self::Mtu256,
            512 => Self::Mtu512,
            1024 => Self::Mtu1024,
            2048 => Self::Mtu2048,
            4096 => Self::Mtu4096,
            _ => return None,
        })
    }

    /// The largest MTU whose packets fit an Ethernet MTU of `eth_mtu` bytes (IP and above),
    /// leaving room for IPv6, UDP, BTH, the largest extension headers and the ICRC.
    pub const fn for_ethernet_mtu(eth_mtu: usize) -> Self {
        const OVERHEAD: usize = 40 + 8 + 12 + 28 + 4;
        let mut m = Self::Mtu4096;
        loop {
            if m.bytes() as usize + OVERHEAD <= eth_mtu || matches!(m, Self::Mtu256) {
                return m;
            }
            m = match m {
                Self::Mtu4096 => Self::Mtu2048,
                Self::Mtu2048 => Self::Mtu1024,
                Self::Mtu1024 => Self::Mtu512,
                _ => Self::Mtu256,
            };
        }
    }
}

/// Queue capacities, as `ibv_qp_cap`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpCaps {
    /// Outstanding send WRs.
    pub max_send_wr: u32,
    /// Outstanding receive WRs.
    pub max_recv_wr: u32,
    /// Gather elements per send WR.
    pub max_send_sge: u32,
    /// Scatter elements per receive WR.
    pub max_recv_sge: u32,
    /// Inline bytes per send WR.
    pub max_inline_data: u32,
    /// Every send WR generates a completion, signaled or not (`sq_sig_all`).
    pub sq_sig_all: bool,
}

impl Default for QpCaps {
    fn default() -> Self {
        Self {
            max_send_wr: 1024,
            max_recv_wr: 1024,
            max_send_sge: 16,
            max_recv_sge: 16,
            max_inline_data: 256,
            sq_sig_all: false,
        }
    }
}

/// QP attributes, as `ibv_qp_attr`: the values `modify` applies for the bits of its mask, and
/// what `query` reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpAttr {
    /// Target state (`STATE`).
    pub qp_state: QpState,
    /// Remote access the responder allows (`ACCESS_FLAGS`).
    pub qp_access_flags: Access,
    /// Partition key index (`PKEY_INDEX`); ferroce has one partition, the default key.
    pub pkey_index: u16,
    /// Port (`PORT`).
    pub port_num: u8,
    /// Q_Key (`QKEY`, UD).
    pub qkey: u32,
    /// The path (`AV`).
    pub ah_attr: AddressVector,
    /// Path MTU (`PATH_MTU`).
    pub path_mtu: Mtu,
    /// Local ACK timeout exponent (`TIMEOUT`): 4.096 µs · 2^timeout, 0 = infinite.
    pub timeout: u8,
    /// Transport retries (`RETRY_CNT`), 0..=7.
    pub retry_cnt: u8,
    /// RNR retries (`RNR_RETRY`), 7 = infinite.
    pub rnr_retry: u8,
    /// First expected receive PSN (`RQ_PSN`).
    pub rq_psn: Psn,
    /// READ/atomic requests this QP may have outstanding (`MAX_QP_RD_ATOMIC`).
    pub max_rd_atomic: u8,
    /// RNR NAK timer code this responder sends (`MIN_RNR_TIMER`).
    pub min_rnr_timer: u8,
    /// First send PSN (`SQ_PSN`).
    pub sq_psn: Psn,
    /// READ/atomic requests this QP accepts as responder (`MAX_DEST_RD_ATOMIC`).
    pub max_dest_rd_atomic: u8,
    /// Peer QP (`DEST_QPN`).
    pub dest_qp_num: Qpn,
}

impl Default for QpAttr {
    fn default() -> Self {
        Self {
            qp_state: QpState::Reset,
            qp_access_flags: Access::NONE,
            pkey_index: 0,
            port_num: 1,
            qkey: 0,
            ah_attr: AddressVector::default(),
            path_mtu: Mtu::Mtu1024,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            rq_psn: Psn::new(0),
            max_rd_atomic: 16,
            min_rnr_timer: 12,
            sq_psn: Psn::new(0),
            max_dest_rd_atomic: 16,
            dest_qp_num: Qpn::new(0),
        }
    }
}

/// Walks a QP of type `t` from RESET through INIT and RTR to RTS with `modify`, giving each
/// step `attr` with that step's state and the attribute mask IBTA table 91 requires for it.
/// The one bring-up every connection takes: a sans-IO [`Qp`] ([`Qp::bring_up`]), a verbs
/// queue pair, the testbed's hosts.
pub fn bring_up<E>(
    t: QpType,
    attr: &QpAttr,
    mut modify: impl FnMut(&QpAttr, AttrMask) -> Result<(), E>,
) -> Result<(), E> {
    for (from, to) in [
        (QpState::Reset, QpState::Init),
        (QpState::Init, QpState::Rtr),
        (QpState::Rtr, QpState::Rts),
    ] {
        let mask = required_mask(t, from, to).expect("RESET to RTS is legal for every type");
        modify(
            &QpAttr {
                qp_state: to,
                ..*attr
            },
            mask,
        )?;
    }
    Ok(())
}

/// What a QP is created with.
#[derive(Debug)]
pub struct QpConfig {
    /// Its number.
    pub qpn: Qpn,
    /// RC, UC or UD.
    pub qp_type: QpType,
    /// Protection domain: every local and remote access is checked against it.
    pub pd: PdId,
    /// Queue capacities.
    pub caps: QpCaps,
    /// Its policies: path choice, loss recovery, congestion control.
    pub policies: Policies,
    /// Take receives from this shared receive queue instead of the QP's own.
    pub srq: Option<super::srq::Srq>,
}

impl QpConfig {
    /// A QP with default capabilities and Go-Back-N.
    pub fn new(qpn: Qpn, qp_type: QpType, pd: PdId) -> Self {
        Self {
            qpn,
            qp_type,
            pd,
            caps: QpCaps::default(),
            policies: Policies::default(),
            srq: None,
        }
    }
}

/// The data of a send WQE: a gather list, or bytes copied at post time.
#[derive(Clone, Debug)]
pub(crate) enum WqeData {
    Sges(SmallVec<[Sge; 2]>),
    Inline(SmallVec<[u8; 64]>),
}

/// A posted send WR as the QP keeps it.
#[derive(Clone, Debug)]
pub(crate) struct SendWqe {
    pub(crate) wr_id: u64,
    pub(crate) op: WrOpcode,
    pub(crate) flags: SendFlags,
    pub(crate) imm: u32,
    pub(crate) remote_addr: u64,
    pub(crate) rkey: u32,
    pub(crate) compare_add: u64,
    pub(crate) swap: u64,
    pub(crate) data: WqeData,
    pub(crate) len: u32,
    pub(crate) ud: Option<Box<UdDest>>,
    /// PSN of its first packet; valid once the requester assigned it.
    pub(crate) first_psn: Psn,
    /// PSNs it spans (READ: response packets; atomics: one).
    pub(crate) npkts: u32,
}

impl SendWqe {
    pub(crate) fn last_psn(&self) -> Psn {
        self.first_psn.add(self.npkts - 1)
    }

    pub(crate) fn contains(&self, psn: Psn) -> bool {
        let d = psn.distance(self.first_psn);
        d >= 0 && (d as u32) < self.npkts
    }
}

/// What a QP's two halves share, and the context each half's handlers take: the
/// connection's attributes and header template, its policies, the completion queue and
/// the counters. A half that fails the QP changes the state here at once and leaves in
/// `pending` what the QP flushes when the handler returns ([`Flush`]).
pub(crate) struct QpContext {
    pub(crate) qpn: Qpn,
    pub(crate) qp_type: QpType,
    pub(crate) pd: PdId,
    pub(crate) caps: QpCaps,
    pub(crate) state: QpState,
    pub(crate) attr: QpAttr,
    /// Header template of every packet to the peer (connected QPs, from RTR on).
    pub(crate) template: Template,
    pub(crate) path: PathSlot,
    pub(crate) recovery: Box<dyn Recovery>,
    pub(crate) congestion: CongestionSlot,
    pub(crate) completions: VecDeque<WorkCompletion>,
    pub(crate) counters: Counters,
    /// What of the QP a half's failure left for the QP to flush when the handler returns.
    pub(crate) pending: Flush,
    /// Why the responder failed the QP, until the engine takes it ([`Qp::take_error_cause`]).
    pub(crate) error_cause: Option<ErrorCause>,
    /// What few QPs use, boxed so an idle QP pays one pointer: the alternate path (native
    /// failover) and the WRITE-with-immediate sink (SDR).
    pub(crate) ext: Option<Box<Extensions>>,
}

/// A QP's rarely used parts (see `QpContext::ext`).
#[derive(Debug, Default)]
pub(crate) struct Extensions {
    /// The alternate path and which path is active.
    pub(crate) paths: Option<Paths>,
    /// UC only: takes WRITE_ONLY_WITH_IMMEDIATEs in place of the receive queue.
    pub(crate) sink: Option<Box<dyn WriteImmSink>>,
    /// The device's other port this QP announces to a ferroce peer, and what it heard.
    pub(crate) discovery: Option<Discovery>,
    /// A path control message to send.
    pub(crate) control_out: PendingControl,
    /// Path control messages sent and received, and depths lowered (the peer's replay
    /// cache too small for this QP's atomics).
    pub(crate) control: PathControlStats,
    /// DCQCN's notification point, once set or once a CE-marked packet came.
    pub(crate) np: Option<notify::Np>,
    /// Tag matching rendezvous: reads to start, the FIN headers of the reads under way (in
    /// posting order, which is completion order), FINs to send.
    pub(crate) tm_reads: VecDeque<(RecvWqe, super::tm::Rendezvous)>,
    pub(crate) tm_inflight: VecDeque<[u8; super::tm::TMH_LEN + super::tm::RVH_LEN]>,
    pub(crate) tm_fins: VecDeque<[u8; super::tm::TMH_LEN + super::tm::RVH_LEN]>,
    /// Requests of the QP's own in the send queue (not the program's to count).
    pub(crate) tm_queued: usize,
    /// What the SRQ's tag matching made of the message the responder is taking (`None`:
    /// no message, or an untagged one): here rather than in the responder, which every QP
    /// carries, because only a QP on a tag matching SRQ ever has one.
    pub(crate) tm_taken: Option<super::tm::Taken>,
}

crate::counter_set! {
    /// What a QP's path control exchange did (see [`Qp::path_control_stats`]), under the
    /// names `ferroce stats` exports them with.
    pub struct PathControlStats {
        /// Messages sent (announces, replies, moves).
        sent => "path_control_sent",
        /// Messages received.
        received => "path_control_received",
        /// Announces after which this QP's `max_rd_atomic` was lowered to the peer's
        /// `max_dest_rd_atomic`: the peer keeps fewer atomic results for replay than this QP
        /// would keep atomics outstanding, and a resend after a move could run one twice.
        clamped => "path_rd_atomic_clamped",
        /// Moves the peer announced that this QP followed.
        followed => "path_moves_followed",
        /// Probes of the primary path sent while on the alternate (each answered one moves the
        /// QP home).
        probes => "path_probes",
        /// Probes of the peer's answered.
        probes_answered => "path_probes_answered",
    }
}

/// What the QP still flushes after a half failed it. A failure the requester raises flushes
/// the send queue at once (the requester owns it; the failed WQE completes with its status
/// in queue order) and leaves the receive queue; one the responder raises leaves both, send
/// queue first. One byte, so an idle QP carries it in what was padding.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Flush {
    /// Nothing pending.
    #[default]
    None,
    /// The receive queue (the send queue is flushed already).
    Receives,
    /// Both queues, send queue first.
    All,
}

/// Why a QP's responder put it in the error state: what an RNIC reports as an affiliated
/// asynchronous error (IBTA Vol 1 §11.6.3.1), since no work completion of the requester's
/// says so.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorCause {
    /// A request the responder could not take: an unsupported or malformed one, a length or
    /// opcode sequence error ("Invalid Request Local Work Queue Error",
    /// `IBV_EVENT_QP_REQ_ERR`).
    InvalidRequest,
    /// A request for memory it had no right to ("Local Access Violation Work Queue Error",
    /// `IBV_EVENT_QP_ACCESS_ERR`).
    AccessViolation,
    /// Anything else ("Local Work Queue Catastrophic Error", `IBV_EVENT_QP_FATAL`).
    Catastrophic,
}

/// One queue pair: the shared context, the requester half and the responder half.
pub struct Qp {
    pub(crate) cx: QpContext,
    pub(crate) req: requester::Requester,
    pub(crate) resp: responder::Responder,
}

impl core::fmt::Debug for Qp {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Qp")
            .field("qpn", &self.cx.qpn)
            .field("type", &self.cx.qp_type)
            .field("state", &self.cx.state)
            .field("path", &self.cx.path.name())
            .field("recovery", &self.cx.recovery.name())
            .field("congestion", &self.cx.congestion.name())
            .finish_non_exhaustive()
    }
}

/// Creation and the state machine: attributes, transitions, entering ERR.
impl Qp {
    /// A QP in RESET.
    pub fn new(config: QpConfig) -> Self {
        let attr = QpAttr::default();
        let (path, recovery, congestion) = policies::install(config.policies);
        Self {
            cx: QpContext {
                qpn: config.qpn,
                qp_type: config.qp_type,
                pd: config.pd,
                caps: config.caps,
                state: QpState::Reset,
                attr,
                template: attr.ah_attr.template(Qpn::new(0), 0),
                path,
                recovery,
                congestion,
                completions: VecDeque::new(),
                counters: Counters::default(),
                pending: Flush::None,
                error_cause: None,
                ext: None,
            },
            req: requester::Requester::new(Psn::new(0)),
            resp: responder::Responder::new(Psn::new(0), config.srq.clone()),
        }
    }

    /// Its number.
    pub fn qpn(&self) -> Qpn {
        self.cx.qpn
    }

    /// Its type.
    pub fn qp_type(&self) -> QpType {
        self.cx.qp_type
    }

    /// Its protection domain.
    pub fn pd(&self) -> PdId {
        self.cx.pd
    }

    /// Its current state.
    pub fn state(&self) -> QpState {
        self.cx.state
    }

    /// Current attributes (`ibv_query_qp`), with `sq_psn` / `rq_psn` reporting the next PSN
    /// to send and the next expected.
    pub fn query(&self) -> QpAttr {
        let mut a = self.cx.attr;
        a.qp_state = self.cx.state;
        a.sq_psn = self.req.nxt;
        a.rq_psn = self.resp.epsn;
        a
    }

    /// Changes state and attributes as `ibv_modify_qp`: `mask` names which fields of `attr`
    /// apply. Legal transitions and required attributes follow IBTA table 91 (see
    /// [`check_modify`]).
    pub fn modify(&mut self, attr: &QpAttr, mask: AttrMask) -> Result<(), ModifyError> {
        let to = if mask.contains(AttrMask::STATE) {
            attr.qp_state
        } else {
            self.cx.state
        };
        check_modify(self.cx.qp_type, self.cx.state, to, mask)?;
        // An alternate path given in RTR was taken on the peer's replay depth; the atomics
        // this QP may keep outstanding, set now, must fit it (see `set_alternate_path`).
        // One the peer announced in band is kept and the depth lowered instead, as at RTS.
        let mut clamp_to = None;
        if to == QpState::Rts && self.cx.state == QpState::Rtr && self.cx.qp_type == QpType::Rc {
            let ours = if mask.contains(AttrMask::MAX_QP_RD_ATOMIC) {
                attr.max_rd_atomic
            } else {
                self.cx.attr.max_rd_atomic
            };
            if let Some(p) = self
                .cx
                .paths()
                .filter(|p| ours.max(1) > p.peer_depth.max(1))
            {
                if !p.in_band {
                    return Err(ModifyError::ReplayTooShallow {
                        max_rd_atomic: ours,
                        peer_max_dest_rd_atomic: p.peer_depth,
                    });
                }
                clamp_to = Some(p.peer_depth.max(1));
            }
        }
        self.apply(attr, mask);
        if let Some(d) = clamp_to {
            self.cx.attr.max_rd_atomic = d;
            if let Some(e) = self.cx.ext.as_mut() {
                e.control.clamped += 1;
            }
        }
        let from = self.cx.state;
        match to {
            QpState::Reset => self.reset(),
            QpState::Err if from != QpState::Err => self.enter_error(),
            QpState::Rtr if from == QpState::Init => {
                // Receives posted in INIT stay queued.
                self.resp.epsn = self.cx.attr.rq_psn;
                let capacity = self.cx.recovery.window().min(1 << 16);
                self.resp.ooo = self
                    .cx
                    .placing()
                    .map(|feedback| Box::new(responder::Ooo::new(feedback, capacity)));
                self.connect_path();
            }
            QpState::Rts if from == QpState::Rtr => {
                self.req = requester::Requester::new(self.cx.attr.sq_psn);
                if self.cx.placing().is_some() {
                    self.req.sacks = Some(Box::new(requester::Sacks::new(
                        self.cx.recovery.window().min(1 << 16),
                        self.cx.attr.sq_psn,
                    )));
                    self.req.responses = Some(Box::new(requester::Responses::new(
                        self.cx.recovery.window(),
                        self.cx.attr.sq_psn,
                    )));
                }
                self.req.retries_left = self.cx.attr.retry_cnt;
                self.req.rnr_retries_left = self.cx.attr.rnr_retry;
                if let Some(e) = self.cx.ext.as_mut() {
                    if e.discovery.is_some_and(|d| !d.heard) {
                        e.control_out = Some(PathControlKind::Announce);
                    }
                }
            }
            _ => {}
        }
        self.cx.state = to;
        self.cx
            .span()
            .in_scope(|| tracing::debug!(%from, %to, "modify_qp"));
        Ok(())
    }

    /// From RESET to RTS with `attr` (see [`bring_up`]).
    pub fn bring_up(&mut self, attr: &QpAttr) -> Result<(), ModifyError> {
        bring_up(self.cx.qp_type, attr, |a, m| self.modify(a, m))
    }

    fn apply(&mut self, a: &QpAttr, mask: AttrMask) {
        let m = |bit| mask.contains(bit);
        if m(AttrMask::ACCESS_FLAGS) {
            self.cx.attr.qp_access_flags = a.qp_access_flags;
        }
        if m(AttrMask::PKEY_INDEX) {
            self.cx.attr.pkey_index = a.pkey_index;
        }
        if m(AttrMask::PORT) {
            self.cx.attr.port_num = a.port_num;
        }
        if m(AttrMask::QKEY) {
            self.cx.attr.qkey = a.qkey;
        }
        if m(AttrMask::AV) {
            self.cx.attr.ah_attr = a.ah_attr;
        }
        if m(AttrMask::PATH_MTU) {
            self.cx.attr.path_mtu = a.path_mtu;
        }
        if m(AttrMask::TIMEOUT) {
            self.cx.attr.timeout = a.timeout;
        }
        if m(AttrMask::RETRY_CNT) {
            self.cx.attr.retry_cnt = a.retry_cnt.min(7);
        }
        if m(AttrMask::RNR_RETRY) {
            self.cx.attr.rnr_retry = a.rnr_retry.min(7);
        }
        if m(AttrMask::RQ_PSN) {
            self.cx.attr.rq_psn = a.rq_psn;
        }
        if m(AttrMask::MAX_QP_RD_ATOMIC) {
            self.cx.attr.max_rd_atomic = a.max_rd_atomic;
        }
        if m(AttrMask::MIN_RNR_TIMER) {
            self.cx.attr.min_rnr_timer = a.min_rnr_timer & 0x1f;
        }
        if m(AttrMask::SQ_PSN) {
            self.cx.attr.sq_psn = a.sq_psn;
        }
        if m(AttrMask::MAX_DEST_RD_ATOMIC) {
            self.cx.attr.max_dest_rd_atomic = a.max_dest_rd_atomic;
        }
        if m(AttrMask::DEST_QPN) {
            self.cx.attr.dest_qp_num = a.dest_qp_num;
        }
        if m(AttrMask::AV) || m(AttrMask::DEST_QPN) {
            self.connect_path();
        }
    }

    /// Rebuilds the header template from the address vector and destination QPN.
    fn connect_path(&mut self) {
        let av = self.cx.attr.ah_attr;
        let udp_src_port = av.udp_src_port.unwrap_or_else(|| {
            // ConnectX derives the RoCEv2 source port from the QP numbers; any stable hash in
            // the dynamic range does, as long as distinct QPs tend to differ.
            let h = (self.cx.qpn.value() ^ self.cx.attr.dest_qp_num.value().rotate_left(7))
                .wrapping_mul(0x9e37_79b1);
            0xc000 | ((h >> 18) as u16 & 0x3fff)
        });
        self.cx.template = av.template(self.cx.attr.dest_qp_num, udp_src_port);
    }

    /// Back to RESET: queues emptied without completions, as the spec says.
    fn reset(&mut self) {
        self.req = requester::Requester::new(Psn::new(0));
        let srq = self.resp.srq.clone();
        self.resp = responder::Responder::new(Psn::new(0), srq);
        // The sink stays (the owner set it); the alternate path goes, as every path does.
        if let Some(e) = self.cx.ext.as_mut() {
            e.paths = None;
            e.control_out = None;
            e.tm_reads.clear();
            e.tm_inflight.clear();
            e.tm_fins.clear();
            e.tm_queued = 0;
            if let Some(d) = e.discovery.as_mut() {
                *d = Discovery::new(d.local);
            }
        }
        self.cx.completions.clear();
    }

    /// Why the responder put the QP in the error state, once: `None` when it did not (a
    /// requester's error completes its WR with the reason; a `modify` to ERR has none).
    pub fn take_error_cause(&mut self) -> Option<ErrorCause> {
        self.cx.error_cause.take()
    }

    /// Moves to ERR now (`modify` to ERR): every outstanding WR is flushed, send queue
    /// first.
    fn enter_error(&mut self) {
        self.cx.enter_error();
        self.apply_failure();
    }

    /// Applies the failure a half raised, if one did (see [`flush_failure`](Self::flush_failure));
    /// a load and a branch on every handler's return, so it is kept apart from the flush.
    #[inline(always)]
    fn apply_failure(&mut self) {
        if self.cx.pending != Flush::None {
            self.flush_failure();
        }
    }

    /// Flushes what a failure left: the send queue unless the requester did already, then
    /// the receive queue.
    #[cold]
    #[inline(never)]
    fn flush_failure(&mut self) {
        if self.cx.pending == Flush::All {
            self.req.fail(&mut self.cx, None);
        }
        self.resp.flush(&mut self.cx);
        self.cx.pending = Flush::None;
    }
}

/// The policies a QP composes and the hooks above it: recovery, path, congestion, the path
/// MTU, SDR's WRITE-with-immediate sink.
impl Qp {
    /// Replaces all three policies, before RTR (see [`set_recovery`](Self::set_recovery)).
    pub fn set_policies(&mut self, p: Policies) {
        (self.cx.path, self.cx.recovery, self.cx.congestion) = policies::install(p);
    }

    /// Replaces the loss recovery policy, before RTR: both ends must agree on its
    /// [`Delivery`], which they negotiate at connection setup.
    pub fn set_recovery(&mut self, recovery: Box<dyn Recovery>) {
        self.cx.recovery = recovery;
    }

    /// The port's active MTU, which bounds UD datagrams (connected QPs take `path_mtu`).
    pub fn set_port_mtu(&mut self, mtu: Mtu) {
        if self.cx.qp_type == QpType::Ud {
            self.cx.attr.path_mtu = mtu;
        }
    }

    /// Gives a UC QP's WRITE_ONLY_WITH_IMMEDIATE packets to `sink` instead of the receive
    /// queue (see [`sink`](crate::transport::sink)); `None` takes it back. Returns the sink
    /// it replaced. Refused for RC and UD QPs, which keep their receive queue.
    pub fn set_write_imm_sink(
        &mut self,
        sink: Option<Box<dyn WriteImmSink>>,
    ) -> Result<Option<Box<dyn WriteImmSink>>, ModifyError> {
        if self.cx.qp_type != QpType::Uc {
            return Err(ModifyError::NotUc(self.cx.qp_type));
        }
        let ext = self.cx.ext.get_or_insert_with(Box::default);
        Ok(core::mem::replace(&mut ext.sink, sink))
    }

    /// The sink a UC QP hands its WRITE-with-immediates to, if any.
    pub fn write_imm_sink(&mut self) -> Option<&mut (dyn WriteImmSink + 'static)> {
        self.cx.ext.as_mut()?.sink.as_deref_mut()
    }

    /// The recovery policy's name.
    pub fn recovery_name(&self) -> &'static str {
        self.cx.recovery.name()
    }

    /// The names of its path, recovery and congestion-control policies.
    pub fn policy_names(&self) -> [&'static str; 3] {
        [
            self.cx.path.name(),
            self.cx.recovery.name(),
            self.cx.congestion.name(),
        ]
    }

    /// How its recovery policy delivers: in PSN order (Go-Back-N, the IBTA default) or by
    /// placement, where a WRITE's packets may land in any order.
    pub fn delivery(&self) -> crate::transport::Delivery {
        self.cx.recovery.delivery()
    }
}

/// What `ibv_post_send` refuses of `wr` on a QP of type `t` in `state` with `caps`, before
/// it looks at how full the queue is; the message's length when it is accepted. One home
/// for the rules: a QP here and a program posting to a QP in another process (through
/// `ferroce serve`, which must refuse at post time what the QP would) both ask it.
pub fn check_send(
    state: QpState,
    t: QpType,
    caps: &QpCaps,
    wr: &SendWr<'_>,
) -> Result<u64, PostError> {
    match state {
        QpState::Rts | QpState::Sqd | QpState::Sqe | QpState::Err => {}
        s => return Err(PostError::InvalidState(s)),
    }
    let supported = !wr.opcode.is_local()
        && match t {
            QpType::Rc => true,
            QpType::Uc => {
                !wr.opcode.is_read_or_atomic()
                    && !matches!(wr.opcode, WrOpcode::SendWithInv | WrOpcode::AtomicWrite)
            }
            QpType::Ud => matches!(wr.opcode, WrOpcode::Send | WrOpcode::SendWithImm),
        };
    if !supported {
        return Err(PostError::UnsupportedOpcode {
            opcode: wr.opcode,
            qp_type: t,
        });
    }
    if (t == QpType::Ud) != wr.ud.is_some() {
        return Err(PostError::Destination);
    }
    let len = match wr.payload {
        Payload::Inline(bytes) => {
            // An ATOMIC WRITE's 8 bytes travel in the request whatever the inline size.
            let fits =
                bytes.len() <= caps.max_inline_data as usize || wr.opcode == WrOpcode::AtomicWrite;
            if !fits || wr.opcode.is_read_or_atomic() {
                return Err(PostError::InlineTooLong {
                    got: bytes.len(),
                    max: caps.max_inline_data,
                });
            }
            bytes.len() as u64
        }
        Payload::Sges(sges) => {
            if sges.len() > caps.max_send_sge as usize {
                return Err(PostError::TooManySges {
                    got: sges.len(),
                    max: caps.max_send_sge,
                });
            }
            super::sg::total_len(sges)
        }
    };
    if (wr.opcode.is_atomic() || wr.opcode == WrOpcode::AtomicWrite) && len != 8 {
        return Err(PostError::AtomicLength);
    }
    if len > 1 << 31 {
        return Err(PostError::MessageTooLong(len));
    }
    Ok(len)
}

/// What `ibv_post_recv` refuses of `wr` on a QP in `state` with `caps` (taking receives
/// from a shared receive queue when `srq`), before it looks at how full the queue is; see
/// [`check_send`].
pub fn check_recv(
    state: QpState,
    caps: &QpCaps,
    srq: bool,
    wr: &RecvWr<'_>,
) -> Result<(), PostError> {
    if state == QpState::Reset {
        return Err(PostError::InvalidState(state));
    }
    if srq {
        return Err(PostError::UsesSrq);
    }
    if wr.sg_list.len() > caps.max_recv_sge as usize {
        return Err(PostError::TooManySges {
            got: wr.sg_list.len(),
            max: caps.max_recv_sge,
        });
    }
    Ok(())
}

/// Work requests in, completions out.
impl Qp {
    /// Posts a send WR (`ibv_post_send` for one WR; the verbs layer walks chains).
    pub fn post_send(&mut self, wr: &SendWr<'_>) -> Result<(), PostError> {
        let len = check_send(self.cx.state, self.cx.qp_type, &self.cx.caps, wr)?;
        if self.send_queue_len() >= self.cx.caps.max_send_wr as usize {
            return Err(PostError::QueueFull(self.cx.caps.max_send_wr));
        }
        let data = match wr.payload {
            Payload::Inline(bytes) => WqeData::Inline(SmallVec::from_slice(bytes)),
            Payload::Sges(sges) => WqeData::Sges(SmallVec::from_slice(sges)),
        };
        let wqe = SendWqe {
            wr_id: wr.wr_id,
            op: wr.opcode,
            flags: SendFlags(wr.flags.0 & !(SendFlags::INTERNAL.0 | SendFlags::TM_READ.0)),
            imm: wr.imm_data,
            remote_addr: wr.remote_addr,
            rkey: wr.rkey,
            compare_add: wr.compare_add,
            swap: wr.swap,
            data,
            len: len as u32,
            ud: wr.ud.map(Box::new),
            first_psn: Psn::new(0),
            npkts: 0,
        };
        if matches!(self.cx.state, QpState::Err | QpState::Sqe) {
            // As on mlx5: accepted, and flushed at once.
            self.cx.push_send_completion(&wqe, WcStatus::WrFlushErr, 0);
            return Ok(());
        }
        self.req.sq.push_back(wqe);
        Ok(())
    }

    /// Posts a receive WR.
    pub fn post_recv(&mut self, wr: &RecvWr<'_>) -> Result<(), PostError> {
        check_recv(self.cx.state, &self.cx.caps, self.resp.srq.is_some(), wr)?;
        if self.resp.rq.len() >= self.cx.caps.max_recv_wr as usize {
            return Err(PostError::QueueFull(self.cx.caps.max_recv_wr));
        }
        let wqe = RecvWqe {
            wr_id: wr.wr_id,
            sges: SmallVec::from_slice(wr.sg_list),
        };
        if self.cx.state == QpState::Err {
            self.cx.push_recv_flush(&wqe);
            return Ok(());
        }
        self.resp.rq.push_back(wqe);
        Ok(())
    }

    /// The next completion, oldest first. Send and receive completions share this queue;
    /// [`WcOpcode::is_recv`] tells them apart for a QP whose two CQs differ.
    pub fn poll_completion(&mut self) -> Option<WorkCompletion> {
        self.cx.completions.pop_front()
    }

    /// Completions waiting.
    pub fn completions_pending(&self) -> usize {
        self.cx.completions.len()
    }

    /// Send WRs posted and not yet completed.
    pub fn send_queue_len(&self) -> usize {
        self.req.sq.len() - self.cx.ext.as_ref().map_or(0, |e| e.tm_queued)
    }

    /// Receive WRs posted and not yet consumed.
    pub fn recv_queue_len(&self) -> usize {
        self.resp.rq.len()
    }
}

/// Driving the QP: frames in, frames out, time. Native failover's side frames and the
/// notification point's CNPs are in `failover.rs` and `notify.rs`.
impl Qp {
    /// Parses `frame` (every check on) and handles it; a malformed frame is an error for the
    /// caller to count, and handed to [`handle_malformed`](Self::handle_malformed) when it
    /// still names this QP. Engines that already parsed to demultiplex call
    /// [`handle_packet`](Self::handle_packet).
    pub fn handle_frame(
        &mut self,
        now: u64,
        frame: &[u8],
        mem: &mut MrTable,
    ) -> Result<(), crate::wire::Error> {
        // By reference: binding the packet by value moved it out of the result (a memcpy).
        match &RoceRepr::parse(frame, Checks::ALL) {
            Ok(pkt) => {
                self.handle_packet(now, pkt, mem);
                Ok(())
            }
            &Err(e) => {
                if let Some(m) = RoceRepr::attribute(frame, Checks::ALL, e) {
                    if m.bth.dest_qpn == self.cx.qpn {
                        self.handle_malformed(now, &m);
                    }
                }
                Err(e)
            }
        }
    }

    /// Handles one received packet addressed to this QP (the caller demultiplexed on the
    /// BTH destination QP and checked the ICRC). Anything that does not belong is counted
    /// and dropped; no input panics.
    #[inline]
    pub fn handle_packet(&mut self, now: u64, pkt: &RocePacket<'_>, mem: &mut MrTable) {
        self.cx.counters.rx_packets += 1;
        self.cx.counters.rx_bytes += pkt.frame_len() as u64;
        if pkt.repr.ip.ecn() == crate::wire::Ecn::Ce {
            self.on_ce(now, pkt.repr.bth.opcode);
        }
        if self.cx.paths().is_some() && !is_probe(pkt) {
            self.follow_peer(now, pkt);
        }
        let op = pkt.repr.bth.opcode;
        if op == Opcode::PATH_CONTROL {
            self.on_path_control(now, pkt);
            return;
        }
        if op == Opcode::CNP
            && self.cx.qp_type != QpType::Ud
            && matches!(self.cx.state, QpState::Rts | QpState::Sqd)
        {
            // A congestion notification for what this QP sends (Annex A17.9.3): the reaction
            // point is the congestion-control policy.
            self.cx.counters.rp_cnp_handled += 1;
            self.cx.congestion.on_cnp(now);
            return;
        }
        if !self.admits(op) {
            self.cx.counters.rx_dropped += 1;
            return;
        }
        if op.is_response() {
            if matches!(self.cx.state, QpState::Rts | QpState::Sqd) {
                self.req.receive(&mut self.cx, now, pkt, mem);
                self.apply_failure();
            } else {
                self.cx.counters.rx_dropped += 1;
            }
        } else {
            self.resp.receive(&mut self.cx, pkt, mem);
            self.apply_failure();
        }
        if self.cx.ext.is_some() {
            self.run_tag_matching();
        }
    }

    /// Queues the requests tag matching owes: the READs of matched rendezvous requests and
    /// the FINs of finished ones, behind whatever the program posted, past the queue's
    /// depth (the TM-SRQ owns the QP's send queue for these, as rdma-core describes). A QP
    /// that cannot send any more fails the READs as flushed.
    #[inline]
    fn run_tag_matching(&mut self) {
        let Some(e) = self.cx.ext.as_deref_mut() else {
            return;
        };
        if e.tm_reads.is_empty() && e.tm_fins.is_empty() {
            return;
        }
        let sending = matches!(self.cx.state, QpState::Rts | QpState::Sqd);
        let mut flushed = Vec::new();
        while let Some((w, r)) = e.tm_reads.pop_front() {
            if !sending {
                flushed.push(w.wr_id);
                continue;
            }
            e.tm_inflight.push_back(r.headers);
            e.tm_queued += 1;
            self.req.sq.push_back(SendWqe {
                wr_id: w.wr_id,
                op: WrOpcode::Read,
                flags: SendFlags::INTERNAL
                    .with(SendFlags::TM_READ)
                    .with(SendFlags::SIGNALED),
                imm: 0,
                remote_addr: r.va,
                rkey: r.rkey,
                compare_add: 0,
                swap: 0,
                data: WqeData::Sges(w.sges),
                len: r.len,
                ud: None,
                first_psn: Psn::new(0),
                npkts: 0,
            });
        }
        while let Some(h) = e.tm_fins.pop_front() {
            if !sending {
                continue;
            }
            e.tm_queued += 1;
            self.req.sq.push_back(SendWqe {
                wr_id: 0,
                op: WrOpcode::Send,
                flags: SendFlags::INTERNAL,
                imm: 0,
                remote_addr: 0,
                rkey: 0,
                compare_add: 0,
                swap: 0,
                data: WqeData::Inline(SmallVec::from_slice(&h)),
                len: h.len() as u32,
                ud: None,
                first_psn: Psn::new(0),
                npkts: 0,
            });
        }
        for wr_id in flushed {
            let wc =
                WorkCompletion::new(wr_id, WcStatus::WrFlushErr, WcOpcode::TmRecv, self.cx.qpn);
            self.cx.completions.push_back(wc);
        }
    }

    /// True when this QP takes packets with opcode `op` now: a state that receives, and the
    /// QP's own transport (selective-repeat opcodes only between QPs that agreed on
    /// placement).
    fn admits(&self, op: Opcode) -> bool {
        let ok_state = matches!(
            self.cx.state,
            QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
        );
        let ours = match (self.cx.qp_type, op.transport()) {
            (QpType::Rc, crate::wire::Transport::Rc)
            | (QpType::Uc, crate::wire::Transport::Uc)
            | (QpType::Ud, crate::wire::Transport::Ud) => true,
            (QpType::Rc, crate::wire::Transport::Manufacturer) => {
                op.is_selective_repeat() && self.resp.ooo.is_some()
            }
            _ => false,
        };
        ok_state && ours
    }

    /// A frame for this QP that the parser refused after its BTH ([`RoceRepr::attribute`]).
    /// Who receives it decides what it means: an RC responder answers a malformed request at
    /// the expected PSN with NAK invalid request and enters ERR (IBTA class C), ahead of it
    /// as any early packet, behind it as a duplicate it drops; an RC requester fails the
    /// request a malformed response names with BAD_RESP_ERR; UC drops the message in
    /// progress; UD drops the packet. Nothing is written to memory.
    pub fn handle_malformed(&mut self, _now: u64, m: &Malformed) {
        self.cx.counters.rx_packets += 1;
        let op = m.bth.opcode;
        if !self.admits(op) {
            self.cx.counters.rx_dropped += 1;
            return;
        }
        self.cx.span().in_scope(|| {
            tracing::debug!(psn = m.bth.psn.value(), opcode = op.0, error = %m.error, "malformed packet")
        });
        if op.is_response() {
            if matches!(self.cx.state, QpState::Rts | QpState::Sqd) {
                self.req.malformed(&mut self.cx, m.bth.psn);
                self.apply_failure();
            } else {
                self.cx.counters.rx_dropped += 1;
            }
        } else {
            self.resp.malformed(&mut self.cx, m.bth.psn);
            self.apply_failure();
        }
    }

    /// The next frame this QP wants to send, written into `buf` (headers, and the payload
    /// too unless it is at least `split_min` bytes from registered memory: see
    /// [`poll_transmit_split`](Self::poll_transmit_split)), and the port it leaves on; `None`
    /// when it has nothing to send now. This is the call a driver makes: a probe of a path
    /// the QP does not use (or the answer to one) comes first, on that path's port; then the
    /// QP's own frames, on its [`send_port`](Self::send_port). A driver that sends each frame
    /// where it is told cannot put a probe on the wrong port.
    #[inline]
    pub fn poll_transmit_any<'m>(
        &mut self,
        now: u64,
        buf: &mut [u8],
        mem: &'m MrTable,
        split_min: usize,
    ) -> Option<Transmit<'m>> {
        if let Some((port, n)) = self.poll_transmit_side(buf) {
            return Some(Transmit {
                port,
                out: TxOut::Whole(n),
            });
        }
        let out = self.poll_transmit_split(now, buf, mem, split_min)?;
        Some(Transmit {
            port: self.send_port(),
            out,
        })
    }

    /// Writes the next frame this QP wants to send into `buf` and returns its length, or
    /// `None` when it has nothing to send now. Responses go first (they unblock the peer),
    /// then requests within the window. `buf` must hold a path-MTU packet with headers.
    ///
    /// The frames of the QP's [`send_port`](Self::send_port) only, for a QP on one port
    /// (tests, a peer built by hand): a QP with an alternate path also sends probes on the
    /// other path's port, which [`poll_transmit_any`](Self::poll_transmit_any) names.
    pub fn poll_transmit(&mut self, now: u64, buf: &mut [u8], mem: &MrTable) -> Option<usize> {
        match self.poll_transmit_split(now, buf, mem, usize::MAX)? {
            TxOut::Whole(n) => Some(n),
            TxOut::Split(_) => unreachable!("no payload reaches usize::MAX bytes"),
        }
    }

    /// [`poll_transmit`](Self::poll_transmit) for a port that can send a frame from several
    /// buffers: a packet whose payload from registered memory is at least `split_min` bytes
    /// (WRITE and SEND data, READ responses) comes back as headers in `buf` plus the payload
    /// in place ([`TxOut::Split`]); every other frame is whole in `buf`.
    pub fn poll_transmit_split<'m>(
        &mut self,
        now: u64,
        buf: &mut [u8],
        mem: &'m MrTable,
        split_min: usize,
    ) -> Option<TxOut<'m>> {
        if self
            .cx
            .ext
            .as_ref()
            .is_some_and(|e| e.np.is_some_and(|n| n.out))
        {
            if let Some(n) = self.transmit_cnp(buf) {
                self.cx.counters.tx_packets += 1;
                self.cx.counters.tx_bytes += n as u64;
                return Some(TxOut::Whole(n));
            }
        }
        if self
            .cx
            .ext
            .as_ref()
            .is_some_and(|e| e.control_out.is_some())
        {
            if let Some(n) = self.transmit_control(now, buf) {
                self.cx.counters.tx_packets += 1;
                self.cx.counters.tx_bytes += n as u64;
                return Some(TxOut::Whole(n));
            }
        }
        // A half that fails the QP sends nothing in that call, so the failure is looked for
        // only when a half had nothing to send; a responder's (a READ whose region went away)
        // flushes the send queue before the requester is asked.
        let out = match self.resp.transmit(&mut self.cx, buf, mem, split_min) {
            Some(out) => out,
            None => {
                self.apply_failure();
                let out = self.req.transmit(&mut self.cx, now, buf, mem, split_min);
                if out.is_none() {
                    self.apply_failure();
                }
                out?
            }
        };
        debug_assert_eq!(
            self.cx.pending,
            Flush::None,
            "a half failed the QP and sent"
        );
        self.cx.counters.tx_packets += 1;
        self.cx.counters.tx_bytes += out.len() as u64;
        Some(out)
    }

    /// True when the requester has packets it could send now (used by engines to decide
    /// whether to call `poll_transmit` again without new input).
    pub fn wants_transmit(&self) -> bool {
        self.resp.has_output() || self.req.may_send(&self.cx)
    }

    /// The earliest time [`handle_timeout`](Self::handle_timeout) has work, if any.
    pub fn poll_timeout(&self) -> Option<u64> {
        if self.cx.state == QpState::Rtr {
            // A responder that never reaches RTS (perftest's SEND server) still answers on
            // a path, and probes its primary like any other.
            return self.probe_at();
        }
        if !matches!(self.cx.state, QpState::Rts | QpState::Sqd) {
            return None;
        }
        [self.req.timers.next(), self.announce_at(), self.probe_at()]
            .into_iter()
            .flatten()
            .min()
    }

    /// Runs the timers due at `now`.
    pub fn handle_timeout(&mut self, now: u64) {
        if self.cx.state == QpState::Rtr {
            self.probe_if_due(now);
            return;
        }
        if matches!(self.cx.state, QpState::Rts | QpState::Sqd) {
            if self.announce_at().is_some_and(|t| t <= now) {
                if let Some(e) = self.cx.ext.as_mut() {
                    if let Some(d) = e.discovery.as_mut() {
                        d.next_at = None;
                    }
                    e.control_out = Some(PathControlKind::Announce);
                }
            }
            if self.migrates_on_timeout(now) {
                self.cx.counters.local_ack_timeout_err += 1;
                self.migrate(now, true);
                return;
            }
            self.probe_if_due(now);
            self.req.on_timeout(&mut self.cx, now);
            self.apply_failure();
        }
    }
}

/// What the QP did: counters, the send record, memory beyond the queues.
impl Qp {
    /// Its counters.
    pub fn counters(&self) -> &Counters {
        &self.cx.counters
    }

    /// When and by which path request packet `psn` left, while it is recent enough to be in
    /// the send records; `None` for a QP with the default congestion control, which keeps
    /// none.
    pub fn send_record(&self, psn: Psn) -> Option<SendRecord> {
        self.cx.congestion.records().and_then(|r| r.get(psn))
    }

    /// Bytes this QP holds on the heap beyond its send and receive queues (completion
    /// buffer, READ/atomic response queue, atomic replay cache), for the footprint benchmark.
    pub fn heap_bytes_beyond_queues(&self) -> usize {
        self.cx.completions.capacity() * core::mem::size_of::<WorkCompletion>()
            + self.resp.heap_bytes()
    }
}

impl QpContext {
    /// The alternate path and which path is active, if the QP has one.
    pub(crate) fn paths(&self) -> Option<&Paths> {
        self.ext.as_ref()?.paths.as_ref()
    }

    /// Packet `opcode` with `psn` on the QP's path, as a responder sends it: no solicited
    /// event, no AckReq, from the path's UDP source port.
    #[inline]
    pub(crate) fn fields(&self, opcode: Opcode, psn: Psn) -> crate::wire::PacketFields {
        crate::wire::PacketFields {
            opcode,
            solicited: false,
            ack_req: false,
            psn,
            udp_src_port: self.template.udp_src_port(),
        }
    }

    /// The header template with the BTH fields of one packet set.
    pub(crate) fn repr(&self, opcode: Opcode, psn: Psn, payload_len: usize) -> RoceRepr {
        let mut r = self.template.repr();
        r.bth.opcode = opcode;
        set_psn(&mut r, psn);
        r.payload_len = payload_len;
        r
    }

    /// The span every event this QP logs happens in (`qp{qpn, kind}`), so a subscriber can
    /// follow one QP. Made when an event is logged, not kept: a span handle would cost every
    /// QP 40 bytes, and with no subscriber making one costs next to nothing.
    pub(crate) fn span(&self) -> tracing::Span {
        tracing::debug_span!("qp", qpn = self.qpn.value(), kind = ?self.qp_type)
    }

    /// The retransmission deadline for a request sent, or progress made, at `now` (`None`
    /// when the local ACK timeout is infinite).
    pub(crate) fn ack_deadline(&self, now: u64) -> Option<u64> {
        self.ack_timeout_ns().map(|t| now + t)
    }

    /// The local ACK timeout (`None`: wait forever). Computed from the attribute rather
    /// than kept: an idle QP's bytes count (issue 19).
    pub(crate) fn ack_timeout_ns(&self) -> Option<u64> {
        local_ack_timeout_ns(self.attr.timeout)
    }

    /// Payload bytes per packet: the path MTU (a UD QP's, the port's).
    #[inline]
    pub(crate) fn mtu(&self) -> u32 {
        self.attr.path_mtu.bytes()
    }

    /// The path the QP sends on: its active port (0 with one path) and UDP source port.
    pub(crate) fn base_path(&self) -> Path {
        Path {
            port: self.paths().map_or(0, |p| p.active_port),
            udp_src_port: self.template.udp_src_port(),
        }
    }

    /// The feedback of a QP that places requests out of order (an RC QP whose policy asks
    /// for it).
    pub(crate) fn placing(&self) -> Option<super::recovery::Feedback> {
        match self.recovery.delivery() {
            Delivery::Placement(f) if self.qp_type == QpType::Rc => Some(f),
            _ => None,
        }
    }

    pub(crate) fn push_send_completion(&mut self, w: &SendWqe, status: WcStatus, byte_len: u32) {
        if w.flags.contains(SendFlags::INTERNAL) {
            self.internal_done(w, status, byte_len);
            return;
        }
        let signaled = self.caps.sq_sig_all || w.flags.contains(SendFlags::SIGNALED);
        match status {
            WcStatus::Success if !signaled => return,
            WcStatus::Success => {}
            WcStatus::WrFlushErr => self.counters.req_cqe_flush_error += 1,
            _ => self.counters.req_cqe_error += 1,
        }
        let mut wc = WorkCompletion::new(w.wr_id, status, w.op.wc_opcode(), self.qpn);
        wc.byte_len = byte_len;
        self.completions.push_back(wc);
    }

    /// A request the QP made itself finished. A rendezvous READ completes its tagged buffer
    /// (`IBV_WC_TM_RECV` with `TM_DATA_VALID`, or the READ's error) and, done, owes the
    /// sender its FIN; a FIN's own completion is nobody's.
    #[cold]
    fn internal_done(&mut self, w: &SendWqe, status: WcStatus, byte_len: u32) {
        let e = self.ext.get_or_insert_with(Box::default);
        e.tm_queued = e.tm_queued.saturating_sub(1);
        if !w.flags.contains(SendFlags::TM_READ) {
            return;
        }
        let headers = e.tm_inflight.pop_front();
        let mut wc = WorkCompletion::new(w.wr_id, status, WcOpcode::TmRecv, self.qpn);
        if status == WcStatus::Success {
            wc.wc_flags = WcFlags::TM_DATA_VALID;
            wc.byte_len = byte_len;
            if let Some(h) = headers {
                e.tm_fins.push_back(h);
            }
        } else {
            self.counters.resp_cqe_error += 1;
        }
        self.completions.push_back(wc);
    }

    /// A tagged buffer took a rendezvous request: the QP reads the data into it (started
    /// by [`Qp::run_tag_matching`] once the packet is handled).
    pub(crate) fn tm_read(&mut self, w: RecvWqe, read: super::tm::Rendezvous) {
        self.ext
            .get_or_insert_with(Box::default)
            .tm_reads
            .push_back((w, read));
    }

    pub(crate) fn push_recv_flush(&mut self, w: &RecvWqe) {
        self.counters.resp_cqe_flush_error += 1;
        self.completions.push_back(WorkCompletion::new(
            w.wr_id,
            WcStatus::WrFlushErr,
            WcOpcode::Recv,
            self.qpn,
        ));
    }

    /// Fails the QP into ERR from the responder: every outstanding WR is flushed, send queue
    /// first, when the handler returns (a final NAK the responder queued stays queued). The
    /// state changes at once, so the rest of the handler sees ERR.
    pub(crate) fn enter_error(&mut self) {
        self.state = QpState::Err;
        self.pending = Flush::All;
    }
}

/// Sets a packet's PSN and, over IPv4, its IP identification to the PSN's low 16 bits.
///
/// Consecutive packets of a QP then carry consecutive identifications, exactly as the
/// datagrams that UDP segmentation offload (the kernel's GSO, a NIC's USO) cuts from one
/// larger datagram do. A driver may therefore hand a run of equal-sized packets to the kernel
/// or the NIC as one datagram and the segments come out byte for byte as emitted, ICRC
/// included (the ICRC covers the identification). A retransmission repeats its original's
/// identification, which RFC 6864 allows for atomic (DF) datagrams.
pub(crate) fn set_psn(r: &mut RoceRepr, psn: Psn) {
    r.bth.psn = psn;
    if let crate::wire::IpRepr::V4(ip) = &mut r.ip {
        ip.ident = psn.value() as u16;
    }
}

/// Credit count → AETH credit code (IBTA table 44): the largest code whose count does not
/// exceed `available`.
pub fn credit_code(available: usize) -> u8 {
    let mut code = 0u8;
    for (c, &n) in CREDITS.iter().enumerate() {
        if n as usize <= available {
            code = c as u8;
        }
    }
    code
}

/// AETH credit code → receive WQEs; `None` for code 31 (invalid: flow control off).
pub fn credits_of(code: u8) -> Option<u32> {
    CREDITS.get(usize::from(code & 0x1f)).copied()
}

const CREDITS: [u32; 31] = [
    0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536,
    2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768,
];

/// Whether `pkt` is a path probe or a probe's answer: evidence of a path the QP may not be
/// using, not of where the peer sends from.
fn is_probe(pkt: &RocePacket<'_>) -> bool {
    pkt.repr.bth.opcode == Opcode::PATH_CONTROL
        && matches!(
            PathControl::parse(pkt.payload).map(|m| m.kind),
            Ok(PathControlKind::Probe | PathControlKind::ProbeReply)
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credit_codes_follow_table_44() {
        assert_eq!(credit_code(0), 0);
        assert_eq!(credit_code(5), 4);
        assert_eq!(credits_of(5), Some(6));
        assert_eq!(credit_code(6), 5);
        assert_eq!(credit_code(1000), 19);
        assert_eq!(credit_code(100_000), 30);
        assert_eq!(credits_of(31), None);
        for n in 0..40_000 {
            assert!(credits_of(credit_code(n)).unwrap() as usize <= n);
        }
    }

    #[test]
    fn mtu_values() {
        assert_eq!(Mtu::Mtu256.bytes(), 256);
        assert_eq!(Mtu::Mtu4096.bytes(), 4096);
        assert_eq!(Mtu::for_ethernet_mtu(1500), Mtu::Mtu1024);
        assert_eq!(Mtu::for_ethernet_mtu(9000), Mtu::Mtu4096);
        assert_eq!(Mtu::for_ethernet_mtu(4200), Mtu::Mtu4096);
        assert_eq!(Mtu::from_bytes(2048), Some(Mtu::Mtu2048));
    }
}
