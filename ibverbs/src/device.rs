//! The device list: one `struct ibv_device` per ferroce device named in `FERROCE_DEVICES`,
//! built once and kept for the life of the process (programs hold `ibv_device` pointers past
//! `ibv_free_device_list`, as libibverbs allows).

use std::ffi::{c_char, c_int, c_void};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use ferroce_verbs::Context as VerbsContext;

use crate::ffi;

/// The environment variable naming the devices: ferroce device specifications separated by
/// `;` (a DPDK specification holds spaces and commas), e.g. `afpacket:veth0` or
/// `afpacket:eth1;tap:fr0@10.0.0.2`.
pub const DEVICES_ENV: &str = "FERROCE_DEVICES";

/// Where a context hears of its device's asynchronous events (see [`crate::events`], which
/// turns each into the `struct ibv_async_event` a program takes).
pub(crate) trait EventQueue: Send + Sync {
    fn raise(&self, event: ferroce_verbs::AsyncEvent);
}

/// A device as programs see it (`ibv_device` first, so a pointer to one is a pointer to the
/// other) and what opening it needs.
#[repr(C)]
pub struct Device {
    pub(crate) ibv: ffi::ibv_device,
    /// The ferroce specification, e.g. `afpacket:veth0` (of a service's device: the
    /// service's specification, whose interface is the program's too).
    pub spec: String,
    /// A device of the service (`FERROCE_SERVICE`): its number there.
    pub service: Option<u32>,
    /// Node GUID, network order: EUI-64 from the interface's MAC when it can be read.
    pub guid: u64,
    /// A DPDK device's ferroce device, opened once for the process: EAL and the PMD take a
    /// port once, so every context on the device shares it, as contexts share a NIC.
    shared: Mutex<Option<VerbsContext>>,
    /// The event queues of the contexts open on the device.
    subscribers: Arc<Mutex<Vec<Weak<dyn EventQueue>>>>,
}

// SAFETY: the `ibv_device` holds only plain data and null function pointers, written once
// before the list is published and never again.
unsafe impl Send for Device {}
// SAFETY: as above: shared only for reading.
unsafe impl Sync for Device {}

/// Copies `s` into a fixed C string field, truncated and NUL-terminated.
fn put(dst: &mut [c_char], s: &str) {
    let n = s.len().min(dst.len() - 1);
    for (d, &b) in dst.iter_mut().zip(&s.as_bytes()[..n]) {
        *d = b as c_char;
    }
    dst[n] = 0;
}

/// The EUI-64 GUID of a MAC address (as RoCE devices derive theirs), in network order.
fn guid_of_mac(mac: [u8; 6]) -> u64 {
    let eui = [
        mac[0] ^ 2,
        mac[1],
        mac[2],
        0xff,
        0xfe,
        mac[3],
        mac[4],
        mac[5],
    ];
    u64::from_ne_bytes(eui)
}

/// The MAC of a Linux interface, from sysfs.
fn iface_mac(iface: &str) -> Option<[u8; 6]> {
    let s = std::fs::read_to_string(format!("/sys/class/net/{iface}/address")).ok()?;
    crate::neigh::parse_mac(&s).map(|m| m.0)
}

impl Device {
    fn new(index: usize, spec: &str, service: Option<u32>) -> Self {
        let guid = crate::neigh::interface(spec)
            .and_then(iface_mac)
            .map_or(0x0200_00ff_fe00_0000 | index as u64, guid_of_mac);
        let mut ibv = ffi::ibv_device {
            node_type: ffi::IBV_NODE_CA,
            transport_type: ffi::IBV_TRANSPORT_IB,
            ..Default::default()
        };
        put(&mut ibv.name, &format!("ferroce{index}"));
        put(&mut ibv.dev_name, &format!("uverbs{index}"));
        put(
            &mut ibv.dev_path,
            &format!("/sys/class/infiniband_verbs/uverbs{index}"),
        );
        put(
            &mut ibv.ibdev_path,
            &format!("/sys/class/infiniband/ferroce{index}"),
        );
        Self {
            ibv,
            spec: spec.to_owned(),
            service,
            guid,
            shared: Mutex::new(None),
            subscribers: Arc::new(Mutex::new(Vec::new())),
        }
    }
}

impl Device {
    /// True for a device every context shares (a DPDK port; see `shared`).
    pub(crate) fn is_shared(&self) -> bool {
        self.service.is_none() && self.spec.starts_with("dpdk:")
    }

    /// The ferroce device for a new context: opened now, or (a shared device) the one the
    /// process opened first.
    pub(crate) fn open(&self) -> Result<VerbsContext, ferroce_verbs::VerbsError> {
        if let Some(i) = self.service {
            return crate::service::open(i);
        }
        if !self.is_shared() {
            return ferroce_verbs::spec::open_device(&self.spec);
        }
        let mut shared = self.shared.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = shared.as_ref() {
            return Ok(c.clone());
        }
        let c = ferroce_verbs::spec::open_device(&self.spec)?;
        wait_for_link(&c);
        *shared = Some(c.clone());
        Ok(c)
    }

    /// Enters a context's event queue: the ferroce device's events reach it from now on.
    /// The device's handler is set by its first context and serves every one after.
    pub(crate) fn subscribe(&self, verbs: &VerbsContext, queue: Arc<dyn EventQueue>) {
        let mut subs = self.subscribers.lock().unwrap_or_else(|e| e.into_inner());
        subs.retain(|w| w.strong_count() > 0);
        subs.push(Arc::downgrade(&queue));
        drop(subs);
        let subs = self.subscribers.clone();
        // A device opened afresh takes a handler; a shared one keeps the first.
        verbs.set_async_handler(Box::new(move |e| {
            let list: Vec<_> = subs
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .filter_map(Weak::upgrade)
                .collect();
            for q in list {
                q.raise(e);
            }
        }));
    }
}

/// How long opening a DPDK device waits for its port's link (`FERROCE_LINK_WAIT_MS`,
/// default 10 s).
const LINK_WAIT_ENV: &str = "FERROCE_LINK_WAIT_MS";

/// Waits, up to `FERROCE_LINK_WAIT_MS`, for port 1 of a just-opened DPDK device to come up:
/// a PMD brings its link up some time after the port starts (a NIC's autonegotiation, a memif
/// port's peer connecting), and programs check the port is ACTIVE once, when they start
/// (perftest refuses to run otherwise). A port still down after the wait is reported down.
fn wait_for_link(c: &VerbsContext) {
    let ms = std::env::var(LINK_WAIT_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000u64);
    let until = std::time::Instant::now() + std::time::Duration::from_millis(ms);
    while std::time::Instant::now() < until {
        if c.query_port_num(1)
            .is_ok_and(|p| p.state == ferroce_verbs::PortState::Active)
        {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// Every device `FERROCE_DEVICES` names, in order.
pub fn devices() -> &'static [Device] {
    static LIST: OnceLock<Vec<Device>> = OnceLock::new();
    LIST.get_or_init(|| {
        if let Some(names) = crate::service::device_specs() {
            return names
                .iter()
                .enumerate()
                .map(|(i, s)| Device::new(i, s, Some(i as u32)))
                .collect();
        }
        std::env::var(DEVICES_ENV)
            .unwrap_or_default()
            .split(';')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .enumerate()
            .map(|(i, s)| Device::new(i, s, None))
            .collect()
    })
}

/// The device behind a pointer a program holds, if it is one of ours.
pub(crate) fn lookup(dev: *const ffi::ibv_device) -> Option<&'static Device> {
    devices().iter().find(|d| std::ptr::eq(&d.ibv, dev))
}

/// `ibv_get_device_list`: a NULL-terminated array (freed by `ibv_free_device_list`).
///
/// # Safety
/// `num` is null or points to an `int`.
#[no_mangle]
pub unsafe extern "C" fn ferroce_ibv_get_device_list(num: *mut c_int) -> *mut *mut ffi::ibv_device {
    let list = devices();
    // SAFETY: calloc of n+1 pointers; checked for null before use.
    let arr = unsafe { libc::calloc(list.len() + 1, size_of::<*mut ffi::ibv_device>()) }
        as *mut *mut ffi::ibv_device;
    if arr.is_null() {
        set_errno(libc::ENOMEM);
        return arr;
    }
    for (i, d) in list.iter().enumerate() {
        // SAFETY: `i < len + 1` slots were allocated. The devices live for the process and
        // are never written through these pointers by any verb of ours.
        unsafe { *arr.add(i) = &d.ibv as *const _ as *mut _ };
    }
    if !num.is_null() {
        // SAFETY: the caller passes a valid `int *` or null (checked).
        unsafe { *num = list.len() as c_int };
    }
    arr
}
symver!(ferroce_ibv_get_device_list => "ibv_get_device_list" @ "IBVERBS_1.1");

/// `ibv_free_device_list`.
///
/// # Safety
/// `list` came from `ibv_get_device_list` (or is null).
#[no_mangle]
pub unsafe extern "C" fn ferroce_ibv_free_device_list(list: *mut *mut ffi::ibv_device) {
    // SAFETY: allocated by calloc in `ibv_get_device_list`; free(NULL) is a no-op.
    unsafe { libc::free(list as *mut c_void) };
}
symver!(ferroce_ibv_free_device_list => "ibv_free_device_list" @ "IBVERBS_1.1");

/// `ibv_get_device_name`.
///
/// # Safety
/// `dev` is null or a device from the list.
#[no_mangle]
pub unsafe extern "C" fn ferroce_ibv_get_device_name(dev: *mut ffi::ibv_device) -> *const c_char {
    match lookup(dev) {
        Some(d) => d.ibv.name.as_ptr(),
        None => std::ptr::null(),
    }
}
symver!(ferroce_ibv_get_device_name => "ibv_get_device_name" @ "IBVERBS_1.1");

/// `ibv_get_device_guid` (network order).
///
/// # Safety
/// `dev` is null or a device from the list.
#[no_mangle]
pub unsafe extern "C" fn ferroce_ibv_get_device_guid(dev: *mut ffi::ibv_device) -> u64 {
    lookup(dev).map_or(0, |d| d.guid)
}
symver!(ferroce_ibv_get_device_guid => "ibv_get_device_guid" @ "IBVERBS_1.1");

/// `ibv_read_sysfs_file`: ferroce devices have no sysfs entries, so every read fails (as for
/// a missing file), and programs fall back to what the verbs report.
///
/// # Safety
/// Any arguments; none is dereferenced.
#[no_mangle]
pub unsafe extern "C" fn ferroce_ibv_read_sysfs_file(
    _dir: *const c_char,
    _file: *const c_char,
    _buf: *mut c_char,
    _size: usize,
) -> c_int {
    set_errno(libc::ENOENT);
    -1
}
symver!(ferroce_ibv_read_sysfs_file => "ibv_read_sysfs_file" @ "IBVERBS_1.0");

/// `ibv_get_device_index`: the device's index, its place in `FERROCE_DEVICES` (what the
/// kernel's device index is to rdma-core); -1 for a device that is not ours.
///
/// # Safety
/// `dev` is null or a device from the list.
#[no_mangle]
pub unsafe extern "C" fn ferroce_ibv_get_device_index(dev: *mut ffi::ibv_device) -> c_int {
    devices()
        .iter()
        .position(|d| std::ptr::eq(&d.ibv, dev))
        .map_or(-1, |i| i as c_int)
}
symver!(ferroce_ibv_get_device_index => "ibv_get_device_index" @ "IBVERBS_1.9");

/// `ibv_get_sysfs_path`: where sysfs is mounted (what libibverbs reports; ferroce's devices
/// have no entries there, see `ibv_read_sysfs_file`).
#[no_mangle]
pub extern "C" fn ferroce_ibv_get_sysfs_path() -> *const c_char {
    c"/sys".as_ptr()
}
symver!(ferroce_ibv_get_sysfs_path => "ibv_get_sysfs_path" @ "IBVERBS_1.0");

/// Sets the calling thread's `errno`.
pub(crate) fn set_errno(e: c_int) {
    // SAFETY: `__errno_location` returns this thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guids_follow_eui64_and_names_fit() {
        let g = guid_of_mac([0x02, 0x11, 0x22, 0x33, 0x44, 0x55]).to_ne_bytes();
        assert_eq!(g, [0x00, 0x11, 0x22, 0xff, 0xfe, 0x33, 0x44, 0x55]);
        let mut name = [0 as c_char; 4];
        put(&mut name, "ferroce0");
        assert_eq!(name, [b'f' as c_char, b'e' as c_char, b'r' as c_char, 0]);
    }
}
