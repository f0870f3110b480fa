//! Every codec against the same cases: parity that rebuilds what its code promises, refusal
//! of what it does not, and the chunks that arrived left as they were.

use proptest::prelude::*;

use super::*;

fn codecs(k: usize, m: usize) -> Vec<Box<dyn ErasureCodec>> {
    vec![
        Box::new(RsSimd::new(k, m).unwrap()),
        Box::new(RsErasure::new(k, m).unwrap()),
        Box::new(Xor::new(k, m).unwrap()),
    ]
}

fn data(k: usize, len: usize, seed: u64) -> Vec<Vec<u8>> {
    let mut x = seed | 1;
    (0..k)
        .map(|_| {
            (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect()
        })
        .collect()
}

/// Encodes, erases the chunks `lost` names (overwritten with junk), rebuilds; returns the
/// rebuilt data chunks, or the refusal.
fn round_trip(
    c: &mut dyn ErasureCodec,
    d: &[Vec<u8>],
    lost: &[usize],
) -> Result<Vec<Vec<u8>>, CodecError> {
    let (k, m) = (c.k(), c.m());
    let len = d[0].len();
    let mut parity = vec![vec![0u8; len]; m];
    {
        let refs: Vec<&[u8]> = d.iter().map(Vec::as_slice).collect();
        let mut p: Vec<&mut [u8]> = parity.iter_mut().map(Vec::as_mut_slice).collect();
        c.encode(&refs, &mut p)?;
    }
    let mut all: Vec<Vec<u8>> = d.iter().cloned().chain(parity).collect();
    let mut present = vec![true; k + m];
    for &i in lost {
        present[i] = false;
        all[i].fill(0xa5);
    }
    let kept: Vec<(usize, Vec<u8>)> = (0..k + m)
        .filter(|&i| present[i])
        .map(|i| (i, all[i].clone()))
        .collect();
    let mut refs: Vec<&mut [u8]> = all.iter_mut().map(Vec::as_mut_slice).collect();
    c.reconstruct(&mut refs, &present)?;
    for (i, before) in kept {
        assert_eq!(
            all[i],
            before,
            "{} changed chunk {i}, which arrived",
            c.name()
        );
    }
    Ok(all.into_iter().take(k).collect())
}

#[test]
fn every_codec_rebuilds_one_lost_data_chunk() {
    let d = data(8, 256, 7);
    for mut c in codecs(8, 2) {
        for lost in 0..8 {
            assert_eq!(
                round_trip(&mut *c, &d, &[lost]).unwrap(),
                d,
                "{} lost {lost}",
                c.name()
            );
        }
    }
}

#[test]
fn xor_rebuilds_one_loss_per_group_and_refuses_two() {
    let d = data(8, 64, 3);
    let mut x = Xor::new(8, 4).unwrap();
    // Groups are j mod 4: chunks 0 and 5 are in different groups, 1 and 5 in the same.
    assert_eq!(round_trip(&mut x, &d, &[0, 5]).unwrap(), d);
    assert_eq!(
        round_trip(&mut x, &d, &[1, 5]),
        Err(CodecError::Undecodable)
    );
    // A lost data chunk whose group's parity is lost too.
    assert_eq!(
        round_trip(&mut x, &d, &[2, 8 + 2]),
        Err(CodecError::Undecodable)
    );
    // A lost parity chunk alone costs nothing.
    assert_eq!(round_trip(&mut x, &d, &[8 + 3]).unwrap(), d);
}

#[test]
fn reed_solomon_rebuilds_any_m_losses_and_refuses_m_plus_one() {
    let d = data(32, 128, 11);
    for mut c in [
        Box::new(RsSimd::new(32, 8).unwrap()) as Box<dyn ErasureCodec>,
        Box::new(RsErasure::new(32, 8).unwrap()),
    ] {
        let lost: Vec<usize> = vec![0, 3, 9, 17, 31, 32, 35, 39];
        assert_eq!(round_trip(&mut *c, &d, &lost).unwrap(), d, "{}", c.name());
        let eight_data: Vec<usize> = (0..8).map(|i| i * 4).collect();
        assert_eq!(
            round_trip(&mut *c, &d, &eight_data).unwrap(),
            d,
            "{}",
            c.name()
        );
        let nine: Vec<usize> = (0..9).collect();
        assert_eq!(
            round_trip(&mut *c, &d, &nine),
            Err(CodecError::Undecodable),
            "{}",
            c.name()
        );
    }
}

#[test]
fn shapes_and_lengths_are_checked() {
    assert!(Xor::new(2, 3).is_err());
    assert!(RsErasure::new(250, 10).is_err());
    assert!(RsSimd::new(0, 1).is_err());
    let mut c = RsSimd::new(2, 1).unwrap();
    let (a, b) = ([1u8; 8], [2u8; 6]);
    let mut p = [0u8; 8];
    assert!(c.encode(&[&a, &b], &mut [&mut p]).is_err());
    // reed-solomon-simd takes even lengths only.
    let (a, b) = ([1u8; 7], [2u8; 7]);
    let mut p = [0u8; 7];
    assert!(c.encode(&[&a, &b], &mut [&mut p]).is_err());
    assert!(!mds(4, 2)
        .unwrap()
        .decodable(&[true, false, false, false, true, true]));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Whatever is lost, a codec rebuilds the data exactly when it says the arrivals
    /// determine it, and refuses otherwise.
    #[test]
    fn rebuilds_exactly_when_decodable(
        (k, m) in (1usize..12).prop_flat_map(|k| (Just(k), 1usize..=k)),
        lost_bits in any::<u32>(),
        len in (1usize..40).prop_map(|n| n * 2),
        seed in any::<u64>(),
    ) {
        let d = data(k, len, seed);
        let lost: Vec<usize> = (0..k + m).filter(|i| lost_bits >> (i % 32) & 1 == 1).collect();
        let mut present = vec![true; k + m];
        for &i in &lost { present[i] = false; }
        for mut c in codecs(k, m) {
            let ok = c.decodable(&present);
            match round_trip(&mut *c, &d, &lost) {
                Ok(got) => { prop_assert!(ok, "{} rebuilt what it called undecodable", c.name()); prop_assert_eq!(&got, &d); }
                Err(e) => { prop_assert!(!ok, "{} refused a decodable loss: {}", c.name(), e); }
            }
        }
    }
}

/// `encode_each` hands out exactly what `encode` writes, for every codec (the default and
/// reed-solomon-simd's own).
#[test]
fn encode_each_hands_out_what_encode_writes() {
    let (k, m, len) = (6, 3, 64);
    let data: Vec<Vec<u8>> = (0..k)
        .map(|i| (0..len).map(|j| (i * 13 + j * 5) as u8).collect())
        .collect();
    let d: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
    let codecs: Vec<Box<dyn ErasureCodec>> = vec![
        Box::new(RsSimd::new(k, m).unwrap()),
        Box::new(RsErasure::new(k, m).unwrap()),
        Box::new(Xor::new(k, m).unwrap()),
    ];
    for mut c in codecs {
        let mut want = vec![vec![0u8; len]; m];
        let mut p: Vec<&mut [u8]> = want.iter_mut().map(Vec::as_mut_slice).collect();
        c.encode(&d, &mut p).unwrap();
        let mut got = vec![Vec::new(); m];
        c.encode_each(&d, &mut |i, b| got[i] = b.to_vec()).unwrap();
        assert_eq!(got, want, "{}", c.name());
    }
}
