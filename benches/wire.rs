//! Wire-format costs on an RC WRITE_ONLY frame with 64 B and 4 KiB payloads: header parse and
//! checks without the ICRC, the ICRC alone, full parse with ICRC, and emit with ICRC.
//! Targets (issue 2, this 2-core machine): headers of a 64 B frame <= 30 ns; ICRC of a 64 B
//! frame <= 15 ns and >= 30 GB/s on 4 KiB.

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use ferroce::stack::wire::sample::{sample_frame, sample_repr, SampleAddr};
use ferroce::stack::wire::{icrc, Checks, Opcode, RoceRepr};

fn bench(c: &mut Criterion) {
    for payload in [64usize, 4096] {
        let repr = sample_repr(Opcode::RC_RDMA_WRITE_ONLY, SampleAddr::default(), payload);
        let frame = sample_frame(&repr);
        // The ICRC input: the last 8 bytes of the Ethernet header (the LRH stand-in) + IP..pad.
        let covered = &frame[14 - icrc::LRH_STAND_IN..frame.len() - 4];
        let data = vec![0x5au8; payload];
        let mut g = c.benchmark_group(format!("write_only_{payload}B"));
        g.throughput(Throughput::Bytes(covered.len() as u64));
        let headers_only = Checks {
            icrc: false,
            ipv4_checksum: true,
        };
        g.bench_function("parse_headers_no_icrc", |b| {
            b.iter(|| {
                RoceRepr::parse(black_box(&frame), headers_only)
                    .unwrap()
                    .repr
                    .bth
                    .psn
            })
        });
        g.bench_function("icrc", |b| b.iter(|| icrc::compute(black_box(covered), 4)));
        g.bench_function("parse_with_icrc", |b| {
            b.iter(|| {
                RoceRepr::parse(black_box(&frame), Checks::ALL)
                    .unwrap()
                    .repr
                    .bth
                    .psn
            })
        });
        let mut buf = vec![0u8; frame.len()];
        g.bench_function("emit_with_icrc", |b| {
            b.iter(|| black_box(&repr).emit_with_payload(&mut buf, &data).unwrap())
        });
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
