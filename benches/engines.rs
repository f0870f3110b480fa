//! Engines and cores (issue 38, item 4): 64 B RC WRITEs through the verbs API between two
//! devices joined by in-memory pipes, with one engine per device on one core against two
//! engines per device on two cores (`pipe_pair_queues`). Each core runs one thread that is
//! both ends: it posts to its QPs and polls their CQs, which turns its engine of each device
//! (run-to-completion), so engine i of both devices lives on core i. The QPs are placed by
//! the device (least-loaded engine first) and the bench checks they were split evenly.
//!
//! ```text
//! cargo bench --bench engines [-- --secs S] [--rounds R] [--pairs P] [--json FILE]
//! ```
//!
//! Prints each round's message rate for one and for two engines, and the median ratio;
//! target ≥ 1.8×. Pinning needs as many CPUs as engines; with fewer the threads share.

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use ferroce::drivers::affinity::pin_current_thread;
use ferroce::verbs::connect::{connect_qp, ConnectOpts, Endpoint};
use ferroce::verbs::sim::pipe_pair_queues;
use ferroce::verbs::*;

/// WRITEs each QP keeps outstanding.
const WINDOW: usize = 64;
/// Bytes each WRITE carries.
const LEN: usize = 64;

struct End {
    _pd: ProtectionDomain,
    cq: CompletionQueue,
    qp: QueuePair,
    mr: MemoryRegion,
}

fn end(ctx: &Context) -> End {
    let pd = ctx.alloc_pd();
    let mr = pd
        .alloc_mr(1 << 16, Access::LOCAL_WRITE.with(Access::REMOTE_WRITE))
        .expect("a memory region");
    let cq = ctx.create_cq(4 * WINDOW, None);
    let caps = QpCaps {
        max_send_wr: 2 * WINDOW as u32,
        ..QpCaps::default()
    };
    let qp = pd.create_qp(QpType::Rc, caps, &cq, &cq).expect("an RC QP");
    End {
        _pd: pd,
        cq,
        qp,
        mr,
    }
}

/// `engines` engines per device, `pairs` QP pairs per engine: each thread's pairs.
fn rig(engines: usize, pairs: usize) -> (Vec<Vec<(End, End)>>, Context, Context) {
    let (ca, cb) = pipe_pair_queues(1500, engines);
    for c in [&ca, &cb] {
        c.set_balance_interval(None);
    }
    let mut by_engine: Vec<Vec<(End, End)>> = (0..engines).map(|_| Vec::new()).collect();
    for _ in 0..engines * pairs {
        let (a, b) = (end(&ca), end(&cb));
        let o = ConnectOpts::default();
        let (ea, eb) = (
            Endpoint::of(&ca, &a.qp, &a.mr, 1),
            Endpoint::of(&cb, &b.qp, &b.mr, 2),
        );
        connect_qp(&ca, &a.qp, ea.psn, &eb, &o).expect("connect a");
        connect_qp(&cb, &b.qp, eb.psn, &ea, &o).expect("connect b");
        assert_eq!(
            a.qp.engine(),
            b.qp.engine(),
            "placement puts a pair's ends on the same engine"
        );
        by_engine[a.qp.engine()].push((a, b));
    }
    for (e, p) in by_engine.iter().enumerate() {
        assert_eq!(
            p.len(),
            pairs,
            "engine {e} got {} pairs, not {pairs}",
            p.len()
        );
    }
    (by_engine, ca, cb)
}

/// Messages per second carried by `engines` engines (one thread each) in `secs`.
fn run(engines: usize, pairs: usize, secs: f64) -> f64 {
    let (by_engine, _ca, _cb) = rig(engines, pairs);
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let start = Arc::new(Barrier::new(engines));
    let threads: Vec<_> = by_engine
        .into_iter()
        .enumerate()
        .map(|(i, pairs)| {
            let start = start.clone();
            std::thread::spawn(move || {
                if engines <= cpus {
                    pin_current_thread(i).expect("pin");
                }
                start.wait();
                drive(&pairs, secs)
            })
        })
        .collect();
    let done: Vec<(u64, Duration)> = threads
        .into_iter()
        .map(|t| t.join().expect("a bench thread"))
        .collect();
    done.iter().map(|&(n, t)| n as f64 / t.as_secs_f64()).sum()
}

/// Keeps [`WINDOW`] WRITEs outstanding on each pair for `secs` (after a warm-up of a fifth
/// of that): the completions counted and the time they took.
fn drive(pairs: &[(End, End)], secs: f64) -> (u64, Duration) {
    let mut wcs = Vec::with_capacity(WINDOW);
    let post = |a: &End, b: &End, n: usize| {
        let s = [a.mr.sge(0, LEN)];
        let wr =
            SendWr::new(0, WrOpcode::Write, Payload::Sges(&s)).remote(b.mr.addr(), b.mr.rkey());
        for _ in 0..n {
            a.qp.post_send(&[wr]).expect("post");
        }
    };
    for (a, b) in pairs {
        post(a, b, WINDOW);
    }
    let warm = Instant::now() + Duration::from_secs_f64(secs / 5.0);
    let mut counted = 0u64;
    let mut began = None;
    loop {
        for (a, b) in pairs {
            wcs.clear();
            let n = a.cq.poll(&mut wcs, WINDOW);
            b.cq.poll(&mut wcs, 0);
            if n == 0 {
                continue;
            }
            assert!(wcs.iter().all(|c| c.status == WcStatus::Success), "{wcs:?}");
            post(a, b, n);
            if began.is_some() {
                counted += n as u64;
            }
        }
        let now = Instant::now();
        match began {
            None if now >= warm => began = Some(now),
            Some(t) if now - t >= Duration::from_secs_f64(secs) => return (counted, now - t),
            _ => {}
        }
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let (mut secs, mut rounds, mut pairs, mut json) = (1.0f64, 5usize, 2usize, None);
    while let Some(a) = args.next() {
        let mut val = || args.next().expect("a value after the option");
        match a.as_str() {
            "--secs" => secs = val().parse().expect("--secs S"),
            "--rounds" => rounds = val().parse().expect("--rounds R"),
            "--pairs" => pairs = val().parse().expect("--pairs P"),
            "--json" => json = Some(val()),
            // What cargo bench passes to every bench.
            "--bench" => {}
            other => {
                panic!("unknown option {other} (--secs S, --rounds R, --pairs P, --json FILE)")
            }
        }
    }
    println!(
        "64 B RC WRITE, {pairs} QP pairs per engine, {WINDOW} outstanding each, {secs} s per run"
    );
    println!(
        "{:>5} {:>14} {:>14} {:>7}",
        "round", "1 engine M/s", "2 engines M/s", "ratio"
    );
    let mut ratios = Vec::new();
    let mut rows = Vec::new();
    for r in 0..rounds {
        let one = run(1, pairs, secs);
        let two = run(2, pairs, secs);
        let ratio = two / one;
        println!(
            "{r:>5} {:>14.3} {:>14.3} {ratio:>7.3}",
            one / 1e6,
            two / 1e6
        );
        ratios.push(ratio);
        rows.push(format!(
            "{{\"one_engine\":{one:.0},\"two_engines\":{two:.0},\"ratio\":{ratio:.4}}}"
        ));
    }
    ratios.sort_by(f64::total_cmp);
    let median = ratios[ratios.len() / 2];
    println!("median ratio {median:.3} (target >= 1.8)");
    if let Some(path) = json {
        let body = format!(
            "{{\"pairs_per_engine\":{pairs},\"window\":{WINDOW},\"len\":{LEN},\"secs\":{secs},\"rounds\":[{}],\"median_ratio\":{median:.4}}}\n",
            rows.join(",")
        );
        std::fs::write(&path, body).expect("write the json");
    }
}
