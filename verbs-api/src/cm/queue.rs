//! Where a device's connection manager events wait for their consumer: filled by the
//! engine's agent in this process, or by a service client's watcher thread when the agent
//! is a service's. A leaf: both sides use it, and it uses neither.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, OnceLock};

use ferroce_stack::cm::CmEvent;

/// A device's CM events on their way to the consumer, and what wakes it.
#[derive(Default)]
pub(crate) struct CmShared {
    events: Mutex<VecDeque<CmEvent>>,
    ready: Condvar,
    /// Called after each event is queued (the librdmacm shim makes its channel's fd
    /// readable with it).
    pub(crate) notify: OnceLock<Box<dyn Fn() + Send + Sync>>,
}

impl std::fmt::Debug for CmShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmShared").finish_non_exhaustive()
    }
}

impl CmShared {
    pub(crate) fn post(&self, e: CmEvent) {
        self.events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push_back(e);
        self.ready.notify_all();
        if let Some(f) = self.notify.get() {
            f();
        }
    }

    /// The next event, waiting up to `timeout` for one.
    pub(crate) fn wait(&self, timeout: std::time::Duration) -> Option<CmEvent> {
        let q = self.events.lock().unwrap_or_else(|e| e.into_inner());
        let (mut q, _) = self
            .ready
            .wait_timeout_while(q, timeout, |q| q.is_empty())
            .unwrap_or_else(|e| e.into_inner());
        q.pop_front()
    }

    /// The next event, if one waits.
    pub(crate) fn try_next(&self) -> Option<CmEvent> {
        self.events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop_front()
    }
}
