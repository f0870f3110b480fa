//! TAP: ferroce as the far end of a Linux TAP interface. Frames ferroce sends arrive at the
//! kernel as if received on the interface; frames the kernel (or anything on the interface:
//! a bridge, an AF_PACKET socket, kernel Soft-RoCE) sends out of it come to ferroce. Root
//! (or CAP_NET_ADMIN) is needed to attach.
//!
//! ferroce is a host of its own on the TAP link, with its own MAC (locally administered,
//! derived from the interface name) and its own IP address: given as `tap:NAME@IP`, or else
//! the interface's IPv4 address plus one.

use std::ffi::CString;
use std::io;
use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Instant;

use ferroce_stack::wire::{Checks, MacAddr};

use crate::port::{LinkState, Port, PortCapabilities, TxError};

/// Frames per burst.
pub const BURST: usize = 32;

/// ferroce's end of a TAP interface.
pub struct TapPort {
    fd: OwnedFd,
    name: String,
    mac: MacAddr,
    mtu: usize,
    ip: IpAddr,
    buf: Vec<u8>,
    pending: Vec<Vec<u8>>,
    epoch: Instant,
    /// Frames the kernel refused (its queue full).
    pub tx_dropped: u64,
}

impl TapPort {
    /// Attaches to (or creates) TAP interface `name`; `ip` is ferroce's address on it.
    pub fn open(name: &str, ip: Option<IpAddr>) -> io::Result<Self> {
        let dev = CString::new("/dev/net/tun").map_err(io::Error::other)?;
        // SAFETY: open(2) on a constant path; the result is checked.
        let raw = unsafe {
            libc::open(
                dev.as_ptr(),
                libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC,
            )
        };
        if raw < 0 {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(
                e.kind(),
                format!("cannot open /dev/net/tun: {e}"),
            ));
        }
        // SAFETY: a fresh descriptor we own from here on.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: ifreq is plain data; zero is valid.
        let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
        for (d, s) in req
            .ifr_name
            .iter_mut()
            .zip(name.bytes().take(libc::IFNAMSIZ - 1))
        {
            *d = s as libc::c_char;
        }
        req.ifr_ifru.ifru_flags = (libc::IFF_TAP | libc::IFF_NO_PI) as libc::c_short;
        // SAFETY: TUNSETIFF reads the ifreq we pass (name and flags).
        if unsafe { libc::ioctl(fd.as_raw_fd(), libc::TUNSETIFF, &mut req) } < 0 {
            let e = io::Error::last_os_error();
            let hint = if e.raw_os_error() == Some(libc::EPERM) {
                " (attaching a TAP interface needs root or CAP_NET_ADMIN)"
            } else {
                ""
            };
            return Err(io::Error::new(
                e.kind(),
                format!("cannot attach TAP {name}: {e}{hint}"),
            ));
        }
        let ip = match ip {
            Some(ip) => ip,
            None => match crate::afpacket::interface_ip(name) {
                Some(IpAddr::V4(v4)) => IpAddr::V4(Ipv4Addr::from(u32::from(v4).wrapping_add(1))),
                _ => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("TAP {name} has no IPv4 address to derive ferroce's from; use tap:{name}@IP"),
                    ))
                }
            },
        };
        let h = crc32fast::hash(name.as_bytes()).to_be_bytes();
        let mac = MacAddr([0x02, 0xfe, h[0], h[1], h[2], h[3]]);
        let mtu = interface_mtu(name).unwrap_or(1500);
        Ok(Self {
            fd,
            name: name.into(),
            mac,
            mtu,
            ip,
            buf: vec![0; 65536],
            pending: Vec::new(),
            epoch: Instant::now(),
            tx_dropped: 0,
        })
    }

    /// ferroce's IP address on the link.
    pub fn ip(&self) -> IpAddr {
        self.ip
    }

    /// The interface's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

fn interface_mtu(name: &str) -> Option<usize> {
    std::fs::read_to_string(format!("/sys/class/net/{name}/mtu"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

impl Port for TapPort {
    fn rx_fd(&self) -> Option<std::os::fd::RawFd> {
        Some(self.fd.as_raw_fd())
    }

    fn rx_burst<F: FnMut(&[u8])>(&mut self, max: usize, mut f: F) -> usize {
        let mut n = 0;
        while n < max.min(BURST) {
            // SAFETY: reads at most `buf.len()` bytes into our buffer.
            let got = unsafe {
                libc::read(
                    self.fd.as_raw_fd(),
                    self.buf.as_mut_ptr().cast(),
                    self.buf.len(),
                )
            };
            if got <= 0 {
                break;
            }
            f(&self.buf[..got as usize]);
            n += 1;
        }
        n
    }

    fn tx<F: FnOnce(&mut [u8])>(&mut self, len: usize, fill: F) -> Result<(), TxError> {
        let max = self.mtu + 18;
        if len > max {
            return Err(TxError::TooLong { len, max });
        }
        let mut b = vec![0; len];
        fill(&mut b);
        self.pending.push(b);
        if self.pending.len() >= BURST {
            self.flush();
        }
        Ok(())
    }

    fn flush(&mut self) -> usize {
        let mut sent = 0;
        for frame in self.pending.drain(..) {
            // SAFETY: writes exactly `frame.len()` bytes from our buffer.
            let w = unsafe { libc::write(self.fd.as_raw_fd(), frame.as_ptr().cast(), frame.len()) };
            if w == frame.len() as isize {
                sent += 1;
            } else {
                self.tx_dropped += 1;
            }
        }
        sent
    }

    fn link_state(&self) -> LinkState {
        match std::fs::read_to_string(format!("/sys/class/net/{}/operstate", self.name)) {
            Ok(s) if s.trim() == "down" => LinkState::Down,
            _ => LinkState::Up,
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
