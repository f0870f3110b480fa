//! Connecting QPs out of band, as perftest does: each side describes its end (QP number,
//! first PSN, GID, MAC, and a memory region's address and rkey), the two swap descriptions
//! over TCP, and each moves its QP through INIT, RTR and RTS towards the other.
//!
//! The TCP is the kernel's, or, on a device whose port has its own control plane (a DPDK
//! port, which no kernel serves), smoltcp's through that port: [`OobListener`] and
//! [`OobStream`] pick by the device, so callers write one exchange for both.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::time::Duration;

use ferroce_stack::transport::{required_mask, Access, Mtu, QpAttr, QpState};
use ferroce_stack::wire::{MacAddr, Psn, Qpn};

use ferroce_drivers::control::tcp::{ControlListener, ControlStream};

use crate::verbs::{Context, Gid, MemoryRegion, QueuePair, VerbsError};

/// One end of a connection, as exchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Endpoint {
    /// QP number.
    pub qpn: u32,
    /// First PSN it sends.
    pub psn: u32,
    /// Its GID.
    pub gid: Gid,
    /// Its MAC.
    pub mac: MacAddr,
    /// A memory region the peer may target: address, length, rkey.
    pub addr: u64,
    /// Length of that region.
    pub len: u64,
    /// Its rkey.
    pub rkey: u32,
    /// Recovery schemes this end offers beyond Go-Back-N ([`OFFER_SELECTIVE_REPEAT`]); the
    /// connection runs one only when both ends offer it ([`negotiate`]).
    pub offers: u8,
}

/// The [`Endpoint::offers`] bit for ferroce's selective repeat (SR opcodes, SACKs).
pub const OFFER_SELECTIVE_REPEAT: u8 = 1;

/// The recovery scheme two ends agreed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Negotiated {
    /// IBTA Go-Back-N: the default, and what any peer that offers nothing gets.
    GoBackN,
    /// ferroce's selective repeat: both ends offered it.
    SelectiveRepeat,
}

impl Negotiated {
    /// Its name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Self::GoBackN => "gbn",
            Self::SelectiveRepeat => "sr",
        }
    }
}

/// What a connection runs: the best scheme both ends offer.
pub fn negotiate(mine: &Endpoint, peer: &Endpoint) -> Negotiated {
    if mine.offers & peer.offers & OFFER_SELECTIVE_REPEAT != 0 {
        Negotiated::SelectiveRepeat
    } else {
        Negotiated::GoBackN
    }
}

/// First bytes of an exchange message, so a peer speaking something else (or an older
/// exchange without offers) is caught.
const MAGIC: &[u8; 8] = b"FERROCE2";
/// Bytes of one encoded endpoint.
pub const ENDPOINT_LEN: usize = 8 + 4 + 4 + 16 + 6 + 8 + 8 + 4 + 1;

impl Endpoint {
    /// This end of a connection: `qp` on `ctx` with first PSN `psn`, offering the peer `mr`,
    /// and no recovery scheme beyond Go-Back-N (set [`offers`](Self::offers) for more).
    pub fn of(ctx: &Context, qp: &QueuePair, mr: &MemoryRegion, psn: u32) -> Self {
        Self {
            qpn: qp.qpn().value(),
            psn,
            gid: Gid::from_ip(ctx.dev.ip),
            mac: ctx.mac(),
            addr: mr.addr(),
            len: mr.len() as u64,
            rkey: mr.rkey(),
            offers: 0,
        }
    }

    /// The wire form: magic, then fields big-endian.
    pub fn encode(&self) -> [u8; ENDPOINT_LEN] {
        let mut b = [0u8; ENDPOINT_LEN];
        b[..8].copy_from_slice(MAGIC);
        b[8..12].copy_from_slice(&self.qpn.to_be_bytes());
        b[12..16].copy_from_slice(&self.psn.to_be_bytes());
        b[16..32].copy_from_slice(&self.gid.0);
        b[32..38].copy_from_slice(&self.mac.0);
        b[38..46].copy_from_slice(&self.addr.to_be_bytes());
        b[46..54].copy_from_slice(&self.len.to_be_bytes());
        b[54..58].copy_from_slice(&self.rkey.to_be_bytes());
        b[58] = self.offers;
        b
    }

    /// Reads the wire form; `None` when the magic is wrong.
    pub fn decode(b: &[u8; ENDPOINT_LEN]) -> Option<Self> {
        if &b[..8] != MAGIC {
            return None;
        }
        let u32_at = |i: usize| u32::from_be_bytes(b[i..i + 4].try_into().unwrap_or([0; 4]));
        let u64_at = |i: usize| u64::from_be_bytes(b[i..i + 8].try_into().unwrap_or([0; 8]));
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[16..32]);
        let mut mac = [0u8; 6];
        mac.copy_from_slice(&b[32..38]);
        Some(Self {
            qpn: u32_at(8),
            psn: u32_at(12),
            gid: Gid(gid),
            mac: MacAddr(mac),
            addr: u64_at(38),
            len: u64_at(46),
            rkey: u32_at(54),
            offers: b[58],
        })
    }
}

/// Why an exchange failed.
#[derive(Debug, thiserror::Error)]
pub enum ExchangeError {
    /// Nothing listens at the address, or the network failed.
    #[error("cannot reach the peer at {addr}: {source}")]
    Connect {
        /// Where.
        addr: String,
        /// Why.
        source: std::io::Error,
    },
    /// The listening socket could not be opened.
    #[error("cannot listen on TCP port {port}: {source}")]
    Listen {
        /// Which port.
        port: u16,
        /// Why.
        source: std::io::Error,
    },
    /// The connection broke or timed out mid-exchange.
    #[error("exchange with the peer failed: {0}")]
    Io(#[from] std::io::Error),
    /// The peer sent something that is not a ferroce endpoint.
    #[error("the peer does not speak ferroce's connection exchange (got {0:02x?}...)")]
    Protocol(Vec<u8>),
}

/// The listening end of the out-of-band channel: kernel TCP, or TCP through the device's
/// own port when a control plane serves it (a DPDK port, which no kernel serves).
pub enum OobListener {
    /// A kernel socket.
    Kernel(TcpListener),
    /// smoltcp on the device's port.
    Port(ControlListener),
}

/// One out-of-band connection; `Read` and `Write` as a `TcpStream`.
pub enum OobStream {
    /// A kernel socket.
    Kernel(TcpStream),
    /// smoltcp on the device's port.
    Port(ControlStream),
}

impl OobListener {
    /// Listens on TCP `port`: on the device's own address when it has a control plane,
    /// else on every kernel address.
    pub fn bind(ctx: &Context, port: u16) -> Result<Self, ExchangeError> {
        let cannot = |source| ExchangeError::Listen { port, source };
        Ok(match ctx.control() {
            Some(c) => Self::Port(c.listen(port).map_err(cannot)?),
            None => Self::Kernel(TcpListener::bind(("0.0.0.0", port)).map_err(cannot)?),
        })
    }

    /// Waits for one peer.
    pub fn accept(&mut self) -> Result<OobStream, ExchangeError> {
        Ok(match self {
            Self::Kernel(l) => OobStream::Kernel(l.accept()?.0),
            Self::Port(l) => OobStream::Port(l.accept(None)?.0),
        })
    }
}

impl OobStream {
    /// Connects to `addr` (`HOST:PORT`) the way `ctx` reaches its peers, retrying for
    /// `patience` while the server starts.
    pub fn connect(ctx: &Context, addr: &str, patience: Duration) -> Result<Self, ExchangeError> {
        let unreachable = |source| ExchangeError::Connect {
            addr: addr.into(),
            source,
        };
        let target = addr
            .to_socket_addrs()
            .map_err(unreachable)?
            .next()
            .ok_or_else(|| unreachable(std::io::Error::other("no address")))?;
        let start = std::time::Instant::now();
        loop {
            let tried = match ctx.control() {
                Some(c) => c
                    .connect(target, Duration::from_secs(2))
                    .map(OobStream::Port),
                None => TcpStream::connect_timeout(&target, Duration::from_secs(2))
                    .map(OobStream::Kernel),
            };
            match tried {
                Ok(s) => return Ok(s),
                Err(e) if start.elapsed() >= patience => return Err(unreachable(e)),
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    /// As `TcpStream::set_read_timeout`.
    pub fn set_read_timeout(&mut self, t: Option<Duration>) -> std::io::Result<()> {
        match self {
            Self::Kernel(s) => s.set_read_timeout(t),
            Self::Port(s) => {
                s.set_read_timeout(t);
                Ok(())
            }
        }
    }

    /// As `TcpStream::set_nonblocking`.
    pub fn set_nonblocking(&mut self, on: bool) -> std::io::Result<()> {
        match self {
            Self::Kernel(s) => s.set_nonblocking(on),
            Self::Port(s) => {
                s.set_nonblocking(on);
                Ok(())
            }
        }
    }

    /// True when a read would not wait: data arrived or the peer closed. Does not block.
    pub fn readable(&mut self) -> bool {
        match self {
            Self::Kernel(s) => {
                let was = s.set_nonblocking(true);
                let mut b = [0u8; 1];
                let r = !matches!(s.peek(&mut b), Err(ref e) if e.kind() == std::io::ErrorKind::WouldBlock);
                if was.is_ok() {
                    let _ = s.set_nonblocking(false);
                }
                r
            }
            Self::Port(s) => s.readable(),
        }
    }
}

impl Read for OobStream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Self::Kernel(s) => s.read(buf),
            Self::Port(s) => s.read(buf),
        }
    }
}

impl Write for OobStream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Self::Kernel(s) => s.write(buf),
            Self::Port(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Self::Kernel(s) => s.flush(),
            Self::Port(s) => s.flush(),
        }
    }
}

/// Sends `mine` and reads the peer's endpoint on an established stream.
pub fn swap(stream: &mut OobStream, mine: &Endpoint) -> Result<Endpoint, ExchangeError> {
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    if let OobStream::Kernel(s) = stream {
        s.set_nodelay(true)?;
    }
    stream.write_all(&mine.encode())?;
    let mut buf = [0u8; ENDPOINT_LEN];
    stream.read_exact(&mut buf)?;
    Endpoint::decode(&buf).ok_or_else(|| ExchangeError::Protocol(buf[..8].to_vec()))
}

/// Server side: accepts one peer on `listener` and swaps endpoints. The stream stays open
/// for the caller's end-of-test handshake.
pub fn exchange_server(
    listener: &mut OobListener,
    mine: &Endpoint,
) -> Result<(Endpoint, OobStream), ExchangeError> {
    let mut s = listener.accept()?;
    let peer = swap(&mut s, mine)?;
    Ok((peer, s))
}

/// Client side: connects to `addr` (retrying for `patience` while the server starts) and
/// swaps endpoints.
pub fn exchange_client(
    ctx: &Context,
    addr: &str,
    mine: &Endpoint,
    patience: Duration,
) -> Result<(Endpoint, OobStream), ExchangeError> {
    let mut s = OobStream::connect(ctx, addr, patience)?;
    let peer = swap(&mut s, mine)?;
    Ok((peer, s))
}

/// Parameters both ends agree on.
#[derive(Debug, Clone, Copy)]
pub struct ConnectOpts {
    /// Path MTU.
    pub mtu: Mtu,
    /// Remote access this QP grants.
    pub access: Access,
    /// Local ACK timeout exponent (perftest: 14).
    pub timeout: u8,
    /// Transport retries (perftest: 7).
    pub retry_cnt: u8,
    /// RNR retries (perftest: 7, infinite).
    pub rnr_retry: u8,
    /// RNR NAK timer this end sends (perftest: 12).
    pub min_rnr_timer: u8,
    /// READ/atomic depth, both directions.
    pub rd_atomic: u8,
    /// Q_Key (UD).
    pub qkey: u32,
}

impl Default for ConnectOpts {
    fn default() -> Self {
        Self {
            mtu: Mtu::Mtu1024,
            access: Access::REMOTE_WRITE
                .with(Access::REMOTE_READ)
                .with(Access::REMOTE_ATOMIC),
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            rd_atomic: 16,
            qkey: 0x1111_1111,
        }
    }
}

/// Moves `qp` (in RESET) to RTS towards `peer`: INIT, RTR with the peer's QPN, PSN, GID and
/// MAC, RTS with `my_psn`.
pub fn connect_qp(
    ctx: &Context,
    qp: &QueuePair,
    my_psn: u32,
    peer: &Endpoint,
    o: &ConnectOpts,
) -> Result<(), VerbsError> {
    let attr = QpAttr {
        qp_access_flags: o.access,
        qkey: o.qkey,
        ah_attr: ctx.path_to(peer.gid, peer.mac),
        path_mtu: o.mtu,
        dest_qp_num: Qpn::new(peer.qpn),
        rq_psn: Psn::new(peer.psn),
        max_dest_rd_atomic: o.rd_atomic,
        min_rnr_timer: o.min_rnr_timer,
        sq_psn: Psn::new(my_psn),
        timeout: o.timeout,
        retry_cnt: o.retry_cnt,
        rnr_retry: o.rnr_retry,
        max_rd_atomic: o.rd_atomic,
        ..QpAttr::default()
    };
    let t = qp.qp_type();
    for (from, to) in [
        (QpState::Reset, QpState::Init),
        (QpState::Init, QpState::Rtr),
        (QpState::Rtr, QpState::Rts),
    ] {
        let mask = required_mask(t, from, to).ok_or(VerbsError::NoSuchQp(peer.qpn))?;
        qp.modify(
            &QpAttr {
                qp_state: to,
                ..attr
            },
            mask,
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn end(offers: u8) -> Endpoint {
        Endpoint {
            qpn: 0x12,
            psn: 0xab_cdef,
            gid: Gid([7; 16]),
            mac: MacAddr([2, 0, 0, 0, 0, 9]),
            addr: 0x1000,
            len: 4096,
            rkey: 0xdead_beef,
            offers,
        }
    }

    #[test]
    fn endpoints_round_trip_with_their_offers_and_old_magic_is_refused() {
        let e = end(OFFER_SELECTIVE_REPEAT);
        let b = e.encode();
        assert_eq!(Endpoint::decode(&b), Some(e));
        assert_eq!(b[58], 1);
        let mut old = b;
        old[..8].copy_from_slice(b"FERROCE1");
        assert_eq!(Endpoint::decode(&old), None);
    }

    #[test]
    fn selective_repeat_only_when_both_offer_it() {
        let (sr, none) = (end(OFFER_SELECTIVE_REPEAT), end(0));
        assert_eq!(negotiate(&sr, &sr), Negotiated::SelectiveRepeat);
        assert_eq!(negotiate(&sr, &none), Negotiated::GoBackN);
        assert_eq!(negotiate(&none, &sr), Negotiated::GoBackN);
        // Bits this build does not know are ignored.
        assert_eq!(negotiate(&end(0x80), &end(0x81)), Negotiated::GoBackN);
    }
}
