//! The control plane of a port no kernel serves (a DPDK port): smoltcp answers ARP and ICMP
//! echo for the port's address and carries the TCP connections that exchange QP endpoints,
//! while RoCEv2 frames go to the engine untouched.
//!
//! [`ControlPlane`] wraps any [`Port`] as middleware, like the pcap tee. On receive it sorts
//! each frame: UDP to port 4791 is RoCEv2 and is lent to the engine as before; anything else
//! (ARP, ICMP, TCP, neighbour discovery) is queued for smoltcp, whose interface is polled when
//! such frames wait, its timers are due, or an application touched a socket. smoltcp
//! transmits through the same port. The RoCE path pays one header check per frame and one
//! relaxed atomic load per burst.
//!
//! Applications reach smoltcp's TCP through a [`ControlHandle`] (see [`tcp`]): the interface
//! and its sockets sit behind a mutex that the engine takes only when it polls smoltcp, so the
//! handle works from any thread while the engine turns on another.

pub mod tcp;

use std::collections::VecDeque;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crossbeam::queue::ArrayQueue;
use ferroce_stack::wire::{Span, SplitFrame};
use ferroce_stack::wire::{ETHERTYPE_IPV4, ETHERTYPE_IPV6, ETHERTYPE_VLAN, ROCEV2_PORT};
use smoltcp::iface::{Config, Interface, SocketHandle, SocketSet};
use smoltcp::phy::{self, DeviceCapabilities, Medium};
use smoltcp::time::Instant;
use smoltcp::wire::{EthernetAddress, HardwareAddress, IpAddress, IpCidr};

use crate::port::{Port, TxError};

/// Frames for smoltcp held between polls; more are dropped (and counted), as a NIC drops
/// when its ring is full.
const QUEUE: usize = 256;

/// Receive bursts between two looks at smoltcp's timers when no control frame arrived.
const TIMER_STRIDE: u32 = 64;

/// True when `frame` is RoCEv2: IPv4 or IPv6 (optionally VLAN-tagged) carrying UDP to 4791.
/// Malformed or short frames are not RoCE; the engine never sees them.
pub fn is_rocev2(frame: &[u8]) -> bool {
    let be16 = |at: usize| {
        frame
            .get(at..at + 2)
            .map(|b| u16::from_be_bytes([b[0], b[1]]))
    };
    let (ethertype, l3) = match be16(12) {
        Some(ETHERTYPE_VLAN) => (be16(16), 18),
        t => (t, 14),
    };
    let udp = match ethertype {
        Some(ETHERTYPE_IPV4) => match frame.get(l3) {
            Some(&vihl) if vihl >> 4 == 4 && frame.get(l3 + 9) == Some(&17) => {
                l3 + usize::from(vihl & 0x0f) * 4
            }
            _ => return false,
        },
        Some(ETHERTYPE_IPV6) if frame.get(l3 + 6) == Some(&17) => l3 + 40,
        _ => return false,
    };
    be16(udp + 2) == Some(ROCEV2_PORT)
}

/// What the control plane did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ControlCounters {
    /// Frames handed to smoltcp.
    pub rx_frames: u64,
    /// Frames smoltcp sent.
    pub tx_frames: u64,
    /// Control frames dropped because smoltcp's queue was full.
    pub rx_dropped: u64,
}

/// smoltcp's interface and sockets: what the engine polls and applications' sockets use.
struct Smol {
    iface: Interface,
    sockets: SocketSet<'static>,
    /// Sockets whose owner dropped them: closed gracefully, removed once TCP is done.
    closing: Vec<SocketHandle>,
    /// Next local port for an outgoing connection.
    next_port: u16,
}

/// What a [`ControlPlane`] shares with its handles.
struct Shared {
    smol: Mutex<Smol>,
    /// Set by an application that changed a socket, or by a [`ControlFeed`] that queued
    /// a frame: poll smoltcp at the next burst.
    kick: AtomicBool,
    /// Control frames that arrived on the port's other queues.
    fed: ArrayQueue<Vec<u8>>,
}

impl Shared {
    fn smol(&self) -> MutexGuard<'_, Smol> {
        self.smol.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A port with smoltcp answering for its address.
pub struct ControlPlane<P> {
    inner: P,
    shared: Arc<Shared>,
    rxq: VecDeque<Vec<u8>>,
    /// When smoltcp next wants a poll, on the port's clock (ns).
    next_poll: u64,
    turns: u32,
    counters: ControlCounters,
}

impl<P: Port> ControlPlane<P> {
    /// smoltcp on `inner` at address `ip` (a /24 for IPv4, a /64 for IPv6: the on-link
    /// range it reaches without a router).
    pub fn new(mut inner: P, ip: IpAddr) -> Self {
        let mac = inner.mac();
        let mut config = Config::new(HardwareAddress::Ethernet(EthernetAddress(mac.0)));
        config.random_seed = u64::from_le_bytes([
            mac.0[0], mac.0[1], mac.0[2], mac.0[3], mac.0[4], mac.0[5], 0x5a, 0xa5,
        ]) ^ inner.now_ns();
        let mut rxq = VecDeque::new();
        let mut counters = ControlCounters::default();
        let now = smol_now(&inner);
        let mut iface = Interface::new(
            config,
            &mut SmolDevice {
                port: &mut inner,
                rxq: &mut rxq,
                counters: &mut counters,
            },
            now,
        );
        let prefix = if ip.is_ipv4() { 24 } else { 64 };
        iface.update_ip_addrs(|addrs| {
            let _ = addrs.push(IpCidr::new(IpAddress::from(ip), prefix));
        });
        let next_port = 49152 + (inner.now_ns() % 8192) as u16;
        Self {
            inner,
            shared: Arc::new(Shared {
                smol: Mutex::new(Smol {
                    iface,
                    sockets: SocketSet::new(Vec::new()),
                    closing: Vec::new(),
                    next_port,
                }),
                kick: AtomicBool::new(false),
                fed: ArrayQueue::new(QUEUE),
            }),
            rxq,
            next_poll: 0,
            turns: 0,
            counters,
        }
    }

    /// The wrapped port.
    pub fn inner(&self) -> &P {
        &self.inner
    }

    /// What the control plane did.
    pub fn counters(&self) -> ControlCounters {
        self.counters
    }

    /// A handle for TCP through this port's address, usable from any thread.
    pub fn handle(&self) -> tcp::ControlHandle {
        tcp::ControlHandle::new(self.shared.clone())
    }

    /// Wraps `port`, another queue of the same NIC, so that the control frames arriving
    /// there (anything not RoCEv2: receive-side scaling spreads TCP and ICMP over every
    /// queue) reach this control plane; RoCEv2 passes through. Replies leave on this queue.
    pub fn feed<Q: Port>(&self, port: Q) -> ControlFeed<Q> {
        ControlFeed {
            inner: port,
            shared: self.shared.clone(),
            dropped: 0,
        }
    }

    /// Runs smoltcp: queued frames in, replies and socket data out.
    pub fn poll_control(&mut self) {
        let now = smol_now(&self.inner);
        let mut dev = SmolDevice {
            port: &mut self.inner,
            rxq: &mut self.rxq,
            counters: &mut self.counters,
        };
        let mut guard = self.shared.smol();
        let smol = &mut *guard;
        smol.iface.poll(now, &mut dev, &mut smol.sockets);
        let Smol {
            sockets, closing, ..
        } = smol;
        closing.retain(|&h| {
            let done = matches!(
                sockets.get::<smoltcp::socket::tcp::Socket<'_>>(h).state(),
                smoltcp::socket::tcp::State::Closed | smoltcp::socket::tcp::State::TimeWait
            );
            if done {
                sockets.remove(h);
            }
            !done
        });
        self.next_poll = match smol.iface.poll_delay(now, &smol.sockets) {
            Some(d) => self.inner.now_ns().saturating_add(d.total_micros() * 1000),
            None => u64::MAX,
        };
    }
}

fn smol_now<P: Port>(p: &P) -> Instant {
    Instant::from_micros((p.now_ns() / 1000) as i64)
}

impl<P: Port> Port for ControlPlane<P> {
    fn rx_burst<F: FnMut(&[u8])>(&mut self, max: usize, mut f: F) -> usize {
        let Self {
            inner,
            rxq,
            counters,
            ..
        } = self;
        let n = inner.rx_burst(max, |frame| {
            if is_rocev2(frame) {
                f(frame);
            } else if rxq.len() < QUEUE {
                counters.rx_frames += 1;
                rxq.push_back(frame.to_vec());
            } else {
                counters.rx_dropped += 1;
            }
        });
        self.turns = self.turns.wrapping_add(1);
        let due = self.turns.is_multiple_of(TIMER_STRIDE) && self.inner.now_ns() >= self.next_poll;
        let kicked = self.shared.kick.load(Ordering::Relaxed)
            && self.shared.kick.swap(false, Ordering::AcqRel);
        if kicked {
            while let Some(frame) = self.shared.fed.pop() {
                self.counters.rx_frames += 1;
                if self.rxq.len() < QUEUE {
                    self.rxq.push_back(frame);
                } else {
                    self.counters.rx_dropped += 1;
                }
            }
        }
        if !self.rxq.is_empty() || due || kicked {
            self.poll_control();
        }
        n
    }

    fn tx<F: FnOnce(&mut [u8])>(&mut self, len: usize, fill: F) -> Result<(), TxError> {
        self.inner.tx(len, fill)
    }

    fn tx_split<S: Span>(&mut self, head: &[u8], frame: &SplitFrame<S>) -> Result<(), TxError> {
        self.inner.tx_split(head, frame)
    }

    crate::port::forward_to_inner!();
}

/// Another queue of a port whose first queue runs the [`ControlPlane`]: passes RoCEv2 to
/// its engine and hands every other frame to the control plane (see
/// [`ControlPlane::feed`]).
pub struct ControlFeed<P> {
    inner: P,
    shared: Arc<Shared>,
    /// Control frames dropped because the control plane's inbox was full.
    pub dropped: u64,
}

impl<P: Port> Port for ControlFeed<P> {
    fn rx_burst<F: FnMut(&[u8])>(&mut self, max: usize, mut f: F) -> usize {
        let Self {
            inner,
            shared,
            dropped,
        } = self;
        inner.rx_burst(max, |frame| {
            if is_rocev2(frame) {
                f(frame);
            } else {
                if shared.fed.push(frame.to_vec()).is_err() {
                    *dropped += 1;
                }
                shared.kick.store(true, Ordering::Release);
            }
        })
    }

    fn tx<F: FnOnce(&mut [u8])>(&mut self, len: usize, fill: F) -> Result<(), TxError> {
        self.inner.tx(len, fill)
    }

    fn tx_split<S: Span>(&mut self, head: &[u8], frame: &SplitFrame<S>) -> Result<(), TxError> {
        self.inner.tx_split(head, frame)
    }

    crate::port::forward_to_inner!();
}

/// smoltcp's view of the port for one poll.
struct SmolDevice<'a, P> {
    port: &'a mut P,
    rxq: &'a mut VecDeque<Vec<u8>>,
    counters: &'a mut ControlCounters,
}

struct FrameRx(Vec<u8>);

impl phy::RxToken for FrameRx {
    fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
        f(&self.0)
    }
}

struct PortTx<'a, P> {
    port: &'a mut P,
    counters: &'a mut ControlCounters,
}

impl<P: Port> phy::TxToken for PortTx<'_, P> {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        let mut f = Some(f);
        let mut out = None;
        let sent = self.port.tx(len, |buf| {
            if let Some(f) = f.take() {
                out = Some(f(buf));
            }
        });
        if sent.is_ok() {
            self.counters.tx_frames += 1;
        }
        match (out, f) {
            (Some(r), _) => r,
            // The port refused the frame (ring full, link down): smoltcp still builds it,
            // into a buffer that goes nowhere, as a lost frame; TCP retransmits.
            (None, Some(f)) => f(&mut vec![0; len]),
            (None, None) => unreachable!("the closure ran or is still here"),
        }
    }
}

impl<P: Port> phy::Device for SmolDevice<'_, P> {
    type RxToken<'b>
        = FrameRx
    where
        Self: 'b;
    type TxToken<'b>
        = PortTx<'b, P>
    where
        Self: 'b;

    fn receive(&mut self, _: Instant) -> Option<(FrameRx, PortTx<'_, P>)> {
        let frame = self.rxq.pop_front()?;
        Some((
            FrameRx(frame),
            PortTx {
                port: self.port,
                counters: self.counters,
            },
        ))
    }

    fn transmit(&mut self, _: Instant) -> Option<PortTx<'_, P>> {
        Some(PortTx {
            port: self.port,
            counters: self.counters,
        })
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut caps = DeviceCapabilities::default();
        caps.medium = Medium::Ethernet;
        caps.max_transmission_unit = self.port.mtu() + 14;
        // A kernel peer on a virtual link (veth, tap) hands its TCP segments over with the
        // checksum left to an offload that never runs (CHECKSUM_PARTIAL): a port beside the
        // kernel sees only the pseudo-header sum. Verifying would drop every such segment, so
        // TCP checksums are written, not checked; the link's FCS guards the control channel.
        caps.checksum.tcp = smoltcp::phy::Checksum::Tx;
        caps
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::port::{LinkState, PortCapabilities};
    use ferroce_stack::wire::{Checks, MacAddr};
    use smoltcp::wire::{
        ArpOperation, ArpPacket, ArpRepr, EthernetFrame, EthernetProtocol, EthernetRepr,
        Icmpv4Packet, Icmpv4Repr, IpProtocol, Ipv4Packet, Ipv4Repr,
    };
    use std::net::Ipv4Addr;

    /// A port whose wire is two queues the test reads and writes.
    #[derive(Default)]
    struct MemPort {
        mac: Option<EthernetAddress>,
        rx: VecDeque<Vec<u8>>,
        tx: Vec<Vec<u8>>,
        now: u64,
    }

    impl Port for MemPort {
        fn rx_burst<F: FnMut(&[u8])>(&mut self, max: usize, mut f: F) -> usize {
            let mut n = 0;
            while n < max {
                let Some(fr) = self.rx.pop_front() else { break };
                f(&fr);
                n += 1;
            }
            n
        }
        fn tx<F: FnOnce(&mut [u8])>(&mut self, len: usize, fill: F) -> Result<(), TxError> {
            let mut b = vec![0; len];
            fill(&mut b);
            self.tx.push(b);
            Ok(())
        }
        fn flush(&mut self) -> usize {
            0
        }
        fn link_state(&self) -> LinkState {
            LinkState::Up
        }
        fn mac(&self) -> MacAddr {
            MacAddr(self.mac.unwrap_or(OURS).0)
        }
        fn mtu(&self) -> usize {
            1500
        }
        fn capabilities(&self) -> PortCapabilities {
            PortCapabilities {
                max_burst: 32,
                rx_checks: Checks::ALL,
                tx_split_min: None,
            }
        }
        fn now_ns(&self) -> u64 {
            self.now
        }
    }

    const OURS: EthernetAddress = EthernetAddress([0x02, 0, 0, 0, 0, 0x0a]);
    const PEER: EthernetAddress = EthernetAddress([0x02, 0, 0, 0, 0, 0x0b]);
    const OUR_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
    const PEER_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);

    fn ethernet(dst: EthernetAddress, ethertype: EthernetProtocol, payload: &[u8]) -> Vec<u8> {
        let repr = EthernetRepr {
            src_addr: PEER,
            dst_addr: dst,
            ethertype,
        };
        let mut b = vec![0; repr.buffer_len() + payload.len()];
        let mut f = EthernetFrame::new_unchecked(&mut b);
        repr.emit(&mut f);
        f.payload_mut().copy_from_slice(payload);
        b
    }

    fn plane() -> ControlPlane<MemPort> {
        ControlPlane::new(MemPort::default(), IpAddr::V4(OUR_IP))
    }

    fn arp_request() -> Vec<u8> {
        let arp = ArpRepr::EthernetIpv4 {
            operation: ArpOperation::Request,
            source_hardware_addr: PEER,
            source_protocol_addr: PEER_IP,
            target_hardware_addr: EthernetAddress([0; 6]),
            target_protocol_addr: OUR_IP,
        };
        let mut p = vec![0; arp.buffer_len()];
        arp.emit(&mut ArpPacket::new_unchecked(&mut p));
        ethernet(EthernetAddress::BROADCAST, EthernetProtocol::Arp, &p)
    }

    #[test]
    fn answers_arp_for_its_address() {
        let mut cp = plane();
        cp.inner.rx.push_back(arp_request());
        let mut roce = 0;
        cp.rx_burst(32, |_| roce += 1);
        assert_eq!(roce, 0, "ARP is not RoCE");
        assert_eq!(cp.inner.tx.len(), 1, "one ARP reply");
        let f = EthernetFrame::new_checked(&cp.inner.tx[0][..]).unwrap();
        assert_eq!(f.dst_addr(), PEER);
        let reply = ArpRepr::parse(&ArpPacket::new_checked(f.payload()).unwrap()).unwrap();
        assert_eq!(
            reply,
            ArpRepr::EthernetIpv4 {
                operation: ArpOperation::Reply,
                source_hardware_addr: OURS,
                source_protocol_addr: OUR_IP,
                target_hardware_addr: PEER,
                target_protocol_addr: PEER_IP,
            }
        );
        assert_eq!(cp.counters().rx_frames, 1);
        assert_eq!(cp.counters().tx_frames, 1);
    }

    #[test]
    fn answers_ping_and_passes_roce_through() {
        let mut cp = plane();
        let echo = Icmpv4Repr::EchoRequest {
            ident: 0x1234,
            seq_no: 7,
            data: b"ferroce ping payload",
        };
        let ip = Ipv4Repr {
            src_addr: PEER_IP,
            dst_addr: OUR_IP,
            next_header: IpProtocol::Icmp,
            payload_len: echo.buffer_len(),
            hop_limit: 64,
        };
        let mut p = vec![0; ip.buffer_len() + echo.buffer_len()];
        let caps = smoltcp::phy::ChecksumCapabilities::default();
        ip.emit(&mut Ipv4Packet::new_unchecked(&mut p), &caps);
        echo.emit(
            &mut Icmpv4Packet::new_unchecked(&mut p[ip.buffer_len()..]),
            &caps,
        );
        // As ping does: ARP first (smoltcp learns neighbours from ARP), then the echo.
        cp.inner.rx.push_back(arp_request());
        cp.inner
            .rx
            .push_back(ethernet(OURS, EthernetProtocol::Ipv4, &p));
        // A RoCEv2 frame in the same burst goes to the engine, not to smoltcp.
        use ferroce_stack::wire::sample::{sample_frame, sample_repr, SampleAddr};
        use ferroce_stack::wire::Opcode;
        let roce = sample_frame(&sample_repr(
            Opcode::RC_SEND_ONLY,
            SampleAddr::default(),
            32,
        ));
        assert!(is_rocev2(&roce));
        for (ip_version, vlan) in [(6, false), (4, true), (6, true)] {
            let addr = SampleAddr {
                ip_version,
                vlan,
                ..SampleAddr::default()
            };
            assert!(is_rocev2(&sample_frame(&sample_repr(
                Opcode::RC_ACKNOWLEDGE,
                addr,
                0
            ))));
        }
        cp.inner.rx.push_back(roce.clone());
        let mut seen = Vec::new();
        cp.rx_burst(32, |f| seen.push(f.to_vec()));
        assert_eq!(seen, vec![roce]);
        let reply = cp
            .inner
            .tx
            .iter()
            .find_map(|b| {
                let f = EthernetFrame::new_checked(&b[..]).ok()?;
                let ip = Ipv4Packet::new_checked(f.payload()).ok()?;
                let icmp = Icmpv4Packet::new_checked(ip.payload()).ok()?;
                match Icmpv4Repr::parse(&icmp, &caps).ok()? {
                    Icmpv4Repr::EchoReply {
                        ident,
                        seq_no,
                        data,
                    } => Some((ip.dst_addr(), ident, seq_no, data.to_vec())),
                    _ => None,
                }
            })
            .expect("an echo reply");
        assert_eq!(
            reply,
            (PEER_IP, 0x1234, 7, b"ferroce ping payload".to_vec())
        );
    }

    #[test]
    fn control_frames_of_other_queues_reach_the_first_queue_s_plane() {
        let mut cp = plane();
        let mut q1 = cp.feed(MemPort::default());
        use ferroce_stack::wire::sample::{sample_frame, sample_repr, SampleAddr};
        let roce = sample_frame(&sample_repr(
            ferroce_stack::wire::Opcode::RC_SEND_ONLY,
            SampleAddr::default(),
            32,
        ));
        q1.inner.rx.push_back(arp_request());
        q1.inner.rx.push_back(roce.clone());
        let mut seen = Vec::new();
        assert_eq!(q1.rx_burst(32, |f| seen.push(f.to_vec())), 2);
        assert_eq!(seen, vec![roce], "RoCE stays on its queue");
        assert!(q1.inner.tx.is_empty());
        // The ARP request crossed over: the first queue's next burst answers it, on its own
        // queue, though nothing arrived there.
        assert_eq!(cp.rx_burst(32, |_| panic!("nothing for the engine")), 0);
        assert_eq!(cp.inner.tx.len(), 1, "one ARP reply");
        let f = EthernetFrame::new_checked(&cp.inner.tx[0][..]).unwrap();
        assert_eq!(f.ethertype(), EthernetProtocol::Arp);
        assert_eq!(f.dst_addr(), PEER);
        assert_eq!(cp.counters().rx_frames, 1);
        // A full inbox drops and counts.
        for _ in 0..QUEUE + 5 {
            q1.inner.rx.push_back(arp_request());
        }
        while q1.rx_burst(32, |_| {}) > 0 {}
        assert_eq!(q1.dropped, 5);
    }

    /// Two planes joined by a wire that a thread turns, as two engines would.
    fn wired<T>(
        f: impl FnOnce(tcp::ControlHandle, tcp::ControlHandle) -> T,
    ) -> (T, ControlCounters, ControlCounters) {
        let mut a = plane();
        let mut b = ControlPlane::new(
            MemPort {
                mac: Some(PEER),
                ..MemPort::default()
            },
            IpAddr::V4(PEER_IP),
        );
        let (ha, hb) = (a.handle(), b.handle());
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let wire = std::thread::spawn(move || {
            while !flag.load(Ordering::Acquire) {
                a.inner.now += 1_000;
                b.inner.now += 1_000;
                a.rx_burst(32, |_| panic!("no RoCE here"));
                b.rx_burst(32, |_| panic!("no RoCE here"));
                b.inner.rx.extend(a.inner.tx.drain(..));
                a.inner.rx.extend(b.inner.tx.drain(..));
                std::thread::yield_now();
            }
            (a.counters(), b.counters())
        });
        let out = f(ha, hb);
        stop.store(true, Ordering::Release);
        let (ca, cb) = wire.join().unwrap();
        (out, ca, cb)
    }

    #[test]
    fn tcp_between_two_planes_carries_bytes_both_ways_and_closes() {
        use std::io::{Read, Write};
        use std::time::Duration;
        let ((), ca, cb) = wired(|ha, hb| {
            let mut listener = hb.listen(18515).unwrap();
            let server = std::thread::spawn(move || {
                let (mut s, from) = listener.accept(Some(Duration::from_secs(10))).unwrap();
                assert_eq!(from.ip(), IpAddr::V4(OUR_IP));
                s.set_read_timeout(Some(Duration::from_secs(10)));
                let mut msg = [0u8; 5];
                s.read_exact(&mut msg).unwrap();
                assert_eq!(&msg, b"hello");
                s.write_all(&[7u8; 3000]).unwrap();
                s.flush().unwrap();
                // The client's close arrives as end of stream.
                let mut rest = Vec::new();
                s.read_to_end(&mut rest).unwrap();
                assert!(rest.is_empty());
            });
            let to = std::net::SocketAddr::new(IpAddr::V4(PEER_IP), 18515);
            let mut c = ha.connect(to, Duration::from_secs(10)).unwrap();
            assert_eq!(c.peer_addr(), Some(to));
            c.write_all(b"hello").unwrap();
            c.set_read_timeout(Some(Duration::from_secs(10)));
            let mut back = vec![0u8; 3000];
            c.read_exact(&mut back).unwrap();
            assert!(back.iter().all(|&x| x == 7));
            drop(c);
            server.join().unwrap();
            // Nothing listens on another port: refused at once, as by a kernel.
            let e = ha
                .connect(
                    std::net::SocketAddr::new(IpAddr::V4(PEER_IP), 18516),
                    Duration::from_secs(10),
                )
                .unwrap_err();
            assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused);
        });
        assert!(ca.tx_frames >= 4 && cb.tx_frames >= 4, "{ca:?} {cb:?}");
        assert_eq!(ca.rx_dropped + cb.rx_dropped, 0);
    }

    #[test]
    fn waits_end_in_their_timeout_when_no_engine_turns() {
        let cp = plane();
        let h = cp.handle();
        let mut l = h.listen(1).unwrap();
        let e = l
            .accept(Some(std::time::Duration::from_millis(20)))
            .unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::TimedOut);
    }

    proptest::proptest! {
        #[test]
        fn classifying_any_bytes_never_panics(b in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..128)) {
            let _ = is_rocev2(&b);
        }
    }
}
