//! A Varuna vQP (seed 001 §3.2, §3.4), first form: one-sided WRITEs and READs over a default
//! QP, with a backup QP on the other port to fail over to.
//!
//! Every WRITE is logged: it goes out unsignaled, followed on the same QP by an inline
//! 8-byte WRITE of its [`LogEntry`] into its slot of the peer's completion log, which carries
//! the application's id and signal (one completion per request, as the paper does). READs are
//! idempotent and not logged. On `RETRY_EXC_ERR` from the default QP the vQP moves to the
//! backup, READs the whole completion log through it, and resends only the WRITEs the log
//! shows never ran (pre-failure); those it shows ran (post-failure) complete without a
//! resend; READs go again. Later WRs go on the backup.
//!
//! Still to come (issue 23): CAS with extended status and FAA as READ + CAS on this path,
//! the shared pool of backup QPs and the lazy rebuild of a dedicated one.

use std::collections::VecDeque;

use ferroce_stack::transport::{
    Payload, PostError, QpType, SendFlags, SendWr, Sge, WcStatus, WorkCompletion, WrOpcode,
};

use super::log::{Class, RequestLog};
use crate::shift::Rail;

/// What the vQP needs from whoever owns its QPs.
pub trait VarunaIo {
    /// Posts a send WR on `rail`'s QP ([`Rail::Default`] or [`Rail::Backup`]).
    fn post_send(&mut self, rail: Rail, wr: &SendWr<'_>) -> Result<(), PostError>;
    /// Reads the requester's own registered memory at `addr` (the staging buffer the
    /// completion log was READ into).
    fn read_local(&self, addr: u64, out: &mut [u8]);
}

/// Where the logs live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VarunaConfig {
    /// Slots in the request and completion logs (requests outstanding at most).
    pub slots: usize,
    /// The peer's completion log: address and rkey (`slots` × 8 bytes, zeroed).
    pub log_addr: u64,
    /// Its rkey.
    pub log_rkey: u32,
    /// A local buffer of `slots` × 8 bytes the recovery READs the log into, and its lkey.
    pub staging_addr: u64,
    /// Its lkey.
    pub staging_lkey: u32,
}

/// What the vQP did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VarunaStats {
    /// Failovers to the backup QP.
    pub failovers: u64,
    /// WRITEs the completion log showed never ran, resent.
    pub resent_pre_failure: u64,
    /// WRITEs it showed ran: completed without a resend.
    pub recovered_post_failure: u64,
    /// READs issued again.
    pub reads_reissued: u64,
    /// Completion-log bytes written per logged request (the paper's overhead: 8).
    pub log_bytes: u64,
}

/// Work request ids the vQP keeps for itself.
pub const VARUNA_WR_IDS: u64 = 0xffff_ffff_ffff_fe00;
const RECOVER_READ: u64 = VARUNA_WR_IDS;
/// The unsignaled request itself, before its log write: its id marks it as the vQP's.
const REQUEST: u64 = VARUNA_WR_IDS + 1;

#[derive(Clone, Debug)]
struct Req {
    wr_id: u64,
    opcode: WrOpcode,
    flags: SendFlags,
    sges: Vec<Sge>,
    remote_addr: u64,
    rkey: u32,
    /// Its log id and slot (WRITEs).
    log: Option<(u64, usize, u64)>,
    /// Posted (false: held while recovering).
    posted: bool,
    /// Recovery found it executed: it completes, in its turn, without a resend.
    done: bool,
}

impl Req {
    fn success(&self) -> WorkCompletion {
        WorkCompletion {
            wr_id: self.wr_id,
            status: WcStatus::Success,
            opcode: self.opcode.wc_opcode(),
            byte_len: self.sges.iter().map(|s| s.length).sum(),
            ..empty_wc()
        }
    }
}

/// A Varuna vQP (see the module documentation).
#[derive(Debug)]
pub struct VarunaQp {
    config: VarunaConfig,
    log: RequestLog,
    next_id: u64,
    reqs: VecDeque<Req>,
    rail: Rail,
    recovering: bool,
    failed: bool,
    stats: VarunaStats,
}

impl VarunaQp {
    /// A vQP whose QPs are connected and whose peer's completion log is zeroed.
    pub fn new(config: VarunaConfig) -> Self {
        Self {
            config,
            log: RequestLog::new(config.slots),
            next_id: 1,
            reqs: VecDeque::new(),
            rail: Rail::Default,
            recovering: false,
            failed: false,
            stats: VarunaStats::default(),
        }
    }

    /// What it did so far.
    pub fn stats(&self) -> VarunaStats {
        self.stats
    }

    /// The QP it sends on now.
    pub fn rail(&self) -> Rail {
        self.rail
    }

    /// Requests posted and not yet completed.
    pub fn outstanding(&self) -> usize {
        self.reqs.len()
    }

    /// Posts a WRITE or READ (other opcodes: not yet). A WRITE needs a free log slot:
    /// `QueueFull` when every slot holds an unfinished request.
    pub fn post_send(&mut self, io: &mut impl VarunaIo, wr: &SendWr<'_>) -> Result<(), PostError> {
        if !matches!(wr.opcode, WrOpcode::Write | WrOpcode::Read) {
            return Err(PostError::UnsupportedOpcode {
                opcode: wr.opcode,
                qp_type: QpType::Rc,
            });
        }
        if wr.wr_id >= VARUNA_WR_IDS {
            return Err(PostError::Destination);
        }
        let Payload::Sges(sges) = wr.payload else {
            return Err(PostError::UnsupportedOpcode {
                opcode: wr.opcode,
                qp_type: QpType::Rc,
            });
        };
        let log = if wr.opcode == WrOpcode::Write {
            let id = self.next_id;
            let (slot, entry) = self
                .log
                .append(id)
                .ok_or(PostError::QueueFull(self.config.slots as u32))?;
            self.next_id += 1;
            Some((id, slot, entry.to_word()))
        } else {
            None
        };
        let mut r = Req {
            wr_id: wr.wr_id,
            opcode: wr.opcode,
            flags: wr.flags,
            sges: sges.to_vec(),
            remote_addr: wr.remote_addr,
            rkey: wr.rkey,
            log,
            posted: false,
            done: false,
        };
        if !self.recovering && !self.failed {
            self.send(io, &mut r)?;
        }
        self.reqs.push_back(r);
        Ok(())
    }

    /// Hands `r` to the current QP: a READ as it is (signaled), a WRITE unsignaled and then
    /// its log write with the application's id, signaled.
    fn send(&mut self, io: &mut impl VarunaIo, r: &mut Req) -> Result<(), PostError> {
        let op = SendWr::new(r.wr_id, r.opcode, Payload::Sges(&r.sges))
            .remote(r.remote_addr, r.rkey)
            .flags(SendFlags::SIGNALED);
        match r.log {
            None => io.post_send(self.rail, &op)?,
            Some((_, slot, word)) => {
                let op = SendWr {
                    wr_id: REQUEST,
                    ..op
                }
                .flags(SendFlags(0));
                io.post_send(self.rail, &op)?;
                let bytes = word.to_le_bytes();
                let log = SendWr::new(r.wr_id, WrOpcode::Write, Payload::Inline(&bytes))
                    .remote(self.config.log_addr + 8 * slot as u64, self.config.log_rkey)
                    .flags(SendFlags(SendFlags::SIGNALED.0 | SendFlags::INLINE.0));
                io.post_send(self.rail, &log)?;
                self.stats.log_bytes += 8;
            }
        }
        r.posted = true;
        Ok(())
    }

    /// A completion from `rail`'s QP; returns the application's completions.
    pub fn on_completion(
        &mut self,
        io: &mut impl VarunaIo,
        rail: Rail,
        wc: &WorkCompletion,
    ) -> Vec<WorkCompletion> {
        let mut out = Vec::new();
        if wc.status != WcStatus::Success {
            self.on_error(io, rail, wc, &mut out);
            return out;
        }
        if wc.wr_id == RECOVER_READ {
            self.recover(io, &mut out);
            return out;
        }
        if rail != self.rail {
            return out;
        }
        // RC completes in order: this request and every one before it are done.
        let Some(i) = self
            .reqs
            .iter()
            .position(|r| r.wr_id == wc.wr_id && r.posted)
        else {
            return out;
        };
        for r in self.reqs.drain(..=i) {
            if let Some((id, _, _)) = r.log {
                self.log.finish(id);
            }
            if r.done && r.flags.contains(SendFlags::SIGNALED) {
                out.push(r.success());
            } else if r.flags.contains(SendFlags::SIGNALED) && r.wr_id == wc.wr_id {
                out.push(*wc);
            }
        }
        self.complete_done_head(&mut out);
        out
    }

    /// Requests recovery found executed complete once everything before them has, so the
    /// application sees completions in posting order.
    fn complete_done_head(&mut self, out: &mut Vec<WorkCompletion>) {
        while self.reqs.front().is_some_and(|r| r.done) {
            if let Some(r) = self.reqs.pop_front() {
                if r.flags.contains(SendFlags::SIGNALED) {
                    out.push(r.success());
                }
            }
        }
    }

    fn on_error(
        &mut self,
        io: &mut impl VarunaIo,
        rail: Rail,
        wc: &WorkCompletion,
        out: &mut Vec<WorkCompletion>,
    ) {
        if rail != self.rail || self.failed {
            // Flushes of the QP just left.
            return;
        }
        if rail == Rail::Backup || wc.status != WcStatus::RetryExcErr {
            self.recovering = false;
            self.failed = true;
            let mut status = wc.status;
            for r in self.reqs.drain(..) {
                let mut c = *wc;
                c.wr_id = r.wr_id;
                c.status = status;
                c.opcode = r.opcode.wc_opcode();
                status = WcStatus::WrFlushErr;
                out.push(c);
            }
            return;
        }
        // The default path failed: read the peer's completion log through the backup.
        self.stats.failovers += 1;
        self.rail = Rail::Backup;
        self.recovering = true;
        for r in &mut self.reqs {
            r.posted = false;
        }
        let sge = [Sge {
            addr: self.config.staging_addr,
            length: 8 * self.config.slots as u32,
            lkey: self.config.staging_lkey,
        }];
        let read = SendWr::new(RECOVER_READ, WrOpcode::Read, Payload::Sges(&sge))
            .remote(self.config.log_addr, self.config.log_rkey)
            .flags(SendFlags::SIGNALED);
        if io.post_send(Rail::Backup, &read).is_err() {
            self.recovering = false;
            self.on_error(io, Rail::Backup, wc, out);
        }
    }

    /// The completion log is here: post-failure WRITEs complete, pre-failure ones and READs
    /// go again on the backup, in their order, then whatever was held.
    fn recover(&mut self, io: &mut impl VarunaIo, out: &mut Vec<WorkCompletion>) {
        let mut bytes = vec![0u8; 8 * self.config.slots];
        io.read_local(self.config.staging_addr, &mut bytes);
        let remote: Vec<u64> = bytes
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
            .collect();
        let classes = self.log.classify(&remote);
        let ran = |id: u64| {
            classes
                .iter()
                .any(|&(_, e, c)| e.id == id && c == Class::PostFailure)
        };
        self.recovering = false;
        let reqs = std::mem::take(&mut self.reqs);
        for mut r in reqs {
            match r.log {
                Some((id, _, _)) if ran(id) => {
                    self.log.finish(id);
                    self.stats.recovered_post_failure += 1;
                    r.done = true;
                    r.posted = true;
                    self.reqs.push_back(r);
                    continue;
                }
                Some(_) => self.stats.resent_pre_failure += 1,
                None => self.stats.reads_reissued += 1,
            }
            let _ = self.send(io, &mut r);
            self.reqs.push_back(r);
        }
        self.complete_done_head(out);
    }
}

fn empty_wc() -> WorkCompletion {
    WorkCompletion {
        wr_id: 0,
        status: WcStatus::Success,
        opcode: ferroce_stack::transport::WcOpcode::RdmaWrite,
        qp_num: ferroce_stack::wire::Qpn::new(0),
        byte_len: 0,
        imm_data: 0,
        wc_flags: Default::default(),
        src_qp: ferroce_stack::wire::Qpn::new(0),
        smac: ferroce_stack::wire::MacAddr([0; 6]),
        solicited: false,
    }
}

#[cfg(test)]
mod tests;
