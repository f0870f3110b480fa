//! [`IsaL`]: the (k, m) Cauchy Reed-Solomon code through ISA-L.

use core::ffi::c_int;

use ferroce_reliability::sdr::codec::{same_length, CodecError, ErasureCodec};

use crate::ffi;

/// MDS (k, m) Reed-Solomon on ISA-L (GF(2^8): at most 255 chunks in all). Keeps its
/// encoding tables, and the decoding tables of the last loss pattern, between calls.
pub struct IsaL {
    k: usize,
    m: usize,
    /// The (k + m) × k generator: identity on top, Cauchy rows below.
    matrix: Vec<u8>,
    /// `ec_init_tables` of the parity rows.
    encode_tables: Vec<u8>,
    /// The loss pattern the decode tables are for, and the tables.
    decode: Option<(Vec<bool>, Vec<u8>)>,
}

impl IsaL {
    /// A (k, m) code.
    pub fn new(k: usize, m: usize) -> Result<Self, CodecError> {
        if k == 0 || m == 0 || k + m > 255 {
            return Err(CodecError::Shape {
                k,
                m,
                why: "ISA-L's GF(2^8) code needs k, m >= 1 and k + m <= 255",
            });
        }
        let mut matrix = vec![0u8; (k + m) * k];
        // SAFETY: `matrix` holds (k + m) × k bytes, what gf_gen_cauchy1_matrix(a, m', k)
        // writes for m' = k + m rows of k columns.
        unsafe { ffi::gf_gen_cauchy1_matrix(matrix.as_mut_ptr(), (k + m) as c_int, k as c_int) };
        let mut encode_tables = vec![0u8; 32 * k * m];
        // SAFETY: the parity rows are the m × k bytes after the identity's k × k; the tables
        // hold 32 × k × rows bytes, ISA-L's documented size.
        unsafe {
            ffi::ec_init_tables(
                k as c_int,
                m as c_int,
                matrix.as_mut_ptr().add(k * k),
                encode_tables.as_mut_ptr(),
            )
        };
        Ok(Self {
            k,
            m,
            matrix,
            encode_tables,
            decode: None,
        })
    }

    /// Runs `ec_encode_data` with `tables` (`rows` output rows) over `inputs` into `outputs`.
    fn run(
        k: usize,
        tables: &mut [u8],
        len: usize,
        inputs: &[&[u8]],
        outputs: &mut [&mut [u8]],
    ) -> Result<(), CodecError> {
        if len == 0 || inputs.len() != k {
            return Err(CodecError::Chunks("ISA-L needs k non-empty input chunks"));
        }
        let mut ins: Vec<*mut u8> = inputs.iter().map(|c| c.as_ptr().cast_mut()).collect();
        let mut outs: Vec<*mut u8> = outputs.iter_mut().map(|c| c.as_mut_ptr()).collect();
        // SAFETY: every input and output chunk holds `len` bytes (checked by the callers'
        // shape checks); ISA-L reads `k` inputs and writes `outs.len()` outputs of `len`
        // bytes each and never writes through the input pointers (the `*mut` is its C
        // signature); `tables` holds 32 × k × rows bytes from ec_init_tables.
        unsafe {
            ffi::ec_encode_data(
                len as c_int,
                k as c_int,
                outs.len() as c_int,
                tables.as_mut_ptr(),
                ins.as_mut_ptr(),
                outs.as_mut_ptr(),
            )
        };
        Ok(())
    }
}

impl ErasureCodec for IsaL {
    fn name(&self) -> &'static str {
        "isa-l"
    }
    fn k(&self) -> usize {
        self.k
    }
    fn m(&self) -> usize {
        self.m
    }

    fn encode(&mut self, data: &[&[u8]], parity: &mut [&mut [u8]]) -> Result<(), CodecError> {
        let len = same_length(data.iter().map(|c| c.len()), self.k)?;
        if same_length(parity.iter().map(|c| c.len()), self.m)? != len {
            return Err(CodecError::Chunks("parity and data lengths differ"));
        }
        Self::run(self.k, &mut self.encode_tables, len, data, parity)
    }

    fn decodable(&self, present: &[bool]) -> bool {
        present.len() == self.k + self.m && present.iter().filter(|&&p| p).count() >= self.k
    }

    fn reconstruct(
        &mut self,
        chunks: &mut [&mut [u8]],
        present: &[bool],
    ) -> Result<(), CodecError> {
        let (k, m) = (self.k, self.m);
        let len = same_length(chunks.iter().map(|c| c.len()), k + m)?;
        if !self.decodable(present) {
            return Err(CodecError::Undecodable);
        }
        let missing: Vec<usize> = (0..k).filter(|&i| !present[i]).collect();
        if missing.is_empty() {
            return Ok(());
        }
        // The first k chunks that arrived, and their rows of the generator.
        let used: Vec<usize> = (0..k + m).filter(|&i| present[i]).take(k).collect();
        let pattern: Vec<bool> = (0..k + m).map(|i| used.contains(&i)).collect();
        let fresh = !matches!(&self.decode, Some((p, _)) if *p == pattern);
        if fresh {
            let mut sub = vec![0u8; k * k];
            for (r, &row) in used.iter().enumerate() {
                sub[r * k..(r + 1) * k].copy_from_slice(&self.matrix[row * k..(row + 1) * k]);
            }
            let mut inv = vec![0u8; k * k];
            // SAFETY: both matrices hold k × k bytes, as gf_invert_matrix(in, out, k) reads
            // and writes.
            if unsafe { ffi::gf_invert_matrix(sub.as_mut_ptr(), inv.as_mut_ptr(), k as c_int) } != 0
            {
                return Err(CodecError::Undecodable);
            }
            // Data chunk d is row d of the inverse applied to the chunks used.
            let mut rows = vec![0u8; missing.len() * k];
            for (r, &d) in missing.iter().enumerate() {
                rows[r * k..(r + 1) * k].copy_from_slice(&inv[d * k..(d + 1) * k]);
            }
            let mut tables = vec![0u8; 32 * k * missing.len()];
            // SAFETY: `rows` holds missing × k bytes and `tables` 32 × k × missing.
            unsafe {
                ffi::ec_init_tables(
                    k as c_int,
                    missing.len() as c_int,
                    rows.as_mut_ptr(),
                    tables.as_mut_ptr(),
                )
            };
            self.decode = Some((pattern, tables));
        }
        let Some((_, tables)) = self.decode.as_mut() else {
            return Err(CodecError::Undecodable);
        };
        // Inputs are the chunks used; outputs the missing data chunks: disjoint.
        let mut outs: Vec<Vec<u8>> = vec![vec![0u8; len]; missing.len()];
        {
            let inputs: Vec<&[u8]> = used.iter().map(|&i| &*chunks[i]).collect();
            let mut o: Vec<&mut [u8]> = outs.iter_mut().map(Vec::as_mut_slice).collect();
            Self::run(k, tables, len, &inputs, &mut o)?;
        }
        for (d, out) in missing.iter().zip(outs) {
            chunks[*d].copy_from_slice(&out);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every loss pattern of up to m chunks rebuilds the data; m + 1 is refused.
    #[test]
    fn rebuilds_any_m_losses() {
        let (k, m, len) = (8, 3, 96);
        let mut c = IsaL::new(k, m).unwrap();
        let data: Vec<Vec<u8>> = (0..k)
            .map(|i| (0..len).map(|j| (i * 29 + j * 11 + 1) as u8).collect())
            .collect();
        let mut parity = vec![vec![0u8; len]; m];
        {
            let d: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
            let mut p: Vec<&mut [u8]> = parity.iter_mut().map(Vec::as_mut_slice).collect();
            c.encode(&d, &mut p).unwrap();
        }
        for mask in 0u32..(1 << (k + m)) {
            let lost = mask.count_ones() as usize;
            if lost > m + 1 {
                continue;
            }
            let present: Vec<bool> = (0..k + m).map(|i| mask >> i & 1 == 0).collect();
            let mut all: Vec<Vec<u8>> = data.iter().chain(&parity).cloned().collect();
            for (i, ch) in all.iter_mut().enumerate() {
                if !present[i] {
                    ch.fill(0xee);
                }
            }
            let mut views: Vec<&mut [u8]> = all.iter_mut().map(Vec::as_mut_slice).collect();
            let r = c.reconstruct(&mut views, &present);
            if lost > m {
                assert_eq!(r, Err(CodecError::Undecodable));
            } else {
                r.unwrap();
                assert_eq!(&all[..k], &data[..], "pattern {mask:#b}");
            }
        }
    }
}
