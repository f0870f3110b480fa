//! The spec's timer encodings: the local ACK timeout exponent and the RNR NAK timer code.

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
}
