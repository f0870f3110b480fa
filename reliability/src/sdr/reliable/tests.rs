//! Reliable SDR end to end, sans-IO: a sender and a receiver joined by a lossy, duplicating,
//! reordering wire in virtual time, the receiver's packets placed through its
//! [`SdrReceiver`] into a real [`MrTable`].

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use ferroce_stack::transport::{Access, MrKeys, MrTable, PdId};
use ferroce_stack::wire::RethRepr;
use proptest::prelude::*;

use super::super::imm::ImmLayout;
use super::super::model::{Code, Scheme};
use super::super::receiver::{Buffer, SdrReceiver};
use super::super::recv::RecvConfig;
use super::*;

const PD: PdId = PdId(1);
const MTU: u32 = 256;
const CHUNK_PACKETS: u32 = 2;
const RTT: u64 = 100_000;

/// The wire's misbehaviour, per packet (and per acknowledgement for `ack_loss`).
#[derive(Clone, Copy, Debug)]
struct Wire {
    loss: f64,
    duplicate: f64,
    reorder: f64,
    ack_loss: f64,
}

enum Item {
    Packet {
        generation: u8,
        reth: RethRepr,
        imm: u32,
        payload: Vec<u8>,
    },
    Ack(Vec<u8>),
}

/// The model's seeded generator (SplitMix64), so a failing case replays.
use super::super::model::Rng;

fn chance(rng: &mut Rng, p: f64) -> bool {
    rng.unit() <= p && p > 0.0
}

fn layout() -> RecvConfig {
    RecvConfig {
        layout: ImmLayout::PAPER,
        mtu: MTU,
        chunk_packets: CHUNK_PACKETS,
        max_message: 64 * 1024,
        slots: 4,
        generations: 2,
    }
}

struct Run {
    /// Message bytes, as sent and as received.
    sent: Vec<Vec<u8>>,
    got: Vec<Vec<u8>>,
    sender: SenderStats,
    receiver: ReceiverStats,
}

/// Sends `lens` one after another (each posted at the receiver before it is sent) over
/// `wire` with `scheme`; returns what arrived. Panics (with the seed) if a message never
/// completes within a generous horizon.
fn run(scheme: Scheme, lens: &[u64], wire: Wire, seed: u64) -> Run {
    run_with(ReliableConfig::new(scheme, RTT), lens, wire, seed)
}

fn run_with(cfg: ReliableConfig, lens: &[u64], wire: Wire, seed: u64) -> Run {
    run_full(cfg, lens, wire, seed, false)
}

/// With `streaming`, each message is a streaming send whose chunks are added last first,
/// the first one twice.
fn run_full(cfg: ReliableConfig, lens: &[u64], wire: Wire, seed: u64, streaming: bool) -> Run {
    let mut rng = Rng(seed);
    let scheme = cfg.scheme;
    let (mut txm, mut rxm) = (MrTable::new(1), MrTable::new(2));
    let all = Access::LOCAL_WRITE.with(Access::REMOTE_WRITE);
    let (src, _) = txm.register_owned(PD, 64 * 1024, all).unwrap();
    let (tpar, _) = txm.register_owned(PD, 64 * 1024, all).unwrap();
    let (dst, _) = rxm.register_owned(PD, 64 * 1024, all).unwrap();
    let (rpar, _) = rxm.register_owned(PD, 64 * 1024, all).unwrap();
    let buf = |m: &MrTable, k: MrKeys| Buffer {
        lkey: k.lkey,
        va: m.extent(k.lkey).unwrap().0 as u64,
    };
    let (src_b, tpar_b, dst_b, rpar_b) = (
        buf(&txm, src),
        buf(&txm, tpar),
        buf(&rxm, dst),
        buf(&rxm, rpar),
    );
    let sdr = SdrReceiver::new(layout(), &mut rxm, PD).unwrap();
    let region = sdr.region();
    let mut rx = ReliableReceiver::new(sdr.clone(), cfg).unwrap();
    let mut tx = ReliableSender::new(layout(), cfg).unwrap();
    let mut wire_q: BinaryHeap<Reverse<(u64, u64, usize)>> = BinaryHeap::new();
    let mut items: Vec<Option<Item>> = Vec::new();
    let mut out = Run {
        sent: Vec::new(),
        got: Vec::new(),
        sender: SenderStats::default(),
        receiver: ReceiverStats::default(),
    };
    let mut now = 0u64;
    let mut order = 0u64;
    for (n, &len) in lens.iter().enumerate() {
        let data: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        txm.write(src.lkey, PD, src_b.va, &data, Access::NONE)
            .unwrap();
        rxm.write(dst.lkey, PD, dst_b.va, &vec![0; len as usize], Access::NONE)
            .unwrap();
        let user = rx.post(dst_b, len, Some(rpar_b)).unwrap();
        assert_eq!(user, n as u64);
        if streaming {
            let m = tx.send_streaming(src_b, len, Some(0x1234_5678)).unwrap();
            let chunks = len.div_ceil(u64::from(MTU * CHUNK_PACKETS)) as u32;
            for c in (0..chunks).rev().chain([0]) {
                tx.stream_chunk(m, c).unwrap();
            }
            assert!(tx.stream_chunk(m, chunks).is_err());
        } else {
            tx.send(src_b, len, Some(0x1234_5678), Some(tpar_b))
                .unwrap();
        }
        let horizon = now + 2_000 * RTT;
        loop {
            assert!(now < horizon, "seed {seed}: message {n} stuck");
            if tx.poll_timeout().is_some_and(|t| t <= now) {
                tx.handle_timeout(now);
            }
            // One chunk's packets at a time, a packet per 100 ns.
            if let Some(c) = tx.poll_transmit(now, &TableMemory { mem: &txm, pd: PD }) {
                for p in &c.packets {
                    now += 100;
                    let mut payload = vec![0; p.len as usize];
                    txm.read(
                        c.source.lkey,
                        PD,
                        c.source.va + p.local,
                        &mut payload,
                        Access::NONE,
                    )
                    .unwrap();
                    let copies = if chance(&mut rng, wire.loss) {
                        0
                    } else if chance(&mut rng, wire.duplicate) {
                        2
                    } else {
                        1
                    };
                    for _ in 0..copies {
                        let late = if chance(&mut rng, wire.reorder) {
                            RTT / 20
                        } else {
                            0
                        };
                        items.push(Some(Item::Packet {
                            generation: p.generation,
                            reth: RethRepr {
                                va: p.remote,
                                rkey: region.rkey,
                                dma_len: p.len,
                            },
                            imm: p.imm,
                            payload: payload.clone(),
                        }));
                        order += 1;
                        wire_q.push(Reverse((now + RTT / 2 + late, order, items.len() - 1)));
                    }
                }
                continue;
            }
            while let Some(&Reverse((t, _, i))) = wire_q.peek() {
                if t > now {
                    break;
                }
                wire_q.pop();
                match items[i].take() {
                    Some(Item::Packet {
                        generation,
                        reth,
                        imm,
                        payload,
                    }) => {
                        sdr.on_packet(generation, reth, imm, &payload, PD, &rxm);
                    }
                    Some(Item::Ack(b)) => tx.on_control(t, &b),
                    None => {}
                }
            }
            rx.poll(now, &TableMemory { mem: &rxm, pd: PD });
            while let Some(a) = rx.poll_control(now) {
                if !chance(&mut rng, wire.ack_loss) {
                    items.push(Some(Item::Ack(a)));
                    order += 1;
                    wire_q.push(Reverse((now + RTT / 2, order, items.len() - 1)));
                }
            }
            if let Some(d) = tx.poll_done() {
                assert_eq!(d.message, n as u64);
                break;
            }
            // Time moves to the next thing that happens.
            let next = [
                wire_q.peek().map(|r| r.0 .0),
                tx.poll_timeout(),
                rx.poll_timeout(),
            ]
            .into_iter()
            .flatten()
            .min();
            now = next.map_or(now + 1000, |t| t.max(now + 1));
        }
        assert!(
            rx.is_complete(n as u64),
            "seed {seed}: acknowledged means whole"
        );
        let mut got = vec![0; len as usize];
        rxm.read(dst.lkey, PD, dst_b.va, &mut got, Access::NONE)
            .unwrap();
        // SR delivers every packet, so every fragment; EC may have rebuilt all packets of
        // one fragment, and then has none — but never a wrong one.
        let imm = rx.imm(n as u64);
        if len >= u64::from(MTU) * 8 && scheme.name().starts_with("sr") && cfg.auto_gbps.is_none() {
            assert_eq!(imm, Some(0x1234_5678), "seed {seed}");
        }
        assert!(imm.is_none_or(|i| i == 0x1234_5678), "seed {seed}");
        assert!(rx.complete(n as u64));
        out.sent.push(data);
        out.got.push(got);
    }
    out.sender = tx.stats();
    out.receiver = rx.stats();
    out
}

const CLEAN: Wire = Wire {
    loss: 0.0,
    duplicate: 0.0,
    reorder: 0.0,
    ack_loss: 0.0,
};

fn schemes() -> [Scheme; 4] {
    [
        Scheme::SR_RTO,
        Scheme::SrNack,
        Scheme::Ec {
            code: Code::Mds,
            k: 4,
            m: 2,
            beta: 1.0,
        },
        Scheme::Ec {
            code: Code::Xor,
            k: 4,
            m: 2,
            beta: 1.0,
        },
    ]
}

#[test]
fn a_clean_wire_sends_each_chunk_once() {
    for s in schemes() {
        let r = run(s, &[10_000, 777, 20_000], CLEAN, 1);
        assert_eq!(r.sent, r.got, "{}", s.name());
        assert_eq!(r.sender.chunks_resent, 0, "{}", s.name());
        assert_eq!(r.sender.chunks_sent, 20 + 2 + 40, "{}", s.name());
        assert_eq!(r.receiver.messages_complete, 3);
    }
}

#[test]
fn losses_are_repaired_by_each_scheme_its_own_way() {
    let wire = Wire {
        loss: 0.02,
        ..CLEAN
    };
    let lens = [30_000, 30_000, 30_000, 30_000];
    let rto = run(Scheme::SR_RTO, &lens, wire, 7);
    assert_eq!(rto.sent, rto.got);
    assert!(rto.sender.timeouts > 0 && rto.sender.nack_losses == 0);
    let nack = run(Scheme::SrNack, &lens, wire, 7);
    assert_eq!(nack.sent, nack.got);
    assert!(nack.sender.nack_losses > 0, "{:?}", nack.sender);
    let ec = run(schemes()[2], &lens, wire, 7);
    assert_eq!(ec.sent, ec.got);
    assert!(ec.receiver.chunks_rebuilt > 0, "{:?}", ec.receiver);
    assert!(
        ec.sender.chunks_resent < rto.sender.chunks_resent,
        "EC repairs most losses without resending"
    );
}

#[test]
fn ec_falls_back_to_selective_repeat_when_a_submessage_cannot_decode() {
    // 30 % loss: many submessages lose more than their two parity chunks cover.
    let wire = Wire { loss: 0.3, ..CLEAN };
    for s in &schemes()[2..] {
        let r = run(*s, &[30_000], wire, 3);
        assert_eq!(r.sent, r.got, "{}", s.name());
        assert!(r.sender.fallbacks > 0, "{}: {:?}", s.name(), r.sender);
    }
}

/// A streaming send: chunks added in any order (one twice, as an application's own resend)
/// arrive where they belong and the message completes; EC refuses to stream.
#[test]
fn a_streaming_send_lands_its_chunks_in_any_order() {
    let wire = Wire {
        loss: 0.05,
        ..CLEAN
    };
    for s in [Scheme::SR_RTO, Scheme::SrNack] {
        let r = run_full(ReliableConfig::new(s, RTT), &[9_000, 30_000], wire, 4, true);
        assert_eq!(r.sent, r.got, "{}", s.name());
        assert!(
            r.sender.chunks_resent >= 2,
            "the chunk added twice: {:?}",
            r.sender
        );
    }
    let mut ec = ReliableSender::new(layout(), ReliableConfig::new(schemes()[2], RTT)).unwrap();
    let b = Buffer { lkey: 1, va: 0 };
    assert_eq!(
        ec.send_streaming(b, 1000, None),
        Err(sender::SendError::StreamingNeedsSr)
    );
}

/// The automatic choice sends SR while nothing is lost and turns to EC once losses show;
/// every message arrives whole either way.
#[test]
fn auto_turns_to_ec_when_losses_show() {
    let cfg = ReliableConfig::auto(schemes()[2], RTT, 20.0);
    let clean = run_with(cfg, &[30_000; 3], CLEAN, 5);
    assert_eq!(clean.sent, clean.got);
    assert_eq!(clean.sender.parity_sent, 0, "no loss: SR throughout");
    let lossy = run_with(
        cfg,
        &[30_000; 6],
        Wire {
            loss: 0.05,
            ..CLEAN
        },
        5,
    );
    assert_eq!(lossy.sent, lossy.got);
    assert!(lossy.sender.parity_sent > 0, "{:?}", lossy.sender);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Whatever the wire does — loss, duplicates, reordering, lost acknowledgements — every
    /// message completes equal to what was sent, under every scheme.
    #[test]
    fn every_completed_message_equals_what_was_sent(
        seed: u64,
        scheme in 0usize..5,
        lens in proptest::collection::vec(1u64..40_000, 1..4),
        loss in 0.0f64..0.15,
        duplicate in 0.0f64..0.1,
        reorder in 0.0f64..0.1,
        ack_loss in 0.0f64..0.3,
    ) {
        let wire = Wire { loss, duplicate, reorder, ack_loss };
        // Scheme 4: the automatic choice between SR and EC(4, 2).
        let cfg = match scheme {
            4 => ReliableConfig::auto(schemes()[2], RTT, 20.0),
            s => ReliableConfig::new(schemes()[s], RTT),
        };
        let r = run_with(cfg, &lens, wire, seed);
        prop_assert_eq!(r.sent, r.got, "seed {}", seed);
    }
}
