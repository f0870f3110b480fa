//! Deterministic sample frames: one well-formed [`RoceRepr`] per opcode, used by golden
//! vectors, benchmarks, fuzz seeds and the demo so they all speak about the same bytes.

use core::net::{Ipv4Addr, Ipv6Addr};

use super::{
    AethRepr, AtomicAckEthRepr, AtomicEthRepr, BthRepr, DethRepr, Ecn, EthernetRepr, ExtHeaders,
    Headers, IethRepr, ImmDtRepr, IpRepr, Ipv4Repr, Ipv6Repr, MacAddr, Msn, Opcode, Psn, Qpn,
    RethRepr, SackEthRepr, VlanTag, ETHERTYPE_IPV4,
};

/// Addressing choices for a sample frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SampleAddr {
    /// 4 or 6.
    pub ip_version: u8,
    /// Add an 802.1Q tag (VLAN 100, priority 3).
    pub vlan: bool,
    /// UDP source port.
    pub udp_src_port: u16,
}

impl Default for SampleAddr {
    fn default() -> Self {
        Self {
            ip_version: 4,
            vlan: false,
            udp_src_port: 0xc000,
        }
    }
}

/// A well-formed frame for `opcode` (which must be one ferroce speaks) with `payload_len`
/// payload bytes where the opcode has a payload (ignored otherwise), and every extension header
/// filled with recognisable values.
pub fn sample_repr(opcode: Opcode, addr: SampleAddr, payload_len: usize) -> super::RoceRepr {
    let info = opcode
        .info()
        .expect("sample_repr needs an opcode ferroce speaks");
    let ip = if addr.ip_version == 6 {
        IpRepr::V6(Ipv6Repr {
            src: Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 1),
            dst: Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 2),
            dscp: 26,
            ecn: Ecn::Ect0,
            flow_label: 0x1_2345,
            hop_limit: 64,
        })
    } else {
        IpRepr::V4(Ipv4Repr {
            src: Ipv4Addr::new(10, 0, 0, 1),
            dst: Ipv4Addr::new(10, 0, 0, 2),
            dscp: 26,
            ecn: Ecn::Ect0,
            ident: 0x1234,
            dont_frag: true,
            ttl: 64,
        })
    };
    let h = info.headers;
    let pick = |flag: Headers| h.contains(flag);
    let ext = ExtHeaders {
        deth: pick(Headers::DETH).then_some(DethRepr {
            qkey: 0x1111_1111,
            src_qp: Qpn::new(0x00_0101),
        }),
        reth: pick(Headers::RETH).then_some(RethRepr {
            va: 0x0000_7f00_1234_5000,
            rkey: 0x8e3f_a1c5,
            dma_len: if info.payload {
                payload_len as u32
            } else {
                4096
            },
        }),
        atomic_eth: pick(Headers::ATOMIC_ETH).then_some(AtomicEthRepr {
            va: 0x0000_7f00_1234_6008,
            rkey: 0x8e3f_a1c5,
            swap_add: 0x0102_0304_0506_0708,
            compare: 0x1112_1314_1516_1718,
        }),
        aeth: pick(Headers::AETH).then_some(AethRepr {
            syndrome: 0x1f,
            msn: Msn::new(0x00_0042),
        }),
        atomic_ack_eth: pick(Headers::ATOMIC_ACK_ETH).then_some(AtomicAckEthRepr {
            orig_data: 0xdead_beef_cafe_f00d,
        }),
        imm_dt: pick(Headers::IMM_DT).then_some(ImmDtRepr { imm: 0xabcd_0123 }),
        ieth: pick(Headers::IETH).then_some(IethRepr { rkey: 0x5a5a_0001 }),
        sack_eth: pick(Headers::SACK_ETH).then_some(SackEthRepr {
            flags: SackEthRepr::LOST,
            base: Psn::new(0x12_3457),
            path: 3,
            lost: Psn::new(0x12_3459),
            bits0: 0b1011,
            bits1: 0,
            bits2: 1 << 63,
            bits3: 0x8000_0000_0000_0001,
        }),
    };
    let mut bth = BthRepr::new(opcode, Qpn::new(0x00_0d11), Psn::new(0x12_3456));
    bth.ack_req = matches!(info.position, super::Position::Last | super::Position::Only)
        && info.transport == super::Transport::Rc
        && info.payload;
    if opcode == Opcode::CNP {
        bth.becn = true;
        bth.psn = Psn::new(0);
    }
    super::RoceRepr {
        eth: EthernetRepr {
            dst: MacAddr([0x02, 0, 0, 0, 0, 0x02]),
            src: MacAddr([0x02, 0, 0, 0, 0, 0x01]),
            vlan: addr.vlan.then_some(VlanTag {
                pcp: 3,
                dei: false,
                vid: 100,
            }),
            ethertype: ETHERTYPE_IPV4,
        },
        ip,
        udp_src_port: addr.udp_src_port,
        bth,
        ext,
        payload_len: match (info.payload, info.position) {
            (false, _) => 0,
            // First and middle packets carry whole path-MTU chunks, never a pad.
            (true, super::Position::First | super::Position::Middle) => payload_len & !3,
            (true, _) => payload_len,
        },
    }
}

/// The payload byte at offset `i` of every sample frame: a counter, so truncation and
/// corruption show.
pub fn sample_payload_byte(i: usize) -> u8 {
    (i as u8).wrapping_mul(7).wrapping_add(1)
}

/// Emits `repr` with the sample payload into a fresh vector.
pub fn sample_frame(repr: &super::RoceRepr) -> Vec<u8> {
    let mut buf = vec![0u8; repr.buffer_len()];
    let n = repr
        .emit(&mut buf, |p| {
            for (i, b) in p.iter_mut().enumerate() {
                *b = sample_payload_byte(i);
            }
        })
        .expect("sample frames are well-formed");
    buf.truncate(n);
    buf
}

/// Recomputes the IPv4 header checksum (if any) and the ICRC of an untagged frame whose
/// headers were edited, so a deliberately broken sample fails only the check it aims at.
/// Trusts the frame's own IP length field; does nothing if the frame is too short.
pub fn reseal(frame: &mut [u8]) {
    use super::{icrc, ETHERNET_LEN, IPV4_LEN, IPV6_LEN};
    if frame.len() < ETHERNET_LEN + IPV4_LEN {
        return;
    }
    let ip = &mut frame[ETHERNET_LEN..];
    if ip[0] >> 4 != 4 && ip.len() < IPV6_LEN {
        return;
    }
    let (version, ip_end) = match ip[0] >> 4 {
        4 => {
            ip[10] = 0;
            ip[11] = 0;
            let c = super::internet_checksum(&ip[..IPV4_LEN]);
            ip[10..12].copy_from_slice(&c.to_be_bytes());
            (4, usize::from(u16::from_be_bytes([ip[2], ip[3]])))
        }
        _ => (
            6,
            IPV6_LEN + usize::from(u16::from_be_bytes([ip[4], ip[5]])),
        ),
    };
    if ip_end < 4 || ip_end > ip.len() {
        return;
    }
    let input = &frame[ETHERNET_LEN - icrc::LRH_STAND_IN..ETHERNET_LEN + ip_end - 4];
    let crc = icrc::compute(input, version);
    icrc::write(
        crc,
        &mut frame[ETHERNET_LEN + ip_end - 4..ETHERNET_LEN + ip_end],
    );
}

/// Adds `delta` bytes to the IPv4 total length and UDP length of an untagged frame, after a
/// sample has inserted or removed bytes inside the datagram.
fn grow_ipv4_datagram(f: &mut [u8], delta: i16) {
    use super::{ETHERNET_LEN, IPV4_LEN};
    for at in [ETHERNET_LEN + 2, ETHERNET_LEN + IPV4_LEN + 4] {
        let len = u16::from_be_bytes([f[at], f[at + 1]]).wrapping_add_signed(delta);
        f[at..at + 2].copy_from_slice(&len.to_be_bytes());
    }
}

/// One deliberately malformed frame: what it is, its bytes, and the [`Error::kind`] a parse
/// with every check on must report.
///
/// [`Error::kind`]: super::Error::kind
#[derive(Clone, Debug)]
pub struct BrokenFrame {
    /// What was broken.
    pub what: &'static str,
    /// The frame.
    pub bytes: Vec<u8>,
    /// The error kind parsing must give.
    pub kind: &'static str,
}

/// A frame for every way the parser rejects input, each broken in exactly one way.
pub fn broken_frames() -> Vec<BrokenFrame> {
    let v4 = SampleAddr::default();
    let v6 = SampleAddr {
        ip_version: 6,
        ..v4
    };
    let write = sample_frame(&sample_repr(Opcode::RC_RDMA_WRITE_ONLY, v4, 64));
    let write6 = sample_frame(&sample_repr(Opcode::RC_RDMA_WRITE_ONLY, v6, 64));
    let ack = sample_frame(&sample_repr(Opcode::RC_ACKNOWLEDGE, v4, 0));
    let send = sample_frame(&sample_repr(Opcode::RC_SEND_ONLY, v4, 13));
    let empty_send = sample_frame(&sample_repr(Opcode::RC_SEND_ONLY, v4, 0));
    // Offsets in an untagged IPv4 frame.
    const IP: usize = 14;
    const UDP: usize = IP + 20;
    const BTH: usize = UDP + 8;

    let mut out = Vec::new();
    let mut add = |what, kind, base: &Vec<u8>, edit: &dyn Fn(&mut Vec<u8>), seal: bool| {
        let mut bytes = base.clone();
        edit(&mut bytes);
        if seal {
            reseal(&mut bytes);
        }
        out.push(BrokenFrame { what, bytes, kind });
    };
    add(
        "frame shorter than an Ethernet header",
        "truncated",
        &write,
        &|f| f.truncate(10),
        false,
    );
    add(
        "frame ends inside the IPv4 header",
        "truncated",
        &write,
        &|f| f.truncate(IP + 12),
        false,
    );
    add(
        "ARP, not IP",
        "not_ip",
        &write,
        &|f| f[12..14].copy_from_slice(&[0x08, 0x06]),
        false,
    );
    add(
        "ethertype IPv4, version nibble 6",
        "ip_version",
        &write,
        &|f| f[IP] = 0x65,
        true,
    );
    add(
        "IPv4 header with options (IHL 6)",
        "ipv4_options",
        &write,
        &|f| f[IP] = 0x46,
        true,
    );
    add(
        "IPv4 IHL below 5",
        "ipv4_ihl",
        &write,
        &|f| f[IP] = 0x44,
        true,
    );
    add(
        "IPv4 fragment (more-fragments set)",
        "ipv4_fragment",
        &write,
        &|f| f[IP + 6] = 0x20,
        true,
    );
    add(
        "IPv4 header checksum wrong",
        "ipv4_checksum",
        &write,
        &|f| f[IP + 11] ^= 0x01,
        false,
    );
    add(
        "IPv4 total length beyond the frame",
        "ip_length",
        &write,
        &|f| {
            let l = u16::from_be_bytes([f[IP + 2], f[IP + 3]]) + 8;
            f[IP + 2..IP + 4].copy_from_slice(&l.to_be_bytes());
            let c = {
                f[IP + 10] = 0;
                f[IP + 11] = 0;
                super::internet_checksum(&f[IP..IP + 20])
            };
            f[IP + 10..IP + 12].copy_from_slice(&c.to_be_bytes());
        },
        false,
    );
    add(
        "IPv4 carrying TCP",
        "not_udp",
        &write,
        &|f| f[IP + 9] = 6,
        true,
    );
    add(
        "IPv6 with a hop-by-hop extension header",
        "not_udp",
        &write6,
        &|f| f[IP + 6] = 0,
        true,
    );
    add(
        "IPv6 payload length beyond the frame",
        "ip_length",
        &write6,
        &|f| f[IP + 5] += 8,
        false,
    );
    add(
        "UDP to port 4790, not 4791",
        "not_roce",
        &write,
        &|f| f[UDP + 3] = 0xb6,
        true,
    );
    add(
        "UDP length disagrees with IP",
        "udp_length",
        &write,
        &|f| f[UDP + 5] -= 4,
        true,
    );
    add(
        "UDP datagram too short for BTH and ICRC",
        "truncated",
        &write,
        &|f| {
            let n = (20 + 8 + 8) as u16;
            f[IP + 2..IP + 4].copy_from_slice(&n.to_be_bytes());
            f[UDP + 4..UDP + 6].copy_from_slice(&16u16.to_be_bytes());
            f.truncate(IP + 36);
        },
        true,
    );
    add("BTH TVer 1", "tver", &write, &|f| f[BTH + 1] |= 0x01, true);
    add(
        "reserved opcode 0x15",
        "reserved_opcode",
        &ack,
        &|f| f[BTH] = 0x15,
        true,
    );
    add(
        "RD opcode 0x44 (RD SEND_ONLY)",
        "unsupported_opcode",
        &send,
        &|f| f[BTH] = 0x44,
        true,
    );
    add(
        "WRITE_ONLY cut inside its RETH",
        "truncated",
        &ack,
        &|f| f[BTH] = 0x0a,
        true,
    );
    add(
        "pad count 3 with an empty payload field",
        "bad_pad",
        &empty_send,
        &|f| f[BTH + 1] = 0x30 | (f[BTH + 1] & 0xcf),
        true,
    );
    add(
        "payload field not a multiple of four",
        "bad_pad",
        &send,
        &|f| {
            // Drop one pad byte: 13 bytes of payload with pad 3 becomes a 15-byte field.
            let icrc_at = f.len() - 4;
            f.remove(icrc_at - 1);
            grow_ipv4_datagram(f, -1);
        },
        true,
    );
    add(
        "non-zero pad on a WRITE_FIRST",
        "bad_pad",
        &write,
        &|f| {
            f[BTH] = 0x06;
            f[BTH + 1] |= 0x10;
        },
        true,
    );
    add(
        "ACK with four payload bytes",
        "unexpected_payload",
        &ack,
        &|f| {
            let at = f.len() - 4;
            f.splice(at..at, [0u8; 4]);
            grow_ipv4_datagram(f, 4);
        },
        true,
    );
    add(
        "ICRC wrong (payload bit flipped after sealing)",
        "bad_icrc",
        &write,
        &|f| {
            let at = f.len() - 10;
            f[at] ^= 0x04;
        },
        false,
    );
    add(
        "ICRC wrong (IPv6)",
        "bad_icrc",
        &write6,
        &|f| {
            let at = f.len() - 1;
            f[at] ^= 0x80;
        },
        false,
    );
    out
}
