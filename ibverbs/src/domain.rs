//! Protection domains (`ibv_alloc_pd`), thread domains and parent domains (`ibv_alloc_td`,
//! `ibv_alloc_parent_domain`).
//!
//! A thread domain is a program's promise that the objects made with it are used from one
//! thread at a time, so a provider may drop its locks. ferroce's posting and polling paths
//! take no lock a promise could remove (posts go through lock-free queues), so a thread
//! domain asks nothing of it; it is kept only to be checked and counted. A parent domain is a
//! protection domain with a thread domain (and, optionally, the program's allocator for the
//! provider's queue buffers) attached: it is taken wherever a PD is, and stands for its
//! protection domain. ferroce's queues live in the engine, not in buffers a program could
//! place, so the allocator is accepted and never called.

use std::ffi::c_int;
use std::sync::atomic::{AtomicU32, Ordering};

use ferroce_verbs::ProtectionDomain;

use crate::context::context;
use crate::device::set_errno;
use crate::ffi;
use crate::objects::{forget_handle, free, object, publish, register_handle, HandleKind};

/// A protection domain, or a parent domain (which stands for its protection domain
/// wherever a PD is taken, see [`Parent`]).
#[repr(C)]
pub struct Pd {
    pub(crate) ibv: ffi::ibv_pd,
    pub(crate) pd: ProtectionDomain,
    /// Set on a parent domain: its thread domain and what the program gave it.
    pub(crate) parent: Option<Parent>,
    /// Parent domains made over this PD (it cannot be freed while one lives).
    pub(crate) children: std::sync::atomic::AtomicU32,
    /// Made by `ibv_import_pd`: a second handle on another context's PD.
    pub(crate) imported: bool,
}

/// Counts an object made in `pd` (an MR, MW, QP, SRQ, AH, WQ): `ibv_dealloc_pd` is `EBUSY`
/// until it goes, as the kernel refuses to free a PD that still has objects.
///
/// # Safety
/// `pd` is null or a live PD.
pub(crate) unsafe fn hold_pd(pd: *mut ffi::ibv_pd) {
    // SAFETY: per the contract.
    if let Some(p) = unsafe { object::<Pd, _>(pd) } {
        p.children.fetch_add(1, Ordering::AcqRel);
    }
}

/// Undoes [`hold_pd`] when the object goes.
///
/// # Safety
/// `pd` is null or a live PD that [`hold_pd`] counted the object in.
pub(crate) unsafe fn release_pd(pd: *mut ffi::ibv_pd) {
    // SAFETY: per the contract.
    if let Some(p) = unsafe { object::<Pd, _>(pd) } {
        p.children.fetch_sub(1, Ordering::AcqRel);
    }
}

/// `ibv_alloc_pd`.
///
/// # Safety
/// `ctx` is an open context.
#[no_mangle]
pub unsafe extern "C" fn ferroce_ibv_alloc_pd(ctx: *mut ffi::ibv_context) -> *mut ffi::ibv_pd {
    // SAFETY: per the contract.
    let Some(c) = (unsafe { context(ctx) }) else {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    };
    let pd = match c.verbs.try_alloc_pd() {
        Ok(pd) => pd,
        Err(e) => {
            set_errno(crate::service::errno(&e));
            return std::ptr::null_mut();
        }
    };
    let p: *mut ffi::ibv_pd = publish(Pd {
        ibv: ffi::ibv_pd {
            context: ctx,
            handle: 0,
        },
        pd,
        parent: None,
        children: std::sync::atomic::AtomicU32::new(0),
        imported: false,
    });
    // SAFETY: just made, not yet the program's.
    unsafe { (*p).handle = register_handle(HandleKind::Pd, p.cast()) };
    p
}
symver!(ferroce_ibv_alloc_pd => "ibv_alloc_pd" @ "IBVERBS_1.1");

/// `ibv_dealloc_pd` (also of a parent domain): `EBUSY` while a parent domain stands on it
/// or an object was made in it and not destroyed.
///
/// # Safety
/// `pd` came from `ibv_alloc_pd` (or `ibv_alloc_parent_domain`) and is not used again.
#[no_mangle]
pub unsafe extern "C" fn ferroce_ibv_dealloc_pd(pd: *mut ffi::ibv_pd) -> c_int {
    // SAFETY: per the contract.
    let Some(p) = (unsafe { object::<Pd, _>(pd) }) else {
        return libc::EINVAL;
    };
    if p.children.load(std::sync::atomic::Ordering::Acquire) != 0 {
        return libc::EBUSY;
    }
    if let Some(parent) = &p.parent {
        parent.release();
    }
    if !p.imported {
        forget_handle(p.ibv.handle);
    }
    // SAFETY: per the contract.
    unsafe { free::<Pd, _>(pd) }
}
symver!(ferroce_ibv_dealloc_pd => "ibv_dealloc_pd" @ "IBVERBS_1.1");

/// A thread domain.
#[repr(C)]
pub struct Td {
    pub(crate) ibv: ffi::ibv_td,
    /// Parent domains made with it (it cannot be freed while one lives).
    users: AtomicU32,
}

/// What a parent domain holds beside its protection domain.
pub struct Parent {
    /// The protection domain it stands for.
    pd: *mut ffi::ibv_pd,
    /// Its thread domain, if any.
    td: *mut ffi::ibv_td,
}

// SAFETY: the pointers name the program's live objects and are only read by verbs of this
// library, which the program may call from any thread.
unsafe impl Send for Parent {}
// SAFETY: as above.
unsafe impl Sync for Parent {}

impl Parent {
    /// The parent domain is being freed: its PD and thread domain are free to go.
    pub(crate) fn release(&self) {
        // SAFETY: both outlive the parent domain (their frees fail with EBUSY before).
        unsafe {
            if let Some(p) = object::<Pd, _>(self.pd) {
                p.children.fetch_sub(1, Ordering::AcqRel);
            }
            if let Some(t) = object::<Td, _>(self.td) {
                t.users.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }
}

/// The parent domain behind a PD pointer, if it is one.
///
/// # Safety
/// `pd` is null or a live PD of this library.
pub(crate) unsafe fn parent_of<'a>(pd: *mut ffi::ibv_pd) -> Option<&'a Parent> {
    // SAFETY: per the contract.
    unsafe { object::<Pd, _>(pd) }.and_then(|p| p.parent.as_ref())
}

/// `verbs_context.alloc_td` (the header's `ibv_alloc_td`).
pub(crate) unsafe extern "C" fn alloc_td(
    ctx: *mut ffi::ibv_context,
    attr: *mut ffi::ibv_td_init_attr,
) -> *mut ffi::ibv_td {
    // SAFETY: the inline wrapper passes the program's context and attributes.
    let (Some(_), Some(a)) = (unsafe { context(ctx) }, unsafe { attr.as_ref() }) else {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    };
    if a.comp_mask != 0 {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    }
    publish(Td {
        ibv: ffi::ibv_td { context: ctx },
        users: AtomicU32::new(0),
    })
}

/// `verbs_context.dealloc_td`: `EBUSY` while a parent domain uses it.
pub(crate) unsafe extern "C" fn dealloc_td(td: *mut ffi::ibv_td) -> c_int {
    // SAFETY: the inline wrapper passes the program's thread domain.
    let Some(t) = (unsafe { object::<Td, _>(td) }) else {
        return libc::EINVAL;
    };
    if t.users.load(Ordering::Acquire) != 0 {
        return libc::EBUSY;
    }
    // SAFETY: a live thread domain, not used again per libibverbs' contract.
    unsafe { free::<Td, _>(td) }
}

/// `verbs_context.alloc_parent_domain` (the header's `ibv_alloc_parent_domain`).
pub(crate) unsafe extern "C" fn alloc_parent_domain(
    ctx: *mut ffi::ibv_context,
    attr: *mut ffi::ibv_parent_domain_init_attr,
) -> *mut ffi::ibv_pd {
    // SAFETY: the inline wrapper passes the program's context and attributes.
    let (Some(_), Some(a)) = (unsafe { context(ctx) }, unsafe { attr.as_ref() }) else {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    };
    let known =
        ffi::IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS | ffi::IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT;
    if a.comp_mask & !known != 0 {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    }
    // SAFETY: null or the program's PD and thread domain.
    let (pd, td) = unsafe { (object::<Pd, _>(a.pd), object::<Td, _>(a.td)) };
    // A parent domain stands on a plain PD of the same context.
    let Some(pd) = pd.filter(|p| p.parent.is_none() && p.ibv.context == ctx) else {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    };
    if !a.td.is_null() && td.is_none_or(|t| t.ibv.context != ctx) {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    }
    pd.children.fetch_add(1, Ordering::AcqRel);
    if let Some(t) = td {
        t.users.fetch_add(1, Ordering::AcqRel);
    }
    publish(Pd {
        ibv: ffi::ibv_pd {
            context: ctx,
            handle: 0,
        },
        pd: pd.pd.clone(),
        parent: Some(Parent { pd: a.pd, td: a.td }),
        children: AtomicU32::new(0),
        imported: false,
    })
}
