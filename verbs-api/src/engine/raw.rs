//! Raw packet QPs (`IBV_QPT_RAW_PACKET`) and flow steering (`ibv_create_flow`): a program
//! sends whole Ethernet frames from registered memory and receives the frames its flow
//! rules match, on the same port and beside the RoCE traffic, as packet programs do on a
//! ConnectX. A frame a rule matches goes to the rule's QP (the first rule, in the order they
//! were attached) instead of the RoCE transport; the others are RoCE's, as before.
//!
//! Frames a raw QP sends to a multicast or broadcast address, or to the port's own MAC, are
//! also delivered to the raw QPs of the process on that port (the loopback a ConnectX
//! eswitch gives multicast), so two contexts of one device exchange raw frames as on a NIC.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use ferroce_stack::transport::{
    Access, MrTable, PdId, PostError, QpState, Sge, WcOpcode, WcStatus, WorkCompletion,
};
use ferroce_stack::wire::Qpn;
use smallvec::SmallVec;

use super::shared::{state_code, CqShared, QpShared};

/// One match of a flow rule (libibverbs' `ibv_flow_spec_*`): each field is compared under
/// its mask; a zero mask matches anything.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum FlowSpec {
    /// The Ethernet header (`IBV_FLOW_SPEC_ETH`); `vlan_tag` is the 802.1Q TCI.
    Eth {
        /// Destination MAC.
        dst: [u8; 6],
        /// Its mask.
        dst_mask: [u8; 6],
        /// Source MAC.
        src: [u8; 6],
        /// Its mask.
        src_mask: [u8; 6],
        /// Ethertype (of the payload, past a VLAN tag).
        ether_type: u16,
        /// Its mask.
        ether_type_mask: u16,
        /// 802.1Q tag control (0 without a tag).
        vlan_tag: u16,
        /// Its mask.
        vlan_mask: u16,
    },
    /// An IPv4 header (`IBV_FLOW_SPEC_IPV4`, `_IPV4_EXT`).
    Ipv4 {
        /// Source address.
        src: [u8; 4],
        /// Its mask.
        src_mask: [u8; 4],
        /// Destination address.
        dst: [u8; 4],
        /// Its mask.
        dst_mask: [u8; 4],
        /// Protocol.
        proto: u8,
        /// Its mask.
        proto_mask: u8,
    },
    /// An IPv6 header (`IBV_FLOW_SPEC_IPV6`).
    Ipv6 {
        /// Source address.
        src: [u8; 16],
        /// Its mask.
        src_mask: [u8; 16],
        /// Destination address.
        dst: [u8; 16],
        /// Its mask.
        dst_mask: [u8; 16],
        /// Next header.
        next_hdr: u8,
        /// Its mask.
        next_hdr_mask: u8,
    },
    /// A TCP (`tcp`) or UDP header's ports (`IBV_FLOW_SPEC_TCP`, `_UDP`).
    Ports {
        /// TCP, else UDP.
        tcp: bool,
        /// Source port.
        src: u16,
        /// Its mask.
        src_mask: u16,
        /// Destination port.
        dst: u16,
        /// Its mask.
        dst_mask: u16,
    },
}

fn masked_eq(a: &[u8], b: &[u8], m: &[u8]) -> bool {
    a.iter().zip(b).zip(m).all(|((x, y), k)| x & k == y & k)
}

/// The headers of a frame a rule can match.
struct Headers<'a> {
    dst: &'a [u8],
    src: &'a [u8],
    vlan: u16,
    ether_type: u16,
    /// (src, dst, protocol / next header) of an IPv4 or IPv6 header.
    v4: Option<(&'a [u8], &'a [u8], u8)>,
    v6: Option<(&'a [u8], &'a [u8], u8)>,
    /// (src, dst) ports of the TCP or UDP header, and whether it is TCP.
    ports: Option<(u16, u16, bool)>,
}

fn headers(f: &[u8]) -> Option<Headers<'_>> {
    let be16 = |i: usize| f.get(i..i + 2).map(|b| u16::from_be_bytes([b[0], b[1]]));
    let mut at = 12;
    let mut ether_type = be16(at)?;
    let mut vlan = 0;
    if ether_type == 0x8100 {
        vlan = be16(14)?;
        at += 4;
        ether_type = be16(at)?;
    }
    at += 2;
    let mut h = Headers {
        dst: &f[0..6],
        src: &f[6..12],
        vlan,
        ether_type,
        v4: None,
        v6: None,
        ports: None,
    };
    let l4 = match ether_type {
        0x0800 => {
            let ihl = usize::from(*f.get(at)? & 0x0f) * 4;
            let proto = *f.get(at + 9)?;
            h.v4 = Some((f.get(at + 12..at + 16)?, f.get(at + 16..at + 20)?, proto));
            Some((at + ihl, proto))
        }
        0x86dd => {
            let next = *f.get(at + 6)?;
            h.v6 = Some((f.get(at + 8..at + 24)?, f.get(at + 24..at + 40)?, next));
            Some((at + 40, next))
        }
        _ => None,
    };
    if let Some((at, proto @ (6 | 17))) = l4 {
        if let (Some(s), Some(d)) = (be16(at), be16(at + 2)) {
            h.ports = Some((s, d, proto == 6));
        }
    }
    Some(h)
}

impl FlowSpec {
    fn matches(&self, h: &Headers<'_>) -> bool {
        match *self {
            Self::Eth {
                dst,
                dst_mask,
                src,
                src_mask,
                ether_type,
                ether_type_mask,
                vlan_tag,
                vlan_mask,
            } => {
                masked_eq(h.dst, &dst, &dst_mask)
                    && masked_eq(h.src, &src, &src_mask)
                    && h.ether_type & ether_type_mask == ether_type & ether_type_mask
                    && h.vlan & vlan_mask == vlan_tag & vlan_mask
            }
            Self::Ipv4 {
                src,
                src_mask,
                dst,
                dst_mask,
                proto,
                proto_mask,
            } => h.v4.is_some_and(|(s, d, p)| {
                masked_eq(s, &src, &src_mask)
                    && masked_eq(d, &dst, &dst_mask)
                    && p & proto_mask == proto & proto_mask
            }),
            Self::Ipv6 {
                src,
                src_mask,
                dst,
                dst_mask,
                next_hdr,
                next_hdr_mask,
            } => h.v6.is_some_and(|(s, d, p)| {
                masked_eq(s, &src, &src_mask)
                    && masked_eq(d, &dst, &dst_mask)
                    && p & next_hdr_mask == next_hdr & next_hdr_mask
            }),
            Self::Ports {
                tcp,
                src,
                src_mask,
                dst,
                dst_mask,
            } => h.ports.is_some_and(|(s, d, t)| {
                t == tcp && s & src_mask == src & src_mask && d & dst_mask == dst & dst_mask
            }),
        }
    }
}

/// A flow rule: every spec must match (an empty rule matches every frame).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FlowRule {
    /// The specs, all of which a frame must match.
    pub specs: Vec<FlowSpec>,
}

impl FlowRule {
    /// True when `frame` matches every spec.
    pub fn matches(&self, frame: &[u8]) -> bool {
        match headers(frame) {
            Some(h) => self.specs.iter().all(|s| s.matches(&h)),
            None => false,
        }
    }
}

/// What a raw packet QP refuses of `wr` at post time, before it looks at its queue: anything
/// but a SEND, a send before RTS, more elements than its caps, a frame shorter than an
/// Ethernet header or longer than `max_frame`. One home for the rules: the verbs API asks
/// before it hands a WR to the engine, and a service's client asks before the WR goes into
/// the ring.
pub(crate) fn check_send(
    state: QpState,
    caps: &ferroce_stack::transport::QpCaps,
    wr: &ferroce_stack::transport::SendWr<'_>,
    max_frame: usize,
) -> Result<(), PostError> {
    use ferroce_stack::transport::{Payload, QpType, WrOpcode};
    if wr.opcode != WrOpcode::Send {
        return Err(PostError::UnsupportedOpcode {
            opcode: wr.opcode,
            qp_type: QpType::Ud,
        });
    }
    if state != QpState::Rts {
        return Err(PostError::InvalidState(state));
    }
    let len = match wr.payload {
        Payload::Inline(b) => b.len(),
        Payload::Sges(sges) => {
            if sges.len() > caps.max_send_sge as usize {
                return Err(PostError::TooManySges {
                    got: sges.len(),
                    max: caps.max_send_sge,
                });
            }
            sges.iter().map(|s| s.length as usize).sum()
        }
    };
    if !(14..=max_frame).contains(&len) {
        return Err(PostError::FrameLength(len));
    }
    Ok(())
}

/// A frame a raw QP will send, read out of registered memory at post time.
struct RawSend {
    wr_id: u64,
    signaled: bool,
    frame: Vec<u8>,
}

/// Receive-side scaling of a raw QP (`IBV_QP_INIT_ATTR_RX_HASH`): the frames its rules
/// match go to one of its work queues, picked by the Toeplitz hash of the fields the program
/// chose (`IBV_RX_HASH_*`) under its key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rss {
    /// The work queues (raw QPs that only receive), in indirection table order.
    pub wqs: Vec<u32>,
    /// The Toeplitz key.
    pub key: Vec<u8>,
    /// `IBV_RX_HASH_*` fields hashed.
    pub fields: u64,
}

/// `IBV_RX_HASH_*` bits.
mod hash {
    pub(super) const SRC_IPV4: u64 = 1;
    pub(super) const DST_IPV4: u64 = 2;
    pub(super) const SRC_IPV6: u64 = 4;
    pub(super) const DST_IPV6: u64 = 8;
    pub(super) const SRC_PORT_TCP: u64 = 16;
    pub(super) const DST_PORT_TCP: u64 = 32;
    pub(super) const SRC_PORT_UDP: u64 = 64;
    pub(super) const DST_PORT_UDP: u64 = 128;
}

/// The Toeplitz hash of `input` under `key` (Microsoft's RSS definition): for every set bit
/// of the input, the 32 bits of the key starting at that bit's position are XORed in.
pub fn toeplitz(key: &[u8], input: &[u8]) -> u32 {
    let bit = |i: usize| {
        key.get(i / 8)
            .map_or(0, |k| u32::from(k >> (7 - i % 8) & 1))
    };
    let mut window = (0..32).fold(0u32, |w, i| w << 1 | bit(i));
    let mut out = 0;
    for (i, byte) in input.iter().enumerate() {
        for b in 0..8 {
            if byte & (0x80 >> b) != 0 {
                out ^= window;
            }
            window = window << 1 | bit(i * 8 + b + 32);
        }
    }
    out
}

impl Rss {
    /// The work queue a frame goes to.
    pub(crate) fn pick(&self, frame: &[u8]) -> Option<u32> {
        let h = headers(frame)?;
        let mut input = Vec::with_capacity(36);
        if let Some((s, d, _)) = h.v4 {
            if self.fields & hash::SRC_IPV4 != 0 {
                input.extend_from_slice(s);
            }
            if self.fields & hash::DST_IPV4 != 0 {
                input.extend_from_slice(d);
            }
        }
        if let Some((s, d, _)) = h.v6 {
            if self.fields & hash::SRC_IPV6 != 0 {
                input.extend_from_slice(s);
            }
            if self.fields & hash::DST_IPV6 != 0 {
                input.extend_from_slice(d);
            }
        }
        if let Some((sp, dp, tcp)) = h.ports {
            let (src, dst) = if tcp {
                (hash::SRC_PORT_TCP, hash::DST_PORT_TCP)
            } else {
                (hash::SRC_PORT_UDP, hash::DST_PORT_UDP)
            };
            if self.fields & src != 0 {
                input.extend_from_slice(&sp.to_be_bytes());
            }
            if self.fields & dst != 0 {
                input.extend_from_slice(&dp.to_be_bytes());
            }
        }
        let n = self.wqs.len();
        (n > 0).then(|| self.wqs[toeplitz(&self.key, &input) as usize % n])
    }
}

/// A raw packet QP as its engine keeps it.
pub(crate) struct RawQp {
    pub(super) shared: Arc<QpShared>,
    pub(super) pd: PdId,
    pub(super) state: QpState,
    pub(super) port: u8,
    rq: VecDeque<(u64, SmallVec<[Sge; 2]>)>,
    sq: VecDeque<RawSend>,
    pub(super) send_cq: Arc<CqShared>,
    pub(super) recv_cq: Arc<CqShared>,
    /// Frames that matched but found no receive posted.
    pub(super) dropped: u64,
    /// Set on an RSS QP: where its frames go instead of its own receive queue.
    pub(crate) rss: Option<Rss>,
}

impl RawQp {
    pub(crate) fn new(
        shared: Arc<QpShared>,
        pd: PdId,
        send_cq: Arc<CqShared>,
        recv_cq: Arc<CqShared>,
    ) -> Self {
        Self {
            shared,
            pd,
            state: QpState::Reset,
            port: 0,
            rq: VecDeque::new(),
            sq: VecDeque::new(),
            send_cq,
            recv_cq,
            dropped: 0,
            rss: None,
        }
    }

    /// A work queue (`ibv_create_wq`) or an RSS QP: set to its state as is, without the QP
    /// state machine (a work queue is RESET, RDY or ERR; RDY receives as RTS does).
    pub(crate) fn force_state(&mut self, state: QpState, now: u64) {
        if state == QpState::Err || state == QpState::Reset {
            let _ = self.modify(state, None, now);
            return;
        }
        self.state = state;
        self.shared
            .state
            .store(state_code(state), Ordering::Release);
    }

    fn qpn(&self) -> Qpn {
        Qpn::new(self.shared.qpn)
    }

    fn completion(
        &self,
        wr_id: u64,
        status: WcStatus,
        opcode: WcOpcode,
        len: u32,
    ) -> WorkCompletion {
        let mut wc = WorkCompletion::of_request(wr_id, status, opcode, len);
        wc.qp_num = self.qpn();
        wc
    }

    /// Moves to `state`: RESET, INIT (on port `port`, from 0), RTR, RTS, ERR, along the
    /// IBTA order; ERR and RESET flush or drop what is queued. False for a transition the
    /// spec does not allow.
    pub(crate) fn modify(&mut self, state: QpState, port: Option<u8>, now: u64) -> bool {
        let ok = match (self.state, state) {
            (_, QpState::Reset | QpState::Err) => true,
            (QpState::Reset, QpState::Init) => port.is_some(),
            (QpState::Init, QpState::Init | QpState::Rtr) => true,
            (QpState::Rtr, QpState::Rts) | (QpState::Rts, QpState::Rts) => true,
            _ => false,
        };
        if !ok {
            return false;
        }
        if let Some(p) = port {
            self.port = p;
        }
        match state {
            QpState::Err => {
                for s in std::mem::take(&mut self.sq) {
                    let wc = self.completion(s.wr_id, WcStatus::WrFlushErr, WcOpcode::Send, 0);
                    self.send_cq.push(wc, now);
                }
                for (id, _) in std::mem::take(&mut self.rq) {
                    let wc = self.completion(id, WcStatus::WrFlushErr, WcOpcode::Recv, 0);
                    self.recv_cq.push(wc, now);
                }
            }
            QpState::Reset => {
                self.sq.clear();
                self.rq.clear();
            }
            _ => {}
        }
        self.state = state;
        self.shared
            .state
            .store(state_code(state), Ordering::Release);
        true
    }

    /// Queues a frame read from `sges` (or `inline`) of registered memory, to leave at the
    /// engine's next turn.
    pub(crate) fn post_send(
        &mut self,
        mem: &MrTable,
        wr_id: u64,
        signaled: bool,
        sges: &[Sge],
        inline: Option<&[u8]>,
        max_frame: usize,
    ) -> Result<(), PostError> {
        match self.state {
            QpState::Rts => {}
            s => return Err(PostError::InvalidState(s)),
        }
        let caps = self.shared.caps;
        if self.sq.len() >= caps.max_send_wr as usize {
            return Err(PostError::QueueFull(caps.max_send_wr));
        }
        if sges.len() > caps.max_send_sge as usize {
            return Err(PostError::TooManySges {
                got: sges.len(),
                max: caps.max_send_sge,
            });
        }
        let mut frame = Vec::new();
        match inline {
            Some(b) => frame.extend_from_slice(b),
            None => {
                for s in sges {
                    let at = frame.len();
                    frame.resize(at + s.length as usize, 0);
                    mem.read(s.lkey, self.pd, s.addr, &mut frame[at..], Access::NONE)
                        .map_err(|_| PostError::LocalAccess)?;
                }
            }
        }
        if frame.len() < 14 || frame.len() > max_frame {
            return Err(PostError::FrameLength(frame.len()));
        }
        self.sq.push_back(RawSend {
            wr_id,
            signaled: signaled || self.shared.caps.sq_sig_all,
            frame,
        });
        Ok(())
    }

    /// Queues a receive.
    pub(crate) fn post_recv(&mut self, wr_id: u64, sges: &[Sge]) -> Result<(), PostError> {
        if self.state == QpState::Reset {
            return Err(PostError::InvalidState(self.state));
        }
        let caps = self.shared.caps;
        if self.rq.len() >= caps.max_recv_wr as usize {
            return Err(PostError::QueueFull(caps.max_recv_wr));
        }
        if sges.len() > caps.max_recv_sge as usize {
            return Err(PostError::TooManySges {
                got: sges.len(),
                max: caps.max_recv_sge,
            });
        }
        if self.state == QpState::Err {
            let wc = self.completion(wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, 0);
            self.recv_cq.push(wc, 0);
            return Ok(());
        }
        self.rq.push_back((wr_id, SmallVec::from_slice(sges)));
        Ok(())
    }

    /// Takes a received frame into the next receive: the frame from its first byte, its
    /// length in the completion (`IBV_WC_RECV`).
    pub(crate) fn receive(&mut self, mem: &MrTable, frame: &[u8], now: u64) {
        if !matches!(self.state, QpState::Rtr | QpState::Rts) {
            return;
        }
        let Some((wr_id, sges)) = self.rq.pop_front() else {
            self.dropped += 1;
            return;
        };
        let status = match ferroce_stack::transport::scatter_from_start(mem, self.pd, &sges, frame)
        {
            Ok(()) => WcStatus::Success,
            Err(ferroce_stack::transport::SgError::Length) => WcStatus::LocLenErr,
            Err(_) => WcStatus::LocProtErr,
        };
        let wc = self.completion(wr_id, status, WcOpcode::Recv, frame.len() as u32);
        self.recv_cq.push(wc, now);
    }

    /// The frames waiting to leave, each with whether to complete it.
    pub(crate) fn take_sends(&mut self) -> impl Iterator<Item = (u64, bool, Vec<u8>)> + '_ {
        self.sq.drain(..).map(|s| (s.wr_id, s.signaled, s.frame))
    }

    /// Completes a send that left (or failed to).
    pub(crate) fn complete_send(&self, wr_id: u64, ok: bool, len: usize, now: u64) {
        let status = if ok {
            WcStatus::Success
        } else {
            WcStatus::LocQpOpErr
        };
        let wc = self.completion(wr_id, status, WcOpcode::Send, len as u32);
        self.send_cq.push(wc, now);
    }

    /// Sends waiting.
    pub(crate) fn has_sends(&self) -> bool {
        !self.sq.is_empty()
    }

    /// Its port (index from 0).
    pub(crate) fn port(&self) -> u8 {
        self.port
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn udp_v4() -> Vec<u8> {
        let mut f = vec![0u8; 64];
        f[0..6].copy_from_slice(&[0x01, 0x50, 0x56, 0x19, 0x20, 0xa7]);
        f[6..12].copy_from_slice(&[0x24, 0x8a, 0x07, 0xa5, 0x28, 0xc8]);
        f[12..14].copy_from_slice(&[0x08, 0x00]);
        f[14] = 0x45;
        f[23] = 17;
        f[26..30].copy_from_slice(&[1, 1, 1, 1]);
        f[30..34].copy_from_slice(&[2, 2, 2, 2]);
        f[34..36].copy_from_slice(&1234u16.to_be_bytes());
        f[36..38].copy_from_slice(&5678u16.to_be_bytes());
        f
    }

    /// The verification suite of Microsoft's RSS specification: IPv4 source and destination
    /// (addresses only) under its 40-byte key.
    #[test]
    fn toeplitz_matches_the_rss_specification() {
        let key = [
            0x6d, 0x5a, 0x56, 0xda, 0x25, 0x5b, 0x0e, 0xc2, 0x41, 0x67, 0x25, 0x3d, 0x43, 0xa3,
            0x8f, 0xb0, 0xd0, 0xca, 0x2b, 0xcb, 0xae, 0x7b, 0x30, 0xb4, 0x77, 0xcb, 0x2d, 0xa3,
            0x80, 0x30, 0xf2, 0x0c, 0x6a, 0x42, 0xb7, 0x3b, 0xbe, 0xac, 0x01, 0xfa,
        ];
        // 66.9.149.187:2794 -> 161.142.100.80:1766: 0x323e8fc2 (addresses), 0x51ccc178
        // (with ports).
        let src = [66, 9, 149, 187];
        let dst = [161, 142, 100, 80];
        let mut v = src.to_vec();
        v.extend_from_slice(&dst);
        assert_eq!(toeplitz(&key, &v), 0x323e_8fc2);
        v.extend_from_slice(&2794u16.to_be_bytes());
        v.extend_from_slice(&1766u16.to_be_bytes());
        assert_eq!(toeplitz(&key, &v), 0x51cc_c178);
    }

    #[test]
    fn rules_match_under_their_masks() {
        let f = udp_v4();
        let eth = FlowSpec::Eth {
            dst: [0x01, 0x50, 0x56, 0x19, 0x20, 0xa7],
            dst_mask: [0xff; 6],
            src: [0; 6],
            src_mask: [0; 6],
            ether_type: 0x0800,
            ether_type_mask: 0xffff,
            vlan_tag: 0,
            vlan_mask: 0,
        };
        let ip = FlowSpec::Ipv4 {
            src: [1, 1, 1, 1],
            src_mask: [0xff; 4],
            dst: [2, 2, 2, 2],
            dst_mask: [0xff; 4],
            proto: 17,
            proto_mask: 0xff,
        };
        let udp = FlowSpec::Ports {
            tcp: false,
            src: 1234,
            src_mask: 0xffff,
            dst: 5678,
            dst_mask: 0xffff,
        };
        let rule = FlowRule {
            specs: vec![eth, ip, udp],
        };
        assert!(rule.matches(&f));
        assert!(FlowRule::default().matches(&f), "an empty rule takes all");
        let tcp = FlowSpec::Ports {
            tcp: true,
            src: 1234,
            src_mask: 0xffff,
            dst: 5678,
            dst_mask: 0xffff,
        };
        assert!(!FlowRule { specs: vec![tcp] }.matches(&f));
        let mut other = f.clone();
        other[33] = 3;
        assert!(!rule.matches(&other), "another destination address");
        assert!(!rule.matches(&f[..20]), "truncated");
        let v6 = FlowSpec::Ipv6 {
            src: [0; 16],
            src_mask: [0; 16],
            dst: [0; 16],
            dst_mask: [0; 16],
            next_hdr: 0,
            next_hdr_mask: 0,
        };
        assert!(!FlowRule { specs: vec![v6] }.matches(&f), "not IPv6");
    }
}
