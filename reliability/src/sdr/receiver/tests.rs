//! Adversarial input at the receive side (issue 21, item 8): every packet a hostile or
//! confused peer could send, through the sink's entry point into a real [`MrTable`] whose
//! posted buffer sits between guard bytes. Nothing outside the posted receive is written,
//! the counters name every drop, and nothing panics.

use ferroce_stack::transport::{Access, MrKeys, MrTable, PdId, Sunk};
use ferroce_stack::wire::RethRepr;

use super::super::imm::{ImmLayout, SdrImm};
use super::super::model::{Code, Scheme};
use super::super::recv::RecvConfig;
use super::super::reliable::{ReliableConfig, ReliableReceiver, TableMemory};
use super::super::send::{Packet, SendTable};
use super::*;

const PD: PdId = PdId(1);
const GUARD: u64 = 16 * 1024;

fn config() -> RecvConfig {
    RecvConfig {
        layout: ImmLayout::PAPER,
        mtu: 1024,
        chunk_packets: 2,
        max_message: 16 * 1024,
        slots: 2,
        generations: 2,
    }
}

struct Rig {
    mem: MrTable,
    keys: MrKeys,
    base: u64,
    rx: SdrReceiver,
    tx: SendTable,
}

impl Rig {
    /// A receiver whose memory is guard, receive buffer (16 KiB at `GUARD`), guard.
    fn new() -> Self {
        let mut mem = MrTable::new(5);
        let (keys, base) = mem
            .register_owned(PD, 3 * GUARD as usize, Access::LOCAL_WRITE)
            .unwrap();
        let rx = SdrReceiver::new(config(), &mut mem, PD).unwrap();
        Self {
            mem,
            keys,
            base,
            rx,
            tx: SendTable::new(config()),
        }
    }

    fn buffer(&self) -> Buffer {
        Buffer {
            lkey: self.keys.lkey,
            va: self.base + GUARD,
        }
    }

    fn deliver(&self, p: &Packet, reth: Option<RethRepr>, byte: u8) -> Sunk {
        let reth = reth.unwrap_or(RethRepr {
            va: p.remote,
            rkey: self.rx.region().rkey,
            dma_len: p.len,
        });
        let payload = vec![byte; p.len as usize];
        self.rx
            .on_packet(p.generation, reth, p.imm, &payload, PD, &self.mem)
    }

    fn bytes(&self) -> Vec<u8> {
        let mut b = vec![0; 3 * GUARD as usize];
        self.mem
            .read(self.keys.lkey, PD, self.base, &mut b, Access::NONE)
            .unwrap();
        b
    }

    /// Nothing but `[GUARD, GUARD + len)` was ever written.
    fn guards_clean(&self, len: u64) {
        let b = self.bytes();
        let outside = b[..GUARD as usize]
            .iter()
            .chain(&b[(GUARD + len) as usize..])
            .filter(|&&x| x != 0)
            .count();
        assert_eq!(outside, 0, "bytes written outside the posted receive");
    }
}

#[test]
fn forged_stale_duplicate_and_out_of_range_packets_write_nothing_outside_the_receive() {
    let r = Rig::new();
    let len = 10_000u64;
    let h = r.rx.post(r.buffer(), len).unwrap();
    let mut tx = SendTable::new(config());
    let s = tx.send(len, Some(7)).unwrap();
    let packets: Vec<Packet> = tx.packets(&s).collect();
    let region = r.rx.region();
    let first = packets[0];
    // Forged: the RETH names another place than the immediate, another key, another length.
    for reth in [
        RethRepr {
            va: first.remote + 1024,
            rkey: region.rkey,
            dma_len: first.len,
        },
        RethRepr {
            va: r.base,
            rkey: r.keys.rkey,
            dma_len: first.len,
        },
        RethRepr {
            va: first.remote,
            rkey: region.rkey,
            dma_len: first.len - 1,
        },
    ] {
        assert_eq!(r.deliver(&first, Some(reth), 0xee), Sunk::Dropped);
    }
    // An immediate naming an empty slot, an offset past the message, the other generation.
    let l = config().layout;
    let forged = |msg_id, offset, generation| Packet {
        imm: l
            .pack(SdrImm {
                msg_id,
                offset,
                user: 0,
            })
            .unwrap(),
        generation,
        remote: u64::from(msg_id) * 16 * 1024 + u64::from(offset) * 1024,
        ..first
    };
    assert_eq!(r.deliver(&forged(1, 0, 0), None, 0xee), Sunk::Dropped);
    assert_eq!(r.deliver(&forged(0, 10, 0), None, 0xee), Sunk::Dropped);
    assert_eq!(r.deliver(&forged(0, 200_000, 0), None, 0xee), Sunk::Dropped);
    assert_eq!(r.deliver(&forged(0, 0, 1), None, 0xee), Sunk::Dropped);
    // The real packets, each twice.
    for p in &packets {
        assert_eq!(r.deliver(p, None, 0x5a), Sunk::Placed);
        assert_eq!(r.deliver(p, None, 0xee), Sunk::Dropped);
    }
    assert!(h.is_complete());
    assert_eq!(r.rx.imm(&h), Some(7));
    let b = r.bytes();
    assert!(b[GUARD as usize..(GUARD + len) as usize]
        .iter()
        .all(|&x| x == 0x5a));
    r.guards_clean(len);
    let st = r.rx.stats();
    assert_eq!(
        (
            st.refused_packets,
            st.stale_packets,
            st.out_of_range_packets,
            st.duplicate_packets,
            st.packets_placed,
        ),
        (3, 2, 2, 10, 10)
    );
    assert_eq!((st.chunks_completed, st.messages_completed), (5, 1));
}

#[test]
fn late_packets_of_every_old_generation_never_reach_the_new_message() {
    let r = Rig::new();
    let mut tx = SendTable::new(config());
    // Messages 0..8 go round both slots and both generations twice; each is completed
    // before the next is posted, and then every packet of the three messages before it comes
    // late — every other (slot, generation) pair. (Four messages back is the same pair
    // again: a packet that late is indistinguishable, the reason for generations — G·S
    // messages of reordering is the limit, as on the paper's NIC.)
    let mut old: std::collections::VecDeque<Vec<Packet>> = Default::default();
    for n in 0..8u8 {
        let h = r.rx.post(r.buffer(), 4096).unwrap();
        let s = tx.send(4096, None).unwrap();
        let packets: Vec<Packet> = tx.packets(&s).collect();
        for p in old.iter().flatten() {
            assert_eq!(
                r.deliver(p, None, 0xee),
                Sunk::Dropped,
                "late packet into {n}"
            );
        }
        for p in &packets {
            assert_eq!(r.deliver(p, None, n + 1), Sunk::Placed);
        }
        assert!(h.is_complete());
        let b = r.bytes();
        assert!(b[GUARD as usize..GUARD as usize + 4096]
            .iter()
            .all(|&x| x == n + 1));
        assert!(r.rx.complete(&h));
        // Completed: its share points at the discard target, so even a write past the
        // table's checks lands nowhere.
        r.mem
            .write(
                r.rx.region().rkey,
                PD,
                u64::from(h.slot) * 16 * 1024,
                &[0xee; 64],
                Access::REMOTE_WRITE,
            )
            .unwrap();
        old.push_back(packets);
        if old.len() > 3 {
            old.pop_front();
        }
    }
    r.guards_clean(4096);
    assert_eq!(r.rx.discarded_bytes(), 8 * 64);
    assert!(r.rx.stats().stale_packets > 0);
}

#[test]
fn a_receive_buffer_smaller_than_the_message_takes_only_what_fits() {
    let mut r = Rig::new();
    // A 4 KiB window of the buffer, posted for a 10 000-byte message.
    let small = r
        .mem
        .register_within(r.keys, GUARD as usize, 4096, (PD, 0, Access::LOCAL_WRITE))
        .unwrap()
        .unwrap();
    let h =
        r.rx.post(
            Buffer {
                lkey: small.lkey,
                va: 0,
            },
            10_000,
        )
        .unwrap();
    let s = r.tx.send(10_000, None).unwrap();
    let placed: Vec<Sunk> =
        r.tx.packets(&s)
            .collect::<Vec<_>>()
            .iter()
            .map(|p| r.deliver(p, None, 0x77))
            .collect();
    assert_eq!(placed.iter().filter(|&&p| p == Sunk::Placed).count(), 4);
    assert!(!h.is_complete());
    r.guards_clean(4096);
    assert_eq!(r.rx.stats().refused_packets, 6);
}

#[test]
fn a_parity_chunk_for_a_submessage_already_whole_rebuilds_nothing() {
    let mut r = Rig::new();
    let scheme = Scheme::Ec {
        code: Code::Mds,
        k: 2,
        m: 1,
        beta: 1.0,
    };
    let mut rel =
        ReliableReceiver::new(r.rx.clone(), ReliableConfig::new(scheme, 100_000)).unwrap();
    let (par, pbase) = r.mem.register_owned(PD, 8192, Access::LOCAL_WRITE).unwrap();
    let len = 4096;
    let user = rel
        .post(
            r.buffer(),
            len,
            Some(Buffer {
                lkey: par.lkey,
                va: pbase,
            }),
        )
        .unwrap();
    let data = r.tx.send(len, None).unwrap();
    let parity = r.tx.send(rel.parity_len(len), None).unwrap();
    for p in r.tx.packets(&data).collect::<Vec<_>>() {
        r.deliver(&p, None, 0x33);
    }
    // The parity arrives after the data is whole (its bytes are not what the code would
    // give: a rebuild from them would write garbage).
    for p in r.tx.packets(&parity).collect::<Vec<_>>() {
        r.deliver(&p, None, 0xff);
    }
    rel.poll(
        0,
        &TableMemory {
            mem: &r.mem,
            pd: PD,
        },
    );
    assert!(rel.is_complete(user));
    assert_eq!(rel.stats().chunks_rebuilt, 0);
    let b = r.bytes();
    assert!(b[GUARD as usize..(GUARD + len) as usize]
        .iter()
        .all(|&x| x == 0x33));
    r.guards_clean(len);
}
