//! Calling the drop-in through its C ABI from Rust, as a program does: a `loop` device (a
//! port with a loopback plug; no root, no network) and the steps every test repeats.

#![allow(dead_code, unreachable_pub)]

use std::ffi::{c_int, c_void};
use std::ptr::null_mut;
use std::sync::Once;

use ibverbs::ffi;

/// The send and receive queue depths [`Dev::qp`] asks for.
pub const SQ_DEPTH: u32 = 16;
pub const RQ_DEPTH: u32 = 16;

/// The calling thread's errno.
pub fn errno() -> c_int {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// An open context of the process's `loop` device; closed on drop.
pub struct Dev {
    pub ctx: *mut ffi::ibv_context,
}

impl Dev {
    pub fn open() -> Self {
        static ENV: Once = Once::new();
        ENV.call_once(|| std::env::set_var(ibverbs::device::DEVICES_ENV, "loop"));
        // SAFETY: the device list is the library's own; one entry at least (checked).
        unsafe {
            let mut n = 0;
            let list = ibverbs::device::ferroce_ibv_get_device_list(&mut n);
            assert!(n >= 1 && !list.is_null());
            let ctx = ibverbs::open::ferroce_ibv_open_device(*list);
            ibverbs::device::ferroce_ibv_free_device_list(list);
            assert!(!ctx.is_null(), "open_device: errno {}", errno());
            Self { ctx }
        }
    }

    /// The extended context around `ctx`.
    pub fn vctx(&self) -> &ffi::verbs_context {
        // SAFETY: every context of the library is the `context` field of a verbs_context.
        unsafe {
            &*((self.ctx as *mut u8).sub(std::mem::offset_of!(ffi::verbs_context, context))
                as *const ffi::verbs_context)
        }
    }

    pub fn pd(&self) -> *mut ffi::ibv_pd {
        // SAFETY: a live context.
        let pd = unsafe { ibverbs::domain::ferroce_ibv_alloc_pd(self.ctx) };
        assert!(!pd.is_null());
        pd
    }

    pub fn close_pd(&self, pd: *mut ffi::ibv_pd) {
        // SAFETY: a live PD with nothing left in it.
        assert_eq!(unsafe { ibverbs::domain::ferroce_ibv_dealloc_pd(pd) }, 0);
    }

    pub fn cq(&self, n: c_int) -> *mut ffi::ibv_cq {
        // SAFETY: a live context.
        let cq =
            unsafe { ibverbs::cq::ferroce_ibv_create_cq(self.ctx, n, null_mut(), null_mut(), 0) };
        assert!(!cq.is_null(), "create_cq: errno {}", errno());
        cq
    }

    pub fn destroy_cq(&self, cq: *mut ffi::ibv_cq) {
        // SAFETY: a live CQ no QP uses.
        assert_eq!(unsafe { ibverbs::cq::ferroce_ibv_destroy_cq(cq) }, 0);
    }

    /// A region over `buf` with every right.
    pub fn mr(&self, pd: *mut ffi::ibv_pd, buf: &mut [u8]) -> *mut ffi::ibv_mr {
        let all = ffi::IBV_ACCESS_LOCAL_WRITE
            | ffi::IBV_ACCESS_REMOTE_WRITE
            | ffi::IBV_ACCESS_REMOTE_READ
            | ffi::IBV_ACCESS_REMOTE_ATOMIC
            | ffi::IBV_ACCESS_MW_BIND;
        // SAFETY: `buf` outlives the region (the callers deregister first).
        let mr = unsafe {
            ibverbs::mr::ferroce_ibv_reg_mr(
                pd,
                buf.as_mut_ptr() as *mut c_void,
                buf.len(),
                all as c_int,
            )
        };
        assert!(!mr.is_null(), "reg_mr: errno {}", errno());
        mr
    }

    pub fn qp(
        &self,
        pd: *mut ffi::ibv_pd,
        cq: *mut ffi::ibv_cq,
        t: ffi::ibv_qp_type,
    ) -> *mut ffi::ibv_qp {
        let mut init = rc_init(cq);
        init.qp_type = t;
        // SAFETY: live PD and CQ.
        let qp = unsafe { ibverbs::qp::create::ferroce_ibv_create_qp(pd, &mut init) };
        assert!(!qp.is_null(), "create_qp: errno {}", errno());
        qp
    }

    /// Takes an RC QP to RTS, connected to `dest` on the port's own GID.
    pub fn to_rts(&self, qp: *mut ffi::ibv_qp, dest: u32, timeout: u8) {
        let mut gid = ffi::ibv_gid::default();
        // SAFETY: live context and QP; whole attribute structures.
        unsafe {
            assert_eq!(
                ibverbs::context::ferroce_ibv_query_gid(self.ctx, 1, 0, &mut gid),
                0
            );
            let mut a = ffi::ibv_qp_attr {
                qp_state: ffi::IBV_QPS_INIT,
                port_num: 1,
                qp_access_flags: ffi::IBV_ACCESS_REMOTE_WRITE
                    | ffi::IBV_ACCESS_REMOTE_READ
                    | ffi::IBV_ACCESS_REMOTE_ATOMIC,
                ..Default::default()
            };
            let m = ffi::IBV_QP_STATE
                | ffi::IBV_QP_PKEY_INDEX
                | ffi::IBV_QP_PORT
                | ffi::IBV_QP_ACCESS_FLAGS;
            assert_eq!(
                ibverbs::qp::ferroce_ibv_modify_qp(qp, &mut a, m as c_int),
                0
            );
            let mut a = ffi::ibv_qp_attr {
                qp_state: ffi::IBV_QPS_RTR,
                path_mtu: ffi::IBV_MTU_1024,
                dest_qp_num: dest,
                rq_psn: 7,
                max_dest_rd_atomic: 4,
                min_rnr_timer: 1,
                ..Default::default()
            };
            a.ah_attr.is_global = 1;
            a.ah_attr.grh.dgid = gid;
            a.ah_attr.grh.hop_limit = 64;
            a.ah_attr.port_num = 1;
            let m = ffi::IBV_QP_STATE
                | ffi::IBV_QP_AV
                | ffi::IBV_QP_PATH_MTU
                | ffi::IBV_QP_DEST_QPN
                | ffi::IBV_QP_RQ_PSN
                | ffi::IBV_QP_MAX_DEST_RD_ATOMIC
                | ffi::IBV_QP_MIN_RNR_TIMER;
            assert_eq!(
                ibverbs::qp::ferroce_ibv_modify_qp(qp, &mut a, m as c_int),
                0
            );
            let mut a = ffi::ibv_qp_attr {
                qp_state: ffi::IBV_QPS_RTS,
                sq_psn: 7,
                timeout,
                retry_cnt: 7,
                rnr_retry: 7,
                max_rd_atomic: 4,
                ..Default::default()
            };
            let m = ffi::IBV_QP_STATE
                | ffi::IBV_QP_SQ_PSN
                | ffi::IBV_QP_TIMEOUT
                | ffi::IBV_QP_RETRY_CNT
                | ffi::IBV_QP_RNR_RETRY
                | ffi::IBV_QP_MAX_QP_RD_ATOMIC;
            assert_eq!(
                ibverbs::qp::ferroce_ibv_modify_qp(qp, &mut a, m as c_int),
                0
            );
        }
    }

    /// Two RC QPs on `cq`, connected to each other through the port's own GID.
    pub fn connected_pair(
        &self,
        pd: *mut ffi::ibv_pd,
        cq: *mut ffi::ibv_cq,
    ) -> (*mut ffi::ibv_qp, *mut ffi::ibv_qp) {
        let (a, b) = (
            self.qp(pd, cq, ffi::IBV_QPT_RC),
            self.qp(pd, cq, ffi::IBV_QPT_RC),
        );
        // SAFETY: live QPs.
        let (na, nb) = unsafe { ((*a).qp_num, (*b).qp_num) };
        self.to_rts(a, nb, 14);
        self.to_rts(b, na, 14);
        (a, b)
    }

    pub fn post_send(
        &self,
        qp: *mut ffi::ibv_qp,
        wr: *mut ffi::ibv_send_wr,
        bad: *mut *mut ffi::ibv_send_wr,
    ) -> c_int {
        // SAFETY: the ops table's entry, as the header's inline calls it.
        unsafe { (*self.ctx).ops.post_send.unwrap()(qp, wr, bad) }
    }

    pub fn post_recv(
        &self,
        qp: *mut ffi::ibv_qp,
        wr: *mut ffi::ibv_recv_wr,
        bad: *mut *mut ffi::ibv_recv_wr,
    ) -> c_int {
        // SAFETY: as above.
        unsafe { (*self.ctx).ops.post_recv.unwrap()(qp, wr, bad) }
    }

    pub fn poll(&self, cq: *mut ffi::ibv_cq, n: c_int, wc: *mut ffi::ibv_wc) -> c_int {
        // SAFETY: as above.
        unsafe { (*self.ctx).ops.poll_cq.unwrap()(cq, n, wc) }
    }

    /// The next completion (within 10 s of polling).
    pub fn wait(&self, cq: *mut ffi::ibv_cq) -> ffi::ibv_wc {
        let mut wc = ffi::ibv_wc::default();
        let end = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::time::Instant::now() < end {
            if self.poll(cq, 1, &mut wc) == 1 {
                return wc;
            }
            std::thread::yield_now();
        }
        panic!("no completion within 10 s");
    }

    /// Polls until nothing more arrives for 50 ms.
    pub fn drain(&self, cq: *mut ffi::ibv_cq) {
        let mut wc = [ffi::ibv_wc::default(); 16];
        let mut quiet = std::time::Instant::now();
        while quiet.elapsed() < std::time::Duration::from_millis(50) {
            if self.poll(cq, 16, wc.as_mut_ptr()) > 0 {
                quiet = std::time::Instant::now();
            }
        }
    }
}

impl Drop for Dev {
    fn drop(&mut self) {
        // SAFETY: opened in `open`, closed once.
        let rc = unsafe { ibverbs::open::ferroce_ibv_close_device(self.ctx) };
        if !std::thread::panicking() {
            assert_eq!(rc, 0);
        }
    }
}

/// Creation attributes of an RC QP on `cq` with [`SQ_DEPTH`], [`RQ_DEPTH`], two elements
/// each way and 64 bytes inline.
pub fn rc_init(cq: *mut ffi::ibv_cq) -> ffi::ibv_qp_init_attr {
    ffi::ibv_qp_init_attr {
        send_cq: cq,
        recv_cq: cq,
        qp_type: ffi::IBV_QPT_RC,
        cap: ffi::ibv_qp_cap {
            max_send_wr: SQ_DEPTH,
            max_recv_wr: RQ_DEPTH,
            max_send_sge: 2,
            max_recv_sge: 2,
            max_inline_data: 64,
        },
        ..Default::default()
    }
}

/// A send WR of `sges` with opcode `op`.
pub fn send_wr(sges: &[ffi::ibv_sge], op: ffi::ibv_wr_opcode) -> ffi::ibv_send_wr {
    ffi::ibv_send_wr {
        wr_id: 1,
        sg_list: sges.as_ptr() as *mut _,
        num_sge: sges.len() as c_int,
        opcode: op,
        ..Default::default()
    }
}
