//! `ferroce perf` on the simulated fabric: all six tests finish with verified data and the
//! promised JSON fields, impairments included; bad arguments are one line with exit 2.

use std::process::{Command, Output};

use serde_json::Value;

fn ferroce(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ferroce"))
        .args(args)
        .output()
        .unwrap()
}

fn json_run(args: &[&str]) -> Value {
    let out = ferroce(args);
    let text = String::from_utf8_lossy(&out.stdout);
    let v: Value = serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert_eq!(out.status.code(), Some(0), "{v}");
    v
}

#[test]
fn all_six_tests_verify_their_data() {
    for verb in ["write", "read", "send"] {
        for kind in ["bw", "lat"] {
            let v = json_run(&[
                "perf", verb, kind, "--size", "5000", "--iters", "300", "--mtu", "1024", "--json",
            ]);
            assert_eq!(v["verified"], true, "{verb} {kind}: {v}");
            assert_eq!(v["iterations"], 300, "{verb} {kind}");
            assert_eq!(v["bytes"], 300 * 5000);
            for key in ["bw_avg_gbps", "msg_rate_mpps", "wall_seconds"] {
                assert!(
                    v[key].as_f64().unwrap() > 0.0,
                    "{verb} {kind}: {key} in {v}"
                );
            }
            assert!(v["counters"]["client"]["tx_packets"].as_u64().unwrap() > 0);
            if kind == "lat" {
                let l = |k: &str| v[k].as_f64().unwrap();
                assert!(l("lat_min_us") > 0.0);
                assert!(l("lat_min_us") <= l("lat_p50_us"));
                assert!(l("lat_p50_us") <= l("lat_p99_us"));
                assert!(l("lat_p99_us") <= l("lat_p999_us"));
                // The histogram: every round trip in one log bucket, the fastest in the
                // first, the slowest in the last.
                let h = v["lat_histogram_ns"].as_array().unwrap();
                let n = |r: &Value, i: usize| r[i].as_u64().unwrap();
                assert_eq!(h.iter().map(|r| n(r, 2)).sum::<u64>(), 300, "{verb}: {h:?}");
                let (first, last) = (&h[0], &h[h.len() - 1]);
                let ns = |k: &str| (l(k) * 1e3).round() as u64;
                assert!(n(first, 0) <= ns("lat_min_us") && ns("lat_min_us") < n(first, 1));
                assert!(n(last, 0) <= ns("lat_max_us") && ns("lat_max_us") < n(last, 1));
            }
        }
    }
}

#[test]
fn bandwidth_under_loss_and_reordering_still_verifies() {
    // The same seed replays the same virtual time.
    const RUN: &[&str] = &[
        "perf",
        "send",
        "bw",
        "--size",
        "64",
        "--iters",
        "5000",
        "--loss",
        "0.02",
        "--reorder",
        "0.01",
        "--qps",
        "2",
        "--seed",
        "9",
        "--json",
    ];
    let v = json_run(RUN);
    assert_eq!(v["verified"], true, "{v}");
    assert!(
        v["counters"]["client"]["retransmitted_packets"]
            .as_u64()
            .unwrap()
            > 0
    );
    assert!(v["link"]["lost"].as_u64().unwrap() > 0);
    let again = json_run(RUN);
    assert_eq!(v["virtual_seconds"], again["virtual_seconds"]);
}

#[test]
fn human_output_has_perftests_columns() {
    let out = ferroce(&["perf", "write", "bw", "--iters", "100"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(
            "#bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]"
        ),
        "{text}"
    );
    assert!(text.contains("virtual time"));
    assert!(text.contains("wall clock"));
    assert!(text.contains("data          : verified"));
}

#[test]
fn bad_perf_arguments_are_one_line() {
    for (args, starts) in [
        (
            &["perf", "write", "bw", "--mtu", "3000"][..],
            "ferroce: --mtu 3000 is not a path MTU",
        ),
        (
            &["perf", "write", "bw", "--device", "nic0"][..],
            "ferroce: device 'nic0'",
        ),
        (
            &["perf", "write", "sideways"][..],
            "ferroce: invalid value 'sideways'",
        ),
        (
            &["perf", "read", "lat", "--loss", "3"][..],
            "ferroce: --loss and --reorder are probabilities",
        ),
        (
            &["perf", "send", "lat", "--qps", "8"][..],
            "ferroce: latency tests run one QP",
        ),
    ] {
        let out = ferroce(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.starts_with(starts), "{args:?}: {err}");
    }
}

#[test]
fn stats_shows_the_counters_a_run_exported() {
    let dir = std::env::temp_dir().join(format!("ferroce-stats-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let out = Command::new(env!("CARGO_BIN_EXE_ferroce"))
        .args(["perf", "send", "bw", "--iters", "200", "--size", "1000"])
        .env("FERROCE_STATS_DIR", &dir)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let d = dir.to_str().unwrap();
    // The run has exited: only --all shows it.
    let live = ferroce(&["stats", "--dir", d, "--json"]);
    assert_eq!(String::from_utf8_lossy(&live.stdout).trim(), "[]");
    let all = ferroce(&["stats", "--dir", d, "--json", "--all"]);
    let v: Value = serde_json::from_slice(&all.stdout).unwrap();
    let devices: Vec<&str> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["device"].as_str().unwrap())
        .collect();
    assert_eq!(devices, ["sim:a", "sim:b"]);
    let b = &v[1];
    assert_eq!(b["alive"], false);
    assert!(b["port"]["rx_frames"].as_u64().unwrap() >= 200);
    let qp = b["qps"].as_object().unwrap().values().next().unwrap();
    assert!(qp["acks_sent"].as_u64().unwrap() > 0);
    let text = ferroce(&["stats", "--dir", d, "--all"]);
    assert!(String::from_utf8_lossy(&text.stdout).contains("sim:b (pid "));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn selective_repeat_is_negotiated_and_resends_less_than_go_back_n() {
    let run = |reliability: &str| {
        json_run(&[
            "perf",
            "write",
            "bw",
            "--size",
            "8192",
            "--iters",
            "1000",
            "--loss",
            "0.01",
            "--reorder",
            "0.05",
            "--seed",
            "4",
            "--json",
            "--reliability",
            reliability,
        ])
    };
    let (gbn, sr) = (run("gbn"), run("sr"));
    for v in [&gbn, &sr] {
        assert_eq!(v["verified"], true, "{v}");
    }
    assert_eq!(gbn["reliability"], "gbn");
    assert_eq!(sr["reliability"], "sr");
    let retx = |v: &Value| {
        v["counters"]["client"]["retransmitted_packets"]
            .as_u64()
            .unwrap()
    };
    // Go-Back-N resends the whole window behind every loss; selective repeat only the losses
    // (and the responder places what arrives early instead of dropping it).
    assert!(
        retx(&sr) * 10 < retx(&gbn),
        "sr {} gbn {}",
        retx(&sr),
        retx(&gbn)
    );
    assert!(sr["counters"]["server"]["ooo_placed"].as_u64().unwrap() > 0);
    assert_eq!(gbn["counters"]["server"]["ooo_placed"].as_u64().unwrap(), 0);
}

/// `perf sdr bw` on the simulated fabric: every scheme moves every message verified, at the
/// link's rate when nothing is lost (SR) and with the parity's share when it is (EC), and
/// repairs losses its own way.
#[test]
fn sdr_bw_verifies_every_scheme_with_and_without_loss() {
    for scheme in ["sr-rto", "sr-nack", "ec-mds", "ec-xor"] {
        for loss in ["0", "0.001"] {
            let v = json_run(&[
                "perf",
                "sdr",
                "bw",
                "--size",
                "1048576",
                "--iters",
                "30",
                "--delay-us",
                "5",
                "--loss",
                loss,
                "--scheme",
                scheme,
                "--json",
            ]);
            assert_eq!(v["verified"], true, "{scheme} {loss}: {v}");
            assert_eq!(v["iterations"], 30, "{scheme} {loss}");
            assert_eq!(v["scheme"], scheme);
            let s = &v["counters"]["sender"];
            let gbps = v["bw_avg_gbps"].as_f64().unwrap();
            if loss == "0" {
                // Nothing lost, nothing resent, and the link (100 Gbit/s) nearly full of data
                // (EC: 16 data chunks travel with 8 parity chunks).
                assert_eq!(s["chunks_resent"], 0, "{scheme}: {v}");
                let floor = if scheme.starts_with("sr") { 90.0 } else { 60.0 };
                assert!(gbps > floor, "{scheme}: {gbps} Gb/s");
            } else if scheme.starts_with("sr") {
                assert!(s["chunks_resent"].as_u64().unwrap() > 0, "{scheme}: {v}");
            } else {
                assert!(
                    v["counters"]["receiver"]["chunks_rebuilt"]
                        .as_u64()
                        .unwrap_or(0)
                        > 0
                        || s["fallbacks"].as_u64().unwrap() > 0,
                    "{scheme}: {v}"
                );
            }
        }
    }
    let bad = ferroce(&["perf", "sdr", "lat"]);
    assert!(!bad.status.success());
    assert_eq!(
        String::from_utf8_lossy(&bad.stderr).trim().lines().count(),
        1
    );
}
