//! PACKET_MMAP rings (TPACKET_V2): one receive ring and one transmit ring shared with the
//! kernel through one mapping.
//!
//! V2 rather than V3 because V3 hands over whole blocks, on a timer when traffic is light,
//! which adds up to a millisecond to every ACK. With virtio-net headers on (the `gso`
//! option) there is only the transmit ring, each frame in it led by a header: see the port
//! for why `gso` receives without a ring.

use std::io;

use super::gso::VNET_HDR_LEN;
use crate::port::TxError;

/// Where a transmit slot's frame starts: after the aligned V2 header. (TPACKET2_HDRLEN also
/// counts a sockaddr_ll, which the kernel subtracts again for transmit slots.)
const TX_DATA_OFFSET: usize = libc::TPACKET2_HDRLEN - std::mem::size_of::<libc::sockaddr_ll>();

/// Bytes of one ring block (the kernel's allocation unit).
const RING_BLOCK: usize = 1 << 20;
/// Blocks per ring.
const RING_BLOCKS: usize = 16;
/// Blocks of the receive ring.
const RX_BLOCKS: usize = 32;
/// The largest IP datagram of a RoCEv2 packet: a 4096-byte payload behind IPv6, UDP, BTH and
/// the longest extension headers, with pad and ICRC, rounded up.
const ROCE_MAX_IP: usize = 4096 + 128;

/// One ring's shape.
#[derive(Clone, Copy, Debug)]
struct Geometry {
    /// Offset of the ring in the mapping.
    base: usize,
    frame_size: usize,
    frames: usize,
    blocks: usize,
}

impl Geometry {
    /// A ring of `blocks` blocks whose slots hold a `largest`-byte frame.
    fn new(base: usize, largest: usize, blocks: usize) -> io::Result<Self> {
        // A slot holds the header, the kernel's sockaddr_ll and the largest frame.
        let need = libc::TPACKET2_HDRLEN + std::mem::size_of::<libc::sockaddr_ll>() + largest + 64;
        let frame_size = need.next_multiple_of(libc::TPACKET_ALIGNMENT).max(2048);
        if frame_size > RING_BLOCK {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "MTU too large for the ring",
            ));
        }
        Ok(Self {
            base,
            frame_size,
            frames: RING_BLOCK / frame_size * blocks,
            blocks,
        })
    }

    fn bytes(&self) -> usize {
        RING_BLOCK * self.blocks
    }

    fn request(&self) -> libc::tpacket_req {
        libc::tpacket_req {
            tp_block_size: RING_BLOCK as u32,
            tp_block_nr: self.blocks as u32,
            tp_frame_size: self.frame_size as u32,
            tp_frame_nr: self.frames as u32,
        }
    }

    /// Offset of slot `i` in the mapping. Frames never straddle blocks: a block holds a whole
    /// number of them.
    fn offset(&self, i: usize) -> usize {
        let per_block = RING_BLOCK / self.frame_size;
        self.base + (i / per_block) * RING_BLOCK + (i % per_block) * self.frame_size
    }
}

/// A TPACKET_V2 receive ring (unless `vnet`) and transmit ring mapped from one socket.
pub(super) struct Rings {
    map: *mut u8,
    map_len: usize,
    rx: Option<Geometry>,
    tx: Geometry,
    /// Transmit frames carry a virtio-net header (PACKET_VNET_HDR was set before the rings).
    vnet: bool,
    rx_next: usize,
    tx_next: usize,
    tx_pending: usize,
}

// SAFETY: the mapping belongs to this value alone; moving it to another thread moves the
// only handle (the socket moves with the port).
unsafe impl Send for Rings {}

impl Rings {
    /// Sets up the rings on `fd` for frames of an `mtu`-byte IP MTU; `vnet` when the socket
    /// has PACKET_VNET_HDR (then only the transmit ring).
    pub(super) fn new(fd: i32, mtu: usize, vnet: bool) -> io::Result<Self> {
        let version: libc::c_int = libc::tpacket_versions::TPACKET_V2 as libc::c_int;
        // SAFETY: setsockopt with an int of the size passed.
        if unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_PACKET,
                libc::PACKET_VERSION,
                (&raw const version).cast(),
                std::mem::size_of::<libc::c_int>() as u32,
            )
        } < 0
        {
            return Err(io::Error::last_os_error());
        }
        let prefix = if vnet { VNET_HDR_LEN } else { 0 };
        // Receive slots hold the largest RoCEv2 frame (a 4 KiB path MTU and every header),
        // not the interface's largest: on a 9000-byte veth that is four times the slots in
        // twice the memory, room for several QPs' windows arriving at once while the engine
        // thread waits for a core. Longer frames are cut to the slot and dropped as malformed;
        // none of them is RoCEv2.
        let rx = if vnet {
            None
        } else {
            Some(Geometry::new(0, mtu.min(ROCE_MAX_IP) + 18, RX_BLOCKS)?)
        };
        let rx_bytes = rx.map_or(0, |g| g.bytes());
        let tx = Geometry::new(rx_bytes, mtu + 18 + prefix, RING_BLOCKS)?;
        let rings = rx.map(|g| (libc::PACKET_RX_RING, g));
        for (opt, g) in rings.into_iter().chain([(libc::PACKET_TX_RING, tx)]) {
            let req = g.request();
            // SAFETY: setsockopt with a tpacket_req of the size passed.
            if unsafe {
                libc::setsockopt(
                    fd,
                    libc::SOL_PACKET,
                    opt,
                    (&raw const req).cast(),
                    std::mem::size_of::<libc::tpacket_req>() as u32,
                )
            } < 0
            {
                return Err(io::Error::last_os_error());
            }
        }
        let map_len = rx_bytes + tx.bytes();
        // SAFETY: maps the rings the kernel just allocated for this socket (receive ring
        // first, then transmit ring, as packet_mmap lays them out); checked below.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if map == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Self {
            map: map.cast(),
            map_len,
            rx,
            tx,
            vnet,
            rx_next: 0,
            tx_next: 0,
            tx_pending: 0,
        })
    }

    /// The header of slot `i` of ring `g`.
    fn slot(&self, g: &Geometry, i: usize) -> *mut libc::tpacket2_hdr {
        // SAFETY: the offset is inside the mapping (i < frames, rings laid out as in `new`).
        unsafe { self.map.add(g.offset(i)).cast() }
    }

    fn status(h: *mut libc::tpacket2_hdr) -> u32 {
        // SAFETY: `h` points at a slot header inside the mapping; the kernel writes the status
        // concurrently, hence the volatile read and the acquire fence after it.
        let s = unsafe { std::ptr::read_volatile(&raw const (*h).tp_status) };
        std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
        s
    }

    fn set_status(h: *mut libc::tpacket2_hdr, s: u32) {
        std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
        // SAFETY: as in `status`; the release fence orders our writes to the slot before it.
        unsafe { std::ptr::write_volatile(&raw mut (*h).tp_status, s) };
    }

    /// True when frames arrive through a receive ring.
    pub(super) fn receives(&self) -> bool {
        self.rx.is_some()
    }

    /// Reads up to `max` frames from the receive ring, lending each to `f`; returns how many.
    pub(super) fn rx<F: FnMut(&[u8])>(&mut self, max: usize, mut f: F) -> usize {
        let Some(g) = self.rx else {
            return 0;
        };
        let mut n = 0;
        while n < max {
            let h = self.slot(&g, self.rx_next);
            if Self::status(h) & libc::TP_STATUS_USER == 0 {
                break;
            }
            // SAFETY: the kernel handed this slot to us (TP_STATUS_USER): its header and the
            // frame at tp_mac (tp_snaplen bytes, within the slot) are ours until we give it
            // back below.
            unsafe {
                let mac = usize::from((*h).tp_mac);
                let len = ((*h).tp_snaplen as usize).min(g.frame_size.saturating_sub(mac));
                let frame = std::slice::from_raw_parts(h.cast::<u8>().add(mac), len);
                f(frame);
            }
            Self::set_status(h, libc::TP_STATUS_KERNEL);
            self.rx_next = (self.rx_next + 1) % g.frames;
            n += 1;
        }
        n
    }

    /// Queues one `len`-byte frame written by `fill` into the next transmit slot.
    pub(super) fn tx<F: FnOnce(&mut [u8])>(
        &mut self,
        fd: i32,
        len: usize,
        fill: F,
    ) -> Result<(), TxError> {
        let prefix = if self.vnet { VNET_HDR_LEN } else { 0 };
        let room = self.tx.frame_size - TX_DATA_OFFSET - prefix;
        if len > room {
            return Err(TxError::TooLong { len, max: room });
        }
        let mut h = self.slot(&self.tx, self.tx_next);
        if Self::status(h) != libc::TP_STATUS_AVAILABLE {
            // The ring is full of frames the kernel has not sent: push them out, look again.
            // Whether or not this thread queued any since its last flush: frames a send
            // refused stay queued (a link without carrier refuses every one), and a ring
            // full of them is never looked at again unless something asks.
            if Self::kick(fd) {
                self.tx_pending = 0;
            }
            h = self.slot(&self.tx, self.tx_next);
            if Self::status(h) != libc::TP_STATUS_AVAILABLE {
                return Err(TxError::RingFull);
            }
        }
        // SAFETY: the slot is ours (TP_STATUS_AVAILABLE); its data area starts after the
        // aligned header (the kernel's default for V2 without PACKET_TX_HAS_OFF), led by a
        // zeroed virtio-net header (no offload) when enabled, and `len` fits, checked above.
        unsafe {
            let data =
                std::slice::from_raw_parts_mut(h.cast::<u8>().add(TX_DATA_OFFSET), prefix + len);
            data[..prefix].fill(0);
            fill(&mut data[prefix..]);
            (*h).tp_len = (prefix + len) as u32;
        }
        Self::set_status(h, libc::TP_STATUS_SEND_REQUEST);
        self.tx_next = (self.tx_next + 1) % self.tx.frames;
        self.tx_pending += 1;
        Ok(())
    }

    /// Hands every queued slot to the kernel; returns how many.
    pub(super) fn flush(&mut self, fd: i32) -> usize {
        if self.tx_pending == 0 {
            return 0;
        }
        // A refused send (no carrier, the socket's buffer full) leaves the kernel's head at
        // the first refused frame: asked again at the next flush, and not counted as work
        // (an engine whose link is down must still sleep).
        if Self::kick(fd) {
            std::mem::take(&mut self.tx_pending)
        } else {
            0
        }
    }

    /// Asks the kernel to transmit every slot marked SEND_REQUEST, from its head on; false
    /// when it refused one (it stops there, and the rest wait for the next ask).
    ///
    /// Asked twice when refused: the first send after the interface came back up fails
    /// with the error its going down left on the socket (ENETDOWN), which that send clears.
    fn kick(fd: i32) -> bool {
        (0..2).any(|_| {
            // SAFETY: a zero-length send on a packet socket with a TX ring transmits the
            // slots marked SEND_REQUEST; no buffer is read.
            unsafe { libc::send(fd, std::ptr::null(), 0, libc::MSG_DONTWAIT) >= 0 }
        })
    }
}

impl Drop for Rings {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `new`, once.
        unsafe { libc::munmap(self.map.cast(), self.map_len) };
    }
}
