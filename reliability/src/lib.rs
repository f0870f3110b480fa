//! Reliability policies plugged into the sans-IO transport of `ferroce-stack`.
//!
//! This crate will hold Go-Back-N (the IBTA default), selective repeat, packet spraying and
//! path-aware loss detection (Themis), SDR-RDMA's partial-completion messaging with its SR and
//! erasure-coding layers, and multi-port failover (native, SHIFT, Varuna, R2CCL). Each is a policy
//! behind a trait of the transport, so one QP can run any of them. Nothing is implemented yet:
//! the transport it plugs into arrives with issue 3.
