//! Opening a device (`ibv_open_device`, `ibv_import_device`) and closing it.
//!
//! The context is an *extended* one, as every rdma-core provider's: `struct verbs_context`
//! with the program's `struct ibv_context` as its last field and `abi_compat` set to
//! libibverbs' marker, so the header's inline wrappers find the extended entry points
//! (`ibv_query_port` with the whole attribute structure, `ibv_query_device_ex`,
//! `ibv_create_cq_ex`, `ibv_create_qp_ex`, thread and parent domains, flow steering) in it.
//! An entry left null makes its inline wrapper fail with `EOPNOTSUPP`, as libibverbs does
//! for a provider without the feature. Opening a device starts its engine thread: a
//! perftest server blocks in a TCP read for the whole test, so nothing of the program's
//! drives the transport. This is the top of the library: the tables it installs name the
//! verbs of every module.

use std::ffi::{c_int, c_void};

use ferroce_verbs::Context as VerbsContext;

use crate::context::{context, Context};
use crate::device::{lookup, set_errno, Device};
use crate::events::AsyncEvents;
use crate::ffi;

/// The process's open contexts by the inode of their `cmd_fd` (a memfd, unique to the
/// context, and the same through a `dup` of it): what `ibv_import_device` finds one by.
static BY_CMD_FD: std::sync::LazyLock<std::sync::Mutex<std::collections::HashMap<u64, usize>>> =
    std::sync::LazyLock::new(Default::default);

/// The inode behind an fd.
fn inode(fd: c_int) -> Option<u64> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::zeroed();
    // SAFETY: fstat writes a whole `struct stat` into the zeroed storage, or fails.
    (unsafe { libc::fstat(fd, st.as_mut_ptr()) } == 0).then(|| {
        // SAFETY: written by a successful fstat.
        unsafe { st.assume_init() }.st_ino
    })
}

/// libibverbs' marker in `ibv_context.abi_compat` for an extended context
/// (`__VERBS_ABI_IS_EXTENDED`, `(void *)UINTPTR_MAX`).
const ABI_IS_EXTENDED: *mut c_void = usize::MAX as *mut c_void;

/// A context's `cmd_fd`: a memfd, whose inode names the context (see `BY_CMD_FD`). A
/// software RNIC takes no commands through it; programs only pass it around.
fn cmd_fd() -> c_int {
    // SAFETY: plain system call on a NUL-terminated name; -1 on failure, which programs
    // see as a closed fd.
    unsafe { libc::memfd_create(c"ferroce-context".as_ptr(), libc::MFD_CLOEXEC) }
}

/// The extended entry points of every context.
fn extended_ops(ibv: ffi::ibv_context) -> ffi::verbs_context {
    ffi::verbs_context {
        query_port: Some(crate::context::query_port_ex),
        query_device_ex: Some(crate::caps::query_device_ex),
        query_rt_values: Some(crate::caps::query_rt_values),
        sz: size_of::<ffi::verbs_context>(),
        context: ibv,
        ..Default::default()
    }
}

/// `ibv_open_device`: opens the ferroce device and starts its engine thread. Null with
/// `errno` set when the device cannot be opened (its message goes to stderr: a missing
/// interface or missing privileges is something the user must fix).
///
/// # Safety
/// `dev` is null or a device from `ibv_get_device_list`.
#[no_mangle]
pub unsafe extern "C" fn ferroce_ibv_open_device(
    dev: *mut ffi::ibv_device,
) -> *mut ffi::ibv_context {
    let Some(d) = lookup(dev) else {
        set_errno(libc::ENODEV);
        return std::ptr::null_mut();
    };
    let verbs = match d.open() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("ferroce: cannot open {}: {e}", d.spec);
            set_errno(libc::ENODEV);
            return std::ptr::null_mut();
        }
    };
    if let Err(e) = verbs.start_engine_thread() {
        eprintln!("ferroce: {}: {e}", d.spec);
        set_errno(libc::EIO);
        return std::ptr::null_mut();
    }
    let events = match AsyncEvents::new(d, &verbs) {
        Ok(e) => e,
        Err(errno) => {
            if !d.is_shared() {
                verbs.stop_engine_thread();
            }
            set_errno(errno);
            return std::ptr::null_mut();
        }
    };
    let ibv = ffi::ibv_context {
        device: dev,
        cmd_fd: cmd_fd(),
        async_fd: events.fd(),
        num_comp_vectors: 1,
        ops: crate::ops::table(),
        abi_compat: ABI_IS_EXTENDED,
        ..Default::default()
    };
    let mut vctx = extended_ops(ibv);
    install(&mut vctx);
    // SAFETY: initializing a zeroed mutex in place before anyone can see it.
    unsafe {
        libc::pthread_mutex_init(
            &mut vctx.context.mutex as *mut _ as *mut libc::pthread_mutex_t,
            std::ptr::null(),
        )
    };
    publish_context(vctx, verbs, d, events, false)
}

/// Makes a context the program holds.
fn publish_context(
    vctx: ffi::verbs_context,
    verbs: VerbsContext,
    dev: &'static Device,
    events: AsyncEvents,
    imported: bool,
) -> *mut ffi::ibv_context {
    let fd = vctx.context.cmd_fd;
    let ctx = Box::into_raw(Box::new(Context {
        vctx,
        verbs,
        dev,
        events,
        imported,
    }));
    // SAFETY: just made; it lives until `ibv_close_device`.
    let ctx = unsafe { &*ctx };
    ctx.events.attach(ctx.ibv());
    if !imported {
        if let Some(ino) = inode(fd) {
            BY_CMD_FD
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(ino, ctx as *const Context as usize);
        }
    }
    ctx.ibv()
}
symver!(ferroce_ibv_open_device => "ibv_open_device" @ "IBVERBS_1.1");

/// `ibv_close_device`: stops the engine thread and frees the context.
///
/// # Safety
/// `ctx` came from `ibv_open_device` and is not used again.
#[no_mangle]
pub unsafe extern "C" fn ferroce_ibv_close_device(ctx: *mut ffi::ibv_context) -> c_int {
    // SAFETY: per the contract.
    let Some(c) = (unsafe { context(ctx) }) else {
        return libc::EINVAL;
    };
    // SAFETY: per the contract, `c` is a `Context` from `Box::into_raw`, closed once.
    let c = unsafe { Box::from_raw(c as *const Context as *mut Context) };
    c.events.detach();
    if !c.imported {
        if let Some(ino) = inode(c.vctx.context.cmd_fd) {
            BY_CMD_FD
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&ino);
        }
    }
    // A shared device outlives its contexts (its port is the process's, see
    // `Device::open`); an imported context is a second handle on another's device.
    if !c.dev.is_shared() && !c.imported {
        c.verbs.stop_engine_thread();
    }
    if c.vctx.context.cmd_fd >= 0 {
        // SAFETY: the context's own fd, closed once (the async fd is closed with `events`).
        unsafe { libc::close(c.vctx.context.cmd_fd) };
    }
    0
}
symver!(ferroce_ibv_close_device => "ibv_close_device" @ "IBVERBS_1.1");

/// `ibv_import_device`: another context on the device of the context whose `cmd_fd` this
/// is (or a `dup` of it), in this process; it takes `cmd_fd` as its own and closes it. Its
/// PDs and MRs are reached with `ibv_import_pd` / `ibv_import_mr`. A context of another
/// process cannot be imported (its engine is in that process; `EOPNOTSUPP`).
#[no_mangle]
pub extern "C" fn ferroce_ibv_import_device(cmd_fd: c_int) -> *mut ffi::ibv_context {
    let found = inode(cmd_fd).and_then(|ino| {
        BY_CMD_FD
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&ino)
            .copied()
    });
    let Some(orig) = found else {
        set_errno(if inode(cmd_fd).is_some() {
            libc::EOPNOTSUPP
        } else {
            libc::EBADF
        });
        return std::ptr::null_mut();
    };
    // SAFETY: registered contexts are live until their close removes them, which takes
    // the registry's lock; reading a few fields here races no close that matters to a
    // program importing a context it is closing.
    let o = unsafe { &*(orig as *const Context) };
    let verbs = o.verbs.clone();
    let events = match AsyncEvents::new(o.dev, &verbs) {
        Ok(e) => e,
        Err(errno) => {
            set_errno(errno);
            return std::ptr::null_mut();
        }
    };
    let mut vctx = extended_ops(ffi::ibv_context {
        device: o.vctx.context.device,
        cmd_fd,
        async_fd: events.fd(),
        num_comp_vectors: o.vctx.context.num_comp_vectors,
        ops: crate::ops::table(),
        abi_compat: ABI_IS_EXTENDED,
        ..Default::default()
    });
    install(&mut vctx);
    // SAFETY: initializing a zeroed mutex in place before anyone can see it.
    unsafe {
        libc::pthread_mutex_init(
            &mut vctx.context.mutex as *mut _ as *mut libc::pthread_mutex_t,
            std::ptr::null(),
        )
    };
    publish_context(vctx, verbs, o.dev, events, true)
}
symver!(ferroce_ibv_import_device => "ibv_import_device" @ "IBVERBS_1.10");

/// Fills the extended entry points of a new context.
pub(crate) fn install(v: &mut ffi::verbs_context) {
    v.create_cq_ex = Some(crate::cq::create_cq_ex);
    v.create_qp_ex = Some(crate::qp::create::create_qp_ex);
    v.create_srq_ex = Some(crate::srq::create_srq_ex);
    v.get_srq_num = Some(crate::srq::get_srq_num);
    v.post_srq_ops = Some(crate::srq::post_srq_ops);
    v.alloc_td = Some(crate::domain::alloc_td);
    v.dealloc_td = Some(crate::domain::dealloc_td);
    v.alloc_parent_domain = Some(crate::domain::alloc_parent_domain);
    v.advise_mr = Some(crate::mr::advise_mr);
    v.ibv_create_flow = Some(crate::flow::create_flow);
    v.ibv_destroy_flow = Some(crate::flow::destroy_flow);
    v.create_wq = Some(crate::wq::create_wq);
    v.modify_wq = Some(crate::wq::modify_wq);
    v.destroy_wq = Some(crate::wq::destroy_wq);
    v.create_rwq_ind_table = Some(crate::wq::create_rwq_ind_table);
    v.destroy_rwq_ind_table = Some(crate::wq::destroy_rwq_ind_table);
}
