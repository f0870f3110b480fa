//! The one error type of the wire layer.
//!
//! It is `Copy` and carries only numbers, so rejecting a frame never allocates: the receive path
//! counts the error and drops the frame. Each malformed-frame kind is its own variant so counters
//! and `ferroce decode` can say exactly what was wrong.

use core::fmt;

/// Which header a truncated frame ran out in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Layer {
    /// The 14-byte Ethernet II header.
    Ethernet,
    /// The 4-byte IEEE 802.1Q tag.
    Vlan,
    /// The IPv4 header.
    Ipv4,
    /// The IPv6 header.
    Ipv6,
    /// The UDP header.
    Udp,
    /// The base transport header plus the 4-byte ICRC every RoCEv2 packet ends with.
    Bth,
    /// The extension headers the opcode requires.
    ExtHeaders,
}

impl Layer {
    /// A short lower-case name, used in messages and in `ferroce decode` output.
    pub fn name(self) -> &'static str {
        match self {
            Self::Ethernet => "ethernet",
            Self::Vlan => "vlan",
            Self::Ipv4 => "ipv4",
            Self::Ipv6 => "ipv6",
            Self::Udp => "udp",
            Self::Bth => "bth",
            Self::ExtHeaders => "extension headers",
        }
    }
}

/// Why a frame was rejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
pub enum Error {
    /// The frame ended inside a header.
    #[error("frame ends inside the {} header ({available} bytes left, {needed} needed)", .layer.name())]
    Truncated {
        /// The header that did not fit.
        layer: Layer,
        /// Bytes the header needs.
        needed: usize,
        /// Bytes that were left.
        available: usize,
    },
    /// The Ethernet type is neither IPv4 nor IPv6 (nor an 802.1Q tag in front of one).
    #[error("ethertype {0:#06x} is not IPv4 or IPv6")]
    NotIp(u16),
    /// The IP version nibble disagrees with the Ethernet type.
    #[error("IP version field is {0}, the ethertype says otherwise")]
    IpVersion(u8),
    /// IPv4 header with options (IHL > 5); RoCEv2 never sends them (IBTA A17.4.2), so they are
    /// rejected rather than skipped.
    #[error("IPv4 header has options (IHL {0}); RoCEv2 does not use them")]
    Ipv4Options(u8),
    /// IPv4 IHL below the minimum of 5 words.
    #[error("IPv4 IHL {0} is below the minimum of 5")]
    Ipv4Ihl(u8),
    /// A fragment (MF set or non-zero offset); RoCEv2 packets are never fragmented.
    #[error("IPv4 fragment (flags/offset {0:#06x}); RoCEv2 is never fragmented")]
    Ipv4Fragment(u16),
    /// The IPv4 header checksum does not verify.
    #[error("IPv4 header checksum {found:#06x} is wrong (expected {expected:#06x})")]
    Ipv4Checksum {
        /// The checksum the header carries.
        found: u16,
        /// The checksum the header should carry.
        expected: u16,
    },
    /// The IP length field claims more bytes than the frame holds, or fewer than a header.
    #[error("IP length field says {declared} bytes but {available} are there")]
    IpLength {
        /// Bytes the IP header declares (whole IPv4 datagram, or IPv6 payload).
        declared: usize,
        /// Bytes the frame actually carries from that point.
        available: usize,
    },
    /// The IP payload is not UDP (IPv6 extension headers land here too).
    #[error("IP protocol {0} is not UDP")]
    NotUdp(u8),
    /// UDP, but not to the RoCEv2 port 4791.
    #[error("UDP destination port {0} is not RoCEv2's 4791")]
    NotRoce(u16),
    /// The UDP length field disagrees with the IP length.
    #[error("UDP length field says {declared} bytes but the IP payload is {available}")]
    UdpLength {
        /// The UDP length field.
        declared: usize,
        /// The IP payload length.
        available: usize,
    },
    /// BTH transport header version other than 0.
    #[error("BTH TVer {0} is not 0")]
    Tver(u8),
    /// A reserved opcode value (IBTA Vol 1 table 38).
    #[error("opcode {0:#04x} is reserved")]
    ReservedOpcode(u8),
    /// A defined opcode of a transport ferroce does not speak (RD, XRC, manufacturer-specific).
    #[error("opcode {0:#04x} belongs to a transport ferroce does not implement")]
    UnsupportedOpcode(u8),
    /// The pad count is impossible: larger than the payload, non-zero where the opcode forbids a
    /// pad, or payload plus pad not a multiple of four bytes.
    #[error("pad count {pad} does not fit a {len}-byte payload field")]
    BadPad {
        /// The BTH PadCnt field.
        pad: u8,
        /// Bytes between the last extension header and the ICRC.
        len: usize,
    },
    /// Bytes after the headers of an opcode that carries no payload.
    #[error("opcode {opcode:#04x} carries no payload but {len} bytes follow its headers")]
    UnexpectedPayload {
        /// The opcode.
        opcode: u8,
        /// Bytes found between the headers and the ICRC.
        len: usize,
    },
    /// A PATH_CONTROL payload that is short, names an unknown message or sets reserved bits.
    #[error("path control payload refused ({0} bytes)")]
    PathControl(usize),
    /// The invariant CRC does not match.
    #[error("ICRC {found:#010x} is wrong (expected {expected:#010x})")]
    Icrc {
        /// The ICRC the frame carries (its four bytes read little-endian, as on the wire).
        found: u32,
        /// The ICRC computed over the frame.
        expected: u32,
    },
    /// A buffer handed to an emit function is too small for the frame.
    #[error("emit buffer holds {available} bytes, the frame needs {needed}")]
    BufferTooSmall {
        /// Bytes the frame needs.
        needed: usize,
        /// Bytes the buffer has.
        available: usize,
    },
    /// Emit was asked for an opcode whose required extension header is `None`.
    #[error("opcode {0:#04x} needs an extension header the repr does not carry")]
    MissingHeader(u8),
    /// The frame would exceed what IP or UDP length fields can describe.
    #[error("a {0}-byte payload does not fit in one IP datagram")]
    PayloadTooLong(usize),
}

impl Error {
    /// A stable short name for the error's kind (`truncated`, `bad_icrc`, ...), used as the
    /// counter name suffix and as the `<kind>` in `ferroce decode`'s error objects.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Truncated { .. } => "truncated",
            Self::NotIp(_) => "not_ip",
            Self::IpVersion(_) => "ip_version",
            Self::Ipv4Options(_) => "ipv4_options",
            Self::Ipv4Ihl(_) => "ipv4_ihl",
            Self::Ipv4Fragment(_) => "ipv4_fragment",
            Self::Ipv4Checksum { .. } => "ipv4_checksum",
            Self::IpLength { .. } => "ip_length",
            Self::NotUdp(_) => "not_udp",
            Self::NotRoce(_) => "not_roce",
            Self::UdpLength { .. } => "udp_length",
            Self::Tver(_) => "tver",
            Self::ReservedOpcode(_) => "reserved_opcode",
            Self::UnsupportedOpcode(_) => "unsupported_opcode",
            Self::BadPad { .. } => "bad_pad",
            Self::UnexpectedPayload { .. } => "unexpected_payload",
            Self::Icrc { .. } => "bad_icrc",
            Self::BufferTooSmall { .. } => "buffer_too_small",
            Self::PayloadTooLong(_) => "payload_too_long",
            Self::MissingHeader(_) => "missing_header",
            Self::PathControl(_) => "path_control",
        }
    }
}

/// The wire layer's result type.
pub type Result<T> = core::result::Result<T, Error>;

/// Returns `Err(Truncated)` unless `buf` holds at least `needed` bytes.
pub(crate) fn need(buf: &[u8], needed: usize, layer: Layer) -> Result<()> {
    if buf.len() < needed {
        Err(Error::Truncated {
            layer,
            needed,
            available: buf.len(),
        })
    } else {
        Ok(())
    }
}

impl fmt::Display for Layer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
