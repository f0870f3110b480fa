//! UDP as RoCEv2 uses it: destination port 4791, the source port as flow entropy (Annex
//! A17.4.3), checksum sent as zero and not checked on receive (the ICRC covers the packet, and
//! ConnectX does the same).

use super::error::{need, Error, Layer, Result};
use super::field::BeField;

/// The IANA port of RoCEv2.
pub const ROCEV2_PORT: u16 = 4791;
/// Bytes of a UDP header.
pub const UDP_LEN: usize = 8;

/// Zero-copy view over a UDP header.
#[derive(Debug, Clone, Copy)]
pub struct UdpPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> UdpPacket<T> {
    /// Wraps a buffer without checking it.
    pub const fn new_unchecked(buffer: T) -> Self {
        Self { buffer }
    }

    /// Wraps a buffer after checking it holds the header.
    pub fn new_checked(buffer: T) -> Result<Self> {
        need(buffer.as_ref(), UDP_LEN, Layer::Udp)?;
        Ok(Self { buffer })
    }

    /// Source port.
    pub fn src_port(&self) -> u16 {
        u16::read(self.buffer.as_ref())
    }
    /// Destination port.
    pub fn dst_port(&self) -> u16 {
        u16::read(&self.buffer.as_ref()[2..])
    }
    /// Length field (header plus payload).
    pub fn len(&self) -> u16 {
        u16::read(&self.buffer.as_ref()[4..])
    }
    /// True when the length field says the datagram is just a header.
    pub fn is_empty(&self) -> bool {
        usize::from(self.len()) <= UDP_LEN
    }
    /// Checksum field.
    pub fn checksum(&self) -> u16 {
        u16::read(&self.buffer.as_ref()[6..])
    }
}

/// UDP header as plain values; the length is implied by the payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct UdpRepr {
    /// Source port: the flow's entropy, chosen by the sender.
    pub src_port: u16,
    /// Destination port.
    pub dst_port: u16,
}

impl UdpRepr {
    /// Validates a checked view over exactly the IP payload; returns the header and the UDP
    /// payload. Anything not addressed to port 4791 is rejected.
    pub fn parse<'a>(p: &UdpPacket<&'a [u8]>) -> Result<(Self, &'a [u8])> {
        if p.dst_port() != ROCEV2_PORT {
            return Err(Error::NotRoce(p.dst_port()));
        }
        let declared = usize::from(p.len());
        if declared != p.buffer.len() {
            return Err(Error::UdpLength {
                declared,
                available: p.buffer.len(),
            });
        }
        let repr = Self {
            src_port: p.src_port(),
            dst_port: p.dst_port(),
        };
        Ok((repr, &p.buffer[UDP_LEN..]))
    }

    /// Writes the header for a `payload_len`-byte payload, checksum zero.
    pub fn emit(&self, buf: &mut [u8], payload_len: usize) {
        self.src_port.write(buf);
        self.dst_port.write(&mut buf[2..]);
        ((UDP_LEN + payload_len) as u16).write(&mut buf[4..]);
        0u16.write(&mut buf[6..]);
    }
}
