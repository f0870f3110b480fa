//! What the transport tests share beyond the testbed (`ferroce::testbed`, which they drive):
//! seeded runs that name a failing seed, and a small deterministic generator.
#![allow(dead_code, unreachable_pub, unused_imports)]

use std::panic::{catch_unwind, AssertUnwindSafe};

pub use ferroce::stack::transport::{Access, Policies};
pub use ferroce::testbed::{multipath, multipath_asym, pair, ConnOpts, Host, Step, Testbed, PD};

/// Runs `f` for each seed (or only `FERROCE_SEED`), naming the seed if it fails.
pub fn seeded(default: impl IntoIterator<Item = u64>, mut f: impl FnMut(u64)) {
    let seeds: Vec<u64> = match std::env::var("FERROCE_SEED") {
        Ok(s) => vec![s.parse().expect("FERROCE_SEED is a number")],
        Err(_) => default.into_iter().collect(),
    };
    for seed in seeds {
        if let Err(e) = catch_unwind(AssertUnwindSafe(|| f(seed))) {
            eprintln!("failed with seed {seed}; replay with FERROCE_SEED={seed}");
            std::panic::resume_unwind(e);
        }
    }
}

/// A small deterministic generator for test choices (SplitMix64).
#[derive(Clone, Debug)]
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo).max(1)
    }

    pub fn chance(&mut self, p: f64) -> bool {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }
}

/// Every right a region can have.
pub const ALL: Access = Access::LOCAL_WRITE
    .with(Access::REMOTE_WRITE)
    .with(Access::REMOTE_READ)
    .with(Access::REMOTE_ATOMIC);
