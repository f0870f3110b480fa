//! RoCEv2 wire formats: IBTA Vol 1 base transport headers over UDP/IP per Annex A17.
//!
//! Two levels, as in smoltcp:
//! - a `*Packet<T>` / `*Frame<T>` is a zero-copy view over bytes, with getters (and setters when
//!   `T: AsMut<[u8]>`);
//! - a `*Repr` is the header as plain values, with `parse` and `emit`.
//!
//! The contract: untrusted bytes go through `new_checked` (or the whole-frame
//! [`RoceRepr::parse`]); after that no accessor can panic. [`RoceRepr::parse`] never panics on
//! any input and reports every malformed frame as its own [`Error`] variant. [`RoceRepr::emit`]
//! writes a whole frame into the caller's buffer, computing lengths, the IPv4 checksum, the
//! pad count and the ICRC, without allocating.

mod bth;
mod cnp;
mod error;
mod ethernet;
mod ext;
pub(crate) mod field;
pub mod icrc;
mod image;
mod ip;
pub mod mad;
mod opcode;
mod pathctl;
mod roce;
pub mod sample;
mod split;
mod udp;

pub use bth::{BthPacket, BthRepr, Msn, Psn, Qpn, BTH_LEN, DEFAULT_PKEY};
pub use cnp::{cnp_repr, CNP_PKEY};
pub use error::{Error, Layer, Result};
pub use ethernet::{
    EthernetFrame, EthernetRepr, MacAddr, VlanTag, ETHERNET_LEN, ETHERTYPE_IPV4, ETHERTYPE_IPV6,
    ETHERTYPE_VLAN, VLAN_TAG_LEN,
};
pub use ext::{
    AethPacket, AethRepr, AtomicAckEthPacket, AtomicAckEthRepr, AtomicEthPacket, AtomicEthRepr,
    DethPacket, DethRepr, IethPacket, IethRepr, ImmDtPacket, ImmDtRepr, NakCode, RethPacket,
    RethRepr, SackEthPacket, SackEthRepr, Syndrome, CNP_RESERVED_LEN,
};
pub use field::BeField;
pub use image::{HeaderImage, PacketFields};
pub use ip::{
    internet_checksum, Ecn, IpRepr, Ipv4Packet, Ipv4Repr, Ipv6Packet, Ipv6Repr, IPV4_LEN, IPV6_LEN,
    IP_PROTO_UDP,
};
pub use opcode::{Headers, Kind, Opcode, OpcodeInfo, Position, Suffix, Transport};
pub use pathctl::{PathControl, PathControlKind};
pub use roce::{pad_for, Checks, ExtHeaders, Malformed, RocePacket, RoceRepr};
pub use split::{Span, SplitFrame};
pub use udp::{UdpPacket, UdpRepr, ROCEV2_PORT, UDP_LEN};
