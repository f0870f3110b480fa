//! R2CCL's DMA-buffer rollback (seed 003, mechanism 2), sans-IO: a transfer in fixed-size
//! chunks, each a WRITE with immediate into the receiver's buffer (registered on every NIC
//! at setup, so a move needs no registration). When the connection fails, the sender
//! rewinds to the first chunk it has no completion for, the receiver to the chunk after
//! the last it confirmed (saw arrive whole), and the transfer goes on over the backup NIC
//! from there. Chunks the receiver already holds but the sender saw no completion for are
//! sent again and land on the same bytes: the rewind costs at most the chunks in flight and
//! a partly written chunk is simply written again.

/// The sender's side of one transfer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sender {
    chunks: u32,
    /// The next chunk to post.
    next: u32,
    /// Chunks `0..completed` have a completion.
    completed: u32,
    /// Chunks posted again after rewinds.
    pub resent: u32,
}

impl Sender {
    /// A transfer of `chunks` chunks, none sent.
    pub fn new(chunks: u32) -> Self {
        Self {
            chunks,
            next: 0,
            completed: 0,
            resent: 0,
        }
    }

    /// The chunk [`next_chunk`](Self::next_chunk) would give, without taking it (a
    /// sender whose chunks wait on other data looks before it posts).
    pub fn peek(&self) -> Option<u32> {
        (self.next < self.chunks).then_some(self.next)
    }

    /// Chunks posted and not completed.
    pub fn in_flight(&self) -> u32 {
        self.next - self.completed
    }

    /// The next chunk to post, if any is left (the caller posts it and calls again).
    pub fn next_chunk(&mut self) -> Option<u32> {
        if self.next >= self.chunks {
            return None;
        }
        let c = self.next;
        self.next += 1;
        Some(c)
    }

    /// Chunk `c` completed; completions of one QP come in order, so every chunk before it
    /// did too. A completion for a chunk not posted since the last rewind is ignored.
    pub fn on_completion(&mut self, c: u32) {
        if c < self.next {
            self.completed = self.completed.max(c + 1);
        }
    }

    /// The connection failed: rewind to the first chunk without a completion. Returns it.
    pub fn rollback(&mut self) -> u32 {
        self.resent += self.next - self.completed;
        self.next = self.completed;
        self.completed
    }

    /// Every chunk completed.
    pub fn done(&self) -> bool {
        self.completed == self.chunks
    }
}

/// The receiver's side of one transfer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Receiver {
    chunks: u32,
    /// Chunks `0..confirmed` arrived whole, in order.
    confirmed: u32,
    /// Chunks that arrived again (already confirmed): written over the same bytes.
    pub repeats: u32,
}

impl Receiver {
    /// A transfer of `chunks` chunks, none arrived.
    pub fn new(chunks: u32) -> Self {
        Self {
            chunks,
            confirmed: 0,
            repeats: 0,
        }
    }

    /// Chunk `c` arrived whole (its WRITE with immediate completed here). True when it is
    /// new.
    pub fn on_chunk(&mut self, c: u32) -> bool {
        if c < self.confirmed {
            self.repeats += 1;
            return false;
        }
        if c == self.confirmed && c < self.chunks {
            self.confirmed += 1;
            return true;
        }
        // A chunk beyond the next expected: RC delivers in order, so only a rewind on the
        // sender's side could skip one — it cannot. Ignore it.
        false
    }

    /// The connection failed: the chunk the receiver expects next.
    pub fn rollback(&self) -> u32 {
        self.confirmed
    }

    /// Every chunk arrived.
    pub fn done(&self) -> bool {
        self.confirmed == self.chunks
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A transfer through failures at random moments — at chunk boundaries and in the
    /// middle of a chunk (its first bytes written, its completion not): the receiver's buffer
    /// ends equal to the source, every chunk confirmed once, and what the sender resent is
    /// bounded by the chunks in flight at each failure.
    #[test]
    fn rollback_at_any_moment_ends_with_the_whole_buffer() {
        const CHUNK: usize = 16;
        for seed in 0..500u64 {
            let mut rng = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
            let mut next = move || {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                rng
            };
            let chunks = 1 + (next() % 40) as u32;
            let src: Vec<u8> = (0..chunks as usize * CHUNK)
                .map(|i| (i as u64 ^ seed) as u8)
                .collect();
            let mut dst = vec![0u8; src.len()];
            let (mut tx, mut rx) = (Sender::new(chunks), Receiver::new(chunks));
            // In flight: chunks posted, not yet arrived; arrived, completion not yet back.
            let mut wire: Vec<u32> = Vec::new();
            let mut acks: Vec<u32> = Vec::new();
            let mut failures = 0;
            let mut steps = 0;
            while !(tx.done() && rx.done()) {
                steps += 1;
                assert!(steps < 100_000, "seed {seed}: no progress");
                match next() % 8 {
                    0 | 1 => {
                        if let Some(c) = tx.next_chunk() {
                            wire.push(c);
                        }
                    }
                    2 | 3 if !wire.is_empty() => {
                        let c = wire.remove(0);
                        let at = c as usize * CHUNK;
                        dst[at..at + CHUNK].copy_from_slice(&src[at..at + CHUNK]);
                        rx.on_chunk(c);
                        acks.push(c);
                    }
                    4 | 5 if !acks.is_empty() => tx.on_completion(acks.remove(0)),
                    6 if failures < 3 && next() % 16 == 0 => {
                        // The connection fails: a chunk on the wire may have been half
                        // written, everything in flight is lost; both ends roll back.
                        if let Some(&c) = wire.first() {
                            let at = c as usize * CHUNK;
                            dst[at] = !src[at];
                        }
                        let in_flight = wire.len() + acks.len();
                        wire.clear();
                        acks.clear();
                        let before = tx.resent;
                        let from = tx.rollback();
                        assert!(from <= rx.rollback(), "seed {seed}: the sender never skips");
                        assert!((tx.resent - before) as usize <= in_flight, "seed {seed}");
                        failures += 1;
                    }
                    _ => {}
                }
            }
            assert_eq!(dst, src, "seed {seed}");
        }
    }

    #[test]
    fn a_repeat_is_counted_not_confirmed_again() {
        let mut rx = Receiver::new(3);
        assert!(rx.on_chunk(0));
        assert!(!rx.on_chunk(0));
        assert_eq!(rx.repeats, 1);
        assert!(!rx.on_chunk(2), "not the next");
        assert!(rx.on_chunk(1));
        assert_eq!(rx.rollback(), 2);
        let mut tx = Sender::new(3);
        assert_eq!(tx.peek(), Some(0));
        assert_eq!(tx.next_chunk(), Some(0));
        assert_eq!(tx.next_chunk(), Some(1));
        tx.on_completion(0);
        tx.on_completion(7);
        assert_eq!(tx.in_flight(), 1);
        assert_eq!(tx.rollback(), 1);
        assert_eq!(tx.resent, 1);
        assert_eq!(tx.in_flight(), 0);
        assert_eq!(tx.next_chunk(), Some(1));
    }
}
