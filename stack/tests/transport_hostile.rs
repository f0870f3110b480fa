//! Invariants 3 and 4 against a hostile peer: well-formed frames (valid ICRC) with arbitrary
//! opcodes, PSNs, keys, addresses, lengths, syndromes and payloads, thrown at a connected RC,
//! UC or UD QP whose registered region sits between two guard areas. Nothing panics, nothing
//! outside the region changes, and the QP's queues stay bounded. RC runs with Go-Back-N and
//! with each placing delivery (selective repeat's opcodes and acknowledgements included).

use ferroce_stack::transport::hostile::{EagerPlacing, Target, XorPaths};
use ferroce_stack::transport::{
    Access, Feedback, Mtu, Payload, QpAttr, QpType, RecvWr, SendWr, Sge, WrOpcode,
};
use ferroce_stack::wire::sample::{sample_repr, SampleAddr};
use ferroce_stack::wire::{
    AethRepr, AtomicEthRepr, Msn, Opcode, Psn, Qpn, RethRepr, RoceRepr, SackEthRepr,
};

use proptest::prelude::*;

const GUARD: usize = 4096;
const REGION: usize = 8192;

#[derive(Debug, Clone)]
struct Evil {
    opcode: Opcode,
    psn: u32,
    va: u64,
    rkey_mode: u8,
    len: u32,
    syndrome: u8,
    payload: usize,
    ack_req: bool,
}

fn evil() -> impl Strategy<Value = Evil> {
    let ops: Vec<Opcode> = Opcode::all().collect();
    (
        proptest::sample::select(ops),
        prop_oneof![0u32..16, (1u32 << 24) - 16..(1 << 24), any::<u32>()],
        prop_oneof![0u64..(REGION as u64 + 64), any::<u64>()],
        0u8..3,
        prop_oneof![0u32..(REGION as u32 + 64), any::<u32>()],
        any::<u8>(),
        // Now and then exactly what a response to the outstanding READs carries.
        prop_oneof![4 => 0usize..1100, 1 => Just(1024usize), 1 => Just(952usize), 1 => Just(500usize)],
        any::<bool>(),
    )
        .prop_map(
            |(opcode, psn, va, rkey_mode, len, syndrome, payload, ack_req)| Evil {
                opcode,
                psn: psn & 0xff_ffff,
                va,
                rkey_mode,
                len,
                syndrome,
                payload,
                ack_req,
            },
        )
}

fn frame(e: &Evil, dest: Qpn, rkey: u32, mtu: usize) -> Option<Vec<u8>> {
    let info = e.opcode.info().ok()?;
    let plen = if info.payload { e.payload.min(mtu) } else { 0 };
    let mut r: RoceRepr = sample_repr(e.opcode, SampleAddr::default(), plen);
    r.bth.dest_qpn = dest;
    r.bth.psn = Psn::new(e.psn);
    r.bth.ack_req = e.ack_req;
    let key = match e.rkey_mode {
        0 => rkey,
        1 => rkey ^ 1,
        _ => e.len,
    };
    if r.ext.reth.is_some() {
        r.ext.reth = Some(RethRepr {
            va: e.va,
            rkey: key,
            dma_len: e.len,
        });
    }
    if r.ext.atomic_eth.is_some() {
        r.ext.atomic_eth = Some(AtomicEthRepr {
            va: e.va,
            rkey: key,
            swap_add: 1,
            compare: 0,
        });
    }
    if r.ext.aeth.is_some() {
        r.ext.aeth = Some(AethRepr {
            syndrome: e.syndrome,
            msn: Msn::new(e.len),
        });
    }
    if r.ext.sack_eth.is_some() {
        r.ext.sack_eth = Some(SackEthRepr {
            flags: e.syndrome,
            base: Psn::new(e.psn.wrapping_add(1)),
            path: e.syndrome,
            lost: Psn::new(e.len),
            bits0: e.va,
            bits1: e.va.rotate_left(17),
            bits2: !e.va,
            bits3: u64::from(e.len),
        });
    }
    if let Some(d) = r.ext.deth.as_mut() {
        d.qkey = if e.rkey_mode == 0 { 0x1111 } else { e.len };
    }
    let mut buf = vec![0u8; r.buffer_len()];
    let fill = (e.va as u8) | 1;
    r.emit(&mut buf, |p| p.fill(fill)).ok()?;
    Some(buf)
}

fn run(t: QpType, frames: &[Evil]) {
    run_with(t, frames, None);
}

fn run_with(t: QpType, frames: &[Evil], feedback: Option<Feedback>) {
    let all = Access::LOCAL_WRITE
        .with(Access::REMOTE_WRITE)
        .with(Access::REMOTE_READ)
        .with(Access::REMOTE_ATOMIC);
    let attr = QpAttr {
        qp_access_flags: all,
        path_mtu: Mtu::Mtu1024,
        qkey: 0x1111,
        ..QpAttr::default()
    };
    let placing = feedback.map(|feedback| EagerPlacing {
        feedback,
        window: 256,
        paths: 4,
    });
    let spray = placing.map(|_| XorPaths(4));
    let mut target = Target::new(t, (placing, spray), &attr, (GUARD, REGION), 3).unwrap();
    let keys = target.keys;
    let (qp, table) = (&mut target.qp, &mut target.mem);
    for i in 0..4 {
        let s = [Sge {
            addr: 1024 * i,
            length: 1024,
            lkey: keys.lkey,
        }];
        qp.post_recv(&RecvWr {
            wr_id: i,
            sg_list: &s,
        })
        .unwrap();
    }
    let mut out = vec![0u8; 9000];
    if t == QpType::Rc {
        // Outstanding READs and an atomic from PSN 0 on, so forged responses find something
        // to land in: a 3-packet READ, a FETCH_ADD, a 1-packet READ.
        let wrs = [
            (WrOpcode::Read, 4096, 3000),
            (WrOpcode::FetchAdd, 7168, 8),
            (WrOpcode::Read, 7680, 500),
        ];
        for (i, &(op, at, len)) in wrs.iter().enumerate() {
            let s = [Sge {
                addr: at,
                length: len,
                lkey: keys.lkey,
            }];
            qp.post_send(&SendWr::new(100 + i as u64, op, Payload::Sges(&s)).remote(0, 0x99))
                .unwrap();
        }
        while qp.poll_transmit(0, &mut out, table).is_some() {}
    }
    let mut now = 0;
    for e in frames {
        let Some(f) = frame(e, Qpn::new(7), keys.rkey, 1024) else {
            continue;
        };
        now += 1_000;
        let _ = qp.handle_frame(now, &f, table);
        let mut sent = 0;
        while qp.poll_transmit(now, &mut out, table).is_some() {
            sent += 1;
            assert!(sent < 10_000, "transmit does not stop");
        }
        if qp.poll_timeout().is_some_and(|t| t <= now + 1_000_000_000) {
            qp.handle_timeout(now + 1_000_000_000);
        }
        while qp.poll_completion().is_some() {}
    }
    let (below, above) = target.guards_untouched();
    assert!(below, "wrote below the region");
    assert!(above, "wrote above the region");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn hostile_frames_to_rc(frames in proptest::collection::vec(evil(), 1..40)) {
        run(QpType::Rc, &frames);
    }

    #[test]
    fn hostile_frames_to_rc_with_selective_repeat(frames in proptest::collection::vec(evil(), 1..40)) {
        run_with(QpType::Rc, &frames, Some(Feedback::Selective));
    }

    #[test]
    fn hostile_frames_to_rc_with_rnic_sr(frames in proptest::collection::vec(evil(), 1..40)) {
        run_with(QpType::Rc, &frames, Some(Feedback::NakExpected));
    }

    #[test]
    fn hostile_frames_to_uc(frames in proptest::collection::vec(evil(), 1..40)) {
        run(QpType::Uc, &frames);
    }

    #[test]
    fn hostile_frames_to_ud(frames in proptest::collection::vec(evil(), 1..40)) {
        run(QpType::Ud, &frames);
    }
}
