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
