//! The invariant CRC of RoCEv2 (IBTA Vol 1 §7.8.1 and Annex A17.4.3.2).
//!
//! The ICRC is CRC-32 (the Ethernet polynomial, reflected, initial value and final XOR all
//! ones) over: eight bytes of ones standing in for the InfiniBand LRH, then the IP header, UDP
//! header, BTH, extension headers, payload and pad. Fields a router may change are replaced by
//! ones before the CRC sees them:
//! - IPv4: the whole type-of-service byte (DSCP and ECN), TTL and the header checksum;
//! - IPv6: traffic class, flow label and hop limit;
//! - UDP: the checksum;
//! - BTH: the reserved byte 4 (resv8a, which holds FECN/BECN).
//!
//! The result goes on the wire least-significant byte first, like the Ethernet FCS.
//!
//! Masking needs a private copy of the headers. Setting ones is an OR, so the copy is built
//! in whole 16-byte chunks, each OR-ed with a per-IP-version mask: the compiler makes each one
//! vector load, OR and store. Any narrower store under crc32fast's 16-byte loads (byte
//! patches, `u128` arithmetic, a chunk assembled from two halves) stalls store-to-load
//! forwarding and costs more than the CRC itself (measured with `benches/wire.rs`). The LRH
//! stand-in gets the same treatment: the input starts eight bytes before the IP header (in a
//! frame, the end of the Ethernet header) and the mask turns those bytes into ones, so the
//! first chunk is a plain load too. Up to 128 bytes are copied, which is where crc32fast's
//! carry-less-multiply path starts: an RC WRITE with a 64-byte payload is exactly 128 bytes of
//! ICRC input, one fast call. Whatever follows is read in place.

/// Bytes of the ICRC trailer.
pub const ICRC_LEN: usize = 4;

/// Bytes in front of the IP header that stand for the LRH.
pub const LRH_STAND_IN: usize = 8;

/// Most bytes of the masked copy: eight chunks of 16.
const COPY: usize = 128;

/// OR-masks over the first [`COPY`] bytes of the input: ones on the stand-in and on every
/// variant field.
const fn masks(ip_version: u8) -> [[u8; 16]; COPY / 16] {
    let mut bytes = [0u8; COPY];
    let mut i = 0;
    while i < LRH_STAND_IN {
        bytes[i] = 0xff;
        i += 1;
    }
    let (fields, udp): (&[(usize, u8)], usize) = if ip_version == 4 {
        // DSCP + ECN, TTL, header checksum.
        (&[(1, 0xff), (8, 0xff), (10, 0xff), (11, 0xff)], 20)
    } else {
        // Traffic class (split over bytes 0 and 1), flow label, hop limit.
        (&[(0, 0x0f), (1, 0xff), (2, 0xff), (3, 0xff), (7, 0xff)], 40)
    };
    let mut f = 0;
    while f < fields.len() {
        bytes[LRH_STAND_IN + fields[f].0] = fields[f].1;
        f += 1;
    }
    bytes[LRH_STAND_IN + udp + 6] = 0xff; // UDP checksum
    bytes[LRH_STAND_IN + udp + 7] = 0xff;
    bytes[LRH_STAND_IN + udp + 8 + 4] = 0xff; // BTH resv8a
    let mut out = [[0u8; 16]; COPY / 16];
    let mut i = 0;
    while i < COPY {
        out[i / 16][i % 16] = bytes[i];
        i += 1;
    }
    out
}

/// Input bytes that hold masked fields, rounded up to whole chunks: resv8a is input byte 40
/// for IPv4 and 60 for IPv6.
const MASKED_V4: usize = 48;
const MASKED_V6: usize = 64;

/// Bytes of input from which crc32fast's widest kernel (AVX-512, from 2 KiB) does most of
/// the work; below this the masked copy is [`COPY`] bytes.
const LONG: usize = 2048 + COPY;

/// How much of an input of `len` bytes goes through the masked copy: [`COPY`] bytes, except
/// for a long input, where the copy is cut so that what crc32fast then reads in place is a
/// whole number of its 256-byte AVX-512 blocks plus less than 128 bytes. A remainder of 128
/// or more is finished by a second, fold-by-4 kernel call, about 18 ns, once per ICRC: with
/// 4 KiB payloads the in-place part was 4016 bytes, 176 of them past the blocks.
fn head_len(len: usize, masked_len: usize) -> usize {
    if len < LONG {
        return COPY;
    }
    let r = (len - masked_len) % 256;
    if r < 128 {
        return masked_len;
    }
    let extra = (r - 127).div_ceil(16) * 16;
    (masked_len + extra).min(COPY)
}

const MASKS_V4: [[u8; 16]; COPY / 16] = masks(4);
const MASKS_V6: [[u8; 16]; COPY / 16] = masks(6);

/// A fresh CRC-32 hasher. crc32fast probes the CPU's features in every `Hasher::new`; cloning
/// a prototype made once skips that on the per-frame path.
fn hasher() -> crc32fast::Hasher {
    static PROTOTYPE: std::sync::OnceLock<crc32fast::Hasher> = std::sync::OnceLock::new();
    PROTOTYPE.get_or_init(crc32fast::Hasher::new).clone()
}

/// Computes the ICRC. `input` is eight bytes of any value (they stand for the LRH and are
/// replaced by ones; in a frame, pass the last eight bytes of the Ethernet header) followed by
/// the packet from the first byte of the IP header to the last pad byte, the ICRC itself
/// excluded. `ip_version` is 4 or 6. The caller guarantees `input` holds the stand-in and
/// the IP, UDP and BTH headers.
pub fn compute(input: &[u8], ip_version: u8) -> u32 {
    IcrcState::start(input, ip_version).finish()
}

/// An ICRC over a packet that is not contiguous: the headers in one buffer, the payload where
/// it lies (registered memory, for a zero-copy transmit), the pad last.
#[derive(Clone)]
pub struct IcrcState(crc32fast::Hasher);

impl IcrcState {
    /// Starts over `head`: the stand-in and headers as [`compute`] takes them (at least up to
    /// the end of the BTH), possibly followed by some payload.
    pub fn start(head: &[u8], ip_version: u8) -> Self {
        let (masks, masked_len) = if ip_version == 4 {
            (&MASKS_V4, MASKED_V4)
        } else {
            (&MASKS_V6, MASKED_V6)
        };
        let mut h = hasher();
        let cut = head_len(head.len(), masked_len);
        if cut == COPY {
            if let Some((first, rest)) = head.split_first_chunk::<COPY>() {
                // The usual case (every packet up to 2 KiB): the whole copy is written from
                // the input, so the compiler need not clear it first.
                let copy: [u8; COPY] = core::array::from_fn(|i| first[i] | masks.as_flattened()[i]);
                h.update(&copy);
                if !rest.is_empty() {
                    h.update(rest);
                }
                return Self(h);
            }
        }
        let mut copy = [[0u8; 16]; COPY / 16];
        let first = &head[..head.len().min(cut)];
        let (chunks, _) = first.as_chunks::<16>();
        let copied = chunks.len() * 16;
        if copied >= masked_len {
            for ((dst, src), mask) in copy.iter_mut().zip(chunks).zip(masks) {
                for i in 0..16 {
                    dst[i] = src[i] | mask[i];
                }
            }
            h.update(&copy.as_flattened()[..copied]);
            if head.len() > copied {
                h.update(&head[copied..]);
            }
        } else {
            // A short packet whose last masked field is in a partial chunk: patch bytes.
            let flat = copy.as_flattened_mut();
            flat[..first.len()].copy_from_slice(first);
            for (b, m) in flat.iter_mut().zip(masks.as_flattened()) {
                *b |= m;
            }
            h.update(&flat[..first.len()]);
        }
        Self(h)
    }

    /// Continues over the next bytes of the packet (none of them a masked field).
    pub fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    /// The ICRC.
    pub fn finish(self) -> u32 {
        self.0.finalize()
    }
}

/// Reads the ICRC trailer as it sits on the wire.
pub fn read(trailer: &[u8]) -> u32 {
    u32::from_le_bytes([trailer[0], trailer[1], trailer[2], trailer[3]])
}

/// Writes an ICRC value into a trailer.
pub fn write(icrc: u32, trailer: &mut [u8]) {
    trailer[..4].copy_from_slice(&icrc.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    /// The ICRC the slow way: mask a copy of the whole input byte by byte, one CRC call.
    fn reference(input: &[u8], ip_version: u8) -> u32 {
        let mut c = input.to_vec();
        let masks = if ip_version == 4 {
            super::MASKS_V4
        } else {
            super::MASKS_V6
        };
        for (b, m) in c.iter_mut().zip(masks.as_flattened()) {
            *b |= m;
        }
        crc32fast::hash(&c)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        /// Whatever split of the masked copy and the in-place rest the length picks, and
        /// however the rest is fed afterwards, the ICRC is the same.
        #[test]
        fn every_length_and_split_gives_the_reference_icrc(
            len in 64usize..9300,
            v6 in any::<bool>(),
            fill in any::<u8>(),
            cut in 0usize..9300,
        ) {
            let input: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(31) ^ fill).collect();
            let v = if v6 { 6 } else { 4 };
            let want = reference(&input, v);
            prop_assert_eq!(super::compute(&input, v), want);
            let cut = cut.clamp(64, len);
            let mut split = super::IcrcState::start(&input[..cut], v);
            split.update(&input[cut..]);
            prop_assert_eq!(split.finish(), want);
        }
    }

    #[test]
    fn long_inputs_leave_less_than_a_block_half_past_the_blocks() {
        for len in super::LONG..super::LONG + 1024 {
            for masked in [super::MASKED_V4, super::MASKED_V6] {
                let h = super::head_len(len, masked);
                assert!(
                    h >= masked && h <= super::COPY && h.is_multiple_of(16),
                    "{len} {h}"
                );
                let r = (len - h) % 256;
                // Achievable unless the needed cut would pass COPY.
                if (len - masked) % 256 <= 128 + (super::COPY - masked) - 16 {
                    assert!(r < 128, "len {len}: rest {r}");
                }
            }
        }
    }

    #[test]
    fn stand_in_bytes_do_not_matter() {
        let mut input = [0x5au8; 200];
        input[8] = 0x45;
        let a = super::compute(&input, 4);
        input[..8].fill(0x00);
        assert_eq!(super::compute(&input, 4), a);
        let mut split = super::IcrcState::start(&input[..64], 4);
        split.update(&input[64..100]);
        split.update(&input[100..]);
        assert_eq!(split.finish(), a);
        assert_eq!(super::compute(&input[..60], 4), {
            let mut c = input;
            c[..8].fill(0xff);
            super::compute(&c[..60], 4)
        });
    }
}
