//! Ethernet II with an optional IEEE 802.1Q tag.

use core::fmt;

use super::error::{need, Layer, Result};
use super::field::BeField;

/// A 48-bit MAC address.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct MacAddr(pub [u8; 6]);

impl MacAddr {
    /// ff:ff:ff:ff:ff:ff.
    pub const BROADCAST: Self = Self([0xff; 6]);

    /// True for group (multicast and broadcast) addresses.
    pub fn is_multicast(&self) -> bool {
        self.0[0] & 1 != 0
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = &self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            b[0], b[1], b[2], b[3], b[4], b[5]
        )
    }
}

/// Ethertype of IPv4.
pub const ETHERTYPE_IPV4: u16 = 0x0800;
/// Ethertype of IPv6.
pub const ETHERTYPE_IPV6: u16 = 0x86dd;
/// Tag protocol identifier of an 802.1Q VLAN tag.
pub const ETHERTYPE_VLAN: u16 = 0x8100;

/// Bytes of an untagged Ethernet II header.
pub const ETHERNET_LEN: usize = 14;
/// Bytes of an 802.1Q tag.
pub const VLAN_TAG_LEN: usize = 4;

/// An 802.1Q tag control field.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct VlanTag {
    /// Priority code point (3 bits); RoCE maps traffic classes to it for PFC.
    pub pcp: u8,
    /// Drop eligible indicator.
    pub dei: bool,
    /// VLAN id (12 bits).
    pub vid: u16,
}

impl VlanTag {
    fn from_tci(tci: u16) -> Self {
        Self {
            pcp: (tci >> 13) as u8,
            dei: tci & 0x1000 != 0,
            vid: tci & 0x0fff,
        }
    }

    fn tci(self) -> u16 {
        u16::from(self.pcp & 7) << 13 | u16::from(self.dei) << 12 | (self.vid & 0x0fff)
    }
}

/// Zero-copy view over an Ethernet frame.
#[derive(Debug, Clone, Copy)]
pub struct EthernetFrame<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> EthernetFrame<T> {
    /// Wraps a buffer without checking it.
    pub const fn new_unchecked(buffer: T) -> Self {
        Self { buffer }
    }

    /// Wraps a buffer after checking it holds the header, tag included when there is one.
    pub fn new_checked(buffer: T) -> Result<Self> {
        need(buffer.as_ref(), ETHERNET_LEN, Layer::Ethernet)?;
        let f = Self { buffer };
        if f.outer_ethertype() == ETHERTYPE_VLAN {
            need(f.buffer.as_ref(), ETHERNET_LEN + VLAN_TAG_LEN, Layer::Vlan)?;
        }
        Ok(f)
    }

    /// Gives the buffer back.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Destination address.
    pub fn dst(&self) -> MacAddr {
        MacAddr(self.buffer.as_ref()[0..6].try_into().unwrap())
    }

    /// Source address.
    pub fn src(&self) -> MacAddr {
        MacAddr(self.buffer.as_ref()[6..12].try_into().unwrap())
    }

    /// The type field right after the addresses (0x8100 when tagged).
    pub fn outer_ethertype(&self) -> u16 {
        u16::read(&self.buffer.as_ref()[12..])
    }

    /// The 802.1Q tag, if the frame has one.
    pub fn vlan(&self) -> Option<VlanTag> {
        (self.outer_ethertype() == ETHERTYPE_VLAN)
            .then(|| VlanTag::from_tci(u16::read(&self.buffer.as_ref()[14..])))
    }

    /// The type of the payload, after any tag.
    pub fn ethertype(&self) -> u16 {
        if self.outer_ethertype() == ETHERTYPE_VLAN {
            u16::read(&self.buffer.as_ref()[16..])
        } else {
            self.outer_ethertype()
        }
    }

    /// Bytes of header, tag included.
    pub fn header_len(&self) -> usize {
        if self.outer_ethertype() == ETHERTYPE_VLAN {
            ETHERNET_LEN + VLAN_TAG_LEN
        } else {
            ETHERNET_LEN
        }
    }
}

impl<'a> EthernetFrame<&'a [u8]> {
    /// The bytes after the header, borrowed from the frame.
    pub fn payload(&self) -> &'a [u8] {
        &self.buffer[self.header_len()..]
    }
}

/// Ethernet header as plain values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct EthernetRepr {
    /// Destination address.
    pub dst: MacAddr,
    /// Source address.
    pub src: MacAddr,
    /// Optional 802.1Q tag.
    pub vlan: Option<VlanTag>,
    /// Payload type (after the tag).
    pub ethertype: u16,
}

impl EthernetRepr {
    /// Reads a checked view.
    pub fn parse<T: AsRef<[u8]>>(f: &EthernetFrame<T>) -> Self {
        Self {
            dst: f.dst(),
            src: f.src(),
            vlan: f.vlan(),
            ethertype: f.ethertype(),
        }
    }

    /// Bytes the header takes.
    pub const fn header_len(&self) -> usize {
        if self.vlan.is_some() {
            ETHERNET_LEN + VLAN_TAG_LEN
        } else {
            ETHERNET_LEN
        }
    }

    /// Writes the header into the first [`header_len`](Self::header_len) bytes of `buf`.
    pub fn emit(&self, buf: &mut [u8]) {
        buf[0..6].copy_from_slice(&self.dst.0);
        buf[6..12].copy_from_slice(&self.src.0);
        match self.vlan {
            Some(tag) => {
                ETHERTYPE_VLAN.write(&mut buf[12..]);
                tag.tci().write(&mut buf[14..]);
                self.ethertype.write(&mut buf[16..]);
            }
            None => self.ethertype.write(&mut buf[12..]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vlan_tag_round_trips() {
        let repr = EthernetRepr {
            dst: MacAddr([2, 0, 0, 0, 0, 1]),
            src: MacAddr([2, 0, 0, 0, 0, 2]),
            vlan: Some(VlanTag {
                pcp: 3,
                dei: true,
                vid: 0x123,
            }),
            ethertype: ETHERTYPE_IPV6,
        };
        let mut buf = [0u8; 18];
        repr.emit(&mut buf);
        assert_eq!(&buf[12..], &[0x81, 0x00, 0x71, 0x23, 0x86, 0xdd]);
        let f = EthernetFrame::new_checked(&buf[..]).unwrap();
        assert_eq!(EthernetRepr::parse(&f), repr);
        assert!(EthernetFrame::new_checked(&buf[..17]).is_err());
    }
}
