//! Arbitrary frames thrown at connected QPs (RC, UC, UD; RC also with each placing delivery:
//! selective repeat, RNIC-SR, timeout-only) with work outstanding in both halves. Frames are parsed without the ICRC check so the fuzzer reaches the transport; each
//! frame is retargeted to the QP under test. Whatever arrives, nothing may panic, transmit
//! forever, or write outside the registered region (guard bytes around it must stay zero).
#![no_main]

use ferroce_stack::transport::hostile::{EagerPlacing, Target};
use ferroce_stack::transport::{
    Access, Feedback, LocalPort, Mtu, Payload, QpAttr, QpType, RecvWr, SendWr, Sge, WrOpcode,
};
use ferroce_stack::wire::{Checks, MacAddr, Qpn, RoceRepr};
use libfuzzer_sys::fuzz_target;

const GUARD: usize = 256;
const REGION: usize = 4096;

fuzz_target!(|data: &[u8]| {
    let Some((&kind, mut rest)) = data.split_first() else {
        return;
    };
    let t = [QpType::Rc, QpType::Uc, QpType::Ud][usize::from(kind % 3).min(2)];
    let placing = match kind % 6 {
        3 => Some(Feedback::Selective),
        4 => Some(Feedback::NakExpected),
        5 => Some(Feedback::AckOnly),
        _ => None,
    };
    let t = if placing.is_some() { QpType::Rc } else { t };
    let all = Access::LOCAL_WRITE
        .with(Access::REMOTE_WRITE)
        .with(Access::REMOTE_READ)
        .with(Access::REMOTE_ATOMIC);
    let attr = QpAttr {
        qp_access_flags: all,
        path_mtu: Mtu::Mtu256,
        qkey: 0x1111,
        timeout: 1,
        retry_cnt: 1,
        rnr_retry: 1,
        ..QpAttr::default()
    };
    let placing = placing.map(|feedback| EagerPlacing {
        feedback,
        window: 128,
        paths: 256,
    });
    let Ok(mut target) = Target::new(t, (placing, None), &attr, (GUARD, REGION), 1) else {
        return;
    };
    let keys = target.keys;
    let (qp, table) = (&mut target.qp, &mut target.mem);
    // Half the runs: a QP with another port to announce, so PATH_CONTROL announces (taking an
    // alternate path, lowering the atomic depth) and moves (migrating, resending) are
    // reachable from the wire.
    if kind & 0x40 != 0 {
        qp.offer_alternate_port(LocalPort {
            port: 1,
            mac: MacAddr([2, 0, 0, 0, 1, 1]),
            ip: std::net::IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 1, 1)),
        });
    }
    for i in 0..4u64 {
        let s = [Sge {
            addr: 512 * i,
            length: 512,
            lkey: keys.lkey,
        }];
        let _ = qp.post_recv(&RecvWr {
            wr_id: i,
            sg_list: &s,
        });
    }
    if t != QpType::Ud {
        let s = [Sge {
            addr: 2048,
            length: 600,
            lkey: keys.lkey,
        }];
        let a = [Sge {
            addr: 4088,
            length: 8,
            lkey: keys.lkey,
        }];
        let wrs = [
            SendWr::new(1, WrOpcode::Write, Payload::Sges(&s)).remote(0, 5),
            SendWr::new(2, WrOpcode::Send, Payload::Sges(&s)),
        ];
        for wr in &wrs {
            let _ = qp.post_send(wr);
        }
        if t == QpType::Rc {
            let _ = qp.post_send(&SendWr::new(3, WrOpcode::Read, Payload::Sges(&s)).remote(0, 5));
            let _ =
                qp.post_send(&SendWr::new(4, WrOpcode::FetchAdd, Payload::Sges(&a)).remote(8, 5));
        }
    }
    let mut out = vec![0u8; 2048];
    let mut now = 0u64;
    // Frames: a two-byte length, then that many bytes.
    while rest.len() >= 2 {
        let len = usize::from(u16::from_le_bytes([rest[0], rest[1]])).min(rest.len() - 2);
        let frame = &rest[2..2 + len];
        rest = &rest[2 + len..];
        now += 10_000;
        if let Ok(mut pkt) = RoceRepr::parse(frame, Checks::NONE) {
            pkt.repr.bth.dest_qpn = Qpn::new(7);
            qp.handle_packet(now, &pkt, table);
        }
        let mut sent = 0;
        while qp.poll_transmit(now, &mut out, table).is_some() {
            sent += 1;
            assert!(sent < 100_000, "transmit does not stop");
        }
        if let Some(t) = qp.poll_timeout() {
            if t <= now + 1_000_000_000 {
                qp.handle_timeout(t.max(now));
            }
        }
        while qp.poll_completion().is_some() {}
    }
    let (below, above) = target.guards_untouched();
    assert!(below, "wrote below the region");
    assert!(above, "wrote above the region");
});
