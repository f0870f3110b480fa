//! `ferroce scenario incast`: `n` senders WRITE into one receiver through one switch, beside
//! a long-lived flow from one more sender that runs the whole time; the switch's port
//! towards the receiver is the bottleneck — a shallow buffer (tail drop beyond it) with RED
//! ECN marking (the DCQCN paper's thresholds scaled to the link). The incast senders start
//! together after the long flow has the link to itself. Per scheme: how much of the
//! bottleneck the flows use and how fairly (Jain's index) once converged, how long the
//! queue gets, what is dropped, how many CNPs the receiver sends, and when every incast
//! sender has delivered its first `burst` bytes. Every byte is checked.

use ferroce_drivers::sim::{LinkModel, Red};
use ferroce_reliability::schemes::{CcScheme, Params, Schemes};
use ferroce_stack::transport::{
    Mtu, Payload, Policies, QpType, SendFlags, SendWr, Sge, WcStatus, WrOpcode,
};
use ferroce_testbed::{star, ConnOpts};

/// Congestion control of every sender.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Scheme {
    /// DCQCN with ferroce's parameters.
    Dcqcn,
    /// DCQCN with ConnectX's defaults.
    #[cfg_attr(feature = "clap", value(name = "dcqcn-mlx5"))]
    DcqcnMlx5,
    /// TIMELY (delay-based), ferroce's parameters.
    Timely,
    /// None (a restart window after a rewind only).
    None,
}

impl Scheme {
    pub fn name(self) -> &'static str {
        match self {
            Self::Dcqcn => "dcqcn",
            Self::DcqcnMlx5 => "dcqcn-mlx5",
            Self::Timely => "timely",
            Self::None => "none",
        }
    }

    fn policies(self, line: u64) -> Option<Policies> {
        let cc = match self {
            Self::Dcqcn => CcScheme::Dcqcn,
            Self::DcqcnMlx5 => CcScheme::DcqcnMlx5,
            Self::Timely => CcScheme::Timely,
            Self::None => return None,
        };
        let schemes = Schemes {
            cc: Some(cc),
            ..Schemes::IBTA
        };
        Some(schemes.policies(&Params {
            line_bps: line,
            ..Params::default()
        }))
    }
}

/// One run.
#[derive(Clone, Debug)]
pub struct Setup {
    pub senders: usize,
    pub scheme: Scheme,
    pub gbps: f64,
    pub delay_ns: u64,
    /// The bottleneck's buffer.
    pub buffer: usize,
    /// The bottleneck's marking probability at Kmax (Kmin and Kmax the DCQCN paper's, scaled).
    pub pmax: f64,
    /// Every QP's local ACK timeout exponent (4.096 µs × 2^timeout).
    pub timeout: u8,
    /// WRITE size and WRs outstanding per sender.
    pub msg: usize,
    pub depth: u64,
    /// When the incast senders start, and when everyone stops.
    pub start_ns: u64,
    pub end_ns: u64,
    /// Bytes an incast sender's completion time counts.
    pub burst: u64,
    pub bin_ns: u64,
    pub seed: u64,
    /// Instead of `senders` incast flows and a long one: these flows, each sending in
    /// `[join, leave)` (the staggered run).
    pub windows: Option<Vec<(u64, u64)>>,
}

/// What a run measured.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    /// Goodput over the bottleneck's rate, in the second half of the incast.
    pub utilization: f64,
    /// Jain's index over every flow's goodput then.
    pub jain: f64,
    /// The bottleneck queue, sampled every microsecond over the same half (bytes).
    pub queue_p50: usize,
    pub queue_p99: usize,
    /// And its maximum over the whole run.
    pub queue_max: usize,
    pub drops: u64,
    /// Flows whose QP completed a WR in error (retries exhausted): they stop there. An
    /// outcome, not a failure of the run: an RC QP gives up after `retry_cnt` timeouts.
    pub errors: u64,
    pub marked: u64,
    pub cnps: u64,
    /// When the last incast sender had delivered `burst` bytes, from the start (ns).
    pub fct_ns: Option<u64>,
    pub verified: bool,
    /// Goodput per flow per bin, Gbit/s (the long flow last).
    pub bins: Vec<Vec<f64>>,
}

const SRC: usize = 0;
const REGION: usize = 1 << 20;

fn pattern(s: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 13 + s * 29 + 1) as u8).collect()
}

/// Runs `s`.
pub fn run(s: &Setup) -> Outcome {
    let line = (s.gbps * 1e9) as u64;
    let mut m = LinkModel::new(line, s.delay_ns);
    m.queue_limit_bytes = s.buffer;
    m.ecn = Some(Red {
        pmax: s.pmax,
        ..Red::dcqcn(line)
    });
    // Each flow sends in [join, leave): the incast senders from the start, the long flow
    // all along — or the staggered run's windows.
    let windows: Vec<(u64, u64)> = s.windows.clone().unwrap_or_else(|| {
        let mut v = vec![(s.start_ns, s.end_ns); s.senders];
        v.push((0, s.end_ns));
        v
    });
    let flows = windows.len();
    let mem = REGION * (flows + 1);
    let (mut w, sw) = star(s.seed, flows + 1, m, mem);
    let o = ConnOpts {
        mtu: Mtu::Mtu4096,
        timeout: s.timeout,
        ..ConnOpts::default()
    };
    for f in 1..=flows {
        w.connect(
            QpType::Rc,
            ((f, 0x100 + f as u32), (0, 0x200 + f as u32)),
            (1, 1),
            &o,
            None,
        );
        if let Some(p) = s.scheme.policies(line) {
            w.hosts[f].qp(0x100 + f as u32).set_policies(p);
        }
        w.hosts[f].write(SRC, &pattern(f, s.msg));
    }
    let bottleneck = w
        .fabric
        .link_of_port(ferroce_drivers::sim::HostId(0), 0)
        .expect("the receiver's link");
    let n_bins = (s.end_ns / s.bin_ns + 1) as usize;
    let mut bins = vec![vec![0u64; n_bins]; flows];
    let mut delivered = vec![0u64; flows];
    let mut fct: Vec<Option<u64>> = vec![None; flows];
    let (mut posted, mut done, mut seen) = (vec![0u64; flows], vec![0u64; flows], vec![0; flows]);
    let half = s.start_ns + (s.end_ns - s.start_ns) / 2;
    let mut in_half = vec![0u64; flows];
    let mut samples: Vec<usize> = Vec::new();
    let mut queue_max = 0;
    let mut next_sample = 0u64;
    let mut failed = vec![false; flows];
    let deadline = s.end_ns + 50_000_000;
    let mut idle = false;
    loop {
        let now = w.now();
        while next_sample <= now {
            let q = w.fabric.queue_bytes(bottleneck, 1);
            queue_max = queue_max.max(q);
            if next_sample >= half && next_sample < s.end_ns {
                samples.push(q);
            }
            next_sample += 1_000;
        }
        for (i, f) in (1..=flows).enumerate() {
            let long = s.windows.is_none() && f == flows;
            let (join, leave) = windows[i];
            let active = now < s.end_ns && now >= join && now < leave && !failed[i];
            while active && posted[i] - done[i] < s.depth {
                let sge = [Sge {
                    addr: SRC as u64,
                    length: s.msg as u32,
                    lkey: w.hosts[f].keys.lkey,
                }];
                let slot = (posted[i] as usize * s.msg) % REGION;
                let at = REGION * f + slot.min(REGION - s.msg);
                let rkey = w.hosts[0].keys.rkey;
                let wr = SendWr::new(posted[i], WrOpcode::Write, Payload::Sges(&sge))
                    .remote(at as u64, rkey)
                    .flags(SendFlags::SIGNALED);
                if w.hosts[f].qp(0x100 + f as u32).post_send(&wr).is_err() {
                    break;
                }
                posted[i] += 1;
            }
            let host = &w.hosts[f];
            for (c, &t) in host.completions[seen[i]..]
                .iter()
                .zip(&host.completed_at[seen[i]..])
            {
                done[i] += 1;
                if c.status != WcStatus::Success {
                    // The QP is in error; what it flushes was not delivered.
                    failed[i] = true;
                    continue;
                }
                delivered[i] += s.msg as u64;
                if let Some(b) = bins[i].get_mut((t / s.bin_ns) as usize) {
                    *b += s.msg as u64;
                }
                if t >= half && t < s.end_ns {
                    in_half[i] += s.msg as u64;
                }
                if !long && fct[i].is_none() && delivered[i] >= s.burst {
                    fct[i] = Some(t - s.start_ns);
                }
            }
            seen[i] = host.completions.len();
        }
        let finished = now >= s.end_ns && (0..flows).all(|i| done[i] == posted[i]);
        if finished || now > deadline || idle {
            break;
        }
        let until = if now < s.end_ns {
            let edge = windows
                .iter()
                .flat_map(|&(a, b)| [a, b])
                .filter(|&t| t > now)
                .min()
                .unwrap_or(s.end_ns);
            next_sample.min(edge).min(s.end_ns)
        } else {
            deadline
        };
        idle = match w.step(until) {
            ferroce_testbed::Step::Idle | ferroce_testbed::Step::Beyond => {
                if now < s.end_ns {
                    w.fabric.advance_to(until.max(now + 1));
                    false
                } else {
                    true
                }
            }
            _ => false,
        };
    }
    let mut out = Outcome {
        queue_max,
        errors: failed.iter().filter(|&&f| f).count() as u64,
        // Every flow that completed a WRITE put its bytes where they belong (a flow that
        // failed before its first is counted in `errors`, not here).
        verified: (1..=flows).all(|f| {
            delivered[f - 1] == 0 || w.hosts[0].read(REGION * f, s.msg) == pattern(f, s.msg)
        }),
        ..Outcome::default()
    };
    for l in w.fabric.links_of_switch(sw) {
        for d in w.fabric.link_stats(l) {
            out.drops += d.dropped_queue;
            out.marked += d.ecn_marked;
        }
    }
    out.cnps = w.hosts[0].counters().np_cnp_sent;
    let span = (s.end_ns - half) as f64;
    let total: u64 = in_half.iter().sum();
    out.utilization = total as f64 * 8.0 / (s.gbps * span);
    out.jain = crate::jain(&in_half);
    samples.sort_unstable();
    let pct = |p: f64| {
        samples
            .get(((samples.len().max(1) - 1) as f64 * p).round() as usize)
            .copied()
            .unwrap_or(0)
    };
    out.queue_p50 = pct(0.5);
    out.queue_p99 = pct(0.99);
    out.fct_ns = fct[..s.senders]
        .iter()
        .copied()
        .collect::<Option<Vec<u64>>>()
        .and_then(|v| v.into_iter().max());
    out.bins = bins
        .iter()
        .map(|b| {
            b.iter()
                .map(|&x| x as f64 * 8.0 / s.bin_ns as f64)
                .collect()
        })
        .collect();
    out
}

/// One event of the staggered run: when, how many flows send after it, their fair share,
/// and how long until every one of them was within 20 % of it for three bins in a row.
#[derive(Clone, Debug)]
pub struct Event {
    pub at_ns: u64,
    pub joined: bool,
    pub active: usize,
    pub fair_gbps: f64,
    pub converge_ns: Option<u64>,
}

/// The events of `windows` (joins and leaves after the first join, before `end`) and their
/// convergence in `bins` (Gbit/s per flow per `bin_ns`).
pub fn convergence(
    windows: &[(u64, u64)],
    bins: &[Vec<f64>],
    bin_ns: u64,
    end: u64,
    gbps: f64,
) -> Vec<Event> {
    let first = windows.iter().map(|w| w.0).min().unwrap_or(0);
    let mut times: Vec<(u64, bool)> = windows
        .iter()
        .flat_map(|&(a, b)| [(a, true), (b, false)])
        .filter(|&(t, _)| t > first && t < end)
        .collect();
    times.sort_unstable();
    times.dedup();
    let mut out = Vec::new();
    for (k, &(at, joined)) in times.iter().enumerate() {
        let next = times.get(k + 1).map_or(end, |t| t.0);
        let active: Vec<usize> = (0..windows.len())
            .filter(|&f| windows[f].0 <= at && at < windows[f].1)
            .collect();
        let fair = gbps / active.len().max(1) as f64;
        let (b0, b1) = (at.div_ceil(bin_ns) as usize, (next / bin_ns) as usize);
        let near = |b: usize| {
            active.iter().all(|&f| {
                let x = bins[f].get(b).copied().unwrap_or(0.0);
                (x - fair).abs() <= 0.2 * fair
            })
        };
        let converge_ns = (b0..b1.saturating_sub(2))
            .find(|&b| near(b) && near(b + 1) && near(b + 2))
            .map(|b| (b as u64 * bin_ns).saturating_sub(at));
        out.push(Event {
            at_ns: at,
            joined,
            active: active.len(),
            fair_gbps: fair,
            converge_ns,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two flows, the second joining at 1 ms (bins of 100 µs): fair share 50 Gbit/s, reached
    /// by both from bin 13 on — 300 µs after the join; the first leaving at 2 ms leaves the
    /// second alone, at 100 Gbit/s from bin 20: 0 µs. A flow that never gets there: never.
    #[test]
    fn convergence_by_hand() {
        let windows = [(0, 2_000_000), (1_000_000, 3_000_000)];
        let first = |b: usize| match b {
            0..10 => 100.0,
            10..13 => 80.0,
            13..20 => 50.0,
            _ => 0.0,
        };
        let second = |b: usize| match b {
            0..10 => 0.0,
            10..13 => 20.0,
            13..20 => 50.0,
            _ => 100.0,
        };
        let mut bins = vec![
            (0..31).map(first).collect::<Vec<f64>>(),
            (0..31).map(second).collect::<Vec<f64>>(),
        ];
        let ev = convergence(&windows, &bins, 100_000, 3_000_000, 100.0);
        assert_eq!(ev.len(), 2);
        assert!(ev[0].joined && ev[0].active == 2 && ev[0].fair_gbps == 50.0);
        assert_eq!(ev[0].converge_ns, Some(300_000));
        assert!(!ev[1].joined && ev[1].active == 1);
        assert_eq!(ev[1].converge_ns, Some(0));
        bins[1] = vec![10.0; 31];
        let ev = convergence(&windows, &bins, 100_000, 3_000_000, 100.0);
        assert_eq!(ev[0].converge_ns, None);
    }
}
