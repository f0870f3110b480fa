//! `ferroce stats`: the counters ferroce processes on this machine export (each device's port
//! counters and every QP's, named like the Linux RDMA hardware counters), as `rdma statistic`
//! shows a kernel RDMA device's.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

use serde_json::{json, Value};

use crate::Failure;

#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// Where processes export their counters (FERROCE_STATS_DIR, else /tmp/ferroce-stats).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Also show processes that have exited (their last export).
    #[arg(long)]
    all: bool,
    /// Show counters that are zero too.
    #[arg(long)]
    zeros: bool,
    /// One JSON array instead of the listing.
    #[arg(long)]
    json: bool,
}

struct Export {
    pid: u32,
    device: String,
    alive: bool,
    port: BTreeMap<String, u64>,
    qps: BTreeMap<String, BTreeMap<String, u64>>,
}

fn parse(text: &str) -> Option<Export> {
    let mut e = Export {
        pid: 0,
        device: String::new(),
        alive: false,
        port: BTreeMap::new(),
        qps: BTreeMap::new(),
    };
    for line in text.lines() {
        let (k, v) = line.split_once('=')?;
        match k {
            "pid" => e.pid = v.parse().ok()?,
            "device" => e.device = v.to_owned(),
            _ => {
                let n: u64 = v.parse().ok()?;
                if let Some(name) = k.strip_prefix("port.") {
                    e.port.insert(name.to_owned(), n);
                } else if let Some(rest) = k.strip_prefix("qp.") {
                    let (qpn, name) = rest.split_once('.')?;
                    e.qps
                        .entry(qpn.to_owned())
                        .or_default()
                        .insert(name.to_owned(), n);
                }
            }
        }
    }
    e.alive = std::path::Path::new(&format!("/proc/{}", e.pid)).exists();
    Some(e)
}

pub(crate) fn run(a: &Args) -> Result<ExitCode, Failure> {
    let dir = a
        .dir
        .clone()
        .or_else(|| std::env::var_os("FERROCE_STATS_DIR").map(Into::into))
        .unwrap_or_else(|| PathBuf::from("/tmp/ferroce-stats"));
    let mut exports = Vec::new();
    if let Ok(entries) = std::fs::read_dir(&dir) {
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().is_some_and(|x| x == "stats") {
                if let Some(e) = std::fs::read_to_string(&path)
                    .ok()
                    .as_deref()
                    .and_then(parse)
                {
                    if e.alive || a.all {
                        exports.push(e);
                    }
                }
            }
        }
    }
    exports.sort_by(|x, y| (x.pid, &x.device).cmp(&(y.pid, &y.device)));
    let keep = |v: u64| a.zeros || v != 0;
    if a.json {
        let arr: Vec<Value> = exports
            .iter()
            .map(|e| {
                json!({
                    "pid": e.pid,
                    "device": e.device,
                    "alive": e.alive,
                    "port": e.port,
                    "qps": e.qps,
                })
            })
            .collect();
        println!("{}", Value::Array(arr));
        return Ok(ExitCode::SUCCESS);
    }
    if exports.is_empty() {
        println!(
            "no ferroce process exports counters in {} (ferroce perf does while it runs; --all shows finished ones)",
            dir.display()
        );
        return Ok(ExitCode::SUCCESS);
    }
    for e in &exports {
        println!(
            "{} (pid {}{})",
            e.device,
            e.pid,
            if e.alive { "" } else { ", exited" }
        );
        let port: Vec<String> = e
            .port
            .iter()
            .filter(|(_, &v)| keep(v))
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        println!("  port 1: {}", port.join(" "));
        for (qpn, c) in &e.qps {
            let line: Vec<String> = c
                .iter()
                .filter(|(_, &v)| keep(v))
                .map(|(k, v)| format!("{k} {v}"))
                .collect();
            println!("  qp {qpn}: {}", line.join(" "));
        }
    }
    Ok(ExitCode::SUCCESS)
}
