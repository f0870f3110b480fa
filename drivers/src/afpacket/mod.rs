//! AF_PACKET: raw Ethernet frames on any Linux interface (veth, TAP, a physical NIC), no
//! DPDK needed, root (CAP_NET_RAW) required.
//!
//! Frames move through PACKET_MMAP rings ([`ring`]): receiving is reading slots the kernel
//! marked, with no system call when nothing arrived; transmitting fills slots in place and
//! one `send` per burst hands them to the kernel. If the rings cannot be set up (or
//! `FERROCE_AFPACKET_NO_RING` is set), bursts of `recvmmsg` / `sendmmsg` do the same job. The
//! socket ignores its own outgoing frames (PACKET_IGNORE_OUTGOING). To keep the kernel from
//! answering RoCEv2 datagrams with ICMP port-unreachable, the port also holds UDP port 4791 on
//! the interface's address with a socket it never reads.
//!
//! With the `gso` option ([`AfPacketOptions::gso`]) runs of equal-sized data packets leave as
//! one UDP datagram the kernel or NIC segments, and arriving datagrams are split again
//! ([`gso`]); both ends of a virtual link must then use it.

use std::ffi::CString;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Instant;

use ferroce_stack::wire::{Checks, MacAddr};

use crate::port::{LinkState, Port, PortCapabilities, TxError};

mod gso;
mod ring;

use ferroce_stack::wire::{Span, SplitFrame};
use gso::{Batch, GSO_UDP_L4, VNET_HDR_LEN};
use ring::Rings;

/// Payloads from this size up leave from registered memory (`sendmsg` gathers them) when the
/// port segments (`gso`).
const GSO_SPLIT_MIN: usize = 512;

/// Splits a UDP datagram that arrived behind a virtio-net header asking for UDP_L4
/// segmentation of `gso_size` bytes into the packets it carries, in place, lending each to
/// `f`; returns how many. What a `gso` port does with each such datagram; public for the
/// fuzz target and for any driver that receives virtio-net headers (a TAP with IFF_VNET_HDR).
/// Never panics; a frame it does not understand is lent whole.
pub fn split_datagram(frame: &mut [u8], gso_size: usize, mut f: impl FnMut(&[u8])) -> usize {
    gso::split(frame, gso_size, &mut f)
}

/// `PACKET_VNET_HDR` from linux/if_packet.h (not in the libc crate).
const PACKET_VNET_HDR: libc::c_int = 15;

/// How an AF_PACKET port is opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AfPacketOptions {
    /// UDP segmentation offload: a run of equal-sized RoCEv2 packets of one QP leaves as one
    /// UDP datagram behind a virtio-net header (PACKET_VNET_HDR), which the kernel (software
    /// GSO) or a NIC with USO cuts into the original packets where it leaves a real device,
    /// and arriving segmented datagrams are split here. On a veth pair nothing is cut on the
    /// way, so the far end must be a ferroce port with `gso` too; a tap on the link
    /// (tcpdump, another raw socket) sees the datagrams whole.
    pub gso: bool,
}

/// Frames per receive or send system call.
pub const BURST: usize = 32;
/// Receive buffer per frame: a jumbo frame and its VLAN tag.
const FRAME_BUF: usize = 9216 + 18;
/// Largest datagram received with `gso`: 64 KiB of IP and its Ethernet header.
const GSO_MAX_FRAME: usize = 0xffff + 18;
/// A cache line: where received datagrams' payload is placed (see `rx_burst`).
const RX_ALIGN: usize = 64;

/// A port on a Linux interface through an AF_PACKET socket.
pub struct AfPacketPort {
    fd: OwnedFd,
    ifname: String,
    mac: MacAddr,
    mtu: usize,
    ip: Option<IpAddr>,
    rx_bufs: Vec<Vec<u8>>,
    /// Received frames are led by a virtio-net header (`gso`).
    vnet: bool,
    rings: Option<Rings>,
    pending: Vec<Vec<u8>>,
    spare: Vec<Vec<u8>>,
    epoch: Instant,
    /// With `gso`: the socket datagrams leave through, and the data packets waiting to
    /// leave as one.
    batch: Option<(OwnedFd, Box<Batch>)>,
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
        Self::open_with(ifname, AfPacketOptions::default())
    }

    /// [`open`](Self::open) with options.
    pub fn open_with(ifname: &str, opts: AfPacketOptions) -> io::Result<Self> {
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
        let fd = raw_socket(ifname, proto)?;
        let (mac, mtu) = mac_and_mtu(fd.as_raw_fd(), ifname)?;
        // Virtio-net headers are switched on before the rings, as the kernel requires.
        if opts.gso && !set_int(&fd, libc::SOL_PACKET, PACKET_VNET_HDR, 1) {
            return Err(last_error("PACKET_VNET_HDR (the gso option)", ifname));
        }
        // Rings are set up before bind, so no frame arrives outside them. With `gso` there is
        // no receive ring: a ring is filled by the kernel's softirq, which on a veth pair
        // runs on the *sending* process's CPU, so that CPU would copy every byte twice (out
        // of the sender's memory and into our ring). Received with recvmmsg, a datagram is
        // only queued there and copied here, on this process's CPU, as TCP's receiver copies.
        let rings = if opts.gso {
            Some(Rings::new(fd.as_raw_fd(), mtu, true).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("gso needs PACKET_MMAP rings on {ifname}: {e}"),
                )
            })?)
        } else if std::env::var_os("FERROCE_AFPACKET_NO_RING").is_some() {
            None
        } else {
            Rings::new(fd.as_raw_fd(), mtu, false).ok()
        };
        bind(&fd, ifindex, proto, ifname)?;
        // Failure (kernels before 4.20) only means our own frames come back and are dropped
        // as not ours.
        set_int(&fd, libc::SOL_PACKET, libc::PACKET_IGNORE_OUTGOING, 1);
        tune_transmit(&fd);
        // Socket buffers deep enough for a Go-Back-N window (the FORCE option passes
        // net.core.rmem_max as root; the plain one is the fallback).
        let _ = set_int(&fd, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, 64 << 20)
            || set_int(&fd, libc::SOL_SOCKET, libc::SO_RCVBUF, 64 << 20);
        // A packet socket with a transmit ring sends only from the ring, so datagrams
        // gathered from registered memory leave through a second socket, bound with
        // protocol 0 so that it receives nothing.
        let gso_tx = if opts.gso {
            let tx = raw_socket(ifname, 0)?;
            if !set_int(&tx, libc::SOL_PACKET, PACKET_VNET_HDR, 1) {
                return Err(last_error("PACKET_VNET_HDR (the gso option)", ifname));
            }
            bind(&tx, ifindex, 0, ifname)?;
            // No qdisc bypass here: the direct path drops a datagram the kernel had to
            // segment in software (a device without UDP segmentation offload).
            let _ = set_int(&tx, libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, 64 << 20)
                || set_int(&tx, libc::SOL_SOCKET, libc::SO_SNDBUF, 64 << 20);
            Some(tx)
        } else {
            None
        };
        let ip = interface_ip(ifname);
        let hold = ip.and_then(|ip| UdpSocket::bind((ip, 4791)).ok());
        if let (Some(h), true) = (&hold, opts.gso) {
            // Datagrams still whole when the kernel's own UDP stack meets them would be cut
            // in software, checksums and all, only to be dropped at this socket: accepting
            // them whole (UDP_GRO) lets them be dropped as they are. Failure only costs time.
            set_int(h, libc::SOL_UDP, libc::UDP_GRO, 1);
        }
        Ok(Self {
            fd,
            ifname: ifname.into(),
            mac,
            mtu,
            ip,
            rx_bufs: match &rings {
                Some(r) if r.receives() => Vec::new(),
                _ => {
                    let size = if opts.gso {
                        RX_ALIGN + GSO_MAX_FRAME
                    } else {
                        FRAME_BUF
                    };
                    (0..BURST).map(|_| vec![0; size]).collect()
                }
            },
            vnet: opts.gso,
            rings,
            pending: Vec::new(),
            spare: Vec::new(),
            epoch: Instant::now(),
            batch: gso_tx.map(|tx| (tx, Box::default())),
            _hold_4791: hold,
            tx_dropped: 0,
        })
    }

    /// Sends the waiting data packets, if any, as one datagram; returns how many packets.
    fn send_batch(&mut self) -> usize {
        match &mut self.batch {
            Some((fd, b)) => Self::send(fd, b, &mut self.tx_dropped),
            None => 0,
        }
    }

    /// Sends `batch` as one datagram (virtio-net header first) through `fd` and empties it.
    fn send(fd: &OwnedFd, batch: &mut Batch, dropped: &mut u64) -> usize {
        let n = batch.len();
        if n == 0 {
            return 0;
        }
        let mut vnet = [0u8; VNET_HDR_LEN];
        let d = batch.datagram(&mut vnet);
        let mut iov = [
            libc::iovec {
                iov_base: vnet.as_mut_ptr().cast(),
                iov_len: VNET_HDR_LEN,
            },
            libc::iovec {
                iov_base: d.as_ptr().cast_mut().cast(),
                iov_len: d.len(),
            },
        ];
        // SAFETY: msghdr is plain data; all-zero is valid (no address: the socket is bound).
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = iov.as_mut_ptr();
        msg.msg_iovlen = iov.len();
        // SAFETY: both iovecs point at memory alive for the call (`vnet` on this stack, the
        // batch's buffer); the kernel only reads them.
        let rc = unsafe { libc::sendmsg(fd.as_raw_fd(), &msg, libc::MSG_DONTWAIT) };
        if rc < 0 {
            // The socket buffer is full: drop the datagram, as a full NIC ring would.
            *dropped += n as u64;
        }
        batch.clear();
        n
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

/// A non-blocking AF_PACKET raw socket for `proto` (network order; 0 receives nothing).
fn raw_socket(ifname: &str, proto: u16) -> io::Result<OwnedFd> {
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
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// Binds a packet socket to interface `ifindex` for `proto` (network order).
fn bind(fd: &impl AsRawFd, ifindex: i32, proto: u16, ifname: &str) -> io::Result<()> {
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
    Ok(())
}

/// Sets an int socket option; true on success.
fn set_int(fd: &impl AsRawFd, level: libc::c_int, opt: libc::c_int, value: libc::c_int) -> bool {
    // SAFETY: setsockopt with a pointer to an int of the size passed.
    unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            opt,
            (&raw const value).cast(),
            std::mem::size_of::<libc::c_int>() as u32,
        ) == 0
    }
}

/// A send buffer deep enough for a Go-Back-N window, and transmit straight to the driver
/// without the qdisc layer. Either failing only costs speed.
fn tune_transmit(fd: &impl AsRawFd) {
    let _ = set_int(fd, libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, 64 << 20)
        || set_int(fd, libc::SOL_SOCKET, libc::SO_SNDBUF, 64 << 20);
    set_int(fd, libc::SOL_PACKET, libc::PACKET_QDISC_BYPASS, 1);
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
    /// The packet socket: readable while its receive ring holds a frame for us, or (`gso`)
    /// while its queue holds a datagram.
    fn rx_fd(&self) -> Option<std::os::fd::RawFd> {
        Some(self.fd.as_raw_fd())
    }

    fn rx_burst<F: FnMut(&[u8])>(&mut self, max: usize, mut f: F) -> usize {
        if let Some(r) = self.rings.as_mut().filter(|r| r.receives()) {
            return r.rx(max, f);
        }
        let n = max.min(BURST);
        if n == 0 {
            return 0;
        }
        // SAFETY: iovec/mmsghdr are plain data; zero is a valid start.
        let mut iov: [[libc::iovec; 2]; BURST] = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut msgs: [libc::mmsghdr; BURST] = unsafe { std::mem::zeroed() };
        let mut vnets = [[0u8; VNET_HDR_LEN]; BURST];
        let mut offs = [0usize; BURST];
        for i in 0..n {
            let buf = &mut self.rx_bufs[i];
            let mut parts = 0;
            if self.vnet {
                // The virtio-net header apart, and the frame placed so that the bytes after
                // an untagged IPv4/UDP header (the socket buffer's page fragments) start on
                // a cache line: the kernel's copy out of them is then aligned.
                iov[i][0].iov_base = vnets[i].as_mut_ptr().cast();
                iov[i][0].iov_len = VNET_HDR_LEN;
                parts = 1;
                offs[i] = (RX_ALIGN - (buf.as_ptr() as usize + 42) % RX_ALIGN) % RX_ALIGN;
            }
            iov[i][parts].iov_base = buf[offs[i]..].as_mut_ptr().cast();
            iov[i][parts].iov_len = buf.len() - offs[i];
            msgs[i].msg_hdr.msg_iov = iov[i].as_mut_ptr();
            msgs[i].msg_hdr.msg_iovlen = parts + 1;
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
        let mut frames = 0;
        for i in 0..got as usize {
            let len = msgs[i].msg_len as usize;
            let buf = &mut self.rx_bufs[i][offs[i]..];
            if !self.vnet {
                f(&buf[..len.min(buf.len())]);
                frames += 1;
                continue;
            }
            let Some(len) = len.checked_sub(VNET_HDR_LEN) else {
                continue;
            };
            let len = len.min(buf.len());
            let frame = &mut buf[..len];
            let vnet = &vnets[i];
            if vnet[1] == GSO_UDP_L4 {
                let gso_size = usize::from(u16::from_le_bytes([vnet[4], vnet[5]]));
                frames += gso::split(frame, gso_size, &mut f);
            } else {
                f(frame);
                frames += 1;
            }
        }
        frames
    }

    fn tx<F: FnOnce(&mut [u8])>(&mut self, len: usize, fill: F) -> Result<(), TxError> {
        let max = self.mtu + 18;
        if len > max {
            return Err(TxError::TooLong { len, max });
        }
        // A frame queued after waiting data packets leaves after them.
        self.send_batch();
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

    fn tx_split<S: Span>(&mut self, head: &[u8], frame: &SplitFrame<S>) -> Result<(), TxError> {
        let max = self.mtu + 18;
        let Some((fd, batch)) = &mut self.batch else {
            return self.tx(frame.len(), |buf| frame.copy_to(head, buf));
        };
        if frame.len() > max {
            return Err(TxError::TooLong {
                len: frame.len(),
                max,
            });
        }
        if batch.is_empty() {
            // Frames queued in the ring before this one leave first (the ring's send is
            // synchronous with qdisc bypass).
            if let Some(r) = &mut self.rings {
                r.flush(self.fd.as_raw_fd());
            }
        }
        if !batch.push(head, frame) {
            Self::send(fd, batch, &mut self.tx_dropped);
            let taken = batch.push(head, frame);
            debug_assert!(taken, "an empty batch takes any frame");
        }
        Ok(())
    }

    fn flush(&mut self) -> usize {
        let sent = self.send_batch();
        if let Some(r) = &mut self.rings {
            return sent + r.flush(self.fd.as_raw_fd());
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
            tx_split_min: self.batch.is_some().then_some(GSO_SPLIT_MIN),
        }
    }

    fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }
}
