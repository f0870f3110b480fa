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

use ferroce_stack::transport::{Access, Mtu, QpAttr};
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
    /// What this end offers beyond IBTA (a recovery scheme, later SDR or a congestion
    /// control and their parameters); the connection uses what both offer ([`negotiate`]).
    pub offers: Capabilities,
    /// Its device's second port, GID and MAC, when it has one: where native failover
    /// reaches it ([`connect_qp`] makes it the alternate path when both ends have one).
    pub alt: Option<(Gid, MacAddr)>,
    /// Its responder's atomic replay depth (`max_dest_rd_atomic`): native failover is
    /// exactly-once only if the peer's `max_rd_atomic` is no more.
    pub rd_atomic: u8,
}

/// Capability kinds of the exchange. A kind this build does not know is carried and
/// ignored, so an end may offer more than its peer understands.
pub mod capability {
    /// ferroce's selective repeat (SR opcodes, SACKs); value 0.
    pub const SELECTIVE_REPEAT: u8 = 1;
}

/// One offer: a kind ([`capability`]) and a parameter (a version or a limit; two ends that
/// both offer a kind agree on the smaller parameter).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Capability {
    /// What is offered.
    pub kind: u8,
    /// Its parameter.
    pub value: u32,
}

/// Most capabilities one end may offer: the exchange stays one small fixed-size message.
pub const MAX_CAPABILITIES: usize = 8;

/// The capabilities an end offers: a short list, one entry per kind, kept `Copy` so an
/// [`Endpoint`] stays a plain value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Capabilities {
    list: [Capability; MAX_CAPABILITIES],
    len: u8,
}

impl Capabilities {
    /// Nothing beyond IBTA: what a ConnectX peer would offer.
    pub const NONE: Self = Self {
        list: [Capability { kind: 0, value: 0 }; MAX_CAPABILITIES],
        len: 0,
    };

    /// These capabilities and `kind` with `value` (replacing an earlier offer of `kind`).
    /// Panics past [`MAX_CAPABILITIES`] kinds, a programming error.
    pub fn with(mut self, kind: u8, value: u32) -> Self {
        match self.list[..self.len as usize]
            .iter_mut()
            .find(|c| c.kind == kind)
        {
            Some(c) => c.value = value,
            None => {
                assert!(
                    (self.len as usize) < MAX_CAPABILITIES,
                    "too many capabilities"
                );
                self.list[self.len as usize] = Capability { kind, value };
                self.len += 1;
            }
        }
        self
    }

    /// The parameter offered for `kind`, if it is offered.
    pub fn get(&self, kind: u8) -> Option<u32> {
        self.iter().find(|c| c.kind == kind).map(|c| c.value)
    }

    /// True when `kind` is offered.
    pub fn has(&self, kind: u8) -> bool {
        self.get(kind).is_some()
    }

    /// The offers, in the order they were made.
    pub fn iter(&self) -> impl Iterator<Item = &Capability> {
        self.list[..self.len as usize].iter()
    }

    /// How many kinds are offered.
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// True when nothing is offered.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The kinds both offer, each with the smaller parameter.
    pub fn common(&self, peer: &Self) -> Self {
        self.iter()
            .fold(Self::NONE, |acc, c| match peer.get(c.kind) {
                Some(v) => acc.with(c.kind, c.value.min(v)),
                None => acc,
            })
    }
}

impl FromIterator<Capability> for Capabilities {
    fn from_iter<I: IntoIterator<Item = Capability>>(iter: I) -> Self {
        iter.into_iter()
            .fold(Self::NONE, |acc, c| acc.with(c.kind, c.value))
    }
}

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

impl Negotiated {
    /// The schemes a QP of a connection that agreed on this runs, of those it `wanted`:
    /// selective repeat, and spraying with it, only when agreed (see
    /// [`Schemes::agreed`](ferroce_reliability::schemes::Schemes::agreed)).
    pub fn schemes(
        self,
        wanted: &ferroce_reliability::schemes::Schemes,
    ) -> ferroce_reliability::schemes::Schemes {
        wanted.agreed(self == Self::SelectiveRepeat)
    }
}

/// What two ends agreed on: every capability both offered, and what that means for each
/// policy a connection composes (only recovery so far).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Agreement {
    /// The kinds both offered, with the smaller parameter.
    pub common: Capabilities,
    /// The recovery scheme: the best both offer.
    pub recovery: Negotiated,
}

impl Agreement {
    /// The policies a QP of this connection runs, of those it `wanted`, with `params`: the
    /// one way from a connection exchange to [`Policies`](ferroce_stack::transport::Policies)
    /// (`ferroce perf`, the drop-in's rdma_cm).
    pub fn policies(
        &self,
        wanted: &ferroce_reliability::schemes::Schemes,
        params: &ferroce_reliability::schemes::Params,
    ) -> ferroce_stack::transport::Policies {
        self.recovery.schemes(wanted).policies(params)
    }
}

/// What a connection runs, from both ends' offers.
pub fn negotiate(mine: &Endpoint, peer: &Endpoint) -> Agreement {
    let common = mine.offers.common(&peer.offers);
    let recovery = if common.has(capability::SELECTIVE_REPEAT) {
        Negotiated::SelectiveRepeat
    } else {
        Negotiated::GoBackN
    };
    Agreement { common, recovery }
}

/// First bytes of an exchange message, so a peer speaking something else (or an older
/// exchange: `FERROCE2` carried one offers byte) is caught.
const MAGIC: &[u8; 8] = b"FERROCE4";
/// Bytes of the fixed part of an encoded endpoint, before the capability count: magic, QPN,
/// PSN, GID, MAC, region, then the second port (a flag, GID, MAC) and the replay depth.
const FIXED_LEN: usize = 8 + 4 + 4 + 16 + 6 + 8 + 8 + 4 + 1 + 16 + 6 + 1;
/// Where the second port's flag starts.
const ALT_AT: usize = 58;
/// Bytes of one encoded capability: kind, then the parameter big-endian.
const CAPABILITY_LEN: usize = 1 + 4;
/// Bytes of one encoded endpoint: the fixed part, the capability count, and room for
/// [`MAX_CAPABILITIES`] (unused entries are zero).
pub const ENDPOINT_LEN: usize = FIXED_LEN + 1 + MAX_CAPABILITIES * CAPABILITY_LEN;

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
            offers: Capabilities::NONE,
            alt: ctx.query_gid_on(2, 0).ok().zip(ctx.port_mac(2).ok()),
            rd_atomic: ConnectOpts::default().rd_atomic,
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
        if let Some((gid, mac)) = self.alt {
            b[ALT_AT] = 1;
            b[ALT_AT + 1..ALT_AT + 17].copy_from_slice(&gid.0);
            b[ALT_AT + 17..ALT_AT + 23].copy_from_slice(&mac.0);
        }
        b[ALT_AT + 23] = self.rd_atomic;
        b[FIXED_LEN] = self.offers.len;
        for (i, c) in self.offers.iter().enumerate() {
            let at = FIXED_LEN + 1 + i * CAPABILITY_LEN;
            b[at] = c.kind;
            b[at + 1..at + CAPABILITY_LEN].copy_from_slice(&c.value.to_be_bytes());
        }
        b
    }

    /// Reads the wire form; `None` when the magic is wrong or the capability list is
    /// impossible (too long, a kind twice).
    pub fn decode(b: &[u8; ENDPOINT_LEN]) -> Option<Self> {
        if &b[..8] != MAGIC {
            return None;
        }
        let count = b[FIXED_LEN] as usize;
        if count > MAX_CAPABILITIES {
            return None;
        }
        let mut offers = Capabilities::NONE;
        for i in 0..count {
            let at = FIXED_LEN + 1 + i * CAPABILITY_LEN;
            let kind = b[at];
            if offers.has(kind) {
                return None;
            }
            let value = u32::from_be_bytes(b[at + 1..at + CAPABILITY_LEN].try_into().ok()?);
            offers = offers.with(kind, value);
        }
        let u32_at = |i: usize| u32::from_be_bytes(b[i..i + 4].try_into().unwrap_or([0; 4]));
        let u64_at = |i: usize| u64::from_be_bytes(b[i..i + 8].try_into().unwrap_or([0; 8]));
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[16..32]);
        let mut mac = [0u8; 6];
        mac.copy_from_slice(&b[32..38]);
        let alt = match b[ALT_AT] {
            0 => None,
            1 => {
                let mut g = [0u8; 16];
                g.copy_from_slice(&b[ALT_AT + 1..ALT_AT + 17]);
                let mut m = [0u8; 6];
                m.copy_from_slice(&b[ALT_AT + 17..ALT_AT + 23]);
                Some((Gid(g), MacAddr(m)))
            }
            _ => return None,
        };
        Some(Self {
            qpn: u32_at(8),
            psn: u32_at(12),
            gid: Gid(gid),
            mac: MacAddr(mac),
            addr: u64_at(38),
            len: u64_at(46),
            rkey: u32_at(54),
            offers,
            alt,
            rd_atomic: b[ALT_AT + 23],
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

    /// Sends the last message's end: every byte written reached the peer, which then sees
    /// the end of the stream. Pairs with [`Self::await_end`] on the other side, so neither
    /// process leaves while the other still waits for an acknowledgement from it (over a
    /// port's TCP, which ends with its process, that wait would last until its timeout).
    pub fn finish(&mut self) -> std::io::Result<()> {
        match self {
            Self::Kernel(s) => {
                s.flush()?;
                s.shutdown(std::net::Shutdown::Write)
            }
            Self::Port(s) => s.shutdown_write(Duration::from_secs(2)),
        }
    }

    /// After the last message arrived: reads (and drops) until the peer's end of stream, or
    /// `patience` passes. Never fails: the exchange is over either way.
    pub fn await_end(&mut self, patience: Duration) {
        let until = std::time::Instant::now() + patience;
        let mut sink = [0u8; 64];
        loop {
            let left = until.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() || self.set_read_timeout(Some(left)).is_err() {
                return;
            }
            match self.read(&mut sink) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
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
    // The magic first: a peer speaking something else may send less than an endpoint and
    // wait, and should be told apart from a connection that broke.
    let mut buf = [0u8; ENDPOINT_LEN];
    stream.read_exact(&mut buf[..MAGIC.len()])?;
    if &buf[..MAGIC.len()] != MAGIC {
        return Err(ExchangeError::Protocol(buf[..MAGIC.len()].to_vec()));
    }
    stream.read_exact(&mut buf[MAGIC.len()..])?;
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
    connect_qp_on(ctx, qp, 1, my_psn, peer, o)
}

/// [`connect_qp`] from port `port_num` of the device (the peer's `gid` and `mac` are its
/// address on the matching port).
pub fn connect_qp_on(
    ctx: &Context,
    qp: &QueuePair,
    port_num: u8,
    my_psn: u32,
    peer: &Endpoint,
    o: &ConnectOpts,
) -> Result<(), VerbsError> {
    let attr = QpAttr {
        qp_access_flags: o.access,
        qkey: o.qkey,
        port_num,
        ah_attr: ctx.path_on(port_num, peer.gid, peer.mac)?,
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
    ferroce_stack::transport::bring_up(qp.qp_type(), &attr, |a, m| qp.modify(a, m))?;
    // Both ends with a second port: native failover between them. A QP keeping more
    // atomics outstanding than the peer's replay cache holds gets none (and says why).
    if let (Some((gid, mac)), true, false) = (
        peer.alt,
        ctx.query_device().phys_port_cnt > 1,
        qp.qp_type() == ferroce_stack::transport::QpType::Ud,
    ) {
        qp.set_alternate_path(2, gid, mac, peer.rd_atomic)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn end(offers: Capabilities) -> Endpoint {
        Endpoint {
            qpn: 0x12,
            psn: 0xab_cdef,
            gid: Gid([7; 16]),
            mac: MacAddr([2, 0, 0, 0, 0, 9]),
            addr: 0x1000,
            len: 4096,
            rkey: 0xdead_beef,
            offers,
            alt: Some((Gid([9; 16]), MacAddr([2, 0, 0, 0, 1, 9]))),
            rd_atomic: 8,
        }
    }

    fn sr() -> Capabilities {
        Capabilities::NONE.with(capability::SELECTIVE_REPEAT, 0)
    }

    #[test]
    fn endpoints_round_trip_with_their_offers_and_old_magic_is_refused() {
        let e = end(sr().with(0x80, 7));
        let b = e.encode();
        assert_eq!(Endpoint::decode(&b), Some(e));
        // Count, then (kind, parameter big-endian) per offer.
        assert_eq!(
            &b[FIXED_LEN..FIXED_LEN + 11],
            &[2, 1, 0, 0, 0, 0, 0x80, 0, 0, 0, 7]
        );
        let mut old = b;
        old[..8].copy_from_slice(b"FERROCE2");
        assert_eq!(Endpoint::decode(&old), None);
        let mut long = b;
        long[FIXED_LEN] = MAX_CAPABILITIES as u8 + 1;
        assert_eq!(Endpoint::decode(&long), None);
        let mut twice = b;
        twice[FIXED_LEN + 6] = 1;
        assert_eq!(Endpoint::decode(&twice), None);
    }

    #[test]
    fn selective_repeat_only_when_both_offer_it() {
        let (sr, none) = (end(sr()), end(Capabilities::NONE));
        assert_eq!(negotiate(&sr, &sr).recovery, Negotiated::SelectiveRepeat);
        assert_eq!(negotiate(&sr, &none).recovery, Negotiated::GoBackN);
        assert_eq!(negotiate(&none, &sr).recovery, Negotiated::GoBackN);
        // Kinds this build does not know are carried and ignored.
        let unknown = end(Capabilities::NONE.with(0x80, 1));
        let agreed = negotiate(
            &unknown,
            &end(Capabilities::NONE.with(0x80, 3).with(0x81, 1)),
        );
        assert_eq!(agreed.recovery, Negotiated::GoBackN);
        assert_eq!(
            agreed.common.iter().copied().collect::<Vec<_>>(),
            [Capability {
                kind: 0x80,
                value: 1
            }]
        );
    }

    #[test]
    fn a_kind_offered_twice_keeps_the_last_parameter() {
        let c = Capabilities::NONE.with(5, 1).with(5, 9);
        assert_eq!((c.len(), c.get(5)), (1, Some(9)));
    }
}
