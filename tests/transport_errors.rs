//! Negative paths: every refused access NAKs with the spec's syndrome and writes nothing;
//! RNR waits and recovers or gives up; a dead link ends in RETRY_EXC_ERR with everything
//! flushed, without hanging or spinning; local errors complete with the local status.

mod support;

use ferroce::drivers::sim::LinkModel;
use ferroce::stack::transport::{
    Access, AttrMask, ModifyError, Payload, PdId, PostError, QpAttr, QpState, QpType, RecvWr,
    SendWr, Sge, WcStatus, WorkCompletion, WrOpcode,
};
use support::*;

const MEM: usize = 1 << 20;

fn world(seed: u64) -> Testbed {
    let mut w = pair(seed, LinkModel::new(25_000_000_000, 2_000), MEM);
    w.connect(
        QpType::Rc,
        ((0, 1), (1, 2)),
        (0xff_fffe, 0x10),
        &ConnOpts::default(),
        None,
    );
    w
}

fn src(w: &Testbed, len: u32) -> [Sge; 1] {
    [Sge {
        addr: 0,
        length: len,
        lkey: w.hosts[0].keys.lkey,
    }]
}

fn statuses(c: &[WorkCompletion]) -> Vec<(u64, WcStatus)> {
    c.iter().map(|c| (c.wr_id, c.status)).collect()
}

/// Posts `bad` then two good WRITEs behind it; checks the requester completes `bad` with
/// `want`, flushes the rest, both QPs end in ERR, and b's memory is untouched.
fn refused(seed: u64, bad: impl Fn(&mut Testbed) -> SendWr<'static>, want: WcStatus) {
    let mut w = world(seed);
    w.hosts[0].write(0, &[0xab; 64]);
    let before = w.hosts[1].bytes();
    let wr = bad(&mut w);
    w.hosts[0].qp(1).post_send(&wr).unwrap();
    let s = Box::leak(Box::new(src(&w, 64)));
    let rkey = w.hosts[1].keys.rkey;
    for id in [2, 3] {
        let ok = SendWr::new(id, WrOpcode::Write, Payload::Sges(s)).remote(0x100, rkey);
        w.hosts[0].qp(1).post_send(&ok).unwrap();
    }
    assert!(w.drive_until(10_000_000_000), "hung");
    assert_eq!(
        statuses(&w.hosts[0].completions),
        [
            (1, want),
            (2, WcStatus::WrFlushErr),
            (3, WcStatus::WrFlushErr)
        ]
    );
    assert_eq!(w.hosts[0].qp(1).state(), QpState::Err);
    assert_eq!(w.hosts[1].qp(2).state(), QpState::Err);
    assert!(
        w.hosts[1].bytes() == before,
        "the responder wrote something"
    );
    // Later posts are flushed at once.
    let late = SendWr::new(9, WrOpcode::Write, Payload::Sges(s)).remote(0, rkey);
    w.hosts[0].qp(1).post_send(&late).unwrap();
    let last = w.hosts[0].qp(1).poll_completion().unwrap();
    assert_eq!((last.wr_id, last.status), (9, WcStatus::WrFlushErr));
}

#[test]
fn bad_rkey_is_a_remote_access_error() {
    seeded([11], |seed| {
        refused(
            seed,
            |w| {
                let s = Box::leak(Box::new(src(w, 64)));
                let rkey = w.hosts[1].keys.rkey ^ 0x5a5a;
                SendWr::new(1, WrOpcode::Write, Payload::Sges(s)).remote(0x100, rkey)
            },
            WcStatus::RemAccessErr,
        );
    });
}

#[test]
fn out_of_bounds_is_a_remote_access_error() {
    seeded([12], |seed| {
        refused(
            seed,
            |w| {
                let s = Box::leak(Box::new(src(w, 64)));
                let rkey = w.hosts[1].keys.rkey;
                SendWr::new(1, WrOpcode::Write, Payload::Sges(s)).remote(MEM as u64 - 63, rkey)
            },
            WcStatus::RemAccessErr,
        );
        // READ past the end, too.
        refused(
            seed,
            |w| {
                let s = Box::leak(Box::new([Sge {
                    addr: 0x1000,
                    length: 64,
                    lkey: w.hosts[0].keys.lkey,
                }]));
                let rkey = w.hosts[1].keys.rkey;
                SendWr::new(1, WrOpcode::Read, Payload::Sges(s)).remote(MEM as u64 - 8, rkey)
            },
            WcStatus::RemAccessErr,
        );
    });
}

/// Registers 4 KiB of b's buffer at 0x8_0000 with `access` in `pd`; returns its rkey.
fn extra_region(w: &mut Testbed, pd: PdId, access: Access) -> u32 {
    w.hosts[1]
        .register_window(pd, 0x8_0000, 4096, access)
        .unwrap()
        .rkey
}

#[test]
fn missing_access_flag_is_a_remote_access_error() {
    seeded([13], |seed| {
        for (op, lacks) in [
            (
                WrOpcode::Write,
                Access::LOCAL_WRITE.with(Access::REMOTE_READ),
            ),
            (
                WrOpcode::Read,
                Access::LOCAL_WRITE.with(Access::REMOTE_WRITE),
            ),
            (
                WrOpcode::FetchAdd,
                Access::LOCAL_WRITE.with(Access::REMOTE_WRITE),
            ),
        ] {
            refused(
                seed,
                |w| {
                    let rkey = extra_region(w, PD, lacks);
                    let len = if op == WrOpcode::FetchAdd { 8 } else { 64 };
                    let s = Box::leak(Box::new([Sge {
                        addr: 0x1000,
                        length: len,
                        lkey: w.hosts[0].keys.lkey,
                    }]));
                    SendWr::new(1, op, Payload::Sges(s)).remote(0x8_0000, rkey)
                },
                WcStatus::RemAccessErr,
            );
        }
    });
}

#[test]
fn wrong_pd_is_a_remote_access_error() {
    seeded([14], |seed| {
        refused(
            seed,
            |w| {
                let rkey = extra_region(w, PdId(2), ALL);
                let s = Box::leak(Box::new(src(w, 64)));
                SendWr::new(1, WrOpcode::Write, Payload::Sges(s)).remote(0x8_0000, rkey)
            },
            WcStatus::RemAccessErr,
        );
    });
}

#[test]
fn misaligned_atomic_is_an_invalid_request() {
    seeded([15], |seed| {
        refused(
            seed,
            |w| {
                let s = Box::leak(Box::new([Sge {
                    addr: 0x1000,
                    length: 8,
                    lkey: w.hosts[0].keys.lkey,
                }]));
                let rkey = w.hosts[1].keys.rkey;
                SendWr {
                    compare_add: 1,
                    ..SendWr::new(1, WrOpcode::FetchAdd, Payload::Sges(s)).remote(0x104, rkey)
                }
            },
            WcStatus::RemInvReqErr,
        );
    });
}

#[test]
fn receive_too_small_is_an_invalid_request_and_a_local_length_error() {
    seeded([16], |seed| {
        let mut w = world(seed);
        let bk = w.hosts[1].keys.lkey;
        let tiny = [Sge {
            addr: 0x100,
            length: 10,
            lkey: bk,
        }];
        w.hosts[1]
            .qp(2)
            .post_recv(&RecvWr {
                wr_id: 50,
                sg_list: &tiny,
            })
            .unwrap();
        w.hosts[1]
            .qp(2)
            .post_recv(&RecvWr {
                wr_id: 51,
                sg_list: &tiny,
            })
            .unwrap();
        let s = src(&w, 64);
        w.hosts[0]
            .qp(1)
            .post_send(&SendWr::new(1, WrOpcode::Send, Payload::Sges(&s)))
            .unwrap();
        assert!(w.drive_until(10_000_000_000));
        assert_eq!(
            statuses(&w.hosts[0].completions),
            [(1, WcStatus::RemInvReqErr)]
        );
        assert_eq!(
            statuses(&w.hosts[1].completions),
            [(50, WcStatus::LocLenErr), (51, WcStatus::WrFlushErr)]
        );
    });
}

#[test]
fn bad_lkey_is_a_local_protection_error() {
    seeded([17], |seed| {
        let mut w = world(seed);
        let s = [Sge {
            addr: 0,
            length: 64,
            lkey: 0xdead_beef,
        }];
        let rkey = w.hosts[1].keys.rkey;
        let q = w.hosts[0].qp(1);
        q.post_send(&SendWr::new(1, WrOpcode::Write, Payload::Sges(&s)).remote(0, rkey))
            .unwrap();
        q.post_send(&SendWr::new(2, WrOpcode::Write, Payload::Sges(&s)).remote(0, rkey))
            .unwrap();
        assert!(w.drive_until(10_000_000_000));
        assert_eq!(
            statuses(&w.hosts[0].completions),
            [(1, WcStatus::LocProtErr), (2, WcStatus::WrFlushErr)]
        );
        assert_eq!(
            w.hosts[0].qps().next().unwrap().counters().tx_packets,
            0,
            "sent garbage"
        );
    });
}

#[test]
fn rnr_then_success_once_a_receive_is_posted() {
    seeded([18], |seed| {
        let mut w = world(seed);
        let s = src(&w, 100);
        w.hosts[0]
            .qp(1)
            .post_send(&SendWr::new(1, WrOpcode::Send, Payload::Sges(&s)))
            .unwrap();
        // min_rnr_timer 1 = 10 µs; run 1 ms with no receive posted.
        assert!(!w.drive_until(1_000_000));
        assert!(w.hosts[0].completions.is_empty());
        let c = *w.hosts[0].qps().next().unwrap().counters();
        assert!(c.rnr_naks_received >= 10, "{c:?}");
        assert_eq!(
            w.hosts[1].qps().next().unwrap().counters().out_of_buffer,
            c.rnr_naks_received
        );
        let bk = w.hosts[1].keys.lkey;
        let r = [Sge {
            addr: 0x2000,
            length: 100,
            lkey: bk,
        }];
        w.hosts[1]
            .qp(2)
            .post_recv(&RecvWr {
                wr_id: 7,
                sg_list: &r,
            })
            .unwrap();
        assert!(w.drive_until(10_000_000_000));
        assert_eq!(statuses(&w.hosts[0].completions), [(1, WcStatus::Success)]);
        assert_eq!(statuses(&w.hosts[1].completions), [(7, WcStatus::Success)]);
    });
}

#[test]
fn rnr_retry_exhausted() {
    seeded([19], |seed| {
        let mut w = pair(seed, LinkModel::new(25_000_000_000, 2_000), MEM);
        let o = ConnOpts {
            rnr_retry: 2,
            ..ConnOpts::default()
        };
        w.connect(QpType::Rc, ((0, 1), (1, 2)), (5, 5), &o, None);
        let s = src(&w, 100);
        let q = w.hosts[0].qp(1);
        q.post_send(&SendWr::new(1, WrOpcode::Send, Payload::Sges(&s)))
            .unwrap();
        q.post_send(&SendWr::new(2, WrOpcode::Send, Payload::Sges(&s)))
            .unwrap();
        assert!(w.drive_until(10_000_000_000), "hung");
        assert_eq!(
            statuses(&w.hosts[0].completions),
            [(1, WcStatus::RnrRetryExcErr), (2, WcStatus::WrFlushErr)]
        );
        let c = *w.hosts[0].qps().next().unwrap().counters();
        assert_eq!((c.rnr_naks_received, c.rnr_nak_retry_err), (3, 1));
        assert_eq!(w.hosts[0].qp(1).state(), QpState::Err);
    });
}

#[test]
fn link_down_for_good_ends_in_retry_exceeded() {
    seeded([20, 21], |seed| {
        // The link dies 50 µs in and never comes back.
        let model = LinkModel {
            schedule: vec![(50_000, false)],
            ..LinkModel::new(25_000_000_000, 2_000)
        };
        let mut w = pair(seed, model, MEM);
        let o = ConnOpts {
            timeout: 10,
            retry_cnt: 3,
            ..ConnOpts::default()
        };
        w.connect(QpType::Rc, ((0, 1), (1, 2)), (0, 0), &o, None);
        let s = src(&w, 4000);
        let rkey = w.hosts[1].keys.rkey;
        for id in 0..100 {
            let wr = SendWr::new(id, WrOpcode::Write, Payload::Sges(&s)).remote(0x1000, rkey);
            w.hosts[0].qp(1).post_send(&wr).unwrap();
        }
        // Virtual time is bounded by (retry_cnt + 1) timeouts of 4.2 ms; the loop goes idle.
        assert!(w.drive_until(60_000_000_000), "hung");
        assert!(w.fabric.now() < 30_000_000, "took {} ns", w.fabric.now());
        let c = &w.hosts[0].completions;
        assert_eq!(c.len(), 100, "every WR completes once");
        let failed: Vec<_> = c
            .iter()
            .filter(|c| c.status == WcStatus::RetryExcErr)
            .collect();
        assert_eq!(failed.len(), 1);
        let ok = c
            .iter()
            .take_while(|c| c.status == WcStatus::Success)
            .count();
        assert!(c[ok..]
            .iter()
            .skip(1)
            .all(|c| c.status == WcStatus::WrFlushErr));
        assert_eq!(w.hosts[0].qp(1).state(), QpState::Err);
        let k = *w.hosts[0].qps().next().unwrap().counters();
        assert_eq!(k.local_ack_timeout_err, 4);
        // No busy loop: at most one window per try was sent.
        assert!(k.tx_packets <= 4 * 2048 + 400, "{k:?}");
        assert_eq!(w.hosts[0].qp(1).poll_timeout(), None);
    });
}

#[test]
fn state_rules_reject_early_posts_and_illegal_transitions() {
    let mut w = pair(1, LinkModel::default(), 4096);
    w.hosts[0].add_qp(1, QpType::Rc);
    let q = w.hosts[0].qp(1);
    let s = [Sge {
        addr: 0,
        length: 8,
        lkey: 0,
    }];
    let wr = SendWr::new(1, WrOpcode::Send, Payload::Sges(&s));
    assert_eq!(
        q.post_send(&wr),
        Err(PostError::InvalidState(QpState::Reset))
    );
    assert_eq!(
        q.post_recv(&RecvWr {
            wr_id: 1,
            sg_list: &s
        }),
        Err(PostError::InvalidState(QpState::Reset))
    );
    let to_rts = QpAttr {
        qp_state: QpState::Rts,
        ..QpAttr::default()
    };
    assert!(matches!(
        q.modify(&to_rts, AttrMask::STATE),
        Err(ModifyError::IllegalTransition { .. })
    ));
    let init = QpAttr {
        qp_state: QpState::Init,
        ..QpAttr::default()
    };
    assert!(matches!(
        q.modify(&init, AttrMask::STATE),
        Err(ModifyError::MissingAttributes { .. })
    ));
    let m = AttrMask::STATE
        .with(AttrMask::PKEY_INDEX)
        .with(AttrMask::PORT)
        .with(AttrMask::ACCESS_FLAGS);
    q.modify(&init, m).unwrap();
    assert_eq!(
        q.post_send(&wr),
        Err(PostError::InvalidState(QpState::Init))
    );
    // Receives may be posted from INIT on.
    q.post_recv(&RecvWr {
        wr_id: 2,
        sg_list: &s,
    })
    .unwrap();
    // ERR flushes them.
    let err = QpAttr {
        qp_state: QpState::Err,
        ..QpAttr::default()
    };
    q.modify(&err, AttrMask::STATE).unwrap();
    let c = q.poll_completion().unwrap();
    assert_eq!((c.wr_id, c.status), (2, WcStatus::WrFlushErr));
}
