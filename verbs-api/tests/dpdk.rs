//! The verbs API over a DPDK port: a net_ring vdev loops frames back inside this process, so
//! two RC QPs on the one device talk to each other through DPDK's ethdev rings.
#![cfg(feature = "dpdk")]

use ferroce_verbs::connect::{connect_qp, ConnectOpts, Endpoint};
use ferroce_verbs::sim::open_device;
use ferroce_verbs::*;

#[test]
fn rc_traffic_through_a_dpdk_ring_port() {
    let spec = format!(
        "dpdk:-l 0 --no-pci --no-huge -m 256 --file-prefix=ferroce-verbs-{} --log-level=error --vdev=net_ring0 @10.9.0.1",
        std::process::id()
    );
    let ctx = open_device(&spec).unwrap();
    assert_eq!(ctx.query_port().state, PortState::Active);
    let pd = ctx.alloc_pd();
    let all = Access::LOCAL_WRITE
        .with(Access::REMOTE_WRITE)
        .with(Access::REMOTE_READ);
    let (ma, mb) = (
        pd.alloc_mr(1 << 20, all).unwrap(),
        pd.alloc_mr(1 << 20, all).unwrap(),
    );
    let cq = ctx.create_cq(1024, None);
    let qa = pd
        .create_qp(QpType::Rc, QpCaps::default(), &cq, &cq)
        .unwrap();
    let qb = pd
        .create_qp(QpType::Rc, QpCaps::default(), &cq, &cq)
        .unwrap();
    let ep = |qp: &QueuePair, mr: &MemoryRegion, psn| Endpoint {
        qpn: qp.qpn().value(),
        psn,
        gid: ctx.query_gid(0).unwrap(),
        mac: ctx.mac(),
        addr: mr.addr(),
        len: mr.len() as u64,
        rkey: mr.rkey(),
    };
    let (ea, eb) = (ep(&qa, &ma, 1), ep(&qb, &mb, 2));
    let o = ConnectOpts {
        mtu: Mtu::Mtu1024,
        ..ConnectOpts::default()
    };
    connect_qp(&ctx, &qa, 1, &eb, &o).unwrap();
    connect_qp(&ctx, &qb, 2, &ea, &o).unwrap();
    let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7) as u8).collect();
    assert!(ma.write(0, &data));
    qb.post_recv(&[RecvWr {
        wr_id: 9,
        sg_list: &[mb.sge(0x20000, 100_000)],
    }])
    .unwrap();
    let s = [ma.sge(0, 100_000)];
    let back = [ma.sge(0x40000, 100_000)];
    qa.post_send(&[
        SendWr::new(1, WrOpcode::Write, Payload::Sges(&s)).remote(mb.addr(), mb.rkey()),
        SendWr::new(2, WrOpcode::Send, Payload::Sges(&s)),
        SendWr::new(3, WrOpcode::Read, Payload::Sges(&back)).remote(mb.addr(), mb.rkey()),
    ])
    .unwrap();
    let mut got = Vec::new();
    let start = std::time::Instant::now();
    while got.len() < 4 && start.elapsed().as_secs() < 20 {
        ctx.progress();
        cq.poll(&mut got, 8);
    }
    assert_eq!(got.len(), 4, "{got:?}");
    assert!(got.iter().all(|c| c.status == WcStatus::Success), "{got:?}");
    let mut out = vec![0u8; 100_000];
    for (mr, at) in [(&mb, 0), (&mb, 0x20000), (&ma, 0x40000)] {
        assert!(mr.read(at, &mut out));
        assert_eq!(out, data, "at {at:#x}");
    }
    assert!(ctx.port_counters().rx_frames > 200);
}
