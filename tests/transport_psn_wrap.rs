//! PSNs are 24 bits and wrap: a lossy run across the wrap point on the sim fabric, and a run
//! through the whole PSN space (2^24 packets and more) back to back in memory.

mod support;

use ferroce::drivers::sim::{LinkModel, Loss};
use ferroce::stack::transport::loopback::{connect, Loopback};
use ferroce::stack::transport::{
    Access, MrTable, Mtu, Payload, PdId, Qp, QpAttr, QpConfig, QpType, SendFlags, SendWr, Sge,
    WcStatus, WrOpcode,
};
use ferroce::stack::wire::{Psn, Qpn};
use support::*;

#[test]
fn wrap_under_loss_on_the_sim() {
    seeded([31, 32, 33], |seed| {
        let model = LinkModel {
            loss: Loss::Bernoulli(0.02),
            reorder: 0.01,
            ..LinkModel::new(25_000_000_000, 3_000)
        };
        let mut w = pair(seed, model, 4 << 20);
        let start = (1 << 24) - 700;
        let o = ConnOpts {
            mtu: Mtu::Mtu256,
            timeout: 12,
            ..ConnOpts::default()
        };
        w.connect(QpType::Rc, ((0, 1), (1, 2)), (start, 0), &o, None);
        let mut r = Rng(seed);
        let fill: Vec<u8> = (0..1 << 20).map(|_| r.next() as u8).collect();
        w.hosts[0].write(0, &fill);
        let rkey = w.hosts[1].keys.rkey;
        let lkey = w.hosts[0].keys.lkey;
        for i in 0..300u64 {
            let s = [Sge {
                addr: i * 2048,
                length: 2048,
                lkey,
            }];
            let wr = SendWr::new(i, WrOpcode::Write, Payload::Sges(&s)).remote(i * 2048, rkey);
            w.hosts[0].qp(1).post_send(&wr).unwrap();
        }
        assert!(w.drive_until(60_000_000_000));
        let c = &w.hosts[0].completions;
        assert_eq!(c.len(), 300);
        assert!(c
            .iter()
            .enumerate()
            .all(|(i, c)| c.wr_id == i as u64 && c.status == WcStatus::Success));
        assert!(w.hosts[0].bytes()[..300 * 2048] == w.hosts[1].bytes()[..300 * 2048]);
        // 300 WRITEs of 8 packets: the send PSN wrapped to 2400 - 700.
        assert_eq!(w.hosts[0].qp(1).query().sq_psn, Psn::new(300 * 8 - 700));
        assert_eq!(w.hosts[1].qp(2).query().rq_psn, Psn::new(300 * 8 - 700));
        assert!(
            w.hosts[0]
                .qps()
                .next()
                .unwrap()
                .counters()
                .retransmitted_packets
                > 0
        );
    });
}

/// 2^24 + 8192 packets through one RC connection: every PSN is used once, then wraps. In
/// debug builds this takes minutes, so the test command runs it with the release profile.
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "2^24 packets; scripts/test-all.sh runs it in release"
)]
fn a_run_through_the_whole_psn_space() {
    const MSG: usize = 4096;
    const PKTS_PER_MSG: u64 = 16; // 256-byte MTU
    let total_msgs = ((1u64 << 24) + 8192) / PKTS_PER_MSG;
    let mut src = vec![0u8; MSG];
    for (i, b) in src.iter_mut().enumerate() {
        *b = (i * 7) as u8;
    }
    let mut dst = vec![0u8; MSG * 4];
    let pd = PdId(1);
    let mut mem_a = MrTable::new(1);
    let mut mem_b = MrTable::new(2);
    // SAFETY: `src` and `dst` outlive the loopback, which is dropped at the end of the test.
    let ka = unsafe { mem_a.register(pd, src.as_mut_ptr(), MSG, 0, Access::LOCAL_WRITE) }.unwrap();
    let all = Access::LOCAL_WRITE.with(Access::REMOTE_WRITE);
    // SAFETY: as above.
    let kb = unsafe { mem_b.register(pd, dst.as_mut_ptr(), dst.len(), 0, all) }.unwrap();
    let mut a = Qp::new(QpConfig::new(Qpn::new(0x10), QpType::Rc, pd));
    let mut b = Qp::new(QpConfig::new(Qpn::new(0x20), QpType::Rc, pd));
    let start = 0xab_cdef;
    let attr = QpAttr {
        path_mtu: Mtu::Mtu256,
        sq_psn: Psn::new(start),
        rq_psn: Psn::new(0),
        qp_access_flags: Access::REMOTE_WRITE,
        ..QpAttr::default()
    };
    connect(&mut a, &mut b, &attr).unwrap();
    let mut lo = Loopback::new(a, b, mem_a, mem_b);
    let s = [Sge {
        addr: 0,
        length: MSG as u32,
        lkey: ka.lkey,
    }];
    let mut posted = 0u64;
    let mut completed = 0u64;
    while completed < total_msgs {
        while posted < total_msgs && lo.a.send_queue_len() < 512 {
            let signaled = posted % 64 == 63 || posted + 1 == total_msgs;
            let flags = if signaled {
                SendFlags::SIGNALED
            } else {
                SendFlags(0)
            };
            let at = (posted % 4) * MSG as u64;
            let wr = SendWr::new(posted, WrOpcode::Write, Payload::Sges(&s))
                .remote(at, kb.rkey)
                .flags(flags);
            lo.a.post_send(&wr).unwrap();
            posted += 1;
        }
        lo.run();
        while let Some(c) = lo.a.poll_completion() {
            assert_eq!(c.status, WcStatus::Success);
            completed = c.wr_id + 1;
        }
    }
    let packets = total_msgs * PKTS_PER_MSG;
    assert!(packets > 1 << 24);
    let end = Psn::new(start).add(packets as u32);
    assert_eq!(lo.a.query().sq_psn, end);
    assert_eq!(lo.b.query().rq_psn, end);
    let c = *lo.a.counters();
    assert_eq!(c.tx_packets, packets);
    assert_eq!((c.retransmitted_packets, c.local_ack_timeout_err), (0, 0));
    assert_eq!(lo.b.counters().duplicate_request, 0);
    drop(lo);
    assert!(dst.chunks(MSG).all(|d| d == &src[..]));
}
