//! Engine threads that sleep when idle (a port with a descriptor: here the in-memory pipe)
//! and what wakes them. Its own test binary: it reads the states of this process's engine
//! threads from /proc, which other tests' threads would muddle.

use std::time::{Duration, Instant};

use ferroce_verbs::connect::{connect_qp, ConnectOpts};
use ferroce_verbs::sim::pipe_pair;
use ferroce_verbs::*;

mod common;
use common::{endpoint, End};

fn end(ctx: &Context, ch: &CompletionChannel) -> End {
    let pd = ctx.alloc_pd();
    let mr = pd
        .alloc_mr(1 << 16, Access::LOCAL_WRITE.with(Access::REMOTE_WRITE))
        .unwrap();
    let cq = ctx.create_cq(64, Some(ch));
    let qp = pd
        .create_qp(QpType::Rc, QpCaps::default(), &cq, &cq)
        .unwrap();
    End {
        ctx: ctx.clone(),
        cq,
        qp,
        mr,
        _pd: pd,
    }
}

/// The states of this process's engine threads (field 3 of /proc/self/task/*/stat: `S` is
/// asleep, `R` running).
fn engine_thread_states() -> Vec<char> {
    let mut v = Vec::new();
    for t in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if !comm.starts_with("ferroce-engine") {
            continue;
        }
        let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
        // pid (comm) state ...: the state follows the last ')'.
        if let Some(state) = stat
            .rsplit(')')
            .next()
            .and_then(|r| r.trim().chars().next())
        {
            v.push(state);
        }
    }
    v
}

/// Waits (up to 10 s) until every engine thread of this process sleeps.
fn until_engine_threads_sleep(n: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = engine_thread_states();
        if s.len() == n && s.iter().all(|&c| c == 'S') {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "engine threads never slept: {s:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Engine threads on a port with a descriptor sleep when idle, and what needs them wakes
/// them: a frame for a responder whose program is blocked on a completion channel (not in a
/// verb), the completion for a requester likewise, and a retransmission deadline armed by a
/// program's own turn while its engine thread slept.
#[test]
fn idle_engine_threads_sleep_and_wake_for_frames_and_deadlines() {
    let (ca, cb) = pipe_pair(4200);
    let (cha, chb) = (ca.create_comp_channel(), cb.create_comp_channel());
    let (a, b) = (end(&ca, &cha), end(&cb, &chb));
    let o = ConnectOpts {
        timeout: 8, // 1 ms
        retry_cnt: 1,
        ..ConnectOpts::default()
    };
    let (ea, eb) = (endpoint(&a, 0x10), endpoint(&b, 0x20));
    connect_qp(&a.ctx, &a.qp, ea.psn, &eb, &o).unwrap();
    connect_qp(&b.ctx, &b.qp, eb.psn, &ea, &o).unwrap();
    ca.start_engine_thread().unwrap();
    cb.start_engine_thread().unwrap();
    until_engine_threads_sleep(2);

    // A SEND: b's program waits on its channel, so b's engine thread must wake for the frame,
    // and a's for the ACK.
    b.qp.post_recv(&[RecvWr {
        wr_id: 1,
        sg_list: &[b.mr.sge(0, 4096)],
    }])
    .unwrap();
    until_engine_threads_sleep(2);
    a.cq.req_notify(false);
    b.cq.req_notify(false);
    assert!(a.mr.write(0, b"woken"));
    let s = [a.mr.sge(0, 5)];
    a.qp.post_send(&[SendWr::new(2, WrOpcode::Send, Payload::Sges(&s))])
        .unwrap();
    assert!(
        chb.get_event(Duration::from_secs(10)).is_some(),
        "no receive"
    );
    assert!(
        cha.get_event(Duration::from_secs(10)).is_some(),
        "no send completion"
    );
    let mut got = Vec::new();
    b.cq.poll(&mut got, 4);
    a.cq.poll(&mut got, 4);
    let ids: Vec<(u64, WcStatus)> = got.iter().map(|c| (c.wr_id, c.status)).collect();
    assert_eq!(ids, [(1, WcStatus::Success), (2, WcStatus::Success)]);
    let mut landed = [0u8; 5];
    assert!(b.mr.read(0, &mut landed));
    assert_eq!(&landed, b"woken");

    // b goes silent; a's WRITE is posted while a's engine thread sleeps with no deadline.
    // Only the retransmission timer can end it: retry_cnt 1 of 1 ms each, then
    // RETRY_EXC_ERR, delivered by a's engine thread to a program blocked on its channel.
    cb.stop_engine_thread();
    until_engine_threads_sleep(1);
    a.cq.req_notify(false);
    let w = SendWr::new(3, WrOpcode::Write, Payload::Sges(&s)).remote(b.mr.addr(), b.mr.rkey());
    a.qp.post_send(&[w]).unwrap();
    assert!(
        cha.get_event(Duration::from_secs(10)).is_some(),
        "the retransmission timer never fired"
    );
    let mut got = Vec::new();
    a.cq.poll(&mut got, 4);
    assert_eq!((got[0].wr_id, got[0].status), (3, WcStatus::RetryExcErr));
    ca.stop_engine_thread();
    // Every wakeup came from what needed the engine, none from the sleep's upper bound.
    for (side, ctx) in [("a", &ca), ("b", &cb)] {
        let c = ctx.port_counters();
        assert!(c.engine_sleeps > 0, "{side}'s engine thread never slept");
        assert_eq!(c.engine_missed_wakeups, 0, "{side}: {c:?}");
    }
}
