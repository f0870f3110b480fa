//! The modes and tables of `ferroce scenario allreduce` (the collective itself is
//! [`super::allreduce`]): faults against schemes, random faults for localization accuracy,
//! and a training-like loop for the overhead of one NIC failure.

use std::process::ExitCode;

use serde_json::{json, Value};

use super::allreduce::{run, Fault, Outcome, Scheme, Setup};
use crate::Failure;

/// Faults of the table (placed on host 1, rail 0; a link between hosts 1 and 2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Kind {
    None,
    Nic,
    Link,
    Tor,
    /// The NIC keeps half its rate: its host lost a quarter of its bandwidth.
    #[value(name = "degrade-50")]
    Degrade50,
    /// The NIC keeps a quarter: its host lost 37.5 %, beyond R2CCL's one-third threshold.
    #[value(name = "degrade-75")]
    Degrade75,
}

impl Kind {
    const ALL: [Self; 6] = [
        Self::None,
        Self::Nic,
        Self::Link,
        Self::Tor,
        Self::Degrade50,
        Self::Degrade75,
    ];

    fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Nic => "nic",
            Self::Link => "link",
            Self::Tor => "tor",
            Self::Degrade50 => "degrade-50",
            Self::Degrade75 => "degrade-75",
        }
    }

    fn fault(self) -> Fault {
        match self {
            Self::None => Fault::None,
            Self::Nic => Fault::Nic { host: 1, rail: 0 },
            Self::Link => Fault::Link {
                a: 1,
                b: 2,
                rail: 0,
            },
            Self::Tor => Fault::Tor { rail: 0 },
            Self::Degrade50 => Fault::Degrade {
                host: 1,
                rail: 0,
                left: 0.5,
            },
            Self::Degrade75 => Fault::Degrade {
                host: 1,
                rail: 0,
                left: 0.25,
            },
        }
    }
}

#[derive(clap::Args)]
pub(crate) struct Args {
    /// Hosts (two NICs each, one rail per NIC).
    #[arg(long, default_value_t = 4)]
    nodes: usize,
    /// Bytes each host reduces, comma-separated for a sweep (suffixes KiB, MiB).
    #[arg(long, value_delimiter = ',', default_value = "16MiB", value_parser = super::parse_size)]
    size: Vec<usize>,
    /// Schemes, comma-separated (default: ring, balance, decompose, r2ccl).
    #[arg(long, value_delimiter = ',', value_enum)]
    scheme: Vec<Scheme>,
    /// Faults, comma-separated (default: all).
    #[arg(long, value_delimiter = ',', value_enum)]
    fault: Vec<Kind>,
    /// Where in the first collective the fault strikes, as a share of its healthy time.
    #[arg(long, default_value_t = 0.3)]
    at: f64,
    /// Instead: this many runs with a random single fault (a NIC, a path or a ToR, at a
    /// random moment of the collective): what was blamed against what failed.
    #[arg(long, default_value_t = 0)]
    random_faults: usize,
    /// Instead: a training-like loop of this many collectives, --compute-us apart, healthy
    /// and with a NIC failing in the second: the loop's overhead per scheme.
    #[arg(long, default_value_t = 0)]
    train: usize,
    /// --train: compute time before each collective, µs.
    #[arg(long, default_value_t = 5000.0)]
    compute_us: f64,
    /// NIC rate, Gbit/s.
    #[arg(long, default_value_t = 100.0)]
    gbps: f64,
    /// One-way delay of every link, µs.
    #[arg(long, default_value_t = 1.0)]
    delay_us: f64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

fn base(a: &Args, bytes: usize) -> Setup {
    Setup {
        nodes: a.nodes,
        bytes,
        scheme: Scheme::Ring,
        fault: Fault::None,
        fault_at: 0,
        collectives: 2,
        compute_ns: 0,
        gbps: a.gbps,
        delay_ns: (a.delay_us * 1000.0) as u64,
        seed: a.seed,
    }
}

/// NCCL's bus bandwidth of an AllReduce of `bytes` in `ns`, Gbit/s.
fn busbw(nodes: usize, bytes: usize, ns: u64) -> f64 {
    let n = nodes as f64;
    bytes as f64 * 8.0 * 2.0 * (n - 1.0) / n / ns.max(1) as f64
}

fn localize_us(o: &Outcome) -> Option<f64> {
    o.localized
        .iter()
        .filter_map(|l| l.decided_at.map(|d| (d - l.detected_at) as f64 / 1e3))
        .reduce(f64::max)
}

pub(crate) fn run_cli(a: &Args) -> Result<ExitCode, Failure> {
    if !(3..=32).contains(&a.nodes) {
        return Err(Failure(
            "--nodes must be 3..32 (probe triangulation needs a third node)".into(),
        ));
    }
    if !(0.0..1.0).contains(&a.at) || a.gbps <= 0.0 || a.delay_us < 0.0 {
        return Err(Failure(
            "--at must be in [0, 1), --gbps above zero, --delay-us not negative".into(),
        ));
    }
    if a.size.iter().any(|&s| s > 256 << 20) {
        return Err(Failure(
            "--size above 256MiB would not fit the simulator's memory".into(),
        ));
    }
    if a.random_faults > 0 {
        return random_faults(a);
    }
    if a.train > 0 {
        return train(a);
    }
    table(a)
}

fn table(a: &Args) -> Result<ExitCode, Failure> {
    let schemes = if a.scheme.is_empty() {
        vec![
            Scheme::Ring,
            Scheme::Balance,
            Scheme::Decompose,
            Scheme::R2ccl,
        ]
    } else {
        a.scheme.clone()
    };
    let kinds = if a.fault.is_empty() {
        Kind::ALL.to_vec()
    } else {
        a.fault.clone()
    };
    let mut rows = Vec::new();
    let mut ok = true;
    for &bytes in &a.size {
        let healthy = run(&base(a, bytes));
        let base_ns = healthy.duration(1).unwrap_or(1);
        ok &= healthy.verified && !healthy.stuck;
        for &kind in &kinds {
            for &scheme in &schemes {
                let fault = kind.fault();
                let s = Setup {
                    scheme,
                    fault,
                    fault_at: (base_ns as f64 * a.at) as u64,
                    ..base(a, bytes)
                };
                let o = run(&s);
                let good = o.verified && !o.stuck;
                ok &= good;
                let truth = fault.component();
                let accurate = o.localized.iter().all(|l| l.blamed == truth);
                let first_ns = o.duration(0);
                let after_ns = o.duration(1);
                let ratio = |t: Option<u64>| t.map(|t| base_ns as f64 / t as f64);
                let detect_us = o
                    .localized
                    .first()
                    .map(|l| l.detected_at.saturating_sub(s.fault_at) as f64 / 1e3);
                rows.push(json!({
                    "size": bytes,
                    "fault": kind.name(),
                    "scheme": scheme.name(),
                    "plan": o.plans.get(1).cloned().unwrap_or_default(),
                    "healthy_us": base_ns as f64 / 1e3,
                    "first_us": first_ns.map(|t| t as f64 / 1e3),
                    "first_of_base": ratio(first_ns),
                    "after_us": after_ns.map(|t| t as f64 / 1e3),
                    "after_of_base": ratio(after_ns),
                    "after_busbw_gbps": after_ns.map(|t| busbw(a.nodes, bytes, t)),
                    "detect_us": detect_us,
                    "localize_us": localize_us(&o),
                    "localizations": o.localized.len(),
                    "blamed": o.localized.first().and_then(|l| l.blamed).map(|c| c.describe()),
                    "accurate": truth.is_none() || (accurate && !o.localized.is_empty()),
                    "migrations": o.migrations,
                    "resent_slices": o.resent,
                    "oob_messages": o.oob_messages,
                    "verified": o.verified,
                    "stuck": o.stuck,
                }));
            }
        }
    }
    if a.json {
        println!(
            "{}",
            json!({"scenario": "allreduce", "nodes": a.nodes, "at": a.at, "rows": rows})
        );
    } else {
        println!(
            "{:>9} {:>10} {:>9} {:>24} {:>10} {:>6} {:>10} {:>6} {:>9} {:>9} {:>24} {:>5}",
            "size",
            "fault",
            "scheme",
            "plan_after",
            "first_us",
            "×base",
            "after_us",
            "×base",
            "detect_us",
            "local_us",
            "blamed",
            "ok"
        );
        let f = |v: &Value, p: usize| v.as_f64().map_or("-".into(), |x| format!("{x:.p$}"));
        for r in &rows {
            println!(
                "{:>9} {:>10} {:>9} {:>24} {:>10} {:>6} {:>10} {:>6} {:>9} {:>9} {:>24} {:>5}",
                r["size"].as_u64().unwrap_or(0),
                r["fault"].as_str().unwrap_or(""),
                r["scheme"].as_str().unwrap_or(""),
                r["plan"].as_str().unwrap_or(""),
                f(&r["first_us"], 1),
                f(&r["first_of_base"], 2),
                f(&r["after_us"], 1),
                f(&r["after_of_base"], 2),
                f(&r["detect_us"], 1),
                f(&r["localize_us"], 1),
                r["blamed"].as_str().unwrap_or("-"),
                r["verified"].as_bool() == Some(true)
                    && r["stuck"].as_bool() == Some(false)
                    && r["accurate"].as_bool() == Some(true),
            );
        }
    }
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// A small xorshift for drawing faults (the runs' own randomness is the fabric's seed).
fn draw(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

fn random_faults(a: &Args) -> Result<ExitCode, Failure> {
    let bytes = a.size[0];
    let healthy = run(&Setup {
        collectives: 1,
        ..base(a, bytes)
    });
    let base_ns = healthy.duration(0).unwrap_or(1);
    let n = a.nodes;
    // Per kind: faults, localizations, right, ambiguous (remote-or-link), wrong.
    let mut per: Vec<(&str, [u64; 5])> = vec![("nic", [0; 5]), ("link", [0; 5]), ("tor", [0; 5])];
    let mut times: Vec<f64> = Vec::new();
    let mut slowdowns: Vec<f64> = Vec::new();
    let mut ok = healthy.verified;
    let mut runs = Vec::new();
    for i in 0..a.random_faults {
        let mut st = (a.seed ^ 0x9e37_79b9_7f4a_7c15).wrapping_add(i as u64 * 0x2545_f491) | 1;
        for _ in 0..4 {
            draw(&mut st);
        }
        let kind = (draw(&mut st) % 3) as usize;
        let host = (draw(&mut st) % n as u64) as usize;
        let rail = (draw(&mut st) % 2) as usize;
        let fault = match kind {
            0 => Fault::Nic { host, rail },
            1 => Fault::Link {
                a: host,
                b: (host + 1) % n,
                rail,
            },
            _ => Fault::Tor { rail },
        };
        let frac = 0.1 + (draw(&mut st) % 800) as f64 / 1000.0;
        let s = Setup {
            scheme: Scheme::R2ccl,
            fault,
            fault_at: (base_ns as f64 * frac) as u64,
            collectives: 1,
            seed: a.seed + i as u64,
            ..base(a, bytes)
        };
        let o = run(&s);
        ok &= o.verified && !o.stuck;
        let truth = fault.component();
        let c = &mut per[kind].1;
        c[0] += 1;
        for l in &o.localized {
            c[1] += 1;
            match l.blamed {
                b if b == truth => c[2] += 1,
                Some(super::allreduce::Component::RemoteOrLink(..)) => c[3] += 1,
                _ => c[4] += 1,
            }
            if let Some(d) = l.decided_at {
                times.push((d - l.detected_at) as f64 / 1e3);
            }
        }
        if let Some(t) = o.duration(0) {
            slowdowns.push(t as f64 / base_ns as f64);
        }
        runs.push(json!({
            "fault": fault.kind(),
            "failed": truth.map(|c| c.describe()),
            "at_us": s.fault_at as f64 / 1e3,
            "blamed": o.localized.iter().map(|l| l.blamed.map(|c| c.describe())).collect::<Vec<_>>(),
            "collective_us": o.duration(0).map(|t| t as f64 / 1e3),
            "verified": o.verified,
        }));
    }
    times.sort_by(f64::total_cmp);
    let pct = |v: &[f64], p: f64| -> Option<f64> {
        (!v.is_empty()).then(|| v[((v.len() - 1) as f64 * p).round() as usize])
    };
    let total: [u64; 5] = per.iter().fold([0; 5], |mut acc, (_, c)| {
        for (x, y) in acc.iter_mut().zip(c) {
            *x += y;
        }
        acc
    });
    let accuracy = total[2] as f64 / total[1].max(1) as f64;
    let mean_slow = slowdowns.iter().sum::<f64>() / slowdowns.len().max(1) as f64;
    if a.json {
        println!(
            "{}",
            json!({
                "scenario": "allreduce",
                "mode": "random-faults",
                "nodes": n,
                "size": bytes,
                "faults": a.random_faults,
                "per_kind": per.iter().map(|(k, c)| json!({
                    "fault": k, "faults": c[0], "localizations": c[1], "right": c[2],
                    "ambiguous": c[3], "wrong": c[4],
                })).collect::<Vec<_>>(),
                "accuracy": accuracy,
                "localize_us_p50": pct(&times, 0.5),
                "localize_us_max": pct(&times, 1.0),
                "mean_slowdown": mean_slow,
                "verified": ok,
                "runs": runs,
            })
        );
    } else {
        println!(
            "{} random single faults, {n} nodes, {bytes} bytes, fault at 10–90 % of the collective:",
            a.random_faults
        );
        println!(
            "{:>6} {:>7} {:>14} {:>6} {:>10} {:>6}",
            "fault", "faults", "localizations", "right", "ambiguous", "wrong"
        );
        for (k, c) in &per {
            println!(
                "{k:>6} {:>7} {:>14} {:>6} {:>10} {:>6}",
                c[0], c[1], c[2], c[3], c[4]
            );
        }
        println!(
            "accuracy {:.3}; localization p50 {} µs, max {} µs; collective {:.2}× its healthy time on average; all verified: {ok}",
            accuracy,
            pct(&times, 0.5).map_or("-".into(), |x| format!("{x:.1}")),
            pct(&times, 1.0).map_or("-".into(), |x| format!("{x:.1}")),
            mean_slow
        );
    }
    Ok(if ok && total[4] == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn train(a: &Args) -> Result<ExitCode, Failure> {
    let bytes = a.size[0];
    let compute_ns = (a.compute_us * 1000.0) as u64;
    let schemes = if a.scheme.is_empty() {
        vec![Scheme::Ring, Scheme::R2ccl]
    } else {
        a.scheme.clone()
    };
    let mut rows = Vec::new();
    let mut ok = true;
    for &scheme in &schemes {
        let s = Setup {
            scheme,
            collectives: a.train,
            compute_ns,
            ..base(a, bytes)
        };
        let healthy = run(&s);
        // The NIC fails in the middle of the second collective and stays dead.
        let second = healthy.spans.get(1).copied().unwrap_or((0, 0));
        let failed = run(&Setup {
            fault: Fault::Nic { host: 1, rail: 0 },
            fault_at: (second.0 + second.1) / 2,
            ..s.clone()
        });
        ok &= healthy.verified && failed.verified && !healthy.stuck && !failed.stuck;
        let comm: u64 = healthy.spans.iter().map(|(a, b)| b - a).sum();
        let overhead = failed.end_ns() as f64 / healthy.end_ns().max(1) as f64 - 1.0;
        rows.push(json!({
            "scheme": scheme.name(),
            "collectives": a.train,
            "compute_us": a.compute_us,
            "healthy_ms": healthy.end_ns() as f64 / 1e6,
            "failed_ms": failed.end_ns() as f64 / 1e6,
            "overhead": overhead,
            "comm_share": comm as f64 / healthy.end_ns().max(1) as f64,
            "plan_after": failed.plans.last().cloned().unwrap_or_default(),
            "localize_us": localize_us(&failed),
            "verified": healthy.verified && failed.verified,
        }));
    }
    if a.json {
        println!(
            "{}",
            json!({"scenario": "allreduce", "mode": "train", "nodes": a.nodes, "size": bytes, "rows": rows})
        );
    } else {
        println!(
            "{:>9} {:>11} {:>10} {:>10} {:>9} {:>10} {:>24} {:>5}",
            "scheme",
            "collectives",
            "healthy_ms",
            "failed_ms",
            "overhead",
            "comm_share",
            "plan_after",
            "ok"
        );
        for r in &rows {
            println!(
                "{:>9} {:>11} {:>10.3} {:>10.3} {:>8.2}% {:>10.2} {:>24} {:>5}",
                r["scheme"].as_str().unwrap_or(""),
                r["collectives"].as_u64().unwrap_or(0),
                r["healthy_ms"].as_f64().unwrap_or(0.0),
                r["failed_ms"].as_f64().unwrap_or(0.0),
                r["overhead"].as_f64().unwrap_or(0.0) * 100.0,
                r["comm_share"].as_f64().unwrap_or(0.0),
                r["plan_after"].as_str().unwrap_or(""),
                r["verified"].as_bool().unwrap_or(false),
            );
        }
    }
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
