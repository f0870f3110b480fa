//! Shared memory between the engine and the programs it serves (issue 37, `ferroce serve`):
//! sealed memfd [`Region`]s, the single-producer single-consumer rings in them
//! ([`Producer`], [`Consumer`]) that carry work requests and completions without a system
//! call, and registered memory moved onto a memfd at its own addresses ([`adopt`]) so the
//! engine reaches it without a copy. Either side may be hostile to the other: nothing the other side writes can make
//! this side read outside a region, fault, or hit undefined behaviour (see [`ring`]'s
//! docs for the ordering and the checks).

pub mod adopt;
pub mod region;
pub mod ring;
pub mod stitch;

pub use adopt::{adopt, release, Adopted};
pub use region::{Mapped, Region, ShmError};
pub use ring::{Consumer, Producer, RingError, RingLayout, MAX_CAP};
pub use stitch::{Piece, Stitched, MAX_PIECES};

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::os::fd::{FromRawFd, OwnedFd};
    use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
    use std::sync::Arc;

    use proptest::prelude::*;

    use super::*;

    const W: usize = 4;

    fn region(bytes: usize) -> Arc<Region> {
        Arc::new(Region::new(c"ferroce-test", bytes).unwrap())
    }

    /// A second, independent mapping of the same memory (as the other process has).
    fn other_mapping(r: &Region) -> Arc<Region> {
        Arc::new(Region::from_fd(r.dup_fd().unwrap(), r.len()).unwrap())
    }

    fn entry(i: u64) -> [u64; W] {
        [i, !i, i.wrapping_mul(0x9e37_79b9_7f4a_7c15), 0x5a5a]
    }

    /// A word of the region, written as the other side would, from outside the ring API.
    fn scribble32(r: &Region, byte: usize, v: u32) {
        // SAFETY: `byte` is in the region and 4-aligned in every caller; atomic access only.
        unsafe { &*r.base().as_ptr().add(byte).cast::<AtomicU32>() }.store(v, Ordering::Relaxed);
    }

    fn scribble64(r: &Region, byte: usize, v: u64) {
        // SAFETY: as in `scribble32`, 8-aligned.
        unsafe { &*r.base().as_ptr().add(byte).cast::<AtomicU64>() }.store(v, Ordering::Relaxed);
    }

    #[test]
    fn entries_come_out_in_order_and_the_ring_fills_at_its_capacity() {
        let layout = RingLayout { offset: 64, cap: 8 };
        let r = region(4096);
        let mut p = Producer::<W>::new(r.clone(), layout).unwrap();
        let mut c = Consumer::<W>::new(other_mapping(&r), layout).unwrap();
        assert_eq!(c.pop(), Ok(None));
        for i in 0..8 {
            assert_eq!(p.push(&entry(i)), Ok(true));
        }
        assert_eq!(p.push(&entry(8)), Ok(false), "full at 8");
        assert_eq!(p.free(), Ok(0));
        assert_eq!(c.len(), Ok(8));
        for i in 0..8 {
            assert_eq!(c.pop(), Ok(Some(entry(i))));
        }
        assert_eq!(c.pop(), Ok(None));
        assert_eq!(p.free(), Ok(8));
    }

    #[test]
    fn a_layout_that_does_not_fit_is_refused() {
        let r = region(4096);
        let bytes = RingLayout::bytes::<W>(64);
        assert_eq!(bytes, 128 + 64 * 32);
        for (offset, cap) in [(0, 3), (0, 0), (32, 8), (0, MAX_CAP * 2), (4096 - 64, 8)] {
            let l = RingLayout { offset, cap };
            assert!(
                matches!(
                    Producer::<W>::new(r.clone(), l),
                    Err(RingError::Layout { .. })
                ),
                "{l:?}"
            );
            assert!(Consumer::<W>::new(r.clone(), l).is_err(), "{l:?}");
        }
        let l = RingLayout {
            offset: 4096 - bytes,
            cap: 64,
        };
        assert!(l.offset.is_multiple_of(64) && Producer::<W>::new(r, l).is_ok());
    }

    #[test]
    fn a_region_that_could_shrink_or_is_too_small_is_refused() {
        // A memfd without seals: its owner could truncate it under our mapping.
        // SAFETY: memfd_create with a valid name; the fd is taken by OwnedFd at once.
        let raw = unsafe { libc::memfd_create(c"unsealed".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(raw >= 0);
        // SAFETY: a fresh descriptor nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: ftruncate on our own descriptor.
        assert_eq!(unsafe { libc::ftruncate(raw, 4096) }, 0);
        assert!(matches!(
            Region::from_fd(fd, 4096),
            Err(ShmError::Unsealed(_))
        ));
        // A regular file: no seals at all.
        let f = std::fs::File::create(std::env::temp_dir().join("ferroce-shm-test")).unwrap();
        assert!(matches!(
            Region::from_fd(f.into(), 1),
            Err(ShmError::Unsealed(_))
        ));
        let r = region(4096);
        assert!(matches!(
            Region::from_fd(r.dup_fd().unwrap(), 8192),
            Err(ShmError::TooSmall {
                have: 4096,
                need: 8192
            })
        ));
        assert!(matches!(Region::new(c"x", 0), Err(ShmError::BadSize(0))));
    }

    #[test]
    fn another_process_cannot_resize_a_sealed_region() {
        let r = region(4096);
        let fd = r.dup_fd().unwrap();
        use std::os::fd::AsRawFd;
        // SAFETY: ftruncate on a descriptor we own; the seals make it fail.
        assert!(unsafe { libc::ftruncate(fd.as_raw_fd(), 0) } < 0);
        // SAFETY: as above.
        assert!(unsafe { libc::ftruncate(fd.as_raw_fd(), 8192) } < 0);
        // SAFETY: removing seals is itself sealed.
        assert!(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_WRITE) } < 0);
    }

    #[test]
    fn words_are_stored_only_inside_the_region_and_aligned() {
        let r = region(4096);
        let theirs = other_mapping(&r);
        assert!(r.store_words(4088, &[7]));
        assert!(!r.store_words(4088, &[7, 8]), "one past the end");
        assert!(!r.store_words(4, &[1]), "misaligned");
        assert!(!r.store_words(usize::MAX - 7, &[1]), "overflowing");
        assert!(r.store_words(64, &[3, 4]));
        // Seen through the other mapping, as a ring reads it: the producer's index is 3.
        let mut c = Consumer::<W>::new(theirs, RingLayout { offset: 0, cap: 4 }).unwrap();
        assert_eq!(c.len(), Ok(3));
        assert!(c.pop().unwrap().is_some());
    }

    #[test]
    fn two_threads_on_two_mappings_pass_every_entry_in_order() {
        let layout = RingLayout { offset: 0, cap: 64 };
        let r = region(RingLayout::bytes::<W>(64));
        let theirs = other_mapping(&r);
        const N: u64 = 200_000;
        let producer = std::thread::spawn(move || {
            let mut p = Producer::<W>::new(r, layout).unwrap();
            let mut i = 0;
            while i < N {
                if p.push(&entry(i)).unwrap() {
                    i += 1;
                } else {
                    std::hint::spin_loop();
                }
            }
        });
        let mut c = Consumer::<W>::new(theirs, layout).unwrap();
        let mut next = 0;
        while next < N {
            match c.pop().unwrap() {
                Some(e) => {
                    assert_eq!(e, entry(next), "entry {next}");
                    next += 1;
                }
                None => std::hint::spin_loop(),
            }
        }
        producer.join().unwrap();
        assert_eq!(c.pop(), Ok(None));
    }

    #[test]
    fn an_index_the_other_side_scribbles_is_caught_not_followed() {
        let layout = RingLayout { offset: 0, cap: 16 };
        let r = region(4096);
        let mut p = Producer::<W>::new(r.clone(), layout).unwrap();
        let mut c = Consumer::<W>::new(other_mapping(&r), layout).unwrap();
        p.push(&entry(1)).unwrap();
        // The producer claims 1000 entries in a ring of 16.
        scribble32(&r, 64, 1000);
        assert_eq!(
            c.pop(),
            Err(RingError::Corrupt {
                theirs: 1000,
                ours: 0,
                cap: 16
            })
        );
        // Behind the consumer (wrapping) is as wrong.
        scribble32(&r, 64, u32::MAX);
        assert!(matches!(c.pop(), Err(RingError::Corrupt { .. })));
        // The consumer's index, scribbled, does not move the producer's own: it refuses.
        scribble32(&r, 0, 77);
        assert!(matches!(p.push(&entry(2)), Err(RingError::Corrupt { .. })));
        assert!(matches!(p.free(), Err(RingError::Corrupt { .. })));
        // Set right again, both go on from their own indices.
        scribble32(&r, 64, 1);
        scribble32(&r, 0, 0);
        assert_eq!(c.pop(), Ok(Some(entry(1))));
        assert_eq!(p.push(&entry(2)), Ok(true));
        assert_eq!(c.pop(), Ok(Some(entry(2))));
    }

    #[test]
    fn a_ring_scribbled_while_in_use_yields_errors_or_garbage_never_a_fault() {
        // One thread writes random words over the whole ring, indices included, while this
        // one pops: every result is an entry (whatever words) or an error, and nothing
        // reads outside the region.
        let layout = RingLayout { offset: 0, cap: 32 };
        let bytes = RingLayout::bytes::<W>(32);
        let r = region(bytes);
        let hostile = other_mapping(&r);
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let scribbles = Arc::new(AtomicU64::new(0));
        let (s, n) = (stop.clone(), scribbles.clone());
        let t = std::thread::spawn(move || {
            let mut x: u64 = 0x1234_5678_9abc_def1;
            while !s.load(Ordering::Relaxed) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let word = (x as usize % (bytes / 8)) * 8;
                scribble64(&hostile, word, x);
                n.fetch_add(1, Ordering::Relaxed);
            }
        });
        let mut c = Consumer::<W>::new(r.clone(), layout).unwrap();
        let (mut got, mut errors) = (0u64, 0u64);
        // Pops until the scribbler has written 100 000 words (one in 144 lands on `tail`)
        // and something it wrote was seen, or it wrote ten million: the thread may not run
        // at all for a while on a loaded machine, so the count, not the pops, bounds it.
        loop {
            let done = scribbles.load(Ordering::Relaxed);
            if (done >= 100_000 && got + errors > 0) || done >= 10_000_000 {
                break;
            }
            match c.pop() {
                Ok(Some(_)) => got += 1,
                Ok(None) => {}
                Err(RingError::Corrupt { cap, .. }) => {
                    assert_eq!(cap, 32);
                    errors += 1;
                }
                Err(e) => panic!("{e}"),
            }
        }
        stop.store(true, Ordering::Relaxed);
        t.join().unwrap();
        assert!(got + errors > 0, "the scribbler was seen");
    }

    #[derive(Clone, Debug)]
    enum Op {
        Push,
        Pop,
    }

    proptest! {
        /// Any sequence of pushes and pops on a ring of any capacity behaves as a bounded
        /// queue, across the 2^32 wrap of the indices.
        #[test]
        fn a_ring_is_a_bounded_fifo(
            cap_log in 0u32..6,
            start in prop_oneof![Just(0u32), Just(u32::MAX - 40), any::<u32>()],
            ops in prop::collection::vec(prop_oneof![Just(Op::Push), Just(Op::Pop)], 0..300),
        ) {
            let cap = 1u32 << cap_log;
            let layout = RingLayout { offset: 0, cap };
            let r = region(RingLayout::bytes::<W>(cap));
            // Both indices start at `start`, as after that many entries.
            scribble32(&r, 0, start);
            scribble32(&r, 64, start);
            let mut p = Producer::<W>::new(r.clone(), layout).unwrap();
            let mut c = Consumer::<W>::new(r.clone(), layout).unwrap();
            p.tail = start;
            c.head = start;
            let mut model = VecDeque::new();
            let mut n = 0u64;
            for op in ops {
                match op {
                    Op::Push => {
                        let pushed = p.push(&entry(n)).unwrap();
                        prop_assert_eq!(pushed, model.len() < cap as usize);
                        if pushed {
                            model.push_back(entry(n));
                        }
                        n += 1;
                    }
                    Op::Pop => prop_assert_eq!(c.pop().unwrap(), model.pop_front()),
                }
                prop_assert_eq!(c.len().unwrap() as usize, model.len());
                prop_assert_eq!(p.free().unwrap() as usize, cap as usize - model.len());
            }
        }
    }
}
