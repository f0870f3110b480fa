//! SDR through the transport, one core, no fabric (issue 21, item 7):
//!
//! - `sdr_rx/64B`: the receive side's whole per-packet work for 64 B packets — frame parse
//!   (ICRC included), the UC responder, the sink (generation, slot, offset and RETH checks),
//!   the payload placed through the slotted region, packet and chunk bitmaps. Target
//!   ≥ 10 M packets/s.
//! - `sdr_send_16MiB` against `uc_write_16MiB`: a one-shot SDR send of 16 MiB at 4 KiB MTU
//!   (one WRITE-with-immediate work request per packet, placed by the receiver's sink)
//!   against one plain UC WRITE of the same 16 MiB, both ends in memory. Target ≥ 0.8×.
//! - `ec_send_encode_2MiB` against `ec_raw_encode_2MiB`: EC(32, 8) with 64 KiB chunks, the
//!   sender handing out one submessage (encoding its parity from registered memory on the
//!   way) against the codec encoding the same bytes in place. Target ≥ 0.9×.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use ferroce::reliability::sdr::ack::Ack;
use ferroce::reliability::sdr::codec;
use ferroce::reliability::sdr::imm::ImmLayout;
use ferroce::reliability::sdr::model::{Code, Scheme};
use ferroce::reliability::sdr::receiver::{Buffer, SdrReceiver};
use ferroce::reliability::sdr::recv::RecvConfig;
use ferroce::reliability::sdr::reliable::{ReliableConfig, ReliableSender, TableMemory};
use ferroce::stack::transport::loopback::{connect, drain_frames, Loopback};
use ferroce::stack::transport::{
    Access, MrTable, Mtu, Payload, PdId, Qp, QpAttr, QpCaps, QpConfig, QpType, SendFlags, SendWr,
    Sge, WrOpcode,
};
use ferroce::stack::wire::{Checks, Qpn, RoceRepr};

const PD: PdId = PdId(1);
const RW: Access = Access::LOCAL_WRITE.with(Access::REMOTE_WRITE);

fn uc_pair(mtu: Mtu) -> (Qp, Qp) {
    let caps = QpCaps {
        max_send_wr: 8192,
        ..QpCaps::default()
    };
    let mk = |n| {
        let mut c = QpConfig::new(Qpn::new(n), QpType::Uc, PD);
        c.caps = caps;
        Qp::new(c)
    };
    let (mut a, mut b) = (mk(0x10), mk(0x20));
    let attr = QpAttr {
        path_mtu: mtu,
        qp_access_flags: Access::REMOTE_WRITE,
        ..QpAttr::default()
    };
    connect(&mut a, &mut b, &attr).unwrap();
    (a, b)
}

fn layout(mtu: u32, chunk_packets: u32, max_message: u64) -> RecvConfig {
    RecvConfig {
        layout: ImmLayout::PAPER,
        mtu,
        chunk_packets,
        max_message,
        // One slot and one generation: every message reuses the frames of the first.
        slots: 1,
        generations: 1,
    }
}

fn rx_path(c: &mut Criterion) {
    const PACKETS: u64 = 4096;
    let l = layout(64, 64, 64 * PACKETS);
    let (mut a, mut b) = uc_pair(Mtu::Mtu256);
    let (mut ma, mut mb) = (MrTable::new(1), MrTable::new(2));
    let src = ma
        .register_owned_at(PD, (64 * PACKETS) as usize, 0, RW)
        .unwrap();
    let dst = mb
        .register_owned_at(PD, (64 * PACKETS) as usize, 0, RW)
        .unwrap();
    let rx = SdrReceiver::new(l, &mut mb, PD).unwrap();
    b.set_write_imm_sink(Some(rx.sink(0))).unwrap();
    let mut tx = ReliableSender::new(l, ReliableConfig::new(Scheme::SR_RTO, 1_000_000)).unwrap();
    let buf = |k: u32| Buffer { lkey: k, va: 0 };
    tx.send(buf(src.lkey), 64 * PACKETS, None, None).unwrap();
    let mem = TableMemory { mem: &ma, pd: PD };
    while let Some(chunk) = tx.poll_transmit(0, &mem) {
        for i in 0..chunk.packets.len() {
            let sge = chunk.sge(i);
            a.post_send(&chunk.write(i, &sge, rx.region().rkey, 0, false))
                .unwrap();
        }
    }
    let frames = drain_frames(&mut a, &ma, 0);
    assert_eq!(frames.len() as u64, PACKETS);
    let mut g = c.benchmark_group("sdr_rx");
    g.throughput(Throughput::Elements(PACKETS));
    let mut h = rx.post(buf(dst.lkey), 64 * PACKETS).unwrap();
    g.bench_function("64B", |bench| {
        bench.iter(|| {
            for f in &frames {
                let pkt = RoceRepr::parse(f, Checks::ALL).unwrap();
                b.handle_packet(0, &pkt, &mut mb);
            }
            assert!(h.is_complete());
            rx.complete(&h);
            h = rx.post(buf(dst.lkey), 64 * PACKETS).unwrap();
        })
    });
    g.finish();
}

fn send_16mib(c: &mut Criterion) {
    const LEN: u64 = 16 << 20;
    let l = layout(4096, 16, LEN);
    let mut g = c.benchmark_group("sdr_vs_uc_4KiB_mtu");
    g.throughput(Throughput::Bytes(LEN));
    g.sample_size(20);
    {
        let (a, b) = uc_pair(Mtu::Mtu4096);
        let (mut ma, mut mb) = (MrTable::new(1), MrTable::new(2));
        let src = ma.register_owned_at(PD, LEN as usize, 0, RW).unwrap();
        let dst = mb.register_owned_at(PD, LEN as usize, 0, RW).unwrap();
        ma.write(src.lkey, PD, 0, &vec![0x5a; LEN as usize], Access::NONE)
            .unwrap();
        let mut lo = Loopback::new(a, b, ma, mb);
        g.bench_function("uc_write_16MiB", |bench| {
            bench.iter(|| {
                let sge = [Sge {
                    addr: 0,
                    length: LEN as u32,
                    lkey: src.lkey,
                }];
                let wr = SendWr::new(1, WrOpcode::Write, Payload::Sges(&sge))
                    .remote(0, dst.rkey)
                    .flags(SendFlags(0));
                lo.a.post_send(&wr).unwrap();
                lo.run();
            })
        });
    }
    {
        let (a, mut b) = uc_pair(Mtu::Mtu4096);
        let (mut ma, mut mb) = (MrTable::new(1), MrTable::new(2));
        let src = ma.register_owned_at(PD, LEN as usize, 0, RW).unwrap();
        let dst = mb.register_owned_at(PD, LEN as usize, 0, RW).unwrap();
        ma.write(src.lkey, PD, 0, &vec![0x5a; LEN as usize], Access::NONE)
            .unwrap();
        let rx = SdrReceiver::new(l, &mut mb, PD).unwrap();
        b.set_write_imm_sink(Some(rx.sink(0))).unwrap();
        let region = rx.region().rkey;
        let mut lo = Loopback::new(a, b, ma, mb);
        let cfg = ReliableConfig::new(Scheme::SR_RTO, 1_000_000);
        let mut tx = ReliableSender::new(l, cfg).unwrap();
        let buf = |k: u32| Buffer { lkey: k, va: 0 };
        g.bench_function("sdr_send_16MiB", |bench| {
            bench.iter(|| {
                let h = rx.post(buf(dst.lkey), LEN).unwrap();
                tx.send(buf(src.lkey), LEN, None, None).unwrap();
                loop {
                    let mem = TableMemory {
                        mem: &lo.mem_a,
                        pd: PD,
                    };
                    let Some(chunk) = tx.poll_transmit(0, &mem) else {
                        break;
                    };
                    for i in 0..chunk.packets.len() {
                        let sge = chunk.sge(i);
                        lo.a.post_send(&chunk.write(i, &sge, region, 0, false))
                            .unwrap();
                    }
                    // Move what was posted, as a driver keeps a few chunks ahead.
                    if lo.a.send_queue_len() >= 64 {
                        lo.run();
                    }
                }
                lo.run();
                assert!(h.is_complete());
                rx.complete(&h);
                // The acknowledgement that completes it (no control channel here).
                let chunks = LEN.div_ceil(64 * 1024) as u32;
                let ack = Ack {
                    message: h.message,
                    chunks,
                    cumulative: chunks,
                    complete: true,
                    done_below: h.message + 1,
                    ..Ack::default()
                };
                tx.on_control(0, &ack.encode(4096));
                assert!(tx.poll_done().is_some());
            })
        });
    }
    g.finish();
}

fn ec_encode(c: &mut Criterion) {
    const CHUNK: u64 = 64 * 1024;
    const LEN: u64 = 32 * CHUNK;
    let l = layout(4096, 16, LEN);
    let mut g = c.benchmark_group("sdr_ec_32_8_64KiB");
    g.throughput(Throughput::Bytes(LEN));
    g.sample_size(20);
    let mut codec = codec::mds(32, 8).unwrap();
    let mut chunks: Vec<Vec<u8>> = (0..40)
        .map(|i| (0..CHUNK).map(|j| (i * 31 + j * 7) as u8).collect())
        .collect();
    g.bench_function("ec_raw_encode_2MiB", |bench| {
        bench.iter(|| {
            let (data, parity) = chunks.split_at_mut(32);
            let d: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
            let mut p: Vec<&mut [u8]> = parity.iter_mut().map(Vec::as_mut_slice).collect();
            codec.encode(&d, &mut p).unwrap();
        })
    });
    let mut mem = MrTable::new(1);
    let src = mem.register_owned_at(PD, LEN as usize, 0, RW).unwrap();
    let par = mem
        .register_owned_at(PD, (8 * CHUNK) as usize, 0, RW)
        .unwrap();
    let data: Vec<u8> = (0..LEN).map(|j| (j * 7) as u8).collect();
    mem.write(src.lkey, PD, 0, &data, Access::NONE).unwrap();
    let cfg = ReliableConfig::new(
        Scheme::Ec {
            code: Code::Mds,
            k: 32,
            m: 8,
            beta: 1.0,
        },
        1_000_000,
    );
    let mut tx = ReliableSender::new(l, cfg).unwrap();
    // Data and parity messages alternate: data messages are the even ones.
    let mut message = 0u64;
    g.bench_function("ec_send_encode_2MiB", |bench| {
        bench.iter(|| {
            let m = TableMemory { mem: &mem, pd: PD };
            tx.send(
                Buffer {
                    lkey: src.lkey,
                    va: 0,
                },
                LEN,
                None,
                Some(Buffer {
                    lkey: par.lkey,
                    va: 0,
                }),
            )
            .unwrap();
            let mut n = 0;
            while let Some(chunk) = tx.poll_transmit(0, &m) {
                n += chunk.packets.len();
            }
            assert_eq!(n, 40 * 16);
            // Done, so the sender holds one message at a time.
            let ack = Ack {
                message,
                chunks: 32,
                cumulative: 32,
                complete: true,
                done_below: message + 2,
                ..Ack::default()
            };
            message += 2;
            tx.on_control(0, &ack.encode(4096));
            assert!(tx.poll_done().is_some());
        })
    });
    g.finish();
}

criterion_group!(benches, rx_path, send_16mib, ec_encode);
criterion_main!(benches);
