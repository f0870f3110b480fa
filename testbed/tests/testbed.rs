//! The testbed's loop and hosts: a WRITE between two hosts runs to completion in virtual time,
//! a horizon stops the loop with work left, and a QP sends on the port it was put on.

use std::net::Ipv4Addr;

use ferroce_drivers::sim::{FabricBuilder, LinkModel};
use ferroce_stack::transport::{Payload, Qp, QpConfig, QpType, SendWr, Sge, WcStatus, WrOpcode};
use ferroce_stack::wire::Qpn;
use ferroce_testbed::{pair, ConnOpts, Host, Step, Testbed, PD};

fn write(w: &mut Testbed, from: usize, qpn: u32, len: usize) {
    let data: Vec<u8> = (0..len).map(|i| (i * 7 + 1) as u8).collect();
    w.hosts[from].write(0, &data);
    let rkey = w.hosts[1 - from].keys.rkey;
    let s = [Sge {
        addr: 0,
        length: len as u32,
        lkey: w.hosts[from].keys.lkey,
    }];
    let wr = SendWr::new(9, WrOpcode::Write, Payload::Sges(&s)).remote(0x1_0000, rkey);
    w.hosts[from].qp(qpn).post_send(&wr).unwrap();
}

#[test]
fn a_write_runs_to_completion_and_a_horizon_stops_the_loop_early() {
    let mut w = pair(5, LinkModel::new(10_000_000_000, 5_000), 1 << 20);
    w.connect(
        QpType::Rc,
        ((0, 1), (1, 2)),
        (100, 200),
        &ConnOpts::default(),
        None,
    );
    write(&mut w, 0, 1, 100_000);
    // The first turn sends; nothing has arrived 1 µs in.
    assert_eq!(w.step(u64::MAX), Step::Worked);
    assert!(!w.drive_until(1_000));
    assert!(w.hosts[0].completions.is_empty());
    assert!(w.drive());
    assert!(w.now() > 5_000);
    let c = &w.hosts[0].completions;
    assert_eq!(
        (c.len(), c[0].wr_id, c[0].status),
        (1, 9, WcStatus::Success)
    );
    assert_eq!(w.hosts[0].completed_at.len(), 1);
    let sent: Vec<u8> = (0..100_000).map(|i| (i * 7 + 1) as u8).collect();
    assert_eq!(w.hosts[1].read(0x1_0000, 100_000), sent);
    // Idle stays idle.
    assert_eq!(w.step(u64::MAX), Step::Idle);
}

#[test]
fn a_qp_sends_on_the_port_it_was_put_on() {
    let mut b = FabricBuilder::new(1);
    let ha = b.host("a", 2);
    let hb = b.host("b", 2);
    for p in 0..2 {
        b.link((ha, p), (hb, p), LinkModel::new(10_000_000_000, 1_000));
    }
    let fabric = b.build().unwrap();
    let a = Host::with_ports(
        vec![fabric.port(ha, 0), fabric.port(ha, 1)],
        1 << 20,
        Ipv4Addr::new(10, 0, 0, 1),
        1,
    );
    let bh = Host::with_ports(
        vec![fabric.port(hb, 0), fabric.port(hb, 1)],
        1 << 20,
        Ipv4Addr::new(10, 0, 0, 2),
        2,
    );
    let mut w = Testbed::new(fabric.clone(), vec![a, bh]);
    for (h, qpn) in [(0, 1), (1, 2)] {
        let qp = Qp::new(QpConfig::new(Qpn::new(qpn), QpType::Rc, PD));
        w.hosts[h].insert_qp(qp, 1);
    }
    // Each end sends from its second port to the other's.
    let o = ConnOpts::default();
    w.bring_up((0, 1), (1, 2), (0, 0), &o);
    w.bring_up((1, 2), (0, 1), (0, 0), &o);
    write(&mut w, 0, 1, 10_000);
    assert!(w.drive());
    assert_eq!(w.hosts[0].completions[0].status, WcStatus::Success);
    assert!(fabric.port_stats(ha, 1).tx_bytes > 10_000);
    assert_eq!(fabric.port_stats(ha, 0).tx_bytes, 0);
    assert_eq!(fabric.port_stats(hb, 0).tx_bytes, 0);
}
