//! `ferroce scenario sdr`: SDR-RDMA's cross-continent experiment (seed 004, §6, Figures
//! 9–10) on the simulated fabric in virtual time. Two hosts on one link (a 400 Gbit/s, 25 ms
//! RTT path by default: 3750 km of fibre) that drops data packets by a Bernoulli or a
//! Gilbert-Elliott model; acknowledgements come back on a clean direction, as the paper's
//! model assumes. Every run is one Write through the real transport: SDR packets as UC
//! WRITE-with-immediates on one internal QP per generation (paced at the link's rate), placed
//! by the receiver's sink, acknowledged on a UC control QP.

use ferroce_drivers::sim::{LinkModel, Loss};
use ferroce_reliability::sdr::imm::ImmLayout;
use ferroce_reliability::sdr::model::{self, Code, Scheme};
use ferroce_reliability::sdr::receiver::{Buffer, SdrReceiver};
use ferroce_reliability::sdr::recv::RecvConfig;
use ferroce_reliability::sdr::reliable::{
    parity_len, ReliableConfig, ReliableReceiver, ReliableSender, TableMemory,
};
use ferroce_stack::transport::{
    FixedRate, Mtu, Payload, Policies, QpType, RecvWr, SendFlags, SendWr, Sge, WcOpcode, WrOpcode,
};
use ferroce_testbed::{ConnOpts, Testbed, PD};

/// Internal UC QPs (generations).
const GENERATIONS: u8 = 2;
/// Message slots: each message id names one.
const SLOTS: u32 = 8;
/// Control receives kept posted, and the control send ring's slots.
const CONTROL_SLOTS: usize = 64;
const CONTROL_BYTES: usize = 4096;
/// QP numbers: the sender's generation QPs, the receiver's, and the control pair.
const QPN_TX: u32 = 0x100;
const QPN_RX: u32 = 0x200;
const QPN_CTL_TX: u32 = 0x1ff;
const QPN_CTL_RX: u32 = 0x2ff;
/// The frame around a full packet: Ethernet 14, IPv4 20, UDP 8, BTH 12, RETH 16, ImmDt 4,
/// ICRC 4.
const FRAME_OVERHEAD: usize = 78;
/// Chunks the sender keeps posted ahead of the wire.
const AHEAD_CHUNKS: usize = 2;

/// How the link drops data packets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum LossModel {
    /// Each packet independently.
    Bernoulli,
    /// Bursts: a good state that drops nothing and a bad one that drops half, mean burst
    /// of the bad state ten packets, the bad state's share set for the mean drop rate.
    GilbertElliott,
}

impl LossModel {
    pub fn name(self) -> &'static str {
        match self {
            Self::Bernoulli => "bernoulli",
            Self::GilbertElliott => "gilbert-elliott",
        }
    }

    /// The link's loss for mean packet drop probability `p`.
    fn loss(self, p: f64) -> Loss {
        if p <= 0.0 {
            return Loss::None;
        }
        match self {
            Self::Bernoulli => Loss::Bernoulli(p),
            Self::GilbertElliott => {
                let (loss_bad, p_bad_to_good) = (0.5, 0.1);
                let bad = (p / loss_bad).min(0.99);
                Loss::GilbertElliott {
                    p_good_to_bad: bad * p_bad_to_good / (1.0 - bad),
                    p_bad_to_good,
                    loss_good: 0.0,
                    loss_bad,
                }
            }
        }
    }
}

/// A scheme of the comparison, as the command line names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Choice {
    /// Selective repeat, 3-RTT timeout.
    SrRto,
    /// Selective repeat with NACKs.
    SrNack,
    /// EC (k, m) Reed-Solomon, SR fallback.
    EcMds,
    /// EC (k, m) XOR, SR fallback.
    EcXor,
    /// Per message, SR with NACKs or EC (k, m) Reed-Solomon, by the model at the measured
    /// RTT and chunk drop rate.
    Auto,
}

impl Choice {
    pub const ALL: [Self; 5] = [
        Self::SrRto,
        Self::SrNack,
        Self::EcMds,
        Self::EcXor,
        Self::Auto,
    ];

    pub fn scheme(self, k: u32, m: u32) -> Scheme {
        match self {
            Self::SrRto => Scheme::SR_RTO,
            Self::SrNack => Scheme::SrNack,
            Self::EcMds | Self::Auto => Scheme::Ec {
                code: Code::Mds,
                k,
                m,
                beta: 1.0,
            },
            Self::EcXor => Scheme::Ec {
                code: Code::Xor,
                k,
                m,
                beta: 1.0,
            },
        }
    }
}

/// One point of the grid.
#[derive(Clone, Copy, Debug)]
pub struct Setup {
    pub size: u64,
    pub chunk: u64,
    pub mtu: Mtu,
    pub gbps: f64,
    pub rtt_ns: u64,
    pub loss: LossModel,
    pub drop: f64,
    pub scheme: Scheme,
    /// Choose per message between SR with NACKs and `scheme`.
    pub auto: bool,
    pub runs: u32,
    pub seed: u64,
}

impl Setup {
    /// The model's view of the same point.
    pub fn model(&self) -> model::Setup {
        model::Setup {
            bytes: self.size,
            chunk: self.chunk,
            mtu: u64::from(self.mtu.bytes()),
            gbps: self.gbps,
            rtt: self.rtt_ns as f64 * 1e-9,
            p_packet: self.drop,
            // The receiver here keeps a partly arrived chunk's packets.
            per_packet: true,
        }
    }
}

/// What the runs of one point measured.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    /// Completion time of each run: from the send to the acknowledgement that completed it.
    pub times_ns: Vec<u64>,
    /// Frames' bytes the sender put on the link, all runs.
    pub bytes_on_wire: u64,
    /// Every run's received bytes equal what was sent.
    pub verified: bool,
    pub resent_chunks: u64,
    pub fallbacks: u64,
    pub rebuilt_chunks: u64,
    /// Messages the automatic choice sent with SR and with EC, and why it chose last.
    pub auto_sr: u64,
    pub auto_ec: u64,
    pub auto_last: Option<ferroce_reliability::sdr::auto::Decision>,
}

/// Runs one point: `runs` Writes of `size` bytes one after another on one connection.
pub fn run(s: &Setup) -> Result<Outcome, String> {
    let mtu = s.mtu.bytes();
    let chunk_packets = (s.chunk / u64::from(mtu)).max(1) as u32;
    // A slot takes a message or its parity, whichever is longer.
    let parity = match s.scheme {
        Scheme::Ec { k, m, .. } => parity_len(s.size, u64::from(mtu * chunk_packets), k, m),
        _ => 0,
    };
    let layout = RecvConfig {
        layout: ImmLayout::PAPER,
        mtu,
        chunk_packets,
        max_message: s.size.max(parity).max(1),
        slots: SLOTS,
        generations: GENERATIONS,
    };
    #[allow(unused_mut)]
    let mut cfg = if s.auto {
        ReliableConfig::auto(s.scheme, s.rtt_ns, s.gbps)
    } else {
        ReliableConfig::new(s.scheme, s.rtt_ns)
    };
    // Built with `--features isal`: the system ISA-L rebuilds lost chunks (and encodes).
    #[cfg(feature = "isal")]
    {
        cfg.mds = ferroce_isal::mds;
    }
    let mut tx = ReliableSender::new(layout, cfg).map_err(|e| e.to_string())?;
    let plen = tx.parity_len(s.size);
    // Memory on each host: the message, its parity, the control ring.
    let (msg_at, parity_at, ctl_at) = (0u64, s.size, s.size + plen);
    let mem = (ctl_at as usize) + CONTROL_SLOTS * CONTROL_BYTES;
    let delay = s.rtt_ns / 2;
    let bw = (s.gbps * 1e9) as u64;
    let mut ab = LinkModel::new(bw, delay);
    ab.loss = s.loss.loss(s.drop);
    // Room for the sender's bursts; pacing keeps the queue near empty.
    ab.queue_limit_bytes = 64 << 20;
    let ba = LinkModel::new(bw, delay);
    let mut tb = ferroce_testbed::pair_asym(s.seed, ab, ba, mem);
    let opts = ConnOpts {
        mtu: s.mtu,
        ..ConnOpts::default()
    };
    let frame = mtu as usize + FRAME_OVERHEAD;
    for g in 0..u32::from(GENERATIONS) {
        uc_pair(&mut tb, (QPN_TX + g, QPN_RX + g), &opts, s.gbps, frame);
    }
    uc_pair(&mut tb, (QPN_CTL_TX, QPN_CTL_RX), &opts, s.gbps, frame);
    let sdr = {
        let b = &mut tb.hosts[1];
        SdrReceiver::new(layout, b.mem_mut(), PD).map_err(|e| e.to_string())?
    };
    for g in 0..GENERATIONS {
        tb.hosts[1]
            .qp(QPN_RX + u32::from(g))
            .set_write_imm_sink(Some(sdr.sink(g)))
            .map_err(|e| e.to_string())?;
    }
    let region = sdr.region();
    let mut rx = ReliableReceiver::new(sdr, cfg).map_err(|e| e.to_string())?;
    let keys = (tb.hosts[0].keys, tb.hosts[1].keys);
    for i in 0..CONTROL_SLOTS {
        post_control_recv(&mut tb, keys.0.lkey, ctl_at, i);
    }
    let src = Buffer {
        lkey: keys.0.lkey,
        va: msg_at,
    };
    let (tpar, dst, rpar) = (
        Buffer {
            lkey: keys.0.lkey,
            va: parity_at,
        },
        Buffer {
            lkey: keys.1.lkey,
            va: msg_at,
        },
        Buffer {
            lkey: keys.1.lkey,
            va: parity_at,
        },
    );
    // The message: a pattern; each run stamps every chunk's first bytes with the run, so a
    // chunk that never arrived cannot pass for one that did.
    let pattern: Vec<u8> = (0..s.size)
        .map(|i| (i.wrapping_mul(0x9e37_79b9) >> 13) as u8)
        .collect();
    tb.hosts[0].write(msg_at as usize, &pattern);
    let mut out = Outcome {
        verified: true,
        ..Outcome::default()
    };
    let mut ctl_next = 0usize;
    let wire_before = tb.fabric.port_stats(ferroce_drivers::sim::HostId(0), 0);
    for run in 0..s.runs {
        for c in 0..s.size.div_ceil(s.chunk) {
            let stamp = (u64::from(run) << 32 | c).to_le_bytes();
            let at = (c * s.chunk) as usize;
            let n = stamp.len().min(s.size as usize - at);
            tb.hosts[0].write(at, &stamp[..n]);
        }
        let user = rx
            .post(dst, s.size, (plen > 0).then_some(rpar))
            .map_err(|e| e.to_string())?;
        let start = tb.now();
        let sent = tx
            .send(src, s.size, None, (plen > 0).then_some(tpar))
            .map_err(|e| e.to_string())?;
        let horizon = start + 1000 * s.rtt_ns.max(1_000_000);
        let mut settled = false;
        let done = loop {
            let now = tb.now();
            if now > horizon {
                return Err(format!("run {run} did not complete (seed {})", s.seed));
            }
            if tx.poll_timeout().is_some_and(|t| t <= now) {
                tx.handle_timeout(now);
            }
            // Keep a couple of chunks posted on the generation QPs, the pacer spaces them.
            loop {
                let queued: usize = (0..u32::from(GENERATIONS))
                    .map(|g| tb.hosts[0].qp(QPN_TX + g).send_queue_len())
                    .sum();
                if queued >= AHEAD_CHUNKS * chunk_packets as usize {
                    break;
                }
                let mem = TableMemory {
                    mem: tb.hosts[0].mem(),
                    pd: PD,
                };
                let Some(c) = tx.poll_transmit(now, &mem) else {
                    break;
                };
                for (i, p) in c.packets.iter().enumerate() {
                    let sge = c.sge(i);
                    let wr = c.write(i, &sge, region.rkey, 0, false);
                    tb.hosts[0]
                        .qp(QPN_TX + u32::from(p.generation))
                        .post_send(&wr)
                        .map_err(|e| format!("posting an SDR packet: {e}"))?;
                }
            }
            // Acknowledgements that arrived at the sender.
            let wcs = std::mem::take(&mut tb.hosts[0].completions);
            tb.hosts[0].completed_at.clear();
            for wc in wcs {
                if wc.opcode == WcOpcode::Recv {
                    let slot = wc.wr_id as usize;
                    let bytes = tb.hosts[0]
                        .read(ctl_at as usize + slot * CONTROL_BYTES, wc.byte_len as usize);
                    tx.on_control(now, &bytes);
                    post_control_recv(&mut tb, keys.0.lkey, ctl_at, slot);
                }
            }
            // The receiver: arrivals, rebuilds, acknowledgements.
            {
                let mem = TableMemory {
                    mem: tb.hosts[1].mem(),
                    pd: PD,
                };
                rx.poll(now, &mem);
            }
            while let Some(ack) = rx.poll_control(now) {
                let at = ctl_at as usize + ctl_next * CONTROL_BYTES;
                ctl_next = (ctl_next + 1) % CONTROL_SLOTS;
                let n = ack.len().min(CONTROL_BYTES);
                tb.hosts[1].write(at, &ack[..n]);
                let sge = [Sge {
                    addr: at as u64,
                    length: n as u32,
                    lkey: keys.1.lkey,
                }];
                let wr = SendWr::new(0, WrOpcode::Send, Payload::Sges(&sge)).flags(SendFlags(0));
                tb.hosts[1]
                    .qp(QPN_CTL_RX)
                    .post_send(&wr)
                    .map_err(|e| format!("posting an acknowledgement: {e}"))?;
            }
            tb.hosts[1].completions.clear();
            tb.hosts[1].completed_at.clear();
            if let Some(d) = tx.poll_done() {
                break d;
            }
            let until = [tx.poll_timeout(), rx.poll_timeout()]
                .into_iter()
                .flatten()
                .min();
            let busy = tx.wants_transmit();
            match tb.step(until.unwrap_or(u64::MAX)) {
                ferroce_testbed::Step::Worked | ferroce_testbed::Step::Advanced => settled = false,
                // The hosts' turn in this step may have completed receives or placed
                // packets the SDR layer has not seen: one more pass before time moves.
                ferroce_testbed::Step::Beyond | ferroce_testbed::Step::Idle if !settled => {
                    settled = true;
                }
                ferroce_testbed::Step::Beyond | ferroce_testbed::Step::Idle => {
                    settled = false;
                    // Nothing in the fabric before the SDR layer's next timer: go there.
                    match until {
                        Some(t) => tb.fabric.advance_to(t.max(now + 1)),
                        None if busy => tb.fabric.advance_to(now + 1),
                        None => return Err(format!("run {run}: nothing left to happen")),
                    }
                }
            }
        };
        debug_assert_eq!(done.message, sent);
        out.times_ns.push(done.at - start);
        let got = tb.hosts[1].read(msg_at as usize, s.size as usize);
        let want = tb.hosts[0].read(msg_at as usize, s.size as usize);
        out.verified &= got == want && rx.is_complete(user);
        rx.complete(user);
    }
    let wire_after = tb.fabric.port_stats(ferroce_drivers::sim::HostId(0), 0);
    out.bytes_on_wire = wire_after.tx_bytes - wire_before.tx_bytes;
    let (ts, rs) = (tx.stats(), rx.stats());
    out.resent_chunks = ts.chunks_resent;
    out.fallbacks = ts.fallbacks;
    out.rebuilt_chunks = rs.chunks_rebuilt;
    if let Some((a, last)) = tx.auto() {
        out.auto_sr = a.chose_sr;
        out.auto_ec = a.chose_ec;
        out.auto_last = last;
    }
    Ok(out)
}

/// A UC connection between host 0's `qpn.0` and host 1's `qpn.1`, each paced to fill the
/// link with full frames.
fn uc_pair(tb: &mut Testbed, (a, b): (u32, u32), o: &ConnOpts, gbps: f64, frame: usize) {
    for (h, q) in [(0, a), (1, b)] {
        tb.hosts[h].add_qp(q, QpType::Uc);
        let pace = FixedRate::filling(gbps * 0.999, frame, ferroce_drivers::sim::WIRE_OVERHEAD);
        tb.hosts[h]
            .qp(q)
            .set_policies(Policies::default().with_congestion(Box::new(pace)));
    }
    tb.bring_up((0, a), (1, b), (0, 0), o);
    tb.bring_up((1, b), (0, a), (0, 0), o);
}

fn post_control_recv(tb: &mut Testbed, lkey: u32, ctl_at: u64, slot: usize) {
    let sge = [Sge {
        addr: ctl_at + (slot * CONTROL_BYTES) as u64,
        length: CONTROL_BYTES as u32,
        lkey,
    }];
    let _ = tb.hosts[0].qp(QPN_CTL_TX).post_recv(&RecvWr {
        wr_id: slot as u64,
        sg_list: &sge,
    });
}

/// Mean and 99.9th percentile (nearest rank) of `v`.
pub fn mean_p999(v: &[u64]) -> (f64, f64) {
    if v.is_empty() {
        return (0.0, 0.0);
    }
    let mut s = v.to_vec();
    s.sort_unstable();
    let mean = s.iter().sum::<u64>() as f64 / s.len() as f64;
    let rank = ((s.len() as f64 * 0.999).ceil() as usize).clamp(1, s.len());
    (mean, s[rank - 1] as f64)
}
