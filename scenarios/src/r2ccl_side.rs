//! The `r2ccl` scheme of `ferroce scenario failover`: R2CCL's handling of a failed
//! connection (seed 003) for the WRITE stream. Host 0's default QP on rail 0 reports the
//! error (its retries run out); host 0 tells host 1 over the out-of-band network (the
//! bootstrap TCP connection, modelled as a fixed one-way delay), both probe — a zero-byte
//! WRITE to each other and to the third node on rail 0, on short-timeout probe QPs apart
//! from the data path — host 1 sends its results back out of band, host 0 blames a
//! component ([`triangulate`]), rolls the stream back to its first WR without a completion
//! and resends from there on its backup QP on rail 1 (the buffers are registered on every
//! NIC, so nothing is registered then). It stays on rail 1. Resending what had no
//! completion is R2CCL's rollback: right for a collective's chunks, which land on the same
//! bytes again; an atomic in the stream may run twice.

use std::collections::VecDeque;

use ferroce_reliability::failover::r2ccl::conn::{Localization, LocalizeIo, Progress};
use ferroce_reliability::failover::r2ccl::localize::{Blame, Probes};
use ferroce_reliability::failover::r2ccl::oob::OobMsg;
use ferroce_stack::transport::{
    OwnedSendWr, Payload, PostError, SendFlags, SendWr, WcStatus, WorkCompletion,
};
use ferroce_testbed::{OobNet, Testbed};

/// One-way delay of an out-of-band message (a TCP message over the management network).
pub const OOB_NS: u64 = 50_000;

/// Probe QPs on port 0: (host, QPN) ↔ (host, QPN).
pub const PROBE_PAIRS: [((usize, u32), (usize, u32)); 3] = [
    ((0, 0x40), (1, 0x41)),
    ((0, 0x42), (2, 0x43)),
    ((1, 0x44), (2, 0x45)),
];

/// Host 0's (A's) and host 1's (B's) probes, to the peer then to the third node: (host,
/// its QPN, target host).
const A_PROBES: [(usize, u32, usize); 2] = [(0, 0x40, 1), (0, 0x42, 2)];
const B_PROBES: [(usize, u32, usize); 2] = [(1, 0x41, 0), (1, 0x44, 2)];

/// One end of the localization on the testbed: its probe QPs, the out-of-band network.
struct EndIo<'a> {
    w: &'a mut Testbed,
    oob: &'a mut OobNet,
    now: u64,
    probes: [(usize, u32, usize); 2],
}

impl LocalizeIo for EndIo<'_> {
    fn start_probes(&mut self) {
        for (h, q, to) in self.probes {
            probe(self.w, h, q, to);
        }
    }

    fn probe_results(&self) -> Probes {
        let [(h, peer, _), (_, third, _)] = self.probes;
        Probes {
            to_peer: result(self.w, h, peer),
            to_third: result(self.w, h, third),
        }
    }

    fn send_oob(&mut self, msg: OobMsg) {
        self.oob.send(self.now, &msg);
    }
}

/// R2CCL's state for the stream (see the module documentation).
#[derive(Debug)]
pub struct R2ccl {
    /// The data QPs: host 0's default and backup.
    default_qp: u32,
    backup_qp: u32,
    /// WRs without a completion, oldest first.
    out: VecDeque<OwnedSendWr>,
    on_backup: bool,
    failed: bool,
    /// The out-of-band network between the two hosts.
    oob: OobNet,
    /// Host 0's and host 1's part in localizing the failure, once each has one.
    sender: Option<Localization>,
    receiver: Option<Localization>,
    /// What was blamed, and when.
    pub verdict: Option<(Option<Blame>, u64)>,
    /// WRs posted again on the backup.
    pub resent: u64,
}

impl R2ccl {
    pub fn new(default_qp: u32, backup_qp: u32) -> Self {
        Self {
            default_qp,
            backup_qp,
            out: VecDeque::new(),
            on_backup: false,
            failed: false,
            oob: OobNet::new(OOB_NS),
            sender: None,
            receiver: None,
            verdict: None,
            resent: 0,
        }
    }

    /// Whether the stream may post now (not while localizing, not once both QPs failed).
    pub fn may_post(&self) -> bool {
        !self.failed && (self.sender.is_none() || self.on_backup)
    }

    pub fn failed(&self) -> bool {
        self.failed
    }

    pub fn migrated(&self) -> bool {
        self.on_backup
    }

    /// Posts a stream WR on the QP in use.
    pub fn post(&mut self, w: &mut Testbed, wr: &SendWr<'_>) -> Result<(), PostError> {
        let q = if self.on_backup {
            self.backup_qp
        } else {
            self.default_qp
        };
        w.hosts[0].qp(q).post_send(wr)?;
        self.out.push_back(OwnedSendWr::from_wr(wr));
        Ok(())
    }

    /// A completion on host 0 (`h` 0) or host 1 (probes); returns the stream's
    /// completions.
    pub fn on_completion(
        &mut self,
        w: &mut Testbed,
        h: usize,
        wc: &WorkCompletion,
        at: u64,
    ) -> Vec<WorkCompletion> {
        let q = wc.qp_num.value();
        if h != 0 || self.failed {
            return Vec::new();
        }
        let current = if self.on_backup {
            self.backup_qp
        } else {
            self.default_qp
        };
        if q != current {
            return Vec::new();
        }
        if wc.status == WcStatus::Success {
            self.out.pop_front();
            return vec![*wc];
        }
        if !self.on_backup && wc.status == WcStatus::RetryExcErr && self.sender.is_none() {
            // The error: tell the peer, probe.
            let mut io = EndIo {
                w,
                oob: &mut self.oob,
                now: at,
                probes: A_PROBES,
            };
            self.sender = Some(Localization::on_error(self.default_qp, 0, &mut io));
            return Vec::new();
        }
        if self.on_backup {
            self.failed = true;
            return self
                .out
                .drain(..)
                .map(|o| {
                    let mut c = *wc;
                    c.wr_id = o.wr_id();
                    c
                })
                .collect();
        }
        Vec::new()
    }

    /// The next out-of-band event.
    pub fn next_timeout(&self) -> Option<u64> {
        self.oob.next_arrival()
    }

    /// Out-of-band messages due at `now`, and the localization's progress: host 1 probes
    /// when told and sends its results back once its probes are done; with them and its
    /// own, host 0 blames and migrates. True when it posted or sent something.
    pub fn poll(&mut self, w: &mut Testbed, now: u64) -> bool {
        let mut acted = false;
        let Self {
            oob,
            sender,
            receiver,
            ..
        } = self;
        for m in oob.arrived(now) {
            acted = true;
            match m {
                OobMsg::ConnError { conn, rail } if receiver.is_none() => {
                    let mut io = EndIo {
                        w,
                        oob,
                        now,
                        probes: B_PROBES,
                    };
                    *receiver = Some(Localization::on_notice(conn, rail, &mut io));
                }
                other => {
                    if let Some(a) = sender.as_mut() {
                        a.on_oob(&other);
                    }
                }
            }
        }
        if let Some(b) = receiver.as_mut() {
            let mut io = EndIo {
                w,
                oob,
                now,
                probes: B_PROBES,
            };
            acted |= b.poll(&mut io) == Progress::Reported;
        }
        let Some(a) = sender.as_mut() else {
            return acted;
        };
        let mut io = EndIo {
            w,
            oob,
            now,
            probes: A_PROBES,
        };
        let Progress::Decided(blamed) = a.poll(&mut io) else {
            return acted;
        };
        self.verdict = Some((blamed, now));
        // Rollback: from the first WR without a completion, on the backup.
        self.on_backup = true;
        for o in &self.out {
            if w.hosts[0].qp(self.backup_qp).post_send(&o.as_wr()).is_err() {
                self.failed = true;
            }
        }
        self.resent = self.out.len() as u64;
        let mut io = EndIo {
            w,
            oob: &mut self.oob,
            now,
            probes: A_PROBES,
        };
        if let Some(a) = self.sender.as_ref() {
            a.migrated(1, &mut io);
        }
        true
    }
}

/// A zero-byte WRITE from QP `qpn` of host `h` to host `to`; its id is the QPN.
fn probe(w: &mut Testbed, h: usize, qpn: u32, to: usize) {
    let rkey = w.hosts[to].keys.rkey;
    let wr = SendWr::new(
        u64::from(qpn),
        ferroce_stack::transport::WrOpcode::Write,
        Payload::Sges(&[]),
    )
    .remote(0, rkey)
    .flags(SendFlags::SIGNALED);
    let _ = w.hosts[h].qp(qpn).post_send(&wr);
}

/// Whether host `h`'s probe on QP `qpn` got through (`None`: not completed yet).
fn result(w: &Testbed, h: usize, qpn: u32) -> Option<bool> {
    w.hosts[h]
        .completions
        .iter()
        .rev()
        .find(|c| c.qp_num.value() == qpn && c.wr_id == u64::from(qpn))
        .map(|c| c.status == WcStatus::Success)
}
