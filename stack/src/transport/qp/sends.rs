//! Per-packet send records: when each request packet left, by which path, and how big, in a
//! ring indexed by PSN. Acknowledgements turn them into RTT samples for congestion control
//! (delay-based controllers need them); failover will read them as loss evidence per path.
//! Built only for a QP whose controller hears sends, so a default QP carries none.

use crate::transport::path::Path;
use crate::wire::Psn;

/// What the requester recorded of one packet it sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendRecord {
    /// When it (last) left, ns.
    pub at: u64,
    /// The path it took.
    pub path: Path,
    /// Bytes of the frame.
    pub bytes: u16,
    /// Sent more than once: its acknowledgement says nothing of the round trip (Karn).
    pub resent: bool,
}

const VALID: u32 = 1 << 31;
const RESENT: u32 = 1 << 30;
const PORT_SHIFT: u32 = 24;
const PORT_MASK: u32 = 0x3f;
const PSN_MASK: u32 = 0x00ff_ffff;

/// One slot: the PSN, the device port (6 bits) and two flags in one word.
#[derive(Clone, Copy, Debug, Default)]
struct Slot {
    at: u64,
    tag: u32,
    bytes: u16,
    udp_src_port: u16,
}

/// The ring: slot `psn mod capacity` holds the newest packet that maps there, so records of
/// the last `capacity` PSNs survive, which covers a window of that many packets.
#[derive(Debug)]
pub(crate) struct SendRecords {
    slots: Box<[Slot]>,
}

impl SendRecords {
    /// A ring for windows of up to `capacity` packets (rounded up to a power of two, at most
    /// 2^16).
    pub(crate) fn new(capacity: u32) -> Self {
        let n = capacity.clamp(64, 1 << 16).next_power_of_two() as usize;
        Self {
            slots: vec![Slot::default(); n].into_boxed_slice(),
        }
    }

    fn slot(&self, psn: Psn) -> usize {
        psn.value() as usize & (self.slots.len() - 1)
    }

    /// Packet `psn` of `bytes` left at `now` by `path`.
    pub(crate) fn note(&mut self, psn: Psn, now: u64, bytes: usize, path: Path, resent: bool) {
        let i = self.slot(psn);
        let again = self.get(psn).is_some();
        let flags = VALID | if resent || again { RESENT } else { 0 };
        self.slots[i] = Slot {
            at: now,
            tag: flags | (u32::from(path.port) & PORT_MASK) << PORT_SHIFT | psn.value(),
            bytes: bytes.min(usize::from(u16::MAX)) as u16,
            udp_src_port: path.udp_src_port,
        };
    }

    /// The record of `psn`, if the ring still holds it.
    pub(crate) fn get(&self, psn: Psn) -> Option<SendRecord> {
        let s = self.slots[self.slot(psn)];
        (s.tag & VALID != 0 && s.tag & PSN_MASK == psn.value()).then_some(SendRecord {
            at: s.at,
            path: Path {
                port: (s.tag >> PORT_SHIFT & PORT_MASK) as u8,
                udp_src_port: s.udp_src_port,
            },
            bytes: s.bytes,
            resent: s.tag & RESENT != 0,
        })
    }

    /// The round trip of `psn`, acknowledged at `now`: none when it was resent or is no
    /// longer (or never was) recorded.
    pub(crate) fn rtt(&self, psn: Psn, now: u64) -> Option<u64> {
        self.get(psn)
            .filter(|r| !r.resent)
            .map(|r| now.saturating_sub(r.at))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_give_rtt_samples_except_for_resent_packets() {
        let mut r = SendRecords::new(100);
        let path = Path {
            port: 3,
            udp_src_port: 0xc001,
        };
        r.note(Psn::new(5), 1_000, 1082, path, false);
        r.note(Psn::new(6), 1_100, 1082, path, false);
        assert_eq!(r.rtt(Psn::new(5), 9_000), Some(8_000));
        assert_eq!(r.get(Psn::new(6)).unwrap().path, path);
        r.note(Psn::new(6), 5_000, 1082, path, false);
        assert_eq!(r.rtt(Psn::new(6), 9_000), None, "sent twice: Karn");
        assert_eq!(r.rtt(Psn::new(7), 9_000), None, "never sent");
        // 128 PSNs later the slot holds another packet.
        r.note(Psn::new(5 + 128), 2_000, 64, path, false);
        assert_eq!(r.get(Psn::new(5)), None);
        assert_eq!(r.rtt(Psn::new(5 + 128), 2_500), Some(500));
    }
}
