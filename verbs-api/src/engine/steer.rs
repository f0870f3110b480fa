//! How the engines of a multi-queue device share its QPs: which engine each QP lives on
//! ([`QpEngines`]), and the inboxes through which one engine hands another a frame that
//! arrived on its queue for a QP it does not hold ([`Steer`]).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

use crossbeam::queue::ArrayQueue;
use hashbrown::HashMap;

use super::PortCounters;

/// Frames an engine's inbox holds for it from the other engines of its device.
const STEER_INBOX: usize = 4096;

/// Which engine of a device each QP lives on. A QP starts on engine `qpn % engines` (QPNs
/// are handed out in turn, so QPs spread evenly); one moved to another engine
/// ([`Device::move_qp`](crate::device::Device::move_qp), what failover onto another port will
/// do) is entered in a table. Every post and, on a multi-engine device, every received frame
/// asks; while no QP has moved the answer costs one atomic load and a division, as before QPs
/// could move, and after a move a read lock and a lookup.
///
/// A new QP goes to the least-loaded engine ([`place`](Self::place)): its number is drawn
/// so that `qpn % engines` names that engine, and the hot paths keep their division.
#[derive(Debug)]
pub(crate) struct QpEngines {
    engines: usize,
    /// Entries in `moved_to`: zero keeps the lock off the hot paths.
    moved: AtomicUsize,
    moved_to: RwLock<HashMap<u32, usize>>,
    /// QPs on each engine.
    qps: Box<[AtomicUsize]>,
    /// Packets each engine's QPs carried in the balancer's last interval (see
    /// [`Device::rebalance`](crate::device::Device::rebalance)).
    load: Box<[AtomicU64]>,
}

impl QpEngines {
    /// The table of a device with `engines` engines, no QP moved.
    pub(crate) fn new(engines: usize) -> Self {
        let engines = engines.max(1);
        Self {
            engines,
            moved: AtomicUsize::new(0),
            moved_to: RwLock::new(HashMap::new()),
            qps: (0..engines).map(|_| AtomicUsize::new(0)).collect(),
            load: (0..engines).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// How many engines there are.
    pub(crate) fn len(&self) -> usize {
        self.engines
    }

    /// The engine a new QP should live on: the least loaded, counting each engine's
    /// packets in the balancer's last interval plus an average QP's share for every QP it
    /// holds (so QPs created since, which carried nothing yet, count; with no load yet it is
    /// the engine with the fewest QPs), the first of equals.
    pub(crate) fn place(&self) -> usize {
        let load: Vec<u64> = self
            .load
            .iter()
            .map(|l| l.load(Ordering::Relaxed))
            .collect();
        let qps: Vec<u64> = self
            .qps
            .iter()
            .map(|n| n.load(Ordering::Relaxed) as u64)
            .collect();
        let per_qp = (load.iter().sum::<u64>() / qps.iter().sum::<u64>().max(1)).max(1);
        (0..self.engines)
            .min_by_key(|&e| load[e].saturating_add(qps[e].saturating_mul(per_qp)))
            .unwrap_or(0)
    }

    /// True when QP `qpn` starts on `engine` without an entry in the table.
    pub(crate) fn starts_on(&self, qpn: u32, engine: usize) -> bool {
        self.first(qpn) == engine
    }

    /// Counts a QP that came to `engine` (created or moved there).
    pub(crate) fn arrived(&self, engine: usize) {
        self.qps[engine].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a QP that left `engine` (destroyed or moved away).
    pub(crate) fn left(&self, engine: usize) {
        let _ = self.qps[engine]
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
    }

    /// QPs on each engine.
    pub(crate) fn qp_counts(&self) -> Vec<usize> {
        self.qps.iter().map(|n| n.load(Ordering::Relaxed)).collect()
    }

    /// Records each engine's packets in the balancer's last interval.
    pub(crate) fn set_load(&self, load: &[u64]) {
        for (slot, &l) in self.load.iter().zip(load) {
            slot.store(l, Ordering::Relaxed);
        }
    }

    /// The engine QP `qpn` starts on.
    fn first(&self, qpn: u32) -> usize {
        qpn as usize % self.engines
    }

    /// The engine QP `qpn` lives on.
    #[inline]
    pub(crate) fn owner(&self, qpn: u32) -> usize {
        if self.engines == 1 {
            return 0;
        }
        if self.moved.load(Ordering::Acquire) != 0 {
            let moved_to = self.moved_to.read().unwrap_or_else(PoisonError::into_inner);
            if let Some(&e) = moved_to.get(&qpn) {
                return e;
            }
        }
        self.first(qpn)
    }

    /// Records that QP `qpn` now lives on `engine`.
    pub(crate) fn set(&self, qpn: u32, engine: usize) {
        let mut moved_to = self
            .moved_to
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        if engine == self.first(qpn) {
            moved_to.remove(&qpn);
        } else {
            moved_to.insert(qpn, engine);
        }
        self.moved.store(moved_to.len(), Ordering::Release);
    }

    /// Forgets where QP `qpn` lived (it was destroyed): a new QP with its number starts on
    /// the first engine again.
    pub(crate) fn forget(&self, qpn: u32) {
        self.set(qpn, self.first(qpn));
    }
}

/// How the engines of a multi-queue device pass each other frames. A frame that arrived on
/// the queue of an engine that does not hold its QP is copied into the owner's inbox, as a NIC without a
/// flow rule on the BTH would have to: receive-side scaling hashes addresses and UDP ports,
/// and the peer picks the source port. The frame was checked on arrival (ICRC included), so
/// the owner does not check it again.
pub(crate) struct Steer {
    index: usize,
    homes: Arc<QpEngines>,
    inboxes: Arc<[ArrayQueue<Vec<u8>>]>,
    /// Buffers of delivered frames, for the next forward to reuse.
    pub(super) spare: Arc<ArrayQueue<Vec<u8>>>,
}

impl Steer {
    /// One `Steer` for each of `n` engines, finding QPs in `homes`.
    pub(crate) fn group(n: usize, homes: &Arc<QpEngines>) -> Vec<Self> {
        let inboxes: Arc<[ArrayQueue<Vec<u8>>]> =
            (0..n).map(|_| ArrayQueue::new(STEER_INBOX)).collect();
        let spare = Arc::new(ArrayQueue::new(STEER_INBOX));
        (0..n)
            .map(|index| Self {
                index,
                homes: homes.clone(),
                inboxes: inboxes.clone(),
                spare: spare.clone(),
            })
            .collect()
    }

    /// Hands `frame` to engine `to`; false if its inbox is full.
    fn forward(&self, to: usize, frame: &[u8]) -> bool {
        let mut buf = self.spare.pop().unwrap_or_default();
        buf.clear();
        buf.extend_from_slice(frame);
        match self.inboxes[to].push(buf) {
            Ok(()) => true,
            Err(buf) => {
                // Dropped like a frame on a full ring; its buffer serves the next forward.
                let _ = self.spare.push(buf);
                false
            }
        }
    }

    /// Hands `frame`, for QP `qpn`, to the engine that owns that QP when that is another
    /// engine (counted, as a drop too if its inbox is full); false when it is this one.
    pub(super) fn forward_to_owner(
        &self,
        qpn: u32,
        frame: &[u8],
        counters: &mut PortCounters,
    ) -> bool {
        let to = self.homes.owner(qpn);
        if to == self.index {
            return false;
        }
        counters.rx_forwarded += 1;
        if !self.forward(to, frame) {
            counters.rx_forward_drops += 1;
        }
        true
    }

    pub(super) fn inbox(&self) -> &ArrayQueue<Vec<u8>> {
        &self.inboxes[self.index]
    }
}
