//! SDR receive side fuzz target: a hostile peer's packets (any generation, RETH, immediate
//! and payload) into a receiver with two receives posted between guard bytes, and any bytes
//! as a control-channel acknowledgement and as an R2CCL out-of-band message. Nothing may panic, and no byte outside the posted
//! receives may change.
#![no_main]

use ferroce_reliability::sdr::ack::Ack;
use ferroce_reliability::sdr::imm::ImmLayout;
use ferroce_reliability::sdr::receiver::{Buffer, SdrReceiver};
use ferroce_reliability::sdr::recv::RecvConfig;
use ferroce_stack::transport::{Access, MrTable, PdId};
use ferroce_stack::wire::RethRepr;
use libfuzzer_sys::fuzz_target;

const PD: PdId = PdId(1);

fuzz_target!(|data: &[u8]| {
    let _ = Ack::parse(data);
    let _ = ferroce_reliability::failover::r2ccl::oob::OobMsg::decode(data);
    let config = RecvConfig {
        layout: ImmLayout::PAPER,
        mtu: 256,
        chunk_packets: 2,
        max_message: 4096,
        slots: 4,
        generations: 2,
    };
    let mut mem = MrTable::new(1);
    let Ok((keys, base)) = mem.register_owned(PD, 16384, Access::LOCAL_WRITE) else {
        return;
    };
    let Ok(rx) = SdrReceiver::new(config, &mut mem, PD) else {
        return;
    };
    // Receives of 3000 and 1000 bytes at 4096 and 10000: the rest is guard.
    let posts = [(4096u64, 3000u64), (10000, 1000)];
    for (at, len) in posts {
        let buf = Buffer {
            lkey: keys.lkey,
            va: base + at,
        };
        if rx.post(buf, len).is_err() {
            return;
        }
    }
    let region = rx.region();
    // Each packet: generation (1), which key (1), va (4), imm (4), length (2), then payload.
    let mut rest = data;
    while let Some((h, tail)) = rest.split_first_chunk::<12>() {
        let len = usize::from(u16::from_le_bytes([h[10], h[11]])) % 512;
        let Some((payload, tail)) = tail.split_at_checked(len.min(tail.len())) else {
            return;
        };
        rest = tail;
        let reth = RethRepr {
            va: u64::from(u32::from_le_bytes([h[2], h[3], h[4], h[5]])),
            rkey: if h[1] & 1 == 0 {
                region.rkey
            } else {
                keys.rkey
            },
            dma_len: if h[1] & 2 == 0 {
                payload.len() as u32
            } else {
                u32::from(h[1])
            },
        };
        let imm = u32::from_le_bytes([h[6], h[7], h[8], h[9]]);
        let _ = rx.on_packet(h[0] % 3, reth, imm, payload, PD, &mem);
    }
    let mut all = vec![0u8; 16384];
    if mem
        .read(keys.lkey, PD, base, &mut all, Access::NONE)
        .is_ok()
    {
        let inside = |i: usize| {
            posts
                .iter()
                .any(|&(at, len)| (at..at + len).contains(&(i as u64)))
        };
        for (i, b) in all.iter().enumerate() {
            assert!(
                *b == 0 || inside(i),
                "byte {i} outside the posted receives was written"
            );
        }
    }
});
