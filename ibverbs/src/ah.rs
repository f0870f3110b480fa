//! Address handles (`ibv_create_ah`, `ibv_init_ah_from_wc`, `ibv_create_ah_from_wc`): where
//! UD sends go, and the path a GID names (also what a connected QP's `ah_attr` becomes).

use std::ffi::c_int;

use ferroce_stack::transport::AddressVector;
use ferroce_verbs::Gid;

use crate::context::{context, owner, Context};
use crate::device::set_errno;
use crate::domain::{hold_pd, release_pd, Pd};
use crate::ffi;
use crate::objects::{free, object, publish};

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
        Ok(av) => {
            // SAFETY: a live PD.
            unsafe { hold_pd(pd) };
            publish(Ah {
                ibv: ffi::ibv_ah {
                    context: p.ibv.context,
                    pd,
                    handle: 0,
                },
                av,
            })
        }
        Err(e) => {
            set_errno(e);
            std::ptr::null_mut()
        }
    }
}
symver!(ferroce_ibv_create_ah => "ibv_create_ah" @ "IBVERBS_1.1");

/// The address of a UD receive's sender, from the GRH area at the start of its buffer (for
/// RoCEv2 over IPv4 the IPv4 header sits in its last 20 bytes; over IPv6 the IPv6 header
/// fills it), as an address attribute back to it.
fn ah_attr_from_grh(wc: &ffi::ibv_wc, grh: &[u8; 40], port_num: u8) -> Option<ffi::ibv_ah_attr> {
    if wc.wc_flags & ffi::IBV_WC_GRH == 0 {
        return None;
    }
    let src: std::net::IpAddr = if grh[20] >> 4 == 4 {
        std::net::Ipv4Addr::new(grh[32], grh[33], grh[34], grh[35]).into()
    } else {
        let mut a = [0u8; 16];
        a.copy_from_slice(&grh[8..24]);
        std::net::Ipv6Addr::from(a).into()
    };
    let mut attr = ffi::ibv_ah_attr {
        is_global: 1,
        port_num,
        ..Default::default()
    };
    attr.grh.dgid.raw = Gid::from_ip(src).0;
    attr.grh.hop_limit = 64;
    Some(attr)
}

/// `ibv_init_ah_from_wc`: the address attributes of a UD receive's sender.
///
/// # Safety
/// `ctx` is an open context; `wc` a completion; `grh` the 40 bytes the receive started
/// with; `ah_attr` a writable `struct ibv_ah_attr`.
#[no_mangle]
pub unsafe extern "C" fn ferroce_ibv_init_ah_from_wc(
    ctx: *mut ffi::ibv_context,
    port_num: u8,
    wc: *mut ffi::ibv_wc,
    grh: *mut ffi::ibv_grh,
    ah_attr: *mut ffi::ibv_ah_attr,
) -> c_int {
    // SAFETY: per the contract.
    let (Some(c), Some(w), false, false) = (
        unsafe { context(ctx) },
        unsafe { wc.as_ref() },
        grh.is_null(),
        ah_attr.is_null(),
    ) else {
        return libc::EINVAL;
    };
    if c.verbs.query_port_num(port_num).is_err() {
        return libc::EINVAL;
    }
    // SAFETY: the GRH area is 40 readable bytes per the contract.
    let raw = unsafe { &*(grh as *const [u8; 40]) };
    match ah_attr_from_grh(w, raw, port_num) {
        Some(a) => {
            // SAFETY: per the contract.
            unsafe { ah_attr.write(a) };
            0
        }
        None => libc::EINVAL,
    }
}
symver!(ferroce_ibv_init_ah_from_wc => "ibv_init_ah_from_wc" @ "IBVERBS_1.1");

/// `ibv_create_ah_from_wc`: a handle back to the sender of a UD receive.
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
    // SAFETY: the GRH area is 40 readable bytes per the contract.
    let raw = unsafe { &*(grh as *const [u8; 40]) };
    let Some(mut attr) = ah_attr_from_grh(w, raw, port_num) else {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    };
    // SAFETY: `attr` is a live local; `pd` per the contract.
    unsafe { ferroce_ibv_create_ah(pd, &mut attr) }
}
symver!(ferroce_ibv_create_ah_from_wc => "ibv_create_ah_from_wc" @ "IBVERBS_1.1");

/// `ibv_resolve_eth_l2_from_gid`: the MAC address of the next hop to `attr`'s GID (from
/// the neighbour table, as for an address handle), and no VLAN (`0xffff` in `vid`).
///
/// # Safety
/// `ctx` is an open context; `attr` a `struct ibv_ah_attr`; `eth_mac` 6 writable bytes;
/// `vid` null or writable.
#[no_mangle]
pub unsafe extern "C" fn ferroce_ibv_resolve_eth_l2_from_gid(
    ctx: *mut ffi::ibv_context,
    attr: *mut ffi::ibv_ah_attr,
    eth_mac: *mut u8,
    vid: *mut u16,
) -> c_int {
    // SAFETY: per the contract.
    let (Some(c), Some(a), false) = (
        unsafe { context(ctx) },
        unsafe { attr.as_ref() },
        eth_mac.is_null(),
    ) else {
        return -libc::EINVAL;
    };
    match path_of(c, a) {
        Ok(av) => {
            // SAFETY: per the contract.
            unsafe {
                std::ptr::copy_nonoverlapping(av.dmac.0.as_ptr(), eth_mac, 6);
                if !vid.is_null() {
                    vid.write(0xffff);
                }
            }
            0
        }
        Err(e) => -e,
    }
}
symver!(ferroce_ibv_resolve_eth_l2_from_gid => "ibv_resolve_eth_l2_from_gid" @ "IBVERBS_1.1");

/// `ibv_destroy_ah`.
///
/// # Safety
/// `ah` came from `ibv_create_ah` and is not used again.
#[no_mangle]
pub unsafe extern "C" fn ferroce_ibv_destroy_ah(ah: *mut ffi::ibv_ah) -> c_int {
    // SAFETY: per the contract.
    if let Some(a) = unsafe { object::<Ah, _>(ah) } {
        // SAFETY: the AH's PD outlives it.
        unsafe { release_pd(a.ibv.pd) };
    }
    // SAFETY: per the contract.
    unsafe { free::<Ah, _>(ah) }
}
symver!(ferroce_ibv_destroy_ah => "ibv_destroy_ah" @ "IBVERBS_1.1");
