//! The receiving end of a reliable SDR connection.

use std::collections::VecDeque;

use super::super::ack::Ack;
use super::super::codec::ErasureCodec;
use super::super::receiver::{Buffer, ChunkEvent, SdrReceiver};
use super::super::recv::{PostError, RecvHandle};
use super::{parity_len, Memory, ReliableConfig};

ferroce_stack::counter_set! {
    /// What a receiver did.
    pub struct ReceiverStats {
        /// Acknowledgements sent on the interval.
        acks_sent,
        /// Acknowledgements sent at once: a message completed, or (NACK) a chunk completed
        /// past a missing one, or a packet of a completed message came again.
        acks_urgent,
        /// Submessages rebuilt by the erasure code.
        submessages_decoded,
        /// Data chunks rebuilt.
        chunks_rebuilt,
        /// Messages whose data all arrived.
        messages_complete,
    }
}

struct InMsg {
    user: u64,
    data: RecvHandle,
    parity: Option<RecvHandle>,
    buf: Buffer,
    parity_buf: Buffer,
    /// Every chunk below it arrived.
    low: u32,
    complete: bool,
    /// Arrivals since the last acknowledgement.
    dirty: bool,
    /// When an urgent acknowledgement last went for it.
    urgent_at: Option<u64>,
    sub_done: Vec<bool>,
    rebuilt: u32,
}

/// The receiving end of one reliable SDR connection.
pub struct ReliableReceiver {
    cfg: ReliableConfig,
    rx: SdrReceiver,
    chunk_bytes: u64,
    codec: Option<Box<dyn ErasureCodec>>,
    msgs: VecDeque<InMsg>,
    next_user: u64,
    /// The SDR message number the next post takes.
    next_sdr: u64,
    events: Vec<ChunkEvent>,
    urgent: VecDeque<u64>,
    next_ack: Option<u64>,
    stale_seen: u64,
    duplicates_seen: u64,
    scratch: Vec<u8>,
    stats: ReceiverStats,
}

impl ReliableReceiver {
    /// The reliable end over `rx` (whose sinks the driver installed on the internal QPs).
    pub fn new(
        rx: SdrReceiver,
        cfg: ReliableConfig,
    ) -> Result<Self, super::super::codec::CodecError> {
        let c = rx.config();
        Ok(Self {
            cfg,
            chunk_bytes: u64::from(c.mtu) * u64::from(c.chunk_packets),
            codec: cfg.codec()?,
            rx,
            msgs: VecDeque::new(),
            next_user: 0,
            next_sdr: 0,
            events: Vec::new(),
            urgent: VecDeque::new(),
            next_ack: None,
            stale_seen: 0,
            duplicates_seen: 0,
            scratch: Vec::new(),
            stats: ReceiverStats::default(),
        })
    }

    /// The SDR receive side underneath.
    pub fn sdr(&self) -> &SdrReceiver {
        &self.rx
    }

    /// Bytes of parity buffer a `len`-byte receive needs (0 without EC).
    pub fn parity_len(&self, len: u64) -> u64 {
        self.cfg
            .ec()
            .map_or(0, |(k, m)| parity_len(len, self.chunk_bytes, k, m))
    }

    /// Posts the next receive into `buf` (and, for EC, its parity into `parity`, of
    /// [`parity_len`](Self::parity_len) bytes). Returns the message's number.
    pub fn post(
        &mut self,
        buf: Buffer,
        len: u64,
        parity: Option<Buffer>,
    ) -> Result<u64, PostError> {
        let plen = self.parity_len(len);
        let parity_buf = match (plen, parity) {
            (0, _) => Buffer { lkey: 0, va: 0 },
            (_, Some(p)) => p,
            (n, None) => return Err(PostError::TooLong { len: n, max: 0 }),
        };
        let data = self.rx.post(buf, len)?;
        let parity = match plen {
            0 => None,
            n => match self.rx.post(parity_buf, n) {
                Ok(h) => Some(h),
                Err(e) => {
                    self.rx.complete(&data);
                    return Err(e);
                }
            },
        };
        self.next_sdr = parity.as_ref().unwrap_or(&data).message + 1;
        let subs = self
            .cfg
            .ec()
            .map_or(0, |(k, _)| data.chunks().div_ceil(k) as usize);
        let user = self.next_user;
        self.next_user += 1;
        self.msgs.push_back(InMsg {
            user,
            data,
            parity,
            buf,
            parity_buf,
            low: 0,
            complete: false,
            dirty: false,
            urgent_at: None,
            sub_done: vec![false; subs],
            rebuilt: 0,
        });
        Ok(user)
    }

    fn index(&self, user: u64) -> Option<usize> {
        self.msgs.iter().position(|m| m.user == user)
    }

    /// The data receive of message `user`, whose bitmap its owner polls.
    pub fn handle(&self, user: u64) -> Option<&RecvHandle> {
        Some(&self.msgs[self.index(user)?].data)
    }

    /// Whether message `user` arrived whole (data chunks; rebuilt ones count).
    pub fn is_complete(&self, user: u64) -> bool {
        self.index(user).is_some_and(|i| self.msgs[i].complete)
    }

    /// `recv_imm_get` for message `user`.
    pub fn imm(&self, user: u64) -> Option<u32> {
        self.rx.imm(&self.msgs[self.index(user)?].data)
    }

    /// `recv_complete`: frees message `user`'s slots; its late packets are discarded.
    pub fn complete(&mut self, user: u64) -> bool {
        let Some(i) = self.index(user) else {
            return false;
        };
        let Some(m) = self.msgs.remove(i) else {
            return false;
        };
        self.rx.complete(&m.data);
        if let Some(p) = &m.parity {
            self.rx.complete(p);
        }
        true
    }

    /// Every message below it is complete.
    fn done_below(&self) -> u64 {
        self.msgs
            .iter()
            .find(|m| !m.complete)
            .map_or(self.next_sdr, |m| m.data.message)
    }

    /// Takes the chunks that arrived, rebuilds what EC can (through `mem`), and decides
    /// what to acknowledge.
    pub fn poll(&mut self, now: u64, mem: &dyn Memory) {
        self.rx.take_events(&mut self.events);
        let events = core::mem::take(&mut self.events);
        for ev in &events {
            let Some(i) = self.msgs.iter().position(|m| {
                m.data.message == ev.message
                    || m.parity.as_ref().is_some_and(|p| p.message == ev.message)
            }) else {
                continue;
            };
            let is_data = self.msgs[i].data.message == ev.message;
            self.msgs[i].dirty = true;
            if let Some((k, m)) = self.cfg.ec() {
                let j = if is_data {
                    ev.chunk / k
                } else {
                    ev.chunk / m.max(1)
                };
                self.try_decode(i, j, mem);
            }
            self.settle(now, i, is_data.then_some(ev.chunk));
        }
        self.events = events;
        self.events.clear();
        // A packet for a message no longer posted: its sender missed the acknowledgement
        // that completed it.
        let st = self.rx.stats();
        if st.stale_packets > self.stale_seen {
            self.stale_seen = st.stale_packets;
            if self.urgent.is_empty() {
                self.urgent.push_back(u64::MAX);
            }
        }
        // A chunk sent again that had arrived: the acknowledgement that said so was lost, so
        // the next interval repeats it (at once for a message already whole).
        if st.duplicate_packets > self.duplicates_seen {
            self.duplicates_seen = st.duplicate_packets;
            for m in self.msgs.iter_mut() {
                if !m.complete {
                    m.dirty = true;
                } else if !self.urgent.contains(&m.user) {
                    self.urgent.push_back(m.user);
                }
            }
        }
        if self.next_ack.is_none() && self.msgs.iter().any(|m| !m.complete) {
            self.next_ack = Some(now + self.cfg.ack_interval_ns);
        }
    }

    /// After an arrival for message `i` (data chunk `chunk`, if it was one): the cumulative
    /// point, completion, and a NACK.
    fn settle(&mut self, now: u64, i: usize, chunk: Option<u32>) {
        let m = &mut self.msgs[i];
        while m.low < m.data.chunks() && m.data.has(m.low) {
            m.low += 1;
        }
        if !m.complete && m.data.is_complete() {
            m.complete = true;
            self.stats.messages_complete += 1;
            self.urgent.push_back(m.user);
            return;
        }
        // A chunk past a missing one completed: say so now (at most once per interval
        // eighth), so the sender resends in one RTT.
        let hole = chunk.is_some_and(|c| c > m.low);
        let quiet = m
            .urgent_at
            .is_none_or(|t| now >= t + self.cfg.ack_interval_ns / 8);
        if self.cfg.nacks() && hole && quiet && !self.urgent.contains(&m.user) {
            m.urgent_at = Some(now);
            self.urgent.push_back(m.user);
        }
    }

    /// Rebuilds submessage `j` of message `i` if it is not whole and can be.
    fn try_decode(&mut self, i: usize, j: u32, mem: &dyn Memory) {
        let (Some(codec), Some((k, mm))) = (self.codec.as_mut(), self.cfg.ec()) else {
            return;
        };
        let m = &mut self.msgs[i];
        let Some(parity) = &m.parity else { return };
        if m.sub_done.get(j as usize).is_none_or(|&d| d) {
            return;
        }
        let chunks = m.data.chunks();
        let first = j * k;
        let real = k.min(chunks - first);
        let present: Vec<bool> = (0..k)
            .map(|n| n >= real || m.data.has(first + n))
            .chain((0..mm).map(|p| parity.has(j * mm + p)))
            .collect();
        if present[..k as usize].iter().all(|&p| p) {
            m.sub_done[j as usize] = true;
            return;
        }
        if !codec.decodable(&present) {
            return;
        }
        let cb = self.chunk_bytes as usize;
        let len = m.data.len;
        self.scratch.clear();
        self.scratch.resize((k + mm) as usize * cb, 0);
        for (n, chunk) in self.scratch.chunks_exact_mut(cb).enumerate() {
            if !present[n] {
                continue;
            }
            let ok = if n < k as usize {
                let start = u64::from(first + n as u32) * cb as u64;
                let l = len.saturating_sub(start).min(cb as u64) as usize;
                l == 0 || mem.read(m.buf, start, &mut chunk[..l])
            } else {
                let p = j * mm + (n - k as usize) as u32;
                mem.read(m.parity_buf, u64::from(p) * cb as u64, chunk)
            };
            if !ok {
                return;
            }
        }
        let mut views: Vec<&mut [u8]> = self.scratch.chunks_exact_mut(cb).collect();
        if codec.reconstruct(&mut views, &present).is_err() {
            return;
        }
        m.sub_done[j as usize] = true;
        self.stats.submessages_decoded += 1;
        for n in 0..real {
            if present[n as usize] {
                continue;
            }
            let c = first + n;
            let start = u64::from(c) * cb as u64;
            let l = len.saturating_sub(start).min(cb as u64) as usize;
            if mem.write(m.buf, start, &views[n as usize][..l]) {
                self.rx.mark_chunk(&m.data, c);
                m.rebuilt += 1;
                self.stats.chunks_rebuilt += 1;
            }
        }
    }

    fn ack_of(&self, i: usize) -> Ack {
        let m = &self.msgs[i];
        let chunks = m.data.chunks();
        let mut bitmap = vec![0u64; (chunks - m.low).div_ceil(64) as usize];
        for c in m.low..chunks {
            if m.data.has(c) {
                let d = c - m.low;
                bitmap[(d / 64) as usize] |= 1 << (d % 64);
            }
        }
        Ack {
            message: m.data.message,
            chunks,
            cumulative: m.low,
            bitmap,
            complete: m.complete,
            done_below: self.done_below(),
            rebuilt: m.rebuilt,
        }
    }

    /// The next acknowledgement to send on the control channel, if one is due.
    pub fn poll_control(&mut self, now: u64) -> Option<Vec<u8>> {
        let max = self.cfg.control_mtu;
        if let Some(user) = self.urgent.pop_front() {
            self.stats.acks_urgent += 1;
            match self.index(user) {
                Some(i) => {
                    self.msgs[i].dirty = false;
                    return Some(self.ack_of(i).encode(max));
                }
                None => {
                    // Completed and freed (or the stale marker): what is done is all it
                    // can say.
                    let below = self.done_below();
                    let ack = Ack {
                        message: below.wrapping_sub(1),
                        chunks: 0,
                        complete: true,
                        done_below: below,
                        ..Ack::default()
                    };
                    return Some(ack.encode(max));
                }
            }
        }
        let due = self.next_ack.is_some_and(|t| now >= t);
        if !due {
            return None;
        }
        let i = self.msgs.iter().position(|m| m.dirty && !m.complete);
        match i {
            Some(i) => {
                self.msgs[i].dirty = false;
                self.stats.acks_sent += 1;
                Some(self.ack_of(i).encode(max))
            }
            None => {
                self.next_ack = self
                    .msgs
                    .iter()
                    .any(|m| !m.complete)
                    .then_some(now + self.cfg.ack_interval_ns);
                None
            }
        }
    }

    /// When the next acknowledgement falls due.
    pub fn poll_timeout(&self) -> Option<u64> {
        self.next_ack
    }

    /// The counters.
    pub fn stats(&self) -> ReceiverStats {
        self.stats
    }
}
