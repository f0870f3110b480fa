//! `ferroce demo`: crafted RoCEv2 frames through one impaired simulated link, and an account
//! of what arrived set against what the link's impairments did. The main job of the README
//! until `ferroce perf` exists.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use ferroce_drivers::pcap::{Direction, PcapTee};
use ferroce_drivers::sim::{FabricBuilder, LinkModel, LinkStats, Loss, SimPort, WIRE_OVERHEAD};
use ferroce_drivers::Port;
use ferroce_stack::wire::sample::{sample_payload_byte, sample_repr, SampleAddr};
use ferroce_stack::wire::{Checks, Opcode, Psn, RoceRepr};
use serde_json::json;

use crate::Failure;

#[derive(clap::Args)]
pub(crate) struct Args {
    /// Frames to send.
    #[arg(long, default_value_t = 20_000)]
    frames: u32,
    /// Payload bytes of the data-carrying frames (rounded down to a multiple of 4 for
    /// first/middle packets).
    #[arg(long, default_value_t = 1024)]
    payload: usize,
    /// Link bandwidth in Gbit/s.
    #[arg(long, default_value_t = 100.0)]
    gbps: f64,
    /// One-way propagation delay in microseconds.
    #[arg(long, default_value_t = 5.0)]
    delay_us: f64,
    /// Loss probability per frame.
    #[arg(long, default_value_t = 0.01)]
    loss: f64,
    /// Make the loss bursty (Gilbert-Elliott with mean bursts of 8 frames, same mean rate).
    #[arg(long)]
    burst: bool,
    /// Duplication probability per frame.
    #[arg(long, default_value_t = 0.005)]
    dup: f64,
    /// Reordering probability per frame (a reordered frame is held back 20 us).
    #[arg(long, default_value_t = 0.01)]
    reorder: f64,
    /// Bit-corruption probability per frame.
    #[arg(long, default_value_t = 0.002)]
    corrupt: f64,
    /// Link flaps: up for UP microseconds, then down for DOWN, repeating (e.g. 500,50).
    #[arg(long, value_name = "UP,DOWN", value_parser = parse_flap)]
    flap_us: Option<(u64, u64)>,
    /// Seed of every random choice; the same seed gives the same run.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Write the frames that arrived at the receiver to this pcap file.
    #[arg(long)]
    pcap: Option<PathBuf>,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

fn parse_flap(s: &str) -> Result<(u64, u64), String> {
    let (up, down) = s
        .split_once(',')
        .ok_or_else(|| format!("'{s}' is not UP,DOWN in microseconds, e.g. 500,50"))?;
    let num = |v: &str| {
        v.trim()
            .parse::<u64>()
            .map_err(|_| format!("'{v}' is not a whole number of microseconds"))
    };
    let (up, down) = (num(up)?, num(down)?);
    if up == 0 {
        return Err("the up time of a flap must be above zero".into());
    }
    Ok((up, down))
}

/// The repeating message pattern the demo sends, one opcode per packet: a three-packet
/// WRITE, a SEND, a WRITE with immediate, a READ request and an atomic.
const PATTERN: [Opcode; 7] = [
    Opcode::RC_RDMA_WRITE_FIRST,
    Opcode::RC_RDMA_WRITE_MIDDLE,
    Opcode::RC_RDMA_WRITE_LAST,
    Opcode::RC_SEND_ONLY,
    Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE,
    Opcode::RC_RDMA_READ_REQUEST,
    Opcode::RC_FETCH_ADD,
];

fn check(args: &Args) -> Result<(), Failure> {
    let prob = |name: &str, p: f64| {
        if (0.0..=1.0).contains(&p) {
            Ok(())
        } else {
            Err(Failure(format!(
                "--{name} {p} is not a probability between 0 and 1"
            )))
        }
    };
    prob("loss", args.loss)?;
    prob("dup", args.dup)?;
    prob("reorder", args.reorder)?;
    prob("corrupt", args.corrupt)?;
    if !(args.gbps > 0.0 && args.gbps <= 10_000.0) {
        return Err(Failure(format!(
            "--gbps {} must be above 0 and at most 10000",
            args.gbps
        )));
    }
    if !(0.0..=1e6).contains(&args.delay_us) {
        return Err(Failure(format!(
            "--delay-us {} must be between 0 and 1000000",
            args.delay_us
        )));
    }
    if args.payload > 8192 {
        return Err(Failure(format!(
            "--payload {} exceeds the sim port's 9000-byte MTU; use at most 8192",
            args.payload
        )));
    }
    if args.frames == 0 {
        return Err(Failure("--frames must be at least 1".into()));
    }
    Ok(())
}

pub(crate) fn run(args: &Args) -> Result<ExitCode, Failure> {
    check(args)?;
    let bandwidth = (args.gbps * 1e9) as u64;
    let frame_len = sample_repr(
        Opcode::RC_RDMA_WRITE_FIRST,
        SampleAddr::default(),
        args.payload,
    )
    .buffer_len();
    let slot_ns = ((frame_len + WIRE_OVERHEAD) as f64 * 8.0 / args.gbps).ceil() as u64;
    let mut model = LinkModel::new(bandwidth, (args.delay_us * 1000.0) as u64);
    model.loss = match (args.loss, args.burst) {
        (0.0, _) => Loss::None,
        (p, false) => Loss::Bernoulli(p),
        (p, true) => {
            // Bad state: 50% loss, left with probability 1/8 per frame. Enter it often enough
            // that the long-run rate is p.
            let (loss_bad, p_bg) = (0.5f64, 0.125f64);
            let bad_share = (p / loss_bad).min(0.99);
            Loss::GilbertElliott {
                p_good_to_bad: p_bg * bad_share / (1.0 - bad_share),
                p_bad_to_good: p_bg,
                loss_good: 0.0,
                loss_bad,
            }
        }
    };
    model.duplicate = args.dup;
    model.reorder = args.reorder;
    model.reorder_delay_ns = 20_000;
    model.corrupt = args.corrupt;
    if let Some((up, down)) = args.flap_us {
        let horizon = u64::from(args.frames) * slot_ns * 2 + 1_000_000;
        let (mut t, period) = (up * 1000, (up + down) * 1000);
        while t < horizon {
            model = model.flap(t, down * 1000);
            t += period;
        }
    }

    let mut b = FabricBuilder::new(args.seed);
    b.rx_ring(1 << 16);
    let a = b.host("sender", 1);
    let z = b.host("receiver", 1);
    let link = b.link((a, 0), (z, 0), model);
    let fabric = b.build()?;
    let mut tx = fabric.port(a, 0);
    let rx = fabric.port(z, 0);
    let capture = match &args.pcap {
        Some(path) => {
            let f = File::create(path)
                .map_err(|e| Failure(format!("cannot create {}: {e}", path.display())))?;
            Some(BufWriter::new(f))
        }
        None => None,
    };
    let mut rx = Receiver::new(rx, capture, args.frames)?;

    let wall = Instant::now();
    let (src, dst) = (tx.mac(), rx.port.mac());
    let addr = SampleAddr::default();
    let reprs: Vec<RoceRepr> = PATTERN
        .iter()
        .map(|&op| {
            let mut r = sample_repr(op, addr, args.payload);
            r.eth.src = src;
            r.eth.dst = dst;
            r
        })
        .collect();
    let mut sent = 0u32;
    while sent < args.frames {
        // Pace the sender at line rate: frame i leaves at i * slot.
        let now = fabric.now();
        while sent < args.frames && u64::from(sent) * slot_ns <= now {
            let mut r = reprs[sent as usize % PATTERN.len()];
            r.bth.psn = Psn::new(sent);
            let len = r.buffer_len();
            tx.tx(len, |buf| {
                r.emit(buf, |p| {
                    for (i, b) in p.iter_mut().enumerate() {
                        *b = sample_payload_byte(i);
                    }
                })
                .expect("demo frames are well-formed");
            })
            .map_err(|e| Failure(format!("transmit failed: {e}")))?;
            sent += 1;
        }
        tx.flush();
        let next_send = u64::from(sent) * slot_ns;
        let t = fabric.next_event().map_or(next_send, |e| e.min(next_send));
        fabric.advance_to(t);
        rx.poll();
    }
    while fabric.step().is_some() {
        rx.poll();
    }
    let wall_s = wall.elapsed().as_secs_f64();
    let end_ns = fabric.now();
    let [stats, _] = fabric.link_stats(link);
    let filtered = rx.port.inner().stats().rx_filtered;
    let mut tally = rx.finish()?;
    tally.filtered = filtered;
    report(args, sent, &stats, &tally, end_ns, wall_s);
    Ok(ExitCode::SUCCESS)
}

/// What the receiver counted.
struct Tally {
    seen: Vec<u32>,
    arrived: u64,
    valid: u64,
    valid_bytes: u64,
    rejected: BTreeMap<&'static str, u64>,
    max_psn: Option<u32>,
    out_of_order: u64,
    /// Frames the port dropped because a flipped bit changed their destination MAC.
    filtered: u64,
}

/// The receiving host: parses what arrives and keeps the tallies.
struct Receiver {
    port: PcapTee<SimPort, Box<dyn Write>>,
    tally: Tally,
}

impl Receiver {
    fn new(port: SimPort, capture: Option<BufWriter<File>>, frames: u32) -> Result<Self, Failure> {
        let sink: Box<dyn Write> = match capture {
            Some(w) => Box::new(w),
            None => Box::new(std::io::sink()),
        };
        Ok(Self {
            port: PcapTee::new(port, sink, Direction::Rx)?,
            tally: Tally {
                seen: vec![0; frames as usize],
                arrived: 0,
                valid: 0,
                valid_bytes: 0,
                rejected: BTreeMap::new(),
                max_psn: None,
                out_of_order: 0,
                filtered: 0,
            },
        })
    }

    fn poll(&mut self) {
        let t = &mut self.tally;
        self.port.rx_burst(usize::MAX, |frame| {
            t.arrived += 1;
            match RoceRepr::parse(frame, Checks::ALL) {
                Ok(p) => {
                    let psn = p.repr.bth.psn.value();
                    let Some(count) = t.seen.get_mut(psn as usize) else {
                        *t.rejected.entry("unknown_psn").or_default() += 1;
                        return;
                    };
                    *count += 1;
                    t.valid += 1;
                    t.valid_bytes += p.payload.len() as u64;
                    if t.max_psn.is_some_and(|m| psn < m) {
                        t.out_of_order += 1;
                    }
                    t.max_psn = Some(t.max_psn.map_or(psn, |m| m.max(psn)));
                }
                Err(e) => *t.rejected.entry(e.kind()).or_default() += 1,
            }
        });
    }

    /// Flushes the capture (reporting the first write error) and hands back the tallies.
    fn finish(self) -> Result<Tally, Failure> {
        let (_, mut sink) = self.port.finish()?;
        sink.flush()?;
        Ok(self.tally)
    }
}

fn report(args: &Args, sent: u32, link: &LinkStats, rx: &Tally, end_ns: u64, wall_s: f64) {
    let unique = rx.seen.iter().filter(|&&c| c > 0).count() as u64;
    let missing = u64::from(sent) - unique;
    let duplicates: u64 = rx
        .seen
        .iter()
        .map(|&c| u64::from(c.saturating_sub(1)))
        .sum();
    let rejected: u64 = rx.rejected.values().sum();
    let goodput_gbps = rx.valid_bytes as f64 * 8.0 / end_ns.max(1) as f64;
    let wall_fps = f64::from(sent) / wall_s.max(1e-9);
    if args.json {
        let obj = json!({
            "seed": args.seed,
            "frames_sent": sent,
            "link": {
                "offered": link.offered,
                "delivered": link.delivered,
                "lost": link.dropped_loss,
                "dropped_link_down": link.dropped_down,
                "dropped_queue_full": link.dropped_queue,
                "duplicated": link.duplicated,
                "reordered": link.reordered,
                "corrupted": link.corrupted,
            },
            "receiver": {
                "filtered_wrong_mac": rx.filtered,
                "arrived": rx.arrived,
                "valid": rx.valid,
                "rejected": rejected,
                "rejected_by_kind": rx.rejected,
                "unique_psns": unique,
                "missing_psns": missing,
                "duplicate_deliveries": duplicates,
                "out_of_order": rx.out_of_order,
            },
            "virtual_time_us": end_ns as f64 / 1000.0,
            "goodput_gbps_virtual": goodput_gbps,
            "wall_seconds": wall_s,
            "frames_per_wall_second": wall_fps,
        });
        println!("{obj}");
        return;
    }
    println!(
        "ferroce demo: {sent} RoCEv2 frames over one simulated link (seed {})",
        args.seed
    );
    println!();
    println!("what the link did               frames");
    println!("  offered                       {:>8}", link.offered);
    println!(
        "  lost ({})           {:>8}",
        if args.burst {
            "bursty     "
        } else {
            "independent"
        },
        link.dropped_loss
    );
    println!("  dropped, link down            {:>8}", link.dropped_down);
    println!("  dropped, queue full           {:>8}", link.dropped_queue);
    println!("  duplicated                    {:>8}", link.duplicated);
    println!("  reordered                     {:>8}", link.reordered);
    println!("  corrupted (one bit flipped)   {:>8}", link.corrupted);
    println!();
    println!("what the receiver saw           frames");
    println!("  dropped by the NIC, wrong MAC {:>8}", rx.filtered);
    println!("  arrived                       {:>8}", rx.arrived);
    println!("  valid RoCEv2                  {:>8}", rx.valid);
    for (kind, n) in &rx.rejected {
        println!("  rejected: {kind:<19} {n:>8}");
    }
    println!("  distinct PSNs                 {:>8}", unique);
    println!("  PSNs never received           {:>8}", missing);
    println!("  duplicate deliveries          {:>8}", duplicates);
    println!("  arrived after a later PSN     {:>8}", rx.out_of_order);
    println!();
    println!(
        "virtual time {:.1} us, goodput {:.2} Gb/s (simulated link)",
        end_ns as f64 / 1000.0,
        goodput_gbps
    );
    println!(
        "wall clock   {:.3} s, {:.2} M frames/s processed (this machine)",
        wall_s,
        wall_fps / 1e6
    );
}
