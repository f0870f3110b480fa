//! A Varuna vQP (seed 001 §3.2–3.4), first form: one-sided WRITEs, READs and compare-and-swaps
//! over a default QP, with a backup QP on the other port to fail over to.
//!
//! Every WRITE is logged: it goes out unsignaled, followed on the same QP by an inline
//! 8-byte WRITE of its [`LogEntry`] into its slot of the peer's completion log, which carries
//! the application's id and signal (one completion per request, as the paper does). READs are
//! idempotent and not logged. On `RETRY_EXC_ERR` from the default QP the vQP moves to the
//! backup, READs the whole completion log through it, and resends only the WRITEs the log
//! shows never ran (pre-failure); those it shows ran (post-failure) complete without a
//! resend; READs go again. Later WRs go on the backup.
//!
//! A CAS runs with extended status ([`super::uid`]) when the vQP has a CAS buffer at the
//! peer: the real swap value and the log entry are written into the request's buffer slot,
//! the CAS swaps in the slot's UID, and the log write follows; when the CAS is seen to have
//! won (its result equals `compare`), a second CAS *confirms* it (UID → value) before any
//! later request. After a failure, every CAS recovery cannot settle from the log alone is
//! settled by READing its target: the UID there means it won (the application's result is
//! `compare`; the confirm goes out), logged without it means it lost (the result is the value
//! read), neither means it never ran (resent).
//!
//! A FETCH_ADD runs as the paper does it, READ + CAS: a READ of the target gives `v`, then
//! an extended-status CAS(`v` → `v + add`) — retried with the value a lost CAS returns — and
//! the application's result is the `v` of the CAS that won. Later requests are held while an
//! FAA is in progress (they would otherwise overtake it). Only the CAS is logged, so recovery
//! treats an FAA in its READ stage as a READ (issued again) and one in its CAS stage as a CAS
//! (won: done, result `v`; lost: the next attempt from the value READ; not executed: sent
//! again).
//!
//! Other requesters' UIDs: a word others CAS may hold one of their UIDs (occupied, not yet
//! confirmed — or never, if that requester died). Taken as a number it would corrupt the
//! word (an FAA would add to an address). With [`VarunaConfig::uids`] naming the region of
//! everyone's CAS buffers, an FAA that reads (or loses to) such a UID **resolves** it, as
//! the paper's extended status allows: it READs the value in the UID's slot, WRITEs the UID
//! into the slot's second word (a mark: "this CAS won, and was resolved"), then CASes the UID
//! for the value in the owner's stead — the owner's own confirm, done by someone else; the
//! mark lands first (one QP, in order). Then it goes on from the value. The owner's recovery
//! reads its slot's mark along with the target, so a CAS resolved by another still counts as
//! won. A plain CAS that loses to a foreign UID returns the word as it was (a UID), as
//! hardware returns whatever the word holds; a plain READ is not resolved.
//!
//! Which QP "the backup" is belongs to the caller: a dedicated one, or a shared channel of
//! a [`super::pool::BackupPool`] until the vQP's own is rebuilt.

use std::collections::VecDeque;

use ferroce_stack::transport::{
    Payload, PostError, QpType, SendFlags, SendWr, Sge, WcStatus, WorkCompletion, WrOpcode,
};

use super::log::{Class, RequestLog};
use super::uid::{cas_outcome, CasBuffer, CasOutcome, Uid, UidRegion, SLOT_BYTES};
use crate::failover::shift::Rail;

/// What the vQP needs from whoever owns its QPs.
pub trait VarunaIo {
    /// Posts a send WR on `rail`'s QP ([`Rail::Default`] or [`Rail::Backup`]).
    fn post_send(&mut self, rail: Rail, wr: &SendWr<'_>) -> Result<(), PostError>;
    /// Reads the requester's own registered memory at `addr` (the staging buffer the
    /// completion log was READ into, a CAS's result).
    fn read_local(&self, addr: u64, out: &mut [u8]);
    /// Writes the requester's own registered memory (a recovered CAS's result).
    fn write_local(&mut self, addr: u64, data: &[u8]);
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
    /// A local buffer of `3 × slots + 1` 8-byte words the recovery READs the log, the CAS
    /// targets and their slots' marks into (and confirms return into), and its lkey.
    pub staging_addr: u64,
    /// Its lkey.
    pub staging_lkey: u32,
    /// The requester's CAS buffer at the peer and its rkey (CAS needs one).
    pub cas: Option<(CasBuffer, u32)>,
    /// The region of every requester's CAS buffer at the peer, when others CAS the words
    /// this vQP's FETCH_ADDs target: their UIDs are resolved (see the module documentation).
    pub uids: Option<UidRegion>,
}

ferroce_stack::counter_set! {
    /// What the vQP did.
    pub struct VarunaStats {
        /// Failovers to the backup QP.
        failovers,
        /// WRITEs the completion log showed never ran, resent.
        resent_pre_failure,
        /// WRITEs it showed ran: completed without a resend.
        recovered_post_failure,
        /// READs issued again.
        reads_reissued,
        /// Completion-log bytes written (8 per logged request; 16 more per CAS into its buffer).
        log_bytes,
        /// CASes recovery found had won (confirmed, result `compare`), lost, or never run.
        cas_won,
        /// Lost.
        cas_lost,
        /// Never ran (resent).
        cas_resent,
        /// Moves back to a rebuilt QP ([`VarunaQp::switch_to`]).
        switchbacks,
        /// Other requesters' UIDs an FAA found and resolved.
        uids_resolved,
        /// CASes recovery found won through another requester's resolution (the slot's mark).
        cas_won_resolved,
    }
}

/// Work request ids the vQP keeps for itself.
pub const VARUNA_WR_IDS: u64 = 0xffff_ffff_ffff_fe00;
const RECOVER_READ: u64 = VARUNA_WR_IDS;
/// The unsignaled request itself, before its log write: its id marks it as the vQP's.
const REQUEST: u64 = VARUNA_WR_IDS + 1;
const CONFIRM: u64 = VARUNA_WR_IDS + 2;
/// READs of CAS targets during recovery: this plus the request's index.
const TARGET_READ: u64 = VARUNA_WR_IDS + 0x80;
/// READs of their slots' marks: this plus the request's index.
const MARK_READ: u64 = VARUNA_WR_IDS + 0x100;

/// An FAA resolving another requester's UID it found in its target.
#[derive(Clone, Copy, Debug)]
struct Resolve {
    /// The UID as it sits in the target.
    word: u64,
    /// Its slot (the value, then the mark).
    slot_addr: u64,
    /// The value READ from the slot (`None`: the READ is out; `Some`: the CAS is).
    value: Option<u64>,
}

/// A CAS's extended status.
#[derive(Clone, Copy, Debug)]
struct Cas {
    compare: u64,
    swap: u64,
    uid: Uid,
    /// Its slot in the CAS buffer.
    slot: u32,
}

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
    /// Ever handed to a QP (a request held from the start never reached the peer).
    sent: bool,
    /// Recovery found it executed: it completes, in its turn, without a resend.
    done: bool,
    /// A CAS with extended status (an FAA's current attempt).
    cas: Option<Cas>,
    /// A FETCH_ADD, run as READ + CAS: what it adds.
    faa: Option<u64>,
    /// An FAA resolving a foreign UID.
    resolve: Option<Resolve>,
}

impl Req {
    fn success(&self) -> WorkCompletion {
        WorkCompletion::of_request(
            self.wr_id,
            WcStatus::Success,
            self.opcode.wc_opcode(),
            self.sges.iter().map(|s| s.length).sum(),
        )
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
    /// CAS-buffer slots: the next to use, and each one's use count.
    cas_next: u32,
    cas_uses: Vec<u8>,
    /// Recovery, second stage: the log's verdicts and the CAS target READs still out.
    verdicts: Option<Vec<(u64, Class)>>,
    targets_out: usize,
    /// Confirms posted and not yet completed: the target, its rkey, the CAS. A failure can
    /// take one with it after its CAS completed — the UID would stay in the target for good
    /// — so recovery posts them again (a confirm is idempotent: once it ran, the UID it
    /// compares against is gone from the target).
    confirms: VecDeque<(u64, u32, Cas)>,
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
            cas_next: 0,
            cas_uses: vec![0; config.cas.map_or(0, |(b, _)| b.slots as usize)],
            verdicts: None,
            targets_out: 0,
            confirms: VecDeque::new(),
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

    /// Both QPs failed: every request ended with an error.
    pub fn failed(&self) -> bool {
        self.failed
    }

    /// Moves to `rail`'s QP — back to the default one once the caller rebuilt it on the
    /// repaired link (the paper: Varuna rebuilds RCQPs there and migrates later traffic
    /// back). Only when quiescent, so completions stay in posting order: false otherwise,
    /// or after a failure.
    pub fn switch_to(&mut self, rail: Rail) -> bool {
        if !self.quiescent() || self.failed || rail == Rail::Control {
            return false;
        }
        if self.rail != rail {
            self.rail = rail;
            self.stats.switchbacks += 1;
        }
        true
    }

    /// Nothing in flight on its QP: no request, no confirm, no recovery — it may change the
    /// QP it posts on (see [`super::pool`]).
    pub fn quiescent(&self) -> bool {
        self.reqs.is_empty() && self.confirms.is_empty() && !self.recovering
    }

    /// Posts a WRITE, READ, CAS or FETCH_ADD (the atomics need the vQP's CAS buffer; other
    /// opcodes: not yet). A WRITE or atomic needs a free log slot: `QueueFull` when every slot
    /// holds an unfinished request.
    pub fn post_send(&mut self, io: &mut impl VarunaIo, wr: &SendWr<'_>) -> Result<(), PostError> {
        let cas_ok =
            matches!(wr.opcode, WrOpcode::CmpSwp | WrOpcode::FetchAdd) && self.config.cas.is_some();
        if !matches!(wr.opcode, WrOpcode::Write | WrOpcode::Read) && !cas_ok {
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
        let log = if wr.opcode != WrOpcode::Read {
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
            sent: false,
            done: false,
            cas: None,
            faa: (wr.opcode == WrOpcode::FetchAdd).then_some(wr.compare_add),
            resolve: None,
        };
        if cas_ok && wr.opcode == WrOpcode::CmpSwp {
            let (buffer, _) = self.config.cas.expect("checked");
            let slot = self.cas_next;
            self.cas_next = (slot + 1) % buffer.slots;
            let uses = &mut self.cas_uses[slot as usize];
            *uses = uses.wrapping_add(1) & 7;
            r.cas = Some(Cas {
                compare: wr.compare_add,
                swap: wr.swap,
                uid: buffer.uid(slot, *uses),
                slot,
            });
        }
        if !self.recovering && !self.failed && !self.holding() {
            self.send(io, &mut r)?;
        }
        self.reqs.push_back(r);
        Ok(())
    }

    /// Whether an FAA in progress holds what comes after it.
    fn holding(&self) -> bool {
        self.reqs.iter().any(|r| r.faa.is_some() && !r.done)
    }

    /// A new CAS attempt for FAA `r` from the target value `v`: its own log entry and
    /// CAS-buffer slot use (a stale UID of an earlier attempt never reads as this one's).
    fn faa_attempt(&mut self, r: &mut Req, v: u64) {
        let (Some(add), Some((buffer, _))) = (r.faa, self.config.cas) else {
            return;
        };
        if let Some((id, _, _)) = r.log.take() {
            self.log.finish(id);
        }
        let id = self.next_id;
        // The entry just finished frees a slot, so this finds one.
        if let Some((slot, entry)) = self.log.append(id) {
            self.next_id += 1;
            r.log = Some((id, slot, entry.to_word()));
        }
        let slot = self.cas_next;
        self.cas_next = (slot + 1) % buffer.slots;
        let uses = &mut self.cas_uses[slot as usize];
        *uses = uses.wrapping_add(1) & 7;
        r.cas = Some(Cas {
            compare: v,
            swap: v.wrapping_add(add),
            uid: buffer.uid(slot, *uses),
            slot,
        });
    }

    /// An FAA at the head of the queue finished a stage: its READ (the CAS goes next), or a
    /// CAS attempt (won: done, and what it held goes; lost: again from the value returned).
    fn faa_step(&mut self, io: &mut impl VarunaIo, out: &mut Vec<WorkCompletion>) {
        let Some(mut r) = self.reqs.pop_front() else {
            return;
        };
        let mut v = [0u8; 8];
        if let Some(s) = r.sges.first() {
            io.read_local(s.addr, &mut v);
        }
        let x = u64::from_le_bytes(v);
        if let Some(mut res) = r.resolve {
            match res.value {
                // The slot's value: now the CAS of the UID for it.
                None => {
                    res.value = Some(x);
                    r.resolve = Some(res);
                }
                // Resolved by this CAS (it returned the UID) or by someone else: go on from
                // the value the word holds now.
                Some(value) => {
                    r.resolve = None;
                    self.next_attempt(&mut r, if x == res.word { value } else { x });
                }
            }
            let _ = self.send(io, &mut r);
            self.reqs.push_front(r);
            return;
        }
        match r.cas {
            Some(c) if c.compare == x => {
                self.confirm(io, &r, c);
                if let Some((id, _, _)) = r.log {
                    self.log.finish(id);
                }
                r.done = true;
                self.reqs.push_front(r);
                self.complete_done_head(out);
                self.release(io);
            }
            _ => {
                self.next_attempt(&mut r, x);
                let _ = self.send(io, &mut r);
                self.reqs.push_front(r);
            }
        }
    }

    /// FAA `r` goes on from the word `v`: a CAS attempt from it, or first the resolution of
    /// the foreign UID it is.
    fn next_attempt(&mut self, r: &mut Req, v: u64) {
        let Some(u) = self.config.uids.and_then(|region| region.names(v)) else {
            self.faa_attempt(r, v);
            return;
        };
        // The attempt that found it is over.
        if let Some((id, _, _)) = r.log.take() {
            self.log.finish(id);
        }
        r.cas = None;
        r.resolve = Some(Resolve {
            word: v,
            slot_addr: u.slot_addr,
            value: None,
        });
        self.stats.uids_resolved += 1;
    }

    /// Sends what an FAA held, in order, up to and including the next FAA.
    fn release(&mut self, io: &mut impl VarunaIo) {
        if self.recovering || self.failed {
            return;
        }
        let mut reqs = std::mem::take(&mut self.reqs);
        for r in reqs.iter_mut().filter(|r| !r.posted && !r.done) {
            let _ = self.send(io, r);
            if r.faa.is_some() {
                break;
            }
        }
        self.reqs = reqs;
    }

    /// Hands `r` to the current QP: a READ as it is (signaled), a WRITE unsignaled and then
    /// its log write with the application's id, signaled.
    fn send(&mut self, io: &mut impl VarunaIo, r: &mut Req) -> Result<(), PostError> {
        if let (Some(res), Some(region)) = (r.resolve, self.config.uids) {
            self.send_resolve(io, r, res, region)?;
            r.posted = true;
            r.sent = true;
            return Ok(());
        }
        // An FAA goes as its READ, then as its CAS attempts.
        let opcode = match (r.faa, r.cas) {
            (None, _) => r.opcode,
            (Some(_), None) => WrOpcode::Read,
            (Some(_), Some(_)) => WrOpcode::CmpSwp,
        };
        let op = SendWr::new(r.wr_id, opcode, Payload::Sges(&r.sges))
            .remote(r.remote_addr, r.rkey)
            .flags(SendFlags::SIGNALED);
        let log = if opcode == WrOpcode::Read {
            None
        } else {
            r.log
        };
        match log {
            None => io.post_send(self.rail, &op)?,
            Some((_, slot, word)) => {
                if let (Some(c), Some((buffer, rkey))) = (r.cas, self.config.cas) {
                    // Occupy: the real value and the entry into the slot, then the UID in.
                    let mut b = [0u8; 16];
                    b[..8].copy_from_slice(&c.swap.to_le_bytes());
                    b[8..].copy_from_slice(&word.to_le_bytes());
                    let at = buffer.base + u64::from(c.slot) * SLOT_BYTES;
                    let status = SendWr::new(REQUEST, WrOpcode::Write, Payload::Inline(&b))
                        .remote(at, rkey)
                        .flags(SendFlags::INLINE);
                    io.post_send(self.rail, &status)?;
                    self.stats.log_bytes += 16;
                }
                let mut op = SendWr {
                    wr_id: REQUEST,
                    ..op
                }
                .flags(SendFlags(0));
                if let Some(c) = r.cas {
                    op.compare_add = c.compare;
                    op.swap = c.uid.to_word();
                }
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
        r.sent = true;
        Ok(())
    }

    /// A resolution's stage: READ the UID's slot value (into the FAA's result word), or mark
    /// the slot and CAS the UID for the value (returning into the same word).
    fn send_resolve(
        &mut self,
        io: &mut impl VarunaIo,
        r: &Req,
        res: Resolve,
        region: UidRegion,
    ) -> Result<(), PostError> {
        let result = &r.sges[..r.sges.len().min(1)];
        match res.value {
            None => {
                let wr = SendWr::new(r.wr_id, WrOpcode::Read, Payload::Sges(result))
                    .remote(res.slot_addr, region.rkey)
                    .flags(SendFlags::SIGNALED);
                io.post_send(self.rail, &wr)
            }
            Some(value) => {
                let mark = res.word.to_le_bytes();
                let wr = SendWr::new(REQUEST, WrOpcode::Write, Payload::Inline(&mark))
                    .remote(res.slot_addr + 8, region.rkey)
                    .flags(SendFlags::INLINE);
                io.post_send(self.rail, &wr)?;
                let mut cas = SendWr::new(r.wr_id, WrOpcode::CmpSwp, Payload::Sges(result))
                    .remote(r.remote_addr, r.rkey)
                    .flags(SendFlags::SIGNALED);
                cas.compare_add = res.word;
                cas.swap = value;
                io.post_send(self.rail, &cas)
            }
        }
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
        if (TARGET_READ..TARGET_READ + 0x80).contains(&wc.wr_id)
            || (MARK_READ..MARK_READ + 0x80).contains(&wc.wr_id)
        {
            self.targets_out = self.targets_out.saturating_sub(1);
            if self.targets_out == 0 {
                self.settle(io, &mut out);
            }
            return out;
        }
        if rail != self.rail {
            return out;
        }
        if wc.wr_id == CONFIRM {
            // Confirms on one QP complete in the order they went.
            self.confirms.pop_front();
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
        // An FAA's stage: what is before it is done; it goes on.
        let faa = self.reqs[i].faa.is_some() && !self.reqs[i].done;
        let drained: Vec<Req> = self.reqs.drain(..if faa { i } else { i + 1 }).collect();
        for r in drained {
            if let Some((id, _, _)) = r.log {
                self.log.finish(id);
            }
            if let (Some(c), false) = (r.cas, r.done) {
                // The CAS returned the target's old value into its result: `compare` means
                // it won and the UID sits there now: confirm before anything later.
                let mut v = [0u8; 8];
                if let Some(s) = r.sges.first() {
                    io.read_local(s.addr, &mut v);
                }
                if u64::from_le_bytes(v) == c.compare {
                    self.confirm(io, &r, c);
                }
            }
            if r.done && r.flags.contains(SendFlags::SIGNALED) {
                out.push(r.success());
            } else if r.flags.contains(SendFlags::SIGNALED) && r.wr_id == wc.wr_id {
                out.push(*wc);
            }
        }
        if faa {
            self.faa_step(io, &mut out);
            return out;
        }
        self.complete_done_head(&mut out);
        out
    }

    /// Confirm: the UID in `r`'s target becomes the real value.
    fn confirm(&mut self, io: &mut impl VarunaIo, r: &Req, c: Cas) {
        self.confirms.push_back((r.remote_addr, r.rkey, c));
        self.post_confirm(io, r.remote_addr, r.rkey, c);
    }

    fn post_confirm(&mut self, io: &mut impl VarunaIo, addr: u64, rkey: u32, c: Cas) {
        let sge = [Sge {
            addr: self.config.staging_addr + 16 * self.config.slots as u64,
            length: 8,
            lkey: self.config.staging_lkey,
        }];
        let mut wr = SendWr::new(CONFIRM, WrOpcode::CmpSwp, Payload::Sges(&sge))
            .remote(addr, rkey)
            .flags(SendFlags::SIGNALED);
        wr.compare_add = c.uid.to_word();
        wr.swap = c.swap;
        let _ = io.post_send(self.rail, &wr);
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
        let verdicts: Vec<(u64, Class)> = self
            .log
            .classify(&remote)
            .into_iter()
            .map(|(_, e, c)| (e.id, c))
            .collect();
        self.verdicts = Some(verdicts);
        // Every CAS still in flight: its target, READ into the staging words after the log's.
        self.targets_out = 0;
        let cases: Vec<(usize, u64, u32)> = self
            .reqs
            .iter()
            .enumerate()
            .filter(|(_, r)| r.cas.is_some() && r.sent)
            .map(|(i, r)| (i, r.remote_addr, r.rkey))
            .collect();
        for (i, addr, rkey) in cases {
            if i >= 0x80 || i >= self.config.slots {
                continue;
            }
            let sge = [Sge {
                addr: self.config.staging_addr + 8 * (self.config.slots + i) as u64,
                length: 8,
                lkey: self.config.staging_lkey,
            }];
            let read = SendWr::new(TARGET_READ + i as u64, WrOpcode::Read, Payload::Sges(&sge))
                .remote(addr, rkey)
                .flags(SendFlags::SIGNALED);
            if io.post_send(Rail::Backup, &read).is_ok() {
                self.targets_out += 1;
            }
            // And its slot's mark: another requester may have resolved the UID already.
            let (Some(c), Some((_, buf_rkey))) = (self.reqs[i].cas, self.config.cas) else {
                continue;
            };
            let sge = [Sge {
                addr: self.mark_staging(i),
                length: 8,
                lkey: self.config.staging_lkey,
            }];
            let read = SendWr::new(MARK_READ + i as u64, WrOpcode::Read, Payload::Sges(&sge))
                .remote(c.uid.slot_addr + 8, buf_rkey)
                .flags(SendFlags::SIGNALED);
            if io.post_send(Rail::Backup, &read).is_ok() {
                self.targets_out += 1;
            }
        }
        if self.targets_out == 0 {
            self.settle(io, out);
        }
    }

    /// Where recovery READs request `i`'s slot mark.
    fn mark_staging(&self, i: usize) -> u64 {
        self.config.staging_addr + 8 * (2 * self.config.slots + 1 + i) as u64
    }

    /// Recovery's last stage: every request settled from the log's verdict and, for a CAS,
    /// its target; then resends, confirms and completions in posting order.
    fn settle(&mut self, io: &mut impl VarunaIo, out: &mut Vec<WorkCompletion>) {
        let verdicts = self.verdicts.take().unwrap_or_default();
        let ran = |id: u64| {
            verdicts
                .iter()
                .any(|&(v, c)| v == id && c == Class::PostFailure)
        };
        self.recovering = false;
        // Confirms the failure may have taken go again first, ahead of anything that could
        // read their targets.
        let pending: Vec<(u64, u32, Cas)> = self.confirms.iter().copied().collect();
        for (addr, rkey, c) in pending {
            self.post_confirm(io, addr, rkey, c);
        }
        // Once an FAA goes again unfinished, what follows it waits for it.
        let mut hold = false;
        let reqs = std::mem::take(&mut self.reqs);
        for (i, mut r) in reqs.into_iter().enumerate() {
            if hold {
                r.posted = false;
                self.reqs.push_back(r);
                continue;
            }
            if let (Some(c), Some((buffer, _)), Some((id, _, _))) = (r.cas, self.config.cas, r.log)
            {
                let mut w = [0u8; 8];
                let read = i < 0x80 && i < self.config.slots && r.sent;
                if read {
                    io.read_local(
                        self.config.staging_addr + 8 * (self.config.slots + i) as u64,
                        &mut w,
                    );
                }
                let target = u64::from_le_bytes(w);
                let mut m = [0u8; 8];
                if read {
                    io.read_local(self.mark_staging(i), &mut m);
                }
                let helped = read && u64::from_le_bytes(m) == c.uid.to_word();
                let outcome = if read {
                    cas_outcome(&buffer, target, c.uid, ran(id), helped)
                } else {
                    CasOutcome::NotExecuted
                };
                if outcome == CasOutcome::Won && helped && buffer.owns(target).is_none() {
                    self.stats.cas_won_resolved += 1;
                }
                let result = r.sges.first().map(|s| s.addr);
                match outcome {
                    CasOutcome::Won => {
                        self.stats.cas_won += 1;
                        if let Some(a) = result {
                            io.write_local(a, &c.compare.to_le_bytes());
                        }
                        self.confirm(io, &r, c);
                    }
                    CasOutcome::Lost if r.faa.is_some() => {
                        // An FAA's attempt lost: the next one, from the value there now.
                        self.stats.cas_lost += 1;
                        self.next_attempt(&mut r, target);
                        let _ = self.send(io, &mut r);
                        hold = true;
                        self.reqs.push_back(r);
                        continue;
                    }
                    CasOutcome::Lost => {
                        self.stats.cas_lost += 1;
                        if let Some(a) = result {
                            io.write_local(a, &target.to_le_bytes());
                        }
                    }
                    CasOutcome::NotExecuted => {
                        self.stats.cas_resent += 1;
                        let _ = self.send(io, &mut r);
                        hold = r.faa.is_some();
                        self.reqs.push_back(r);
                        continue;
                    }
                }
                self.log.finish(id);
                r.done = true;
                r.posted = true;
                self.reqs.push_back(r);
                continue;
            }
            if r.faa.is_some() && r.cas.is_none() {
                // An FAA still in its READ stage, resolving a UID, or never sent: from the
                // READ (a resolution's CAS is the owner's confirm: harmless if it ran).
                r.resolve = None;
                self.stats.reads_reissued += u64::from(r.sent);
                let _ = self.send(io, &mut r);
                hold = true;
                self.reqs.push_back(r);
                continue;
            }
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

// Its tests run it on the testbed's rails: reliability/tests/varuna.rs.
