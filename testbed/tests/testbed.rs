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

/// SHIFT's rail-optimized testbed: each rail carries its own connection; a ToR fault takes
/// its rail down (both hosts' ports on it see the link down) while the other rail carries on;
/// the clock stops at the fault's start and end; a black hole keeps the carrier up and loses
/// everything; a WRITE caught by the fault completes once the rail is back.
#[test]
fn rails_carry_one_connection_each_and_a_fault_cuts_only_its_rail() {
    use ferroce_drivers::{LinkState, Port};
    let (mut w, r) = ferroce_testbed::rails(3, LinkModel::new(100_000_000_000, 1_000), 1 << 20);
    let o = ConnOpts::default();
    for rail in 0..2u32 {
        let (qa, qb) = (10 + rail, 20 + rail);
        w.hosts[0].insert_qp(
            Qp::new(QpConfig::new(Qpn::new(qa), QpType::Rc, PD)),
            rail as usize,
        );
        w.hosts[1].insert_qp(
            Qp::new(QpConfig::new(Qpn::new(qb), QpType::Rc, PD)),
            rail as usize,
        );
        w.bring_up((0, qa), (1, qb), (0, 0), &o);
        w.bring_up((1, qb), (0, qa), (0, 0), &o);
    }
    let (down_at, up_at) = (50_000, 400_000);
    w.fabric.fail_switch(r.tors[0], down_at, up_at);
    // Both rails work before the fault.
    write(&mut w, 0, 10, 4096);
    write(&mut w, 0, 11, 4096);
    assert!(w.drive_until(down_at - 1), "all done before the fault");
    assert_eq!(w.hosts[0].completions.len(), 2);
    // Idle before the fault: the next change is the fault itself.
    assert_eq!(w.fabric.next_event(), None);
    assert_eq!(w.fabric.next_link_change(), Some(down_at));
    w.fabric.advance_to(down_at);
    for h in 0..2 {
        assert_eq!(w.hosts[h].port(0).link_state(), LinkState::Down, "host {h}");
        assert_eq!(w.hosts[h].port(1).link_state(), LinkState::Up, "host {h}");
    }
    // During the fault: rail 1 completes, rail 0's WRITE waits for the rail to come back.
    write(&mut w, 0, 10, 4096);
    write(&mut w, 0, 11, 4096);
    assert!(!w.drive_until(up_at - 1));
    let done: Vec<u64> = w.hosts[0].completions.iter().map(|c| c.wr_id).collect();
    assert_eq!(done.len(), 3, "{done:?}");
    let stats = w.fabric.link_stats(r.links[0][0]);
    assert!(stats[0].dropped_down > 0, "{stats:?}");
    assert!(w.drive());
    assert_eq!(w.hosts[0].completions.len(), 4);
    assert!(w.hosts[0]
        .completions
        .iter()
        .all(|c| c.status == WcStatus::Success));
    assert_eq!(w.hosts[0].port(0).link_state(), LinkState::Up);
    // A black hole on rail 1: the carrier stays up, the frames vanish.
    let now = w.now();
    w.fabric.blackhole_link(r.links[0][1], now, now + 100_000);
    write(&mut w, 0, 11, 4096);
    assert!(!w.drive_until(now + 99_000));
    assert_eq!(w.hosts[0].port(1).link_state(), LinkState::Up);
    assert!(w.fabric.link_stats(r.links[0][1])[0].dropped_blackhole > 0);
    assert_eq!(
        w.hosts[0].completions.len(),
        4,
        "nothing got through the hole"
    );
    assert!(w.drive());
    assert_eq!(w.hosts[0].completions.len(), 5);
}
