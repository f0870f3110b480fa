//! The `ferroce` command's contract: one-line errors with exit 2, a `--json` summary, and a
//! demo that replays from its seed.

use std::process::{Command, Output};

use serde_json::Value;

fn ferroce(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ferroce"))
        .args(args)
        .output()
        .unwrap()
}

fn one_line_error(out: &Output, starts: &str) {
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with(starts), "{err}");
}

#[test]
fn bad_arguments_are_one_line() {
    one_line_error(
        &ferroce(&["demo", "--bogus"]),
        "ferroce: unexpected argument '--bogus'",
    );
    one_line_error(
        &ferroce(&["demo", "--loss", "2"]),
        "ferroce: --loss 2 is not a probability",
    );
    one_line_error(
        &ferroce(&["demo", "--flap-us", "5"]),
        "ferroce: invalid value '5'",
    );
    one_line_error(
        &ferroce(&["frobnicate"]),
        "ferroce: unrecognized subcommand",
    );
    one_line_error(
        &ferroce(&[
            "demo",
            "--frames",
            "10",
            "--pcap",
            "/nonexistent/dir/x.pcap",
        ]),
        "ferroce: cannot create /nonexistent/dir/x.pcap",
    );
}

/// `ferroce switch` and `perf --base-rtt-us` refuse what they cannot use in one line.
#[test]
fn the_switch_and_the_base_rtt_refuse_bad_arguments_in_one_line() {
    one_line_error(
        &ferroce(&["switch", "--from", "eth0", "--to", "afpacket:lo"]),
        "ferroce: 'eth0' is not a port the switch can use; give afpacket:IFACE",
    );
    one_line_error(
        &ferroce(&[
            "switch",
            "--from",
            "afpacket:a",
            "--to",
            "afpacket:b",
            "--gbps",
            "0",
        ]),
        "ferroce: --gbps, --buffer and --duration must be above zero",
    );
    one_line_error(
        &ferroce(&[
            "switch",
            "--from",
            "afpacket:no-such-if0",
            "--to",
            "afpacket:no-such-if1",
        ]),
        "ferroce: cannot open no-such-if0: no network interface named 'no-such-if0'",
    );
    one_line_error(
        &ferroce(&["perf", "write", "bw", "--base-rtt-us=-1"]),
        "ferroce: --base-rtt-us must be within 0..1000000",
    );
}

fn demo_json(seed: &str) -> Value {
    let out = ferroce(&[
        "demo",
        "--frames",
        "3000",
        "--seed",
        seed,
        "--loss",
        "0.02",
        "--dup",
        "0.01",
        "--reorder",
        "0.02",
        "--corrupt",
        "0.01",
        "--flap-us",
        "100,10",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let o = v.as_object_mut().unwrap();
    // Wall-clock figures differ run to run; everything else is the seed's.
    o.remove("wall_seconds");
    o.remove("frames_per_wall_second");
    v
}

#[test]
fn demo_accounts_for_every_frame_and_replays_from_its_seed() {
    let a = demo_json("5");
    assert_eq!(a, demo_json("5"));
    assert_ne!(a, demo_json("6"));
    let link = &a["link"];
    let rx = &a["receiver"];
    let n = |v: &Value| v.as_u64().unwrap();
    assert_eq!(n(&a["frames_sent"]), 3000);
    assert_eq!(n(&link["offered"]), 3000);
    for k in [
        "lost",
        "dropped_link_down",
        "duplicated",
        "reordered",
        "corrupted",
    ] {
        assert!(n(&link[k]) > 0, "no {k}");
    }
    // What the link delivered arrived, or was dropped by the port because a flipped bit hit
    // the destination MAC; valid plus rejected is what arrived.
    assert_eq!(
        n(&link["delivered"]),
        n(&rx["arrived"]) + n(&rx["filtered_wrong_mac"])
    );
    assert_eq!(n(&rx["valid"]) + n(&rx["rejected"]), n(&rx["arrived"]));
    assert_eq!(n(&rx["unique_psns"]) + n(&rx["missing_psns"]), 3000);
    // Nothing is lost that the link did not drop or corrupt.
    let dropped = n(&link["lost"]) + n(&link["dropped_link_down"]) + n(&link["dropped_queue_full"]);
    assert!(n(&rx["missing_psns"]) >= dropped);
    assert!(n(&rx["missing_psns"]) <= dropped + n(&link["corrupted"]));
    assert!(n(&rx["rejected_by_kind"]["bad_icrc"]) > 0);
}

#[test]
fn scenario_spray_reports_every_scheme_and_replays_from_its_seed() {
    let args = [
        "scenario", "spray", "--size", "512KiB", "--loss", "0,0.01", "--runs", "1", "--seed", "3",
        "--json",
    ];
    let out = ferroce(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["all_flows_verified"], true);
    let points = v["points"].as_array().unwrap();
    assert_eq!(points.len(), 2 * 5);
    let at = |scheme: &str, loss: f64| {
        points
            .iter()
            .find(|p| p["scheme"] == scheme && p["loss"].as_f64() == Some(loss))
            .unwrap_or_else(|| panic!("no point {scheme} {loss}"))
    };
    let n = |p: &Value, k: &str| p[k].as_u64().unwrap_or_else(|| panic!("{k} in {p}"));
    // Reordering only: ferroce's SR and Themis send nothing twice; RNIC-SR NACKs the
    // reordering and resends what was never lost; timeout-only waits for nothing.
    let sr = at("spray+ferroce-sr", 0.0);
    assert_eq!(n(sr, "retransmitted_packets"), 0);
    assert!(sr["goodput_ratio"].as_f64().unwrap() > 0.95, "{sr}");
    // (PSN spraying over two equal paths barely reorders, so the receivers may not NACK.)
    let themis = at("spray+themis", 0.0);
    assert!(
        themis["themis"]["sprayed"].as_u64().unwrap() > 0,
        "{themis}"
    );
    assert_eq!(n(themis, "nacks_received"), 0, "{themis}");
    assert_eq!(n(themis, "retransmitted_packets"), 0);
    assert_eq!(
        n(themis, "nacks_sent"),
        themis["themis"]["nacks_invalid"].as_u64().unwrap()
            + themis["themis"]["nacks_stashed"].as_u64().unwrap()
    );
    let rnic = at("spray+rnic-sr", 0.0);
    assert!(n(rnic, "spurious_retransmissions") > 0, "{rnic}");
    assert_eq!(n(at("ecmp+gbn", 0.0), "nacks_sent"), 0);
    // With a 1% lossy link, the timer is the only way back for timeout-only.
    let lossy = at("spray+timeout-only", 0.01);
    assert!(n(lossy, "link_drops") > 0);
    assert_eq!(n(lossy, "nacks_sent"), 0);
    assert!(n(lossy, "timeouts") > 0, "{lossy}");
    for p in points {
        assert_eq!(p["verified"], true, "{p}");
        assert!(p["tail_fct_us"].as_f64().unwrap() > 0.0);
    }
    // Same seed, same run: every number but the wall clock agrees.
    let again: Value = serde_json::from_slice(&ferroce(&args).stdout).unwrap();
    assert_eq!(again["points"], v["points"]);
}

#[test]
fn scenario_spray_writes_its_plot_and_refuses_bad_arguments() {
    let dir = std::env::temp_dir().join(format!("ferroce-plot-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let svg = dir.join("spray.svg");
    let out = ferroce(&[
        "scenario",
        "spray",
        "--size",
        "64KiB",
        "--loss",
        "0,0.001",
        "--runs",
        "1",
        "--scheme",
        "spray-sr,ecmp-gbn",
        "--plot",
        svg.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("spray+ferroce-sr") && !text.contains("spray+themis"),
        "{text}"
    );
    let plot = std::fs::read_to_string(&svg).unwrap();
    assert!(plot.starts_with("<svg") && plot.matches("<polyline").count() == 2);
    std::fs::remove_dir_all(&dir).unwrap();

    one_line_error(
        &ferroce(&["scenario", "spray", "--size", "12parsecs"]),
        "ferroce: invalid value '12parsecs'",
    );
    one_line_error(
        &ferroce(&["scenario", "spray", "--loss", "1.5"]),
        "ferroce: loss rate 1.5 is not in [0, 1)",
    );
    one_line_error(
        &ferroce(&["scenario", "spray", "--scheme", "magic"]),
        "ferroce: invalid value 'magic'",
    );
}

/// `ferroce --help` opens with what the tool is and lists exactly the subcommands that run,
/// each of which answers its own `--help` (it once promised "perf, model and scenario to
/// come" after perf and scenario had arrived).
#[test]
fn help_names_every_command_and_none_to_come() {
    let out = ferroce(&["--help"]);
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        help.lines().next(),
        Some("ferroce: a software RNIC speaking RoCEv2")
    );
    assert!(!help.contains("to come"), "{help}");
    let commands: Vec<&str> = help
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .collect();
    assert_eq!(
        commands,
        ["decode", "demo", "perf", "stats", "scenario", "model", "switch", "serve"]
    );
    for c in commands {
        let out = ferroce(&[c, "--help"]);
        assert!(out.status.success(), "{c} --help");
    }
}

/// `ferroce model sdr --json`: every scheme, its analytic mean within 5 % of its Monte Carlo
/// mean, slowdowns against the loss-free time, both drop probabilities; a bad argument is one
/// line.
#[test]
fn model_sdr_prints_every_scheme_analytic_beside_monte_carlo() {
    let out = ferroce(&["model", "sdr", "--drop", "1e-4", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["size_bytes"], 128u64 << 20);
    let p_chunk = 1.0 - (1.0 - 1e-4f64).powi(16);
    assert!((v["p_chunk"].as_f64().unwrap() - p_chunk).abs() < 1e-12);
    let names: Vec<&str> = v["schemes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["scheme"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["sr-rto", "sr-nack", "ec-mds", "ec-xor"]);
    for s in v["schemes"].as_array().unwrap() {
        let (a, m) = (
            s["mean_s"].as_f64().unwrap(),
            s["mc_mean_s"].as_f64().unwrap(),
        );
        assert!((a - m).abs() / m < 0.05, "{s}");
        assert!(s["mean_slowdown"].as_f64().unwrap() >= 1.0, "{s}");
    }
    let bad = ferroce(&["model", "sdr", "--drop", "2"]);
    assert_eq!(bad.status.code(), Some(2));
    assert_eq!(String::from_utf8_lossy(&bad.stderr).lines().count(), 1);
}

/// `scenario sdr` on a small grid: every scheme completes every Write with the bytes sent,
/// the JSON carries the fields the issue lists, and a bad argument is one line.
#[test]
fn scenario_sdr_reports_every_scheme_beside_the_model() {
    let out = ferroce(&[
        "scenario", "sdr", "--size", "1MiB", "--drop", "1e-3", "--runs", "4", "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let points = v["points"].as_array().unwrap();
    let names: Vec<&str> = points
        .iter()
        .map(|p| p["scheme"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["sr-rto", "sr-nack", "ec-mds", "ec-xor", "auto"]);
    for p in points {
        for key in [
            "k",
            "m",
            "size_bytes",
            "chunk_bytes",
            "mtu",
            "gbps",
            "rtt_ms",
            "rto_us",
            "loss_model",
            "drop",
            "runs",
            "mean_slowdown",
            "p999_slowdown",
            "model_mean_slowdown",
            "bytes_on_wire",
            "verified",
            "p_chunk",
        ] {
            assert!(!p[key].is_null(), "{key} missing in {p}");
        }
        assert_eq!(p["verified"], true, "{p}");
        assert_eq!(p["runs"], 4);
        assert!(p["mean_slowdown"].as_f64().unwrap() >= 0.99, "{p}");
        // At least the message, each frame's headers on top.
        assert!(p["bytes_on_wire"].as_u64().unwrap() > 4 << 20, "{p}");
    }
    let ec = &points[2];
    assert!(
        ec["inflation"].as_f64().unwrap() > 1.2,
        "parity costs bytes: {ec}"
    );
    // The heat map and the check against the model.
    let dir = std::env::temp_dir().join(format!("ferroce-sdr-plot-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let svg = dir.join("sdr.svg");
    let out = ferroce(&[
        "scenario",
        "sdr",
        "--size",
        "1MiB",
        "--drop",
        "1e-4,1e-3",
        "--runs",
        "3",
        "--scheme",
        "sr-nack,auto",
        "--check",
        "--plot",
        svg.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let plot = std::fs::read_to_string(&svg).unwrap();
    assert!(plot.starts_with("<svg") && plot.contains("sr-nack") && plot.contains("auto"));
    std::fs::remove_dir_all(&dir).unwrap();
    let bad = ferroce(&["scenario", "sdr", "--chunk", "5000"]);
    assert!(!bad.status.success());
    let err = String::from_utf8_lossy(&bad.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}

/// `scenario failover` on two faults: native failover moves the stream to the other rail and
/// loses nothing (every WR completed, atomics once each); SHIFT mode refuses to resubmit
/// with an atomic outstanding and fails like the RNIC; Varuna mode recovers, later; R2CCL
/// blames the right component and rolls back (its resends may run an atomic twice); without
/// failover the QP dies.
#[test]
fn scenario_failover_native_survives_where_none_dies() {
    let out = ferroce(&["scenario", "failover", "--fault", "tor,blackhole", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 10);
    for r in runs {
        for key in [
            "scheme",
            "fault",
            "detect_us",
            "failover_us",
            "resent_bytes",
            "duplicates_executed",
            "atomics_ok",
            "verified",
        ] {
            assert!(r.get(key).is_some(), "{key} missing in {r}");
        }
        if r["scheme"] != "r2ccl" {
            assert_eq!(r["atomics_ok"], true, "{r}");
            assert_eq!(r["duplicates_executed"], 0, "{r}");
        }
        match r["scheme"].as_str().unwrap() {
            "native" => {
                assert_eq!(r["errors"], 0, "{r}");
                assert_eq!(r["verified"], true, "{r}");
                assert!(r["failover_us"].as_f64().is_some(), "{r}");
            }
            "shift" => {
                assert!(r["refused"].as_u64().unwrap() > 0, "{r}");
                assert!(r["errors"].as_u64().unwrap() > 0, "{r}");
            }
            // Varuna recovers from its completion log, FETCH_ADDs included: nothing lost,
            // nothing twice, after the RNIC's retry budget; every logged op paid its entry.
            "varuna" => {
                assert_eq!(r["errors"], 0, "{r}");
                assert_eq!(r["verified"], true, "{r}");
                assert!(r["failover_us"].as_f64().unwrap() > 1000.0, "{r}");
                assert!(r["log_bytes_per_op"].as_f64().unwrap() >= 8.0, "{r}");
            }
            // R2CCL blames the component (the black hole is on host 0's own link) after the
            // retry budget, the out-of-band round trip and the probes, then rolls back.
            "r2ccl" => {
                assert_eq!(r["errors"], 0, "{r}");
                assert_eq!(r["verified"], true, "{r}");
                let want = if r["fault"] == "tor" {
                    "tor"
                } else {
                    "local-nic"
                };
                assert_eq!(r["localized"], want, "{r}");
                assert!(r["localize_us"].as_f64().unwrap() > 1000.0, "{r}");
            }
            _ => {
                assert!(r["errors"].as_u64().unwrap() > 0, "{r}");
                assert!(r["failover_us"].is_null(), "{r}");
            }
        }
    }
    let tor = &runs[0];
    // A ToR failure is a link event at both ends: the move is immediate.
    assert!(tor["failover_us"].as_f64().unwrap() < 50.0, "{tor}");
}

/// SHIFT mode on a WRITE-only stream: the default QP's retries run out (the RNIC's error
/// is SHIFT's detection), the WRs go again on the backup QP after the handshake, nothing is
/// lost, and after the repair the traffic goes home (a fallback and a switch-back).
#[test]
fn scenario_failover_shift_resubmits_a_write_stream() {
    let out = ferroce(&[
        "scenario",
        "failover",
        "--fault",
        "remote-nic",
        "--scheme",
        "shift,native",
        "--atomic-every",
        "0",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let runs = v["runs"].as_array().unwrap();
    let (shift, native) = (&runs[0], &runs[1]);
    assert_eq!(shift["scheme"], "shift");
    assert_eq!(shift["errors"], 0, "{shift}");
    assert_eq!(shift["verified"], true, "{shift}");
    assert_eq!(shift["migrations"], 2, "{shift}");
    // SHIFT waits for the retry budget (8 ACK timeouts of 131 µs); native is told at once.
    let (s, n) = (
        shift["failover_us"].as_f64().unwrap(),
        native["failover_us"].as_f64().unwrap(),
    );
    assert!(s > 1000.0 && n < 50.0, "shift {s} µs, native {n} µs");
}

/// `scenario varuna`, short form: Varuna mode (with dedicated backup QPs or the shared pool)
/// and native failover leave the shared lock and counter right in every run; the JSON
/// carries each (scheme, fault)'s counts; a bad argument is one line.
#[test]
fn scenario_varuna_keeps_the_lock_and_counter_right() {
    let out = ferroce(&[
        "scenario",
        "varuna",
        "--runs",
        "4",
        "--clients",
        "8",
        "--iterations",
        "2",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 12, "four schemes × three faults");
    for r in rows {
        for key in [
            "wrong_runs",
            "duplicated_updates",
            "lost_updates",
            "bad_releases",
            "stuck_runs",
            "lock_held_runs",
            "mean_finish_ms",
            "failovers",
            "log_bytes_per_op",
        ] {
            assert!(r.get(key).is_some(), "{key} missing in {r}");
        }
        assert_eq!(r["runs"], 4, "{r}");
        match r["scheme"].as_str().unwrap() {
            "varuna" => {
                assert_eq!(r["wrong_runs"], 0, "{r}");
                assert!(r["log_bytes_per_op"].as_f64().unwrap() > 8.0, "{r}");
                assert_eq!(r["backup_qps_at_start"], 8, "{r}");
            }
            "varuna-pool" => {
                assert_eq!(r["wrong_runs"], 0, "{r}");
                assert_eq!(r["backup_qps_at_start"], 1, "{r}");
                // Every client that failed over got its own QP back, later.
                assert_eq!(r["rebuilt"], r["failovers"], "{r}");
                assert!(r["mean_rebuilt_all_after_ms"].as_f64().is_some(), "{r}");
            }
            "native" => assert_eq!(r["wrong_runs"], 0, "{r}"),
            _ => assert_eq!(r["log_bytes_per_op"], 0.0, "{r}"),
        }
        assert!(r["failovers"].as_u64().unwrap() > 0, "{r}");
    }
    let bad = ferroce(&["scenario", "varuna", "--clients", "0"]);
    assert!(!bad.status.success());
    let err = String::from_utf8_lossy(&bad.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}

/// `scenario allreduce`, short form: every fault against the plain ring and R2CCL's rule on
/// four nodes and 4 MiB (below that the decomposition's extra pipeline does not pay) — every collective sums right, every localization blames what
/// failed, a dead NIC or a NIC down to a quarter is decomposed around and the next
/// collective beats the plain ring's; random faults are all blamed right; a training loop
/// through a NIC failure costs less with R2CCL than without; a bad argument is one line.
#[test]
fn scenario_allreduce_localizes_repairs_and_decomposes() {
    let out = ferroce(&[
        "scenario",
        "allreduce",
        "--size",
        "4MiB",
        "--scheme",
        "ring,r2ccl",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 12, "six faults × two schemes");
    let after = |fault: &str, scheme: &str| -> f64 {
        rows.iter()
            .find(|r| r["fault"] == fault && r["scheme"] == scheme)
            .and_then(|r| r["after_of_base"].as_f64())
            .unwrap()
    };
    for r in rows {
        assert_eq!(r["verified"], true, "{r}");
        assert_eq!(r["accurate"], true, "{r}");
        let fault = r["fault"].as_str().unwrap();
        if ["nic", "link", "tor"].contains(&fault) {
            assert!(r["localize_us"].as_f64().unwrap() > 0.0, "{r}");
            assert!(r["migrations"].as_u64().unwrap() > 0, "{r}");
        }
    }
    for fault in ["nic", "degrade-75"] {
        assert!(
            after(fault, "r2ccl") > after(fault, "ring"),
            "{fault}: r2ccl {} ring {}",
            after(fault, "r2ccl"),
            after(fault, "ring")
        );
    }
    let out = ferroce(&[
        "scenario",
        "allreduce",
        "--size",
        "1MiB",
        "--random-faults",
        "6",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["accuracy"], 1.0, "{v}");
    assert_eq!(v["verified"], true, "{v}");
    let out = ferroce(&[
        "scenario",
        "allreduce",
        "--size",
        "4MiB",
        "--train",
        "4",
        "--compute-us",
        "200",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = v["rows"].as_array().unwrap();
    let overhead = |s: &str| {
        rows.iter()
            .find(|r| r["scheme"] == s)
            .and_then(|r| r["overhead"].as_f64())
            .unwrap()
    };
    assert!(overhead("r2ccl") < overhead("ring"), "{v}");
    let bad = ferroce(&["scenario", "allreduce", "--nodes", "2"]);
    assert!(!bad.status.success());
    let err = String::from_utf8_lossy(&bad.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}

/// `scenario incast`, short form: sixteen senders and a long flow into one receiver through a
/// 1 MB marking buffer — every byte arrives under every scheme (DCQCN twice, TIMELY, none),
/// the receiver sends CNPs, and
/// DCQCN (ferroce's parameters) drops less than no congestion control; the JSON carries the
/// issue's keys per point. (The utilization and fairness targets are not met yet:
/// docs/congestion.md.)
#[test]
fn scenario_incast_meets_its_targets_with_dcqcn() {
    let out = ferroce(&[
        "scenario",
        "incast",
        "--senders",
        "16",
        "--duration-ms",
        "4",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let points = v["points"].as_array().unwrap();
    assert_eq!(points.len(), 4, "four schemes");
    for p in points {
        for key in [
            "scheme",
            "senders",
            "utilization",
            "jain",
            "queue_p99_bytes",
            "drops",
            "cnps",
            "verified",
        ] {
            assert!(p.get(key).is_some(), "{key} missing in {p}");
        }
        assert_eq!(p["verified"], true, "{p}");
        if p["scheme"] != "timely" {
            assert!(p["cnps"].as_u64().unwrap() > 0, "the queue marks: {p}");
        }
    }
    let drops = |s: &str| {
        points
            .iter()
            .find(|p| p["scheme"] == s)
            .and_then(|p| p["drops"].as_u64())
            .unwrap()
    };
    // Issue 24's targets at 16:1 with ferroce's DCQCN, as it ships: the link kept busy and
    // shared fairly once converged (the second half of the incast), the queue below Kmax,
    // nothing lost from a 1 MB buffer. Without congestion control the buffer overflows.
    let kmax = v["kmax_bytes"].as_u64().unwrap();
    assert_eq!(kmax, 500_000, "{v}");
    let d = points.iter().find(|p| p["scheme"] == "dcqcn").unwrap();
    assert!(d["utilization"].as_f64().unwrap() >= 0.95, "{d}");
    assert!(d["jain"].as_f64().unwrap() >= 0.95, "{d}");
    assert!(d["queue_p99_bytes"].as_u64().unwrap() < kmax, "{d}");
    assert_eq!(d["drops"], 0, "{d}");
    assert_eq!(d["errors"], 0, "{d}");
    assert!(drops("none") > 0, "{v}");
    // The staggered run: three joins and three leaves, each with its fair share.
    let out = ferroce(&[
        "scenario",
        "incast",
        "--staggered-ms",
        "1",
        "--depth",
        "4",
        "--scheme",
        "dcqcn",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let events = v["events"].as_array().unwrap();
    let active: Vec<u64> = events
        .iter()
        .map(|e| e["active"].as_u64().unwrap())
        .collect();
    assert_eq!(active, [2, 3, 4, 3, 2, 1], "{v}");
    for e in events {
        assert_eq!(e["verified"], true, "{e}");
        assert!(e.get("converge_us").is_some(), "{e}");
    }
    let bad = ferroce(&["scenario", "incast", "--senders", "0"]);
    assert!(!bad.status.success());
    let err = String::from_utf8_lossy(&bad.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}

/// `scenario varuna --steady`, short form: with nothing failing, native failover changes no
/// latency and no goodput at all (the same packets), and Varuna's log costs a little on
/// batched 4 KiB WRITEs (an 8-byte WRITE per request: the paper's ≤ 2.5 % goodput above
/// 4 KiB) and more on tiny ones.
#[test]
fn scenario_varuna_steady_costs_what_the_log_puts_on_the_wire() {
    let out = ferroce(&[
        "scenario",
        "varuna",
        "--steady",
        "--sizes",
        "16,4KiB",
        "--clients",
        "4",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(
        rows.len(),
        6 * 3,
        "2 sizes × 2 WRITE workloads + 2 CAS ones, 3 schemes"
    );
    let find = |w: &str, size: u64, s: &str| {
        rows.iter()
            .find(|r| r["workload"] == w && r["size"] == size && r["scheme"] == s)
            .unwrap_or_else(|| panic!("{w} {size} {s}"))
    };
    for r in rows {
        assert_eq!(r["ok"], true, "{r}");
        if r["scheme"] == "native" {
            assert_eq!(r["latency_overhead"], 0.0, "{r}");
            assert_eq!(r["bandwidth_overhead"], 0.0, "{r}");
        }
    }
    let b4k = find("write-batch64", 4096, "varuna")["bandwidth_overhead"]
        .as_f64()
        .unwrap();
    assert!(b4k > 0.0 && b4k < 0.05, "{b4k}");
    let b16 = find("write-batch64", 16, "varuna")["bandwidth_overhead"]
        .as_f64()
        .unwrap();
    assert!(b16 > b4k, "{b16} vs {b4k}");
}

/// `ferroce serve`: a short run on the default `loop` device prints its JSON summary; a bad
/// mode or a device that does not open is one line that says what to do.
#[test]
fn serve_runs_and_refuses_bad_arguments_in_one_line() {
    let dir = std::env::temp_dir().join(format!("ferroce-cli-serve-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("s.sock");
    let sock = sock.to_str().unwrap();
    let out = ferroce(&["serve", "--socket", sock, "--duration", "0.2", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["devices"], serde_json::json!(["loop"]));
    assert_eq!(r["sessions"], 0);
    assert!(
        !std::path::Path::new(sock).exists(),
        "the socket file stays behind"
    );
    for (args, says) in [
        (vec!["serve", "--mode", "999"], "octal"),
        (
            vec!["serve", "--socket", sock, "--device", "nosuch:x"],
            "cannot open device",
        ),
    ] {
        let out = ferroce(&args);
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(err.contains(says), "{err}");
    }
}
