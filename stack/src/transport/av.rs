//! The address vector (`ibv_ah_attr` for RoCEv2: MACs, GIDs as IP addresses, traffic
//! class, hop limit, UDP source port) and the header template a QP builds from it once, at
//! RTR, for every packet it sends.

use core::net::IpAddr;

use crate::wire::{
    BthRepr, Ecn, EthernetRepr, HeaderImage, IpRepr, Ipv4Repr, Ipv6Repr, MacAddr, Opcode, Psn, Qpn,
    RoceRepr, VlanTag, DEFAULT_PKEY, ETHERTYPE_IPV4,
};

/// How frames reach the peer: the addressing of every packet of a connected QP, or of one UD
/// send. The verbs layer fills the source fields from the port; a GID maps to `src`/`dst`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AddressVector {
    /// Our MAC.
    pub smac: MacAddr,
    /// The next hop's MAC.
    pub dmac: MacAddr,
    /// Optional 802.1Q tag.
    pub vlan: Option<VlanTag>,
    /// Our IP address (the source GID).
    pub src: IpAddr,
    /// The peer's IP address (the destination GID).
    pub dst: IpAddr,
    /// GRH traffic class: DSCP in the top six bits, ECN in the low two. Data leaves
    /// ECN-capable whatever they say — ECT(1) when they say so, ECT(0) otherwise — because a
    /// RoCE fabric's congestion control works through switches marking ECN-capable packets
    /// (a ConnectX with RoCE congestion control on does the same).
    pub traffic_class: u8,
    /// Hop limit / TTL.
    pub hop_limit: u8,
    /// IPv6 flow label.
    pub flow_label: u32,
    /// UDP source port (flow entropy); `None` derives one from the QP numbers, as ConnectX
    /// does, so different QPs spread over ECMP paths.
    pub udp_src_port: Option<u16>,
}

impl Default for AddressVector {
    fn default() -> Self {
        Self {
            smac: MacAddr([0; 6]),
            dmac: MacAddr([0; 6]),
            vlan: None,
            src: IpAddr::V4(core::net::Ipv4Addr::UNSPECIFIED),
            dst: IpAddr::V4(core::net::Ipv4Addr::UNSPECIFIED),
            traffic_class: 0,
            hop_limit: 64,
            flow_label: 0,
            udp_src_port: None,
        }
    }
}

impl AddressVector {
    /// The frame headers for packets on this path to `dest_qpn` (opcode, PSN and extension
    /// headers are filled per packet).
    pub(crate) fn template(&self, dest_qpn: Qpn, udp_src_port: u16) -> Template {
        let dscp = self.traffic_class >> 2;
        let ecn = match Ecn::from_bits(self.traffic_class) {
            Ecn::Ect1 => Ecn::Ect1,
            _ => Ecn::Ect0,
        };
        let ip = match (self.src, self.dst) {
            (IpAddr::V4(src), IpAddr::V4(dst)) => IpRepr::V4(Ipv4Repr {
                src,
                dst,
                dscp,
                ecn,
                ident: 0,
                dont_frag: true,
                ttl: self.hop_limit,
            }),
            (src, dst) => IpRepr::V6(Ipv6Repr {
                src: to_v6(src),
                dst: to_v6(dst),
                dscp,
                ecn,
                flow_label: self.flow_label & 0xf_ffff,
                hop_limit: self.hop_limit,
            }),
        };
        let mut bth = BthRepr::new(Opcode::RC_ACKNOWLEDGE, dest_qpn, Psn::new(0));
        bth.pkey = DEFAULT_PKEY;
        let eth = EthernetRepr {
            dst: self.dmac,
            src: self.smac,
            vlan: self.vlan,
            ethertype: ETHERTYPE_IPV4,
        };
        Template(HeaderImage::new(&eth, &ip, udp_src_port, &bth))
    }
}

/// What every packet on one path shares: addressing and the BTH fields fixed at RTR,
/// rendered to bytes once ([`HeaderImage`]), which each packet copies and patches.
/// Extension headers and lengths are per packet, so they are not kept: a connected QP holds
/// one of these, and an idle QP's footprint counts (`benches/transport.rs`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Template(HeaderImage);

impl Template {
    /// The UDP source port every packet on this path leaves from.
    pub(crate) fn udp_src_port(&self) -> u16 {
        self.0.udp_src_port()
    }

    /// The source MAC and address packets on this path leave from.
    pub(crate) fn source(&self) -> (MacAddr, IpAddr) {
        self.0.source()
    }

    /// The frame headers, no extension header, no payload.
    pub(crate) fn repr(&self) -> RoceRepr {
        self.0.repr()
    }

    /// The rendered headers.
    #[inline]
    pub(crate) fn image(&self) -> &HeaderImage {
        &self.0
    }
}

fn to_v6(a: IpAddr) -> core::net::Ipv6Addr {
    match a {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    }
}
