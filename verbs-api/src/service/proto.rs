//! The control protocol between a program and `ferroce serve`: one [`Request`] or
//! [`Response`] per datagram of a `SOCK_SEQPACKET` Unix socket, encoded with postcard, file
//! descriptors (shared memory regions, the doorbell) riding on the datagram that names them
//! (`SCM_RIGHTS`). Requests come from an untrusted program: decoding any bytes yields a
//! request or an error, never a panic, and every handle, size and value in a request is
//! checked by the server before it is used.

use std::net::IpAddr;

use ferroce_stack::cm::{AcceptParams, CmEvent, ConnId, ConnectParams, Peer};
use ferroce_stack::transport::{
    Access, AddressVector, AttrMask, Mtu, QpAttr, QpCaps, QpState, QpType,
};
use ferroce_stack::wire::{MacAddr, Psn, Qpn, VlanTag};
use serde::{Deserialize, Serialize};

/// The protocol's version: a program and a service of different versions refuse each other
/// at [`Request::Hello`] rather than misread each other's rings.
pub const VERSION: u32 = 2;

/// The largest datagram either side sends or accepts.
pub const MAX_MESSAGE: usize = 4096;

/// Largest CQ and queue depth a program may ask a service for (an attached context's
/// `max_cqe` and `max_qp_wr`).
pub const MAX_DEPTH: u32 = 1 << 15;

/// Most descriptors one datagram carries.
pub const MAX_FDS: usize = ferroce_drivers::shm::MAX_PIECES;

/// An object of one program: handles are per connection, so a program can only name what it
/// created.
pub type Handle = u32;

/// What a program asks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    /// First message: the program's protocol version and its process id (for the logs).
    /// The datagram carries the program's event eventfd, which the service writes after it
    /// queues an asynchronous event in the program's page.
    Hello {
        /// [`VERSION`] as the program knows it.
        version: u32,
        /// Its pid.
        pid: u32,
    },
    /// Facts about device `device` (an index into the service's list).
    QueryDevice {
        /// Which device.
        device: u32,
    },
    /// `ibv_alloc_pd`.
    AllocPd {
        /// Which device.
        device: u32,
    },
    /// `ibv_dealloc_pd`.
    DeallocPd {
        /// The PD.
        pd: Handle,
    },
    /// `ibv_reg_mr`: the buffer's pages, moved onto memfds that this datagram carries, one
    /// per piece (`pieces`: where in its memfd, how many bytes); laid end to end, the pieces
    /// hold the `len` bytes at byte `offset`, which peers and gather lists address as `iova`.
    RegMr {
        /// The PD.
        pd: Handle,
        /// The buffer's address in the program.
        addr: u64,
        /// How peers and gather lists address it (`addr` unless `ibv_reg_mr_iova`).
        iova: u64,
        /// Bytes.
        len: u64,
        /// Where the buffer starts in the pieces laid end to end.
        offset: u64,
        /// Each piece: its offset in its memfd and its bytes (whole pages).
        pieces: Vec<(u64, u64)>,
        /// `IBV_ACCESS_*` bits.
        access: u32,
    },
    /// `ibv_dereg_mr`.
    DeregMr {
        /// The MR.
        mr: Handle,
    },
    /// `ibv_create_cq` with at least `cqe` entries; with `channel`, the datagram carries the
    /// completion channel's eventfd, which the service writes when the CQ, armed, fires.
    CreateCq {
        /// Which device.
        device: u32,
        /// Entries.
        cqe: u32,
        /// A completion channel's eventfd comes with the request.
        channel: bool,
    },
    /// `ibv_destroy_cq`.
    DestroyCq {
        /// The CQ.
        cq: Handle,
    },
    /// `ibv_create_qp`.
    CreateQp {
        /// The PD.
        pd: Handle,
        /// Its send CQ.
        send_cq: Handle,
        /// Its receive CQ.
        recv_cq: Handle,
        /// RC, UC or UD.
        qp_type: WireQpType,
        /// Queue capacities asked for.
        caps: WireCaps,
        /// Its shared receive queue, if it takes receives from one.
        srq: Option<Handle>,
    },
    /// `ibv_create_srq`: the answer's datagram carries the region of its receive ring.
    CreateSrq {
        /// The PD.
        pd: Handle,
        /// Receives it holds.
        max_wr: u32,
        /// Elements per receive.
        max_sge: u32,
    },
    /// `ibv_modify_srq`.
    ModifySrq {
        /// The SRQ.
        srq: Handle,
        /// A new size.
        max_wr: Option<u32>,
        /// A limit to arm (0 disarms).
        limit: Option<u32>,
    },
    /// `ibv_query_srq`.
    QuerySrq {
        /// The SRQ.
        srq: Handle,
    },
    /// `ibv_destroy_srq`.
    DestroySrq {
        /// The SRQ.
        srq: Handle,
    },
    /// `ibv_modify_qp`.
    ModifyQp {
        /// The QP.
        qp: Handle,
        /// The attributes.
        attr: WireQpAttr,
        /// `IBV_QP_*` mask.
        mask: u32,
    },
    /// `ibv_query_qp`.
    QueryQp {
        /// The QP.
        qp: Handle,
    },
    /// `ibv_destroy_qp`.
    DestroyQp {
        /// The QP.
        qp: Handle,
    },
    /// `ibv_create_flow` on a raw packet QP.
    CreateFlow {
        /// The raw QP.
        qp: Handle,
        /// What its frames match.
        rule: crate::engine::raw::FlowRule,
    },
    /// `ibv_destroy_flow`.
    DestroyFlow {
        /// The flow.
        flow: Handle,
    },
    /// A call on device `device`'s connection manager: the service's one agent on the port,
    /// which every program shares. What comes back for this program's listeners and
    /// connections waits for it in the service, announced on its event ring
    /// ([`CM_WAITING`]), until it asks with [`Request::CmTakeEvents`].
    Cm {
        /// Which device.
        device: u32,
        /// What to do.
        call: CmCall,
    },
    /// The connection manager events waiting for this program, oldest first.
    CmTakeEvents,
}

/// A connection manager call ([`Request::Cm`]); a connection named must be the program's,
/// and a QP number it sends must be one of its QPs on the device.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CmCall {
    /// Take REQs and SIDR_REQs for a service ID.
    Listen(u64),
    /// Stop taking them.
    StopListening(u64),
    /// Send a REQ ([`Response::CmConn`]).
    Connect {
        /// Where to.
        peer: Peer,
        /// What it asks.
        params: ConnectParams,
    },
    /// Answer a request with a REP.
    Accept {
        /// The connection.
        conn: ConnId,
        /// The answer.
        params: AcceptParams,
    },
    /// Refuse a request (or a reply) with a REJ.
    Reject {
        /// The connection.
        conn: ConnId,
        /// IBTA table 109.
        reason: u16,
        /// Its private data.
        private_data: Vec<u8>,
    },
    /// Send the RTU.
    ReadyToUse {
        /// The connection.
        conn: ConnId,
        /// Its private data.
        private_data: Vec<u8>,
    },
    /// Send a DREQ (or end a connection not yet made).
    Disconnect {
        /// The connection.
        conn: ConnId,
        /// Its private data.
        private_data: Vec<u8>,
    },
    /// Send a SIDR_REQ ([`Response::CmConn`]).
    SidrRequest {
        /// Where to.
        peer: Peer,
        /// The UD service.
        service_id: u64,
        /// Its private data.
        private_data: Vec<u8>,
    },
    /// Answer a SIDR_REQ.
    SidrReply {
        /// The request.
        conn: ConnId,
        /// 0 valid; else IBTA table 121's reason.
        status: u8,
        /// The serving UD QP (the program's).
        qpn: u32,
        /// Its Q_Key.
        qkey: u32,
        /// Its private data.
        private_data: Vec<u8>,
    },
    /// How many connections the program holds here ([`Response::Count`]).
    Connections,
}

/// What the service answers, one per request, in order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Response {
    /// Done; nothing to report.
    Ok,
    /// Refused: an errno value and why.
    Error {
        /// `EINVAL`, `ENOMEM`, ...
        errno: i32,
        /// Words for a person.
        message: String,
    },
    /// To [`Request::Hello`]: the devices served. The datagram carries the service's doorbell
    /// (an eventfd the program writes when the service sleeps) and the program's control page
    /// (a region whose first word says whether the service sleeps).
    Welcome {
        /// The service's [`VERSION`].
        version: u32,
        /// Device names, index = device number.
        devices: Vec<String>,
    },
    /// To [`Request::QueryDevice`].
    Device(DeviceFacts),
    /// A new object.
    Created {
        /// Its handle.
        handle: Handle,
    },
    /// To [`Request::RegMr`].
    Mr {
        /// Its handle.
        handle: Handle,
        /// Local key.
        lkey: u32,
        /// Remote key.
        rkey: u32,
    },
    /// To [`Request::CreateCq`]: the datagram carries the ring's region.
    Cq {
        /// Its handle.
        handle: Handle,
        /// Slots in its completion ring (the CQ's depth).
        slots: u32,
    },
    /// To [`Request::CreateQp`]: the datagram carries the region with its two rings.
    Qp {
        /// Its handle.
        handle: Handle,
        /// Its QP number.
        qpn: u32,
        /// The capacities granted.
        caps: WireCaps,
        /// Slots of the send ring (at its start).
        sq_slots: u32,
        /// Slots of the receive ring (after the send ring).
        rq_slots: u32,
    },
    /// To [`Request::QueryQp`].
    QpAttr(WireQpAttr),
    /// To [`Request::CreateSrq`]: the datagram carries its ring's region.
    Srq {
        /// Its handle.
        handle: Handle,
        /// Slots of its receive ring.
        slots: u32,
    },
    /// To [`Request::QuerySrq`]: size, elements per receive, armed limit.
    SrqAttr(u32, u32, u32),
    /// To [`CmCall::Connect`] and [`CmCall::SidrRequest`]: the connection's ID.
    CmConn(ConnId),
    /// To [`Request::CmTakeEvents`]: `(device, event)` pairs, and whether more wait.
    CmEvents {
        /// The events, oldest first.
        events: Vec<(u32, CmEvent)>,
        /// More wait than one answer holds.
        more: bool,
    },
    /// A number.
    Count(u64),
    /// To [`Request::ModifySrq`], refused: a limit above the size (`(limit, size)`) or a
    /// size below the receives waiting (`(size, waiting)`).
    SrqRefused {
        /// True for a limit above the size.
        limit_too_high: bool,
        /// The value asked for.
        asked: u32,
        /// The size, or the receives waiting.
        bound: u64,
    },
}

/// Device and port facts, as `ibv_query_device` / `ibv_query_port` / `ibv_query_gid` give
/// them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceFacts {
    /// The device's name.
    pub name: String,
    /// Per port (port 1 first): MAC, GID 0, link up, active MTU code.
    pub ports: Vec<PortFacts>,
}

/// One port's facts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortFacts {
    /// MAC address.
    pub mac: [u8; 6],
    /// GID index 0.
    pub gid: [u8; 16],
    /// Link up.
    pub up: bool,
    /// Active MTU (`IBV_MTU_*` code).
    pub mtu: u8,
    /// The Ethernet MTU (IP and above).
    pub eth_mtu: u32,
}

/// RC, UC or UD.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum WireQpType {
    /// Reliable connection.
    Rc,
    /// Unreliable connection.
    Uc,
    /// Unreliable datagram.
    Ud,
    /// A raw packet QP (`IBV_QPT_RAW_PACKET`): whole Ethernet frames, received through flow
    /// rules ([`Request::CreateFlow`]). Only a program running as root may make one, as the
    /// kernel asks `CAP_NET_RAW` of it: its frames go out as it wrote them.
    Raw,
}

impl From<WireQpType> for QpType {
    /// A raw QP's is UD's (a datagram per frame), as its QP shares say.
    fn from(t: WireQpType) -> Self {
        match t {
            WireQpType::Rc => Self::Rc,
            WireQpType::Uc => Self::Uc,
            WireQpType::Ud | WireQpType::Raw => Self::Ud,
        }
    }
}

impl From<QpType> for WireQpType {
    fn from(t: QpType) -> Self {
        match t {
            QpType::Rc => Self::Rc,
            QpType::Uc => Self::Uc,
            QpType::Ud => Self::Ud,
        }
    }
}

/// `ibv_qp_cap`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireCaps {
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
    /// Every send WR completes.
    pub sq_sig_all: bool,
}

impl From<WireCaps> for QpCaps {
    fn from(c: WireCaps) -> Self {
        Self {
            max_send_wr: c.max_send_wr,
            max_recv_wr: c.max_recv_wr,
            max_send_sge: c.max_send_sge,
            max_recv_sge: c.max_recv_sge,
            max_inline_data: c.max_inline_data,
            sq_sig_all: c.sq_sig_all,
        }
    }
}

impl From<QpCaps> for WireCaps {
    fn from(c: QpCaps) -> Self {
        Self {
            max_send_wr: c.max_send_wr,
            max_recv_wr: c.max_recv_wr,
            max_send_sge: c.max_send_sge,
            max_recv_sge: c.max_recv_sge,
            max_inline_data: c.max_inline_data,
            sq_sig_all: c.sq_sig_all,
        }
    }
}

/// An address vector: GIDs as 16 bytes, the rest as `ibv_ah_attr` has it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireAv {
    /// Our MAC (the service fills it from the port when zero).
    pub smac: [u8; 6],
    /// Next hop's MAC.
    pub dmac: [u8; 6],
    /// 802.1Q tag: PCP, DEI, VID.
    pub vlan: Option<(u8, bool, u16)>,
    /// Source GID.
    pub sgid: [u8; 16],
    /// Destination GID.
    pub dgid: [u8; 16],
    /// Traffic class.
    pub traffic_class: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Flow label.
    pub flow_label: u32,
    /// UDP source port.
    pub udp_src_port: Option<u16>,
}

/// The IP address a 16-byte GID names (IPv4-mapped for IPv4).
pub fn gid_ip(g: [u8; 16]) -> IpAddr {
    let v6 = std::net::Ipv6Addr::from(g);
    match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    }
}

/// The GID of an IP address.
pub fn ip_gid(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

impl From<WireAv> for AddressVector {
    fn from(a: WireAv) -> Self {
        Self {
            smac: MacAddr(a.smac),
            dmac: MacAddr(a.dmac),
            vlan: a.vlan.map(|(pcp, dei, vid)| VlanTag {
                pcp: pcp & 7,
                dei,
                vid: vid & 0xfff,
            }),
            src: gid_ip(a.sgid),
            dst: gid_ip(a.dgid),
            traffic_class: a.traffic_class,
            hop_limit: a.hop_limit,
            flow_label: a.flow_label,
            udp_src_port: a.udp_src_port,
        }
    }
}

impl From<AddressVector> for WireAv {
    fn from(a: AddressVector) -> Self {
        Self {
            smac: a.smac.0,
            dmac: a.dmac.0,
            vlan: a.vlan.map(|v| (v.pcp, v.dei, v.vid)),
            sgid: ip_gid(a.src),
            dgid: ip_gid(a.dst),
            traffic_class: a.traffic_class,
            hop_limit: a.hop_limit,
            flow_label: a.flow_label,
            udp_src_port: a.udp_src_port,
        }
    }
}

/// `ibv_qp_attr`, the fields ferroce uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireQpAttr {
    /// State, as its index in [`QpState::ALL`].
    pub qp_state: u8,
    /// `IBV_ACCESS_*` the responder allows.
    pub qp_access_flags: u32,
    /// P_Key index.
    pub pkey_index: u16,
    /// Port.
    pub port_num: u8,
    /// Q_Key.
    pub qkey: u32,
    /// The path.
    pub ah_attr: WireAv,
    /// `IBV_MTU_*` code.
    pub path_mtu: u8,
    /// ACK timeout exponent.
    pub timeout: u8,
    /// Transport retries.
    pub retry_cnt: u8,
    /// RNR retries.
    pub rnr_retry: u8,
    /// First expected receive PSN.
    pub rq_psn: u32,
    /// Outstanding READ/atomic as requester.
    pub max_rd_atomic: u8,
    /// RNR NAK timer code.
    pub min_rnr_timer: u8,
    /// First send PSN.
    pub sq_psn: u32,
    /// Outstanding READ/atomic as responder.
    pub max_dest_rd_atomic: u8,
    /// Peer QP.
    pub dest_qp_num: u32,
}

/// Why a [`WireQpAttr`] does not make a [`QpAttr`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AttrError {
    /// A state code past the seven states.
    #[error("no QP state has code {0}")]
    State(u8),
    /// An MTU code other than 1..=5.
    #[error("no path MTU has code {0}")]
    Mtu(u8),
}

impl TryFrom<WireQpAttr> for QpAttr {
    type Error = AttrError;
    fn try_from(a: WireQpAttr) -> Result<Self, AttrError> {
        let qp_state = *QpState::ALL
            .get(usize::from(a.qp_state))
            .ok_or(AttrError::State(a.qp_state))?;
        let path_mtu = match a.path_mtu {
            c @ 1..=5 => Mtu::from_bytes(128 << c).ok_or(AttrError::Mtu(c))?,
            c => return Err(AttrError::Mtu(c)),
        };
        Ok(Self {
            qp_state,
            qp_access_flags: Access(a.qp_access_flags),
            pkey_index: a.pkey_index,
            port_num: a.port_num,
            qkey: a.qkey,
            ah_attr: a.ah_attr.into(),
            path_mtu,
            timeout: a.timeout,
            retry_cnt: a.retry_cnt,
            rnr_retry: a.rnr_retry,
            rq_psn: Psn::new(a.rq_psn),
            max_rd_atomic: a.max_rd_atomic,
            min_rnr_timer: a.min_rnr_timer,
            sq_psn: Psn::new(a.sq_psn),
            max_dest_rd_atomic: a.max_dest_rd_atomic,
            dest_qp_num: Qpn::new(a.dest_qp_num),
        })
    }
}

impl From<QpAttr> for WireQpAttr {
    fn from(a: QpAttr) -> Self {
        Self {
            qp_state: QpState::ALL
                .iter()
                .position(|&x| x == a.qp_state)
                .unwrap_or(0) as u8,
            qp_access_flags: a.qp_access_flags.0,
            pkey_index: a.pkey_index,
            port_num: a.port_num,
            qkey: a.qkey,
            ah_attr: a.ah_attr.into(),
            path_mtu: a.path_mtu as u8,
            timeout: a.timeout,
            retry_cnt: a.retry_cnt,
            rnr_retry: a.rnr_retry,
            rq_psn: a.rq_psn.value(),
            max_rd_atomic: a.max_rd_atomic,
            min_rnr_timer: a.min_rnr_timer,
            sq_psn: a.sq_psn.value(),
            max_dest_rd_atomic: a.max_dest_rd_atomic,
            dest_qp_num: a.dest_qp_num.value(),
        }
    }
}

/// The mask as the transport reads it.
pub fn mask(bits: u32) -> AttrMask {
    AttrMask(bits)
}

/// Where a CQ's notification words sit in its region, after a ring of `slots` slots: the
/// program stores 1 (any completion) or 2 (solicited only) at `armed` to arm it; the service
/// swaps it to 0 when it fires and adds one to `fired`, then writes the channel's eventfd.
pub const fn cq_words(slots: u32) -> (usize, usize) {
    let at =
        ferroce_drivers::shm::RingLayout::bytes::<{ super::slots::W }>(slots).next_multiple_of(64);
    (at, at + 64)
}

/// A CQ region's size.
pub const fn cq_region(slots: u32) -> usize {
    cq_words(slots).1 + 64
}

/// Where a QP's word "receives retired" sits in its region, after its send ring of
/// `sq_slots` and its receive ring of `rq_slots`: the service stores there how many of the
/// QP's receives it has completed into the program's CQ (successful or not), so the program
/// knows how many are outstanding and refuses a receive past `max_recv_wr` at post time, as
/// the QP itself would.
pub const fn qp_words(sq_slots: u32, rq_slots: u32) -> usize {
    use ferroce_drivers::shm::RingLayout;
    RingLayout::bytes::<{ super::slots::W }>(sq_slots).next_multiple_of(64)
        + RingLayout::bytes::<{ super::slots::W }>(rq_slots).next_multiple_of(64)
}

/// A QP region's size.
pub const fn qp_region(sq_slots: u32, rq_slots: u32) -> usize {
    qp_words(sq_slots, rq_slots) + 64
}

/// Byte offset of the sleeping flag in a program's control page.
pub const SLEEPING: usize = 0;
/// Size of a program's control page.
pub const PAGE: usize = 4096;

/// Where a program's asynchronous events wait in its control page: a ring of two-word
/// entries (`[kind | device << 8 | port << 16, value]`, see [`event_words`]) written by the
/// service.
pub const EVENTS: ferroce_drivers::shm::RingLayout = ferroce_drivers::shm::RingLayout {
    offset: 64,
    cap: 64,
};

/// An asynchronous event as two ring words, for device `device`: `None` for one that does
/// not go through the ring (a CQ's or an SRQ's: those objects are the program's own).
pub fn event_words(device: u32, e: crate::AsyncEvent) -> Option<[u64; 2]> {
    use crate::AsyncEvent as E;
    let (kind, port, value) = match e {
        E::PortActive(p) => (1u64, p, 0u32),
        E::PortError(p) => (2, p, 0),
        E::QpFatal(q) => (3, 0, q.value()),
        E::QpRequestError(q) => (4, 0, q.value()),
        E::QpAccessError(q) => (5, 0, q.value()),
        E::QpLastWqeReached(q) => (6, 0, q.value()),
        E::PathMigrated(q) => (7, 0, q.value()),
        _ => return None,
    };
    Some([
        kind | u64::from(device & 0xff) << 8 | u64::from(port) << 16,
        u64::from(value),
    ])
}

/// The event two ring words carry, and its device: `None` for words no event has.
pub fn words_event(w: [u64; 2]) -> Option<(u32, crate::AsyncEvent)> {
    use crate::AsyncEvent as E;
    let qpn = ferroce_stack::wire::Qpn::new(w[1] as u32);
    let port = (w[0] >> 16) as u8;
    let e = match w[0] & 0xff {
        1 => E::PortActive(port),
        2 => E::PortError(port),
        3 => E::QpFatal(qpn),
        4 => E::QpRequestError(qpn),
        5 => E::QpAccessError(qpn),
        6 => E::QpLastWqeReached(qpn),
        7 => E::PathMigrated(qpn),
        _ => return None,
    };
    Some((((w[0] >> 8) & 0xff) as u32, e))
}

/// The event ring's entry that says connection manager events wait for the program
/// ([`Request::CmTakeEvents`]). The service writes one until the program has asked, so the
/// ring never fills with them.
pub const CM_WAITING: [u64; 2] = [8, 0];

/// Encodes a message for one datagram.
pub fn encode<T: Serialize>(msg: &T) -> Vec<u8> {
    postcard::to_allocvec(msg).unwrap_or_default()
}

/// Decodes one datagram: any bytes give a message or `None`.
pub fn decode<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Option<T> {
    postcard::from_bytes(bytes).ok()
}
