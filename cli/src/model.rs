//! `ferroce model sdr`: SDR's completion-time model (reliability::sdr::model) for one Write,
//! every scheme or one, analytic and Monte Carlo side by side.

use std::process::ExitCode;

use ferroce_reliability::sdr::model::{analytic, monte_carlo, Code, Scheme, Setup};
use serde_json::{json, Value};

use crate::scenario::parse_size;
use crate::Failure;

#[derive(clap::Args)]
pub(crate) struct Args {
    #[command(subcommand)]
    what: What,
}

#[derive(clap::Subcommand)]
enum What {
    /// Expected and 99.9th-percentile completion time of one SDR Write per scheme.
    Sdr(Sdr),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum SchemeArg {
    SrRto,
    SrNack,
    EcMds,
    EcXor,
}

#[derive(clap::Args)]
struct Sdr {
    /// Message bytes (suffixes KiB, MiB, GiB).
    #[arg(long, default_value = "128MiB", value_parser = parse_size)]
    size: usize,
    /// Link rate, Gbit/s.
    #[arg(long, default_value_t = 400.0)]
    gbps: f64,
    /// Round-trip time, milliseconds.
    #[arg(long, default_value_t = 25.0)]
    rtt_ms: f64,
    /// Packet drop probability (independent per packet).
    #[arg(long, default_value_t = 1e-5)]
    drop: f64,
    /// Bitmap chunk bytes.
    #[arg(long, default_value = "64KiB", value_parser = parse_size)]
    chunk: usize,
    /// MTU bytes.
    #[arg(long, default_value_t = 4096)]
    mtu: u64,
    /// One scheme only (default: all four).
    #[arg(long, value_enum)]
    scheme: Option<SchemeArg>,
    /// Monte Carlo draws per scheme.
    #[arg(long, default_value_t = 2000)]
    runs: usize,
    /// Seed of the Monte Carlo draws.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Resends lose only the packets still missing (SDR's per-packet bitmap, as ferroce's
    /// receiver keeps it), not a whole chunk's worth: the model `scenario sdr` is checked
    /// against. Without it, the paper's model.
    #[arg(long)]
    per_packet: bool,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

pub(crate) fn run(args: &Args) -> Result<ExitCode, Failure> {
    let What::Sdr(a) = &args.what;
    if !(0.0..1.0).contains(&a.drop) || a.gbps <= 0.0 || a.rtt_ms < 0.0 || a.mtu == 0 {
        return Err(Failure(
            "--drop must be in [0, 1), --gbps above 0, --rtt-ms at least 0, --mtu above 0".into(),
        ));
    }
    if a.chunk == 0 || !(a.chunk as u64).is_multiple_of(a.mtu) {
        return Err(Failure(format!(
            "--chunk must be a multiple of the MTU ({})",
            a.mtu
        )));
    }
    let s = Setup {
        bytes: a.size as u64,
        chunk: a.chunk as u64,
        mtu: a.mtu,
        gbps: a.gbps,
        rtt: a.rtt_ms / 1e3,
        p_packet: a.drop,
        per_packet: a.per_packet,
    };
    let schemes: Vec<Scheme> = [
        (SchemeArg::SrRto, Scheme::SR_RTO),
        (SchemeArg::SrNack, Scheme::SrNack),
        (SchemeArg::EcMds, Scheme::ec(Code::Mds)),
        (SchemeArg::EcXor, Scheme::ec(Code::Xor)),
    ]
    .into_iter()
    .filter(|(arg, _)| a.scheme.is_none_or(|s| s == *arg))
    .map(|(_, s)| s)
    .collect();
    let lossless = s.lossless();
    let rows: Vec<Value> = schemes
        .iter()
        .map(|&scheme| {
            let an = analytic(&s, scheme);
            let mc = monte_carlo(&s, scheme, a.runs, a.seed);
            json!({
                "scheme": scheme.name(),
                "mean_s": an.mean,
                "p999_s": an.p999,
                "mean_slowdown": an.mean / lossless,
                "p999_slowdown": an.p999 / lossless,
                "mc_mean_s": mc.mean,
                "mc_p999_s": mc.p999,
                "mc_mean_slowdown": mc.mean / lossless,
                "mc_p999_slowdown": mc.p999 / lossless,
            })
        })
        .collect();
    if a.json {
        println!(
            "{}",
            json!({
                "size_bytes": s.bytes,
                "chunk_bytes": s.chunk,
                "mtu": s.mtu,
                "gbps": s.gbps,
                "rtt_ms": a.rtt_ms,
                "p_packet": s.p_packet,
                "p_chunk": s.p_chunk(),
                "p_resend": s.p_resend(),
                "per_packet": s.per_packet,
                "lossless_s": lossless,
                "runs": a.runs,
                "schemes": rows,
            })
        );
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "SDR Write of {} bytes, {} B chunks, {} B MTU, {} Gbit/s, RTT {} ms: p_packet {:e}, p_chunk {:.3e}; lossless {:.3} ms",
        s.bytes, s.chunk, s.mtu, s.gbps, a.rtt_ms, s.p_packet, s.p_chunk(), lossless * 1e3
    );
    println!(
        "  {:8} {:>12} {:>12} {:>9} {:>9}   {:>12} {:>12}",
        "scheme", "mean ms", "p99.9 ms", "mean x", "p99.9 x", "MC mean ms", "MC p99.9 ms"
    );
    for r in &rows {
        let f = |k: &str| r[k].as_f64().unwrap_or(f64::NAN);
        println!(
            "  {:8} {:>12.3} {:>12.3} {:>9.2} {:>9.2}   {:>12.3} {:>12.3}",
            r["scheme"].as_str().unwrap_or(""),
            f("mean_s") * 1e3,
            f("p999_s") * 1e3,
            f("mean_slowdown"),
            f("p999_slowdown"),
            f("mc_mean_s") * 1e3,
            f("mc_p999_s") * 1e3,
        );
    }
    Ok(ExitCode::SUCCESS)
}
