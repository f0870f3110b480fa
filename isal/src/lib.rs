//! SDR's MDS erasure codec on Intel ISA-L (issue 21, item 3): the system's libisal
//! (libisal-dev), bound with bindgen as the DPDK driver binds DPDK, behind the `isal`
//! feature. Without it the crate is empty.
//!
//! A departure from the rule that `unsafe` lives only in drivers and the memory accessor:
//! this crate is a driver of a kind — for a C library rather than a NIC — and stands beside
//! `reliability` (it implements its [`ErasureCodec`](ferroce_reliability::sdr::codec::ErasureCodec)),
//! so the transport's crates stay free of FFI; every `unsafe` block carries its SAFETY note.
//!
//! The code is ISA-L's Cauchy Reed-Solomon over GF(2^8): parity rows of a Cauchy matrix
//! under an identity, encoded with `ec_encode_data`; decoding inverts the rows of `k` chunks
//! that arrived (`gf_invert_matrix`) and encodes the missing data chunks from them.

#[cfg(feature = "isal")]
mod ffi {
    #![allow(
        non_camel_case_types,
        non_snake_case,
        non_upper_case_globals,
        dead_code,
        unreachable_pub,
        clippy::all
    )]
    include!(concat!(env!("OUT_DIR"), "/isal_bindings.rs"));
}

#[cfg(feature = "isal")]
mod codec;

#[cfg(feature = "isal")]
pub use codec::IsaL;

/// ISA-L as a connection's Reed-Solomon backend
/// ([`MdsFactory`](ferroce_reliability::sdr::codec::MdsFactory)).
#[cfg(feature = "isal")]
pub fn mds(
    k: usize,
    m: usize,
) -> Result<
    Box<dyn ferroce_reliability::sdr::codec::ErasureCodec>,
    ferroce_reliability::sdr::codec::CodecError,
> {
    Ok(Box::new(IsaL::new(k, m)?))
}
