//! The receive side's message table (§3.2.3–3.3): posted receives matched to messages by
//! order, one slot per message id, per-packet and per-chunk bitmaps, and generations that
//! keep a late packet of an old message out of the new one in its slot.
//!
//! Sans-IO: [`RecvTable::arrive`] takes what a packet's UC WRITE-with-immediate carries (the
//! generation of the internal QP it came on, its immediate, its length) and answers where its
//! payload goes in the receiver's zero-based region — message `n` owns
//! `[slot(n)·M, slot(n)·M + M)` for a maximum message size `M` — or why it goes nowhere. The
//! caller places the bytes; ferroce checks before it writes, so a late packet needs no
//! discard region to land in, as it does on a NIC that writes first (the paper's null MR).
//!
//! Message `n` (counting posts from 0) takes slot `n mod S` (`S`, the slots, at most the
//! immediate's message ids) and generation `(n / S) mod G`; its sender sends it on internal
//! QP `generation`. A packet for a slot whose posted message has another generation is late
//! (or early) and dropped: safe while no packet is `G·S` messages late.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::imm::ImmLayout;

/// How a receive side is laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecvConfig {
    /// The immediate's fields.
    pub layout: ImmLayout,
    /// Bytes per packet (the path MTU).
    pub mtu: u32,
    /// Packets per bitmap chunk.
    pub chunk_packets: u32,
    /// The largest message, bytes: each slot's share of the region.
    pub max_message: u64,
    /// Message slots (at most the layout's message ids).
    pub slots: u32,
    /// Generations (internal QPs).
    pub generations: u8,
}

/// Why a post was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PostError {
    /// Longer than the slot, or than the immediate's packet offsets reach.
    #[error("a {len}-byte message does not fit (at most {max} bytes)")]
    TooLong {
        /// Asked for.
        len: u64,
        /// The most there is room for.
        max: u64,
    },
    /// Every slot holds a receive not completed yet.
    #[error("all {0} message slots are in use")]
    Full(u32),
}

/// What became of one arriving packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arrival {
    /// Write the payload at `at` (bytes into the region). `chunk` completed with this
    /// packet if it is `Some`; `message` completed if `done`.
    Place {
        /// Where in the region.
        at: u64,
        /// The chunk this packet completed, if it did.
        chunk: Option<u32>,
        /// Every chunk of the message has arrived.
        done: bool,
    },
    /// The packet arrived before: nothing to write.
    Duplicate,
    /// No receive is posted in its slot, or the one there has another generation (a late
    /// packet of an earlier message, or one far ahead).
    Stale,
    /// Its offset or length leaves the posted receive.
    OutOfRange,
    /// Everything checked, but the placement refused it (see [`RecvTable::arrive_with`]):
    /// nothing was written or marked.
    Refused,
}

/// A posted receive, as its owner sees it: the chunk bitmap it polls.
#[derive(Clone, Debug)]
pub struct RecvHandle {
    /// Which message (posts counted from 0).
    pub message: u64,
    /// Its slot (the message id on the wire).
    pub slot: u32,
    /// Its generation.
    pub generation: u8,
    /// Its length, bytes.
    pub len: u64,
    chunks: u32,
    chunk_packets: u32,
    bitmap: Arc<[AtomicU64]>,
}

impl RecvHandle {
    /// Chunks in the message.
    pub fn chunks(&self) -> u32 {
        self.chunks
    }

    /// Packets per chunk of this receive.
    pub fn chunk_packets(&self) -> u32 {
        self.chunk_packets
    }

    /// Whether chunk `i` arrived whole.
    pub fn has(&self, i: u32) -> bool {
        i < self.chunks
            && self.bitmap[(i / 64) as usize].load(Ordering::Acquire) >> (i % 64) & 1 == 1
    }

    /// The chunk bitmap, 64 chunks a word (bit `i % 64` of word `i / 64`).
    pub fn bitmap(&self) -> Vec<u64> {
        self.bitmap
            .iter()
            .map(|w| w.load(Ordering::Acquire))
            .collect()
    }

    /// True when every chunk arrived.
    pub fn is_complete(&self) -> bool {
        (0..self.chunks).all(|i| self.has(i))
    }
}

/// One slot's posted receive.
struct Posted {
    handle: RecvHandle,
    packets: u32,
    /// One bit a packet.
    arrived: Vec<u64>,
    /// Packets still missing per chunk.
    missing: Vec<u32>,
    chunks_left: u32,
    /// The user's immediate as its fragments arrive, and which have.
    user_imm: u32,
    fragments: u64,
}

/// The receive side of one SDR QP.
pub struct RecvTable {
    config: RecvConfig,
    slots: Vec<Option<Posted>>,
    next: u64,
}

impl RecvTable {
    /// An empty table.
    pub fn new(config: RecvConfig) -> Self {
        let slots = config.slots.clamp(1, config.layout.max_messages()) as usize;
        Self {
            config: RecvConfig {
                slots: slots as u32,
                generations: config.generations.max(1),
                mtu: config.mtu.max(1),
                chunk_packets: config.chunk_packets.max(1),
                ..config
            },
            slots: (0..slots).map(|_| None).collect(),
            next: 0,
        }
    }

    /// Posts the next receive, `len` bytes: the next message sent lands in it.
    pub fn post(&mut self, len: u64) -> Result<RecvHandle, PostError> {
        self.post_chunked(len, self.config.chunk_packets)
    }

    /// [`post`](Self::post) with this receive's own chunk size, `chunk_packets` packets (the
    /// paper's `recv_post` takes one per receive): the bitmap is the receiver's alone, so a
    /// sender need not know it — unless a reliability layer acknowledges chunks, which then
    /// keeps the connection's.
    pub fn post_chunked(&mut self, len: u64, chunk_packets: u32) -> Result<RecvHandle, PostError> {
        let c = RecvConfig {
            chunk_packets: chunk_packets.max(1),
            ..self.config
        };
        let max = c
            .max_message
            .min(u64::from(c.layout.max_packets()) * u64::from(c.mtu));
        if len > max {
            return Err(PostError::TooLong { len, max });
        }
        let slot = (self.next % u64::from(c.slots)) as u32;
        if self.slots[slot as usize].is_some() {
            return Err(PostError::Full(c.slots));
        }
        let packets = len.div_ceil(u64::from(c.mtu)).max(1) as u32;
        let chunks = packets.div_ceil(c.chunk_packets);
        let handle = RecvHandle {
            message: self.next,
            slot,
            generation: ((self.next / u64::from(c.slots)) % u64::from(c.generations)) as u8,
            len,
            chunks,
            chunk_packets: c.chunk_packets,
            bitmap: (0..chunks.div_ceil(64))
                .map(|_| AtomicU64::new(0))
                .collect(),
        };
        let missing = (0..chunks)
            .map(|i| c.chunk_packets.min(packets - i * c.chunk_packets))
            .collect();
        self.slots[slot as usize] = Some(Posted {
            handle: handle.clone(),
            packets,
            arrived: vec![0; packets.div_ceil(64) as usize],
            missing,
            chunks_left: chunks,
            user_imm: 0,
            fragments: 0,
        });
        self.next += 1;
        Ok(handle)
    }

    /// A packet arrived on the internal QP of `generation` with immediate `imm` and `len`
    /// payload bytes (its bytes placed by the caller where `Place` says).
    pub fn arrive(&mut self, generation: u8, imm: u32, len: u32) -> Arrival {
        self.arrive_with(generation, imm, len, |_| true)
    }

    /// [`arrive`](Self::arrive), with `place` writing the payload at the region offset it
    /// is given once every check passed and before anything is marked, so a chunk's bit is
    /// set only after its bytes are in memory (its owner may read them the moment it sees
    /// the bit). When `place` returns false the packet is [`Arrival::Refused`] and counts
    /// as never arrived.
    pub fn arrive_with(
        &mut self,
        generation: u8,
        imm: u32,
        len: u32,
        place: impl FnOnce(u64) -> bool,
    ) -> Arrival {
        let c = self.config;
        let f = c.layout.unpack(imm);
        let Some(Some(p)) = self.slots.get_mut(f.msg_id as usize) else {
            return Arrival::Stale;
        };
        if p.handle.generation != generation {
            return Arrival::Stale;
        }
        if f.offset >= p.packets {
            return Arrival::OutOfRange;
        }
        // Every packet but the last is a full MTU; the last holds the rest.
        let start = u64::from(f.offset) * u64::from(c.mtu);
        let want = (p.handle.len - start).min(u64::from(c.mtu));
        if u64::from(len) != want {
            return Arrival::OutOfRange;
        }
        let (w, b) = ((f.offset / 64) as usize, f.offset % 64);
        if p.arrived[w] >> b & 1 == 1 {
            return Arrival::Duplicate;
        }
        let at = u64::from(f.msg_id) * c.max_message + start;
        if !place(at) {
            return Arrival::Refused;
        }
        p.arrived[w] |= 1 << b;
        let n = super::imm::imm_fragments(c.layout);
        if n > 0 {
            // Packet p carries fragment p mod n: the first of each residue to arrive fills it.
            let i = f.offset % n;
            if p.fragments >> i & 1 == 0 {
                p.user_imm |= f.user << (i * u32::from(c.layout.user_bits()));
                p.fragments |= 1 << i;
            }
        }
        let chunk = f.offset / p.handle.chunk_packets;
        p.missing[chunk as usize] -= 1;
        let completed = p.missing[chunk as usize] == 0;
        if completed {
            p.handle.bitmap[(chunk / 64) as usize].fetch_or(1 << (chunk % 64), Ordering::AcqRel);
            p.chunks_left -= 1;
        }
        Arrival::Place {
            at,
            chunk: completed.then_some(chunk),
            done: p.chunks_left == 0,
        }
    }

    /// Marks chunk `chunk` of `handle`'s message as arrived whole without its packets (an
    /// erasure decoder rebuilt it in place): its packets still to come are duplicates.
    /// Returns whether the message is now complete; false as well for a receive no longer
    /// posted or a chunk past it.
    pub fn mark_chunk(&mut self, handle: &RecvHandle, chunk: u32) -> bool {
        let Some(p) = self.slots[handle.slot as usize]
            .as_mut()
            .filter(|p| p.handle.message == handle.message)
        else {
            return false;
        };
        if chunk >= p.handle.chunks || p.missing[chunk as usize] == 0 {
            return p.chunks_left == 0;
        }
        let first = chunk * p.handle.chunk_packets;
        let last = (first + p.handle.chunk_packets).min(p.packets);
        for i in first..last {
            p.arrived[(i / 64) as usize] |= 1 << (i % 64);
        }
        p.missing[chunk as usize] = 0;
        p.handle.bitmap[(chunk / 64) as usize].fetch_or(1 << (chunk % 64), Ordering::AcqRel);
        p.chunks_left -= 1;
        p.chunks_left == 0
    }

    /// The message posted in the slot `imm` names, if any.
    pub fn message_in(&self, imm: u32) -> Option<u64> {
        let f = self.config.layout.unpack(imm);
        self.slots
            .get(f.msg_id as usize)?
            .as_ref()
            .map(|p| p.handle.message)
    }

    /// The layout this table runs.
    pub fn config(&self) -> RecvConfig {
        self.config
    }

    /// `recv_imm_get`: the user's immediate, once a packet of every fragment arrived (packet
    /// `p` carries fragment `p mod (32 / user_bits)`); `None` before, and for a message
    /// shorter than that. Chunks an erasure code rebuilt bring no fragments.
    pub fn imm(&self, handle: &RecvHandle) -> Option<u32> {
        let p = self.slots[handle.slot as usize].as_ref()?;
        if p.handle.message != handle.message {
            return None;
        }
        let n = super::imm::imm_fragments(self.config.layout);
        (n > 0 && p.packets >= n && p.fragments == (1u64 << n) - 1).then_some(p.user_imm)
    }

    /// `recv_complete`: the owner is done with the receive (whole or not); its slot takes
    /// the next post, and its late packets are stale from now on.
    pub fn complete(&mut self, handle: &RecvHandle) -> bool {
        let slot = &mut self.slots[handle.slot as usize];
        if slot
            .as_ref()
            .is_some_and(|p| p.handle.message == handle.message)
        {
            *slot = None;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests;
