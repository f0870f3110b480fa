//! `ferroce perf {write|read|send} {bw|lat}`: perftest's tests on ferroce's verbs API.
//!
//! On the simulated fabric (the default) both ends run in this process on two simulated
//! hosts; the figures are reported twice, clearly apart: in virtual time (what the protocol
//! achieves on the simulated link) and in wall-clock time (how many messages and bytes the
//! stack processed per second of this CPU). Every run ends by comparing the receiver's buffer
//! with the sender's; a mismatch exits non-zero.

use std::fs::File;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use ferroce_drivers::sim::{LinkModel, Loss};
use ferroce_verbs::connect::{
    capability, connect_qp, negotiate, Capabilities, ConnectOpts, Endpoint, Negotiated,
};
use ferroce_verbs::sim::SimNet;
use ferroce_verbs::{
    Access, CompletionQueue, Context, MemoryRegion, Mtu, Payload, ProtectionDomain, QpCaps, QpType,
    QueuePair, RecvWr, SendFlags, SendWr, WcStatus, WorkCompletion, WrOpcode,
};
use serde_json::{json, Map, Value};

use crate::Failure;

mod histogram;
mod net;
mod sdr;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Verb {
    Write,
    Read,
    Send,
    /// SDR Writes (seed 004) through the verbs API's SDR QP: `perf sdr bw`.
    Sdr,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Kind {
    Bw,
    Lat,
}

/// The recovery scheme an end offers at connection setup.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Reliability {
    /// Go-Back-N only (IBTA; what a ConnectX peer speaks).
    Gbn,
    /// Offer ferroce's selective repeat; used when the peer offers it too.
    Sr,
}

/// Congestion control per QP.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Cc {
    /// None of its own: the restart window after a Go-Back-N rewind only.
    None,
    /// DCQCN's reaction point with ConnectX's defaults at the link rate (`--gbps`).
    Dcqcn,
    /// DCQCN with ferroce's parameters, its window one BDP at `--gbps` and `--base-rtt-us`.
    #[value(name = "dcqcn-ferroce")]
    DcqcnFerroce,
    /// TIMELY (delay-based, from the transport's RTT samples), ferroce's parameters.
    Timely,
}

#[derive(clap::Args, Clone, Debug)]
pub(crate) struct Args {
    /// The operation.
    verb: Verb,
    /// Bandwidth or latency.
    kind: Kind,
    /// Device: `sim` (both ends in this process on a simulated fabric), `afpacket:IFACE`,
    /// `tap:NAME[@IP]` or `dpdk:EAL ARGS @IP [port=N] [desc=N] [zerocopy]` (one end per
    /// process: `--server` on one, `--connect HOST` on the other).
    #[arg(long, default_value = "sim")]
    device: String,
    /// Wait for a client (perftest's server side).
    #[arg(long)]
    server: bool,
    /// Connect to the server at HOST (perftest's client side).
    #[arg(long, value_name = "HOST", conflicts_with = "server")]
    connect: Option<String>,
    /// TCP port of the connection exchange.
    #[arg(long, default_value_t = 18515)]
    port: u16,
    /// Client: seconds to keep trying to reach the server.
    #[arg(long, default_value_t = 10.0)]
    wait: f64,
    /// Message size in bytes.
    #[arg(long, default_value_t = 65536)]
    size: usize,
    /// Iterations (messages per QP for bw, round trips for lat).
    #[arg(long)]
    iters: Option<u64>,
    /// Run for this many seconds instead (virtual seconds on sim).
    #[arg(long, conflicts_with = "iters")]
    duration: Option<f64>,
    /// Queue pairs.
    #[arg(long, default_value_t = 1)]
    qps: u32,
    /// Outstanding WRs per QP (bw).
    #[arg(long, default_value_t = 128)]
    tx_depth: u32,
    /// Send messages up to this size inline.
    #[arg(long, default_value_t = 0)]
    inline: usize,
    /// Path MTU in bytes (256, 512, 1024, 2048 or 4096).
    #[arg(long, default_value_t = 4096)]
    mtu: u32,
    /// Sim: link bandwidth in Gbit/s.
    #[arg(long, default_value_t = 100.0)]
    gbps: f64,
    /// Sim: loss probability per frame.
    #[arg(long, default_value_t = 0.0)]
    loss: f64,
    /// Sim: one-way delay in microseconds.
    #[arg(long, default_value_t = 1.0)]
    delay_us: f64,
    /// Sim: reordering probability per frame.
    #[arg(long, default_value_t = 0.0)]
    reorder: f64,
    /// Sim: link flaps, up ON ms then down OFF ms, repeating.
    #[arg(long, value_name = "ON,OFF", value_parser = parse_pair)]
    flap_ms: Option<(f64, f64)>,
    /// Sim: ports per host (1 or 2), each on a link of its own to the other host.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=2))]
    ports: u8,
    /// Sim: each QP gets the other port as its alternate path (native failover ready,
    /// nothing failing; implies --ports 2): what being ready costs, against `--ports 2`
    /// without it.
    #[arg(long)]
    backup: bool,
    /// Recovery scheme to offer; the connection runs selective repeat only when both ends
    /// offer it, Go-Back-N otherwise.
    #[arg(long, value_enum, default_value = "gbn")]
    reliability: Reliability,
    /// Congestion control per QP (`dcqcn` reacts to CNPs; ferroce answers CE-marked packets
    /// with CNPs either way).
    #[arg(long, value_enum, default_value = "none")]
    cc: Cc,
    /// The path's base round trip, µs: `--cc dcqcn-ferroce`'s window is `--gbps` × this
    /// (5 µs if not given), and `--cc timely` moves its thresholds to it (ferroce's 100 G
    /// fabric set, 4 µs, if not given).
    #[arg(long)]
    base_rtt_us: Option<f64>,
    /// `perf sdr`: the reliability scheme on the bitmap.
    #[arg(long = "scheme", value_enum, default_value = "sr-nack")]
    sdr_scheme: sdr::SdrScheme,
    /// With selective repeat: UDP source ports (paths) to spray over by PSN; 1 keeps ECMP.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=64))]
    paths: u16,
    /// Seed of every random choice on sim.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Record this process's port (on sim: the client's) to this pcap file.
    #[arg(long)]
    pcap: Option<PathBuf>,
    /// One JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

fn parse_pair(s: &str) -> Result<(f64, f64), String> {
    let (a, b) = s
        .split_once(',')
        .ok_or_else(|| format!("'{s}' is not ON,OFF in milliseconds, e.g. 10,1"))?;
    let num = |v: &str| {
        v.trim()
            .parse::<f64>()
            .ok()
            .filter(|x| x.is_finite() && *x >= 0.0)
            .ok_or_else(|| format!("'{v}' is not a number of milliseconds"))
    };
    let (a, b) = (num(a)?, num(b)?);
    if a <= 0.0 {
        return Err("the up time of a flap must be above zero".into());
    }
    Ok((a, b))
}

fn check(a: &Args) -> Result<Mtu, Failure> {
    let mtu = Mtu::from_bytes(a.mtu).ok_or_else(|| {
        Failure(format!(
            "--mtu {} is not a path MTU; use 256, 512, 1024, 2048 or 4096",
            a.mtu
        ))
    })?;
    if a.base_rtt_us.is_some_and(|us| !(0.0..=1e6).contains(&us)) {
        return Err(Failure(
            "--base-rtt-us must be within 0..1000000 (0: no window)".into(),
        ));
    }
    let two_sided = a.server || a.connect.is_some();
    if a.device == "sim" {
        if two_sided {
            return Err(Failure(
                "--server and --connect need a real device (--device afpacket:IFACE); sim runs both ends here".into(),
            ));
        }
    } else if !["afpacket:", "tap:", "dpdk:"]
        .iter()
        .any(|p| a.device.starts_with(p))
    {
        return Err(Failure(format!(
            "device '{}' is unknown; use sim, afpacket:IFACE, tap:NAME[@IP] or dpdk:EAL ARGS @IP",
            a.device
        )));
    } else if !two_sided {
        return Err(Failure(format!(
            "{} runs one end per process: add --server on one side and --connect HOST on the other",
            a.device
        )));
    }
    if a.size == 0 || a.size > 1 << 30 {
        return Err(Failure("--size must be between 1 byte and 1 GiB".into()));
    }
    if !(0.0..=1.0).contains(&a.loss) || !(0.0..=1.0).contains(&a.reorder) {
        return Err(Failure(
            "--loss and --reorder are probabilities in 0..1".into(),
        ));
    }
    if a.qps == 0 || a.qps > 1024 || a.tx_depth == 0 || a.tx_depth > 8192 {
        return Err(Failure(
            "--qps must be 1..1024 and --tx-depth 1..8192".into(),
        ));
    }
    if a.kind == Kind::Lat && a.qps > 1 {
        // A ping-pong measures one QP's round trip; perftest's latency tests take no -q.
        return Err(Failure(
            "latency tests run one QP; drop --qps (or use a bw test for several QPs)".into(),
        ));
    }
    if a.gbps <= 0.0 || a.delay_us < 0.0 {
        return Err(Failure(
            "--gbps must be above zero and --delay-us not negative".into(),
        ));
    }
    if a.inline > 256 {
        return Err(Failure("--inline is at most 256 bytes".into()));
    }
    Ok(mtu)
}

/// One side's resources for one QP.
struct Conn {
    qp: QueuePair,
    mr: MemoryRegion,
    /// Remote buffer.
    peer: Endpoint,
}

/// One side: a context, a PD, a CQ for everything.
struct Side {
    ctx: Context,
    cq: CompletionQueue,
    conns: Vec<Conn>,
    _pd: ProtectionDomain,
    /// The recovery scheme the connections agreed on.
    agreed: Negotiated,
}

impl Side {
    /// Which of this side's QPs a completion belongs to.
    fn index_of(&self, wc: &WorkCompletion) -> usize {
        self.conns
            .iter()
            .position(|c| c.qp.qpn() == wc.qp_num)
            .unwrap_or(0)
    }
}

/// Slots per QP buffer: messages cycle through them, as perftest cycles its buffers.
const SLOTS: usize = 4;

fn side(ctx: &Context, qps: u32, buf_len: usize, depth: u32) -> Result<Side, Failure> {
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq((qps * (depth * 2 + 16)) as usize, None);
    let all = Access::LOCAL_WRITE
        .with(Access::REMOTE_WRITE)
        .with(Access::REMOTE_READ)
        .with(Access::REMOTE_ATOMIC);
    let caps = QpCaps {
        max_send_wr: depth + 1,
        max_recv_wr: depth + 1,
        ..QpCaps::default()
    };
    let mut conns = Vec::new();
    for _ in 0..qps {
        let mr = pd.alloc_mr(buf_len, all)?;
        let qp = pd.create_qp(QpType::Rc, caps, &cq, &cq)?;
        conns.push(Conn {
            qp,
            mr,
            peer: Endpoint {
                qpn: 0,
                psn: 0,
                gid: ctx.query_gid(0)?,
                mac: ctx.mac(),
                addr: 0,
                len: 0,
                rkey: 0,
                offers: Capabilities::NONE,
                alt: None,
                rd_atomic: 16,
            },
        });
    }
    Ok(Side {
        ctx: ctx.clone(),
        cq,
        conns,
        _pd: pd,
        agreed: Negotiated::GoBackN,
    })
}

fn endpoint(s: &Side, i: usize, psn: u32, a: &Args) -> Result<Endpoint, Failure> {
    let c = &s.conns[i];
    Ok(Endpoint {
        offers: match a.reliability {
            Reliability::Gbn => Capabilities::NONE,
            Reliability::Sr => Capabilities::NONE.with(capability::SELECTIVE_REPEAT, 0),
        },
        ..Endpoint::of(&s.ctx, &c.qp, &c.mr, psn)
    })
}

/// Puts a QP (in RESET) on the schemes its connection agreed on.
fn use_scheme(qp: &QueuePair, agreed: Negotiated, a: &Args) -> Result<(), Failure> {
    use ferroce_reliability::schemes::{CcScheme, Params, PathScheme, RecoveryScheme, Schemes};
    let wanted = Schemes {
        recovery: Some(RecoveryScheme::SelectiveRepeat),
        path: Some(if a.paths > 1 {
            PathScheme::Psn(a.paths)
        } else {
            PathScheme::Ecmp
        }),
        cc: match a.cc {
            Cc::None => None,
            Cc::Dcqcn => Some(CcScheme::DcqcnMlx5),
            Cc::DcqcnFerroce => Some(CcScheme::Dcqcn),
            Cc::Timely => Some(CcScheme::Timely),
        },
    };
    let schemes = agreed.schemes(&wanted);
    if schemes == Schemes::IBTA {
        return Ok(());
    }
    let rtt_ns = match a.cc {
        Cc::DcqcnFerroce => Some((a.base_rtt_us.unwrap_or(5.0) * 1e3) as u64),
        Cc::Timely => a.base_rtt_us.map(|us| (us * 1e3) as u64),
        Cc::None | Cc::Dcqcn => None,
    };
    let params = Params {
        line_bps: (a.gbps * 1e9) as u64,
        rtt_ns,
        ..Params::default()
    };
    qp.set_reliability(schemes.policies(&params))?;
    Ok(())
}

/// Deterministic message bytes for QP `q`.
fn pattern(seed: u64, q: usize, len: usize) -> Vec<u8> {
    let mut x = seed ^ (q as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x5eed;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Results of a run, in the units perftest prints.
#[derive(Default)]
struct Outcome {
    iterations: u64,
    bytes: u64,
    /// Virtual (sim) or real seconds the test took.
    seconds: f64,
    peak_gbps: f64,
    lat_ns: Vec<u64>,
    wall_s: f64,
    verified: bool,
    failed: Option<String>,
    /// bw over real ports: messages each QP had completed when the run's time was up (the
    /// share of the link each got; how fairly congestion control divides it).
    per_qp_messages: Vec<u64>,
}

pub(crate) fn run(a: &Args) -> Result<ExitCode, Failure> {
    let mtu = check(a)?;
    if a.verb == Verb::Sdr {
        if a.kind != Kind::Bw {
            return Err(Failure("perf sdr runs bw only".into()));
        }
        return if a.device == "sim" {
            sdr::run_sim(a, mtu)
        } else {
            sdr::run_net(a, mtu)
        };
    }
    if a.device != "sim" {
        return net::run(a, mtu);
    }
    let mut model = LinkModel::new((a.gbps * 1e9) as u64, (a.delay_us * 1e3) as u64);
    model.loss = if a.loss > 0.0 {
        Loss::Bernoulli(a.loss)
    } else {
        Loss::None
    };
    model.reorder = a.reorder;
    model.queue_limit_bytes = 64 << 20;
    if let Some((on, off)) = a.flap_ms {
        // Enough flaps to cover any run of a few virtual seconds.
        let (on, off) = ((on * 1e6) as u64, (off * 1e6) as u64);
        let mut t = on;
        for _ in 0..10_000 {
            model = model.flap(t, off);
            t += on + off;
        }
    }
    let eth_mtu = mtu.bytes() as usize + 200;
    let pcap: Option<Box<dyn Write + Send>> = match &a.pcap {
        Some(p) => {
            Some(Box::new(File::create(p).map_err(|e| {
                Failure(format!("cannot create {}: {e}", p.display()))
            })?))
        }
        None => None,
    };
    let (net, ca, cb) = if a.backup || a.ports == 2 {
        if pcap.is_some() {
            return Err(Failure(
                "--ports 2 / --backup with --pcap: capture a one-port run instead".into(),
            ));
        }
        let (net, _links, ca, cb) = SimNet::rails(a.seed, model, eth_mtu.max(1500))?;
        (net, ca, cb)
    } else {
        SimNet::pair(a.seed, model, eth_mtu.max(1500), pcap)?
    };
    let buf_len = a.size * SLOTS;
    let depth = if a.kind == Kind::Lat { 2 } else { a.tx_depth };
    let mut client = side(&ca, a.qps, buf_len, depth)?;
    let mut server = side(&cb, a.qps, buf_len, depth)?;
    let o = ConnectOpts {
        mtu,
        ..ConnectOpts::default()
    };
    for i in 0..a.qps as usize {
        let (ec, es) = (
            endpoint(&client, i, 0x10 + i as u32, a)?,
            endpoint(&server, i, 0x80 + i as u32, a)?,
        );
        let (mut ec, mut es) = (ec, es);
        if !a.backup {
            // A second port, but no alternate path on it.
            (ec.alt, es.alt) = (None, None);
        }
        let agreed = negotiate(&ec, &es).recovery;
        use_scheme(&client.conns[i].qp, agreed, a)?;
        use_scheme(&server.conns[i].qp, agreed, a)?;
        client.agreed = agreed;
        server.agreed = agreed;
        connect_qp(&ca, &client.conns[i].qp, ec.psn, &es, &o)?;
        connect_qp(&cb, &server.conns[i].qp, es.psn, &ec, &o)?;
        client.conns[i].peer = es;
        server.conns[i].peer = ec;
        // The data source holds the pattern: the client for WRITE and SEND, the server for READ.
        let src = if a.verb == Verb::Read {
            &server
        } else {
            &client
        };
        src.conns[i].mr.write(0, &pattern(a.seed, i, buf_len));
    }
    let iters = a
        .iters
        .unwrap_or(if a.kind == Kind::Lat { 1000 } else { 5000 });
    let limit_ns = a.duration.map(|s| (s * 1e9) as u64);
    let wall = Instant::now();
    let mut out = match a.kind {
        Kind::Bw => bw(a, &net, &client, &server, iters, limit_ns),
        Kind::Lat => lat(a, &net, &client, &server, iters, limit_ns),
    };
    out.wall_s = wall.elapsed().as_secs_f64();
    // Verification: the receiver's buffer equals the sender's.
    let (src, dst) = if a.verb == Verb::Read {
        (&server, &client)
    } else {
        (&client, &server)
    };
    out.verified = out.failed.is_none()
        && (0..a.qps as usize).all(|i| {
            let (mut x, mut y) = (vec![0u8; buf_len], vec![0u8; buf_len]);
            let used = if out.iterations >= SLOTS as u64 {
                buf_len
            } else {
                a.size * out.iterations as usize
            };
            src.conns[i].mr.read(0, &mut x)
                && dst.conns[i].mr.read(0, &mut y)
                && x[..used] == y[..used]
        });
    for s in [&client, &server] {
        let _ = s.ctx.export_stats();
    }
    let link = net.fabric().link_stats(net.link());
    report(a, &out, Some(link), Some(&client), Some(&server));
    server.conns.clear();
    client.conns.clear();
    Ok(if out.verified {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn op_of(v: Verb) -> WrOpcode {
    match v {
        Verb::Write => WrOpcode::Write,
        Verb::Read => WrOpcode::Read,
        Verb::Send => WrOpcode::Send,
        Verb::Sdr => WrOpcode::WriteWithImm,
    }
}

/// Posts one message of QP `i` into slot `n % SLOTS`.
fn post(a: &Args, s: &Side, i: usize, n: u64, signaled: bool) -> Result<(), String> {
    let c = &s.conns[i];
    let slot = (n as usize % SLOTS) * a.size;
    let sge = [c.mr.sge(slot, a.size)];
    let mut flags = if signaled {
        SendFlags::SIGNALED
    } else {
        SendFlags(0)
    };
    let inline_bytes;
    let payload = if a.verb != Verb::Read && a.size <= a.inline {
        flags = flags.with(SendFlags::INLINE);
        let mut b = vec![0u8; a.size];
        c.mr.read(slot, &mut b);
        inline_bytes = b;
        Payload::Inline(&inline_bytes)
    } else {
        Payload::Sges(&sge)
    };
    let wr = SendWr::new(n, op_of(a.verb), payload)
        .remote(c.peer.addr + slot as u64, c.peer.rkey)
        .flags(flags);
    c.qp.post_send(&[wr]).map_err(|e| e.to_string())
}

fn post_recv(a: &Args, s: &Side, i: usize, n: u64) -> Result<(), String> {
    let c = &s.conns[i];
    let slot = (n as usize % SLOTS) * a.size;
    c.qp.post_recv(&[RecvWr {
        wr_id: n,
        sg_list: &[c.mr.sge(slot, a.size)],
    }])
    .map_err(|e| e.to_string())
}

fn bad(wc: &WorkCompletion) -> Option<String> {
    (wc.status != WcStatus::Success).then(|| {
        format!(
            "QP {:#x}: work request {} completed with {}",
            wc.qp_num.value(),
            wc.wr_id,
            wc.status
        )
    })
}

fn bw(
    a: &Args,
    net: &SimNet,
    client: &Side,
    server: &Side,
    iters: u64,
    limit: Option<u64>,
) -> Outcome {
    let qps = a.qps as usize;
    let depth = u64::from(a.tx_depth);
    // Signal every cq_mod-th WR, as perftest's --cq-mod (default: a quarter of the depth).
    let cq_mod = (depth / 4).max(1);
    let mut posted = vec![0u64; qps];
    let mut done = vec![0u64; qps];
    let mut recv_posted = vec![0u64; qps];
    let mut received = vec![0u64; qps];
    let target = if limit.is_some() { u64::MAX } else { iters };
    let mut out = Outcome::default();
    if a.verb == Verb::Send {
        for (i, n) in recv_posted.iter_mut().enumerate() {
            for _ in 0..depth.min(target) {
                if let Err(e) = post_recv(a, server, i, *n) {
                    out.failed = Some(e);
                    return out;
                }
                *n += 1;
            }
        }
    }
    let start = client.ctx.now();
    let mut samples: Vec<(u64, u64)> = vec![(start, 0)];
    let mut wcs = Vec::with_capacity(256);
    let mut stop_at = None;
    let mut idle_rounds = 0;
    loop {
        let now = client.ctx.now();
        if stop_at.is_none() && limit.is_some_and(|l| now - start >= l) {
            stop_at = Some(posted.clone());
        }
        for i in 0..qps {
            let cap = stop_at.as_ref().map_or(target, |s| s[i]);
            while posted[i] < cap && posted[i] - done[i] < depth {
                let n = posted[i];
                let signaled = (n + 1).is_multiple_of(cq_mod) || n + 1 == cap;
                if let Err(e) = post(a, client, i, n, signaled) {
                    out.failed = Some(e);
                    return out;
                }
                posted[i] += 1;
            }
        }
        wcs.clear();
        client.cq.poll(&mut wcs, 256);
        for wc in &wcs {
            if let Some(e) = bad(wc) {
                out.failed = Some(e);
                return out;
            }
            let i = client.index_of(wc);
            done[i] = done[i].max(wc.wr_id + 1);
        }
        if a.verb == Verb::Send {
            wcs.clear();
            server.cq.poll(&mut wcs, 256);
            for wc in &wcs {
                if let Some(e) = bad(wc) {
                    out.failed = Some(e);
                    return out;
                }
                let i = server.index_of(wc);
                received[i] += 1;
                if recv_posted[i] < target {
                    if let Err(e) = post_recv(a, server, i, recv_posted[i]) {
                        out.failed = Some(e);
                        return out;
                    }
                    recv_posted[i] += 1;
                }
            }
        }
        let total: u64 = done.iter().sum();
        let finished = match &stop_at {
            Some(s) => (0..qps).all(|i| done[i] >= s[i]),
            None => limit.is_none() && done.iter().all(|&d| d >= iters),
        };
        let now = client.ctx.now();
        if !wcs.is_empty() || samples.last().is_some_and(|s| s.1 != total) {
            samples.push((now, total));
        }
        if finished {
            out.iterations = total;
            out.bytes = total * a.size as u64;
            out.seconds = (now - start) as f64 / 1e9;
            break;
        }
        // Polling a CQ also turns the engines (run-to-completion), so a completion may have
        // arrived after this round's poll: only two idle rounds in a row mean the end.
        if wcs.is_empty() && !net.step() {
            idle_rounds += 1;
        } else {
            idle_rounds = 0;
        }
        if idle_rounds > 2 {
            out.failed = Some(format!(
                "the simulated fabric went idle before the test finished (posted {posted:?}, completed {done:?}, received {received:?}, QP state {:?}, CQ overruns {}/{}, {:?})",
                client.conns[0].qp.state(), client.cq.overruns(), server.cq.overruns(), client.conns[0].qp.query().map(|q| q.sq_psn)
            ));
            return out;
        }
    }
    let avg = if out.seconds > 0.0 {
        out.bytes as f64 * 8.0 / out.seconds / 1e9
    } else {
        0.0
    };
    out.peak_gbps = peak(&samples, a.size).max(avg);
    out
}

/// perftest's peak: the best rate over any window of at least a tenth of the run (and 1 µs),
/// so one burst of completions cannot pose as a rate.
fn peak(samples: &[(u64, u64)], size: usize) -> f64 {
    let (Some(first), Some(last)) = (samples.first(), samples.last()) else {
        return 0.0;
    };
    let window = ((last.0 - first.0) / 10).max(1_000);
    let mut best = 0.0f64;
    let mut j = 0;
    for i in 0..samples.len() {
        while j < samples.len() && samples[j].0 - samples[i].0 < window {
            j += 1;
        }
        if j == samples.len() {
            break;
        }
        let (dt, dn) = (samples[j].0 - samples[i].0, samples[j].1 - samples[i].1);
        best = best.max(dn as f64 * size as f64 * 8.0 / dt as f64);
    }
    if best == 0.0 && last.0 > first.0 {
        best = (last.1 - first.1) as f64 * size as f64 * 8.0 / (last.0 - first.0) as f64;
    }
    best
}

fn lat(
    a: &Args,
    net: &SimNet,
    client: &Side,
    server: &Side,
    iters: u64,
    limit: Option<u64>,
) -> Outcome {
    let mut out = Outcome::default();
    let start = client.ctx.now();
    let mut wcs = Vec::new();
    let last = a.size - 1;
    let marker = |n: u64| (n % 127) as u8 + 1;
    // Receives for SEND ping-pong: one outstanding each way.
    if a.verb == Verb::Send {
        for (s, n) in [(server, 0), (client, 0)] {
            if let Err(e) = post_recv(a, s, 0, n) {
                out.failed = Some(e);
                return out;
            }
        }
    }
    for n in 0..iters {
        if limit.is_some_and(|l| client.ctx.now() - start >= l) {
            break;
        }
        let t0 = client.ctx.now();
        match a.verb {
            Verb::Read => {
                if let Err(e) = post(a, client, 0, n, true) {
                    out.failed = Some(e);
                    return out;
                }
                let ok = net.run_until(|| {
                    wcs.clear();
                    client.cq.poll(&mut wcs, 4) > 0
                });
                if let Some(e) = (!ok)
                    .then(|| "READ never completed".to_string())
                    .or_else(|| bad(&wcs[0]))
                {
                    out.failed = Some(e);
                    return out;
                }
                out.lat_ns.push(client.ctx.now() - t0);
            }
            Verb::Write | Verb::Sdr => {
                // Ping: the client's last byte carries the iteration's marker; the server
                // waits for it in memory (as ib_write_lat spins on the last byte) and pongs.
                let m = marker(n);
                let slot = (n as usize % SLOTS) * a.size;
                // The pong carries a different marker, so neither side mistakes its own
                // outgoing byte for the answer.
                for (from, to, mark) in [(client, server, m), (server, client, m | 0x80)] {
                    if !from.conns[0].mr.write(slot + last, &[mark]) {
                        out.failed = Some("cannot write the marker byte".into());
                        return out;
                    }
                    if let Err(e) = post(a, from, 0, n, true) {
                        out.failed = Some(e);
                        return out;
                    }
                    let ok = net.run_until(|| {
                        let mut b = [0u8];
                        to.conns[0].mr.read(slot + last, &mut b) && b[0] == mark
                    });
                    if !ok {
                        out.failed = Some("a WRITE never arrived".into());
                        return out;
                    }
                }
                for s in [client, server] {
                    wcs.clear();
                    s.cq.poll(&mut wcs, 16);
                    if let Some(e) = wcs.iter().find_map(bad) {
                        out.failed = Some(e);
                        return out;
                    }
                }
                out.lat_ns.push((client.ctx.now() - t0) / 2);
            }
            Verb::Send => {
                for (from, to) in [(client, server), (server, client)] {
                    if let Err(e) = post(a, from, 0, n, true) {
                        out.failed = Some(e);
                        return out;
                    }
                    let mut got_recv = false;
                    let ok = net.run_until(|| {
                        wcs.clear();
                        to.cq.poll(&mut wcs, 4);
                        got_recv |= wcs.iter().any(|w| w.opcode.is_recv());
                        got_recv
                    });
                    if !ok {
                        out.failed = Some("a SEND never arrived".into());
                        return out;
                    }
                    if let Err(e) = post_recv(a, to, 0, n + 1) {
                        out.failed = Some(e);
                        return out;
                    }
                }
                wcs.clear();
                for s in [client, server] {
                    s.cq.poll(&mut wcs, 16);
                }
                if let Some(e) = wcs.iter().find_map(bad) {
                    out.failed = Some(e);
                    return out;
                }
                out.lat_ns.push((client.ctx.now() - t0) / 2);
            }
        }
    }
    out.iterations = out.lat_ns.len() as u64;
    out.bytes = out.iterations * a.size as u64;
    out.seconds = (client.ctx.now() - start) as f64 / 1e9;
    out
}

fn pct(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i] as f64 / 1e3
}

fn counters(s: &Side) -> Map<String, Value> {
    let mut m = Map::new();
    for (k, v) in s.ctx.port_counters().iter() {
        m.insert(format!("port_{k}"), json!(v));
    }
    for (k, v) in s.ctx.qp_counters_total().iter() {
        m.insert(k.to_string(), json!(v));
    }
    let per_qp: Map<String, Value> = s
        .ctx
        .qp_counters_all()
        .into_iter()
        .map(|(qpn, c)| {
            let obj: Map<String, Value> =
                c.iter().map(|(k, v)| (k.to_string(), json!(v))).collect();
            (format!("{qpn:#x}"), Value::Object(obj))
        })
        .collect();
    m.insert("per_qp".into(), Value::Object(per_qp));
    m
}

fn report(
    a: &Args,
    o: &Outcome,
    link: Option<[ferroce_drivers::sim::LinkStats; 2]>,
    client: Option<&Side>,
    server: Option<&Side>,
) {
    let simulated = link.is_some();
    let link = link.unwrap_or_default();
    let name = match (a.verb, a.kind) {
        (Verb::Write, Kind::Bw) => "RDMA_Write BW Test",
        (Verb::Read, Kind::Bw) => "RDMA_Read BW Test",
        (Verb::Send, Kind::Bw) => "Send BW Test",
        (Verb::Write, Kind::Lat) => "RDMA_Write Latency Test",
        (Verb::Read, Kind::Lat) => "RDMA_Read Latency Test",
        (Verb::Send, Kind::Lat) => "Send Latency Test",
        (Verb::Sdr, _) => "SDR BW Test",
    };
    let avg_gbps = if o.seconds > 0.0 {
        o.bytes as f64 * 8.0 / o.seconds / 1e9
    } else {
        0.0
    };
    let mpps = if o.seconds > 0.0 {
        o.iterations as f64 / o.seconds / 1e6
    } else {
        0.0
    };
    let wall_mpps = o.iterations as f64 / o.wall_s.max(1e-9) / 1e6;
    let wall_gbps = o.bytes as f64 * 8.0 / o.wall_s.max(1e-9) / 1e9;
    let mut sorted = o.lat_ns.clone();
    sorted.sort_unstable();
    let lat_avg = if sorted.is_empty() {
        0.0
    } else {
        sorted.iter().sum::<u64>() as f64 / sorted.len() as f64 / 1e3
    };
    if a.json {
        let mut obj = json!({
            "test": name,
            "device": a.device,
            "ports": if a.backup { 2 } else { a.ports },
            "backup": a.backup,
            "verified": o.verified,
            "bytes": o.bytes,
            "iterations": o.iterations,
            "size": a.size,
            "qps": a.qps,
            "mtu": a.mtu,
            "virtual_seconds": o.seconds,
            "bw_peak_gbps": o.peak_gbps,
            "bw_avg_gbps": avg_gbps,
            "msg_rate_mpps": mpps,
            "wall_seconds": o.wall_s,
            "wall_msg_rate_mpps": wall_mpps,
            "wall_gbps": wall_gbps,
            "link": {
                "offered": link[0].offered + link[1].offered,
                "lost": link[0].dropped_loss + link[1].dropped_loss,
                "dropped_down": link[0].dropped_down + link[1].dropped_down,
                "dropped_queue": link[0].dropped_queue + link[1].dropped_queue,
            },
            "counters": {
                "client": client.map(counters).unwrap_or_default(),
                "server": server.map(counters).unwrap_or_default(),
            },
            "simulated": simulated,
            "reliability": client.or(server).map_or("gbn", |s| s.agreed.name()),
            "cc": match a.cc {
                Cc::None => "none",
                Cc::Dcqcn => "dcqcn",
                Cc::DcqcnFerroce => "dcqcn-ferroce",
                Cc::Timely => "timely",
            },
        });
        if !o.per_qp_messages.is_empty() {
            obj["per_qp_messages"] = json!(o.per_qp_messages);
            obj["jain"] = json!(crate::scenario::jain(&o.per_qp_messages));
        }
        if a.kind == Kind::Lat {
            let m = obj.as_object_mut().expect("object");
            m.insert("lat_min_us".into(), json!(pct(&sorted, 0.0)));
            m.insert("lat_p50_us".into(), json!(pct(&sorted, 0.5)));
            m.insert("lat_avg_us".into(), json!(lat_avg));
            m.insert("lat_p99_us".into(), json!(pct(&sorted, 0.99)));
            m.insert("lat_p999_us".into(), json!(pct(&sorted, 0.999)));
            m.insert("lat_max_us".into(), json!(pct(&sorted, 1.0)));
            m.insert("lat_histogram_ns".into(), histogram::log_buckets(&sorted));
        }
        if let Some(f) = &o.failed {
            obj.as_object_mut()
                .expect("object")
                .insert("error".into(), json!(f));
        }
        println!("{obj}");
    } else {
        let rule = "-".repeat(87);
        println!("{rule}");
        println!("{:^87}", name);
        println!(
            " Device          : {:<12} Number of qps   : {:<6} Transport type : RoCEv2 (ferroce)",
            a.device, a.qps
        );
        println!(
            " MTU             : {:<12} Tx depth        : {:<6} Inline data    : {} bytes",
            a.mtu,
            if a.kind == Kind::Lat { 1 } else { a.tx_depth },
            a.inline
        );
        println!(
            " Reliability     : {}",
            match client.or(server).map(|s| s.agreed) {
                Some(Negotiated::SelectiveRepeat) =>
                    format!("selective repeat over {} path(s) (negotiated)", a.paths),
                _ => "Go-Back-N".to_string(),
            }
        );
        if simulated {
            println!(
                " Link (sim)      : {} Gb/s, {} us one way, loss {}, reorder {}",
                a.gbps, a.delay_us, a.loss, a.reorder
            );
        } else {
            println!(
                " Role            : {}",
                if a.server { "server" } else { "client" }
            );
        }
        println!("{rule}");
        if a.kind == Kind::Bw {
            println!(
                " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]"
            );
            println!(
                " {:<10} {:<14} {:<18.2} {:<20.2} {:.6}",
                a.size, o.iterations, o.peak_gbps, avg_gbps, mpps
            );
        } else {
            println!(" #bytes #iterations  t_min[usec]  t_median[usec]  t_avg[usec]  99% percentile[usec]  99.9% percentile[usec]");
            println!(
                " {:<6} {:<12} {:<12.2} {:<15.2} {:<12.2} {:<21.2} {:.2}",
                a.size,
                o.iterations,
                pct(&sorted, 0.0),
                pct(&sorted, 0.5),
                lat_avg,
                pct(&sorted, 0.99),
                pct(&sorted, 0.999)
            );
        }
        println!("{rule}");
        if simulated {
            println!(
                " figures above: virtual time on the simulated link ({:.6} s simulated)",
                o.seconds
            );
            println!(
                " wall clock    : {:.3} s; the stack processed {:.3} M messages/s and {:.2} Gbit/s of payload per wall-clock second (both ends on this CPU)",
                o.wall_s, wall_mpps, wall_gbps
            );
        } else {
            println!(" figures above: real time ({:.3} s)", o.seconds);
        }
        let lost = link[0].dropped_loss
            + link[1].dropped_loss
            + link[0].dropped_down
            + link[1].dropped_down;
        if let Some(me) = client.or(server) {
            let c = me.ctx.qp_counters_total();
            println!(
                " transport     : {} frames lost on the link, {} retransmitted, {} timeouts, {} sequence NAKs",
                lost, c.retransmitted_packets, c.local_ack_timeout_err, c.packet_seq_err
            );
        }
        match &o.failed {
            Some(f) => println!(" data          : NOT verified: {f}"),
            None if o.verified => {
                println!(" data          : verified (receiver's buffer equals the sender's)")
            }
            None => {
                println!(" data          : MISMATCH between the receiver's buffer and the sender's")
            }
        }
        println!("{rule}");
    }
}
