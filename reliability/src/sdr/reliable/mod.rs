//! Reliability on SDR's bitmap (§4.2, §5.2): selective repeat with a timeout or with NACKs,
//! and erasure coding with selective repeat as the fallback — one policy per connection.
//!
//! Sans-IO, like the transport: a [`ReliableSender`] is given messages and acknowledgements
//! and time and asked for chunks to send (each a list of SDR packets its driver posts on the
//! generation's UC QP); a [`ReliableReceiver`] is told of chunk arrivals (its
//! [`SdrReceiver`](super::receiver::SdrReceiver) collects them from the engine) and asked
//! for acknowledgements to send on the control channel (ferroce's layout in
//! [`ack`](super::ack)).
//!
//! - **SR** (`sr-rto`): the receiver acknowledges every `ack_interval` while a message is
//!   incomplete, and at once when it completes; the sender resends a chunk not acknowledged
//!   `rto_rtts` RTTs after it left (the paper: 3).
//! - **SR with NACK** (`sr-nack`, §5.2.1): the receiver acknowledges at once when a chunk
//!   completes beyond a missing one, and the sender takes a chunk as lost as soon as an
//!   acknowledgement shows a chunk sent after it — on one path nothing overtakes, so the
//!   earlier one will not come (RACK's rule). A timeout of a little over one RTT remains
//!   for a loss nothing was sent after.
//! - **EC(k, m)**: each submessage of `k` data chunks is followed by `m` parity chunks,
//!   which travel as the next SDR message into a parity buffer the receiver posted with
//!   the data; the receiver rebuilds missing data chunks in place as soon as the chunks
//!   that arrived determine them. A submessage still not whole `(1 + β)` RTTs after its last
//!   parity chunk left goes to selective repeat with NACKs for its missing data chunks.

mod receiver;
mod sender;
#[cfg(test)]
mod tests;

pub use receiver::{ReceiverStats, ReliableReceiver};
pub use sender::{ReliableSender, SendDone, SendError, SenderStats, TxChunk, TxKind};

use ferroce_stack::transport::{Access, MrTable, PdId};

use super::codec::{self, CodecError, ErasureCodec, Xor};
use super::model::{Code, Scheme};
use super::receiver::Buffer;

/// A connection's reliability settings; both ends use the same.
#[derive(Clone, Copy, Debug)]
pub struct ReliableConfig {
    /// The scheme.
    pub scheme: Scheme,
    /// The round-trip time timeouts are counted in, ns.
    pub rtt_ns: u64,
    /// How often an incomplete message is acknowledged, ns.
    pub ack_interval_ns: u64,
    /// Bytes an acknowledgement may take (the control channel's MTU).
    pub control_mtu: usize,
    /// Automatic choice ([`auto`](super::auto)): per message, SR with NACKs or the EC
    /// `scheme`, by the model at this link rate (Gbit/s). Both ends then number a parity
    /// message after every data message, sent only when EC was chosen.
    pub auto_gbps: Option<f64>,
    /// The Reed-Solomon backend for `Code::Mds` ([`codec::mds`] unless set).
    pub mds: codec::MdsFactory,
    /// The most a chunk may wait in queues after it left its QP (50 µs unless set): the
    /// timeouts' floor over the RTT. It matters only where the RTT is of that order.
    pub queue_slack_ns: u64,
}

impl ReliableConfig {
    /// `scheme` over a path of `rtt_ns`, acknowledging every `rtt_ns / 64` (at least 1 µs)
    /// on a 4 KiB control channel.
    pub fn new(scheme: Scheme, rtt_ns: u64) -> Self {
        Self {
            scheme,
            rtt_ns,
            ack_interval_ns: (rtt_ns / 64).max(1000),
            control_mtu: 4096,
            auto_gbps: None,
            mds: codec::mds,
            queue_slack_ns: 50_000,
        }
    }

    /// Automatic choice between SR with NACKs and `ec` (an EC scheme) on a `gbps` link.
    pub fn auto(ec: Scheme, rtt_ns: u64, gbps: f64) -> Self {
        Self {
            auto_gbps: Some(gbps),
            ..Self::new(ec, rtt_ns)
        }
    }

    /// Its name in reports: the scheme's, or `auto`.
    pub fn name(&self) -> &'static str {
        match self.auto_gbps {
            Some(_) => "auto",
            None => self.scheme.name(),
        }
    }

    /// When a chunk not acknowledged is sent again, ns after it left. With NACKs (and in
    /// EC's fallback) a little over one RTT: the acknowledgement of a chunk that arrived
    /// comes back within one RTT and an interval or two. Never less than the RTT plus
    /// [`queue_slack_ns`](Self::queue_slack_ns): a chunk that left its QP may still wait
    /// in the port's queue behind another generation's.
    pub fn rto_ns(&self, fallback: bool) -> u64 {
        let nack = self.rtt_ns + 2 * self.ack_interval_ns + self.rtt_ns / 8;
        let rto = match self.scheme {
            Scheme::SrRto { rto_rtts } if !fallback => (self.rtt_ns as f64 * rto_rtts) as u64,
            _ => nack,
        };
        rto.max(self.rtt_ns + self.queue_slack_ns)
    }

    /// Whether an acknowledgement showing a later chunk names a loss.
    pub fn nacks(&self) -> bool {
        !matches!(self.scheme, Scheme::SrRto { .. })
    }

    /// `(k, m)` for EC.
    pub fn ec(&self) -> Option<(u32, u32)> {
        match self.scheme {
            Scheme::Ec { k, m, .. } => Some((k.max(1), m)),
            _ => None,
        }
    }

    /// EC's fallback slack in ns: `(1 + β)·RTT`, and at least the RTT plus
    /// [`queue_slack_ns`](Self::queue_slack_ns) (the submessage's last chunk may still be
    /// queued when its timer starts).
    pub fn fallback_ns(&self) -> u64 {
        match self.scheme {
            Scheme::Ec { beta, .. } => {
                (((1.0 + beta) * self.rtt_ns as f64) as u64).max(self.rtt_ns + self.queue_slack_ns)
            }
            _ => 0,
        }
    }

    /// The codec EC runs, if any.
    pub fn codec(&self) -> Result<Option<Box<dyn ErasureCodec>>, CodecError> {
        match self.scheme {
            Scheme::Ec {
                code: Code::Mds,
                k,
                m,
                ..
            } => (self.mds)(k as usize, m as usize).map(Some),
            Scheme::Ec {
                code: Code::Xor,
                k,
                m,
                ..
            } => Ok(Some(Box::new(Xor::new(k as usize, m as usize)?))),
            _ => Ok(None),
        }
    }
}

/// Bytes of the parity message a `len`-byte EC message travels with: `m` chunks for each
/// submessage of `k` data chunks, and [`sub_parity`] for a short last one —
/// `⌈chunks·m/k⌉` in all, as the model counts them.
pub fn parity_len(len: u64, chunk_bytes: u64, k: u32, m: u32) -> u64 {
    let chunks = len.div_ceil(chunk_bytes.max(1)).max(1);
    let k = u64::from(k.max(1));
    let subs = chunks.div_ceil(k);
    let last = chunks - (subs - 1) * k;
    ((subs - 1) * u64::from(m) + u64::from(sub_parity(last as u32, k as u32, m))) * chunk_bytes
}

/// Parity chunks of a submessage of `d` data chunks: `m` for a whole one, `⌈d·m/k⌉` for a
/// short last one, so parity stays in proportion. An MDS code (the missing data chunks read
/// as zeros at both ends) still rebuilds any that many losses; XOR protects the groups whose
/// parity chunk was sent.
pub fn sub_parity(d: u32, k: u32, m: u32) -> u32 {
    (u64::from(d) * u64::from(m))
        .div_ceil(u64::from(k.max(1)))
        .min(u64::from(m)) as u32
}

/// Registered memory as the EC layer reads and writes it (encoding at the sender, rebuilding
/// at the receiver). Offsets are bytes into a [`Buffer`].
pub trait Memory {
    /// Copies `out.len()` bytes at `offset` of `buf` out; false when the memory refuses.
    fn read(&self, buf: Buffer, offset: u64, out: &mut [u8]) -> bool;
    /// Copies `data` to `offset` of `buf`; false when the memory refuses.
    fn write(&self, buf: Buffer, offset: u64, data: &[u8]) -> bool;

    /// Calls `f` with the bytes of `len` at each `offset` of `ranges` in `buf`; false (and
    /// no call) when the memory refuses. The default copies them out; a memory that can
    /// lend them in place (an [`MrTable`]) saves the copy, which costs as much as encoding.
    fn with_ranges(
        &self,
        buf: Buffer,
        ranges: &[(u64, usize)],
        f: &mut dyn FnMut(&[&[u8]]),
    ) -> bool {
        let mut copies = Vec::with_capacity(ranges.len());
        for &(offset, len) in ranges {
            let mut v = vec![0; len];
            if !self.read(buf, offset, &mut v) {
                return false;
            }
            copies.push(v);
        }
        let views: Vec<&[u8]> = copies.iter().map(Vec::as_slice).collect();
        f(&views);
        true
    }
}

/// [`Memory`] through a transport's [`MrTable`], with local rights in one PD.
#[derive(Clone, Copy)]
pub struct TableMemory<'a> {
    /// The table.
    pub mem: &'a MrTable,
    /// The PD the buffers are in.
    pub pd: PdId,
}

impl Memory for TableMemory<'_> {
    fn read(&self, buf: Buffer, offset: u64, out: &mut [u8]) -> bool {
        self.mem
            .read(buf.lkey, self.pd, buf.va + offset, out, Access::NONE)
            .is_ok()
    }

    fn write(&self, buf: Buffer, offset: u64, data: &[u8]) -> bool {
        self.mem
            .write(
                buf.lkey,
                self.pd,
                buf.va + offset,
                data,
                Access::LOCAL_WRITE,
            )
            .is_ok()
    }

    fn with_ranges(
        &self,
        buf: Buffer,
        ranges: &[(u64, usize)],
        f: &mut dyn FnMut(&[&[u8]]),
    ) -> bool {
        let at: Vec<(u64, usize)> = ranges.iter().map(|&(o, l)| (buf.va + o, l)).collect();
        self.mem
            .with_slices(buf.lkey, self.pd, &at, Access::NONE, |s| f(s))
            .is_ok()
    }
}
