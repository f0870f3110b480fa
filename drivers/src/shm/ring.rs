//! A single-producer single-consumer ring in a shared [`Region`], for a side that does not
//! trust the other.
//!
//! Layout at its offset (64-byte aligned): the consumer's index `head` alone in one cache
//! line, the producer's index `tail` alone in the next, then `cap` slots of `W` 64-bit words.
//! Both indices count entries since the start and wrap at 2^32; slot `i % cap` holds entry
//! `i`. `cap` is a power of two fixed when the ring is made and never read from the shared
//! memory, so the other side cannot change it.
//!
//! Ordering. The producer stores an entry's words (relaxed) and then `tail` with release;
//! the consumer loads `tail` with acquire, so every word of each entry below `tail` is
//! visible to it, then loads the words (relaxed) and stores `head` with release; the
//! producer loads `head` with acquire before it reuses a slot, so the consumer's loads of
//! that slot happened before the producer's new stores. Lock-free atomics order memory the
//! same way between processes mapping the same page as between threads.
//!
//! Distrust. Each side keeps its own index in private memory and only publishes it: the
//! other side writing it changes nothing here. The index read from the other side is
//! checked (`tail - head` at most `cap`) before it is used, and a slot is read word by word
//! with atomic loads, so an entry scribbled while it is read is garbage, never undefined
//! behaviour. Entries are plain words: what they mean is checked by whoever decodes them.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use thiserror::Error;

use super::region::Region;

/// The bytes of the two index lines.
const HEADER: usize = 128;
/// The largest capacity a ring may have.
pub const MAX_CAP: u32 = 1 << 16;

/// Why a ring cannot be used.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum RingError {
    /// The layout does not fit the region, is misaligned, or the capacity is not a power
    /// of two up to [`MAX_CAP`].
    #[error("a ring of {cap} entries of {words} words at offset {offset} does not fit a region of {region} bytes")]
    Layout {
        /// The offset asked for.
        offset: usize,
        /// The capacity asked for.
        cap: u32,
        /// Words per entry.
        words: usize,
        /// The region's size.
        region: usize,
    },
    /// The other side's index says more entries are in the ring than it holds: it wrote
    /// something no correct peer writes.
    #[error("the ring's other side published index {theirs} against {ours} here (capacity {cap})")]
    Corrupt {
        /// The index read from the other side.
        theirs: u32,
        /// This side's index.
        ours: u32,
        /// The capacity.
        cap: u32,
    },
}

/// Where a ring lives in a region, and its shape; both sides must agree on it (the control
/// protocol carries it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingLayout {
    /// Byte offset in the region (a multiple of 64).
    pub offset: usize,
    /// Entries (a power of two, at most [`MAX_CAP`]).
    pub cap: u32,
}

impl RingLayout {
    /// The bytes a ring of `cap` entries of `W` words takes.
    pub const fn bytes<const W: usize>(cap: u32) -> usize {
        HEADER + cap as usize * W * 8
    }
}

/// A ring's view of its region: checked to fit once, then read and written by atomics.
#[derive(Debug)]
struct Shared<const W: usize> {
    region: Arc<Region>,
    offset: usize,
    cap: u32,
}

impl<const W: usize> Shared<W> {
    fn new(region: Arc<Region>, layout: RingLayout) -> Result<Self, RingError> {
        let bad = || RingError::Layout {
            offset: layout.offset,
            cap: layout.cap,
            words: W,
            region: region.len(),
        };
        if W == 0
            || !layout.cap.is_power_of_two()
            || layout.cap > MAX_CAP
            || !layout.offset.is_multiple_of(64)
        {
            return Err(bad());
        }
        let end = layout
            .offset
            .checked_add(RingLayout::bytes::<W>(layout.cap))
            .ok_or_else(bad)?;
        if end > region.len() {
            return Err(bad());
        }
        Ok(Self {
            offset: layout.offset,
            cap: layout.cap,
            region,
        })
    }

    fn word32(&self, byte: usize) -> &AtomicU32 {
        debug_assert!(byte + 4 <= HEADER);
        // SAFETY: `new` checked that the ring's bytes lie in the region, which stays mapped
        // while `self.region` lives; the offset is 64-aligned and the region page-aligned,
        // so the word is aligned; the memory is only ever accessed atomically.
        unsafe {
            &*self
                .region
                .base()
                .as_ptr()
                .add(self.offset + byte)
                .cast::<AtomicU32>()
        }
    }

    fn head(&self) -> &AtomicU32 {
        self.word32(0)
    }

    fn tail(&self) -> &AtomicU32 {
        self.word32(64)
    }

    fn slot(&self, index: u32) -> &[AtomicU64; W] {
        let i = (index & (self.cap - 1)) as usize;
        // SAFETY: as in `word32`: slot `i < cap` lies in the checked bytes, 8-aligned (the
        // slots start 128 bytes in), accessed only atomically.
        unsafe {
            &*self
                .region
                .base()
                .as_ptr()
                .add(self.offset + HEADER + i * W * 8)
                .cast::<[AtomicU64; W]>()
        }
    }

    /// The other side's index, checked against ours: at most `cap` entries apart, in the
    /// direction `ahead` says (the producer's tail is ahead of our head; our tail is ahead
    /// of the consumer's head).
    fn check(&self, theirs: u32, ours: u32, theirs_ahead: bool) -> Result<u32, RingError> {
        let used = if theirs_ahead {
            theirs.wrapping_sub(ours)
        } else {
            ours.wrapping_sub(theirs)
        };
        if used > self.cap {
            return Err(RingError::Corrupt {
                theirs,
                ours,
                cap: self.cap,
            });
        }
        Ok(used)
    }
}

/// The writing end of a ring.
#[derive(Debug)]
pub struct Producer<const W: usize> {
    ring: Shared<W>,
    /// Entries pushed so far (the published `tail`).
    pub(super) tail: u32,
}

impl<const W: usize> Producer<W> {
    /// The producer of the ring `layout` places in `region`, starting empty: the consumer
    /// must start at the same time (both indices start at 0; the creator of a region
    /// zeroes it).
    pub fn new(region: Arc<Region>, layout: RingLayout) -> Result<Self, RingError> {
        Ok(Self {
            ring: Shared::new(region, layout)?,
            tail: 0,
        })
    }

    /// Appends `entry`: `Ok(false)` when the ring is full.
    pub fn push(&mut self, entry: &[u64; W]) -> Result<bool, RingError> {
        let head = self.ring.head().load(Ordering::Acquire);
        if self.ring.check(head, self.tail, false)? == self.ring.cap {
            return Ok(false);
        }
        let slot = self.ring.slot(self.tail);
        for (w, &v) in slot.iter().zip(entry) {
            w.store(v, Ordering::Relaxed);
        }
        self.tail = self.tail.wrapping_add(1);
        self.ring.tail().store(self.tail, Ordering::Release);
        Ok(true)
    }

    /// Appends `entries` together: the consumer sees all of them or none (one store of
    /// `tail`). `Ok(false)`, writing nothing, when they do not all fit.
    pub fn push_all(&mut self, entries: &[[u64; W]]) -> Result<bool, RingError> {
        let head = self.ring.head().load(Ordering::Acquire);
        let used = self.ring.check(head, self.tail, false)?;
        if entries.len() > (self.ring.cap - used) as usize {
            return Ok(false);
        }
        let mut at = self.tail;
        for entry in entries {
            for (w, &v) in self.ring.slot(at).iter().zip(entry) {
                w.store(v, Ordering::Relaxed);
            }
            at = at.wrapping_add(1);
        }
        self.tail = at;
        self.ring.tail().store(self.tail, Ordering::Release);
        Ok(true)
    }

    /// Free slots, as far as the consumer has published.
    pub fn free(&self) -> Result<u32, RingError> {
        let head = self.ring.head().load(Ordering::Acquire);
        Ok(self.ring.cap - self.ring.check(head, self.tail, false)?)
    }
}

/// The reading end of a ring.
#[derive(Debug)]
pub struct Consumer<const W: usize> {
    ring: Shared<W>,
    /// Entries taken so far (the published `head`).
    pub(super) head: u32,
}

impl<const W: usize> Consumer<W> {
    /// The consumer of the ring `layout` places in `region` (see [`Producer::new`]).
    pub fn new(region: Arc<Region>, layout: RingLayout) -> Result<Self, RingError> {
        Ok(Self {
            ring: Shared::new(region, layout)?,
            head: 0,
        })
    }

    /// Takes the oldest entry, if any. The words are what the producer wrote, unchecked.
    pub fn pop(&mut self) -> Result<Option<[u64; W]>, RingError> {
        let tail = self.ring.tail().load(Ordering::Acquire);
        if self.ring.check(tail, self.head, true)? == 0 {
            return Ok(None);
        }
        let slot = self.ring.slot(self.head);
        let mut entry = [0u64; W];
        for (e, w) in entry.iter_mut().zip(slot) {
            *e = w.load(Ordering::Relaxed);
        }
        self.head = self.head.wrapping_add(1);
        self.ring.head().store(self.head, Ordering::Release);
        Ok(Some(entry))
    }

    /// Entries waiting, as far as the producer has published.
    pub fn len(&self) -> Result<u32, RingError> {
        let tail = self.ring.tail().load(Ordering::Acquire);
        self.ring.check(tail, self.head, true)
    }

    /// Whether no entry waits.
    pub fn is_empty(&self) -> Result<bool, RingError> {
        Ok(self.len()? == 0)
    }
}
