//! What registering memory through the service costs (issue 37 item 2): moving a buffer's
//! pages onto a memfd at the same addresses (`shm::adopt`), per size, beside a plain copy of
//! the same bytes between two buffers already faulted in (the copy `adopt` makes is most of
//! it; the rest is the memfd's page faults and the remapping). Criterion reports bytes per
//! second: the cost per MiB is its inverse.
//!
//!   cargo bench -p ferroce-drivers --bench shm

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use ferroce_drivers::shm::adopt;

/// A fresh private anonymous mapping of `n` bytes, every page written (as a program's
/// buffer is before it registers it).
fn buffer(n: usize) -> *mut u8 {
    // SAFETY: a fresh private anonymous mapping.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            n,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    // SAFETY: fills the mapping just made.
    unsafe { std::ptr::write_bytes(p.cast::<u8>(), 0x5a, n) };
    p.cast()
}

fn unmap(p: *mut u8, n: usize) {
    // SAFETY: unmaps a mapping `buffer` made, which nothing uses any more.
    unsafe { libc::munmap(p.cast(), n) };
}

/// A registered buffer, unmapped (and its memfd closed) when criterion drops it, after the
/// timing.
struct Registered(
    *mut u8,
    usize,
    #[allow(dead_code)] ferroce_drivers::shm::Adopted,
);

impl Drop for Registered {
    fn drop(&mut self) {
        unmap(self.0, self.1);
    }
}

fn bench(c: &mut Criterion) {
    for mib in [1usize, 16, 64] {
        let n = mib << 20;
        let mut g = c.benchmark_group(format!("register_{mib}MiB"));
        g.throughput(Throughput::Bytes(n as u64));
        g.sample_size(10);
        g.bench_function("adopt", |b| {
            b.iter_batched(
                || buffer(n),
                |p| {
                    // SAFETY: the benchmark's own buffer, touched by this thread only.
                    let a = unsafe { adopt(p, n, c"ferroce-bench") }.unwrap();
                    Registered(p, n, a)
                },
                BatchSize::PerIteration,
            )
        });
        let (src, dst) = (buffer(n), buffer(n));
        g.bench_function("copy", |b| {
            // SAFETY: two distinct mappings of `n` bytes each.
            b.iter(|| unsafe { std::ptr::copy_nonoverlapping(src, dst, n) })
        });
        unmap(src, n);
        unmap(dst, n);
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
