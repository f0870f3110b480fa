//! Protection domains, memory regions, completion channels and queues, shared receive queues
//! and address handles. Each is the header's structure (what the program reads fields of)
//! followed by the ferroce object behind it, boxed; the program's pointer is the box's.

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ferroce_stack::transport::{Access, AddressVector};
use ferroce_verbs::{
    CompletionChannel, CompletionQueue, Gid, MemoryRegion, ProtectionDomain, SharedReceiveQueue,
};

use crate::context::{context, Context};
use crate::device::set_errno;
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
unsafe fn destroy<T, H>(p: *mut H) -> Option<Box<T>> {
    // SAFETY: per the contract.
    (!p.is_null()).then(|| unsafe { Box::from_raw(p as *mut T) })
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

/// A protection domain.
#[repr(C)]
pub struct Pd {
    pub(crate) ibv: ffi::ibv_pd,
    pub(crate) pd: ProtectionDomain,
}

/// The context behind an object's `context` field.
///
/// # Safety
/// `ctx` is the `context` field of a live object of this library.
pub(crate) unsafe fn owner<'a>(ctx: *mut ffi::ibv_context) -> &'a Context {
    // SAFETY: objects are only made with a live context, which outlives them.
    unsafe { context(ctx) }.expect("object without a context")
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
    publish(Pd {
        ibv: ffi::ibv_pd {
            context: ctx,
            handle: 0,
        },
        pd: c.verbs.alloc_pd(),
    })
}
symver!(ferroce_ibv_alloc_pd => "ibv_alloc_pd" @ "IBVERBS_1.1");

/// `ibv_dealloc_pd`.
///
/// # Safety
/// `pd` came from `ibv_alloc_pd` and is not used again.
#[no_mangle]
pub unsafe extern "C" fn ferroce_ibv_dealloc_pd(pd: *mut ffi::ibv_pd) -> c_int {
    // SAFETY: per the contract.
    unsafe { free::<Pd, _>(pd) }
}
symver!(ferroce_ibv_dealloc_pd => "ibv_dealloc_pd" @ "IBVERBS_1.1");

/// A registered memory region.
#[repr(C)]
pub struct Mr {
    pub(crate) ibv: ffi::ibv_mr,
    _mr: MemoryRegion,
}

/// The rights ferroce enforces; the other `IBV_ACCESS_*` bits (relaxed ordering, on-demand
/// paging, huge pages, memory windows) ask nothing of a software RNIC.
const ACCESS_BITS: u32 = 0xf;

fn reg(
    pd: *mut ffi::ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_int,
) -> *mut ffi::ibv_mr {
    // SAFETY: `pd` is null or a live PD (the caller's contract).
    let Some(p) = (unsafe { object::<Pd, _>(pd) }) else {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    };
    let access = access as u32;
    let iova = if access & ffi::IBV_ACCESS_ZERO_BASED != 0 {
        0
    } else {
        iova
    };
    // SAFETY: the program registers memory it owns and keeps valid until `ibv_dereg_mr`, as
    // libibverbs requires of it.
    let mr = unsafe {
        p.pd.reg_mr_iova(addr as *mut u8, length, iova, Access(access & ACCESS_BITS))
    };
    match mr {
        Ok(mr) => publish(Mr {
            ibv: ffi::ibv_mr {
                context: p.ibv.context,
                pd,
                addr,
                length,
                handle: 0,
                lkey: mr.lkey(),
                rkey: mr.rkey(),
            },
            _mr: mr,
        }),
        Err(e) => {
            eprintln!("ferroce: ibv_reg_mr: {e}");
            set_errno(libc::EINVAL);
            std::ptr::null_mut()
        }
    }
}

/// `ibv_reg_mr`: the region is addressed by its virtual address.
///
/// # Safety
/// `pd` is a live PD; `addr .. addr + length` stays valid until `ibv_dereg_mr`.
#[no_mangle]
pub unsafe extern "C" fn ferroce_ibv_reg_mr(
    pd: *mut ffi::ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> *mut ffi::ibv_mr {
    reg(pd, addr, length, addr as u64, access)
}
symver!(ferroce_ibv_reg_mr => "ibv_reg_mr" @ "IBVERBS_1.1");

/// `ibv_reg_mr_iova2` (what the header's `ibv_reg_mr` calls for some flags): addressed
/// as `iova`.
///
/// # Safety
/// As `ibv_reg_mr`.
#[no_mangle]
pub unsafe extern "C" fn ferroce_ibv_reg_mr_iova2(
    pd: *mut ffi::ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: u32,
) -> *mut ffi::ibv_mr {
    reg(pd, addr, length, iova, access as c_int)
}
symver!(ferroce_ibv_reg_mr_iova2 => "ibv_reg_mr_iova2" @ "IBVERBS_1.8");

/// `ibv_reg_mr_iova`.
///
/// # Safety
/// As `ibv_reg_mr`.
#[no_mangle]
pub unsafe extern "C" fn ferroce_ibv_reg_mr_iova(
    pd: *mut ffi::ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_int,
) -> *mut ffi::ibv_mr {
    reg(pd, addr, length, iova, access)
}
symver!(ferroce_ibv_reg_mr_iova => "ibv_reg_mr_iova" @ "IBVERBS_1.7");

/// `ibv_dereg_mr`: the keys stop working at once; a later access by a peer fails with a
/// remote access error.
///
/// # Safety
/// `mr` came from `ibv_reg_mr` and is not used again.
#[no_mangle]
pub unsafe extern "C" fn ferroce_ibv_dereg_mr(mr: *mut ffi::ibv_mr) -> c_int {
    // SAFETY: per the contract.
    unsafe { free::<Mr, _>(mr) }
}
symver!(ferroce_ibv_dereg_mr => "ibv_dereg_mr" @ "IBVERBS_1.1");

/// A completion channel. Its fd is an eventfd in semaphore mode: the engine adds one per
/// event, `ibv_get_cq_event` reads one (blocking unless the program made the fd
/// non-blocking), so `poll()` on the fd works as with the kernel's channel.
#[repr(C)]
pub struct Channel {
    pub(crate) ibv: ffi::ibv_comp_channel,
    pub(crate) ch: CompletionChannel,
    /// The fd the notifier writes to; -1 once the channel is destroyed.
    fd: Arc<AtomicI32>,
    /// The CQs on this channel, by ferroce CQ id.
    cqs: Mutex<HashMap<u32, usize>>,
}

/// `ibv_create_comp_channel`.
///
/// # Safety
/// `ctx` is an open context.
#[no_mangle]
pub unsafe extern "C" fn ferroce_ibv_create_comp_channel(
    ctx: *mut ffi::ibv_context,
) -> *mut ffi::ibv_comp_channel {
    // SAFETY: per the contract.
    let Some(c) = (unsafe { context(ctx) }) else {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    };
    // SAFETY: plain system call.
    let raw = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_SEMAPHORE) };
    if raw < 0 {
        return std::ptr::null_mut();
    }
    let ch = c.verbs.create_comp_channel();
    let fd = Arc::new(AtomicI32::new(raw));
    let notify_fd = fd.clone();
    ch.set_notify(Box::new(move || {
        let fd = notify_fd.load(Ordering::Acquire);
        if fd >= 0 {
            let one = 1u64;
            // SAFETY: writes 8 bytes from a live u64 to the channel's eventfd.
            unsafe { libc::write(fd, &one as *const u64 as *const c_void, 8) };
        }
    }));
    publish(Channel {
        ibv: ffi::ibv_comp_channel {
            context: ctx,
            fd: raw,
            refcnt: 0,
        },
        ch,
        fd,
        cqs: Mutex::new(HashMap::new()),
    })
}
symver!(ferroce_ibv_create_comp_channel => "ibv_create_comp_channel" @ "IBVERBS_1.0");

/// `ibv_destroy_comp_channel`: EBUSY while CQs still use it.
///
/// # Safety
/// `channel` came from `ibv_create_comp_channel` and is not used again.
#[no_mangle]
pub unsafe extern "C" fn ferroce_ibv_destroy_comp_channel(
    channel: *mut ffi::ibv_comp_channel,
) -> c_int {
    // SAFETY: per the contract.
    let Some(ch) = (unsafe { object::<Channel, _>(channel) }) else {
        return libc::EINVAL;
    };
    if !ch.cqs.lock().unwrap_or_else(|e| e.into_inner()).is_empty() {
        return libc::EBUSY;
    }
    // SAFETY: per the contract; checked non-null above.
    let ch = unsafe { destroy::<Channel, _>(channel) }.expect("non-null");
    let fd = ch.fd.swap(-1, Ordering::AcqRel);
    // SAFETY: our own eventfd, closed once.
    unsafe { libc::close(fd) };
    0
}
symver!(ferroce_ibv_destroy_comp_channel => "ibv_destroy_comp_channel" @ "IBVERBS_1.0");

/// A completion queue.
#[repr(C)]
pub struct Cq {
    pub(crate) ibv: ffi::ibv_cq,
    pub(crate) cq: CompletionQueue,
}

/// `ibv_create_cq`.
///
/// # Safety
/// `ctx` is an open context; `channel` is null or a live channel of it.
#[no_mangle]
pub unsafe extern "C" fn ferroce_ibv_create_cq(
    ctx: *mut ffi::ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ffi::ibv_comp_channel,
    _comp_vector: c_int,
) -> *mut ffi::ibv_cq {
    // SAFETY: per the contract.
    let (Some(c), ch) = (unsafe { context(ctx) }, unsafe {
        object::<Channel, _>(channel)
    }) else {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    };
    let max = c.verbs.query_device().max_cqe;
    if cqe < 1 || cqe as u32 > max {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    }
    let cq = c.verbs.create_cq(cqe as usize, ch.map(|ch| &ch.ch));
    let id = cq.id();
    let mut ibv = ffi::ibv_cq {
        context: ctx,
        channel,
        cq_context,
        cqe,
        ..Default::default()
    };
    // SAFETY: fresh, unshared storage.
    unsafe { init_sync(&mut ibv.mutex, &mut ibv.cond) };
    let p: *mut ffi::ibv_cq = publish(Cq { ibv, cq });
    if let Some(ch) = ch {
        ch.cqs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, p as usize);
    }
    p
}
symver!(ferroce_ibv_create_cq => "ibv_create_cq" @ "IBVERBS_1.1");

/// `ibv_destroy_cq`.
///
/// # Safety
/// `cq` came from `ibv_create_cq`, no QP uses it any more, and it is not used again.
#[no_mangle]
pub unsafe extern "C" fn ferroce_ibv_destroy_cq(cq: *mut ffi::ibv_cq) -> c_int {
    // SAFETY: per the contract.
    let Some(c) = (unsafe { destroy::<Cq, _>(cq) }) else {
        return libc::EINVAL;
    };
    // SAFETY: the channel outlives its CQs (destroying it first fails with EBUSY).
    if let Some(ch) = unsafe { object::<Channel, _>(c.ibv.channel) } {
        ch.cqs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&c.cq.id());
    }
    0
}
symver!(ferroce_ibv_destroy_cq => "ibv_destroy_cq" @ "IBVERBS_1.1");

/// `ibv_get_cq_event`: the next CQ whose notification fired.
///
/// # Safety
/// `channel` is a live channel; `cq` and `cq_context` point to writable pointers.
#[no_mangle]
pub unsafe extern "C" fn ferroce_ibv_get_cq_event(
    channel: *mut ffi::ibv_comp_channel,
    cq: *mut *mut ffi::ibv_cq,
    cq_context: *mut *mut c_void,
) -> c_int {
    // SAFETY: per the contract.
    let Some(ch) = (unsafe { object::<Channel, _>(channel) }) else {
        set_errno(libc::EINVAL);
        return -1;
    };
    let mut count = 0u64;
    // SAFETY: reads 8 bytes into a live u64 from the channel's eventfd; blocks unless the
    // program made the fd non-blocking, as the kernel's channel does.
    let n = unsafe { libc::read(ch.ibv.fd, &mut count as *mut u64 as *mut c_void, 8) };
    if n != 8 {
        return -1;
    }
    // The notifier queues the event before it writes the fd.
    let Some(id) = ch.ch.get_event(Duration::from_secs(1)) else {
        set_errno(libc::EIO);
        return -1;
    };
    let found = ch
        .cqs
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&id)
        .copied();
    let Some(p) = found else {
        // The CQ was destroyed after its event fired.
        set_errno(libc::EAGAIN);
        return -1;
    };
    let p = p as *mut ffi::ibv_cq;
    // SAFETY: `p` is a live CQ (in the channel's table); the out-pointers per the contract.
    unsafe {
        *cq = p;
        *cq_context = (*p).cq_context;
    }
    0
}
symver!(ferroce_ibv_get_cq_event => "ibv_get_cq_event" @ "IBVERBS_1.1");

/// `ibv_ack_cq_events`.
///
/// # Safety
/// `cq` is a live CQ.
#[no_mangle]
pub unsafe extern "C" fn ferroce_ibv_ack_cq_events(cq: *mut ffi::ibv_cq, nevents: u32) {
    if !cq.is_null() {
        // SAFETY: a live CQ's header; programs acknowledge from one thread at a time, as
        // libibverbs' own counter (under its mutex) assumes of them anyway.
        unsafe { (*cq).comp_events_completed = (*cq).comp_events_completed.wrapping_add(nevents) };
    }
}
symver!(ferroce_ibv_ack_cq_events => "ibv_ack_cq_events" @ "IBVERBS_1.1");

/// A shared receive queue.
#[repr(C)]
pub struct Srq {
    pub(crate) ibv: ffi::ibv_srq,
    pub(crate) srq: SharedReceiveQueue,
}

/// `ibv_create_srq`; the attributes are written back with what was granted.
///
/// # Safety
/// `pd` is a live PD; `attr` points to a `struct ibv_srq_init_attr`.
#[no_mangle]
pub unsafe extern "C" fn ferroce_ibv_create_srq(
    pd: *mut ffi::ibv_pd,
    attr: *mut ffi::ibv_srq_init_attr,
) -> *mut ffi::ibv_srq {
    // SAFETY: per the contract.
    let (Some(p), Some(a)) = (unsafe { object::<Pd, _>(pd) }, unsafe { attr.as_mut() }) else {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    };
    // SAFETY: PDs are made with a live context.
    let dev = unsafe { owner(p.ibv.context) }.verbs.query_device();
    if a.attr.max_wr > dev.max_qp_wr || a.attr.max_sge > dev.max_sge {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    }
    let max_wr = a.attr.max_wr.max(1);
    let max_sge = a.attr.max_sge.max(1);
    a.attr.max_wr = max_wr;
    a.attr.max_sge = max_sge;
    let mut ibv = ffi::ibv_srq {
        context: p.ibv.context,
        srq_context: a.srq_context,
        pd,
        ..Default::default()
    };
    // SAFETY: fresh, unshared storage.
    unsafe { init_sync(&mut ibv.mutex, &mut ibv.cond) };
    publish(Srq {
        ibv,
        srq: p.pd.create_srq(max_wr, max_sge),
    })
}
symver!(ferroce_ibv_create_srq => "ibv_create_srq" @ "IBVERBS_1.1");

/// `ibv_destroy_srq`.
///
/// # Safety
/// `srq` came from `ibv_create_srq` and is not used again.
#[no_mangle]
pub unsafe extern "C" fn ferroce_ibv_destroy_srq(srq: *mut ffi::ibv_srq) -> c_int {
    // SAFETY: per the contract.
    unsafe { free::<Srq, _>(srq) }
}
symver!(ferroce_ibv_destroy_srq => "ibv_destroy_srq" @ "IBVERBS_1.1");

/// An address handle: where UD sends go.
#[repr(C)]
pub struct Ah {
    pub(crate) ibv: ffi::ibv_ah,
    pub(crate) av: AddressVector,
}

/// The path an `ibv_ah_attr` names: RoCE needs the GRH (its GID is the peer's address); the
/// MAC comes from the neighbour table. Err holds the errno.
pub(crate) fn path_of(c: &Context, a: &ffi::ibv_ah_attr) -> Result<AddressVector, c_int> {
    if a.is_global == 0 {
        eprintln!(
            "ferroce: RoCE needs a GRH (is_global = 1 and the peer's GID; ibv_*_pingpong: -g 0)"
        );
        return Err(libc::EINVAL);
    }
    // Port 0 in an address handle means port 1 (libibverbs programs leave it unset).
    let port = a.port_num.max(1);
    if c.verbs.query_port_num(port).is_err() || a.grh.sgid_index != 0 {
        return Err(libc::EINVAL);
    }
    // SAFETY: every 16-byte pattern is a valid `raw` view of the union.
    let gid = Gid(unsafe { a.grh.dgid.raw });
    let ip = gid.ip();
    let own = (1..=c.verbs.query_device().phys_port_cnt)
        .find(|&p| c.verbs.query_gid_on(p, 0).ok() == Some(Gid::from_ip(ip)));
    let mac = if let Some(p) = own {
        c.verbs.port_mac(p).ok()
    } else {
        crate::neigh::configured(ip).or_else(|| {
            crate::neigh::interface_of(&c.dev.spec, port).and_then(|i| crate::neigh::resolve(i, ip))
        })
    };
    let Some(mac) = mac else {
        eprintln!(
            "ferroce: cannot find the MAC address of {ip} on {} (give it as FERROCE_NEIGH={ip}=MAC)",
            c.dev.spec
        );
        return Err(libc::EHOSTUNREACH);
    };
    let mut av = c.verbs.path_on(port, gid, mac).map_err(|_| libc::EINVAL)?;
    av.hop_limit = a.grh.hop_limit;
    av.traffic_class = a.grh.traffic_class;
    av.flow_label = a.grh.flow_label;
    Ok(av)
}

/// `ibv_create_ah`.
///
/// # Safety
/// `pd` is a live PD; `attr` points to a `struct ibv_ah_attr`.
#[no_mangle]
pub unsafe extern "C" fn ferroce_ibv_create_ah(
    pd: *mut ffi::ibv_pd,
    attr: *mut ffi::ibv_ah_attr,
) -> *mut ffi::ibv_ah {
    // SAFETY: per the contract.
    let (Some(p), Some(a)) = (unsafe { object::<Pd, _>(pd) }, unsafe { attr.as_ref() }) else {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    };
    // SAFETY: PDs are made with a live context.
    let c = unsafe { owner(p.ibv.context) };
    match path_of(c, a) {
        Ok(av) => publish(Ah {
            ibv: ffi::ibv_ah {
                context: p.ibv.context,
                pd,
                handle: 0,
            },
            av,
        }),
        Err(e) => {
            set_errno(e);
            std::ptr::null_mut()
        }
    }
}
symver!(ferroce_ibv_create_ah => "ibv_create_ah" @ "IBVERBS_1.1");

/// `ibv_create_ah_from_wc`: a handle back to the sender of a UD receive, from the GRH area
/// at the start of its buffer (for RoCEv2 over IPv4 the IPv4 header sits in its last 20
/// bytes; over IPv6 the IPv6 header fills it).
///
/// # Safety
/// `pd` is a live PD; `wc` a completion; `grh` the 40 bytes the receive started with.
#[no_mangle]
pub unsafe extern "C" fn ferroce_ibv_create_ah_from_wc(
    pd: *mut ffi::ibv_pd,
    wc: *mut ffi::ibv_wc,
    grh: *mut ffi::ibv_grh,
    port_num: u8,
) -> *mut ffi::ibv_ah {
    // SAFETY: per the contract.
    let (Some(w), false) = (unsafe { wc.as_ref() }, grh.is_null()) else {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    };
    if w.wc_flags & ffi::IBV_WC_GRH == 0 {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    }
    // SAFETY: the GRH area is 40 readable bytes per the contract.
    let raw = unsafe { std::slice::from_raw_parts(grh as *const u8, 40) };
    let src: std::net::IpAddr = if raw[20] >> 4 == 4 {
        std::net::Ipv4Addr::new(raw[32], raw[33], raw[34], raw[35]).into()
    } else {
        let mut a = [0u8; 16];
        a.copy_from_slice(&raw[8..24]);
        std::net::Ipv6Addr::from(a).into()
    };
    let mut attr = ffi::ibv_ah_attr {
        is_global: 1,
        port_num,
        ..Default::default()
    };
    attr.grh.dgid.raw = Gid::from_ip(src).0;
    attr.grh.hop_limit = 64;
    // SAFETY: `attr` is a live local; `pd` per the contract.
    unsafe { ferroce_ibv_create_ah(pd, &mut attr) }
}
symver!(ferroce_ibv_create_ah_from_wc => "ibv_create_ah_from_wc" @ "IBVERBS_1.1");

/// `ibv_destroy_ah`.
///
/// # Safety
/// `ah` came from `ibv_create_ah` and is not used again.
#[no_mangle]
pub unsafe extern "C" fn ferroce_ibv_destroy_ah(ah: *mut ffi::ibv_ah) -> c_int {
    // SAFETY: per the contract.
    unsafe { free::<Ah, _>(ah) }
}
symver!(ferroce_ibv_destroy_ah => "ibv_destroy_ah" @ "IBVERBS_1.1");
