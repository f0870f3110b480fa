//! How this library's objects meet programs. Each object is the header's structure (what the program reads fields of) followed by the
//! ferroce object behind it, boxed; the program's pointer is the box's.

use std::ffi::c_int;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::ffi;

/// The object of type `T` whose header structure `p` points to.
///
/// # Safety
/// `p` is null or came from this library as a `T` (header first) that was not destroyed.
pub(crate) unsafe fn object<'a, T, H>(p: *mut H) -> Option<&'a T> {
    // SAFETY: per the contract, a non-null `p` is the first field of a live `T`.
    unsafe { (p as *const T).as_ref() }
}

/// Frees an object made by [`publish`].
///
/// # Safety
/// `p` came from [`publish`] as a `T` and is not used again.
pub(crate) unsafe fn destroy<T, H>(p: *mut H) -> Option<Box<T>> {
    // SAFETY: per the contract.
    (!p.is_null()).then(|| {
        LIVE.fetch_sub(1, Ordering::Relaxed);
        // SAFETY: per the contract.
        unsafe { Box::from_raw(p as *mut T) }
    })
}

/// Objects handed out by [`publish`] and not yet destroyed.
static LIVE: AtomicUsize = AtomicUsize::new(0);

/// How many objects (PDs, MRs, CQs, QPs, ...; not contexts) the process holds: what a test
/// that creates and destroys objects checks comes back to where it was.
pub fn live_objects() -> usize {
    LIVE.load(Ordering::Relaxed)
}

/// A destroy verb: frees the object, 0; EINVAL for a null pointer.
///
/// # Safety
/// As [`destroy`].
pub(crate) unsafe fn free<T, H>(p: *mut H) -> c_int {
    // SAFETY: per the contract.
    match unsafe { destroy::<T, H>(p) } {
        Some(_) => 0,
        None => libc::EINVAL,
    }
}

/// Hands an object to the program as a pointer to its header.
pub(crate) fn publish<T, H>(obj: T) -> *mut H {
    LIVE.fetch_add(1, Ordering::Relaxed);
    Box::into_raw(Box::new(obj)) as *mut H
}

/// Initializes the pthread mutex and condition variable of an object header in place, as
/// libibverbs does (programs never touch them, but a copy of libibverbs code might).
///
/// # Safety
/// Both point to zeroed, unshared storage of their types.
pub(crate) unsafe fn init_sync(mutex: *mut ffi::pthread_mutex_t, cond: *mut ffi::pthread_cond_t) {
    // SAFETY: per the contract.
    unsafe {
        libc::pthread_mutex_init(mutex as *mut libc::pthread_mutex_t, std::ptr::null());
        libc::pthread_cond_init(cond as *mut libc::pthread_cond_t, std::ptr::null());
    }
}

/// What an object handle (`ibv_pd.handle`, `ibv_mr.handle`) names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum HandleKind {
    Pd,
    Mr,
}

/// Handles of the process's PDs and MRs, by number: what `ibv_import_pd` and
/// `ibv_import_mr` find an object of another context by.
static HANDLES: std::sync::LazyLock<
    std::sync::Mutex<std::collections::HashMap<u32, (HandleKind, usize)>>,
> = std::sync::LazyLock::new(Default::default);

/// The next handle (never 0).
fn next_handle() -> u32 {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// Enters object `ptr` of `kind` under a new handle, which it returns.
pub(crate) fn register_handle(kind: HandleKind, ptr: *mut std::ffi::c_void) -> u32 {
    let h = next_handle();
    HANDLES
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(h, (kind, ptr as usize));
    h
}

/// Forgets a handle (its object is destroyed).
pub(crate) fn forget_handle(h: u32) {
    HANDLES.lock().unwrap_or_else(|e| e.into_inner()).remove(&h);
}

/// The object of `kind` handle `h` names, if any.
pub(crate) fn handle_object(kind: HandleKind, h: u32) -> Option<usize> {
    HANDLES
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&h)
        .filter(|(k, _)| *k == kind)
        .map(|&(_, p)| p)
}
