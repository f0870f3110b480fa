//! rdma-core's `ibv_rc_pingpong` on ferroce's verbs API: two RC QPs bounce a SEND back and
//! forth `--iters` times and report the bandwidth and the time per round trip.
//!
//! ```sh
//! cargo run --release --example rc_pingpong                     # both ends here, simulated fabric
//! rc_pingpong -d afpacket:veth1                                 # server (as ibv_rc_pingpong with no host)
//! rc_pingpong -d afpacket:veth0 192.168.77.2                    # client
//! ```
//!
//! The shape is ibv_rc_pingpong's: open the device, allocate a PD, register a buffer, create a
//! CQ and an RC QP, swap QPN/PSN/GID over TCP, move the QP to RTS, post receives, then
//! ping-pong SENDs, each side re-posting a receive for every one it consumes.

use std::time::{Duration, Instant};

use ferroce::drivers::sim::LinkModel;
use ferroce::verbs::connect::{
    connect_qp, exchange_client, exchange_server, ConnectOpts, Endpoint, OobListener,
};
use ferroce::verbs::sim::SimNet;
use ferroce::verbs::spec::open_device;
use ferroce::verbs::{
    Access, CompletionQueue, Context, MemoryRegion, Payload, ProtectionDomain, QpCaps, QpType,
    QueuePair, RecvWr, SendWr, WcOpcode, WcStatus, WrOpcode,
};

const PORT: u16 = 18515;

struct PingPong {
    ctx: Context,
    _pd: ProtectionDomain,
    mr: MemoryRegion,
    cq: CompletionQueue,
    qp: QueuePair,
}

impl PingPong {
    fn new(ctx: &Context, size: usize, rx_depth: u32) -> Self {
        let pd = ctx.alloc_pd();
        let mr = pd.alloc_mr(size, Access::LOCAL_WRITE).expect("ibv_reg_mr");
        let cq = ctx.create_cq(rx_depth as usize + 1, None);
        let caps = QpCaps {
            max_send_wr: 2,
            max_recv_wr: rx_depth,
            ..QpCaps::default()
        };
        let qp = pd
            .create_qp(QpType::Rc, caps, &cq, &cq)
            .expect("ibv_create_qp");
        Self {
            ctx: ctx.clone(),
            _pd: pd,
            mr,
            cq,
            qp,
        }
    }

    fn endpoint(&self, psn: u32) -> Endpoint {
        Endpoint::of(&self.ctx, &self.qp, &self.mr, psn)
    }

    fn post_recv(&self, n: u32) {
        for _ in 0..n {
            let sge = [self.mr.sge(0, self.mr.len())];
            self.qp
                .post_recv(&[RecvWr {
                    wr_id: 1,
                    sg_list: &sge,
                }])
                .expect("ibv_post_recv");
        }
    }

    fn post_send(&self) {
        let sge = [self.mr.sge(0, self.mr.len())];
        self.qp
            .post_send(&[SendWr::new(2, WrOpcode::Send, Payload::Sges(&sge))])
            .expect("ibv_post_send");
    }
}

/// Runs `iters` round trips; `step` makes progress (the simulator, or the engine).
fn run(me: &PingPong, peer: Option<&PingPong>, iters: u32, step: &dyn Fn()) -> Duration {
    let ends: Vec<&PingPong> = std::iter::once(me).chain(peer).collect();
    let start = Instant::now();
    let t0 = me.ctx.now();
    // The client (the first end) sends first; whoever receives answers.
    me.post_send();
    let mut received = vec![0u32; ends.len()];
    let mut wcs = Vec::new();
    while received[0] < iters {
        step();
        for (i, e) in ends.iter().enumerate() {
            wcs.clear();
            e.cq.poll(&mut wcs, 16);
            for wc in &wcs {
                assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
                if wc.opcode == WcOpcode::Recv {
                    received[i] += 1;
                    e.post_recv(1);
                    if i > 0 || received[0] < iters {
                        e.post_send();
                    }
                }
            }
        }
    }
    let _ = start;
    Duration::from_nanos(me.ctx.now() - t0)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mut device = String::from("sim");
    let mut server_host = None;
    let (size, iters, rx_depth) = (4096usize, 1000u32, 500u32);
    while let Some(a) = args.next() {
        match a.as_str() {
            "-d" | "--ib-dev" => device = args.next().expect("-d needs a device"),
            host => server_host = Some(host.to_owned()),
        }
    }
    let o = ConnectOpts::default();
    let elapsed = if device == "sim" {
        let (net, ca, cb) = SimNet::pair(1, LinkModel::default(), 9000, None).expect("sim");
        let (a, b) = (
            PingPong::new(&ca, size, rx_depth),
            PingPong::new(&cb, size, rx_depth),
        );
        let (ea, eb) = (a.endpoint(1), b.endpoint(2));
        connect_qp(&ca, &a.qp, ea.psn, &eb, &o).expect("modify to RTS");
        connect_qp(&cb, &b.qp, eb.psn, &ea, &o).expect("modify to RTS");
        a.post_recv(rx_depth);
        b.post_recv(rx_depth);
        println!(
            "  local address:  QPN {:#08x}, PSN {:#08x}, GID {:?}",
            ea.qpn,
            ea.psn,
            ea.gid.ip()
        );
        println!(
            "  remote address: QPN {:#08x}, PSN {:#08x}, GID {:?}",
            eb.qpn,
            eb.psn,
            eb.gid.ip()
        );
        run(&a, Some(&b), iters, &|| {
            net.step();
        })
    } else {
        let ctx = open_device(&device).unwrap_or_else(|e| {
            eprintln!("rc_pingpong: {e}");
            std::process::exit(1)
        });
        let me = PingPong::new(&ctx, size, rx_depth);
        let mine = me.endpoint(if server_host.is_some() { 1 } else { 2 });
        // The exchange may run over the port itself (a DPDK port's smoltcp), which answers
        // only while the engine turns: give it a thread until the QPs are connected.
        ctx.start_engine_thread().expect("engine thread");
        let (peer, _stream) = match &server_host {
            Some(h) => {
                exchange_client(&ctx, &format!("{h}:{PORT}"), &mine, Duration::from_secs(10))
            }
            None => OobListener::bind(&ctx, PORT).and_then(|mut l| exchange_server(&mut l, &mine)),
        }
        .unwrap_or_else(|e| {
            eprintln!("rc_pingpong: {e}");
            std::process::exit(1)
        });
        ctx.stop_engine_thread();
        connect_qp(&ctx, &me.qp, mine.psn, &peer, &o).expect("modify to RTS");
        // A SEND that arrives before these are posted gets an RNR NAK and is retried.
        me.post_recv(rx_depth);
        println!(
            "  local address:  QPN {:#08x}, PSN {:#08x}, GID {:?}",
            mine.qpn,
            mine.psn,
            mine.gid.ip()
        );
        println!(
            "  remote address: QPN {:#08x}, PSN {:#08x}, GID {:?}",
            peer.qpn,
            peer.psn,
            peer.gid.ip()
        );
        if server_host.is_some() {
            run(&me, None, iters, &|| {
                ctx.progress();
            })
        } else {
            // The server answers each receive with a send until the client stops.
            // Like ibv_rc_pingpong, it also waits for its own last SEND to complete: leaving
            // earlier would strand it unsent or unacknowledged.
            let mut wcs = Vec::new();
            let (mut answered, mut sent) = (0, 0);
            let t0 = ctx.now();
            while answered < iters || sent < iters {
                ctx.progress();
                wcs.clear();
                me.cq.poll(&mut wcs, 16);
                for wc in &wcs {
                    assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
                    if wc.opcode == WcOpcode::Recv {
                        me.post_recv(1);
                        me.post_send();
                        answered += 1;
                    } else {
                        sent += 1;
                    }
                }
            }
            Duration::from_nanos(ctx.now() - t0)
        }
    };
    let bytes = 2.0 * size as f64 * f64::from(iters);
    println!(
        "{bytes} bytes in {:.6} seconds = {:.2} Mbit/sec",
        elapsed.as_secs_f64(),
        bytes * 8.0 / elapsed.as_secs_f64() / 1e6
    );
    println!(
        "{iters} iters in {:.6} seconds = {:.2} usec/iter",
        elapsed.as_secs_f64(),
        elapsed.as_secs_f64() * 1e6 / f64::from(iters)
    );
}
