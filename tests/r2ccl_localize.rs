//! R2CCL's probe triangulation (seed 003; issue 23) on a rail of three sim nodes: A's
//! connection to B on rail 0 fails; A and B each send a zero-byte RDMA WRITE to the other
//! and to the third node C on the same rail (short-timeout probe QPs, apart from the data
//! path), swap the results, and blame a component. Every single fault — A's NIC, B's NIC,
//! the rail's ToR, the path between A and B only — is blamed on what failed, from both
//! ends, within the probes' retry budget; with no fault every probe gets through.

use ferroce::drivers::sim::LinkModel;
use ferroce::drivers::Port;
use ferroce::reliability::failover::r2ccl::localize::{triangulate, Blame, Probes};
use ferroce::stack::transport::{Payload, SendFlags, SendWr, WcStatus, WrOpcode};
use ferroce::testbed::{rails_n, ConnOpts, PairCut, RailsN, Testbed};

/// Probe QPs on rail 0 (port 0): (from host, its QPN) ↔ (to host, its QPN).
const PAIRS: [((usize, u32), (usize, u32)); 3] = [
    ((0, 0x10), (1, 0x11)),
    ((0, 0x20), (2, 0x21)),
    ((1, 0x30), (2, 0x31)),
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    None,
    ANic,
    BNic,
    Tor,
    Between,
}

fn setup() -> (Testbed, RailsN) {
    let (mut w, r) = rails_n(3, 3, LinkModel::new(100_000_000_000, 2_000), 1 << 16);
    // 32 µs ACK timeout, one retry: a probe fails in about 64 µs.
    let o = ConnOpts {
        timeout: 3,
        retry_cnt: 1,
        ..ConnOpts::default()
    };
    for ((ha, qa), (hb, qb)) in PAIRS {
        w.connect_rc_on(0, ((ha, qa), (hb, qb)), (1, 2), &o);
    }
    (w, r)
}

/// A zero-byte WRITE from QP `qpn` of host `h` to host `to`: its id is the QPN.
fn probe(w: &mut Testbed, h: usize, qpn: u32, to: usize) {
    let rkey = w.hosts[to].keys.rkey;
    let wr = SendWr::new(u64::from(qpn), WrOpcode::Write, Payload::Sges(&[]))
        .remote(0, rkey)
        .flags(SendFlags::SIGNALED);
    w.hosts[h].qp(qpn).post_send(&wr).unwrap();
}

/// Whether host `h`'s probe with id `qpn` completed successfully (`None`: no completion).
fn result(w: &Testbed, h: usize, qpn: u32) -> Option<bool> {
    w.hosts[h]
        .completions
        .iter()
        .find(|c| c.wr_id == u64::from(qpn))
        .map(|c| c.status == WcStatus::Success)
}

fn localize(fault: Fault) -> (Option<Blame>, Option<Blame>, u64) {
    let (mut w, r) = setup();
    let at = 1_000;
    match fault {
        Fault::None => {}
        Fault::ANic => w.fabric.fail_port(r.hosts[0], 0, at, u64::MAX / 4),
        Fault::BNic => w.fabric.fail_port(r.hosts[1], 0, at, u64::MAX / 4),
        Fault::Tor => w.fabric.fail_switch(r.tors[0], at, u64::MAX / 4),
        Fault::Between => {
            let (a, b) = (w.hosts[0].port(0).mac(), w.hosts[1].port(0).mac());
            w.fabric.set_hook(r.tors[0], PairCut(a, b));
        }
    }
    w.fabric.advance_to(at + 1);
    // Both ends probe each other and the third node.
    probe(&mut w, 0, 0x10, 1);
    probe(&mut w, 1, 0x11, 0);
    probe(&mut w, 0, 0x20, 2);
    probe(&mut w, 1, 0x30, 2);
    assert!(w.drive_until(at + 10_000_000), "probes end in bounded time");
    let a = Probes {
        to_peer: result(&w, 0, 0x10),
        to_third: result(&w, 0, 0x20),
    };
    let b = Probes {
        to_peer: result(&w, 1, 0x11),
        to_third: result(&w, 1, 0x30),
    };
    let took = w
        .hosts
        .iter()
        .flat_map(|h| h.completed_at.iter().copied())
        .max()
        .unwrap_or(at)
        - at;
    (triangulate(a, Some(b)), triangulate(b, Some(a)), took)
}

#[test]
fn every_single_fault_on_the_rail_is_blamed_on_what_failed() {
    for (fault, want) in [
        (Fault::None, None),
        (Fault::ANic, Some(Blame::LocalNic)),
        (Fault::BNic, Some(Blame::RemoteNic)),
        (Fault::Tor, Some(Blame::Tor)),
        (Fault::Between, Some(Blame::Link)),
    ] {
        let (from_a, from_b, took) = localize(fault);
        assert_eq!(from_a, want, "{fault:?}, A's verdict");
        assert_eq!(from_b, want.map(Blame::from_peer), "{fault:?}, B's verdict");
        // A failed probe takes its ACK timeout twice (one retry): 2 × 32.8 µs, plus flight.
        assert!(took < 100_000, "{fault:?}: {took} ns");
        eprintln!(
            "{fault:?}: blamed {from_a:?} in {:.1} µs",
            took as f64 / 1e3
        );
    }
}

/// The out-of-band network down together with the data port: B never hears of the error
/// and sends no results, so A decides from its own two probes — its own NIC is still told
/// apart; anything on the far side is `remote-or-link`; nothing hangs.
#[test]
fn with_the_out_of_band_channel_down_an_end_still_knows_its_own_nic() {
    for (fault, want) in [
        (Fault::ANic, Some(Blame::LocalNic)),
        (Fault::BNic, Some(Blame::RemoteOrLink)),
        (Fault::Between, Some(Blame::RemoteOrLink)),
        (Fault::None, None),
    ] {
        let (mut w, r) = setup();
        let at = 1_000;
        match fault {
            Fault::ANic => w.fabric.fail_port(r.hosts[0], 0, at, u64::MAX / 4),
            Fault::BNic => w.fabric.fail_port(r.hosts[1], 0, at, u64::MAX / 4),
            Fault::Between => {
                let (a, b) = (w.hosts[0].port(0).mac(), w.hosts[1].port(0).mac());
                w.fabric.set_hook(r.tors[0], PairCut(a, b));
            }
            Fault::Tor | Fault::None => {}
        }
        w.fabric.advance_to(at + 1);
        // Only A probes: B was never told.
        probe(&mut w, 0, 0x10, 1);
        probe(&mut w, 0, 0x20, 2);
        assert!(w.drive_until(at + 10_000_000), "probes end in bounded time");
        let a = Probes {
            to_peer: result(&w, 0, 0x10),
            to_third: result(&w, 0, 0x20),
        };
        assert!(
            a.to_peer.is_some() && a.to_third.is_some(),
            "{fault:?}: both ended"
        );
        assert_eq!(triangulate(a, None), want, "{fault:?}");
    }
}
