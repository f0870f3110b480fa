//! An AF_PACKET port whose link goes away and comes back transmits again.
//!
//! The fault this pins down left failover runs' QPs on their alternate port for good: while
//! the peer's end of a veth pair was down, the kernel refused every frame of the transmit ring
//! (a link without carrier) and left each one queued; the ring filled, and since the port
//! asked the kernel to send only when it had queued something new, a full ring was never
//! handed to the kernel again. Every later frame on that port was dropped as "ring full":
//! probes home and their answers with them.
//!
//! Needs root (a network namespace of its own, raw sockets): skipped, saying so, otherwise.
//! The test's thread moves into a new network namespace, so its veth pair disappears with it.

use std::process::Command;
use std::time::{Duration, Instant};

use ferroce_drivers::afpacket::AfPacketPort;
use ferroce_drivers::{LinkState, Port};

/// An ethertype for local experiments (IEEE 802 "local experimental ethertype 1").
const ETHERTYPE: [u8; 2] = [0x88, 0xb5];

fn ip(args: &[&str]) {
    let st = Command::new("ip").args(args).status().expect("runs ip");
    assert!(st.success(), "ip {}", args.join(" "));
}

fn wait_link(port: &AfPacketPort, want: LinkState) {
    let t = Instant::now();
    while port.link_state() != want {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "{} never became {want:?}",
            port.name()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Queues and flushes one frame from `from` to `to` carrying `tag`.
fn send(from: &mut AfPacketPort, to: &AfPacketPort, tag: u32) -> bool {
    let (dst, src) = (to.mac().0, from.mac().0);
    let ok = from
        .tx(64, |b| {
            b.fill(0);
            b[..6].copy_from_slice(&dst);
            b[6..12].copy_from_slice(&src);
            b[12..14].copy_from_slice(&ETHERTYPE);
            b[14..18].copy_from_slice(&tag.to_be_bytes());
        })
        .is_ok();
    from.flush();
    ok
}

/// Sends from `from` while its link is down until its transmit ring is full; how many
/// frames it queued.
fn fill(from: &mut AfPacketPort, to: &AfPacketPort, tag: u32) -> u32 {
    let mut queued = 0u32;
    while send(from, to, tag) {
        queued += 1;
        assert!(queued < 1_000_000, "the ring never filled");
    }
    assert!(queued > 0, "no frame was queued while the link was down");
    queued
}

/// Whether `port` receives a frame of ours tagged `tag` within a second (other frames, the
/// kernel's own neighbour discovery say, are skipped).
fn receives(port: &mut AfPacketPort, tag: u32) -> bool {
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(1) {
        let mut seen = false;
        port.rx_burst(64, |f| {
            seen |= f.len() >= 18 && f[12..14] == ETHERTYPE && f[14..18] == tag.to_be_bytes();
        });
        if seen {
            return true;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    false
}

#[test]
fn a_port_transmits_again_after_its_link_comes_back() {
    // SAFETY: geteuid takes no arguments and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root (a network namespace and raw sockets)");
        return;
    }
    std::thread::spawn(|| {
        // SAFETY: unshare takes no pointers; it moves only this thread (and the processes
        // it starts) into a new network namespace.
        let rc = unsafe { libc::unshare(libc::CLONE_NEWNET) };
        assert_eq!(
            rc,
            0,
            "unshare(CLONE_NEWNET): {}",
            std::io::Error::last_os_error()
        );
        ip(&["link", "add", "fla", "type", "veth", "peer", "name", "flb"]);
        ip(&["link", "set", "fla", "up"]);
        ip(&["link", "set", "flb", "up"]);
        let mut a = AfPacketPort::open("fla").expect("opens fla");
        let mut b = AfPacketPort::open("flb").expect("opens flb");
        assert!(a.uses_rings(), "the port under test sends through its ring");
        wait_link(&a, LinkState::Up);
        assert!(
            send(&mut a, &b, 1) && receives(&mut b, 1),
            "a frame before the fault"
        );

        // The far end goes down: this end loses its carrier and the kernel refuses its
        // frames, which stay in the ring until it is full.
        ip(&["link", "set", "flb", "down"]);
        wait_link(&a, LinkState::Down);
        let refused = fill(&mut a, &b, 2);

        // Back up: frames leave again (the stale ones first, then the new).
        ip(&["link", "set", "flb", "up"]);
        wait_link(&a, LinkState::Up);
        assert!(
            send(&mut a, &b, 3),
            "the ring is still full after the link came back ({refused} frames were queued \
             while it was down)"
        );
        assert!(receives(&mut b, 3), "a frame after the link came back");

        // The same with this end's own interface down (the kernel then refuses with
        // ENETDOWN before it looks at a frame), and frames still arrive here afterwards.
        ip(&["link", "set", "fla", "down"]);
        wait_link(&a, LinkState::Down);
        let refused = fill(&mut a, &b, 4);
        ip(&["link", "set", "fla", "up"]);
        wait_link(&a, LinkState::Up);
        wait_link(&b, LinkState::Up);
        assert!(
            send(&mut a, &b, 5),
            "the ring is still full after the interface came back up ({refused} frames were \
             queued while it was down)"
        );
        assert!(
            receives(&mut b, 5),
            "a frame after the interface came back up"
        );
        assert!(
            send(&mut b, &a, 6) && receives(&mut a, 6),
            "a frame to the port after it"
        );
    })
    .join()
    .unwrap();
}
