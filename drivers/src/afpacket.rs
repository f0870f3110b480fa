//! AF_PACKET: raw Ethernet frames on any Linux interface (veth, TAP, a physical NIC), no
//! DPDK needed, root (CAP_NET_RAW) required.
//!
//! Frames move through PACKET_MMAP rings (TPACKET_V2, one receive ring and one transmit ring
//! shared with the kernel): receiving is reading slots the kernel marked, with no system call
//! when nothing arrived; transmitting fills slots in place and one `send` per burst hands them
//! to the kernel. V2 rather than V3 because V3 hands over whole blocks, on a timer when traffic
//! is light, which adds up to a millisecond to every ACK. If the rings cannot be set up (or
//! `FERROCE_AFPACKET_NO_RING` is set), bursts of `recvmmsg` / `sendmmsg` do the same job. The
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
    mac: MacAddr,
    mtu: usize,
    ip: Option<IpAddr>,
    rx_bufs: Vec<Vec<u8>>,
    rings: Option<Rings>,
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
        let (mac, mtu) = mac_and_mtu(fd.as_raw_fd(), ifname)?;
        // Rings are set up before bind, so no frame arrives outside them.
        let rings = if std::env::var_os("FERROCE_AFPACKET_NO_RING").is_some() {
            None
        } else {
            Rings::new(fd.as_raw_fd(), mtu).ok()
        };
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
        let ip = interface_ip(ifname);
        let hold = ip.and_then(|ip| UdpSocket::bind((ip, 4791)).ok());
        Ok(Self {
            fd,
            ifname: ifname.into(),
            mac,
            mtu,
            ip,
            rx_bufs: if rings.is_some() {
                Vec::new()
            } else {
                (0..BURST).map(|_| vec![0; FRAME_BUF]).collect()
            },
            rings,
            pending: Vec::new(),
            spare: Vec::new(),
            epoch: Instant::now(),
            _hold_4791: hold,
            tx_dropped: 0,
        })
    }

    /// True when frames move through PACKET_MMAP rings (else `recvmmsg` / `sendmmsg`).
    pub fn uses_rings(&self) -> bool {
        self.rings.is_some()
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
        if let Some(r) = &mut self.rings {
            return r.rx(max, f);
        }
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
        if let Some(r) = &mut self.rings {
            return r.tx(self.fd.as_raw_fd(), len, fill);
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
        if let Some(r) = &mut self.rings {
            return r.flush(self.fd.as_raw_fd());
        }
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
            tx_split_min: None,
        }
    }

    fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }
}

/// Where a transmit slot's frame starts: after the aligned V2 header. (TPACKET2_HDRLEN also
/// counts a sockaddr_ll, which the kernel subtracts again for transmit slots.)
const TX_DATA_OFFSET: usize = libc::TPACKET2_HDRLEN - std::mem::size_of::<libc::sockaddr_ll>();

/// Bytes of one ring block (the kernel's allocation unit).
const RING_BLOCK: usize = 1 << 20;
/// Blocks per ring.
const RING_BLOCKS: usize = 16;

/// A TPACKET_V2 receive ring and transmit ring mapped from one socket.
struct Rings {
    map: *mut u8,
    map_len: usize,
    frame_size: usize,
    frames: usize,
    rx_next: usize,
    tx_next: usize,
    tx_pending: usize,
}

// SAFETY: the mapping belongs to this value alone; moving it to another thread moves the
// only handle (the socket moves with the port).
unsafe impl Send for Rings {}

impl Rings {
    fn new(fd: i32, mtu: usize) -> io::Result<Self> {
        let version: libc::c_int = libc::tpacket_versions::TPACKET_V2 as libc::c_int;
        // SAFETY: setsockopt with an int of the size passed.
        if unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_PACKET,
                libc::PACKET_VERSION,
                (&raw const version).cast(),
                std::mem::size_of::<libc::c_int>() as u32,
            )
        } < 0
        {
            return Err(io::Error::last_os_error());
        }
        // A slot holds the header, the kernel's sockaddr_ll and the largest frame.
        let need = libc::TPACKET2_HDRLEN + std::mem::size_of::<libc::sockaddr_ll>() + mtu + 18 + 64;
        let frame_size = need.next_power_of_two().max(2048);
        if frame_size > RING_BLOCK {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "MTU too large for the ring",
            ));
        }
        let frames = RING_BLOCK / frame_size * RING_BLOCKS;
        let req = libc::tpacket_req {
            tp_block_size: RING_BLOCK as u32,
            tp_block_nr: RING_BLOCKS as u32,
            tp_frame_size: frame_size as u32,
            tp_frame_nr: frames as u32,
        };
        for opt in [libc::PACKET_RX_RING, libc::PACKET_TX_RING] {
            // SAFETY: setsockopt with a tpacket_req of the size passed.
            if unsafe {
                libc::setsockopt(
                    fd,
                    libc::SOL_PACKET,
                    opt,
                    (&raw const req).cast(),
                    std::mem::size_of::<libc::tpacket_req>() as u32,
                )
            } < 0
            {
                return Err(io::Error::last_os_error());
            }
        }
        let map_len = 2 * RING_BLOCK * RING_BLOCKS;
        // SAFETY: maps the two rings the kernel just allocated for this socket (receive ring
        // first, then transmit ring, as packet_mmap lays them out); checked below.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if map == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Self {
            map: map.cast(),
            map_len,
            frame_size,
            frames,
            rx_next: 0,
            tx_next: 0,
            tx_pending: 0,
        })
    }

    /// The header of receive slot `i` (`tx` false) or transmit slot `i`.
    fn slot(&self, tx: bool, i: usize) -> *mut libc::tpacket2_hdr {
        let ring = if tx { RING_BLOCK * RING_BLOCKS } else { 0 };
        // Frames never straddle blocks: a block holds a whole number of them.
        let per_block = RING_BLOCK / self.frame_size;
        let offset = ring + (i / per_block) * RING_BLOCK + (i % per_block) * self.frame_size;
        // SAFETY: `offset` is inside the mapping (i < frames, rings laid out as above).
        unsafe { self.map.add(offset).cast() }
    }

    fn status(h: *mut libc::tpacket2_hdr) -> u32 {
        // SAFETY: `h` points at a slot header inside the mapping; the kernel writes the status
        // concurrently, hence the volatile read and the acquire fence after it.
        let s = unsafe { std::ptr::read_volatile(&raw const (*h).tp_status) };
        std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
        s
    }

    fn set_status(h: *mut libc::tpacket2_hdr, s: u32) {
        std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
        // SAFETY: as in `status`; the release fence orders our writes to the slot before it.
        unsafe { std::ptr::write_volatile(&raw mut (*h).tp_status, s) };
    }

    fn rx<F: FnMut(&[u8])>(&mut self, max: usize, mut f: F) -> usize {
        let mut n = 0;
        while n < max {
            let h = self.slot(false, self.rx_next);
            if Self::status(h) & libc::TP_STATUS_USER == 0 {
                break;
            }
            // SAFETY: the kernel handed this slot to us (TP_STATUS_USER): its header and the
            // frame at tp_mac (tp_snaplen bytes, within the slot) are ours until we give it
            // back below.
            unsafe {
                let mac = usize::from((*h).tp_mac);
                let len = ((*h).tp_snaplen as usize).min(self.frame_size.saturating_sub(mac));
                let frame = std::slice::from_raw_parts(h.cast::<u8>().add(mac), len);
                f(frame);
            }
            Self::set_status(h, libc::TP_STATUS_KERNEL);
            self.rx_next = (self.rx_next + 1) % self.frames;
            n += 1;
        }
        n
    }

    fn tx<F: FnOnce(&mut [u8])>(&mut self, fd: i32, len: usize, fill: F) -> Result<(), TxError> {
        let room = self.frame_size - TX_DATA_OFFSET;
        if len > room {
            return Err(TxError::TooLong { len, max: room });
        }
        let mut h = self.slot(true, self.tx_next);
        if Self::status(h) != libc::TP_STATUS_AVAILABLE {
            // The ring is full of frames the kernel has not sent: push them out, look again.
            self.flush(fd);
            h = self.slot(true, self.tx_next);
            if Self::status(h) != libc::TP_STATUS_AVAILABLE {
                return Err(TxError::RingFull);
            }
        }
        // SAFETY: the slot is ours (TP_STATUS_AVAILABLE); its data area starts after the
        // aligned header (the kernel's default for V2 without PACKET_TX_HAS_OFF) and `len`
        // fits the slot, checked above.
        unsafe {
            let data = std::slice::from_raw_parts_mut(h.cast::<u8>().add(TX_DATA_OFFSET), len);
            fill(data);
            (*h).tp_len = len as u32;
        }
        Self::set_status(h, libc::TP_STATUS_SEND_REQUEST);
        self.tx_next = (self.tx_next + 1) % self.frames;
        self.tx_pending += 1;
        Ok(())
    }

    fn flush(&mut self, fd: i32) -> usize {
        if self.tx_pending == 0 {
            return 0;
        }
        // SAFETY: a zero-length send on a packet socket with a TX ring transmits the slots
        // marked SEND_REQUEST; no buffer is read.
        unsafe { libc::send(fd, std::ptr::null(), 0, libc::MSG_DONTWAIT) };
        std::mem::take(&mut self.tx_pending)
    }
}

impl Drop for Rings {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `new`, once.
        unsafe { libc::munmap(self.map.cast(), self.map_len) };
    }
}
