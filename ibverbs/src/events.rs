//! Asynchronous events: `ibv_get_async_event`, `ibv_ack_async_event` and the context's
//! `async_fd`.
//!
//! The engine raises ferroce's events ([`AsyncEvent`]) on its thread; here each becomes the
//! `struct ibv_async_event` libibverbs returns, naming the program's own object (its QP, CQ
//! or SRQ pointer, or the port number), queued for `ibv_get_async_event`. The `async_fd` is
//! an eventfd in semaphore mode counting queued events: readable exactly when one waits, so
//! a program may `poll()` it, and blocking unless the program made it non-blocking, as the
//! kernel's is. An event whose object is destroyed before the program took it is dropped
//! with the object (as the kernel drops it); the fd's count for it is consumed by the next
//! `ibv_get_async_event`, which then waits for a real event. `ibv_destroy_qp`, `_cq` and
//! `_srq` wait until every event they were named in has been acknowledged, as libibverbs
//! documents, on the object header's own mutex and condition variable.

use std::collections::{HashMap, VecDeque};
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use ferroce_verbs::{AsyncEvent, Context as VerbsContext};

use crate::device::{Device, EventQueue};
use crate::ffi;

/// The kinds of object an event names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Kind {
    Qp,
    Cq,
    Srq,
}

/// A queued event, and the count of taken events of the object it names (none for a port
/// event). It holds the program's pointers, which only this library's verbs read.
struct Queued(ffi::ibv_async_event, Option<Reported>);

// SAFETY: the pointers are the program's objects, handed back to it; this library reads
// them only while the objects are registered, under the queue's lock.
unsafe impl Send for Queued {}

/// What events of one context are queued, and the program's objects they may name.
#[derive(Default)]
struct Inner {
    queue: VecDeque<Queued>,
    /// The program's object for each ferroce id (QPN, CQ id, SRQ id), by kind, and its
    /// [`Reported`] count.
    objects: HashMap<(Kind, u32), (usize, Reported)>,
}

pub(crate) struct Shared {
    /// Eventfd (semaphore mode) counting queued events; -1 once closed.
    fd: c_int,
    inner: Mutex<Inner>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `event` for the object `(kind, id)` (none for a port event); dropped when the
    /// program has no such object (it was destroyed, or never seen by this library).
    fn push(&self, kind: Option<(Kind, u32)>, event_type: ffi::ibv_event_type, port: u8) {
        let mut inner = self.lock();
        let mut reported = None;
        let element = match kind {
            Some(k) => {
                let Some((p, r)) = inner.objects.get(&k) else {
                    return;
                };
                let p = *p;
                reported = Some(r.clone());
                match k.0 {
                    Kind::Qp => ffi::ibv_async_event__bindgen_ty_1 {
                        qp: p as *mut ffi::ibv_qp,
                    },
                    Kind::Cq => ffi::ibv_async_event__bindgen_ty_1 {
                        cq: p as *mut ffi::ibv_cq,
                    },
                    Kind::Srq => ffi::ibv_async_event__bindgen_ty_1 {
                        srq: p as *mut ffi::ibv_srq,
                    },
                }
            }
            None => ffi::ibv_async_event__bindgen_ty_1 {
                port_num: c_int::from(port),
            },
        };
        inner.queue.push_back(Queued(
            ffi::ibv_async_event {
                element,
                event_type,
            },
            reported,
        ));
        drop(inner);
        let one = 1u64;
        // SAFETY: writes 8 bytes from a live u64 to our eventfd.
        unsafe { libc::write(self.fd, &one as *const u64 as *const c_void, 8) };
    }
}

impl EventQueue for Shared {
    fn raise(&self, event: AsyncEvent) {
        let qp = |q: ferroce_stack::wire::Qpn| Some((Kind::Qp, q.value()));
        let (kind, t, port) = match event {
            AsyncEvent::PortActive(p) => (None, ffi::IBV_EVENT_PORT_ACTIVE, p),
            AsyncEvent::PortError(p) => (None, ffi::IBV_EVENT_PORT_ERR, p),
            AsyncEvent::QpFatal(q) => (qp(q), ffi::IBV_EVENT_QP_FATAL, 0),
            AsyncEvent::QpRequestError(q) => (qp(q), ffi::IBV_EVENT_QP_REQ_ERR, 0),
            AsyncEvent::QpAccessError(q) => (qp(q), ffi::IBV_EVENT_QP_ACCESS_ERR, 0),
            AsyncEvent::QpLastWqeReached(q) => (qp(q), ffi::IBV_EVENT_QP_LAST_WQE_REACHED, 0),
            AsyncEvent::PathMigrated(q) => (qp(q), ffi::IBV_EVENT_PATH_MIG, 0),
            AsyncEvent::CqError(c) => (Some((Kind::Cq, c)), ffi::IBV_EVENT_CQ_ERR, 0),
            AsyncEvent::SrqLimitReached(s) => {
                (Some((Kind::Srq, s)), ffi::IBV_EVENT_SRQ_LIMIT_REACHED, 0)
            }
            AsyncEvent::DeviceFatal => (None, ffi::IBV_EVENT_DEVICE_FATAL, 0),
            // A kind of event this library does not know yet: not the program's business.
            #[allow(unreachable_patterns)]
            _ => return,
        };
        self.push(kind, t, port);
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        if self.fd >= 0 {
            // SAFETY: our own eventfd, closed once.
            unsafe { libc::close(self.fd) };
        }
    }
}

/// The asynchronous events of one context.
pub(crate) struct AsyncEvents {
    shared: Arc<Shared>,
}

impl AsyncEvents {
    /// Events of device `dev` for a new context: the device raises them here from now on
    /// (every context open on it hears of its ports; of its objects, the one that made
    /// them). Err holds an errno.
    pub(crate) fn new(dev: &Device, verbs: &VerbsContext) -> Result<Self, c_int> {
        // SAFETY: plain system call.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_SEMAPHORE) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EMFILE));
        }
        let shared = Arc::new(Shared {
            fd,
            inner: Mutex::new(Inner::default()),
        });
        dev.subscribe(verbs, shared.clone());
        Ok(Self { shared })
    }

    /// The `async_fd` programs poll.
    pub(crate) fn fd(&self) -> c_int {
        self.shared.fd
    }

    /// Called once the context is published (nothing to do yet; kept for symmetry with
    /// `detach`).
    pub(crate) fn attach(&self, _ctx: *mut ffi::ibv_context) {}

    /// The context closes: queued events go with it.
    pub(crate) fn detach(&self) {
        let mut inner = self.shared.lock();
        inner.queue.clear();
        inner.objects.clear();
    }

    /// Enters the program's object `ptr` as `(kind, id)`: events naming it name `ptr`, and
    /// each one the program takes counts in `reported` (a handle on the object's own count).
    pub(crate) fn register(&self, kind: Kind, id: u32, ptr: *mut c_void, reported: Reported) {
        self.shared
            .lock()
            .objects
            .insert((kind, id), (ptr as usize, reported));
    }

    /// `ibv_get_async_event` on this context: the next event, waiting for one unless the
    /// program made `async_fd` non-blocking (then -1 with `errno` `EAGAIN` when none waits).
    ///
    /// # Safety
    /// `event` points to a writable `struct ibv_async_event`.
    pub(crate) unsafe fn take(&self, event: *mut ffi::ibv_async_event) -> c_int {
        let shared = &self.shared;
        loop {
            let mut count = 0u64;
            // SAFETY: reads 8 bytes into a live u64 from our eventfd; blocks unless the
            // program set O_NONBLOCK on it.
            let n = unsafe { libc::read(shared.fd, &mut count as *mut u64 as *mut c_void, 8) };
            if n != 8 {
                return -1;
            }
            let mut inner = shared.lock();
            // An event dropped with its object left its count behind: wait for the next one.
            let Some(Queued(e, reported)) = inner.queue.pop_front() else {
                continue;
            };
            // Counted under this lock: the object's destroy takes it to forget the object
            // (dropping its queued events), then waits for this count's acknowledgement.
            if let Some(r) = reported {
                r.0.fetch_add(1, Ordering::AcqRel);
            }
            drop(inner);
            // SAFETY: per the contract.
            unsafe { event.write(e) };
            return 0;
        }
    }

    /// Forgets `(kind, id)` and drops its queued events (its object is being destroyed).
    pub(crate) fn forget(&self, kind: Kind, id: u32) {
        let mut inner = self.shared.lock();
        let Some((p, _)) = inner.objects.remove(&(kind, id)) else {
            return;
        };
        inner.queue.retain(|Queued(e, _)| {
            // SAFETY: an event that is not a port event was made with a pointer member,
            // and every pointer member reads as the same address.
            is_port_event(e.event_type) || unsafe { e.element.qp } as usize != p
        });
    }
}

fn is_port_event(t: ffi::ibv_event_type) -> bool {
    matches!(
        t,
        ffi::IBV_EVENT_PORT_ACTIVE
            | ffi::IBV_EVENT_PORT_ERR
            | ffi::IBV_EVENT_LID_CHANGE
            | ffi::IBV_EVENT_PKEY_CHANGE
            | ffi::IBV_EVENT_SM_CHANGE
            | ffi::IBV_EVENT_CLIENT_REREGISTER
            | ffi::IBV_EVENT_GID_CHANGE
            | ffi::IBV_EVENT_DEVICE_FATAL
    )
}

/// The count of events an object was named in and the program took; what its destroy waits
/// for the acknowledgements of.
#[derive(Default, Clone)]
pub(crate) struct Reported(Arc<AtomicU32>);

impl From<u32> for Reported {
    fn from(n: u32) -> Self {
        Self(Arc::new(AtomicU32::new(n)))
    }
}

impl Reported {
    /// Waits, on the object header's mutex and condition variable, until `completed` (the
    /// header's acknowledged count, which `ibv_ack_async_event` raises under that mutex)
    /// covers every event reported.
    ///
    /// # Safety
    /// `mutex`, `cond` and `completed` are the live object header's.
    pub(crate) unsafe fn wait_acked(
        &self,
        mutex: *mut ffi::pthread_mutex_t,
        cond: *mut ffi::pthread_cond_t,
        completed: *const u32,
    ) {
        let (m, c) = (
            mutex as *mut libc::pthread_mutex_t,
            cond as *mut libc::pthread_cond_t,
        );
        // SAFETY: per the contract; `completed` is read under the mutex its writer holds.
        unsafe {
            libc::pthread_mutex_lock(m);
            while std::ptr::read_volatile(completed) < self.0.load(Ordering::Acquire) {
                libc::pthread_cond_wait(c, m);
            }
            libc::pthread_mutex_unlock(m);
        }
    }
}

/// Raises the acknowledged count of an object header and wakes a destroy waiting for it.
///
/// # Safety
/// All three are the live object header's.
unsafe fn ack(
    mutex: *mut ffi::pthread_mutex_t,
    cond: *mut ffi::pthread_cond_t,
    completed: *mut u32,
) {
    let (m, c) = (
        mutex as *mut libc::pthread_mutex_t,
        cond as *mut libc::pthread_cond_t,
    );
    // SAFETY: per the contract.
    unsafe {
        libc::pthread_mutex_lock(m);
        std::ptr::write_volatile(
            completed,
            std::ptr::read_volatile(completed).wrapping_add(1),
        );
        libc::pthread_cond_broadcast(c);
        libc::pthread_mutex_unlock(m);
    }
}

/// The kind of object an event type names.
fn kind_of(t: ffi::ibv_event_type) -> Option<Kind> {
    match t {
        ffi::IBV_EVENT_CQ_ERR => Some(Kind::Cq),
        ffi::IBV_EVENT_SRQ_ERR | ffi::IBV_EVENT_SRQ_LIMIT_REACHED => Some(Kind::Srq),
        ffi::IBV_EVENT_QP_FATAL
        | ffi::IBV_EVENT_QP_REQ_ERR
        | ffi::IBV_EVENT_QP_ACCESS_ERR
        | ffi::IBV_EVENT_COMM_EST
        | ffi::IBV_EVENT_SQ_DRAINED
        | ffi::IBV_EVENT_PATH_MIG
        | ffi::IBV_EVENT_PATH_MIG_ERR
        | ffi::IBV_EVENT_QP_LAST_WQE_REACHED => Some(Kind::Qp),
        _ => None,
    }
}

/// `ibv_ack_async_event`: the program is done with an event; a destroy of the object it
/// named may proceed once all of its events are acknowledged.
///
/// # Safety
/// `event` is an event `ibv_get_async_event` returned, acknowledged once.
#[no_mangle]
pub unsafe extern "C" fn ferroce_ibv_ack_async_event(event: *mut ffi::ibv_async_event) {
    // SAFETY: per the contract.
    let Some(e) = (unsafe { event.as_ref() }) else {
        return;
    };
    // SAFETY: the object an unacknowledged event names is alive (its destroy waits for
    // this); the union member its kind names.
    unsafe {
        match kind_of(e.event_type) {
            Some(Kind::Qp) => {
                let q = e.element.qp;
                ack(&mut (*q).mutex, &mut (*q).cond, &mut (*q).events_completed);
            }
            Some(Kind::Cq) => {
                let q = e.element.cq;
                ack(
                    &mut (*q).mutex,
                    &mut (*q).cond,
                    &mut (*q).async_events_completed,
                );
            }
            Some(Kind::Srq) => {
                let q = e.element.srq;
                ack(&mut (*q).mutex, &mut (*q).cond, &mut (*q).events_completed);
            }
            None => {}
        }
    }
}
symver!(ferroce_ibv_ack_async_event => "ibv_ack_async_event" @ "IBVERBS_1.1");

/// `ibv_event_type_str`: libibverbs' names.
#[no_mangle]
pub extern "C" fn ferroce_ibv_event_type_str(t: ffi::ibv_event_type) -> *const std::ffi::c_char {
    const NAMES: [&std::ffi::CStr; 20] = [
        c"CQ error",
        c"local work queue catastrophic error",
        c"invalid request local work queue error",
        c"local access violation work queue error",
        c"communication established",
        c"send queue drained",
        c"path migrated",
        c"path migration request error",
        c"local catastrophic error",
        c"port active",
        c"port error",
        c"LID change",
        c"P_Key change",
        c"SM change",
        c"SRQ catastrophic error",
        c"SRQ limit reached",
        c"last WQE reached",
        c"client reregistration",
        c"GID table change",
        c"WQ fatal",
    ];
    NAMES
        .get(t as usize)
        .copied()
        .unwrap_or(c"unknown")
        .as_ptr()
}
symver!(ferroce_ibv_event_type_str => "ibv_event_type_str" @ "IBVERBS_1.1");
