//! A testbed for the transport: hosts with one or more ports, a registered buffer each and
//! sans-IO [`Qp`](ferroce_stack::transport::Qp)s, on [`ferroce_drivers::sim`]'s fabric,
//! driven in virtual time on the model of quinn's test `Pair`: [`Testbed::step`] gives
//! every host one turn (receive, timers, transmit, completions) and, when none sent anything,
//! moves time to the next arrival or timer; [`Testbed::drive`] steps until nothing is left to
//! happen, [`Testbed::drive_until`] until a horizon.
//!
//! Everything is single-threaded and seeded, so a run is a pure function of its seed: the
//! transport's tests, the CLI's scenarios and a researcher's experiment all stand on it. The
//! verbs engine over the same fabric (`ferroce_verbs::sim`) follows the same time rule,
//! [`Fabric::advance_idle`](ferroce_drivers::sim::Fabric::advance_idle).

#![forbid(unsafe_code)]

mod bed;
mod conn;
mod hooks;
mod host;
mod oob;
mod rails_io;
mod topology;

pub use bed::{Step, Testbed};
pub use conn::ConnOpts;
pub use hooks::{Cut, PairCut};
pub use host::{Host, PD};
pub use oob::OobNet;
pub use rails_io::{PoolSeat, RailQps, ShiftPair, ShiftRails, VarunaRails};
pub use topology::{
    multipath, multipath_asym, pair, pair_asym, rails, rails_n, rails_with, star, Rails, RailsN,
};
