//! Tag matching (rdma-core's "hardware tag matching", `IBV_SRQT_TM`): an SRQ that, besides
//! its ordinary receives, holds a list of tagged buffers, and hands a SEND whose first bytes
//! are a tag matching header to the first buffer whose tag it matches, as an MPI library's
//! receive queue does. Messages are ordinary RC SENDs; the header formats are rdma-core's
//! `infiniband/tm_types.h`:
//!
//! ```text
//! TMH (16 bytes): opcode u8, reserved [u8; 3], app_ctx be32, tag be64
//! RVH (16 bytes, after a TMH of a rendezvous request): va be64, rkey be32, len be32
//! ```
//!
//! An eager message's payload (after the TMH) lands in the matched buffer; a rendezvous
//! request's data is read from the sender by the responder's QP (an RDMA READ into the
//! matched buffer), which then tells the sender with a FIN message. A message no tag takes
//! is "unexpected": it goes whole into an ordinary receive, and the list counts it; tags
//! added by software that had not yet seen every unexpected message would match out of MPI
//! order, so an add that names a stale count fails until software synchronizes.

use smallvec::SmallVec;

use super::wr::{PostError, RecvWqe, Sge};

/// Bytes of a tag matching header.
pub const TMH_LEN: usize = 16;
/// Bytes of a rendezvous header.
pub const RVH_LEN: usize = 16;

/// `IBV_TMH_*` opcodes (`enum ibv_tmh_op`).
pub mod op {
    /// A message without a tag: always an ordinary receive.
    pub const NO_TAG: u8 = 0;
    /// A rendezvous request: header, rendezvous header, optional data.
    pub const RNDV: u8 = 1;
    /// The receiver read a rendezvous request's data: the sender may free it.
    pub const FIN: u8 = 2;
    /// An eager message: header, then payload.
    pub const EAGER: u8 = 3;
}

/// A tagged buffer.
#[derive(Clone, Debug)]
struct Entry {
    handle: u32,
    tag: u64,
    mask: u64,
    wqe: RecvWqe,
}

/// A rendezvous request's read: what the matched buffer takes, from where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rendezvous {
    /// The sender's buffer.
    pub va: u64,
    /// Its rkey.
    pub rkey: u32,
    /// Its length.
    pub len: u32,
    /// The request's TMH and RVH, sent back (with the FIN opcode) when the read is done.
    pub headers: [u8; TMH_LEN + RVH_LEN],
}

/// Where a SEND arriving at a tag matching SRQ goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Taken {
    /// Not a tag matching message (too short for a header, or an opcode that is none of
    /// the request kinds): an ordinary receive, completed as `IBV_WC_RECV`.
    Plain,
    /// Sent without a tag: an ordinary receive, `IBV_WC_TM_NO_TAG`.
    NoTag,
    /// No tagged buffer matched (or matching waits for software to catch up): an ordinary
    /// receive, `IBV_WC_TM_RECV` without flags, and the unexpected count grew.
    Unexpected,
    /// An eager message matched: its payload after the header lands in the buffer.
    Eager {
        /// The header's tag.
        tag: u64,
        /// The header's application context.
        app_ctx: u32,
    },
    /// A rendezvous request matched: the responder reads the data into the buffer.
    Rndv {
        /// The header's tag.
        tag: u64,
        /// The header's application context.
        app_ctx: u32,
        /// The read to make.
        read: Rendezvous,
    },
}

/// The tag list of a tag matching SRQ.
#[derive(Debug)]
pub(crate) struct TagList {
    entries: Vec<Entry>,
    max_tags: u32,
    max_sge: u32,
    next_handle: u32,
    /// Messages deemed unexpected so far.
    unexpected: u32,
    /// The count software last reported (an add or a sync).
    reported: u32,
}

/// Why a tag list operation failed (`IBV_WC_TM_ERR`, or an errno at post time).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TmError {
    /// The add named an unexpected count older than the list's: synchronize first.
    #[error("unexpected count {given} is behind the queue's {actual}: synchronize first")]
    OutOfSync {
        /// The count the operation named.
        given: u32,
        /// The list's.
        actual: u32,
    },
    /// No tag has that handle (a message consumed it, or it was removed).
    #[error("no tag with handle {0}")]
    NoSuchTag(u32),
    /// The list is full.
    #[error("the tag list holds its {0} tags")]
    Full(u32),
    /// More scatter elements than a tagged buffer takes.
    #[error("{got} scatter elements, a tagged buffer takes {max}")]
    TooManySges {
        /// Elements given.
        got: usize,
        /// Elements allowed.
        max: u32,
    },
}

impl From<TmError> for PostError {
    fn from(e: TmError) -> Self {
        match e {
            TmError::TooManySges { got, max } => Self::TooManySges { got, max },
            TmError::Full(n) => Self::QueueFull(n),
            _ => Self::Destination,
        }
    }
}

impl TagList {
    pub(crate) fn new(max_tags: u32, max_sge: u32) -> Self {
        Self {
            entries: Vec::new(),
            max_tags,
            max_sge,
            next_handle: 1,
            unexpected: 0,
            reported: 0,
        }
    }

    /// True while software has not reported every unexpected message.
    pub(crate) fn sync_required(&self) -> bool {
        self.reported != self.unexpected
    }

    /// `IBV_WR_TAG_ADD`: the new tag's handle. `unexpected` is the count software reports
    /// with it (`IBV_OPS_TM_SYNC`); without one the last reported count stands, as on mlx5.
    pub(crate) fn add(
        &mut self,
        unexpected: Option<u32>,
        tag: u64,
        mask: u64,
        recv_wr_id: u64,
        sges: &[Sge],
    ) -> Result<u32, TmError> {
        if let Some(n) = unexpected {
            self.reported = n;
        }
        if self.reported != self.unexpected {
            return Err(TmError::OutOfSync {
                given: self.reported,
                actual: self.unexpected,
            });
        }
        if sges.len() > self.max_sge as usize {
            return Err(TmError::TooManySges {
                got: sges.len(),
                max: self.max_sge,
            });
        }
        if self.entries.len() >= self.max_tags as usize {
            return Err(TmError::Full(self.max_tags));
        }
        let handle = self.next_handle;
        self.next_handle = self.next_handle.wrapping_add(1).max(1);
        self.entries.push(Entry {
            handle,
            tag,
            mask,
            wqe: RecvWqe {
                wr_id: recv_wr_id,
                sges: SmallVec::from_slice(sges),
            },
        });
        Ok(handle)
    }

    /// `IBV_WR_TAG_DEL`.
    pub(crate) fn remove(&mut self, unexpected: Option<u32>, handle: u32) -> Result<(), TmError> {
        if let Some(n) = unexpected {
            self.reported = n;
        }
        let i = self
            .entries
            .iter()
            .position(|e| e.handle == handle)
            .ok_or(TmError::NoSuchTag(handle))?;
        self.entries.remove(i);
        Ok(())
    }

    /// `IBV_WR_TAG_SYNC`.
    pub(crate) fn sync(&mut self, unexpected: u32) {
        self.reported = unexpected;
    }

    /// Classifies a message by its first packet's payload and takes the buffer it goes to:
    /// a tagged one (matched), or, through `ordinary`, one of the SRQ's receives. None when
    /// an ordinary receive is needed and there is none (the message is not counted).
    pub(crate) fn take(
        &mut self,
        payload: &[u8],
        ordinary: impl FnOnce() -> Option<RecvWqe>,
    ) -> Option<(RecvWqe, Taken)> {
        let Some(h) = payload.get(..TMH_LEN) else {
            return ordinary().map(|w| (w, Taken::Plain));
        };
        let opcode = h[0];
        let app_ctx = u32::from_be_bytes([h[4], h[5], h[6], h[7]]);
        let tag = u64::from_be_bytes([h[8], h[9], h[10], h[11], h[12], h[13], h[14], h[15]]);
        let read = match opcode {
            op::NO_TAG => return ordinary().map(|w| (w, Taken::NoTag)),
            op::EAGER => None,
            op::RNDV => match payload.get(..TMH_LEN + RVH_LEN) {
                Some(hv) => {
                    let r = &hv[TMH_LEN..];
                    let mut headers = [0u8; TMH_LEN + RVH_LEN];
                    headers.copy_from_slice(hv);
                    headers[0] = op::FIN;
                    Some(Rendezvous {
                        va: u64::from_be_bytes([r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7]]),
                        rkey: u32::from_be_bytes([r[8], r[9], r[10], r[11]]),
                        len: u32::from_be_bytes([r[12], r[13], r[14], r[15]]),
                        headers,
                    })
                }
                None => return ordinary().map(|w| (w, Taken::Plain)),
            },
            _ => return ordinary().map(|w| (w, Taken::Plain)),
        };
        // The first tag, in the order they were added, whose bits under its mask agree.
        let hit = self
            .entries
            .iter()
            .position(|e| (e.tag ^ tag) & e.mask == 0);
        match hit {
            Some(i) => {
                let e = self.entries.remove(i);
                let taken = match read {
                    None => Taken::Eager { tag, app_ctx },
                    Some(read) => Taken::Rndv { tag, app_ctx, read },
                };
                Some((e.wqe, taken))
            }
            None => {
                let w = ordinary()?;
                self.unexpected = self.unexpected.wrapping_add(1);
                Some((w, Taken::Unexpected))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmh(opcode: u8, tag: u64) -> Vec<u8> {
        let mut h = vec![opcode, 0, 0, 0, 0, 0, 0, 7];
        h.extend_from_slice(&tag.to_be_bytes());
        h
    }

    fn plain() -> Option<RecvWqe> {
        Some(RecvWqe {
            wr_id: 99,
            sges: SmallVec::new(),
        })
    }

    #[test]
    fn eager_messages_take_the_first_tag_they_match_under_its_mask() {
        let mut l = TagList::new(8, 1);
        let a = l.add(Some(0), 0x1200, 0xff00, 1, &[]).unwrap();
        l.add(Some(0), 0x1234, u64::MAX, 2, &[]).unwrap();
        assert_ne!(a, 0);
        let (w, t) = l.take(&tmh(op::EAGER, 0x1234), plain).unwrap();
        // The masked tag was added first and matches too.
        assert_eq!(w.wr_id, 1);
        assert_eq!(
            t,
            Taken::Eager {
                tag: 0x1234,
                app_ctx: 7
            }
        );
        let (w, _) = l.take(&tmh(op::EAGER, 0x1234), plain).unwrap();
        assert_eq!(w.wr_id, 2);
        // Nothing left: unexpected, counted, and adds fail until software syncs.
        let (w, t) = l.take(&tmh(op::EAGER, 0x1234), plain).unwrap();
        assert_eq!((w.wr_id, t), (99, Taken::Unexpected));
        assert!(l.sync_required());
        assert_eq!(
            l.add(Some(0), 5, u64::MAX, 3, &[]),
            Err(TmError::OutOfSync {
                given: 0,
                actual: 1
            })
        );
        l.sync(1);
        assert!(!l.sync_required());
        assert!(l.add(Some(1), 5, u64::MAX, 3, &[]).is_ok());
    }

    #[test]
    fn no_tag_short_and_unknown_messages_are_ordinary_receives() {
        let mut l = TagList::new(8, 1);
        l.add(Some(0), 0, 0, 1, &[]).unwrap();
        assert_eq!(l.take(&tmh(op::NO_TAG, 0), plain).unwrap().1, Taken::NoTag);
        assert_eq!(l.take(&[1, 2, 3], plain).unwrap().1, Taken::Plain);
        assert_eq!(l.take(&tmh(op::FIN, 0), plain).unwrap().1, Taken::Plain);
        // A rendezvous request too short for its header is not one.
        assert_eq!(l.take(&tmh(op::RNDV, 0), plain).unwrap().1, Taken::Plain);
        assert!(!l.sync_required());
        // With no ordinary receive the message waits (RNR) and is not counted.
        assert!(l.take(&tmh(op::EAGER, 1 << 40), || None).is_some());
        let mut l = TagList::new(8, 1);
        assert!(l.take(&tmh(op::EAGER, 1), || None).is_none());
        assert!(!l.sync_required());
    }

    #[test]
    fn a_rendezvous_request_carries_its_read_and_the_fin_headers() {
        let mut l = TagList::new(8, 1);
        l.add(Some(0), 9, u64::MAX, 4, &[]).unwrap();
        let mut m = tmh(op::RNDV, 9);
        m.extend_from_slice(&0x1000_2000u64.to_be_bytes());
        m.extend_from_slice(&0xabcdu32.to_be_bytes());
        m.extend_from_slice(&4096u32.to_be_bytes());
        m.extend_from_slice(b"meta");
        let (w, t) = l.take(&m, plain).unwrap();
        assert_eq!(w.wr_id, 4);
        let Taken::Rndv {
            tag: 9,
            app_ctx: 7,
            read,
        } = t
        else {
            panic!("{t:?}");
        };
        assert_eq!((read.va, read.rkey, read.len), (0x1000_2000, 0xabcd, 4096));
        assert_eq!(read.headers[0], op::FIN);
        assert_eq!(read.headers[1..], m[1..32]);
    }

    proptest::proptest! {
        /// Any bytes from the wire, after any list operations: classified without a panic,
        /// a tagged buffer taken only by a request whose tag it matches, and the unexpected
        /// count grown exactly when a tag matching request took an ordinary receive.
        #[test]
        fn any_message_is_classified_safely(
            tags in proptest::collection::vec((0u64..4, proptest::prelude::any::<u64>()), 0..6),
            payload in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..48),
            ordinary in proptest::prelude::any::<bool>(),
        ) {
            let mut l = TagList::new(8, 1);
            for (i, &(tag, mask)) in tags.iter().enumerate() {
                l.add(Some(0), tag, mask, i as u64, &[]).unwrap();
            }
            let before = l.unexpected;
            let out = l.take(&payload, || ordinary.then(|| RecvWqe { wr_id: 99, sges: SmallVec::new() }));
            match out {
                None => proptest::prop_assert!(!ordinary),
                Some((w, Taken::Eager { tag, .. } | Taken::Rndv { tag, .. })) => {
                    let (t, m) = tags[w.wr_id as usize];
                    proptest::prop_assert_eq!((t ^ tag) & m, 0);
                    proptest::prop_assert_eq!(l.unexpected, before);
                }
                Some((w, Taken::Unexpected)) => {
                    proptest::prop_assert_eq!(w.wr_id, 99);
                    proptest::prop_assert_eq!(l.unexpected, before + 1);
                }
                Some((w, _)) => {
                    proptest::prop_assert_eq!(w.wr_id, 99);
                    proptest::prop_assert_eq!(l.unexpected, before);
                }
            }
        }
    }

    #[test]
    fn tags_are_removed_by_handle_once() {
        let mut l = TagList::new(2, 1);
        let h = l.add(Some(0), 1, u64::MAX, 1, &[]).unwrap();
        l.add(Some(0), 2, u64::MAX, 2, &[]).unwrap();
        assert_eq!(l.add(Some(0), 3, u64::MAX, 3, &[]), Err(TmError::Full(2)));
        assert_eq!(l.remove(Some(0), h), Ok(()));
        assert_eq!(l.remove(Some(0), h), Err(TmError::NoSuchTag(h)));
        let sge = Sge::default();
        assert!(matches!(
            l.add(Some(0), 3, u64::MAX, 3, &[sge, sge]),
            Err(TmError::TooManySges { got: 2, max: 1 })
        ));
    }
}
