//! Two processes in two network namespaces joined by a veth pair run all six perf tests over
//! AF_PACKET with verified data; a client whose server is absent, or speaks something else,
//! fails with one clear line. Needs root (namespaces, raw sockets): skipped, saying so,
//! otherwise. The namespaces are removed even when a test fails.

mod common;

use std::io::Write;
use std::net::TcpListener;
use std::process::{Command, Stdio};

use common::{json_of, Pair};

fn root() -> bool {
    common::root("network namespaces and AF_PACKET")
}

/// One end of a two-process run: its namespace, its `--device`, extra arguments and
/// environment.
struct End<'a> {
    ns: &'a str,
    device: &'a str,
    args: &'a [&'a str],
    env: Option<&'a str>,
}

impl<'a> End<'a> {
    /// `device` in namespace `ns`, with no extra arguments or environment.
    fn at(ns: &'a str, device: &'a str) -> Self {
        Self {
            ns,
            device,
            args: &[],
            env: None,
        }
    }
}

/// Runs `ferroce perf VERB KIND` with the server at `server` and the client at `client`
/// (which connects to 192.168.77.2) with the `common` arguments, checks that both exit 0 with
/// verified data, and returns both summaries.
fn perf_pair(
    client: End<'_>,
    server: End<'_>,
    verb: &str,
    kind: &str,
    common: &[&str],
) -> (serde_json::Value, serde_json::Value) {
    let bin = env!("CARGO_BIN_EXE_ferroce");
    let cmd = |end: &End<'_>| {
        let mut c = Command::new("ip");
        c.args([
            "netns", "exec", end.ns, bin, "perf", verb, kind, "--device", end.device,
        ])
        .args(end.args)
        .args(common);
        if let Some(var) = end.env {
            c.env(var, "1");
        }
        c
    };
    let srv = cmd(&server)
        .arg("--server")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let cli = cmd(&client)
        .args(["--connect", "192.168.77.2"])
        .output()
        .unwrap();
    let srv = srv.wait_with_output().unwrap();
    if cli.stdout.is_empty() || srv.stdout.is_empty() {
        panic!(
            "{verb} {kind}: client said {} / {}, server said {} / {}",
            String::from_utf8_lossy(&cli.stdout),
            String::from_utf8_lossy(&cli.stderr),
            String::from_utf8_lossy(&srv.stdout),
            String::from_utf8_lossy(&srv.stderr)
        );
    }
    let (c, s) = (json_of(&cli), json_of(&srv));
    assert_eq!(cli.status.code(), Some(0), "{verb} {kind} client: {c}");
    assert_eq!(srv.status.code(), Some(0), "{verb} {kind} server: {s}");
    assert_eq!(c["verified"], true, "{verb} {kind}: {c}");
    assert_eq!(s["verified"], true, "{verb} {kind}: {s}");
    (c, s)
}

#[test]
fn six_perf_tests_between_two_namespaces() {
    if !root() {
        return;
    }
    let pair = Pair::up(&format!("fn{}", std::process::id() % 100_000));
    let [(na, ia), (nb, ib)] = pair.afpacket_ends();
    let run = |verb: &str, kind: &str, port: usize, no_ring: bool| {
        let port = port.to_string();
        let common = [
            "--size", "3000", "--iters", "500", "--mtu", "1024", "--port", &port, "--json",
        ];
        let env = no_ring.then_some("FERROCE_AFPACKET_NO_RING");
        let (c, _) = perf_pair(
            End {
                env,
                ..End::at(&na, &ia)
            },
            End {
                env,
                ..End::at(&nb, &ib)
            },
            verb,
            kind,
            &common,
        );
        assert_eq!(c["iterations"], 500, "{verb} {kind}");
        assert!(c["counters"]["client"]["tx_packets"].as_u64().unwrap() > 0);
    };
    for (i, verb) in ["write", "read", "send"].into_iter().enumerate() {
        for (j, kind) in ["bw", "lat"].into_iter().enumerate() {
            run(verb, kind, 20_000 + 2 * i + j, false);
        }
    }
    // The recvmmsg/sendmmsg fallback (no PACKET_MMAP rings) carries the same traffic.
    run("send", "bw", 20_010, true);
}

#[test]
fn gso_datagrams_between_two_namespaces_and_as_the_kernel_cuts_them() {
    if !root() {
        return;
    }
    let pair = Pair::up(&format!("fg{}", std::process::id() % 100_000));
    let [(na, ia), (nb, ib)] = pair.afpacket_ends();
    let (ga, gb) = (format!("{ia} gso"), format!("{ib} gso"));
    // Both ends with `gso`: datagrams cross the veth pair whole and are split on arrival.
    // 20 000-byte messages at a 4 KiB MTU are five packets: runs of equal ones travel
    // together, READ responses (from the server) included.
    for (i, verb) in ["write", "read", "send"].into_iter().enumerate() {
        for (j, kind) in ["bw", "lat"].into_iter().enumerate() {
            let port = (20_100 + 2 * i + j).to_string();
            let common = [
                "--size", "20000", "--iters", "300", "--mtu", "4096", "--port", &port, "--json",
            ];
            let (c, s) = perf_pair(End::at(&na, &ga), End::at(&nb, &gb), verb, kind, &common);
            let sender = if verb == "read" {
                &s["counters"]["server"]
            } else {
                &c["counters"]["client"]
            };
            assert!(
                sender["port_tx_zero_copy"].as_u64().unwrap() >= 300 * 4,
                "{verb} {kind}: data packets left through batches: {sender}"
            );
        }
    }
    // The kernel cuts the datagrams itself where the device cannot (UDP segmentation
    // offload off on the sending veth): a receiver without `gso` gets ordinary RoCEv2
    // packets, ICRC and all, which it records; ferroce decode and tshark read them back.
    let Some(ethtool) = ["/usr/sbin/ethtool", "/sbin/ethtool"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
    else {
        eprintln!(
            "skipped the kernel-segmentation half: no ethtool (the test command installs it)"
        );
        return;
    };
    let va = ia.trim_start_matches("afpacket:");
    let off = Command::new("ip")
        .args([
            "netns",
            "exec",
            &na,
            ethtool,
            "-K",
            va,
            "tx-udp-segmentation",
            "off",
        ])
        .output()
        .unwrap();
    assert!(
        off.status.success(),
        "{}",
        String::from_utf8_lossy(&off.stderr)
    );
    let dir = std::env::temp_dir().join(format!("ferroce-gso-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pcap = dir.join("cut.pcap");
    let pcap_s = pcap.to_str().unwrap();
    let common = [
        "--size", "65536", "--iters", "200", "--mtu", "4096", "--port", "20120", "--json",
    ];
    let (c, s) = perf_pair(
        End::at(&na, &ga),
        End {
            args: &["--pcap", pcap_s],
            ..End::at(&nb, &ib)
        },
        "write",
        "bw",
        &common,
    );
    assert!(
        c["counters"]["client"]["port_tx_zero_copy"]
            .as_u64()
            .unwrap()
            >= 200 * 16
    );
    let bin = env!("CARGO_BIN_EXE_ferroce");
    let dec = Command::new(bin)
        .args(["decode", "--json", pcap_s])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&dec.stdout);
    let mut lines: Vec<&str> = text.lines().collect();
    let d: serde_json::Value = serde_json::from_str(lines.pop().unwrap_or("")).unwrap();
    assert!(d["decoded"].as_u64().unwrap() >= 200 * 16, "{d}");
    // The capture also holds the TCP exchange; every RoCEv2 packet parses, ICRC good, and
    // the receiver counted only the TCP frames as not its own.
    let errors: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| l.contains("\"error\""))
        .collect();
    assert!(errors.iter().all(|l| l.contains("not_udp")), "{errors:?}");
    assert_eq!(d["rejected"].as_u64().unwrap(), errors.len() as u64, "{d}");
    assert_eq!(
        s["counters"]["server"]["port_rx_malformed"]
            .as_u64()
            .unwrap(),
        errors.len() as u64,
        "{s}"
    );
    if let Ok(t) = Command::new("tshark")
        .args([
            "-r",
            pcap_s,
            "-Y",
            "infiniband.bth.opcode == 7",
            "-T",
            "fields",
            "-e",
            "ip.id",
            "-e",
            "infiniband.bth.psn",
        ])
        .output()
    {
        // Each RDMA WRITE MIDDLE's identification is its PSN's low 16 bits, as cut.
        let text = String::from_utf8_lossy(&t.stdout);
        let mut n = 0;
        for line in text.lines() {
            let mut f = line.split('\t');
            let (id, psn) = (f.next().unwrap(), f.next().unwrap());
            let id = u32::from_str_radix(id.trim_start_matches("0x"), 16).unwrap();
            assert_eq!(id, psn.parse::<u32>().unwrap() & 0xffff, "{line}");
            n += 1;
        }
        assert!(n >= 200 * 14, "tshark saw {n} RDMA WRITE MIDDLE packets");
    } else {
        eprintln!("tshark not installed: the tshark half skipped (the test command installs it)");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn selective_repeat_runs_only_when_both_ends_offer_it() {
    if !root() {
        return;
    }
    let pair = Pair::up(&format!("fs{}", std::process::id() % 100_000));
    let [(na, ia), (nb, ib)] = pair.afpacket_ends();
    let bin = env!("CARGO_BIN_EXE_ferroce");
    let run = |server_offer: &str, client_offer: &str, port: u16| {
        let port = port.to_string();
        let common = [
            "--size", "4096", "--iters", "300", "--port", &port, "--json",
        ];
        let server = Command::new("ip")
            .args([
                "netns", "exec", &nb, bin, "perf", "write", "bw", "--device", &ib,
            ])
            .args(["--server", "--reliability", server_offer])
            .args(common)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let client = Command::new("ip")
            .args([
                "netns", "exec", &na, bin, "perf", "write", "bw", "--device", &ia,
            ])
            .args(["--connect", "192.168.77.2", "--reliability", client_offer])
            .args(common)
            .output()
            .unwrap();
        let server = server.wait_with_output().unwrap();
        let (c, s) = (json_of(&client), json_of(&server));
        assert_eq!(c["verified"], true, "{c}");
        assert_eq!(s["verified"], true, "{s}");
        (c["reliability"].clone(), s["reliability"].clone())
    };
    // A peer that does not offer selective repeat gets Go-Back-N, whichever end it is.
    assert_eq!(run("sr", "gbn", 20_100), ("gbn".into(), "gbn".into()));
    assert_eq!(run("gbn", "sr", 20_101), ("gbn".into(), "gbn".into()));
    assert_eq!(run("sr", "sr", 20_102), ("sr".into(), "sr".into()));
}

#[test]
fn an_absent_or_foreign_peer_is_one_clear_line() {
    if !root() {
        return;
    }
    let bin = env!("CARGO_BIN_EXE_ferroce");
    // Nobody listens.
    let free = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let out = Command::new(bin)
        .args([
            "perf",
            "write",
            "bw",
            "--device",
            "afpacket:lo",
            "--connect",
            "127.0.0.1",
        ])
        .args(["--port", &free.to_string(), "--wait", "0.5"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("ferroce: cannot reach the peer at 127.0.0.1:"),
        "{err}"
    );
    // Something else answers.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let t = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let _ =
            s.write_all(b"SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n....................................");
        std::thread::sleep(std::time::Duration::from_millis(500));
    });
    let out = Command::new(bin)
        .args([
            "perf",
            "write",
            "bw",
            "--device",
            "afpacket:lo",
            "--connect",
            "127.0.0.1",
        ])
        .args(["--port", &port.to_string()])
        .output()
        .unwrap();
    t.join().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("does not speak ferroce"), "{err}");
}

/// Removes a namespace (and the TAP inside it) even if the test fails.
struct Ns(String);

impl Drop for Ns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).output();
    }
}

#[test]
fn tap_device_talks_to_afpacket_on_the_same_interface() {
    if !root() {
        return;
    }
    let ns = format!("ft{}", std::process::id() % 100_000);
    let _ = Command::new("ip").args(["netns", "del", &ns]).output();
    let sh = |args: &[&str]| {
        let out = Command::new("ip")
            .args(["netns", "exec", &ns])
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    assert!(Command::new("ip")
        .args(["netns", "add", &ns])
        .status()
        .unwrap()
        .success());
    let _guard = Ns(ns.clone());
    sh(&[
        "sysctl",
        "-qw",
        "net.ipv6.conf.all.disable_ipv6=1",
        "net.ipv6.conf.default.disable_ipv6=1",
    ]);
    sh(&["ip", "tuntap", "add", "dev", "ftap0", "mode", "tap"]);
    sh(&["ip", "link", "set", "ftap0", "mtu", "4200"]);
    sh(&["ip", "addr", "add", "192.168.78.1/24", "dev", "ftap0"]);
    sh(&["ip", "link", "set", "ftap0", "up"]);
    sh(&["ip", "link", "set", "lo", "up"]);
    let bin = env!("CARGO_BIN_EXE_ferroce");
    for (verb, kind, port) in [("write", "bw", "20101"), ("send", "lat", "20102")] {
        let common = [
            "--size", "2000", "--iters", "300", "--mtu", "2048", "--port", port, "--json",
        ];
        let server = Command::new("ip")
            .args([
                "netns",
                "exec",
                &ns,
                bin,
                "perf",
                verb,
                kind,
                "--device",
                "afpacket:ftap0",
                "--server",
            ])
            .args(common)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // ferroce's end of the TAP is 192.168.78.2; the exchange runs over loopback.
        let pcap = std::env::temp_dir().join(format!("{ns}-{verb}.pcap"));
        let client = Command::new("ip")
            .args([
                "netns",
                "exec",
                &ns,
                bin,
                "perf",
                verb,
                kind,
                "--device",
                "tap:ftap0@192.168.78.2",
            ])
            .args(["--connect", "127.0.0.1", "--pcap", pcap.to_str().unwrap()])
            .args(common)
            .output()
            .unwrap();
        let server = server.wait_with_output().unwrap();
        let (c, s) = (json_of(&client), json_of(&server));
        assert_eq!(c["verified"], true, "{verb} {kind}: {c}");
        assert_eq!(s["verified"], true, "{verb} {kind}: {s}");
        assert_eq!(c["iterations"], 300);
        // The capture of the TAP end decodes cleanly, every frame.
        let d = Command::new(bin)
            .args(["decode", pcap.to_str().unwrap()])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&d.stdout);
        let summary = text.lines().last().unwrap_or_default();
        assert!(
            summary.ends_with("decoded, 0 rejected") && !summary.starts_with("0 "),
            "{summary}"
        );
        let _ = std::fs::remove_file(&pcap);
    }
}

/// SDR between two processes over AF_PACKET (a veth pair across two namespaces): every
/// scheme moves its messages, each checked at the receiver against the sender's pattern.
#[test]
fn sdr_between_two_namespaces() {
    if !root() {
        return;
    }
    let pair = Pair::up(&format!("fd{}", std::process::id() % 100_000));
    let [(na, ia), (nb, ib)] = pair.afpacket_ends();
    for (i, scheme) in ["sr-rto", "sr-nack", "ec-mds", "ec-xor"]
        .into_iter()
        .enumerate()
    {
        let port = (20_100 + i).to_string();
        let common = [
            "--size", "262144", "--iters", "60", "--mtu", "1024", "--port", &port, "--scheme",
            scheme, "--json",
        ];
        let (c, s) = perf_pair(End::at(&na, &ia), End::at(&nb, &ib), "sdr", "bw", &common);
        assert_eq!(c["iterations"], 60, "{scheme}: {c}");
        assert_eq!(s["iterations"], 60, "{scheme}: {s}");
        assert_eq!(c["scheme"], scheme);
        assert!(c["counters"]["sdr"]["packets_posted"].as_u64().unwrap() >= 60 * 256);
        assert!(
            s["counters"]["receive_table"]["packets_placed"]
                .as_u64()
                .unwrap()
                > 0
        );
    }
}
