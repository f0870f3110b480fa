//! The sending end of a reliable SDR connection.

use std::collections::VecDeque;

use ferroce_stack::transport::{Payload, SendFlags, SendWr, Sge, WrOpcode};

use super::super::ack::Ack;
use super::super::auto::{AutoStats, Chooser};
use super::super::codec::ErasureCodec;
use super::super::receiver::Buffer;
use super::super::recv::RecvConfig;
use super::super::send::{Packet, SendHandle, SendTable};
use super::{parity_len, sub_parity, Memory, ReliableConfig};

ferroce_stack::counter_set! {
    /// What a sender did.
    pub struct SenderStats {
        /// Data chunks sent for the first time.
        chunks_sent,
        /// Data chunks sent again.
        chunks_resent,
        /// Parity chunks sent.
        parity_sent,
        /// Submessages encoded.
        submessages_encoded,
        /// Resends a timeout caused.
        timeouts,
        /// Resends an acknowledgement showing a later chunk caused (NACK).
        nack_losses,
        /// Submessages EC handed to selective repeat.
        fallbacks,
        /// Acknowledgements taken.
        acks_received,
        /// Control messages that were not acknowledgements.
        acks_refused,
        /// Messages acknowledged whole.
        messages_done,
    }
}

/// What a chunk to send carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TxKind {
    /// Message data.
    Data,
    /// EC parity.
    Parity,
}

/// One chunk to put on the wire: its packets, each a WRITE-with-immediate on the QP of its
/// generation, whose payload is `packet.len` bytes at `source.va + packet.local`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TxChunk {
    /// The message (sends counted from 0).
    pub message: u64,
    /// Data or parity.
    pub kind: TxKind,
    /// The chunk's index among its kind.
    pub index: u32,
    /// Sent before.
    pub resend: bool,
    /// Where the payloads come from.
    pub source: Buffer,
    /// The packets.
    pub packets: Vec<Packet>,
}

impl TxChunk {
    /// Packet `i`'s payload in the source buffer, as its work request's one SGE.
    pub fn sge(&self, i: usize) -> [Sge; 1] {
        let p = &self.packets[i];
        [Sge {
            addr: self.source.va + p.local,
            length: p.len,
            lkey: self.source.lkey,
        }]
    }

    /// Packet `i`'s work request, to post on the QP of its generation: a WRITE with
    /// immediate of `sge` ([`sge`](Self::sge)) to the packet's place in the receiver's region
    /// `rkey`, its immediate naming that place for the receiver's bitmap; `wr_id` on it,
    /// signaled when `signaled`. The one step every driver of SDR (the verbs API, the
    /// scenario, the benchmarks) takes from a chunk to the wire.
    pub fn write<'a>(
        &self,
        i: usize,
        sge: &'a [Sge; 1],
        rkey: u32,
        wr_id: u64,
        signaled: bool,
    ) -> SendWr<'a> {
        let p = &self.packets[i];
        SendWr::new(wr_id, WrOpcode::WriteWithImm, Payload::Sges(sge))
            .remote(p.remote, rkey)
            .imm(p.imm)
            .flags(if signaled {
                SendFlags::SIGNALED
            } else {
                SendFlags(0)
            })
    }
}

/// A message the receiver acknowledged whole.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendDone {
    /// The message.
    pub message: u64,
    /// When the acknowledgement arrived.
    pub at: u64,
}

/// Why a send was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    /// Longer than the receiver's slots take.
    #[error("a {0}-byte message does not fit the connection's slots")]
    TooLong(u64),
    /// EC needs a buffer for the parity.
    #[error("EC needs a parity buffer of {0} bytes")]
    NeedsParity(u64),
    /// Streaming sends chunks as they come, so there is no whole submessage to encode: SR
    /// only.
    #[error("a streaming send needs selective repeat (EC encodes whole submessages)")]
    StreamingNeedsSr,
    /// No such streaming message, or no such chunk in it.
    #[error("message {0} has no chunk {1} to stream")]
    NoChunk(u64, u32),
}

struct OutMsg {
    user: u64,
    data: SendHandle,
    parity: Option<SendHandle>,
    src: Buffer,
    parity_buf: Buffer,
    chunks: u32,
    acked: Vec<u64>,
    acked_n: u32,
    /// Every chunk below it is acknowledged.
    low: u32,
    /// The send sequence number of each data chunk's latest send (0: not sent).
    seq: Vec<u64>,
    /// Queued for a resend.
    pending: Vec<bool>,
    /// Position in the first transmissions' schedule, and its length.
    cursor: u32,
    schedule: u32,
    encoded: Vec<bool>,
    /// EC submessages handed to selective repeat.
    fallback: Vec<bool>,
    /// `(k, m)` when this message travels with parity.
    ec: Option<(u32, u32)>,
    /// When each data chunk last left.
    sent_at: Vec<u64>,
    /// The deadline of each data chunk's armed timeout (0: none).
    deadline: Vec<u64>,
    /// Chunks sent more than once, and how many.
    resent: Vec<bool>,
    resent_n: u32,
    /// Chunks the receiver rebuilt, by its latest acknowledgement.
    rebuilt: u32,
    done: bool,
}

impl OutMsg {
    fn acked(&self, c: u32) -> bool {
        self.acked[(c / 64) as usize] >> (c % 64) & 1 == 1
    }

    fn ack(&mut self, c: u32) {
        self.acked[(c / 64) as usize] |= 1 << (c % 64);
        self.acked_n += 1;
    }
}

/// The sending end of one reliable SDR connection.
pub struct ReliableSender {
    cfg: ReliableConfig,
    table: SendTable,
    chunk_bytes: u64,
    codec: Option<Box<dyn ErasureCodec>>,
    msgs: VecDeque<OutMsg>,
    next_user: u64,
    seq: u64,
    resend: VecDeque<(u64, u32)>,
    /// Chunks of streaming messages added and not yet sent.
    fresh: VecDeque<(u64, u32)>,
    /// (deadline, message, chunk, seq), deadlines in order (one RTO per connection).
    rto: VecDeque<(u64, u64, u32, u64)>,
    /// Timers found re-armed while running the due ones.
    rto_later: Vec<(u64, u64, u32, u64)>,
    /// (deadline, message, submessage).
    fallback: VecDeque<(u64, u64, u32)>,
    done: VecDeque<SendDone>,
    scratch: Vec<u8>,
    stats: SenderStats,
    auto: Option<Chooser>,
    /// The driver reports when chunks leave ([`on_departed`](Self::on_departed)): timers
    /// start then, not when a chunk is handed out.
    departures: bool,
}

impl ReliableSender {
    /// A sender for a receiver laid out by `layout`, with reliability `cfg`.
    pub fn new(
        layout: RecvConfig,
        cfg: ReliableConfig,
    ) -> Result<Self, super::super::codec::CodecError> {
        Ok(Self {
            cfg,
            table: SendTable::new(layout),
            chunk_bytes: u64::from(layout.mtu.max(1)) * u64::from(layout.chunk_packets.max(1)),
            codec: cfg.codec()?,
            msgs: VecDeque::new(),
            next_user: 0,
            seq: 0,
            resend: VecDeque::new(),
            fresh: VecDeque::new(),
            rto: VecDeque::new(),
            rto_later: Vec::new(),
            fallback: VecDeque::new(),
            done: VecDeque::new(),
            scratch: Vec::new(),
            stats: SenderStats::default(),
            auto: cfg.auto_gbps.map(|gbps| {
                Chooser::new(
                    cfg.scheme,
                    gbps,
                    cfg.rtt_ns,
                    u64::from(layout.mtu.max(1)) * u64::from(layout.chunk_packets.max(1)),
                    u64::from(layout.mtu.max(1)),
                )
            }),
            departures: false,
        })
    }

    /// The driver will report each data chunk's departure
    /// ([`on_departed`](Self::on_departed)); its timeout then starts at the departure, so
    /// chunks queued behind a pacer (or a slow port) do not time out before they leave.
    pub fn report_departures(&mut self, on: bool) {
        self.departures = on;
    }

    /// The automatic choice's counters and its latest decision, when it runs.
    pub fn auto(&self) -> Option<(AutoStats, Option<super::super::auto::Decision>)> {
        self.auto.as_ref().map(|c| (c.stats(), c.last()))
    }

    /// The settings.
    pub fn config(&self) -> ReliableConfig {
        self.cfg
    }

    /// Bytes of parity buffer a `len`-byte message needs (0 without EC).
    pub fn parity_len(&self, len: u64) -> u64 {
        self.cfg
            .ec()
            .map_or(0, |(k, m)| parity_len(len, self.chunk_bytes, k, m))
    }

    /// Sends `len` bytes from `src` (one-shot: every chunk is queued now), with EC's parity
    /// computed into `parity`. Returns the message's number.
    pub fn send(
        &mut self,
        src: Buffer,
        len: u64,
        user_imm: Option<u32>,
        parity: Option<Buffer>,
    ) -> Result<u64, SendError> {
        let plen = self.parity_len(len);
        let parity_buf = match (plen, parity) {
            (0, _) => Buffer { lkey: 0, va: 0 },
            (_, Some(p)) => p,
            (n, None) => return Err(SendError::NeedsParity(n)),
        };
        let data = self
            .table
            .send(len, user_imm)
            .ok_or(SendError::TooLong(len))?;
        let parity = match plen {
            0 => None,
            n => Some(self.table.send(n, None).ok_or(SendError::TooLong(n))?),
        };
        let chunks = len.div_ceil(self.chunk_bytes).max(1) as u32;
        let ec = match self.auto.as_mut() {
            Some(c) => c.choose(len).ec.then(|| self.cfg.ec()).flatten(),
            None => self.cfg.ec(),
        };
        let (subs, parity_chunks) = match ec {
            Some((k, m)) => {
                let subs = chunks.div_ceil(k);
                (
                    subs,
                    (subs - 1) * m + sub_parity(chunks - (subs - 1) * k, k, m),
                )
            }
            None => (0, 0),
        };
        let user = self.next_user;
        self.next_user += 1;
        self.msgs.push_back(OutMsg {
            user,
            data,
            parity,
            src,
            parity_buf,
            chunks,
            acked: vec![0; chunks.div_ceil(64) as usize],
            acked_n: 0,
            low: 0,
            seq: vec![0; chunks as usize],
            pending: vec![false; chunks as usize],
            cursor: 0,
            schedule: chunks + parity_chunks,
            encoded: vec![false; subs as usize],
            fallback: vec![false; subs as usize],
            ec,
            sent_at: vec![0; chunks as usize],
            deadline: vec![0; chunks as usize],
            resent: vec![false; chunks as usize],
            resent_n: 0,
            rebuilt: 0,
            done: false,
        });
        Ok(user)
    }

    /// Starts a streaming send of `len` bytes from `src`: nothing leaves until chunks are
    /// added ([`stream_chunk`](Self::stream_chunk)), in any order, each landing at its offset
    /// of the receiver's buffer; the message completes when every chunk was acknowledged.
    /// Selective repeat only.
    pub fn send_streaming(
        &mut self,
        src: Buffer,
        len: u64,
        user_imm: Option<u32>,
    ) -> Result<u64, SendError> {
        if self.cfg.ec().is_some() {
            return Err(SendError::StreamingNeedsSr);
        }
        let user = self.send(src, len, user_imm, None)?;
        if let Some(m) = self.msgs.back_mut() {
            // Nothing is scheduled: chunks come one by one.
            m.schedule = 0;
        }
        Ok(user)
    }

    /// Adds chunk `chunk` of streaming message `user` (again, if it was added before: a
    /// resend the application asks for).
    pub fn stream_chunk(&mut self, user: u64, chunk: u32) -> Result<(), SendError> {
        let i = self.index(user).ok_or(SendError::NoChunk(user, chunk))?;
        let m = &self.msgs[i];
        if chunk >= m.chunks || m.schedule != 0 {
            return Err(SendError::NoChunk(user, chunk));
        }
        if !m.done {
            self.fresh.push_back((user, chunk));
        }
        Ok(())
    }

    fn index(&self, user: u64) -> Option<usize> {
        let front = self.msgs.front()?.user;
        let i = user.checked_sub(front)? as usize;
        (i < self.msgs.len()).then_some(i)
    }

    /// The generation (internal QP) of the chunk [`poll_transmit`](Self::poll_transmit)
    /// would hand out next, if any. A driver keeps one generation's QP busy at a time with
    /// it: two QPs each paced to the link would together send at twice its rate.
    pub fn next_generation(&self) -> Option<u8> {
        let live = |&(user, c): &(u64, u32)| {
            let m = &self.msgs[self.index(user)?];
            (!m.done && !m.acked(c)).then_some(m.data.generation)
        };
        if let Some(g) = self.resend.iter().find_map(live) {
            return Some(g);
        }
        if let Some(g) = self.fresh.iter().find_map(live) {
            return Some(g);
        }
        let m = self
            .msgs
            .iter()
            .find(|m| !m.done && m.cursor < m.schedule)?;
        let parity = m.ec.is_some_and(|(k, mm)| {
            let (j, r) = (m.cursor / (k + mm), m.cursor % (k + mm));
            r >= k.min(m.chunks - j * k)
        });
        match (parity, m.parity) {
            (true, Some(p)) => Some(p.generation),
            _ => Some(m.data.generation),
        }
    }

    /// The next chunk to send, resends first; `mem` reads data to encode parity from.
    pub fn poll_transmit(&mut self, now: u64, mem: &dyn Memory) -> Option<TxChunk> {
        while let Some((user, c)) = self.resend.pop_front() {
            let Some(i) = self.index(user) else { continue };
            let m = &mut self.msgs[i];
            m.pending[c as usize] = false;
            if m.done || m.acked(c) {
                continue;
            }
            return Some(self.emit_data(now, i, c, true));
        }
        while let Some((user, c)) = self.fresh.pop_front() {
            let Some(i) = self.index(user) else { continue };
            let m = &self.msgs[i];
            if m.done || m.acked(c) {
                continue;
            }
            let again = m.seq[c as usize] > 0;
            return Some(self.emit_data(now, i, c, again));
        }
        let i = self
            .msgs
            .iter()
            .position(|m| !m.done && m.cursor < m.schedule)?;
        let m = &mut self.msgs[i];
        let pos = m.cursor;
        m.cursor += 1;
        let Some((k, mm)) = m.ec else {
            return Some(self.emit_data(now, i, pos, false));
        };
        // Submessage j: its data chunks, then its parity chunks.
        let j = pos / (k + mm);
        let r = pos % (k + mm);
        let d = k.min(m.chunks - j * k);
        let last_of_sub = r + 1 == d + sub_parity(d, k, mm);
        if last_of_sub {
            let at = now + self.cfg.fallback_ns();
            self.fallback.push_back((at, m.user, j));
        }
        if r < d {
            return Some(self.emit_data(now, i, j * k + r, false));
        }
        let p = j * mm + (r - d);
        if !self.msgs[i].encoded[j as usize] {
            self.encode(i, j, mem);
        }
        let m = &self.msgs[i];
        let h = m.parity?;
        self.stats.parity_sent += 1;
        Some(TxChunk {
            message: m.user,
            kind: TxKind::Parity,
            index: p,
            resend: false,
            source: m.parity_buf,
            packets: self.table.chunk(&h, p).collect(),
        })
    }

    fn emit_data(&mut self, now: u64, i: usize, c: u32, resend: bool) -> TxChunk {
        self.seq += 1;
        let m = &mut self.msgs[i];
        m.seq[c as usize] = self.seq;
        m.sent_at[c as usize] = now;
        if resend && !m.resent[c as usize] {
            m.resent[c as usize] = true;
            m.resent_n += 1;
        }
        let fallback = m.ec.is_some_and(|(k, _)| m.fallback[(c / k) as usize]);
        // SR chunks and EC's fallback resends are timed; EC's first sends are covered by
        // the parity and the fallback timer.
        if m.ec.is_none() || fallback {
            if self.departures {
                // Armed when it leaves; until then no timer runs for it.
                m.deadline[c as usize] = u64::MAX;
            } else {
                let at = now + self.cfg.rto_ns(fallback);
                m.deadline[c as usize] = at;
                self.rto.push_back((at, m.user, c, self.seq));
            }
        }
        if resend {
            self.stats.chunks_resent += 1;
        } else {
            self.stats.chunks_sent += 1;
        }
        TxChunk {
            message: m.user,
            kind: TxKind::Data,
            index: c,
            resend,
            source: m.src,
            packets: self.table.chunk(&m.data, c).collect(),
        }
    }

    /// Computes submessage `j`'s parity into the message's parity buffer. Data past the
    /// message's end reads as zeros, as the receiver takes it. A whole submessage is encoded
    /// from the registered memory in place; a short last one from a zero-padded copy.
    fn encode(&mut self, i: usize, j: u32, mem: &dyn Memory) {
        let m = &mut self.msgs[i];
        let (Some(codec), Some((k, mm))) = (self.codec.as_mut(), m.ec) else {
            return;
        };
        m.encoded[j as usize] = true;
        let cb = self.chunk_bytes as usize;
        let (k, mm) = (k as usize, mm as usize);
        let first = u64::from(j) * k as u64 * cb as u64;
        if self.scratch.len() < k * cb {
            self.scratch.resize(k * cb, 0);
        }
        let data = &mut self.scratch[..k * cb];
        let whole = first + (k * cb) as u64 <= m.data.len;
        // Each parity chunk goes straight from the codec into the parity buffer.
        let (parity_buf, mut wrote) = (m.parity_buf, 0);
        // A short last submessage sends (and so stores) only its first parity chunks.
        let d = (m.chunks - j * k as u32).min(k as u32);
        let sent = sub_parity(d, k as u32, mm as u32) as usize;
        let mut store = |p: usize, bytes: &[u8]| {
            let at = (u64::from(j) * mm as u64 + p as u64) * cb as u64;
            if p < sent && mem.write(parity_buf, at, bytes) {
                wrote += 1;
            }
        };
        let encoded = if whole {
            let ranges: Vec<(u64, usize)> = (0..k).map(|n| (first + (n * cb) as u64, cb)).collect();
            let mut out = false;
            let lent = mem.with_ranges(m.src, &ranges, &mut |d| {
                out = codec.encode_each(d, &mut store).is_ok();
            });
            lent && out
        } else {
            for (n, chunk) in data.chunks_exact_mut(cb).enumerate() {
                let start = first + (n * cb) as u64;
                let len = m.data.len.saturating_sub(start).min(cb as u64) as usize;
                chunk[len..].fill(0);
                if len > 0 {
                    mem.read(m.src, start, &mut chunk[..len]);
                }
            }
            let d: Vec<&[u8]> = data.chunks_exact(cb).collect();
            codec.encode_each(&d, &mut store).is_ok()
        };
        if encoded && wrote == sent {
            self.stats.submessages_encoded += 1;
        }
    }

    /// Chunk `index` of message `message`, handed out by
    /// [`poll_transmit`](Self::poll_transmit) at some earlier time, has left (its last
    /// packet's send completed): its timeout counts from now. A driver that keeps chunks
    /// queued behind a pacer calls this, so queueing does not eat into the timeout.
    pub fn on_departed(&mut self, now: u64, message: u64, kind: TxKind, index: u32) {
        if kind != TxKind::Data {
            return;
        }
        let Some(i) = self.index(message) else { return };
        let m = &mut self.msgs[i];
        let Some(d) = m.deadline.get_mut(index as usize) else {
            return;
        };
        if *d == u64::MAX {
            // Waiting for its departure: the timer starts now.
            let fallback = m.ec.is_some_and(|(k, _)| m.fallback[(index / k) as usize]);
            let at = now + self.cfg.rto_ns(fallback);
            *d = at;
            m.sent_at[index as usize] = now;
            let s = m.seq[index as usize];
            let user = m.user;
            self.rto_later.push((at, user, index, s));
            self.resort_timers();
        } else if *d > 0 {
            let fallback = m.ec.is_some_and(|(k, _)| m.fallback[(index / k) as usize]);
            *d = (*d).max(now + self.cfg.rto_ns(fallback));
            m.sent_at[index as usize] = m.sent_at[index as usize].max(now);
        }
    }

    /// A message from the control channel.
    pub fn on_control(&mut self, now: u64, bytes: &[u8]) {
        let Ok(ack) = Ack::parse(bytes) else {
            self.stats.acks_refused += 1;
            return;
        };
        self.stats.acks_received += 1;
        for i in 0..self.msgs.len() {
            if !self.msgs[i].done && self.msgs[i].data.message < ack.done_below {
                self.finish(now, i);
            }
        }
        let Some(i) = self.msgs.iter().position(|m| m.data.message == ack.message) else {
            self.retire();
            return;
        };
        let m = &mut self.msgs[i];
        if m.done || ack.chunks != m.chunks {
            self.retire();
            return;
        }
        m.rebuilt = m.rebuilt.max(ack.rebuilt);
        // The newest send among the chunks this acknowledgement is first to show, and when
        // it left (an RTT sample unless it was sent more than once: Karn's rule).
        let (mut newest, mut newest_at) = (0, None);
        for c in m.low..m.chunks {
            if !m.acked(c) && ack.has(c) {
                m.ack(c);
                // A chunk sent more than once could be acknowledged for any of its sends.
                // It dates a loss by its latest send only when that send is at least most of
                // an RTT old, so the acknowledgement cannot be for an earlier one arriving
                // late (RACK's rule, RFC 8985); it never gives an RTT sample (Karn's).
                let s = m.seq[c as usize];
                let resent = m.resent[c as usize];
                let old_enough =
                    now.saturating_sub(m.sent_at[c as usize]) >= self.cfg.rtt_ns / 8 * 7;
                if s > newest && (!resent || old_enough) {
                    newest = s;
                    newest_at = (s > 0 && !resent).then_some(m.sent_at[c as usize]);
                }
            }
        }
        if let (Some(at), Some(a)) = (newest_at, self.auto.as_mut()) {
            a.observe_rtt(now.saturating_sub(at));
        }
        while m.low < m.chunks && m.acked(m.low) {
            m.low += 1;
        }
        if m.acked_n == m.chunks || ack.complete {
            self.finish(now, i);
        } else if self.cfg.nacks() && newest > 0 {
            // Anything sent before a chunk that arrived, and still missing, was lost.
            let ec_k = m.ec.map(|(k, _)| k);
            for c in m.low..m.chunks {
                let s = m.seq[c as usize];
                let timed = ec_k.is_none_or(|k| m.fallback[(c / k) as usize]);
                if timed && s > 0 && s < newest && !m.acked(c) && !m.pending[c as usize] {
                    m.pending[c as usize] = true;
                    self.resend.push_back((m.user, c));
                    self.stats.nack_losses += 1;
                }
            }
        }
        self.retire();
    }

    fn finish(&mut self, now: u64, i: usize) {
        let m = &mut self.msgs[i];
        if !m.done {
            m.done = true;
            self.stats.messages_done += 1;
            if let Some(a) = self.auto.as_mut() {
                a.observe_message(m.chunks, m.resent_n + m.rebuilt);
            }
            self.done.push_back(SendDone {
                message: m.user,
                at: now,
            });
        }
    }

    /// Drops finished messages from the front.
    fn retire(&mut self) {
        while self.msgs.front().is_some_and(|m| m.done) {
            self.msgs.pop_front();
        }
    }

    /// When [`handle_timeout`](Self::handle_timeout) wants to run next.
    pub fn poll_timeout(&self) -> Option<u64> {
        let a = self.rto.front().map(|t| t.0);
        let b = self.fallback.front().map(|t| t.0);
        match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Runs the timers due at `now`.
    pub fn handle_timeout(&mut self, now: u64) {
        while self.rto.front().is_some_and(|t| t.0 <= now) {
            let Some((_, user, c, s)) = self.rto.pop_front() else {
                break;
            };
            let Some(i) = self.index(user) else { continue };
            let m = &mut self.msgs[i];
            // A timer re-armed since (the chunk left later than it was handed out) waits.
            let armed = m.deadline[c as usize];
            if armed > now {
                if m.seq[c as usize] == s {
                    self.rto_later.push((armed, user, c, s));
                }
                continue;
            }
            if !m.done && !m.acked(c) && m.seq[c as usize] == s && !m.pending[c as usize] {
                m.pending[c as usize] = true;
                self.resend.push_back((user, c));
                self.stats.timeouts += 1;
            }
        }
        self.resort_timers();
        while self.fallback.front().is_some_and(|t| t.0 <= now) {
            let Some((_, user, j)) = self.fallback.pop_front() else {
                break;
            };
            let Some(i) = self.index(user) else {
                continue;
            };
            let m = &mut self.msgs[i];
            let Some((k, _)) = m.ec else { continue };
            if m.done {
                continue;
            }
            let missing: Vec<u32> = (j * k..((j + 1) * k).min(m.chunks))
                .filter(|&c| !m.acked(c) && !m.pending[c as usize])
                .collect();
            if !missing.is_empty() {
                m.fallback[j as usize] = true;
                self.stats.fallbacks += 1;
                for c in missing {
                    m.pending[c as usize] = true;
                    self.resend.push_back((user, c));
                }
            }
        }
    }

    /// Puts re-armed timers back among the others, in deadline order. Departures arrive in
    /// send order with one RTO each, so a new timer usually goes at the back.
    fn resort_timers(&mut self) {
        if self.rto_later.is_empty() {
            return;
        }
        let in_order = self.rto_later.windows(2).all(|w| w[0].0 <= w[1].0)
            && self
                .rto
                .back()
                .zip(self.rto_later.first())
                .is_none_or(|(b, f)| b.0 <= f.0);
        if in_order {
            self.rto.extend(self.rto_later.drain(..));
        } else {
            let mut all: Vec<_> = self.rto.drain(..).chain(self.rto_later.drain(..)).collect();
            all.sort_by_key(|t| t.0);
            self.rto.extend(all);
        }
    }

    /// The next message acknowledged whole.
    pub fn poll_done(&mut self) -> Option<SendDone> {
        self.done.pop_front()
    }

    /// Messages not yet acknowledged whole.
    pub fn in_flight(&self) -> usize {
        self.msgs.iter().filter(|m| !m.done).count()
    }

    /// Whether a chunk waits to be sent.
    pub fn wants_transmit(&self) -> bool {
        !self.resend.is_empty()
            || !self.fresh.is_empty()
            || self.msgs.iter().any(|m| !m.done && m.cursor < m.schedule)
    }

    /// The counters.
    pub fn stats(&self) -> SenderStats {
        self.stats
    }
}
