//! DPDK (cargo feature `dpdk`): ports driven by DPDK's poll-mode drivers — mlx5 on ConnectX-7
//! and BlueField-3, and net_ring / net_af_packet / net_tap / net_virtio_user vdevs in tests.
//!
//! This first step: EAL initialised from arguments passed through verbatim, one rx and one tx
//! queue per port, an mbuf pool sized from the queue depths, rx/tx bursts with one copy each
//! way (frames are parsed in place in the mbuf and the payload copied once into registered
//! memory by the transport; transmit copies the emitted frame into an mbuf). Zero-copy
//! transmit from registered memory (external buffers) and several queues per port come next.

#![allow(unsafe_code)]

use std::ffi::CString;
use std::sync::OnceLock;
use std::time::Instant;

use ferroce_stack::wire::{Checks, MacAddr};

use crate::port::{LinkState, Port, PortCapabilities, TxError};

#[allow(
    non_upper_case_globals,
    non_camel_case_types,
    non_snake_case,
    dead_code,
    unreachable_pub,
    missing_docs,
    clippy::all
)]
mod sys {
    include!(concat!(env!("OUT_DIR"), "/dpdk_bindings.rs"));
}

/// Frames per burst.
pub const BURST: usize = 32;

/// Why DPDK could not be used.
#[derive(Debug, thiserror::Error)]
pub enum DpdkError {
    /// `rte_eal_init` refused the arguments (or EAL was started with others).
    #[error("DPDK EAL initialisation failed with '{0}' (check the arguments, hugepages or --no-huge, and --file-prefix)")]
    Eal(String),
    /// No port with that number after EAL probed its devices.
    #[error("DPDK has {available} ports, so port {port} does not exist (did the --vdev or PCI device probe?)")]
    NoPort {
        /// Asked for.
        port: u16,
        /// Probed.
        available: u16,
    },
    /// Setting up the port failed.
    #[error("DPDK port {port}: {what} failed ({code})")]
    Port {
        /// The port.
        port: u16,
        /// Which step.
        what: &'static str,
        /// The negative errno.
        code: i32,
    },
}

static EAL: OnceLock<Result<String, String>> = OnceLock::new();

/// Initialises DPDK's EAL once per process with `args` (split on whitespace, as a shell
/// would without quotes), e.g. `-l 1 --no-pci --no-huge -m 256 --vdev=net_ring0`. Later calls
/// with other arguments fail: EAL cannot be initialised twice.
pub fn eal_init(args: &str) -> Result<(), DpdkError> {
    let r = EAL.get_or_init(|| {
        let mut argv: Vec<CString> = vec![CString::new("ferroce").unwrap_or_default()];
        for a in args.split_whitespace() {
            argv.push(CString::new(a).map_err(|_| args.to_owned())?);
        }
        let mut ptrs: Vec<*mut libc::c_char> = argv.iter().map(|c| c.as_ptr().cast_mut()).collect();
        // SAFETY: argv points at NUL-terminated strings that outlive the call (EAL copies
        // what it keeps); argc matches.
        let rc = unsafe { sys::rte_eal_init(ptrs.len() as i32, ptrs.as_mut_ptr()) };
        if rc < 0 {
            Err(args.to_owned())
        } else {
            Ok(args.to_owned())
        }
    });
    match r {
        Ok(done) if done == args => Ok(()),
        Ok(other) => Err(DpdkError::Eal(format!(
            "{args} (EAL already runs with '{other}')"
        ))),
        Err(a) => Err(DpdkError::Eal(a.clone())),
    }
}

/// Ports DPDK probed.
pub fn port_count() -> u16 {
    // SAFETY: plain query; EAL must be up, which every caller path ensures first.
    unsafe { sys::rte_eth_dev_count_avail() }
}

/// One DPDK port, one rx and one tx queue.
pub struct DpdkPort {
    port: u16,
    pool: *mut sys::rte_mempool,
    mac: MacAddr,
    mtu: usize,
    pending: Vec<*mut sys::rte_mbuf>,
    epoch: Instant,
    /// Frames the PMD did not take at flush (its ring full); freed, counted.
    pub tx_dropped: u64,
}

// SAFETY: the mbuf pointers and the pool belong to this port's queue pair, which DPDK lets one
// thread at a time use; moving the port moves that ownership.
unsafe impl Send for DpdkPort {}

impl DpdkPort {
    /// Starts port `port` (after [`eal_init`]) with `rx_desc`/`tx_desc` descriptors.
    pub fn open(port: u16, rx_desc: u16, tx_desc: u16) -> Result<Self, DpdkError> {
        let available = port_count();
        if port >= available {
            return Err(DpdkError::NoPort { port, available });
        }
        // Enough mbufs for both rings, bursts in flight and the pool's per-core caches.
        let n = u32::from(rx_desc) + u32::from(tx_desc) + 4 * BURST as u32 + 512;
        let name = CString::new(format!("ferroce_pool_{port}")).unwrap_or_default();
        // SAFETY: plain call; a NULL result is checked.
        let pool = unsafe {
            sys::rte_pktmbuf_pool_create(
                name.as_ptr(),
                n,
                256,
                0,
                (9216 + 128) as u16,
                sys::rte_socket_id() as i32,
            )
        };
        if pool.is_null() {
            return Err(DpdkError::Port {
                port,
                what: "rte_pktmbuf_pool_create",
                code: -12,
            });
        }
        // SAFETY: the pool is valid; the shim configures and starts the port.
        let rc = unsafe { sys::fr_port_start(port, pool, rx_desc, tx_desc) };
        if rc < 0 {
            return Err(DpdkError::Port {
                port,
                what: "configure/start",
                code: rc,
            });
        }
        // SAFETY: zeroed rte_ether_addr is valid; the call fills it.
        let mut addr: sys::rte_ether_addr = unsafe { std::mem::zeroed() };
        // SAFETY: `addr` is a valid out-pointer.
        unsafe { sys::rte_eth_macaddr_get(port, &mut addr) };
        let mut mtu: u16 = 1500;
        // SAFETY: `mtu` is a valid out-pointer.
        unsafe { sys::rte_eth_dev_get_mtu(port, &mut mtu) };
        Ok(Self {
            port,
            pool,
            mac: MacAddr(addr.addr_bytes),
            mtu: usize::from(mtu),
            pending: Vec::with_capacity(BURST),
            epoch: Instant::now(),
            tx_dropped: 0,
        })
    }
}

impl Port for DpdkPort {
    fn rx_burst<F: FnMut(&[u8])>(&mut self, max: usize, mut f: F) -> usize {
        let mut pkts = [std::ptr::null_mut::<sys::rte_mbuf>(); BURST];
        let n = max.min(BURST) as u16;
        // SAFETY: `pkts` has room for `n` pointers.
        let got = unsafe { sys::fr_rx_burst(self.port, pkts.as_mut_ptr(), n) };
        for &m in &pkts[..usize::from(got)] {
            let mut len = 0u16;
            // SAFETY: `m` is an mbuf the PMD handed us; its first segment's data is `len`
            // bytes at the returned pointer until we free it below.
            unsafe {
                let data = sys::fr_mbuf_data(m, &mut len);
                f(std::slice::from_raw_parts(data, usize::from(len)));
                sys::fr_pktmbuf_free(m);
            }
        }
        usize::from(got)
    }

    fn tx<F: FnOnce(&mut [u8])>(&mut self, len: usize, fill: F) -> Result<(), TxError> {
        let max = self.mtu + 18;
        if len > max {
            return Err(TxError::TooLong { len, max });
        }
        if self.pending.len() >= BURST {
            self.flush();
        }
        // SAFETY: the pool is valid for the port's life.
        let m = unsafe { sys::fr_pktmbuf_alloc(self.pool) };
        if m.is_null() {
            return Err(TxError::RingFull);
        }
        // SAFETY: `m` is a fresh mbuf; append reserves `len` bytes (NULL if they do not fit).
        let data = unsafe { sys::fr_pktmbuf_append(m, len as u16) };
        if data.is_null() {
            // SAFETY: we own `m`.
            unsafe { sys::fr_pktmbuf_free(m) };
            return Err(TxError::TooLong { len, max });
        }
        // SAFETY: `data` points at `len` bytes of `m` that we own until tx_burst takes it.
        fill(unsafe { std::slice::from_raw_parts_mut(data, len) });
        self.pending.push(m);
        Ok(())
    }

    fn flush(&mut self) -> usize {
        if self.pending.is_empty() {
            return 0;
        }
        let n = self.pending.len() as u16;
        // SAFETY: the pending mbufs are ours; the PMD takes the first `sent`.
        let sent = unsafe { sys::fr_tx_burst(self.port, self.pending.as_mut_ptr(), n) };
        for &m in &self.pending[usize::from(sent)..] {
            // SAFETY: mbufs the PMD did not take are still ours.
            unsafe { sys::fr_pktmbuf_free(m) };
            self.tx_dropped += 1;
        }
        self.pending.clear();
        usize::from(sent)
    }

    fn link_state(&self) -> LinkState {
        // SAFETY: zeroed rte_eth_link is valid; the call fills it.
        let mut link: sys::rte_eth_link = unsafe { std::mem::zeroed() };
        // SAFETY: valid out-pointer.
        unsafe { sys::rte_eth_link_get_nowait(self.port, &mut link) };
        if link.link_status() != 0 {
            LinkState::Up
        } else {
            LinkState::Down
        }
    }

    fn mac(&self) -> MacAddr {
        self.mac
    }

    fn mtu(&self) -> usize {
        self.mtu
    }

    fn capabilities(&self) -> PortCapabilities {
        PortCapabilities {
            max_burst: BURST,
            rx_checks: Checks::ALL,
        }
    }

    fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }
}
