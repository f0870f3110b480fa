//! SDR's erasure codecs on the paper's configuration, (32, 8) with 64 KiB chunks: encoding a
//! submessage, and rebuilding it with 1 to 8 data chunks lost (XOR: one per modulo group, all
//! it can rebuild); `--features isal` adds the system ISA-L. Throughput is data bytes per second (32 × 64 KiB per operation). The
//! issue's reference figures on this machine: ISA-L 2.30 encodes (32, 8) at about 6.5 GB/s,
//! reed-solomon-simd at about 8.7 GB/s and decodes at about 1.6 GB/s; reed-solomon-erasure
//! encodes at about 0.42 GB/s. docs/benchmarks.md keeps the table.
//!
//! Beside them, the receive side's per-packet bookkeeping (`RecvTable::arrive`: immediate,
//! slot and generation, offset and length checks, packet and chunk bitmaps) for 64 B packets,
//! against the target of 10 M packets/s on one core.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use ferroce::reliability::sdr::codec::{ErasureCodec, RsErasure, RsSimd, Xor};
use ferroce::reliability::sdr::recv::{Arrival, RecvConfig, RecvTable};
use ferroce::reliability::sdr::{ImmLayout, SdrImm};

const K: usize = 32;
const M: usize = 8;
const CHUNK: usize = 64 * 1024;

fn codecs() -> Vec<Box<dyn ErasureCodec>> {
    #[allow(unused_mut)]
    let mut v: Vec<Box<dyn ErasureCodec>> = vec![
        Box::new(RsSimd::new(K, M).unwrap()),
        Box::new(RsErasure::new(K, M).unwrap()),
        Box::new(Xor::new(K, M).unwrap()),
    ];
    // The system ISA-L, with `--features isal` (libisal-dev).
    #[cfg(feature = "isal")]
    v.push(Box::new(ferroce::isal::IsaL::new(K, M).unwrap()));
    v
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
        for lost in 1usize..=M {
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

/// 64 B packets of 4096-packet messages into a table of 16 slots: each iteration posts a
/// message, feeds all its packets, completes it.
fn receive(c: &mut Criterion) {
    const PACKETS: u32 = 4096;
    let config = RecvConfig {
        layout: ImmLayout::PAPER,
        mtu: 64,
        chunk_packets: 16,
        max_message: u64::from(PACKETS) * 64,
        slots: 16,
        generations: 4,
    };
    let mut t = RecvTable::new(config);
    let mut g = c.benchmark_group("sdr_receive_64B");
    g.throughput(Throughput::Elements(u64::from(PACKETS)));
    g.bench_function("arrive", |b| {
        b.iter(|| {
            let h = t.post(u64::from(PACKETS) * 64).unwrap();
            let mut placed = 0u32;
            for offset in 0..PACKETS {
                let imm = ImmLayout::PAPER
                    .pack(SdrImm {
                        msg_id: h.slot,
                        offset,
                        user: 0,
                    })
                    .unwrap();
                if let Arrival::Place { .. } = t.arrive(h.generation, imm, 64) {
                    placed += 1;
                }
            }
            assert!(t.complete(&h));
            placed
        })
    });
    g.finish();
}

criterion_group!(benches, bench, receive);
criterion_main!(benches);
