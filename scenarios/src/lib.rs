//! The papers' experiments on the simulated fabric, in virtual time (no NIC, no root): each
//! a module with a `Setup`, an `Outcome` and `run(&Setup) -> Outcome`, deterministic for a
//! seed. `ferroce scenario` is their command line (arguments, tables, JSON, plots); a
//! researcher calls them directly to sweep a parameter the CLI does not expose.
//!
//! | module | experiment |
//! |---|---|
//! | [`spray`] | Themis' testbed: tail FCT of every recovery scheme against the loss rate |
//! | [`sdr`] | SDR-RDMA's cross-continent link: completion time of SR and EC against the drop rate |
//! | [`failover`] | SHIFT's Figure 7: a WRITE stream through a fault, per failover scheme |
//! | [`varuna`] | Varuna's lock-and-counter correctness run, per scheme and fault |
//! | [`varuna_steady`] | what the failover schemes cost while nothing fails |
//! | [`incast`] | congestion control: senders into one receiver through a shallow ECN buffer |
//! | [`allreduce`] | R2CCL's ring AllReduce through NIC, path and ToR faults |
//!
//! [`r2ccl_side`] is the R2CCL scheme of the failover experiment.
#![forbid(unsafe_code)]

pub mod allreduce;
pub mod failover;
pub mod incast;
pub mod r2ccl_side;
pub mod sdr;
pub mod spray;
pub mod varuna;
pub mod varuna_steady;

/// Jain's fairness index of `shares`: 1 when all are equal, 1/n when one has everything
/// (0 when nothing was shared).
pub fn jain(shares: &[u64]) -> f64 {
    let sum: f64 = shares.iter().map(|&x| x as f64).sum();
    let sq: f64 = shares.iter().map(|&x| (x as f64).powi(2)).sum();
    if sq > 0.0 {
        sum * sum / (shares.len() as f64 * sq)
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn jain_is_one_for_equal_shares_and_one_over_n_for_one_taker() {
        assert_eq!(super::jain(&[5, 5, 5, 5]), 1.0);
        assert_eq!(super::jain(&[8, 0, 0, 0]), 0.25);
        assert_eq!(super::jain(&[0, 0]), 0.0);
    }
}
