//! The verbs API over DPDK ports: a net_ring vdev loops frames back inside this process, so
//! two RC QPs on one device talk to each other through DPDK's ethdev rings. Two such ports
//! in the one process (two devices on the same EAL), the second sending payloads in place
//! from registered memory (zero-copy: external mbufs chained after the headers).
#![cfg(feature = "dpdk")]

use ferroce_verbs::connect::{connect_qp, ConnectOpts, Endpoint};
use ferroce_verbs::spec::open_device;
use ferroce_verbs::*;

mod common;
use common::through_the_port;

#[test]
fn rc_traffic_through_dpdk_ring_ports_with_and_without_zero_copy() {
    let eal = format!(
        "-l 0 --no-pci --no-huge -m 512 --file-prefix=ferroce-verbs-{} --log-level=error --vdev=net_ring0 --vdev=net_ring1 --vdev=net_ring2 --vdev=net_ring3",
        std::process::id()
    );
    let copying = open_device(&format!("dpdk:{eal} @10.9.0.1")).unwrap();
    let zero_copy = open_device(&format!("dpdk:{eal} @10.9.0.2 port=1 zerocopy")).unwrap();
    let c = rc_write_send_read(&copying);
    assert_eq!(c.tx_zero_copy, 0);
    let z = rc_write_send_read(&zero_copy);
    // The data packets of the WRITE, the SEND and the READ responses went out in place: at
    // least the 3 × 97 full 1024-byte ones (the short last ones, 672 bytes, are above the
    // 512-byte threshold too).
    assert!(z.tx_zero_copy >= 3 * 97, "{z:?}");
    // A zero-copy device registers the memory of its regions with DPDK (external memory,
    // mapped for the device's DMA, as mlx5 needs before it sends from it) and forgets it when
    // the region goes; a copying device leaves memory alone.
    let (pz, pc) = (zero_copy.alloc_pd(), copying.alloc_pd());
    let big = pz.alloc_mr(1 << 20, Access::LOCAL_WRITE).unwrap();
    let small = pz.alloc_mr(100, Access::LOCAL_WRITE).unwrap();
    let copied = pc.alloc_mr(1 << 20, Access::LOCAL_WRITE).unwrap();
    let inside = |mr: &MemoryRegion, at: u64| (mr.addr() + at) as *const u8;
    use ferroce_drivers::dpdk::is_external_memory;
    for at in [0, 1 << 19, (1 << 20) - 1] {
        assert!(is_external_memory(inside(&big, at)), "{at:#x}");
    }
    // (Only the middle: the copying device's region may share its first and last pages
    // with the zero-copy regions on the heap, and shared pages are mapped.)
    assert!(!is_external_memory(inside(&copied, 1 << 19)));
    assert!(is_external_memory(inside(&small, 99)));
    let (middle, last) = (inside(&big, 1 << 19), inside(&small, 0));
    drop(big);
    assert!(!is_external_memory(middle));
    assert!(is_external_memory(last));
    drop(small);
    assert!(!is_external_memory(last));
    // A device with two ports (net_ring2 and net_ring3, each looped back): both ports
    // report, the QPs get each other's second port as their alternate path, and traffic
    // runs on port 1.
    let two = open_device(&format!("dpdk:{eal} @10.9.0.4,10.9.1.4 port=2,3")).unwrap();
    assert_eq!(two.query_device().phys_port_cnt, 2);
    assert_eq!(two.query_port_num(2).unwrap().state, PortState::Active);
    assert_eq!(&two.query_gid_on(2, 0).unwrap().0[12..], &[10, 9, 1, 4]);
    let t = rc_write_send_read(&two);
    assert!(t.tx_frames > 200, "{t:?}");
    moves_when_port_1_goes_down(&two, 2);
    // A second device on other EAL arguments is refused with a clear error.
    let e = open_device("dpdk:-l 0 --vdev=net_ring2 @10.9.0.3").unwrap_err();
    assert!(e.to_string().contains("EAL already runs"), "{e}");
}

fn rc_write_send_read(ctx: &Context) -> PortCounters {
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
    let ep =
        |qp: &QueuePair, mr: &MemoryRegion, psn| through_the_port(Endpoint::of(ctx, qp, mr, psn));
    let (ea, eb) = (ep(&qa, &ma, 1), ep(&qb, &mb, 2));
    let o = ConnectOpts {
        mtu: Mtu::Mtu1024,
        ..ConnectOpts::default()
    };
    connect_qp(ctx, &qa, 1, &eb, &o).unwrap();
    connect_qp(ctx, &qb, 2, &ea, &o).unwrap();
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
    let c = ctx.port_counters();
    assert!(c.rx_frames > 200);
    c
}

/// On a two-port device whose port 1 is DPDK port `dpdk_port`: a pair of QPs on it (each
/// the other's peer, port 2 the alternate), a WRITE stream, and port 1's link set down
/// administratively in the middle (`rte_eth_dev_set_link_down`): the engine reads the link
/// status, both QPs move to port 2, and every WRITE completes. Port 1 comes back up after.
fn moves_when_port_1_goes_down(ctx: &Context, dpdk_port: u16) {
    let pd = ctx.alloc_pd();
    let all = Access::LOCAL_WRITE.with(Access::REMOTE_WRITE);
    let (ma, mb) = (
        pd.alloc_mr(1 << 20, all).unwrap(),
        pd.alloc_mr(1 << 20, all).unwrap(),
    );
    let cq = ctx.create_cq(4096, None);
    let qa = pd
        .create_qp(QpType::Rc, QpCaps::default(), &cq, &cq)
        .unwrap();
    let qb = pd
        .create_qp(QpType::Rc, QpCaps::default(), &cq, &cq)
        .unwrap();
    let ep =
        |qp: &QueuePair, mr: &MemoryRegion, psn| through_the_port(Endpoint::of(ctx, qp, mr, psn));
    let (ea, eb) = (ep(&qa, &ma, 5), ep(&qb, &mb, 6));
    let o = ConnectOpts {
        mtu: Mtu::Mtu1024,
        ..ConnectOpts::default()
    };
    connect_qp(ctx, &qa, 5, &eb, &o).unwrap();
    connect_qp(ctx, &qb, 6, &ea, &o).unwrap();
    assert_eq!(qa.path_state().unwrap(), (Some(1), 0));
    let data: Vec<u8> = (0..65536u32).map(|i| (i * 3 + 1) as u8).collect();
    assert!(ma.write(0, &data));
    let s = [ma.sge(0, 65536)];
    let post = |from: u64| {
        let wrs: Vec<_> = (from..from + 8)
            .map(|i| {
                SendWr::new(i, WrOpcode::Write, Payload::Sges(&s))
                    .remote(mb.addr() + 65536 * (i % 16), mb.rkey())
            })
            .collect();
        qa.post_send(&wrs).unwrap();
    };
    let mut got = Vec::new();
    let wait = |got: &mut Vec<WorkCompletion>, n: usize| {
        let start = std::time::Instant::now();
        while got.len() < n && start.elapsed().as_secs() < 20 {
            ctx.progress();
            cq.poll(got, 16);
        }
    };
    post(0);
    ferroce_drivers::dpdk::set_link(dpdk_port, false).expect("net_ring sets its link down");
    post(8);
    wait(&mut got, 16);
    assert_eq!(got.len(), 16, "{got:?}");
    assert!(got.iter().all(|c| c.status == WcStatus::Success), "{got:?}");
    assert_eq!(ctx.query_port_num(1).unwrap().state, PortState::Down);
    assert_eq!(qa.path_state().unwrap().0, Some(2), "moved to port 2");
    assert_eq!(qb.path_state().unwrap().0, Some(2), "the peer too");
    let mut out = vec![0u8; 65536];
    assert!(mb.read(65536 * 15, &mut out));
    assert_eq!(out, data);
    ferroce_drivers::dpdk::set_link(dpdk_port, true).unwrap();
}
