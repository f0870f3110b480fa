//! R2CCL's bilateral failure awareness (seed 003, mechanism 1): the out-of-band messages the
//! two ends of a failed connection swap over the bootstrap network — the TCP connection the
//! QPs' addresses were exchanged over, which does not share the data NICs' fate. An RDMA
//! WRITE's requester is the only end that sees its connection fail (its retries run out);
//! the responder sees nothing but silence. So the end that sees the error tells the other
//! ([`OobMsg::ConnError`]), both probe, the peer sends its probe results back
//! ([`OobMsg::ProbeResults`]) and the one that decides says where the connection goes on
//! ([`OobMsg::Migrated`]).
//!
//! The messages are a small fixed binary format (`R2`, a kind, big-endian fields), framed on
//! a byte stream by a 2-byte length; [`OobStream`] carries them over any `Read + Write`
//! stream, a [`std::net::TcpStream`] in practice. The simulated scenarios deliver the same
//! encoded bytes after a modelled delay.

use std::io::{self, Read, Write};

use super::localize::Probes;

/// The first two bytes of every message.
const MAGIC: [u8; 2] = *b"R2";

/// Longest encoded message (a [`OobMsg::ProbeResults`]).
pub const MAX_LEN: usize = 12;

/// One out-of-band message about connection `conn` (an id both ends agreed on at setup).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OobMsg {
    /// The sender's connection `conn` failed on `rail`: probe, and send back the results.
    ConnError {
        /// The connection.
        conn: u32,
        /// The rail (NIC index) it failed on.
        rail: u8,
    },
    /// The sender's probes for `conn`'s localization on `rail`.
    ProbeResults {
        /// The connection.
        conn: u32,
        /// The rail probed.
        rail: u8,
        /// What the sender's probes saw.
        probes: Probes,
    },
    /// `conn` goes on over `rail` (the backup the proximity order chose): the receiver
    /// takes its chunks there, from the one after its last confirmed.
    Migrated {
        /// The connection.
        conn: u32,
        /// The rail it continues on.
        rail: u8,
    },
}

/// Why bytes are not an out-of-band message.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum OobError {
    /// Fewer bytes than the message needs.
    #[error("truncated out-of-band message: {0} bytes")]
    Truncated(usize),
    /// Not R2CCL's magic.
    #[error("not an R2CCL out-of-band message (magic {0:02x?})")]
    BadMagic([u8; 2]),
    /// A kind this version does not know.
    #[error("unknown out-of-band message kind {0}")]
    UnknownKind(u8),
    /// A probe result that is not 0 (unknown), 1 (failed) or 2 (through).
    #[error("bad probe result {0}")]
    BadProbe(u8),
    /// Bytes after the message.
    #[error("{0} trailing bytes after an out-of-band message")]
    Trailing(usize),
    /// Reserved bytes that are not zero.
    #[error("reserved bytes of an out-of-band message are not zero")]
    Reserved,
    /// A frame longer than any message.
    #[error("out-of-band frame of {0} bytes, longer than any message")]
    TooLong(usize),
}

fn probe_byte(p: Option<bool>) -> u8 {
    match p {
        None => 0,
        Some(false) => 1,
        Some(true) => 2,
    }
}

fn probe_of(b: u8) -> Result<Option<bool>, OobError> {
    match b {
        0 => Ok(None),
        1 => Ok(Some(false)),
        2 => Ok(Some(true)),
        other => Err(OobError::BadProbe(other)),
    }
}

impl OobMsg {
    /// The connection the message is about.
    pub fn conn(&self) -> u32 {
        match *self {
            Self::ConnError { conn, .. }
            | Self::ProbeResults { conn, .. }
            | Self::Migrated { conn, .. } => conn,
        }
    }

    /// Writes the message into `out`; returns its length (at most [`MAX_LEN`]).
    pub fn encode(&self, out: &mut [u8; MAX_LEN]) -> usize {
        out[..2].copy_from_slice(&MAGIC);
        let (kind, conn, rail) = match *self {
            Self::ConnError { conn, rail } => (1, conn, rail),
            Self::ProbeResults { conn, rail, .. } => (2, conn, rail),
            Self::Migrated { conn, rail } => (3, conn, rail),
        };
        out[2] = kind;
        out[3..7].copy_from_slice(&conn.to_be_bytes());
        out[7] = rail;
        match *self {
            Self::ProbeResults { probes, .. } => {
                out[8] = probe_byte(probes.to_peer);
                out[9] = probe_byte(probes.to_third);
                out[10..12].fill(0);
                12
            }
            _ => 8,
        }
    }

    /// The message in `b` (exactly one).
    pub fn decode(b: &[u8]) -> Result<Self, OobError> {
        if b.len() < 8 {
            return Err(OobError::Truncated(b.len()));
        }
        if b[..2] != MAGIC {
            return Err(OobError::BadMagic([b[0], b[1]]));
        }
        let conn = u32::from_be_bytes([b[3], b[4], b[5], b[6]]);
        let rail = b[7];
        let (msg, len) = match b[2] {
            1 => (Self::ConnError { conn, rail }, 8),
            3 => (Self::Migrated { conn, rail }, 8),
            2 => {
                if b.len() < 12 {
                    return Err(OobError::Truncated(b.len()));
                }
                let probes = Probes {
                    to_peer: probe_of(b[8])?,
                    to_third: probe_of(b[9])?,
                };
                if b[10..12] != [0, 0] {
                    return Err(OobError::Reserved);
                }
                (Self::ProbeResults { conn, rail, probes }, 12)
            }
            other => return Err(OobError::UnknownKind(other)),
        };
        if b.len() > len {
            return Err(OobError::Trailing(b.len() - len));
        }
        Ok(msg)
    }
}

/// Out-of-band messages over a byte stream (the bootstrap TCP connection): each a 2-byte
/// big-endian length and the encoded message. Reading never blocks longer than the stream
/// does; a non-blocking stream gives `Ok(None)` until a whole message is in.
#[derive(Debug)]
pub struct OobStream<S> {
    stream: S,
    inbox: Vec<u8>,
}

/// Why a stream could not carry a message.
#[derive(Debug, thiserror::Error)]
pub enum OobStreamError {
    /// The stream failed (or closed: `UnexpectedEof`).
    #[error("out-of-band stream: {0}")]
    Io(#[from] io::Error),
    /// The peer sent something that is not a message; the stream cannot be trusted after.
    #[error("out-of-band stream: {0}")]
    Bad(#[from] OobError),
}

impl<S: Read + Write> OobStream<S> {
    /// Messages over `stream`.
    pub fn new(stream: S) -> Self {
        Self {
            stream,
            inbox: Vec::new(),
        }
    }

    /// The stream.
    pub fn get_ref(&self) -> &S {
        &self.stream
    }

    /// Sends `msg` (one write of its frame).
    pub fn send(&mut self, msg: &OobMsg) -> Result<(), OobStreamError> {
        let mut body = [0; MAX_LEN];
        let n = msg.encode(&mut body);
        let mut frame = [0; MAX_LEN + 2];
        frame[..2].copy_from_slice(&(n as u16).to_be_bytes());
        frame[2..2 + n].copy_from_slice(&body[..n]);
        self.stream.write_all(&frame[..2 + n])?;
        self.stream.flush()?;
        Ok(())
    }

    /// The next message, if a whole one has come (`Ok(None)`: not yet, on a non-blocking
    /// stream). A length above [`MAX_LEN`] is refused before anything is buffered for it.
    pub fn recv(&mut self) -> Result<Option<OobMsg>, OobStreamError> {
        loop {
            if self.inbox.len() >= 2 {
                let n = usize::from(u16::from_be_bytes([self.inbox[0], self.inbox[1]]));
                if n > MAX_LEN {
                    return Err(OobError::TooLong(n).into());
                }
                if self.inbox.len() >= 2 + n {
                    let msg = OobMsg::decode(&self.inbox[2..2 + n]);
                    self.inbox.drain(..2 + n);
                    return Ok(Some(msg?));
                }
            }
            let mut buf = [0; 64];
            match self.stream.read(&mut buf) {
                Ok(0) => return Err(io::Error::from(io::ErrorKind::UnexpectedEof).into()),
                Ok(k) => self.inbox.extend_from_slice(&buf[..k]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::net::{TcpListener, TcpStream};

    fn all() -> Vec<OobMsg> {
        let probes = Probes {
            to_peer: Some(false),
            to_third: Some(true),
        };
        vec![
            OobMsg::ConnError {
                conn: 0x0102_0304,
                rail: 1,
            },
            OobMsg::ProbeResults {
                conn: 7,
                rail: 0,
                probes,
            },
            OobMsg::ProbeResults {
                conn: 8,
                rail: 3,
                probes: Probes::default(),
            },
            OobMsg::Migrated { conn: 9, rail: 1 },
        ]
    }

    /// The bytes of each kind, written out, and back.
    #[test]
    fn each_kind_has_fixed_bytes_and_decodes_back() {
        let mut b = [0; MAX_LEN];
        let n = all()[0].encode(&mut b);
        assert_eq!(&b[..n], b"R2\x01\x01\x02\x03\x04\x01");
        let n = all()[1].encode(&mut b);
        assert_eq!(&b[..n], b"R2\x02\x00\x00\x00\x07\x00\x01\x02\x00\x00");
        for m in all() {
            let n = m.encode(&mut b);
            assert_eq!(OobMsg::decode(&b[..n]), Ok(m));
        }
        assert_eq!(
            OobMsg::decode(b"R2\x09\0\0\0\0\0"),
            Err(OobError::UnknownKind(9))
        );
        assert_eq!(
            OobMsg::decode(b"R3\x01\0\0\0\0\0"),
            Err(OobError::BadMagic(*b"R3"))
        );
        assert_eq!(
            OobMsg::decode(b"R2\x02\0\0\0\0\0\x03\0\0\0"),
            Err(OobError::BadProbe(3))
        );
        assert_eq!(
            OobMsg::decode(b"R2\x01\0\0\0\0\0\0"),
            Err(OobError::Trailing(1))
        );
        assert_eq!(
            OobMsg::decode(b"R2\x02\0\0\0\0\0"),
            Err(OobError::Truncated(8))
        );
    }

    /// Over a real TCP connection on loopback, both ways, the peer's stream non-blocking:
    /// messages arrive whole and in order, nothing before they are in.
    #[test]
    fn messages_cross_a_tcp_connection_both_ways() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        let addr = listener.local_addr().expect("its address");
        let client = TcpStream::connect(addr).expect("connect on loopback");
        let (server, _) = listener.accept().expect("accept");
        server.set_nonblocking(true).expect("non-blocking");
        let mut a = OobStream::new(client);
        let mut b = OobStream::new(server);
        assert!(b.recv().expect("nothing yet").is_none());
        for m in all() {
            a.send(&m).expect("send");
        }
        let mut got = Vec::new();
        while got.len() < all().len() {
            if let Some(m) = b.recv().expect("a message") {
                got.push(m);
            }
        }
        assert_eq!(got, all());
        b.send(&OobMsg::Migrated { conn: 1, rail: 1 })
            .expect("reply");
        assert_eq!(
            a.recv().expect("the reply"),
            Some(OobMsg::Migrated { conn: 1, rail: 1 })
        );
        // The peer going away is an error, not a hang or a panic.
        drop(a);
        loop {
            match b.recv() {
                Ok(None) => continue,
                Ok(Some(m)) => panic!("nothing more was sent: {m:?}"),
                Err(OobStreamError::Io(e)) => {
                    assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
                    break;
                }
                Err(e) => panic!("{e}"),
            }
        }
    }

    /// A length beyond any message is refused at once, not waited for.
    #[test]
    fn an_oversized_frame_is_refused() {
        let bytes: &[u8] = &[0x40, 0x00, b'R', b'2'];
        let mut s = OobStream::new(io::Cursor::new(bytes.to_vec()));
        assert!(matches!(
            s.recv(),
            Err(OobStreamError::Bad(OobError::TooLong(0x4000)))
        ));
    }

    proptest! {
        /// Any bytes decode to a message or an error (no panic), and what decodes encodes
        /// back to the same bytes.
        #[test]
        fn any_bytes_decode_or_refuse(b in proptest::collection::vec(any::<u8>(), 0..20)) {
            if let Ok(m) = OobMsg::decode(&b) {
                let mut out = [0; MAX_LEN];
                let n = m.encode(&mut out);
                prop_assert_eq!(&out[..n], &b[..]);
            }
        }

        /// Any stream of bytes gives messages or an error, never a panic.
        #[test]
        fn any_stream_is_read_without_panic(b in proptest::collection::vec(any::<u8>(), 0..64)) {
            let mut s = OobStream::new(io::Cursor::new(b));
            for _ in 0..70 {
                if s.recv().is_err() {
                    break;
                }
            }
        }
    }
}
