//! What ferroce adds to a CM exchange: the schemes beyond IBTA an end offers, carried in the
//! last [`OFFER_LEN`] bytes of a REQ's or REP's private data.
//!
//! rdma_cm leaves the private data after its IP header to the program, and a program reads
//! only as many bytes as it sent: the tail stays zero when a kernel CM sends the message. An
//! offer written there is invisible to a peer that does not know it (a ConnectX, rxe), and
//! its absence tells a ferroce end that the peer is such a peer, which must then never see a
//! ferroce-only opcode (the in-band alternate-port exchange of native failover, for one).
//! The offer goes at the *end* so the program's bytes at the start keep their place, and
//! only when the program left the room: a program that fills the private data gets a plain
//! IBTA connection. The magic, a version and a CRC-32 over the rest make a program's own
//! bytes taken for an offer a 2⁻⁶⁴ event.
//!
//! Layout (big-endian):
//! ```text
//!  0..4   magic "FRCE"
//!  4      version (1)
//!  5      flags: bit 0 = speaks ferroce's in-band path control (native failover)
//!  6      capability count (at most MAX_OFFERED)
//!  7      zero
//!  8..18  two capabilities: kind (u8), parameter (u32) — as the TCP exchange's
//! 18..20  zero
//! 20..24  CRC-32 (IEEE) of bytes 0..20
//! ```

use crate::connect::Capabilities;

/// Bytes of an encoded offer.
pub const OFFER_LEN: usize = 24;

/// Capabilities an offer carries (the REQ's private data is 56 bytes after rdma_cm's
/// header, and programs such as NVMe-oF's initiator use 32 of them).
pub const MAX_OFFERED: usize = 2;

const MAGIC: &[u8; 4] = b"FRCE";
const VERSION: u8 = 1;
const FLAG_PATH_CONTROL: u8 = 1;
const CAPS_AT: usize = 8;
const CAP_LEN: usize = 5;
const CRC_AT: usize = 20;

/// An end's offer of what it runs beyond IBTA.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Offer {
    /// The end understands ferroce's in-band path control: the alternate-port announce,
    /// moves and probes of native failover. Only then may the other end send them.
    pub path_control: bool,
    /// Recovery, path and congestion schemes, as the TCP exchange's
    /// [`Capabilities`](crate::connect::Capabilities) (at most [`MAX_OFFERED`]).
    pub offers: Capabilities,
}

impl Offer {
    /// The wire form; `None` with more than [`MAX_OFFERED`] capabilities.
    pub fn encode(&self) -> Option<[u8; OFFER_LEN]> {
        if self.offers.len() > MAX_OFFERED {
            return None;
        }
        let mut b = [0u8; OFFER_LEN];
        b[..4].copy_from_slice(MAGIC);
        b[4] = VERSION;
        b[5] = if self.path_control {
            FLAG_PATH_CONTROL
        } else {
            0
        };
        b[6] = self.offers.len() as u8;
        for (i, c) in self.offers.iter().enumerate() {
            let at = CAPS_AT + i * CAP_LEN;
            b[at] = c.kind;
            b[at + 1..at + CAP_LEN].copy_from_slice(&c.value.to_be_bytes());
        }
        let crc = crc32fast::hash(&b[..CRC_AT]);
        b[CRC_AT..].copy_from_slice(&crc.to_be_bytes());
        Some(b)
    }

    /// Reads an offer from exactly its bytes; `None` for anything else (a program's bytes,
    /// zeros, a damaged offer). A later version keeps this layout and may set more flags,
    /// which are ignored here.
    pub fn decode(b: &[u8]) -> Option<Self> {
        let b: &[u8; OFFER_LEN] = b.try_into().ok()?;
        if &b[..4] != MAGIC || b[4] < VERSION {
            return None;
        }
        let crc = u32::from_be_bytes([b[20], b[21], b[22], b[23]]);
        if crc32fast::hash(&b[..CRC_AT]) != crc {
            return None;
        }
        let count = usize::from(b[6]);
        if count > MAX_OFFERED {
            return None;
        }
        let mut offers = Capabilities::NONE;
        for i in 0..count {
            let at = CAPS_AT + i * CAP_LEN;
            let kind = b[at];
            if offers.has(kind) {
                return None;
            }
            let value = u32::from_be_bytes([b[at + 1], b[at + 2], b[at + 3], b[at + 4]]);
            offers = offers.with(kind, value);
        }
        Some(Self {
            path_control: b[5] & FLAG_PATH_CONTROL != 0,
            offers,
        })
    }

    /// Puts the offer at the end of a message's private data of `room` bytes, after the
    /// `data` already there (padded with zeros up to it). False, `data` unchanged, when the
    /// data leaves no room for it or the offer does not encode.
    pub fn append_to(&self, data: &mut Vec<u8>, room: usize) -> bool {
        let Some(b) = self.encode() else {
            return false;
        };
        if room < OFFER_LEN || data.len() > room - OFFER_LEN {
            return false;
        }
        data.resize(room - OFFER_LEN, 0);
        data.extend_from_slice(&b);
        true
    }

    /// The offer at the end of a received message's private data, if one is there; its bytes
    /// are zeroed, so the program sees what a kernel CM's message would carry.
    pub fn take_from(data: &mut [u8]) -> Option<Self> {
        let at = data.len().checked_sub(OFFER_LEN)?;
        let offer = Self::decode(&data[at..])?;
        data[at..].fill(0);
        Some(offer)
    }

    /// What a connection between an end offering `self` and one offering `peer` runs: each
    /// scheme both offer (the smaller parameter), path control if both speak it.
    pub fn agree(&self, peer: &Self) -> Self {
        Self {
            path_control: self.path_control && peer.path_control,
            offers: self.offers.common(&peer.offers),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connect::capability;
    use ferroce_stack::wire::mad::private_len;
    use proptest::prelude::*;

    fn some() -> Offer {
        Offer {
            path_control: true,
            offers: Capabilities::NONE.with(capability::SELECTIVE_REPEAT, 0),
        }
    }

    #[test]
    fn offer_round_trips_at_the_end_of_a_req() {
        // rdma_cm's 36-byte header and 32 bytes of the program's (NVMe-oF's request size).
        let mut data: Vec<u8> = (0..68u8).collect();
        assert!(some().append_to(&mut data, private_len::REQ));
        assert_eq!(data.len(), private_len::REQ);
        assert_eq!(&data[..68], &(0..68u8).collect::<Vec<_>>()[..]);
        assert_eq!(&data[68..72], b"FRCE");
        assert_eq!(Offer::take_from(&mut data), Some(some()));
        // Taken: the tail reads as a kernel CM's zeros, and nothing is found twice.
        assert!(data[68..].iter().all(|&x| x == 0));
        assert_eq!(Offer::take_from(&mut data), None);
    }

    #[test]
    fn a_full_private_data_gets_no_offer() {
        let mut data = vec![7u8; private_len::REQ - OFFER_LEN + 1];
        assert!(!some().append_to(&mut data, private_len::REQ));
        assert_eq!(data, vec![7u8; private_len::REQ - OFFER_LEN + 1]);
        let mut exact = vec![7u8; private_len::REQ - OFFER_LEN];
        assert!(some().append_to(&mut exact, private_len::REQ));
    }

    #[test]
    fn a_kernel_cms_zeros_and_damaged_offers_are_not_offers() {
        assert_eq!(Offer::decode(&[0; OFFER_LEN]), None);
        let good = some().encode().unwrap();
        for i in 0..OFFER_LEN {
            let mut bad = good;
            bad[i] ^= 0x10;
            assert_eq!(Offer::decode(&bad), None, "byte {i}");
        }
        assert_eq!(Offer::decode(&good[1..]), None);
    }

    #[test]
    fn agreement_is_what_both_offer() {
        let none = Offer::default();
        assert_eq!(some().agree(&none), none);
        assert_eq!(some().agree(&some()), some());
        let pc = Offer {
            path_control: true,
            offers: Capabilities::NONE,
        };
        assert_eq!(some().agree(&pc), pc);
    }

    #[test]
    fn three_capabilities_do_not_encode() {
        let o = Offer {
            path_control: false,
            offers: Capabilities::NONE.with(1, 0).with(2, 0).with(3, 0),
        };
        assert_eq!(o.encode(), None);
        assert!(!o.append_to(&mut Vec::new(), private_len::REP));
    }

    proptest! {
        #[test]
        fn any_bytes_decode_without_panic(b in proptest::collection::vec(any::<u8>(), 0..300)) {
            let mut b = b;
            let _ = Offer::decode(&b);
            let _ = Offer::take_from(&mut b);
        }

        #[test]
        fn offers_round_trip(pc: bool, k1 in 1u8.., v1: u32, k2 in 1u8.., v2: u32, n in 0usize..=2) {
            let mut offers = Capabilities::NONE;
            if n >= 1 { offers = offers.with(k1, v1); }
            if n >= 2 && k2 != k1 { offers = offers.with(k2, v2); }
            let o = Offer { path_control: pc, offers };
            prop_assert_eq!(Offer::decode(&o.encode().unwrap()), Some(o));
        }
    }
}
