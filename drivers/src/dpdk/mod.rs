//! DPDK (cargo feature `dpdk`): ports driven by DPDK's poll-mode drivers — mlx5 on ConnectX-7
//! and BlueField-3, and net_ring / net_af_packet / net_tap / net_virtio_user vdevs in tests.
//!
//! EAL is initialised once per process from arguments passed through verbatim; a port has one
//! rx/tx queue pair, or several ([`DpdkPort::open_queues`]: one handle per pair, one engine per
//! core, receive-side scaling spreading arrivals), each with mbuf pools sized from its depths. Receive parses frames in
//! place in the mbuf (a chained mbuf is first made contiguous) and the transport copies the
//! payload once into registered memory. Transmit either copies the emitted frame into an mbuf,
//! or, with zero-copy on and a PMD that sends chained mbufs, sends the headers from a small
//! mbuf and the payload straight from registered memory as an external buffer
//! (`rte_pktmbuf_attach_extbuf`), with the pad and ICRC in a last small segment.

#![allow(unsafe_code)]

use std::ffi::CString;
use std::sync::OnceLock;
use std::time::Instant;

use ferroce_stack::wire::{Checks, MacAddr, ROCEV2_PORT};

use ferroce_stack::wire::{Span, SplitFrame};

use crate::mapped::MappedChunks;
use crate::port::{LinkState, MapError, Port, PortCapabilities, TxError};

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
    /// More queues asked for than the port has (or none).
    #[error("DPDK port {port} offers {max} queue pairs; {asked} asked for")]
    Queues {
        /// The port.
        port: u16,
        /// Asked for.
        asked: u16,
        /// The port's most.
        max: u16,
    },
    /// The PMD refused flow isolation or the steering rules.
    #[error("DPDK port {port}: {what} failed: {reason} ({code}); without isolate the port takes all its traffic")]
    Flow {
        /// The port.
        port: u16,
        /// Which step.
        what: &'static str,
        /// The PMD's reason.
        reason: String,
        /// The negative errno.
        code: i32,
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

/// How [`DpdkPort::open_config`] sets a port up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortConfig {
    /// rx/tx queue pairs, one handle each.
    pub queues: u16,
    /// Receive ring depth.
    pub rx_desc: u16,
    /// Transmit ring depth.
    pub tx_desc: u16,
    /// Send payloads of at least this many bytes in place (zero-copy), where the PMD can.
    pub zero_copy_min: Option<usize>,
    /// Flow-isolated mode with rules sending UDP to 4791 (IPv4 and IPv6) to the queues: on a
    /// bifurcated NIC (mlx5) the kernel keeps all other traffic, ARP and the TCP exchange
    /// included. PMDs without rte_flow refuse it with [`DpdkError::Flow`].
    pub isolate: bool,
}

/// The calling thread's EAL lcore id, if it has one (EAL's main thread, its workers, and
/// engine threads registered by [`Port::thread_started`]).
pub fn lcore_id() -> Option<u32> {
    // SAFETY: reads a thread-local of EAL's.
    u32::try_from(unsafe { sys::fr_lcore_id() }).ok()
}

/// True when `addr` lies in memory DPDK knows as external (a region a zero-copy port
/// mapped, see [`Port::map_memory`]).
pub fn is_external_memory(addr: *const u8) -> bool {
    // SAFETY: a lookup by address in EAL's tables; nothing is dereferenced.
    unsafe { sys::fr_mem_is_external(addr.cast()) == 1 }
}

/// Runs a shim call that reports a flow error's reason in a buffer.
fn flow_step(
    port: u16,
    what: &'static str,
    call: impl FnOnce(*mut std::ffi::c_char, u32) -> i32,
) -> Result<(), DpdkError> {
    let mut msg = [0u8; 256];
    let rc = call(msg.as_mut_ptr().cast(), msg.len() as u32);
    if rc == 0 {
        return Ok(());
    }
    let end = msg.iter().position(|&b| b == 0).unwrap_or(msg.len());
    Err(DpdkError::Flow {
        port,
        what,
        reason: String::from_utf8_lossy(&msg[..end]).into_owned(),
        code: rc,
    })
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

/// Sets probed port `port`'s link up or down administratively (`rte_eth_dev_set_link_up` /
/// `_down`): what `ip link set ... up/down` is to a kernel interface, for fault injection in
/// tests and experiments. Err holds DPDK's return code (a PMD without the operation says
/// `-ENOTSUP`).
pub fn set_link(port: u16, up: bool) -> Result<(), i32> {
    // SAFETY: plain control calls on a port id; DPDK checks the id itself.
    let rc = unsafe {
        if up {
            sys::rte_eth_dev_set_link_up(port)
        } else {
            sys::rte_eth_dev_set_link_down(port)
        }
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(rc)
    }
}

/// Ports DPDK probed.
pub fn port_count() -> u16 {
    // SAFETY: plain query; EAL must be up, which every caller path ensures first.
    unsafe { sys::rte_eth_dev_count_avail() }
}

/// One rx/tx queue pair of a DPDK port: the whole port when it has one queue, else one of
/// the handles [`DpdkPort::open_queues`] returns, each for one engine on its own core.
pub struct DpdkPort {
    port: u16,
    queue: u16,
    pool: *mut sys::rte_mempool,
    /// Small mbufs for the pieces of a zero-copy frame (headers, external payload, tail).
    seg_pool: *mut sys::rte_mempool,
    /// The shared-info block every external payload buffer points at.
    shinfo: *mut sys::rte_mbuf_ext_shared_info,
    /// `Some(min payload)` when transmit sends payloads in place.
    split_min: Option<usize>,
    /// Where a chained received frame is made contiguous.
    scratch: Box<[u8]>,
    mac: MacAddr,
    mtu: usize,
    pending: Vec<*mut sys::rte_mbuf>,
    epoch: Instant,
    /// Frames the PMD did not take at flush (its ring full); freed, counted.
    pub tx_dropped: u64,
    /// Frames sent with their payload in place (zero-copy).
    pub tx_zero_copy: u64,
    /// Application memory mapped for the device (zero-copy only; see [`Port::map_memory`]).
    mapped: MappedChunks,
    /// The engine thread polling this queue registered itself with EAL.
    registered_thread: bool,
}

/// The page size application memory is registered with DPDK in: every Linux page is
/// 4 KiB-aligned, so ranges rounded out to it are valid whatever backs them.
const EXTMEM_PAGE: usize = 4096;

/// Payloads below this many bytes are copied even with zero-copy on: chaining an external
/// buffer and a tail costs more than copying a few hundred bytes.
pub const ZERO_COPY_MIN: usize = 512;

// SAFETY: the mbuf pointers and the pool belong to this port's queue pair, which DPDK lets one
// thread at a time use; moving the port moves that ownership.
unsafe impl Send for DpdkPort {}

impl DpdkPort {
    /// Starts port `port` (after [`eal_init`]) with `rx_desc`/`tx_desc` descriptors, copying
    /// on transmit.
    pub fn open(port: u16, rx_desc: u16, tx_desc: u16) -> Result<Self, DpdkError> {
        Self::open_with(port, rx_desc, tx_desc, None)
    }

    /// [`open`](Self::open), sending payloads of at least `zero_copy_min` bytes from
    /// registered memory in place when the PMD can transmit chained mbufs (it copies
    /// otherwise; [`zero_copy`](Self::zero_copy) says which).
    pub fn open_with(
        port: u16,
        rx_desc: u16,
        tx_desc: u16,
        zero_copy_min: Option<usize>,
    ) -> Result<Self, DpdkError> {
        let mut q = Self::open_queues(port, 1, rx_desc, tx_desc, zero_copy_min)?;
        Ok(q.remove(0))
    }

    /// Starts port `port` with `queues` rx/tx queue pairs and returns one handle per pair,
    /// each with its own mbuf pools, to be polled by one engine on one core (DPDK lets one
    /// thread at a time use a queue). With several queues the port spreads arriving frames
    /// by receive-side scaling over addresses and UDP ports where the PMD offers it; a PMD
    /// without RSS (memif) delivers on queue i what the peer sent on its queue i.
    pub fn open_queues(
        port: u16,
        queues: u16,
        rx_desc: u16,
        tx_desc: u16,
        zero_copy_min: Option<usize>,
    ) -> Result<Vec<Self>, DpdkError> {
        Self::open_config(
            port,
            &PortConfig {
                queues,
                rx_desc,
                tx_desc,
                zero_copy_min,
                isolate: false,
            },
        )
    }

    /// [`open_queues`](Self::open_queues) with every setting, flow isolation included.
    pub fn open_config(port: u16, config: &PortConfig) -> Result<Vec<Self>, DpdkError> {
        let PortConfig {
            queues,
            rx_desc,
            tx_desc,
            zero_copy_min,
            isolate,
        } = *config;
        let available = port_count();
        if port >= available {
            return Err(DpdkError::NoPort { port, available });
        }
        // SAFETY: plain query of a probed port.
        let max = unsafe { sys::fr_port_max_queues(port) };
        if queues == 0 || i32::from(queues) > max {
            return Err(DpdkError::Queues {
                port,
                asked: queues,
                max: max.max(0) as u16,
            });
        }
        if isolate {
            // Before the pools, so that a PMD's refusal leaves nothing behind and the port
            // can be opened again without isolation.
            flow_step(port, "flow isolation", |msg, cap| {
                // SAFETY: `msg` holds `cap` bytes; the port is probed and not configured.
                unsafe { sys::fr_port_isolate(port, msg, cap) }
            })?;
        }
        // SAFETY: plain query of a probed port.
        let multi_seg = unsafe { sys::fr_port_multi_seg(port) } > 0;
        let split_min = zero_copy_min.filter(|_| multi_seg);
        // Enough mbufs for both rings, bursts in flight and the pool's per-core caches.
        let n = u32::from(rx_desc) + u32::from(tx_desc) + 4 * BURST as u32 + 512;
        let mut handles = Vec::with_capacity(usize::from(queues));
        for queue in 0..queues {
            let tag = |what: &str| {
                if queues == 1 {
                    what.to_owned()
                } else {
                    format!("{what}q{queue}")
                }
            };
            let pool = mbuf_pool(port, &tag("ferroce_pool"), n, 9216 + 128)?;
            let (seg_pool, shinfo) = if split_min.is_some() {
                // Up to four pieces per frame: headers, two payload spans, tail.
                let seg_pool = mbuf_pool(port, &tag("ferroce_segs"), 4 * n, 256)?;
                // SAFETY: plain allocation; NULL is checked.
                let shinfo = unsafe { sys::fr_shinfo_new() };
                if shinfo.is_null() {
                    return Err(DpdkError::Port {
                        port,
                        what: "external buffer info",
                        code: -12,
                    });
                }
                (seg_pool, shinfo)
            } else {
                (std::ptr::null_mut(), std::ptr::null_mut())
            };
            handles.push(Self {
                port,
                queue,
                pool,
                seg_pool,
                shinfo,
                split_min,
                scratch: vec![0; 16 * 1024].into_boxed_slice(),
                mac: MacAddr([0; 6]),
                mtu: 1500,
                pending: Vec::with_capacity(BURST),
                epoch: Instant::now(),
                tx_dropped: 0,
                tx_zero_copy: 0,
                mapped: MappedChunks::new(EXTMEM_PAGE),
                registered_thread: false,
            });
        }
        let mut pools: Vec<_> = handles.iter().map(|h| h.pool).collect();
        // SAFETY: one valid pool per queue; the shim configures and starts the port.
        let rc = unsafe {
            sys::fr_port_start_queues(
                port,
                pools.as_mut_ptr(),
                queues,
                rx_desc,
                tx_desc,
                i32::from(split_min.is_some()),
            )
        };
        if rc < 0 {
            return Err(DpdkError::Port {
                port,
                what: "configure/start",
                code: rc,
            });
        }
        if isolate {
            flow_step(port, "the UDP 4791 steering rules", |msg, cap| {
                // SAFETY: `msg` holds `cap` bytes; the port is started with `queues` queues.
                unsafe { sys::fr_port_steer_udp(port, queues, ROCEV2_PORT, msg, cap) }
            })?;
        }
        // SAFETY: zeroed rte_ether_addr is valid; the call fills it.
        let mut addr: sys::rte_ether_addr = unsafe { std::mem::zeroed() };
        // SAFETY: `addr` is a valid out-pointer.
        unsafe { sys::rte_eth_macaddr_get(port, &mut addr) };
        let mut mtu: u16 = 1500;
        // SAFETY: `mtu` is a valid out-pointer.
        unsafe { sys::rte_eth_dev_get_mtu(port, &mut mtu) };
        for h in &mut handles {
            h.mac = MacAddr(addr.addr_bytes);
            h.mtu = usize::from(mtu);
        }
        Ok(handles)
    }

    /// The queue pair this handle polls.
    pub fn queue_id(&self) -> u16 {
        self.queue
    }

    /// True when transmit sends large payloads in place.
    pub fn zero_copy(&self) -> bool {
        self.split_min.is_some()
    }

    /// The DPDK port number.
    pub fn port_id(&self) -> u16 {
        self.port
    }

    /// Queues a built mbuf, flushing first when the burst is full.
    fn queue(&mut self, m: *mut sys::rte_mbuf) {
        if self.pending.len() >= BURST {
            self.flush();
        }
        self.pending.push(m);
    }
}

/// An mbuf pool for `port` whose buffers hold `data_room` bytes.
fn mbuf_pool(
    port: u16,
    what: &str,
    n: u32,
    data_room: u16,
) -> Result<*mut sys::rte_mempool, DpdkError> {
    let name = CString::new(format!("{what}_{port}")).unwrap_or_default();
    // SAFETY: plain call; a NULL result is checked.
    let pool = unsafe {
        sys::rte_pktmbuf_pool_create(
            name.as_ptr(),
            n,
            256,
            0,
            data_room,
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
    Ok(pool)
}

impl Port for DpdkPort {
    fn rx_burst<F: FnMut(&[u8])>(&mut self, max: usize, mut f: F) -> usize {
        let mut pkts = [std::ptr::null_mut::<sys::rte_mbuf>(); BURST];
        let n = max.min(BURST) as u16;
        // SAFETY: `pkts` has room for `n` pointers.
        let got = unsafe { sys::fr_rx_burst(self.port, self.queue, pkts.as_mut_ptr(), n) };
        for &m in &pkts[..usize::from(got)] {
            let mut len = 0u32;
            // SAFETY: `m` is an mbuf the PMD handed us; the returned bytes (in the mbuf, or
            // in `scratch` for a chained one) stay valid until we free it below. NULL means
            // the frame is longer than any RoCE frame, and is dropped.
            unsafe {
                let data = sys::fr_mbuf_linear(
                    m,
                    self.scratch.as_mut_ptr(),
                    self.scratch.len() as u32,
                    &mut len,
                );
                if !data.is_null() {
                    f(std::slice::from_raw_parts(data, len as usize));
                }
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
        self.queue(m);
        Ok(())
    }

    fn tx_split<S: Span>(&mut self, head: &[u8], frame: &SplitFrame<S>) -> Result<(), TxError> {
        let len = frame.len();
        let max = self.mtu + 18;
        if len > max {
            return Err(TxError::TooLong { len, max });
        }
        if self.split_min.is_none() {
            return self.tx(len, |buf| frame.copy_to(head, buf));
        }
        let head = &head[..frame.head_len];
        // SAFETY: the segment pool lives as long as the port.
        let m = unsafe { sys::fr_pktmbuf_alloc(self.seg_pool) };
        if m.is_null() {
            return Err(TxError::RingFull);
        }
        // SAFETY: `m` is a fresh mbuf we own; append reserves room for the headers (NULL if
        // they do not fit, which a 256-byte segment never refuses a RoCE header).
        let data = unsafe { sys::fr_pktmbuf_append(m, head.len() as u16) };
        let mut ok = !data.is_null();
        if ok {
            // SAFETY: `data` points at `head.len()` bytes of `m`.
            unsafe { std::ptr::copy_nonoverlapping(head.as_ptr(), data, head.len()) };
        }
        for span in &frame.payload {
            // SAFETY: the span is registered memory the transport checked; the PMD reads it
            // during tx_burst (software PMDs copy it there; a NIC reads it before the
            // packet's work request can complete). The shared info outlives the port.
            ok = ok
                && unsafe {
                    sys::fr_chain_extbuf(
                        m,
                        self.seg_pool,
                        span.as_ptr().cast_mut().cast(),
                        span.len() as u16,
                        self.shinfo,
                    )
                } == 0;
        }
        let tail = &frame.tail[..frame.tail_len];
        // SAFETY: `tail` is a plain byte slice the shim copies.
        ok = ok
            && unsafe {
                sys::fr_chain_copy(m, self.seg_pool, tail.as_ptr().cast(), tail.len() as u16)
            } == 0;
        if !ok {
            // SAFETY: we own the chain; freeing it releases every segment.
            unsafe { sys::fr_pktmbuf_free(m) };
            return Err(TxError::RingFull);
        }
        self.tx_zero_copy += 1;
        self.queue(m);
        Ok(())
    }

    fn flush(&mut self) -> usize {
        if self.pending.is_empty() {
            return 0;
        }
        let n = self.pending.len() as u16;
        // SAFETY: the pending mbufs are ours; the PMD takes the first `sent`.
        let sent = unsafe { sys::fr_tx_burst(self.port, self.queue, self.pending.as_mut_ptr(), n) };
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
            tx_split_min: self.split_min,
        }
    }

    fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    /// With zero-copy on, registers the region's pages with EAL as external memory and maps
    /// them for the device's DMA (IOVA = VA), as a NIC PMD (mlx5) needs before it sends from
    /// them; software PMDs read the memory themselves and need only the registration. Copy
    /// mode maps nothing.
    fn map_memory(&mut self, addr: usize, len: usize) -> Result<(), MapError> {
        if self.split_min.is_none() {
            return Ok(());
        }
        let port = self.port;
        self.mapped.add(
            addr,
            len,
            |at, n| {
                // SAFETY: EAL records the range and the device maps it; nothing is written
                // there. `at`/`n` are whole pages of the application's registered memory.
                let rc = unsafe {
                    sys::fr_port_map_memory(port, at as *mut _, n, EXTMEM_PAGE)
                };
                match rc {
                    0 => Ok(()),
                    rc => Err(MapError(format!(
                        "DPDK port {port}: mapping {n} bytes at {at:#x} for zero-copy failed ({rc}); memory registered with two zero-copy DPDK devices is not supported"
                    ))),
                }
            },
            |at, n| {
                // SAFETY: undoes a mapping made just above.
                unsafe { sys::fr_port_unmap_memory(port, at as *mut _, n) };
            },
        )
    }

    fn thread_started(&mut self) {
        // SAFETY: registers the calling thread with EAL (a no-op for one that has an lcore).
        if unsafe { sys::fr_lcore_id() } < 0 {
            // SAFETY: as above. When EAL has no lcore id left the thread polls without
            // mempool caches, slower but correct.
            self.registered_thread = unsafe { sys::fr_thread_register() } == 0;
        }
    }

    fn thread_stopped(&mut self) {
        if std::mem::take(&mut self.registered_thread) {
            // SAFETY: the calling thread registered itself in `thread_started`.
            unsafe { sys::fr_thread_unregister() };
        }
    }

    fn unmap_memory(&mut self, addr: usize, len: usize) {
        let port = self.port;
        self.mapped.remove(addr, len, |at, n| {
            // SAFETY: the range was mapped by `map_memory` and no region uses it any more.
            unsafe { sys::fr_port_unmap_memory(port, at as *mut _, n) };
        });
    }
}
