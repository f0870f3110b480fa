//! The 32-bit immediate every SDR packet carries (one UC RDMA WRITE-with-immediate per packet,
//! §3.2.1): which message the packet belongs to, where in it it lands, and a few bits of the
//! user's own immediate, which the receiver reassembles from the fragments.
//!
//! The paper gives the fields and their widths — 10 bits of message id (1024 messages in
//! flight per QP), 18 of packet offset (1 GiB at a 4 KiB MTU), 4 of user immediate — and
//! allows other splits (8 + 22 + 2 for larger messages), but not their positions. ferroce
//! puts them in that order from the most significant bit: message id, packet offset, user
//! bits. A peer on the SDR SDK that packs them otherwise needs a different [`ImmLayout`].

/// Widths of the three fields, most significant first; they fill 32 bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImmLayout {
    msg_bits: u8,
    offset_bits: u8,
    user_bits: u8,
}

/// A layout that does not fill the immediate, or a field that does not fit its layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ImmError {
    /// The widths do not add up to 32, or the message id or offset has no bit.
    #[error("an SDR immediate needs msg + offset + user = 32 bits with msg, offset >= 1; got {0} + {1} + {2}")]
    Layout(u8, u8, u8),
    /// A field is wider than its bits.
    #[error("{field} {value} does not fit {bits} bits")]
    TooWide {
        /// `msg_id`, `offset` or `user`.
        field: &'static str,
        /// Its value.
        value: u32,
        /// The layout's width for it.
        bits: u8,
    },
}

/// The fields of one packet's immediate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SdrImm {
    /// The message slot (the receive it lands in, modulo the slots).
    pub msg_id: u32,
    /// The packet's index in its message (its byte offset over the MTU).
    pub offset: u32,
    /// This packet's fragment of the user's immediate.
    pub user: u32,
}

impl ImmLayout {
    /// The paper's split: 10 + 18 + 4.
    pub const PAPER: Self = Self {
        msg_bits: 10,
        offset_bits: 18,
        user_bits: 4,
    };

    /// A split of the immediate: `msg_bits + offset_bits + user_bits = 32`.
    pub const fn new(msg_bits: u8, offset_bits: u8, user_bits: u8) -> Result<Self, ImmError> {
        if msg_bits == 0
            || offset_bits == 0
            || msg_bits as u32 + offset_bits as u32 + user_bits as u32 != 32
        {
            return Err(ImmError::Layout(msg_bits, offset_bits, user_bits));
        }
        Ok(Self {
            msg_bits,
            offset_bits,
            user_bits,
        })
    }

    /// Messages in flight per QP: message ids run `0 .. max_messages()`.
    pub const fn max_messages(self) -> u32 {
        1 << self.msg_bits
    }

    /// Packets per message: offsets run `0 .. max_packets()`.
    pub const fn max_packets(self) -> u32 {
        1 << self.offset_bits
    }

    /// Bits of user immediate per packet.
    pub const fn user_bits(self) -> u8 {
        self.user_bits
    }

    /// The immediate for `f`, or which field is too wide.
    pub fn pack(self, f: SdrImm) -> Result<u32, ImmError> {
        let check = |field, value: u32, bits: u8| {
            if bits < 32 && value >> bits != 0 {
                Err(ImmError::TooWide { field, value, bits })
            } else {
                Ok(value)
            }
        };
        let msg = check("msg_id", f.msg_id, self.msg_bits)?;
        let off = check("offset", f.offset, self.offset_bits)?;
        let user = check("user", f.user, self.user_bits)?;
        let user_shift = 0;
        let off_shift = u32::from(self.user_bits);
        let msg_shift = off_shift + u32::from(self.offset_bits);
        Ok(msg << msg_shift | off << off_shift | (user << user_shift))
    }

    /// The fields of immediate `imm`. Every 32-bit value is some packet's immediate; whether
    /// it names a posted receive and an offset inside it is the receiver's question.
    pub fn unpack(self, imm: u32) -> SdrImm {
        let mask = |bits: u8| {
            if bits >= 32 {
                u32::MAX
            } else {
                (1u32 << bits) - 1
            }
        };
        let off_shift = u32::from(self.user_bits);
        let msg_shift = off_shift + u32::from(self.offset_bits);
        SdrImm {
            msg_id: imm.checked_shr(msg_shift).unwrap_or(0) & mask(self.msg_bits),
            offset: imm.checked_shr(off_shift).unwrap_or(0) & mask(self.offset_bits),
            user: imm & mask(self.user_bits),
        }
    }
}

impl Default for ImmLayout {
    fn default() -> Self {
        Self::PAPER
    }
}

/// Fragments the user's immediate is cut into: `32 / user_bits` (0 without user bits).
pub fn imm_fragments(layout: ImmLayout) -> u32 {
    match layout.user_bits() {
        0 => 0,
        b => 32u32.div_ceil(u32::from(b)),
    }
}

/// The user-immediate bits packet `offset` carries.
pub fn imm_fragment(layout: ImmLayout, user_imm: u32, offset: u32) -> u32 {
    let bits = u32::from(layout.user_bits());
    let n = imm_fragments(layout);
    if n == 0 {
        return 0;
    }
    let shift = (offset % n) * bits;
    user_imm.checked_shr(shift).unwrap_or(0) & ((1u32 << bits) - 1)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn the_paper_layout_puts_the_message_id_on_top() {
        let l = ImmLayout::PAPER;
        assert_eq!(
            (l.max_messages(), l.max_packets(), l.user_bits()),
            (1024, 1 << 18, 4)
        );
        let f = |msg_id, offset, user| {
            l.pack(SdrImm {
                msg_id,
                offset,
                user,
            })
            .unwrap()
        };
        assert_eq!(f(0x3ff, 0, 0), 0xffc0_0000);
        assert_eq!(f(0, 0x3_ffff, 0), 0x003f_fff0);
        assert_eq!(f(0, 0, 0xf), 0x0000_000f);
        assert_eq!(f(1, 2, 3), 1 << 22 | 2 << 4 | 3);
        assert_eq!(
            l.pack(SdrImm {
                msg_id: 1024,
                offset: 0,
                user: 0
            }),
            Err(ImmError::TooWide {
                field: "msg_id",
                value: 1024,
                bits: 10
            })
        );
        assert!(l
            .pack(SdrImm {
                msg_id: 0,
                offset: 1 << 18,
                user: 0
            })
            .is_err());
        assert!(l
            .pack(SdrImm {
                msg_id: 0,
                offset: 0,
                user: 16
            })
            .is_err());
        assert_eq!(ImmLayout::new(8, 22, 2).unwrap().max_packets(), 1 << 22);
        assert!(ImmLayout::new(10, 18, 5).is_err());
        assert!(ImmLayout::new(0, 28, 4).is_err());
    }

    proptest! {
        /// Any layout, any fields that fit: unpack undoes pack; any immediate repacks to
        /// itself.
        #[test]
        fn pack_and_unpack_are_inverse(
            (msg_bits, offset_bits) in (1u8..=31).prop_flat_map(|m| (Just(m), 1u8..=(32 - m))),
            raw in any::<u32>(),
            fields in any::<(u32, u32, u32)>(),
        ) {
            let l = ImmLayout::new(msg_bits, offset_bits, 32 - msg_bits - offset_bits).unwrap();
            let f = l.unpack(raw);
            prop_assert_eq!(l.pack(f), Ok(raw));
            let fit = |v: u32, bits: u8| if bits >= 32 { v } else { v & ((1 << bits) - 1) };
            let g = SdrImm {
                msg_id: fit(fields.0, msg_bits),
                offset: fit(fields.1, offset_bits),
                user: fit(fields.2, l.user_bits()),
            };
            prop_assert_eq!(l.unpack(l.pack(g).unwrap()), g);
        }
    }
}
