//! The payload of ferroce's `PATH_CONTROL` packet (opcode 0xd8, manufacturer-specific, so
//! standard RoCEv2 never carries it): how two ferroce QPs with several ports tell each other
//! where they can be reached, that one of them moved, and whether a path carries both ways
//! (a probe on the path, answered on the same path).
//!
//! ```text
//!  0       1       2              3               4 .. 20   20 .. 26  26 .. 28
//!  what    port    max_rd_atomic  max_dest_rd_at  GID       MAC       reserved (0)
//! ```
//!
//! `port` is the sender's port index (from 0) of the address that follows. The two atomic
//! depths let each side check that its outstanding atomics fit the other's replay cache, the
//! condition for resending them exactly once after a move.

use core::net::{IpAddr, Ipv6Addr};

use super::{Error, MacAddr, Result};

/// What a path control message says.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PathControlKind {
    /// "I can also be reached here": sent when a QP with another port reaches RTS.
    Announce,
    /// The answer to an announce: the same, and "I heard yours".
    AnnounceReply,
    /// "I send from this address now: reply to it" (sent on the new path after a move).
    Moved,
    /// "Do you hear me here?": sent on a path the QP does not use now (its primary, while it
    /// runs on the alternate), from that path's address to the peer's on it.
    Probe,
    /// The answer to a probe, sent on the path the probe came on.
    ProbeReply,
}

impl PathControlKind {
    fn to_byte(self) -> u8 {
        match self {
            Self::Announce => 1,
            Self::AnnounceReply => 2,
            Self::Moved => 3,
            Self::Probe => 4,
            Self::ProbeReply => 5,
        }
    }

    fn from_byte(b: u8) -> Option<Self> {
        match b {
            1 => Some(Self::Announce),
            2 => Some(Self::AnnounceReply),
            3 => Some(Self::Moved),
            4 => Some(Self::Probe),
            5 => Some(Self::ProbeReply),
            _ => None,
        }
    }
}

/// A path control payload as plain values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PathControl {
    /// What it says.
    pub kind: PathControlKind,
    /// The sender's port index of `ip` / `mac`.
    pub port: u8,
    /// The sender's `max_rd_atomic` (atomics it keeps outstanding).
    pub max_rd_atomic: u8,
    /// The sender's `max_dest_rd_atomic` (atomic results its responder keeps for replay).
    pub max_dest_rd_atomic: u8,
    /// The sender's address on that port (its RoCEv2 GID).
    pub ip: IpAddr,
    /// The sender's MAC on that port.
    pub mac: MacAddr,
}

impl PathControl {
    /// Bytes on the wire.
    pub const LEN: usize = 28;

    /// Reads a payload; refuses a short one, an unknown kind or a nonzero reserved field.
    pub fn parse(b: &[u8]) -> Result<Self> {
        let malformed = Error::PathControl(b.len());
        if b.len() < Self::LEN || b[26..28] != [0, 0] {
            return Err(malformed);
        }
        let kind = PathControlKind::from_byte(b[0]).ok_or(malformed)?;
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[4..20]);
        let v6 = Ipv6Addr::from(gid);
        let ip = match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        };
        let mut mac = [0u8; 6];
        mac.copy_from_slice(&b[20..26]);
        Ok(Self {
            kind,
            port: b[1],
            max_rd_atomic: b[2],
            max_dest_rd_atomic: b[3],
            ip,
            mac: MacAddr(mac),
        })
    }

    /// Writes the payload into the first [`LEN`](Self::LEN) bytes of `b`.
    pub fn emit(&self, b: &mut [u8]) {
        b[0] = self.kind.to_byte();
        b[1] = self.port;
        b[2] = self.max_rd_atomic;
        b[3] = self.max_dest_rd_atomic;
        let gid = match self.ip {
            IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
            IpAddr::V6(v6) => v6.octets(),
        };
        b[4..20].copy_from_slice(&gid);
        b[20..26].copy_from_slice(&self.mac.0);
        b[26..28].fill(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn layout() {
        let p = PathControl {
            kind: PathControlKind::Moved,
            port: 1,
            max_rd_atomic: 16,
            max_dest_rd_atomic: 8,
            ip: "10.0.1.2".parse().unwrap(),
            mac: MacAddr([2, 0, 0, 0, 1, 2]),
        };
        let mut b = [0xffu8; PathControl::LEN];
        p.emit(&mut b);
        assert_eq!(&b[..4], &[3, 1, 16, 8]);
        assert_eq!(
            &b[4..20],
            &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 1, 2]
        );
        assert_eq!(&b[20..], &[2, 0, 0, 0, 1, 2, 0, 0]);
        assert_eq!(PathControl::parse(&b), Ok(p));
        let mut bad = b;
        bad[0] = 9;
        assert!(PathControl::parse(&bad).is_err());
        bad = b;
        bad[27] = 1;
        assert!(PathControl::parse(&bad).is_err());
        for (byte, kind) in [
            (1, PathControlKind::Announce),
            (2, PathControlKind::AnnounceReply),
            (3, PathControlKind::Moved),
            (4, PathControlKind::Probe),
            (5, PathControlKind::ProbeReply),
        ] {
            let mut k = b;
            k[0] = byte;
            assert_eq!(PathControl::parse(&k).map(|m| m.kind), Ok(kind));
        }
        for byte in [0, 6, 0xff] {
            let mut k = b;
            k[0] = byte;
            assert!(PathControl::parse(&k).is_err());
        }
        assert!(PathControl::parse(&b[..27]).is_err());
    }

    proptest! {
        /// Any bytes parse or are refused without a panic; what parses emits back to the
        /// same bytes (the reserved field is zero in everything that parses).
        #[test]
        fn parse_emit_round_trip(b in proptest::collection::vec(any::<u8>(), 0..40)) {
            if let Ok(p) = PathControl::parse(&b) {
                let mut out = [0u8; PathControl::LEN];
                p.emit(&mut out);
                prop_assert_eq!(&out[..], &b[..PathControl::LEN]);
            }
        }
    }
}
