//! AF_PACKET: raw Ethernet frames on any Linux interface (veth, TAP, a physical NIC), no
//! DPDK needed, root (CAP_NET_RAW) required.
//!
//! This first version moves frames with `recvmmsg` / `sendmmsg` on a non-blocking socket bound
//! to the interface, a burst per system call; PACKET_MMAP (TPACKET_V3) rings come next. The
//! socket ignores its own outgoing frames (PACKET_IGNORE_OUTGOING). To keep the kernel from
//! answering RoCEv2 datagrams with ICMP port-unreachable, the port also holds UDP port 4791 on
//! the interface's address with a socket it never reads.

use std::ffi::CString;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Instant;

use ferroce_stack::wire::{Checks, MacAddr};

use crate::port::{LinkState, Port, PortCapabilities, TxError};

/// Frames per receive or send system call.
pub const BURST: usize = 32;
/// Receive buffer per frame: a jumbo frame and its VLAN tag.
const FRAME_BUF: usize = 9216 + 18;

/// A port on a Linux interface through an AF_PACKET socket.
pub struct AfPacketPort {
    fd: OwnedFd,
    ifname: String,
    ifindex: i32,
    mac: MacAddr,
    mtu: usize,
    ip: Option<IpAddr>,
    rx_bufs: Vec<Vec<u8>>,
    pending: Vec<Vec<u8>>,
    spare: Vec<Vec<u8>>,
    epoch: Instant,
    _hold_4791: Option<UdpSocket>,
    /// Frames `sendmmsg` did not take.
    pub tx_dropped: u64,
}

fn last_error(what: &str, ifname: &str) -> io::Error {
    let e = io::Error::last_os_error();
    io::Error::new(e.kind(), format!("{what} on {ifname}: {e}"))
}

impl AfPacketPort {
    /// Opens `ifname`. Fails with a clear message when the interface does not exist or the
    /// process lacks CAP_NET_RAW.
    pub fn open(ifname: &str) -> io::Result<Self> {
        let cname = CString::new(ifname)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "interface name has a NUL"))?;
        // SAFETY: `cname` is a valid C string for the duration of the call.
        let ifindex = unsafe { libc::if_nametoindex(cname.as_ptr()) } as i32;
        if ifindex == 0 {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("no network interface named '{ifname}'"),
            ));
        }
        let proto = (libc::ETH_P_ALL as u16).to_be();
        // SAFETY: plain socket(2) call; the result is checked before use.
        let raw = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                i32::from(proto),
            )
        };
        if raw < 0 {
            let e = io::Error::last_os_error();
            let hint = if e.raw_os_error() == Some(libc::EPERM) {
                " (AF_PACKET needs root or CAP_NET_RAW)"
            } else {
                ""
            };
            return Err(io::Error::new(
                e.kind(),
                format!("cannot open a raw socket for {ifname}: {e}{hint}"),
            ));
        }
        // SAFETY: `raw` is a fresh descriptor we own from here on.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: sockaddr_ll is plain data; all-zero is a valid starting value.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = proto;
        sll.sll_ifindex = ifindex;
        // SAFETY: `sll` is a properly initialised sockaddr_ll of the size passed.
        let rc = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&raw const sll).cast::<libc::sockaddr>(),
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            )
        };
        if rc < 0 {
            return Err(last_error("bind", ifname));
        }
        let one: libc::c_int = 1;
        // SAFETY: setsockopt with a pointer to an int of the size passed. Failure (kernels
        // before 4.20) only means our own frames come back and are dropped as not ours.
        unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_PACKET,
                libc::PACKET_IGNORE_OUTGOING,
                (&raw const one).cast(),
                std::mem::size_of::<libc::c_int>() as u32,
            );
        }
        // Socket buffers deep enough for a Go-Back-N window (the *FORCE options pass
        // net.core.rmem_max as root; the plain ones are the fallback), and transmit straight
        // to the driver without the qdisc layer.
        let big: libc::c_int = 64 << 20;
        for (force, plain) in [
            (libc::SO_RCVBUFFORCE, libc::SO_RCVBUF),
            (libc::SO_SNDBUFFORCE, libc::SO_SNDBUF),
        ] {
            for opt in [force, plain] {
                // SAFETY: setsockopt with a pointer to an int of the size passed; a smaller
                // buffer is only slower.
                let rc = unsafe {
                    libc::setsockopt(
                        fd.as_raw_fd(),
                        libc::SOL_SOCKET,
                        opt,
                        (&raw const big).cast(),
                        std::mem::size_of::<libc::c_int>() as u32,
                    )
                };
                if rc == 0 {
                    break;
                }
            }
        }
        // SAFETY: as above.
        unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_PACKET,
                libc::PACKET_QDISC_BYPASS,
                (&raw const one).cast(),
                std::mem::size_of::<libc::c_int>() as u32,
            );
        }
        let (mac, mtu) = mac_and_mtu(fd.as_raw_fd(), ifname)?;
        let ip = interface_ip(ifname);
        let hold = ip.and_then(|ip| UdpSocket::bind((ip, 4791)).ok());
        Ok(Self {
            fd,
            ifname: ifname.into(),
            ifindex,
            mac,
            mtu,
            ip,
            rx_bufs: (0..BURST).map(|_| vec![0; FRAME_BUF]).collect(),
            pending: Vec::new(),
            spare: Vec::new(),
            epoch: Instant::now(),
            _hold_4791: hold,
            tx_dropped: 0,
        })
    }

    /// The interface's name.
    pub fn name(&self) -> &str {
        &self.ifname
    }

    /// The interface's first IPv4 address (else IPv6), the RoCEv2 GID of this port.
    pub fn ip(&self) -> Option<IpAddr> {
        self.ip
    }
}

fn mac_and_mtu(fd: i32, ifname: &str) -> io::Result<(MacAddr, usize)> {
    // SAFETY: ifreq is plain data; all-zero is valid.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req
        .ifr_name
        .iter_mut()
        .zip(ifname.bytes().take(libc::IFNAMSIZ - 1))
    {
        *dst = src as libc::c_char;
    }
    // SAFETY: SIOCGIFHWADDR fills `ifr_hwaddr` of the ifreq we pass.
    if unsafe { libc::ioctl(fd, libc::SIOCGIFHWADDR, &mut req) } < 0 {
        return Err(last_error("SIOCGIFHWADDR", ifname));
    }
    // SAFETY: the ioctl above initialised the hwaddr member of the union.
    let hw = unsafe { req.ifr_ifru.ifru_hwaddr.sa_data };
    let mut mac = [0u8; 6];
    for (d, s) in mac.iter_mut().zip(hw.iter()) {
        *d = *s as u8;
    }
    // SAFETY: SIOCGIFMTU fills `ifr_mtu`.
    if unsafe { libc::ioctl(fd, libc::SIOCGIFMTU, &mut req) } < 0 {
        return Err(last_error("SIOCGIFMTU", ifname));
    }
    // SAFETY: the ioctl above initialised the mtu member.
    let mtu = unsafe { req.ifr_ifru.ifru_mtu } as usize;
    Ok((MacAddr(mac), mtu))
}

/// The first IPv4 (else IPv6) address of `ifname`, from getifaddrs.
pub fn interface_ip(ifname: &str) -> Option<IpAddr> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs allocates a list we free below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return None;
    }
    let mut v4 = None;
    let mut v6 = None;
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, alive until freeifaddrs.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_addr.is_null() {
            continue;
        }
        // SAFETY: ifa_name is a NUL-terminated string owned by the list.
        let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) };
        if name.to_bytes() != ifname.as_bytes() {
            continue;
        }
        // SAFETY: ifa_addr points at a sockaddr whose family says which struct it is.
        let family = i32::from(unsafe { (*ifa.ifa_addr).sa_family });
        if family == libc::AF_INET && v4.is_none() {
            // SAFETY: family AF_INET means a sockaddr_in.
            let sin = unsafe { &*ifa.ifa_addr.cast::<libc::sockaddr_in>() };
            v4 = Some(IpAddr::V4(Ipv4Addr::from(u32::from_be(
                sin.sin_addr.s_addr,
            ))));
        } else if family == libc::AF_INET6 && v6.is_none() {
            // SAFETY: family AF_INET6 means a sockaddr_in6.
            let sin6 = unsafe { &*ifa.ifa_addr.cast::<libc::sockaddr_in6>() };
            v6 = Some(IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr)));
        }
    }
    // SAFETY: `head` came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    v4.or(v6)
}

impl Port for AfPacketPort {
    fn rx_burst<F: FnMut(&[u8])>(&mut self, max: usize, mut f: F) -> usize {
        let n = max.min(BURST);
        if n == 0 {
            return 0;
        }
        // SAFETY: iovec/mmsghdr are plain data; zero is a valid start.
        let mut iov: [libc::iovec; BURST] = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut msgs: [libc::mmsghdr; BURST] = unsafe { std::mem::zeroed() };
        for i in 0..n {
            iov[i].iov_base = self.rx_bufs[i].as_mut_ptr().cast();
            iov[i].iov_len = self.rx_bufs[i].len();
            msgs[i].msg_hdr.msg_iov = &raw mut iov[i];
            msgs[i].msg_hdr.msg_iovlen = 1;
        }
        // SAFETY: `msgs[..n]` point at `iov[..n]`, which point at buffers we own of the
        // lengths given; the kernel writes at most those lengths.
        let got = unsafe {
            libc::recvmmsg(
                self.fd.as_raw_fd(),
                msgs.as_mut_ptr(),
                n as u32,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        if got <= 0 {
            return 0;
        }
        for (m, buf) in msgs.iter().zip(&self.rx_bufs).take(got as usize) {
            let len = (m.msg_len as usize).min(buf.len());
            f(&buf[..len]);
        }
        got as usize
    }

    fn tx<F: FnOnce(&mut [u8])>(&mut self, len: usize, fill: F) -> Result<(), TxError> {
        let max = self.mtu + 18;
        if len > max {
            return Err(TxError::TooLong { len, max });
        }
        if self.pending.len() >= BURST {
            self.flush();
        }
        let mut buf = self.spare.pop().unwrap_or_default();
        buf.clear();
        buf.resize(len, 0);
        fill(&mut buf);
        self.pending.push(buf);
        Ok(())
    }

    fn flush(&mut self) -> usize {
        let mut sent = 0;
        while !self.pending.is_empty() {
            let n = self.pending.len().min(BURST);
            // SAFETY: plain data, zero-initialised.
            let mut iov: [libc::iovec; BURST] = unsafe { std::mem::zeroed() };
            // SAFETY: as above.
            let mut msgs: [libc::mmsghdr; BURST] = unsafe { std::mem::zeroed() };
            for i in 0..n {
                iov[i].iov_base = self.pending[i].as_mut_ptr().cast();
                iov[i].iov_len = self.pending[i].len();
                msgs[i].msg_hdr.msg_iov = &raw mut iov[i];
                msgs[i].msg_hdr.msg_iovlen = 1;
            }
            // SAFETY: the headers point at our pending buffers with their lengths; the socket
            // is bound to the interface, so no address is needed.
            let done = unsafe {
                libc::sendmmsg(
                    self.fd.as_raw_fd(),
                    msgs.as_mut_ptr(),
                    n as u32,
                    libc::MSG_DONTWAIT,
                )
            };
            let done = if done < 0 { 0 } else { done as usize };
            if done == 0 {
                // The socket buffer is full: drop the rest, as a full NIC ring would.
                self.tx_dropped += self.pending.len() as u64;
                let rest: Vec<_> = self.pending.drain(..).collect();
                self.spare.extend(rest);
                break;
            }
            sent += done;
            let used: Vec<_> = self.pending.drain(..done).collect();
            if self.spare.len() < 256 {
                self.spare.extend(used);
            }
        }
        sent
    }

    fn link_state(&self) -> LinkState {
        // SAFETY: ifreq is plain data.
        let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
        for (dst, src) in req
            .ifr_name
            .iter_mut()
            .zip(self.ifname.bytes().take(libc::IFNAMSIZ - 1))
        {
            *dst = src as libc::c_char;
        }
        // SAFETY: SIOCGIFFLAGS fills `ifr_flags`.
        if unsafe { libc::ioctl(self.fd.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) } < 0 {
            return LinkState::Down;
        }
        // SAFETY: the ioctl initialised the flags member.
        let flags = i32::from(unsafe { req.ifr_ifru.ifru_flags });
        let _ = self.ifindex;
        if flags & libc::IFF_UP != 0 && flags & libc::IFF_RUNNING != 0 {
            LinkState::Up
        } else {
            LinkState::Down
        }
    }

    fn mac(&self) -> MacAddr {
        self.mac
    }

    fn mtu(&self) -> usize {
        self.mtu
    }

    fn capabilities(&self) -> PortCapabilities {
        PortCapabilities {
            max_burst: BURST,
            rx_checks: Checks::ALL,
        }
    }

    fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }
}
