//! Deterministic sample frames: one well-formed [`RoceRepr`] per opcode, used by golden
//! vectors, benchmarks, fuzz seeds and the demo so they all speak about the same bytes.

use core::net::{Ipv4Addr, Ipv6Addr};

use super::{
    AethRepr, AtomicAckEthRepr, AtomicEthRepr, BthRepr, DethRepr, Ecn, EthernetRepr, ExtHeaders,
    Headers, IethRepr, ImmDtRepr, IpRepr, Ipv4Repr, Ipv6Repr, MacAddr, Msn, Opcode, Psn, Qpn,
    RethRepr, VlanTag, ETHERTYPE_IPV4,
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
    let info = opcode.info().expect("sample_repr needs an opcode ferroce speaks");
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
            dma_len: if info.payload { payload_len as u32 } else { 4096 },
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
        payload_len: if info.payload { payload_len } else { 0 },
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
