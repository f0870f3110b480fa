//! Reed-Solomon through `reed-solomon-erasure`: a Vandermonde-derived code over GF(2^8)
//! with table-driven multiplication (the pure-Rust path; the crate's SIMD C kernels are an
//! optional feature left off).

use reed_solomon_erasure::galois_8::ReedSolomon;

use super::{encode_shape, same_length, CodecError, ErasureCodec};

/// MDS (k, m) Reed-Solomon, `reed-solomon-erasure` backend.
pub struct RsErasure {
    rs: ReedSolomon,
}

impl RsErasure {
    /// A (k, m) code; GF(2^8) allows at most 256 chunks in all.
    pub fn new(k: usize, m: usize) -> Result<Self, CodecError> {
        let rs = ReedSolomon::new(k, m).map_err(|_| CodecError::Shape {
            k,
            m,
            why: "reed-solomon-erasure needs k, m >= 1 and k + m <= 256",
        })?;
        Ok(Self { rs })
    }
}

impl ErasureCodec for RsErasure {
    fn name(&self) -> &'static str {
        "rs-erasure"
    }
    fn k(&self) -> usize {
        self.rs.data_shard_count()
    }
    fn m(&self) -> usize {
        self.rs.parity_shard_count()
    }

    fn encode(&mut self, data: &[&[u8]], parity: &mut [&mut [u8]]) -> Result<(), CodecError> {
        encode_shape(data, parity, self.k(), self.m())?;
        self.rs
            .encode_sep(data, parity)
            .map_err(|_| CodecError::Chunks("reed-solomon-erasure refused the chunks"))
    }

    fn decodable(&self, present: &[bool]) -> bool {
        present.len() == self.k() + self.m() && present.iter().filter(|&&p| p).count() >= self.k()
    }

    fn reconstruct(
        &mut self,
        chunks: &mut [&mut [u8]],
        present: &[bool],
    ) -> Result<(), CodecError> {
        same_length(chunks.iter().map(|c| c.len()), self.k() + self.m())?;
        if !self.decodable(present) {
            return Err(CodecError::Undecodable);
        }
        let mut shards: Vec<(&mut [u8], bool)> = chunks
            .iter_mut()
            .zip(present)
            .map(|(c, &p)| (&mut **c, p))
            .collect();
        self.rs
            .reconstruct_data(&mut shards)
            .map_err(|_| CodecError::Undecodable)
    }
}
