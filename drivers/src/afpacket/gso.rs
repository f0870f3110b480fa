//! UDP segmentation offload for RoCEv2 over AF_PACKET (the port's `gso` option).
//!
//! TCP over a veth pair crosses the kernel 64 KiB at a time; RoCEv2 at most one 4 KiB path
//! MTU's worth, so the kernel's per-packet work dominates. With `gso`, a run of equal-sized
//! RoCEv2 packets of one flow leaves as one UDP datagram behind a virtio-net header that asks
//! for UDP_L4 segmentation with `gso_size` = one packet's UDP payload (how QUIC stacks send).
//! The segments are the original packets byte for byte: the transport gives consecutive
//! packets of a QP consecutive IPv4 identifications, which is what segmentation writes, and
//! each packet's ICRC is already among its bytes. A NIC with USO or the kernel's software GSO
//! cuts the datagram where it leaves through a real device; between two ferroce ports on a
//! veth pair nobody cuts it, and the receiving port, which asked for virtio-net headers,
//! splits it itself ([`split`]).
//!
//! Everything here is plain byte work, so it is tested without sockets; the port does the
//! system calls.

use ferroce_stack::wire::internet_checksum;
use ferroce_stack::wire::{Span, SplitFrame};

/// Bytes of `struct virtio_net_hdr`, which leads every frame once PACKET_VNET_HDR is set.
pub(crate) const VNET_HDR_LEN: usize = 10;
/// `VIRTIO_NET_HDR_F_NEEDS_CSUM`: segmentation needs a partial L4 checksum.
const F_NEEDS_CSUM: u8 = 1;
/// `VIRTIO_NET_HDR_GSO_UDP_L4`.
pub(crate) const GSO_UDP_L4: u8 = 5;
/// Most packets in one datagram (the kernel's UDP_MAX_SEGMENTS is at least this).
pub(crate) const MAX_SEGS: usize = 64;
/// Largest Ethernet + VLAN + IPv6 + UDP header.
const MAX_HDR: usize = 18 + 40 + 8;

/// Where a frame's IP and UDP headers start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Layout {
    l3: usize,
    l4: usize,
    v4: bool,
}

impl Layout {
    /// Bytes up to the end of the UDP header: what every segment repeats.
    fn hdr_len(self) -> usize {
        self.l4 + 8
    }
}

/// The header layout of an Ethernet (optionally 802.1Q) / IPv4 without options or IPv6
/// without extension headers / UDP frame; `None` for anything else.
fn layout(frame: &[u8]) -> Option<Layout> {
    let ethertype = |at: usize| Some(u16::from_be_bytes([*frame.get(at)?, *frame.get(at + 1)?]));
    let (l3, et) = match ethertype(12)? {
        0x8100 => (18, ethertype(16)?),
        et => (14, et),
    };
    let lay = match et {
        0x0800 if *frame.get(l3)? == 0x45 && *frame.get(l3 + 9)? == 17 => Layout {
            l3,
            l4: l3 + 20,
            v4: true,
        },
        0x86dd if *frame.get(l3)? >> 4 == 6 && *frame.get(l3 + 6)? == 17 => Layout {
            l3,
            l4: l3 + 40,
            v4: false,
        },
        _ => return None,
    };
    (frame.len() >= lay.hdr_len()).then_some(lay)
}

/// True when two frames' headers agree on everything segmentation copies unchanged: the
/// Ethernet header, the IP header but for length, identification and checksum, and the UDP
/// ports.
fn same_flow(lay: Layout, a: &[u8], b: &[u8]) -> bool {
    let (l3, l4) = (lay.l3, lay.l4);
    let ip_same = if lay.v4 {
        a[l3..l3 + 2] == b[l3..l3 + 2]
            && a[l3 + 6..l3 + 10] == b[l3 + 6..l3 + 10]
            && a[l3 + 12..l4] == b[l3 + 12..l4]
    } else {
        a[l3..l3 + 4] == b[l3..l3 + 4] && a[l3 + 6..l4] == b[l3 + 6..l4]
    };
    a[..l3] == b[..l3] && ip_same && a[l4..l4 + 4] == b[l4..l4 + 4]
}

fn ident(lay: Layout, frame: &[u8]) -> u16 {
    if lay.v4 {
        u16::from_be_bytes([frame[lay.l3 + 4], frame[lay.l3 + 5]])
    } else {
        0
    }
}

/// Rewrites the IP and UDP headers at the front of `hdr` for a UDP payload of `len` bytes:
/// lengths, the IPv4 identification and header checksum, and the UDP checksum field.
fn set_lengths(lay: Layout, hdr: &mut [u8], len: usize, id: u16, udp_check: u16) {
    let (l3, l4) = (lay.l3, lay.l4);
    let udp_len = 8 + len;
    if lay.v4 {
        hdr[l3 + 2..l3 + 4].copy_from_slice(&((20 + udp_len) as u16).to_be_bytes());
        hdr[l3 + 4..l3 + 6].copy_from_slice(&id.to_be_bytes());
        hdr[l3 + 10..l3 + 12].fill(0);
        let sum = internet_checksum(&hdr[l3..l4]);
        hdr[l3 + 10..l3 + 12].copy_from_slice(&sum.to_be_bytes());
    } else {
        hdr[l3 + 4..l3 + 6].copy_from_slice(&(udp_len as u16).to_be_bytes());
    }
    hdr[l4 + 4..l4 + 6].copy_from_slice(&(udp_len as u16).to_be_bytes());
    hdr[l4 + 6..l4 + 8].copy_from_slice(&udp_check.to_be_bytes());
}

/// The UDP pseudo-header sum, folded and not inverted: what a partial checksum leaves in
/// the UDP checksum field for the device (or GSO) to finish.
fn pseudo_sum(lay: Layout, hdr: &[u8], udp_len: usize) -> u16 {
    let mut p = [0u8; 40];
    let n = if lay.v4 {
        p[..8].copy_from_slice(&hdr[lay.l3 + 12..lay.l3 + 20]);
        p[9] = 17;
        p[10..12].copy_from_slice(&(udp_len as u16).to_be_bytes());
        12
    } else {
        p[..32].copy_from_slice(&hdr[lay.l3 + 8..lay.l3 + 40]);
        p[32..36].copy_from_slice(&(udp_len as u32).to_be_bytes());
        p[39] = 17;
        40
    };
    !internet_checksum(&p[..n])
}

/// Bytes of a batch's buffer: the largest datagram and room to align it.
const BATCH_BUF: usize = MAX_HDR + 0xffff + ALIGN;
/// Where the kernel's copy of a datagram lands best: its data pages start at offset 0, and
/// `rep movsb` copies fastest when source and destination agree modulo a cache line.
const ALIGN: usize = 64;

/// Packets waiting to leave as one datagram, copied out of registered memory as they come.
///
/// The copy is what makes the kernel's own copy fast. Gathering payload straight from the
/// application's memory with `sendmsg` would leave each packet's payload 16 bytes further
/// out of step with its source than the last (a packet's BTH and ICRC lie between), and the
/// kernel's `rep movsb` into freshly allocated pages ran at a third of the speed of an
/// aligned copy here. Laid out in this buffer so that the bytes after the L2–L4 header (the
/// part the kernel puts in page fragments) start on a cache line, the kernel's copy is
/// aligned, and this one lands in a buffer that stays in cache.
pub(crate) struct Batch {
    buf: Box<[u8]>,
    /// Where the datagram starts in `buf`, and where it ends.
    start: usize,
    end: usize,
    lay: Option<Layout>,
    first_id: u16,
    seg_len: usize,
    segs: usize,
    closed: bool,
}

impl Default for Batch {
    fn default() -> Self {
        Self {
            buf: vec![0; BATCH_BUF].into_boxed_slice(),
            start: 0,
            end: 0,
            lay: None,
            first_id: 0,
            seg_len: 0,
            segs: 0,
            closed: false,
        }
    }
}

impl std::fmt::Debug for Batch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batch")
            .field("segs", &self.segs)
            .field("seg_len", &self.seg_len)
            .field("bytes", &(self.end - self.start))
            .finish()
    }
}

impl Batch {
    /// Packets in the batch.
    pub(crate) fn len(&self) -> usize {
        self.segs
    }

    /// True when nothing waits.
    pub(crate) fn is_empty(&self) -> bool {
        self.segs == 0
    }

    /// Adds a frame given as `frame` over `head` (see [`SplitFrame`]). An empty batch takes
    /// any frame; a batch with packets takes only the next packet of the same flow, as long
    /// as its own, with the next identification, while the datagram stays under 64 KiB —
    /// else `false`, and the caller sends the batch and pushes again.
    pub(crate) fn push<S: Span>(&mut self, head: &[u8], frame: &SplitFrame<S>) -> bool {
        let head = &head[..frame.head_len];
        if self.segs == 0 {
            self.lay = layout(head);
            let h = self.lay.map_or(0, Layout::hdr_len);
            // The byte after the L2–L4 header on a cache line (see the type's comment).
            let base = self.buf.as_ptr() as usize + MAX_HDR;
            self.start = MAX_HDR - h + (ALIGN - base % ALIGN) % ALIGN;
            self.end = self.start;
            if frame.len() > self.buf.len() - self.start {
                return false; // never for a frame a port's MTU allows
            }
            self.own(&head[..h]);
            self.first_id = self.lay.map_or(0, |l| ident(l, head));
            self.seg_len = frame.len() - h;
            // A frame this code does not understand travels alone, as it is.
            self.closed = self.lay.is_none();
            self.add(&head[h..], frame);
            return true;
        }
        let Some(lay) = self.lay else {
            return false;
        };
        let h = lay.hdr_len();
        if self.closed
            || layout(head) != Some(lay)
            || !same_flow(lay, &self.buf[self.start..], head)
            || ident(lay, head) != self.first_id.wrapping_add(self.segs as u16)
            || frame.len() - h > self.seg_len
            || self.segs + 1 > MAX_SEGS
            || (if lay.v4 { 28 } else { 8 }) + (self.end - self.start - h) + frame.len() - h
                > 0xffff
        {
            return false;
        }
        // A shorter packet can only be the last segment.
        self.closed = frame.len() - h < self.seg_len;
        self.add(&head[h..], frame);
        true
    }

    fn own(&mut self, b: &[u8]) {
        self.buf[self.end..self.end + b.len()].copy_from_slice(b);
        self.end += b.len();
    }

    fn add<S: Span>(&mut self, transport_head: &[u8], frame: &SplitFrame<S>) {
        self.own(transport_head);
        for s in &frame.payload {
            s.copy_to(&mut self.buf[self.end..self.end + s.len()]);
            self.end += s.len();
        }
        self.own(&frame.tail[..frame.tail_len]);
        self.segs += 1;
    }

    /// Writes the virtio-net header into `vnet` and returns the datagram, its L2–L4 header
    /// rewritten for the whole of it when it carries several packets.
    pub(crate) fn datagram(&mut self, vnet: &mut [u8; VNET_HDR_LEN]) -> &[u8] {
        *vnet = [0; VNET_HDR_LEN];
        if let Some(lay) = self.lay.filter(|_| self.segs > 1) {
            let h = lay.hdr_len();
            let total = self.end - self.start - h;
            let hdr = &mut self.buf[self.start..self.start + h];
            let check = pseudo_sum(lay, hdr, 8 + total);
            set_lengths(lay, hdr, total, self.first_id, check);
            vnet[0] = F_NEEDS_CSUM;
            vnet[1] = GSO_UDP_L4;
            // hdr_len is also how much the kernel puts in the socket buffer's head; the rest
            // goes to page fragments from offset 0, which `push` aligned.
            vnet[2..4].copy_from_slice(&(h as u16).to_le_bytes());
            vnet[4..6].copy_from_slice(&(self.seg_len as u16).to_le_bytes());
            vnet[6..8].copy_from_slice(&(lay.l4 as u16).to_le_bytes());
            vnet[8..10].copy_from_slice(&6u16.to_le_bytes());
        }
        &self.buf[self.start..self.end]
    }

    /// Empties the batch.
    pub(crate) fn clear(&mut self) {
        self.segs = 0;
        self.closed = false;
        self.lay = None;
        self.start = 0;
        self.end = 0;
    }
}

/// Splits a datagram that arrived behind a virtio-net header asking for UDP_L4 segmentation
/// of `gso_size` bytes back into the packets it carries, lending each to `f`; returns how
/// many. Segment `i` gets the datagram's headers with its own lengths, identification
/// `first + i` and IPv4 checksum, and a zero UDP checksum — what segmentation would have
/// written, so each comes out as its sender emitted it. The headers of segment `i` are written
/// over the tail of segment `i - 1`, which `f` has seen already: no copy of the payload.
/// Anything not understood is lent whole (the parser then rejects it); nothing panics.
pub(crate) fn split(frame: &mut [u8], gso_size: usize, f: &mut impl FnMut(&[u8])) -> usize {
    let Some(lay) = layout(frame) else {
        f(frame);
        return 1;
    };
    let h = lay.hdr_len();
    if gso_size == 0 || frame.len() <= h {
        f(frame);
        return 1;
    }
    let mut hdr = [0u8; MAX_HDR];
    hdr[..h].copy_from_slice(&frame[..h]);
    let first = ident(lay, &hdr);
    let mut start = h;
    let mut n = 0;
    while start < frame.len() {
        let end = frame.len().min(start + gso_size);
        let at = start - h;
        frame[at..start].copy_from_slice(&hdr[..h]);
        set_lengths(
            lay,
            &mut frame[at..start],
            end - start,
            first.wrapping_add(n as u16),
            0,
        );
        f(&frame[at..end]);
        n += 1;
        start = end;
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferroce_stack::transport::loopback::connect;
    use ferroce_stack::transport::{
        Access, MrKeys, MrTable, Mtu, Payload, PdId, Qp, QpAttr, QpConfig, QpType, SendWr, Sge,
        TxOut, WrOpcode,
    };
    use ferroce_stack::wire::{Checks, Psn, Qpn, RoceRepr};
    use proptest::prelude::*;

    const PD: PdId = PdId(1);

    /// A connected RC requester over `mem` with a 64 KiB WRITE, a WRITE of 10 001 bytes (a
    /// short, padded last packet), a SEND of 9 000 and a WRITE that fits one packet posted.
    fn requester(mem: &mut MrTable, buf: &mut [u64], psn: u32) -> Qp {
        let all = Access::LOCAL_WRITE
            .with(Access::REMOTE_WRITE)
            .with(Access::REMOTE_READ);
        // SAFETY: `buf` outlives the table in every test below and never moves.
        let k: MrKeys =
            unsafe { mem.register(PD, buf.as_mut_ptr().cast(), 1 << 18, 0, all) }.unwrap();
        let mut a = Qp::new(QpConfig::new(Qpn::new(1), QpType::Rc, PD));
        let mut b = Qp::new(QpConfig::new(Qpn::new(2), QpType::Rc, PD));
        let attr = QpAttr {
            qp_access_flags: all,
            path_mtu: Mtu::Mtu4096,
            sq_psn: Psn::new(psn),
            rq_psn: Psn::new(7),
            timeout: 10,
            ..QpAttr::default()
        };
        connect(&mut a, &mut b, &attr).unwrap();
        for (id, op, addr, len) in [
            (1, WrOpcode::Write, 0, 65536),
            (2, WrOpcode::Write, 70_000, 10_001),
            (3, WrOpcode::Send, 100_000, 9000),
            (4, WrOpcode::Write, 120_000, 700),
        ] {
            let sge = Box::leak(Box::new([Sge {
                addr,
                length: len,
                lkey: k.lkey,
            }]));
            let mut wr = SendWr::new(id, op, Payload::Sges(sge));
            if op == WrOpcode::Write {
                wr = wr.remote(addr, k.rkey);
            }
            a.post_send(&wr).unwrap();
        }
        a
    }

    fn pattern(buf: &mut [u64]) {
        for (i, w) in buf.iter_mut().enumerate() {
            *w = (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }

    /// The datagram as bytes, and its virtio-net header.
    fn datagram(b: &mut Batch) -> ([u8; VNET_HDR_LEN], Vec<u8>) {
        let mut vnet = [0u8; VNET_HDR_LEN];
        let d = b.datagram(&mut vnet).to_vec();
        (vnet, d)
    }

    /// What the receiving port makes of one datagram.
    fn received(vnet: [u8; VNET_HDR_LEN], mut d: Vec<u8>) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        if vnet[1] == GSO_UDP_L4 {
            let g = usize::from(u16::from_le_bytes([vnet[4], vnet[5]]));
            let n = split(&mut d, g, &mut |f: &[u8]| out.push(f.to_vec()));
            assert_eq!(n, out.len());
        } else {
            out.push(d);
        }
        out
    }

    /// Sends every frame of `qp` through a batch the way the port does, then splits the
    /// datagrams the way the receiving port does; returns the frames and the datagram count.
    fn through_batches(qp: &mut Qp, mem: &MrTable) -> (Vec<Vec<u8>>, usize) {
        let mut buf = vec![0u8; 9000];
        let mut b = Batch::default();
        let (mut out, mut datagrams) = (Vec::new(), 0);
        let mut send = |b: &mut Batch, out: &mut Vec<Vec<u8>>| {
            if !b.is_empty() {
                let (vnet, d) = datagram(b);
                out.extend(received(vnet, d));
                b.clear();
                datagrams += 1;
            }
        };
        while let Some(tx) = qp.poll_transmit_split(0, &mut buf, mem, 1) {
            match tx {
                TxOut::Whole(n) => {
                    send(&mut b, &mut out);
                    out.push(buf[..n].to_vec());
                }
                TxOut::Split(s) => {
                    if !b.push(&buf, &s) {
                        send(&mut b, &mut out);
                        assert!(b.push(&buf, &s), "an empty batch takes any frame");
                    }
                }
            }
        }
        send(&mut b, &mut out);
        (out, datagrams)
    }

    fn whole_frames(qp: &mut Qp, mem: &MrTable) -> Vec<Vec<u8>> {
        let mut buf = vec![0u8; 9000];
        let mut out = Vec::new();
        while let Some(n) = qp.poll_transmit(0, &mut buf, mem) {
            out.push(buf[..n].to_vec());
        }
        out
    }

    #[test]
    fn packets_survive_batching_and_splitting_byte_for_byte() {
        // Two identical requesters: one emits whole frames, the other split frames that go
        // through a batch and a split. The PSNs start near a 16-bit wrap of the IPv4
        // identification.
        for psn in [100, 0xfffa, 0xff_fffc] {
            let (mut buf_w, mut buf_s) = (vec![0u64; 1 << 15], vec![0u64; 1 << 15]);
            pattern(&mut buf_w);
            pattern(&mut buf_s);
            let (mut mw, mut ms) = (MrTable::new(1), MrTable::new(1));
            let mut w = requester(&mut mw, &mut buf_w, psn);
            let mut s = requester(&mut ms, &mut buf_s, psn);
            let want = whole_frames(&mut w, &mw);
            let (got, datagrams) = through_batches(&mut s, &ms);
            assert_eq!(got.len(), want.len(), "psn {psn:#x}");
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(g, w, "psn {psn:#x}: frame {i} differs");
                RoceRepr::parse(g, Checks::ALL).expect("ICRC and IPv4 checksum good");
            }
            // 64 KiB: FIRST (with its RETH, longer) + 15 equal packets → 2 datagrams;
            // 10 001 B: FIRST + MIDDLE (shorter, closes) → 1, then LAST alone → 1;
            // SEND 9 000: FIRST, MIDDLE, LAST all from one flow, equal but the last → 1;
            // the one-packet WRITE_ONLY → 1.
            assert_eq!(want.len(), 16 + 3 + 3 + 1);
            assert_eq!(datagrams, 2 + 2 + 1 + 1, "psn {psn:#x}");
        }
    }

    #[test]
    fn the_datagram_is_what_segmentation_expects() {
        let mut buf = vec![0u64; 1 << 15];
        pattern(&mut buf);
        let mut mem = MrTable::new(1);
        let mut qp = requester(&mut mem, &mut buf, 0xfffe);
        let mut frame = vec![0u8; 9000];
        let mut b = Batch::default();
        let mut n = 0;
        while let Some(TxOut::Split(s)) = qp.poll_transmit_split(0, &mut frame, &mem, 1) {
            n += 1;
            if n == 1 {
                continue; // the 64 KiB WRITE's FIRST, which travels alone
            }
            assert!(b.push(&frame, &s), "packet {n} joins");
            if n == 16 {
                break;
            }
        }
        let mut v = [0u8; VNET_HDR_LEN];
        let at = b.datagram(&mut v).as_ptr() as usize;
        assert_eq!(
            (at + 42) % ALIGN,
            0,
            "the bytes after the headers start a cache line"
        );
        let (vnet, d) = datagram(&mut b);
        // virtio_net_hdr: NEEDS_CSUM, UDP_L4, hdr_len 42, gso_size = BTH + 4096 + ICRC,
        // csum_start at the UDP header, csum_offset 6.
        assert_eq!(vnet[..2], [1, GSO_UDP_L4]);
        assert_eq!(u16::from_le_bytes([vnet[2], vnet[3]]), 42);
        assert_eq!(u16::from_le_bytes([vnet[4], vnet[5]]), 12 + 4096 + 4);
        assert_eq!(u16::from_le_bytes([vnet[6], vnet[7]]), 34);
        assert_eq!(u16::from_le_bytes([vnet[8], vnet[9]]), 6);
        assert_eq!(d.len(), 42 + 15 * 4112);
        // IPv4 total length and UDP length of the whole; identification of the first
        // packet (PSN 0xffff: the FIRST took 0xfffe); a valid header checksum.
        assert_eq!(
            u16::from_be_bytes([d[16], d[17]]) as usize,
            20 + 8 + 15 * 4112
        );
        assert_eq!(u16::from_be_bytes([d[18], d[19]]), 0xffff);
        assert_eq!(internet_checksum(&d[14..34]), 0);
        assert_eq!(u16::from_be_bytes([d[38], d[39]]) as usize, 8 + 15 * 4112);
        // The UDP checksum field holds the pseudo-header sum over the whole length.
        let mut p = d[26..34].to_vec();
        p.extend_from_slice(&[0, 17]);
        p.extend_from_slice(&((8 + 15 * 4112) as u16).to_be_bytes());
        assert_eq!(u16::from_be_bytes([d[40], d[41]]), !internet_checksum(&p));
    }

    #[test]
    fn a_packet_of_another_flow_or_out_of_order_is_refused() {
        let mut buf = vec![0u64; 1 << 15];
        pattern(&mut buf);
        let mut mem = MrTable::new(1);
        let mut qp = requester(&mut mem, &mut buf, 500);
        let mut frame = vec![0u8; 9000];
        let mut heads = Vec::new();
        while let Some(TxOut::Split(s)) = qp.poll_transmit_split(0, &mut frame, &mem, 1) {
            heads.push((frame[..s.head_len].to_vec(), s.tail, s.tail_len, s.len()));
            if heads.len() == 4 {
                break;
            }
        }
        let sf = |i: usize| SplitFrame::<&[u8]> {
            head_len: heads[i].0.len(),
            payload: Default::default(),
            tail: heads[i].1,
            tail_len: heads[i].2,
        };
        // Same length (no payload here), consecutive identifications: joins.
        let mut b = Batch::default();
        assert!(b.push(&heads[1].0, &sf(1)));
        assert!(b.push(&heads[2].0, &sf(2)));
        // Skipping an identification: refused.
        let mut b = Batch::default();
        assert!(b.push(&heads[1].0, &sf(1)));
        assert!(!b.push(&heads[3].0, &sf(3)));
        // Another UDP source port (another flow): refused.
        let mut other = heads[2].0.clone();
        other[35] ^= 1;
        assert!(!b.push(&other, &sf(2)));
        // A longer packet after a shorter one: refused (only the last may be short).
        let mut b = Batch::default();
        assert!(b.push(&heads[1].0, &sf(1)));
        assert!(
            !b.push(&heads[0].0, &sf(0)),
            "the FIRST, with its RETH, is longer"
        );
    }

    proptest! {
        #[test]
        fn split_never_panics_and_stays_inside(mut bytes in proptest::collection::vec(any::<u8>(), 0..9000),
                                               gso in 0usize..5000, v6 in any::<bool>()) {
            // Half the cases get a plausible IPv4/IPv6 UDP header so the split path runs.
            if bytes.len() > 62 {
                bytes[12..14].copy_from_slice(if v6 { &[0x86, 0xdd] } else { &[0x08, 0x00] });
                if v6 { bytes[14] = 0x60; bytes[20] = 17; } else { bytes[14] = 0x45; bytes[23] = 17; }
            }
            let len = bytes.len();
            let mut seen = 0usize;
            let n = split(&mut bytes, gso, &mut |f: &[u8]| { seen += 1; assert!(f.len() <= len); });
            prop_assert_eq!(n, seen);
            prop_assert!(n >= 1);
        }

        #[test]
        fn push_never_panics(heads in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..120), 1..8)) {
            let mut b = Batch::default();
            for h in &heads {
                let f = SplitFrame::<&[u8]> { head_len: h.len(), payload: Default::default(), tail: [0; 7], tail_len: 0 };
                if !b.push(h, &f) {
                    let _ = datagram(&mut b);
                    b.clear();
                    prop_assert!(b.push(h, &f));
                }
            }
            let (_, d) = datagram(&mut b);
            prop_assert!(d.len() <= heads.iter().map(Vec::len).sum::<usize>());
        }
    }
}
