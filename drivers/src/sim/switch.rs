//! Switches of the simulated fabric: shortest-path forwarding by destination MAC, ECMP over
//! equal-cost egress ports by hashing the flow, and a hook for in-network logic.

use ferroce_stack::wire::{
    EthernetFrame, Ipv4Packet, Ipv6Packet, UdpPacket, ETHERTYPE_IPV4, ETHERTYPE_IPV6,
};

/// How a switch picks among equal-cost egress ports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum EcmpHash {
    /// CRC-32 of the 5-tuple (addresses, protocol, ports) salted per switch, as a data-centre
    /// switch hashes; the UDP source port is what senders vary to change path.
    #[default]
    FiveTuple,
    /// `udp_src_port mod n`: a predictable map from source port to path, handy when an
    /// experiment wants to name its paths.
    SourcePortModulo,
}

/// The flow fields ECMP hashes on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FlowKey {
    /// Source address bytes (IPv4 in the first four).
    pub src: [u8; 16],
    /// Destination address bytes.
    pub dst: [u8; 16],
    /// IP protocol.
    pub proto: u8,
    /// UDP source port (0 when not UDP).
    pub src_port: u16,
    /// UDP destination port (0 when not UDP).
    pub dst_port: u16,
}

impl FlowKey {
    /// Reads the flow fields of a frame; non-IP frames get an all-zero key. Never panics.
    pub fn of(frame: &[u8]) -> Self {
        let mut key = Self::default();
        let Ok(eth) = EthernetFrame::new_checked(frame) else {
            return key;
        };
        let l3 = eth.payload();
        let l4 = match eth.ethertype() {
            ETHERTYPE_IPV4 => match Ipv4Packet::new_checked(l3) {
                Ok(ip) => {
                    key.src[..4].copy_from_slice(&ip.src().octets());
                    key.dst[..4].copy_from_slice(&ip.dst().octets());
                    key.proto = ip.protocol();
                    l3.get(usize::from(ip.ihl()) * 4..)
                }
                Err(_) => None,
            },
            ETHERTYPE_IPV6 => match Ipv6Packet::new_checked(l3) {
                Ok(ip) => {
                    key.src = ip.src().octets();
                    key.dst = ip.dst().octets();
                    key.proto = ip.next_header();
                    l3.get(40..)
                }
                Err(_) => None,
            },
            _ => None,
        };
        if key.proto == 17 {
            if let Some(Ok(udp)) = l4.map(UdpPacket::new_checked) {
                key.src_port = udp.src_port();
                key.dst_port = udp.dst_port();
            }
        }
        key
    }

    /// Index in `0..n` of the egress a switch with `salt` picks.
    pub fn pick(&self, hash: EcmpHash, salt: u32, n: usize) -> usize {
        if n <= 1 {
            return 0;
        }
        match hash {
            EcmpHash::SourcePortModulo => usize::from(self.src_port) % n,
            EcmpHash::FiveTuple => {
                let mut h = crc32fast::Hasher::new_with_initial(salt);
                h.update(&self.src);
                h.update(&self.dst);
                h.update(&[self.proto]);
                h.update(&self.src_port.to_be_bytes());
                h.update(&self.dst_port.to_be_bytes());
                h.finalize() as usize % n
            }
        }
    }
}

ferroce_stack::counter_set! {
    /// Counters of one switch.
    pub struct SwitchStats {
        /// Frames forwarded.
        forwarded,
        /// Frames with no route to their destination MAC (multicast included: the fabric does
        /// not flood).
        no_route,
        /// Frames a hook dropped.
        hook_dropped,
        /// Frames a hook originated.
        hook_emitted,
    }
}
