//! Completion channels and completion queues.

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ferroce_stack::transport::WcFlags;
use ferroce_verbs::{CompletionChannel, CompletionQueue, WorkCompletion};

use crate::context::{context, Context};
use crate::device::set_errno;
use crate::events::{Kind, Reported};
use crate::ffi;
use crate::objects::{destroy, init_sync, object, publish};

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
    let ch = match c.verbs.try_create_comp_channel() {
        Ok(ch) => ch,
        Err(e) => {
            set_errno(crate::service::errno(&e));
            return std::ptr::null_mut();
        }
    };
    // Through a service, the channel's fd is the one the service writes (a second handle
    // on it, which this library closes).
    let raw = match ch.remote_fd() {
        // SAFETY: plain system call on a live descriptor.
        Some(fd) => unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) },
        // SAFETY: plain system call.
        None => unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_SEMAPHORE) },
    };
    if raw < 0 {
        return std::ptr::null_mut();
    }
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

/// A completion queue. Every CQ is an extended one (`struct ibv_cq_ex`, whose first part is
/// `struct ibv_cq`): `ibv_poll_cq` reaches it through the context's ops table, and the
/// header's `ibv_start_poll` / `ibv_next_poll` / `ibv_wc_read_*` through the entry points in
/// the header, the same for a CQ from `ibv_create_cq` and one from `ibv_create_cq_ex`.
#[repr(C)]
pub struct Cq {
    pub(crate) ibv: ffi::ibv_cq_ex,
    pub(crate) cq: CompletionQueue,
    /// Asynchronous events that named it and were taken.
    pub(crate) async_reported: Reported,
    /// Completion events taken from its channel.
    comp_reported: AtomicU32,
    /// QPs using it (it cannot be destroyed while any does).
    pub(crate) users: AtomicU32,
    /// The completion an extended poll is at, with its timestamp.
    current: Mutex<Option<(WorkCompletion, u64)>>,
    /// The device clock's zero on the wall clock (ns since the epoch), for
    /// `ibv_wc_read_completion_wallclock_ns`.
    wall_zero: u64,
}

/// The CQ of a live CQ pointer.
///
/// # Safety
/// `cq` is a live CQ of this library.
pub(crate) unsafe fn cq_of<'a>(cq: *mut ffi::ibv_cq) -> &'a Cq {
    // SAFETY: per the contract.
    unsafe { &*(cq as *const Cq) }
}

/// The CQ behind an extended CQ pointer.
///
/// # Safety
/// As [`cq_of`].
unsafe fn ex<'a>(cq: *mut ffi::ibv_cq_ex) -> &'a Cq {
    // SAFETY: per the contract.
    unsafe { &*(cq as *const Cq) }
}

/// The `wc_flags` an extended CQ offers: the standard set, timestamps on the engine's
/// clock and on the wall clock, and tag matching's tag. VLANs and flow tags are not
/// offered.
const SUPPORTED_WC_FLAGS: u64 = ffi::IBV_WC_STANDARD_FLAGS as u64
    | ffi::IBV_WC_EX_WITH_COMPLETION_TIMESTAMP as u64
    | ffi::IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK as u64
    | ffi::IBV_WC_EX_WITH_TM_INFO as u64;

/// Makes a CQ; Err holds the errno.
fn create(
    c: &Context,
    cqe: u32,
    cq_context: *mut c_void,
    channel: *mut ffi::ibv_comp_channel,
    comp_vector: u32,
    wc_flags: u64,
) -> Result<*mut ffi::ibv_cq, c_int> {
    // SAFETY: null or a live channel, per the callers' contracts.
    let ch = unsafe { object::<Channel, _>(channel) };
    if !channel.is_null() && ch.is_none() {
        return Err(libc::EINVAL);
    }
    let max = c.verbs.query_device().max_cqe;
    if cqe < 1 || cqe > max || comp_vector >= c.vctx.context.num_comp_vectors as u32 {
        return Err(libc::EINVAL);
    }
    if wc_flags & !SUPPORTED_WC_FLAGS != 0 {
        return Err(libc::EOPNOTSUPP);
    }
    let cq = c
        .verbs
        .try_create_cq(cqe as usize, ch.map(|ch| &ch.ch))
        .map_err(|e| crate::service::errno(&e))?;
    let id = cq.id();
    let mut ibv = ffi::ibv_cq_ex {
        context: c.ibv(),
        channel,
        cq_context,
        cqe: cqe as c_int,
        start_poll: Some(start_poll),
        next_poll: Some(next_poll),
        end_poll: Some(end_poll),
        read_opcode: Some(read_opcode),
        read_vendor_err: Some(read_vendor_err),
        read_byte_len: Some(read_byte_len),
        read_imm_data: Some(read_imm_data),
        read_qp_num: Some(read_qp_num),
        read_src_qp: Some(read_src_qp),
        read_wc_flags: Some(read_wc_flags),
        read_slid: Some(read_slid),
        read_sl: Some(read_sl),
        read_dlid_path_bits: Some(read_dlid_path_bits),
        read_completion_ts: Some(read_completion_ts),
        read_completion_wallclock_ns: Some(read_completion_wallclock_ns),
        read_tm_info: Some(read_tm_info),
        ..Default::default()
    };
    // SAFETY: fresh, unshared storage.
    unsafe { init_sync(&mut ibv.mutex, &mut ibv.cond) };
    let wall_zero = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
        .saturating_sub(c.verbs.clock_ns());
    let reported = Reported::default();
    let p: *mut ffi::ibv_cq = publish(Cq {
        ibv,
        cq,
        async_reported: reported.clone(),
        comp_reported: AtomicU32::new(0),
        users: AtomicU32::new(0),
        current: Mutex::new(None),
        wall_zero,
    });
    if let Some(ch) = ch {
        ch.cqs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, p as usize);
    }
    c.events.register(Kind::Cq, id, p as *mut c_void, reported);
    Ok(p)
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
    comp_vector: c_int,
) -> *mut ffi::ibv_cq {
    // SAFETY: per the contract.
    let Some(c) = (unsafe { context(ctx) }) else {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    };
    let (Ok(cqe), Ok(vector)) = (u32::try_from(cqe), u32::try_from(comp_vector)) else {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    };
    match create(c, cqe, cq_context, channel, vector, 0) {
        Ok(p) => p,
        Err(e) => {
            set_errno(e);
            std::ptr::null_mut()
        }
    }
}
symver!(ferroce_ibv_create_cq => "ibv_create_cq" @ "IBVERBS_1.1");

/// `verbs_context.create_cq_ex` (the header's `ibv_create_cq_ex`).
pub(crate) unsafe extern "C" fn create_cq_ex(
    ctx: *mut ffi::ibv_context,
    attr: *mut ffi::ibv_cq_init_attr_ex,
) -> *mut ffi::ibv_cq_ex {
    // SAFETY: the inline wrapper passes the program's context and attributes.
    let (Some(c), Some(a)) = (unsafe { context(ctx) }, unsafe { attr.as_ref() }) else {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    };
    let known = ffi::IBV_CQ_INIT_ATTR_MASK_FLAGS | ffi::IBV_CQ_INIT_ATTR_MASK_PD;
    let flags = ffi::IBV_CREATE_CQ_ATTR_SINGLE_THREADED | ffi::IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN;
    if a.comp_mask & !known != 0 {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    }
    if a.comp_mask & ffi::IBV_CQ_INIT_ATTR_MASK_FLAGS != 0 && a.flags & !flags != 0 {
        set_errno(libc::EOPNOTSUPP);
        return std::ptr::null_mut();
    }
    if a.comp_mask & ffi::IBV_CQ_INIT_ATTR_MASK_PD != 0
        // SAFETY: null or the program's PD.
        && unsafe { crate::domain::parent_of(a.parent_domain) }.is_none()
    {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    }
    match create(c, a.cqe, a.cq_context, a.channel, a.comp_vector, a.wc_flags) {
        Ok(p) => p as *mut ffi::ibv_cq_ex,
        Err(e) => {
            set_errno(e);
            std::ptr::null_mut()
        }
    }
}

/// `ibv_destroy_cq`: `EBUSY` while a QP uses it; waits until the program acknowledged every
/// event it took for it (completion and asynchronous), as libibverbs does.
///
/// # Safety
/// `cq` came from `ibv_create_cq` and is not used again.
#[no_mangle]
pub unsafe extern "C" fn ferroce_ibv_destroy_cq(cq: *mut ffi::ibv_cq) -> c_int {
    if cq.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: per the contract.
    let c = unsafe { cq_of(cq) };
    if c.users.load(Ordering::Acquire) != 0 {
        return libc::EBUSY;
    }
    // SAFETY: CQs are made with a live context.
    let ctx = unsafe { crate::context::owner(c.ibv.context) };
    ctx.events.forget(Kind::Cq, c.cq.id());
    // SAFETY: the channel outlives its CQs (destroying it first fails with EBUSY).
    if let Some(ch) = unsafe { object::<Channel, _>(c.ibv.channel) } {
        ch.cqs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&c.cq.id());
    }
    // SAFETY: the header's own fields, live until freed below.
    unsafe {
        let h = &mut (*cq);
        c.async_reported
            .wait_acked(&mut h.mutex, &mut h.cond, &h.async_events_completed);
        let comp = Reported::from(c.comp_reported.load(Ordering::Acquire));
        comp.wait_acked(&mut h.mutex, &mut h.cond, &h.comp_events_completed);
    }
    // SAFETY: per the contract.
    drop(unsafe { destroy::<Cq, _>(cq) });
    0
}
symver!(ferroce_ibv_destroy_cq => "ibv_destroy_cq" @ "IBVERBS_1.1");

/// `ibv_resize_cq`: room for at least `cqe` completions; `EINVAL` when more than that wait
/// in it, or beyond the device's maximum. `cqe` in the header shows the new size.
///
/// # Safety
/// `cq` is a live CQ.
#[no_mangle]
pub unsafe extern "C" fn ferroce_ibv_resize_cq(cq: *mut ffi::ibv_cq, cqe: c_int) -> c_int {
    if cq.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: per the contract.
    let c = unsafe { cq_of(cq) };
    // SAFETY: CQs are made with a live context.
    let max = unsafe { crate::context::owner(c.ibv.context) }
        .verbs
        .query_device()
        .max_cqe;
    let Ok(n) = u32::try_from(cqe) else {
        return libc::EINVAL;
    };
    if n == 0 || n > max {
        return libc::EINVAL;
    }
    if c.cq.resize(n as usize).is_err() {
        return libc::EINVAL;
    }
    // SAFETY: the program's own CQ header; libibverbs' providers update it the same way.
    unsafe { (*cq).cqe = cqe };
    0
}
symver!(ferroce_ibv_resize_cq => "ibv_resize_cq" @ "IBVERBS_1.1");

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
    if cq.is_null() || cq_context.is_null() {
        set_errno(libc::EINVAL);
        return -1;
    }
    loop {
        let mut count = 0u64;
        // SAFETY: reads 8 bytes into a live u64 from the channel's eventfd; blocks unless
        // the program made the fd non-blocking, as the kernel's channel does.
        let n = unsafe { libc::read(ch.ibv.fd, &mut count as *mut u64 as *mut c_void, 8) };
        if n != 8 {
            return -1;
        }
        // The notifier queues the event before it writes the fd (the service counts it
        // before it does).
        let id = match ch.ch.remote_fd() {
            Some(_) => ch.ch.take_remote_event(),
            None => ch.ch.get_event(Duration::from_secs(1)),
        };
        let Some(id) = id else {
            set_errno(libc::EIO);
            return -1;
        };
        let cqs = ch.cqs.lock().unwrap_or_else(|e| e.into_inner());
        // A CQ destroyed after its event fired: its event went with it.
        let Some(&p) = cqs.get(&id) else {
            continue;
        };
        let p = p as *mut ffi::ibv_cq;
        // SAFETY: `p` is a live CQ (in the channel's table, whose lock its destroy takes);
        // the out-pointers per the contract.
        unsafe {
            cq_of(p).comp_reported.fetch_add(1, Ordering::AcqRel);
            *cq = p;
            *cq_context = (*p).cq_context;
        }
        return 0;
    }
}
symver!(ferroce_ibv_get_cq_event => "ibv_get_cq_event" @ "IBVERBS_1.1");

/// `ibv_ack_cq_events`: under the CQ's mutex, so a destroy waiting for them wakes.
///
/// # Safety
/// `cq` is a live CQ.
#[no_mangle]
pub unsafe extern "C" fn ferroce_ibv_ack_cq_events(cq: *mut ffi::ibv_cq, nevents: u32) {
    if cq.is_null() {
        return;
    }
    // SAFETY: a live CQ's header.
    unsafe {
        let h = &mut *cq;
        let m = &mut h.mutex as *mut _ as *mut libc::pthread_mutex_t;
        libc::pthread_mutex_lock(m);
        h.comp_events_completed = h.comp_events_completed.wrapping_add(nevents);
        libc::pthread_cond_broadcast(&mut h.cond as *mut _ as *mut libc::pthread_cond_t);
        libc::pthread_mutex_unlock(m);
    }
}
symver!(ferroce_ibv_ack_cq_events => "ibv_ack_cq_events" @ "IBVERBS_1.1");

/// Moves an extended poll to the next completion: `status` and `wr_id` in the header, the
/// rest for the `read_*` entry points. `ENOENT` when none waits.
fn advance(cq: *mut ffi::ibv_cq_ex) -> c_int {
    // SAFETY: the header's poll entry points are called with the program's CQ.
    let c = unsafe { ex(cq) };
    let Some((wc, ts)) = c.cq.poll_one_stamped() else {
        std::thread::yield_now();
        return libc::ENOENT;
    };
    // SAFETY: the program's CQ header; only the polling thread writes these.
    unsafe {
        (*cq).status = wc.status as ffi::ibv_wc_status;
        (*cq).wr_id = wc.wr_id;
    }
    *c.current.lock().unwrap_or_else(|e| e.into_inner()) = Some((wc, ts));
    0
}

unsafe extern "C" fn start_poll(
    cq: *mut ffi::ibv_cq_ex,
    attr: *mut ffi::ibv_poll_cq_attr,
) -> c_int {
    // SAFETY: null or the program's attributes.
    if unsafe { attr.as_ref() }.is_some_and(|a| a.comp_mask != 0) {
        return libc::EINVAL;
    }
    advance(cq)
}

unsafe extern "C" fn next_poll(cq: *mut ffi::ibv_cq_ex) -> c_int {
    advance(cq)
}

unsafe extern "C" fn end_poll(cq: *mut ffi::ibv_cq_ex) {
    // SAFETY: the program's CQ.
    *unsafe { ex(cq) }
        .current
        .lock()
        .unwrap_or_else(|e| e.into_inner()) = None;
}

/// Reads a field of the completion an extended poll is at (0 when none).
fn read<T: Default>(cq: *mut ffi::ibv_cq_ex, f: impl FnOnce(&WorkCompletion, u64, &Cq) -> T) -> T {
    // SAFETY: the program's CQ.
    let c = unsafe { ex(cq) };
    let cur = c.current.lock().unwrap_or_else(|e| e.into_inner());
    cur.as_ref()
        .map_or_else(T::default, |(wc, ts)| f(wc, *ts, c))
}

unsafe extern "C" fn read_opcode(cq: *mut ffi::ibv_cq_ex) -> ffi::ibv_wc_opcode {
    read(cq, |w, _, _| to_wc(w).opcode)
}
unsafe extern "C" fn read_vendor_err(cq: *mut ffi::ibv_cq_ex) -> u32 {
    read(cq, |w, _, _| to_wc(w).vendor_err)
}
unsafe extern "C" fn read_byte_len(cq: *mut ffi::ibv_cq_ex) -> u32 {
    read(cq, |w, _, _| w.byte_len)
}
unsafe extern "C" fn read_imm_data(cq: *mut ffi::ibv_cq_ex) -> u32 {
    // SAFETY: both union members are plain u32s.
    read(cq, |w, _, _| unsafe { to_wc(w).__bindgen_anon_1.imm_data })
}
unsafe extern "C" fn read_qp_num(cq: *mut ffi::ibv_cq_ex) -> u32 {
    read(cq, |w, _, _| w.qp_num.value())
}
unsafe extern "C" fn read_src_qp(cq: *mut ffi::ibv_cq_ex) -> u32 {
    read(cq, |w, _, _| w.src_qp.value())
}
unsafe extern "C" fn read_wc_flags(cq: *mut ffi::ibv_cq_ex) -> std::ffi::c_uint {
    read(cq, |w, _, _| to_wc(w).wc_flags)
}
unsafe extern "C" fn read_slid(_cq: *mut ffi::ibv_cq_ex) -> u32 {
    0
}
unsafe extern "C" fn read_sl(_cq: *mut ffi::ibv_cq_ex) -> u8 {
    0
}
unsafe extern "C" fn read_dlid_path_bits(_cq: *mut ffi::ibv_cq_ex) -> u8 {
    0
}
unsafe extern "C" fn read_completion_ts(cq: *mut ffi::ibv_cq_ex) -> u64 {
    read(cq, |_, ts, _| ts)
}
unsafe extern "C" fn read_completion_wallclock_ns(cq: *mut ffi::ibv_cq_ex) -> u64 {
    read(cq, |_, ts, c| c.wall_zero.wrapping_add(ts))
}
/// A tag matching completion's tag and application context (0 for the others).
unsafe extern "C" fn read_tm_info(cq: *mut ffi::ibv_cq_ex, info: *mut ffi::ibv_wc_tm_info) {
    let matched = |w: &WorkCompletion| {
        w.opcode == ferroce_verbs::WcOpcode::TmRecv
            && w.wc_flags.contains(ferroce_verbs::WcFlags::TM_MATCH)
    };
    let (tag, ctx) = read(cq, |w, _, _| {
        if matched(w) {
            (w.tag, w.imm_data)
        } else {
            (0, 0)
        }
    });
    // SAFETY: the program passes its structure (the header's inline wrapper).
    if let Some(i) = unsafe { info.as_mut() } {
        i.tag = tag;
        i.priv_ = ctx;
    }
}
/// A ferroce completion as `struct ibv_wc`.
pub(crate) fn to_wc(wc: &WorkCompletion) -> ffi::ibv_wc {
    let mut out = ffi::ibv_wc {
        wr_id: wc.wr_id,
        status: wc.status as ffi::ibv_wc_status,
        opcode: wc.opcode as ffi::ibv_wc_opcode,
        byte_len: wc.byte_len,
        qp_num: wc.qp_num.value(),
        src_qp: wc.src_qp.value(),
        wc_flags: wc.wc_flags.0,
        ..Default::default()
    };
    if wc.wc_flags.contains(WcFlags::WITH_INV) {
        out.__bindgen_anon_1.invalidated_rkey = wc.imm_data;
    } else {
        out.__bindgen_anon_1.imm_data = wc.imm_data.to_be();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferroce_stack::transport::{WcOpcode, WcStatus};
    use ferroce_stack::wire::Qpn;

    #[test]
    fn immediate_data_keeps_its_wire_bytes() {
        // A program writes htonl(0x01020304); the wire and the peer's wc carry 01 02 03 04.
        let c_imm: u32 = u32::from_ne_bytes([1, 2, 3, 4]);
        assert_eq!(u32::from_be(c_imm), 0x0102_0304);
        let mut wc = WorkCompletion {
            wr_id: 7,
            status: WcStatus::Success,
            opcode: WcOpcode::RecvRdmaWithImm,
            qp_num: Qpn::new(0x11),
            byte_len: 0,
            imm_data: 0x0102_0304,
            wc_flags: WcFlags::WITH_IMM,
            src_qp: Qpn::new(0),
            smac: ferroce_stack::wire::MacAddr([0; 6]),
            solicited: false,
            tag: 0,
        };
        let out = to_wc(&wc);
        // SAFETY: reading the member just written.
        assert_eq!(
            unsafe { out.__bindgen_anon_1.imm_data }.to_ne_bytes(),
            [1, 2, 3, 4]
        );
        assert_eq!(out.opcode, ffi::IBV_WC_RECV_RDMA_WITH_IMM);
        assert_eq!(out.wc_flags, ffi::IBV_WC_WITH_IMM);
        wc.wc_flags = WcFlags::WITH_INV;
        // SAFETY: as above.
        assert_eq!(
            unsafe { to_wc(&wc).__bindgen_anon_1.invalidated_rkey },
            0x0102_0304
        );
    }
}
