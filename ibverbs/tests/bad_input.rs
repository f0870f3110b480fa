//! Bad input through the C ABI: every verb given invalid arguments returns the errno
//! libibverbs gives (rdma-core's mlx5 provider where providers differ), and nothing crashes.
//! On a `loop` device (a port with a loopback plug): no root, no network.

use std::ffi::{c_int, c_void};
use std::ptr::{null, null_mut};

use ibverbs::ffi;

mod common;
use common::*;

#[test]
fn device_and_port_queries() {
    let d = Dev::open();
    unsafe {
        let mut pa = std::mem::MaybeUninit::<ffi::ibv_port_attr>::zeroed();
        assert_eq!(
            ibverbs::context::ferroce_ibv_query_port(d.ctx, 0, pa.as_mut_ptr().cast()),
            libc::EINVAL
        );
        assert_eq!(
            ibverbs::context::ferroce_ibv_query_port(d.ctx, 9, pa.as_mut_ptr().cast()),
            libc::EINVAL
        );
        assert_eq!(
            ibverbs::context::ferroce_ibv_query_port(null_mut(), 1, pa.as_mut_ptr().cast()),
            libc::EINVAL
        );
        let mut gid = ffi::ibv_gid::default();
        assert_eq!(
            ibverbs::context::ferroce_ibv_query_gid(d.ctx, 1, 4096, &mut gid),
            -1
        );
        assert_eq!(
            ibverbs::context::ferroce_ibv_query_gid(d.ctx, 7, 0, &mut gid),
            -1
        );
        let mut attr = ffi::ibv_device_attr::default();
        assert_eq!(
            ibverbs::caps::ferroce_ibv_query_device(null_mut(), &mut attr),
            libc::EINVAL
        );
        assert!(ibverbs::open::ferroce_ibv_open_device(null_mut()).is_null());
        assert_eq!(errno(), libc::ENODEV);
        assert_eq!(
            ibverbs::open::ferroce_ibv_close_device(null_mut()),
            libc::EINVAL
        );
    }
}

#[test]
fn memory_registration() {
    let d = Dev::open();
    let pd = d.pd();
    let mut buf = vec![0u8; 8192];
    let addr = buf.as_mut_ptr() as *mut c_void;
    unsafe {
        // Remote write or atomic without local write: EINVAL, as the kernel says.
        for bad in [
            ffi::IBV_ACCESS_REMOTE_WRITE,
            ffi::IBV_ACCESS_REMOTE_ATOMIC,
            ffi::IBV_ACCESS_REMOTE_WRITE | ffi::IBV_ACCESS_REMOTE_READ,
        ] {
            let mr = ibverbs::mr::ferroce_ibv_reg_mr(pd, addr, 8192, bad as c_int);
            assert!(mr.is_null(), "access {bad:#x}");
            assert_eq!(errno(), libc::EINVAL);
        }
        assert!(ibverbs::mr::ferroce_ibv_reg_mr(null_mut(), addr, 8192, 1).is_null());
        assert_eq!(errno(), libc::EINVAL);
        // An access bit no kernel knows (the optional range, bits 20 and up, libibverbs drops).
        assert!(ibverbs::mr::ferroce_ibv_reg_mr(pd, addr, 8192, 1 << 15).is_null());
        assert_eq!(errno(), libc::EINVAL);
        assert_eq!(ibverbs::mr::ferroce_ibv_dereg_mr(null_mut()), libc::EINVAL);
        // A PD with a region cannot go; without it, it can.
        let mr = ibverbs::mr::ferroce_ibv_reg_mr(pd, addr, 8192, 1);
        assert!(!mr.is_null());
        assert_eq!(ibverbs::domain::ferroce_ibv_dealloc_pd(pd), libc::EBUSY);
        // Re-registration with a bad flag or a PD of nothing.
        assert_eq!(
            ibverbs::mr::ferroce_ibv_rereg_mr(mr, 1 << 20, null_mut(), null_mut(), 0, 0),
            ffi::IBV_REREG_MR_ERR_INPUT as c_int
        );
        assert_eq!(ibverbs::mr::ferroce_ibv_dereg_mr(mr), 0);
    }
    d.close_pd(pd);
    drop(buf);
}

#[test]
fn completion_queues() {
    let d = Dev::open();
    let mut attr = ffi::ibv_device_attr::default();
    unsafe {
        assert_eq!(ibverbs::caps::ferroce_ibv_query_device(d.ctx, &mut attr), 0);
        for (cqe, vector) in [
            (0, 0),
            (-1, 0),
            (attr.max_cqe + 1, 0),
            (16, 1 << 20),
            (16, -1),
        ] {
            let cq = ibverbs::cq::ferroce_ibv_create_cq(d.ctx, cqe, null_mut(), null_mut(), vector);
            assert!(cq.is_null(), "cqe {cqe} vector {vector}");
            assert_eq!(errno(), libc::EINVAL, "cqe {cqe} vector {vector}");
        }
        let cq = d.cq(4);
        assert_eq!(ibverbs::cq::ferroce_ibv_resize_cq(cq, 0), libc::EINVAL);
        assert_eq!(
            ibverbs::cq::ferroce_ibv_resize_cq(cq, attr.max_cqe + 1),
            libc::EINVAL
        );
        assert_eq!(
            ibverbs::cq::ferroce_ibv_resize_cq(null_mut(), 8),
            libc::EINVAL
        );
        // Polling for a negative number of completions finds none.
        let mut wc = [ffi::ibv_wc::default(); 2];
        assert_eq!(d.poll(cq, -3, wc.as_mut_ptr()), 0);
        d.destroy_cq(cq);
        assert_eq!(
            ibverbs::cq::ferroce_ibv_destroy_cq(null_mut()),
            libc::EINVAL
        );
    }
}

#[test]
fn queue_pair_creation() {
    let d = Dev::open();
    let pd = d.pd();
    let cq = d.cq(16);
    let other = Dev::open();
    let foreign_cq = other.cq(16);
    unsafe {
        let mut attr = ffi::ibv_device_attr::default();
        assert_eq!(ibverbs::caps::ferroce_ibv_query_device(d.ctx, &mut attr), 0);
        // Types ferroce does not offer: EOPNOTSUPP; a type that is no type: EOPNOTSUPP too
        // (mlx5's kernel answers so for any type it does not know).
        for t in [
            ffi::IBV_QPT_XRC_SEND,
            ffi::IBV_QPT_XRC_RECV,
            ffi::IBV_QPT_DRIVER,
            77,
        ] {
            let mut init = rc_init(cq);
            init.qp_type = t;
            assert!(ibverbs::qp::create::ferroce_ibv_create_qp(pd, &mut init).is_null());
            assert_eq!(errno(), libc::EOPNOTSUPP, "type {t}");
        }
        let bad_caps: [fn(&mut ffi::ibv_qp_cap, &ffi::ibv_device_attr); 5] = [
            |c, a| c.max_send_wr = a.max_qp_wr as u32 + 1,
            |c, a| c.max_recv_wr = a.max_qp_wr as u32 + 1,
            |c, a| c.max_send_sge = a.max_sge as u32 + 1,
            |c, a| c.max_recv_sge = a.max_sge as u32 + 1,
            |c, _| c.max_inline_data = 1 << 20,
        ];
        for (i, f) in bad_caps.iter().enumerate() {
            let mut init = rc_init(cq);
            f(&mut init.cap, &attr);
            assert!(
                ibverbs::qp::create::ferroce_ibv_create_qp(pd, &mut init).is_null(),
                "cap {i}"
            );
            assert_eq!(errno(), libc::EINVAL, "cap {i}");
        }
        // No CQ, a CQ of another context, no PD.
        let mut init = rc_init(null_mut());
        assert!(ibverbs::qp::create::ferroce_ibv_create_qp(pd, &mut init).is_null());
        assert_eq!(errno(), libc::EINVAL);
        let mut init = rc_init(foreign_cq);
        assert!(ibverbs::qp::create::ferroce_ibv_create_qp(pd, &mut init).is_null());
        assert_eq!(errno(), libc::EINVAL);
        let mut init = rc_init(cq);
        assert!(ibverbs::qp::create::ferroce_ibv_create_qp(null_mut(), &mut init).is_null());
        assert_eq!(errno(), libc::EINVAL);
        assert!(ibverbs::qp::create::ferroce_ibv_create_qp(pd, null_mut()).is_null());
        assert_eq!(errno(), libc::EINVAL);
        // A CQ in use cannot go.
        let qp = d.qp(pd, cq, ffi::IBV_QPT_RC);
        assert_eq!(ibverbs::cq::ferroce_ibv_destroy_cq(cq), libc::EBUSY);
        assert_eq!(ibverbs::domain::ferroce_ibv_dealloc_pd(pd), libc::EBUSY);
        assert_eq!(ibverbs::qp::ferroce_ibv_destroy_qp(qp), 0);
        assert_eq!(
            ibverbs::qp::ferroce_ibv_destroy_qp(null_mut()),
            libc::EINVAL
        );
    }
    other.destroy_cq(foreign_cq);
    d.destroy_cq(cq);
    d.close_pd(pd);
}

#[test]
fn queue_pair_transitions() {
    let d = Dev::open();
    let pd = d.pd();
    let cq = d.cq(16);
    let qp = d.qp(pd, cq, ffi::IBV_QPT_RC);
    unsafe {
        let mut a = ffi::ibv_qp_attr {
            qp_state: ffi::IBV_QPS_RTS,
            ..Default::default()
        };
        // RESET to RTS skips two states.
        assert_eq!(
            ibverbs::qp::ferroce_ibv_modify_qp(qp, &mut a, ffi::IBV_QP_STATE as c_int),
            libc::EINVAL
        );
        // INIT without its required attributes, and with a port that does not exist.
        a.qp_state = ffi::IBV_QPS_INIT;
        assert_eq!(
            ibverbs::qp::ferroce_ibv_modify_qp(qp, &mut a, ffi::IBV_QP_STATE as c_int),
            libc::EINVAL
        );
        a.port_num = 3;
        let init_mask = ffi::IBV_QP_STATE
            | ffi::IBV_QP_PKEY_INDEX
            | ffi::IBV_QP_PORT
            | ffi::IBV_QP_ACCESS_FLAGS;
        assert_eq!(
            ibverbs::qp::ferroce_ibv_modify_qp(qp, &mut a, init_mask as c_int),
            libc::EINVAL
        );
        // A state that is no state; a null attribute.
        a.qp_state = 42;
        assert_eq!(
            ibverbs::qp::ferroce_ibv_modify_qp(qp, &mut a, ffi::IBV_QP_STATE as c_int),
            libc::EINVAL
        );
        assert_eq!(
            ibverbs::qp::ferroce_ibv_modify_qp(qp, null_mut(), ffi::IBV_QP_STATE as c_int),
            libc::EINVAL
        );
        // The QP is still in RESET after all that.
        let mut q = ffi::ibv_qp_attr::default();
        let mut i = ffi::ibv_qp_init_attr::default();
        assert_eq!(ibverbs::qp::ferroce_ibv_query_qp(qp, &mut q, 0, &mut i), 0);
        assert_eq!(q.qp_state, ffi::IBV_QPS_RESET);
        assert_eq!(
            ibverbs::qp::ferroce_ibv_query_qp(qp, null_mut(), 0, &mut i),
            libc::EINVAL
        );
        assert_eq!(ibverbs::qp::ferroce_ibv_destroy_qp(qp), 0);
    }
    d.destroy_cq(cq);
    d.close_pd(pd);
}

#[test]
fn posting() {
    let d = Dev::open();
    let pd = d.pd();
    let cq = d.cq(64);
    let (a, b) = d.connected_pair(pd, cq);
    let mut buf = vec![0u8; 1 << 16];
    let mr = d.mr(pd, &mut buf);
    unsafe {
        let lkey = (*mr).lkey;
        let sge = |len| ffi::ibv_sge {
            addr: buf.as_ptr() as u64,
            length: len,
            lkey,
        };
        // An opcode that is none: EINVAL, and bad_wr names it.
        let s = [sge(64)];
        let mut wr = send_wr(&s, 99);
        let mut bad = null_mut();
        assert_eq!(d.post_send(a, &mut wr, &mut bad), libc::EINVAL);
        assert_eq!(bad, &mut wr as *mut _);
        // More elements than the QP was granted: ENOMEM (mlx5).
        let many: Vec<_> = (0..8).map(|_| sge(8)).collect();
        let mut wr = send_wr(&many, ffi::IBV_WR_SEND);
        assert_eq!(d.post_send(a, &mut wr, &mut bad), libc::ENOMEM);
        // A negative count: EINVAL.
        let mut wr = send_wr(&s, ffi::IBV_WR_SEND);
        wr.num_sge = -1;
        assert_eq!(d.post_send(a, &mut wr, &mut bad), libc::EINVAL);
        // Inline data beyond what the QP was granted: ENOMEM (mlx5).
        let mut wr = send_wr(&s, ffi::IBV_WR_SEND);
        wr.send_flags = ffi::IBV_SEND_INLINE;
        let big = [sge(4096)];
        wr.sg_list = big.as_ptr() as *mut _;
        assert_eq!(d.post_send(a, &mut wr, &mut bad), libc::ENOMEM);
        // A receive list longer than the queue: the ones that fit are posted, the first
        // that does not is ENOMEM.
        let r = [sge(64)];
        let mut recvs: Vec<ffi::ibv_recv_wr> = (0..(RQ_DEPTH + 1))
            .map(|i| ffi::ibv_recv_wr {
                wr_id: i as u64,
                sg_list: r.as_ptr() as *mut _,
                num_sge: 1,
                ..Default::default()
            })
            .collect();
        for i in 0..recvs.len() - 1 {
            recvs[i].next = &mut recvs[i + 1];
        }
        let mut bad_r = null_mut();
        assert_eq!(d.post_recv(b, &mut recvs[0], &mut bad_r), libc::ENOMEM);
        assert_eq!(bad_r, &mut recvs[RQ_DEPTH as usize] as *mut _);
        // A receive with more elements than granted: EINVAL (mlx5).
        let mut rwr = ffi::ibv_recv_wr {
            sg_list: many.as_ptr() as *mut _,
            num_sge: 8,
            ..Default::default()
        };
        assert_eq!(d.post_recv(a, &mut rwr, &mut bad_r), libc::EINVAL);
        // A send queue filled past its depth: ENOMEM at the first that does not fit. The QP
        // talks to a QPN nobody has, so nothing is acknowledged and nothing leaves the queue
        // (a WR holds its slot until acknowledged, as on rxe; mlx5 until its completion is
        // polled).
        let c = d.qp(pd, cq, ffi::IBV_QPT_RC);
        d.to_rts(c, 0xabcde, 20);
        let mut sends: Vec<ffi::ibv_send_wr> = (0..SQ_DEPTH + 1)
            .map(|_| send_wr(&s, ffi::IBV_WR_RDMA_WRITE))
            .collect();
        for w in &mut sends {
            w.wr.rdma.remote_addr = buf.as_ptr() as u64;
            w.wr.rdma.rkey = (*mr).rkey;
            w.send_flags = ffi::IBV_SEND_SIGNALED;
        }
        for i in 0..sends.len() - 1 {
            sends[i].next = &mut sends[i + 1];
        }
        let rc = d.post_send(c, &mut sends[0], &mut bad);
        if rc == 0 {
            panic!("{} WRs fit a send queue of {SQ_DEPTH}", SQ_DEPTH + 1);
        }
        assert_eq!(rc, libc::ENOMEM);
        assert_eq!(bad, &mut sends[SQ_DEPTH as usize] as *mut _);
        // Null lists and QPs.
        assert_eq!(d.post_send(null_mut(), &mut wr, &mut bad), libc::EINVAL);
        assert_eq!(d.post_recv(null_mut(), &mut rwr, &mut bad_r), libc::EINVAL);
        assert_eq!(d.post_send(a, null_mut(), &mut bad), 0);
        d.drain(cq);
        for q in [a, b, c] {
            assert_eq!(ibverbs::qp::ferroce_ibv_destroy_qp(q), 0);
        }
        assert_eq!(ibverbs::mr::ferroce_ibv_dereg_mr(mr), 0);
    }
    d.destroy_cq(cq);
    d.close_pd(pd);
}

#[test]
fn memory_window_bound_outside_its_region() {
    let d = Dev::open();
    let pd = d.pd();
    let cq = d.cq(64);
    let (a, b) = d.connected_pair(pd, cq);
    let mut buf = vec![0u8; 1 << 16];
    let mr = d.mr(pd, &mut buf);
    unsafe {
        let alloc = (*d.ctx).ops.alloc_mw.unwrap();
        let bind = (*d.ctx).ops.bind_mw.unwrap();
        let dealloc = (*d.ctx).ops.dealloc_mw.unwrap();
        assert!(alloc(pd, 7).is_null());
        assert_eq!(errno(), libc::EINVAL);
        assert!(alloc(null_mut(), ffi::IBV_MW_TYPE_1).is_null());
        assert_eq!(errno(), libc::EINVAL);
        // Type 1 over bytes past the region's end: the bind completes in error, as on mlx5,
        // and the window opens nothing.
        let mw = alloc(pd, ffi::IBV_MW_TYPE_1);
        assert!(!mw.is_null());
        let mut mb = ffi::ibv_mw_bind {
            wr_id: 5,
            send_flags: ffi::IBV_SEND_SIGNALED,
            bind_info: ffi::ibv_mw_bind_info {
                mr,
                addr: buf.as_ptr() as u64 + 4096,
                length: 1 << 16,
                mw_access_flags: ffi::IBV_ACCESS_REMOTE_READ,
            },
        };
        let rc = bind(a, mw, &mut mb);
        if rc == 0 {
            let wc = d.wait(cq);
            assert_eq!(wc.wr_id, 5);
            assert_eq!(wc.status, ffi::IBV_WC_MW_BIND_ERR);
        } else {
            assert_eq!(rc, libc::EINVAL);
        }
        // Type 2 needs a WR; ibv_bind_mw on it is EINVAL.
        let mw2 = alloc(pd, ffi::IBV_MW_TYPE_2);
        assert!(!mw2.is_null());
        mb.bind_info.length = 64;
        assert_eq!(bind(b, mw2, &mut mb), libc::EINVAL);
        assert_eq!(dealloc(mw), 0);
        assert_eq!(dealloc(mw2), 0);
        d.drain(cq);
        for q in [a, b] {
            assert_eq!(ibverbs::qp::ferroce_ibv_destroy_qp(q), 0);
        }
        assert_eq!(ibverbs::mr::ferroce_ibv_dereg_mr(mr), 0);
    }
    d.destroy_cq(cq);
    d.close_pd(pd);
}

#[test]
fn flow_specs_that_make_no_sense() {
    let d = Dev::open();
    let pd = d.pd();
    let cq = d.cq(16);
    let raw = d.qp(pd, cq, ffi::IBV_QPT_RAW_PACKET);
    let rc = d.qp(pd, cq, ffi::IBV_QPT_RC);
    unsafe {
        let create = d.vctx().ibv_create_flow.unwrap();
        // A rule claiming one spec, followed by a spec whose size is not its type's.
        #[repr(C)]
        struct Rule {
            attr: ffi::ibv_flow_attr,
            eth: ffi::ibv_flow_spec_eth,
        }
        let good = || Rule {
            attr: ffi::ibv_flow_attr {
                size: std::mem::size_of::<Rule>() as u16,
                num_of_specs: 1,
                port: 1,
                ..Default::default()
            },
            eth: ffi::ibv_flow_spec_eth {
                type_: ffi::IBV_FLOW_SPEC_ETH,
                size: std::mem::size_of::<ffi::ibv_flow_spec_eth>() as u16,
                ..Default::default()
            },
        };
        let mut r = good();
        r.eth.size = 7;
        assert!(create(raw, &mut r.attr).is_null());
        assert_eq!(errno(), libc::EINVAL);
        let mut r = good();
        r.attr.num_of_specs = 3;
        assert!(create(raw, &mut r.attr).is_null());
        assert_eq!(errno(), libc::EINVAL);
        let mut r = good();
        r.eth.type_ = 0x7777;
        assert!(create(raw, &mut r.attr).is_null());
        assert!([libc::EINVAL, libc::EOPNOTSUPP].contains(&errno()));
        let mut r = good();
        r.attr.port = 5;
        assert!(create(raw, &mut r.attr).is_null());
        assert_eq!(errno(), libc::EINVAL);
        // Flow steering is for raw packet QPs.
        let mut r = good();
        assert!(create(rc, &mut r.attr).is_null());
        assert!([libc::EINVAL, libc::EOPNOTSUPP].contains(&errno()));
        // And a good one, to show the failures were the input's.
        let mut r = good();
        let f = create(raw, &mut r.attr);
        assert!(!f.is_null(), "errno {}", errno());
        assert_eq!(d.vctx().ibv_destroy_flow.unwrap()(f), 0);
        for q in [raw, rc] {
            assert_eq!(ibverbs::qp::ferroce_ibv_destroy_qp(q), 0);
        }
    }
    d.destroy_cq(cq);
    d.close_pd(pd);
}

#[test]
fn shared_receive_queues() {
    let d = Dev::open();
    let pd = d.pd();
    unsafe {
        let mut attr = ffi::ibv_device_attr::default();
        assert_eq!(ibverbs::caps::ferroce_ibv_query_device(d.ctx, &mut attr), 0);
        for (wr, sge) in [
            (attr.max_srq_wr as u32 + 1, 1),
            (16, attr.max_srq_sge as u32 + 1),
        ] {
            let mut init = ffi::ibv_srq_init_attr {
                attr: ffi::ibv_srq_attr {
                    max_wr: wr,
                    max_sge: sge,
                    srq_limit: 0,
                },
                ..Default::default()
            };
            assert!(ibverbs::srq::ferroce_ibv_create_srq(pd, &mut init).is_null());
            assert_eq!(errno(), libc::EINVAL, "max_wr {wr} max_sge {sge}");
        }
        let mut init = ffi::ibv_srq_init_attr {
            attr: ffi::ibv_srq_attr {
                max_wr: 16,
                max_sge: 1,
                srq_limit: 0,
            },
            ..Default::default()
        };
        let srq = ibverbs::srq::ferroce_ibv_create_srq(pd, &mut init);
        assert!(!srq.is_null());
        // A limit above the size, an unknown mask bit.
        let mut a = ffi::ibv_srq_attr {
            srq_limit: 1000,
            ..Default::default()
        };
        assert_eq!(
            ibverbs::srq::ferroce_ibv_modify_srq(srq, &mut a, ffi::IBV_SRQ_LIMIT as c_int),
            libc::EINVAL
        );
        assert_eq!(
            ibverbs::srq::ferroce_ibv_modify_srq(srq, &mut a, 1 << 7),
            libc::EINVAL
        );
        assert_eq!(ibverbs::srq::ferroce_ibv_destroy_srq(srq), 0);
        assert_eq!(
            ibverbs::srq::ferroce_ibv_destroy_srq(null_mut()),
            libc::EINVAL
        );
    }
    d.close_pd(pd);
}

#[test]
fn address_handles() {
    let d = Dev::open();
    let pd = d.pd();
    unsafe {
        // RoCE needs a GRH; port 9 does not exist.
        let mut a = ffi::ibv_ah_attr {
            port_num: 1,
            ..Default::default()
        };
        assert!(ibverbs::ah::ferroce_ibv_create_ah(pd, &mut a).is_null());
        assert_eq!(errno(), libc::EINVAL);
        a.is_global = 1;
        a.port_num = 9;
        assert!(ibverbs::ah::ferroce_ibv_create_ah(pd, &mut a).is_null());
        assert_eq!(errno(), libc::EINVAL);
        assert!(ibverbs::ah::ferroce_ibv_create_ah(null_mut(), &mut a).is_null());
        assert_eq!(errno(), libc::EINVAL);
        assert!(ibverbs::ah::ferroce_ibv_create_ah(pd, null_mut()).is_null());
        assert_eq!(errno(), libc::EINVAL);
        assert_eq!(
            ibverbs::ah::ferroce_ibv_destroy_ah(null_mut()),
            libc::EINVAL
        );
    }
    d.close_pd(pd);
    let _ = null::<u8>();
}
