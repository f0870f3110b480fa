//! Big-endian field access shared by every header view.
//!
//! Views check their length once in `new_checked`; after that these accessors index within
//! bounds. They panic on a short slice, which is why untrusted input must go through
//! `new_checked` first (the smoltcp contract, see `wire`'s module doc).

/// A value stored big-endian in a fixed number of bytes.
pub trait BeField: Sized + Copy {
    /// Bytes on the wire.
    const LEN: usize;
    /// Reads the value from the first `LEN` bytes of `b`.
    fn read(b: &[u8]) -> Self;
    /// Writes the value into the first `LEN` bytes of `b`.
    fn write(self, b: &mut [u8]);
}

macro_rules! be_int {
    ($($t:ty),*) => {$(
        impl BeField for $t {
            const LEN: usize = core::mem::size_of::<$t>();
            #[inline]
            fn read(b: &[u8]) -> Self {
                let mut a = [0u8; core::mem::size_of::<$t>()];
                a.copy_from_slice(&b[..Self::LEN]);
                <$t>::from_be_bytes(a)
            }
            #[inline]
            fn write(self, b: &mut [u8]) {
                b[..Self::LEN].copy_from_slice(&self.to_be_bytes());
            }
        }
    )*};
}
be_int!(u8, u16, u32, u64);

/// Reads a 24-bit big-endian value.
#[inline]
pub(crate) fn read_u24(b: &[u8]) -> u32 {
    u32::from(b[0]) << 16 | u32::from(b[1]) << 8 | u32::from(b[2])
}

/// Writes the low 24 bits of `v` big-endian.
#[inline]
pub(crate) fn write_u24(v: u32, b: &mut [u8]) {
    b[0] = (v >> 16) as u8;
    b[1] = (v >> 8) as u8;
    b[2] = v as u8;
}

/// Defines a 24-bit newtype stored in three bytes (QPNs, PSNs and MSNs are all 24 bits).
macro_rules! u24_newtype {
    ($(#[$m:meta])* $name:ident) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(u32);

        impl $name {
            /// The largest value plus one: these fields are 24 bits wide.
            pub const MODULUS: u32 = 1 << 24;

            /// Takes the low 24 bits of `v`.
            #[inline]
            pub const fn new(v: u32) -> Self {
                Self(v & (Self::MODULUS - 1))
            }

            /// The value, always below 2^24.
            #[inline]
            pub const fn value(self) -> u32 {
                self.0
            }
        }

        impl $crate::wire::field::BeField for $name {
            const LEN: usize = 3;
            #[inline]
            fn read(b: &[u8]) -> Self {
                Self($crate::wire::field::read_u24(b))
            }
            #[inline]
            fn write(self, b: &mut [u8]) {
                $crate::wire::field::write_u24(self.0, b)
            }
        }

        impl core::fmt::Display for $name {
            fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                write!(f, "{}", self.0)
            }
        }
    };
}
pub(crate) use u24_newtype;
