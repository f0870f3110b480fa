//! The out-of-band network R2CCL's ends talk over (the bootstrap TCP connection on the
//! management network), modelled as a fixed one-way delay that never loses a message: what
//! a message says is encoded when sent and decoded when it arrives, as the peer would.

use ferroce_reliability::failover::r2ccl::oob::{OobMsg, MAX_LEN};

/// Messages in flight on the out-of-band network.
#[derive(Clone, Debug)]
pub struct OobNet {
    delay_ns: u64,
    /// (arrival time, encoded bytes, length), in the order sent.
    in_flight: Vec<(u64, [u8; MAX_LEN], usize)>,
    /// Messages sent so far.
    pub sent: u64,
}

impl OobNet {
    /// A network whose every message arrives `delay_ns` after it was sent.
    pub fn new(delay_ns: u64) -> Self {
        Self {
            delay_ns,
            in_flight: Vec::new(),
            sent: 0,
        }
    }

    /// Sends `msg` at `now`.
    pub fn send(&mut self, now: u64, msg: &OobMsg) {
        let mut b = [0; MAX_LEN];
        let n = msg.encode(&mut b);
        self.in_flight.push((now + self.delay_ns, b, n));
        self.sent += 1;
    }

    /// When the next message arrives, if one is in flight.
    pub fn next_arrival(&self) -> Option<u64> {
        self.in_flight.iter().map(|m| m.0).min()
    }

    /// The messages that have arrived by `now`, in the order they were sent.
    pub fn arrived(&mut self, now: u64) -> Vec<OobMsg> {
        let mut out = Vec::new();
        self.in_flight.retain(|(t, b, n)| {
            if *t > now {
                return true;
            }
            if let Ok(m) = OobMsg::decode(&b[..*n]) {
                out.push(m);
            }
            false
        });
        out
    }
}
