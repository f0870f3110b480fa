//! The simulated fabric: every impairment does what its model says, ECMP spreads flows over
//! paths with their own delay and loss, hooks see and change frames, and a seed replays a run
//! byte for byte. Each seeded test prints its seed when it fails; `FERROCE_SEED=N` replays one.

use std::panic::{catch_unwind, AssertUnwindSafe};

use ferroce_drivers::pcap::{Direction, PcapTee};
use ferroce_drivers::sim::*;
use ferroce_drivers::{LinkState, Port};
use ferroce_stack::switch::{HookCtx, SwitchHook, Verdict};
use ferroce_stack::wire::sample::{sample_frame, sample_repr, SampleAddr};
use ferroce_stack::wire::{Checks, MacAddr, Opcode, Psn, RoceRepr};

/// Runs `f` for each seed (or only `FERROCE_SEED`), naming the seed if it fails.
fn seeded(default: &[u64], f: impl Fn(u64)) {
    let seeds = match std::env::var("FERROCE_SEED") {
        Ok(s) => vec![s.parse().expect("FERROCE_SEED is a number")],
        Err(_) => default.to_vec(),
    };
    for seed in seeds {
        if let Err(e) = catch_unwind(AssertUnwindSafe(|| f(seed))) {
            eprintln!("failed with seed {seed}; replay with FERROCE_SEED={seed}");
            std::panic::resume_unwind(e);
        }
    }
}

/// A 1000-byte-payload RC WRITE from `src` to `dst` with PSN `psn` and UDP source port `sport`.
fn frame(src: MacAddr, dst: MacAddr, psn: u32, sport: u16) -> Vec<u8> {
    let addr = SampleAddr {
        udp_src_port: sport,
        ..Default::default()
    };
    let mut r = sample_repr(Opcode::RC_RDMA_WRITE_ONLY, addr, 1000);
    r.eth.src = src;
    r.eth.dst = dst;
    r.bth.psn = Psn::new(psn);
    sample_frame(&r)
}

/// Sends `n` frames from `tx`, one burst per 32.
fn send_n(tx: &mut impl Port, dst: MacAddr, n: u32, sport: impl Fn(u32) -> u16) {
    let src = tx.mac();
    for i in 0..n {
        let f = frame(src, dst, i, sport(i));
        tx.tx(f.len(), |b| b.copy_from_slice(&f)).unwrap();
        if i % 32 == 31 {
            tx.flush();
        }
    }
    tx.flush();
}

/// Drives the fabric to idle and returns what `rx` received: (arrival time, frame).
fn drain(fabric: &Fabric, rx: &mut impl Port) -> Vec<(u64, Vec<u8>)> {
    let mut got = Vec::new();
    loop {
        let t = fabric.now();
        rx.rx_burst(usize::MAX, |f| got.push((t, f.to_vec())));
        if fabric.step().is_none() {
            rx.rx_burst(usize::MAX, |f| got.push((t, f.to_vec())));
            return got;
        }
    }
}

fn psn_of(frame: &[u8]) -> Option<u32> {
    RoceRepr::parse(frame, Checks::ALL)
        .ok()
        .map(|p| p.repr.bth.psn.value())
}

fn pair(seed: u64, model: LinkModel) -> (Fabric, SimPort, SimPort, LinkId) {
    let mut b = FabricBuilder::new(seed);
    b.rx_ring(1 << 20);
    let a = b.host("a", 1);
    let z = b.host("z", 1);
    let link = b.link((a, 0), (z, 0), model);
    let fabric = b.build().unwrap();
    let pa = fabric.port(a, 0);
    let pz = fabric.port(z, 0);
    (fabric, pa, pz, link)
}

#[test]
fn clean_link_delivers_in_order_at_line_rate() {
    // 10 Gbit/s, 2 us: each 1074-byte frame takes (1074 + 24) * 8 / 10 = 878.4 -> 879 ns.
    let (fabric, mut a, mut z, link) = pair(1, LinkModel::new(10_000_000_000, 2_000));
    let dst = z.mac();
    send_n(&mut a, dst, 100, |_| 1);
    let got = drain(&fabric, &mut z);
    assert_eq!(got.len(), 100);
    let psns: Vec<u32> = got.iter().map(|(_, f)| psn_of(f).unwrap()).collect();
    assert_eq!(psns, (0..100).collect::<Vec<_>>());
    assert_eq!(got[0].1.len(), 1074);
    assert_eq!(got[0].0, 879 + 2_000);
    assert_eq!(got[99].0, 100 * 879 + 2_000);
    let [ab, ba] = fabric.link_stats(link);
    assert_eq!((ab.offered, ab.delivered), (100, 100));
    assert_eq!(ba.offered, 0);
    assert_eq!(z.stats().rx_frames, 100);
    assert_eq!(a.stats().tx_bytes, 107_400);
}

#[test]
fn queue_limit_tail_drops() {
    // 1 Gbit/s with a queue of 10 frames' bytes. Serialization counts the 24 bytes of wire
    // overhead per frame, so frame k waits behind k * 1098 bytes and is admitted while
    // k * 1098 + 1074 <= 10740: frames 0..=8.
    let mut m = LinkModel::new(1_000_000_000, 1_000);
    m.queue_limit_bytes = 10 * 1074;
    let (fabric, mut a, mut z, link) = pair(2, m);
    let dst = z.mac();
    send_n(&mut a, dst, 100, |_| 1);
    let got = drain(&fabric, &mut z);
    let [s, _] = fabric.link_stats(link);
    assert_eq!(s.delivered as usize, got.len());
    assert_eq!(s.delivered + s.dropped_queue, 100);
    assert_eq!(got.len(), 9);
    // What got through is the head of the burst.
    let psns: Vec<u32> = got.iter().map(|(_, f)| psn_of(f).unwrap()).collect();
    assert_eq!(psns, (0..got.len() as u32).collect::<Vec<_>>());
}

#[test]
fn bernoulli_loss_matches_its_rate() {
    seeded(&[3, 4, 5], |seed| {
        let mut m = LinkModel::new(0, 500);
        m.loss = Loss::Bernoulli(0.05);
        let (fabric, mut a, mut z, link) = pair(seed, m);
        let dst = z.mac();
        send_n(&mut a, dst, 20_000, |_| 1);
        let got = drain(&fabric, &mut z);
        let [s, _] = fabric.link_stats(link);
        assert_eq!(s.dropped_loss + got.len() as u64, 20_000);
        let rate = s.dropped_loss as f64 / 20_000.0;
        assert!((0.04..0.06).contains(&rate), "loss rate {rate}");
    });
}

#[test]
fn gilbert_elliott_loss_comes_in_bursts() {
    seeded(&[6, 7], |seed| {
        let loss = Loss::GilbertElliott {
            p_good_to_bad: 0.01,
            p_bad_to_good: 0.2,
            loss_good: 0.0,
            loss_bad: 0.8,
        };
        let mut m = LinkModel::new(0, 500);
        m.loss = loss;
        let (fabric, mut a, mut z, _) = pair(seed, m);
        let dst = z.mac();
        send_n(&mut a, dst, 50_000, |_| 1);
        let got = drain(&fabric, &mut z);
        let mut delivered = vec![false; 50_000];
        for (_, f) in &got {
            delivered[psn_of(f).unwrap() as usize] = true;
        }
        let lost = delivered.iter().filter(|d| !**d).count();
        let rate = lost as f64 / 50_000.0;
        let mean = loss.mean_rate();
        assert!(
            (rate - mean).abs() < mean * 0.3,
            "rate {rate}, model {mean}"
        );
        // Mean run of consecutive losses: independent loss at this rate gives ~1.04.
        let runs = delivered.windows(2).filter(|w| w[0] && !w[1]).count();
        let mean_run = lost as f64 / runs as f64;
        assert!(mean_run > 2.0, "mean loss run {mean_run}");
    });
}

#[test]
fn duplication_reordering_and_corruption_are_counted_and_visible() {
    seeded(&[8, 9, 10], |seed| {
        let mut m = LinkModel::new(25_000_000_000, 1_000);
        m.duplicate = 0.02;
        m.reorder = 0.03;
        m.reorder_delay_ns = 20_000;
        m.corrupt = 0.02;
        m.queue_limit_bytes = 0;
        let (fabric, mut a, mut z, link) = pair(seed, m);
        let dst = z.mac();
        send_n(&mut a, dst, 5_000, |_| 1);
        let got = drain(&fabric, &mut z);
        let [s, _] = fabric.link_stats(link);
        assert!(s.duplicated > 0 && s.reordered > 0 && s.corrupted > 0);
        assert_eq!(s.delivered, 5_000 + s.duplicated);
        let filtered = z.stats().rx_filtered;
        assert_eq!(got.len() as u64 + filtered, s.delivered);
        // A corrupted frame either fails to parse or went to another MAC (a flipped
        // destination bit); a corrupted duplicate counts once per copy at most.
        let bad = got.iter().filter(|(_, f)| psn_of(f).is_none()).count() as u64;
        assert!(
            bad + filtered <= 2 * s.corrupted && bad + filtered >= s.corrupted / 2,
            "bad {bad} filtered {filtered} corrupted {}",
            s.corrupted
        );
        // Every PSN arrives (nothing is lost) and some arrive after a later one.
        let psns: Vec<u32> = got.iter().filter_map(|(_, f)| psn_of(f)).collect();
        let mut seen = vec![0u32; 5_000];
        for &p in &psns {
            seen[p as usize] += 1;
        }
        let dups = seen.iter().filter(|&&c| c > 1).count();
        assert!(dups > 0);
        let late = psns.windows(2).filter(|w| w[1] < w[0]).count();
        assert!(late > 0);
    });
}

#[test]
fn link_flap_drops_while_down_and_reports_state() {
    let m = LinkModel::new(10_000_000_000, 1_000).flap(50_000, 30_000);
    let (fabric, mut a, mut z, link) = pair(11, m);
    let dst = z.mac();
    let mut sent = 0;
    // One frame every microsecond for 120 us.
    for t in 0..120u64 {
        fabric.advance_to(t * 1_000);
        let expect = if (50..80).contains(&t) {
            LinkState::Down
        } else {
            LinkState::Up
        };
        assert_eq!(a.link_state(), expect, "t = {t} us");
        let f = frame(a.mac(), dst, t as u32, 1);
        a.tx(f.len(), |b| b.copy_from_slice(&f)).unwrap();
        a.flush();
        sent += 1;
    }
    let got = drain(&fabric, &mut z);
    let [s, _] = fabric.link_stats(link);
    assert_eq!(s.offered, sent);
    assert!(s.dropped_down >= 30, "{s:?}");
    let psns: Vec<u32> = got.iter().map(|(_, f)| psn_of(f).unwrap()).collect();
    // Frame 49 leaves before the link goes down at 50 us but would arrive after: lost too.
    assert_eq!(psns, (0..49).chain(80..120).collect::<Vec<_>>());
}

/// Two hosts behind two switches joined by four parallel paths with their own delays.
fn four_paths(
    seed: u64,
    hash: EcmpHash,
    lossy_path: Option<usize>,
) -> (Fabric, SimPort, SimPort, [LinkId; 4]) {
    let mut b = FabricBuilder::new(seed);
    b.ecmp(hash);
    b.rx_ring(1 << 20);
    let a = b.host("a", 1);
    let z = b.host("z", 1);
    let s0 = b.switch("s0");
    let s1 = b.switch("s1");
    b.link((a, 0), s0, LinkModel::new(0, 100));
    b.link((z, 0), s1, LinkModel::new(0, 100));
    let paths = [0, 1, 2, 3].map(|i| {
        let mut m = LinkModel::new(0, 1_000 * (i as u64 + 1));
        if lossy_path == Some(i) {
            m.loss = Loss::Bernoulli(1.0);
        }
        b.link(s0, s1, m)
    });
    let fabric = b.build().unwrap();
    let pa = fabric.port(a, 0);
    let pz = fabric.port(z, 0);
    (fabric, pa, pz, paths)
}

#[test]
fn ecmp_spreads_source_ports_over_paths_with_their_own_delay() {
    seeded(&[12, 13], |seed| {
        let (fabric, mut a, mut z, paths) = four_paths(seed, EcmpHash::FiveTuple, None);
        let dst = z.mac();
        send_n(&mut a, dst, 400, |i| 49152 + i as u16);
        let got = drain(&fabric, &mut z);
        assert_eq!(got.len(), 400);
        for p in paths {
            let [fwd, _] = fabric.link_stats(p);
            assert!(fwd.delivered > 50, "path carried {}", fwd.delivered);
        }
        // Each path adds its own delay: arrivals fall into four groups 1 us apart.
        let mut delays: Vec<u64> = got.iter().map(|(t, _)| *t).collect();
        delays.sort();
        delays.dedup();
        assert_eq!(delays, vec![1_200, 2_200, 3_200, 4_200]);
        // One source port always takes one path.
        let (fabric2, mut a2, mut z2, paths2) = four_paths(seed, EcmpHash::FiveTuple, None);
        send_n(&mut a2, dst, 50, |_| 777);
        drain(&fabric2, &mut z2);
        let used = paths2
            .iter()
            .filter(|p| fabric2.link_stats(**p)[0].offered > 0)
            .count();
        assert_eq!(used, 1);
    });
}

#[test]
fn source_port_modulo_names_the_path_and_loss_is_per_path() {
    let (fabric, mut a, mut z, paths) = four_paths(14, EcmpHash::SourcePortModulo, Some(2));
    let dst = z.mac();
    send_n(&mut a, dst, 100, |i| i as u16);
    let got = drain(&fabric, &mut z);
    assert_eq!(got.len(), 75);
    assert!(got.iter().all(|(_, f)| psn_of(f).unwrap() % 4 != 2));
    for (i, p) in paths.iter().enumerate() {
        let [s, _] = fabric.link_stats(*p);
        assert_eq!(s.offered, 25, "path {i}");
        assert_eq!(s.dropped_loss, if i == 2 { 25 } else { 0 });
    }
}

struct Rewriter;
impl SwitchHook for Rewriter {
    fn on_frame(&mut self, ctx: &HookCtx<'_>, frame: &mut Vec<u8>) -> Verdict {
        let Ok(p) = RoceRepr::parse(frame, Checks::ALL) else {
            return Verdict::Drop;
        };
        match p.repr.bth.psn.value() % 3 {
            0 => Verdict::Drop,
            1 => {
                // Everything with PSN = 1 mod 3 is steered to the last equal-cost path.
                Verdict::ForwardVia(*ctx.candidates.last().unwrap())
            }
            _ => {
                // Rewrite: truncate the frame so it no longer parses.
                frame.truncate(20);
                Verdict::Forward
            }
        }
    }
}

#[test]
fn switch_hook_drops_reroutes_and_rewrites() {
    let mut b = FabricBuilder::new(15);
    b.ecmp(EcmpHash::SourcePortModulo);
    let a = b.host("a", 1);
    let z = b.host("z", 1);
    let s0 = b.switch("s0");
    let s1 = b.switch("s1");
    b.link((a, 0), s0, LinkModel::new(0, 100));
    b.link((z, 0), s1, LinkModel::new(0, 100));
    let p0 = b.link(s0, s1, LinkModel::new(0, 100));
    let p1 = b.link(s0, s1, LinkModel::new(0, 100));
    let fabric = b.build().unwrap();
    fabric.set_hook(s0, Rewriter);
    let (mut pa, mut pz) = (fabric.port(a, 0), fabric.port(z, 0));
    let dst = pz.mac();
    send_n(&mut pa, dst, 30, |_| 0); // ECMP alone would put everything on p0
    let got = drain(&fabric, &mut pz);
    assert_eq!(fabric.switch_stats(s0).hook_dropped, 10);
    assert_eq!(fabric.link_stats(p1)[0].offered, 10);
    assert_eq!(fabric.link_stats(p0)[0].offered, 10);
    assert_eq!(got.len(), 20);
    assert_eq!(got.iter().filter(|(_, f)| f.len() == 20).count(), 10);
    assert_eq!(
        got.iter()
            .filter_map(|(_, f)| psn_of(f))
            .filter(|p| p % 3 == 1)
            .count(),
        10
    );
}

/// Holds every third frame back and releases the held one, bounced to the sender, with the
/// next frame; records which ports it saw as host-facing.
#[derive(Default)]
struct Bouncer {
    held: Option<Vec<u8>>,
    out: Option<Vec<u8>>,
    seen: usize,
    host_ports: std::sync::Arc<std::sync::Mutex<Vec<bool>>>,
}
impl SwitchHook for Bouncer {
    fn on_frame(&mut self, ctx: &HookCtx<'_>, frame: &mut Vec<u8>) -> Verdict {
        *self.host_ports.lock().unwrap() = ctx.host_ports.to_vec();
        self.seen += 1;
        if let Some(mut f) = self.held.take() {
            // Swap the MACs: the held frame goes back where it came from.
            let (dst, src) = (f[..6].to_vec(), f[6..12].to_vec());
            f[..6].copy_from_slice(&src);
            f[6..12].copy_from_slice(&dst);
            self.out = Some(f);
        }
        if self.seen.is_multiple_of(3) {
            self.held = Some(frame.clone());
            return Verdict::Drop;
        }
        Verdict::Forward
    }
    fn poll_emit(&mut self) -> Option<Vec<u8>> {
        self.out.take()
    }
}

#[test]
fn switch_hook_originates_frames_routed_by_their_destination() {
    let mut b = FabricBuilder::new(17);
    let a = b.host("a", 1);
    let z = b.host("z", 1);
    let s0 = b.switch("s0");
    let s1 = b.switch("s1");
    b.link((a, 0), s0, LinkModel::new(0, 100));
    b.link(s0, s1, LinkModel::new(0, 100));
    b.link((z, 0), s1, LinkModel::new(0, 100));
    let fabric = b.build().unwrap();
    let bouncer = Bouncer::default();
    let host_ports = bouncer.host_ports.clone();
    fabric.set_hook(s0, bouncer);
    let (mut pa, mut pz) = (fabric.port(a, 0), fabric.port(z, 0));
    let dst = pz.mac();
    send_n(&mut pa, dst, 9, |_| 0);
    let got = drain(&fabric, &mut pz);
    // Frames 3, 6 and 9 were held; the first two came back to `a` with the next frame, the
    // last is still held.
    assert_eq!(got.len(), 6);
    let mut back = Vec::new();
    pa.rx_burst(64, |f| back.push(f.to_vec()));
    assert_eq!(back.len(), 2);
    assert!(back
        .iter()
        .all(|f| f[..6] == pa.mac().0 && f[6..12] == dst.0));
    let st = fabric.switch_stats(s0);
    assert_eq!((st.hook_dropped, st.hook_emitted), (3, 2));
    assert_eq!(st.forwarded, 6 + 2);
    // s0's port 0 faces host `a`, port 1 faces s1.
    assert_eq!(*host_ports.lock().unwrap(), [true, false]);
}

#[test]
fn frames_to_unknown_macs_are_not_forwarded() {
    let mut b = FabricBuilder::new(16);
    let a = b.host("a", 1);
    let s = b.switch("s");
    b.link((a, 0), s, LinkModel::default());
    let fabric = b.build().unwrap();
    let mut pa = fabric.port(a, 0);
    send_n(&mut pa, MacAddr([2, 9, 9, 9, 9, 9]), 3, |_| 0);
    while fabric.step().is_some() {}
    assert_eq!(fabric.switch_stats(s).no_route, 3);
}

#[test]
fn oversize_frames_are_refused() {
    let (_, mut a, _, _) = pair(17, LinkModel::default());
    assert!(a.tx(9019, |_| {}).is_err());
    assert!(a.tx(9018, |_| {}).is_ok());
}

#[test]
fn topology_errors_are_reported() {
    let mut b = FabricBuilder::new(0);
    let a = b.host("a", 1);
    let z = b.host("z", 1);
    b.link((a, 0), (z, 0), LinkModel::default());
    b.link((a, 0), (z, 0), LinkModel::default());
    assert!(matches!(b.build(), Err(BuildError::PortInUse { .. })));
    let mut b = FabricBuilder::new(0);
    let a = b.host("a", 1);
    let s = b.switch("s");
    b.link((a, 1), s, LinkModel::default());
    assert!(matches!(
        b.build(),
        Err(BuildError::NoSuchPort { index: 1, .. })
    ));
}

/// Runs a busy impaired scenario with both directions captured; returns both pcaps.
fn impaired_run(seed: u64) -> (Vec<u8>, Vec<u8>) {
    let mut m = LinkModel::new(40_000_000_000, 3_000);
    m.loss = Loss::GilbertElliott {
        p_good_to_bad: 0.02,
        p_bad_to_good: 0.3,
        loss_good: 0.001,
        loss_bad: 0.5,
    };
    m.duplicate = 0.01;
    m.reorder = 0.02;
    m.corrupt = 0.01;
    m.queue_limit_bytes = 64 * 1024;
    let m = m.flap(40_000, 5_000);
    let mut b = FabricBuilder::new(seed);
    let a = b.host("a", 1);
    let z = b.host("z", 1);
    let s0 = b.switch("s0");
    let s1 = b.switch("s1");
    b.link((a, 0), s0, m.clone());
    b.link((z, 0), s1, LinkModel::new(40_000_000_000, 500));
    b.link(s0, s1, m.clone());
    b.link(s0, s1, m);
    let fabric = b.build().unwrap();
    let mut pa = PcapTee::new(fabric.port(a, 0), Vec::new(), Direction::Tx).unwrap();
    let mut pz = PcapTee::new(fabric.port(z, 0), Vec::new(), Direction::Rx).unwrap();
    let dst = pz.mac();
    for round in 0..50u32 {
        send_n(&mut pa, dst, 40, |i| (round * 40 + i) as u16);
        fabric.advance_to(fabric.now() + 2_000);
        pz.rx_burst(usize::MAX, |_| {});
    }
    while fabric.step().is_some() {
        pz.rx_burst(usize::MAX, |_| {});
    }
    (pa.finish().unwrap().1, pz.finish().unwrap().1)
}

#[test]
fn same_seed_same_bytes() {
    seeded(&[18, 19], |seed| {
        let (tx1, rx1) = impaired_run(seed);
        let (tx2, rx2) = impaired_run(seed);
        assert_eq!(tx1, tx2);
        assert_eq!(rx1, rx2);
        assert!(rx1.len() > 100_000);
        let (_, rx3) = impaired_run(seed + 1000);
        assert_ne!(rx1, rx3);
    });
}

#[test]
fn pcap_tee_writes_nanosecond_virtual_timestamps() {
    let (fabric, a, z, _) = pair(20, LinkModel::new(10_000_000_000, 2_000));
    let mut a = PcapTee::new(a, Vec::new(), Direction::Both).unwrap();
    let mut z = PcapTee::new(z, Vec::new(), Direction::Both).unwrap();
    let dst = z.mac();
    send_n(&mut a, dst, 3, |_| 1);
    let mut t = Vec::new();
    while let Some(now) = fabric.step() {
        z.rx_burst(8, |_| t.push(now));
    }
    assert_eq!(z.frames(), 3);
    let bytes = z.finish().unwrap().1;
    // Standard pcap header: nanosecond magic, v2.4, LINKTYPE_ETHERNET.
    assert_eq!(&bytes[..4], &0xa1b2_3c4du32.to_le_bytes());
    assert_eq!(&bytes[20..24], &1u32.to_le_bytes());
    let mut r = pcap_file::pcap::PcapReader::new(&bytes[..]).unwrap();
    let mut stamps = Vec::new();
    while let Some(p) = r.next_packet() {
        let p = p.unwrap();
        assert_eq!(p.data.len(), 1074);
        stamps.push(p.timestamp.as_nanos() as u64);
    }
    assert_eq!(stamps, vec![2_879, 3_758, 4_637]);
    assert_eq!(stamps, t);
}
