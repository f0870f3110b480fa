//! What a QP hands a port ([`Qp::poll_transmit_any`](super::Qp::poll_transmit_any)): a
//! whole frame, or headers plus payload left where it lies in registered memory, and the
//! port it leaves on.
//!
//! A NIC that can send a frame from several buffers (a DPDK PMD with multi-segment transmit)
//! sends a large payload straight from the application's region, as an RNIC's DMA would,
//! instead of copying it into a frame first. The ICRC still covers the payload, so the CPU
//! reads it once either way; what the split saves is the write.

use smallvec::SmallVec;

use super::mr::MemSpan;
use crate::wire::{icrc::IcrcState, ExtHeaders, HeaderImage, PacketFields, SplitFrame};

/// One frame from the transport.
#[derive(Debug)]
pub enum TxOut<'m> {
    /// The whole frame is the first `n` bytes of the caller's buffer.
    Whole(usize),
    /// The frame is the caller's buffer's first `head_len` bytes, then `payload`, then
    /// `tail`.
    Split(SplitFrame<MemSpan<'m>>),
}

impl TxOut<'_> {
    /// Bytes of the frame.
    pub fn len(&self) -> usize {
        match self {
            Self::Whole(n) => *n,
            Self::Split(s) => s.len(),
        }
    }

    /// Never true: a frame has headers.
    pub fn is_empty(&self) -> bool {
        false
    }
}

/// A frame and the port it leaves on: what a QP (or an
/// [`Endpoint`](super::endpoint::Endpoint)) answers when asked to transmit. The port is
/// named with the frame because a QP with an alternate path sends on two: its data on the
/// active path's port, a probe of the other path (or the answer to one) on that path's.
#[derive(Debug)]
pub struct Transmit<'m> {
    /// The port (index from 0).
    pub port: u8,
    /// The frame.
    pub out: TxOut<'m>,
}

impl Transmit<'_> {
    /// Bytes of the frame.
    pub fn len(&self) -> usize {
        self.out.len()
    }

    /// Never true: a frame has headers.
    pub fn is_empty(&self) -> bool {
        false
    }
}

/// Emits packet `p` of the path `image` renders, with extension headers `ext` and its
/// `payload_len` payload bytes left in `payload`.
pub(crate) fn emit_split<'m>(
    image: &HeaderImage,
    p: &PacketFields,
    ext: &ExtHeaders,
    payload_len: usize,
    buf: &mut [u8],
    payload: SmallVec<[MemSpan<'m>; 2]>,
) -> Option<TxOut<'m>> {
    let mut tail = [0u8; 7];
    let (head_len, tail_len) = image
        .emit_split(
            buf,
            &mut tail,
            p,
            ext,
            payload_len,
            |crc: &mut IcrcState| {
                for s in &payload {
                    s.icrc_update(crc);
                }
            },
        )
        .ok()?;
    Some(TxOut::Split(SplitFrame {
        head_len,
        payload,
        tail,
        tail_len,
    }))
}
