//! The message table against what a hostile or lossy wire can do: reordering, duplicates,
//! late packets of every old generation, offsets and lengths past the receive, message ids
//! nobody posted. Nothing lands outside the posted receive's share of the region, and a chunk
//! completes exactly when all its packets arrived.

use proptest::prelude::*;

use super::*;
use crate::sdr::imm::SdrImm;

const MTU: u32 = 1024;

fn config() -> RecvConfig {
    RecvConfig {
        layout: ImmLayout::PAPER,
        mtu: MTU,
        chunk_packets: 4,
        max_message: 64 * 1024,
        slots: 4,
        generations: 2,
    }
}

fn imm(msg_id: u32, offset: u32) -> u32 {
    ImmLayout::PAPER
        .pack(SdrImm {
            msg_id,
            offset,
            user: 0,
        })
        .unwrap()
}

#[test]
fn packets_fill_chunks_and_the_message_in_order() {
    let mut t = RecvTable::new(config());
    // 10 packets (the last 512 bytes): chunks of 4, 4, 2.
    let h = t.post(9 * 1024 + 512).unwrap();
    assert_eq!((h.slot, h.generation, h.chunks()), (0, 0, 3));
    let mut completed = Vec::new();
    for off in 0..10 {
        let len = if off == 9 { 512 } else { MTU };
        match t.arrive(0, imm(0, off), len) {
            Arrival::Place { at, chunk, done } => {
                assert_eq!(at, u64::from(off) * 1024);
                completed.extend(chunk);
                assert_eq!(done, off == 9);
            }
            other => panic!("packet {off}: {other:?}"),
        }
    }
    assert_eq!(completed, [0, 1, 2]);
    assert!(h.is_complete());
    assert_eq!(h.bitmap(), [0b111]);
}

#[test]
fn duplicates_and_bad_packets_write_nothing() {
    let mut t = RecvTable::new(config());
    let h = t.post(4 * 1024).unwrap();
    assert!(matches!(t.arrive(0, imm(0, 1), MTU), Arrival::Place { .. }));
    assert_eq!(t.arrive(0, imm(0, 1), MTU), Arrival::Duplicate);
    // Past the message, and a short packet that is not the last.
    assert_eq!(t.arrive(0, imm(0, 4), MTU), Arrival::OutOfRange);
    assert_eq!(t.arrive(0, imm(0, (1 << 18) - 1), MTU), Arrival::OutOfRange);
    assert_eq!(t.arrive(0, imm(0, 2), 100), Arrival::OutOfRange);
    // Slots nobody posted, ids past the slots, and the wrong generation.
    assert_eq!(t.arrive(0, imm(1, 0), MTU), Arrival::Stale);
    assert_eq!(t.arrive(0, imm(1023, 0), MTU), Arrival::Stale);
    assert_eq!(t.arrive(1, imm(0, 0), MTU), Arrival::Stale);
    assert_eq!(h.bitmap(), [0]);
}

/// Message 0 completes early (the receiver gave up on it); messages 1..=4 fill the four
/// slots, so message 4 takes slot 0 in generation 1. Message 0's late packets, on the QP of
/// generation 0, find nothing, and message 4's bitmap stays its own.
#[test]
fn a_late_packet_of_an_old_generation_never_reaches_the_new_message() {
    let mut t = RecvTable::new(config());
    let old = t.post(8 * 1024).unwrap();
    assert!(matches!(t.arrive(0, imm(0, 0), MTU), Arrival::Place { .. }));
    assert!(t.complete(&old));
    assert!(!t.complete(&old));
    for _ in 1..4 {
        t.post(1024).unwrap();
    }
    let new = t.post(8 * 1024).unwrap();
    assert_eq!((new.message, new.slot, new.generation), (4, 0, 1));
    for off in 0..8 {
        assert_eq!(
            t.arrive(0, imm(0, off), MTU),
            Arrival::Stale,
            "late packet {off}"
        );
    }
    assert_eq!(new.bitmap(), [0]);
    assert!(matches!(
        t.arrive(1, imm(0, 3), MTU),
        Arrival::Place { at: 3072, .. }
    ));
    // All four slots are taken: a fifth receive waits for a completion.
    assert_eq!(t.post(1024).unwrap_err(), PostError::Full(4));
    assert!(matches!(t.post(1 << 20), Err(PostError::TooLong { .. })));
}

proptest! {
    /// Packets of three messages in any order, some lost, some twice: each lands once, in
    /// its message's share of the region, and a chunk is marked exactly when all of its
    /// packets arrived.
    #[test]
    fn chunks_complete_exactly_when_their_packets_arrived(
        lens in proptest::collection::vec(1u64..(24 * 1024), 3),
        order in proptest::collection::vec((0usize..3, 0u32..24, any::<bool>(), any::<bool>()), 0..200),
    ) {
        let c = config();
        let mut t = RecvTable::new(c);
        let hs: Vec<RecvHandle> = lens.iter().map(|&l| t.post(l).unwrap()).collect();
        let mut got = vec![std::collections::HashSet::new(); 3];
        for (m, off, lost, _) in &order {
            let h = &hs[*m];
            let packets = h.len.div_ceil(1024) as u32;
            if *lost || *off >= packets {
                continue;
            }
            let len = (h.len - u64::from(*off) * 1024).min(1024) as u32;
            match t.arrive(h.generation, imm(h.slot, *off), len) {
                Arrival::Place { at, .. } => {
                    prop_assert!(got[*m].insert(*off));
                    let base = u64::from(h.slot) * c.max_message;
                    prop_assert!(at >= base && at + u64::from(len) <= base + h.len);
                }
                Arrival::Duplicate => prop_assert!(got[*m].contains(off)),
                other => prop_assert!(false, "{:?}", other),
            }
        }
        for (m, h) in hs.iter().enumerate() {
            let packets = h.len.div_ceil(1024) as u32;
            for ch in 0..h.chunks() {
                let all = (ch * 4..((ch + 1) * 4).min(packets)).all(|p| got[m].contains(&p));
                prop_assert_eq!(h.has(ch), all);
            }
        }
    }
}

/// Each receive may have its own chunk size (the paper's `recv_post` takes one): the same
/// packets fill a 2-packet-chunk bitmap and a 5-packet-chunk one at their own pace.
#[test]
fn a_receive_can_have_its_own_chunk_size() {
    let mut t = RecvTable::new(RecvConfig {
        layout: ImmLayout::PAPER,
        mtu: 100,
        chunk_packets: 2,
        max_message: 10_000,
        slots: 2,
        generations: 1,
    });
    let a = t.post(1000).unwrap();
    let b = t.post_chunked(1000, 5).unwrap();
    assert_eq!((a.chunks(), a.chunk_packets()), (5, 2));
    assert_eq!((b.chunks(), b.chunk_packets()), (2, 5));
    for offset in 0..5u32 {
        for h in [&a, &b] {
            let imm = ImmLayout::PAPER
                .pack(SdrImm {
                    msg_id: h.slot,
                    offset,
                    user: 0,
                })
                .unwrap();
            assert!(matches!(t.arrive(0, imm, 100), Arrival::Place { .. }));
        }
    }
    // Five packets: two and a half of a's chunks, one of b's.
    assert_eq!(a.bitmap(), [0b11]);
    assert_eq!(b.bitmap(), [0b1]);
}
