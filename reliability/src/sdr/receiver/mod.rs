//! The receive side of an SDR QP wired into a transport: the message table behind a lock,
//! the zero-based region in the [`MrTable`] whose shares follow the posted receives, and one
//! [`WriteImmSink`] per internal UC QP (generation) that places packets.
//!
//! A packet passes four gates before a byte moves: the table's (slot, generation, offset,
//! length, duplicate), the RETH's (it must name the region, the place the immediate implies
//! and the packet's length, so a forged immediate cannot steer a write), then the region's
//! (the share must be mapped — a completed receive's share points at the discard target —
//! and the buffer behind it must take the bytes). Only then is the packet marked, and a
//! chunk's bit set after its bytes are in memory.

use std::sync::{Arc, Mutex, MutexGuard};

use ferroce_stack::transport::{
    Access, MrKeys, MrTable, PdId, RegisterError, SlotTarget, Slotted, Sunk, WriteImmSink,
};
use ferroce_stack::wire::RethRepr;

use super::recv::{Arrival, PostError, RecvConfig, RecvHandle, RecvTable};

ferroce_stack::counter_set! {
    /// What an SDR receive side did with its packets.
    pub struct SdrRecvStats, atomic SharedSdrRecvStats {
        /// Packets placed.
        packets_placed,
        /// Packets that had arrived before.
        duplicate_packets,
        /// Packets for a slot with no receive, or of another generation (late).
        stale_packets,
        /// Packets whose offset or length leaves their receive.
        out_of_range_packets,
        /// Packets whose RETH disagreed with their immediate, or whose bytes the region
        /// refused.
        refused_packets,
        /// Chunks completed by their packets.
        chunks_completed,
        /// Chunks rebuilt by an erasure decoder.
        chunks_decoded,
        /// Messages every chunk of which arrived.
        messages_completed,
    }
}

/// Registered memory a message comes from or lands in: `va` in the region of `lkey` (in
/// the QP's PD; a receive's needs LOCAL_WRITE).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Buffer {
    /// The buffer's region.
    pub lkey: u32,
    /// Its first byte.
    pub va: u64,
}

/// A chunk that completed, for the layer above (acknowledgements, erasure decoding).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkEvent {
    /// The message (posts counted from 0).
    pub message: u64,
    /// The chunk.
    pub chunk: u32,
}

struct Inner {
    table: RecvTable,
    events: Vec<ChunkEvent>,
}

struct Shared {
    inner: Mutex<Inner>,
    slots: Arc<Slotted>,
    region: MrKeys,
    stats: SharedSdrRecvStats,
}

/// The receive side of one SDR QP. Cloning shares it (the engine's sinks hold clones).
#[derive(Clone)]
pub struct SdrReceiver {
    shared: Arc<Shared>,
}

impl core::fmt::Debug for SdrReceiver {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("SdrReceiver")
            .field("region", &self.shared.region)
            .finish_non_exhaustive()
    }
}

fn bump(c: &core::sync::atomic::AtomicU64) {
    c.fetch_add(1, core::sync::atomic::Ordering::Relaxed);
}

impl SdrReceiver {
    /// A receive side laid out by `config`, its region registered in `mem` under `pd`:
    /// `slots × max_message` bytes, zero-based, every share discarded until a receive is
    /// posted in it.
    pub fn new(config: RecvConfig, mem: &mut MrTable, pd: PdId) -> Result<Self, RegisterError> {
        let table = RecvTable::new(config);
        let c = table.config();
        let (region, slots) = mem.register_slotted(
            pd,
            c.slots,
            c.max_message,
            Access::LOCAL_WRITE.with(Access::REMOTE_WRITE),
        )?;
        Ok(Self {
            shared: Arc::new(Shared {
                inner: Mutex::new(Inner {
                    table,
                    events: Vec::new(),
                }),
                slots,
                region,
                stats: SharedSdrRecvStats::default(),
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves a table whose every step completed or did
        // not start (no step unwinds halfway), so carrying on is safe.
        self.shared.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The keys senders write with (`rkey`) into the zero-based region.
    pub fn region(&self) -> MrKeys {
        self.shared.region
    }

    /// The layout.
    pub fn config(&self) -> RecvConfig {
        self.lock().table.config()
    }

    /// Posts the next receive: `len` bytes into `buf`. The next message sent lands there.
    pub fn post(&self, buf: Buffer, len: u64) -> Result<RecvHandle, PostError> {
        let chunk = self.config().chunk_packets;
        self.post_chunked(buf, len, chunk)
    }

    /// [`post`](Self::post) with the receive's own chunk size (`chunk_packets` packets), as
    /// the paper's `recv_post` takes one.
    pub fn post_chunked(
        &self,
        buf: Buffer,
        len: u64,
        chunk_packets: u32,
    ) -> Result<RecvHandle, PostError> {
        let mut inner = self.lock();
        let h = inner.table.post_chunked(len, chunk_packets)?;
        // The share is mapped before the lock is released, so no packet of this message
        // can be checked by the table and then find its share unmapped.
        let mapped = self.shared.slots.map(
            h.slot,
            SlotTarget::Mapped {
                key: buf.lkey,
                va: buf.va,
                len,
            },
        );
        debug_assert!(mapped, "a posted length fits its share");
        Ok(h)
    }

    /// `recv_imm_get`.
    pub fn imm(&self, h: &RecvHandle) -> Option<u32> {
        self.lock().table.imm(h)
    }

    /// `recv_complete`: the owner is done with the receive; its share goes to the discard
    /// target and its slot takes the next post.
    pub fn complete(&self, h: &RecvHandle) -> bool {
        let mut inner = self.lock();
        let done = inner.table.complete(h);
        if done {
            self.shared.slots.map(h.slot, SlotTarget::Discard);
        }
        done
    }

    /// Marks a chunk rebuilt in place (erasure decoding). Returns whether the message is
    /// complete now.
    pub fn mark_chunk(&self, h: &RecvHandle, chunk: u32) -> bool {
        let mut inner = self.lock();
        let was = h.has(chunk);
        let done = inner.table.mark_chunk(h, chunk);
        if !was && h.has(chunk) {
            bump(&self.shared.stats.chunks_decoded);
            if done {
                bump(&self.shared.stats.messages_completed);
            }
        }
        done
    }

    /// The chunks completed by packets since the last call, in arrival order.
    pub fn take_events(&self, out: &mut Vec<ChunkEvent>) {
        out.append(&mut self.lock().events);
    }

    /// The counters.
    pub fn stats(&self) -> SdrRecvStats {
        self.shared.stats.snapshot()
    }

    /// Bytes that fell into discarded shares (late packets past the table's checks, which
    /// the table lets through only if a sender reuses a slot before its receive completed).
    pub fn discarded_bytes(&self) -> u64 {
        self.shared.slots.discarded_bytes()
    }

    /// The sink for the internal UC QP of `generation`.
    pub fn sink(&self, generation: u8) -> Box<dyn WriteImmSink> {
        Box::new(SdrSink {
            receiver: self.clone(),
            generation,
        })
    }

    /// One packet, as the sink of `generation` receives it.
    pub fn on_packet(
        &self,
        generation: u8,
        reth: RethRepr,
        imm: u32,
        payload: &[u8],
        pd: PdId,
        mem: &MrTable,
    ) -> Sunk {
        let s = &*self.shared;
        let mut inner = self.lock();
        let len = payload.len() as u32;
        let arrival = inner.table.arrive_with(generation, imm, len, |at| {
            reth.rkey == s.region.rkey
                && reth.va == at
                && reth.dma_len == len
                && mem
                    .write(reth.rkey, pd, at, payload, Access::REMOTE_WRITE)
                    .is_ok()
        });
        let counter = match arrival {
            Arrival::Place { chunk, done, .. } => {
                if let Some(chunk) = chunk {
                    let message = inner.table.message_in(imm);
                    if let Some(message) = message {
                        inner.events.push(ChunkEvent { message, chunk });
                    }
                    bump(&s.stats.chunks_completed);
                    if done {
                        bump(&s.stats.messages_completed);
                    }
                }
                bump(&s.stats.packets_placed);
                return Sunk::Placed;
            }
            Arrival::Duplicate => &s.stats.duplicate_packets,
            Arrival::Stale => &s.stats.stale_packets,
            Arrival::OutOfRange => &s.stats.out_of_range_packets,
            Arrival::Refused => &s.stats.refused_packets,
        };
        bump(counter);
        Sunk::Dropped
    }
}

/// The sink of one internal QP.
struct SdrSink {
    receiver: SdrReceiver,
    generation: u8,
}

impl core::fmt::Debug for SdrSink {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "SdrSink(generation {})", self.generation)
    }
}

impl WriteImmSink for SdrSink {
    fn on_write_imm(
        &mut self,
        reth: RethRepr,
        imm: u32,
        payload: &[u8],
        pd: PdId,
        mem: &MrTable,
    ) -> Sunk {
        self.receiver
            .on_packet(self.generation, reth, imm, payload, pd, mem)
    }
}

#[cfg(test)]
mod tests;
