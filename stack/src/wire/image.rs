//! A path's headers rendered to bytes once: Ethernet, IP, UDP and BTH as every packet of a
//! connected QP carries them. A packet is its image copied and patched — lengths, the IPv4
//! identification and checksum, the UDP source port, the BTH's opcode, flags, AckReq and
//! PSN — then its extension headers, payload, pad and ICRC, byte for byte what
//! [`RoceRepr::emit`] writes for the same packet. Copying the image and patching a few fields
//! costs a fraction of emitting each header from its fields, on every packet a requester
//! sends (issue 38).

use core::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::bth::field as bth;
use super::field::BeField;
use super::icrc::{self, ICRC_LEN};
use super::roce::{emit_ext, finish_frame, finish_split};
use super::{
    pad_for, BthRepr, Ecn, Error, EthernetRepr, ExtHeaders, IpRepr, Ipv4Repr, Ipv6Repr, MacAddr,
    Opcode, Psn, Qpn, Result, RoceRepr, UdpRepr, VlanTag, BTH_LEN, ETHERNET_LEN, IPV4_LEN,
    IPV6_LEN, ROCEV2_PORT, UDP_LEN, VLAN_TAG_LEN,
};

/// The longest image: a tagged Ethernet header, IPv6 and the BTH. The UDP header is not
/// kept: every field of it is the packet's or a constant, and an idle QP's bytes count.
const MAX: usize = ETHERNET_LEN + VLAN_TAG_LEN + IPV6_LEN + BTH_LEN;

/// What differs between the packets of one path: the BTH fields a packet sets and the UDP
/// source port it leaves from (spraying picks one per packet).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PacketFields {
    /// The opcode.
    pub opcode: Opcode,
    /// Solicited event.
    pub solicited: bool,
    /// AckReq.
    pub ack_req: bool,
    /// The PSN (its low 16 bits are also an IPv4 packet's identification).
    pub psn: Psn,
    /// The UDP source port.
    pub udp_src_port: u16,
}

/// Ethernet, IP, UDP and BTH headers of one path, rendered (see the module's doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeaderImage {
    /// Ethernet, IP and BTH headers, one after the other.
    bytes: [u8; MAX],
    udp_src_port: u16,
    eth_len: u8,
    /// 20 (IPv4) or 40 (IPv6).
    ip_len: u8,
    /// IPv4: the one's-complement sum of the header's words with the total length, the
    /// identification and the checksum taken as zero, folded to 16 bits.
    ip_sum: u16,
}

impl HeaderImage {
    /// The image of headers `eth`, `ip`, a UDP header from `udp_src_port` and `bth` (its
    /// opcode, flags, AckReq and PSN are each packet's; its P_Key, FECN/BECN, MigReq and
    /// destination QP stay).
    pub fn new(eth: &EthernetRepr, ip: &IpRepr, udp_src_port: u16, bth: &BthRepr) -> Self {
        let mut bytes = [0u8; MAX];
        let mut e = *eth;
        e.ethertype = ip.ethertype();
        e.emit(&mut bytes);
        let eth_len = e.header_len();
        let ip_len = ip.header_len();
        match ip {
            IpRepr::V4(r) => r.emit(&mut bytes[eth_len..], 0),
            IpRepr::V6(r) => r.emit(&mut bytes[eth_len..], 0),
        }
        let at = eth_len + ip_len;
        bytes[at..at + BTH_LEN].copy_from_slice(&bth.to_bytes());
        let mut ip_sum = 0;
        if ip_len == IPV4_LEN {
            let h = &mut bytes[eth_len..eth_len + IPV4_LEN];
            let mut sum: u32 = h
                .chunks_exact(2)
                .enumerate()
                .filter(|(i, _)| ![1, 2, 5].contains(i))
                .map(|(_, w)| u32::from(u16::from_be_bytes([w[0], w[1]])))
                .sum();
            while sum > 0xffff {
                sum = (sum & 0xffff) + (sum >> 16);
            }
            ip_sum = sum as u16;
        }
        Self {
            bytes,
            udp_src_port,
            eth_len: eth_len as u8,
            ip_len: ip_len as u8,
            ip_sum,
        }
    }

    /// Bytes of the image: Ethernet header through BTH.
    #[inline]
    pub fn header_len(&self) -> usize {
        usize::from(self.eth_len) + usize::from(self.ip_len) + UDP_LEN + BTH_LEN
    }

    /// 4 or 6.
    #[inline]
    pub fn ip_version(&self) -> u8 {
        if usize::from(self.ip_len) == IPV4_LEN {
            4
        } else {
            6
        }
    }

    /// The UDP source port the image was rendered with.
    pub fn udp_src_port(&self) -> u16 {
        self.udp_src_port
    }

    /// The source MAC and address (an IPv4-mapped IPv6 source as IPv4).
    pub fn source(&self) -> (MacAddr, IpAddr) {
        let r = self.repr();
        let ip = match r.ip {
            IpRepr::V4(v4) => IpAddr::V4(v4.src),
            IpRepr::V6(v6) => match v6.src.to_ipv4_mapped() {
                Some(v4) => IpAddr::V4(v4),
                None => IpAddr::V6(v6.src),
            },
        };
        (r.eth.src, ip)
    }

    /// Where the BTH is in the image (in a frame the UDP header comes first).
    fn bth_at(&self) -> usize {
        usize::from(self.eth_len) + usize::from(self.ip_len)
    }

    /// The headers as values, no extension header, no payload: what the image was
    /// rendered from (an IPv4 identification of zero; lengths and checksums are emit's).
    pub fn repr(&self) -> RoceRepr {
        let b = &self.bytes;
        let mac = |at: usize| {
            let mut m = [0u8; 6];
            m.copy_from_slice(&b[at..at + 6]);
            MacAddr(m)
        };
        let eth_len = usize::from(self.eth_len);
        let vlan = (eth_len > ETHERNET_LEN).then(|| {
            let tci = u16::read(&b[ETHERNET_LEN..]);
            VlanTag {
                pcp: (tci >> 13) as u8,
                dei: tci & 0x1000 != 0,
                vid: tci & 0x0fff,
            }
        });
        let eth = EthernetRepr {
            dst: mac(0),
            src: mac(6),
            vlan,
            ethertype: u16::read(&b[eth_len - 2..]),
        };
        let h = &b[eth_len..];
        let ip = if self.ip_version() == 4 {
            let addr = |at: usize| Ipv4Addr::new(h[at], h[at + 1], h[at + 2], h[at + 3]);
            IpRepr::V4(Ipv4Repr {
                src: addr(12),
                dst: addr(16),
                dscp: h[1] >> 2,
                ecn: Ecn::from_bits(h[1]),
                ident: u16::read(&h[4..]),
                dont_frag: h[6] & 0x40 != 0,
                ttl: h[8],
            })
        } else {
            let addr = |at: usize| {
                let mut a = [0u8; 16];
                a.copy_from_slice(&h[at..at + 16]);
                Ipv6Addr::from(a)
            };
            let first = u32::read(h);
            let tc = (first >> 20) as u8;
            IpRepr::V6(Ipv6Repr {
                src: addr(8),
                dst: addr(24),
                dscp: tc >> 2,
                ecn: Ecn::from_bits(tc),
                flow_label: first & 0x000f_ffff,
                hop_limit: h[7],
            })
        };
        let at = self.bth_at();
        let t = &b[at..at + BTH_LEN];
        let bth = BthRepr {
            opcode: Opcode(t[bth::OPCODE]),
            solicited: t[bth::FLAGS] & 0x80 != 0,
            mig_req: t[bth::FLAGS] & 0x40 != 0,
            pad_count: (t[bth::FLAGS] >> 4) & 0b11,
            pkey: u16::read(&t[bth::PKEY..]),
            fecn: t[bth::RESV8A] & 0x80 != 0,
            becn: t[bth::RESV8A] & 0x40 != 0,
            dest_qpn: Qpn::new(u32::from_be_bytes([
                0,
                t[bth::DEST_QP],
                t[bth::DEST_QP + 1],
                t[bth::DEST_QP + 2],
            ])),
            ack_req: t[bth::ACK_REQ] & 0x80 != 0,
            psn: Psn::new(u32::from_be_bytes([
                0,
                t[bth::PSN],
                t[bth::PSN + 1],
                t[bth::PSN + 2],
            ])),
        };
        RoceRepr {
            eth,
            ip,
            udp_src_port: self.udp_src_port(),
            bth,
            ext: ExtHeaders::default(),
            payload_len: 0,
        }
    }

    /// Writes the headers of packet `p` with `payload_len` payload bytes, extension headers
    /// from `ext`, into the front of `buf`, after checking it holds `needed` bytes; `total`
    /// is the frame's length. Returns where the payload starts.
    #[inline(always)]
    fn emit_headers(
        &self,
        buf: &mut [u8],
        p: &PacketFields,
        ext: &ExtHeaders,
        payload_len: usize,
        (needed, total): (usize, usize),
    ) -> Result<usize> {
        if buf.len() < needed {
            return Err(Error::BufferTooSmall {
                needed,
                available: buf.len(),
            });
        }
        let info = p.opcode.info()?;
        let (eth_len, ip_len) = (usize::from(self.eth_len), usize::from(self.ip_len));
        let hl = self.header_len();
        let ip_total = total - eth_len;
        let udp_len = ip_total - ip_len;
        let too_long = if ip_len == IPV4_LEN {
            ip_total > usize::from(u16::MAX)
        } else {
            udp_len > usize::from(u16::MAX)
        };
        if too_long {
            return Err(Error::PayloadTooLong(payload_len));
        }
        let l3 = eth_len + ip_len;
        buf[..l3].copy_from_slice(&self.bytes[..l3]);
        UdpRepr {
            src_port: p.udp_src_port,
            dst_port: ROCEV2_PORT,
        }
        .emit(&mut buf[l3..], udp_len - UDP_LEN);
        buf[l3 + UDP_LEN..hl].copy_from_slice(&self.bytes[l3..l3 + BTH_LEN]);
        let h = &mut buf[eth_len..hl];
        if ip_len == IPV4_LEN {
            let ident = p.psn.value() as u16;
            (ip_total as u16).write(&mut h[2..]);
            ident.write(&mut h[4..]);
            let mut sum = u32::from(self.ip_sum) + ip_total as u32 + u32::from(ident);
            while sum > 0xffff {
                sum = (sum & 0xffff) + (sum >> 16);
            }
            (!(sum as u16)).write(&mut h[10..]);
        } else {
            (udp_len as u16).write(&mut h[4..]);
        }
        let t = &mut h[ip_len + UDP_LEN..];
        t[bth::OPCODE] = p.opcode.0;
        t[bth::FLAGS] = u8::from(p.solicited) << 7
            | (t[bth::FLAGS] & 0x40)
            | (pad_for(payload_len) & 0b11) << 4;
        t[bth::ACK_REQ] = u8::from(p.ack_req) << 7;
        t[bth::PSN..bth::PSN + 3].copy_from_slice(&p.psn.value().to_be_bytes()[1..]);
        let ext_len = usize::from(info.header_len);
        emit_ext(info.headers, ext, &mut buf[hl..hl + ext_len])
            .ok_or(Error::MissingHeader(p.opcode.0))?;
        Ok(hl + ext_len)
    }

    /// The frame's length: headers, extension headers, payload, pad and ICRC.
    #[inline(always)]
    fn frame_len(&self, p: &PacketFields, payload_len: usize) -> Result<usize> {
        let info = p.opcode.info()?;
        Ok(self.header_len()
            + usize::from(info.header_len)
            + payload_len
            + usize::from(pad_for(payload_len))
            + ICRC_LEN)
    }

    /// [`RoceRepr::emit`] for packet `p` on this path: writes the frame into the front of
    /// `buf` (`fill` writes the `payload_len` payload bytes in place) and returns its length.
    pub fn emit(
        &self,
        buf: &mut [u8],
        p: &PacketFields,
        ext: &ExtHeaders,
        payload_len: usize,
        fill: impl FnOnce(&mut [u8]),
    ) -> Result<usize> {
        let total = self.frame_len(p, payload_len)?;
        let head = self.emit_headers(buf, p, ext, payload_len, (total, total))?;
        let buf = &mut buf[..total];
        let pad_at = head + payload_len;
        fill(&mut buf[head..pad_at]);
        let eth_len = usize::from(self.eth_len);
        finish_frame(buf, eth_len, pad_at, payload_len, self.ip_version());
        Ok(total)
    }

    /// [`RoceRepr::emit_split`] for packet `p` on this path: the headers into the front of
    /// `head` (their length returned first), the pad and ICRC into `tail` (their count
    /// second); `icrc_payload` feeds the payload to the ICRC.
    pub fn emit_split(
        &self,
        head: &mut [u8],
        tail: &mut [u8; 7],
        p: &PacketFields,
        ext: &ExtHeaders,
        payload_len: usize,
        icrc_payload: impl FnOnce(&mut icrc::IcrcState),
    ) -> Result<(usize, usize)> {
        let total = self.frame_len(p, payload_len)?;
        let needed = total - payload_len - usize::from(pad_for(payload_len)) - ICRC_LEN;
        let n = self.emit_headers(head, p, ext, payload_len, (needed, total))?;
        let eth_len = usize::from(self.eth_len);
        let ip_version = self.ip_version();
        let t = finish_split(
            &head[..n],
            eth_len,
            tail,
            payload_len,
            ip_version,
            icrc_payload,
        );
        Ok((n, t))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::sample::{sample_repr, SampleAddr};
    use crate::wire::RethRepr;

    /// The sample frame's addressing over IPv4 and IPv6, with and without a VLAN tag, as a
    /// template holds it: identification zero (each packet's is its PSN's low bits).
    fn reprs() -> Vec<RoceRepr> {
        let mut out = Vec::new();
        for ip_version in [4, 6] {
            for vlan in [false, true] {
                let addr = SampleAddr {
                    ip_version,
                    vlan,
                    udp_src_port: 0xc000,
                };
                let mut r = sample_repr(Opcode::RC_ACKNOWLEDGE, addr, 0);
                r.ext = ExtHeaders::default();
                r.eth.ethertype = r.ip.ethertype();
                r.bth.psn = Psn::new(0);
                r.bth.ack_req = false;
                r.bth.solicited = false;
                if let IpRepr::V4(v4) = &mut r.ip {
                    v4.ident = 0;
                }
                out.push(r);
            }
        }
        out
    }

    /// Every packet an image emits is the bytes `RoceRepr::emit` writes for it, whole or
    /// split, whatever the PSN, opcode, flags, source port and payload length.
    #[test]
    fn an_image_emits_what_the_repr_emits() {
        for base in reprs() {
            let image = HeaderImage::new(&base.eth, &base.ip, base.udp_src_port, &base.bth);
            assert_eq!(image.repr(), base);
            for (k, (opcode, len)) in [
                (Opcode::RC_RDMA_WRITE_ONLY, 64usize),
                (Opcode::RC_RDMA_WRITE_FIRST, 1024),
                (Opcode::RC_SEND_MIDDLE, 1024),
                (Opcode::RC_SEND_LAST, 3),
                (Opcode::RC_RDMA_READ_REQUEST, 0),
                (Opcode::UC_RDMA_WRITE_ONLY, 65),
            ]
            .into_iter()
            .enumerate()
            {
                let p = PacketFields {
                    opcode,
                    solicited: k % 2 == 1,
                    ack_req: k % 3 == 0,
                    psn: Psn::new(0xff_fff0 + k as u32 * 7),
                    udp_src_port: 0xc000 + k as u16,
                };
                let mut r = base;
                r.bth.opcode = p.opcode;
                r.bth.solicited = p.solicited;
                r.bth.ack_req = p.ack_req;
                r.bth.psn = p.psn;
                if let IpRepr::V4(v4) = &mut r.ip {
                    v4.ident = p.psn.value() as u16;
                }
                r.udp_src_port = p.udp_src_port;
                r.payload_len = len;
                if opcode.info().unwrap().header_len > 0 {
                    r.ext.reth = Some(RethRepr {
                        va: 0x1234_5678_9abc,
                        rkey: 0xdead_beef,
                        dma_len: 4096,
                    });
                }
                let data: Vec<u8> = (0..len).map(|i| (i * 31 + k) as u8).collect();
                let (mut want, mut got) = (vec![0u8; 9000], vec![0u8; 9000]);
                let n = r.emit(&mut want, |d| d.copy_from_slice(&data)).unwrap();
                let m = image
                    .emit(&mut got, &p, &r.ext, len, |d| d.copy_from_slice(&data))
                    .unwrap();
                assert_eq!(&got[..m], &want[..n], "{opcode:?} {len}");
                let (mut th, mut tt) = ([0u8; 7], [0u8; 7]);
                let (hw, tw) = r
                    .emit_split(&mut want, &mut th, |c| c.update(&data))
                    .unwrap();
                let (hg, tg) = image
                    .emit_split(&mut got, &mut tt, &p, &r.ext, len, |c| c.update(&data))
                    .unwrap();
                assert_eq!((&got[..hg], &tt[..tg]), (&want[..hw], &th[..tw]));
            }
            // A buffer too small is refused, not overrun.
            let p = PacketFields {
                opcode: Opcode::RC_SEND_ONLY,
                solicited: false,
                ack_req: false,
                psn: Psn::new(1),
                udp_src_port: 1,
            };
            let mut small = [0u8; 40];
            assert!(matches!(
                image.emit(&mut small, &p, &ExtHeaders::default(), 8, |_| {}),
                Err(Error::BufferTooSmall { .. })
            ));
            // A missing extension header is named.
            let p = PacketFields {
                opcode: Opcode::RC_RDMA_WRITE_ONLY,
                ..p
            };
            let mut buf = [0u8; 200];
            assert!(matches!(
                image.emit(&mut buf, &p, &ExtHeaders::default(), 8, |_| {}),
                Err(Error::MissingHeader(_))
            ));
        }
    }
}
