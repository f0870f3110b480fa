//! Latency histograms with logarithmic buckets, so a tail can be plotted (issue 39): four
//! buckets per doubling, bucket `b` holding the samples from `edge(b)` up to `edge(b + 1)`,
//! `edge(b) = ceil(2^(b/4))` nanoseconds (0 has a bucket of its own).

use serde_json::{json, Value};

/// Buckets per doubling.
const PER_OCTAVE: f64 = 4.0;

/// The first nanosecond count of bucket `b` (bucket 0 starts at 0).
fn edge(b: u32) -> u64 {
    if b == 0 {
        return 0;
    }
    2f64.powf(f64::from(b - 1) / PER_OCTAVE).ceil() as u64
}

/// The bucket of `ns`: the last whose edge is at most `ns`.
fn bucket(ns: u64) -> u32 {
    if ns == 0 {
        return 0;
    }
    // A first guess from the logarithm, then settled against the edges themselves, so that
    // rounding never puts a sample outside the bounds its bucket reports.
    let mut b = (ns as f64).log2().mul_add(PER_OCTAVE, 1.0).floor().max(1.0) as u32;
    while edge(b + 1) <= ns {
        b += 1;
    }
    while b > 1 && edge(b) > ns {
        b -= 1;
    }
    b
}

/// The non-empty buckets of `samples` (ns), in order, as `[from_ns, to_ns, count]` with
/// `to_ns` exclusive.
pub(super) fn log_buckets(samples: &[u64]) -> Value {
    let mut counts: std::collections::BTreeMap<u32, u64> = std::collections::BTreeMap::new();
    for &s in samples {
        *counts.entry(bucket(s)).or_default() += 1;
    }
    Value::Array(
        counts
            .into_iter()
            .map(|(b, n)| json!([edge(b), edge(b + 1), n]))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_sample_falls_inside_its_bucket_and_none_is_lost() {
        let samples: Vec<u64> = (0..20_000u64)
            .map(|i| i * i % 3_000_017 + i % 7)
            .chain([0, 1, 2, 3, 4, 5, 1000, 1024, u64::from(u32::MAX)])
            .collect();
        let h = log_buckets(&samples);
        let rows = h.as_array().unwrap();
        let total: u64 = rows.iter().map(|r| r[2].as_u64().unwrap()).sum();
        assert_eq!(total, samples.len() as u64);
        for w in rows.windows(2) {
            assert!(w[0][1].as_u64() <= w[1][0].as_u64(), "{w:?}");
        }
        for &s in &samples {
            let b = bucket(s);
            assert!(
                edge(b) <= s && s < edge(b + 1),
                "{s} in [{}, {})",
                edge(b),
                edge(b + 1)
            );
        }
        // Four buckets per doubling: 1 µs to 2 µs spans four.
        assert_eq!(bucket(2048) - bucket(1024), 4);
    }
}
