//! SDR-RDMA on the verbs API (seed 004's Table 1, issue 21): an SDR QP over UC whose
//! receives the owner polls as a chunk bitmap, with selective repeat or erasure coding on
//! top ([`ferroce_reliability::sdr`]).
//!
//! An [`SdrQp`] is a handful of ordinary UC QPs on one device: one per generation, whose
//! WRITE-with-immediates the engine hands to the SDR receive table (they take no receive
//! WQE and make no completion), and one control QP for acknowledgements. The paper's calls
//! map as follows:
//!
//! | paper            | here                                                    |
//! |------------------|---------------------------------------------------------|
//! | `qp_create`      | [`SdrQp::new`], [`SdrQp::endpoint`], [`SdrQp::connect`] |
//! | `recv_post`      | [`SdrQp::post_recv`] (buffer, length; the chunk size is the QP's) |
//! | `recv_bitmap_get`| [`SdrQp::recv_handle`] → [`RecvHandle::bitmap`], `is_complete` |
//! | `recv_imm_get`   | [`SdrQp::recv_imm_get`]                                 |
//! | `recv_complete`  | [`SdrQp::recv_complete`]                                |
//! | `send_post`      | [`SdrQp::send`] (one-shot)                              |
//! | `send_stream_*`  | [`SdrQp::send_streaming`], [`SdrQp::stream_chunk`]       |
//! | `send_poll`      | [`SdrQp::poll_send`]                                    |
//!
//! The protocol's clock is the application's: [`SdrQp::progress`] moves acknowledgements,
//! timers and packets along, as a polling loop calls `ibv_poll_cq`.

use std::sync::{Mutex, MutexGuard};

use ferroce_reliability::sdr::codec::CodecError;
use ferroce_reliability::sdr::receiver::{Buffer, SdrReceiver};
use ferroce_reliability::sdr::recv::{PostError, RecvConfig, RecvHandle};
use ferroce_reliability::sdr::reliable::{
    Memory, ReceiverStats, ReliableConfig, ReliableReceiver, ReliableSender, SendDone, SendError,
    SenderStats, TxKind,
};
use ferroce_stack::transport::{
    Access, FixedRate, Payload, PdId, Policies, QpCaps, QpType, RecvWr, SendFlags, SendWr, Sge,
    WcOpcode, WorkCompletion, WrOpcode,
};
use ferroce_stack::wire::MacAddr;

use crate::connect::{connect_qp, ConnectOpts, Endpoint};
use crate::verbs::{
    CompletionQueue, Context, Gid, MemoryRegion, ProtectionDomain, QueuePair, VerbsError,
};

/// Control receives kept posted, and send slots in the control ring.
const CONTROL_SLOTS: usize = 64;
const CONTROL_BYTES: usize = 4096;
/// Chunks kept posted on the generation QPs ahead of the wire.
const AHEAD_CHUNKS: u32 = 4;

/// How an SDR QP is laid out and kept reliable; both ends use the same.
#[derive(Clone, Copy, Debug)]
pub struct SdrConfig {
    /// Immediate layout, MTU, chunk size, largest message, slots, generations.
    pub layout: RecvConfig,
    /// Selective repeat, erasure coding or the automatic choice, and their timers.
    pub reliability: ReliableConfig,
    /// Pace each generation QP to this link rate (Gbit/s): a UC QP has no window, and a
    /// one-shot send of a large message would otherwise leave at once.
    pub pace_gbps: Option<f64>,
}

/// What an SDR QP's peer needs to connect to it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SdrEndpoint {
    /// The device's GID.
    pub gid: Gid,
    /// Its MAC.
    pub mac: MacAddr,
    /// The generation QPs' numbers, in generation order.
    pub generations: Vec<u32>,
    /// The control QP's number.
    pub control: u32,
    /// The rkey of the zero-based receive region packets are written into.
    pub region: u32,
}

/// Why an SDR call failed.
#[derive(Debug, thiserror::Error)]
pub enum SdrError {
    /// The device refused.
    #[error(transparent)]
    Verbs(#[from] VerbsError),
    /// The receive could not be posted.
    #[error(transparent)]
    Post(#[from] PostError),
    /// An internal QP refused a work request.
    #[error("an internal QP refused a work request: {0}")]
    Wr(#[from] ferroce_stack::transport::PostError),
    /// The send could not be started.
    #[error(transparent)]
    Send(#[from] SendError),
    /// The erasure code could not be set up.
    #[error(transparent)]
    Codec(#[from] CodecError),
    /// The peer's endpoint has another number of generations.
    #[error("the peer has {peer} generations, this QP {mine}")]
    Generations {
        /// This QP's.
        mine: usize,
        /// The peer's.
        peer: usize,
    },
    /// A send before [`SdrQp::connect`].
    #[error("the SDR QP is not connected")]
    NotConnected,
}

ferroce_stack::counter_set! {
    /// Packets the SDR QP moved.
    pub struct SdrQpStats {
        /// Data and parity packets posted.
        packets_posted,
        /// Acknowledgements posted on the control QP.
        acks_posted,
        /// Acknowledgements received.
        acks_received,
    }
}

struct Inner {
    tx: ReliableSender,
    rx: ReliableReceiver,
    peer_region: Option<u32>,
    next_slot: usize,
    /// Chunks posted whose last packet's completion has not come back, per generation.
    chunks_out: Vec<u32>,
    wcs: Vec<WorkCompletion>,
    stats: SdrQpStats,
}

/// An SDR QP: see the [module](self).
pub struct SdrQp {
    ctx: Context,
    pd: PdId,
    cq: CompletionQueue,
    gens: Vec<QueuePair>,
    control: QueuePair,
    ring: MemoryRegion,
    receiver: SdrReceiver,
    config: SdrConfig,
    inner: Mutex<Inner>,
}

/// Registered memory as the EC layer reads and writes it: through the device's table.
struct DeviceMemory<'a> {
    ctx: &'a Context,
    pd: PdId,
}

impl Memory for DeviceMemory<'_> {
    fn read(&self, buf: Buffer, offset: u64, out: &mut [u8]) -> bool {
        self.ctx
            .dev
            .engine()
            .core_mut()
            .mem()
            .read(buf.lkey, self.pd, buf.va + offset, out, Access::NONE)
            .is_ok()
    }

    fn write(&self, buf: Buffer, offset: u64, data: &[u8]) -> bool {
        self.ctx
            .dev
            .engine()
            .core_mut()
            .mem()
            .write(
                buf.lkey,
                self.pd,
                buf.va + offset,
                data,
                Access::LOCAL_WRITE,
            )
            .is_ok()
    }
}

/// A chunk in a work request id: message (40 bits), parity flag, index (23 bits).
fn pack_chunk(message: u64, kind: TxKind, index: u32) -> u64 {
    (message & ((1 << 40) - 1)) << 24
        | u64::from(kind == TxKind::Parity) << 23
        | u64::from(index & 0x7f_ffff)
}

fn unpack_chunk(id: u64) -> (u64, TxKind, u32) {
    let kind = if id >> 23 & 1 == 1 {
        TxKind::Parity
    } else {
        TxKind::Data
    };
    (id >> 24, kind, (id & 0x7f_ffff) as u32)
}

/// Where in `mr` a buffer at `offset` starts, as the SDR layer names it.
fn buffer(mr: &MemoryRegion, offset: usize) -> Buffer {
    Buffer {
        lkey: mr.lkey(),
        va: mr.addr() + offset as u64,
    }
}

impl SdrQp {
    /// An SDR QP in `pd` of `ctx`'s device, its receive region registered and its internal
    /// QPs created (in RESET; [`connect`](Self::connect) brings them up).
    pub fn new(ctx: &Context, pd: &ProtectionDomain, config: SdrConfig) -> Result<Self, SdrError> {
        let layout = config.layout;
        let generations = usize::from(layout.generations.max(1));
        let cq = ctx.create_cq(1 << 16, None);
        let caps = QpCaps {
            max_send_wr: (AHEAD_CHUNKS + 2) * layout.chunk_packets.max(1) + 64,
            max_recv_wr: CONTROL_SLOTS as u32,
            ..QpCaps::default()
        };
        let mut gens = Vec::with_capacity(generations);
        for _ in 0..generations {
            let qp = pd.create_qp(QpType::Uc, caps, &cq, &cq)?;
            if let Some(gbps) = config.pace_gbps {
                // Full frames: MTU plus Ethernet, IPv4, UDP, BTH, RETH, ImmDt and ICRC.
                let frame = layout.mtu as usize + 78;
                let pace = FixedRate::filling(gbps, frame, 24);
                qp.set_reliability(Policies::default().with_congestion(Box::new(pace)))?;
            }
            gens.push(qp);
        }
        let control = pd.create_qp(QpType::Uc, caps, &cq, &cq)?;
        let ring = pd.alloc_mr(2 * CONTROL_SLOTS * CONTROL_BYTES, Access::LOCAL_WRITE)?;
        let receiver = ctx
            .dev
            .register(|mem| SdrReceiver::new(layout, mem, pd.id()).map(|r| (r.region(), r)))?
            .1;
        for (g, qp) in gens.iter().enumerate() {
            qp.set_write_imm_sink(receiver.sink(g as u8))?;
        }
        let mut tx = ReliableSender::new(layout, config.reliability)?;
        // Every chunk's last packet is signaled: its completion says when it left.
        tx.report_departures(true);
        let rx = ReliableReceiver::new(receiver.clone(), config.reliability)?;
        let this = Self {
            ctx: ctx.clone(),
            pd: pd.id(),
            cq,
            gens,
            control,
            ring,
            receiver,
            config,
            inner: Mutex::new(Inner {
                tx,
                rx,
                peer_region: None,
                next_slot: 0,
                chunks_out: vec![0; generations],
                wcs: Vec::new(),
                stats: SdrQpStats::default(),
            }),
        };
        Ok(this)
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What the peer connects to.
    pub fn endpoint(&self) -> SdrEndpoint {
        let e = Endpoint::of(&self.ctx, &self.control, &self.ring, 0);
        SdrEndpoint {
            gid: e.gid,
            mac: e.mac,
            generations: self.gens.iter().map(|q| q.qpn().value()).collect(),
            control: self.control.qpn().value(),
            region: self.receiver.region().rkey,
        }
    }

    /// Brings every internal QP to RTS towards `peer`'s, and posts the control receives.
    pub fn connect(&self, peer: &SdrEndpoint, o: &ConnectOpts) -> Result<(), SdrError> {
        if peer.generations.len() != self.gens.len() {
            return Err(SdrError::Generations {
                mine: self.gens.len(),
                peer: peer.generations.len(),
            });
        }
        let to = |qpn| Endpoint {
            qpn,
            psn: 0,
            gid: peer.gid,
            mac: peer.mac,
            addr: 0,
            len: 0,
            rkey: 0,
            offers: crate::connect::Capabilities::NONE,
            alt: None,
            rd_atomic: o.rd_atomic,
        };
        let opts = ConnectOpts {
            access: Access::REMOTE_WRITE,
            ..*o
        };
        for (qp, &qpn) in self.gens.iter().zip(&peer.generations) {
            connect_qp(&self.ctx, qp, 0, &to(qpn), &opts)?;
        }
        connect_qp(&self.ctx, &self.control, 0, &to(peer.control), &opts)?;
        for slot in 0..CONTROL_SLOTS {
            self.post_control_recv(slot)?;
        }
        self.lock().peer_region = Some(peer.region);
        Ok(())
    }

    fn post_control_recv(&self, slot: usize) -> Result<(), SdrError> {
        let sge = [self.ring.sge(slot * CONTROL_BYTES, CONTROL_BYTES)];
        self.control
            .post_recv(&[RecvWr {
                wr_id: slot as u64,
                sg_list: &sge,
            }])
            .map_err(|f| f.error.into())
    }

    /// Bytes of parity buffer a `len`-byte message needs under EC (0 otherwise).
    pub fn parity_len(&self, len: u64) -> u64 {
        self.lock().rx.parity_len(len)
    }

    /// `recv_post`: the next message sent lands in `len` bytes at `offset` of `mr` (EC:
    /// its parity in `parity`, [`parity_len`](Self::parity_len) bytes). Returns the
    /// message's number.
    pub fn post_recv(
        &self,
        mr: &MemoryRegion,
        offset: usize,
        len: u64,
        parity: Option<(&MemoryRegion, usize)>,
    ) -> Result<u64, SdrError> {
        let p = parity.map(|(m, o)| buffer(m, o));
        Ok(self.lock().rx.post(buffer(mr, offset), len, p)?)
    }

    /// `recv_bitmap_get`: the handle whose chunk bitmap the owner polls (without a lock:
    /// chunk bits are atomics the engine sets).
    pub fn recv_handle(&self, message: u64) -> Option<RecvHandle> {
        self.lock().rx.handle(message).cloned()
    }

    /// Whether message `message` arrived whole (rebuilt chunks count).
    pub fn recv_is_complete(&self, message: u64) -> bool {
        self.lock().rx.is_complete(message)
    }

    /// `recv_imm_get`.
    pub fn recv_imm_get(&self, message: u64) -> Option<u32> {
        self.lock().rx.imm(message)
    }

    /// `recv_complete`: the receive's slot is free for the next post, and its late packets
    /// fall into the discard target.
    pub fn recv_complete(&self, message: u64) -> bool {
        self.lock().rx.complete(message)
    }

    /// `send_post`, one-shot: `len` bytes at `offset` of `mr` (EC: parity computed into
    /// `parity`). Returns the message's number; [`poll_send`](Self::poll_send) reports it.
    pub fn send(
        &self,
        mr: &MemoryRegion,
        offset: usize,
        len: u64,
        imm: Option<u32>,
        parity: Option<(&MemoryRegion, usize)>,
    ) -> Result<u64, SdrError> {
        let mut inner = self.lock();
        if inner.peer_region.is_none() {
            return Err(SdrError::NotConnected);
        }
        let p = parity.map(|(m, o)| buffer(m, o));
        Ok(inner.tx.send(buffer(mr, offset), len, imm, p)?)
    }

    /// A streaming send of `len` bytes at `offset` of `mr`: chunks leave as
    /// [`stream_chunk`](Self::stream_chunk) adds them (selective repeat only).
    pub fn send_streaming(
        &self,
        mr: &MemoryRegion,
        offset: usize,
        len: u64,
        imm: Option<u32>,
    ) -> Result<u64, SdrError> {
        let mut inner = self.lock();
        if inner.peer_region.is_none() {
            return Err(SdrError::NotConnected);
        }
        Ok(inner.tx.send_streaming(buffer(mr, offset), len, imm)?)
    }

    /// Adds chunk `chunk` of streaming send `message` (again, for a resend).
    pub fn stream_chunk(&self, message: u64, chunk: u32) -> Result<(), SdrError> {
        Ok(self.lock().tx.stream_chunk(message, chunk)?)
    }

    /// `send_poll`: the next send the receiver acknowledged whole.
    pub fn poll_send(&self) -> Option<SendDone> {
        self.lock().tx.poll_done()
    }

    /// When the protocol's next timer is due (device clock, ns).
    pub fn poll_timeout(&self) -> Option<u64> {
        let inner = self.lock();
        [inner.tx.poll_timeout(), inner.rx.poll_timeout()]
            .into_iter()
            .flatten()
            .min()
    }

    /// Moves the protocol along: takes acknowledgements and chunk arrivals, runs due
    /// timers, posts packets and acknowledgements. Returns whether it did anything.
    pub fn progress(&self) -> Result<bool, SdrError> {
        let now = self.ctx.now();
        let mem = DeviceMemory {
            ctx: &self.ctx,
            pd: self.pd,
        };
        let mut inner = self.lock();
        let inner = &mut *inner;
        let mut worked = false;
        // The completions buffer is the QP's, kept between calls.
        let mut wcs = std::mem::take(&mut inner.wcs);
        self.cq.poll(&mut wcs, usize::MAX);
        let control = self.control.qpn();
        for wc in wcs.drain(..) {
            worked = true;
            if wc.qp_num == control && wc.opcode == WcOpcode::Recv {
                let slot = wc.wr_id as usize % CONTROL_SLOTS;
                let mut bytes = vec![0; (wc.byte_len as usize).min(CONTROL_BYTES)];
                if self.ring.read(slot * CONTROL_BYTES, &mut bytes) {
                    inner.tx.on_control(now, &bytes);
                    inner.stats.acks_received += 1;
                }
                self.post_control_recv(slot)?;
            } else if wc.opcode == WcOpcode::RdmaWrite {
                // A chunk's last packet left: its timeout starts now.
                if let Some(g) = self.gens.iter().position(|q| q.qpn() == wc.qp_num) {
                    inner.chunks_out[g] = inner.chunks_out[g].saturating_sub(1);
                }
                let (message, kind, index) = unpack_chunk(wc.wr_id);
                inner.tx.on_departed(now, message, kind, index);
            }
        }
        inner.wcs = wcs;
        if inner.tx.poll_timeout().is_some_and(|t| t <= now) {
            inner.tx.handle_timeout(now);
        }
        // Two generations' QPs each paced to the link would together send at twice its
        // rate, so a paced SDR QP keeps one busy at a time; unpaced, both drain through the
        // same port as fast as it goes, and waiting for one to empty before the other
        // starts leaves the port idle in between.
        let paced = self.config.pace_gbps.is_some();
        if let Some(region) = inner.peer_region {
            // A few chunks ahead, all on one generation's QP (see next_generation).
            while let Some(g) = inner.tx.next_generation() {
                let out: u32 = inner.chunks_out.iter().sum();
                let others = out - inner.chunks_out[usize::from(g)];
                if out >= AHEAD_CHUNKS || (paced && others > 0) {
                    break;
                }
                let Some(c) = inner.tx.poll_transmit(now, &mem) else {
                    break;
                };
                worked = true;
                let n = c.packets.len();
                let Some(g) = c.packets.first().map(|p| usize::from(p.generation)) else {
                    continue;
                };
                // One post for the chunk's packets (one engine lock, not one a packet).
                let sges: Vec<[Sge; 1]> = (0..n).map(|i| c.sge(i)).collect();
                let id = pack_chunk(c.message, c.kind, c.index);
                // The chunk's last packet is signaled: its completion frees a place.
                let wrs: Vec<SendWr<'_>> = sges
                    .iter()
                    .enumerate()
                    .map(|(i, sge)| c.write(i, sge, region, id, i + 1 == n))
                    .collect();
                self.gens[g]
                    .post_send(&wrs)
                    .map_err(|f| SdrError::from(f.error))?;
                inner.stats.packets_posted += n as u64;
                inner.chunks_out[g] += 1;
            }
        }
        inner.rx.poll(now, &mem);
        while let Some(ack) = inner.rx.poll_control(now) {
            worked = true;
            let slot = CONTROL_SLOTS + inner.next_slot;
            inner.next_slot = (inner.next_slot + 1) % CONTROL_SLOTS;
            let n = ack.len().min(CONTROL_BYTES);
            if !self.ring.write(slot * CONTROL_BYTES, &ack[..n]) {
                continue;
            }
            let sge = [self.ring.sge(slot * CONTROL_BYTES, n)];
            let wr = SendWr::new(u64::MAX, WrOpcode::Send, Payload::Sges(&sge)).flags(SendFlags(0));
            self.control
                .post_send(&[wr])
                .map_err(|f| SdrError::from(f.error))?;
            inner.stats.acks_posted += 1;
        }
        Ok(worked)
    }

    /// The counters: the SDR QP's, its sender's and its receiver's, and the receive table's.
    pub fn stats(
        &self,
    ) -> (
        SdrQpStats,
        SenderStats,
        ReceiverStats,
        ferroce_reliability::sdr::receiver::SdrRecvStats,
    ) {
        let inner = self.lock();
        (
            inner.stats,
            inner.tx.stats(),
            inner.rx.stats(),
            self.receiver.stats(),
        )
    }

    /// The settings.
    pub fn config(&self) -> SdrConfig {
        self.config
    }
}
