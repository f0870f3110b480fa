//! The table, JSON and plot of `ferroce scenario incast` (the runs are [`super::incast`]).

use std::process::ExitCode;

use serde_json::json;

use super::incast::{run, Scheme, Setup};
use crate::Failure;

#[derive(clap::Args)]
pub(crate) struct Args {
    /// Incast senders, comma-separated (each run adds one long-lived flow).
    #[arg(long, value_delimiter = ',', default_value = "2,4,8,16")]
    senders: Vec<usize>,
    /// Schemes, comma-separated (default: dcqcn, dcqcn-mlx5, timely, none).
    #[arg(long, value_delimiter = ',', value_enum)]
    scheme: Vec<Scheme>,
    /// The bottleneck's buffer (suffixes KiB, MiB).
    #[arg(long, default_value = "1MiB", value_parser = super::parse_size)]
    buffer: usize,
    /// The bottleneck's ECN marking probability at Kmax (Kmin 12.5 KB and Kmax 500 KB at
    /// 100 Gbit/s: the DCQCN paper's 5 KB and 200 KB at 40, scaled).
    #[arg(long, default_value_t = 0.2)]
    pmax: f64,
    /// Every QP's local ACK timeout exponent (4.096 µs × 2^N; 8: 1 ms).
    #[arg(long, default_value_t = 8)]
    timeout: u8,
    /// Link rate, Gbit/s.
    #[arg(long, default_value_t = 100.0)]
    gbps: f64,
    /// One-way delay of every link, µs.
    #[arg(long, default_value_t = 1.0)]
    delay_us: f64,
    /// How long the flows run, virtual ms (the incast starts at a tenth of it).
    #[arg(long, default_value_t = 4.0)]
    duration_ms: f64,
    /// WRITE size (suffixes KiB, MiB).
    #[arg(long, default_value = "32KiB", value_parser = super::parse_size)]
    msg: usize,
    /// WRs outstanding per sender (with --msg, what a sender can put in flight before any
    /// feedback: 64 KiB by default, so 16 senders' first burst fits the 1 MB buffer).
    #[arg(long, default_value_t = 2)]
    depth: u64,
    /// Bytes each incast sender's completion time counts (suffixes KiB, MiB).
    #[arg(long, default_value = "2MiB", value_parser = super::parse_size)]
    burst: usize,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Instead: the staggered run — four flows join one receiver this many ms apart, then
    /// leave in the same order; how long each scheme takes to come back to the fair share
    /// after each event.
    #[arg(long)]
    staggered_ms: Option<f64>,
    /// Write the goodput of every flow over time (the largest --senders, a panel per
    /// scheme) as an SVG here.
    #[arg(long)]
    plot: Option<std::path::PathBuf>,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

/// The bottleneck's marking profile.
fn red(a: &Args) -> ferroce_drivers::sim::Red {
    ferroce_drivers::sim::Red {
        pmax: a.pmax,
        ..ferroce_drivers::sim::Red::dcqcn((a.gbps * 1e9) as u64)
    }
}

/// A run of `scheme` with the arguments' fabric and workload, `end_ns` long.
fn setup(a: &Args, scheme: Scheme, end_ns: u64, bin_ns: u64) -> Setup {
    Setup {
        senders: 0,
        scheme,
        gbps: a.gbps,
        delay_ns: (a.delay_us * 1000.0) as u64,
        buffer: a.buffer,
        pmax: a.pmax,
        timeout: a.timeout,
        msg: a.msg,
        depth: a.depth,
        start_ns: 0,
        end_ns,
        burst: a.burst as u64,
        bin_ns,
        seed: a.seed,
        windows: None,
    }
}

pub(crate) fn run_cli(a: &Args) -> Result<ExitCode, Failure> {
    if a.senders.iter().any(|&n| !(1..=64).contains(&n)) {
        return Err(Failure("--senders must each be 1..64".into()));
    }
    if a.gbps <= 0.0 || a.delay_us < 0.0 || a.duration_ms <= 0.0 || a.depth == 0 {
        return Err(Failure(
            "--gbps, --duration-ms and --depth must be above zero, --delay-us not negative".into(),
        ));
    }
    if !(0.0..=1.0).contains(&a.pmax) || !(1..=31).contains(&a.timeout) {
        return Err(Failure(
            "--pmax must be within 0..1 and --timeout within 1..31".into(),
        ));
    }
    if a.msg > 1 << 20 {
        return Err(Failure("--msg must be at most 1MiB".into()));
    }
    let schemes = if a.scheme.is_empty() {
        vec![
            Scheme::Dcqcn,
            Scheme::DcqcnMlx5,
            Scheme::Timely,
            Scheme::None,
        ]
    } else {
        a.scheme.clone()
    };
    if let Some(t) = a.staggered_ms {
        return staggered(a, &schemes, t);
    }
    let end_ns = (a.duration_ms * 1e6) as u64;
    let bin_ns = (end_ns / 80).max(1_000);
    let mut points = Vec::new();
    let mut panels_data = Vec::new();
    let mut ok = true;
    let largest = a.senders.iter().copied().max().unwrap_or(1);
    for &scheme in &schemes {
        for &senders in &a.senders {
            let s = Setup {
                senders,
                start_ns: end_ns / 10,
                ..setup(a, scheme, end_ns, bin_ns)
            };
            let o = run(&s);
            ok &= o.verified;
            if senders == largest {
                panels_data.push((scheme, o.bins.clone()));
            }
            points.push(json!({
                "scheme": scheme.name(),
                "senders": senders,
                "utilization": o.utilization,
                "jain": o.jain,
                "queue_p50_bytes": o.queue_p50,
                "queue_p99_bytes": o.queue_p99,
                "queue_max_bytes": o.queue_max,
                "drops": o.drops,
                "errors": o.errors,
                "marked": o.marked,
                "cnps": o.cnps,
                "fct_us": o.fct_ns.map(|t| t as f64 / 1e3),
                "verified": o.verified,
            }));
        }
    }
    if let Some(path) = &a.plot {
        let names: Vec<String> = (1..=largest)
            .map(|f| format!("sender {f}"))
            .chain(std::iter::once("long flow".to_string()))
            .collect();
        let titles: Vec<String> = panels_data
            .iter()
            .map(|(scheme, _)| format!("{} ({largest} senders + a long flow)", scheme.name()))
            .collect();
        let panels: Vec<super::timeline::Panel<'_>> = panels_data
            .iter()
            .zip(&titles)
            .map(|((_, bins), t)| {
                let lines = bins
                    .iter()
                    .enumerate()
                    .map(|(i, b)| (names[i].as_str(), b.clone()))
                    .collect();
                (t.as_str(), lines)
            })
            .collect();
        let title = format!(
            "Incast into one receiver at {} Gbit/s, {} buffer: goodput per flow",
            a.gbps, a.buffer
        );
        let start_ms = a.duration_ms / 10.0;
        std::fs::write(
            path,
            super::timeline::svg(&title, &panels, bin_ns as f64 / 1e6, &[start_ms], a.gbps),
        )
        .map_err(|e| Failure(format!("cannot write {}: {e}", path.display())))?;
    }
    if a.json {
        println!(
            "{}",
            json!({
                "scenario": "incast",
                "gbps": a.gbps,
                "buffer_bytes": a.buffer,
                "kmax_bytes": red(a).kmax_bytes,
                "pmax": a.pmax,
                "points": points,
            })
        );
    } else {
        println!(
            "{:>10} {:>7} {:>6} {:>6} {:>9} {:>9} {:>9} {:>7} {:>6} {:>7} {:>6} {:>9} {:>8}",
            "scheme",
            "senders",
            "util",
            "jain",
            "q_p50_B",
            "q_p99_B",
            "q_max_B",
            "drops",
            "errors",
            "marked",
            "cnps",
            "fct_us",
            "verified"
        );
        for p in &points {
            println!(
                "{:>10} {:>7} {:>6.3} {:>6.3} {:>9} {:>9} {:>9} {:>7} {:>6} {:>7} {:>6} {:>9} {:>8}",
                p["scheme"].as_str().unwrap_or(""),
                p["senders"].as_u64().unwrap_or(0),
                p["utilization"].as_f64().unwrap_or(0.0),
                p["jain"].as_f64().unwrap_or(0.0),
                p["queue_p50_bytes"].as_u64().unwrap_or(0),
                p["queue_p99_bytes"].as_u64().unwrap_or(0),
                p["queue_max_bytes"].as_u64().unwrap_or(0),
                p["drops"].as_u64().unwrap_or(0),
                p["errors"].as_u64().unwrap_or(0),
                p["marked"].as_u64().unwrap_or(0),
                p["cnps"].as_u64().unwrap_or(0),
                p["fct_us"]
                    .as_f64()
                    .map_or("-".to_string(), |x| format!("{x:.1}")),
                p["verified"].as_bool().unwrap_or(false),
            );
        }
    }
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Four flows joining `t_ms` apart, then leaving in the same order.
fn staggered(a: &Args, schemes: &[Scheme], t_ms: f64) -> Result<ExitCode, Failure> {
    if !(t_ms > 0.0 && t_ms <= 100.0) {
        return Err(Failure(
            "--staggered-ms must be above 0 and at most 100".into(),
        ));
    }
    let t = (t_ms * 1e6) as u64;
    let windows: Vec<(u64, u64)> = (0..4).map(|k| (k * t, (4 + k) * t)).collect();
    let end = 7 * t;
    let bin_ns = (t / 20).max(1_000);
    let mut rows = Vec::new();
    let mut ok = true;
    for &scheme in schemes {
        let s = Setup {
            senders: 4,
            windows: Some(windows.clone()),
            ..setup(a, scheme, end, bin_ns)
        };
        let o = run(&s);
        ok &= o.verified;
        for e in super::incast::convergence(&windows, &o.bins, bin_ns, end, a.gbps) {
            rows.push(json!({
                "scheme": scheme.name(),
                "event": if e.joined { "join" } else { "leave" },
                "at_ms": e.at_ns as f64 / 1e6,
                "active": e.active,
                "fair_gbps": e.fair_gbps,
                "converge_us": e.converge_ns.map(|n| n as f64 / 1e3),
                "verified": o.verified,
            }));
        }
    }
    if a.json {
        println!(
            "{}",
            json!({"scenario": "incast", "mode": "staggered", "interval_ms": t_ms, "events": rows})
        );
    } else {
        println!(
            "{:>10} {:>6} {:>7} {:>7} {:>9} {:>12}",
            "scheme", "event", "at_ms", "active", "fair_gbps", "converge_us"
        );
        for r in &rows {
            println!(
                "{:>10} {:>6} {:>7.2} {:>7} {:>9.1} {:>12}",
                r["scheme"].as_str().unwrap_or(""),
                r["event"].as_str().unwrap_or(""),
                r["at_ms"].as_f64().unwrap_or(0.0),
                r["active"].as_u64().unwrap_or(0),
                r["fair_gbps"].as_f64().unwrap_or(0.0),
                r["converge_us"]
                    .as_f64()
                    .map_or("never".to_string(), |x| format!("{x:.0}")),
            );
        }
    }
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
