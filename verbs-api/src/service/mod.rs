//! ferroce as a service (`ferroce serve`): the engine in its own process, serving many
//! programs on its ports. A program talks to it over a Unix socket ([`proto`], [`socket`])
//! for objects and over shared memory ([`slots`] in `ferroce_drivers::shm` rings) for work
//! requests and completions; its registered buffers move onto shared memory at their own
//! addresses, so the engine reads and writes them in place. [`server`] is the service's
//! side, [`client`] the program's. docs/service.md says why the pieces are shaped so.

pub mod client;
mod cm_route;
pub mod proto;
mod registry;
pub mod server;
pub mod slots;
pub mod socket;

pub use client::{
    Client, RemoteChannel, RemoteCq, RemoteFlow, RemoteMr, RemotePd, RemoteQp, RemoteSrq,
    ServiceError,
};
pub use registry::{quiet, Quiet};
pub use server::{ServeError, Service, ServiceCounters};

/// Where programs find the service when `FERROCE_SERVICE` does not say.
pub const DEFAULT_SOCKET: &str = "/run/ferroce.sock";

/// The service's socket: `FERROCE_SERVICE`, or [`DEFAULT_SOCKET`].
pub fn socket_path() -> std::path::PathBuf {
    std::env::var_os("FERROCE_SERVICE")
        .filter(|s| !s.is_empty())
        .map_or_else(|| DEFAULT_SOCKET.into(), Into::into)
}
