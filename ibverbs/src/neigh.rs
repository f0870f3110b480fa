//! The next hop's MAC for a GID. A verbs program gives only the peer's GID (in `ah_attr` of
//! `modify_qp` and `create_ah`); a ConnectX driver asks the kernel's neighbour table, and so
//! does this library for a device on a Linux interface (`afpacket:IFACE`, `tap:NAME`): the
//! out-of-band TCP exchange the program just made over the same interface has usually filled
//! the entry already. When it has not, a datagram to the discard port makes the kernel
//! resolve it, and the table is read again for a few seconds. A port no kernel serves (a
//! DPDK port) has no such table: `FERROCE_NEIGH` gives its neighbours instead, as
//! `IP=MAC` pairs separated by `;` (it is consulted first for every device).

use std::net::{IpAddr, Ipv4Addr, UdpSocket};
use std::time::{Duration, Instant};

use ferroce_stack::wire::MacAddr;

/// How long to wait for the kernel to resolve an address.
const PATIENCE: Duration = Duration::from_secs(3);

/// The interface a device specification sends through (port 1's), if it is a Linux
/// interface.
pub fn interface(spec: &str) -> Option<&str> {
    interface_of(spec, 1)
}

/// The interface of port `port` (from 1) of a device specification, if it is a Linux
/// interface (`afpacket:veth0,veth1` has two).
pub fn interface_of(spec: &str, port: u8) -> Option<&str> {
    let i = usize::from(port.checked_sub(1)?);
    if let Some(rest) = spec.strip_prefix("afpacket:") {
        let ifaces = rest.split_whitespace().next()?;
        return ifaces.split(',').nth(i);
    }
    spec.strip_prefix("tap:")
        .filter(|_| i == 0)
        .map(|s| s.split('@').next().unwrap_or(s))
}

/// Parses `aa:bb:cc:dd:ee:ff`.
pub fn parse_mac(s: &str) -> Option<MacAddr> {
    let mut mac = [0u8; 6];
    let mut parts = s.trim().split(':');
    for b in &mut mac {
        *b = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    parts.next().is_none().then_some(MacAddr(mac))
}

/// The complete entry for `ip` on `iface` in a `/proc/net/arp` table.
fn lookup_arp(table: &str, ip: Ipv4Addr, iface: &str) -> Option<MacAddr> {
    table.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        // IP address, HW type, Flags, HW address, Mask, Device; flag 0x2 is ATF_COM.
        let complete = f
            .get(2)
            .and_then(|x| u32::from_str_radix(x.trim_start_matches("0x"), 16).ok())
            .is_some_and(|fl| fl & 2 != 0);
        (f.len() >= 6 && f[0].parse() == Ok(ip) && complete && f[5] == iface)
            .then(|| parse_mac(f[3]))
            .flatten()
    })
}

/// The environment variable with static neighbour entries.
pub const NEIGH_ENV: &str = "FERROCE_NEIGH";

/// The entry for `ip` in a `FERROCE_NEIGH` value (`IP=MAC;IP=MAC...`).
pub fn lookup_static(entries: &str, ip: IpAddr) -> Option<MacAddr> {
    entries.split(';').find_map(|e| {
        let (a, m) = e.trim().split_once('=')?;
        (a.trim().parse::<IpAddr>().ok()? == ip)
            .then(|| parse_mac(m))
            .flatten()
    })
}

/// The MAC of `ip` from `FERROCE_NEIGH`, if it names it.
pub fn configured(ip: IpAddr) -> Option<MacAddr> {
    lookup_static(&std::env::var(NEIGH_ENV).ok()?, ip)
}

/// The MAC of `ip` as `iface`'s neighbour, resolving it through the kernel when the table
/// lacks it. `None` when it does not resolve (no such host on the link) or for IPv6, whose
/// table this library does not read yet.
pub fn resolve(iface: &str, ip: IpAddr) -> Option<MacAddr> {
    let IpAddr::V4(v4) = ip else {
        return None;
    };
    let read = || {
        std::fs::read_to_string("/proc/net/arp")
            .ok()
            .and_then(|t| lookup_arp(&t, v4, iface))
    };
    if let Some(mac) = read() {
        return Some(mac);
    }
    // Any datagram makes the kernel resolve the next hop; the discard port asks nothing of
    // the peer (its ICMP reply, if any, is ignored).
    if let Ok(sock) = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)) {
        let _ = sock.send_to(&[0], (v4, 9));
    }
    let start = Instant::now();
    while start.elapsed() < PATIENCE {
        std::thread::sleep(Duration::from_millis(10));
        if let Some(mac) = read() {
            return Some(mac);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = "\
IP address       HW type     Flags       HW address            Mask     Device
192.168.77.2     0x1         0x2         02:aa:bb:cc:dd:02     *        fribv-va
192.168.77.3     0x1         0x0         00:00:00:00:00:00     *        fribv-va
10.0.0.9         0x1         0x2         02:aa:bb:cc:dd:09     *        eth0
";

    #[test]
    fn only_complete_entries_on_the_interface_resolve() {
        let ip = |s: &str| s.parse().unwrap();
        assert_eq!(
            lookup_arp(TABLE, ip("192.168.77.2"), "fribv-va"),
            Some(MacAddr([2, 0xaa, 0xbb, 0xcc, 0xdd, 2]))
        );
        // Incomplete entry.
        assert_eq!(lookup_arp(TABLE, ip("192.168.77.3"), "fribv-va"), None);
        // Another interface's neighbour.
        assert_eq!(lookup_arp(TABLE, ip("10.0.0.9"), "fribv-va"), None);
        assert_eq!(parse_mac("02:aa:bb:cc:dd"), None);
        assert_eq!(parse_mac("02:aa:bb:cc:dd:ee:ff"), None);
        assert_eq!(interface("tap:fr0@10.0.0.2"), Some("fr0"));
        assert_eq!(interface("dpdk:-l 1"), None);
        let conf = "10.0.0.2=02:00:00:00:00:02; 10.0.0.3 = 02:00:00:00:00:03;bad";
        assert_eq!(
            lookup_static(conf, "10.0.0.3".parse().unwrap()),
            Some(MacAddr([2, 0, 0, 0, 0, 3]))
        );
        assert_eq!(lookup_static(conf, "10.0.0.4".parse().unwrap()), None);
    }
}
