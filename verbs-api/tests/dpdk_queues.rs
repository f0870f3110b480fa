//! A device with an engine per queue: a net_ring vdev opened with four queue pairs
//! (`queues=4`), each looping its frames back to itself, so a frame between two QPs on
//! different engines arrives on the sender's queue and must be handed to the receiver's
//! engine — what receive-side scaling does to a real port, where the peer's UDP source port
//! and not the destination QP picks the queue. QPs spread over the engines by QPN share one
//! set of memory registrations: WRITE/SEND/READ data, atomics on one word from QPs on every
//! engine, and an rkey invalidated through one engine that is dead on the others. Run once
//! with the caller driving every engine and once with an engine thread per queue, each
//! pinned to its CPU (`cores=`).
#![cfg(feature = "dpdk")]

use std::collections::BTreeSet;

use ferroce_verbs::connect::{connect_qp, ConnectOpts, Endpoint};
use ferroce_verbs::spec::{open_device, open_device_with_pcap};
use ferroce_verbs::*;

mod common;
use common::through_the_port;

const QUEUES: u32 = 4;
const LEN: usize = 100_000;
const ADDS: u64 = 50;

#[test]
fn qps_on_four_engines_share_memory_and_reach_each_other() {
    let pid = std::process::id();
    let eal = format!(
        "-l 0 --no-pci --no-huge -m 512 --file-prefix=ferroce-vq-{pid} --log-level=error --vdev=net_ring0 --vdev=net_ring1 --vdev=net_ring2"
    );
    let e = open_device(&format!("dpdk:{eal} @10.9.1.1 queues=0")).unwrap_err();
    assert!(e.to_string().contains("at least one queue"), "{e}");
    // A PMD without rte_flow (net_ring) cannot leave the kernel its other traffic.
    let e = open_device(&format!("dpdk:{eal} @10.9.1.1 queues={QUEUES} isolate")).unwrap_err();
    assert!(e.to_string().contains("flow isolation failed"), "{e}");
    // Engine threads pinned to a CPU this machine does not have do not start.
    let nowhere = open_device(&format!("dpdk:{eal} @10.9.1.2 port=1 cores=1023")).unwrap();
    let e = nowhere.start_engine_thread().unwrap_err();
    assert!(e.to_string().contains("to CPU 1023"), "{e}");
    let ctx = open_device(&format!(
        "dpdk:{eal} @10.9.1.1 queues={QUEUES} cores=0,1,0,1"
    ))
    .unwrap();
    assert_eq!(ctx.query_port().state, PortState::Active);

    let first = traffic(&ctx, QUEUES);
    assert!(first.rx_forwarded > 0, "{first:?}");
    ctx.start_engine_thread().unwrap();
    // One thread per engine, each pinned to its CPU of the list.
    let mut pinned = engine_thread_cpus();
    pinned.sort();
    assert_eq!(pinned, ["0", "0", "1", "1"]);
    let second = traffic(&ctx, QUEUES);
    ctx.stop_engine_thread();
    // Joined threads leave /proc a moment after the join returns (the kernel wakes the
    // joiner before it reaps the thread), so give them that moment.
    let gone = std::time::Instant::now();
    while !engine_thread_cpus().is_empty() && gone.elapsed().as_secs() < 5 {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert_eq!(engine_thread_cpus(), Vec::<String>::new());
    assert!(second.rx_forwarded > first.rx_forwarded, "{second:?}");
    ctx.start_engine_thread().unwrap();
    mad_on_another_engines_queue(&ctx, QUEUES);
    ctx.stop_engine_thread();
    // Every frame found its QP: none dropped on the way between engines, none unclaimed.
    assert_eq!(second.rx_unknown_qp, 0, "{second:?}");
    assert_eq!(second.rx_forward_drops, 0, "{second:?}");
    assert_eq!(second.rx_malformed, 0, "{second:?}");
    assert_eq!(second.tx_errors, 0, "{second:?}");

    // A capture of a two-queue device: one file, every frame either engine sent or took
    // from its queue, each whole and a valid RoCEv2 frame.
    let path = std::env::temp_dir().join(format!("ferroce-vq-{pid}.pcap"));
    let file = std::fs::File::create(&path).unwrap();
    let two = open_device_with_pcap(
        &format!("dpdk:{eal} @10.9.1.3 port=2 queues=2"),
        Some(Box::new(file)),
    )
    .unwrap();
    two.start_engine_thread().unwrap();
    let c = traffic(&two, 2);
    two.stop_engine_thread();
    drop(two);
    let bytes = std::fs::read(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    let mut r = pcap_file::pcap::PcapReader::new(&bytes[..]).unwrap();
    let mut frames = 0u64;
    while let Some(p) = r.next_packet() {
        let p = p.unwrap();
        ferroce_stack::wire::RoceRepr::parse(&p.data, ferroce_stack::wire::Checks::ALL)
            .unwrap_or_else(|e| panic!("frame {frames}: {e}"));
        frames += 1;
    }
    assert!(c.rx_forwarded > 0, "{c:?}");
    assert_eq!(frames, c.rx_frames + c.tx_frames, "{c:?}");
    let _ = std::fs::remove_dir_all(format!("/var/run/dpdk/ferroce-vq-{pid}"));
}

/// QP1 on a multi-queue device: the communication manager runs in the first engine, and a
/// MAD that arrives on another engine's queue (receive-side scaling picks the queue by the
/// peer's UDP source port) is handed to it. A REQ as a peer's agent sends it leaves from a UD
/// QP of another engine with the GSI Q_Key, loops back onto that engine's queue, and must
/// reach the listener as a request.
fn mad_on_another_engines_queue(ctx: &Context, queues: u32) {
    use ferroce_stack::cm::{CmAgent, CmEvent, ConnectParams};
    use ferroce_stack::wire::mad::{port_space, service_id, CmPath, GSI_QKEY, GSI_QPN, MAD_LEN};
    use ferroce_stack::wire::{Psn, Qpn};

    let cm = ctx.connection_manager();
    let svc = service_id(port_space::TCP, 7471);
    cm.listen(svc).unwrap();
    let me = cm.local_peer();
    let mut peer = CmAgent::new(0x0123_4567_89ab_cdef, 9);
    peer.connect(
        0,
        me,
        &ConnectParams {
            service_id: svc,
            qpn: 0x77,
            psn: 1,
            responder_resources: 1,
            initiator_depth: 1,
            retry_count: 7,
            rnr_retry_count: 7,
            path_mtu: 3,
            transport_service_type: 0,
            srq: false,
            path: CmPath {
                local_gid: me.gid,
                remote_gid: me.gid,
                ..CmPath::default()
            },
            response_timeout: 20,
            max_cm_retries: 15,
            private_data: Vec::new(),
        },
    )
    .unwrap();
    let req = peer.poll_transmit().expect("the REQ").mad;

    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(64, None);
    // Kept while they are looked through: a QP dropped frees its engine's place for the next.
    let mut uds: Vec<QueuePair> = (0..queues)
        .map(|_| {
            pd.create_qp(QpType::Ud, QpCaps::default(), &cq, &cq)
                .unwrap()
        })
        .collect();
    let at = uds
        .iter()
        .position(|q| q.engine() != 0)
        .expect("a UD QP on an engine other than the first");
    assert_eq!(
        uds[at].engine(),
        uds[at].qpn().value() as usize % queues as usize
    );
    let ud = uds.swap_remove(at);
    for (state, mask) in [
        (
            QpState::Init,
            AttrMask::STATE
                .with(AttrMask::PKEY_INDEX)
                .with(AttrMask::PORT)
                .with(AttrMask::QKEY),
        ),
        (QpState::Rtr, AttrMask::STATE),
        (QpState::Rts, AttrMask::STATE.with(AttrMask::SQ_PSN)),
    ] {
        let attr = QpAttr {
            qp_state: state,
            port_num: 1,
            qkey: GSI_QKEY,
            sq_psn: Psn::new(0),
            ..QpAttr::default()
        };
        ud.modify(&attr, mask).unwrap();
    }
    let mr = pd.alloc_mr(MAD_LEN, Access::LOCAL_WRITE).unwrap();
    assert!(mr.write(0, &req));
    let sge = [mr.sge(0, MAD_LEN)];
    ud.post_send(&[SendWr {
        ud: Some(UdDest {
            av: ctx.path_to(Gid(me.gid), me.mac),
            remote_qpn: Qpn::new(GSI_QPN),
            // The top bit: the QP's own Q_Key, the GSI's, goes on the wire.
            remote_qkey: 0x8000_0000,
        }),
        ..SendWr::new(9, WrOpcode::Send, Payload::Sges(&sge))
    }])
    .unwrap();
    let got = wait(ctx, &cq, 1);
    assert_eq!(got[0].status, WcStatus::Success, "{got:?}");
    match cm.next_event(std::time::Duration::from_secs(10)) {
        Some(CmEvent::Request { req, .. }) => {
            assert_eq!((req.service_id, req.qpn), (svc, 0x77), "{req:?}")
        }
        other => panic!("the listener got {other:?}, not the REQ from another engine's queue"),
    }
    cm.stop_listening(svc);
}

/// Four RC pairs on a device of `queues` engines, some across engines and some within one;
/// returns the port's counters afterwards.
fn traffic(ctx: &Context, queues: u32) -> PortCounters {
    let pd = ctx.alloc_pd();
    let all = Access::LOCAL_WRITE
        .with(Access::REMOTE_WRITE)
        .with(Access::REMOTE_READ)
        .with(Access::REMOTE_ATOMIC);
    let mr = pd.alloc_mr(8 << 20, all).unwrap();
    let victim = pd.alloc_mr(4096, all).unwrap();
    let cq = ctx.create_cq(4096, None);
    let qps: Vec<QueuePair> = (0..8)
        .map(|_| {
            pd.create_qp(QpType::Rc, QpCaps::default(), &cq, &cq)
                .unwrap()
        })
        .collect();
    let engine = |q: &QueuePair| q.qpn().value() % queues;
    let pairs = [(0, 1), (2, 5), (3, 7), (4, 6)];
    let across: Vec<bool> = pairs
        .iter()
        .map(|&(a, b)| engine(&qps[a]) != engine(&qps[b]))
        .collect();
    assert!(
        across.contains(&true) && across.contains(&false),
        "{across:?}"
    );
    let ep = |qp: &QueuePair, psn| through_the_port(Endpoint::of(ctx, qp, &mr, psn));
    let o = ConnectOpts::default();
    for &(a, b) in &pairs {
        let (pa, pb) = (a as u32 * 100, b as u32 * 100 + 7);
        connect_qp(ctx, &qps[a], pa, &ep(&qps[b], pb), &o).unwrap();
        connect_qp(ctx, &qps[b], pb, &ep(&qps[a], pa), &o).unwrap();
    }

    // Each pair: WRITE, SEND and READ back of its own 100 000 bytes, at its own offsets.
    let base = |k: usize| k * 4 * LEN;
    for (k, &(a, b)) in pairs.iter().enumerate() {
        let data: Vec<u8> = (0..LEN).map(|i| (i * 7 + k * 31) as u8).collect();
        assert!(mr.write(base(k), &data));
        qps[b]
            .post_recv(&[RecvWr {
                wr_id: 100 + k as u64,
                sg_list: &[mr.sge(base(k) + 2 * LEN, LEN)],
            }])
            .unwrap();
        let s = [mr.sge(base(k), LEN)];
        let back = [mr.sge(base(k) + 3 * LEN, LEN)];
        let at = mr.addr() + (base(k) + LEN) as u64;
        qps[a]
            .post_send(&[
                SendWr::new(1, WrOpcode::Write, Payload::Sges(&s)).remote(at, mr.rkey()),
                SendWr::new(2, WrOpcode::Send, Payload::Sges(&s)),
                SendWr::new(3, WrOpcode::Read, Payload::Sges(&back)).remote(at, mr.rkey()),
            ])
            .unwrap();
    }
    let got = wait(ctx, &cq, 4 * pairs.len());
    assert!(got.iter().all(|c| c.status == WcStatus::Success), "{got:?}");
    for k in 0..pairs.len() {
        let data: Vec<u8> = (0..LEN).map(|i| (i * 7 + k * 31) as u8).collect();
        let mut out = vec![0u8; LEN];
        for part in 1..4 {
            assert!(mr.read(base(k) + part * LEN, &mut out));
            assert_eq!(out, data, "pair {k}, copy {part}");
        }
    }

    // Atomics from QPs on every engine on one word: each value it passed through is seen
    // by exactly one FETCH_ADD.
    let word = mr.addr() + (7 << 20);
    let results = 6 << 20;
    let adders: Vec<usize> = pairs.iter().map(|&(a, _)| a).collect();
    for (j, &a) in adders.iter().enumerate() {
        for i in 0..ADDS {
            let slot = [mr.sge(results + (j * ADDS as usize + i as usize) * 8, 8)];
            let mut wr =
                SendWr::new(i, WrOpcode::FetchAdd, Payload::Sges(&slot)).remote(word, mr.rkey());
            wr.compare_add = 1;
            qps[a].post_send(&[wr]).unwrap();
        }
    }
    let got = wait(ctx, &cq, adders.len() * ADDS as usize);
    assert!(got.iter().all(|c| c.status == WcStatus::Success), "{got:?}");
    let mut seen = BTreeSet::new();
    let mut b = [0u8; 8];
    for n in 0..adders.len() * ADDS as usize {
        assert!(mr.read(results + n * 8, &mut b));
        assert!(seen.insert(u64::from_ne_bytes(b)), "value {b:?} twice");
    }
    assert_eq!(seen, (0..adders.len() as u64 * ADDS).collect());
    assert!(mr.read(7 << 20, &mut b));
    assert_eq!(u64::from_ne_bytes(b), adders.len() as u64 * ADDS);

    // An rkey that works through pair 3's responder, invalidated by a SEND_WITH_INVALIDATE
    // that pair 0's responder (another engine) receives, is refused through pair 3 after.
    let (writer, responder) = (&qps[pairs[3].0], &qps[pairs[3].1]);
    assert_ne!(engine(responder), engine(&qps[pairs[0].1]));
    let s = [mr.sge(0, 64)];
    let write =
        SendWr::new(7, WrOpcode::Write, Payload::Sges(&s)).remote(victim.addr(), victim.rkey());
    writer.post_send(&[write]).unwrap();
    let got = wait(ctx, &cq, 1);
    assert_eq!(got[0].status, WcStatus::Success, "{got:?}");
    qps[pairs[0].1]
        .post_recv(&[RecvWr {
            wr_id: 8,
            sg_list: &[mr.sge(5 << 20, 64)],
        }])
        .unwrap();
    qps[pairs[0].0]
        .post_send(&[SendWr::new(9, WrOpcode::SendWithInv, Payload::Sges(&s)).imm(victim.rkey())])
        .unwrap();
    let got = wait(ctx, &cq, 2);
    assert!(got.iter().all(|c| c.status == WcStatus::Success), "{got:?}");
    writer.post_send(&[write]).unwrap();
    let got = wait(ctx, &cq, 1);
    assert_eq!(got[0].status, WcStatus::RemAccessErr, "{got:?}");
    ctx.port_counters()
}

/// The CPUs each engine thread of this process may run on, as the kernel lists them.
fn engine_thread_cpus() -> Vec<String> {
    let mut cpus = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if !comm.starts_with("ferroce-engine") {
            continue;
        }
        let status = std::fs::read_to_string(task.path().join("status")).unwrap_or_default();
        if let Some(l) = status.lines().find(|l| l.starts_with("Cpus_allowed_list:")) {
            cpus.push(l["Cpus_allowed_list:".len()..].trim().to_owned());
        }
    }
    cpus
}

/// Polls `cq` (turning the engines when no engine thread does) until `n` completions came.
fn wait(ctx: &Context, cq: &CompletionQueue, n: usize) -> Vec<WorkCompletion> {
    let mut got = Vec::new();
    let start = std::time::Instant::now();
    while got.len() < n && start.elapsed().as_secs() < 30 {
        ctx.progress();
        cq.poll(&mut got, 64);
    }
    assert_eq!(got.len(), n, "{got:?}");
    got
}
