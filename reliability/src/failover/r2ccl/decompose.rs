//! R2CCL-AllReduce (seed 003, mechanism 3): when one node has lost more than a third of its
//! bandwidth, a ring AllReduce runs at that node's speed; instead, split the data. A share
//! `beta` goes through a **global** ring over all `n` nodes; the rest through a **partial**
//! ring over the `n - 1` healthy ones, into which the degraded node first **folds** its
//! share (each healthy node reduces one piece of it in) and from which it finally takes the
//! result by **broadcast** (each healthy node sends it the piece it owns). The degraded node
//! then moves `2(n-1)/n · beta + (1 - beta)` of the data each way instead of `2(n-1)/n`;
//! the healthy ones absorb the difference.
//!
//! This module is the arithmetic: the time model (per direction, each node bound by its
//! NICs' bandwidth, the phases pipelined), the `beta` that balances the degraded node
//! against the healthy ones, and the paper's rule for when to decompose at all.

/// The paper's threshold: decompose when a node lost more than this share of its bandwidth
/// (below it, R2CCL-Balance spreads the load over the node's remaining NICs instead).
pub const THRESHOLD: f64 = 1.0 / 3.0;

/// How an AllReduce runs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Plan {
    /// One ring over every node.
    Ring,
    /// Global ring over a `beta` share, partial ring (without the degraded node) over the
    /// rest, then a broadcast to it.
    Decompose {
        /// The share of the data in the global ring.
        beta: f64,
    },
}

/// Time per byte of data, in units of (one healthy node's time to move a byte), of a ring
/// AllReduce over `n` nodes whose slowest has `bw` of a healthy node's bandwidth.
pub fn ring_time(n: usize, bw: f64) -> f64 {
    let a = 2.0 * (n as f64 - 1.0) / n as f64;
    a / bw.max(f64::MIN_POSITIVE)
}

/// The same for the decomposition with share `beta` in the global ring, one node at `bw`:
/// the later of the degraded node and a healthy one.
pub fn decomposed_time(n: usize, bw: f64, beta: f64) -> f64 {
    let nf = n as f64;
    let m = nf - 1.0;
    let a = 2.0 * (nf - 1.0) / nf;
    let degraded = (a * beta + (1.0 - beta)) / bw.max(f64::MIN_POSITIVE);
    let healthy = a * beta + (1.0 - beta) * (2.0 * m - 1.0) / m;
    degraded.max(healthy)
}

/// The `beta` in `[0, 1]` that makes [`decomposed_time`] least (to 1/1024).
pub fn best_beta(n: usize, bw: f64) -> f64 {
    (0..=1024)
        .map(|i| f64::from(i) / 1024.0)
        .min_by(|&x, &y| decomposed_time(n, bw, x).total_cmp(&decomposed_time(n, bw, y)))
        .unwrap_or(1.0)
}

/// The paper's choice for a node that lost `lost` of its bandwidth (0 … 1): decompose
/// beyond [`THRESHOLD`] with the best `beta` (three or more nodes), else one ring.
pub fn choose(n: usize, lost: f64) -> Plan {
    if n < 3 || lost <= THRESHOLD {
        return Plan::Ring;
    }
    Plan::Decompose {
        beta: best_beta(n, 1.0 - lost),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 2e-3
    }

    /// Hand-computed points of the model. Four nodes, one at half bandwidth (a NIC of two
    /// lost): the ring takes 1.5 / 0.5 = 3; decomposed, all of it partial (beta 0), the
    /// degraded node moves 1 at 0.5 = 2 and a healthy one 5/3 — 75 % of the healthy ring's
    /// 1.5 against the ring's 50 %. Sixteen nodes: 1.875 / 2 = 93.75 %.
    #[test]
    fn hand_computed_points() {
        assert!(close(ring_time(4, 1.0), 1.5));
        assert!(close(ring_time(4, 0.5), 3.0));
        assert!(close(decomposed_time(4, 0.5, 0.0), 2.0));
        assert!(
            close(decomposed_time(4, 0.5, 1.0), 3.0),
            "beta 1 is the ring"
        );
        assert_eq!(best_beta(4, 0.5), 0.0);
        assert!(close(
            ring_time(4, 1.0) / decomposed_time(4, 0.5, 0.0),
            0.75
        ));
        assert!(close(
            ring_time(16, 1.0) / decomposed_time(16, 0.5, 0.0),
            0.9375
        ));
        // A third lost on four nodes: balanced at beta 2/11 (degraded 1.5 + 0.75 beta,
        // healthy 5/3 - beta/6), 18/11 — 92 % of the healthy ring against the ring's 67 %.
        let b = best_beta(4, 2.0 / 3.0);
        assert!(close(b, 2.0 / 11.0), "{b}");
        assert!(close(decomposed_time(4, 2.0 / 3.0, b), 18.0 / 11.0));
    }

    /// The balance: at the best beta (inside (0, 1)) the degraded and healthy nodes finish
    /// together; the decomposition never loses to the ring by the model.
    #[test]
    fn the_best_beta_balances_and_never_loses() {
        for n in 3..=16 {
            for lost in [0.1, 0.25, 0.34, 0.5, 0.75, 0.9] {
                let bw = 1.0 - lost;
                let b = best_beta(n, bw);
                assert!(decomposed_time(n, bw, b) <= ring_time(n, bw) + 1e-9);
                if b > 0.0 && b < 1.0 {
                    let nf = n as f64;
                    let a = 2.0 * (nf - 1.0) / nf;
                    let deg = (a * b + 1.0 - b) / bw;
                    let healthy = a * b + (1.0 - b) * (2.0 * (nf - 1.0) - 1.0) / (nf - 1.0);
                    assert!((deg - healthy).abs() < 0.01, "n {n} lost {lost}");
                }
            }
        }
    }

    #[test]
    fn the_rule_follows_the_threshold() {
        assert_eq!(choose(4, 0.2), Plan::Ring);
        assert_eq!(choose(4, THRESHOLD), Plan::Ring);
        assert_eq!(
            choose(2, 0.5),
            Plan::Ring,
            "no healthy ring without the node"
        );
        assert!(matches!(choose(4, 0.5), Plan::Decompose { beta } if beta == 0.0));
    }
}
