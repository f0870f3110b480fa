//! Varuna's logs (seed 001 §3.2): a request log at the requester and a completion log at the
//! responder, both of 8-byte entries in one format — a 15-bit timestamp, a 48-bit request
//! identifier (the paper stores the address of the copied `ibv_send_wr`; any 48-bit id
//! unique among the requests in flight does) and a finished bit:
//!
//! ```text
//!  63          49 48                                            1   0
//! +--------------+-----------------------------------------------+---+
//! |  timestamp   |                 request id                    | F |
//! +--------------+-----------------------------------------------+---+
//! ```
//!
//! Each logged request is followed on the same QP by an inline 8-byte WRITE of its entry into
//! its slot of the peer's completion log. RC executes in order, so after a failure one READ
//! of the completion log classifies every request still unfinished in the request log: the
//! peer's slot holds the same entry — the request ran (post-failure: do not resend, recover
//! its result) — or not (pre-failure: resend). The one case this misreads is the paper's
//! own corner: the request ran and its log write did not (treated as pre-failure).

/// One log entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LogEntry {
    /// When the request was logged, modulo 2^15 (tells a slot's reuse from its last use).
    pub timestamp: u16,
    /// The request's 48-bit identifier.
    pub id: u64,
    /// Set once the request completed at the requester (request log only).
    pub finished: bool,
}

/// Timestamps wrap at 2^15.
pub const TIMESTAMP_MASK: u16 = (1 << 15) - 1;
/// Request ids are 48 bits.
pub const ID_MASK: u64 = (1 << 48) - 1;

impl LogEntry {
    /// A fresh entry for request `id` logged at `timestamp`.
    pub fn new(timestamp: u16, id: u64) -> Self {
        Self {
            timestamp: timestamp & TIMESTAMP_MASK,
            id: id & ID_MASK,
            finished: false,
        }
    }

    /// The 8-byte word (little-endian in memory, as the log WRITE carries it).
    pub fn to_word(self) -> u64 {
        u64::from(self.timestamp & TIMESTAMP_MASK) << 49
            | (self.id & ID_MASK) << 1
            | u64::from(self.finished)
    }

    /// Reads a word; `None` for an empty slot (all zero: nothing was ever logged there).
    pub fn from_word(w: u64) -> Option<Self> {
        (w != 0).then_some(Self {
            timestamp: (w >> 49) as u16 & TIMESTAMP_MASK,
            id: (w >> 1) & ID_MASK,
            finished: w & 1 == 1,
        })
    }

    /// Whether `other` (a completion-log slot) records this request: same id and timestamp
    /// (the finished bit is the requester's own).
    pub fn matches(self, other: Self) -> bool {
        self.timestamp == other.timestamp && self.id == other.id
    }
}

/// What recovery makes of an unfinished request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Class {
    /// Never executed by the responder: resend it.
    PreFailure,
    /// Executed, its completion lost: do not resend; recover its result if it has one.
    PostFailure,
}

/// The requester's log: one slot per outstanding request, reused round-robin (the peer's
/// completion log has as many slots, one 8-byte word each).
#[derive(Clone, Debug)]
pub struct RequestLog {
    slots: Vec<Option<LogEntry>>,
    next: usize,
    clock: u16,
}

impl RequestLog {
    /// A log of `slots` entries.
    pub fn new(slots: usize) -> Self {
        Self {
            slots: vec![None; slots.max(1)],
            next: 0,
            clock: 0,
        }
    }

    /// Slots in the log (and in the peer's completion log).
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Always false: a log has at least one slot.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Logs request `id`: its slot and entry, for the completion-log WRITE that follows the
    /// request. `None` when every slot holds an unfinished request (the caller waits for a
    /// completion, as a full send queue makes it).
    pub fn append(&mut self, id: u64) -> Option<(usize, LogEntry)> {
        let n = self.slots.len();
        let slot = (0..n)
            .map(|k| (self.next + k) % n)
            .find(|&s| self.slots[s].is_none_or(|e| e.finished))?;
        self.clock = self.clock.wrapping_add(1) & TIMESTAMP_MASK;
        // Timestamp 0 with id 0 would be the empty word: start the clock at 1.
        if self.clock == 0 {
            self.clock = 1;
        }
        let e = LogEntry::new(self.clock, id);
        self.slots[slot] = Some(e);
        self.next = (slot + 1) % n;
        Some((slot, e))
    }

    /// Request `id` completed: its entry is finished (its slot free for reuse).
    pub fn finish(&mut self, id: u64) -> bool {
        match self
            .slots
            .iter_mut()
            .flatten()
            .find(|e| e.id == id & ID_MASK && !e.finished)
        {
            Some(e) => {
                e.finished = true;
                true
            }
            None => false,
        }
    }

    /// The unfinished entries, oldest first (by timestamp, modulo wrap from the newest), with
    /// their slots.
    pub fn unfinished(&self) -> Vec<(usize, LogEntry)> {
        let mut v: Vec<(usize, LogEntry)> = self
            .slots
            .iter()
            .enumerate()
            .filter_map(|(i, e)| e.filter(|e| !e.finished).map(|e| (i, e)))
            .collect();
        let newest = self.clock;
        // Age: how far behind the newest timestamp, modulo 2^15.
        v.sort_by_key(|(_, e)| newest.wrapping_sub(e.timestamp) & TIMESTAMP_MASK);
        v.reverse();
        v
    }

    /// Classifies every unfinished request against the peer's completion log `remote` (one
    /// word per slot, as one READ of it returns): oldest first. A slot missing from `remote`
    /// (a short read) counts as empty.
    pub fn classify(&self, remote: &[u64]) -> Vec<(usize, LogEntry, Class)> {
        self.unfinished()
            .into_iter()
            .map(|(slot, e)| {
                let there = remote.get(slot).copied().and_then(LogEntry::from_word);
                let class = if there.is_some_and(|r| e.matches(r)) {
                    Class::PostFailure
                } else {
                    Class::PreFailure
                };
                (slot, e, class)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_word_layout() {
        let e = LogEntry {
            timestamp: 0x7fff,
            id: 0xabcd_ef01_2345,
            finished: true,
        };
        assert_eq!(e.to_word(), 0xffff_579b_de02_468b);
        assert_eq!(LogEntry::from_word(e.to_word()), Some(e));
        assert_eq!(LogEntry::from_word(0), None);
    }

    proptest! {
        #[test]
        fn words_round_trip(ts in 0u16..0x8000, id in 0u64..(1 << 48), f: bool) {
            let e = LogEntry { timestamp: ts, id, finished: f };
            prop_assume!(e.to_word() != 0);
            prop_assert_eq!(LogEntry::from_word(e.to_word()), Some(e));
        }

        /// Any word decodes or is empty, never panics; what decodes encodes back.
        #[test]
        fn any_word(w: u64) {
            if let Some(e) = LogEntry::from_word(w) {
                prop_assert_eq!(e.to_word(), w);
            }
        }
    }

    /// Slots are reused only once their request finished; a full log refuses.
    #[test]
    fn slots_are_reused_after_their_request_finishes() {
        let mut log = RequestLog::new(3);
        let a = log.append(10).unwrap();
        let b = log.append(11).unwrap();
        let c = log.append(12).unwrap();
        assert_eq!((a.0, b.0, c.0), (0, 1, 2));
        assert!(log.append(13).is_none());
        assert!(log.finish(11));
        assert!(!log.finish(11), "finished once");
        let d = log.append(13).unwrap();
        assert_eq!(d.0, 1);
        assert_ne!(d.1.timestamp, b.1.timestamp);
        let order: Vec<u64> = log.unfinished().iter().map(|(_, e)| e.id).collect();
        assert_eq!(order, [10, 12, 13]);
    }

    /// Every moment a request can fail at, against the peer's completion log: before its
    /// packets (the slot holds the previous use, or nothing), between the request and its
    /// log write (the same), after both (the slot holds this entry). And a completion-log
    /// entry for a request the requester never logged changes nothing.
    #[test]
    fn classification_at_every_failure_moment() {
        let mut log = RequestLog::new(4);
        let (s0, e0) = log.append(100).unwrap(); // failed before its packets left
        let (s1, e1) = log.append(101).unwrap(); // executed, its log write lost
        let (s2, e2) = log.append(102).unwrap(); // executed and logged
        let mut remote = vec![0u64; 4];
        // The slot of 100 still holds an older request's entry from an earlier round.
        remote[s0] = LogEntry::new(e0.timestamp.wrapping_sub(4), 100).to_word();
        remote[s1] = 0;
        remote[s2] = e2.to_word();
        // A forged entry in the free slot names a request the log does not hold.
        remote[3] = LogEntry::new(77, 999).to_word();
        let c = log.classify(&remote);
        assert_eq!(
            c,
            [
                (s0, e0, Class::PreFailure),
                (s1, e1, Class::PreFailure),
                (s2, e2, Class::PostFailure)
            ]
        );
        // A short READ (the log cut off) counts the rest as not executed.
        let c = log.classify(&remote[..2]);
        assert!(c.iter().all(|&(_, _, k)| k == Class::PreFailure));
    }

    /// The timestamp survives its wrap: ordering and matching stay right past 2^15 requests.
    #[test]
    fn timestamps_wrap() {
        let mut log = RequestLog::new(2);
        for i in 0..40_000u64 {
            let (_, e) = log.append(i).unwrap();
            assert_ne!(e.to_word(), 0);
            log.finish(i);
        }
        let (_, a) = log.append(1).unwrap();
        let (_, b) = log.append(2).unwrap();
        let order: Vec<u64> = log.unfinished().iter().map(|(_, e)| e.id).collect();
        assert_eq!(order, [1, 2]);
        assert!(a.timestamp != b.timestamp);
    }
}
