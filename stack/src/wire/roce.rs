//! A whole RoCEv2 frame: Ethernet → IP → UDP/4791 → BTH → extension headers → payload → pad →
//! ICRC, parsed in one pass into a [`RoceRepr`] plus a borrowed payload, and emitted in one
//! pass into a caller's buffer.

use super::bth::{BthPacket, BthRepr, BTH_LEN};
use super::error::{need, Error, Layer, Result};
use super::ethernet::{EthernetFrame, EthernetRepr, ETHERTYPE_IPV4, ETHERTYPE_IPV6};
use super::ext::{
    AethPacket, AethRepr, AtomicAckEthPacket, AtomicAckEthRepr, AtomicEthPacket, AtomicEthRepr,
    DethPacket, DethRepr, IethPacket, IethRepr, ImmDtPacket, ImmDtRepr, RethPacket, RethRepr,
    SackEthPacket, SackEthRepr, CNP_RESERVED_LEN,
};
use super::icrc::{self, ICRC_LEN};
use super::ip::{IpRepr, Ipv4Packet, Ipv4Repr, Ipv6Packet, Ipv6Repr};
use super::opcode::{Headers, OpcodeInfo, Position};
use super::udp::{UdpPacket, UdpRepr, ROCEV2_PORT, UDP_LEN};

/// Which integrity checks the receive path performs. Drivers whose NIC already verified a
/// field turn its check off, as smoltcp's `ChecksumCapabilities` does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Checks {
    /// Verify the ICRC. Under `cfg(fuzzing)` it always passes so fuzzers get past it.
    pub icrc: bool,
    /// Verify the IPv4 header checksum.
    pub ipv4_checksum: bool,
}

impl Default for Checks {
    fn default() -> Self {
        Self::ALL
    }
}

impl Checks {
    /// Every check on: for frames from a wire nobody vouched for.
    pub const ALL: Self = Self {
        icrc: true,
        ipv4_checksum: true,
    };
    /// Structure only: lengths, opcodes, pad; no CRC or checksum.
    pub const NONE: Self = Self {
        icrc: false,
        ipv4_checksum: false,
    };
}

/// The extension headers of one packet, in wire order. Exactly those the opcode requires are
/// `Some` after a parse; emit writes those the opcode requires and ignores the rest.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ExtHeaders {
    /// DETH (UD).
    pub deth: Option<DethRepr>,
    /// RETH.
    pub reth: Option<RethRepr>,
    /// AtomicETH.
    pub atomic_eth: Option<AtomicEthRepr>,
    /// AETH.
    pub aeth: Option<AethRepr>,
    /// AtomicAckETH.
    pub atomic_ack_eth: Option<AtomicAckEthRepr>,
    /// ImmDt.
    pub imm_dt: Option<ImmDtRepr>,
    /// IETH.
    pub ieth: Option<IethRepr>,
    /// SackETH (ferroce selective repeat).
    pub sack_eth: Option<SackEthRepr>,
}

/// A RoCEv2 frame's headers as plain values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RoceRepr {
    /// Ethernet header; its ethertype is set from `ip` on emit.
    pub eth: EthernetRepr,
    /// IP header.
    pub ip: IpRepr,
    /// UDP source port, the flow entropy switches hash on.
    pub udp_src_port: u16,
    /// Base transport header.
    pub bth: BthRepr,
    /// Extension headers.
    pub ext: ExtHeaders,
    /// Payload bytes, pad excluded.
    pub payload_len: usize,
}

/// A parsed frame: its headers, its payload borrowed from the frame, and what the ICRC check
/// needs should the caller defer it.
#[derive(Clone, Copy, Debug)]
pub struct RocePacket<'a> {
    /// The headers.
    pub repr: RoceRepr,
    /// The payload, pad excluded.
    pub payload: &'a [u8],
    /// What [`icrc::compute`] takes: the eight bytes before the IP header (the LRH stand-in)
    /// and the IP header through the pad.
    pub icrc_input: &'a [u8],
    /// The ICRC the frame carries.
    pub icrc: u32,
}

impl RocePacket<'_> {
    /// Bytes of the frame it was parsed from (Ethernet header to ICRC, no FCS or Ethernet
    /// padding): what [`RoceRepr::buffer_len`] would say, read off the parse instead of
    /// recomputed from the opcode table (a packet built by hand, without `icrc_input`,
    /// falls back to that).
    #[inline]
    pub fn frame_len(&self) -> usize {
        if self.icrc_input.is_empty() {
            return self.repr.buffer_len();
        }
        self.repr.eth.header_len() - icrc::LRH_STAND_IN + self.icrc_input.len() + ICRC_LEN
    }

    /// Recomputes the ICRC and compares it with the trailer.
    pub fn icrc_check(&self) -> Result<()> {
        check_icrc(self.icrc_input, self.repr.ip.version(), self.icrc)
    }
}

/// A frame refused after its BTH that still names a QP (see [`RoceRepr::attribute`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Malformed {
    /// Ethernet header.
    pub eth: EthernetRepr,
    /// IP header.
    pub ip: IpRepr,
    /// UDP source port.
    pub udp_src_port: u16,
    /// The base transport header: destination QP, PSN, opcode.
    pub bth: BthRepr,
    /// Why the frame was refused.
    pub error: Error,
}

/// Everything of a frame below the BTH, and where the transport packet lies: the first
/// stage of a parse, shared by [`RoceRepr::parse`] and [`RoceRepr::attribute`].
struct Outer<'a> {
    eth: EthernetRepr,
    ip: IpRepr,
    udp_src_port: u16,
    /// BTH through the pad: the UDP payload without the ICRC (at least a BTH long).
    transport: &'a [u8],
    icrc_input: &'a [u8],
    icrc: u32,
}

impl<'a> Outer<'a> {
    #[inline(always)]
    fn parse(frame: &'a [u8], checks: Checks) -> Result<Self> {
        let eth_view = EthernetFrame::new_checked(frame)?;
        let eth = EthernetRepr::parse(&eth_view);
        let l3 = eth_view.payload();
        let (ip, udp_bytes) = match eth.ethertype {
            ETHERTYPE_IPV4 => {
                let (r, p) = Ipv4Repr::parse(&Ipv4Packet::new_checked(l3)?, checks.ipv4_checksum)?;
                (IpRepr::V4(r), p)
            }
            ETHERTYPE_IPV6 => {
                let (r, p) = Ipv6Repr::parse(&Ipv6Packet::new_checked(l3)?)?;
                (IpRepr::V6(r), p)
            }
            other => return Err(Error::NotIp(other)),
        };
        let (udp, roce) = UdpRepr::parse(&UdpPacket::new_checked(udp_bytes)?)?;
        need(roce, BTH_LEN + ICRC_LEN, Layer::Bth)?;
        let ip_len = ip.header_len() + UDP_LEN + roce.len() - ICRC_LEN;
        let packet_end = roce.len() - ICRC_LEN;
        let ip_at = eth_view.header_len();
        Ok(Self {
            eth,
            ip,
            udp_src_port: udp.src_port,
            transport: &roce[..packet_end],
            icrc_input: &frame[ip_at - icrc::LRH_STAND_IN..ip_at + ip_len],
            icrc: icrc::read(&roce[packet_end..]),
        })
    }
}

/// Compares the ICRC of `input` (see [`icrc::compute`]) with `found`, the trailer's.
fn check_icrc(input: &[u8], ip_version: u8, found: u32) -> Result<()> {
    let expected = icrc::compute(input, ip_version);
    if expected == found || cfg!(fuzzing) {
        Ok(())
    } else {
        Err(Error::Icrc { found, expected })
    }
}

/// The end of a whole frame in `buf`, whose payload of `payload_len` bytes ends at `pad_at`:
/// the pad, and the ICRC over the IP header (at `eth_len`) through the pad.
#[inline(always)]
pub(super) fn finish_frame(
    buf: &mut [u8],
    eth_len: usize,
    pad_at: usize,
    payload_len: usize,
    ip_version: u8,
) {
    let icrc_at = pad_at + usize::from(pad_for(payload_len));
    buf[pad_at..icrc_at].fill(0);
    let input = &buf[eth_len - icrc::LRH_STAND_IN..icrc_at];
    let crc = icrc::compute(input, ip_version);
    icrc::write(crc, &mut buf[icrc_at..]);
}

/// The end of a frame written in two places: `head` holds its headers (the Ethernet header
/// `eth_len` bytes), `icrc_payload` feeds the `payload_len` payload bytes to the ICRC, and the
/// pad and ICRC go into `tail`; their count.
#[inline(always)]
pub(super) fn finish_split(
    head: &[u8],
    eth_len: usize,
    tail: &mut [u8; 7],
    payload_len: usize,
    ip_version: u8,
    icrc_payload: impl FnOnce(&mut icrc::IcrcState),
) -> usize {
    let mut crc = icrc::IcrcState::start(&head[eth_len - icrc::LRH_STAND_IN..], ip_version);
    icrc_payload(&mut crc);
    let pad = usize::from(pad_for(payload_len));
    tail[..pad].fill(0);
    crc.update(&tail[..pad]);
    icrc::write(crc.finish(), &mut tail[pad..]);
    pad + ICRC_LEN
}

/// Pad bytes that align a payload of `len` bytes to four.
#[inline]
pub const fn pad_for(len: usize) -> u8 {
    ((4 - (len & 3)) & 3) as u8
}

impl RoceRepr {
    /// Parses and validates a frame. Never panics, whatever the bytes; every way a frame can
    /// be malformed is its own [`Error`]. Bytes after the IP datagram (Ethernet padding of
    /// short frames) are ignored.
    pub fn parse(frame: &[u8], checks: Checks) -> Result<RocePacket<'_>> {
        let o = Outer::parse(frame, checks)?;
        let roce = o.transport;
        let bth = BthRepr::parse(&BthPacket::new_unchecked(roce))?;
        let info = bth.opcode.info()?;
        let body = &roce[BTH_LEN..];
        let hdr_len = usize::from(info.header_len);
        need(body, hdr_len, Layer::ExtHeaders)?;
        let ext = parse_ext(info.headers, &body[..hdr_len]);

        let rest = &body[hdr_len..];
        let pad = bth.pad_count;
        if !info.payload {
            if !rest.is_empty() {
                return Err(Error::UnexpectedPayload {
                    opcode: bth.opcode.0,
                    len: rest.len(),
                });
            }
            if pad != 0 {
                return Err(Error::BadPad { pad, len: 0 });
            }
        } else {
            let pad_forbidden = matches!(info.position, Position::First | Position::Middle);
            if rest.len() % 4 != 0 || usize::from(pad) > rest.len() || (pad_forbidden && pad != 0) {
                return Err(Error::BadPad {
                    pad,
                    len: rest.len(),
                });
            }
        }
        let payload = &rest[..rest.len() - usize::from(pad)];

        if checks.icrc {
            check_icrc(o.icrc_input, o.ip.version(), o.icrc)?;
        }
        // Built where it is returned, after the last check: a 300-byte packet assembled in a
        // local and then moved into the result was a measurable copy per frame.
        Ok(RocePacket {
            repr: Self {
                eth: o.eth,
                ip: o.ip,
                udp_src_port: o.udp_src_port,
                bth,
                ext,
                payload_len: payload.len(),
            },
            payload,
            icrc_input: o.icrc_input,
            icrc: o.icrc,
        })
    }

    /// What can still be said of a frame [`parse`](Self::parse) refused with `error`: when the
    /// refusal came after a sound BTH (an opcode ferroce does not speak, extension headers cut
    /// short, bytes the opcode forbids, an impossible pad) and the ICRC checks (if `checks`
    /// asks), the frame is the peer's and names its QP, so that QP decides what the refusal
    /// means (IBTA: an RC responder NAKs it as an invalid request). Refusals below the BTH, a
    /// bad transport version and ICRC errors are nobody's: `None`, dropped by the caller.
    pub fn attribute(frame: &[u8], checks: Checks, error: Error) -> Option<Malformed> {
        let after_bth = matches!(
            error,
            Error::ReservedOpcode(_)
                | Error::UnsupportedOpcode(_)
                | Error::BadPad { .. }
                | Error::UnexpectedPayload { .. }
                | Error::Truncated {
                    layer: Layer::ExtHeaders,
                    ..
                }
        );
        if !after_bth {
            return None;
        }
        let o = Outer::parse(frame, checks).ok()?;
        let bth = BthRepr::parse(&BthPacket::new_unchecked(o.transport)).ok()?;
        if checks.icrc && check_icrc(o.icrc_input, o.ip.version(), o.icrc).is_err() {
            return None;
        }
        Some(Malformed {
            eth: o.eth,
            ip: o.ip,
            udp_src_port: o.udp_src_port,
            bth,
            error,
        })
    }

    /// Bytes of all headers, Ethernet through the last extension header. An opcode ferroce
    /// does not speak counts no extension headers.
    pub fn header_len(&self) -> usize {
        let ext = self
            .bth
            .opcode
            .info()
            .map_or(0, |i| usize::from(i.header_len));
        self.eth.header_len() + self.ip.header_len() + UDP_LEN + BTH_LEN + ext
    }

    /// Bytes of the whole frame: headers, payload, pad and ICRC (no Ethernet FCS, and no
    /// padding to the 60-byte Ethernet minimum, which the NIC adds).
    pub fn buffer_len(&self) -> usize {
        self.header_len() + self.payload_len + usize::from(pad_for(self.payload_len)) + ICRC_LEN
    }

    /// Writes the frame into the front of `buf` and returns its length. `emit_payload` fills
    /// the `payload_len` payload bytes in place (so a gather list can be copied straight from
    /// registered memory). The BTH pad count is derived from `payload_len`, the lengths and
    /// checksums are computed, and the ICRC is appended. No allocation.
    pub fn emit(&self, buf: &mut [u8], emit_payload: impl FnOnce(&mut [u8])) -> Result<usize> {
        let info = self.bth.opcode.info()?;
        let total = self.frame_len_with(info);
        let head = self.emit_headers(buf, total, total, info)?;
        let buf = &mut buf[..total];
        let pad_at = head + self.payload_len;
        emit_payload(&mut buf[head..pad_at]);
        let eth_len = self.eth.header_len();
        finish_frame(buf, eth_len, pad_at, self.payload_len, self.ip.version());
        Ok(total)
    }

    /// Writes a frame in two places, for a port that sends the payload from where it lies
    /// (zero-copy transmit): the headers go into the front of `head` (their length, returned
    /// first, is [`header_len`](Self::header_len)), and the bytes that follow the payload, pad
    /// and ICRC, into `tail` (their count returned second). `icrc_payload` feeds the
    /// `payload_len` payload bytes, in order, to the ICRC.
    pub fn emit_split(
        &self,
        head: &mut [u8],
        tail: &mut [u8; 7],
        icrc_payload: impl FnOnce(&mut icrc::IcrcState),
    ) -> Result<(usize, usize)> {
        let info = self.bth.opcode.info()?;
        let total = self.frame_len_with(info);
        let n = self.emit_headers(head, self.header_len(), total, info)?;
        let eth_len = self.eth.header_len();
        let ip_version = self.ip.version();
        let t = finish_split(
            &head[..n],
            eth_len,
            tail,
            self.payload_len,
            ip_version,
            icrc_payload,
        );
        Ok((n, t))
    }

    /// [`buffer_len`](Self::buffer_len) with the opcode's facts at hand.
    fn frame_len_with(&self, info: &OpcodeInfo) -> usize {
        self.eth.header_len()
            + self.ip.header_len()
            + UDP_LEN
            + BTH_LEN
            + usize::from(info.header_len)
            + self.payload_len
            + usize::from(pad_for(self.payload_len))
            + ICRC_LEN
    }

    /// Writes every header (lengths and checksums for a frame of `total` bytes, `info` being
    /// its opcode's) into the front of `buf`, after checking it holds the `needed` bytes the
    /// caller will write; returns where the payload starts.
    fn emit_headers(
        &self,
        buf: &mut [u8],
        needed: usize,
        total: usize,
        info: &OpcodeInfo,
    ) -> Result<usize> {
        if buf.len() < needed {
            return Err(Error::BufferTooSmall {
                needed,
                available: buf.len(),
            });
        }
        let eth_len = self.eth.header_len();
        let ip_hlen = self.ip.header_len();
        let udp_payload = total - eth_len - ip_hlen - UDP_LEN;
        let ip_payload = udp_payload + UDP_LEN;
        let too_long = match self.ip {
            IpRepr::V4(_) => ip_payload + ip_hlen > usize::from(u16::MAX),
            IpRepr::V6(_) => ip_payload > usize::from(u16::MAX),
        };
        if too_long {
            return Err(Error::PayloadTooLong(self.payload_len));
        }

        let mut eth = self.eth;
        eth.ethertype = self.ip.ethertype();
        eth.emit(buf);
        let l3 = &mut buf[eth_len..];
        match &self.ip {
            IpRepr::V4(r) => r.emit(l3, ip_payload),
            IpRepr::V6(r) => r.emit(l3, ip_payload),
        }
        let udp = UdpRepr {
            src_port: self.udp_src_port,
            dst_port: ROCEV2_PORT,
        };
        udp.emit(&mut l3[ip_hlen..], udp_payload);

        let roce = &mut l3[ip_hlen + UDP_LEN..];
        let mut bth = self.bth;
        bth.pad_count = pad_for(self.payload_len);
        bth.emit(&mut BthPacket::new_unchecked(&mut *roce));
        let hdr_len = usize::from(info.header_len);
        emit_ext(
            info.headers,
            &self.ext,
            &mut roce[BTH_LEN..BTH_LEN + hdr_len],
        )
        .ok_or(Error::MissingHeader(self.bth.opcode.0))?;
        Ok(eth_len + ip_hlen + UDP_LEN + BTH_LEN + hdr_len)
    }

    /// [`emit`](Self::emit) with the payload copied from a slice of exactly `payload_len`
    /// bytes.
    pub fn emit_with_payload(&self, buf: &mut [u8], payload: &[u8]) -> Result<usize> {
        debug_assert_eq!(payload.len(), self.payload_len);
        self.emit(buf, |dst| dst.copy_from_slice(payload))
    }
}

/// Reads the headers in `h` (exactly `headers.len()` bytes) in wire order.
fn parse_ext(headers: Headers, h: &[u8]) -> ExtHeaders {
    let mut ext = ExtHeaders::default();
    // The sets most packets carry, read without asking after each kind of header in turn.
    if headers == Headers::NONE {
        return ext;
    }
    if headers == Headers::RETH {
        ext.reth = Some(RethRepr::parse(&RethPacket::new_unchecked(h)));
        return ext;
    }
    if headers == Headers::AETH {
        ext.aeth = Some(AethRepr::parse(&AethPacket::new_unchecked(h)));
        return ext;
    }
    let mut at = 0;
    macro_rules! take {
        ($flag:ident, $field:ident, $packet:ident, $repr:ident) => {
            if headers.contains(Headers::$flag) {
                ext.$field = Some($repr::parse(&$packet::new_unchecked(&h[at..])));
                at += $repr::LEN;
            }
        };
    }
    take!(DETH, deth, DethPacket, DethRepr);
    take!(RETH, reth, RethPacket, RethRepr);
    take!(ATOMIC_ETH, atomic_eth, AtomicEthPacket, AtomicEthRepr);
    take!(AETH, aeth, AethPacket, AethRepr);
    take!(
        ATOMIC_ACK_ETH,
        atomic_ack_eth,
        AtomicAckEthPacket,
        AtomicAckEthRepr
    );
    take!(IMM_DT, imm_dt, ImmDtPacket, ImmDtRepr);
    take!(IETH, ieth, IethPacket, IethRepr);
    take!(SACK_ETH, sack_eth, SackEthPacket, SackEthRepr);
    // The CNP's reserved block is not read; IBTA says receivers ignore it.
    let _ = at;
    ext
}

/// Writes the headers `headers` names from `ext` into `h`; `None` when one is missing.
pub(super) fn emit_ext(headers: Headers, ext: &ExtHeaders, h: &mut [u8]) -> Option<()> {
    // The sets most packets carry (see `parse_ext`).
    if headers == Headers::NONE {
        return Some(());
    }
    if headers == Headers::RETH {
        ext.reth?.emit(&mut RethPacket::new_unchecked(h));
        return Some(());
    }
    if headers == Headers::AETH {
        ext.aeth?.emit(&mut AethPacket::new_unchecked(h));
        return Some(());
    }
    let mut at = 0;
    macro_rules! put {
        ($flag:ident, $field:ident, $packet:ident, $repr:ident) => {
            if headers.contains(Headers::$flag) {
                ext.$field?.emit(&mut $packet::new_unchecked(&mut h[at..]));
                at += $repr::LEN;
            }
        };
    }
    put!(DETH, deth, DethPacket, DethRepr);
    put!(RETH, reth, RethPacket, RethRepr);
    put!(ATOMIC_ETH, atomic_eth, AtomicEthPacket, AtomicEthRepr);
    put!(AETH, aeth, AethPacket, AethRepr);
    put!(
        ATOMIC_ACK_ETH,
        atomic_ack_eth,
        AtomicAckEthPacket,
        AtomicAckEthRepr
    );
    put!(IMM_DT, imm_dt, ImmDtPacket, ImmDtRepr);
    put!(IETH, ieth, IethPacket, IethRepr);
    put!(SACK_ETH, sack_eth, SackEthPacket, SackEthRepr);
    if headers.contains(Headers::CNP_RESERVED) {
        h[at..at + CNP_RESERVED_LEN].fill(0);
    }
    Some(())
}
