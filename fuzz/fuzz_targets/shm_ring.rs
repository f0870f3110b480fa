//! The service's view of a ring a hostile program shares (issue 37 item 4): any bytes as the
//! ring's memory to start with, then any mix of pops, pushes (the service's completion ring:
//! it reads the program's `head`) and words the program writes anywhere in the ring at any
//! moment. No call may panic, fault or read outside the region; the counts the ring reports
//! never exceed its capacity.
#![no_main]

use std::sync::Arc;

use ferroce_drivers::shm::{Consumer, Producer, Region, RingLayout};
use libfuzzer_sys::fuzz_target;

const W: usize = 4;

fuzz_target!(|data: &[u8]| {
    let Some((&[cap_log, split], rest)) = data.split_first_chunk::<2>() else {
        return;
    };
    let cap = 1u32 << (cap_log % 7);
    let bytes = RingLayout::bytes::<W>(cap);
    let region = Arc::new(Region::new(c"ferroce-fuzz", bytes).unwrap());
    let (init, ops) = rest.split_at(usize::from(split).min(rest.len()));
    // The program's first writes: `init` laid over the ring from its start.
    let words: Vec<u64> = init
        .chunks(8)
        .map(|c| {
            let mut w = [0u8; 8];
            w[..c.len()].copy_from_slice(c);
            u64::from_le_bytes(w)
        })
        .take(bytes / 8)
        .collect();
    assert!(region.store_words(0, &words));
    let layout = RingLayout { offset: 0, cap };
    let mut rx = Consumer::<W>::new(region.clone(), layout).unwrap();
    let mut tx = Producer::<W>::new(region.clone(), layout).unwrap();
    for op in ops.chunks(9) {
        match op[0] % 4 {
            0 => {
                let _ = rx.pop();
            }
            1 => {
                let _ = tx.push(&[u64::from(op[0]); W]);
            }
            2 => {
                // A word anywhere in the ring, indices included.
                let at = usize::from(op.get(1).copied().unwrap_or(0)) % (bytes / 8) * 8;
                let mut w = [0u8; 8];
                for (d, s) in w.iter_mut().zip(op.iter().skip(1)) {
                    *d = *s;
                }
                assert!(region.store_words(at, &[u64::from_le_bytes(w)]));
            }
            _ => {
                if let Ok(n) = rx.len() {
                    assert!(n <= cap);
                }
                if let Ok(n) = tx.free() {
                    assert!(n <= cap);
                }
            }
        }
    }
    // Outside the region, nothing is stored.
    assert!(!region.store_words(bytes, &[1]));
    assert!(!region.store_words(4, &[1]));
});
