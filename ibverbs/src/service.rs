//! The drop-in as a thin client of `ferroce serve`: with `FERROCE_SERVICE` set (to the
//! service's socket; `default` for /run/ferroce.sock) the device list is the service's, and
//! every context is attached to it: no engine, no port and no DPDK in the program's process.
//! The process keeps one connection, made when the device list is first read; a service
//! that cannot be reached leaves the list empty, with one line on stderr saying why. A child
//! of fork makes its own when it first opens a device (as a process with kernel RDMA opens
//! its own `/dev/infiniband` files): its parent's connection, and what the parent made on
//! it, stay the parent's.

use std::sync::Mutex;

use ferroce_verbs::service::Client;
use ferroce_verbs::{Context, VerbsError};

/// Names the service's socket.
pub const SERVICE_ENV: &str = "FERROCE_SERVICE";

/// This process's connection to the service (`None` when none could be made).
fn client() -> Option<Client> {
    static CLIENT: Mutex<Option<Option<Client>>> = Mutex::new(None);
    let mut slot = CLIENT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(Some(c)) = slot.as_ref() {
        if !c.is_own() {
            // A child of fork: the parent's connection must not be closed from here.
            if let Some(Some(inherited)) = slot.take() {
                std::mem::forget(inherited);
            }
        }
    }
    slot.get_or_insert_with(|| {
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
    .clone()
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
    Context::attach(&c, index)
}

/// The errno a verb returns for `e`.
pub(crate) fn errno(e: &VerbsError) -> i32 {
    match e {
        VerbsError::Service { errno, .. } => *errno,
        VerbsError::NotThroughService(_) => libc::EOPNOTSUPP,
        _ => libc::EINVAL,
    }
}
