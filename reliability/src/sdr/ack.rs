//! The control channel's acknowledgement: which chunks of a message the receiver holds.
//!
//! The paper acknowledges on a control channel with a cumulative point and a selective
//! bitmap but gives no byte layout, so this one is ferroce's (little-endian, 24-byte header):
//!
//! ```text
//!  0  u16 magic 0x5344 ("SD")     2  u8 version (1)     3  u8 flags (bit 0: complete)
//!  4  u64 message: the data message it speaks of (SDR sends counted from 0)
//! 12  u32 chunks: the message's data chunks
//! 16  u32 cumulative: every chunk below it arrived
//! 20  u16 words of bitmap that follow   22 u16 reserved (0)
//! 24  u64 done_below: every message below it is complete
//! 32  u32 rebuilt: data chunks the erasure code rebuilt (the sender's loss estimate)
//! 36  u32 reserved (0)
//! 40  words × u64: bit b of word w is chunk cumulative + 64·w + b
//! ```
//!
//! A bitmap that would not fit the channel's MTU is cut short; chunks past it read as not
//! arrived, which costs at most a spurious resend.

/// Bytes before the bitmap.
pub const HEADER_LEN: usize = 40;
const MAGIC: u16 = 0x5344;
const VERSION: u8 = 1;
const COMPLETE: u8 = 1;

/// One acknowledgement.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ack {
    /// The message.
    pub message: u64,
    /// Its data chunks.
    pub chunks: u32,
    /// Every chunk below it arrived.
    pub cumulative: u32,
    /// From `cumulative` on, one bit a chunk.
    pub bitmap: Vec<u64>,
    /// Every data chunk arrived (or was rebuilt).
    pub complete: bool,
    /// Every message below it is complete at the receiver.
    pub done_below: u64,
    /// Data chunks of the message the erasure code rebuilt so far.
    pub rebuilt: u32,
}

/// Why bytes are not an acknowledgement.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AckError {
    /// Shorter than its header or its bitmap.
    #[error("truncated acknowledgement")]
    Truncated,
    /// Wrong magic or version.
    #[error("not an SDR acknowledgement")]
    Foreign,
    /// A cumulative point past the message's chunks.
    #[error("cumulative point {cumulative} past {chunks} chunks")]
    Inconsistent {
        /// Claimed.
        cumulative: u32,
        /// The message's chunks.
        chunks: u32,
    },
}

impl Ack {
    /// Whether chunk `i` arrived, by this acknowledgement.
    pub fn has(&self, i: u32) -> bool {
        if self.complete || i < self.cumulative {
            return true;
        }
        let d = i - self.cumulative;
        self.bitmap
            .get((d / 64) as usize)
            .is_some_and(|w| w >> (d % 64) & 1 == 1)
    }

    /// Its encoding, the bitmap cut to fit `max_len` bytes.
    pub fn encode(&self, max_len: usize) -> Vec<u8> {
        let words = self
            .bitmap
            .len()
            .min(max_len.saturating_sub(HEADER_LEN) / 8)
            .min(usize::from(u16::MAX));
        let mut b = Vec::with_capacity(HEADER_LEN + words * 8);
        b.extend_from_slice(&MAGIC.to_le_bytes());
        b.push(VERSION);
        b.push(if self.complete { COMPLETE } else { 0 });
        b.extend_from_slice(&self.message.to_le_bytes());
        b.extend_from_slice(&self.chunks.to_le_bytes());
        b.extend_from_slice(&self.cumulative.to_le_bytes());
        b.extend_from_slice(&(words as u16).to_le_bytes());
        b.extend_from_slice(&[0, 0]);
        b.extend_from_slice(&self.done_below.to_le_bytes());
        b.extend_from_slice(&self.rebuilt.to_le_bytes());
        b.extend_from_slice(&[0; 4]);
        for w in &self.bitmap[..words] {
            b.extend_from_slice(&w.to_le_bytes());
        }
        b
    }

    /// Parses bytes from the control channel; anything but a well-formed acknowledgement is
    /// an error, never a panic.
    pub fn parse(b: &[u8]) -> Result<Self, AckError> {
        let h = b.get(..HEADER_LEN).ok_or(AckError::Truncated)?;
        let u16_at = |i: usize| u16::from_le_bytes([h[i], h[i + 1]]);
        let u32_at = |i: usize| u32::from_le_bytes(h[i..i + 4].try_into().unwrap_or_default());
        let u64_at = |i: usize| u64::from_le_bytes(h[i..i + 8].try_into().unwrap_or_default());
        if u16_at(0) != MAGIC || h[2] != VERSION {
            return Err(AckError::Foreign);
        }
        let (chunks, cumulative) = (u32_at(12), u32_at(16));
        if cumulative > chunks {
            return Err(AckError::Inconsistent { cumulative, chunks });
        }
        let words = usize::from(u16_at(20));
        let body = b
            .get(HEADER_LEN..HEADER_LEN + words * 8)
            .ok_or(AckError::Truncated)?;
        Ok(Self {
            message: u64_at(4),
            chunks,
            cumulative,
            bitmap: body
                .chunks_exact(8)
                .map(|w| u64::from_le_bytes(w.try_into().unwrap_or_default()))
                .collect(),
            complete: h[3] & COMPLETE != 0,
            done_below: u64_at(24),
            rebuilt: u32_at(32),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn layout_and_a_cut_bitmap() {
        let a = Ack {
            message: 5,
            chunks: 200,
            cumulative: 3,
            bitmap: vec![0b101, u64::MAX, 1],
            complete: false,
            done_below: 4,
            rebuilt: 2,
        };
        let b = a.encode(HEADER_LEN + 16);
        assert_eq!(b.len(), HEADER_LEN + 16);
        assert_eq!(&b[..4], &[0x44, 0x53, 1, 0]);
        assert_eq!(u16::from_le_bytes([b[20], b[21]]), 2);
        let back = Ack::parse(&b).unwrap();
        assert_eq!(back.rebuilt, 2);
        assert_eq!(back.bitmap, [0b101, u64::MAX]);
        assert!(back.has(0) && back.has(2) && !back.has(4) && back.has(5));
        assert!(back.has(67) && !back.has(131), "chunk 131 was cut off");
        assert_eq!(Ack::parse(&b[..HEADER_LEN + 15]), Err(AckError::Truncated));
        let mut wrong = b.clone();
        wrong[0] ^= 1;
        assert_eq!(Ack::parse(&wrong), Err(AckError::Foreign));
    }

    proptest! {
        #[test]
        fn round_trips(message: u64, chunks in 0u32..100_000, cum in 0u32..100_000,
                       bitmap in proptest::collection::vec(any::<u64>(), 0..64),
                       complete: bool, done_below: u64, rebuilt: u32) {
            let a = Ack { message, chunks: chunks.max(cum), cumulative: cum, bitmap, complete, done_below, rebuilt };
            prop_assert_eq!(Ack::parse(&a.encode(4096)).unwrap(), a);
        }

        #[test]
        fn any_bytes_parse_or_fail_cleanly(b in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = Ack::parse(&b);
        }
    }
}
