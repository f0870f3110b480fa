//! The spec's timer encodings (the local ACK timeout exponent and the RNR NAK timer code),
//! and the table of a QP's deadlines.

use core::num::NonZeroU64;

/// The local ACK timeout for the `timeout` attribute: 4.096 µs · 2^timeout (IBTA §9.7.6.1.3,
/// C9-140), `None` for 0, which means wait forever. Values above 31 are clamped to 31 as
/// libibverbs providers do.
pub fn local_ack_timeout_ns(timeout: u8) -> Option<u64> {
    match timeout {
        0 => None,
        t => Some(4096u64 << t.min(31)),
    }
}

/// RNR NAK timer codes in units of 10 µs (IBTA table 45): the delay a requester waits before
/// retrying after an RNR NAK carrying this code. Code 0 is the longest, 655.36 ms.
const RNR_TIMER_10US: [u64; 32] = [
    65_536, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536,
    2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768, 49152,
];

/// The delay for RNR timer `code` (its low five bits), in nanoseconds.
pub fn rnr_timer_ns(code: u8) -> u64 {
    RNR_TIMER_10US[usize::from(code & 0x1f)] * 10_000
}

/// `rnr_retry` 7 means retry forever (IBTA §9.7.5.2.8).
pub const RNR_RETRY_INFINITE: u8 = 7;

/// The timers of a QP's requester.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Timer {
    /// The local ACK timeout: resend when nothing was acknowledged in time.
    Retry,
    /// After an RNR NAK: send nothing until it expires.
    Rnr,
    /// Pacing: send no request before it expires.
    Pace,
}

impl Timer {
    const COUNT: usize = 3;
}

/// Each timer's deadline in one place (quinn-proto's `TimerTable`): the QP's next wakeup is
/// their minimum, and arming, stopping and testing a timer is one call rather than a
/// hand-written `Option` dance at every site. A deadline is stored as a non-zero `u64` (a
/// deadline of 0, possible only at time 0, is kept as 1 ns), so the table takes 8 bytes a
/// timer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct TimerTable {
    at: [Option<NonZeroU64>; Timer::COUNT],
}

impl TimerTable {
    /// Arms `timer` for `at`, replacing any earlier setting.
    pub(crate) fn set(&mut self, timer: Timer, at: u64) {
        self.at[timer as usize] = NonZeroU64::new(at.max(1));
    }

    /// Arms `timer` for `at`, or stops it when `at` is `None` (an infinite timeout).
    pub(crate) fn set_or_stop(&mut self, timer: Timer, at: Option<u64>) {
        match at {
            Some(at) => self.set(timer, at),
            None => self.stop(timer),
        }
    }

    /// Stops `timer`.
    pub(crate) fn stop(&mut self, timer: Timer) {
        self.at[timer as usize] = None;
    }

    /// When `timer` expires, if armed.
    pub(crate) fn get(&self, timer: Timer) -> Option<u64> {
        self.at[timer as usize].map(NonZeroU64::get)
    }

    /// True when `timer` is armed.
    pub(crate) fn is_armed(&self, timer: Timer) -> bool {
        self.at[timer as usize].is_some()
    }

    /// True when `timer` is armed and its deadline is not after `now`.
    pub(crate) fn expired(&self, timer: Timer, now: u64) -> bool {
        self.get(timer).is_some_and(|t| t <= now)
    }

    /// The earliest deadline of any armed timer.
    pub(crate) fn next(&self) -> Option<u64> {
        self.at.iter().flatten().map(|t| t.get()).min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ack_timeout_follows_the_exponent() {
        assert_eq!(local_ack_timeout_ns(0), None);
        assert_eq!(local_ack_timeout_ns(1), Some(8_192));
        // perftest's timeout=14: 4.096 us * 16384 = 67.1 ms.
        assert_eq!(local_ack_timeout_ns(14), Some(67_108_864));
        assert_eq!(local_ack_timeout_ns(31), local_ack_timeout_ns(40));
    }

    #[test]
    fn rnr_table_matches_ibta_table_45() {
        assert_eq!(rnr_timer_ns(0), 655_360_000);
        assert_eq!(rnr_timer_ns(1), 10_000);
        assert_eq!(rnr_timer_ns(12), 640_000);
        assert_eq!(rnr_timer_ns(14), 1_280_000);
        assert_eq!(rnr_timer_ns(31), 491_520_000);
        // Strictly increasing from code 1 to 31.
        assert!((1..31).all(|c| rnr_timer_ns(c) < rnr_timer_ns(c + 1)));
    }

    #[test]
    fn the_table_arms_stops_and_finds_the_earliest() {
        let mut t = TimerTable::default();
        assert_eq!(t.next(), None);
        t.set(Timer::Retry, 500);
        t.set(Timer::Pace, 200);
        assert_eq!(t.next(), Some(200));
        assert!(t.expired(Timer::Pace, 200) && !t.expired(Timer::Retry, 499));
        t.stop(Timer::Pace);
        assert_eq!(t.next(), Some(500));
        t.set_or_stop(Timer::Retry, None);
        assert!(!t.is_armed(Timer::Retry));
        t.set(Timer::Rnr, 0);
        assert_eq!(
            t.get(Timer::Rnr),
            Some(1),
            "a deadline at time 0 is kept as 1 ns"
        );
    }
}
