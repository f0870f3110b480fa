//! The verbs-like user API and the poll-mode engine.
//!
//! This crate will expose device lists and contexts, protection domains, memory regions,
//! completion queues and queue pairs shaped like libibverbs, plus the engine that polls ports,
//! demultiplexes by destination QPN and runs the timers. Nothing is implemented yet: it arrives
//! with issue 4, on top of the transport of issue 3.
