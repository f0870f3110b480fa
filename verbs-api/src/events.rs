//! Asynchronous events of a device (libibverbs' `ibv_get_async_event`): a port's link
//! going up or down, a QP the transport put in the error state with no completion to say so,
//! the last receive of a QP on a shared receive queue, a completion queue that overflowed, a
//! shared receive queue that fell below its limit, a QP that moved to its alternate path.
//! The engine raises them where they happen, on its own thread; a handler the application
//! sets once receives each.

use std::sync::{Arc, OnceLock};

use ferroce_stack::wire::Qpn;

/// An asynchronous event, named as libibverbs names them (`IBV_EVENT_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AsyncEvent {
    /// The port's link came up (`IBV_EVENT_PORT_ACTIVE`); the port number, from 1.
    PortActive(u8),
    /// The port's link went down (`IBV_EVENT_PORT_ERR`).
    PortError(u8),
    /// A QP entered the error state for a reason no work completion reports
    /// (`IBV_EVENT_QP_FATAL`): a request the responder could not execute, a malformed one.
    QpFatal(Qpn),
    /// A QP's request was refused by the peer as invalid (`IBV_EVENT_QP_REQ_ERR`).
    QpRequestError(Qpn),
    /// A QP's responder refused a request for its memory rights (`IBV_EVENT_QP_ACCESS_ERR`).
    QpAccessError(Qpn),
    /// A QP on a shared receive queue reached the error state and will take no more of its
    /// receives (`IBV_EVENT_QP_LAST_WQE_REACHED`).
    QpLastWqeReached(Qpn),
    /// A QP moved to its alternate path (`IBV_EVENT_PATH_MIG`).
    PathMigrated(Qpn),
    /// A completion queue overflowed and lost a completion (`IBV_EVENT_CQ_ERR`); its id.
    CqError(u32),
    /// A shared receive queue holds fewer receives than its armed limit
    /// (`IBV_EVENT_SRQ_LIMIT_REACHED`); its id. The limit disarms until set again.
    SrqLimitReached(u32),
    /// The device is gone (`IBV_EVENT_DEVICE_FATAL`): the service a context is attached to
    /// exited. Every verb fails from now on.
    DeviceFatal,
}

/// What receives a device's events.
pub(crate) type Handler = Box<dyn Fn(AsyncEvent) + Send + Sync>;

/// Where a device's engines send its events: a handler set once, or nowhere.
#[derive(Clone, Default)]
pub(crate) struct EventSink(Arc<OnceLock<Handler>>);

impl EventSink {
    /// Raises `event`: the handler runs now, on this thread.
    pub(crate) fn emit(&self, event: AsyncEvent) {
        tracing::debug!(?event, "async event");
        if let Some(f) = self.0.get() {
            f(event);
        }
    }

    /// Sets the handler; false (and nothing changes) if one is set.
    pub(crate) fn set(&self, f: Handler) -> bool {
        self.0.set(f).is_ok()
    }
}

impl std::fmt::Debug for EventSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventSink")
            .field("handled", &self.0.get().is_some())
            .finish()
    }
}
