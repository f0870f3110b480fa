//! SDR's erasure codecs on the paper's configuration, (32, 8) with 64 KiB chunks: encoding a
//! submessage, and rebuilding it with 1 to 8 data chunks lost (XOR: one per modulo group, all
//! it can rebuild). Throughput is data bytes per second (32 × 64 KiB per operation). The
//! issue's reference figures on this machine: ISA-L 2.30 encodes (32, 8) at about 6.5 GB/s,
//! reed-solomon-simd at about 8.7 GB/s and decodes at about 1.6 GB/s; reed-solomon-erasure
//! encodes at about 0.42 GB/s. docs/benchmarks.md keeps the table.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use ferroce::reliability::sdr::codec::{ErasureCodec, RsErasure, RsSimd, Xor};

const K: usize = 32;
const M: usize = 8;
const CHUNK: usize = 64 * 1024;

fn codecs() -> Vec<Box<dyn ErasureCodec>> {
    vec![
        Box::new(RsSimd::new(K, M).unwrap()),
        Box::new(RsErasure::new(K, M).unwrap()),
        Box::new(Xor::new(K, M).unwrap()),
    ]
}

fn bench(c: &mut Criterion) {
    let mut chunks: Vec<Vec<u8>> = (0..K + M)
        .map(|i| (0..CHUNK).map(|j| (i * 31 + j * 7) as u8).collect())
        .collect();
    let mut g = c.benchmark_group("sdr_codec_32_8_64KiB");
    g.throughput(Throughput::Bytes((K * CHUNK) as u64));
    g.sample_size(20);
    for mut codec in codecs() {
        let name = codec.name();
        g.bench_function(BenchmarkId::new(name, "encode"), |b| {
            b.iter(|| {
                let (data, parity) = chunks.split_at_mut(K);
                let d: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
                let mut p: Vec<&mut [u8]> = parity.iter_mut().map(Vec::as_mut_slice).collect();
                codec.encode(&d, &mut p).unwrap();
            })
        });
        for lost in [1usize, 2, 4, 8] {
            // Data chunks 0, 1, .. lost-1: one per XOR group, the worst case for RS.
            let mut present = vec![true; K + M];
            for p in present.iter_mut().take(lost) {
                *p = false;
            }
            g.bench_function(BenchmarkId::new(name, format!("decode_{lost}_lost")), |b| {
                b.iter(|| {
                    let mut all: Vec<&mut [u8]> =
                        chunks.iter_mut().map(Vec::as_mut_slice).collect();
                    codec.reconstruct(&mut all, &present).unwrap();
                })
            });
        }
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
