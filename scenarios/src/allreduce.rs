//! `ferroce scenario allreduce`: R2CCL's collective (seed 003) over ferroce RC QPs on the
//! simulated fabric. `n` hosts with two NICs each, NIC `r` of every host on rail `r`'s ToR
//! (rail-optimized, the rails joined nowhere else). An AllReduce of `bytes` per host runs
//! as NCCL runs it over two NICs: one ring per NIC (a *channel*), each over its share of the
//! buffer, every hop a WRITE with immediate of one slice into the next host — into a
//! staging area to be reduced during reduce-scatter, straight into the buffer during
//! all-gather — pipelined slice by slice. The reduction is real (wrapping 32-bit sums) and
//! every host's result is checked against the expected sums.
//!
//! R2CCL's handling, at every connection (a sender, a receiver, a QP on each rail — the
//! backup pre-established, the buffers registered on every NIC): the sender sees the error,
//! tells the receiver out of band ([`OobMsg`], encoded bytes delivered after a modelled
//! delay), both probe the failed rail — each other and a third node — the receiver sends
//! its results back, the sender blames a component ([`triangulate`]), moves the connection
//! to the backup NIC by proximity ([`backup_order`]) and rolls back: its [`Sender`] to the
//! first slice without a completion, the receiver's [`Receiver`] dropping what it already
//! had. What the verdicts say (a dead NIC, rail or path) and what the ports say (their
//! rates) shape the next collective's plan: one ring with the channels split equally
//! (`ring`), split by each rail's slowest NIC (`balance`), or R2CCL-AllReduce's global +
//! partial rings and broadcast around a degraded node ([`decompose`]); `r2ccl` picks
//! balance or decomposition by the paper's one-third rule.

use std::collections::HashMap;
use std::ops::Range;

use ferroce_drivers::sim::LinkModel;
use ferroce_drivers::Port;
use ferroce_reliability::failover::r2ccl::conn::{Localization, LocalizeIo, Progress};
use ferroce_reliability::failover::r2ccl::decompose::{self, Plan};
use ferroce_reliability::failover::r2ccl::localize::{Blame, Probes};
use ferroce_reliability::failover::r2ccl::oob::OobMsg;
use ferroce_reliability::failover::r2ccl::proximity::{backup_order, paired_layout};
use ferroce_reliability::failover::r2ccl::rollback::{Receiver, Sender};
use ferroce_stack::transport::{
    Mtu, Payload, RecvWr, SendFlags, SendWr, Sge, WcOpcode, WcStatus, WrOpcode,
};
use ferroce_testbed::{rails_n, ConnOpts, OobNet, PairCut, RailsN, Testbed};

use crate::r2ccl_side::OOB_NS;

const RAILS: usize = 2;
/// Bytes per WRITE with immediate (NCCL's slices are of this order).
const SLICE: usize = 64 * 1024;
/// Bytes per member per loop (NCCL's chunk: its buffer over its steps).
const LOOP_CHUNK: usize = 4 * SLICE;
/// Slices in flight per ring connection: a bandwidth-delay product at 100 Gbit/s.
const WINDOW: u32 = 3;
/// Slices in flight over all of a degraded node's fold (or broadcast) connections: they all
/// converge on one NIC, whose queue is one FIFO for data and ACKs alike, so a deeper fan
/// holds the other direction's ACKs back (on 4, 8 and 16 nodes, 1, 2 or 3 per connection:
/// this budget was best or near it on each).
const FAN_SLICES: u32 = 6;
/// Receives kept posted per QP (a WRITE with immediate consumes one).
const RECVS: usize = 64;
/// Give up on a run after this much virtual time.
const DEADLINE_NS: u64 = 20_000_000_000;
/// Probe completions carry this tag above the QPN.
const PROBE_TAG: u64 = 1 << 40;

/// How collectives are planned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Scheme {
    /// One ring per channel, the data split equally (NCCL's default); failed connections
    /// still move (R2CCL's hot repair), nothing else changes.
    Ring,
    /// One ring, the data split between the channels by each rail's slowest NIC.
    Balance,
    /// R2CCL-AllReduce around the slowest node whenever one lost bandwidth.
    Decompose,
    /// The paper's rule: decompose when a node lost more than a third of its bandwidth,
    /// else balance.
    R2ccl,
}

impl Scheme {
    pub fn name(self) -> &'static str {
        match self {
            Self::Ring => "ring",
            Self::Balance => "balance",
            Self::Decompose => "decompose",
            Self::R2ccl => "r2ccl",
        }
    }
}

/// A fault, from its moment on (it stays).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Fault {
    None,
    /// Host `host`'s NIC on rail `rail` dies (its link goes down).
    Nic {
        host: usize,
        rail: usize,
    },
    /// Frames between hosts `a` and `b` on rail `rail` are lost at the ToR (both ways); the
    /// carrier stays up and everything else passes.
    Link {
        a: usize,
        b: usize,
        rail: usize,
    },
    /// Rail `rail`'s ToR dies.
    Tor {
        rail: usize,
    },
    /// Host `host`'s NIC on rail `rail` runs at `left` of its rate (trained down).
    Degrade {
        host: usize,
        rail: usize,
        left: f64,
    },
}

impl Fault {
    /// The kind, in `scenario failover`'s words.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Nic { .. } => "nic",
            Self::Link { .. } => "link",
            Self::Tor { .. } => "tor",
            Self::Degrade { .. } => "degrade",
        }
    }

    /// What failed, for comparing with what was blamed.
    pub fn component(&self) -> Option<Component> {
        match *self {
            Self::None | Self::Degrade { .. } => None,
            Self::Nic { host, rail } => Some(Component::Nic(host, rail)),
            Self::Link { a, b, rail } => Some(Component::Link(a.min(b), a.max(b), rail)),
            Self::Tor { rail } => Some(Component::Tor(rail)),
        }
    }
}

/// A component of the fabric a localization can blame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Component {
    /// Host's NIC (or its cable) on a rail.
    Nic(usize, usize),
    /// The path between two hosts (lower first) on a rail.
    Link(usize, usize, usize),
    /// A rail's ToR.
    Tor(usize),
    /// The far end or the path, not told apart.
    RemoteOrLink(usize, usize, usize),
}

impl Component {
    /// `blame` from the sender `a` of a connection to `b` on `rail`.
    fn of(blame: Blame, a: usize, b: usize, rail: usize) -> Self {
        match blame {
            Blame::LocalNic => Self::Nic(a, rail),
            Blame::RemoteNic => Self::Nic(b, rail),
            Blame::Tor => Self::Tor(rail),
            Blame::Link => Self::Link(a.min(b), a.max(b), rail),
            Blame::RemoteOrLink => Self::RemoteOrLink(a.min(b), a.max(b), rail),
        }
    }

    pub fn describe(&self) -> String {
        match *self {
            Self::Nic(h, r) => format!("nic h{h} r{r}"),
            Self::Link(a, b, r) => format!("link h{a}-h{b} r{r}"),
            Self::Tor(r) => format!("tor r{r}"),
            Self::RemoteOrLink(a, b, r) => format!("remote-or-link h{a}-h{b} r{r}"),
        }
    }
}

/// One run.
#[derive(Clone, Debug)]
pub struct Setup {
    pub nodes: usize,
    /// Bytes each host reduces (a multiple of 4).
    pub bytes: usize,
    pub scheme: Scheme,
    pub fault: Fault,
    /// When the fault strikes (virtual ns from the start).
    pub fault_at: u64,
    /// AllReduces, one after another.
    pub collectives: usize,
    /// Idle time before each collective after the first (a training step's compute).
    pub compute_ns: u64,
    pub gbps: f64,
    pub delay_ns: u64,
    pub seed: u64,
}

/// One localization: who saw the error, when, and what it blamed.
#[derive(Clone, Debug)]
pub struct Localized {
    pub detected_at: u64,
    /// When the verdict came (`None`: never).
    pub decided_at: Option<u64>,
    pub blamed: Option<Component>,
}

/// What a run did.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    /// Each collective's start and end (virtual ns).
    pub spans: Vec<(u64, u64)>,
    /// Each collective's plan.
    pub plans: Vec<String>,
    /// Every host's buffer held the expected sums after every collective.
    pub verified: bool,
    /// The run stopped without finishing (a connection with nowhere to go).
    pub stuck: bool,
    pub localized: Vec<Localized>,
    /// Connections moved to a backup NIC.
    pub migrations: u64,
    /// Slices posted again after rollbacks; slices a receiver already had.
    pub resent: u64,
    pub repeats: u64,
    /// Out-of-band messages sent.
    pub oob_messages: u64,
}

impl Outcome {
    /// Virtual ns of collective `i`.
    pub fn duration(&self, i: usize) -> Option<u64> {
        self.spans.get(i).map(|&(a, b)| b - a)
    }

    /// When the last collective ended.
    pub fn end_ns(&self) -> u64 {
        self.spans.last().map_or(0, |s| s.1)
    }
}

/// A connection from one host to another for one lane (a channel's ring, a partial ring's,
/// a fold/broadcast rail), with a QP pair on every rail; it lives across collectives.
struct Conn {
    from: usize,
    to: usize,
    /// Its rail when nothing is wrong.
    pref: usize,
    /// The rail it uses now.
    rail: usize,
    /// (QPN on `from`, QPN on `to`) per rail.
    qps: [(u32, u32); RAILS],
    /// Rails whose QP pair failed.
    failed: [bool; RAILS],
    window: u32,
}

/// One WRITE with immediate of a collective.
struct Xfer {
    range: Range<usize>,
    /// Into the staging area, to be added into the buffer on arrival (else straight in).
    reduce: bool,
    /// The transfer that must have arrived at the sender before this one may go.
    dep: Option<usize>,
}

/// A connection's part in one collective: its transfers in order, both ends' rollback
/// state.
struct Edge {
    conn: usize,
    xfers: Vec<usize>,
    tx: Sender,
    rx: Receiver,
    /// Failed, being localized: nothing is posted.
    held: bool,
}

/// A localization under way (seed 003's sequence), at the sender `a` of `conn`.
struct Loc {
    conn: usize,
    rail: usize,
    a: usize,
    b: usize,
    /// The node both ends probe besides each other.
    third: usize,
    /// a's probe QPs: to b, to the third node; b's likewise.
    a_probes: [u32; 2],
    b_probes: [u32; 2],
    /// The sender's part (R2CCL's connection protocol), and the receiver's once told.
    sender: Localization,
    receiver: Option<Localization>,
    report: usize,
}

/// One end of a localization as R2CCL's connection protocol sees the run: its host's probe
/// QPs (to the other end, to the third node) and the out-of-band network.
struct LocIo<'a, 's> {
    run: &'a mut Run<'s>,
    h: usize,
    probes: [u32; 2],
    targets: [usize; 2],
}

impl LocalizeIo for LocIo<'_, '_> {
    fn start_probes(&mut self) {
        for (q, to) in self.probes.into_iter().zip(self.targets) {
            self.run.probe(self.h, q, to);
        }
    }

    fn probe_results(&self) -> Probes {
        let res = |q| self.run.probes.get(&(self.h, q)).copied().flatten();
        Probes {
            to_peer: res(self.probes[0]),
            to_third: res(self.probes[1]),
        }
    }

    fn send_oob(&mut self, msg: OobMsg) {
        self.run.send_oob(msg);
    }
}

/// What the planner knows is broken.
#[derive(Default)]
struct Health {
    dead_nic: Vec<[bool; RAILS]>,
    dead_rail: [bool; RAILS],
    dead_paths: Vec<(usize, usize, usize)>,
}

impl Health {
    fn learn(&mut self, c: Component) {
        match c {
            Component::Nic(h, r) => self.dead_nic[h][r] = true,
            Component::Tor(r) => self.dead_rail[r] = true,
            Component::Link(a, b, r) | Component::RemoteOrLink(a, b, r) => {
                self.dead_paths.push((a, b, r))
            }
        }
    }
}

struct Run<'s> {
    s: &'s Setup,
    w: Testbed,
    r: RailsN,
    o: ConnOpts,
    probe_o: ConnOpts,
    places: Vec<ferroce_reliability::failover::r2ccl::proximity::NicPlace>,
    next_qpn: u32,
    conns: Vec<Conn>,
    conn_of: HashMap<(usize, usize, usize), usize>,
    /// (host, QPN) → (connection, rail).
    qp_conn: HashMap<(usize, u32), (usize, usize)>,
    /// Probe QPNs on each host → the probe's result once it completed.
    probes: HashMap<(usize, u32), Option<bool>>,
    health: Health,
    xfers: Vec<Xfer>,
    arrived: Vec<bool>,
    edges: Vec<Edge>,
    /// conn → its edge in the running collective.
    edge_of: HashMap<usize, usize>,
    locs: Vec<Loc>,
    /// The out-of-band network.
    oob: OobNet,
    seen: Vec<usize>,
    out: Outcome,
}

/// Splits `range` into parts proportional to `weights`, each boundary on a 4 KiB multiple
/// from the start (the last part takes the remainder).
fn split(range: Range<usize>, weights: &[f64]) -> Vec<Range<usize>> {
    let total: f64 = weights.iter().sum();
    let len = range.len();
    let mut out = Vec::with_capacity(weights.len());
    let mut at = range.start;
    let mut acc = 0.0;
    for (i, &wt) in weights.iter().enumerate() {
        acc += wt;
        let end = if i + 1 == weights.len() || total <= 0.0 {
            if i + 1 == weights.len() {
                range.end
            } else {
                at
            }
        } else {
            let raw = (len as f64 * acc / total) as usize;
            (range.start + raw / 4096 * 4096).clamp(at, range.end)
        };
        out.push(at..end);
        at = end;
    }
    out
}

/// `range` in NCCL's loops: portions of `m` × [`LOOP_CHUNK`] bytes, each reduced by all
/// the ring's steps before the next starts (so one slow step paces one portion, not the
/// whole buffer).
fn loops(range: Range<usize>, m: usize) -> Vec<Range<usize>> {
    let step = m * LOOP_CHUNK;
    let mut out = Vec::new();
    let mut at = range.start;
    while at < range.end {
        let end = (at + step).min(range.end);
        out.push(at..end);
        at = end;
    }
    out
}

/// `range` in `m` chunks on 4-byte boundaries, each in slices of at most [`SLICE`].
fn chunks(range: &Range<usize>, m: usize) -> Vec<Vec<Range<usize>>> {
    let words = range.len() / 4;
    (0..m)
        .map(|c| {
            let a = range.start + words * c / m * 4;
            let b = range.start + words * (c + 1) / m * 4;
            let mut v = Vec::new();
            let mut x = a;
            while x < b {
                let y = (x + SLICE).min(b);
                v.push(x..y);
                x = y;
            }
            v
        })
        .collect()
}

impl<'s> Run<'s> {
    fn new(s: &'s Setup) -> Self {
        let mut model = LinkModel::new((s.gbps * 1e9) as u64, s.delay_ns);
        // InfiniBand's fabric is lossless (credit flow control); unbounded queues stand in.
        model.queue_limit_bytes = 0;
        let (w, r) = rails_n(s.seed, s.nodes, model, 2 * s.bytes + 4096);
        let o = ConnOpts {
            mtu: Mtu::Mtu4096,
            timeout: 6,
            ..ConnOpts::default()
        };
        let probe_o = ConnOpts {
            timeout: 3,
            retry_cnt: 1,
            ..o
        };
        Self {
            s,
            w,
            r,
            o,
            probe_o,
            places: paired_layout(RAILS),
            next_qpn: 0x100,
            conns: Vec::new(),
            conn_of: HashMap::new(),
            qp_conn: HashMap::new(),
            probes: HashMap::new(),
            health: Health {
                dead_nic: vec![[false; RAILS]; s.nodes],
                ..Health::default()
            },
            xfers: Vec::new(),
            arrived: Vec::new(),
            edges: Vec::new(),
            edge_of: HashMap::new(),
            locs: Vec::new(),
            oob: OobNet::new(OOB_NS),
            seen: vec![0; s.nodes],
            out: Outcome::default(),
        }
    }

    fn qpn(&mut self) -> u32 {
        self.next_qpn += 1;
        self.next_qpn
    }

    /// Whether the planner may put a connection from `a` to `b` on rail `r`: what the
    /// verdicts said and what both ports say (their state is theirs to see, and swapped at
    /// a re-plan).
    fn usable(&self, a: usize, b: usize, r: usize) -> bool {
        let h = &self.health;
        let (lo, hi) = (a.min(b), a.max(b));
        !h.dead_rail[r]
            && !h.dead_nic[a][r]
            && !h.dead_nic[b][r]
            && !h.dead_paths.contains(&(lo, hi, r))
            && self.rate(a, r) > 0
            && self.rate(b, r) > 0
    }

    /// Host `h`'s NIC `r` rate now, bit/s (0 when down or known dead).
    fn rate(&self, h: usize, r: usize) -> u64 {
        if self.health.dead_nic[h][r] || self.health.dead_rail[r] {
            return 0;
        }
        self.w.fabric.port_rate(self.r.hosts[h], r)
    }

    /// The rail for a connection that prefers `pref`: it, or the nearest usable backup.
    fn pick_rail(&self, c: &Conn, pref: usize) -> Option<usize> {
        let ok = |r: usize| !c.failed[r] && self.usable(c.from, c.to, r);
        if ok(pref) {
            return Some(pref);
        }
        backup_order(&self.places, pref, ok).first().copied()
    }

    /// The connection from `from` to `to` on `lane`, made (a QP pair on every rail, receives
    /// posted) the first time.
    fn conn(&mut self, from: usize, to: usize, lane: usize, window: u32) -> usize {
        if let Some(&c) = self.conn_of.get(&(from, to, lane)) {
            return c;
        }
        let id = self.conns.len();
        let mut qps = [(0, 0); RAILS];
        for (r, q) in qps.iter_mut().enumerate() {
            let (qa, qb) = (self.qpn(), self.qpn());
            self.w
                .connect_rc_on(r, ((from, qa), (to, qb)), (qa, qb), &self.o);
            for _ in 0..RECVS {
                let _ = self.w.hosts[to].qp(qb).post_recv(&RecvWr {
                    wr_id: 0,
                    sg_list: &[],
                });
            }
            self.qp_conn.insert((from, qa), (id, r));
            self.qp_conn.insert((to, qb), (id, r));
            *q = (qa, qb);
        }
        let pref = lane % RAILS;
        self.conns.push(Conn {
            from,
            to,
            pref,
            rail: pref,
            qps,
            failed: [false; RAILS],
            window,
        });
        self.conn_of.insert((from, to, lane), id);
        id
    }

    fn push_xfer(&mut self, conn: usize, x: Xfer) -> usize {
        let id = self.xfers.len();
        self.xfers.push(x);
        let e = match self.edge_of.get(&conn) {
            Some(&e) => e,
            None => {
                self.edges.push(Edge {
                    conn,
                    xfers: Vec::new(),
                    tx: Sender::new(0),
                    rx: Receiver::new(0),
                    held: false,
                });
                self.edge_of.insert(conn, self.edges.len() - 1);
                self.edges.len() - 1
            }
        };
        self.edges[e].xfers.push(id);
        id
    }

    /// A ring AllReduce over `members` (in ring order) of `range` on `lane`. `step0_deps`
    /// `[c][p]`: a transfer each first send of chunk `c`, slice `p` waits for (the fold into
    /// that member). Returns, per chunk and slice, the last reduce-scatter transfer (after
    /// which its receiver holds the chunk reduced).
    fn ring(
        &mut self,
        members: &[usize],
        range: Range<usize>,
        lane: usize,
        step0_deps: Option<&[Vec<usize>]>,
    ) -> Vec<Vec<usize>> {
        let m = members.len();
        let sl = chunks(&range, m);
        let mut last_rs: Vec<Vec<usize>> = sl.iter().map(|v| vec![0; v.len()]).collect();
        if m < 2 || range.is_empty() {
            return last_rs;
        }
        // ids[k][j][p]: member j's send at step k (of chunk (j - k) mod m).
        let mut ids: Vec<Vec<Vec<usize>>> = Vec::with_capacity(2 * (m - 1));
        for k in 0..2 * (m - 1) {
            let mut row = Vec::with_capacity(m);
            for j in 0..m {
                let c = (j + 2 * m - k) % m;
                let from = members[j];
                let to = members[(j + 1) % m];
                let conn = self.conn(from, to, lane, WINDOW);
                let mut slice_ids = Vec::with_capacity(sl[c].len());
                for (p, r) in sl[c].iter().enumerate() {
                    let dep = if k == 0 {
                        step0_deps.map(|d| d[c][p])
                    } else {
                        Some(ids[k - 1][(j + m - 1) % m][p])
                    };
                    let id = self.push_xfer(
                        conn,
                        Xfer {
                            range: r.clone(),
                            reduce: k < m - 1,
                            dep,
                        },
                    );
                    if k == m - 2 {
                        last_rs[c][p] = id;
                    }
                    slice_ids.push(id);
                }
                row.push(slice_ids);
            }
            ids.push(row);
        }
        last_rs
    }

    /// The collective's plan, from what is known now: (name, regions and lanes).
    fn plan(&mut self) -> String {
        let s = self.s;
        let n = s.nodes;
        let all: Vec<usize> = (0..n).collect();
        let nominal = s.gbps * 1e9;
        let node_share = |me: &Self, h: usize| -> f64 {
            (0..RAILS).map(|r| me.rate(h, r) as f64).sum::<f64>() / (RAILS as f64 * nominal)
        };
        let shares: Vec<f64> = (0..n).map(|h| node_share(self, h)).collect();
        let (k, &worst) = shares
            .iter()
            .enumerate()
            .min_by(|a, b| a.1.total_cmp(b.1))
            .expect("nodes");
        let others_whole = shares
            .iter()
            .enumerate()
            .all(|(h, &x)| h == k || x >= 0.999);
        let rail_min = |me: &Self, r: usize| -> f64 {
            (0..n)
                .map(|h| me.rate(h, r) as f64)
                .fold(f64::MAX, f64::min)
        };
        let balance: Vec<f64> = (0..RAILS).map(|r| rail_min(self, r)).collect();
        let lost = 1.0 - worst;
        let decomposed = match s.scheme {
            Scheme::Ring | Scheme::Balance => None,
            Scheme::Decompose if lost > 1e-3 && others_whole && n >= 3 => {
                Some(decompose::best_beta(n, worst.max(1e-3)))
            }
            Scheme::Decompose => None,
            Scheme::R2ccl => match decompose::choose(n, lost) {
                Plan::Decompose { beta } if others_whole => Some(beta),
                _ => None,
            },
        };
        let whole = 0..s.bytes;
        let Some(beta) = decomposed else {
            let weights = if s.scheme == Scheme::Ring {
                vec![1.0; RAILS]
            } else {
                balance
            };
            for (lane, part) in split(whole, &weights).into_iter().enumerate() {
                for lp in loops(part, n) {
                    self.ring(&all, lp, lane, None);
                }
            }
            return if s.scheme == Scheme::Ring {
                "ring".into()
            } else {
                format!("balance({:.2})", weights[0] / weights.iter().sum::<f64>())
            };
        };
        // R2CCL-AllReduce around k.
        let cut = ((s.bytes as f64 * beta) as usize) / 4096 * 4096;
        let k_rates: Vec<f64> = (0..RAILS).map(|r| self.rate(k, r) as f64).collect();
        for (lane, part) in split(0..cut, &k_rates).into_iter().enumerate() {
            for lp in loops(part, n) {
                self.ring(&all, lp, lane, None);
            }
        }
        let healthy: Vec<usize> = all.iter().copied().filter(|&h| h != k).collect();
        let m = healthy.len();
        let partial = cut..s.bytes;
        // k's fold and broadcast go over its NICs in proportion to their rates; the partial
        // ring's channel on the rail that also carries them gets less, so every healthy
        // NIC moves the same (per direction: 2(m-1)/m of its ring share plus 1/m of the
        // fold/broadcast share).
        let ksum: f64 = k_rates.iter().sum::<f64>().max(1.0);
        let wr: Vec<f64> = k_rates.iter().map(|&x| x / ksum).collect();
        let total = partial.len() as f64;
        let mf = m as f64;
        let x0 =
            (total / 2.0 + total * (wr[1] - wr[0]) / (4.0 * (mf - 1.0)).max(1.0)).clamp(0.0, total);
        let mut on_rail = [0.0f64; RAILS];
        let fan_window = (FAN_SLICES / m as u32).max(1);
        // The two channels' loops interleaved by progress, so k's fold (one queue per
        // member) feeds both partial rings from the start, not one after the other.
        let mut pending: Vec<(
            usize,
            std::collections::VecDeque<Range<usize>>,
            usize,
            usize,
        )> = split(partial, &[x0, total - x0])
            .into_iter()
            .enumerate()
            .map(|(ch, part)| (ch, loops(part.clone(), m).into(), 0, part.len().max(1)))
            .collect();
        let mut order = Vec::new();
        while let Some(i) = (0..pending.len())
            .filter(|&i| !pending[i].1.is_empty())
            .min_by(|&a, &b| {
                let f = |i: usize| pending[i].2 as f64 / pending[i].3 as f64;
                f(a).total_cmp(&f(b))
            })
        {
            let lp = pending[i].1.pop_front().expect("not empty");
            pending[i].2 += lp.len();
            order.push((pending[i].0, lp));
        }
        for (ch, lp) in order {
            let sl = chunks(&lp, m);
            // Fold: k sends chunk c of this part to healthy member c (who sends it first).
            let mut fold_deps: Vec<Vec<usize>> = Vec::with_capacity(m);
            let mut fold_rail: Vec<Vec<usize>> = Vec::with_capacity(m);
            for (c, slices) in sl.iter().enumerate() {
                let mut deps = Vec::with_capacity(slices.len());
                let mut rails = Vec::with_capacity(slices.len());
                for r in slices {
                    // The rail furthest below its share so far.
                    let rail = (0..RAILS)
                        .filter(|&x| k_rates[x] > 0.0)
                        .min_by(|&x, &y| {
                            (on_rail[x] / k_rates[x]).total_cmp(&(on_rail[y] / k_rates[y]))
                        })
                        .unwrap_or(0);
                    on_rail[rail] += r.len() as f64;
                    let conn = self.conn(k, healthy[c], 4 + rail, fan_window);
                    deps.push(self.push_xfer(
                        conn,
                        Xfer {
                            range: r.clone(),
                            reduce: true,
                            dep: None,
                        },
                    ));
                    rails.push(rail);
                }
                fold_deps.push(deps);
                fold_rail.push(rails);
            }
            // The partial ring (lanes 2 and 3).
            let last_rs = self.ring(&healthy, lp, 2 + ch, Some(&fold_deps));
            // Broadcast: member j holds chunk (j + 1) mod m reduced after reduce-scatter and
            // sends it to k on the rail k folded it over.
            for (c, slices) in sl.iter().enumerate() {
                let j = (c + m - 1) % m;
                for (p, r) in slices.iter().enumerate() {
                    let conn = self.conn(healthy[j], k, 4 + fold_rail[c][p], fan_window);
                    self.push_xfer(
                        conn,
                        Xfer {
                            range: r.clone(),
                            reduce: false,
                            dep: Some(last_rs[c][p]),
                        },
                    );
                }
            }
        }
        format!("decompose(h{k}, beta {beta:.2})")
    }
}

/// Host `h`'s word `i` before collective `iter`, and every host's after it.
fn word(h: usize, i: usize, iter: usize) -> u32 {
    ((h as u32) + 1).wrapping_mul((i as u32).wrapping_add(iter as u32 * 7 + 1))
}

fn expected(n: usize, i: usize, iter: usize) -> u32 {
    let sum_h = (n * (n + 1) / 2) as u32;
    sum_h.wrapping_mul((i as u32).wrapping_add(iter as u32 * 7 + 1))
}

fn words(n: usize, f: impl Fn(usize) -> u32) -> Vec<u8> {
    (0..n / 4).flat_map(|i| f(i).to_le_bytes()).collect()
}

impl<'s> Run<'s> {
    /// Fills the buffers, plans the collective and hands every connection its transfers.
    fn start_collective(&mut self, iter: usize) -> bool {
        let s = self.s;
        for h in 0..s.nodes {
            let data = words(s.bytes, |i| word(h, i, iter));
            self.w.hosts[h].write(0, &data);
        }
        self.xfers.clear();
        self.edges.clear();
        self.edge_of.clear();
        let name = self.plan();
        self.out.plans.push(name);
        self.arrived = vec![false; self.xfers.len()];
        for e in &mut self.edges {
            let n = e.xfers.len() as u32;
            e.tx = Sender::new(n);
            e.rx = Receiver::new(n);
        }
        for i in 0..self.edges.len() {
            let c = self.edges[i].conn;
            let pref = self.conns[c].pref;
            match self.pick_rail(&self.conns[c], pref) {
                Some(r) => self.conns[c].rail = r,
                None => return false,
            }
        }
        true
    }

    fn verify(&self, iter: usize) -> bool {
        let s = self.s;
        let want = words(s.bytes, |i| expected(s.nodes, i, iter));
        (0..s.nodes).all(|h| self.w.hosts[h].read(0, s.bytes) == want)
    }

    fn done(&self) -> bool {
        self.arrived.iter().all(|&a| a) && self.edges.iter().all(|e| e.tx.done())
    }

    /// Posts every transfer whose data is ready, within each connection's window.
    fn post_ready(&mut self) -> bool {
        let mut posted = false;
        for e in &mut self.edges {
            if e.held {
                continue;
            }
            let c = &self.conns[e.conn];
            let (qa, _) = c.qps[c.rail];
            let bytes = self.s.bytes;
            while e.tx.in_flight() < c.window {
                let Some(seq) = e.tx.peek() else { break };
                let x = &self.xfers[e.xfers[seq as usize]];
                if x.dep.is_some_and(|d| !self.arrived[d]) {
                    break;
                }
                let sge = [Sge {
                    addr: x.range.start as u64,
                    length: x.range.len() as u32,
                    lkey: self.w.hosts[c.from].keys.lkey,
                }];
                let dst = if x.reduce {
                    bytes + x.range.start
                } else {
                    x.range.start
                };
                let rkey = self.w.hosts[c.to].keys.rkey;
                let wr = SendWr::new(u64::from(seq), WrOpcode::WriteWithImm, Payload::Sges(&sge))
                    .remote(dst as u64, rkey)
                    .imm(seq)
                    .flags(SendFlags::SIGNALED);
                if self.w.hosts[c.from].qp(qa).post_send(&wr).is_err() {
                    break;
                }
                e.tx.next_chunk();
                posted = true;
            }
        }
        posted
    }

    /// Adds the staging copy of `range` into host `h`'s buffer.
    fn reduce(&mut self, h: usize, range: &Range<usize>) {
        let host = &mut self.w.hosts[h];
        let mut a = host.read(range.start, range.len());
        let b = host.read(self.s.bytes + range.start, range.len());
        for (x, y) in a.chunks_exact_mut(4).zip(b.chunks_exact(4)) {
            let v = u32::from_le_bytes([x[0], x[1], x[2], x[3]])
                .wrapping_add(u32::from_le_bytes([y[0], y[1], y[2], y[3]]));
            x.copy_from_slice(&v.to_le_bytes());
        }
        host.write(range.start, &a);
    }

    /// Every host's new completions: transfers arriving and completing, errors starting a
    /// localization, probes' results.
    fn completions(&mut self) -> bool {
        let mut acted = false;
        for h in 0..self.s.nodes {
            let from = self.seen[h];
            let to = self.w.hosts[h].completions.len();
            self.seen[h] = to;
            for i in from..to {
                acted = true;
                let wc = self.w.hosts[h].completions[i];
                let at = self.w.hosts[h].completed_at[i];
                let q = wc.qp_num.value();
                if wc.wr_id & PROBE_TAG != 0 {
                    if let Some(r) = self.probes.get_mut(&(h, q)) {
                        *r = Some(wc.status == WcStatus::Success);
                    }
                    continue;
                }
                let Some(&(c, rail)) = self.qp_conn.get(&(h, q)) else {
                    continue;
                };
                let Some(&e) = self.edge_of.get(&c) else {
                    continue;
                };
                if wc.opcode == WcOpcode::RecvRdmaWithImm {
                    if wc.status != WcStatus::Success {
                        continue;
                    }
                    let _ = self.w.hosts[h].qp(q).post_recv(&RecvWr {
                        wr_id: 0,
                        sg_list: &[],
                    });
                    let seq = wc.imm_data;
                    if self.edges[e].rx.on_chunk(seq) {
                        let id = self.edges[e].xfers[seq as usize];
                        if self.xfers[id].reduce {
                            let range = self.xfers[id].range.clone();
                            self.reduce(h, &range);
                        }
                        self.arrived[id] = true;
                    }
                    continue;
                }
                if rail != self.conns[c].rail {
                    continue; // the failed QP's flushed requests
                }
                if wc.status == WcStatus::Success {
                    self.edges[e].tx.on_completion(wc.wr_id as u32);
                } else if !self.edges[e].held {
                    self.edges[e].held = true;
                    self.conns[c].failed[rail] = true;
                    self.start_loc(c, rail, at);
                }
            }
        }
        acted
    }

    /// A zero-byte WRITE from host `h`'s probe QP `q` (to the host it is connected to).
    fn probe(&mut self, h: usize, q: u32, to: usize) {
        let rkey = self.w.hosts[to].keys.rkey;
        let wr = SendWr::new(
            PROBE_TAG | u64::from(q),
            WrOpcode::Write,
            Payload::Sges(&[]),
        )
        .remote(0, rkey)
        .flags(SendFlags::SIGNALED);
        let _ = self.w.hosts[h].qp(q).post_send(&wr);
    }

    /// A probe connection between `a` and `b` on `rail`: (QPN on a, QPN on b).
    fn probe_pair(&mut self, a: usize, b: usize, rail: usize) -> (u32, u32) {
        let (qa, qb) = (self.qpn(), self.qpn());
        let po = self.probe_o;
        self.w.connect_rc_on(rail, ((a, qa), (b, qb)), (1, 2), &po);
        self.probes.insert((a, qa), None);
        self.probes.insert((b, qb), None);
        (qa, qb)
    }

    fn send_oob(&mut self, msg: OobMsg) {
        self.oob.send(self.w.now(), &msg);
        self.out.oob_messages += 1;
    }

    /// Runs `f` on one end of localization `l` (the sender's, or the receiver's) with that
    /// end's IO: its probe QPs and targets, the out-of-band network.
    fn with_end<T>(
        &mut self,
        l: usize,
        receiver: bool,
        f: impl FnOnce(&mut Option<Localization>, &mut LocIo<'_, 's>) -> T,
    ) -> T {
        let loc = &self.locs[l];
        let (h, probes, targets) = if receiver {
            (loc.b, loc.b_probes, [loc.a, loc.third])
        } else {
            (loc.a, loc.a_probes, [loc.b, loc.third])
        };
        let mut end = if receiver {
            self.locs[l].receiver.take()
        } else {
            Some(self.locs[l].sender.clone())
        };
        let mut io = LocIo {
            run: self,
            h,
            probes,
            targets,
        };
        let out = f(&mut end, &mut io);
        match (receiver, end) {
            (true, end) => self.locs[l].receiver = end,
            (false, Some(a)) => self.locs[l].sender = a,
            (false, None) => {}
        }
        out
    }

    /// The sender of `conn` saw its QP on `rail` fail: tell the receiver, probe.
    fn start_loc(&mut self, c: usize, rail: usize, at: u64) {
        let (a, b) = (self.conns[c].from, self.conns[c].to);
        let third = (1..self.s.nodes)
            .map(|d| (a + d) % self.s.nodes)
            .find(|&t| t != b)
            .expect("three nodes or more");
        let (ab_a, ab_b) = self.probe_pair(a, b, rail);
        let (at_a, _) = self.probe_pair(a, third, rail);
        let (bt_b, _) = self.probe_pair(b, third, rail);
        self.out.localized.push(Localized {
            detected_at: at,
            decided_at: None,
            blamed: None,
        });
        let mut io = LocIo {
            run: self,
            h: a,
            probes: [ab_a, at_a],
            targets: [b, third],
        };
        let sender = Localization::on_error(c as u32, rail as u8, &mut io);
        self.locs.push(Loc {
            conn: c,
            rail,
            a,
            b,
            third,
            a_probes: [ab_a, at_a],
            b_probes: [ab_b, bt_b],
            sender,
            receiver: None,
            report: self.out.localized.len() - 1,
        });
    }

    /// Out-of-band messages due, and the localizations' next steps.
    fn localize(&mut self) -> bool {
        let now = self.w.now();
        let mut acted = false;
        for m in self.oob.arrived(now) {
            acted = true;
            let Some(l) = self.locs.iter().position(|l| {
                l.conn as u32 == m.conn() && self.out.localized[l.report].decided_at.is_none()
            }) else {
                continue;
            };
            match m {
                OobMsg::ConnError { conn, rail } => {
                    // The receiver learns its connection failed: it probes too.
                    self.with_end(l, true, |end, io| {
                        *end = Some(Localization::on_notice(conn, rail, io));
                    });
                }
                other => self.locs[l].sender.on_oob(&other),
            }
        }
        for l in 0..self.locs.len() {
            if self.out.localized[self.locs[l].report].decided_at.is_some() {
                continue;
            }
            acted |= self.with_end(l, true, |end, io| {
                end.as_mut()
                    .is_some_and(|b| b.poll(io) == Progress::Reported)
            });
            let decided = self.with_end(l, false, |end, io| match end.as_mut() {
                Some(a) => a.poll(io),
                None => Progress::Idle,
            });
            let Progress::Decided(blamed) = decided else {
                continue;
            };
            // The verdict, the move, the rollback.
            acted = true;
            let (a, b) = (self.locs[l].a, self.locs[l].b);
            let (c, rail) = (self.locs[l].conn, self.locs[l].rail);
            let blamed = blamed.map(|x| Component::of(x, a, b, rail));
            if let Some(x) = blamed {
                self.health.learn(x);
            }
            let report = self.locs[l].report;
            self.out.localized[report].decided_at = Some(now);
            self.out.localized[report].blamed = blamed;
            let pick = self.pick_rail(&self.conns[c], rail);
            let Some(to) = pick else {
                continue; // nowhere to go: the edge stays held
            };
            self.conns[c].rail = to;
            self.out.migrations += 1;
            if let Some(&e) = self.edge_of.get(&c) {
                let before = self.edges[e].tx.resent;
                self.edges[e].tx.rollback();
                self.out.resent += u64::from(self.edges[e].tx.resent - before);
                self.edges[e].held = false;
            }
            self.with_end(l, false, |end, io| {
                if let Some(a) = end.as_ref() {
                    a.migrated(to as u8, io);
                }
            });
        }
        acted
    }

    fn inject(&mut self) {
        let at = self.s.fault_at;
        let f = &self.w.fabric;
        match self.s.fault {
            Fault::None | Fault::Link { .. } => {}
            Fault::Nic { host, rail } => f.fail_port(self.r.hosts[host], rail, at, u64::MAX),
            Fault::Tor { rail } => f.fail_switch(self.r.tors[rail], at, u64::MAX),
            Fault::Degrade { host, rail, left } => {
                let bps = (self.s.gbps * 1e9 * left) as u64;
                f.degrade_link(self.r.links[host][rail], at, u64::MAX, bps);
            }
        }
    }
}

/// Runs `s` and says what happened.
pub fn run(s: &Setup) -> Outcome {
    let mut x = Run::new(s);
    x.inject();
    let mut hooked = !matches!(s.fault, Fault::Link { .. });
    let mut iter = 0;
    let mut started = 0;
    let mut next_start = Some(0u64);
    x.out.verified = true;
    loop {
        let now = x.w.now();
        if !hooked && now >= s.fault_at {
            if let Fault::Link { a, b, rail } = s.fault {
                let (ma, mb) = (x.w.hosts[a].port(rail).mac(), x.w.hosts[b].port(rail).mac());
                x.w.fabric.set_hook(x.r.tors[rail], PairCut(ma, mb));
            }
            hooked = true;
        }
        if next_start.is_some_and(|t| t <= now) {
            if !x.start_collective(iter) {
                x.out.stuck = true;
                break;
            }
            started = now;
            next_start = None;
        }
        let mut acted = x.post_ready();
        let sent = x.w.turn();
        acted |= x.completions();
        acted |= x.localize();
        if next_start.is_none() && x.done() {
            let end = x.w.now();
            x.out.spans.push((started, end));
            x.out.verified &= x.verify(iter);
            iter += 1;
            if iter == s.collectives {
                break;
            }
            next_start = Some(end + s.compute_ns);
            acted = true;
        }
        acted |= x.post_ready();
        if sent > 0 || acted {
            continue;
        }
        let mut horizon = DEADLINE_NS;
        for t in x.oob.next_arrival().into_iter().chain(next_start) {
            horizon = horizon.min(t.max(now + 1));
        }
        if !hooked {
            horizon = horizon.min(s.fault_at.max(now + 1));
        }
        match x.w.advance(horizon) {
            ferroce_testbed::Step::Worked | ferroce_testbed::Step::Advanced => {}
            ferroce_testbed::Step::Idle | ferroce_testbed::Step::Beyond => {
                if horizon >= DEADLINE_NS {
                    x.out.stuck = true;
                    break;
                }
                x.w.fabric.advance_to(horizon);
            }
        }
    }
    x.out.repeats = x.edges.iter().map(|e| u64::from(e.rx.repeats)).sum();
    x.out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup(nodes: usize, scheme: Scheme, fault: Fault, at: u64) -> Setup {
        Setup {
            nodes,
            bytes: 1 << 20,
            scheme,
            fault,
            fault_at: at,
            collectives: 2,
            compute_ns: 0,
            gbps: 100.0,
            delay_ns: 1_000,
            seed: 1,
        }
    }

    /// Every single fault mid-collective, under every scheme: both collectives sum right,
    /// every failed connection is localized to what failed, moved, and rolled back
    /// (slices resent, the receiver dropping what it had), with one out-of-band message
    /// each way and a move notice per localization.
    #[test]
    fn each_fault_mid_collective_is_blamed_moved_and_summed_right() {
        let healthy = run(&setup(4, Scheme::Ring, Fault::None, 0));
        let t = healthy.duration(0).expect("a span");
        let faults = [
            Fault::Nic { host: 1, rail: 0 },
            Fault::Nic { host: 3, rail: 1 },
            Fault::Link {
                a: 0,
                b: 1,
                rail: 1,
            },
            Fault::Tor { rail: 0 },
        ];
        for fault in faults {
            for scheme in [Scheme::Ring, Scheme::R2ccl] {
                let o = run(&setup(4, scheme, fault, t / 2));
                let what = format!("{fault:?} {scheme:?}: {o:?}");
                assert!(o.verified && !o.stuck, "{what}");
                assert!(!o.localized.is_empty(), "{what}");
                for l in &o.localized {
                    assert_eq!(l.blamed, fault.component(), "{what}");
                    assert!(l.decided_at.is_some(), "{what}");
                }
                let n = o.localized.len() as u64;
                assert_eq!(o.migrations, n, "{what}");
                assert_eq!(o.oob_messages, 3 * n, "error, results, move: {what}");
                assert!(o.resent > 0, "{what}");
                // A NIC on a rail: the connections into and out of it on that channel.
                if let Fault::Nic { .. } = fault {
                    assert_eq!(n, 2, "{what}");
                }
                if let Fault::Link { .. } = fault {
                    assert_eq!(n, 1, "the ring runs one way: {what}");
                }
            }
        }
    }

    /// A node whose NIC kept a quarter of its rate (37.5 % of the node lost, beyond the
    /// third): `r2ccl` decomposes, and the decomposed collective sums right and beats the
    /// plain ring, which runs at the slow NIC's pace; balance splits by the rails.
    #[test]
    fn a_degraded_node_is_decomposed_around_and_the_sum_holds() {
        let f = Fault::Degrade {
            host: 2,
            rail: 1,
            left: 0.25,
        };
        let ring = run(&setup(4, Scheme::Ring, f, 0));
        let r2 = run(&setup(4, Scheme::R2ccl, f, 0));
        let bal = run(&setup(4, Scheme::Balance, f, 0));
        for o in [&ring, &r2, &bal] {
            assert!(o.verified && !o.stuck, "{o:?}");
            assert!(o.localized.is_empty(), "nothing fails: {o:?}");
        }
        assert!(r2.plans[0].starts_with("decompose(h2"), "{:?}", r2.plans);
        assert!(bal.plans[0].starts_with("balance(0.8"), "{:?}", bal.plans);
        let (tr, t2) = (ring.duration(1).unwrap(), r2.duration(1).unwrap());
        assert!(t2 < tr, "decomposed {t2} ns, ring {tr} ns");
        // Half a NIC lost (a quarter of the node): below the third, r2ccl balances.
        let half = Fault::Degrade {
            host: 2,
            rail: 1,
            left: 0.5,
        };
        let o = run(&setup(4, Scheme::R2ccl, half, 0));
        assert!(o.verified && o.plans[1].starts_with("balance"), "{o:?}");
    }

    /// After a NIC died, the next collective is planned around it: decomposed with every
    /// share in the partial ring (beta 0), no connection on the dead NIC, nothing failing.
    #[test]
    fn the_next_collective_avoids_what_was_blamed() {
        let o = run(&Setup {
            collectives: 3,
            ..setup(5, Scheme::R2ccl, Fault::Nic { host: 4, rail: 0 }, 10_000)
        });
        assert!(o.verified && !o.stuck, "{o:?}");
        assert_eq!(o.plans[1], "decompose(h4, beta 0.00)");
        assert_eq!(o.plans[2], o.plans[1]);
        assert_eq!(o.localized.len(), 2, "only the collective it struck: {o:?}");
    }

    #[test]
    fn a_healthy_ring_sums_right_at_the_ring_bound() {
        let o = run(&setup(4, Scheme::Ring, Fault::None, 0));
        assert!(!o.stuck && o.verified, "{o:?}");
        assert_eq!(o.spans.len(), 2);
        // 2(n-1)/n · 1 MiB over 200 Gbit/s per host: 62.9 µs, plus the pipeline's fill.
        let t = o.duration(1).expect("a span");
        assert!(t > 62_900, "{t}");
        assert!(o.localized.is_empty() && o.migrations == 0);
    }
}
