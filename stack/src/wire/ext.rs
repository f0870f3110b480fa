//! The fixed-size extension transport headers that follow the BTH (IBTA Vol 1 §9.3).
//!
//! Each header is a zero-copy view (`*Packet<T>`) plus a plain value (`*Repr`). They are all
//! fixed-size runs of big-endian fields, so one macro writes both halves; the per-header
//! meaning lives in the doc comments and in the small impls below the macro calls.

use super::error::{need, Layer, Result};
use super::field::BeField;
use super::{Msn, Psn, Qpn};

macro_rules! fixed_header {
    (
        $(#[$doc:meta])*
        $packet:ident / $repr:ident, len $len:expr;
        $( $(#[$fdoc:meta])* $field:ident / $setter:ident : $ty:ty = $off:expr ),+ $(,)?
    ) => {
        $(#[$doc])*
        ///
        /// Zero-copy view over a buffer that starts with this header.
        #[derive(Debug, Clone, Copy)]
        pub struct $packet<T: AsRef<[u8]>> {
            buffer: T,
        }

        impl<T: AsRef<[u8]>> $packet<T> {
            /// Bytes this header occupies on the wire.
            pub const LEN: usize = $len;

            /// Wraps a buffer without checking its length; accessors panic if it is short.
            pub const fn new_unchecked(buffer: T) -> Self {
                Self { buffer }
            }

            /// Wraps a buffer after checking it holds the whole header.
            pub fn new_checked(buffer: T) -> Result<Self> {
                need(buffer.as_ref(), $len, Layer::ExtHeaders)?;
                Ok(Self { buffer })
            }

            /// Gives the buffer back.
            pub fn into_inner(self) -> T {
                self.buffer
            }

            $(
                $(#[$fdoc])*
                #[inline]
                pub fn $field(&self) -> $ty {
                    <$ty as BeField>::read(&self.buffer.as_ref()[$off..])
                }
            )+
        }

        impl<T: AsRef<[u8]> + AsMut<[u8]>> $packet<T> {
            $(
                $(#[$fdoc])*
                #[inline]
                pub fn $setter(&mut self, value: $ty) {
                    BeField::write(value, &mut self.buffer.as_mut()[$off..])
                }
            )+
        }

        $(#[$doc])*
        ///
        /// Plain value form, for building and matching packets.
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
        pub struct $repr {
            $( $(#[$fdoc])* pub $field: $ty, )+
        }

        impl $repr {
            /// Bytes this header occupies on the wire.
            pub const LEN: usize = $len;

            /// Reads every field out of a checked view.
            pub fn parse<T: AsRef<[u8]>>(packet: &$packet<T>) -> Self {
                Self { $( $field: packet.$field(), )+ }
            }

            /// Writes the header, zeroing its reserved bits, into the view's buffer.
            pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut $packet<T>) {
                packet.buffer.as_mut()[..$len].fill(0);
                $( packet.$setter(self.$field); )+
            }
        }
    };
}

fixed_header! {
    /// RDMA Extended Transport Header: where a WRITE lands or a READ reads (IBTA §9.3.3.3).
    RethPacket / RethRepr, len 16;
    /// Remote virtual address.
    va / set_va: u64 = 0,
    /// Remote key of the target memory region.
    rkey / set_rkey: u32 = 8,
    /// Length of the whole RDMA operation in bytes, not of this packet.
    dma_len / set_dma_len: u32 = 12,
}

fixed_header! {
    /// ACK Extended Transport Header: acknowledgement syndrome and message sequence number
    /// (IBTA §9.3.5).
    AethPacket / AethRepr, len 4;
    /// Syndrome: ACK with credits, RNR NAK with a timer, or NAK with a code; see [`Syndrome`].
    syndrome / set_syndrome: u8 = 0,
    /// Message sequence number of the last message completed by the responder.
    msn / set_msn: Msn = 1,
}

fixed_header! {
    /// Atomic Extended Transport Header: target and operands of CMP_SWP / FETCH_ADD
    /// (IBTA §9.3.3.4).
    AtomicEthPacket / AtomicEthRepr, len 28;
    /// Remote virtual address, 8-byte aligned.
    va / set_va: u64 = 0,
    /// Remote key of the target memory region.
    rkey / set_rkey: u32 = 8,
    /// Swap value (CMP_SWP) or addend (FETCH_ADD).
    swap_add / set_swap_add: u64 = 12,
    /// Compare value (CMP_SWP only).
    compare / set_compare: u64 = 20,
}

fixed_header! {
    /// Atomic Acknowledge Extended Transport Header: the value the target held before the
    /// atomic executed (IBTA §9.3.6).
    AtomicAckEthPacket / AtomicAckEthRepr, len 8;
    /// Original remote data.
    orig_data / set_orig_data: u64 = 0,
}

fixed_header! {
    /// Immediate Data Extended Transport Header (IBTA §9.3.4).
    ImmDtPacket / ImmDtRepr, len 4;
    /// The 32-bit immediate, delivered in the receive completion.
    imm / set_imm: u32 = 0,
}

fixed_header! {
    /// Invalidate Extended Transport Header of SEND_WITH_INVALIDATE (IBTA §9.3.7).
    IethPacket / IethRepr, len 4;
    /// The R_Key the responder invalidates.
    rkey / set_rkey: u32 = 0,
}

fixed_header! {
    /// Datagram Extended Transport Header of UD packets (IBTA §9.3.2).
    DethPacket / DethRepr, len 8;
    /// Queue key checked against the destination QP's.
    qkey / set_qkey: u32 = 0,
    /// Source QP number (byte 4 is reserved).
    src_qp / set_src_qp: Qpn = 5,
}

fixed_header! {
    /// Selective acknowledgement header of ferroce's selective repeat (`SR_ACKNOWLEDGE`, a
    /// manufacturer-specific opcode, so standard RoCEv2 never carries it): the first PSN the
    /// responder lacks, which PSNs after it arrived, and an explicit loss report.
    SackEthPacket / SackEthRepr, len 40;
    /// [`SackEthRepr::LOST`] and [`SackEthRepr::AVOID`] say which of `lost` / `path` mean
    /// something.
    flags / set_flags: u8 = 0,
    /// The expected PSN: everything before it arrived.
    base / set_base: Psn = 1,
    /// A path (UDP source port modulo the path count) the requester should avoid for a while.
    path / set_path: u8 = 4,
    /// A PSN the responder declares lost: resend it.
    lost / set_lost: Psn = 5,
    /// Arrivals after `base`: bit `i` (LSB first across the four words) is PSN `base + 1 + i`.
    bits0 / set_bits0: u64 = 8,
    /// Bits 64..128 of the arrival map.
    bits1 / set_bits1: u64 = 16,
    /// Bits 128..192 of the arrival map.
    bits2 / set_bits2: u64 = 24,
    /// Bits 192..256 of the arrival map.
    bits3 / set_bits3: u64 = 32,
}

impl SackEthRepr {
    /// `lost` names a lost PSN.
    pub const LOST: u8 = 1 << 0;
    /// `path` names a path to avoid.
    pub const AVOID: u8 = 1 << 1;
    /// PSNs after `base` the arrival map covers.
    pub const SPAN: u32 = 256;

    /// True when PSN `base + 1 + i` arrived.
    pub fn has(&self, i: u32) -> bool {
        let w = [self.bits0, self.bits1, self.bits2, self.bits3];
        i < Self::SPAN && w[(i / 64) as usize] >> (i % 64) & 1 == 1
    }

    /// Marks PSN `base + 1 + i` arrived (ignored past the span).
    pub fn set(&mut self, i: u32) {
        let bit = 1u64 << (i % 64);
        match i / 64 {
            0 => self.bits0 |= bit,
            1 => self.bits1 |= bit,
            2 => self.bits2 |= bit,
            3 => self.bits3 |= bit,
            _ => {}
        }
    }
}

/// Length of the reserved block a CNP carries after its BTH (Annex A17.9.3).
pub const CNP_RESERVED_LEN: usize = 16;

/// The AETH syndrome decoded (IBTA §9.3.5, table 41).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Syndrome {
    /// Positive acknowledgement with an end-to-end credit count (31 = invalid/unlimited).
    Ack {
        /// The 5-bit credit code.
        credits: u8,
    },
    /// Receiver not ready: retry after the timer value's delay.
    RnrNak {
        /// The 5-bit RNR timer code (IBTA table 45).
        timer: u8,
    },
    /// Negative acknowledgement.
    Nak(NakCode),
    /// Syndrome type 0b10, reserved.
    Reserved(u8),
}

/// NAK codes (IBTA §9.3.5, table 42).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NakCode {
    /// PSN sequence error: the responder expected another PSN.
    PsnSequenceError,
    /// Invalid request.
    InvalidRequest,
    /// Remote access error (bad R_Key, bounds or access rights).
    RemoteAccessError,
    /// Remote operational error.
    RemoteOperationalError,
    /// Invalid RD request (RD only).
    InvalidRdRequest,
    /// A reserved NAK code.
    Reserved(u8),
}

impl Syndrome {
    /// Decodes the 8-bit syndrome byte.
    pub fn from_byte(b: u8) -> Self {
        let value = b & 0x1f;
        match (b >> 5) & 0b11 {
            0b00 => Self::Ack { credits: value },
            0b01 => Self::RnrNak { timer: value },
            0b11 => Self::Nak(match value {
                0 => NakCode::PsnSequenceError,
                1 => NakCode::InvalidRequest,
                2 => NakCode::RemoteAccessError,
                3 => NakCode::RemoteOperationalError,
                4 => NakCode::InvalidRdRequest,
                v => NakCode::Reserved(v),
            }),
            _ => Self::Reserved(value),
        }
    }

    /// Encodes the syndrome byte (bit 7 is reserved and zero).
    pub fn to_byte(self) -> u8 {
        match self {
            Self::Ack { credits } => credits & 0x1f,
            Self::RnrNak { timer } => 0b0010_0000 | (timer & 0x1f),
            Self::Nak(code) => {
                0b0110_0000
                    | match code {
                        NakCode::PsnSequenceError => 0,
                        NakCode::InvalidRequest => 1,
                        NakCode::RemoteAccessError => 2,
                        NakCode::RemoteOperationalError => 3,
                        NakCode::InvalidRdRequest => 4,
                        NakCode::Reserved(v) => v & 0x1f,
                    }
            }
            Self::Reserved(v) => 0b0100_0000 | (v & 0x1f),
        }
    }
}
