//! A frame in pieces: headers in a buffer, the payload where it lies, pad and ICRC last.
//!
//! A NIC that sends one frame from several buffers (a DPDK PMD with multi-segment transmit)
//! takes a large payload straight from the application's registered memory, as an RNIC's DMA
//! would. The shape of such a frame is wire, so a driver needs nothing else from the stack to
//! send it; what a payload piece *is* (a checked view of registered memory) stays with the
//! transport's memory accessor, behind [`Span`].

use smallvec::SmallVec;

/// Payload bytes a split frame carries without copying them.
pub trait Span {
    /// Bytes in the span.
    fn len(&self) -> usize;

    /// True for an empty span.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Where the bytes are, for a driver that hands them to a NIC. Valid for as long as the
    /// span lives.
    fn as_ptr(&self) -> *const u8;

    /// Copies the span into `out`, which is exactly [`len`](Self::len) bytes long.
    fn copy_to(&self, out: &mut [u8]);
}

/// A frame in pieces: headers in the caller's buffer, payload in spans `S`, pad and ICRC in
/// `tail`.
#[derive(Debug)]
pub struct SplitFrame<S> {
    /// Header bytes at the front of the caller's buffer.
    pub head_len: usize,
    /// The payload, in order.
    pub payload: SmallVec<[S; 2]>,
    /// Pad bytes and the ICRC: the first `tail_len` bytes.
    pub tail: [u8; 7],
    /// Bytes of `tail` in use.
    pub tail_len: usize,
}

impl<S: Span> SplitFrame<S> {
    /// Bytes of the frame.
    pub fn len(&self) -> usize {
        self.head_len + self.payload.iter().map(S::len).sum::<usize>() + self.tail_len
    }

    /// Never true: a frame has headers.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Copies the frame into `out` (exactly [`len`](Self::len) bytes): what a port without
    /// multi-segment transmit does.
    pub fn copy_to(&self, head: &[u8], out: &mut [u8]) {
        out[..self.head_len].copy_from_slice(&head[..self.head_len]);
        let mut at = self.head_len;
        for s in &self.payload {
            s.copy_to(&mut out[at..at + s.len()]);
            at += s.len();
        }
        out[at..at + self.tail_len].copy_from_slice(&self.tail[..self.tail_len]);
    }
}

/// Plain bytes are a span too: a frame assembled from buffers the caller owns.
impl Span for &[u8] {
    fn len(&self) -> usize {
        <[u8]>::len(self)
    }

    fn as_ptr(&self) -> *const u8 {
        <[u8]>::as_ptr(self)
    }

    fn copy_to(&self, out: &mut [u8]) {
        out.copy_from_slice(self);
    }
}
