//! `ferroce scenario`: the papers' experiments, run on the simulated fabric in virtual time
//! (no NIC, no root), each printing a table, a `--json` summary and optionally a plot.

//!
//! The experiments themselves are the `ferroce-scenarios` library's; this module is their
//! command line: arguments, tables, JSON and plots.

mod allreduce_report;
mod heatmap;
mod incast_report;
mod plot;
mod timeline;

pub(crate) use ferroce_scenarios::jain;
use ferroce_scenarios::{allreduce, failover, incast, sdr, spray, varuna, varuna_steady};

use std::process::ExitCode;

use serde_json::{json, Value};

use crate::Failure;
use spray::{Scheme, Setup};

#[derive(clap::Args)]
pub(crate) struct Args {
    #[command(subcommand)]
    which: Which,
}

#[derive(clap::Subcommand)]
enum Which {
    /// Themis' testbed (seed 002): 8 hosts, 4 ToRs, 2 spines, ring WRITEs, one lossy link;
    /// tail FCT of every recovery scheme against the loss rate.
    Spray(SprayArgs),
    /// SDR-RDMA's cross-continent experiment (seed 004): one Write at a time over a long,
    /// lossy, fast link; completion time of SR (RTO, NACK) and EC (MDS, XOR) against the drop
    /// rate, beside the completion-time model.
    Sdr(SdrArgs),
    /// SHIFT's experiment (seed 000, Figure 7): a WRITE stream over one of two rails, a NIC,
    /// link, ToR or black-hole fault at 5 ms healed at 10 ms; native failover against none.
    Failover(FailoverArgs),
    /// Varuna's correctness experiment (seed 001): clients share a lock and a counter on a
    /// server (CAS acquire, FETCH_ADD, WRITE, CAS release) while rail 0 fails; resend-only
    /// against Varuna mode and native failover, the final state checked per run.
    Varuna(VarunaArgs),
    /// R2CCL's collective (seed 003): a ring AllReduce over ferroce RC QPs among N hosts
    /// with two NICs each; NIC, path, ToR and partial-degradation faults mid-collective,
    /// localized by probe triangulation and repaired by migration and rollback; plain ring
    /// against R2CCL's bandwidth-aware decomposition.
    Allreduce(allreduce_report::Args),
    /// Congestion control (issue 24): N senders into one receiver through one switch with a
    /// shallow, ECN-marking buffer, beside a long-lived flow; utilization, fairness, queue,
    /// drops and CNPs per scheme (DCQCN with ferroce's and ConnectX's parameters, none).
    Incast(incast_report::Args),
}

#[derive(clap::Args)]
struct VarunaArgs {
    /// Schemes, comma-separated (default: resend, varuna, native).
    #[arg(long, value_delimiter = ',', value_enum)]
    scheme: Vec<varuna::Scheme>,
    /// Faults, comma-separated (default: remote-nic, tor, blackhole).
    #[arg(long, value_delimiter = ',', value_enum)]
    fault: Vec<varuna::Fault>,
    /// Clients (QPs on one host) sharing the lock.
    #[arg(long, default_value_t = 16)]
    clients: usize,
    /// Lock iterations per client.
    #[arg(long, default_value_t = 4)]
    iterations: u64,
    /// Runs per (scheme, fault): seeds `seed` .. `seed + runs` (each seeds the moment of the
    /// fault).
    #[arg(long, default_value_t = 20)]
    runs: u64,
    /// First seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Instead: what the schemes cost while nothing fails — synchronous and batched (64)
    /// WRITEs of --sizes, synchronous CASes, batches of a CAS and three READs; latency and
    /// goodput of none, native and varuna.
    #[arg(long)]
    steady: bool,
    /// --steady: WRITE sizes, comma-separated (suffixes KiB, MiB).
    #[arg(long, value_delimiter = ',', default_value = "16,256,4KiB,64KiB,1MiB", value_parser = parse_small_size)]
    sizes: Vec<usize>,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

/// A size from 1 byte to 1 MiB (suffixes KiB, MiB).
fn parse_small_size(s: &str) -> Result<usize, String> {
    parse_size_within(s, 1, 1 << 20, "16, 4KiB or 1MiB")
}

#[derive(clap::Args)]
struct FailoverArgs {
    /// Faults, comma-separated (default: all five).
    #[arg(long, value_delimiter = ',', value_enum)]
    fault: Vec<failover::Fault>,
    /// Schemes, comma-separated (default: native, shift, varuna, r2ccl, none).
    #[arg(long, value_delimiter = ',', value_enum)]
    scheme: Vec<failover::Scheme>,
    /// Every n-th WR of the stream is a FETCH_ADD (0: WRITEs only). SHIFT refuses to
    /// resubmit while an atomic is outstanding, so with atomics it fails where native
    /// failover carries on.
    #[arg(long, default_value_t = 16)]
    atomic_every: u64,
    /// NIC rate, Gbit/s.
    #[arg(long, default_value_t = 100.0)]
    gbps: f64,
    /// One-way delay of every link, µs.
    #[arg(long, default_value_t = 2.0)]
    delay_us: f64,
    /// WRITE size, bytes.
    #[arg(long, default_value_t = 65536)]
    size: usize,
    /// Local ACK timeout exponent (4.096 µs · 2^n): the detection threshold of a black hole.
    #[arg(long, default_value_t = 5)]
    timeout: u8,
    /// Seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
    /// Write throughput over time (100 µs bins, a panel per fault, a line per scheme) to
    /// this SVG file: SHIFT's Figure 7 in virtual time.
    #[arg(long)]
    plot: Option<std::path::PathBuf>,
}

#[derive(clap::Args)]
struct SdrArgs {
    /// Write sizes, comma-separated (suffixes KiB, MiB, GiB); the paper's grid is 128KiB to
    /// 1GiB (see --full).
    #[arg(long, value_delimiter = ',', default_value = "1MiB,8MiB", value_parser = parse_size)]
    size: Vec<usize>,
    /// Packet drop probabilities, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1e-5,1e-4,1e-3,1e-2")]
    drop: Vec<f64>,
    /// Loss models, comma-separated.
    #[arg(long, value_delimiter = ',', value_enum, default_value = "bernoulli")]
    loss: Vec<sdr::LossModel>,
    /// Schemes (default: all).
    #[arg(long, value_delimiter = ',', value_enum)]
    scheme: Vec<sdr::Choice>,
    /// The paper's grid: 128KiB … 1GiB, drop 1e-6 … 1e-2, both loss models (hours).
    #[arg(long)]
    full: bool,
    /// Writes per point.
    #[arg(long, default_value_t = 20)]
    runs: u32,
    /// Seed of the first point; each point adds its index.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Link rate, Gbit/s.
    #[arg(long, default_value_t = 400.0)]
    gbps: f64,
    /// Round-trip time, ms.
    #[arg(long, default_value_t = 25.0)]
    rtt_ms: f64,
    /// Bitmap chunk bytes (a multiple of the MTU).
    #[arg(long, default_value = "64KiB", value_parser = parse_size)]
    chunk: usize,
    /// Path MTU: 1024, 2048 or 4096.
    #[arg(long, default_value_t = 4096)]
    mtu: u32,
    /// EC's data chunks per submessage.
    #[arg(long, default_value_t = 32)]
    k: u32,
    /// EC's parity chunks per submessage.
    #[arg(long, default_value_t = 8)]
    m: u32,
    /// Write an SVG heat map (Figure 9's shape) of the mean slowdowns here: one panel per
    /// scheme, sizes down, drop rates across (the first loss model only).
    #[arg(long)]
    plot: Option<std::path::PathBuf>,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
    /// Fail unless every point the model covers (Bernoulli loss; SR at any drop rate, EC where
    /// the chunk drop rate is at most 2 % and its fallback rare; not auto) has a mean slowdown within
    /// three standard errors (the model's spread over √runs) of the model's (with the
    /// per-packet bitmap), or 5 %.
    #[arg(long)]
    check: bool,
}

#[derive(clap::Args)]
struct SprayArgs {
    /// Bytes each flow writes (suffixes KiB, MiB, GiB); the paper used 256MiB.
    #[arg(long, default_value = "8MiB", value_parser = parse_size)]
    size: usize,
    /// Loss rates of the lossy ToR-to-spine link, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "0,1e-5,1e-4,1e-3,1e-2")]
    loss: Vec<f64>,
    /// Schemes to run (default: all five).
    #[arg(long, value_delimiter = ',', value_enum)]
    scheme: Vec<Scheme>,
    /// Runs per point, each with its own seed; the tail FCT reported is the mean of the
    /// runs' slowest flows.
    #[arg(long, default_value_t = 3)]
    runs: u32,
    /// First seed; run `k` uses `seed + k`.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Link rate in Gbit/s.
    #[arg(long, default_value_t = 100)]
    gbps: u64,
    /// One-way delay of every link in nanoseconds.
    #[arg(long, default_value_t = 1000)]
    delay_ns: u64,
    /// Write an SVG plot of tail FCT against loss rate here.
    #[arg(long)]
    plot: Option<std::path::PathBuf>,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

/// A size from 4 KiB to 2 GiB (suffixes KiB, MiB, GiB).
pub(crate) fn parse_size(s: &str) -> Result<usize, String> {
    parse_size_within(s, 4096, 1 << 31, "4096, 64KiB or 16MiB")
}

/// A size with an optional binary suffix (KiB, MiB, GiB), within `min ..= max`; the error
/// names `examples` of what is accepted.
fn parse_size_within(s: &str, min: usize, max: usize, examples: &str) -> Result<usize, String> {
    let t = s.trim();
    let (num, mult) = [("GiB", 1usize << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)]
        .iter()
        .find_map(|(suf, m)| t.strip_suffix(suf).map(|n| (n, *m)))
        .unwrap_or((t, 1));
    let n: usize = num
        .trim()
        .parse()
        .map_err(|_| format!("'{s}' is not a size such as {examples}"))?;
    match n.checked_mul(mult) {
        Some(v) if (min..=max).contains(&v) => Ok(v),
        _ => Err(format!(
            "size '{s}' must be between {} and {}",
            short_size(min),
            short_size(max)
        )),
    }
}

/// `n` bytes as the parser would take them back: 1 byte, 4KiB, 1MiB, 2GiB.
fn short_size(n: usize) -> String {
    match n {
        1 => "1 byte".into(),
        n if n % (1 << 30) == 0 => format!("{}GiB", n >> 30),
        n if n % (1 << 20) == 0 => format!("{}MiB", n >> 20),
        n if n % (1 << 10) == 0 => format!("{}KiB", n >> 10),
        n => format!("{n}"),
    }
}

pub(crate) fn run(a: &Args) -> Result<ExitCode, Failure> {
    match &a.which {
        Which::Spray(s) => run_spray(s),
        Which::Sdr(s) => run_sdr(s),
        Which::Failover(f) => run_failover(f),
        Which::Varuna(v) => run_varuna(v),
        Which::Allreduce(a) => allreduce_report::run_cli(a),
        Which::Incast(a) => incast_report::run_cli(a),
    }
}

/// One (scheme, loss rate) point: its runs.
struct Point {
    scheme: Scheme,
    loss: f64,
    runs: Vec<spray::Outcome>,
}

impl Point {
    /// Mean over the runs of the slowest flow, in µs; `None` if a flow failed.
    fn tail_us(&self) -> Option<f64> {
        let tails: Option<Vec<u64>> = self.runs.iter().map(spray::Outcome::tail_ns).collect();
        tails.map(|t| t.iter().sum::<u64>() as f64 / t.len() as f64 / 1e3)
    }

    fn sum(&self, f: impl Fn(&spray::Outcome) -> u64) -> u64 {
        self.runs.iter().map(f).sum()
    }

    fn goodput_ratio(&self, size: usize) -> f64 {
        let useful = (size * spray::FLOWS * self.runs.len()) as f64;
        useful / self.sum(|r| r.wire_bytes).max(1) as f64
    }

    fn verified(&self) -> bool {
        self.runs
            .iter()
            .all(|r| r.verified && r.fct_ns.iter().all(Option::is_some))
    }
}

fn run_spray(a: &SprayArgs) -> Result<ExitCode, Failure> {
    if a.runs == 0 {
        return Err(Failure("--runs must be at least 1".into()));
    }
    if let Some(bad) = a.loss.iter().find(|l| !(0.0..1.0).contains(*l)) {
        return Err(Failure(format!("loss rate {bad} is not in [0, 1)")));
    }
    if a.gbps == 0 {
        return Err(Failure("--gbps must be above zero".into()));
    }
    let schemes = if a.scheme.is_empty() {
        Scheme::ALL.to_vec()
    } else {
        a.scheme.clone()
    };
    let setup = |scheme, loss, seed| Setup {
        size: a.size,
        bps: a.gbps * 1_000_000_000,
        delay_ns: a.delay_ns,
        scheme,
        loss,
        seed,
    };
    let started = std::time::Instant::now();
    let mut points = Vec::new();
    for &loss in &a.loss {
        for &scheme in &schemes {
            let runs = (0..u64::from(a.runs))
                .map(|k| spray::run(&setup(scheme, loss, a.seed + k)))
                .collect();
            points.push(Point { scheme, loss, runs });
        }
    }
    let wall = started.elapsed().as_secs_f64();
    let targets = targets(&points, a.size);
    if let Some(path) = &a.plot {
        let series: Vec<plot::Series<'_>> = schemes
            .iter()
            .map(|&s| {
                let pts = points
                    .iter()
                    .filter(|p| p.scheme == s)
                    .map(|p| (p.loss, p.tail_us()))
                    .collect();
                (s.name(), pts)
            })
            .collect();
        let title = format!(
            "Tail FCT, 8 flows x {} MiB, {} Gbit/s, mean of {} runs",
            a.size >> 20,
            a.gbps,
            a.runs
        );
        std::fs::write(path, plot::svg(&title, &series))
            .map_err(|e| Failure(format!("cannot write the plot to {}: {e}", path.display())))?;
    }
    let all_ok = points.iter().all(Point::verified);
    if a.json {
        let pts: Vec<Value> = points.iter().map(|p| point_json(p, a.size)).collect();
        let out = json!({
            "scenario": "spray",
            "size_bytes": a.size,
            "flows": spray::FLOWS,
            "runs": a.runs,
            "seed": a.seed,
            "gbps": a.gbps,
            "delay_ns": a.delay_ns,
            "window_packets": spray::WINDOW,
            "rto_us": 4.096 * f64::from(1u32 << spray::TIMEOUT),
            "points": pts,
            "targets": targets.iter().map(|t| json!({"target": t.0, "measured": t.1, "met": t.2})).collect::<Vec<_>>(),
            "all_flows_verified": all_ok,
            "wall_seconds": wall,
        });
        println!("{out}");
    } else {
        print_table(a, &points);
        println!();
        for (what, measured, met) in &targets {
            let mark = if *met { "met   " } else { "missed" };
            println!("  target {mark} {what}: {measured}");
        }
        println!(
            "\n{} runs in {wall:.1} s; every flow's bytes verified: {}",
            points.len() * a.runs as usize,
            if all_ok { "yes" } else { "NO" }
        );
    }
    Ok(if all_ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn point_json(p: &Point, size: usize) -> Value {
    let c = |f: fn(&ferroce_stack::transport::Counters) -> u64| p.sum(|r| f(&r.counters));
    let mut themis = serde_json::Map::new();
    if p.scheme == Scheme::SprayThemis {
        let mut t = ferroce_reliability::policy::themis::ThemisStats::default();
        for r in &p.runs {
            t.accumulate(&r.themis);
        }
        for (k, v) in t.iter() {
            themis.insert(k.into(), v.into());
        }
    }
    json!({
        "scheme": p.scheme.name(),
        "loss": p.loss,
        "tail_fct_us": p.tail_us(),
        "tail_fct_us_per_run": p.runs.iter().map(|r| r.tail_ns().map(|t| t as f64 / 1e3)).collect::<Vec<_>>(),
        "goodput_ratio": p.goodput_ratio(size),
        "retransmitted_packets": c(|c| c.retransmitted_packets),
        "spurious_retransmissions": c(|c| c.duplicate_request),
        "nacks_sent": c(|c| c.naks_sent),
        "nacks_received": c(|c| c.packet_seq_err),
        "loss_reports_received": c(|c| c.loss_reports_received),
        "timeouts": c(|c| c.local_ack_timeout_err),
        "link_drops": p.sum(|r| r.link_drops),
        "verified": p.verified(),
        "themis": themis,
    })
}

fn print_table(a: &SprayArgs, points: &[Point]) {
    println!(
        "spray scenario: 8 hosts, 4 ToRs, 2 spines, {} Gbit/s; ring WRITEs of {} bytes; \
         window {} packets, RTO {:.2} ms; {} run(s) per point from seed {}",
        a.gbps,
        a.size,
        spray::WINDOW,
        4.096e-3 * f64::from(1u32 << spray::TIMEOUT),
        a.runs,
        a.seed
    );
    println!(
        "{:>8} {:<20} {:>12} {:>8} {:>8} {:>8} {:>9} {:>9} {:>8} {:>6}",
        "loss",
        "scheme",
        "tail FCT us",
        "goodput",
        "retx",
        "spurious",
        "NACK sent",
        "NACK rcvd",
        "timeouts",
        "drops"
    );
    for p in points {
        let tail = p
            .tail_us()
            .map_or_else(|| "FAILED".to_string(), |t| format!("{t:.1}"));
        println!(
            "{:>8} {:<20} {:>12} {:>8.3} {:>8} {:>8} {:>9} {:>9} {:>8} {:>6}",
            p.loss,
            p.scheme.name(),
            tail,
            p.goodput_ratio(a.size),
            p.sum(|r| r.counters.retransmitted_packets),
            p.sum(|r| r.counters.duplicate_request),
            p.sum(|r| r.counters.naks_sent),
            p.sum(|r| r.counters.packet_seq_err),
            p.sum(|r| r.counters.local_ack_timeout_err),
            p.sum(|r| r.link_drops),
        );
    }
}

/// The targets, checked on what ran: (what, measured, met).
fn targets(points: &[Point], size: usize) -> Vec<(String, String, bool)> {
    let find = |s: Scheme, loss: f64| points.iter().find(|p| p.scheme == s && p.loss == loss);
    let mut out = Vec::new();
    let mut losses: Vec<f64> = points.iter().map(|p| p.loss).collect();
    losses.dedup();
    for &loss in &losses {
        let Some(base) = find(Scheme::SprayRnicSr, loss).and_then(Point::tail_us) else {
            continue;
        };
        if loss >= 1e-4 {
            for s in [Scheme::SpraySr, Scheme::SprayThemis] {
                if let Some(t) = find(s, loss).and_then(Point::tail_us) {
                    let cut = 1.0 - t / base;
                    out.push((
                        format!(
                            "{} tail FCT >= 25% below spray+rnic-sr at loss {loss}",
                            s.name()
                        ),
                        format!("{:.1}% ({t:.1} vs {base:.1} us)", cut * 100.0),
                        cut >= 0.25,
                    ));
                }
            }
        }
    }
    if let Some(to) = find(Scheme::SprayTimeout, 1e-3).and_then(Point::tail_us) {
        for s in [Scheme::SpraySr, Scheme::SprayThemis] {
            if let Some(t) = find(s, 1e-3).and_then(Point::tail_us) {
                out.push((
                    format!(
                        "{} tail FCT >= 3x below spray+timeout-only at loss 0.001",
                        s.name()
                    ),
                    format!("{:.2}x ({t:.1} vs {to:.1} us)", to / t),
                    to / t >= 3.0,
                ));
            }
        }
    }
    if let Some(p) = find(Scheme::SpraySr, 0.0) {
        let retx = p.sum(|r| r.counters.retransmitted_packets);
        out.push((
            "spray+ferroce-sr with reordering only: zero retransmissions".into(),
            format!("{retx}"),
            retx == 0,
        ));
        let ratio = p.goodput_ratio(size);
        out.push((
            "spray+ferroce-sr with reordering only: goodput ratio >= 0.95".into(),
            format!("{ratio:.3}"),
            ratio >= 0.95,
        ));
    }
    out
}

fn run_sdr(a: &SdrArgs) -> Result<ExitCode, Failure> {
    use ferroce_stack::transport::Mtu;
    if a.runs == 0 {
        return Err(Failure("--runs must be at least 1".into()));
    }
    if let Some(bad) = a.drop.iter().find(|d| !(0.0..0.5).contains(*d)) {
        return Err(Failure(format!(
            "drop probability {bad} is not in [0, 0.5)"
        )));
    }
    if !(a.gbps > 0.0 && a.rtt_ms > 0.0) {
        return Err(Failure("--gbps and --rtt-ms must be above zero".into()));
    }
    let mtu = Mtu::from_bytes(a.mtu)
        .filter(|_| a.mtu >= 1024)
        .ok_or_else(|| Failure(format!("--mtu {} is not 1024, 2048 or 4096", a.mtu)))?;
    if !a.chunk.is_multiple_of(a.mtu as usize) {
        return Err(Failure(format!(
            "--chunk {} is not a multiple of the MTU {}",
            a.chunk, a.mtu
        )));
    }
    if a.k == 0 || a.m == 0 || a.k + a.m > 256 {
        return Err(Failure(
            "--k and --m must be at least 1, k + m at most 256".into(),
        ));
    }
    let (sizes, drops, losses) = if a.full {
        (
            (0..=13).map(|i| (128usize << 10) << i).collect::<Vec<_>>(),
            vec![1e-6, 1e-5, 1e-4, 1e-3, 1e-2],
            vec![sdr::LossModel::Bernoulli, sdr::LossModel::GilbertElliott],
        )
    } else {
        (a.size.clone(), a.drop.clone(), a.loss.clone())
    };
    let schemes = if a.scheme.is_empty() {
        sdr::Choice::ALL.to_vec()
    } else {
        a.scheme.clone()
    };
    let rtt_ns = (a.rtt_ms * 1e6) as u64;
    // Every point's setup first (its seed is its place in the grid), then the points run on
    // every core: each is a simulation of its own, so the results are the same in any order.
    let mut grid = Vec::new();
    let mut index = 0u64;
    for &size in &sizes {
        // The loss-free time every slowdown is over: SR, no loss, data only.
        let base = sdr::Setup {
            size: size as u64,
            chunk: a.chunk as u64,
            mtu,
            gbps: a.gbps,
            rtt_ns,
            loss: sdr::LossModel::Bernoulli,
            drop: 0.0,
            scheme: sdr::Choice::SrRto.scheme(a.k, a.m),
            auto: false,
            runs: 1,
            seed: a.seed,
        };
        let lossless = sdr::run(&base).map_err(Failure)?;
        let lossless_ns = lossless.times_ns[0] as f64;
        for &loss in &losses {
            for &drop in &drops {
                for &choice in &schemes {
                    let setup = sdr::Setup {
                        loss,
                        drop,
                        scheme: choice.scheme(a.k, a.m),
                        auto: choice == sdr::Choice::Auto,
                        runs: a.runs,
                        seed: a.seed + index,
                        ..base
                    };
                    index += 1;
                    grid.push((setup, lossless_ns));
                }
            }
        }
    }
    let outcomes = on_every_core(&grid, |(setup, _)| sdr::run(setup));
    let mut points = Vec::new();
    for ((setup, lossless_ns), out) in grid.iter().zip(outcomes) {
        points.push(sdr_point(setup, &out.map_err(Failure)?, *lossless_ns, a));
    }
    if a.json {
        println!("{}", json!({ "scenario": "sdr", "points": points }));
    } else {
        println!(
            "{:>9} {:>8} {:>16} {:>8} {:>8} {:>8} {:>8} {:>8} {:>9} {:>8}",
            "size",
            "scheme",
            "loss",
            "p_pkt",
            "p_chunk",
            "mean",
            "model",
            "p99.9",
            "inflation",
            "ok"
        );
        for p in &points {
            println!(
                "{:>9} {:>8} {:>16} {:>8.0e} {:>8.1e} {:>7.2}x {:>7.2}x {:>7.2}x {:>9.3} {:>8}",
                human(p["size_bytes"].as_u64().unwrap_or(0)),
                p["scheme"].as_str().unwrap_or(""),
                p["loss_model"].as_str().unwrap_or(""),
                p["drop"].as_f64().unwrap_or(0.0),
                p["p_chunk"].as_f64().unwrap_or(0.0),
                p["mean_slowdown"].as_f64().unwrap_or(0.0),
                p["model_mean_slowdown"].as_f64().unwrap_or(0.0),
                p["p999_slowdown"].as_f64().unwrap_or(0.0),
                p["inflation"].as_f64().unwrap_or(0.0),
                p["verified"].as_bool().unwrap_or(false),
            );
        }
    }
    if let Some(path) = &a.plot {
        let rows: Vec<String> = sizes.iter().map(|&n| human(n as u64)).collect();
        let columns: Vec<String> = drops.iter().map(|d| format!("{d:.0e}")).collect();
        let panels: Vec<heatmap::Panel<'_>> = schemes
            .iter()
            .map(|&c| {
                let name = if c == sdr::Choice::Auto {
                    "auto"
                } else {
                    c.scheme(a.k, a.m).name()
                };
                let cell = |size: usize, drop: f64| {
                    points
                        .iter()
                        .find(|p| {
                            p["scheme"] == json!(name)
                                && p["size_bytes"] == json!(size)
                                && p["drop"] == json!(drop)
                                && p["loss_model"] == json!(losses[0].name())
                        })
                        .and_then(|p| p["mean_slowdown"].as_f64())
                };
                heatmap::Panel {
                    title: name,
                    cells: sizes
                        .iter()
                        .map(|&n| drops.iter().map(|&d| cell(n, d)).collect())
                        .collect(),
                }
            })
            .collect();
        let title = format!(
            "SDR: mean Write completion time over the loss-free time, {} Gbit/s, {} ms RTT, {} loss",
            a.gbps,
            a.rtt_ms,
            losses[0].name()
        );
        std::fs::write(path, heatmap::svg(&title, &rows, &columns, &panels))
            .map_err(|e| Failure(format!("cannot write {}: {e}", path.display())))?;
    }
    let mut ok = points.iter().all(|p| p["verified"] == json!(true));
    if a.check {
        for p in points.iter().filter(|p| p["model_checked"] == json!(false)) {
            eprintln!(
                "{} at {} bytes, drop {}: mean slowdown {:.3}, the model's {:.3} (allowed {:.3})",
                p["scheme"].as_str().unwrap_or(""),
                p["size_bytes"],
                p["drop"],
                p["mean_slowdown"].as_f64().unwrap_or(0.0),
                p["model_mean_slowdown"].as_f64().unwrap_or(0.0),
                p["model_tolerance"].as_f64().unwrap_or(0.0)
            );
            ok = false;
        }
    }
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn human(n: u64) -> String {
    match n {
        n if n >= 1 << 30 && n.is_multiple_of(1 << 30) => format!("{}GiB", n >> 30),
        n if n >= 1 << 20 && n.is_multiple_of(1 << 20) => format!("{}MiB", n >> 20),
        n if n >= 1 << 10 && n.is_multiple_of(1 << 10) => format!("{}KiB", n >> 10),
        n => n.to_string(),
    }
}

/// One point's JSON: measured beside the model.
fn sdr_point(s: &sdr::Setup, out: &sdr::Outcome, lossless_ns: f64, a: &SdrArgs) -> Value {
    use ferroce_reliability::sdr::model;
    let (mean, p999) = sdr::mean_p999(&out.times_ns);
    let n = out.times_ns.len().max(1) as f64;
    let var = out
        .times_ns
        .iter()
        .map(|&t| (t as f64 / lossless_ns - mean / lossless_ns).powi(2))
        .sum::<f64>()
        / (n - 1.0).max(1.0);
    let stderr = (var / n).sqrt();
    let m = s.model();
    // For the automatic choice: what choosing right every time would give.
    let predicted = if s.auto {
        let sr = model::analytic(&m, model::Scheme::SrNack);
        let ec = model::analytic(&m, s.scheme);
        if sr.mean <= ec.mean {
            sr
        } else {
            ec
        }
    } else {
        model::analytic(&m, s.scheme)
    };
    let useful = s.size as f64 * out.times_ns.len() as f64;
    let model_mean = predicted.mean / m.lossless();
    // How far a mean of this many runs strays from the model's by chance: the spread of
    // the model's own draws over √runs (the sample's spread is no guide when few runs saw
    // a loss), three of them, and at least 5 %.
    let draws = model::monte_carlo_draws(&m, s.scheme, 4000, 1);
    let dm = draws.iter().sum::<f64>() / draws.len() as f64;
    let sd = (draws.iter().map(|d| (d - dm).powi(2)).sum::<f64>() / draws.len() as f64).sqrt()
        / m.lossless();
    let tolerance = (3.0 * sd / n.sqrt()).max(0.05 * model_mean);
    // SR everywhere; EC while its fallback is rare — the model resends all `k` chunks of a
    // submessage that did not decode, ferroce only the ones missing, which ends sooner.
    let sr = matches!(
        s.scheme,
        model::Scheme::SrRto { .. } | model::Scheme::SrNack
    );
    // The model's losses are independent: Gilbert-Elliott's bursts are compared, not checked.
    let covered = !s.auto && s.loss == sdr::LossModel::Bernoulli && (sr || m.p_chunk() <= 0.02);
    json!({
        "scheme": if s.auto { "auto" } else { s.scheme.name() },
        "k": a.k,
        "m": a.m,
        "mds_codec": if cfg!(feature = "isal") { "isa-l" } else { "rs-simd" },
        "size_bytes": s.size,
        "chunk_bytes": s.chunk,
        "mtu": s.mtu.bytes(),
        "gbps": s.gbps,
        "rtt_ms": s.rtt_ns as f64 / 1e6,
        "rto_us": ferroce_reliability::sdr::reliable::ReliableConfig::new(s.scheme, s.rtt_ns).rto_ns(false) as f64 / 1e3,
        "loss_model": s.loss.name(),
        "drop": s.drop,
        "p_chunk": m.p_chunk(),
        "runs": out.times_ns.len(),
        "lossless_ms": lossless_ns / 1e6,
        "mean_ms": mean / 1e6,
        "mean_slowdown": mean / lossless_ns,
        "p999_slowdown": p999 / lossless_ns,
        "model_mean_slowdown": model_mean,
        "model_p999_slowdown": predicted.p999 / m.lossless(),
        "bytes_on_wire": out.bytes_on_wire,
        "stderr_slowdown": stderr,
        "model_tolerance": tolerance,
        // null where the model does not cover the point (see --check).
        "model_checked": covered.then_some((mean / lossless_ns - model_mean).abs() <= tolerance),
        "inflation": out.bytes_on_wire as f64 / useful.max(1.0),
        "resent_chunks": out.resent_chunks,
        "fallbacks": out.fallbacks,
        "rebuilt_chunks": out.rebuilt_chunks,
        "auto_chose_sr": out.auto_sr,
        "auto_chose_ec": out.auto_ec,
        "auto_last": out.auto_last.map(|d| json!({
            "chose": if d.ec { "ec" } else { "sr-nack" },
            "rtt_ms": d.rtt_ns / 1e6,
            "p_chunk": d.p_chunk,
            "model_sr_mean_ms": d.sr_mean * 1e3,
            "model_ec_mean_ms": d.ec_mean * 1e3,
        })),
        "verified": out.verified,
    })
}

fn run_failover(a: &FailoverArgs) -> Result<ExitCode, Failure> {
    if a.gbps.is_nan() || a.gbps <= 0.0 || a.delay_us < 0.0 || !(4096..=1 << 20).contains(&a.size) {
        return Err(Failure(
            "--gbps must be above zero, --delay-us not negative, --size 4096..1048576".into(),
        ));
    }
    let faults = if a.fault.is_empty() {
        failover::Fault::ALL.to_vec()
    } else {
        a.fault.clone()
    };
    let schemes = if a.scheme.is_empty() {
        vec![
            failover::Scheme::Native,
            failover::Scheme::Shift,
            failover::Scheme::Varuna,
            failover::Scheme::R2ccl,
            failover::Scheme::None,
        ]
    } else {
        a.scheme.clone()
    };
    let mut runs = Vec::new();
    let mut ok = true;
    for &fault in &faults {
        for &scheme in &schemes {
            let s = failover::Setup {
                scheme,
                fault,
                gbps: a.gbps,
                delay_ns: (a.delay_us * 1e3) as u64,
                size: a.size,
                depth: 32,
                timeout: a.timeout,
                fault_at: 5_000_000,
                heal_at: 10_000_000,
                end: 15_000_000,
                bin_ns: 100_000,
                seed: a.seed,
                atomic_every: a.atomic_every,
            };
            let o = failover::run(&s);
            let before = o.bins[..50].iter().sum::<u64>() as f64 / 50.0;
            let dip = o.bins[50..100].iter().copied().min().unwrap_or(0) as f64 / before.max(1.0);
            match scheme {
                failover::Scheme::Native => {
                    ok &= o.verified && o.atomics_ok && o.duplicates_executed == 0 && o.errors == 0;
                }
                // Varuna recovers everything, atomics included, exactly once.
                failover::Scheme::Varuna => {
                    ok &= o.verified && o.atomics_ok && o.duplicates_executed == 0 && o.errors == 0;
                }
                // R2CCL's rollback resends what had no completion: chunks land again on the
                // same bytes, an atomic may run twice (reported, not required).
                failover::Scheme::R2ccl => {
                    ok &= o.verified && o.errors == 0 && o.localized.is_some()
                }
                // SHIFT may refuse (an atomic outstanding) but never runs one twice.
                failover::Scheme::Shift => {
                    ok &= o.verified && o.atomics_ok && o.duplicates_executed == 0;
                }
                failover::Scheme::None => {}
            }
            runs.push(json!({
                "scheme": scheme.name(),
                "fault": fault.name(),
                "detect_us": o.detect_ns.map(|n| n as f64 / 1e3),
                "failover_us": o.failover_ns.map(|n| n as f64 / 1e3),
                "resent_bytes": o.resent_bytes,
                "duplicates_executed": o.duplicates_executed,
                "atomics_ok": o.atomics_ok,
                "verified": o.verified,
                "completed": o.completed,
                "errors": o.errors,
                "migrations": o.migrations,
                "refused": o.refused,
                "log_bytes_per_op": if o.completed > 0 { o.log_bytes as f64 / o.completed as f64 } else { 0.0 },
                "localized": o.localized,
                "localize_us": o.localize_ns.map(|n| n as f64 / 1e3),
                "dip": dip,
                "gbps_bins": o.bins.iter().map(|&b| b as f64 * 8.0 / 100_000.0).collect::<Vec<_>>(),
            }));
        }
    }
    if let Some(path) = &a.plot {
        let panels: Vec<timeline::Panel<'_>> = faults
            .iter()
            .map(|f| {
                let lines = runs
                    .iter()
                    .filter(|r| r["fault"] == f.name())
                    .map(|r| {
                        let bins = r["gbps_bins"]
                            .as_array()
                            .map(|b| b.iter().filter_map(Value::as_f64).collect())
                            .unwrap_or_default();
                        (r["scheme"].as_str().unwrap_or(""), bins)
                    })
                    .collect();
                (f.name(), lines)
            })
            .collect();
        let title = format!(
            "WRITE stream over rail 0, fault at 5 ms, repaired at 10 ms ({} Gbit/s NICs)",
            a.gbps
        );
        std::fs::write(
            path,
            timeline::svg(&title, &panels, 0.1, &[5.0, 10.0], a.gbps),
        )
        .map_err(|e| Failure(format!("cannot write the plot to {}: {e}", path.display())))?;
    }
    if a.json {
        println!(
            "{}",
            json!({ "scenario": "failover", "bin_us": 100, "runs": runs })
        );
    } else {
        println!(
            "{:>10} {:>7} {:>10} {:>12} {:>6} {:>12} {:>5} {:>8} {:>6} {:>6} {:>10}",
            "fault",
            "scheme",
            "detect_us",
            "failover_us",
            "dip",
            "resent",
            "dups",
            "atomics",
            "errors",
            "ok",
            "blamed"
        );
        let us = |v: &Value| v.as_f64().map_or("-".to_string(), |x| format!("{x:.1}"));
        for r in &runs {
            println!(
                "{:>10} {:>7} {:>10} {:>12} {:>6.2} {:>12} {:>5} {:>8} {:>6} {:>6} {:>10}",
                r["fault"].as_str().unwrap_or(""),
                r["scheme"].as_str().unwrap_or(""),
                us(&r["detect_us"]),
                us(&r["failover_us"]),
                r["dip"].as_f64().unwrap_or(0.0),
                r["resent_bytes"].as_u64().unwrap_or(0),
                r["duplicates_executed"].as_u64().unwrap_or(0),
                r["atomics_ok"].as_bool().unwrap_or(false),
                r["errors"].as_u64().unwrap_or(0),
                r["verified"].as_bool().unwrap_or(false),
                r["localized"].as_str().unwrap_or("-"),
            );
        }
    }
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn run_varuna(a: &VarunaArgs) -> Result<ExitCode, Failure> {
    if a.steady {
        return run_varuna_steady(a);
    }
    if !(1..=200).contains(&a.clients) || a.iterations == 0 || a.runs == 0 {
        return Err(Failure(
            "--clients must be 1..200, --iterations and --runs above zero".into(),
        ));
    }
    let schemes = if a.scheme.is_empty() {
        vec![
            varuna::Scheme::Resend,
            varuna::Scheme::Varuna,
            varuna::Scheme::VarunaPool,
            varuna::Scheme::Native,
        ]
    } else {
        a.scheme.clone()
    };
    let faults = if a.fault.is_empty() {
        varuna::Fault::ALL.to_vec()
    } else {
        a.fault.clone()
    };
    let mut rows = Vec::new();
    let mut ok = true;
    for &fault in &faults {
        for &scheme in &schemes {
            let mut runs = Vec::new();
            for seed in a.seed..a.seed + a.runs {
                let o = varuna::run(&varuna::Setup {
                    scheme,
                    fault,
                    clients: a.clients,
                    iterations: a.iterations,
                    seed,
                });
                if scheme != varuna::Scheme::Resend && scheme != varuna::Scheme::None {
                    ok &= o.correct();
                }
                runs.push(o);
            }
            let n = runs.len() as f64;
            let wrong = runs.iter().filter(|o| !o.correct()).count();
            let sum = |f: fn(&varuna::Outcome) -> u64| runs.iter().map(f).sum::<u64>();
            let ops = sum(|o| o.ops);
            let rebuilt: Vec<f64> = runs
                .iter()
                .filter_map(|o| o.rebuilt_all_after_ns)
                .map(|n| n as f64 / 1e6)
                .collect();
            let rebuilt_ms = if rebuilt.is_empty() {
                Value::Null
            } else {
                json!(rebuilt.iter().sum::<f64>() / rebuilt.len() as f64)
            };
            rows.push(json!({
                "scheme": scheme.name(),
                "fault": fault.name(),
                "runs": runs.len(),
                "wrong_runs": wrong,
                "duplicated_updates": sum(|o| o.duplicated),
                "lost_updates": sum(|o| o.lost),
                "bad_releases": sum(|o| o.bad_releases),
                "stuck_runs": runs.iter().filter(|o| o.stuck > 0).count(),
                "dead_clients": sum(|o| o.dead as u64),
                "lock_held_runs": runs.iter().filter(|o| !o.lock_free).count(),
                "mean_finish_ms": runs.iter().map(|o| o.end_ns as f64).sum::<f64>() / n / 1e6,
                "failovers": sum(|o| o.failovers),
                "log_bytes_per_op": if ops > 0 { sum(|o| o.log_bytes) as f64 / ops as f64 } else { 0.0 },
                "backup_qps_at_start": runs[0].backup_qps_at_start,
                "rebuilt": sum(|o| o.rebuilt),
                "mean_rebuilt_all_after_ms": rebuilt_ms,
            }));
        }
    }
    if a.json {
        println!(
            "{}",
            json!({
                "scenario": "varuna",
                "clients": a.clients,
                "iterations": a.iterations,
                "rows": rows,
            })
        );
    } else {
        println!(
            "{:>10} {:>11} {:>5} {:>6} {:>5} {:>5} {:>8} {:>6} {:>5} {:>10} {:>8} {:>8}",
            "fault",
            "scheme",
            "runs",
            "wrong",
            "dups",
            "lost",
            "bad_rel",
            "stuck",
            "held",
            "finish_ms",
            "log_B/op",
            "bkup_qps"
        );
        for r in &rows {
            println!(
                "{:>10} {:>11} {:>5} {:>6} {:>5} {:>5} {:>8} {:>6} {:>5} {:>10.2} {:>8.1} {:>8}",
                r["fault"].as_str().unwrap_or(""),
                r["scheme"].as_str().unwrap_or(""),
                r["runs"].as_u64().unwrap_or(0),
                r["wrong_runs"].as_u64().unwrap_or(0),
                r["duplicated_updates"].as_u64().unwrap_or(0),
                r["lost_updates"].as_u64().unwrap_or(0),
                r["bad_releases"].as_u64().unwrap_or(0),
                r["stuck_runs"].as_u64().unwrap_or(0),
                r["lock_held_runs"].as_u64().unwrap_or(0),
                r["mean_finish_ms"].as_f64().unwrap_or(0.0),
                r["log_bytes_per_op"].as_f64().unwrap_or(0.0),
                r["backup_qps_at_start"].as_u64().unwrap_or(0),
            );
        }
    }
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn run_varuna_steady(a: &VarunaArgs) -> Result<ExitCode, Failure> {
    use varuna_steady::{Scheme, Workload};
    if !(1..=64).contains(&a.clients) {
        return Err(Failure("--clients must be 1..64 with --steady".into()));
    }
    let mut points: Vec<(Workload, usize)> = Vec::new();
    for w in [Workload::SyncWrite, Workload::BatchWrite] {
        points.extend(a.sizes.iter().map(|&s| (w, s)));
    }
    points.push((Workload::SyncCas, 8));
    points.push((Workload::CasReads, 8));
    let mut rows = Vec::new();
    let mut ok = true;
    for &(workload, size) in &points {
        // About 256 MiB per point, at least one operation per client, at most 64.
        let per_op = match workload {
            Workload::BatchWrite => 64 * size,
            _ => size.max(64),
        };
        let ops = ((256usize << 20) / (a.clients * per_op)).clamp(1, 64) as u64;
        let setup = |scheme| varuna_steady::Setup {
            scheme,
            workload,
            size,
            clients: a.clients,
            ops,
        };
        let base = varuna_steady::run(&setup(Scheme::None));
        for scheme in Scheme::ALL {
            let p = if scheme == Scheme::None {
                base
            } else {
                varuna_steady::run(&setup(scheme))
            };
            ok &= p.ok;
            rows.push(json!({
                "workload": workload.name(),
                "size": size,
                "scheme": scheme.name(),
                "ops_per_client": ops,
                "latency_us": p.latency_ns / 1e3,
                "gbps": p.gbps,
                "latency_overhead": p.latency_ns / base.latency_ns.max(1.0) - 1.0,
                "bandwidth_overhead": 1.0 - p.gbps / base.gbps.max(1e-9),
                "ok": p.ok,
            }));
        }
    }
    if a.json {
        println!(
            "{}",
            json!({ "scenario": "varuna-steady", "clients": a.clients, "rows": rows })
        );
    } else {
        println!(
            "{:>14} {:>8} {:>7} {:>11} {:>9} {:>9} {:>9}",
            "workload", "size", "scheme", "latency_us", "gbps", "lat_ovh", "bw_ovh"
        );
        for r in &rows {
            println!(
                "{:>14} {:>8} {:>7} {:>11.3} {:>9.2} {:>8.1}% {:>8.1}%",
                r["workload"].as_str().unwrap_or(""),
                r["size"].as_u64().unwrap_or(0),
                r["scheme"].as_str().unwrap_or(""),
                r["latency_us"].as_f64().unwrap_or(0.0),
                r["gbps"].as_f64().unwrap_or(0.0),
                100.0 * r["latency_overhead"].as_f64().unwrap_or(0.0),
                100.0 * r["bandwidth_overhead"].as_f64().unwrap_or(0.0),
            );
        }
    }
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// `f` of every item, in the items' order, computed on as many threads as the machine has
/// cores, each taking the next item not yet taken.
fn on_every_core<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(items.len().max(1));
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut done: Vec<(usize, R)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(item) = items.get(i) else {
                            return mine;
                        };
                        mine.push((i, f(item)));
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().expect("a grid point's thread panicked"))
            .collect()
    });
    done.sort_by_key(|&(i, _)| i);
    done.into_iter().map(|(_, r)| r).collect()
}
