//! The one seam between the stack and a NIC queue.

use ferroce_stack::wire::{Checks, MacAddr};
use ferroce_stack::wire::{Span, SplitFrame};

/// Whether the port's link is up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LinkState {
    /// Carrier present: frames can be sent.
    Up,
    /// No carrier: transmit fails and nothing arrives. Failover reacts to this.
    Down,
}

/// What a port can do, so the engine sizes bursts and skips checks the NIC already made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortCapabilities {
    /// Most frames one `rx_burst` returns or one `flush` sends.
    pub max_burst: usize,
    /// Checks the NIC did not do and software must (an ICRC-offloading NIC clears `icrc`).
    pub rx_checks: Checks,
    /// When the port sends a frame's payload from registered memory in place
    /// ([`Port::tx_split`]): the smallest payload worth it. `None`: the port copies, and the
    /// engine asks the transport for whole frames.
    pub tx_split_min: Option<usize>,
}

/// Why a frame could not be queued for transmission.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TxError {
    /// The frame is longer than the port's MTU allows.
    #[error("a {len}-byte frame exceeds the port's largest frame of {max} bytes")]
    TooLong {
        /// Bytes asked for.
        len: usize,
        /// Largest frame the port sends (MTU plus Ethernet header and tag).
        max: usize,
    },
    /// The transmit ring is full; flush and retry.
    #[error("transmit ring full")]
    RingFull,
    /// The link is down.
    #[error("link down")]
    LinkDown,
}

/// Why a port could not make registered memory sendable in place.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct MapError(pub String);

/// A NIC queue pair seen as frames in bursts, in poll mode.
///
/// Frames are borrowed: `rx_burst` lends each received frame to a closure, `tx` lends a
/// driver-owned buffer to be written in place. Nothing here allocates per frame (a driver may
/// recycle buffers), so the stack can emit straight into a DPDK mbuf or a ring slot.
///
/// The engine is generic over `P: Port` and compiled per driver; middleware such as
/// [`PcapTee`](crate::pcap::PcapTee) wraps any port. The per-frame methods are generic and
/// so need a concrete port; the rest (link, clock, memory mapping, wakeups) can be reached
/// through `&dyn Port` by code that holds an engine of any driver.
pub trait Port {
    /// Receives up to `max` frames, lending each to `f`; returns how many it received.
    fn rx_burst<F: FnMut(&[u8])>(&mut self, max: usize, f: F) -> usize
    where
        Self: Sized;

    /// Queues one frame of exactly `len` bytes, written in place by `fill`. Queued frames
    /// leave at the next [`flush`](Self::flush) (a driver may also send early when its batch
    /// is full).
    fn tx<F: FnOnce(&mut [u8])>(&mut self, len: usize, fill: F) -> Result<(), TxError>
    where
        Self: Sized;

    /// Queues one frame given in pieces: the first `frame.head_len` bytes of `head`, the
    /// payload where it lies in registered memory, then the frame's tail (zero-copy
    /// transmit). The default copies the pieces into a frame; a port that can gather (see
    /// [`PortCapabilities::tx_split_min`]) sends the payload in place.
    fn tx_split<S: Span>(&mut self, head: &[u8], frame: &SplitFrame<S>) -> Result<(), TxError>
    where
        Self: Sized,
    {
        self.tx(frame.len(), |buf| frame.copy_to(head, buf))
    }

    /// Sends every queued frame (one tx burst); returns how many left.
    fn flush(&mut self) -> usize;

    /// Current link state.
    fn link_state(&self) -> LinkState;

    /// The port's MAC address.
    fn mac(&self) -> MacAddr;

    /// The IP MTU: the largest IP datagram a frame may carry.
    fn mtu(&self) -> usize;

    /// What the port can do.
    fn capabilities(&self) -> PortCapabilities;

    /// The port's clock in nanoseconds: virtual time on the simulated fabric, the system
    /// clock on real ports. pcap timestamps come from here.
    fn now_ns(&self) -> u64;

    /// Tells the port about `len` bytes at `addr` the application registered, for a port
    /// that sends payloads from registered memory in place and whose NIC must map that
    /// memory first (DPDK: external memory registered with EAL and mapped for the device's
    /// DMA). Called once per region, before any frame is sent from it; the default needs
    /// nothing.
    fn map_memory(&mut self, addr: usize, len: usize) -> Result<(), MapError> {
        let _ = (addr, len);
        Ok(())
    }

    /// Forgets a region [`map_memory`](Self::map_memory) accepted, before its memory goes.
    fn unmap_memory(&mut self, addr: usize, len: usize) {
        let _ = (addr, len);
    }

    /// A descriptor that is readable while received frames wait, for an engine thread that
    /// sleeps when idle ([`crate::wait`]). `None`, the default: the port must be polled (a
    /// DPDK queue is no descriptor; a simulated fabric runs on its caller's clock).
    fn rx_fd(&self) -> Option<std::os::fd::RawFd> {
        None
    }

    /// Called before an engine thread polls this port one last time and then sleeps on
    /// [`rx_fd`](Self::rx_fd). A port whose readiness the kernel does not keep (the pipe's
    /// eventfd) resets it here, so that a frame arriving after this call makes the descriptor
    /// readable again and one arriving before is seen by that last poll.
    fn rx_arm(&mut self) {}

    /// Called on a thread that starts turning an engine over this port in a loop (an engine
    /// thread), before its first turn. DPDK registers the thread with EAL, so it polls with
    /// an lcore id of its own and the mbuf pools' per-core caches.
    fn thread_started(&mut self) {}

    /// Called on that thread after its last turn.
    fn thread_stopped(&mut self) {}
}

/// The [`Port`] methods a middleware port (a wrapper with an `inner` port) passes through
/// unchanged: flush, link state, MAC, MTU, capabilities, clock, memory mapping and thread
/// hooks.
macro_rules! forward_to_inner {
    () => {
        fn flush(&mut self) -> usize {
            self.inner.flush()
        }

        fn link_state(&self) -> $crate::LinkState {
            self.inner.link_state()
        }

        fn mac(&self) -> ferroce_stack::wire::MacAddr {
            self.inner.mac()
        }

        fn mtu(&self) -> usize {
            self.inner.mtu()
        }

        fn capabilities(&self) -> $crate::PortCapabilities {
            self.inner.capabilities()
        }

        fn now_ns(&self) -> u64 {
            self.inner.now_ns()
        }

        fn map_memory(&mut self, addr: usize, len: usize) -> Result<(), $crate::MapError> {
            self.inner.map_memory(addr, len)
        }

        fn unmap_memory(&mut self, addr: usize, len: usize) {
            self.inner.unmap_memory(addr, len)
        }

        fn thread_started(&mut self) {
            self.inner.thread_started()
        }

        fn thread_stopped(&mut self) {
            self.inner.thread_stopped()
        }
    };
}
pub(crate) use forward_to_inner;
