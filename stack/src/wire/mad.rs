//! Communication management datagrams (IBTA Vol 1 chapter 12, and the MAD header of chapter
//! 13.4): the REQ, MRA, REJ, REP, RTU, DREQ, DREP, SIDR_REQ and SIDR_REP messages a
//! connection manager exchanges on QP1, each a 256-byte MAD in one UD SEND with the GSI Q_Key,
//! and the rdma_cm IP addressing header Linux's rdma_cm puts at the start of a REQ's (or
//! SIDR_REQ's) private data.
//!
//! Offsets are the spec's, from the start of the message's data (after the 24-byte MAD
//! header); a field narrower than its byte or word sits in its high bits, as chapter 12's
//! tables draw them. [`CmMad::parse`] reads any 256 bytes without panicking; what it cannot
//! take is a [`MadError`]. [`CmMad::emit`] writes a whole MAD, reserved bits zero.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Bytes of a MAD (and of the UD SEND that carries it).
pub const MAD_LEN: usize = 256;
/// Bytes of the common MAD header.
pub const MAD_HEADER_LEN: usize = 24;
/// Bytes of a CM message's data.
pub const CM_DATA_LEN: usize = MAD_LEN - MAD_HEADER_LEN;
/// The Q_Key of the general services interface (QP1): IBTA's well-known GSI Q_Key.
pub const GSI_QKEY: u32 = 0x8001_0000;
/// The QP number of the general services interface.
pub const GSI_QPN: u32 = 1;
/// `BaseVersion` of every MAD.
pub const BASE_VERSION: u8 = 1;
/// The communication management class.
pub const CM_CLASS: u8 = 0x07;
/// Its class version (IBTA 1.2 and later).
pub const CM_CLASS_VERSION: u8 = 2;
/// `Send`, the one method CM messages use.
pub const METHOD_SEND: u8 = 0x03;

/// Attribute IDs of the CM class.
pub mod attr {
    /// ClassPortInfo.
    pub const CLASS_PORT_INFO: u16 = 0x0001;
    /// Request for communication.
    pub const REQ: u16 = 0x0010;
    /// Message receipt acknowledgement.
    pub const MRA: u16 = 0x0011;
    /// Reject.
    pub const REJ: u16 = 0x0012;
    /// Reply to a request.
    pub const REP: u16 = 0x0013;
    /// Ready to use.
    pub const RTU: u16 = 0x0014;
    /// Disconnection request.
    pub const DREQ: u16 = 0x0015;
    /// Disconnection reply.
    pub const DREP: u16 = 0x0016;
    /// Service ID resolution request.
    pub const SIDR_REQ: u16 = 0x0017;
    /// Service ID resolution reply.
    pub const SIDR_REP: u16 = 0x0018;
    /// Load alternate path.
    pub const LAP: u16 = 0x0019;
    /// Alternate path response.
    pub const APR: u16 = 0x001a;
}

/// The private data each message carries, in bytes (the rest of its 232).
pub mod private_len {
    /// REQ.
    pub const REQ: usize = 92;
    /// MRA.
    pub const MRA: usize = 222;
    /// REJ.
    pub const REJ: usize = 148;
    /// REP.
    pub const REP: usize = 196;
    /// RTU.
    pub const RTU: usize = 224;
    /// DREQ.
    pub const DREQ: usize = 220;
    /// DREP.
    pub const DREP: usize = 224;
    /// SIDR_REQ.
    pub const SIDR_REQ: usize = 216;
    /// SIDR_REP.
    pub const SIDR_REP: usize = 136;
}

/// Why bytes are not a CM MAD this module reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MadError {
    /// Fewer than 256 bytes.
    #[error("a MAD is {MAD_LEN} bytes, got {0}")]
    Length(usize),
    /// A base version other than 1.
    #[error("MAD base version {0}, expected 1")]
    BaseVersion(u8),
    /// Another management class (SA, PMA, ...): not the CM's.
    #[error("management class {0:#04x} is not communication management")]
    Class(u8),
    /// A CM class version other than 2.
    #[error("CM class version {0}, expected 2")]
    ClassVersion(u8),
    /// A method other than Send.
    #[error("CM method {0:#04x}, expected Send")]
    Method(u8),
    /// An attribute this module does not read (ClassPortInfo, LAP, APR, or none of the CM's).
    #[error("CM attribute {0:#06x} is not handled")]
    Attribute(u16),
    /// Private data longer than the message holds (on emit).
    #[error("{got} bytes of private data, the message holds {max}")]
    PrivateData {
        /// Bytes given.
        got: usize,
        /// Bytes the message carries.
        max: usize,
    },
    /// A REJ's or SIDR_REP's additional information longer than its 72 bytes.
    #[error("{0} bytes of additional information, 72 fit")]
    Info(usize),
    /// An rdma_cm header with a version other than 0, or an IP version other than 4 or 6.
    #[error("rdma_cm header version {cma:#04x}, IP version {ip}")]
    CmaHeader {
        /// The header's version byte.
        cma: u8,
        /// The IP version nibble.
        ip: u8,
    },
}

/// The common MAD header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MadHeader {
    /// `BaseVersion` (1).
    pub base_version: u8,
    /// `MgmtClass` (0x07 for the CM).
    pub mgmt_class: u8,
    /// `ClassVersion` (2).
    pub class_version: u8,
    /// `R` and `Method` (0x03, Send).
    pub method: u8,
    /// `Status`.
    pub status: u16,
    /// `ClassSpecific`.
    pub class_specific: u16,
    /// `TransactionID`: what ties a reply to the request it answers.
    pub tid: u64,
    /// `AttributeID`: the message.
    pub attr_id: u16,
    /// `AttributeModifier`.
    pub attr_mod: u32,
}

impl MadHeader {
    /// The header of a CM message `attr_id` in transaction `tid`.
    pub const fn cm(attr_id: u16, tid: u64) -> Self {
        Self {
            base_version: BASE_VERSION,
            mgmt_class: CM_CLASS,
            class_version: CM_CLASS_VERSION,
            method: METHOD_SEND,
            status: 0,
            class_specific: 0,
            tid,
            attr_id,
            attr_mod: 0,
        }
    }

    fn parse(b: &[u8; MAD_LEN]) -> Self {
        Self {
            base_version: b[0],
            mgmt_class: b[1],
            class_version: b[2],
            method: b[3],
            status: be16(&b[4..]),
            class_specific: be16(&b[6..]),
            tid: be64(&b[8..]),
            attr_id: be16(&b[16..]),
            attr_mod: be32(&b[20..]),
        }
    }

    fn emit(&self, b: &mut [u8; MAD_LEN]) {
        b[0] = self.base_version;
        b[1] = self.mgmt_class;
        b[2] = self.class_version;
        b[3] = self.method;
        b[4..6].copy_from_slice(&self.status.to_be_bytes());
        b[6..8].copy_from_slice(&self.class_specific.to_be_bytes());
        b[8..16].copy_from_slice(&self.tid.to_be_bytes());
        b[16..18].copy_from_slice(&self.attr_id.to_be_bytes());
        b[18..20].fill(0);
        b[20..24].copy_from_slice(&self.attr_mod.to_be_bytes());
    }
}

fn be16(b: &[u8]) -> u16 {
    u16::from_be_bytes([b[0], b[1]])
}
fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}
fn be64(b: &[u8]) -> u64 {
    u64::from_be_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]])
}
fn be24(b: &[u8]) -> u32 {
    u32::from(b[0]) << 16 | u32::from(b[1]) << 8 | u32::from(b[2])
}
fn put24(b: &mut [u8], v: u32) {
    b[..3].copy_from_slice(&v.to_be_bytes()[1..]);
}
/// Bits `at..at + width` of byte `b`, counted from its most significant bit.
const fn bits(b: u8, at: u32, width: u32) -> u8 {
    (b >> (8 - at - width)) & ((1u16 << width) - 1) as u8
}
/// `v` placed at bits `at..at + width` of a byte (most significant first).
const fn place(v: u8, at: u32, width: u32) -> u8 {
    (v & ((1u16 << width) - 1) as u8) << (8 - at - width)
}

/// A path as a REQ describes it (primary or alternate; 44 bytes, IBTA table 106).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct CmPath {
    /// The sender's port LID (RoCE: the permissive LID, 0xffff, as Linux sends).
    pub local_lid: u16,
    /// The receiver's port LID.
    pub remote_lid: u16,
    /// The sender's GID.
    pub local_gid: [u8; 16],
    /// The receiver's GID.
    pub remote_gid: [u8; 16],
    /// GRH flow label (20 bits).
    pub flow_label: u32,
    /// Static rate (6 bits).
    pub packet_rate: u8,
    /// GRH traffic class.
    pub traffic_class: u8,
    /// GRH hop limit.
    pub hop_limit: u8,
    /// Service level (4 bits).
    pub sl: u8,
    /// The path stays in the subnet.
    pub subnet_local: bool,
    /// Local ACK timeout (5 bits; 4.096 µs × 2^n).
    pub local_ack_timeout: u8,
}

/// Bytes of a [`CmPath`].
const PATH_LEN: usize = 44;

impl CmPath {
    fn parse(b: &[u8]) -> Self {
        let mut local_gid = [0u8; 16];
        let mut remote_gid = [0u8; 16];
        local_gid.copy_from_slice(&b[4..20]);
        remote_gid.copy_from_slice(&b[20..36]);
        Self {
            local_lid: be16(b),
            remote_lid: be16(&b[2..]),
            local_gid,
            remote_gid,
            flow_label: be32(&b[36..]) >> 12,
            packet_rate: bits(b[39], 2, 6),
            traffic_class: b[40],
            hop_limit: b[41],
            sl: bits(b[42], 0, 4),
            subnet_local: bits(b[42], 4, 1) != 0,
            local_ack_timeout: bits(b[43], 0, 5),
        }
    }

    fn emit(&self, b: &mut [u8]) {
        b[..2].copy_from_slice(&self.local_lid.to_be_bytes());
        b[2..4].copy_from_slice(&self.remote_lid.to_be_bytes());
        b[4..20].copy_from_slice(&self.local_gid);
        b[20..36].copy_from_slice(&self.remote_gid);
        b[36..40].copy_from_slice(&((self.flow_label & 0xf_ffff) << 12).to_be_bytes());
        b[39] |= place(self.packet_rate, 2, 6);
        b[40] = self.traffic_class;
        b[41] = self.hop_limit;
        b[42] = place(self.sl, 0, 4) | place(u8::from(self.subnet_local), 4, 1);
        b[43] = place(self.local_ack_timeout, 0, 5);
    }

    /// True for an all-zero path (a REQ without an alternate).
    pub fn is_absent(&self) -> bool {
        *self == Self::default()
    }
}

/// REQ: a request for communication (IBTA table 106).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Req<'a> {
    /// The sender's communication ID for this connection.
    pub local_comm_id: u32,
    /// Vendor ID (24 bits).
    pub vendor_id: u32,
    /// The service the request is for (rdma_cm: port space and port).
    pub service_id: u64,
    /// The sender's CA GUID.
    pub local_ca_guid: u64,
    /// The sender's Q_Key (UD, RD).
    pub local_qkey: u32,
    /// The sender's QP number.
    pub local_qpn: u32,
    /// RDMA READs and atomics the sender takes at once (its `max_dest_rd_atomic`).
    pub responder_resources: u8,
    /// Local EE context (RD; 0).
    pub local_eecn: u32,
    /// RDMA READs and atomics the sender issues at once (its `max_rd_atomic`).
    pub initiator_depth: u8,
    /// Remote EE context (RD; 0).
    pub remote_eecn: u32,
    /// How long the receiver may take to answer (5 bits; 4.096 µs × 2^n).
    pub remote_cm_response_timeout: u8,
    /// Transport service: 0 RC, 1 UC, 2 RD (2 bits).
    pub transport_service_type: u8,
    /// End-to-end flow control.
    pub end_to_end_flow_control: bool,
    /// The sender's first PSN (24 bits).
    pub starting_psn: u32,
    /// How long the sender takes to answer (5 bits).
    pub local_cm_response_timeout: u8,
    /// Transport retry count (3 bits).
    pub retry_count: u8,
    /// P_Key.
    pub pkey: u16,
    /// Path MTU (`enum ibv_mtu` values, 4 bits).
    pub path_mtu: u8,
    /// RD: an RDC exists.
    pub rdc_exists: bool,
    /// RNR retry count (3 bits).
    pub rnr_retry_count: u8,
    /// CM retries the sender makes (4 bits).
    pub max_cm_retries: u8,
    /// The sender's QP uses an SRQ.
    pub srq: bool,
    /// Extended transport type (3 bits; XRC 1).
    pub extended_transport_type: u8,
    /// The primary path.
    pub primary: CmPath,
    /// The alternate path (all zero: none).
    pub alternate: CmPath,
    /// Alternate path supported.
    pub sap_supported: bool,
    /// Private data (92 bytes when parsed; up to that when emitted).
    pub private_data: &'a [u8],
}

/// MRA: the receiver needs more time (IBTA table 107).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mra<'a> {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The receiver's.
    pub remote_comm_id: u32,
    /// The message acknowledged: 0 REQ, 1 REP, 2 LAP (2 bits).
    pub message_mraed: u8,
    /// The time the sender needs (5 bits; 4.096 µs × 2^n).
    pub service_timeout: u8,
    /// Private data.
    pub private_data: &'a [u8],
}

/// REJ: a request or reply refused (IBTA table 108).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rej<'a> {
    /// The sender's communication ID (0 if it made none).
    pub local_comm_id: u32,
    /// The receiver's.
    pub remote_comm_id: u32,
    /// The message rejected: 0 REQ, 1 REP, 2 none (a timeout) (2 bits).
    pub message_rejected: u8,
    /// The reason (IBTA table 109: 8 invalid service ID, 28 consumer reject, ...).
    pub reason: u16,
    /// Additional rejection information (up to 72 bytes; its length is the length field).
    pub ari: &'a [u8],
    /// Private data.
    pub private_data: &'a [u8],
}

/// REP: the reply to a REQ (IBTA table 110).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rep<'a> {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The receiver's (the REQ's local one).
    pub remote_comm_id: u32,
    /// The sender's Q_Key.
    pub local_qkey: u32,
    /// The sender's QP number.
    pub local_qpn: u32,
    /// Vendor ID (24 bits, spread over three bytes).
    pub vendor_id: u32,
    /// Local EE context.
    pub local_eecn: u32,
    /// The sender's first PSN.
    pub starting_psn: u32,
    /// RDMA READs and atomics the sender takes at once.
    pub responder_resources: u8,
    /// RDMA READs and atomics the sender issues at once.
    pub initiator_depth: u8,
    /// Target ACK delay (5 bits).
    pub target_ack_delay: u8,
    /// Failover accepted (2 bits: 0 accepted).
    pub failover_accepted: u8,
    /// End-to-end flow control.
    pub end_to_end_flow_control: bool,
    /// RNR retry count (3 bits).
    pub rnr_retry_count: u8,
    /// The sender's QP uses an SRQ.
    pub srq: bool,
    /// The sender's CA GUID.
    pub local_ca_guid: u64,
    /// Private data.
    pub private_data: &'a [u8],
}

/// RTU, DREP: a message that is its two communication IDs and private data (tables 111,
/// 113).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ids<'a> {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The receiver's.
    pub remote_comm_id: u32,
    /// Private data.
    pub private_data: &'a [u8],
}

/// DREQ: a disconnection request (IBTA table 112).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dreq<'a> {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The receiver's.
    pub remote_comm_id: u32,
    /// The receiver's QP number.
    pub remote_qpn: u32,
    /// Private data.
    pub private_data: &'a [u8],
}

/// SIDR_REQ: which UD QP serves a service ID (IBTA table 119).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SidrReq<'a> {
    /// The request's ID.
    pub request_id: u32,
    /// P_Key.
    pub pkey: u16,
    /// The service.
    pub service_id: u64,
    /// Private data.
    pub private_data: &'a [u8],
}

/// SIDR_REP: the answer (IBTA table 120).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SidrRep<'a> {
    /// The request's ID.
    pub request_id: u32,
    /// 0 valid, 1 service ID not supported, 2 rejected, 3 no QP, 4 redirect, 5 version.
    pub status: u8,
    /// Vendor ID (24 bits).
    pub vendor_id: u32,
    /// The QP that serves the service.
    pub qpn: u32,
    /// The service.
    pub service_id: u64,
    /// The QP's Q_Key.
    pub qkey: u32,
    /// Additional information (up to 72 bytes).
    pub info: &'a [u8],
    /// Private data.
    pub private_data: &'a [u8],
}

/// A CM message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CmMessage<'a> {
    /// REQ.
    Req(Req<'a>),
    /// MRA.
    Mra(Mra<'a>),
    /// REJ.
    Rej(Rej<'a>),
    /// REP.
    Rep(Rep<'a>),
    /// RTU.
    Rtu(Ids<'a>),
    /// DREQ.
    Dreq(Dreq<'a>),
    /// DREP.
    Drep(Ids<'a>),
    /// SIDR_REQ.
    SidrReq(SidrReq<'a>),
    /// SIDR_REP.
    SidrRep(SidrRep<'a>),
}

impl CmMessage<'_> {
    /// Its attribute ID.
    pub const fn attr_id(&self) -> u16 {
        match self {
            Self::Req(_) => attr::REQ,
            Self::Mra(_) => attr::MRA,
            Self::Rej(_) => attr::REJ,
            Self::Rep(_) => attr::REP,
            Self::Rtu(_) => attr::RTU,
            Self::Dreq(_) => attr::DREQ,
            Self::Drep(_) => attr::DREP,
            Self::SidrReq(_) => attr::SIDR_REQ,
            Self::SidrRep(_) => attr::SIDR_REP,
        }
    }

    /// Its name, as the spec writes it.
    pub const fn name(&self) -> &'static str {
        match self {
            Self::Req(_) => "REQ",
            Self::Mra(_) => "MRA",
            Self::Rej(_) => "REJ",
            Self::Rep(_) => "REP",
            Self::Rtu(_) => "RTU",
            Self::Dreq(_) => "DREQ",
            Self::Drep(_) => "DREP",
            Self::SidrReq(_) => "SIDR_REQ",
            Self::SidrRep(_) => "SIDR_REP",
        }
    }
}

/// A CM MAD: the header and the message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CmMad<'a> {
    /// The MAD header.
    pub header: MadHeader,
    /// The message.
    pub msg: CmMessage<'a>,
}

impl<'a> CmMad<'a> {
    /// A CM message in transaction `tid`, with the standard header.
    pub const fn new(tid: u64, msg: CmMessage<'a>) -> Self {
        Self {
            header: MadHeader::cm(msg.attr_id(), tid),
            msg,
        }
    }

    /// Reads a CM MAD from the first 256 bytes of a UD SEND's payload.
    pub fn parse(bytes: &'a [u8]) -> Result<Self, MadError> {
        let b: &'a [u8; MAD_LEN] = bytes
            .get(..MAD_LEN)
            .and_then(|b| b.try_into().ok())
            .ok_or(MadError::Length(bytes.len()))?;
        let header = MadHeader::parse(b);
        if header.base_version != BASE_VERSION {
            return Err(MadError::BaseVersion(header.base_version));
        }
        if header.mgmt_class != CM_CLASS {
            return Err(MadError::Class(header.mgmt_class));
        }
        if header.class_version != CM_CLASS_VERSION {
            return Err(MadError::ClassVersion(header.class_version));
        }
        if header.method != METHOD_SEND {
            return Err(MadError::Method(header.method));
        }
        let d = &b[MAD_HEADER_LEN..];
        let ids = |pd: usize| Ids {
            local_comm_id: be32(d),
            remote_comm_id: be32(&d[4..]),
            private_data: &d[pd..],
        };
        let msg = match header.attr_id {
            attr::REQ => CmMessage::Req(Req {
                local_comm_id: be32(d),
                vendor_id: be24(&d[5..]),
                service_id: be64(&d[8..]),
                local_ca_guid: be64(&d[16..]),
                local_qkey: be32(&d[28..]),
                local_qpn: be24(&d[32..]),
                responder_resources: d[35],
                local_eecn: be24(&d[36..]),
                initiator_depth: d[39],
                remote_eecn: be24(&d[40..]),
                remote_cm_response_timeout: bits(d[43], 0, 5),
                transport_service_type: bits(d[43], 5, 2),
                end_to_end_flow_control: bits(d[43], 7, 1) != 0,
                starting_psn: be24(&d[44..]),
                local_cm_response_timeout: bits(d[47], 0, 5),
                retry_count: bits(d[47], 5, 3),
                pkey: be16(&d[48..]),
                path_mtu: bits(d[50], 0, 4),
                rdc_exists: bits(d[50], 4, 1) != 0,
                rnr_retry_count: bits(d[50], 5, 3),
                max_cm_retries: bits(d[51], 0, 4),
                srq: bits(d[51], 4, 1) != 0,
                extended_transport_type: bits(d[51], 5, 3),
                primary: CmPath::parse(&d[52..96]),
                alternate: CmPath::parse(&d[96..140]),
                sap_supported: bits(d[139], 5, 1) != 0,
                private_data: &d[140..],
            }),
            attr::MRA => CmMessage::Mra(Mra {
                local_comm_id: be32(d),
                remote_comm_id: be32(&d[4..]),
                message_mraed: bits(d[8], 0, 2),
                service_timeout: bits(d[9], 0, 5),
                private_data: &d[10..],
            }),
            attr::REJ => {
                let info = usize::from(bits(d[9], 0, 7)).min(72);
                CmMessage::Rej(Rej {
                    local_comm_id: be32(d),
                    remote_comm_id: be32(&d[4..]),
                    message_rejected: bits(d[8], 0, 2),
                    reason: be16(&d[10..]),
                    ari: &d[12..12 + info],
                    private_data: &d[84..],
                })
            }
            attr::REP => CmMessage::Rep(Rep {
                local_comm_id: be32(d),
                remote_comm_id: be32(&d[4..]),
                local_qkey: be32(&d[8..]),
                local_qpn: be24(&d[12..]),
                vendor_id: u32::from(d[15]) << 16 | u32::from(d[19]) << 8 | u32::from(d[23]),
                local_eecn: be24(&d[16..]),
                starting_psn: be24(&d[20..]),
                responder_resources: d[24],
                initiator_depth: d[25],
                target_ack_delay: bits(d[26], 0, 5),
                failover_accepted: bits(d[26], 5, 2),
                end_to_end_flow_control: bits(d[26], 7, 1) != 0,
                rnr_retry_count: bits(d[27], 0, 3),
                srq: bits(d[27], 3, 1) != 0,
                local_ca_guid: be64(&d[28..]),
                private_data: &d[36..],
            }),
            attr::RTU => CmMessage::Rtu(ids(8)),
            attr::DREQ => CmMessage::Dreq(Dreq {
                local_comm_id: be32(d),
                remote_comm_id: be32(&d[4..]),
                remote_qpn: be24(&d[8..]),
                private_data: &d[12..],
            }),
            attr::DREP => CmMessage::Drep(ids(8)),
            attr::SIDR_REQ => CmMessage::SidrReq(SidrReq {
                request_id: be32(d),
                pkey: be16(&d[4..]),
                service_id: be64(&d[8..]),
                private_data: &d[16..],
            }),
            attr::SIDR_REP => {
                let info = usize::from(d[5]).min(72);
                CmMessage::SidrRep(SidrRep {
                    request_id: be32(d),
                    status: d[4],
                    vendor_id: u32::from(be16(&d[6..])) << 8 | u32::from(d[11]),
                    qpn: be24(&d[8..]),
                    service_id: be64(&d[12..]),
                    qkey: be32(&d[20..]),
                    info: &d[24..24 + info],
                    private_data: &d[96..],
                })
            }
            other => return Err(MadError::Attribute(other)),
        };
        Ok(Self { header, msg })
    }

    /// Writes the whole MAD into `out`; reserved bits and unused private data are zero.
    pub fn emit(&self, out: &mut [u8; MAD_LEN]) -> Result<(), MadError> {
        out.fill(0);
        let mut header = self.header;
        header.attr_id = self.msg.attr_id();
        header.emit(out);
        let d = &mut out[MAD_HEADER_LEN..];
        let private = |d: &mut [u8], at: usize, pd: &[u8]| {
            let max = CM_DATA_LEN - at;
            if pd.len() > max {
                return Err(MadError::PrivateData { got: pd.len(), max });
            }
            d[at..at + pd.len()].copy_from_slice(pd);
            Ok(())
        };
        let ids = |d: &mut [u8], local: u32, remote: u32| {
            d[..4].copy_from_slice(&local.to_be_bytes());
            d[4..8].copy_from_slice(&remote.to_be_bytes());
        };
        match &self.msg {
            CmMessage::Req(r) => {
                d[..4].copy_from_slice(&r.local_comm_id.to_be_bytes());
                put24(&mut d[5..], r.vendor_id);
                d[8..16].copy_from_slice(&r.service_id.to_be_bytes());
                d[16..24].copy_from_slice(&r.local_ca_guid.to_be_bytes());
                d[28..32].copy_from_slice(&r.local_qkey.to_be_bytes());
                put24(&mut d[32..], r.local_qpn);
                d[35] = r.responder_resources;
                put24(&mut d[36..], r.local_eecn);
                d[39] = r.initiator_depth;
                put24(&mut d[40..], r.remote_eecn);
                d[43] = place(r.remote_cm_response_timeout, 0, 5)
                    | place(r.transport_service_type, 5, 2)
                    | place(u8::from(r.end_to_end_flow_control), 7, 1);
                put24(&mut d[44..], r.starting_psn);
                d[47] = place(r.local_cm_response_timeout, 0, 5) | place(r.retry_count, 5, 3);
                d[48..50].copy_from_slice(&r.pkey.to_be_bytes());
                d[50] = place(r.path_mtu, 0, 4)
                    | place(u8::from(r.rdc_exists), 4, 1)
                    | place(r.rnr_retry_count, 5, 3);
                d[51] = place(r.max_cm_retries, 0, 4)
                    | place(u8::from(r.srq), 4, 1)
                    | place(r.extended_transport_type, 5, 3);
                r.primary.emit(&mut d[52..52 + PATH_LEN]);
                r.alternate.emit(&mut d[96..96 + PATH_LEN]);
                d[139] |= place(u8::from(r.sap_supported), 5, 1);
                private(d, 140, r.private_data)?;
            }
            CmMessage::Mra(m) => {
                ids(d, m.local_comm_id, m.remote_comm_id);
                d[8] = place(m.message_mraed, 0, 2);
                d[9] = place(m.service_timeout, 0, 5);
                private(d, 10, m.private_data)?;
            }
            CmMessage::Rej(r) => {
                if r.ari.len() > 72 {
                    return Err(MadError::Info(r.ari.len()));
                }
                ids(d, r.local_comm_id, r.remote_comm_id);
                d[8] = place(r.message_rejected, 0, 2);
                d[9] = place(r.ari.len() as u8, 0, 7);
                d[10..12].copy_from_slice(&r.reason.to_be_bytes());
                d[12..12 + r.ari.len()].copy_from_slice(r.ari);
                private(d, 84, r.private_data)?;
            }
            CmMessage::Rep(r) => {
                ids(d, r.local_comm_id, r.remote_comm_id);
                d[8..12].copy_from_slice(&r.local_qkey.to_be_bytes());
                put24(&mut d[12..], r.local_qpn);
                let v = r.vendor_id.to_be_bytes();
                (d[15], d[19], d[23]) = (v[1], v[2], v[3]);
                put24(&mut d[16..], r.local_eecn);
                put24(&mut d[20..], r.starting_psn);
                d[24] = r.responder_resources;
                d[25] = r.initiator_depth;
                d[26] = place(r.target_ack_delay, 0, 5)
                    | place(r.failover_accepted, 5, 2)
                    | place(u8::from(r.end_to_end_flow_control), 7, 1);
                d[27] = place(r.rnr_retry_count, 0, 3) | place(u8::from(r.srq), 3, 1);
                d[28..36].copy_from_slice(&r.local_ca_guid.to_be_bytes());
                private(d, 36, r.private_data)?;
            }
            CmMessage::Rtu(i) | CmMessage::Drep(i) => {
                ids(d, i.local_comm_id, i.remote_comm_id);
                private(d, 8, i.private_data)?;
            }
            CmMessage::Dreq(r) => {
                ids(d, r.local_comm_id, r.remote_comm_id);
                put24(&mut d[8..], r.remote_qpn);
                private(d, 12, r.private_data)?;
            }
            CmMessage::SidrReq(r) => {
                d[..4].copy_from_slice(&r.request_id.to_be_bytes());
                d[4..6].copy_from_slice(&r.pkey.to_be_bytes());
                d[8..16].copy_from_slice(&r.service_id.to_be_bytes());
                private(d, 16, r.private_data)?;
            }
            CmMessage::SidrRep(r) => {
                if r.info.len() > 72 {
                    return Err(MadError::Info(r.info.len()));
                }
                d[..4].copy_from_slice(&r.request_id.to_be_bytes());
                d[4] = r.status;
                d[5] = r.info.len() as u8;
                d[6..8].copy_from_slice(&((r.vendor_id >> 8) as u16).to_be_bytes());
                put24(&mut d[8..], r.qpn);
                d[11] = r.vendor_id as u8;
                d[12..20].copy_from_slice(&r.service_id.to_be_bytes());
                d[20..24].copy_from_slice(&r.qkey.to_be_bytes());
                d[24..24 + r.info.len()].copy_from_slice(r.info);
                private(d, 96, r.private_data)?;
            }
        }
        Ok(())
    }
}

/// The frame that carries a MAD: a UD SEND_ONLY from QP1 to QP1 with the GSI Q_Key and the
/// default P_Key, as a kernel CM's MADs go over RoCEv2; its payload is the 256-byte MAD.
pub fn mad_repr(
    eth: super::EthernetRepr,
    ip: super::IpRepr,
    udp_src_port: u16,
    psn: super::Psn,
) -> super::RoceRepr {
    let mut bth = super::BthRepr::new(super::Opcode::UD_SEND_ONLY, super::Qpn::new(GSI_QPN), psn);
    bth.pkey = 0xffff;
    super::RoceRepr {
        eth,
        ip,
        udp_src_port,
        bth,
        ext: super::ExtHeaders {
            deth: Some(super::DethRepr {
                qkey: GSI_QKEY,
                src_qp: super::Qpn::new(GSI_QPN),
            }),
            ..super::ExtHeaders::default()
        },
        payload_len: MAD_LEN,
    }
}

/// rdma_cm's port spaces (`enum rdma_ucm_port_space`): the high part of a service ID.
pub mod port_space {
    /// `RDMA_PS_IPOIB`.
    pub const IPOIB: u16 = 0x0002;
    /// `RDMA_PS_IB`.
    pub const IB: u16 = 0x013f;
    /// `RDMA_PS_TCP` (RC).
    pub const TCP: u16 = 0x0106;
    /// `RDMA_PS_UDP` (UD).
    pub const UDP: u16 = 0x0111;
}

/// The service ID rdma_cm uses for port `port` of port space `ps`: 0x0000_0000_01PP_pppp
/// as Linux's `rdma_get_service_id` forms it.
pub const fn service_id(ps: u16, port: u16) -> u64 {
    (ps as u64) << 16 | port as u64
}

/// The port space and port of an rdma_cm service ID, if it is one.
pub const fn service_port(id: u64) -> Option<(u16, u16)> {
    if id >> 32 != 0 {
        return None;
    }
    Some(((id >> 16) as u16, id as u16))
}

/// Bytes of the rdma_cm IP addressing header.
pub const CMA_HEADER_LEN: usize = 36;

/// The rdma_cm IP addressing header at the start of a REQ's and a SIDR_REQ's private data
/// (Linux's `struct cma_hdr`): version 0, the IP version in the high nibble of the next byte,
/// the source port, and the source and destination addresses, IPv4 ones in the last four of
/// their sixteen bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CmaHeader {
    /// The active side's port.
    pub src_port: u16,
    /// The active side's address.
    pub src: IpAddr,
    /// The passive side's address.
    pub dst: IpAddr,
}

impl CmaHeader {
    /// Reads the header from the start of `private_data`.
    pub fn parse(private_data: &[u8]) -> Result<Self, MadError> {
        let Some(h) = private_data.get(..CMA_HEADER_LEN) else {
            return Err(MadError::Length(private_data.len()));
        };
        let ip = h[1] >> 4;
        if h[0] != 0 || !(ip == 4 || ip == 6) {
            return Err(MadError::CmaHeader { cma: h[0], ip });
        }
        let addr = |b: &[u8]| -> IpAddr {
            if ip == 4 {
                IpAddr::V4(Ipv4Addr::new(b[12], b[13], b[14], b[15]))
            } else {
                let mut a = [0u8; 16];
                a.copy_from_slice(&b[..16]);
                IpAddr::V6(Ipv6Addr::from(a))
            }
        };
        Ok(Self {
            src_port: be16(&h[2..]),
            src: addr(&h[4..20]),
            dst: addr(&h[20..36]),
        })
    }

    /// Writes the header into the first 36 bytes of `out` (the addresses' versions should
    /// agree; the source's decides).
    pub fn emit(&self, out: &mut [u8; CMA_HEADER_LEN]) {
        out.fill(0);
        let v4 = self.src.is_ipv4();
        out[1] = if v4 { 4 << 4 } else { 6 << 4 };
        out[2..4].copy_from_slice(&self.src_port.to_be_bytes());
        let put = |b: &mut [u8], a: IpAddr| match a {
            IpAddr::V4(a) => b[12..16].copy_from_slice(&a.octets()),
            IpAddr::V6(a) => b[..16].copy_from_slice(&a.octets()),
        };
        put(&mut out[4..20], self.src);
        put(&mut out[20..36], self.dst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn path(seed: u8) -> CmPath {
        CmPath {
            local_lid: 0xffff,
            remote_lid: 0xffff,
            local_gid: [seed; 16],
            remote_gid: [seed.wrapping_add(1); 16],
            flow_label: 0xabcde,
            packet_rate: 0x2a,
            traffic_class: 0x60,
            hop_limit: 64,
            sl: 3,
            subnet_local: true,
            local_ack_timeout: 18,
        }
    }

    fn req(pd: &[u8]) -> Req<'_> {
        Req {
            local_comm_id: 0x1122_3344,
            vendor_id: 0x00_02c9,
            service_id: service_id(port_space::TCP, 7174),
            local_ca_guid: 0x0202_c9ff_fe00_0001,
            local_qkey: 0,
            local_qpn: 0x00ab_cdef,
            responder_resources: 16,
            local_eecn: 0,
            initiator_depth: 8,
            remote_eecn: 0,
            remote_cm_response_timeout: 20,
            transport_service_type: 0,
            end_to_end_flow_control: true,
            starting_psn: 0x12_3456,
            local_cm_response_timeout: 20,
            retry_count: 7,
            pkey: 0xffff,
            path_mtu: 3,
            rdc_exists: false,
            rnr_retry_count: 7,
            max_cm_retries: 15,
            srq: false,
            extended_transport_type: 0,
            primary: path(0xfe),
            alternate: CmPath::default(),
            sap_supported: false,
            private_data: pd,
        }
    }

    /// The spec's offsets, byte by byte, for fields a wrong shift would move: the MAD header,
    /// then REQ's fields at table 106's offsets (24 bytes on, past the header).
    #[test]
    fn a_req_lands_at_table_106s_offsets() {
        let mut out = [0u8; MAD_LEN];
        let pd = [0xa5; 10];
        CmMad::new(0x0102_0304_0506_0708, CmMessage::Req(req(&pd)))
            .emit(&mut out)
            .unwrap();
        assert_eq!(&out[..4], &[1, 0x07, 2, 0x03]);
        assert_eq!(&out[8..16], &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(&out[16..18], &[0x00, 0x10]);
        let d = &out[24..];
        assert_eq!(&d[..4], &[0x11, 0x22, 0x33, 0x44]);
        assert_eq!(&d[4..8], &[0, 0x00, 0x02, 0xc9]);
        assert_eq!(&d[8..16], &[0, 0, 0, 0, 0x01, 0x06, 0x1c, 0x06]);
        assert_eq!(&d[32..36], &[0xab, 0xcd, 0xef, 16]);
        assert_eq!(d[39], 8);
        // Remote CM response timeout 20 in the top five bits, RC 0, flow control 1.
        assert_eq!(d[43], 20 << 3 | 1);
        assert_eq!(&d[44..48], &[0x12, 0x34, 0x56, 20 << 3 | 7]);
        assert_eq!(&d[48..50], &[0xff, 0xff]);
        assert_eq!(d[50], 3 << 4 | 7);
        assert_eq!(d[51], 15 << 4);
        // Primary path: LIDs, GIDs, flow label 0xabcde then rate 0x2a, TC, hop limit, SL 3
        // and subnet local, ACK timeout 18.
        assert_eq!(&d[52..56], &[0xff, 0xff, 0xff, 0xff]);
        assert_eq!(d[56], 0xfe);
        assert_eq!(d[72], 0xff);
        assert_eq!(&d[88..92], &[0xab, 0xcd, 0xe0, 0x2a]);
        assert_eq!(&d[92..96], &[0x60, 64, 3 << 4 | 1 << 3, 18 << 3]);
        assert!(d[96..140].iter().all(|&b| b == 0));
        assert_eq!(&d[140..150], &pd);
        assert!(d[150..].iter().all(|&b| b == 0));
    }

    #[test]
    fn every_message_reads_back_what_was_written() {
        let pd = [7u8; 20];
        let info = [9u8; 5];
        let msgs = [
            CmMessage::Req(Req {
                alternate: path(3),
                sap_supported: true,
                ..req(&pd)
            }),
            CmMessage::Mra(Mra {
                local_comm_id: 1,
                remote_comm_id: 2,
                message_mraed: 1,
                service_timeout: 17,
                private_data: &pd,
            }),
            CmMessage::Rej(Rej {
                local_comm_id: 0,
                remote_comm_id: 5,
                message_rejected: 0,
                reason: 8,
                ari: &info,
                private_data: &pd,
            }),
            CmMessage::Rep(Rep {
                local_comm_id: 3,
                remote_comm_id: 4,
                local_qkey: 0x1111,
                local_qpn: 0x12_3456,
                vendor_id: 0x02_c9_01,
                local_eecn: 0,
                starting_psn: 0xff_fffe,
                responder_resources: 4,
                initiator_depth: 2,
                target_ack_delay: 15,
                failover_accepted: 0,
                end_to_end_flow_control: true,
                rnr_retry_count: 6,
                srq: true,
                local_ca_guid: 0xdead_beef,
                private_data: &pd,
            }),
            CmMessage::Rtu(Ids {
                local_comm_id: 7,
                remote_comm_id: 8,
                private_data: &pd,
            }),
            CmMessage::Dreq(Dreq {
                local_comm_id: 7,
                remote_comm_id: 8,
                remote_qpn: 0x11,
                private_data: &pd,
            }),
            CmMessage::Drep(Ids {
                local_comm_id: 8,
                remote_comm_id: 7,
                private_data: &pd,
            }),
            CmMessage::SidrReq(SidrReq {
                request_id: 9,
                pkey: 0xffff,
                service_id: service_id(port_space::UDP, 7174),
                private_data: &pd,
            }),
            CmMessage::SidrRep(SidrRep {
                request_id: 9,
                status: 0,
                vendor_id: 0x12_3456,
                qpn: 0x42,
                service_id: service_id(port_space::UDP, 7174),
                qkey: 0x0123_4567,
                info: &info,
                private_data: &pd,
            }),
        ];
        for m in msgs {
            let mut out = [0u8; MAD_LEN];
            CmMad::new(77, m).emit(&mut out).unwrap();
            let back = CmMad::parse(&out).unwrap();
            assert_eq!(back.header, MadHeader::cm(m.attr_id(), 77), "{}", m.name());
            // Parsed private data is the message's whole area: the written bytes, then zeros.
            let strip = |m: CmMessage<'_>| {
                let mut out = [0u8; MAD_LEN];
                CmMad::new(77, m).emit(&mut out).unwrap();
                out
            };
            assert_eq!(strip(back.msg), out, "{}", m.name());
            match (m, back.msg) {
                (CmMessage::Req(a), CmMessage::Req(b)) => {
                    assert_eq!(
                        Req {
                            private_data: &[],
                            ..a
                        },
                        Req {
                            private_data: &[],
                            ..b
                        }
                    );
                    assert_eq!(&b.private_data[..pd.len()], &pd);
                    assert_eq!(b.private_data.len(), private_len::REQ);
                }
                (CmMessage::Rej(a), CmMessage::Rej(b)) => assert_eq!(a.ari, b.ari),
                (CmMessage::SidrRep(a), CmMessage::SidrRep(b)) => {
                    assert_eq!((a.vendor_id, a.qpn, a.info), (b.vendor_id, b.qpn, b.info));
                }
                (CmMessage::Rep(a), CmMessage::Rep(b)) => {
                    assert_eq!(
                        Rep {
                            private_data: &[],
                            ..a
                        },
                        Rep {
                            private_data: &[],
                            ..b
                        }
                    );
                }
                _ => {}
            }
        }
    }

    #[test]
    fn what_is_not_a_cm_mad_is_refused() {
        let mut good = [0u8; MAD_LEN];
        CmMad::new(
            1,
            CmMessage::Rtu(Ids {
                local_comm_id: 1,
                remote_comm_id: 2,
                private_data: &[],
            }),
        )
        .emit(&mut good)
        .unwrap();
        assert_eq!(CmMad::parse(&good[..255]), Err(MadError::Length(255)));
        let with = |i: usize, v: u8| {
            let mut b = good;
            b[i] = v;
            CmMad::parse(&b).map(|_| ())
        };
        assert_eq!(with(0, 2), Err(MadError::BaseVersion(2)));
        assert_eq!(with(1, 0x03), Err(MadError::Class(0x03)));
        assert_eq!(with(2, 1), Err(MadError::ClassVersion(1)));
        assert_eq!(with(3, 0x81), Err(MadError::Method(0x81)));
        assert_eq!(with(17, 0x19), Err(MadError::Attribute(attr::LAP)));
        assert_eq!(
            with(17, 0x01),
            Err(MadError::Attribute(attr::CLASS_PORT_INFO))
        );
        let big = [0u8; 93];
        let mut out = [0u8; MAD_LEN];
        assert_eq!(
            CmMad::new(1, CmMessage::Req(req(&big))).emit(&mut out),
            Err(MadError::PrivateData { got: 93, max: 92 })
        );
    }

    #[test]
    fn the_rdma_cm_header_is_linuxs_cma_hdr() {
        let h = CmaHeader {
            src_port: 0xbeef,
            src: "192.168.77.2".parse().unwrap(),
            dst: "192.168.77.1".parse().unwrap(),
        };
        let mut b = [0u8; CMA_HEADER_LEN];
        h.emit(&mut b);
        assert_eq!(&b[..4], &[0, 0x40, 0xbe, 0xef]);
        assert!(b[4..16].iter().all(|&x| x == 0));
        assert_eq!(&b[16..20], &[192, 168, 77, 2]);
        assert_eq!(&b[32..36], &[192, 168, 77, 1]);
        assert_eq!(CmaHeader::parse(&b), Ok(h));
        let h6 = CmaHeader {
            src_port: 1,
            src: "fe80::1".parse().unwrap(),
            dst: "fe80::2".parse().unwrap(),
        };
        h6.emit(&mut b);
        assert_eq!(b[1], 0x60);
        assert_eq!(CmaHeader::parse(&b), Ok(h6));
        b[0] = 1;
        assert_eq!(
            CmaHeader::parse(&b),
            Err(MadError::CmaHeader { cma: 1, ip: 6 })
        );
        assert_eq!(service_id(port_space::TCP, 7174), 0x0106_1c06);
        assert_eq!(service_port(0x0106_1c06), Some((port_space::TCP, 7174)));
    }

    proptest! {
        /// Any 256 bytes: parsed without a panic; what parses emits back to bytes that parse
        /// to the same message (reserved bits aside, which emit zeroes).
        #[test]
        fn any_bytes_parse_safely_and_round_trip(bytes in proptest::collection::vec(any::<u8>(), 0..300), attr_id in 0x10u16..0x1b) {
            let mut b = bytes.clone();
            if b.len() >= MAD_LEN {
                b[..4].copy_from_slice(&[1, CM_CLASS, CM_CLASS_VERSION, METHOD_SEND]);
                b[16..18].copy_from_slice(&attr_id.to_be_bytes());
            }
            if let Ok(m) = CmMad::parse(&b) {
                let mut out = [0u8; MAD_LEN];
                m.emit(&mut out).unwrap();
                let again = CmMad::parse(&out).unwrap();
                let mut out2 = [0u8; MAD_LEN];
                again.emit(&mut out2).unwrap();
                prop_assert_eq!(out, out2);
            }
            let _ = CmaHeader::parse(&bytes);
        }
    }
}
