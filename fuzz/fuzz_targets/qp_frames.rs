//! Arbitrary frames thrown at connected QPs (RC, UC, UD; RC also with each placing delivery:
//! selective repeat, RNIC-SR, timeout-only) with work outstanding in both halves. Frames are parsed without the ICRC check so the fuzzer reaches the transport; each
//! frame is retargeted to the QP under test. Whatever arrives, nothing may panic, transmit
//! forever, or write outside the registered region (guard bytes around it must stay zero).
#![no_main]

use ferroce_stack::transport::loopback::connect;
use ferroce_stack::transport::{
    Access, Arrivals, Delivery, Feedback, LossReport, MrTable, Mtu, PathSelector, Payload, PdId,
    Qp, QpAttr, QpConfig, QpType, Recovery, RecvWr, Retransmit, SendWindow, SendWr, Sge, WrOpcode,
};
use ferroce_stack::wire::{Checks, Psn, Qpn, RoceRepr};

/// A placing policy that reports every missing PSN below an arrival lost.
#[derive(Debug)]
struct Placing(Feedback);

impl Recovery for Placing {
    fn name(&self) -> &'static str {
        "placing"
    }
    fn window(&self) -> u32 {
        128
    }
    fn delivery(&self) -> Delivery {
        Delivery::Placement(self.0)
    }
    fn on_sequence_error(&mut self, missing: Psn, w: SendWindow) -> Retransmit {
        Retransmit::Only(missing, Some(w.nxt.sub(1)))
    }
    fn on_timeout(&mut self, _w: SendWindow) -> Retransmit {
        Retransmit::Holes
    }
    fn on_arrival(
        &mut self,
        psn: Psn,
        _port: u16,
        _paths: &dyn PathSelector,
        rx: &dyn Arrivals,
        report: &mut LossReport,
    ) {
        let epsn = rx.epsn();
        for i in 0..psn.distance(epsn).clamp(0, 8) as u32 {
            let m = epsn.add(i);
            if !rx.arrived(m) && !rx.reported(m) {
                report.lost.push(m);
            }
        }
        report.avoid = Some(psn.value() as u8);
    }
    fn on_response_arrival(
        &mut self,
        psn: Psn,
        port: u16,
        paths: &dyn PathSelector,
        rx: &dyn Arrivals,
        report: &mut LossReport,
    ) {
        self.on_arrival(psn, port, paths, rx, report);
    }
}
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
    let pd = PdId(1);
    let mut mem = vec![0u8; GUARD + REGION + GUARD];
    let mut table = MrTable::new(1);
    let all = Access::LOCAL_WRITE
        .with(Access::REMOTE_WRITE)
        .with(Access::REMOTE_READ)
        .with(Access::REMOTE_ATOMIC);
    // SAFETY: `mem` outlives `table`, dropped before the guard check below.
    let keys = unsafe { table.register(pd, mem.as_mut_ptr().add(GUARD), REGION, 0, all) }.unwrap();
    let mut qp = Qp::new(QpConfig::new(Qpn::new(7), t, pd));
    let mut peer = Qp::new(QpConfig::new(Qpn::new(8), t, pd));
    if let Some(f) = placing {
        qp.set_recovery(Box::new(Placing(f)));
        peer.set_recovery(Box::new(Placing(f)));
    }
    let attr = QpAttr {
        qp_access_flags: all,
        path_mtu: Mtu::Mtu256,
        qkey: 0x1111,
        timeout: 1,
        retry_cnt: 1,
        rnr_retry: 1,
        ..QpAttr::default()
    };
    if connect(&mut qp, &mut peer, &attr).is_err() {
        return;
    }
    qp.set_port_mtu(Mtu::Mtu256);
    for i in 0..4u64 {
        let s = [Sge { addr: 512 * i, length: 512, lkey: keys.lkey }];
        let _ = qp.post_recv(&RecvWr { wr_id: i, sg_list: &s });
    }
    if t != QpType::Ud {
        let s = [Sge { addr: 2048, length: 600, lkey: keys.lkey }];
        let a = [Sge { addr: 4088, length: 8, lkey: keys.lkey }];
        let wrs = [
            SendWr::new(1, WrOpcode::Write, Payload::Sges(&s)).remote(0, 5),
            SendWr::new(2, WrOpcode::Send, Payload::Sges(&s)),
        ];
        for wr in &wrs {
            let _ = qp.post_send(wr);
        }
        if t == QpType::Rc {
            let _ = qp.post_send(&SendWr::new(3, WrOpcode::Read, Payload::Sges(&s)).remote(0, 5));
            let _ = qp.post_send(&SendWr::new(4, WrOpcode::FetchAdd, Payload::Sges(&a)).remote(8, 5));
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
            qp.handle_packet(now, &pkt, &mut table);
        }
        let mut sent = 0;
        while qp.poll_transmit(now, &mut out, &table).is_some() {
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
    drop(table);
    assert!(mem[..GUARD].iter().all(|&b| b == 0), "wrote below the region");
    assert!(mem[GUARD + REGION..].iter().all(|&b| b == 0), "wrote above the region");
});
