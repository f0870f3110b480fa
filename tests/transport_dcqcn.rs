//! DCQCN end to end on the simulated fabric (issue 24): `k` senders WRITE into one receiver
//! through one switch whose port towards the receiver marks ECN-capable frames RED-style
//! (the DCQCN paper's thresholds at 100 Gbit/s) and drops beyond a 1 MB buffer. The
//! receiver's QPs answer CE marks with CNPs (the notification point), the senders' DCQCN
//! (the reaction point) paces them down; without congestion control the same incast
//! overflows the buffer. Every byte is checked either way.

use ferroce::drivers::sim::{LinkModel, Red};
use ferroce::reliability::cc::dcqcn::{Dcqcn, DcqcnConfig};
use ferroce::stack::transport::{
    Mtu, Payload, Policies, QpType, SendFlags, SendWr, Sge, WcStatus, WrOpcode,
};
use ferroce::testbed::{star, ConnOpts};

const G100: u64 = 100_000_000_000;
const MSG: usize = 64 * 1024;
/// Per sender: its source bytes at `SRC`, its region at the receiver at `DST + s · REGION`.
const SRC: usize = 0;
const DST: usize = 8 << 20;
const REGION: usize = 4 << 20;
const MEM: usize = 32 << 20;

fn dcqcn() -> Policies {
    Policies::default().with_congestion(Box::new(Dcqcn::new(DcqcnConfig::mlx5(G100))))
}

#[derive(Debug, Default)]
struct Outcome {
    drops: u64,
    marked: u64,
    cnps_sent: u64,
    cnps_handled: u64,
    completed: u64,
    end_ns: u64,
    intact: bool,
}

/// `k` senders, `msgs` WRITEs of 64 KiB each, `depth` outstanding per sender.
fn incast(seed: u64, k: usize, msgs: u64, depth: u64, cc: bool) -> Outcome {
    let mut m = LinkModel::new(G100, 1_000);
    m.queue_limit_bytes = 1 << 20;
    m.ecn = Some(Red::dcqcn(G100));
    let (mut w, sw) = star(seed, k + 1, m, MEM);
    let o = ConnOpts {
        mtu: Mtu::Mtu4096,
        timeout: 8,
        ..ConnOpts::default()
    };
    let policies: Option<fn() -> Policies> = cc.then_some(dcqcn as fn() -> Policies);
    for s in 1..=k {
        w.connect(
            QpType::Rc,
            ((s, 0x100 + s as u32), (0, 0x200 + s as u32)),
            (1, 1),
            &o,
            policies,
        );
        let pattern: Vec<u8> = (0..MSG).map(|i| (i * 7 + s * 31) as u8).collect();
        w.hosts[s].write(SRC, &pattern);
    }
    let mut posted = vec![0u64; k + 1];
    let mut seen = vec![0usize; k + 1];
    let mut done = vec![0u64; k + 1];
    let mut ok = true;
    let deadline = 200_000_000;
    let mut idle = false;
    loop {
        for s in 1..=k {
            while posted[s] < msgs && posted[s] - done[s] < depth {
                let sge = [Sge {
                    addr: SRC as u64,
                    length: MSG as u32,
                    lkey: w.hosts[s].keys.lkey,
                }];
                let at = DST + (s - 1) * REGION + (posted[s] as usize % (REGION / MSG)) * MSG;
                let rkey = w.hosts[0].keys.rkey;
                let wr = SendWr::new(posted[s], WrOpcode::Write, Payload::Sges(&sge))
                    .remote(at as u64, rkey)
                    .flags(SendFlags::SIGNALED);
                w.hosts[s].qp(0x100 + s as u32).post_send(&wr).unwrap();
                posted[s] += 1;
            }
            let fresh = &w.hosts[s].completions[seen[s]..];
            ok &= fresh.iter().all(|c| c.status == WcStatus::Success);
            done[s] += fresh.len() as u64;
            seen[s] = w.hosts[s].completions.len();
        }
        // Idle twice in a row (the last turn's completions taken in between): done or stuck.
        if (1..=k).all(|s| done[s] == msgs) || w.now() > deadline || idle {
            break;
        }
        idle = w.step(deadline) == ferroce::testbed::Step::Idle;
    }
    let mut out = Outcome {
        end_ns: w.now(),
        completed: done.iter().sum(),
        ..Outcome::default()
    };
    for l in w.fabric.links_of_switch(sw) {
        for d in w.fabric.link_stats(l) {
            out.drops += d.dropped_queue;
            out.marked += d.ecn_marked;
        }
    }
    out.cnps_sent = w.hosts[0].counters().np_cnp_sent;
    out.cnps_handled = (1..=k).map(|s| w.hosts[s].counters().rp_cnp_handled).sum();
    out.intact = ok
        && (1..=k).all(|s| {
            let pattern: Vec<u8> = (0..MSG).map(|i| (i * 7 + s * 31) as u8).collect();
            w.hosts[0].read(DST + (s - 1) * REGION, MSG) == pattern
        });
    out
}

/// Four senders, 64 WRITEs of 64 KiB each, 16 outstanding: without congestion control the
/// switch's 1 MB buffer overflows and Go-Back-N resends; with DCQCN the receiver's CNPs
/// pace the senders, and fewer frames are lost. Both deliver every byte.
#[test]
fn dcqcn_paces_an_incast_that_overflows_without_it() {
    let seed = 5;
    let none = incast(seed, 4, 64, 16, false);
    let dc = incast(seed, 4, 64, 16, true);
    eprintln!("seed {seed}: none {none:?}\ndcqcn {dc:?}");
    for o in [&none, &dc] {
        assert!(o.intact, "seed {seed}: {o:?}");
        assert_eq!(o.completed, 4 * 64, "seed {seed}: {o:?}");
        assert!(o.end_ns < 200_000_000, "before the deadline: {o:?}");
        assert!(o.marked > 0, "the queue built up: {o:?}");
    }
    assert!(
        none.drops > 0,
        "the incast overflows without control: {none:?}"
    );
    assert!(dc.cnps_sent > 0 && dc.cnps_handled > 0, "{dc:?}");
    assert!(
        dc.cnps_handled <= dc.cnps_sent,
        "every CNP heard was one sent: {dc:?}"
    );
    assert!(dc.drops < none.drops, "none {none:?}, dcqcn {dc:?}");
}

fn dcqcn_windowed() -> Policies {
    Policies::default().with_congestion(Box::new(Dcqcn::new(DcqcnConfig::ferroce(G100))))
}

/// A window narrower than the AckReq spacing (ferroce's DCQCN: one BDP, 15 frames of 4 KiB
/// at 100 Gbit/s and 5 µs) asks for an ACK every half window as well as at its edge, so
/// it opens again before it is spent; asking only at the edge would answer once per
/// window (about 64 / 15 ACKs for 64 packets), the flow stopping for a round trip each
/// time.
#[test]
fn a_narrow_window_asks_for_acks_every_half_window() {
    let mut w = ferroce::testbed::pair(7, LinkModel::new(G100, 1_000), MEM);
    let o = ConnOpts {
        mtu: Mtu::Mtu4096,
        ..ConnOpts::default()
    };
    w.connect(
        QpType::Rc,
        ((0, 0x11), (1, 0x22)),
        (0, 0),
        &o,
        Some(dcqcn_windowed),
    );
    let len = 64 * 4096;
    let pattern: Vec<u8> = (0..len).map(|i| (i * 5 + 3) as u8).collect();
    w.hosts[0].write(SRC, &pattern);
    let sge = [Sge {
        addr: SRC as u64,
        length: len as u32,
        lkey: w.hosts[0].keys.lkey,
    }];
    let rkey = w.hosts[1].keys.rkey;
    let wr = SendWr::new(1, WrOpcode::Write, Payload::Sges(&sge))
        .remote(DST as u64, rkey)
        .flags(SendFlags::SIGNALED);
    w.hosts[0].qp(0x11).post_send(&wr).unwrap();
    assert!(w.drive());
    assert_eq!(w.hosts[0].completions.len(), 1);
    assert_eq!(w.hosts[0].completions[0].status, WcStatus::Success);
    assert_eq!(w.hosts[1].read(DST, len), pattern);
    let sender = w.hosts[0].qp(0x11).counters();
    assert_eq!(sender.tx_packets, 64, "no packet sent twice");
    assert_eq!(sender.local_ack_timeout_err, 0);
    // AckReq every 7 PSNs (half of 15) and on the last: PSNs 6, 13, …, 62, 63.
    let acks = w.hosts[1].qp(0x22).counters().acks_sent;
    assert!(acks >= 9, "{acks} ACKs: asked only at the window's edge");
}
