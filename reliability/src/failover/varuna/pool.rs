//! Varuna's shared backup channels (seed 001 §3.5, Figure 7), sans-IO: instead of a
//! dedicated backup QP per vQP made ready before any failure, a small pool of QPs on the
//! backup port, shared by every vQP, carries the failed-over traffic at once, while each
//! vQP's dedicated backup QP is rebuilt in the background; a vQP moves to its own QP once
//! that is connected and the vQP has nothing in flight on the shared one.
//!
//! The paper's shared channels are DC QPs (one initiator reaches any target). ferroce has
//! no DC transport, so here a shared channel is an RC QP to one peer — the pool is per peer,
//! which is what the paper's experiments use (many clients, one server). Many vQPs' work
//! requests on one RC QP need their ids kept apart: [`BackupPool::tag`] gives each a
//! channel-unique id and [`BackupPool::untag`] maps a completion back to its vQP and id.
//! Completions on an RC QP come in posting order, so an id completed also completes every
//! one posted before it on that channel (unsignaled ones included) — which is how untagged
//! entries are freed.
//!
//! Departures: a vQP switches to its rebuilt QP only when quiescent (nothing outstanding
//! on the shared channel), instead of letting its in-flight requests finish there while new
//! ones start on the new QP — a vQP recovers completions in posting order, which two QPs
//! cannot promise; and the channel is chosen round-robin, not at random.

use std::collections::VecDeque;

/// Where a vQP's backup traffic goes now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Channel {
    /// Not failed over yet.
    None,
    /// Shared channel `k` of the pool.
    Shared(usize),
    /// Its own backup QP (rebuilt).
    Dedicated,
}

ferroce_stack::counter_set! {
    /// What the pool did.
    pub struct PoolStats {
        /// vQPs bound to a shared channel at failover.
        bound,
        /// Dedicated QPs rebuilt.
        rebuilt,
        /// vQPs moved from a shared channel to their own QP.
        switched,
        /// When the last rebuild finished: a time, not a count (`accumulate` sums it like
        /// the others, so read it per pool).
        last_rebuilt_at,
    }
}

#[derive(Clone, Copy, Debug)]
struct Binding {
    channel: Channel,
    /// Its dedicated QP is connected (from this time).
    ready: bool,
}

/// The shared backup channels of one peer and the rebuild queue (see the module
/// documentation).
#[derive(Debug)]
pub struct BackupPool {
    shared: usize,
    next_shared: usize,
    rebuild_ns: u64,
    vqps: Vec<Binding>,
    /// Rebuilds queued (vQP), and the one in progress with its finish time: connection
    /// setups run one at a time, as an application's connection manager does them.
    queue: VecDeque<usize>,
    current: Option<(usize, u64)>,
    /// Per shared channel: tags posted and not completed, in posting order: (tag, vQP, id).
    inflight: Vec<VecDeque<(u64, usize, u64)>>,
    next_tag: u64,
    stats: PoolStats,
}

impl BackupPool {
    /// A pool of `shared` channels (at least one) for `vqps` vQPs; rebuilding one dedicated
    /// QP takes `rebuild_ns` (creation, the address exchange, the state transitions).
    pub fn new(vqps: usize, shared: usize, rebuild_ns: u64) -> Self {
        let shared = shared.max(1);
        Self {
            shared,
            next_shared: 0,
            rebuild_ns,
            vqps: vec![
                Binding {
                    channel: Channel::None,
                    ready: false,
                };
                vqps
            ],
            queue: VecDeque::new(),
            current: None,
            inflight: vec![VecDeque::new(); shared],
            next_tag: 1,
            stats: PoolStats::default(),
        }
    }

    /// Channels in the pool.
    pub fn shared(&self) -> usize {
        self.shared
    }

    /// What it did.
    pub fn stats(&self) -> PoolStats {
        self.stats
    }

    /// Where vQP `v`'s backup traffic goes now.
    pub fn channel(&self, v: usize) -> Channel {
        self.vqps.get(v).map_or(Channel::None, |b| b.channel)
    }

    /// vQP `v` fails over at `now`: bound to the next shared channel, its own QP queued for
    /// rebuilding. Returns where it posts; a vQP already failed over keeps its channel.
    pub fn fail_over(&mut self, v: usize, now: u64) -> Channel {
        let Some(b) = self.vqps.get_mut(v) else {
            return Channel::None;
        };
        if b.channel != Channel::None {
            return b.channel;
        }
        let k = self.next_shared;
        self.next_shared = (k + 1) % self.shared;
        b.channel = Channel::Shared(k);
        self.stats.bound += 1;
        self.queue.push_back(v);
        self.start_next(now);
        Channel::Shared(k)
    }

    fn start_next(&mut self, now: u64) {
        if self.current.is_none() {
            if let Some(v) = self.queue.pop_front() {
                self.current = Some((v, now.saturating_add(self.rebuild_ns)));
            }
        }
    }

    /// When [`poll`](Self::poll) has a rebuild to finish.
    pub fn next_timeout(&self) -> Option<u64> {
        self.current.map(|(_, t)| t)
    }

    /// The rebuild due at `now`, if any: the vQP whose dedicated QP the caller connects now
    /// (then [`switch`](Self::switch) moves the vQP onto it once it is quiescent).
    pub fn poll(&mut self, now: u64) -> Option<usize> {
        let (v, t) = self.current?;
        if t > now {
            return None;
        }
        self.current = None;
        if let Some(b) = self.vqps.get_mut(v) {
            b.ready = true;
        }
        self.stats.rebuilt += 1;
        self.stats.last_rebuilt_at = t;
        // Back to back: the next setup started when this one ended.
        self.start_next(t);
        Some(v)
    }

    /// vQP `v`, quiescent, moves to its own QP if that is ready; true if it did.
    pub fn switch(&mut self, v: usize) -> bool {
        let Some(b) = self.vqps.get_mut(v) else {
            return false;
        };
        if !b.ready || !matches!(b.channel, Channel::Shared(_)) {
            return false;
        }
        b.channel = Channel::Dedicated;
        self.stats.switched += 1;
        true
    }

    /// The id to post vQP `v`'s work request `wr_id` with on shared channel `k`.
    pub fn tag(&mut self, k: usize, v: usize, wr_id: u64) -> u64 {
        let tag = self.next_tag;
        self.next_tag += 1;
        if let Some(q) = self.inflight.get_mut(k) {
            q.push_back((tag, v, wr_id));
        }
        tag
    }

    /// A completion on shared channel `k` with id `tag`: the vQP and the id it posted (an
    /// unknown tag — never posted here, or already completed — is `None`). Every tag posted
    /// before it on the channel is done too.
    pub fn untag(&mut self, k: usize, tag: u64) -> Option<(usize, u64)> {
        let q = self.inflight.get_mut(k)?;
        if !q.iter().any(|&(t, _, _)| t == tag) {
            return None;
        }
        while let Some((t, v, id)) = q.pop_front() {
            if t == tag {
                return Some((v, id));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failover_binds_round_robin_and_rebuilds_one_at_a_time() {
        let mut p = BackupPool::new(4, 2, 100);
        assert_eq!(p.channel(0), Channel::None);
        assert_eq!(p.fail_over(0, 10), Channel::Shared(0));
        assert_eq!(p.fail_over(1, 10), Channel::Shared(1));
        assert_eq!(p.fail_over(2, 10), Channel::Shared(0));
        assert_eq!(p.fail_over(0, 20), Channel::Shared(0), "kept");
        assert_eq!(p.next_timeout(), Some(110));
        assert_eq!(p.poll(109), None);
        assert_eq!(p.poll(110), Some(0));
        assert_eq!(p.next_timeout(), Some(210), "the next starts when one ends");
        assert_eq!(p.poll(500), Some(1));
        assert_eq!(p.next_timeout(), Some(310), "back to back");
        assert_eq!(p.poll(500), Some(2));
        assert_eq!(p.poll(500), None);
        assert_eq!(p.next_timeout(), None);
        assert!(!p.switch(3), "never failed over");
        assert!(p.switch(0));
        assert_eq!(p.channel(0), Channel::Dedicated);
        assert!(!p.switch(0), "once");
        assert_eq!(p.stats().rebuilt, 3);
        assert_eq!(p.stats().switched, 1);
        assert_eq!(p.stats().last_rebuilt_at, 310);
    }

    #[test]
    fn a_switch_waits_for_the_rebuild() {
        let mut p = BackupPool::new(1, 1, 100);
        p.fail_over(0, 0);
        assert!(!p.switch(0));
        assert_eq!(p.poll(100), Some(0));
        assert!(p.switch(0));
    }

    /// Tags keep many vQPs' ids apart on one channel; a completion frees everything posted
    /// before it (RC order: unsignaled requests complete with the next signaled one); a
    /// stale or unknown tag maps to nothing.
    #[test]
    fn tags_map_completions_back_in_order() {
        let mut p = BackupPool::new(3, 1, 100);
        let a = p.tag(0, 0, 7);
        let b = p.tag(0, 1, 7);
        let c = p.tag(0, 2, 9);
        assert_ne!(a, b);
        assert_eq!(p.untag(0, b), Some((1, 7)));
        assert_eq!(p.untag(0, a), None, "completed with b");
        assert_eq!(p.untag(0, 999), None);
        assert_eq!(p.untag(1, c), None, "no such channel");
        assert_eq!(p.untag(0, c), Some((2, 9)));
        assert_eq!(p.untag(0, c), None, "once");
    }
}
