//! `ferroce perf sdr bw`: SDR Writes through the verbs API's [`SdrQp`], both ends in this
//! process on the simulated fabric (`--device sim`) or one end per process on a real port
//! (`--server` / `--connect`, as perftest). The receiver keeps `WINDOW` receives posted and
//! checks every message against the sender's pattern; the sender keeps one fewer in flight,
//! so a message never arrives before its receive.

use std::io::{Read, Write};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use ferroce_drivers::sim::{LinkModel, Loss};
use ferroce_reliability::sdr::imm::ImmLayout;
use ferroce_reliability::sdr::model::{Code, Scheme};
use ferroce_reliability::sdr::recv::RecvConfig;
use ferroce_reliability::sdr::reliable::{parity_len, ReliableConfig};
use ferroce_verbs::connect::{
    exchange_client, exchange_server, swap, ConnectOpts, Endpoint, OobListener,
};
use ferroce_verbs::sdr::{SdrConfig, SdrEndpoint, SdrQp};
use ferroce_verbs::sim::SimNet;
use ferroce_verbs::spec::open_device;
use ferroce_verbs::{Access, Context, MemoryRegion, Mtu, ProtectionDomain};
use serde_json::json;

use super::{pattern, Args};
use crate::Failure;

/// Receives kept posted.
const WINDOW: usize = 8;

/// The reliability scheme `perf sdr` runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum SdrScheme {
    /// Selective repeat, 3-RTT timeout.
    SrRto,
    /// Selective repeat with NACKs.
    SrNack,
    /// EC(32, 8) Reed-Solomon.
    EcMds,
    /// EC(32, 8) XOR.
    EcXor,
}

impl SdrScheme {
    fn scheme(self) -> Scheme {
        match self {
            Self::SrRto => Scheme::SR_RTO,
            Self::SrNack => Scheme::SrNack,
            Self::EcMds => Scheme::ec(Code::Mds),
            Self::EcXor => Scheme::ec(Code::Xor),
        }
    }
}

/// One end: its SDR QP and buffers (message slots, then parity slots).
struct End {
    qp: SdrQp,
    mr: MemoryRegion,
    _pd: ProtectionDomain,
    size: usize,
    parity: usize,
}

impl End {
    fn new(ctx: &Context, cfg: SdrConfig, size: usize) -> Result<Self, Failure> {
        let pd = ctx.alloc_pd();
        let qp = SdrQp::new(ctx, &pd, cfg).map_err(|e| Failure(e.to_string()))?;
        let parity = qp.parity_len(size as u64) as usize;
        let mr = pd
            .alloc_mr(WINDOW * (size + parity), Access::LOCAL_WRITE)
            .map_err(|e| Failure(e.to_string()))?;
        Ok(Self {
            qp,
            mr,
            _pd: pd,
            size,
            parity,
        })
    }

    fn slot(&self, n: u64) -> usize {
        (n as usize % WINDOW) * self.size
    }

    fn parity_slot(&self, n: u64) -> Option<(&MemoryRegion, usize)> {
        (self.parity > 0).then(|| {
            (
                &self.mr,
                WINDOW * self.size + (n as usize % WINDOW) * self.parity,
            )
        })
    }
}

fn config(a: &Args, mtu: Mtu, rtt_ns: u64, pace: Option<f64>) -> SdrConfig {
    let packets_per_chunk = (65536 / mtu.bytes()).max(1);
    let chunk = u64::from(packets_per_chunk * mtu.bytes());
    // A slot takes a message or its parity, whichever is longer.
    let parity = match a.sdr_scheme.scheme() {
        Scheme::Ec { k, m, .. } => parity_len(a.size as u64, chunk, k, m),
        _ => 0,
    };
    SdrConfig {
        layout: RecvConfig {
            layout: ImmLayout::PAPER,
            mtu: mtu.bytes(),
            chunk_packets: packets_per_chunk,
            max_message: (a.size as u64).max(parity),
            slots: 16,
            generations: 2,
        },
        reliability: ReliableConfig::new(a.sdr_scheme.scheme(), rtt_ns),
        pace_gbps: pace,
    }
}

/// What one end counted.
#[derive(Default)]
struct Count {
    sent: u64,
    done: u64,
    received: u64,
    bad: u64,
    /// Where the receiver reads each message to check it.
    scratch: Vec<u8>,
}

/// Sender's step: keep `WINDOW - 1` messages in flight, collect completions.
fn send_step(e: &End, a: &Args, iters: u64, c: &mut Count) -> Result<(), Failure> {
    while let Some(d) = e.qp.poll_send() {
        let _ = d;
        c.done += 1;
    }
    while c.sent < iters && c.sent - c.done < (WINDOW - 1) as u64 {
        let n = c.sent;
        let at = e.slot(n);
        e.qp.send(&e.mr, at, a.size as u64, Some(n as u32), e.parity_slot(n))
            .map_err(|e| Failure(format!("sdr send: {e}")))?;
        c.sent += 1;
    }
    Ok(())
}

/// Receiver's step: check and free what completed, keep `WINDOW` receives posted.
fn recv_step(
    e: &End,
    a: &Args,
    iters: u64,
    c: &mut Count,
    posted: &mut u64,
    pat: &[u8],
) -> Result<(), Failure> {
    while c.received < *posted && e.qp.recv_is_complete(c.received) {
        let n = c.received;
        let at = e.slot(n);
        // Every message is checked whole, into a buffer kept for it (a fresh one, zeroed,
        // cost the receiver a tenth of its time over memif).
        let got = &mut c.scratch;
        got.resize(a.size, 0);
        if !e.mr.read(at, got) || got[..] != pat[at..at + a.size] {
            c.bad += 1;
        }
        e.qp.recv_complete(n);
        c.received += 1;
    }
    while *posted < iters && *posted - c.received < WINDOW as u64 {
        let n = *posted;
        e.qp.post_recv(&e.mr, e.slot(n), a.size as u64, e.parity_slot(n))
            .map_err(|e| Failure(format!("sdr post_recv: {e}")))?;
        *posted += 1;
    }
    Ok(())
}

fn sdr_err(e: impl std::fmt::Display) -> Failure {
    Failure(format!("sdr: {e}"))
}

/// The summary: the sending end's QP and sender counters, the receiving end's receiver and
/// receive table (one process holds both on sim; each end reports its own otherwise).
fn summary(
    a: &Args,
    role: &str,
    c: &Count,
    (seconds, wall): (f64, f64),
    (sending, receiving): (&End, &End),
) -> serde_json::Value {
    let (qp, tx, _, _) = sending.qp.stats();
    let (_, _, rx, table) = receiving.qp.stats();
    let bytes = (c.done.max(c.received)) * a.size as u64;
    json!({
        "test": "sdr bw",
        "role": role,
        "scheme": a.sdr_scheme.scheme().name(),
        "size": a.size,
        "iterations": c.done.max(c.received),
        "qps": 1,
        "seconds": seconds,
        "bw_avg_gbps": bytes as f64 * 8.0 / seconds.max(1e-9) / 1e9,
        "wall_s": wall,
        "wall_gbps": bytes as f64 * 8.0 / wall.max(1e-9) / 1e9,
        "verified": c.bad == 0,
        "counters": {
            "sdr": qp.iter().map(|(k, v)| (k.to_string(), json!(v))).collect::<serde_json::Map<_, _>>(),
            "sender": tx.iter().map(|(k, v)| (k.to_string(), json!(v))).collect::<serde_json::Map<_, _>>(),
            "receiver": rx.iter().map(|(k, v)| (k.to_string(), json!(v))).collect::<serde_json::Map<_, _>>(),
            "receive_table": table.iter().map(|(k, v)| (k.to_string(), json!(v))).collect::<serde_json::Map<_, _>>(),
        },
    })
}

fn print(a: &Args, v: &serde_json::Value) {
    if a.json {
        println!("{v}");
    } else {
        println!(
            " SDR {} bw, {} B messages, {}: {} messages, {:.2} Gb/s (virtual or wall), {:.2} Gb/s wall, verified {}",
            v["scheme"].as_str().unwrap_or(""),
            a.size,
            v["role"].as_str().unwrap_or(""),
            v["iterations"],
            v["bw_avg_gbps"].as_f64().unwrap_or(0.0),
            v["wall_gbps"].as_f64().unwrap_or(0.0),
            v["verified"]
        );
    }
}

/// Both ends here on the simulated fabric.
pub(super) fn run_sim(a: &Args, mtu: Mtu) -> Result<ExitCode, Failure> {
    let mut model = LinkModel::new((a.gbps * 1e9) as u64, (a.delay_us * 1e3) as u64);
    model.loss = if a.loss > 0.0 {
        Loss::Bernoulli(a.loss)
    } else {
        Loss::None
    };
    model.queue_limit_bytes = 64 << 20;
    let (net, ca, cb) = SimNet::pair(a.seed, model, mtu.bytes() as usize + 200, None)?;
    let rtt = (2.0 * a.delay_us * 1e3) as u64 + 2_000;
    let cfg = config(a, mtu, rtt, Some(a.gbps));
    let (tx, rx) = (End::new(&ca, cfg, a.size)?, End::new(&cb, cfg, a.size)?);
    let o = ConnectOpts {
        mtu,
        ..ConnectOpts::default()
    };
    tx.qp.connect(&rx.qp.endpoint(), &o).map_err(sdr_err)?;
    rx.qp.connect(&tx.qp.endpoint(), &o).map_err(sdr_err)?;
    let pat = pattern(a.seed, 0, WINDOW * a.size);
    // The sender's message slots hold the pattern once; every message goes from one.
    tx.mr.write(0, &pat);
    let iters = a.iters.unwrap_or(200);
    let (mut ct, mut cr, mut posted) = (Count::default(), Count::default(), 0u64);
    let wall = Instant::now();
    let start = net.now();
    while ct.done < iters || cr.received < iters {
        recv_step(&rx, a, iters, &mut cr, &mut posted, &pat)?;
        send_step(&tx, a, iters, &mut ct)?;
        let worked = tx.qp.progress().map_err(sdr_err)? | rx.qp.progress().map_err(sdr_err)?;
        if !net.step() && !worked {
            let next = [tx.qp.poll_timeout(), rx.qp.poll_timeout()]
                .into_iter()
                .flatten()
                .min();
            match next {
                Some(t) => net.fabric().advance_to(t.max(net.now() + 1)),
                None if ct.sent > ct.done || cr.received < posted => {
                    net.fabric().advance_to(net.now() + 1_000)
                }
                None => break,
            }
        }
        if net.now() - start > 3_600_000_000_000 {
            return Err(Failure(
                "sdr: no progress in an hour of virtual time".into(),
            ));
        }
    }
    let seconds = (net.now() - start) as f64 / 1e9;
    let wall = wall.elapsed().as_secs_f64();
    ct.bad = cr.bad;
    let v = summary(a, "both", &ct, (seconds, wall), (&tx, &rx));
    print(a, &v);
    Ok(if cr.bad == 0 && ct.done == iters {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// One end per process on a real port: the server receives, the client sends.
pub(super) fn run_net(a: &Args, mtu: Mtu) -> Result<ExitCode, Failure> {
    let ctx = open_device(&a.device)?;
    let active = ctx.query_port().active_mtu;
    let mtu = if mtu.bytes() > active.bytes() {
        active
    } else {
        mtu
    };
    let cfg = config(a, mtu, 200_000, None);
    let me = End::new(&ctx, cfg, a.size)?;
    ctx.start_engine_thread()?;
    // The control QP's endpoint first (its rkey the region, its length the generations),
    // then one per generation QP.
    let mine = me.qp.endpoint();
    let first = Endpoint {
        qpn: mine.control,
        psn: 0,
        gid: mine.gid,
        mac: mine.mac,
        addr: 0,
        len: mine.generations.len() as u64,
        rkey: mine.region,
        offers: ferroce_verbs::connect::Capabilities::NONE,
        alt: None,
        rd_atomic: 16,
    };
    let (peer0, mut stream) = if a.server {
        let mut listener = OobListener::bind(&ctx, a.port)?;
        exchange_server(&mut listener, &first)?
    } else {
        let host = a.connect.as_deref().unwrap_or_default();
        exchange_client(
            &ctx,
            &format!("{host}:{}", a.port),
            &first,
            Duration::from_secs_f64(a.wait),
        )?
    };
    stream.set_read_timeout(Some(Duration::from_secs(60)))?;
    let mut generations = Vec::new();
    for &g in &mine.generations {
        let e = swap(&mut stream, &Endpoint { qpn: g, ..first })?;
        generations.push(e.qpn);
    }
    if peer0.len != generations.len() as u64 {
        return Err(Failure(
            "the peer's SDR QP has another number of generations".into(),
        ));
    }
    let peer = SdrEndpoint {
        gid: peer0.gid,
        mac: peer0.mac,
        generations,
        control: peer0.qpn,
        region: peer0.rkey,
    };
    let o = ConnectOpts {
        mtu,
        ..ConnectOpts::default()
    };
    me.qp.connect(&peer, &o).map_err(sdr_err)?;
    let iters = a.iters.unwrap_or(200);
    let pat = pattern(a.seed, 0, WINDOW * a.size);
    if !a.server {
        me.mr.write(0, &pat);
    }
    let mut c = Count::default();
    let mut posted = 0u64;
    if a.server {
        // Receives first, then the go.
        recv_step(&me, a, iters, &mut c, &mut posted, &pat)?;
    }
    stream.write_all(b"G")?;
    let mut go = [0u8; 1];
    stream.read_exact(&mut go)?;
    ctx.stop_engine_thread();
    let wall = Instant::now();
    let deadline = Duration::from_secs(120);
    if a.server {
        while c.received < iters {
            recv_step(&me, a, iters, &mut c, &mut posted, &pat)?;
            ctx.progress();
            me.qp.progress().map_err(sdr_err)?;
            if wall.elapsed() > deadline {
                return Err(Failure(format!(
                    "sdr: {} of {iters} messages after 120 s",
                    c.received
                )));
            }
        }
    } else {
        while c.done < iters {
            send_step(&me, a, iters, &mut c)?;
            ctx.progress();
            me.qp.progress().map_err(sdr_err)?;
            if wall.elapsed() > deadline {
                return Err(Failure(format!(
                    "sdr: {} of {iters} messages done after 120 s",
                    c.done
                )));
            }
        }
    }
    let seconds = wall.elapsed().as_secs_f64();
    // The server keeps acknowledging until the client says it has everything.
    ctx.start_engine_thread()?;
    if a.server {
        stream.set_read_timeout(Some(Duration::from_millis(1)))?;
        let mut done = [0u8; 1];
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            me.qp.progress().map_err(sdr_err)?;
            match stream.read(&mut done) {
                Ok(1) if done[0] == b'D' => {
                    // Stay until the client knows its 'D' arrived.
                    stream.await_end(Duration::from_secs(5));
                    break;
                }
                Ok(0) => break,
                _ if Instant::now() > until => break,
                _ => {}
            }
        }
    } else {
        stream.write_all(b"D")?;
        stream.finish()?;
    }
    ctx.stop_engine_thread();
    let role = if a.server { "server" } else { "client" };
    let v = summary(a, role, &c, (seconds, seconds), (&me, &me));
    print(a, &v);
    Ok(if c.bad == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
