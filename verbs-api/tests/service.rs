//! `ferroce serve` end to end, in one process: a service over a `loop` device (a port with
//! a loopback plug) and programs attached to it through its socket, their QPs connected
//! through the port. Every byte that moves is checked where it lands, in the program's own
//! buffer, which the service reached through shared memory.

mod service_common;

use std::time::{Duration, Instant};

use ferroce_stack::transport::{
    bring_up, Access, Payload, QpAttr, QpCaps, QpState, QpType, RecvWr, SendWr, WcOpcode, WcStatus,
    WrOpcode,
};
use ferroce_verbs::service::Client;
use service_common::*;

/// The program the kill test starts (see `service_common::child_main`).
#[test]
fn child_program() {
    child_main();
}

#[test]
fn write_send_read_and_atomics_land_in_the_programs_own_buffers() {
    let svc = serve("ops");
    let (mut a, b) = pair(&svc);
    for i in 0..LEN {
        a.buf.set(i, (i * 7 + 3) as u8);
    }
    // WRITE 16 KiB of A's buffer into B's at offset 4096.
    let sge = [a.mr.sge(0, 16 << 10)];
    let wr = SendWr::new(1, WrOpcode::Write, Payload::Sges(&sge))
        .remote(b.mr.addr() + 4096, b.mr.rkey());
    a.qp.post_send(&[wr]).unwrap();
    let wc = a.wait(1);
    assert_eq!(
        (wc[0].wr_id, wc[0].status, wc[0].opcode),
        (1, WcStatus::Success, WcOpcode::RdmaWrite)
    );
    assert_eq!(
        b.buf.range(4096..4096 + (16 << 10)),
        a.buf.range(0..16 << 10)
    );
    assert!(b.buf.range(0..4096).iter().all(|&x| x == 0));

    // SEND with immediate, 3000 bytes, into a posted receive at B's offset 32 KiB.
    let rsge = [b.mr.sge(32 << 10, 4096)];
    b.qp.post_recv(&[RecvWr {
        wr_id: 7,
        sg_list: &rsge,
    }])
    .unwrap();
    let sge = [a.mr.sge(100, 3000)];
    let wr = SendWr::new(2, WrOpcode::SendWithImm, Payload::Sges(&sge)).imm(0xfeed);
    a.qp.post_send(&[wr]).unwrap();
    assert_eq!(a.wait(1)[0].status, WcStatus::Success);
    let r = b.wait(1)[0];
    assert_eq!(
        (r.wr_id, r.status, r.opcode, r.byte_len, r.imm_data),
        (7, WcStatus::Success, WcOpcode::Recv, 3000, 0xfeed)
    );
    assert_eq!(r.qp_num, b.qp.qpn());
    assert_eq!(
        b.buf.range(32 << 10..(32 << 10) + 3000),
        a.buf.range(100..3100)
    );

    // Inline SEND: the bytes travel in the ring, not from registered memory.
    b.qp.post_recv(&[RecvWr {
        wr_id: 8,
        sg_list: &rsge,
    }])
    .unwrap();
    let msg = b"inline through the ring, 40 bytes long!!";
    let wr = SendWr::new(3, WrOpcode::Send, Payload::Inline(msg));
    a.qp.post_send(&[wr]).unwrap();
    assert_eq!(a.wait(1)[0].status, WcStatus::Success);
    assert_eq!(b.wait(1)[0].byte_len, msg.len() as u32);
    assert_eq!(b.buf.range(32 << 10..(32 << 10) + msg.len()), msg);

    // READ B's bytes back into A at offset 48 KiB.
    let sge = [a.mr.sge(48 << 10, 8192)];
    let wr =
        SendWr::new(4, WrOpcode::Read, Payload::Sges(&sge)).remote(b.mr.addr() + 4096, b.mr.rkey());
    a.qp.post_send(&[wr]).unwrap();
    let wc = a.wait(1)[0];
    assert_eq!(
        (wc.status, wc.opcode, wc.byte_len),
        (WcStatus::Success, WcOpcode::RdmaRead, 8192)
    );
    assert_eq!(
        a.buf.range(48 << 10..(48 << 10) + 8192),
        b.buf.range(4096..4096 + 8192)
    );

    // Fetch-and-add on B's word at offset 60 KiB, twice.
    let target = b.mr.addr() + (60 << 10);
    for (id, expect) in [(5u64, 0u64), (6, 41)] {
        let sge = [a.mr.sge(56 << 10, 8)];
        let mut wr =
            SendWr::new(id, WrOpcode::FetchAdd, Payload::Sges(&sge)).remote(target, b.mr.rkey());
        wr.compare_add = 41;
        a.qp.post_send(&[wr]).unwrap();
        let wc = a.wait(1)[0];
        assert_eq!((wc.wr_id, wc.status), (id, WcStatus::Success));
        assert_eq!(a.buf.word(56 << 10), expect);
    }
    assert_eq!(b.buf.word(60 << 10), 82);
    assert!(
        svc.counters()
            .wrs_forwarded
            .load(std::sync::atomic::Ordering::Relaxed)
            >= 8
    );
}

#[test]
fn many_writes_keep_their_order_and_every_completion_arrives() {
    let svc = serve("many");
    let (a, b) = pair(&svc);
    // 20 000 signaled 64-byte WRITEs, a window of 64 outstanding; each writes its index.
    let total = 20_000u64;
    let (mut posted, mut done) = (0u64, 0u64);
    let mut out = Vec::new();
    let mut src = [0u8; 8];
    while done < total {
        while posted < total && posted - done < 64 {
            src.copy_from_slice(&posted.to_le_bytes());
            let wr = SendWr::new(posted, WrOpcode::Write, Payload::Inline(&src))
                .remote(b.mr.addr() + (posted % 1024) * 8, b.mr.rkey());
            a.qp.post_send(&[wr]).unwrap();
            posted += 1;
        }
        out.clear();
        a.cq.poll(&mut out, 64);
        for wc in &out {
            assert_eq!((wc.wr_id, wc.status), (done, WcStatus::Success));
            done += 1;
        }
    }
    // The last 1024 indices are in B's buffer.
    for i in total - 1024..total {
        let at = ((i % 1024) * 8) as usize;
        assert_eq!(b.buf.word(at), i);
    }
}

#[test]
fn a_program_cannot_name_another_programs_objects() {
    let svc = serve("iso");
    let (a, b) = pair(&svc);
    // B's lkey used by A's QP: a local protection error, and B's buffer is untouched.
    let sge = [b.mr.sge(0, 64)];
    let wr = SendWr::new(9, WrOpcode::Write, Payload::Sges(&sge))
        .remote(b.mr.addr() + 1024, b.mr.rkey());
    a.qp.post_send(&[wr]).unwrap();
    let wc = a.wait(1)[0];
    assert_eq!((wc.wr_id, wc.status), (9, WcStatus::LocProtErr));
    assert!(b.buf.range(0..LEN).iter().all(|&x| x == 0));
    assert!(svc.sessions() >= 2);
}

#[test]
fn a_program_that_goes_loses_its_objects_and_the_service_serves_on() {
    let svc = serve("gone");
    {
        let (_a, _b) = pair(&svc);
        assert_eq!(svc.sessions(), 2);
    }
    let until = Instant::now() + Duration::from_secs(5);
    while svc.sessions() > 0 {
        assert!(
            Instant::now() < until,
            "sessions stay after their programs went"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // A new pair works at once.
    let (a, b) = pair(&svc);
    let sge = [a.mr.sge(0, 64)];
    a.qp.post_send(&[
        SendWr::new(1, WrOpcode::Write, Payload::Sges(&sge)).remote(b.mr.addr(), b.mr.rkey())
    ])
    .unwrap();
    assert_eq!(a.wait(1)[0].status, WcStatus::Success);
}

#[test]
fn a_service_that_stops_is_a_device_fatal_event_and_fails_the_programs_verbs() {
    let svc = serve("stop");
    let client = Client::connect(svc.socket()).unwrap();
    let ctx = ferroce_verbs::Context::attach(&client, 0).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let tx = std::sync::Mutex::new(tx);
    ctx.set_async_handler(Box::new(move |e| {
        let _ = tx.lock().unwrap().send(e);
    }));
    let ch = ctx.create_comp_channel();
    let cq = ctx.try_create_cq(16, Some(&ch)).unwrap();
    let pd = ctx.try_alloc_pd().unwrap();
    let qp = pd
        .create_qp(QpType::Rc, QpCaps::default(), &cq, &cq)
        .unwrap();
    assert!(!cq.is_fatal());
    // A thread blocked on the channel.
    let waiter = std::thread::spawn(move || ch.get_event(Duration::from_secs(30)));
    svc.stop();
    // The event comes without the program calling anything.
    assert_eq!(
        rx.recv_timeout(Duration::from_secs(10)),
        Ok(ferroce_verbs::AsyncEvent::DeviceFatal)
    );
    assert!(client.is_gone());
    assert!(cq.is_fatal());
    assert_eq!(
        waiter.join().unwrap(),
        None,
        "the channel's waiter wakes, with no CQ"
    );
    assert!(ctx.try_alloc_pd().is_err());
    let sge = [ferroce_stack::transport::Sge::default()];
    assert!(qp
        .post_send(&[SendWr::new(1, WrOpcode::Send, Payload::Sges(&sge))])
        .is_err());
}

/// The verbs API itself, attached: `Context::attach` gives the same objects as an opened
/// device, backed by the service's; a completion channel fires when its armed CQ gets a
/// completion.
#[test]
fn a_verbs_context_attached_to_a_service_sends_and_its_channel_fires() {
    let svc = serve("verbs");
    let client = Client::connect(svc.socket()).unwrap();
    let ctx = ferroce_verbs::Context::attach(&client, 0).unwrap();
    assert!(ctx.is_attached());
    assert_eq!(ctx.query_port().state, ferroce_verbs::PortState::Active);
    let gid = ctx.query_gid(0).unwrap();
    let mac = ctx.port_mac(1).unwrap();
    let ch = ctx.create_comp_channel();
    let cq = ctx.try_create_cq(64, Some(&ch)).unwrap();
    let pd = ctx.try_alloc_pd().unwrap();
    let mut a = Buf::new(8192);
    let mut b = Buf::new(8192);
    // SAFETY: both buffers outlive their registrations (dropped at the end of the test,
    // after the MRs) and no other thread touches them.
    let (ma, mb) = unsafe {
        (
            pd.reg_mr(a.ptr(), 4096, Access::LOCAL_WRITE).unwrap(),
            pd.reg_mr(b.ptr(), 4096, Access::LOCAL_WRITE).unwrap(),
        )
    };
    let qa = pd
        .create_qp(QpType::Rc, QpCaps::default(), &cq, &cq)
        .unwrap();
    let qb = pd
        .create_qp(QpType::Rc, QpCaps::default(), &cq, &cq)
        .unwrap();
    for (q, peer) in [(&qa, &qb), (&qb, &qa)] {
        let attr = QpAttr {
            ah_attr: ctx.path_to(gid, mac),
            dest_qp_num: peer.qpn(),
            ..QpAttr::default()
        };
        bring_up(QpType::Rc, &attr, |x, m| q.modify(x, m)).unwrap();
        assert_eq!(q.query().unwrap().qp_state, QpState::Rts);
    }
    // Not armed: a completion comes, no event.
    qb.post_recv(&[RecvWr {
        wr_id: 1,
        sg_list: &[mb.sge(0, 64)],
    }])
    .unwrap();
    a.set(0, 0xab);
    let sge = [ma.sge(0, 64)];
    qa.post_send(&[SendWr::new(2, WrOpcode::Send, Payload::Sges(&sge))])
        .unwrap();
    let mut got = Vec::new();
    let until = Instant::now() + Duration::from_secs(10);
    while got.len() < 2 {
        cq.poll(&mut got, 2);
        assert!(Instant::now() < until, "{got:?}");
    }
    assert!(got.iter().all(|w| w.status == WcStatus::Success), "{got:?}");
    assert_eq!(b.get(0), 0xab);
    assert_eq!(ch.get_event(Duration::from_millis(50)), None);
    // Armed: the next completion fires it, once.
    cq.req_notify(false);
    qb.post_recv(&[RecvWr {
        wr_id: 3,
        sg_list: &[mb.sge(0, 64)],
    }])
    .unwrap();
    qa.post_send(&[SendWr::new(4, WrOpcode::Send, Payload::Sges(&sge))])
        .unwrap();
    assert_eq!(ch.get_event(Duration::from_secs(10)), Some(cq.id()));
    assert_eq!(ch.get_event(Duration::from_millis(50)), None);
    // What the service refuses is an error, not a wrong answer.
    assert!(matches!(
        pd.alloc_mw(true),
        Err(ferroce_verbs::VerbsError::NotThroughService(_))
    ));
    drop((qa, qb, ma, mb));
}

#[test]
fn a_killed_programs_peer_sees_its_connection_end_and_others_go_on() {
    let svc = serve("kill1");
    let (a, b) = pair(&svc);
    let victim_peer = Program::new(&svc);
    let arg = format!(
        "{},{},{}",
        victim_peer.qp.qpn().value(),
        victim_peer.mr.addr(),
        victim_peer.mr.rkey()
    );
    let (mut child, qpn) = spawn_child(&svc, Some(arg));
    // The peer's QP: short ACK timeout (16 µs · 2^... = 4 ms), three retries.
    victim_peer.connect_qpn(ferroce_stack::wire::Qpn::new(qpn), 10);
    go(&mut child);
    // The child writes into its peer's buffer.
    let until = Instant::now() + Duration::from_secs(10);
    while victim_peer.buf.get(0) == 0 && victim_peer.buf.range(0..4096).iter().all(|&x| x == 0) {
        assert!(Instant::now() < until, "the child never wrote");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(svc.sessions(), 4);
    child.kill().unwrap();
    child.wait().unwrap();
    wait_sessions(&svc, 3);
    // Its peer's next request meets no QP: the transport gives up, and says so.
    let sge = [victim_peer.mr.sge(0, 64)];
    victim_peer
        .qp
        .post_send(&[SendWr::new(77, WrOpcode::Send, Payload::Sges(&sge))])
        .unwrap();
    let wc = victim_peer.wait(1)[0];
    assert_eq!((wc.wr_id, wc.status), (77, WcStatus::RetryExcErr));
    // The others' traffic is untouched.
    let sge = [a.mr.sge(0, 256)];
    a.qp.post_send(&[
        SendWr::new(5, WrOpcode::Write, Payload::Sges(&sge)).remote(b.mr.addr(), b.mr.rkey())
    ])
    .unwrap();
    assert_eq!(a.wait(1)[0].status, WcStatus::Success);
}

/// A hostile program: garbage for messages, handles it never got, and its own rings
/// scribbled on while the service reads them. The service answers or drops that program,
/// never crashes, and the programs beside it keep working.
#[test]
fn a_hostile_program_loses_only_its_own_objects() {
    use ferroce_drivers::shm::Region;
    use ferroce_verbs::service::proto::{self, Request, Response, WireCaps, WireQpType};
    use ferroce_verbs::service::socket::Channel;
    let svc = serve("hostile");
    let (a, b) = pair(&svc);
    let check_bystanders = |id: u64| {
        let sge = [a.mr.sge(0, 64)];
        a.qp.post_send(&[
            SendWr::new(id, WrOpcode::Write, Payload::Sges(&sge)).remote(b.mr.addr(), b.mr.rkey())
        ])
        .unwrap();
        let wc = a.wait(1)[0];
        assert_eq!((wc.wr_id, wc.status), (id, WcStatus::Success));
    };
    let mut buf = Box::new([0u8; proto::MAX_MESSAGE]);
    // Garbage instead of a hello: the connection is dropped.
    for junk in [
        vec![0xffu8; 100],
        b"hello".to_vec(),
        vec![7; 4096],
        vec![1, 2, 3],
    ] {
        let ch = Channel::connect(svc.socket()).unwrap();
        let _ = ch.send(&junk, &[]);
        assert!(matches!(ch.recv(&mut buf), Ok(None) | Err(_)), "{junk:?}");
    }
    check_bystanders(1);
    // A hello without its event eventfd: refused.
    let ch = Channel::connect(svc.socket()).unwrap();
    let hello = proto::encode(&Request::Hello {
        version: proto::VERSION,
        pid: 1,
    });
    ch.send(&hello, &[]).unwrap();
    let (n, _) = ch.recv(&mut buf).unwrap().unwrap();
    assert!(matches!(
        proto::decode::<Response>(&buf[..n]),
        Some(Response::Error { .. })
    ));
    // A proper hello, then handles it never made: refused, one by one.
    let bell = ferroce_verbs::service::socket::Doorbell::new().unwrap();
    use std::os::fd::AsFd as _;
    let ch = Channel::connect(svc.socket()).unwrap();
    let call =
        |req: &Request, fds: &[std::os::fd::BorrowedFd<'_>], buf: &mut [u8; proto::MAX_MESSAGE]| {
            ch.send(&proto::encode(req), fds).unwrap();
            let (n, fds) = ch.recv(buf).unwrap().expect("an answer");
            (proto::decode::<Response>(&buf[..n]).unwrap(), fds)
        };
    let (r, _) = call(
        &Request::Hello {
            version: proto::VERSION,
            pid: 1,
        },
        &[bell.as_fd()],
        &mut buf,
    );
    assert!(matches!(r, Response::Welcome { .. }));
    for req in [
        Request::DeallocPd { pd: 1 },
        Request::DeregMr { mr: 99 },
        Request::DestroyQp { qp: 12345 },
        Request::QueryQp { qp: 0 },
        Request::AllocPd { device: 7 },
        Request::CreateCq {
            device: 0,
            cqe: 0,
            channel: false,
        },
        Request::CreateCq {
            device: 0,
            cqe: u32::MAX,
            channel: false,
        },
        Request::RegMr {
            pd: 5,
            addr: 0,
            iova: 0,
            len: 4096,
            offset: 0,
            pieces: vec![(0, 4096)],
            access: 0,
        },
    ] {
        let (r, _) = call(&req, &[], &mut buf);
        assert!(matches!(r, Response::Error { .. }), "{req:?} gave {r:?}");
    }
    // Its own QP, whose rings it then scribbles on while the service reads them.
    let Response::Created { handle: pd } = call(&Request::AllocPd { device: 0 }, &[], &mut buf).0
    else {
        panic!("no PD")
    };
    let Response::Cq { handle: cq, .. } = call(
        &Request::CreateCq {
            device: 0,
            cqe: 64,
            channel: false,
        },
        &[],
        &mut buf,
    )
    .0
    else {
        panic!("no CQ")
    };
    // A registration whose memory is not a sealed memfd: refused.
    let plain = std::fs::File::open("/proc/self/exe").unwrap();
    let reg = Request::RegMr {
        pd,
        addr: 0x1000,
        iova: 0x1000,
        len: 4096,
        offset: 0,
        pieces: vec![(0, 4096)],
        access: 1,
    };
    assert!(matches!(
        call(&reg, &[plain.as_fd()], &mut buf).0,
        Response::Error { .. }
    ));
    let caps = WireCaps {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 4,
        max_recv_sge: 4,
        max_inline_data: 64,
        sq_sig_all: false,
    };
    let req = Request::CreateQp {
        pd,
        send_cq: cq,
        recv_cq: cq,
        qp_type: WireQpType::Rc,
        caps,
        srq: None,
    };
    let (r, mut fds) = call(&req, &[], &mut buf);
    assert!(matches!(r, Response::Qp { .. }), "{r:?}");
    let region = Region::from_fd(fds.pop().unwrap(), 1).unwrap();
    let words = region.len() / 8;
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for round in 0..2000 {
        // xorshift: any words, anywhere, indices included.
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let at = (x as usize % words) * 8;
        let _ = region.store_words(at, &[x, x.rotate_left(17), !x]);
        std::thread::sleep(Duration::from_micros(20));
        if round % 100 == 0 {
            check_bystanders(100 + round);
        }
    }
    check_bystanders(9999);
    // The program itself: answered, or dropped if the service caught it breaking a ring.
    let _ = ch.send(&proto::encode(&Request::QueryQp { qp: 1 }), &[]);
    let _ = ch.recv(&mut buf);
    println!("hostile: {:?}", svc.counters());
    // The service is whole: a new program attaches and works.
    let (c, d) = pair(&svc);
    let sge = [c.mr.sge(0, 64)];
    c.qp.post_send(&[
        SendWr::new(1, WrOpcode::Write, Payload::Sges(&sge)).remote(d.mr.addr(), d.mr.rkey())
    ])
    .unwrap();
    assert_eq!(c.wait(1)[0].status, WcStatus::Success);
}

/// Registrations that share pages (heap buffers side by side, a buffer registered twice):
/// the second reuses the first's shared pages and moves only its own; each lands its data;
/// one going leaves the other working; the last going gives the pages back to private
/// memory.
#[test]
fn registrations_that_share_pages_each_work_and_give_their_pages_back() {
    let svc = serve("overlap");
    let (mut a, b) = pair(&svc);
    let pd = b._pd_ref();
    // One 3-page allocation, page-aligned, cut into two buffers that share its middle page.
    let mut mem = Buf::new(3 * 4096);
    let base = mem.ptr();
    let access = Access::LOCAL_WRITE.with(Access::REMOTE_WRITE);
    // SAFETY: `mem` outlives both registrations; no other thread touches it.
    let first = unsafe { pd.reg_mr(base.wrapping_add(100), 5000, access) }.unwrap();
    let second = unsafe { pd.reg_mr(base.wrapping_add(6000), 6000, access) }.unwrap();
    let same_again = unsafe { pd.reg_mr(base.wrapping_add(100), 5000, access) }.unwrap();
    let shared = |at: usize| {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let at = base as usize + at;
        maps.lines().any(|l| {
            let (range, rest) = l.split_once(' ').unwrap();
            let (x, y) = range.split_once('-').unwrap();
            let (x, y) = (
                usize::from_str_radix(x, 16).unwrap(),
                usize::from_str_radix(y, 16).unwrap(),
            );
            x <= at && at < y && rest.starts_with("rw-s")
        })
    };
    assert!(shared(0) && shared(4096) && shared(8192));
    // A WRITE into each, from A.
    for (i, (mr, at)) in [(&first, 100usize), (&second, 6000), (&same_again, 100)]
        .into_iter()
        .enumerate()
    {
        for j in 0..64 {
            a.buf.set(j, (i * 64 + j) as u8 | 1);
        }
        let sge = [a.mr.sge(0, 64)];
        a.qp.post_send(
            &[SendWr::new(i as u64, WrOpcode::Write, Payload::Sges(&sge))
                .remote(mr.addr(), mr.rkey())],
        )
        .unwrap();
        assert_eq!(a.wait(1)[0].status, WcStatus::Success);
        assert_eq!(mem.range(at..at + 64), a.buf.range(0..64));
    }
    // The first goes: the other two still work, and the pages stay shared.
    drop(first);
    assert!(shared(0) && shared(8192));
    let sge = [a.mr.sge(0, 64)];
    a.qp.post_send(&[SendWr::new(9, WrOpcode::Write, Payload::Sges(&sge))
        .remote(second.addr() + 64, second.rkey())])
        .unwrap();
    assert_eq!(a.wait(1)[0].status, WcStatus::Success);
    assert_eq!(mem.range(6064..6128), a.buf.range(0..64));
    drop(same_again);
    drop(second);
    // All gone: private again, contents kept.
    assert!(!shared(0) && !shared(4096) && !shared(8192));
    assert_eq!(mem.range(6064..6128), a.buf.range(0..64));
}

/// An asynchronous event the service's engine raises for a program's QP reaches that
/// program, and only it: a WRITE with a bad rkey fails the responder's QP
/// (`IBV_EVENT_QP_ACCESS_ERR` at the responder).
#[test]
fn a_qps_async_event_reaches_its_program_only() {
    let svc = serve("events");
    let (a, b) = pair(&svc);
    let (c, _d) = pair(&svc);
    let (tx, rx) = std::sync::mpsc::channel();
    let (ctx_, crx) = std::sync::mpsc::channel();
    let tx = std::sync::Mutex::new(tx);
    let ctx_ = std::sync::Mutex::new(ctx_);
    b.client.on_event(
        0,
        Box::new(move |e| {
            let _ = tx.lock().unwrap().send(e);
        }),
    );
    c.client.on_event(
        0,
        Box::new(move |e| {
            let _ = ctx_.lock().unwrap().send(e);
        }),
    );
    let sge = [a.mr.sge(0, 64)];
    a.qp.post_send(&[SendWr::new(1, WrOpcode::Write, Payload::Sges(&sge))
        .remote(b.mr.addr(), b.mr.rkey() ^ 0x5a5a)])
        .unwrap();
    assert_eq!(a.wait(1)[0].status, WcStatus::RemAccessErr);
    assert_eq!(
        rx.recv_timeout(Duration::from_secs(10)),
        Ok(ferroce_verbs::AsyncEvent::QpAccessError(b.qp.qpn()))
    );
    assert!(
        crx.recv_timeout(Duration::from_millis(200)).is_err(),
        "another program heard it"
    );
}

/// A shared receive queue of the service: receives posted to it through its ring are
/// taken by SENDs to any QP that uses it; its size and limit are the service's.
#[test]
fn a_shared_receive_queue_through_the_service_feeds_its_qps() {
    let svc = serve("srq");
    let client = Client::connect(svc.socket()).unwrap();
    let ctx = ferroce_verbs::Context::attach(&client, 0).unwrap();
    let gid = ctx.query_gid(0).unwrap();
    let mac = ctx.port_mac(1).unwrap();
    let cq = ctx.try_create_cq(64, None).unwrap();
    let pd = ctx.try_alloc_pd().unwrap();
    let srq = pd.try_create_srq(32, 2).unwrap();
    assert_eq!(srq.query(), (32, 2, 0));
    assert!(
        srq.modify(None, Some(40)).is_err(),
        "a limit above the size"
    );
    srq.modify(None, Some(4)).unwrap();
    assert_eq!(srq.query(), (32, 2, 4));
    let mut a = Buf::new(8192);
    let mut b = Buf::new(8192);
    // SAFETY: both buffers outlive their registrations; no other thread touches them.
    let (ma, mb) = unsafe {
        (
            pd.reg_mr(a.ptr(), 8192, Access::LOCAL_WRITE).unwrap(),
            pd.reg_mr(b.ptr(), 8192, Access::LOCAL_WRITE).unwrap(),
        )
    };
    let sender = pd
        .create_qp(QpType::Rc, QpCaps::default(), &cq, &cq)
        .unwrap();
    let r1 = pd
        .create_qp_with_srq(QpType::Rc, QpCaps::default(), &cq, &cq, &srq)
        .unwrap();
    for (q, peer) in [(&sender, &r1), (&r1, &sender)] {
        let attr = QpAttr {
            ah_attr: ctx.path_to(gid, mac),
            dest_qp_num: peer.qpn(),
            ..QpAttr::default()
        };
        bring_up(QpType::Rc, &attr, |x, m| q.modify(x, m)).unwrap();
    }
    // The QP itself takes no receives: they go to the SRQ.
    assert!(r1
        .post_recv(&[RecvWr {
            wr_id: 0,
            sg_list: &[mb.sge(0, 64)]
        }])
        .is_err());
    for i in 0..8u64 {
        srq.post_recv(&[RecvWr {
            wr_id: 100 + i,
            sg_list: &[mb.sge(i as usize * 1024, 1024)],
        }])
        .unwrap();
    }
    for i in 0..8usize {
        a.set(i * 512, i as u8 + 1);
    }
    for i in 0..8usize {
        let sge = [ma.sge(i * 512, 512)];
        sender
            .post_send(&[SendWr::new(i as u64, WrOpcode::Send, Payload::Sges(&sge))])
            .unwrap();
    }
    let mut got = Vec::new();
    let until = Instant::now() + Duration::from_secs(10);
    while got.len() < 16 {
        cq.poll(&mut got, 16);
        assert!(Instant::now() < until, "{got:?}");
    }
    let mut recv_ids: Vec<u64> = got
        .iter()
        .filter(|w| w.opcode == WcOpcode::Recv)
        .map(|w| {
            assert_eq!(
                (w.status, w.byte_len, w.qp_num),
                (WcStatus::Success, 512, r1.qpn())
            );
            w.wr_id
        })
        .collect();
    recv_ids.sort_unstable();
    assert_eq!(recv_ids, (100..108).collect::<Vec<_>>());
    for i in 0..8usize {
        assert_eq!(b.get(i * 1024), i as u8 + 1);
    }
    drop((sender, r1, ma, mb));
}

/// rdma_cm's exchange through a service: the port's one CM agent runs in the service, two
/// programs share it. Each hears only of its own listeners and connections, may name only
/// its own connections and QPs, and a program that goes has its connection ended on the wire
/// (its peer sees the DREQ).
#[test]
fn the_connection_manager_through_a_service_connects_two_programs_and_keeps_them_apart() {
    use ferroce_stack::wire::mad::{port_space, service_id, CmPath};
    use ferroce_verbs::cm::*;
    let svc = serve("cm");
    let (client_a, client_b) = (
        Client::connect(svc.socket()).unwrap(),
        Client::connect(svc.socket()).unwrap(),
    );
    let ca = ferroce_verbs::Context::attach(&client_a, 0).unwrap();
    let cb = ferroce_verbs::Context::attach(&client_b, 0).unwrap();
    let (cma, cmb) = (ca.connection_manager(), cb.connection_manager());
    let qp_of = |ctx: &ferroce_verbs::Context| {
        let cq = ctx.try_create_cq(16, None).unwrap();
        let pd = ctx.try_alloc_pd().unwrap();
        let qp = pd
            .create_qp(QpType::Rc, QpCaps::default(), &cq, &cq)
            .unwrap();
        (qp, cq, pd)
    };
    let (qa, _cqa, _pda) = qp_of(&ca);
    let (qb, _cqb, _pdb) = qp_of(&cb);
    let port = service_id(port_space::TCP, 7471);
    cmb.listen(port).unwrap();
    // The service is B's: A may not listen on it too.
    let taken = cma.listen(port).unwrap_err();
    assert_eq!(taken.errno(), libc::EADDRINUSE, "{taken}");
    let me = cma.local_peer();
    assert_eq!(me, cmb.local_peer());
    let params = |qpn: u32| ConnectParams {
        service_id: port,
        qpn,
        psn: 0x100,
        responder_resources: 4,
        initiator_depth: 4,
        retry_count: 7,
        rnr_retry_count: 7,
        path_mtu: 3,
        transport_service_type: 0,
        srq: false,
        path: CmPath {
            local_lid: 0xffff,
            remote_lid: 0xffff,
            local_gid: me.gid,
            remote_gid: me.gid,
            hop_limit: 64,
            local_ack_timeout: 14,
            ..CmPath::default()
        },
        response_timeout: 16,
        max_cm_retries: 15,
        private_data: b"hello b".to_vec(),
    };
    // A REQ naming B's QP is not A's to send.
    let foreign = cma.connect(me, &params(qb.qpn().value())).unwrap_err();
    assert_eq!(foreign.errno(), libc::EINVAL, "{foreign}");
    let conn = cma.connect(me, &params(qa.qpn().value())).unwrap();
    let next = |cm: &ConnectionManager| {
        cm.next_event(Duration::from_secs(10))
            .expect("an event within 10 s")
    };
    let CmEvent::Request {
        conn: bc,
        peer,
        req,
    } = next(&cmb)
    else {
        panic!("no request");
    };
    assert_eq!((peer, req.qpn, req.psn), (me, qa.qpn().value(), 0x100));
    assert_eq!(&req.private_data[..7], b"hello b");
    // A cannot answer B's request, nor end it.
    let not_a = cma
        .accept(
            bc,
            &AcceptParams {
                qpn: qa.qpn().value(),
                psn: 1,
                responder_resources: 4,
                initiator_depth: 4,
                rnr_retry_count: 7,
                srq: false,
                private_data: Vec::new(),
            },
        )
        .unwrap_err();
    assert_eq!(not_a.errno(), libc::EINVAL, "{not_a}");
    assert!(cma.disconnect(bc, &[]).is_err());
    cmb.accept(
        bc,
        &AcceptParams {
            qpn: qb.qpn().value(),
            psn: 0x200,
            responder_resources: 4,
            initiator_depth: 4,
            rnr_retry_count: 7,
            srq: false,
            private_data: b"hello a".to_vec(),
        },
    )
    .unwrap();
    let CmEvent::Reply { conn: c, rep } = next(&cma) else {
        panic!("no reply");
    };
    assert_eq!((c, rep.qpn, rep.psn), (conn, qb.qpn().value(), 0x200));
    assert_eq!(&rep.private_data[..7], b"hello a");
    cma.ready_to_use(conn, &[]).unwrap();
    assert_eq!(next(&cma), CmEvent::Established { conn });
    assert_eq!(next(&cmb), CmEvent::Established { conn: bc });
    // Neither heard the other's events.
    assert_eq!(cma.try_next_event(), None);
    assert_eq!(cmb.try_next_event(), None);
    assert_eq!((cma.connections(), cmb.connections()), (1, 2));
    // A goes without a word: the service ends its connection, and B hears the DREQ.
    drop((qa, _cqa, _pda, cma, ca));
    drop(client_a);
    assert_eq!(next(&cmb), CmEvent::Disconnected { conn: bc });
    assert_eq!(next(&cmb), CmEvent::TimewaitExit { conn: bc });
    // B's listener is still B's: it stops, and the service may be listened on again.
    cmb.stop_listening(port);
    assert_eq!(cmb.connections(), 0);
    let client_c = Client::connect(svc.socket()).unwrap();
    let cc = ferroce_verbs::Context::attach(&client_c, 0).unwrap();
    cc.connection_manager().listen(port).unwrap();
}

/// What the QP would refuse at post time is refused at post time through a service too, the
/// same error for the same WR: a send before RTS, a receive in RESET, more elements than
/// the caps, and a receive past `max_recv_wr` outstanding (the service counts the receives
/// it retires, so the room comes back as they complete).
#[test]
fn posts_the_qp_would_refuse_are_refused_at_post_time() {
    use ferroce_stack::transport::PostError;
    let svc = serve("refuse");
    let a = Program::new(&svc);
    let b = Program::new(&svc);
    let caps = b.qp.caps();
    let sge = [a.mr.sge(0, 64)];
    let send = SendWr::new(1, WrOpcode::Send, Payload::Sges(&sge));
    let e = a.qp.post_send(&[send]).unwrap_err();
    assert_eq!(
        (e.index, e.error),
        (0, PostError::InvalidState(QpState::Reset))
    );
    let rsge = [b.mr.sge(0, 64)];
    let recv = |id| RecvWr {
        wr_id: id,
        sg_list: &rsge,
    };
    let e = b.qp.post_recv(&[recv(0)]).unwrap_err();
    assert_eq!(e.error, PostError::InvalidState(QpState::Reset));
    a.connect(&b);
    b.connect(&a);
    let many: Vec<_> = (0..caps.max_recv_sge as usize + 1)
        .map(|i| b.mr.sge(i * 8, 8))
        .collect();
    let e =
        b.qp.post_recv(&[
            recv(1),
            RecvWr {
                wr_id: 2,
                sg_list: &many,
            },
        ])
        .unwrap_err();
    assert_eq!(
        (e.index, e.error),
        (
            1,
            PostError::TooManySges {
                got: many.len(),
                max: caps.max_recv_sge
            }
        )
    );
    // One receive is outstanding (wr 1): the queue takes max_recv_wr - 1 more, then no more.
    let fill: Vec<_> = (0..u64::from(caps.max_recv_wr))
        .map(|i| recv(10 + i))
        .collect();
    let e = b.qp.post_recv(&fill).unwrap_err();
    assert_eq!(
        (e.index, e.error),
        (
            caps.max_recv_wr as usize - 1,
            PostError::QueueFull(caps.max_recv_wr)
        )
    );
    // Two SENDs consume two receives: room for exactly two again.
    for id in [100, 101] {
        a.qp.post_send(&[SendWr::new(id, WrOpcode::Send, Payload::Sges(&sge))])
            .unwrap();
    }
    assert!(a.wait(2).iter().all(|w| w.status == WcStatus::Success));
    assert!(b.wait(2).iter().all(|w| w.status == WcStatus::Success));
    let e =
        b.qp.post_recv(&[recv(200), recv(201), recv(202)])
            .unwrap_err();
    assert_eq!(
        (e.index, e.error),
        (2, PostError::QueueFull(caps.max_recv_wr))
    );
}

/// A raw packet QP and a flow rule through a service: a frame one raw QP sends to the port
/// (a loop device hands it back) reaches the raw QP whose rule matches its Ethertype, in the
/// program's own buffer; one another rule does not match stays away; a frame shorter than an
/// Ethernet header is refused at post time.
#[test]
fn raw_frames_and_flow_rules_through_a_service() {
    use ferroce_stack::transport::PostError;
    use ferroce_verbs::{FlowRule, FlowSpec};
    let svc = serve("raw");
    let client = Client::connect(svc.socket()).unwrap();
    let ctx = ferroce_verbs::Context::attach(&client, 0).unwrap();
    let cq = ctx.try_create_cq(64, None).unwrap();
    let pd = ctx.try_alloc_pd().unwrap();
    let mut tx = Buf::new(4096);
    let mut rx = Buf::new(8192);
    // SAFETY: both buffers outlive their registrations (dropped after them at the end of
    // the test) and no other thread touches them.
    let (mtx, mrx) = unsafe {
        (
            pd.reg_mr(tx.ptr(), 4096, Access::LOCAL_WRITE).unwrap(),
            pd.reg_mr(rx.ptr(), 8192, Access::LOCAL_WRITE).unwrap(),
        )
    };
    let raw = |ty: u16| {
        let q = pd.create_raw_qp(QpCaps::default(), &cq, &cq).unwrap();
        q.modify(QpState::Init, Some(1)).unwrap();
        q.modify(QpState::Rtr, None).unwrap();
        q.modify(QpState::Rts, None).unwrap();
        let flow = q
            .create_flow(FlowRule {
                specs: vec![FlowSpec::Eth {
                    dst: [0; 6],
                    dst_mask: [0; 6],
                    src: [0; 6],
                    src_mask: [0; 6],
                    ether_type: ty,
                    ether_type_mask: 0xffff,
                    vlan_tag: 0,
                    vlan_mask: 0,
                }],
            })
            .unwrap();
        (q, flow)
    };
    let (sender, _f1) = raw(0x88b6);
    let (receiver, _f2) = raw(0x88b5);
    assert_eq!(
        (receiver.state(), receiver.port_num().unwrap()),
        (QpState::Rts, 1)
    );
    for (id, at) in [(1u64, 0usize), (2, 4096)] {
        receiver
            .post_recv(&[RecvWr {
                wr_id: id,
                sg_list: &[mrx.sge(at, 4096)],
            }])
            .unwrap();
    }
    let mac = ctx.port_mac(1).unwrap().0;
    let mut frame = Vec::new();
    frame.extend_from_slice(&mac);
    frame.extend_from_slice(&mac);
    frame.extend_from_slice(&[0x88, 0xb5]);
    frame.extend((0..100u8).map(|i| i ^ 0xa5));
    for (i, b) in frame.iter().enumerate() {
        tx.set(i, *b);
    }
    let sge = [mtx.sge(0, frame.len())];
    let send = SendWr::new(7, WrOpcode::Send, Payload::Sges(&sge))
        .flags(ferroce_stack::transport::SendFlags::SIGNALED);
    sender.post_send(&[send]).unwrap();
    let mut got = Vec::new();
    let until = Instant::now() + Duration::from_secs(10);
    while got.len() < 2 {
        cq.poll(&mut got, 2);
        assert!(Instant::now() < until, "{got:?}");
    }
    got.sort_by_key(|w| w.wr_id);
    assert_eq!(
        (got[0].wr_id, got[0].status, got[0].qp_num),
        (1, WcStatus::Success, receiver.qpn())
    );
    assert_eq!(got[0].byte_len as usize, frame.len());
    assert_eq!((got[1].wr_id, got[1].status), (7, WcStatus::Success));
    assert_eq!(rx.range(0..frame.len()), &frame[..]);
    // The second receive waits: the sender's own rule (another Ethertype) took nothing.
    assert!(rx.range(4096..4096 + frame.len()).iter().all(|&b| b == 0));
    let short = [mtx.sge(0, 10)];
    let e = sender
        .post_send(&[SendWr::new(8, WrOpcode::Send, Payload::Sges(&short))])
        .unwrap_err();
    assert_eq!(e.error, PostError::FrameLength(10));
    drop((_f1, _f2, sender, receiver, mtx, mrx));
}
