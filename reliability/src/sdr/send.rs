//! The send side's packetizer: each message becomes one UC RDMA WRITE-with-immediate per
//! packet, on the internal QP of its generation, into its slot's share of the receiver's
//! zero-based region (Figure 5), every immediate naming slot and packet offset and carrying
//! a fragment of the user's immediate.
//!
//! Sans-IO, like the receive table: [`SendTable::send`] numbers the message the way the
//! receiver's posts are numbered (order-based matching), and [`SendTable::packets`] (one-shot:
//! the whole message) or [`SendTable::chunk`] (streaming: one chunk, as a resend does) list
//! the WRITEs; the caller posts them.
//!
//! The user's 32-bit immediate travels in `32 / user_bits` fragments: packet `p` carries
//! fragment `p mod (32 / user_bits)`, low bits first, so the receiver has it once the first
//! `32 / user_bits` packets arrived; a shorter message cannot carry one whole.

use super::imm::SdrImm;
pub use super::imm::{imm_fragment, imm_fragments};
use super::recv::RecvConfig;

/// One WRITE-with-immediate to post.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Packet {
    /// The internal QP: the message's generation.
    pub generation: u8,
    /// The immediate.
    pub imm: u32,
    /// Where it lands: bytes into the receiver's region.
    pub remote: u64,
    /// Where it comes from: bytes into the message.
    pub local: u64,
    /// Payload bytes.
    pub len: u32,
}

/// A message being sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendHandle {
    /// Which message (sends counted from 0).
    pub message: u64,
    /// Its slot (message id on the wire).
    pub slot: u32,
    /// Its generation.
    pub generation: u8,
    /// Bytes.
    pub len: u64,
    /// The user's immediate, if any.
    pub user_imm: Option<u32>,
}

/// The send side of one SDR QP; its configuration must equal the receiver's.
pub struct SendTable {
    config: RecvConfig,
    next: u64,
}

impl SendTable {
    /// A sender laid out as its receiver.
    pub fn new(config: RecvConfig) -> Self {
        Self {
            config: RecvConfig {
                slots: config.slots.clamp(1, config.layout.max_messages()),
                generations: config.generations.max(1),
                mtu: config.mtu.max(1),
                chunk_packets: config.chunk_packets.max(1),
                ..config
            },
            next: 0,
        }
    }

    /// The next message, `len` bytes, with an optional immediate; `None` when it is longer
    /// than a slot or the immediate's offsets reach.
    pub fn send(&mut self, len: u64, user_imm: Option<u32>) -> Option<SendHandle> {
        let c = self.config;
        let max = c
            .max_message
            .min(u64::from(c.layout.max_packets()) * u64::from(c.mtu));
        if len > max {
            return None;
        }
        let slots = u64::from(c.slots);
        let h = SendHandle {
            message: self.next,
            slot: (self.next % slots) as u32,
            generation: ((self.next / slots) % u64::from(c.generations)) as u8,
            len,
            user_imm,
        };
        self.next += 1;
        Some(h)
    }

    fn packets_of(&self, h: &SendHandle) -> u32 {
        h.len.div_ceil(u64::from(self.config.mtu)).max(1) as u32
    }

    /// Packet `offset` of `h`.
    pub fn packet(&self, h: &SendHandle, offset: u32) -> Option<Packet> {
        let c = self.config;
        if offset >= self.packets_of(h) {
            return None;
        }
        let local = u64::from(offset) * u64::from(c.mtu);
        let user = h.user_imm.map_or(0, |u| imm_fragment(c.layout, u, offset));
        let imm = c
            .layout
            .pack(SdrImm {
                msg_id: h.slot,
                offset,
                user,
            })
            .ok()?;
        Some(Packet {
            generation: h.generation,
            imm,
            remote: u64::from(h.slot) * c.max_message + local,
            local,
            len: (h.len - local).min(u64::from(c.mtu)) as u32,
        })
    }

    /// Every packet of `h`, in order (one-shot send).
    pub fn packets<'a>(&'a self, h: &'a SendHandle) -> impl Iterator<Item = Packet> + 'a {
        (0..self.packets_of(h)).filter_map(move |p| self.packet(h, p))
    }

    /// The packets of chunk `chunk` of `h` (streaming send: a resend names a chunk).
    pub fn chunk<'a>(&'a self, h: &'a SendHandle, chunk: u32) -> impl Iterator<Item = Packet> + 'a {
        let per = self.config.chunk_packets;
        let first = chunk.saturating_mul(per);
        (first..first.saturating_add(per).min(self.packets_of(h)))
            .filter_map(move |p| self.packet(h, p))
    }
}

#[cfg(test)]
mod tests {
    use super::super::imm::ImmLayout;
    use super::super::recv::{Arrival, RecvTable};
    use super::*;

    fn config() -> RecvConfig {
        RecvConfig {
            layout: ImmLayout::PAPER,
            mtu: 1024,
            chunk_packets: 4,
            max_message: 64 * 1024,
            slots: 4,
            generations: 2,
        }
    }

    /// What a sender emits is what its receiver places: every packet of six messages
    /// (across both generations and every slot) lands where the sender meant, the user's
    /// immediate comes back whole when the message has a packet for every fragment, and a
    /// streaming resend of one chunk is a duplicate.
    #[test]
    fn a_receiver_places_what_its_sender_packetizes() {
        let (mut tx, mut rx) = (SendTable::new(config()), RecvTable::new(config()));
        for n in 0..6u64 {
            let len = 5000 + n * 3000;
            let r = rx.post(len).unwrap();
            let s = tx.send(len, Some(0xdead_beef ^ n as u32)).unwrap();
            assert_eq!((s.slot, s.generation), (r.slot, r.generation));
            let mut sent = 0;
            for p in tx.packets(&s) {
                match rx.arrive(p.generation, p.imm, p.len) {
                    Arrival::Place { at, .. } => assert_eq!(at, p.remote),
                    other => panic!("message {n}: {other:?}"),
                }
                sent += u64::from(p.len);
            }
            assert_eq!(sent, len);
            assert!(r.is_complete());
            // Five packets cannot carry eight fragments; eight and more can.
            let whole = len.div_ceil(1024) >= 8;
            assert_eq!(
                rx.imm(&r),
                whole.then_some(0xdead_beef ^ n as u32),
                "message {n}"
            );
            let again: Vec<Packet> = tx.chunk(&s, 1).collect();
            assert_eq!(again.len() as u64, (len.div_ceil(1024) - 4).min(4));
            for p in again {
                assert_eq!(rx.arrive(p.generation, p.imm, p.len), Arrival::Duplicate);
            }
            assert!(rx.complete(&r));
        }
    }

    #[test]
    fn the_immediate_is_cut_low_bits_first_and_repeats() {
        let l = ImmLayout::PAPER;
        assert_eq!(imm_fragments(l), 8);
        let frags: Vec<u32> = (0..10).map(|p| imm_fragment(l, 0x8765_4321, p)).collect();
        assert_eq!(frags, [1, 2, 3, 4, 5, 6, 7, 8, 1, 2]);
        assert_eq!(imm_fragments(ImmLayout::new(16, 16, 0).unwrap()), 0);
        assert_eq!(imm_fragments(ImmLayout::new(8, 21, 3).unwrap()), 11);
    }
}
