//! `ferroce scenario`: the papers' experiments, run on the simulated fabric in virtual time
//! (no NIC, no root), each printing a table, a `--json` summary and optionally a plot.

mod plot;
mod spray;

use std::process::ExitCode;

use serde_json::{json, Value};

use crate::Failure;
use spray::{Run, Scheme, Setup};

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

pub(crate) fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let (num, mult) = [("GiB", 1usize << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)]
        .iter()
        .find_map(|(suf, m)| t.strip_suffix(suf).map(|n| (n, *m)))
        .unwrap_or((t, 1));
    let n: usize = num
        .trim()
        .parse()
        .map_err(|_| format!("'{s}' is not a size such as 4096, 64KiB or 16MiB"))?;
    match n.checked_mul(mult) {
        Some(v) if (4096..=1 << 31).contains(&v) => Ok(v),
        _ => Err(format!("size '{s}' must be between 4KiB and 2GiB")),
    }
}

pub(crate) fn run(a: &Args) -> Result<ExitCode, Failure> {
    match &a.which {
        Which::Spray(s) => run_spray(s),
    }
}

/// One (scheme, loss rate) point: its runs.
struct Point {
    scheme: Scheme,
    loss: f64,
    runs: Vec<Run>,
}

impl Point {
    /// Mean over the runs of the slowest flow, in µs; `None` if a flow failed.
    fn tail_us(&self) -> Option<f64> {
        let tails: Option<Vec<u64>> = self.runs.iter().map(Run::tail_ns).collect();
        tails.map(|t| t.iter().sum::<u64>() as f64 / t.len() as f64 / 1e3)
    }

    fn sum(&self, f: impl Fn(&Run) -> u64) -> u64 {
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
    let setup = Setup {
        size: a.size,
        bps: a.gbps * 1_000_000_000,
        delay_ns: a.delay_ns,
    };
    let started = std::time::Instant::now();
    let mut points = Vec::new();
    for &loss in &a.loss {
        for &scheme in &schemes {
            let runs = (0..u64::from(a.runs))
                .map(|k| spray::run(setup, scheme, loss, a.seed + k))
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
        let mut t = ferroce_reliability::themis::ThemisStats::default();
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
