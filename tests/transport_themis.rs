//! Themis as the paper deployed it: software ToRs (switch hooks of the simulated fabric) in
//! front of endpoints running ConnectX-7's selective repeat (RNIC-SR) with plain ECMP. Host
//! `a` streams WRITEs to host `b` over two parallel ToR-to-ToR paths of different delays;
//! the source ToR sprays by PSN, the destination ToR judges the receiver's NACKs.
//!
//! `FERROCE_SEED=N` replays one seed.

mod support;

use ferroce::drivers::sim::{LinkModel, Loss, SwitchId};
use ferroce::reliability::policy::baselines::RnicSr;
use ferroce::reliability::policy::spray::Spray;
use ferroce::reliability::policy::themis::{ThemisConfig, ThemisStats, ThemisTor};
use ferroce::stack::transport::{
    Counters, Mtu, Payload, Policies, QpType, SendWr, Sge, WcStatus, WrOpcode,
};
use support::*;

const MEM: usize = 8 << 20;
const SRC_LEN: usize = 1 << 20;
const DST: usize = 2 << 20;

fn rnic_sr_ecmp() -> Policies {
    Policies::recovery(Box::new(RnicSr::new(512)))
}

fn rnic_sr_sprayed() -> Policies {
    Policies::recovery(Box::new(RnicSr::new(512))).with_path(Box::new(Spray::random(2, 9)))
}

struct Outcome {
    req: Counters,
    resp: Counters,
    /// Themis at the source ToR and at the destination ToR (zero without Themis).
    tor: [ThemisStats; 2],
}

/// Streams `messages` WRITEs from `a` to `b` over `paths`, with Themis on both ToRs or not,
/// and checks every byte and every completion.
fn stream(seed: u64, paths: Vec<(LinkModel, LinkModel)>, themis: bool, messages: usize) -> Outcome {
    let mut rng = Rng(seed);
    let n = paths.len() as u16;
    let mut w = multipath_asym(seed, paths, MEM);
    let stats = themis.then(|| {
        [0, 1].map(|s| {
            let tor = ThemisTor::new(ThemisConfig {
                paths: n,
                seed,
                ..ThemisConfig::default()
            });
            let stats = tor.stats();
            w.fabric.set_hook(SwitchId(s), tor);
            stats
        })
    });
    let fill: Vec<u8> = (0..SRC_LEN).map(|_| rng.next() as u8).collect();
    w.hosts[0].write(0, &fill);
    let o = ConnOpts {
        mtu: Mtu::Mtu1024,
        timeout: 10,
        ..ConnOpts::default()
    };
    let policy: fn() -> Policies = if themis {
        rnic_sr_ecmp
    } else {
        rnic_sr_sprayed
    };
    w.connect(
        QpType::Rc,
        ((0, 0x10), (1, 0x20)),
        (0xff_ff00, 5),
        &o,
        Some(policy),
    );
    let (lkey, rkey) = (w.hosts[0].keys.lkey, w.hosts[1].keys.rkey);
    let mut dst = DST;
    let mut expect = Vec::new();
    for k in 0..messages as u64 {
        let len = rng.range(1, 32 * 1024 + 1) as usize;
        let src = rng.range(0, (SRC_LEN - len) as u64) as usize;
        let sge = [Sge {
            addr: src as u64,
            length: len as u32,
            lkey,
        }];
        let wr = SendWr::new(k, WrOpcode::Write, Payload::Sges(&sge)).remote(dst as u64, rkey);
        w.hosts[0].qp(0x10).post_send(&wr).unwrap();
        expect.push((k, src, dst, len));
        dst += len;
    }
    assert!(dst < MEM);
    assert!(
        w.drive_until(60_000_000_000),
        "did not finish in 60 s of virtual time"
    );

    let (a, b) = (&w.hosts[0], &w.hosts[1]);
    assert_eq!(a.completions.len(), messages);
    for (k, c) in a.completions.iter().enumerate() {
        assert_eq!((c.wr_id, c.status), (k as u64, WcStatus::Success), "{c:?}");
    }
    for &(k, src, at, len) in &expect {
        assert_eq!(
            &b.read(at, len)[..],
            &a.read(src, len)[..],
            "WR {k}: bytes differ"
        );
    }
    let tor = stats.map_or([ThemisStats::default(); 2], |s| s.map(|s| s.snapshot()));
    let req = *a.qps().next().unwrap().counters();
    let resp = *b.qps().next().unwrap().counters();
    Outcome { req, resp, tor }
}

fn both(m: LinkModel) -> (LinkModel, LinkModel) {
    (m.clone(), m)
}

fn path(delay_ns: u64) -> LinkModel {
    let mut m = LinkModel::new(100_000_000_000, delay_ns);
    m.queue_limit_bytes = 16 << 20;
    m
}

#[test]
fn themis_blocks_every_nack_that_reordering_alone_causes() {
    seeded(0..8, |seed| {
        let paths = vec![both(path(1_000)), both(path(4_000))];
        let with = stream(seed, paths.clone(), true, 200);
        let [src, dst] = with.tor;
        assert!(src.sprayed > 1000, "{src:?}");
        // The receiver NACKs as a ConnectX does; none of it reaches the sender.
        assert!(with.resp.naks_sent > 0, "{:?}", with.resp);
        assert_eq!(dst.nacks_invalid + dst.nacks_stashed, with.resp.naks_sent);
        assert_eq!(
            dst.nacks_valid + dst.stash_released + dst.avoidance_signals,
            0
        );
        assert_eq!(with.req.packet_seq_err, 0);
        assert_eq!(with.req.retransmitted_packets, 0, "{:?}", with.req);
        assert_eq!(with.req.local_ack_timeout_err, 0);

        // The same spraying without Themis: the NACKs reach the sender and it resends what
        // was never lost.
        let without = stream(seed, paths, false, 200);
        assert!(without.req.packet_seq_err > 0);
        assert!(without.resp.duplicate_request > 0, "{:?}", without.resp);
    });
}

#[test]
fn themis_passes_the_nacks_of_real_losses_and_reroutes_their_retransmissions() {
    seeded(0..16, |seed| {
        let mut lossy = path(1_000);
        lossy.loss = Loss::Bernoulli(0.01);
        let out = stream(seed, vec![both(lossy), both(path(3_000))], true, 300);
        let [src, dst] = out.tor;
        assert!(dst.nacks_valid + dst.stash_released > 0, "{dst:?}");
        // Every NACK that reached the sender was passed (or released) by Themis-D.
        assert_eq!(
            out.req.packet_seq_err,
            dst.nacks_valid + dst.stash_released + dst.avoidance_signals
        );
        assert!(src.rerouted > 0, "{src:?}");
    });
}

#[test]
fn a_path_with_a_large_out_of_order_degree_is_avoided() {
    seeded(0..4, |seed| {
        // Path 1 dies for a to b 100 µs in (its other direction, which may carry the ACKs,
        // stays up); everything Themis-S designates to it is lost until the destination ToR
        // signals and the source ToR steers around it.
        let dead = path(2_000).flap(100_000, u64::MAX / 4);
        let out = stream(
            seed,
            vec![both(path(1_000)), (dead, path(2_000))],
            true,
            300,
        );
        let [src, dst] = out.tor;
        assert!(dst.avoidance_signals > 0, "{dst:?}");
        assert!(src.paths_avoided > 0 && src.avoided > 0, "{src:?}");
    });
}
