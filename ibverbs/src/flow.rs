//! Flow steering (`ibv_create_flow`, `ibv_destroy_flow`) for raw packet QPs: the rule the
//! program lays out as `struct ibv_flow_attr` followed by its specs becomes a ferroce
//! [`FlowRule`] on the QP's engine (see `ferroce_verbs::engine::raw`). Ethernet, IPv4 (and
//! its extended form), IPv6, TCP and UDP specs match; tunnels, actions, counters and the
//! fields ferroce does not match on (TOS, TTL, flow label, ...) under a non-zero mask are
//! `EOPNOTSUPP`; a spec that makes no sense (a size that is not its type's, a rule longer
//! than its specs) is `EINVAL`.

use std::ffi::c_int;

use ferroce_verbs::{Flow, FlowRule, FlowSpec};

use crate::device::set_errno;
use crate::ffi;
use crate::objects::{free, object, publish};
use crate::qp::{Qp, QpKind};

/// A flow rule as programs hold it.
#[repr(C)]
pub struct FlowObj {
    pub(crate) ibv: ffi::ibv_flow,
    _flow: Flow,
}

/// Reads the spec at `p` (`left` bytes of the rule remain); its size, or the errno.
///
/// # Safety
/// `p` points to `left` readable bytes.
unsafe fn spec(p: *const u8, left: usize, out: &mut Vec<FlowSpec>) -> Result<usize, c_int> {
    if left < 4 {
        return Err(libc::EINVAL);
    }
    // SAFETY: the header's 4 bytes are readable (checked just above).
    let (kind, size) = unsafe {
        (
            std::ptr::read_unaligned(p as *const ffi::ibv_flow_spec_type),
            std::ptr::read_unaligned(p.add(4) as *const u16) as usize,
        )
    };
    if size < 8 || size > left || size > 256 {
        return Err(libc::EINVAL);
    }
    /// Reads the whole spec of type `T` if `size` is its size.
    ///
    /// # Safety
    /// `p` points to `size` readable bytes.
    unsafe fn read<T>(p: *const u8, size: usize) -> Result<T, c_int> {
        if size != size_of::<T>() {
            return Err(libc::EINVAL);
        }
        // SAFETY: per the contract.
        Ok(unsafe { std::ptr::read_unaligned(p as *const T) })
    }
    let be4 = |x: u32| x.to_ne_bytes();
    // SAFETY (each `read`): `size` bytes at `p` are readable (checked above).
    match kind {
        ffi::IBV_FLOW_SPEC_ETH => {
            let s: ffi::ibv_flow_spec_eth = unsafe { read(p, size) }?;
            out.push(FlowSpec::Eth {
                dst: s.val.dst_mac,
                dst_mask: s.mask.dst_mac,
                src: s.val.src_mac,
                src_mask: s.mask.src_mac,
                ether_type: u16::from_be(s.val.ether_type),
                ether_type_mask: u16::from_be(s.mask.ether_type),
                vlan_tag: u16::from_be(s.val.vlan_tag),
                vlan_mask: u16::from_be(s.mask.vlan_tag),
            });
        }
        ffi::IBV_FLOW_SPEC_IPV4 => {
            let s: ffi::ibv_flow_spec_ipv4 = unsafe { read(p, size) }?;
            out.push(FlowSpec::Ipv4 {
                src: be4(s.val.src_ip),
                src_mask: be4(s.mask.src_ip),
                dst: be4(s.val.dst_ip),
                dst_mask: be4(s.mask.dst_ip),
                proto: 0,
                proto_mask: 0,
            });
        }
        ffi::IBV_FLOW_SPEC_IPV4_EXT => {
            let s: ffi::ibv_flow_spec_ipv4_ext = unsafe { read(p, size) }?;
            if s.mask.tos != 0 || s.mask.ttl != 0 || s.mask.flags != 0 {
                return Err(libc::EOPNOTSUPP);
            }
            out.push(FlowSpec::Ipv4 {
                src: be4(s.val.src_ip),
                src_mask: be4(s.mask.src_ip),
                dst: be4(s.val.dst_ip),
                dst_mask: be4(s.mask.dst_ip),
                proto: s.val.proto,
                proto_mask: s.mask.proto,
            });
        }
        ffi::IBV_FLOW_SPEC_IPV6 => {
            let s: ffi::ibv_flow_spec_ipv6 = unsafe { read(p, size) }?;
            if s.mask.flow_label != 0 || s.mask.traffic_class != 0 || s.mask.hop_limit != 0 {
                return Err(libc::EOPNOTSUPP);
            }
            out.push(FlowSpec::Ipv6 {
                src: s.val.src_ip,
                src_mask: s.mask.src_ip,
                dst: s.val.dst_ip,
                dst_mask: s.mask.dst_ip,
                next_hdr: s.val.next_hdr,
                next_hdr_mask: s.mask.next_hdr,
            });
        }
        ffi::IBV_FLOW_SPEC_TCP | ffi::IBV_FLOW_SPEC_UDP => {
            let s: ffi::ibv_flow_spec_tcp_udp = unsafe { read(p, size) }?;
            out.push(FlowSpec::Ports {
                tcp: kind == ffi::IBV_FLOW_SPEC_TCP,
                src: u16::from_be(s.val.src_port),
                src_mask: u16::from_be(s.mask.src_port),
                dst: u16::from_be(s.val.dst_port),
                dst_mask: u16::from_be(s.mask.dst_port),
            });
        }
        _ => return Err(libc::EOPNOTSUPP),
    }
    Ok(size)
}

/// The rule laid out at `attr`. Err holds the errno.
///
/// # Safety
/// `attr` points to a `struct ibv_flow_attr` followed by its specs.
unsafe fn rule(attr: *const ffi::ibv_flow_attr) -> Result<FlowRule, c_int> {
    // SAFETY: per the contract.
    let a = unsafe { &*attr };
    if a.comp_mask != 0 || a.type_ != ffi::IBV_FLOW_ATTR_NORMAL {
        return Err(libc::EOPNOTSUPP);
    }
    if a.flags != 0 {
        return Err(libc::EOPNOTSUPP);
    }
    let total = usize::from(a.size);
    let head = size_of::<ffi::ibv_flow_attr>();
    // The specs follow the attributes. `size` covers both when the program sets it (as
    // libibverbs' own users do); a provider walks the specs by their own sizes, so a rule
    // whose `size` is only the attributes' is read that way too.
    let mut left = if total > head {
        total - head
    } else {
        usize::from(a.num_of_specs) * 256
    };
    // SAFETY: the specs start right after the attributes.
    let mut p = unsafe { (attr as *const u8).add(head) };
    let mut specs = Vec::new();
    for _ in 0..a.num_of_specs {
        // SAFETY: `left` bytes of the rule remain at `p`, per the contract and `size`.
        let n = unsafe { spec(p, left, &mut specs) }?;
        left -= n;
        // SAFETY: `n <= left` bytes were just read there.
        p = unsafe { p.add(n) };
    }
    Ok(FlowRule { specs })
}

/// `verbs_context.ibv_create_flow` (the header's `ibv_create_flow`): a rule steering the
/// port's matching frames to raw packet QP `qp`.
pub(crate) unsafe extern "C" fn create_flow(
    qp: *mut ffi::ibv_qp,
    attr: *mut ffi::ibv_flow_attr,
) -> *mut ffi::ibv_flow {
    let fail = |e| {
        set_errno(e);
        std::ptr::null_mut()
    };
    // SAFETY: the inline wrapper passes the program's QP and attributes.
    let Some(q) = (unsafe { object::<Qp, _>(qp) }) else {
        return fail(libc::EINVAL);
    };
    if attr.is_null() {
        return fail(libc::EINVAL);
    }
    let QpKind::Raw(raw) = &q.qp else {
        return fail(libc::EINVAL);
    };
    // SAFETY: per the contract, the attributes and specs the program laid out.
    let r = match unsafe { rule(attr) } {
        Ok(r) => r,
        Err(e) => return fail(e),
    };
    // SAFETY: as above.
    let port = unsafe { (*attr).port };
    // SAFETY: QPs are made with a live context.
    let ports = unsafe { crate::context::owner(q.base().context) }
        .verbs
        .query_device()
        .phys_port_cnt;
    if port == 0 || port > ports {
        return fail(libc::EINVAL);
    }
    if raw.port_num().is_ok_and(|p| p != port) && q.base().state != ffi::IBV_QPS_RESET {
        return fail(libc::EINVAL);
    }
    match raw.create_flow(r) {
        Ok(flow) => publish(FlowObj {
            ibv: ffi::ibv_flow {
                comp_mask: 0,
                context: q.base().context,
                handle: 0,
            },
            _flow: flow,
        }),
        Err(_) => fail(libc::EINVAL),
    }
}

/// `verbs_context.ibv_destroy_flow`.
pub(crate) unsafe extern "C" fn destroy_flow(flow: *mut ffi::ibv_flow) -> c_int {
    // SAFETY: the inline wrapper passes the program's rule, not used again.
    unsafe { free::<FlowObj, _>(flow) }
}
