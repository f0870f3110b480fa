//! A bitmap over a sliding range of PSNs: the responder's arrivals ahead of the expected PSN
//! and the requester's selectively acknowledged PSNs. Bit `psn mod capacity` stands for the
//! one PSN of the current range that maps there; callers clear bits as the range slides, so
//! a bit is never read for a PSN older than the range.

use crate::wire::Psn;

#[derive(Clone, Debug, Default)]
pub(crate) struct PsnRing {
    words: Vec<u64>,
}

impl PsnRing {
    /// A ring of at least `capacity` PSNs (a power of two, at least 64). Allocates only here:
    /// Go-Back-N QPs never build one.
    pub(crate) fn with_capacity(capacity: u32) -> Self {
        let bits = capacity.max(64).next_power_of_two();
        Self {
            words: vec![0; (bits / 64) as usize],
        }
    }

    /// PSNs the ring spans (0 before it is built).
    pub(crate) fn capacity(&self) -> u32 {
        self.words.len() as u32 * 64
    }

    fn at(&self, psn: Psn) -> (usize, u64) {
        let i = psn.value() & (self.capacity() - 1);
        ((i / 64) as usize, 1u64 << (i % 64))
    }

    pub(crate) fn get(&self, psn: Psn) -> bool {
        if self.words.is_empty() {
            return false;
        }
        let (w, b) = self.at(psn);
        self.words[w] & b != 0
    }

    pub(crate) fn set(&mut self, psn: Psn) {
        if !self.words.is_empty() {
            let (w, b) = self.at(psn);
            self.words[w] |= b;
        }
    }

    pub(crate) fn clear(&mut self, psn: Psn) {
        if !self.words.is_empty() {
            let (w, b) = self.at(psn);
            self.words[w] &= !b;
        }
    }

    pub(crate) fn clear_all(&mut self) {
        self.words.fill(0);
    }

    /// Clears `[from, to)`, at most one whole ring's worth.
    pub(crate) fn clear_range(&mut self, from: Psn, to: Psn) {
        let n = to.distance(from);
        if n <= 0 || self.words.is_empty() {
            return;
        }
        if n as u32 >= self.capacity() {
            self.words.fill(0);
            return;
        }
        for i in 0..n as u32 {
            self.clear(from.add(i));
        }
    }

    /// How many PSNs of `[from, to)` are set, a word at a time.
    pub(crate) fn count(&self, from: Psn, to: Psn) -> u32 {
        let n = to.distance(from);
        if n <= 0 || self.words.is_empty() {
            return 0;
        }
        let cap = self.capacity();
        if n as u32 >= cap {
            return self.words.iter().map(|w| w.count_ones()).sum();
        }
        let start = from.value() & (cap - 1);
        let end = start + n as u32;
        if end <= cap {
            self.count_bits(start, end)
        } else {
            self.count_bits(start, cap) + self.count_bits(0, end - cap)
        }
    }

    /// Set bits at indices `[a, b)`, `a < b <= capacity`.
    fn count_bits(&self, a: u32, b: u32) -> u32 {
        let (first, last) = (a / 64, (b - 1) / 64);
        (first..=last)
            .map(|i| {
                let mut w = self.words[i as usize];
                if i == first {
                    w &= !0u64 << (a % 64);
                }
                if i == last {
                    w &= !0u64 >> (63 - (b - 1) % 64);
                }
                w.count_ones()
            })
            .sum()
    }

    pub(crate) fn heap_bytes(&self) -> usize {
        self.words.capacity() * 8
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bits_follow_psns_across_the_wrap() {
        let mut r = PsnRing::with_capacity(100);
        assert_eq!(r.capacity(), 128);
        let base = Psn::new(0xff_fff0);
        for i in [0u32, 5, 31, 100] {
            r.set(base.add(i));
        }
        assert!(r.get(base) && r.get(base.add(5)) && r.get(base.add(100)));
        assert!(!r.get(base.add(1)));
        r.clear_range(base, base.add(10));
        assert!(!r.get(base) && !r.get(base.add(5)) && r.get(base.add(31)));
        r.clear_range(base, base.add(1000));
        assert!(!r.get(base.add(100)));
        let empty = PsnRing::default();
        assert!(!empty.get(base));
    }

    #[test]
    fn count_agrees_with_bit_by_bit_across_words_and_the_wrap() {
        let mut r = PsnRing::with_capacity(256);
        let base = Psn::new(0xff_ff80);
        let mut rng = 0x1234_5678u64;
        for i in 0..256 {
            rng = rng
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            if rng >> 62 == 0 {
                r.set(base.add(i));
            }
        }
        for from in [0u32, 1, 63, 64, 100, 200, 255] {
            for len in [0u32, 1, 2, 63, 64, 65, 128, 200, 255, 256, 300] {
                let (a, b) = (base.add(from), base.add(from + len));
                let naive = (0..len.min(256)).filter(|&i| r.get(a.add(i))).count() as u32;
                assert_eq!(r.count(a, b), naive, "from {from} len {len}");
            }
        }
    }
}
