//! Random verb sequences with random arguments through the C ABI, on a `loop` device: no
//! panic crosses the ABI (a panic in an `extern "C"` function aborts this process, so the
//! test would not finish), every object the sequence left is destroyed with status 0 in
//! dependency order, and afterwards the library holds exactly as many objects as before:
//! nothing leaked. Pointers handed in are live objects of the right kind or null, as the
//! C contract requires; everything else (sizes, keys, flags, states, opcodes, addresses
//! the keys must guard, flow rule bytes) is arbitrary. proptest prints the failing
//! sequence, shrunk, and its seed; `PROPTEST_CASES` runs more.

use std::ffi::{c_int, c_void};
use std::ptr::null_mut;

use ibverbs::ffi;
use proptest::prelude::*;

mod common;
use common::*;

/// The scratch memory regions and inline data point into.
const SCRATCH: usize = 1 << 16;

#[derive(Debug, Clone)]
enum Op {
    AllocPd,
    DeallocPd(usize),
    RegMr {
        pd: usize,
        off: usize,
        len: usize,
        access: u32,
    },
    DeregMr(usize),
    RereqMr {
        mr: usize,
        flags: i32,
        pd: usize,
        access: u32,
    },
    CreateCq {
        cqe: i32,
        vector: i32,
    },
    ResizeCq {
        cq: usize,
        cqe: i32,
    },
    DestroyCq(usize),
    CreateSrq {
        pd: usize,
        max_wr: u32,
        max_sge: u32,
        limit: u32,
    },
    ModifySrq {
        srq: usize,
        max_wr: u32,
        limit: u32,
        mask: i32,
    },
    DestroySrq(usize),
    CreateQp {
        pd: usize,
        scq: usize,
        rcq: usize,
        srq: Option<usize>,
        qp_type: u32,
        wr: u32,
        sge: u32,
        inline: u32,
    },
    ModifyQp {
        qp: usize,
        state: u32,
        mask: u32,
        port: u8,
        dest: Option<usize>,
        own_gid: bool,
        mtu: u32,
        access: u32,
        timeout: u8,
    },
    QueryQp(usize),
    DestroyQp(usize),
    PostSend {
        qp: usize,
        opcode: u32,
        flags: u32,
        sges: Vec<(usize, u32, Option<usize>)>,
        nsge: i32,
        remote: u64,
        rkey: Option<usize>,
        ah: Option<usize>,
        mw: Option<usize>,
    },
    PostRecv {
        qp: usize,
        sges: Vec<(usize, u32, Option<usize>)>,
        nsge: i32,
        srq: bool,
    },
    PollCq {
        cq: usize,
        n: i32,
    },
    AllocMw {
        pd: usize,
        t: u32,
    },
    BindMw {
        qp: usize,
        mw: usize,
        mr: Option<usize>,
        off: u64,
        len: u64,
        access: u32,
    },
    DeallocMw(usize),
    CreateAh {
        pd: usize,
        port: u8,
        global: bool,
        own_gid: bool,
    },
    DestroyAh(usize),
    CreateFlow {
        qp: usize,
        bytes: Vec<u8>,
        specs: u8,
        port: u8,
    },
    DestroyFlow(usize),
    AsyncEvent,
}

fn sge() -> impl Strategy<Value = (usize, u32, Option<usize>)> {
    (
        0..SCRATCH,
        prop_oneof![0..64u32, 0..5000u32, any::<u32>()],
        proptest::option::of(0..8usize),
    )
}

fn op() -> impl Strategy<Value = Op> {
    let i = || 0..8usize;
    prop_oneof![
        2 => Just(Op::AllocPd),
        1 => i().prop_map(Op::DeallocPd),
        3 => (i(), 0..SCRATCH, prop_oneof![0..4096usize, 0..SCRATCH], prop_oneof![0..32u32, any::<u32>()])
            .prop_map(|(pd, off, len, access)| Op::RegMr { pd, off, len, access }),
        1 => i().prop_map(Op::DeregMr),
        1 => (i(), 0..16i32, i(), 0..32u32).prop_map(|(mr, flags, pd, access)| Op::RereqMr { mr, flags, pd, access }),
        2 => (prop_oneof![-2..300i32, any::<i32>()], -1..3i32).prop_map(|(cqe, vector)| Op::CreateCq { cqe, vector }),
        1 => (i(), prop_oneof![-2..300i32, any::<i32>()]).prop_map(|(cq, cqe)| Op::ResizeCq { cq, cqe }),
        1 => i().prop_map(Op::DestroyCq),
        1 => (i(), prop_oneof![0..64u32, any::<u32>()], 0..40u32, 0..80u32)
            .prop_map(|(pd, max_wr, max_sge, limit)| Op::CreateSrq { pd, max_wr, max_sge, limit }),
        1 => (i(), 0..100u32, 0..100u32, 0..4i32).prop_map(|(srq, max_wr, limit, mask)| Op::ModifySrq { srq, max_wr, limit, mask }),
        1 => i().prop_map(Op::DestroySrq),
        4 => (i(), i(), i(), proptest::option::of(i()), prop_oneof![Just(2u32), Just(3), Just(4), Just(8), 0..12u32],
              prop_oneof![0..40u32, any::<u32>()], 0..40u32, prop_oneof![0..300u32, any::<u32>()])
            .prop_map(|(pd, scq, rcq, srq, qp_type, wr, sge, inline)| Op::CreateQp { pd, scq, rcq, srq, qp_type, wr, sge, inline }),
        6 => (i(), 0..8u32, prop_oneof![Just(0x1u32), Just(0x39), Just(0x1e1ba0), Just(0x1c1a00), any::<u32>()], 0..4u8,
              proptest::option::of(i()), any::<bool>(), 0..7u32, 0..16u32, 0..32u8)
            .prop_map(|(qp, state, mask, port, dest, own_gid, mtu, access, timeout)| Op::ModifyQp { qp, state, mask, port, dest, own_gid, mtu, access, timeout }),
        1 => i().prop_map(Op::QueryQp),
        1 => i().prop_map(Op::DestroyQp),
        8 => (i(), 0..16u32, 0..32u32, proptest::collection::vec(sge(), 0..34), -1..40i32, any::<u64>(),
              proptest::option::of(i()), proptest::option::of(i()), proptest::option::of(i()))
            .prop_map(|(qp, opcode, flags, sges, nsge, remote, rkey, ah, mw)| Op::PostSend { qp, opcode, flags, sges, nsge, remote, rkey, ah, mw }),
        4 => (i(), proptest::collection::vec(sge(), 0..34), -1..40i32, any::<bool>())
            .prop_map(|(qp, sges, nsge, srq)| Op::PostRecv { qp, sges, nsge, srq }),
        4 => (i(), -2..20i32).prop_map(|(cq, n)| Op::PollCq { cq, n }),
        1 => (i(), 0..4u32).prop_map(|(pd, t)| Op::AllocMw { pd, t }),
        1 => (i(), i(), proptest::option::of(i()), 0..SCRATCH as u64 * 2, 0..SCRATCH as u64 * 2, 0..32u32)
            .prop_map(|(qp, mw, mr, off, len, access)| Op::BindMw { qp, mw, mr, off, len, access }),
        1 => i().prop_map(Op::DeallocMw),
        1 => (i(), 0..4u8, any::<bool>(), any::<bool>()).prop_map(|(pd, port, global, own_gid)| Op::CreateAh { pd, port, global, own_gid }),
        1 => i().prop_map(Op::DestroyAh),
        1 => (i(), proptest::collection::vec(any::<u8>(), 0..160), 0..5u8, 0..3u8)
            .prop_map(|(qp, bytes, specs, port)| Op::CreateFlow { qp, bytes, specs, port }),
        1 => i().prop_map(Op::DestroyFlow),
        1 => Just(Op::AsyncEvent),
    ]
}

/// What the sequence made and has not destroyed.
#[derive(Default)]
struct Live {
    pds: Vec<*mut ffi::ibv_pd>,
    mrs: Vec<*mut ffi::ibv_mr>,
    cqs: Vec<*mut ffi::ibv_cq>,
    srqs: Vec<*mut ffi::ibv_srq>,
    qps: Vec<*mut ffi::ibv_qp>,
    mws: Vec<*mut ffi::ibv_mw>,
    ahs: Vec<*mut ffi::ibv_ah>,
    flows: Vec<*mut ffi::ibv_flow>,
}

/// The `i`th live object, or null past the end (a null handle is bad input too).
fn pick<T>(v: &[*mut T], i: usize) -> *mut T {
    v.get(i).copied().unwrap_or(null_mut())
}

/// Removes `p` from `v` when its destroy returned 0.
fn gone<T>(v: &mut Vec<*mut T>, p: *mut T, rc: c_int) {
    if rc == 0 && !p.is_null() {
        v.retain(|&x| x != p);
    }
}

unsafe fn run(d: &Dev, scratch: &mut [u8], ops: &[Op]) -> [usize; 2] {
    let mut tally = [0usize; 2];
    let mut l = Live::default();
    let base = scratch.as_mut_ptr();
    let mut gid = ffi::ibv_gid::default();
    assert_eq!(
        ibverbs::context::ferroce_ibv_query_gid(d.ctx, 1, 0, &mut gid),
        0
    );
    let vctx = d.vctx();
    let ops_table = (*d.ctx).ops;
    let make_sges = |l: &Live, sges: &[(usize, u32, Option<usize>)]| -> Vec<ffi::ibv_sge> {
        sges.iter()
            .map(|&(off, len, mr)| {
                let len = len.min((SCRATCH - off) as u32);
                let mr = pick(&l.mrs, mr.unwrap_or(usize::MAX));
                ffi::ibv_sge {
                    addr: base as u64 + off as u64,
                    length: len,
                    lkey: if mr.is_null() { 0x5eed } else { (*mr).lkey },
                }
            })
            .collect()
    };
    // A working start, so the random operations reach the data path: a PD with a region
    // over all of the scratch memory, two CQs, two RC QPs connected to each other, a UD QP
    // ready to send, an address handle to the port itself, a raw packet QP, an SRQ.
    let pd = d.pd();
    l.pds.push(pd);
    l.mrs.push(d.mr(pd, scratch));
    l.cqs.extend([d.cq(64), d.cq(64)]);
    let (a, b) = d.connected_pair(pd, l.cqs[0]);
    l.qps.extend([a, b]);
    let ud = d.qp(pd, l.cqs[1], ffi::IBV_QPT_UD);
    for (state, mask) in [
        (
            ffi::IBV_QPS_INIT,
            ffi::IBV_QP_STATE | ffi::IBV_QP_PKEY_INDEX | ffi::IBV_QP_PORT | ffi::IBV_QP_QKEY,
        ),
        (ffi::IBV_QPS_RTR, ffi::IBV_QP_STATE),
        (ffi::IBV_QPS_RTS, ffi::IBV_QP_STATE | ffi::IBV_QP_SQ_PSN),
    ] {
        let mut a = ffi::ibv_qp_attr {
            qp_state: state,
            port_num: 1,
            qkey: 0x1111,
            ..Default::default()
        };
        assert_eq!(
            ibverbs::qp::ferroce_ibv_modify_qp(ud, &mut a, mask as c_int),
            0
        );
    }
    l.qps.push(ud);
    let mut ah = ffi::ibv_ah_attr {
        is_global: 1,
        port_num: 1,
        ..Default::default()
    };
    ah.grh.dgid = gid;
    let ah = ibverbs::ah::ferroce_ibv_create_ah(pd, &mut ah);
    assert!(!ah.is_null());
    l.ahs.push(ah);
    l.qps.push(d.qp(pd, l.cqs[1], ffi::IBV_QPT_RAW_PACKET));
    let mut si = ffi::ibv_srq_init_attr {
        attr: ffi::ibv_srq_attr {
            max_wr: 32,
            max_sge: 2,
            srq_limit: 0,
        },
        ..Default::default()
    };
    let srq = ibverbs::srq::ferroce_ibv_create_srq(pd, &mut si);
    assert!(!srq.is_null());
    l.srqs.push(srq);
    for op in ops {
        match op.clone() {
            Op::AllocPd => {
                let p = ibverbs::domain::ferroce_ibv_alloc_pd(d.ctx);
                assert!(!p.is_null());
                l.pds.push(p);
            }
            Op::DeallocPd(i) => {
                let p = pick(&l.pds, i);
                let rc = ibverbs::domain::ferroce_ibv_dealloc_pd(p);
                gone(&mut l.pds, p, rc);
            }
            Op::RegMr {
                pd,
                off,
                len,
                access,
            } => {
                let len = len.min(SCRATCH - off);
                let m = ibverbs::mr::ferroce_ibv_reg_mr(
                    pick(&l.pds, pd),
                    base.add(off) as *mut c_void,
                    len,
                    access as c_int,
                );
                if !m.is_null() {
                    l.mrs.push(m);
                }
            }
            Op::DeregMr(i) => {
                let m = pick(&l.mrs, i);
                let rc = ibverbs::mr::ferroce_ibv_dereg_mr(m);
                gone(&mut l.mrs, m, rc);
            }
            Op::RereqMr {
                mr,
                flags,
                pd,
                access,
            } => {
                let m = pick(&l.mrs, mr);
                if !m.is_null() {
                    ibverbs::mr::ferroce_ibv_rereg_mr(
                        m,
                        flags,
                        pick(&l.pds, pd),
                        base as *mut c_void,
                        SCRATCH / 2,
                        access as c_int,
                    );
                }
            }
            Op::CreateCq { cqe, vector } => {
                let c =
                    ibverbs::cq::ferroce_ibv_create_cq(d.ctx, cqe, null_mut(), null_mut(), vector);
                if !c.is_null() {
                    l.cqs.push(c);
                }
            }
            Op::ResizeCq { cq, cqe } => {
                ibverbs::cq::ferroce_ibv_resize_cq(pick(&l.cqs, cq), cqe);
            }
            Op::DestroyCq(i) => {
                let c = pick(&l.cqs, i);
                let rc = ibverbs::cq::ferroce_ibv_destroy_cq(c);
                gone(&mut l.cqs, c, rc);
            }
            Op::CreateSrq {
                pd,
                max_wr,
                max_sge,
                limit,
            } => {
                let mut init = ffi::ibv_srq_init_attr {
                    attr: ffi::ibv_srq_attr {
                        max_wr,
                        max_sge,
                        srq_limit: limit,
                    },
                    ..Default::default()
                };
                let s = ibverbs::srq::ferroce_ibv_create_srq(pick(&l.pds, pd), &mut init);
                if !s.is_null() {
                    l.srqs.push(s);
                }
            }
            Op::ModifySrq {
                srq,
                max_wr,
                limit,
                mask,
            } => {
                let mut a = ffi::ibv_srq_attr {
                    max_wr,
                    max_sge: 1,
                    srq_limit: limit,
                };
                ibverbs::srq::ferroce_ibv_modify_srq(pick(&l.srqs, srq), &mut a, mask);
            }
            Op::DestroySrq(i) => {
                let s = pick(&l.srqs, i);
                let rc = ibverbs::srq::ferroce_ibv_destroy_srq(s);
                gone(&mut l.srqs, s, rc);
            }
            Op::CreateQp {
                pd,
                scq,
                rcq,
                srq,
                qp_type,
                wr,
                sge,
                inline,
            } => {
                let mut init = ffi::ibv_qp_init_attr {
                    send_cq: pick(&l.cqs, scq),
                    recv_cq: pick(&l.cqs, rcq),
                    srq: srq.map_or(null_mut(), |s| pick(&l.srqs, s)),
                    qp_type,
                    cap: ffi::ibv_qp_cap {
                        max_send_wr: wr,
                        max_recv_wr: wr,
                        max_send_sge: sge,
                        max_recv_sge: sge,
                        max_inline_data: inline,
                    },
                    ..Default::default()
                };
                let q = ibverbs::qp::create::ferroce_ibv_create_qp(pick(&l.pds, pd), &mut init);
                if !q.is_null() {
                    l.qps.push(q);
                }
            }
            Op::ModifyQp {
                qp,
                state,
                mask,
                port,
                dest,
                own_gid,
                mtu,
                access,
                timeout,
            } => {
                let q = pick(&l.qps, qp);
                let dest = dest.map(|i| pick(&l.qps, i)).filter(|p| !p.is_null());
                let mut a = ffi::ibv_qp_attr {
                    qp_state: state,
                    port_num: port,
                    path_mtu: mtu,
                    qp_access_flags: access,
                    dest_qp_num: dest.map_or(0x123, |p| (*p).qp_num),
                    timeout,
                    retry_cnt: 1,
                    rnr_retry: 1,
                    max_rd_atomic: 2,
                    max_dest_rd_atomic: 2,
                    qkey: 0x1111,
                    ..Default::default()
                };
                a.ah_attr.is_global = 1;
                a.ah_attr.port_num = port;
                a.ah_attr.grh.dgid = if own_gid {
                    gid
                } else {
                    ffi::ibv_gid { raw: [0xfe; 16] }
                };
                if !q.is_null() {
                    ibverbs::qp::ferroce_ibv_modify_qp(q, &mut a, mask as c_int);
                }
            }
            Op::QueryQp(i) => {
                let q = pick(&l.qps, i);
                let (mut a, mut init) = (
                    ffi::ibv_qp_attr::default(),
                    ffi::ibv_qp_init_attr::default(),
                );
                if !q.is_null() {
                    ibverbs::qp::ferroce_ibv_query_qp(q, &mut a, -1, &mut init);
                }
            }
            Op::DestroyQp(i) => {
                let q = pick(&l.qps, i);
                let rc = ibverbs::qp::ferroce_ibv_destroy_qp(q);
                gone(&mut l.qps, q, rc);
            }
            Op::PostSend {
                qp,
                opcode,
                flags,
                sges,
                nsge,
                remote,
                rkey,
                ah,
                mw,
            } => {
                let q = pick(&l.qps, qp);
                if q.is_null() {
                    continue;
                }
                let list = make_sges(&l, &sges);
                let mut wr = send_wr(&list, opcode);
                // Beyond the list's length only a smaller count is safe to claim.
                // A count past the list's length would make the library read past it.
                wr.num_sge = nsge.min(list.len() as c_int);
                wr.send_flags = flags;
                let rk = pick(&l.mrs, rkey.unwrap_or(usize::MAX));
                if opcode == ffi::IBV_WR_BIND_MW {
                    let b = &mut wr.__bindgen_anon_2.bind_mw;
                    b.mw = pick(&l.mws, mw.unwrap_or(usize::MAX));
                    b.rkey = remote as u32;
                    b.bind_info = ffi::ibv_mw_bind_info {
                        mr: rk,
                        addr: base as u64 + (remote % SCRATCH as u64),
                        length: remote >> 48,
                        mw_access_flags: (remote >> 40) as u32 & 0x1f,
                    };
                } else if (*q).qp_type == ffi::IBV_QPT_UD {
                    wr.wr.ud.ah = pick(&l.ahs, ah.unwrap_or(usize::MAX));
                    wr.wr.ud.remote_qpn = remote as u32;
                    wr.wr.ud.remote_qkey = 0x1111;
                } else if opcode == ffi::IBV_WR_ATOMIC_CMP_AND_SWP
                    || opcode == ffi::IBV_WR_ATOMIC_FETCH_AND_ADD
                {
                    wr.wr.atomic.remote_addr = base as u64 + (remote % SCRATCH as u64);
                    wr.wr.atomic.rkey = if rk.is_null() {
                        remote as u32
                    } else {
                        (*rk).rkey
                    };
                } else {
                    wr.wr.rdma.remote_addr = base as u64 + (remote % (SCRATCH as u64 * 2));
                    wr.wr.rdma.rkey = if rk.is_null() {
                        remote as u32
                    } else {
                        (*rk).rkey
                    };
                }
                let mut bad = null_mut();
                tally[usize::from(d.post_send(q, &mut wr, &mut bad) == 0)] += 1;
            }
            Op::PostRecv {
                qp,
                sges,
                nsge,
                srq,
            } => {
                let list = make_sges(&l, &sges);
                let mut wr = ffi::ibv_recv_wr {
                    sg_list: list.as_ptr() as *mut _,
                    num_sge: nsge.min(list.len() as c_int),
                    ..Default::default()
                };
                let mut bad = null_mut();
                if srq {
                    let s = pick(&l.srqs, qp);
                    if !s.is_null() {
                        ops_table.post_srq_recv.unwrap()(s, &mut wr, &mut bad);
                    }
                } else {
                    let q = pick(&l.qps, qp);
                    if !q.is_null() {
                        d.post_recv(q, &mut wr, &mut bad);
                    }
                }
            }
            Op::PollCq { cq, n } => {
                let c = pick(&l.cqs, cq);
                let mut wc = [ffi::ibv_wc::default(); 20];
                if !c.is_null() {
                    let got = d.poll(c, n, wc.as_mut_ptr());
                    assert!(got <= n.max(0), "poll_cq({n}) returned {got}");
                }
            }
            Op::AllocMw { pd, t } => {
                let p = pick(&l.pds, pd);
                if !p.is_null() {
                    let w = ops_table.alloc_mw.unwrap()(p, t);
                    if !w.is_null() {
                        l.mws.push(w);
                    }
                }
            }
            Op::BindMw {
                qp,
                mw,
                mr,
                off,
                len,
                access,
            } => {
                let (q, w) = (pick(&l.qps, qp), pick(&l.mws, mw));
                if !q.is_null() && !w.is_null() {
                    let mut b = ffi::ibv_mw_bind {
                        wr_id: 1,
                        send_flags: ffi::IBV_SEND_SIGNALED,
                        bind_info: ffi::ibv_mw_bind_info {
                            mr: pick(&l.mrs, mr.unwrap_or(usize::MAX)),
                            addr: base as u64 + off,
                            length: len,
                            mw_access_flags: access,
                        },
                    };
                    ops_table.bind_mw.unwrap()(q, w, &mut b);
                }
            }
            Op::DeallocMw(i) => {
                let w = pick(&l.mws, i);
                if !w.is_null() {
                    let rc = ops_table.dealloc_mw.unwrap()(w);
                    gone(&mut l.mws, w, rc);
                }
            }
            Op::CreateAh {
                pd,
                port,
                global,
                own_gid,
            } => {
                let mut a = ffi::ibv_ah_attr {
                    is_global: global as u8,
                    port_num: port,
                    ..Default::default()
                };
                a.grh.dgid = if own_gid {
                    gid
                } else {
                    ffi::ibv_gid { raw: [0xfe; 16] }
                };
                let h = ibverbs::ah::ferroce_ibv_create_ah(pick(&l.pds, pd), &mut a);
                if !h.is_null() {
                    l.ahs.push(h);
                }
            }
            Op::DestroyAh(i) => {
                let h = pick(&l.ahs, i);
                let rc = ibverbs::ah::ferroce_ibv_destroy_ah(h);
                gone(&mut l.ahs, h, rc);
            }
            Op::CreateFlow {
                qp,
                bytes,
                specs,
                port,
            } => {
                let q = pick(&l.qps, qp);
                if q.is_null() {
                    continue;
                }
                // The attributes, then the random bytes as specs; `size` says how many there are.
                let head = std::mem::size_of::<ffi::ibv_flow_attr>();
                let mut rule = vec![0u64; (head + bytes.len()).div_ceil(8)];
                let p = rule.as_mut_ptr() as *mut u8;
                std::ptr::copy_nonoverlapping(bytes.as_ptr(), p.add(head), bytes.len());
                let attr = p as *mut ffi::ibv_flow_attr;
                (*attr).size = (head + bytes.len()) as u16;
                (*attr).num_of_specs = specs;
                (*attr).port = port;
                let f = vctx.ibv_create_flow.unwrap()(q, attr);
                if !f.is_null() {
                    l.flows.push(f);
                }
            }
            Op::DestroyFlow(i) => {
                let f = pick(&l.flows, i);
                if !f.is_null() {
                    let rc = vctx.ibv_destroy_flow.unwrap()(f);
                    gone(&mut l.flows, f, rc);
                }
            }
            Op::AsyncEvent => {
                let mut e = std::mem::zeroed::<ffi::ibv_async_event>();
                if ibverbs::context::ferroce_ibv_get_async_event(d.ctx, &mut e) == 0 {
                    ibverbs::events::ferroce_ibv_ack_async_event(&mut e);
                }
            }
        }
    }
    // Everything left goes, in dependency order, each with status 0.
    for f in l.flows.drain(..) {
        assert_eq!(vctx.ibv_destroy_flow.unwrap()(f), 0);
    }
    for q in l.qps.drain(..) {
        assert_eq!(ibverbs::qp::ferroce_ibv_destroy_qp(q), 0);
    }
    for w in l.mws.drain(..) {
        assert_eq!(ops_table.dealloc_mw.unwrap()(w), 0);
    }
    for h in l.ahs.drain(..) {
        assert_eq!(ibverbs::ah::ferroce_ibv_destroy_ah(h), 0);
    }
    for s in l.srqs.drain(..) {
        assert_eq!(ibverbs::srq::ferroce_ibv_destroy_srq(s), 0);
    }
    for c in l.cqs.drain(..) {
        assert_eq!(ibverbs::cq::ferroce_ibv_destroy_cq(c), 0);
    }
    for m in l.mrs.drain(..) {
        assert_eq!(ibverbs::mr::ferroce_ibv_dereg_mr(m), 0);
    }
    for p in l.pds.drain(..) {
        assert_eq!(ibverbs::domain::ferroce_ibv_dealloc_pd(p), 0);
    }
    tally
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn random_verb_sequences_are_harmless(ops in proptest::collection::vec(op(), 1..80)) {
        let d = Dev::open();
        // Events are taken without blocking.
        // SAFETY: the context's own descriptor.
        unsafe {
            let fd = (*d.ctx).async_fd;
            libc::fcntl(fd, libc::F_SETFL, libc::fcntl(fd, libc::F_GETFL) | libc::O_NONBLOCK);
        }
        let before = ibverbs::objects::live_objects();
        let mut scratch = vec![0u8; SCRATCH];
        // SAFETY: every pointer handed in is a live object of its kind or null; lengths
        // stay inside `scratch`, which outlives every region over it.
        let tally = unsafe { run(&d, &mut scratch, &ops) };
        if std::env::var_os("FERROCE_TALLY").is_some() {
            eprintln!("posts refused {} accepted {}", tally[0], tally[1]);
        }
        prop_assert_eq!(ibverbs::objects::live_objects(), before, "objects leaked");
    }
}
