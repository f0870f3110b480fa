//! The `ferroce` command.
//!
//! Subcommands: `decode` (a pcap of RoCEv2 frames as one JSON object per frame), `demo`
//! (crafted frames through an impaired simulated link), `perf` (perftest's tests), `stats`
//! (counters of running processes), `scenario` (the papers' experiments on the simulated
//! fabric) and `switch` (a user-space switch with an ECN-marking queue, for runs over real
//! ports) and `serve` (the engine as a service for other programs). `model` arrives with the issue that builds what it computes.

#![forbid(unsafe_code)]

mod decode;
mod demo;
mod model;
mod perf;
mod scenario;
mod serve;
mod stats;
mod switch;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

// The help's first line comes from this doc comment and the command list from `Command`
// below, so `ferroce --help` names no command that does not exist and none to come.
/// ferroce: a software RNIC speaking RoCEv2.
#[derive(Parser)]
#[command(name = "ferroce", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Decode a pcap or pcapng file of RoCEv2 frames: one JSON object per frame, then a summary.
    Decode(decode::Args),
    /// Push crafted RoCEv2 frames through an impaired simulated link and report what arrived.
    Demo(demo::Args),
    /// perftest's tests on ferroce: `perf write bw`, `perf read lat`, ... (sim by default).
    Perf(perf::Args),
    /// Counters of the ferroce processes running here, per port and per QP.
    Stats(stats::Args),
    /// The papers' experiments on the simulated fabric: `scenario spray` (Themis' testbed).
    Scenario(scenario::Args),
    /// Analytic models beside their Monte Carlo: `model sdr` (SDR's completion time).
    Model(model::Args),
    /// A two-port switch in user space with a shaped, ECN-marking egress queue (RED), for
    /// congestion-control runs over real ports.
    Switch(switch::Args),
    /// The engine as a service: own the devices and serve programs attached through a Unix
    /// socket and shared memory (the drop-in with FERROCE_SERVICE set).
    Serve(serve::Args),
}

/// A failure the user can act on, printed as one line.
pub(crate) struct Failure(pub(crate) String);

impl<E: std::fmt::Display> From<E> for Failure {
    fn from(e: E) -> Self {
        Self(e.to_string())
    }
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion)
                || e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
            {
                let _ = e.print();
                return if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
                    ExitCode::from(2)
                } else {
                    ExitCode::SUCCESS
                };
            }
            let text = e.to_string();
            let first = text.lines().next().unwrap_or("bad arguments");
            let first = first.strip_prefix("error: ").unwrap_or(first);
            eprintln!("ferroce: {first} (see 'ferroce --help')");
            return ExitCode::from(2);
        }
    };
    let result = match cli.command {
        Command::Decode(args) => decode::run(&args),
        Command::Demo(args) => demo::run(&args),
        Command::Perf(args) => perf::run(&args),
        Command::Stats(args) => stats::run(&args),
        Command::Scenario(args) => scenario::run(&args),
        Command::Model(args) => model::run(&args),
        Command::Switch(args) => switch::run(&args),
        Command::Serve(args) => serve::run(&args),
    };
    match result {
        Ok(code) => code,
        Err(Failure(msg)) => {
            eprintln!("ferroce: {msg}");
            ExitCode::from(2)
        }
    }
}
