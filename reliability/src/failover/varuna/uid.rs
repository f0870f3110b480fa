//! Varuna's extended-status compare-and-swap (seed 001 §3.3): a CAS whose outcome can be
//! recovered after a failure. *Occupy*: the requester first WRITEs the real swap value into
//! its slot of a per-vQP CAS buffer at the responder, then swaps in a 64-bit **UID** instead
//! of the value — the slot's address and the requester's QP id — so whoever finds the UID in
//! the target can tell whose CAS won and where its value is. *Confirm*: once the requester
//! knows it won, a second CAS replaces the UID with the real value.
//!
//! ```text
//!  63                                         16 15            0
//! +---------------------------------------------+---------------+
//! |  CAS-buffer slot address (48 bits; the low  |    QP id      |
//! |  3 bits, zero in an 8-byte-aligned address, |   (16 bits)   |
//! |  carry the slot's use count modulo 8)        |               |
//! +---------------------------------------------+---------------+
//! ```
//!
//! The use count in the address's spare bits tells a UID of this use of a slot from a stale
//! one of an earlier use (the paper leaves reuse open).

/// A UID as it sits in the target word.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Uid {
    /// The CAS-buffer slot's address (8-byte aligned, 48 bits).
    pub slot_addr: u64,
    /// The slot's use count modulo 8.
    pub use_count: u8,
    /// The requester's QP id.
    pub qp: u16,
}

impl Uid {
    /// The word swapped into the target.
    pub fn to_word(self) -> u64 {
        ((self.slot_addr & 0xffff_ffff_fff8) | u64::from(self.use_count & 7)) << 16
            | u64::from(self.qp)
    }

    /// Reads a target word as a UID (any word reads as one; [`CasBuffer::owns`] says whether
    /// it is one of ours).
    pub fn from_word(w: u64) -> Self {
        let addr = w >> 16;
        Self {
            slot_addr: addr & !7,
            use_count: (addr & 7) as u8,
            qp: w as u16,
        }
    }
}

/// A requester's CAS buffer at the responder: `slots` 16-byte slots (the real swap value,
/// then the request's log entry) from `base`, used round-robin.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CasBuffer {
    /// The buffer's address at the responder (8-byte aligned).
    pub base: u64,
    /// Slots in it.
    pub slots: u32,
    /// The requester's QP id.
    pub qp: u16,
}

/// Bytes of one CAS-buffer slot: the swap value and the log entry.
pub const SLOT_BYTES: u64 = 16;

impl CasBuffer {
    /// The UID of use `use_count` of slot `slot`.
    pub fn uid(&self, slot: u32, use_count: u8) -> Uid {
        Uid {
            slot_addr: self.base + u64::from(slot) * SLOT_BYTES,
            use_count: use_count & 7,
            qp: self.qp,
        }
    }

    /// The slot a target word names, if it is a UID of this buffer (this QP, an address on a
    /// slot boundary inside the buffer), with the use count it carries. A forged word — any
    /// other QP, an address outside or between slots — is `None`.
    pub fn owns(&self, word: u64) -> Option<(u32, u8)> {
        let u = Uid::from_word(word);
        if u.qp != self.qp || u.slot_addr < self.base {
            return None;
        }
        let off = u.slot_addr - self.base;
        (off.is_multiple_of(SLOT_BYTES) && off / SLOT_BYTES < u64::from(self.slots))
            .then_some(((off / SLOT_BYTES) as u32, u.use_count))
    }
}

/// Where the CAS buffers of every requester sharing the target words lie at the responder
/// (one registered region, `rkey`): a target word naming a slot in it is another
/// requester's occupied CAS — a UID standing for the value in that slot — and must be
/// resolved before it is used as a number (seed 001 §3.3). A number that happens to look
/// like such a UID (its top 48 bits a slot address in the region) would be taken for one;
/// the region's addresses sit high in the address space, where counters and lock words do
/// not reach.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UidRegion {
    /// The region's first byte (8-byte aligned).
    pub base: u64,
    /// Its length in bytes.
    pub len: u64,
    /// Its rkey at the responder.
    pub rkey: u32,
}

impl UidRegion {
    /// The UID `word` is, if it names a slot in the region (an address on a slot boundary
    /// from `base`).
    pub fn names(&self, word: u64) -> Option<Uid> {
        let u = Uid::from_word(word);
        let off = u.slot_addr.checked_sub(self.base)?;
        (off < self.len && off.is_multiple_of(SLOT_BYTES) && off + SLOT_BYTES <= self.len)
            .then_some(u)
    }
}

/// What became of an extended-status CAS in flight at a failure, from the target word read
/// after it, whether the CAS's completion-log entry shows it executed, and its UID.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CasOutcome {
    /// The UID is in the target: the CAS won (it read `compare`); confirm it.
    Won,
    /// It executed and lost: the target held something else (the value read now is the
    /// best the requester can return).
    Lost,
    /// It never executed: resend it.
    NotExecuted,
}

/// Decides a CAS's outcome (§3.3 "Recovery"): this use's UID in the target means it won, and
/// so does `helped` — another requester found the UID there, marked the slot with it and
/// resolved it to the value in its stead; its completion logged without either means it
/// ran and lost; none means it did not run. A stale UID of an earlier use of the same slot,
/// or a forged one, is not a win.
pub fn cas_outcome(
    buffer: &CasBuffer,
    target_word: u64,
    uid: Uid,
    logged: bool,
    helped: bool,
) -> CasOutcome {
    let ours = buffer.owns(target_word);
    let mine = buffer.owns(uid.to_word());
    if (ours.is_some() && ours == mine) || (helped && mine.is_some()) {
        CasOutcome::Won
    } else if logged {
        CasOutcome::Lost
    } else {
        CasOutcome::NotExecuted
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const BUF: CasBuffer = CasBuffer {
        base: 0x7f00_1234_0000,
        slots: 64,
        qp: 0x0a1b,
    };

    #[test]
    fn uid_layout_and_decoding() {
        let u = BUF.uid(3, 5);
        assert_eq!(u.slot_addr, 0x7f00_1234_0030);
        assert_eq!(u.to_word(), 0x7f00_1234_0035_0a1b);
        assert_eq!(Uid::from_word(u.to_word()), u);
        assert_eq!(BUF.owns(u.to_word()), Some((3, 5)));
    }

    proptest! {
        #[test]
        fn uids_round_trip(slot in 0u32..64, uses in 0u8..8) {
            let u = BUF.uid(slot, uses);
            prop_assert_eq!(BUF.owns(u.to_word()), Some((slot, uses)));
        }

        /// Any target word: decoding never panics, and only words naming a slot of this
        /// buffer and this QP are owned.
        #[test]
        fn any_word_is_owned_only_if_it_names_a_slot(w: u64) {
            if let Some((slot, uses)) = BUF.owns(w) {
                prop_assert_eq!(BUF.uid(slot, uses).to_word(), w);
            }
        }
    }

    /// Occupy won, confirm lost: the UID sits in the target — a win, to confirm. Occupy
    /// executed and lost: logged, no UID — lost. Never executed: resend. A forged UID (other
    /// QP, outside the buffer, between slots) or a stale one (the slot's earlier use) in the
    /// target is no win.
    #[test]
    fn outcomes_including_forged_and_stale_uids() {
        let uid = BUF.uid(7, 2);
        assert_eq!(
            cas_outcome(&BUF, uid.to_word(), uid, true, false),
            CasOutcome::Won
        );
        assert_eq!(
            cas_outcome(&BUF, uid.to_word(), uid, false, false),
            CasOutcome::Won
        );
        assert_eq!(cas_outcome(&BUF, 42, uid, true, false), CasOutcome::Lost);
        assert_eq!(
            cas_outcome(&BUF, 42, uid, false, false),
            CasOutcome::NotExecuted
        );
        let other_qp = Uid { qp: 0x0a1c, ..uid };
        let outside = Uid {
            slot_addr: BUF.base + 64 * SLOT_BYTES,
            ..uid
        };
        let between = Uid {
            slot_addr: uid.slot_addr + 8,
            ..uid
        };
        let stale = BUF.uid(7, 1);
        for forged in [other_qp, outside, between, stale] {
            assert_eq!(
                cas_outcome(&BUF, forged.to_word(), uid, false, false),
                CasOutcome::NotExecuted,
                "{forged:?}"
            );
            assert_eq!(
                cas_outcome(&BUF, forged.to_word(), uid, true, false),
                CasOutcome::Lost
            );
        }
        // Resolved by another requester: the value in the target, the slot marked.
        assert_eq!(cas_outcome(&BUF, 42, uid, true, true), CasOutcome::Won);
        assert_eq!(cas_outcome(&BUF, 42, uid, false, true), CasOutcome::Won);
    }

    /// A region names the UIDs of every buffer in it, on slot boundaries only.
    #[test]
    fn a_region_names_uids_inside_it() {
        let region = UidRegion {
            base: BUF.base,
            len: 4 * 64 * SLOT_BYTES,
            rkey: 9,
        };
        let other = CasBuffer {
            base: BUF.base + 64 * SLOT_BYTES,
            qp: 0x0b00,
            ..BUF
        };
        for u in [BUF.uid(0, 1), BUF.uid(63, 7), other.uid(5, 3)] {
            assert_eq!(region.names(u.to_word()), Some(u));
        }
        assert_eq!(region.names(42), None, "a small number");
        assert_eq!(region.names(0), None);
        let past = Uid {
            slot_addr: BUF.base + 4 * 64 * SLOT_BYTES,
            use_count: 0,
            qp: 1,
        };
        assert_eq!(region.names(past.to_word()), None, "past the end");
        let between = Uid {
            slot_addr: BUF.base + 8,
            use_count: 0,
            qp: 1,
        };
        assert_eq!(region.names(between.to_word()), None, "between slots");
    }
}
