//! The simulated fabric's speed in frames per wall-clock second: bursts of 1 KiB RC WRITE
//! frames from one host through a switch to another, over clean links and over impaired ones
//! (loss, duplication, reordering, corruption), delivered and read back.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use ferroce::drivers::sim::{FabricBuilder, LinkModel, Loss};
use ferroce::drivers::Port;
use ferroce::stack::wire::sample::{sample_frame, sample_repr, SampleAddr};
use ferroce::stack::wire::Opcode;

const FRAMES: u64 = 10_000;

fn run(model: &LinkModel) -> u64 {
    let mut b = FabricBuilder::new(42);
    b.rx_ring(1 << 16);
    let a = b.host("a", 1);
    let z = b.host("z", 1);
    let s = b.switch("s");
    b.link((a, 0), s, model.clone());
    b.link((z, 0), s, model.clone());
    let fabric = b.build().unwrap();
    let (mut tx, mut rx) = (fabric.port(a, 0), fabric.port(z, 0));
    let mut r = sample_repr(Opcode::RC_RDMA_WRITE_ONLY, SampleAddr::default(), 1024);
    r.eth.src = tx.mac();
    r.eth.dst = rx.mac();
    let frame = sample_frame(&r);
    let mut got = 0u64;
    for _ in 0..FRAMES / 64 {
        for _ in 0..64 {
            tx.tx(frame.len(), |b| b.copy_from_slice(&frame)).unwrap();
        }
        tx.flush();
        fabric.advance_to(fabric.now() + 10_000);
        got += rx.rx_burst(usize::MAX, |_| {}) as u64;
    }
    while fabric.step().is_some() {
        got += rx.rx_burst(usize::MAX, |_| {}) as u64;
    }
    got
}

fn bench(c: &mut Criterion) {
    let clean = LinkModel::new(100_000_000_000, 1_000);
    let mut impaired = clean.clone();
    impaired.loss = Loss::Bernoulli(0.01);
    impaired.duplicate = 0.01;
    impaired.reorder = 0.01;
    impaired.corrupt = 0.01;
    let mut g = c.benchmark_group("sim_fabric");
    g.throughput(Throughput::Elements(FRAMES));
    g.sample_size(20);
    g.bench_function("clean_1KiB_frames", |b| b.iter(|| run(&clean)));
    g.bench_function("impaired_1KiB_frames", |b| b.iter(|| run(&impaired)));
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
