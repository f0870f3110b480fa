//! Erasure codes for SDR's EC reliability: a submessage of `k` data chunks travels with `m`
//! parity chunks, and the receiver rebuilds the missing data chunks in place once enough of
//! the `k + m` arrived.
//!
//! Two codes, as the paper compares them (§5.1.1, appendix B): an MDS Reed-Solomon code,
//! which rebuilds from any `k` of the `k + m`, and XOR, whose parity chunk `i` is the XOR of
//! the data chunks `j` with `j mod m = i`, so it rebuilds one loss per such group. Reed-Solomon
//! has two backends behind the same trait, [`RsSimd`] (`reed-solomon-simd`: SIMD, O(n log n))
//! and [`RsErasure`] (`reed-solomon-erasure`: table-driven GF(2^8)); docs/benchmarks.md has
//! their figures on (32, 8) with 64 KiB chunks, and [`mds`] returns the faster.

mod rs_erasure;
mod rs_simd;
mod xor;

pub use rs_erasure::RsErasure;
pub use rs_simd::RsSimd;
pub use xor::Xor;

/// Why a codec refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    /// `k` or `m` is zero or too large for the code.
    #[error("no ({k}, {m}) code: {why}")]
    Shape {
        /// Data chunks.
        k: usize,
        /// Parity chunks.
        m: usize,
        /// What the code needs.
        why: &'static str,
    },
    /// The chunks are not all the same length, the length is not one the code takes, or
    /// the number of chunks is not `k` (`k + m` for decoding).
    #[error("chunks do not fit the code: {0}")]
    Chunks(&'static str),
    /// Too few chunks arrived to rebuild the data.
    #[error("cannot rebuild: the chunks that arrived do not determine the data")]
    Undecodable,
}

/// An erasure code over `k` data and `m` parity chunks of equal length.
pub trait ErasureCodec: Send {
    /// Its name in reports (`rs-simd`, `rs-erasure`, `xor`).
    fn name(&self) -> &'static str;

    /// Data chunks per submessage.
    fn k(&self) -> usize;

    /// Parity chunks per submessage.
    fn m(&self) -> usize;

    /// Computes the `m` parity chunks of the `k` data chunks.
    fn encode(&mut self, data: &[&[u8]], parity: &mut [&mut [u8]]) -> Result<(), CodecError>;

    /// Computes the `m` parity chunks of the `k` data chunks of `len` bytes each and hands
    /// each to `out` (index, bytes) where the code keeps it, so a caller that stores parity
    /// elsewhere (registered memory) copies it once. The default encodes into a scratch
    /// buffer and hands that out.
    fn encode_each(
        &mut self,
        data: &[&[u8]],
        out: &mut dyn FnMut(usize, &[u8]),
    ) -> Result<(), CodecError> {
        let len = data.first().map_or(0, |d| d.len());
        let mut scratch = vec![0u8; self.m() * len];
        let mut parity: Vec<&mut [u8]> = scratch.chunks_exact_mut(len.max(1)).collect();
        parity.truncate(self.m());
        self.encode(data, &mut parity)?;
        for (i, p) in parity.iter().enumerate() {
            out(i, p);
        }
        Ok(())
    }

    /// True when the chunks marked in `present` (data first, then parity; `k + m` marks)
    /// determine the data.
    fn decodable(&self, present: &[bool]) -> bool;

    /// Rebuilds, in place, the data chunks `present` marks missing, from those it marks
    /// present: `chunks` holds `k + m` chunks, data first. Parity chunks are not rebuilt.
    fn reconstruct(&mut self, chunks: &mut [&mut [u8]], present: &[bool])
        -> Result<(), CodecError>;
}

/// Makes a (k, m) MDS codec: how a connection picks its Reed-Solomon backend.
pub type MdsFactory = fn(usize, usize) -> Result<Box<dyn ErasureCodec>, CodecError>;

/// The MDS code SDR uses unless told otherwise: of the pure-Rust backends the faster on this
/// machine's measurements (docs/benchmarks.md). The system ISA-L (`ferroce-isal`, feature
/// `isal`) beats it at both encoding and decoding; it is a [`MdsFactory`] away
/// (`ReliableConfig::mds`).
pub fn mds(k: usize, m: usize) -> Result<Box<dyn ErasureCodec>, CodecError> {
    Ok(Box::new(RsSimd::new(k, m)?))
}

/// Checks the shape every call shares: `n` chunks of one length, which it returns (for
/// codecs outside this crate too).
pub fn same_length(chunks: impl Iterator<Item = usize>, n: usize) -> Result<usize, CodecError> {
    let mut len = None;
    let mut count = 0;
    for l in chunks {
        count += 1;
        if *len.get_or_insert(l) != l {
            return Err(CodecError::Chunks("chunks of different lengths"));
        }
    }
    if count != n {
        return Err(CodecError::Chunks("wrong number of chunks"));
    }
    Ok(len.unwrap_or(0))
}

/// Checks an encode call's shape: `k` data chunks and `m` parity chunks, all one length,
/// which it returns.
fn encode_shape(
    data: &[&[u8]],
    parity: &[&mut [u8]],
    k: usize,
    m: usize,
) -> Result<usize, CodecError> {
    let len = same_length(data.iter().map(|c| c.len()), k)?;
    if same_length(parity.iter().map(|c| c.len()), m)? != len {
        return Err(CodecError::Chunks("parity and data lengths differ"));
    }
    Ok(len)
}

#[cfg(test)]
mod tests;
