//! The invariant CRC of RoCEv2 (IBTA Vol 1 §7.8.1 and Annex A17.4.3.2).
//!
//! The ICRC is CRC-32 (the Ethernet polynomial, reflected, initial value and final XOR all
//! ones) over: eight bytes of ones standing in for the InfiniBand LRH, then the IP header, UDP
//! header, BTH, extension headers, payload and pad. Fields a router may change are replaced by
//! ones before the CRC sees them:
//! - IPv4: the whole type-of-service byte (DSCP and ECN), TTL and the header checksum;
//! - IPv6: traffic class, flow label and hop limit;
//! - UDP: the checksum;
//! - BTH: the reserved byte 4 (resv8a, which holds FECN/BECN).
//!
//! The result goes on the wire least-significant byte first, like the Ethernet FCS.
//!
//! Masking needs a private copy of the headers. The copy also takes the first bytes after them,
//! so a small frame is one CRC call on one buffer: crc32fast's carry-less-multiply path only
//! starts at 128 bytes, and two short calls would each run the slower table code.

/// Bytes of the ICRC trailer.
pub const ICRC_LEN: usize = 4;

/// Room for the LRH stand-in plus the longest masked prefix (IPv6 + UDP + BTH = 60 bytes) and
/// enough following bytes to reach crc32fast's fast path in one call.
const SCRATCH: usize = 256;

/// Computes the ICRC of a packet. `ip_packet` runs from the first byte of the IP header to the
/// last pad byte (the ICRC itself excluded); `ip_version` is 4 or 6. The caller guarantees the
/// slice holds at least the IP, UDP and BTH headers.
pub fn compute(ip_packet: &[u8], ip_version: u8) -> u32 {
    let mut scratch = [0u8; SCRATCH];
    scratch[..8].fill(0xff);
    let head = ip_packet.len().min(SCRATCH - 8);
    scratch[8..8 + head].copy_from_slice(&ip_packet[..head]);
    let ip = &mut scratch[8..];
    let udp = if ip_version == 4 {
        ip[1] = 0xff; // DSCP + ECN
        ip[8] = 0xff; // TTL
        ip[10] = 0xff; // header checksum
        ip[11] = 0xff;
        20
    } else {
        ip[0] |= 0x0f; // traffic class, high nibble
        ip[1] = 0xff; // traffic class low nibble + flow label
        ip[2] = 0xff;
        ip[3] = 0xff;
        ip[7] = 0xff; // hop limit
        40
    };
    ip[udp + 6] = 0xff; // UDP checksum
    ip[udp + 7] = 0xff;
    ip[udp + 8 + 4] = 0xff; // BTH resv8a
    let mut h = crc32fast::Hasher::new();
    h.update(&scratch[..8 + head]);
    h.update(&ip_packet[head..]);
    h.finalize()
}

/// Reads the ICRC trailer as it sits on the wire.
pub fn read(trailer: &[u8]) -> u32 {
    u32::from_le_bytes([trailer[0], trailer[1], trailer[2], trailer[3]])
}

/// Writes an ICRC value into a trailer.
pub fn write(icrc: u32, trailer: &mut [u8]) {
    trailer[..4].copy_from_slice(&icrc.to_le_bytes());
}
