//! The Base Transport Header, the 12 bytes every RoCEv2 packet carries after UDP
//! (IBTA Vol 1 §9.2, figure 91).
//!
//! ```text
//!  byte 0     opcode
//!  byte 1     SE | M | PadCnt(2) | TVer(4)
//!  bytes 2-3  P_Key
//!  byte 4     FECN | BECN | reserved(6)   -- "resv8a", masked to ones in the ICRC
//!  bytes 5-7  DestQP
//!  byte 8     AckReq | reserved(7)
//!  bytes 9-11 PSN
//! ```

use super::error::{need, Error, Layer, Result};
use super::field::{read_u24, u24_newtype, write_u24, BeField};
use super::Opcode;

u24_newtype! {
    /// A queue pair number (24 bits).
    Qpn
}

u24_newtype! {
    /// A packet sequence number. PSNs wrap at 2^24, so ordering is by signed distance within
    /// half the space (IBTA §9.7.1), as [`Psn::distance`] computes.
    Psn
}

u24_newtype! {
    /// A message sequence number, carried in the AETH (IBTA §9.7.5.1.4).
    Msn
}

impl Psn {
    /// `self + n`, wrapping at 2^24.
    #[inline]
    pub const fn add(self, n: u32) -> Self {
        Self::new(self.value().wrapping_add(n))
    }

    /// `self - n`, wrapping at 2^24.
    #[inline]
    pub const fn sub(self, n: u32) -> Self {
        Self::new(self.value().wrapping_sub(n))
    }

    /// Signed distance from `earlier` to `self` in 24-bit sequence space, in
    /// `-2^23 ..= 2^23 - 1`: positive when `self` comes after `earlier`.
    #[inline]
    pub const fn distance(self, earlier: Self) -> i32 {
        let d = self.value().wrapping_sub(earlier.value()) & (Self::MODULUS - 1);
        // Sign-extend the 24-bit difference.
        ((d << 8) as i32) >> 8
    }

    /// True when `self` comes strictly before `other` in sequence space.
    #[inline]
    pub const fn before(self, other: Self) -> bool {
        other.distance(self) > 0
    }
}

impl Msn {
    /// `self + 1`, wrapping at 2^24.
    #[inline]
    pub const fn next(self) -> Self {
        Self::new(self.value().wrapping_add(1))
    }
}

/// Byte offsets in a BTH (the header image patches these too).
pub(super) mod field {
    pub(in crate::wire) const OPCODE: usize = 0;
    pub(in crate::wire) const FLAGS: usize = 1;
    pub(in crate::wire) const PKEY: usize = 2;
    pub(in crate::wire) const RESV8A: usize = 4;
    pub(in crate::wire) const DEST_QP: usize = 5;
    pub(in crate::wire) const ACK_REQ: usize = 8;
    pub(in crate::wire) const PSN: usize = 9;
}

/// Bytes of a BTH.
pub const BTH_LEN: usize = 12;

/// The default partition key, full membership (what perftest and ConnectX use).
pub const DEFAULT_PKEY: u16 = 0xffff;

/// Zero-copy view over a buffer starting with a BTH.
#[derive(Debug, Clone, Copy)]
pub struct BthPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> BthPacket<T> {
    /// Wraps a buffer without checking it; accessors panic if it is shorter than 12 bytes.
    pub const fn new_unchecked(buffer: T) -> Self {
        Self { buffer }
    }

    /// Wraps a buffer after checking it holds a whole BTH.
    pub fn new_checked(buffer: T) -> Result<Self> {
        need(buffer.as_ref(), BTH_LEN, Layer::Bth)?;
        Ok(Self { buffer })
    }

    /// Gives the buffer back.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    /// The opcode: transport in the top three bits, operation in the low five.
    pub fn opcode(&self) -> Opcode {
        Opcode(self.b()[field::OPCODE])
    }
    /// Solicited event: the receiver should raise a completion event.
    pub fn solicited(&self) -> bool {
        self.b()[field::FLAGS] & 0x80 != 0
    }
    /// MigReq, the path migration state bit.
    pub fn mig_req(&self) -> bool {
        self.b()[field::FLAGS] & 0x40 != 0
    }
    /// Pad count: bytes of padding after the payload that align it to four bytes.
    pub fn pad_count(&self) -> u8 {
        (self.b()[field::FLAGS] >> 4) & 0b11
    }
    /// Transport header version; only 0 is defined.
    pub fn tver(&self) -> u8 {
        self.b()[field::FLAGS] & 0x0f
    }
    /// Partition key.
    pub fn pkey(&self) -> u16 {
        u16::read(&self.b()[field::PKEY..])
    }
    /// FECN bit of the reserved byte (RoCEv2 signals congestion in the IP ECN field instead).
    pub fn fecn(&self) -> bool {
        self.b()[field::RESV8A] & 0x80 != 0
    }
    /// BECN bit of the reserved byte.
    pub fn becn(&self) -> bool {
        self.b()[field::RESV8A] & 0x40 != 0
    }
    /// Destination queue pair.
    pub fn dest_qpn(&self) -> Qpn {
        Qpn::new(read_u24(&self.b()[field::DEST_QP..]))
    }
    /// Acknowledge request: the responder must acknowledge this packet.
    pub fn ack_req(&self) -> bool {
        self.b()[field::ACK_REQ] & 0x80 != 0
    }
    /// Packet sequence number.
    pub fn psn(&self) -> Psn {
        Psn::new(read_u24(&self.b()[field::PSN..]))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> BthPacket<T> {
    fn bm(&mut self) -> &mut [u8] {
        self.buffer.as_mut()
    }
    fn set_bit(&mut self, byte: usize, mask: u8, on: bool) {
        let b = &mut self.bm()[byte];
        *b = if on { *b | mask } else { *b & !mask };
    }

    /// Sets the opcode.
    pub fn set_opcode(&mut self, op: Opcode) {
        self.bm()[field::OPCODE] = op.0;
    }
    /// Sets the solicited-event bit.
    pub fn set_solicited(&mut self, on: bool) {
        self.set_bit(field::FLAGS, 0x80, on);
    }
    /// Sets MigReq.
    pub fn set_mig_req(&mut self, on: bool) {
        self.set_bit(field::FLAGS, 0x40, on);
    }
    /// Sets the pad count (0..=3).
    pub fn set_pad_count(&mut self, pad: u8) {
        let b = &mut self.bm()[field::FLAGS];
        *b = (*b & !0x30) | ((pad & 0b11) << 4);
    }
    /// Sets the transport header version (low four bits).
    pub fn set_tver(&mut self, tver: u8) {
        let b = &mut self.bm()[field::FLAGS];
        *b = (*b & !0x0f) | (tver & 0x0f);
    }
    /// Sets the partition key.
    pub fn set_pkey(&mut self, pkey: u16) {
        pkey.write(&mut self.bm()[field::PKEY..]);
    }
    /// Sets the FECN bit.
    pub fn set_fecn(&mut self, on: bool) {
        self.set_bit(field::RESV8A, 0x80, on);
    }
    /// Sets the BECN bit.
    pub fn set_becn(&mut self, on: bool) {
        self.set_bit(field::RESV8A, 0x40, on);
    }
    /// Sets the destination QP.
    pub fn set_dest_qpn(&mut self, qpn: Qpn) {
        write_u24(qpn.value(), &mut self.bm()[field::DEST_QP..]);
    }
    /// Sets the AckReq bit.
    pub fn set_ack_req(&mut self, on: bool) {
        self.set_bit(field::ACK_REQ, 0x80, on);
    }
    /// Sets the PSN.
    pub fn set_psn(&mut self, psn: Psn) {
        write_u24(psn.value(), &mut self.bm()[field::PSN..]);
    }
}

/// A BTH as plain values. TVer is not here: it is always 0, and parsing rejects anything else.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BthRepr {
    /// The opcode.
    pub opcode: Opcode,
    /// Solicited event.
    pub solicited: bool,
    /// MigReq.
    pub mig_req: bool,
    /// Pad count. [`RoceRepr::emit`](super::RoceRepr::emit) recomputes it from the payload
    /// length, so a whole frame is always consistent.
    pub pad_count: u8,
    /// Partition key.
    pub pkey: u16,
    /// FECN bit.
    pub fecn: bool,
    /// BECN bit.
    pub becn: bool,
    /// Destination QP.
    pub dest_qpn: Qpn,
    /// AckReq.
    pub ack_req: bool,
    /// PSN.
    pub psn: Psn,
}

impl BthRepr {
    /// A BTH with the defaults a ConnectX sends: full-member default P_Key, no flags.
    pub fn new(opcode: Opcode, dest_qpn: Qpn, psn: Psn) -> Self {
        Self {
            opcode,
            solicited: false,
            mig_req: false,
            pad_count: 0,
            pkey: DEFAULT_PKEY,
            fecn: false,
            becn: false,
            dest_qpn,
            ack_req: false,
            psn,
        }
    }

    /// Reads a checked view; rejects a TVer other than 0.
    pub fn parse<T: AsRef<[u8]>>(p: &BthPacket<T>) -> Result<Self> {
        // The twelve bytes at once, one bounds check, then plain reads: field by field through
        // the view's accessors, every frame paid a check per field.
        let Some(b) = p.b().first_chunk::<BTH_LEN>() else {
            need(p.b(), BTH_LEN, Layer::Bth)?;
            return Err(Error::Tver(0));
        };
        let flags = b[field::FLAGS];
        if flags & 0x0f != 0 {
            return Err(Error::Tver(flags & 0x0f));
        }
        let u24 = |at: usize| u32::from_be_bytes([0, b[at], b[at + 1], b[at + 2]]);
        Ok(Self {
            opcode: Opcode(b[field::OPCODE]),
            solicited: flags & 0x80 != 0,
            mig_req: flags & 0x40 != 0,
            pad_count: (flags >> 4) & 0b11,
            pkey: u16::from_be_bytes([b[field::PKEY], b[field::PKEY + 1]]),
            fecn: b[field::RESV8A] & 0x80 != 0,
            becn: b[field::RESV8A] & 0x40 != 0,
            dest_qpn: Qpn::new(u24(field::DEST_QP)),
            ack_req: b[field::ACK_REQ] & 0x80 != 0,
            psn: Psn::new(u24(field::PSN)),
        })
    }

    /// The twelve bytes on the wire, reserved bits zero.
    pub fn to_bytes(&self) -> [u8; BTH_LEN] {
        let mut b = [0u8; BTH_LEN];
        b[field::OPCODE] = self.opcode.0;
        b[field::FLAGS] = u8::from(self.solicited) << 7
            | u8::from(self.mig_req) << 6
            | (self.pad_count & 0b11) << 4;
        b[field::PKEY..field::PKEY + 2].copy_from_slice(&self.pkey.to_be_bytes());
        b[field::RESV8A] = u8::from(self.fecn) << 7 | u8::from(self.becn) << 6;
        b[field::DEST_QP..field::DEST_QP + 3]
            .copy_from_slice(&self.dest_qpn.value().to_be_bytes()[1..]);
        b[field::ACK_REQ] = u8::from(self.ack_req) << 7;
        b[field::PSN..field::PSN + 3].copy_from_slice(&self.psn.value().to_be_bytes()[1..]);
        b
    }

    /// Writes all 12 bytes, reserved bits zero: built in a register-sized array and stored
    /// once, rather than zeroed and then patched field by field.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut BthPacket<T>) {
        p.bm()[..BTH_LEN].copy_from_slice(&self.to_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn psn_distance_wraps() {
        let a = Psn::new(0xff_fffe);
        let b = a.add(3);
        assert_eq!(b.value(), 1);
        assert_eq!(b.distance(a), 3);
        assert_eq!(a.distance(b), -3);
        assert!(a.before(b));
        assert!(!b.before(a));
        assert_eq!(Psn::new(0).sub(1).value(), 0xff_ffff);
    }

    #[test]
    fn bth_bytes_match_the_spec_layout() {
        let mut buf = [0u8; 12];
        let mut repr = BthRepr::new(
            Opcode::RC_RDMA_WRITE_ONLY,
            Qpn::new(0x12_3456),
            Psn::new(0xab_cdef),
        );
        repr.solicited = true;
        repr.pad_count = 3;
        repr.ack_req = true;
        repr.becn = true;
        repr.emit(&mut BthPacket::new_unchecked(&mut buf[..]));
        assert_eq!(
            buf,
            [0x0a, 0xb0, 0xff, 0xff, 0x40, 0x12, 0x34, 0x56, 0x80, 0xab, 0xcd, 0xef]
        );
        let back = BthRepr::parse(&BthPacket::new_checked(&buf[..]).unwrap()).unwrap();
        assert_eq!(back, repr);
    }

    #[test]
    fn nonzero_tver_is_rejected() {
        let buf = [0x04, 0x01, 0xff, 0xff, 0, 0, 0, 1, 0, 0, 0, 1];
        let p = BthPacket::new_checked(&buf[..]).unwrap();
        assert_eq!(BthRepr::parse(&p), Err(Error::Tver(1)));
    }
}
