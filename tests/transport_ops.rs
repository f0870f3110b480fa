//! Every operation on RC, UC and UD over a clean simulated link: bytes land where they
//! should, completions carry the right opcode, status, length, immediate and flags.

mod support;

use ferroce::drivers::sim::LinkModel;
use ferroce::stack::transport::{
    Access, Mtu, Payload, PostError, QpType, RecvWr, SendFlags, SendWr, Sge, UdDest, WcFlags,
    WcOpcode, WcStatus, WrOpcode,
};
use ferroce::stack::wire::Qpn;
use support::*;

const MEM: usize = 1 << 20;

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn sge<P>(h: &Host<P>, addr: usize, len: usize) -> Sge {
    Sge {
        addr: addr as u64,
        length: len as u32,
        lkey: h.keys.lkey,
    }
}

fn clean(seed: u64) -> Testbed {
    pair(seed, LinkModel::new(100_000_000_000, 1_000), MEM)
}

fn take(w: &mut Testbed, host: usize) -> Vec<ferroce::stack::transport::WorkCompletion> {
    std::mem::take(&mut w.hosts[host].completions)
}

#[test]
fn rc_every_operation() {
    seeded([1, 2, 3], |seed| {
        let mut w = clean(seed);
        let o = ConnOpts::default();
        w.connect(
            QpType::Rc,
            ((0, 0x11), (1, 0x22)),
            (0xff_fff0, 0x12_3456),
            &o,
            None,
        );
        let a_src = pattern(1, 3000);
        w.hosts[0].write(0, &a_src);
        let b_data = pattern(7, 5000);
        w.hosts[1].write(0x8000, &b_data);
        w.hosts[1].write(0xd_0000, &40u64.to_ne_bytes());

        // Receives on b: two plain, one for a WRITE_WITH_IMM, one scattered over two SGEs.
        let bk = w.hosts[1].keys.lkey;
        let b = &mut w.hosts[1];
        for (id, at) in [(100u64, 0x1_0000usize), (101, 0x2_0000), (102, 0x3_0000)] {
            let s = [Sge {
                addr: at as u64,
                length: 4096,
                lkey: bk,
            }];
            b.qp(0x22)
                .post_recv(&RecvWr {
                    wr_id: id,
                    sg_list: &s,
                })
                .unwrap();
        }
        let split = [
            Sge {
                addr: 0x4_0000,
                length: 1000,
                lkey: bk,
            },
            Sge {
                addr: 0x4_1000,
                length: 3000,
                lkey: bk,
            },
        ];
        b.qp(0x22)
            .post_recv(&RecvWr {
                wr_id: 103,
                sg_list: &split,
            })
            .unwrap();
        let s = [Sge {
            addr: 0x5_0000,
            length: 64,
            lkey: bk,
        }];
        b.qp(0x22)
            .post_recv(&RecvWr {
                wr_id: 104,
                sg_list: &s,
            })
            .unwrap();

        let h = &w.hosts[0];
        let whole = [sge(h, 0, 3000)];
        let gather = [sge(h, 0, 1000), sge(h, 1000, 2000)];
        let read_to = [sge(h, 0x6_0000, 5000)];
        let atomic_to = [sge(h, 0x7_0000, 8)];
        let atomic_to2 = [sge(h, 0x7_0008, 8)];
        let bkey = w.hosts[1].keys.rkey;
        let wrs = [
            SendWr::new(1, WrOpcode::Send, Payload::Sges(&whole))
                .flags(SendFlags::SIGNALED.with(SendFlags::SOLICITED)),
            SendWr::new(2, WrOpcode::SendWithImm, Payload::Sges(&gather)).imm(0xdead_beef),
            SendWr::new(3, WrOpcode::Write, Payload::Sges(&whole)).remote(0xa_0000, bkey),
            SendWr::new(4, WrOpcode::WriteWithImm, Payload::Sges(&whole))
                .remote(0xb_0000, bkey)
                .imm(7),
            SendWr::new(5, WrOpcode::Read, Payload::Sges(&read_to)).remote(0x8000, bkey),
            SendWr {
                compare_add: 40,
                swap: 99,
                ..SendWr::new(6, WrOpcode::CmpSwp, Payload::Sges(&atomic_to)).remote(0xd_0000, bkey)
            },
            SendWr {
                compare_add: 5,
                ..SendWr::new(7, WrOpcode::FetchAdd, Payload::Sges(&atomic_to2))
                    .remote(0xd_0000, bkey)
            },
            SendWr::new(8, WrOpcode::Send, Payload::Sges(&whole)),
            // Unsignaled: completes silently.
            SendWr::new(9, WrOpcode::Write, Payload::Sges(&whole))
                .remote(0xc_0000, bkey)
                .flags(SendFlags(0)),
            SendWr::new(10, WrOpcode::Send, Payload::Inline(b"inline hello"))
                .flags(SendFlags::SIGNALED.with(SendFlags::INLINE)),
        ];
        for wr in &wrs {
            w.hosts[0].qp(0x11).post_send(wr).unwrap();
        }
        assert!(w.drive_until(1_000_000_000), "did not go idle");

        let a = take(&mut w, 0);
        let ids: Vec<u64> = a.iter().map(|c| c.wr_id).collect();
        assert_eq!(ids, [1, 2, 3, 4, 5, 6, 7, 8, 10], "{a:#?}");
        assert!(a.iter().all(|c| c.status == WcStatus::Success), "{a:#?}");
        let ops: Vec<WcOpcode> = a.iter().map(|c| c.opcode).collect();
        use WcOpcode::*;
        assert_eq!(
            ops,
            [Send, Send, RdmaWrite, RdmaWrite, RdmaRead, CompSwap, FetchAdd, Send, Send]
        );
        assert_eq!(a[4].byte_len, 5000);

        let bb = w.hosts[1].bytes();
        let ab = w.hosts[0].bytes();
        assert_eq!(&bb[0x1_0000..0x1_0000 + 3000], &a_src[..]);
        assert_eq!(&bb[0x2_0000..0x2_0000 + 3000], &a_src[..]);
        assert_eq!(&bb[0xa_0000..0xa_0000 + 3000], &a_src[..]);
        assert_eq!(&bb[0xb_0000..0xb_0000 + 3000], &a_src[..]);
        assert_eq!(&bb[0xc_0000..0xc_0000 + 3000], &a_src[..]);
        assert_eq!(&bb[0x4_0000..0x4_0000 + 1000], &a_src[..1000]);
        assert_eq!(&bb[0x4_1000..0x4_1000 + 2000], &a_src[1000..]);
        assert_eq!(&bb[0x5_0000..0x5_0000 + 12], b"inline hello");
        assert_eq!(&ab[0x6_0000..0x6_0000 + 5000], &b_data[..]);
        // CAS found 40 and swapped in 99; FETCH_ADD found 99 and left 104.
        assert_eq!(w.hosts[0].word(0x7_0000), 40);
        assert_eq!(w.hosts[0].word(0x7_0008), 99);
        assert_eq!(w.hosts[1].word(0xd_0000), 104);

        let r = take(&mut w, 1);
        let ids: Vec<u64> = r.iter().map(|c| c.wr_id).collect();
        assert_eq!(ids, [100, 101, 102, 103, 104], "{r:#?}");
        assert!(r
            .iter()
            .all(|c| c.status == WcStatus::Success && c.qp_num == Qpn::new(0x22)));
        assert_eq!(r[0].opcode, Recv);
        assert!(r[0].solicited);
        assert_eq!(r[0].byte_len, 3000);
        assert_eq!(
            (r[1].imm_data, r[1].wc_flags),
            (0xdead_beef, WcFlags::WITH_IMM)
        );
        assert_eq!(r[2].opcode, RecvRdmaWithImm);
        assert_eq!((r[2].imm_data, r[2].byte_len), (7, 3000));
        assert_eq!(r[3].byte_len, 3000);
        assert_eq!(r[4].byte_len, 12);
        let c = w.hosts[1].qps().next().unwrap().counters();
        assert_eq!((c.duplicate_request, c.out_of_sequence), (0, 0));
    });
}

#[test]
fn rc_send_with_invalidate_revokes_the_key() {
    seeded([4], |seed| {
        let mut w = clean(seed);
        w.connect(
            QpType::Rc,
            ((0, 1), (1, 2)),
            (0, 0),
            &ConnOpts::default(),
            None,
        );
        // A second region on b, which the SEND_WITH_INV revokes.
        let b = &mut w.hosts[1];
        let extra = b.register_window(PD, 0x8_0000, 4096, ALL).unwrap();
        let s = [Sge {
            addr: 0x1000,
            length: 64,
            lkey: b.keys.lkey,
        }];
        b.qp(2)
            .post_recv(&RecvWr {
                wr_id: 1,
                sg_list: &s,
            })
            .unwrap();
        let src = [sge(&w.hosts[0], 0, 16)];
        let wr = SendWr::new(1, WrOpcode::SendWithInv, Payload::Sges(&src)).imm(extra.rkey);
        w.hosts[0].qp(1).post_send(&wr).unwrap();
        assert!(w.drive_until(1_000_000_000));
        let r = take(&mut w, 1);
        assert_eq!(r.len(), 1);
        assert_eq!(
            (r[0].status, r[0].imm_data),
            (WcStatus::Success, extra.rkey)
        );
        assert!(r[0].wc_flags.contains(WcFlags::WITH_INV));
        // A WRITE with the revoked key now fails with a remote access error.
        let wr = SendWr::new(2, WrOpcode::Write, Payload::Sges(&src)).remote(0x8_0000, extra.rkey);
        w.hosts[0].qp(1).post_send(&wr).unwrap();
        assert!(w.drive_until(1_000_000_000));
        let a = take(&mut w, 0);
        assert_eq!(a.last().unwrap().status, WcStatus::RemAccessErr, "{a:#?}");
    });
}

#[test]
fn rc_every_path_mtu() {
    seeded([5], |seed| {
        for (i, mtu) in [
            Mtu::Mtu256,
            Mtu::Mtu512,
            Mtu::Mtu1024,
            Mtu::Mtu2048,
            Mtu::Mtu4096,
        ]
        .into_iter()
        .enumerate()
        {
            let mut w = clean(seed + i as u64);
            let o = ConnOpts {
                mtu,
                ..ConnOpts::default()
            };
            w.connect(QpType::Rc, ((0, 1), (1, 2)), (100, 200), &o, None);
            let len = 10_000 + i * 7;
            let data = pattern(i as u8, len);
            w.hosts[0].write(0, &data);
            let bk = w.hosts[1].keys;
            let s = [Sge {
                addr: 0x4_0000,
                length: len as u32,
                lkey: bk.lkey,
            }];
            w.hosts[1]
                .qp(2)
                .post_recv(&RecvWr {
                    wr_id: 9,
                    sg_list: &s,
                })
                .unwrap();
            let src = [sge(&w.hosts[0], 0, len)];
            let back = [sge(&w.hosts[0], 0x8_0000, len)];
            let q = w.hosts[0].qp(1);
            q.post_send(
                &SendWr::new(1, WrOpcode::Write, Payload::Sges(&src)).remote(0x1_0000, bk.rkey),
            )
            .unwrap();
            q.post_send(&SendWr::new(2, WrOpcode::Send, Payload::Sges(&src)))
                .unwrap();
            q.post_send(
                &SendWr::new(3, WrOpcode::Read, Payload::Sges(&back)).remote(0x1_0000, bk.rkey),
            )
            .unwrap();
            assert!(w.drive_until(1_000_000_000));
            let a = take(&mut w, 0);
            assert_eq!(a.len(), 3, "{mtu:?}: {a:#?}");
            assert!(
                a.iter().all(|c| c.status == WcStatus::Success),
                "{mtu:?}: {a:#?}"
            );
            assert_eq!(&w.hosts[1].read(0x1_0000, len)[..], &data[..]);
            assert_eq!(&w.hosts[1].read(0x4_0000, len)[..], &data[..]);
            assert_eq!(&w.hosts[0].read(0x8_0000, len)[..], &data[..]);
            // Packets on the wire: ceil(len / mtu) per direction of data, plus requests/ACKs.
            let pkts = len.div_ceil(mtu.bytes() as usize) as u64;
            let c = *w.hosts[0].qps().next().unwrap().counters();
            assert_eq!(c.tx_packets, 2 * pkts + 1, "{mtu:?}");
        }
    });
}

#[test]
fn uc_send_and_write() {
    seeded([6], |seed| {
        let mut w = clean(seed);
        w.connect(
            QpType::Uc,
            ((0, 3), (1, 4)),
            (0xff_ffff, 0xff_ffff),
            &ConnOpts::default(),
            None,
        );
        let data = pattern(3, 2500);
        w.hosts[0].write(0, &data);
        let bk = w.hosts[1].keys;
        for id in 0..2u64 {
            let s = [Sge {
                addr: 0x1_0000 * (id + 1),
                length: 4096,
                lkey: bk.lkey,
            }];
            w.hosts[1]
                .qp(4)
                .post_recv(&RecvWr {
                    wr_id: id,
                    sg_list: &s,
                })
                .unwrap();
        }
        let src = [sge(&w.hosts[0], 0, 2500)];
        let q = w.hosts[0].qp(3);
        q.post_send(&SendWr::new(1, WrOpcode::Send, Payload::Sges(&src)))
            .unwrap();
        q.post_send(
            &SendWr::new(2, WrOpcode::Write, Payload::Sges(&src)).remote(0x8_0000, bk.rkey),
        )
        .unwrap();
        q.post_send(
            &SendWr::new(3, WrOpcode::WriteWithImm, Payload::Sges(&src))
                .remote(0x9_0000, bk.rkey)
                .imm(5),
        )
        .unwrap();
        let err = q.post_send(&SendWr::new(4, WrOpcode::Read, Payload::Sges(&src)));
        assert!(matches!(err, Err(PostError::UnsupportedOpcode { .. })));
        assert!(w.drive_until(1_000_000_000));
        let a = take(&mut w, 0);
        assert_eq!(
            a.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
            [
                (1, WcStatus::Success),
                (2, WcStatus::Success),
                (3, WcStatus::Success)
            ]
        );
        let r = take(&mut w, 1);
        assert_eq!(r.len(), 2, "{r:#?}");
        assert_eq!((r[0].opcode, r[0].byte_len), (WcOpcode::Recv, 2500));
        assert_eq!((r[1].opcode, r[1].imm_data), (WcOpcode::RecvRdmaWithImm, 5));
        let bb = w.hosts[1].bytes();
        assert_eq!(&bb[0x1_0000..0x1_0000 + 2500], &data[..]);
        assert_eq!(&bb[0x8_0000..0x8_0000 + 2500], &data[..]);
        assert_eq!(&bb[0x9_0000..0x9_0000 + 2500], &data[..]);
        // UC never acknowledges.
        assert_eq!(w.hosts[1].qps().next().unwrap().counters().tx_packets, 0);
    });
}

#[test]
fn ud_send_with_deth_grh_and_qkey() {
    seeded([7], |seed| {
        let mut w = clean(seed);
        w.hosts[0].add_qp(0x100, QpType::Ud);
        w.hosts[1].add_qp(0x200, QpType::Ud);
        let o = ConnOpts::default();
        w.bring_up((0, 0x100), (1, 0x200), (0, 0), &o);
        w.bring_up((1, 0x200), (0, 0x100), (0, 0), &o);
        let bk = w.hosts[1].keys.lkey;
        for id in 0..3u64 {
            let s = [Sge {
                addr: 0x1_0000 * (id + 1),
                length: 40 + 1024,
                lkey: bk,
            }];
            w.hosts[1]
                .qp(0x200)
                .post_recv(&RecvWr {
                    wr_id: id,
                    sg_list: &s,
                })
                .unwrap();
        }
        let data = pattern(9, 1000);
        w.hosts[0].write(0, &data);
        let peer_mac = w.hosts[1].mac();
        let av = w.hosts[0].av_to(peer_mac, w.hosts[1].ip);
        let dest = |qkey| UdDest {
            av,
            remote_qpn: Qpn::new(0x200),
            remote_qkey: qkey,
        };
        let src = [sge(&w.hosts[0], 0, 1000)];
        let big = [sge(&w.hosts[0], 0, 1025)];
        let q = w.hosts[0].qp(0x100);
        q.post_send(&SendWr {
            ud: Some(dest(o.qkey)),
            ..SendWr::new(1, WrOpcode::SendWithImm, Payload::Sges(&src)).imm(77)
        })
        .unwrap();
        // Wrong Q_Key: dropped at b.
        q.post_send(&SendWr {
            ud: Some(dest(0x2222)),
            ..SendWr::new(2, WrOpcode::Send, Payload::Sges(&src))
        })
        .unwrap();
        // Controlled Q_Key (top bit): the QP's own key is sent.
        q.post_send(&SendWr {
            ud: Some(dest(0x8000_0000)),
            ..SendWr::new(3, WrOpcode::Send, Payload::Sges(&src))
        })
        .unwrap();
        assert!(w.drive_until(1_000_000_000));
        let a = take(&mut w, 0);
        assert_eq!(
            a.iter().map(|c| c.status).collect::<Vec<_>>(),
            [WcStatus::Success; 3]
        );
        let r = take(&mut w, 1);
        assert_eq!(r.len(), 2, "{r:#?}");
        assert_eq!(r[0].byte_len, 1040);
        assert_eq!(r[0].src_qp, Qpn::new(0x100));
        assert_eq!(r[0].imm_data, 77);
        assert!(r[0].wc_flags.contains(WcFlags::GRH.with(WcFlags::WITH_IMM)));
        assert_eq!(r[0].smac, w.hosts[0].mac());
        let bb = w.hosts[1].bytes();
        // GRH area: 20 zero bytes, then the IPv4 header (version 4, IHL 5; source 10.0.0.1).
        assert_eq!(&bb[0x1_0000..0x1_0000 + 20], &[0u8; 20]);
        assert_eq!(bb[0x1_0000 + 20], 0x45);
        assert_eq!(&bb[0x1_0000 + 32..0x1_0000 + 36], &[10, 0, 0, 1]);
        assert_eq!(&bb[0x1_0000 + 40..0x1_0000 + 1040], &data[..]);
        assert_eq!(
            w.hosts[1].qps().next().unwrap().counters().qkey_violations,
            1
        );
        // Larger than the MTU: local length error, and the send queue goes to SQE.
        let q = w.hosts[0].qp(0x100);
        q.post_send(&SendWr {
            ud: Some(dest(o.qkey)),
            ..SendWr::new(4, WrOpcode::Send, Payload::Sges(&big))
        })
        .unwrap();
        assert!(w.drive_until(1_000_000_000));
        let a = take(&mut w, 0);
        assert_eq!(a[0].status, WcStatus::LocLenErr);
        assert_eq!(
            w.hosts[0].qp(0x100).state(),
            ferroce::stack::transport::QpState::Sqe
        );
        let _ = Access::NONE;
    });
}

/// RDMA ATOMIC WRITE (IBTA 1.5, opcode 0x1d): the 8 bytes land in one store and the WR
/// completes as `IBV_WC_ATOMIC_WRITE`; a misaligned address is refused with a remote access
/// error and writes nothing; UC cannot post it.
#[test]
fn rc_atomic_write_lands_eight_bytes_at_once() {
    seeded([6], |seed| {
        let mut w = clean(seed);
        w.connect(
            QpType::Rc,
            ((0, 1), (1, 2)),
            (0, 0),
            &ConnOpts::default(),
            None,
        );
        let rkey = w.hosts[1].keys.rkey;
        let data = 0x1122_3344_5566_7788u64.to_ne_bytes();
        let wr = SendWr::new(9, WrOpcode::AtomicWrite, Payload::Inline(&data)).remote(0x7000, rkey);
        w.hosts[0].qp(1).post_send(&wr).unwrap();
        assert!(w.drive_until(1_000_000_000));
        let a = take(&mut w, 0);
        assert_eq!(a.len(), 1);
        assert_eq!(
            (a[0].wr_id, a[0].status, a[0].opcode),
            (9, WcStatus::Success, WcOpcode::AtomicWrite)
        );
        assert_eq!(w.hosts[1].read(0x7000, 8), data);
        // Not 8 bytes: refused at post.
        let short = [1u8; 4];
        let wr =
            SendWr::new(10, WrOpcode::AtomicWrite, Payload::Inline(&short)).remote(0x7000, rkey);
        assert_eq!(
            w.hosts[0].qp(1).post_send(&wr),
            Err(PostError::AtomicLength)
        );
        // Misaligned: NAK remote access error, nothing written.
        let other = 0xaaaa_aaaa_aaaa_aaaau64.to_ne_bytes();
        let wr =
            SendWr::new(11, WrOpcode::AtomicWrite, Payload::Inline(&other)).remote(0x7004, rkey);
        w.hosts[0].qp(1).post_send(&wr).unwrap();
        assert!(w.drive_until(1_000_000_000));
        let a = take(&mut w, 0);
        assert_eq!(a[0].status, WcStatus::RemAccessErr, "{a:#?}");
        assert_eq!(w.hosts[1].read(0x7000, 8), data);
    });
}
