//! `ferroce switch`: a two-port switch in user space, for congestion-control runs over real
//! ports where the kernel has no ECN-marking qdisc (no `red`, `codel` or `pie`, as on this
//! project's CI machine). Frames from the first port leave the second through one egress
//! queue served at `--gbps`, tail-dropped beyond `--buffer` and marked Congestion
//! Experienced RED-style (the simulated fabric's [`Red`] and [`mark_ce`], so both
//! congestion points behave alike); frames the other way pass at once. Between two
//! namespaces' veth pairs it stands where a ToR would: the sender's DCQCN hears CNPs for
//! the marks, as it would behind a real switch.

use std::collections::VecDeque;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use ferroce_drivers::afpacket::AfPacketPort;
use ferroce_drivers::sim::{mark_ce, Red};
use ferroce_drivers::Port;
use serde_json::json;

use crate::Failure;

#[derive(clap::Args)]
pub(crate) struct Args {
    /// The port frames come in on (`afpacket:IFACE`): towards the senders.
    #[arg(long)]
    from: String,
    /// The port they leave by, through the shaped queue (`afpacket:IFACE`): towards the
    /// receiver.
    #[arg(long)]
    to: String,
    /// The egress rate, Gbit/s.
    #[arg(long, default_value_t = 1.0)]
    gbps: f64,
    /// The egress buffer (suffixes KiB, MiB); beyond it, tail drop.
    #[arg(long, default_value = "1MiB", value_parser = crate::scenario::parse_size)]
    buffer: usize,
    /// No marking below this queue (suffixes KiB, MiB; default: a twentieth of the buffer).
    #[arg(long, value_parser = crate::scenario::parse_size)]
    kmin: Option<usize>,
    /// Every ECN-capable frame marked above this queue (default: half the buffer).
    #[arg(long, value_parser = crate::scenario::parse_size)]
    kmax: Option<usize>,
    /// The marking probability at Kmax (0: no marking).
    #[arg(long, default_value_t = 0.2)]
    pmax: f64,
    /// Drop each RoCEv2 data frame (not QP1's MADs) towards the receiver with this
    /// probability before it is queued: a lossy link, for recovery runs (the kernel here
    /// has no netem).
    #[arg(long, default_value_t = 0.0)]
    loss: f64,
    /// Only frames of at least this many bytes are lost (0: any): the data packets of a run,
    /// not its acknowledgements or small control messages. perftest's closing exchange has
    /// no recovery: a lost acknowledgement of its last message leaves one side resending to a
    /// QP its peer destroyed as it exited.
    #[arg(long, default_value_t = 0)]
    loss_min_len: usize,
    /// Hold the communication manager's MADs (RoCE frames to QP1) towards the receiver this
    /// many milliseconds before they are queued (they are never lost): a slower management
    /// path, so a program that connects again at once (perftest -R's data connection) finds
    /// its server listening.
    #[arg(long, default_value_t = 0.0)]
    cm_delay_ms: f64,
    /// Stop after this many seconds and print what the queue did.
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    /// Print JSON objects: what the queue has done so far, once a second and at the end (so
    /// the last line says it all even when the switch is stopped from outside).
    #[arg(long)]
    json: bool,
}

/// What became of a frame offered to the queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Offer {
    Queued,
    Marked,
    Dropped,
    Lost,
}

/// The shaped egress queue, sans-IO: frames are offered and taken out at times given.
#[derive(Debug)]
pub(crate) struct Egress {
    bits_per_s: f64,
    buffer: usize,
    red: Option<Red>,
    /// The probability a RoCEv2 frame is lost before the queue.
    loss: f64,
    /// Shorter frames are never lost.
    loss_min_len: usize,
    q: VecDeque<Vec<u8>>,
    /// Buffers of frames sent, for the next ones.
    spare: Vec<Vec<u8>>,
    bytes: usize,
    /// When the frame being serialized is done.
    busy_until: u64,
    rng: u64,
    pub(crate) stats: EgressStats,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct EgressStats {
    pub(crate) forwarded: u64,
    pub(crate) dropped: u64,
    pub(crate) marked: u64,
    pub(crate) max_bytes: usize,
    /// RoCEv2 frames the lossy link took.
    pub(crate) lost: u64,
}

impl Egress {
    pub(crate) fn new(bits_per_s: f64, buffer: usize, red: Option<Red>, seed: u64) -> Self {
        Self {
            bits_per_s,
            buffer,
            red,
            loss: 0.0,
            loss_min_len: 0,
            q: VecDeque::new(),
            spare: Vec::new(),
            bytes: 0,
            busy_until: 0,
            rng: seed | 1,
            stats: EgressStats::default(),
        }
    }

    fn uniform(&mut self) -> f64 {
        // xorshift64*: a marking decision needs no better.
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        (self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Makes the link lose each RoCEv2 frame of at least `min_len` bytes with probability
    /// `p` before the queue.
    pub(crate) fn set_loss(&mut self, p: f64, min_len: usize) {
        self.loss = p;
        self.loss_min_len = min_len;
    }

    /// Queues `frame` (marking it as the queue ahead of it says), or drops it (a lossy
    /// link's loss, a full buffer).
    pub(crate) fn offer(&mut self, frame: &[u8]) -> Offer {
        let data =
            frame.len() >= self.loss_min_len && roce_flow(frame).is_some_and(|(_, qpn)| qpn != 1);
        if self.loss > 0.0 && data && self.uniform() < self.loss {
            self.stats.lost += 1;
            return Offer::Lost;
        }
        if self.bytes + frame.len() > self.buffer {
            self.stats.dropped += 1;
            return Offer::Dropped;
        }
        // A buffer a frame already left in, if there is one: no allocation per frame.
        let mut f = self.spare.pop().unwrap_or_default();
        f.clear();
        f.extend_from_slice(frame);
        let p = self.red.map_or(0.0, |r| r.probability(self.bytes));
        let marked = p > 0.0 && self.uniform() < p && mark_ce(&mut f);
        self.bytes += f.len();
        self.stats.max_bytes = self.stats.max_bytes.max(self.bytes);
        self.q.push_back(f);
        if marked {
            self.stats.marked += 1;
            Offer::Marked
        } else {
            Offer::Queued
        }
    }

    /// The next frame whose turn on the wire has come by `now` (ns).
    pub(crate) fn take(&mut self, now: u64) -> Option<Vec<u8>> {
        if now < self.busy_until {
            return None;
        }
        let f = self.q.pop_front()?;
        self.bytes -= f.len();
        let wire = ((f.len() as f64 * 8.0 * 1e9) / self.bits_per_s) as u64;
        // It starts now: an idle wire banks no time (a burst after a pause still leaves at
        // the rate); polling late only ever costs rate.
        self.busy_until = now + wire;
        self.stats.forwarded += 1;
        Some(f)
    }

    /// Gives back the buffer of a frame [`take`](Self::take) returned, once sent.
    pub(crate) fn recycle(&mut self, buf: Vec<u8>) {
        if self.spare.len() < 4096 {
            self.spare.push(buf);
        }
    }

    /// A frame taken that could not be sent after all: a drop, not a forward.
    pub(crate) fn lost(&mut self) {
        self.stats.forwarded -= 1;
        self.stats.dropped += 1;
    }

    pub(crate) fn queued_bytes(&self) -> usize {
        self.bytes
    }
}

/// A RoCEv2 frame's (over IPv4: UDP destination 4791) UDP source port — the path a
/// sprayed packet takes through an ECMP fabric — and destination QP; `None` for any other
/// frame.
fn roce_flow(f: &[u8]) -> Option<(u16, u32)> {
    if f.get(12..14)? != [0x08, 0x00] || f.get(23)? != &17 {
        return None;
    }
    let udp = 14 + usize::from(f.get(14)? & 0x0f) * 4;
    let port = |at: usize| f.get(at..at + 2).map(|b| u16::from_be_bytes([b[0], b[1]]));
    if port(udp + 2)? != 4791 {
        return None;
    }
    // The BTH after the 8-byte UDP header: the destination QP in its bytes 5..8.
    let q = f.get(udp + 8 + 5..udp + 8 + 8)?;
    Some((port(udp)?, u32::from_be_bytes([0, q[0], q[1], q[2]])))
}

/// The UDP source ports the RoCE frames to each destination QP came from: how many paths
/// its sender sprays over.
#[derive(Default)]
struct Paths(std::collections::HashMap<u32, std::collections::BTreeSet<u16>>);

impl Paths {
    fn see(&mut self, f: &[u8]) {
        // QP1's MADs come from whichever port each sender's CM picks: not a path count.
        if let Some((sport, qpn)) = roce_flow(f).filter(|x| x.1 != 1) {
            if self.0.len() < 1024 {
                let ports = self.0.entry(qpn).or_default();
                if ports.len() < 256 {
                    ports.insert(sport);
                }
            }
        }
    }

    /// The most source ports any destination QP saw.
    fn most(&self) -> usize {
        self.0.values().map(|s| s.len()).max().unwrap_or(0)
    }
}

fn open(dev: &str) -> Result<AfPacketPort, Failure> {
    let Some(ifname) = dev.strip_prefix("afpacket:") else {
        return Err(Failure(format!(
            "'{dev}' is not a port the switch can use; give afpacket:IFACE"
        )));
    };
    AfPacketPort::open(ifname).map_err(|e| Failure(format!("cannot open {ifname}: {e} (root?)")))
}

pub(crate) fn run(a: &Args) -> Result<ExitCode, Failure> {
    let positive = |x: f64| x.is_finite() && x > 0.0;
    let valid = positive(a.gbps)
        && a.buffer != 0
        && (0.0..=1.0).contains(&a.pmax)
        && (0.0..1.0).contains(&a.loss)
        && (a.cm_delay_ms == 0.0 || positive(a.cm_delay_ms))
        && positive(a.duration);
    if !valid {
        return Err(Failure(
            "--gbps, --buffer and --duration must be above zero, --pmax within 0..1, --loss within 0..1 (below 1), --cm-delay-ms 0 or more".into(),
        ));
    }
    let red = (a.pmax > 0.0).then(|| Red {
        kmin_bytes: a.kmin.unwrap_or(a.buffer / 20),
        kmax_bytes: a.kmax.unwrap_or(a.buffer / 2),
        pmax: a.pmax,
    });
    let (mut from, mut to) = (open(&a.from)?, open(&a.to)?);
    let mut egress = Egress::new(a.gbps * 1e9, a.buffer, red, 0x5eed);
    egress.set_loss(a.loss, a.loss_min_len);
    let mut back = 0u64;
    let mut paths = Paths::default();
    let cm_delay = (a.cm_delay_ms * 1e6) as u64;
    let mut held: VecDeque<(u64, Vec<u8>)> = VecDeque::new();
    let mut hist = Histogram(vec![0; (a.buffer >> 10) + 2]);
    let epoch = Instant::now();
    let end = Duration::from_secs_f64(a.duration);
    let (mut next_sample, mut next_report) = (0u64, 1_000_000_000u64);
    while epoch.elapsed() < end {
        let now = epoch.elapsed().as_nanos() as u64;
        from.rx_burst(64, |f| {
            paths.see(f);
            if cm_delay > 0 && roce_flow(f).is_some_and(|(_, qpn)| qpn == 1) {
                held.push_back((now + cm_delay, f.to_vec()));
            } else {
                egress.offer(f);
            }
        });
        while held.front().is_some_and(|h| h.0 <= now) {
            if let Some((_, f)) = held.pop_front() {
                egress.offer(&f);
            }
        }
        while let Some(f) = egress.take(now) {
            // A full transmit ring: send what is queued and try once more.
            let sent = to.tx(f.len(), |b| b.copy_from_slice(&f)).is_ok() || {
                to.flush();
                to.tx(f.len(), |b| b.copy_from_slice(&f)).is_ok()
            };
            if !sent {
                egress.lost();
            }
            egress.recycle(f);
        }
        to.rx_burst(64, |f| {
            // ACKs, NAKs, CNPs and the connection's TCP go back unshaped.
            if from.tx(f.len(), |b| b.copy_from_slice(f)).is_ok() {
                back += 1;
            }
        });
        to.flush();
        from.flush();
        if now >= next_sample {
            hist.add(egress.queued_bytes());
            next_sample = now + 10_000;
        }
        if a.json && now >= next_report {
            report(true, &egress.stats, &hist, back, paths.most());
            next_report = now + 1_000_000_000;
        }
    }
    report(a.json, &egress.stats, &hist, back, paths.most());
    Ok(ExitCode::SUCCESS)
}

/// Queue samples in 1 KiB buckets: percentiles without keeping (or sorting) every sample
/// in the forwarding loop.
struct Histogram(Vec<u64>);

impl Histogram {
    fn add(&mut self, bytes: usize) {
        let i = (bytes >> 10).min(self.0.len() - 1);
        self.0[i] += 1;
    }

    /// The lower edge of the bucket holding the `p` quantile, bytes.
    fn quantile(&self, p: f64) -> usize {
        let n: u64 = self.0.iter().sum();
        let want = (n as f64 * p).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (i, &c) in self.0.iter().enumerate() {
            seen += c;
            if seen >= want {
                return i << 10;
            }
        }
        0
    }
}

/// Prints what the queue did so far (its percentiles over every sample yet, rounded down to
/// 1 KiB).
fn report(json: bool, s: &EgressStats, h: &Histogram, back: u64, ports: usize) {
    let pct = |p: f64| h.quantile(p);
    if json {
        println!(
            "{}",
            json!({
                "forwarded": s.forwarded, "dropped": s.dropped, "marked": s.marked,
                "lost": s.lost, "roce_paths_per_qp": ports, "returned": back, "queue_p50_bytes": pct(0.5), "queue_p99_bytes": pct(0.99),
                "queue_max_bytes": s.max_bytes,
            })
        );
    } else {
        println!(
            "forwarded {} dropped {} marked {} lost {} returned {}; up to {} UDP source ports per destination QP; queue p50 {} B p99 {} B max {} B",
            s.forwarded,
            s.dropped,
            s.marked,
            s.lost,
            back,
            ports,
            pct(0.5),
            pct(0.99),
            s.max_bytes
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An IPv4/UDP frame with the given ECN bits, as a RoCEv2 packet starts.
    fn frame(ecn: u8, len: usize) -> Vec<u8> {
        let mut f = vec![0u8; len];
        f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
        f[14] = 0x45;
        f[15] = ecn;
        f[23] = 17;
        f
    }

    #[test]
    fn the_queue_serves_at_its_rate_drops_beyond_its_buffer_and_marks_above_kmax() {
        // 8 Gbit/s: a 1000-byte frame takes 1 µs. Marks certain above 2000 bytes.
        let red = Red {
            kmin_bytes: 1000,
            kmax_bytes: 2000,
            pmax: 0.0,
        };
        let mut q = Egress::new(8e9, 4000, Some(red), 7);
        let offers: Vec<Offer> = (0..5).map(|_| q.offer(&frame(0b10, 1000))).collect();
        use Offer::*;
        assert_eq!(offers, [Queued, Queued, Queued, Marked, Dropped]);
        assert_eq!(q.queued_bytes(), 4000);
        let first = q.take(0).unwrap();
        assert_eq!(first[15] & 3, 0b10, "not marked");
        assert_eq!(q.take(500), None, "the first is still on the wire");
        assert!(q.take(1000).is_some());
        assert!(q.take(2000).is_some());
        let fourth = q.take(3000).unwrap();
        assert_eq!(fourth[15] & 3, 0b11, "marked CE");
        assert_eq!(q.take(10_000), None);
        assert_eq!(
            q.stats,
            EgressStats {
                forwarded: 4,
                dropped: 1,
                marked: 1,
                max_bytes: 4000,
                lost: 0,
            }
        );
        // Not-ECT is never marked, however long the queue.
        let mut q = Egress::new(8e9, 10_000, Some(red), 7);
        for _ in 0..9 {
            assert_ne!(q.offer(&frame(0, 1000)), Offer::Marked);
        }
        assert_eq!(q.stats.marked, 0);
    }

    /// A RoCEv2 frame (UDP to 4791 from `sport`) of `len` bytes.
    fn roce(sport: u16, len: usize) -> Vec<u8> {
        let mut f = frame(0b10, len);
        f[34..36].copy_from_slice(&sport.to_be_bytes());
        f[36..38].copy_from_slice(&4791u16.to_be_bytes());
        f
    }

    #[test]
    fn a_lossy_link_loses_about_its_share_of_roce_frames_and_nothing_else() {
        assert_eq!(roce_flow(&roce(0xc001, 100)), Some((0xc001, 0)));
        assert_eq!(roce_flow(&frame(0, 100)), None, "UDP, not to 4791");
        assert_eq!(roce_flow(&[0u8; 20]), None, "too short");
        let mut q = Egress::new(1e12, 1 << 30, None, 9);
        q.set_loss(0.1, 0);
        for i in 0..10_000 {
            q.offer(&roce(i as u16, 100));
            q.offer(&frame(0, 100));
        }
        assert!((800..1200).contains(&q.stats.lost), "{}", q.stats.lost);
        assert_eq!(q.queued_bytes(), (20_000 - q.stats.lost as usize) * 100);
        // QP1's MADs (the destination QP in the BTH's bytes 5..8) are never lost.
        let mut mad = roce(1, 100);
        mad[49] = 1;
        let before = q.stats.lost;
        for _ in 0..1000 {
            q.offer(&mad);
        }
        assert_eq!(q.stats.lost, before);
        // With a least length, shorter RoCE frames (acknowledgements) are never lost, and
        // longer ones still are.
        q.set_loss(0.1, 200);
        let before = q.stats.lost;
        for i in 0..1000 {
            q.offer(&roce(i as u16, 100));
        }
        assert_eq!(q.stats.lost, before);
        for i in 0..1000 {
            q.offer(&roce(i as u16, 300));
        }
        assert!(q.stats.lost > before + 50, "{}", q.stats.lost - before);
    }

    #[test]
    fn an_idle_queue_does_not_bank_time() {
        let mut q = Egress::new(8e9, 100_000, None, 1);
        for _ in 0..3 {
            q.offer(&frame(0b10, 1000));
        }
        // Idle until 1 ms: the first leaves then, the next a frame time later, not at once.
        assert!(q.take(1_000_000).is_some());
        assert_eq!(q.take(1_000_000), None);
        assert!(q.take(1_001_000).is_some());
    }
}
