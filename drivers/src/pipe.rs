//! Two ports joined back to back in memory, on the real clock: a frame sent on one is
//! received on the other, whole and in order. For running the engine (and its engine-thread
//! mode) between two devices in one process without root, a NIC or a simulator.

use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crossbeam::queue::ArrayQueue;
use ferroce_stack::wire::{Checks, MacAddr};

use crate::port::{LinkState, Port, PortCapabilities, TxError};
use crate::wait::Wakeup;

/// How a receiving end that went to sleep learns of frames: the sender notifies `wakeup`
/// when `armed` says someone waits on it (a notification per flush otherwise costs a system
/// call the receiver rarely needs).
#[derive(Debug)]
struct Doorbell {
    wakeup: Option<Wakeup>,
    armed: AtomicBool,
}

impl Doorbell {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            // Without an eventfd the port is polled only (`rx_fd` is `None`).
            wakeup: Wakeup::new().ok(),
            armed: AtomicBool::new(false),
        })
    }

    /// After frames were queued: wakes an armed receiver.
    fn ring(&self) {
        // Pairs with the fence in `arm`: either the receiver's last poll sees the frames,
        // or this sees `armed`.
        fence(Ordering::SeqCst);
        if self.armed.swap(false, Ordering::AcqRel) {
            if let Some(w) = &self.wakeup {
                w.notify();
            }
        }
    }

    fn arm(&self) {
        if let Some(w) = &self.wakeup {
            w.drain();
        }
        self.armed.store(true, Ordering::Release);
        fence(Ordering::SeqCst);
    }
}

/// One end of a pipe.
pub struct PipePort {
    rx: Arc<ArrayQueue<Vec<u8>>>,
    tx: Arc<ArrayQueue<Vec<u8>>>,
    /// Rung by the other end when it queues frames for us.
    rx_bell: Arc<Doorbell>,
    /// The other end's.
    tx_bell: Arc<Doorbell>,
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
    let (bell_a, bell_b) = (Doorbell::new(), Doorbell::new());
    let epoch = Instant::now();
    let end = |rx: &Arc<ArrayQueue<Vec<u8>>>,
               tx: &Arc<ArrayQueue<Vec<u8>>>,
               rx_bell: &Arc<Doorbell>,
               tx_bell: &Arc<Doorbell>,
               last| PipePort {
        rx: rx.clone(),
        tx: tx.clone(),
        rx_bell: rx_bell.clone(),
        tx_bell: tx_bell.clone(),
        pending: Vec::new(),
        mac: MacAddr([2, 0, 0, 0, 0, last]),
        mtu,
        epoch,
    };
    (
        end(&ba, &ab, &bell_a, &bell_b, 1),
        end(&ab, &ba, &bell_b, &bell_a, 2),
    )
}

/// A port with a loopback plug in it: every frame it sends it receives back. Each plug has
/// a MAC of its own (02:fe:00:00:00:01, :02, ... in the order they are made), so several
/// in one process are distinct ports. What a device needs to run without root or a
/// network: its traffic to itself never reaches the port anyway (see the engine's
/// loopback), and frames for anyone else come back to a port they are not addressed to.
pub fn plug(mtu: usize) -> PipePort {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);
    let n = NEXT.fetch_add(1, Ordering::Relaxed).to_be_bytes();
    let q = Arc::new(ArrayQueue::new(PIPE_DEPTH));
    let bell = Doorbell::new();
    PipePort {
        rx: q.clone(),
        tx: q,
        rx_bell: bell.clone(),
        tx_bell: bell,
        pending: Vec::new(),
        mac: MacAddr([2, 0xfe, n[0], n[1], n[2], n[3]]),
        mtu,
        epoch: Instant::now(),
    }
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
        if n > 0 {
            self.tx_bell.ring();
        }
        n
    }

    fn rx_fd(&self) -> Option<std::os::fd::RawFd> {
        self.rx_bell.wakeup.as_ref().map(Wakeup::fd)
    }

    fn rx_arm(&mut self) {
        self.rx_bell.arm();
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
