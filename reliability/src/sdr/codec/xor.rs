//! The XOR code of the SDR paper: parity chunk `i` is the XOR of the data chunks `j` with
//! `j mod m = i`; a group (its data chunks and its parity chunk) survives one loss.

use super::{encode_shape, same_length, CodecError, ErasureCodec};

/// XOR parity over `m` modulo groups of the `k` data chunks.
#[derive(Debug, Clone)]
pub struct Xor {
    k: usize,
    m: usize,
}

impl Xor {
    /// A (k, m) XOR code: `m` groups, each of `k / m` data chunks (rounded up for the first
    /// `k mod m`).
    pub fn new(k: usize, m: usize) -> Result<Self, CodecError> {
        if k == 0 || m == 0 || m > k {
            return Err(CodecError::Shape {
                k,
                m,
                why: "XOR needs 1 <= m <= k",
            });
        }
        Ok(Self { k, m })
    }
}

/// `dst ^= src`, a word at a time (the compiler vectorises the loop).
fn xor_into(dst: &mut [u8], src: &[u8]) {
    let mut d = dst.chunks_exact_mut(8);
    let mut s = src.chunks_exact(8);
    for (a, b) in (&mut d).zip(&mut s) {
        let x = u64::from_ne_bytes(a.try_into().unwrap_or([0; 8]))
            ^ u64::from_ne_bytes(b.try_into().unwrap_or([0; 8]));
        a.copy_from_slice(&x.to_ne_bytes());
    }
    for (a, b) in d.into_remainder().iter_mut().zip(s.remainder()) {
        *a ^= b;
    }
}

impl ErasureCodec for Xor {
    fn name(&self) -> &'static str {
        "xor"
    }
    fn k(&self) -> usize {
        self.k
    }
    fn m(&self) -> usize {
        self.m
    }

    fn encode(&mut self, data: &[&[u8]], parity: &mut [&mut [u8]]) -> Result<(), CodecError> {
        encode_shape(data, parity, self.k, self.m)?;
        for (i, p) in parity.iter_mut().enumerate() {
            p.copy_from_slice(data[i]);
            for d in data.iter().skip(i + self.m).step_by(self.m) {
                xor_into(p, d);
            }
        }
        Ok(())
    }

    fn decodable(&self, present: &[bool]) -> bool {
        present.len() == self.k + self.m
            && (0..self.m).all(|g| {
                let lost = (g..self.k).step_by(self.m).filter(|&j| !present[j]).count();
                lost == 0 || (lost == 1 && present[self.k + g])
            })
    }

    fn reconstruct(
        &mut self,
        chunks: &mut [&mut [u8]],
        present: &[bool],
    ) -> Result<(), CodecError> {
        same_length(chunks.iter().map(|c| c.len()), self.k + self.m)?;
        if !self.decodable(present) {
            return Err(CodecError::Undecodable);
        }
        let (data, parity) = chunks.split_at_mut(self.k);
        for (g, p) in parity.iter().enumerate() {
            let Some(lost) = (g..self.k).step_by(self.m).find(|&j| !present[j]) else {
                continue;
            };
            let (before, rest) = data.split_at_mut(lost);
            let (target, after) = rest.split_first_mut().expect("lost < k");
            target.copy_from_slice(p);
            for j in (g..self.k).step_by(self.m).filter(|&j| j != lost) {
                let src: &[u8] = if j < lost {
                    before[j]
                } else {
                    after[j - lost - 1]
                };
                xor_into(target, src);
            }
        }
        Ok(())
    }
}
