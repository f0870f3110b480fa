//! `ferroce perf` between two processes on real devices: perftest's server/client pair.
//!
//! The server listens on TCP (`--port`), the client connects; they check they run the same
//! test, swap one endpoint per QP (QPN, PSN, GID, MAC, buffer address and rkey), bring their
//! QPs up, and start on a go byte. At the end the client sends a CRC of its buffers and the
//! server answers with its own: the data is verified when they match.
//!
//! The TCP is the kernel's, or smoltcp's on the device's own port when it has a control plane
//! (a DPDK port): then `--connect` names the peer's RoCE address and no kernel networking is
//! involved. An engine thread serves the port whenever the test is not running.

use std::io::{Read, Write};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use ferroce_verbs::connect::{
    connect_qp, exchange_client, exchange_server, negotiate, swap, ConnectOpts, OobListener,
    OobStream,
};
use ferroce_verbs::spec::open_device_with_pcap;
use ferroce_verbs::Mtu;

use super::{
    bad, endpoint, pattern, post, post_recv, report, side, use_scheme, Args, Kind, Outcome, Side,
    Verb, SLOTS,
};
use crate::Failure;

/// How long a latency test's side spins for its peer's answer before it yields the CPU on
/// each look: longer than a round trip (about 15 µs on a veth pair), so a typical one never
/// yields. On two cores the two processes' spinning threads sometimes share one, and a
/// spinning waiter then keeps its peer, which holds the answer, off that CPU for a whole
/// scheduler turn: a p99.9 of 2-4 ms (docs/benchmarks.md, issue 39).
const LAT_SPIN: Duration = Duration::from_micros(50);

const PARAMS_LEN: usize = 64;

fn params(a: &Args) -> [u8; PARAMS_LEN] {
    let text = format!(
        "FERROCEP {:?} {:?} {} {} {} {} {}",
        a.verb,
        a.kind,
        a.size,
        a.iters.unwrap_or(0),
        a.qps,
        a.tx_depth,
        a.mtu
    );
    let mut b = [b' '; PARAMS_LEN];
    b[..text.len().min(PARAMS_LEN)].copy_from_slice(&text.as_bytes()[..text.len().min(PARAMS_LEN)]);
    b
}

fn agree(s: &mut OobStream, a: &Args) -> Result<(), Failure> {
    let mine = params(a);
    s.write_all(&mine)?;
    let mut theirs = [0u8; PARAMS_LEN];
    s.read_exact(&mut theirs)
        .map_err(|e| Failure(format!("the peer closed the connection during setup: {e}")))?;
    if !theirs.starts_with(b"FERROCEP ") {
        return Err(Failure(
            "the peer does not speak ferroce perf's exchange (is it another program?)".into(),
        ));
    }
    if theirs != mine {
        return Err(Failure(format!(
            "the peer runs a different test: '{}' here, '{}' there",
            String::from_utf8_lossy(&mine).trim(),
            String::from_utf8_lossy(&theirs).trim()
        )));
    }
    Ok(())
}

fn crc_of(s: &Side, a: &Args, iterations: u64) -> u32 {
    let used = if iterations >= SLOTS as u64 {
        a.size * SLOTS
    } else {
        a.size * iterations as usize
    };
    let mut h = crc32fast::Hasher::new();
    let mut buf = vec![0u8; used];
    for c in &s.conns {
        c.mr.read(0, &mut buf);
        h.update(&buf);
    }
    h.finalize()
}

pub(super) fn run(a: &Args, mtu: Mtu) -> Result<ExitCode, Failure> {
    let pcap: Option<Box<dyn Write + Send>> = match &a.pcap {
        Some(p) => {
            Some(Box::new(std::fs::File::create(p).map_err(|e| {
                Failure(format!("cannot create {}: {e}", p.display()))
            })?))
        }
        None => None,
    };
    let ctx = open_device_with_pcap(&a.device, pcap)?;
    // As perftest: a path MTU above what the port carries falls back to the port's.
    let active = ctx.query_port().active_mtu;
    let mtu = if mtu.bytes() > active.bytes() {
        if !a.json {
            eprintln!(
                " requested MTU {} is larger than the port's active MTU {}; using {}",
                mtu.bytes(),
                active.bytes(),
                active.bytes()
            );
        }
        active
    } else {
        mtu
    };
    let buf_len = a.size * SLOTS;
    let depth = if a.kind == Kind::Lat { 2 } else { a.tx_depth };
    let mut me = side(&ctx, a.qps, buf_len, depth)?;
    // While the exchange blocks on TCP, an engine thread keeps the port served (a DPDK
    // port's control plane answers ARP and ping only when the engine turns).
    ctx.start_engine_thread()?;
    let psn0: u32 = if a.server { 0x800 } else { 0x100 };
    let first = endpoint(&me, 0, psn0, a)?;
    let (peer0, mut stream) = if a.server {
        let mut listener = OobListener::bind(&ctx, a.port)?;
        if !a.json {
            println!(
                " waiting for a client on TCP port {} ({}{})",
                a.port,
                a.device,
                if ctx.control().is_some() {
                    ", TCP through the port"
                } else {
                    ""
                }
            );
        }
        exchange_server(&mut listener, &first)?
    } else {
        let host = a.connect.as_deref().unwrap_or_default();
        exchange_client(
            &ctx,
            &format!("{host}:{}", a.port),
            &first,
            Duration::from_secs(10),
        )?
    };
    stream.set_read_timeout(Some(Duration::from_secs(60)))?;
    agree(&mut stream, a)?;
    let o = ConnectOpts {
        mtu,
        ..ConnectOpts::default()
    };
    for i in 0..a.qps as usize {
        let mine = endpoint(&me, i, psn0 + i as u32, a)?;
        let peer = if i == 0 {
            peer0
        } else {
            swap(&mut stream, &mine)?
        };
        // Selective repeat only if the peer offered it too; Go-Back-N otherwise.
        me.agreed = negotiate(&mine, &peer).recovery;
        use_scheme(&me.conns[i].qp, me.agreed, a)?;
        connect_qp(&ctx, &me.conns[i].qp, mine.psn, &peer, &o)?;
        me.conns[i].peer = peer;
        let source = (a.verb == Verb::Read) == a.server;
        if source {
            me.conns[i].mr.write(0, &pattern(a.seed, i, buf_len));
        }
    }
    // Both ends are at RTS; wait for the link (a memif or a real port comes up a little after
    // it starts: frames sent before that are lost and cost a retransmission timeout), then go.
    let up = Instant::now();
    while ctx.query_port().state != ferroce_verbs::PortState::Active {
        if up.elapsed() > Duration::from_secs(10) {
            return Err(Failure(format!(
                "{}: the link did not come up within 10 s",
                a.device
            )));
        }
        ctx.progress();
        std::thread::sleep(Duration::from_millis(1));
    }
    stream.write_all(b"G")?;
    let mut go = [0u8; 1];
    stream.read_exact(&mut go)?;
    // The test itself runs the engine on this thread (run-to-completion).
    ctx.stop_engine_thread();
    let wall = Instant::now();
    let mut out = if a.server {
        serve(a, &me, &mut stream)
    } else {
        match a.kind {
            Kind::Bw => client_bw(a, &me),
            Kind::Lat => client_lat(a, &me),
        }
    };
    out.wall_s = wall.elapsed().as_secs_f64();
    // End of test: the client's count and CRC, then the server's CRC, with the engine on its
    // thread again to carry a control plane's TCP.
    ctx.start_engine_thread()?;
    let verified = if a.server {
        let mut msg = [0u8; 13];
        stream.read_exact(&mut msg)?;
        let iterations = u64::from_be_bytes(msg[1..9].try_into().unwrap_or_default());
        let theirs = u32::from_be_bytes(msg[9..13].try_into().unwrap_or_default());
        out.iterations = iterations;
        out.bytes = iterations * a.size as u64;
        let mine = crc_of(&me, a, iterations);
        stream.write_all(&mine.to_be_bytes())?;
        // The last message: out before the process ends (a port's TCP dies with it).
        stream.finish()?;
        msg[0] == b'D' && theirs == mine
    } else {
        let mine = crc_of(&me, a, out.iterations);
        let mut msg = vec![b'D'];
        msg.extend_from_slice(&out.iterations.to_be_bytes());
        msg.extend_from_slice(&mine.to_be_bytes());
        stream.write_all(&msg)?;
        let mut theirs = [0u8; 4];
        stream.read_exact(&mut theirs)?;
        // Stay until the server knows its answer arrived.
        stream.await_end(Duration::from_secs(5));
        u32::from_be_bytes(theirs) == mine
    };
    out.verified = verified && out.failed.is_none();
    // The engine (and a pcap tee inside it) belongs to this thread again, so the capture is
    // flushed when the device drops.
    ctx.stop_engine_thread();
    let _ = me.ctx.export_stats();
    // The report shows the MTU the QPs used.
    let a = &Args {
        mtu: mtu.bytes(),
        ..a.clone()
    };
    if a.server {
        out.seconds = out.wall_s;
        out.peak_gbps = out.bytes as f64 * 8.0 / out.seconds.max(1e-9) / 1e9;
        report(a, &out, None, None, Some(&me));
    } else {
        report(a, &out, None, Some(&me), None);
    }
    me.conns.clear();
    Ok(if out.verified {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// The server's part: keep the engine turning, repost receives (SEND), answer pings (lat),
/// until the client says it is done.
fn serve(a: &Args, me: &Side, stream: &mut OobStream) -> Outcome {
    let mut out = Outcome::default();
    let mut wcs = Vec::new();
    let depth = u64::from(if a.kind == Kind::Lat { 1 } else { a.tx_depth });
    let mut recv_posted = vec![0u64; me.conns.len()];
    if a.verb == Verb::Send {
        for (i, n) in recv_posted.iter_mut().enumerate() {
            for _ in 0..depth {
                if let Err(e) = post_recv(a, me, i, *n) {
                    out.failed = Some(e);
                    return out;
                }
                *n += 1;
            }
        }
    }
    let last = a.size - 1;
    let mut n = 0u64;
    let mut turns = 0u32;
    let mut last_export = me.ctx.now();
    let lat = a.kind == Kind::Lat;
    // When the last message came, for a latency test's wait (see `LAT_SPIN`).
    let mut heard = Instant::now();
    loop {
        if lat && heard.elapsed() > LAT_SPIN {
            std::thread::yield_now();
        }
        me.ctx.progress();
        turns = turns.wrapping_add(1);
        if turns.is_multiple_of(256) {
            if stream.readable() {
                return out;
            }
            let now = me.ctx.now();
            if now - last_export >= 1_000_000_000 {
                let _ = me.ctx.export_stats();
                last_export = now;
            }
        }
        wcs.clear();
        me.cq.poll(&mut wcs, 64);
        if lat && !wcs.is_empty() {
            heard = Instant::now();
        }
        for wc in &wcs {
            if let Some(e) = bad(wc) {
                out.failed = Some(e);
            }
            if wc.opcode.is_recv() {
                let i = me.index_of(wc);
                if a.kind == Kind::Lat {
                    // Pong.
                    if let Err(e) = post(a, me, 0, n, true) {
                        out.failed = Some(e);
                    }
                    n += 1;
                }
                if let Err(e) = post_recv(a, me, i, recv_posted[i]) {
                    out.failed = Some(e);
                }
                recv_posted[i] += 1;
            }
        }
        if a.kind == Kind::Lat && a.verb == Verb::Write {
            let slot = (n as usize % SLOTS) * a.size;
            let m = (n % 127) as u8 + 1;
            let mut b = [0u8];
            if me.conns[0].mr.read(slot + last, &mut b) && b[0] == m {
                heard = Instant::now();
                me.conns[0].mr.write(slot + last, &[m | 0x80]);
                if let Err(e) = post(a, me, 0, n, true) {
                    out.failed = Some(e);
                }
                n += 1;
            }
        }
    }
}

fn client_bw(a: &Args, me: &Side) -> Outcome {
    let depth = u64::from(a.tx_depth);
    let cq_mod = (depth / 4).max(1);
    let qps = me.conns.len();
    let iters = a.iters.unwrap_or(5000);
    let limit = a.duration.map(|s| (s * 1e9) as u64);
    let mut posted = vec![0u64; qps];
    let mut done = vec![0u64; qps];
    let mut out = Outcome::default();
    let start = me.ctx.now();
    let mut samples = vec![(start, 0u64)];
    let mut stop_at: Option<Vec<u64>> = None;
    let mut wcs = Vec::new();
    let mut last_report = start;
    loop {
        let now = me.ctx.now();
        if stop_at.is_none() && limit.is_some_and(|l| now - start >= l) {
            stop_at = Some(posted.clone());
            out.per_qp_messages = done.clone();
        }
        for i in 0..qps {
            let cap = stop_at
                .as_ref()
                .map_or(if limit.is_some() { u64::MAX } else { iters }, |s| s[i]);
            while posted[i] < cap && posted[i] - done[i] < depth {
                let n = posted[i];
                let signaled = (n + 1).is_multiple_of(cq_mod) || n + 1 == cap;
                if let Err(e) = post(a, me, i, n, signaled) {
                    out.failed = Some(e);
                    return out;
                }
                posted[i] += 1;
            }
        }
        wcs.clear();
        me.cq.poll(&mut wcs, 256);
        for wc in &wcs {
            if let Some(e) = bad(wc) {
                out.failed = Some(e);
                return out;
            }
            let i = me.index_of(wc);
            done[i] = done[i].max(wc.wr_id + 1);
        }
        let total: u64 = done.iter().sum();
        if !wcs.is_empty() {
            samples.push((now, total));
        }
        if !a.json && now - last_report >= 1_000_000_000 {
            // Progress, a line per second, as perftest's --report_gbits runs do.
            println!(
                " {:>6.1} s  {:>12} messages  {:>8.2} Gb/s so far",
                (now - start) as f64 / 1e9,
                total,
                total as f64 * a.size as f64 * 8.0 / (now - start) as f64
            );
            last_report = now;
            let _ = me.ctx.export_stats();
        }
        let finished = match &stop_at {
            Some(s) => (0..qps).all(|i| done[i] >= s[i]),
            None => limit.is_none() && done.iter().all(|&d| d >= iters),
        };
        if finished {
            if out.per_qp_messages.is_empty() {
                out.per_qp_messages = done.clone();
            }
            out.iterations = total;
            out.bytes = total * a.size as u64;
            out.seconds = (me.ctx.now() - start) as f64 / 1e9;
            break;
        }
    }
    let avg = out.bytes as f64 * 8.0 / out.seconds.max(1e-9) / 1e9;
    out.peak_gbps = super::peak(&samples, a.size).max(avg);
    out
}

fn client_lat(a: &Args, me: &Side) -> Outcome {
    let mut out = Outcome::default();
    let iters = a.iters.unwrap_or(1000);
    let limit = a.duration.map(|s| (s * 1e9) as u64);
    let start = me.ctx.now();
    let last = a.size - 1;
    let mut wcs = Vec::new();
    if a.verb == Verb::Send {
        if let Err(e) = post_recv(a, me, 0, 0) {
            out.failed = Some(e);
            return out;
        }
    }
    let patience = Duration::from_secs(10);
    for n in 0..iters {
        if limit.is_some_and(|l| me.ctx.now() - start >= l) {
            break;
        }
        let t0 = me.ctx.now();
        let slot = (n as usize % SLOTS) * a.size;
        let m = (n % 127) as u8 + 1;
        if a.verb == Verb::Write {
            me.conns[0].mr.write(slot + last, &[m]);
        }
        if let Err(e) = post(a, me, 0, n, true) {
            out.failed = Some(e);
            return out;
        }
        let waited = Instant::now();
        let mut got = false;
        while !got {
            let w = waited.elapsed();
            if w > patience {
                out.failed = Some(format!("no answer to message {n} within {patience:?}"));
                return out;
            }
            if w > LAT_SPIN {
                std::thread::yield_now();
            }
            me.ctx.progress();
            wcs.clear();
            me.cq.poll(&mut wcs, 8);
            if let Some(e) = wcs.iter().find_map(bad) {
                out.failed = Some(e);
                return out;
            }
            got = match a.verb {
                Verb::Read => !wcs.is_empty(),
                Verb::Send => wcs.iter().any(|w| w.opcode.is_recv()),
                Verb::Write | Verb::Sdr => {
                    let mut b = [0u8];
                    me.conns[0].mr.read(slot + last, &mut b) && b[0] == m | 0x80
                }
            };
        }
        if a.verb == Verb::Send {
            if let Err(e) = post_recv(a, me, 0, n + 1) {
                out.failed = Some(e);
                return out;
            }
        }
        let rtt = me.ctx.now() - t0;
        out.lat_ns
            .push(if a.verb == Verb::Read { rtt } else { rtt / 2 });
    }
    out.iterations = out.lat_ns.len() as u64;
    out.bytes = out.iterations * a.size as u64;
    out.seconds = (me.ctx.now() - start) as f64 / 1e9;
    out
}
