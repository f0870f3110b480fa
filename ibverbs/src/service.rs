//! The drop-in as a thin client of `ferroce serve`: with `FERROCE_SERVICE` set (to the
//! service's socket; `default` for /run/ferroce.sock) the device list is the service's, and
//! every context is attached to it: no engine, no port and no DPDK in the program's process.
//! The process keeps one connection, made when the device list is first read; a service
//! that cannot be reached leaves the list empty, with one line on stderr saying why.

use std::sync::OnceLock;

use ferroce_verbs::service::Client;
use ferroce_verbs::{Context, VerbsError};

/// Names the service's socket.
pub const SERVICE_ENV: &str = "FERROCE_SERVICE";

fn client() -> Option<&'static Client> {
    static CLIENT: OnceLock<Option<Client>> = OnceLock::new();
    CLIENT
        .get_or_init(|| {
            let v = std::env::var(SERVICE_ENV).ok().filter(|v| !v.is_empty())?;
            let path = if v == "default" {
                ferroce_verbs::service::DEFAULT_SOCKET.into()
            } else {
                std::path::PathBuf::from(v)
            };
            match Client::connect(&path) {
                Ok(c) => Some(c),
                Err(e) => {
                    eprintln!("ferroce: {SERVICE_ENV}={}: {e}", path.display());
                    None
                }
            }
        })
        .as_ref()
}

/// With `FERROCE_SERVICE` set: the specifications of the devices the service serves, in
/// its order (empty when it cannot be reached). `None` without it.
pub(crate) fn device_specs() -> Option<Vec<String>> {
    std::env::var(SERVICE_ENV).ok().filter(|v| !v.is_empty())?;
    Some(client().map_or_else(Vec::new, |c| c.devices().to_vec()))
}

/// A context attached to device `index` of the service.
pub(crate) fn open(index: u32) -> Result<Context, VerbsError> {
    let c = client().ok_or_else(|| VerbsError::Open(format!("{SERVICE_ENV}: no service")))?;
    Context::attach(c, index)
}

/// The errno a verb returns for `e`.
pub(crate) fn errno(e: &VerbsError) -> i32 {
    match e {
        VerbsError::Service { errno, .. } => *errno,
        VerbsError::NotThroughService(_) => libc::EOPNOTSUPP,
        _ => libc::EINVAL,
    }
}
