//! Reed-Solomon through `reed-solomon-simd`: an O(n log n) code over GF(2^16) with SIMD
//! kernels; chunks must have an even length.

use reed_solomon_simd::{ReedSolomonDecoder, ReedSolomonEncoder};

use super::{encode_shape, same_length, CodecError, ErasureCodec};

/// MDS (k, m) Reed-Solomon, `reed-solomon-simd` backend. The encoder and decoder keep their
/// working memory between calls for one chunk length.
pub struct RsSimd {
    k: usize,
    m: usize,
    /// Made for the first chunk length seen; reset for another.
    enc: Option<(usize, ReedSolomonEncoder)>,
    dec: Option<(usize, ReedSolomonDecoder)>,
}

impl RsSimd {
    /// A (k, m) code; the library takes up to 65535 chunks in all.
    pub fn new(k: usize, m: usize) -> Result<Self, CodecError> {
        if k == 0 || m == 0 || k + m > 65535 {
            return Err(CodecError::Shape {
                k,
                m,
                why: "reed-solomon-simd needs k, m >= 1 and k + m <= 65535",
            });
        }
        Ok(Self {
            k,
            m,
            enc: None,
            dec: None,
        })
    }
}

fn chunk_error(_: reed_solomon_simd::Error) -> CodecError {
    CodecError::Chunks("reed-solomon-simd needs a non-zero, even chunk length")
}

impl ErasureCodec for RsSimd {
    fn name(&self) -> &'static str {
        "rs-simd"
    }
    fn k(&self) -> usize {
        self.k
    }
    fn m(&self) -> usize {
        self.m
    }

    fn encode(&mut self, data: &[&[u8]], parity: &mut [&mut [u8]]) -> Result<(), CodecError> {
        encode_shape(data, parity, self.k, self.m)?;
        self.encode_each(data, &mut |i, r| parity[i].copy_from_slice(r))
    }

    fn encode_each(
        &mut self,
        data: &[&[u8]],
        out: &mut dyn FnMut(usize, &[u8]),
    ) -> Result<(), CodecError> {
        let len = same_length(data.iter().map(|c| c.len()), self.k)?;
        let enc = match &mut self.enc {
            Some((l, e)) if *l == len => e,
            slot => {
                let e = ReedSolomonEncoder::new(self.k, self.m, len).map_err(chunk_error)?;
                &mut slot.insert((len, e)).1
            }
        };
        for d in data {
            enc.add_original_shard(d).map_err(chunk_error)?;
        }
        let result = enc.encode().map_err(chunk_error)?;
        for (i, r) in result.recovery_iter().enumerate() {
            out(i, r);
        }
        Ok(())
    }

    fn decodable(&self, present: &[bool]) -> bool {
        present.len() == self.k + self.m && present.iter().filter(|&&p| p).count() >= self.k
    }

    fn reconstruct(
        &mut self,
        chunks: &mut [&mut [u8]],
        present: &[bool],
    ) -> Result<(), CodecError> {
        let len = same_length(chunks.iter().map(|c| c.len()), self.k + self.m)?;
        if !self.decodable(present) {
            return Err(CodecError::Undecodable);
        }
        if present[..self.k].iter().all(|&p| p) {
            return Ok(());
        }
        let (k, m) = (self.k, self.m);
        let dec = match &mut self.dec {
            Some((l, d)) if *l == len => d,
            slot => {
                let d = ReedSolomonDecoder::new(k, m, len).map_err(chunk_error)?;
                &mut slot.insert((len, d)).1
            }
        };
        for (i, c) in chunks.iter().enumerate().filter(|&(i, _)| present[i]) {
            if i < k {
                dec.add_original_shard(i, &**c).map_err(chunk_error)?;
            } else {
                dec.add_recovery_shard(i - k, &**c).map_err(chunk_error)?;
            }
        }
        let out = dec.decode().map_err(|_| CodecError::Undecodable)?;
        for (i, restored) in out.restored_original_iter() {
            chunks[i].copy_from_slice(restored);
        }
        Ok(())
    }
}
