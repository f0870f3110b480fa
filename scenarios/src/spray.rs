//! `ferroce scenario spray`: the Themis paper's testbed experiment (seed 002, §6.1) on the
//! simulated fabric. Eight hosts on four ToRs and two spines, every link 100 Gbit/s; hosts
//! {0, 2, 4, 6} and {1, 3, 5, 7} each WRITE one message to the next host of their group (a
//! ring permutation, every flow crossing racks); one ToR-to-spine link drops frames at a set
//! rate. Each recovery scheme runs the same workload with the same seeds, and the table shows
//! the slowest flow's completion time against the loss rate.

use std::net::Ipv4Addr;
use std::sync::Arc;

use ferroce_drivers::sim::{EcmpHash, FabricBuilder, LinkModel, LinkStats, Loss, SwitchId};
use ferroce_reliability::policy::themis::{SharedStats, ThemisConfig, ThemisStats, ThemisTor};
use ferroce_reliability::schemes::{Params, PathScheme, RecoveryScheme, Schemes};
use ferroce_stack::transport::{
    Access, Counters, Mtu, Payload, Policies, Qp, QpConfig, QpType, SendWr, Sge, WcStatus, WrOpcode,
};
use ferroce_stack::wire::Qpn;

use ferroce_testbed::{ConnOpts, Host, Testbed, PD};

/// Hosts, ToRs and spines of the testbed.
const HOSTS: usize = 8;
/// One flow per host.
pub const FLOWS: usize = HOSTS;
const TORS: usize = 4;
const SPINES: usize = 2;
/// The TX window of every scheme: ConnectX-7's default, as in the paper.
pub const WINDOW: u32 = 512;
/// Local ACK timeout exponent 10: 4.096 µs × 2^10 ≈ 4.19 ms, the paper's 4 ms RTO.
pub const TIMEOUT: u8 = 10;

/// A recovery scheme of the comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Scheme {
    /// One path per flow (ECMP), IBTA Go-Back-N.
    EcmpGbn,
    /// Random packet spraying with ConnectX-7's selective repeat.
    SprayRnicSr,
    /// Random packet spraying, recovery by the retransmission timer only.
    SprayTimeout,
    /// RNIC-SR endpoints behind Themis ToRs (PSN spraying and NACK validation in the switch).
    SprayThemis,
    /// PSN spraying with ferroce's endpoint selective repeat.
    SpraySr,
}

impl Scheme {
    pub const ALL: [Self; 5] = [
        Self::EcmpGbn,
        Self::SprayRnicSr,
        Self::SprayTimeout,
        Self::SprayThemis,
        Self::SpraySr,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Self::EcmpGbn => "ecmp+gbn",
            Self::SprayRnicSr => "spray+rnic-sr",
            Self::SprayTimeout => "spray+timeout-only",
            Self::SprayThemis => "spray+themis",
            Self::SpraySr => "spray+ferroce-sr",
        }
    }

    /// The schemes every end runs.
    pub fn schemes(self) -> Schemes {
        let paths = SPINES as u16;
        let (recovery, path) = match self {
            Self::EcmpGbn => (RecoveryScheme::GoBackN, PathScheme::Ecmp),
            Self::SprayRnicSr => (RecoveryScheme::RnicSr, PathScheme::Random(paths)),
            Self::SprayTimeout => (RecoveryScheme::TimeoutOnly, PathScheme::Random(paths)),
            // The ToRs spray; the endpoints keep one UDP port, as a ConnectX does.
            Self::SprayThemis => (RecoveryScheme::RnicSr, PathScheme::Ecmp),
            Self::SpraySr => (RecoveryScheme::SelectiveRepeat, PathScheme::Psn(paths)),
        };
        Schemes {
            recovery: Some(recovery),
            path: Some(path),
            cc: None,
        }
    }

    /// The policy of one end of flow `flow`.
    fn policy(self, seed: u64, flow: usize) -> Policies {
        self.schemes().policies(&Params {
            window: Some(WINDOW),
            seed: seed ^ (flow as u64).wrapping_mul(0x51),
            ..Params::default()
        })
    }
}

/// One run: the fabric's parameters, the scheme, the loss rate and the seed.
#[derive(Clone, Copy, Debug)]
pub struct Setup {
    /// Bytes each flow writes.
    pub size: usize,
    /// Link rate in bit/s.
    pub bps: u64,
    /// One-way delay of every link, ns.
    pub delay_ns: u64,
    /// The recovery scheme every QP runs.
    pub scheme: Scheme,
    /// The drop rate of the one lossy ToR-to-spine link.
    pub loss: f64,
    /// The fabric's seed (drops, ECMP salts).
    pub seed: u64,
}

/// What one run (one scheme, one loss rate, one seed) measured.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    /// Completion time of each flow, ns (`None`: it did not complete successfully).
    pub fct_ns: Vec<Option<u64>>,
    /// Bytes every host port put on the wire (data, retransmissions, ACKs, NACKs).
    pub wire_bytes: u64,
    /// Every QP's counters, summed: requester and responder counters are separate fields
    /// (retransmissions and NAKs received on one side, duplicates and NAKs sent on the other).
    pub counters: Counters,
    /// Frames the lossy link dropped (both directions).
    pub link_drops: u64,
    /// Themis on the four ToRs, summed (zero for the other schemes).
    pub themis: ThemisStats,
    /// Every flow's bytes arrived intact.
    pub verified: bool,
}

impl Outcome {
    /// The slowest flow, or `None` if one failed.
    pub fn tail_ns(&self) -> Option<u64> {
        self.fct_ns
            .iter()
            .copied()
            .collect::<Option<Vec<_>>>()
            .and_then(|v| v.into_iter().max())
    }
}

/// The byte flow `flow` writes at offset `i` of its message.
fn pattern(flow: usize, i: usize) -> u8 {
    let x = (i as u64 ^ ((flow as u64) << 40)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (x >> 56) as u8
}

fn link(bps: u64, delay_ns: u64) -> LinkModel {
    let mut m = LinkModel::new(bps, delay_ns);
    // Deep enough that only the lossy link drops: two colliding flows' windows fit.
    m.queue_limit_bytes = 16 << 20;
    m
}

/// One run of `setup.scheme` with one ToR-to-spine link dropping at `setup.loss`.
pub fn run(setup: &Setup) -> Outcome {
    let &Setup {
        scheme, loss, seed, ..
    } = setup;
    let mut b = FabricBuilder::new(seed);
    b.ecmp(EcmpHash::SourcePortModulo).rx_ring(1 << 16);
    let hosts: Vec<_> = (0..HOSTS).map(|i| b.host(&format!("h{i}"), 1)).collect();
    let tors: Vec<_> = (0..TORS).map(|t| b.switch(&format!("tor{t}"))).collect();
    let spines: Vec<_> = (0..SPINES)
        .map(|s| b.switch(&format!("spine{s}")))
        .collect();
    for (i, &h) in hosts.iter().enumerate() {
        b.link((h, 0), tors[i / 2], link(setup.bps, setup.delay_ns));
    }
    let mut lossy = None;
    for &t in &tors {
        for &s in &spines {
            let mut m = link(setup.bps, setup.delay_ns);
            if lossy.is_none() && loss > 0.0 {
                m.loss = Loss::Bernoulli(loss);
            }
            let id = b.link(t, s, m);
            lossy.get_or_insert(id);
        }
    }
    let fabric = b.build().expect("the testbed topology is valid");
    let themis: Vec<Arc<SharedStats>> = if scheme == Scheme::SprayThemis {
        tors.iter()
            .map(|&t| {
                let tor = ThemisTor::new(ThemisConfig {
                    paths: SPINES as u16,
                    window: WINDOW,
                    seed: seed ^ t.0 as u64,
                    ..ThemisConfig::default()
                });
                let stats = tor.stats();
                fabric.set_hook(SwitchId(t.0), tor);
                stats
            })
            .collect()
    } else {
        Vec::new()
    };

    let size = setup.size;
    let nodes = hosts
        .iter()
        .enumerate()
        .map(|(i, &h)| {
            let ip = Ipv4Addr::new(10, 0, 0, i as u8 + 1);
            Host::new(fabric.port(h, 0), 2 * size, ip, seed ^ i as u64)
        })
        .collect();
    let mut w = Testbed::new(fabric.clone(), nodes);
    let mut rng = seed.wrapping_mul(0x2545_f491_4f6c_dd1d) | 1;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let opts = |udp_src_port| ConnOpts {
        mtu: Mtu::Mtu4096,
        timeout: TIMEOUT,
        retry_cnt: 7,
        rnr_retry: 7,
        min_rnr_timer: 1,
        max_rd_atomic: 16,
        access: Access::REMOTE_WRITE.with(Access::REMOTE_READ),
        qkey: 0,
        udp_src_port: Some(udp_src_port),
    };
    let peer = |i: usize| (i + 2) % HOSTS;
    // One end of a connection: an RC QP with its policies, at RTS towards its peer.
    let end = |w: &mut Testbed,
               (h, qpn): (usize, u32),
               (ph, peer_qpn): (usize, u32),
               psn: u32,
               port: u16,
               policies: Policies| {
        let mut qp = Qp::new(QpConfig::new(Qpn::new(qpn), QpType::Rc, PD));
        qp.set_policies(policies);
        w.hosts[h].insert_qp(qp, 0);
        w.bring_up((h, qpn), (ph, peer_qpn), (psn, psn), &opts(port));
    };
    for i in 0..HOSTS {
        let (sq, rq) = (0x100 + i as u32, 0x200 + i as u32);
        let psn = (next() & 0xff_ffff) as u32;
        // Each end its own UDP port: where ECMP puts the flow is up to the hash.
        let (p1, p2) = (
            0xc000 | (next() & 0x3fff) as u16,
            0xc000 | (next() & 0x3fff) as u16,
        );
        let policy = |f| scheme.policy(seed, f);
        end(&mut w, (i, sq), (peer(i), rq), psn, p1, policy(i));
        end(&mut w, (peer(i), rq), (i, sq), psn, p2, policy(i + HOSTS));
    }
    for i in 0..HOSTS {
        let n = &mut w.hosts[i];
        let mut chunk = vec![0u8; 1 << 20];
        for at in (0..size).step_by(chunk.len()) {
            let len = chunk.len().min(size - at);
            for (k, b) in chunk[..len].iter_mut().enumerate() {
                *b = pattern(i, at + k);
            }
            n.write(at, &chunk[..len]);
        }
    }
    for i in 0..HOSTS {
        let rkey = w.hosts[peer(i)].keys.rkey;
        let n = &mut w.hosts[i];
        let sge = [Sge {
            addr: 0,
            length: size as u32,
            lkey: n.keys.lkey,
        }];
        let wr =
            SendWr::new(i as u64, WrOpcode::Write, Payload::Sges(&sge)).remote(size as u64, rkey);
        n.qp(0x100 + i as u32).post_send(&wr).expect("one WR fits");
    }
    // A flow that cannot finish in a virtual minute has failed; the run reports it.
    w.drive_until(60_000_000_000);

    let mut out = Outcome {
        verified: true,
        ..Outcome::default()
    };
    for (i, &h) in hosts.iter().enumerate() {
        let n = &w.hosts[i];
        let done = n
            .completions
            .iter()
            .zip(&n.completed_at)
            .find(|(c, _)| c.wr_id == i as u64 && c.qp_num.value() == 0x100 + i as u32);
        out.fct_ns
            .push(done.and_then(|(c, &t)| (c.status == WcStatus::Success).then_some(t)));
        out.wire_bytes += fabric.port_stats(h, 0).tx_bytes;
        out.counters.accumulate(&n.counters());
    }
    for i in 0..HOSTS {
        let n = &w.hosts[i];
        let src = (i + HOSTS - 2) % HOSTS;
        let chunk = 1 << 20;
        for at in (0..size).step_by(chunk) {
            let len = chunk.min(size - at);
            let got = n.read(size + at, len);
            if got
                .iter()
                .enumerate()
                .any(|(k, &b)| b != pattern(src, at + k))
            {
                out.verified = false;
                break;
            }
        }
    }
    if let Some(id) = lossy {
        let [a, b]: [LinkStats; 2] = fabric.link_stats(id);
        out.link_drops = a.dropped_loss + b.dropped_loss;
    }
    for s in themis {
        out.themis.accumulate(&s.snapshot());
    }
    out
}
