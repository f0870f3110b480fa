//! Which pages of application memory a NIC has mapped for DMA, counted per chunk.
//!
//! A NIC that sends payloads in place must be told about the memory first (DPDK:
//! `rte_extmem_register` plus `rte_dev_dma_map`), in whole pages, and a range may be mapped
//! only once. Memory regions are not page-aligned and may share pages (two small regions on
//! one heap page) or overlap outright, so the driver maps chunks: when a region arrives, the
//! parts of its pages no chunk covers yet become new chunks; each chunk counts the regions
//! that touch it and is unmapped when the last of them goes.

use std::collections::BTreeMap;

/// Mapped chunks, disjoint, by start address: `start -> (end, regions touching it)`.
#[derive(Debug, Default)]
pub struct MappedChunks {
    page: usize,
    chunks: BTreeMap<usize, (usize, u32)>,
}

impl MappedChunks {
    /// Chunks of whole `page`-byte pages (a power of two).
    pub fn new(page: usize) -> Self {
        assert!(page.is_power_of_two(), "page size {page}");
        Self {
            page,
            chunks: BTreeMap::new(),
        }
    }

    /// The pages `len` bytes at `addr` touch, as `[start, end)`; `None` for nothing or a
    /// range that wraps.
    fn pages(&self, addr: usize, len: usize) -> Option<(usize, usize)> {
        let end = addr.checked_add(len)?.checked_next_multiple_of(self.page)?;
        (len > 0).then_some((addr & !(self.page - 1), end))
    }

    /// Chunks overlapping `[a, b)`, in address order.
    fn overlapping(&self, a: usize, b: usize) -> Vec<(usize, usize)> {
        let mut v: Vec<_> = self
            .chunks
            .range(..b)
            .rev()
            .take_while(|(_, &(end, _))| end > a)
            .map(|(&s, &(e, _))| (s, e))
            .collect();
        // Chunks are disjoint: walking back from the last that starts before `b`, the first
        // that ends at or before `a` has only chunks before it that end earlier still.
        v.reverse();
        v
    }

    /// Adds a region of `len` bytes at `addr`: maps (with `map`) each part of its pages no
    /// chunk covers, and counts the region in every chunk it touches. When a `map` fails,
    /// the new chunks mapped before it are unmapped (with `unmap`) and nothing changes.
    pub fn add<E>(
        &mut self,
        addr: usize,
        len: usize,
        mut map: impl FnMut(usize, usize) -> Result<(), E>,
        mut unmap: impl FnMut(usize, usize),
    ) -> Result<(), E> {
        let Some((a, b)) = self.pages(addr, len) else {
            return Ok(());
        };
        let old = self.overlapping(a, b);
        let mut gaps = Vec::new();
        let mut at = a;
        for &(s, e) in &old {
            if s > at {
                gaps.push((at, s));
            }
            at = at.max(e);
        }
        if at < b {
            gaps.push((at, b));
        }
        for (i, &(s, e)) in gaps.iter().enumerate() {
            if let Err(err) = map(s, e - s) {
                for &(s, e) in &gaps[..i] {
                    unmap(s, e - s);
                }
                return Err(err);
            }
        }
        for (s, _) in old {
            if let Some(c) = self.chunks.get_mut(&s) {
                c.1 += 1;
            }
        }
        for (s, e) in gaps {
            self.chunks.insert(s, (e, 1));
        }
        Ok(())
    }

    /// Removes a region added with the same `addr` and `len`: every chunk it touched counts
    /// one region fewer, and those no region touches any more are unmapped with `unmap`.
    pub fn remove(&mut self, addr: usize, len: usize, mut unmap: impl FnMut(usize, usize)) {
        let Some((a, b)) = self.pages(addr, len) else {
            return;
        };
        for (s, e) in self.overlapping(a, b) {
            let Some(c) = self.chunks.get_mut(&s) else {
                continue;
            };
            c.1 = c.1.saturating_sub(1);
            if c.1 == 0 {
                self.chunks.remove(&s);
                unmap(s, e - s);
            }
        }
    }

    /// Mapped chunks as `(start, end, regions)`, in address order.
    pub fn chunks(&self) -> Vec<(usize, usize, u32)> {
        self.chunks.iter().map(|(&s, &(e, n))| (s, e, n)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const P: usize = 4096;

    /// Applies adds and removes to a registry and to a page-by-page model, and checks after
    /// each step: the mapped pages are exactly those some live region touches, no page is
    /// mapped twice, and every unmap matches an earlier map.
    fn run(ops: &[(bool, usize, usize)]) {
        let mut m = MappedChunks::new(P);
        let mut live: Vec<(usize, usize)> = Vec::new();
        let mut mapped: std::collections::BTreeSet<usize> = Default::default();
        for &(add, addr, len) in ops {
            if add {
                m.add::<()>(
                    addr,
                    len,
                    |s, l| {
                        for p in (s..s + l).step_by(P) {
                            assert!(mapped.insert(p), "page {p:#x} mapped twice");
                        }
                        Ok(())
                    },
                    |_, _| unreachable!(),
                )
                .unwrap();
                live.push((addr, len));
            } else if let Some(i) = live.iter().position(|&(a, l)| (a, l) == (addr, len)) {
                live.remove(i);
                m.remove(addr, len, |s, l| {
                    for p in (s..s + l).step_by(P) {
                        assert!(mapped.remove(&p), "page {p:#x} unmapped, never mapped");
                    }
                });
            }
            let want: std::collections::BTreeSet<usize> = live
                .iter()
                .filter(|&&(_, l)| l > 0)
                .flat_map(|&(a, l)| ((a / P) * P..(a + l).div_ceil(P) * P).step_by(P))
                .collect();
            assert_eq!(mapped, want);
        }
    }

    #[test]
    fn shared_pages_are_mapped_once_and_kept_while_any_region_uses_them() {
        // Two regions on one page, a third overlapping both and reaching two pages on.
        run(&[
            (true, 0x1010, 100),
            (true, 0x1800, 100),
            (true, 0x1900, 3 * P),
            (false, 0x1010, 100),
            (false, 0x1900, 3 * P),
            (false, 0x1800, 100),
        ]);
        let mut m = MappedChunks::new(P);
        let mut maps = Vec::new();
        for (addr, len) in [(0x1010, 100), (0x1900, 3 * P)] {
            let record = |s, l| {
                maps.push((s, l));
                Ok::<(), ()>(())
            };
            m.add(addr, len, record, |_, _| ()).unwrap();
        }
        assert_eq!(maps, [(0x1000, P), (0x2000, 3 * P)]);
        assert_eq!(m.chunks(), [(0x1000, 0x2000, 2), (0x2000, 0x5000, 1)]);
    }

    #[test]
    fn a_failed_map_leaves_nothing_behind() {
        let mut m = MappedChunks::new(P);
        m.add::<()>(0x3000, P, |_, _| Ok(()), |_, _| ()).unwrap();
        // Gaps on both sides of the existing chunk: the first maps, the second fails.
        let mut unmapped = Vec::new();
        let mut n = 0;
        let r = m.add(
            0x1000,
            5 * P,
            |_, _| {
                n += 1;
                if n == 2 {
                    Err("refused")
                } else {
                    Ok(())
                }
            },
            |s, l| unmapped.push((s, l)),
        );
        assert_eq!(r, Err("refused"));
        assert_eq!(unmapped, [(0x1000, 2 * P)]);
        assert_eq!(m.chunks(), [(0x3000, 0x4000, 1)]);
    }

    proptest! {
        #[test]
        fn any_adds_and_removes_keep_exactly_the_live_pages_mapped(
            ops in proptest::collection::vec(
                (any::<bool>(), 0usize..64 * P, 0usize..8 * P), 0..40)
        ) {
            run(&ops);
        }
    }
}
