//! `ferroce scenario varuna --steady`: what Varuna mode costs while nothing fails (seed 001
//! §5.2; issue 23, item 2a), in virtual time. `clients` clients on host 0 of the rail
//! testbed issue one-sided operations to a server on host 1, no fault: synchronous WRITEs
//! (one at a time), batched WRITEs (64 posted at once, the next batch when all completed),
//! synchronous CASes, and batches of one CAS and three READs. Schemes: `none` (one QP, no
//! backup), `native` (the same QP with an alternate path: failover ready), `varuna` (the vQP
//! with a backup QP: every WRITE and CAS logged). Resend-only puts the same packets on the
//! wire as `none` (it only keeps copies), so it is not run separately. Reported per point:
//! the mean latency of an operation (a batch for the batched workloads) and the goodput.
//!
//! The fabric is lossless (unbounded switch queues, standing in for PFC), so sixteen
//! clients into one server port queue rather than drop.
//!
//! Virtual time counts the wire and the transport, not host CPU: what the log costs here is
//! its packets (an 8-byte inline WRITE per logged op; for a CAS also the 16-byte CAS-buffer
//! WRITE and the confirm), not the doorbells and WQE processing of a hardware NIC.

use ferroce_drivers::sim::LinkModel;
use ferroce_reliability::failover::shift::Rail;
use ferroce_reliability::failover::varuna::uid::CasBuffer;
use ferroce_reliability::failover::varuna::vqp::{VarunaConfig, VarunaQp};

use crate::varuna::{bed, qpn};
use ferroce_stack::transport::{
    Mtu, Payload, SendFlags, SendWr, Sge, WcStatus, WorkCompletion, WrOpcode,
};
use ferroce_testbed::{rails, ConnOpts, Step};

/// Who sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Scheme {
    /// One QP, nothing ready for a failure.
    None,
    /// The QP with an alternate path (native failover ready).
    Native,
    /// Varuna mode: logged WRITEs and CASes, a backup QP.
    Varuna,
}

impl Scheme {
    pub const ALL: [Self; 3] = [Self::None, Self::Native, Self::Varuna];

    pub fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Native => "native",
            Self::Varuna => "varuna",
        }
    }
}

/// What each client does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    /// One WRITE of `size` at a time.
    SyncWrite,
    /// 64 WRITEs of `size` posted at once.
    BatchWrite,
    /// One CAS at a time (a chain: each succeeds).
    SyncCas,
    /// One CAS and three 64-byte READs posted at once.
    CasReads,
}

impl Workload {
    pub fn name(self) -> &'static str {
        match self {
            Self::SyncWrite => "write",
            Self::BatchWrite => "write-batch64",
            Self::SyncCas => "cas",
            Self::CasReads => "cas+3read",
        }
    }

    fn batch(self) -> usize {
        match self {
            Self::SyncWrite | Self::SyncCas => 1,
            Self::BatchWrite => 64,
            Self::CasReads => 4,
        }
    }
}

/// One point: a scheme, a workload of `size`-byte operations, `clients` clients issuing
/// `ops` operations (batches) each.
#[derive(Clone, Copy, Debug)]
pub struct Setup {
    /// The failover scheme.
    pub scheme: Scheme,
    /// What the clients issue.
    pub workload: Workload,
    /// Bytes per WRITE (the other workloads' sizes are fixed).
    pub size: usize,
    /// Clients on host 0.
    pub clients: usize,
    /// Operations (batches) per client.
    pub ops: u64,
}

/// One point's result.
#[derive(Clone, Copy, Debug, Default)]
pub struct Outcome {
    /// Mean time from posting an operation (a batch) to its (last) completion.
    pub latency_ns: f64,
    /// Application bytes moved per second of virtual time (WRITE payloads, READ results).
    pub gbps: f64,
    /// Every operation completed successfully.
    pub ok: bool,
}

const MEM: usize = 4 << 20;
/// At the clients: the WRITE source; per client, results and the vQP's staging.
const SRC: usize = 0x10_0000;
const CLIENT: usize = 0x30_0000;
/// At the server: where WRITEs land (shared: overlapping data is not checked), per client
/// the CAS word, the READ source, the completion log and the CAS buffer.
const DST: usize = 0x10_0000;
const CAS_WORDS: usize = 0x100;
const READ_SRC: usize = 0x800;
const LOGS: usize = 0x1_0000;
const CAS_BUFS: usize = 0x3_0000;
const SLOTS: usize = 64;

fn client_base(c: usize) -> usize {
    CLIENT + c * 0x1000
}

struct Client {
    vqp: Option<VarunaQp>,
    /// Operations (batches) left, completions still awaited in the current one, when it
    /// was posted, and the CAS chain's next compare value.
    left: u64,
    awaited: usize,
    posted_at: u64,
    cas_next: u64,
    latency_sum: u64,
    done: u64,
    failed: bool,
}

/// Runs one point.
pub fn run(s: &Setup) -> Outcome {
    let &Setup {
        scheme,
        workload,
        size,
        clients,
        ops,
    } = s;
    // Lossless, as RoCE fabrics run with PFC (and the paper's testbed did): sixteen clients
    // into one server port queue up instead of tail-dropping, so what is measured is the
    // schemes, not congestion losses and their timeouts.
    let model = LinkModel {
        queue_limit_bytes: 0,
        ..LinkModel::new(100_000_000_000, 2_000)
    };
    let (mut w, _r) = rails(1, model, MEM);
    let o = ConnOpts {
        mtu: Mtu::Mtu4096,
        // 537 ms: batches of 64 × 1 MiB from sixteen clients queue a gigabyte at the
        // server's port (86 ms at 100 Gbit/s); no ACK timeout may fire on queueing alone.
        timeout: 17,
        max_rd_atomic: 16,
        ..ConnOpts::default()
    };
    for c in 0..clients {
        let mut rails_used = vec![(Rail::Default, 0)];
        if scheme == Scheme::Varuna {
            rails_used.push((Rail::Backup, 1));
        }
        for (rail, port) in rails_used {
            let (a, b) = (qpn(rail, 0, c), qpn(rail, 1, c));
            w.connect_rc_on(port, ((0, a), (1, b)), (100, 200), &o);
        }
        if scheme == Scheme::Native {
            w.set_alternate((0, qpn(Rail::Default, 0, c)), 1, (1, 1));
            w.set_alternate((1, qpn(Rail::Default, 1, c)), 0, (1, 1));
        }
    }
    let (lkey, rkey) = (w.hosts[0].keys.lkey, w.hosts[1].keys.rkey);
    let mut cls: Vec<Client> = (0..clients)
        .map(|c| Client {
            vqp: (scheme == Scheme::Varuna).then(|| {
                VarunaQp::new(VarunaConfig {
                    slots: SLOTS,
                    log_addr: (LOGS + c * 8 * SLOTS) as u64,
                    log_rkey: rkey,
                    staging_addr: (client_base(c) + 0x100) as u64,
                    staging_lkey: lkey,
                    cas: Some((
                        CasBuffer {
                            base: (CAS_BUFS + c * 16 * SLOTS) as u64,
                            slots: SLOTS as u32,
                            qp: c as u16 + 1,
                        },
                        rkey,
                    )),
                    uids: None,
                })
            }),
            left: ops,
            awaited: 0,
            posted_at: 0,
            cas_next: 0,
            latency_sum: 0,
            done: 0,
            failed: false,
        })
        .collect();
    let limit = 10_000_000_000;
    let mut seen = 0usize;
    let start = w.now();
    loop {
        for (c, cl) in cls.iter_mut().enumerate() {
            if cl.awaited > 0 || cl.left == 0 || cl.failed {
                continue;
            }
            let now = w.now();
            let wrs = batch(workload, size, c, cl.cas_next, lkey, rkey);
            cl.cas_next += 1;
            for wr in &wrs {
                let wr = wr.as_wr();
                let r = match cl.vqp.as_mut() {
                    Some(v) => v.post_send(&mut bed(&mut w, c, None), &wr),
                    None => w.hosts[0].qp(qpn(Rail::Default, 0, c)).post_send(&wr),
                };
                if r.is_err() {
                    cl.failed = true;
                }
            }
            cl.awaited = workload.batch();
            cl.posted_at = now;
            cl.left -= 1;
        }
        if cls
            .iter()
            .all(|c| c.failed || (c.left == 0 && c.awaited == 0))
            || w.now() >= limit
        {
            break;
        }
        let sent = w.turn();
        let fresh: Vec<WorkCompletion> = w.hosts[0].completions[seen..].to_vec();
        let at: Vec<u64> = w.hosts[0].completed_at[seen..].to_vec();
        seen += fresh.len();
        for (wc, t) in fresh.iter().zip(at) {
            let q = wc.qp_num.value();
            let (rail, c) = match q {
                0x100..=0x1ff => (Rail::Default, (q - 0x100) as usize),
                0x300..=0x3ff => (Rail::Backup, (q - 0x300) as usize),
                _ => continue,
            };
            let Some(cl) = cls.get_mut(c) else { continue };
            let app = match cl.vqp.as_mut() {
                Some(v) => v.on_completion(&mut bed(&mut w, c, None), rail, wc),
                None => vec![*wc],
            };
            for a in app {
                if a.status != WcStatus::Success {
                    cl.failed = true;
                    continue;
                }
                cl.awaited = cl.awaited.saturating_sub(1);
                if cl.awaited == 0 {
                    cl.latency_sum += t - cl.posted_at;
                    cl.done += 1;
                }
            }
        }
        w.hosts[1].completions.clear();
        if sent == 0 && fresh.is_empty() {
            match w.advance(limit) {
                Step::Worked | Step::Advanced => {}
                Step::Idle | Step::Beyond => break,
            }
        }
    }
    let elapsed = (w.now() - start).max(1);
    let done: u64 = cls.iter().map(|c| c.done).sum();
    let latency = cls.iter().map(|c| c.latency_sum).sum::<u64>() as f64 / done.max(1) as f64;
    let bytes_per_op = match workload {
        Workload::SyncWrite => size as u64,
        Workload::BatchWrite => 64 * size as u64,
        Workload::SyncCas => 8,
        Workload::CasReads => 8 + 3 * 64,
    };
    Outcome {
        latency_ns: latency,
        gbps: (done * bytes_per_op) as f64 * 8.0 / elapsed as f64,
        ok: done == clients as u64 * ops && cls.iter().all(|c| !c.failed),
    }
}

/// One operation (batch) of `workload` for client `c`, as owned WRs.
fn batch(
    workload: Workload,
    size: usize,
    c: usize,
    cas_next: u64,
    lkey: u32,
    rkey: u32,
) -> Vec<ferroce_stack::transport::OwnedSendWr> {
    use ferroce_stack::transport::OwnedSendWr;
    let base = client_base(c) as u64;
    let mut out = Vec::new();
    let sge = |addr: u64, length: usize| {
        [Sge {
            addr,
            length: length as u32,
            lkey,
        }]
    };
    match workload {
        Workload::SyncWrite | Workload::BatchWrite => {
            let s = sge(SRC as u64, size);
            for i in 0..workload.batch() as u64 {
                let wr = SendWr::new(i, WrOpcode::Write, Payload::Sges(&s))
                    .remote(DST as u64, rkey)
                    .flags(SendFlags::SIGNALED);
                out.push(OwnedSendWr::from_wr(&wr));
            }
        }
        Workload::SyncCas | Workload::CasReads => {
            let s = sge(base, 8);
            let mut wr = SendWr::new(0, WrOpcode::CmpSwp, Payload::Sges(&s))
                .remote((CAS_WORDS + 8 * c) as u64, rkey)
                .flags(SendFlags::SIGNALED);
            wr.compare_add = cas_next;
            wr.swap = cas_next + 1;
            out.push(OwnedSendWr::from_wr(&wr));
            if workload == Workload::CasReads {
                for i in 1..4u64 {
                    let d = sge(base + 0x40 * i, 64);
                    let wr = SendWr::new(i, WrOpcode::Read, Payload::Sges(&d))
                        .remote(READ_SRC as u64, rkey)
                        .flags(SendFlags::SIGNALED);
                    out.push(OwnedSendWr::from_wr(&wr));
                }
            }
        }
    }
    out
}
