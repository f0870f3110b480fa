//! `ferroce serve`: the engine as a service. It opens its devices, runs their engines and
//! serves programs attached through its socket (the drop-in libibverbs.so.1 with
//! `FERROCE_SERVICE` set, or the Rust client, `ferroce_verbs::service::Client`), until it
//! is stopped (SIGINT, SIGTERM) or its `--duration` ends. docs/service.md.

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferroce_verbs::service::{self, Service};

use crate::Failure;

#[derive(clap::Args)]
pub(crate) struct Args {
    /// A device to own and serve (`afpacket:IFACE`, `tap:NAME@IP`, `loop[:IP]`,
    /// `dpdk:EAL ARGS @IP`); repeat for several. Programs name them by their place in this
    /// list.
    #[arg(long = "device", default_value = "loop")]
    devices: Vec<String>,
    /// The socket programs attach to (default: FERROCE_SERVICE, else /run/ferroce.sock).
    #[arg(long)]
    socket: Option<std::path::PathBuf>,
    /// Permissions of the socket, in octal: who may attach (0600: the service's user only).
    #[arg(long, default_value = "0660", value_parser = octal)]
    mode: u32,
    /// Stop after this many seconds (default: run until SIGINT or SIGTERM).
    #[arg(long)]
    duration: Option<f64>,
    /// Print a JSON summary (devices, sessions, counters) when it stops.
    #[arg(long)]
    json: bool,
}

fn octal(s: &str) -> Result<u32, String> {
    u32::from_str_radix(s.trim_start_matches("0o"), 8)
        .ok()
        .filter(|m| *m <= 0o777)
        .ok_or_else(|| format!("'{s}' is not an octal mode such as 0660"))
}

pub(crate) fn run(args: &Args) -> Result<ExitCode, Failure> {
    let mut devices = Vec::new();
    for spec in &args.devices {
        devices.push(
            ferroce_verbs::spec::open_device(spec)
                .map_err(|e| Failure(format!("cannot open device '{spec}': {e}")))?,
        );
    }
    let socket = args.socket.clone().unwrap_or_else(service::socket_path);
    let svc = Service::start(devices, socket, args.mode)?;
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone())
            .map_err(|e| Failure(format!("cannot handle signals: {e}")))?;
    }
    eprintln!(
        "ferroce serve: {} at {}",
        args.devices.join(", "),
        svc.socket().display()
    );
    let started = Instant::now();
    let end = args.duration.map(Duration::from_secs_f64);
    while !stop.load(Ordering::Relaxed) && end.is_none_or(|d| started.elapsed() < d) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let c = svc.counters();
    let summary = serde_json::json!({
        "devices": args.devices,
        "socket": svc.socket().display().to_string(),
        "seconds": started.elapsed().as_secs_f64(),
        "sessions": c.sessions.load(Ordering::Relaxed),
        "sessions_dropped": c.sessions_dropped.load(Ordering::Relaxed),
        "requests_refused": c.requests_refused.load(Ordering::Relaxed),
        "wrs_forwarded": c.wrs_forwarded.load(Ordering::Relaxed),
        "wcs_forwarded": c.wcs_forwarded.load(Ordering::Relaxed),
        "forwarder_sleeps": c.sleeps.load(Ordering::Relaxed),
        "port_counters": svc
            .devices()
            .iter()
            .map(|d| d.port_counters().iter().filter(|(_, v)| *v > 0).map(|(k, v)| (k.to_owned(), serde_json::json!(v))).collect::<serde_json::Map<_, _>>())
            .collect::<Vec<_>>(),
    });
    svc.stop();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        eprintln!(
            "ferroce serve: stopped after {:.1} s; {} programs served",
            summary["seconds"].as_f64().unwrap_or(0.0),
            summary["sessions"]
        );
    }
    Ok(ExitCode::SUCCESS)
}
