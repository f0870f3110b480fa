//! A hashed timer wheel for QP deadlines.
//!
//! QPs re-arm their retransmission timer on almost every ACK, and almost none fire, so the
//! wheel is lazy: an entry names a QP and the deadline it was armed for; when it comes due the
//! engine asks the QP for its current deadline and either runs it or re-arms. Insertion is
//! O(1); advancing costs one slot per tick elapsed (bounded by the wheel size per call).

/// Width of one slot: 2^14 ns = 16.4 µs, finer than the shortest RNR timer (10 µs rounds up
/// to two slots at worst) and than any local ACK timeout worth using.
const TICK_SHIFT: u32 = 14;
/// Slots: 4096 × 16.4 µs = 67 ms per lap; later deadlines wait in their slot for later laps.
const SLOTS: usize = 4096;

/// Deadlines keyed by QP number.
#[derive(Debug)]
pub struct TimerWheel {
    slots: Vec<Vec<(u64, u32)>>,
    /// The next tick to process.
    next_tick: u64,
    len: usize,
    /// The earliest deadline noted since [`take_earliest_new`](Self::take_earliest_new).
    earliest_new: u64,
}

impl TimerWheel {
    /// An empty wheel starting at time `now`.
    pub fn new(now: u64) -> Self {
        Self {
            slots: vec![Vec::new(); SLOTS],
            next_tick: now >> TICK_SHIFT,
            len: 0,
            earliest_new: u64::MAX,
        }
    }

    /// Arms `qpn` for `deadline` (ns).
    pub fn insert(&mut self, deadline: u64, qpn: u32) {
        let tick = (deadline >> TICK_SHIFT).max(self.next_tick);
        self.slots[(tick as usize) % SLOTS].push((deadline, qpn));
        self.len += 1;
        self.note(deadline);
    }

    /// Notes a QP deadline, armed in the wheel or already covered by an earlier entry of the
    /// same QP (which re-checks the QP when it fires).
    pub fn note(&mut self, deadline: u64) {
        self.earliest_new = self.earliest_new.min(deadline);
    }

    /// The earliest deadline noted since the last call, if any: what a thread that turned
    /// the engine tells an engine thread asleep until a later deadline. A QP whose new
    /// deadline is covered by an earlier wheel entry arms nothing new, but an engine thread
    /// that went to sleep after that QP's deadline went away does not know of the entry, so
    /// every deadline a turn leaves is noted, not only those inserted.
    pub fn take_earliest_new(&mut self) -> Option<u64> {
        let t = core::mem::replace(&mut self.earliest_new, u64::MAX);
        (t != u64::MAX).then_some(t)
    }

    /// Entries armed.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when nothing is armed.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Calls `f(qpn)` for every entry whose deadline is at or before `now`, once each.
    pub fn expire(&mut self, now: u64, mut f: impl FnMut(u32)) {
        let now_tick = now >> TICK_SHIFT;
        let mut ticks = 0;
        while self.next_tick <= now_tick && ticks < SLOTS as u64 {
            let slot = &mut self.slots[(self.next_tick as usize) % SLOTS];
            let mut i = 0;
            while i < slot.len() {
                if slot[i].0 <= now {
                    let (_, qpn) = slot.swap_remove(i);
                    self.len -= 1;
                    f(qpn);
                } else {
                    i += 1;
                }
            }
            if self.next_tick == now_tick {
                // Entries due later within the current tick stay; look again next call.
                break;
            }
            self.next_tick += 1;
            ticks += 1;
        }
        if ticks == SLOTS as u64 {
            // A whole lap passed without a call: jump ahead (every slot was scanned once).
            self.next_tick = now_tick;
        }
    }

    /// The earliest deadline armed (a scan; used when a simulator must know how far to jump).
    pub fn earliest(&self) -> Option<u64> {
        self.slots.iter().flatten().map(|&(d, _)| d).min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fires_due_entries_once_and_keeps_later_laps() {
        let mut w = TimerWheel::new(0);
        w.insert(10_000, 1);
        w.insert(100_000, 2);
        w.insert(200_000_000, 3); // three laps ahead
        let mut fired = Vec::new();
        w.expire(50_000, |q| fired.push(q));
        assert_eq!(fired, [1]);
        w.expire(150_000, |q| fired.push(q));
        assert_eq!(fired, [1, 2]);
        w.expire(199_999_999, |q| fired.push(q));
        assert_eq!(fired, [1, 2]);
        w.expire(200_000_000, |q| fired.push(q));
        assert_eq!(fired, [1, 2, 3]);
        assert!(w.is_empty());
    }

    #[test]
    fn a_deadline_in_the_past_fires_at_the_next_call() {
        let mut w = TimerWheel::new(1_000_000);
        w.expire(1_000_000, |_| {});
        w.insert(5, 9);
        let mut fired = Vec::new();
        w.expire(1_000_001, |q| fired.push(q));
        assert_eq!(fired, [9]);
        assert_eq!(w.earliest(), None);
    }
}
