//! Loopback: frames a device sends to its own port's MAC address, for one of this process's
//! QPs, never reach the wire. A ConnectX port delivers a packet addressed to its own GID
//! internally, to any QP of any context on it; so does ferroce. Every QP of a device on a
//! real port is entered in a process-wide table under its QP number with its engine's
//! [`LoopInbox`]; an engine about to transmit a frame whose destination MAC is its port's
//! own hands the frame to the inbox of the QP the BTH names instead, and the owning engine
//! takes it from there as if it had arrived on the port (the same engine, another engine of
//! the device, or another device of the process opened on the same interface).
//!
//! QP numbers are therefore handed out process-wide for real ports ([`next_qpn`]), so no two
//! contexts of one process share one; and across the processes of a network namespace (those
//! that can share an interface) they differ in their top eight bits, a slot each process
//! claims by binding the abstract Unix socket `ferroce-qpn-<slot>`. A frame to the port's own
//! address for a QP of another slot goes to that socket, and the owning process's loopback
//! thread hands it to its engine: two processes on one interface talk to each other by the
//! port's GID without a frame leaving, as two programs on one ConnectX port do.

use std::collections::HashMap;
use std::os::unix::net::UnixDatagram;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, LazyLock, OnceLock, PoisonError, RwLock, Weak};

use crossbeam::queue::ArrayQueue;

/// Frames an engine's loopback inbox holds.
const LOOP_INBOX: usize = 4096;

/// An engine's inbox of frames other engines of the process looped to it.
pub(crate) struct LoopInbox {
    /// Frames, each marked raw (a raw packet QP's, for flow rules only) or not (RoCE).
    frames: ArrayQueue<(Vec<u8>, bool)>,
    /// Buffers of taken frames, reused by the next push.
    spare: ArrayQueue<Vec<u8>>,
    /// Wakes the engine's thread if it sleeps (set by the device once it has one).
    wake: OnceLock<Box<dyn Fn() + Send + Sync>>,
}

impl std::fmt::Debug for LoopInbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoopInbox")
            .field("frames", &self.frames.len())
            .finish_non_exhaustive()
    }
}

impl LoopInbox {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self {
            frames: ArrayQueue::new(LOOP_INBOX),
            spare: ArrayQueue::new(LOOP_INBOX),
            wake: OnceLock::new(),
        })
    }

    /// Sets what wakes the owning engine's thread.
    pub(crate) fn set_wake(&self, f: Box<dyn Fn() + Send + Sync>) {
        let _ = self.wake.set(f);
    }

    /// Queues a copy of `frame` (made by `fill`, `len` bytes) and wakes the owner; false
    /// when the inbox is full (dropped, as on a full receive ring).
    fn push(&self, len: usize, raw: bool, fill: impl FnOnce(&mut [u8])) -> bool {
        let mut buf = self.spare.pop().unwrap_or_default();
        buf.clear();
        buf.resize(len, 0);
        fill(&mut buf);
        if let Err((buf, _)) = self.frames.push((buf, raw)) {
            let _ = self.spare.push(buf);
            return false;
        }
        if let Some(w) = self.wake.get() {
            w();
        }
        true
    }

    /// The next frame and whether it is a raw QP's, if any; give its buffer back with
    /// [`recycle`](Self::recycle).
    pub(crate) fn pop(&self) -> Option<(Vec<u8>, bool)> {
        self.frames.pop()
    }

    /// Returns a taken frame's buffer for reuse.
    pub(crate) fn recycle(&self, buf: Vec<u8>) {
        let _ = self.spare.push(buf);
    }

    /// True when no frame waits.
    pub(crate) fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }
}

/// The process's QPs on real ports, by number, and the inbox of the engine each lives on.
static OWNERS: LazyLock<RwLock<HashMap<u32, Weak<LoopInbox>>>> =
    LazyLock::new(|| RwLock::new(HashMap::new()));

/// Enters QP `qpn` as living on the engine with `inbox`.
pub(crate) fn claim(qpn: u32, inbox: &Arc<LoopInbox>) {
    OWNERS
        .write()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(qpn, Arc::downgrade(inbox));
}

/// Forgets QP `qpn` (destroyed).
pub(crate) fn release(qpn: u32) {
    OWNERS
        .write()
        .unwrap_or_else(PoisonError::into_inner)
        .remove(&qpn);
}

/// What became of a frame to the port's own address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Looped {
    /// Queued for the engine of the QP it names.
    Delivered,
    /// That engine's inbox was full: dropped.
    Dropped,
    /// No QP of this process has the number it names (or it is no RoCE frame).
    NoOwner,
}

/// Hands a frame (`len` bytes, written by `fill`) whose BTH names `qpn` to the engine of
/// that QP: in this process, or through its mailbox to the process of the same namespace
/// whose slot its top eight bits name.
pub(crate) fn deliver(qpn: u32, len: usize, fill: impl FnOnce(&mut [u8])) -> Looped {
    let theirs = qpn >> 16;
    let me = mailbox();
    if theirs == me.slot {
        return deliver_here(qpn, len, fill);
    }
    let (Some(sock), Ok(addr)) = (&me.sock, mailbox_addr(theirs)) else {
        return Looped::NoOwner;
    };
    thread_local! {
        static BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    BUF.with_borrow_mut(|buf| {
        buf.clear();
        buf.resize(len, 0);
        fill(buf);
        match sock.send_to_addr(buf, &addr) {
            Ok(_) => Looped::Delivered,
            // No process has that slot here (or it is gone).
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Looped::Dropped,
            Err(_) => Looped::NoOwner,
        }
    })
}

/// Hands a copy of `frame` to every other process of the namespace that has a mailbox: a
/// MAD to the port's own GID is for QP1, which every process on the port runs (each one's
/// communication manager takes what it claims). The number delivered.
pub(crate) fn deliver_to_other_processes(frame: &[u8]) -> usize {
    let me = mailbox();
    let Some(sock) = &me.sock else {
        return 0;
    };
    (1..=254)
        .filter(|&s| s != me.slot)
        .filter_map(|s| mailbox_addr(s).ok())
        .filter(|a| sock.send_to_addr(frame, a).is_ok())
        .count()
}

/// Opens this process's mailbox now (it opens with the first QP otherwise): a process
/// whose only business yet is QP1, a server waiting for requests, is reached through it.
pub(crate) fn open_mailbox() {
    let _ = mailbox();
}

/// [`deliver`] to a QP of this process.
fn deliver_here(qpn: u32, len: usize, fill: impl FnOnce(&mut [u8])) -> Looped {
    let owner = OWNERS
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .get(&qpn)
        .and_then(Weak::upgrade);
    match owner {
        Some(inbox) if inbox.push(len, false, fill) => Looped::Delivered,
        Some(_) => Looped::Dropped,
        None => Looped::NoOwner,
    }
}

/// The engines of the process on each port, by the port's MAC: where a raw QP's frame to a
/// multicast address or to the port's own goes besides the wire.
static PORTS: LazyLock<RwLock<PortInboxes>> = LazyLock::new(|| RwLock::new(HashMap::new()));

/// The inboxes of the engines on each port, by MAC.
type PortInboxes = HashMap<[u8; 6], Vec<Weak<LoopInbox>>>;

/// Enters `inbox` as an engine on the port with `mac`.
pub(crate) fn join_port(mac: [u8; 6], inbox: &Arc<LoopInbox>) {
    let mut ports = PORTS.write().unwrap_or_else(PoisonError::into_inner);
    let list = ports.entry(mac).or_default();
    list.retain(|w| w.strong_count() > 0);
    list.push(Arc::downgrade(inbox));
}

/// Hands a copy of a raw QP's frame to every engine of the process on the port with `mac`.
pub(crate) fn deliver_raw(mac: [u8; 6], frame: &[u8]) -> usize {
    let ports = PORTS.read().unwrap_or_else(PoisonError::into_inner);
    let mut n = 0;
    for inbox in ports
        .get(&mac)
        .into_iter()
        .flatten()
        .filter_map(Weak::upgrade)
    {
        n += usize::from(inbox.push(frame.len(), true, |b| b.copy_from_slice(frame)));
    }
    n
}

/// The destination QP number in the headers of a RoCEv2 frame (Ethernet, an optional
/// 802.1Q tag, IPv4 or IPv6, UDP to port 4791, BTH), if `head` holds them. Read from the
/// headers alone, so it serves a frame whose payload still lies in registered memory.
pub(crate) fn dest_qpn(head: &[u8]) -> Option<u32> {
    let mut at = 12;
    let mut ethertype = u16::from_be_bytes(head.get(at..at + 2)?.try_into().ok()?);
    if ethertype == 0x8100 {
        at += 4;
        ethertype = u16::from_be_bytes(head.get(at..at + 2)?.try_into().ok()?);
    }
    at += 2;
    let (proto, ip_len) = match ethertype {
        0x0800 => {
            let ihl = usize::from(head.get(at)? & 0x0f) * 4;
            (*head.get(at + 9)?, ihl)
        }
        0x86dd => (*head.get(at + 6)?, 40),
        _ => return None,
    };
    at += ip_len;
    let dport = u16::from_be_bytes(head.get(at + 2..at + 4)?.try_into().ok()?);
    if proto != 17 || dport != 4791 {
        return None;
    }
    let bth = head.get(at + 8..at + 20)?;
    Some(u32::from_be_bytes([0, bth[5], bth[6], bth[7]]))
}

/// This process's mailbox: its slot (the top eight bits of its QP numbers on real ports)
/// and the socket other processes on the same host and network namespace reach it at.
struct Mailbox {
    slot: u32,
    sock: Option<UnixDatagram>,
}

/// The abstract socket address of slot `s`'s mailbox. Abstract addresses belong to the
/// network namespace, as the interfaces the processes share do, and vanish with the process.
fn mailbox_addr(s: u32) -> std::io::Result<std::os::unix::net::SocketAddr> {
    use std::os::linux::net::SocketAddrExt;
    std::os::unix::net::SocketAddr::from_abstract_name(format!("ferroce-qpn-{s}"))
}

/// This process's mailbox, claimed the first time a device joins loopback: the first slot
/// in 1..=254 (slot 0 holds QPN 0 and 1, the SMI and GSI; 255 the multicast QPN) whose
/// address no other process of the namespace has bound. Its receiving thread hands each
/// frame another process sent to the QP it names here.
fn mailbox() -> &'static Mailbox {
    static MAILBOX: OnceLock<Mailbox> = OnceLock::new();
    MAILBOX.get_or_init(|| {
        let start = std::process::id() % 254;
        for i in 0..254 {
            let s = (start + i) % 254 + 1;
            let Ok(addr) = mailbox_addr(s) else { break };
            match UnixDatagram::bind_addr(&addr) {
                Ok(sock) => {
                    if let Ok(rx) = sock.try_clone() {
                        let _ = std::thread::Builder::new()
                            .name("ferroce-loopback".into())
                            .spawn(move || receive(rx));
                    }
                    return Mailbox {
                        slot: s,
                        sock: Some(sock),
                    };
                }
                Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => continue,
                Err(e) => {
                    tracing::warn!(%e, "no loopback mailbox; QP numbers may collide across processes");
                    break;
                }
            }
        }
        Mailbox {
            slot: start + 1,
            sock: None,
        }
    })
}

/// The mailbox's receiving thread: each frame to the QP it names.
fn receive(sock: UnixDatagram) {
    let mut buf = vec![0u8; 1 << 16];
    while let Ok(n) = sock.recv(&mut buf) {
        let frame = &buf[..n];
        if let Some(qpn) = dest_qpn(frame) {
            let _ = deliver_here(qpn, n, |b| b.copy_from_slice(frame));
        }
    }
}

/// This process's slot.
fn slot() -> u32 {
    mailbox().slot
}

/// The next QP number of this process on a real port: its slot in the top eight bits, a
/// count in the rest (never 0 or 1 there, so never the SMI, GSI or multicast QPN).
pub(crate) fn next_qpn() -> u32 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    loop {
        let n = NEXT.fetch_add(1, Ordering::Relaxed) & 0xffff;
        if n > 1 {
            return slot() << 16 | n;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qpns_carry_the_process_slot_and_skip_reserved_numbers() {
        let a = next_qpn();
        let b = next_qpn();
        assert_eq!(a >> 16, b >> 16);
        assert!((1..=254).contains(&(a >> 16)));
        assert_ne!(a & 0xffff, b & 0xffff);
        for _ in 0..70_000 {
            let q = next_qpn();
            assert!(q & 0xffff > 1, "{q:#x}");
            assert!(q != 0xff_ffff && q > 1);
        }
    }

    #[test]
    fn the_destination_qpn_is_read_from_the_headers() {
        use ferroce_stack::wire::sample::{sample_frame, sample_repr, SampleAddr};
        use ferroce_stack::wire::Opcode;
        for (ip_version, vlan) in [(4, false), (4, true), (6, false), (6, true)] {
            let addr = SampleAddr {
                ip_version,
                vlan,
                ..SampleAddr::default()
            };
            let repr = sample_repr(Opcode::RC_SEND_ONLY, addr, 64);
            let f = sample_frame(&repr);
            assert_eq!(dest_qpn(&f), Some(repr.bth.dest_qpn.value()));
            assert_eq!(dest_qpn(&f[..30]), None);
            let mut not_roce = f.clone();
            not_roce[12] = 0x88;
            assert_eq!(dest_qpn(&not_roce), None);
        }
    }

    #[test]
    fn frames_reach_the_inbox_of_the_qp_they_name() {
        let inbox = LoopInbox::new();
        let q = slot() << 16 | 0xcdef;
        claim(q, &inbox);
        assert_eq!(
            deliver(q, 3, |b| b.copy_from_slice(&[1, 2, 3])),
            Looped::Delivered
        );
        assert_eq!(deliver(q + 1, 3, |_| {}), Looped::NoOwner);
        let (f, raw) = inbox.pop().unwrap();
        assert_eq!((f.as_slice(), raw), (&[1u8, 2, 3][..], false));
        inbox.recycle(f);
        release(q);
        assert_eq!(deliver(q, 1, |_| {}), Looped::NoOwner);
        // A slot no process of this namespace holds: nobody to hand it to.
        let other = if slot() == 254 { 253 } else { 254 };
        assert_eq!(deliver(other << 16 | 2, 1, |_| {}), Looped::NoOwner);
        drop(inbox);
    }
}
