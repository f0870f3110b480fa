//! Two ports joined back to back in memory, on the real clock: a frame sent on one is
//! received on the other, whole and in order. For running the engine (and its engine-thread
//! mode) between two devices in one process without root, a NIC or a simulator.

use std::sync::Arc;
use std::time::Instant;

use crossbeam::queue::ArrayQueue;
use ferroce_stack::wire::{Checks, MacAddr};

use crate::port::{LinkState, Port, PortCapabilities, TxError};

/// One end of a pipe.
pub struct PipePort {
    rx: Arc<ArrayQueue<Vec<u8>>>,
    tx: Arc<ArrayQueue<Vec<u8>>>,
    pending: Vec<Vec<u8>>,
    mac: MacAddr,
    mtu: usize,
    epoch: Instant,
}

/// Frames a pipe direction holds before `tx` reports the ring full.
pub const PIPE_DEPTH: usize = 8192;

/// Two joined ports with MACs 02:00:00:00:00:01 and :02 and an Ethernet MTU of `mtu`.
pub fn pair(mtu: usize) -> (PipePort, PipePort) {
    let ab = Arc::new(ArrayQueue::new(PIPE_DEPTH));
    let ba = Arc::new(ArrayQueue::new(PIPE_DEPTH));
    let epoch = Instant::now();
    let end = |rx: &Arc<ArrayQueue<Vec<u8>>>, tx: &Arc<ArrayQueue<Vec<u8>>>, last| PipePort {
        rx: rx.clone(),
        tx: tx.clone(),
        pending: Vec::new(),
        mac: MacAddr([2, 0, 0, 0, 0, last]),
        mtu,
        epoch,
    };
    (end(&ba, &ab, 1), end(&ab, &ba, 2))
}

impl Port for PipePort {
    fn rx_burst<F: FnMut(&[u8])>(&mut self, max: usize, mut f: F) -> usize {
        let mut n = 0;
        while n < max {
            match self.rx.pop() {
                Some(frame) => {
                    f(&frame);
                    n += 1;
                }
                None => break,
            }
        }
        n
    }

    fn tx<F: FnOnce(&mut [u8])>(&mut self, len: usize, fill: F) -> Result<(), TxError> {
        let max = self.mtu + 18;
        if len > max {
            return Err(TxError::TooLong { len, max });
        }
        let mut buf = vec![0; len];
        fill(&mut buf);
        self.pending.push(buf);
        Ok(())
    }

    fn flush(&mut self) -> usize {
        let mut n = 0;
        for frame in self.pending.drain(..) {
            // A full pipe drops, as a full NIC ring would; the transport retransmits.
            if self.tx.push(frame).is_ok() {
                n += 1;
            }
        }
        n
    }

    fn link_state(&self) -> LinkState {
        LinkState::Up
    }

    fn mac(&self) -> MacAddr {
        self.mac
    }

    fn mtu(&self) -> usize {
        self.mtu
    }

    fn capabilities(&self) -> PortCapabilities {
        // Frames never leave the process: no corruption to check for, but check anyway so
        // the path under test is the one real ports take.
        PortCapabilities {
            max_burst: 64,
            rx_checks: Checks::ALL,
            tx_split_min: None,
        }
    }

    fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }
}
