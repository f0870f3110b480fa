//! The congestion notification packet (IBTA Annex A17.9.3): what a RoCEv2 notification
//! point sends back to the sender of a packet that arrived with ECN CE, and what a ConnectX
//! sends in the same case. BTH opcode 0x81, BECN set, P_Key 0xFFFF, PSN 0, the destination
//! QP the sender's, 16 reserved zero bytes, no payload; UDP checksum 0, ICRC as always.

use super::{BthRepr, EthernetRepr, ExtHeaders, IpRepr, Opcode, Psn, Qpn, RoceRepr};

/// The P_Key a CNP carries.
pub const CNP_PKEY: u16 = 0xffff;

/// A CNP from `ip`'s source to its destination (addresses as the data packets' reply
/// would carry them) for the sender's QP `dest_qpn`.
pub fn cnp_repr(eth: EthernetRepr, ip: IpRepr, udp_src_port: u16, dest_qpn: Qpn) -> RoceRepr {
    let mut bth = BthRepr::new(Opcode::CNP, dest_qpn, Psn::new(0));
    bth.pkey = CNP_PKEY;
    bth.becn = true;
    RoceRepr {
        eth,
        ip,
        udp_src_port,
        bth,
        ext: ExtHeaders::default(),
        payload_len: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{Checks, Ecn, Ipv4Repr, MacAddr, ETHERTYPE_IPV4};
    use core::net::Ipv4Addr;

    /// A public software CNP generator's frame, IPv4 header to ICRC (issue 24): DSCP 34,
    /// ECT(1), identification 0x98c6, don't-fragment, TTL 32, 22.22.22.8 → 22.22.22.7, UDP
    /// source port 0xdbae, destination QP 0xd2. Built from those fields, ferroce's CNP is the
    /// same bytes, and parses back as a CNP.
    #[test]
    fn a_public_cnp_is_reproduced_byte_for_byte() {
        let vector = "4589003C98C640002011692716161608\
                      16161607DBAE12B7002800008100FFFF\
                      400000D2000000000000000000000000\
                      0000000000000000DAFC1BEF";
        let want: Vec<u8> = (0..vector.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&vector[i..i + 2], 16).unwrap())
            .collect();
        let eth = EthernetRepr {
            dst: MacAddr([2, 0, 0, 0, 0, 7]),
            src: MacAddr([2, 0, 0, 0, 0, 8]),
            vlan: None,
            ethertype: ETHERTYPE_IPV4,
        };
        let ip = IpRepr::V4(Ipv4Repr {
            src: Ipv4Addr::new(22, 22, 22, 8),
            dst: Ipv4Addr::new(22, 22, 22, 7),
            dscp: 34,
            ecn: Ecn::Ect1,
            ident: 0x98c6,
            dont_frag: true,
            ttl: 32,
        });
        let repr = cnp_repr(eth, ip, 0xdbae, Qpn::new(0xd2));
        let mut buf = [0u8; 128];
        let n = repr.emit(&mut buf, |_| {}).unwrap();
        assert_eq!(&buf[14..n], &want[..]);
        let back = RoceRepr::parse(&buf[..n], Checks::ALL).unwrap();
        assert_eq!(back.repr.bth.opcode, Opcode::CNP);
        assert!(back.repr.bth.becn);
        assert_eq!(back.repr.bth.dest_qpn, Qpn::new(0xd2));
    }
}
