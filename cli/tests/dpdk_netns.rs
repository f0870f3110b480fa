//! Two processes, each with DPDK (net_af_packet on its end of a veth pair in its own
//! namespace, separate --file-prefix, --no-huge, different cores), run all six perf tests with
//! verified data; and a mixed pair, DPDK on one side and the afpacket driver on the other,
//! shows the two drivers speak the same wire; memif, virtio-user ↔ vhost and net_tap pairs;
//! and `ping` from a namespace answered by the DPDK side's smoltcp control plane. Needs root
//! and the `dpdk` feature; skipped, saying so, without root.
//!
//! A DPDK end swaps QP endpoints over TCP through its own port (smoltcp), so the two DPDK
//! processes run with no address on their veths at all. In the mixed tests a DPDK end takes an
//! address the kernel on its veth does not own (.11, .12), so the two network stacks never
//! answer for the same address.
#![cfg(feature = "dpdk")]

mod common;

use std::process::{Command, Stdio};

use common::{json_of, Pair};

fn root() -> bool {
    common::root("network namespaces and DPDK's AF_PACKET vdev")
}

/// One test at a time, whatever `--test-threads` says: each pins its DPDK processes to cores
/// 0 and 1 and busy-polls there, and two pairs on two cores would starve each other.
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ONE.lock().unwrap_or_else(|e| e.into_inner())
}

/// EAL's runtime directories of this test process's `--file-prefix`es, removed on drop.
struct EalDirs(&'static [&'static str]);

impl Drop for EalDirs {
    fn drop(&mut self) {
        let pid = std::process::id();
        for tag in self.0 {
            let _ = std::fs::remove_dir_all(format!("/var/run/dpdk/ferroce-{tag}-{pid}"));
        }
    }
}

fn dpdk(core: u32, tag: &str, iface: &str, ip: &str) -> String {
    format!(
        "dpdk:-l {core} --no-pci --no-huge -m 256 --file-prefix=ferroce-{tag}-{} --log-level=error --vdev=net_af_packet0,iface={iface} @{ip}",
        std::process::id()
    )
}

/// Where a perf process runs: in a namespace, or here.
#[derive(Clone, Copy)]
enum At<'a> {
    Ns(&'a str),
    Here,
}

fn perf_cmd(at: At<'_>) -> Command {
    let bin = env!("CARGO_BIN_EXE_ferroce");
    match at {
        At::Ns(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns, bin, "perf"]);
            c
        }
        At::Here => {
            let mut c = Command::new(bin);
            c.arg("perf");
            c
        }
    }
}

/// Runs `verb kind` with a server on `server_dev` and a client on `client_dev` connecting to
/// `host`; both must verify 300 messages of 3000 bytes. When the client's device needs a file
/// the server's creates first (a memif or vhost socket), `wait_for` names it.
fn perf_pair(
    server: (At<'_>, &str),
    client: (At<'_>, &str),
    host: &str,
    verb: &str,
    kind: &str,
    port: u16,
    wait_for: Option<&str>,
) {
    perf_pair_with(server, client, host, (verb, kind, &[]), port, wait_for);
}

/// [`perf_pair`] with `extra` arguments for both ends; returns the client's and the
/// server's JSON summaries.
fn perf_pair_with(
    (server_at, server_dev): (At<'_>, &str),
    (client_at, client_dev): (At<'_>, &str),
    host: &str,
    (verb, kind, extra): (&str, &str, &[&str]),
    port: u16,
    wait_for: Option<&str>,
) -> (serde_json::Value, serde_json::Value) {
    let port = port.to_string();
    let mut common = vec![
        "--size", "3000", "--iters", "300", "--mtu", "1024", "--port", &port, "--json",
    ];
    common.extend_from_slice(extra);
    if let Some(f) = wait_for {
        let _ = std::fs::remove_file(f);
    }
    let server = perf_cmd(server_at)
        .args([verb, kind, "--device", server_dev, "--server"])
        .args(&common)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    if let Some(f) = wait_for {
        for _ in 0..500 {
            if std::path::Path::new(f).exists() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
    let client = perf_cmd(client_at)
        .args([
            verb,
            kind,
            "--device",
            client_dev,
            "--connect",
            host,
            "--wait",
            "20",
        ])
        .args(&common)
        .output()
        .unwrap();
    let server = server.wait_with_output().unwrap();
    let (c, s) = (json_of(&client), json_of(&server));
    assert_eq!(c["verified"], true, "{verb} {kind} client: {c}");
    assert_eq!(s["verified"], true, "{verb} {kind} server: {s}");
    let qps = c["qps"].as_u64().unwrap_or(1);
    assert_eq!(c["iterations"], 300 * qps, "{verb} {kind}");
    // A zero-copy data source sent its payloads in place (3000-byte messages at 1 KiB MTU:
    // at least two full packets each).
    let source = match verb {
        "read" => Some((&s, server_dev, "server")),
        "write" | "send" => Some((&c, client_dev, "client")),
        _ => None,
    };
    if let Some((j, dev, role)) = source {
        if dev.ends_with(" zerocopy") {
            let n = j["counters"][role]["port_tx_zero_copy"]
                .as_u64()
                .unwrap_or(0);
            assert!(
                n >= 600,
                "{verb} {kind}: {n} zero-copy frames from the {role}"
            );
        }
    }
    if let Some(f) = wait_for {
        let _ = std::fs::remove_file(f);
    }
    (c, s)
}

/// Runs `verb kind` with the server on `server_dev` (at `host`) in namespace B and the client
/// on `client_dev` in namespace A.
#[allow(clippy::too_many_arguments)]
fn run(
    p: &str,
    verb: &str,
    kind: &str,
    port: u16,
    (server_dev, host): (&str, &str),
    client_dev: &str,
) {
    let (na, nb) = (format!("{p}-a"), format!("{p}-b"));
    perf_pair(
        (At::Ns(&nb), server_dev),
        (At::Ns(&na), client_dev),
        host,
        verb,
        kind,
        port,
        None,
    );
}

#[test]
fn six_perf_tests_between_two_dpdk_processes() {
    let _one = one_at_a_time();
    if !root() {
        return;
    }
    let p = format!("fd{}", std::process::id() % 100_000);
    let _pair = Pair::up(&p);
    let _eal = EalDirs(&["a", "b", "m"]);
    let short = &p[..p.len().min(8)];
    // No kernel networking on either end: the veths keep no address, and the exchange runs
    // over smoltcp on the DPDK ports.
    for side in ["a", "b"] {
        let out = Command::new("ip")
            .args([
                "netns",
                "exec",
                &format!("{p}-{side}"),
                "ip",
                "addr",
                "flush",
            ])
            .args(["dev", &format!("{short}-v{side}")])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
    }
    let a = dpdk(0, "a", &format!("{short}-va"), "192.168.77.11");
    let b = dpdk(1, "b", &format!("{short}-vb"), "192.168.77.12");
    for (i, verb) in ["write", "read", "send"].into_iter().enumerate() {
        for (j, kind) in ["bw", "lat"].into_iter().enumerate() {
            let port = 21_000 + 2 * i as u16 + j as u16;
            run(&p, verb, kind, port, (&b, "192.168.77.12"), &a);
        }
    }
}

/// Two queue pairs per port and an engine on each (`queues=2`), in two processes: the
/// kernel's packet fanout spreads flows over net_af_packet's two sockets by a hash of
/// addresses and ports, as RSS does on a NIC, so frames arrive on engines that do not own
/// their QP and are handed over, and TCP for the exchange reaches smoltcp from either queue.
/// Eight QPs each way in the bandwidth tests make it all but certain that some flow lands
/// on the other engine (sixteen flows, each on either queue).
#[test]
fn two_engines_per_dpdk_port_between_two_processes() {
    let _one = one_at_a_time();
    if !root() {
        return;
    }
    let p = format!("fq{}", std::process::id() % 100_000);
    let _pair = Pair::up(&p);
    let _eal = EalDirs(&["qa", "qb"]);
    let short = &p[..p.len().min(8)];
    let dev = |core: u32, tag: &str, side: &str, ip: &str| {
        format!(
            "dpdk:-l {core} --no-pci --no-huge -m 256 --file-prefix=ferroce-{tag}-{} --log-level=error --vdev=net_af_packet0,iface={short}-v{side},qpairs=2 @{ip} queues=2",
            std::process::id()
        )
    };
    let a = dev(0, "qa", "a", "192.168.77.11");
    let b = dev(1, "qb", "b", "192.168.77.12");
    let (na, nb) = (format!("{p}-a"), format!("{p}-b"));
    let mut forwarded = 0;
    for (verb, kind, port, qps) in [
        ("write", "bw", 21_300, "8"),
        ("read", "bw", 21_301, "8"),
        ("send", "lat", 21_302, "1"),
    ] {
        let (c, s) = perf_pair_with(
            (At::Ns(&nb), &b),
            (At::Ns(&na), &a),
            "192.168.77.12",
            (verb, kind, &["--qps", qps]),
            port,
            None,
        );
        for (j, role) in [(&c, "client"), (&s, "server")] {
            let n = |k: &str| j["counters"][role][k].as_u64().unwrap_or(u64::MAX);
            assert_eq!(n("port_rx_unknown_qp"), 0, "{verb} {kind} {role}: {j}");
            assert_eq!(n("port_rx_forward_drops"), 0, "{verb} {kind} {role}: {j}");
            forwarded += n("port_rx_forwarded");
        }
    }
    assert!(forwarded > 0, "no frame crossed engines");
}

#[test]
fn dpdk_and_afpacket_speak_the_same_wire() {
    let _one = one_at_a_time();
    if !root() {
        return;
    }
    let p = format!("fm{}", std::process::id() % 100_000);
    let _pair = Pair::up(&p);
    let _eal = EalDirs(&["a", "b", "m"]);
    let short = &p[..p.len().min(8)];
    let a = dpdk(0, "m", &format!("{short}-va"), "192.168.77.11");
    let b = format!("afpacket:{short}-vb");
    // The DPDK client's smoltcp reaches the kernel's TCP at .2.
    let server = (b.as_str(), "192.168.77.2");
    run(&p, "write", "bw", 21_100, server, &a);
    run(&p, "send", "lat", 21_101, server, &a);
    run(&p, "read", "bw", 21_102, server, &a);
    // Zero-copy frames (payload chained as external mbufs) are the same wire: the AF_PACKET
    // side checks every ICRC and the data.
    let a = format!("{a} zerocopy");
    run(&p, "write", "bw", 21_103, server, &a);
    // READ responses leave the server: the zero-copy DPDK end serves, from namespace A, and
    // the kernel's TCP in B reaches its smoltcp at .11.
    let (na, nb) = (format!("{p}-a"), format!("{p}-b"));
    perf_pair(
        (At::Ns(&na), &a),
        (At::Ns(&nb), &b),
        "192.168.77.11",
        "read",
        "bw",
        21_104,
        None,
    );
}

#[test]
fn memif_pair_between_two_processes() {
    let _one = one_at_a_time();
    if !root() {
        return;
    }
    let pid = std::process::id();
    let sock = format!("/tmp/ferroce-memif-{pid}.sock");
    let dev = |core: u32, role: &str, ip: &str| {
        format!(
            "dpdk:-l {core} --no-pci --no-huge -m 256 --file-prefix=ferroce-{role}-{pid} --log-level=error --vdev=net_memif0,role={role},socket={sock},socket-abstract=no @{ip}"
        )
    };
    let (server_dev, client_dev) = (dev(1, "server", "10.1.0.2"), dev(0, "client", "10.1.0.1"));
    let (zc_server, zc_client) = (
        format!("{server_dev} zerocopy"),
        format!("{client_dev} zerocopy"),
    );
    for (verb, kind, port, zc) in [
        ("write", "bw", 21200, false),
        ("send", "lat", 21201, false),
        ("read", "bw", 21202, false),
        ("write", "bw", 21203, true),
        ("read", "bw", 21204, true),
        // SDR Writes (generation UC QPs, the receive table as their sink, acknowledgements
        // on a control QP) between the two DPDK processes.
        ("sdr", "bw", 21205, false),
    ] {
        let (s, c) = if zc {
            (&zc_server, &zc_client)
        } else {
            (&server_dev, &client_dev)
        };
        perf_pair(
            (At::Here, s),
            (At::Here, c),
            "10.1.0.2",
            verb,
            kind,
            port,
            Some(&sock),
        );
    }
    let _ = std::fs::remove_file(&sock);
    for role in ["server", "client"] {
        let _ = std::fs::remove_dir_all(format!("/var/run/dpdk/ferroce-{role}-{pid}"));
    }
}

#[test]
fn dpdk_net_tap_against_afpacket() {
    let _one = one_at_a_time();
    if !root() {
        return;
    }
    let bin = env!("CARGO_BIN_EXE_ferroce");
    let pid = std::process::id();
    let ns = format!("fdt{}", pid % 100_000);
    let iface = format!("fdt{}", pid % 100_000);
    let _ = Command::new("ip").args(["netns", "del", &ns]).output();
    assert!(Command::new("ip")
        .args(["netns", "add", &ns])
        .status()
        .unwrap()
        .success());
    struct Gone(String, u32);
    impl Drop for Gone {
        fn drop(&mut self) {
            let _ = Command::new("ip").args(["netns", "del", &self.0]).output();
            let _ = std::fs::remove_dir_all(format!("/var/run/dpdk/ferroce-t-{}", self.1));
        }
    }
    let _gone = Gone(ns.clone(), pid);
    let sh = |args: &[&str]| {
        Command::new("ip")
            .args(["netns", "exec", &ns])
            .args(args)
            .output()
            .unwrap()
    };
    sh(&["ip", "link", "set", "lo", "up"]);
    sh(&[
        "sysctl",
        "-qw",
        "net.ipv6.conf.all.disable_ipv6=1",
        "net.ipv6.conf.default.disable_ipv6=1",
    ]);
    let common = [
        "--size", "3000", "--iters", "500", "--mtu", "1024", "--port", "21400", "--json",
    ];
    // DPDK's TAP PMD creates the interface; the client starts first and retries the exchange.
    let dpdk = format!(
        "dpdk:-l 0 --no-pci --no-huge -m 256 --file-prefix=ferroce-t-{pid} --log-level=error --vdev=net_tap0,iface={iface} @192.168.79.2"
    );
    let client = Command::new("ip")
        .args([
            "netns", "exec", &ns, bin, "perf", "write", "bw", "--device", &dpdk,
        ])
        .args(["--connect", "192.168.79.1", "--wait", "20"])
        .args(common)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut up = false;
    for _ in 0..400 {
        if sh(&["ip", "link", "show", &iface]).status.success() {
            up = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(25));
    }
    assert!(up, "DPDK did not create {iface}");
    sh(&["ip", "addr", "add", "192.168.79.1/24", "dev", &iface]);
    sh(&["ip", "link", "set", &iface, "up"]);
    let server = Command::new("ip")
        .args(["netns", "exec", &ns, bin, "perf", "write", "bw"])
        .args(["--device", &format!("afpacket:{iface}"), "--server"])
        .args(common)
        .output()
        .unwrap();
    let client = client.wait_with_output().unwrap();
    let (c, s) = (json_of(&client), json_of(&server));
    assert_eq!(c["verified"], true, "client: {c}");
    assert_eq!(s["verified"], true, "server: {s}");
}

#[test]
fn virtio_user_and_vhost_between_two_processes() {
    let _one = one_at_a_time();
    if !root() {
        return;
    }
    // vhost-user shares the guest's memory by file descriptor: hugepages, reserved here and
    // given back after (EAL's in-memory mode needs no hugetlbfs mount and leaves no files).
    struct Hugepages(String);
    impl Drop for Hugepages {
        fn drop(&mut self) {
            let _ = std::fs::write("/proc/sys/vm/nr_hugepages", &self.0);
        }
    }
    let old = std::fs::read_to_string("/proc/sys/vm/nr_hugepages").unwrap();
    let _restore = Hugepages(old.clone());
    let want = old.trim().parse::<u64>().unwrap_or(0).max(512);
    std::fs::write("/proc/sys/vm/nr_hugepages", want.to_string()).unwrap();
    let pid = std::process::id();
    let sock = format!("/tmp/ferroce-vhost-{pid}.sock");
    let server_dev = format!(
        "dpdk:-l 1 --no-pci -m 256 --in-memory --single-file-segments --file-prefix=ferroce-vh-{pid} --log-level=error --vdev=net_vhost0,iface={sock},queues=1 @10.2.0.2"
    );
    let client_dev = format!(
        "dpdk:-l 0 --no-pci -m 256 --in-memory --single-file-segments --file-prefix=ferroce-vu-{pid} --log-level=error --vdev=net_virtio_user0,path={sock},queues=1 @10.2.0.1"
    );
    for (verb, kind, port) in [("write", "bw", 21500), ("read", "lat", 21501)] {
        perf_pair(
            (At::Here, &server_dev),
            (At::Here, &client_dev),
            "10.2.0.2",
            verb,
            kind,
            port,
            Some(&sock),
        );
    }
    let _ = std::fs::remove_file(&sock);
    for tag in ["vh", "vu"] {
        let _ = std::fs::remove_dir_all(format!("/var/run/dpdk/ferroce-{tag}-{pid}"));
    }
}

#[test]
fn ping_is_answered_by_the_dpdk_side_control_plane() {
    let _one = one_at_a_time();
    if !root() {
        return;
    }
    let p = format!("fp{}", std::process::id() % 100_000);
    let _pair = Pair::up(&p);
    let _eal = EalDirs(&["p"]);
    let short = &p[..p.len().min(8)];
    let (na, nb) = (format!("{p}-a"), format!("{p}-b"));
    let ping = |count: &str| {
        Command::new("ip")
            .args([
                "netns", "exec", &na, "ping", "-c", count, "-W", "1", "-i", "0.2",
            ])
            .arg("192.168.77.12")
            .output()
            .unwrap()
    };
    // Nobody owns .12 yet: no answer.
    assert!(
        !ping("1").status.success(),
        "something answered before the DPDK side started"
    );
    let b = dpdk(1, "p", &format!("{short}-vb"), "192.168.77.12");
    let server = perf_cmd(At::Ns(&nb))
        .args(["write", "bw", "--device", &b, "--server", "--port", "21300"])
        .args([
            "--size", "3000", "--iters", "300", "--mtu", "1024", "--json",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The server waits for its client with the engine turning: smoltcp answers ARP and ping.
    let mut answered = None;
    for _ in 0..40 {
        let out = ping("3");
        if out.status.success() {
            answered = Some(String::from_utf8_lossy(&out.stdout).into_owned());
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
    // Then the test runs as usual, the exchange over TCP to smoltcp at .12, so the server
    // exits cleanly and verifies.
    let client = perf_cmd(At::Ns(&na))
        .args(["write", "bw", "--device", &format!("afpacket:{short}-va")])
        .args([
            "--connect",
            "192.168.77.12",
            "--port",
            "21300",
            "--wait",
            "20",
        ])
        .args([
            "--size", "3000", "--iters", "300", "--mtu", "1024", "--json",
        ])
        .output()
        .unwrap();
    let server = server.wait_with_output().unwrap();
    let answered = answered.expect("no echo reply from the DPDK side's smoltcp");
    assert!(answered.contains("3 received"), "{answered}");
    assert_eq!(json_of(&client)["verified"], true);
    assert_eq!(json_of(&server)["verified"], true);
}
