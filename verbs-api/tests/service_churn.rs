//! `kill -9` of a thousand programs attached to one service, alone in its process: the
//! service's memory is this process's, so no other test may run beside it.

mod service_common;

use ferroce_stack::transport::{Payload, SendWr, WcStatus, WrOpcode};
use service_common::*;

/// The program the test starts (see `service_common::child_main`).
#[test]
fn child_program() {
    child_main();
}

/// `kill -9` of programs, one after another, each mid-transfer: the service frees what each
/// held (its sessions come back to the two that stay) and its memory stays flat.
#[test]
fn a_thousand_killed_programs_leave_the_service_flat() {
    let cycles: usize = std::env::var("FERROCE_KILL_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let svc = serve("kill");
    let (a, b) = pair(&svc);
    let mut rss = Vec::new();
    for cycle in 0..cycles {
        let (mut child, _) = spawn_child(&svc, None);
        go(&mut child);
        child.kill().unwrap();
        child.wait().unwrap();
        wait_sessions(&svc, 2);
        // A bystander's WRITE after each kill.
        let sge = [a.mr.sge(0, 64)];
        a.qp.post_send(&[
            SendWr::new(cycle as u64, WrOpcode::Write, Payload::Sges(&sge))
                .remote(b.mr.addr(), b.mr.rkey()),
        ])
        .unwrap();
        let wc = a.wait(1)[0];
        assert_eq!((wc.wr_id, wc.status), (cycle as u64, WcStatus::Success));
        if cycle == 20.min(cycles - 1) || cycle == cycles - 1 || cycle % 200 == 0 {
            rss.push((cycle, rss_kib(), maps()));
        }
    }
    println!("service (RSS KiB, mappings) by killed program: {rss:?}");
    // Only the two programs that stay have QPs in the engine.
    assert_eq!(svc.devices()[0].qp_counters_all().len(), 2);
    let warm = rss.iter().find(|r| r.0 >= 20.min(cycles - 1)).unwrap();
    let end = rss.last().unwrap();
    // (A few may come and go with whatever a thread is doing when they are counted.)
    assert!(
        end.2 <= warm.2 + 4,
        "mappings left behind: {} then {}",
        warm.2,
        end.2
    );
    // Flat: what the allocator keeps of its free lists aside, no more than 1 KiB a program.
    assert!(
        end.1 <= warm.1 + (cycles as u64).max(1024),
        "RSS grew from {} KiB to {} KiB over {cycles} killed programs",
        warm.1,
        end.1
    );
    let dropped = svc
        .counters()
        .sessions
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(dropped as usize, cycles + 2);
}
