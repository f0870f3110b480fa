//! SDR on the verbs API: two SDR QPs on a lossy simulated link, messages sent one-shot and
//! streaming under selective repeat and erasure coding, every one arriving whole.

use ferroce_drivers::sim::{LinkModel, Loss};
use ferroce_reliability::sdr::imm::ImmLayout;
use ferroce_reliability::sdr::model::{Code, Scheme};
use ferroce_reliability::sdr::recv::RecvConfig;
use ferroce_reliability::sdr::reliable::ReliableConfig;
use ferroce_verbs::connect::ConnectOpts;
use ferroce_verbs::sdr::{SdrConfig, SdrQp};
use ferroce_verbs::sim::SimNet;
use ferroce_verbs::*;

const RTT: u64 = 40_000;

fn config(scheme: Scheme) -> SdrConfig {
    SdrConfig {
        layout: RecvConfig {
            layout: ImmLayout::PAPER,
            mtu: 1024,
            chunk_packets: 4,
            max_message: 256 * 1024,
            slots: 4,
            generations: 2,
        },
        reliability: ReliableConfig::new(scheme, RTT),
        pace_gbps: Some(10.0),
    }
}

/// Both ends progress and time moves on (to the protocol's next timer when the fabric has
/// nothing left) until `done`.
fn drive(net: &SimNet, ends: [&SdrQp; 2], mut done: impl FnMut() -> bool) {
    for _ in 0..10_000_000 {
        if done() {
            return;
        }
        let mut worked = false;
        for e in ends {
            worked |= e.progress().unwrap();
        }
        if !net.step() && !worked {
            let next = ends.iter().filter_map(|e| e.poll_timeout()).min();
            match next {
                Some(t) => net.fabric().advance_to(t.max(net.now() + 1)),
                None => panic!("stuck at {} ns with nothing to happen", net.now()),
            }
        }
    }
    panic!("not done");
}

fn run(scheme: Scheme, streaming: bool, seed: u64) {
    let model = LinkModel {
        loss: Loss::Bernoulli(0.01),
        ..LinkModel::new(10_000_000_000, RTT / 2)
    };
    let (net, ca, cb) = SimNet::pair(seed, model, 1500, None).unwrap();
    let (pa, pb) = (ca.alloc_pd(), cb.alloc_pd());
    let rw = Access::LOCAL_WRITE.with(Access::REMOTE_WRITE);
    let (ma, mb) = (
        pa.alloc_mr(512 * 1024, rw).unwrap(),
        pb.alloc_mr(512 * 1024, rw).unwrap(),
    );
    let a = SdrQp::new(&ca, &pa, config(scheme)).unwrap();
    let b = SdrQp::new(&cb, &pb, config(scheme)).unwrap();
    let o = ConnectOpts {
        mtu: Mtu::Mtu1024,
        ..ConnectOpts::default()
    };
    a.connect(&b.endpoint(), &o).unwrap();
    b.connect(&a.endpoint(), &o).unwrap();
    let parity_at = 256 * 1024;
    for (n, len) in [200_000u64, 5_000, 130_000].into_iter().enumerate() {
        let data: Vec<u8> = (0..len).map(|i| (i as u8) ^ (n as u8 * 37)).collect();
        assert!(ma.write(0, &data));
        assert!(mb.write(0, &vec![0; len as usize]));
        let parity = (b.parity_len(len) > 0).then_some((&mb, parity_at));
        let m = b.post_recv(&mb, 0, len, parity).unwrap();
        let sent = if streaming {
            let s = a.send_streaming(&ma, 0, len, Some(0xfeed)).unwrap();
            let chunks = len.div_ceil(4096) as u32;
            for c in (0..chunks).rev() {
                a.stream_chunk(s, c).unwrap();
            }
            s
        } else {
            let parity = (a.parity_len(len) > 0).then_some((&ma, parity_at));
            a.send(&ma, 0, len, Some(0xfeed), parity).unwrap()
        };
        let mut done = None;
        drive(&net, [&a, &b], || {
            done = done.or_else(|| a.poll_send());
            done.is_some()
        });
        assert_eq!(done.unwrap().message, sent);
        assert!(b.recv_is_complete(m));
        let h = b.recv_handle(m).unwrap();
        assert!(h.is_complete());
        assert_eq!(
            h.bitmap().iter().map(|w| w.count_ones()).sum::<u32>(),
            h.chunks()
        );
        let mut got = vec![0; len as usize];
        assert!(mb.read(0, &mut got));
        assert!(got == data, "{} message {n}: bytes differ", scheme.name());
        if let Some(imm) = b.recv_imm_get(m) {
            assert_eq!(imm, 0xfeed);
        }
        assert!(b.recv_complete(m));
    }
    let (qp, tx, _, table) = a.stats();
    assert!(qp.packets_posted > 0 && qp.acks_received > 0);
    assert_eq!(tx.messages_done, 3);
    // Every resend answers a loss: no chunk goes again that arrived (the timeouts count
    // from when a chunk left, not from when it was queued behind the pacer).
    let lost = net.fabric().link_stats(net.link())[0].dropped_loss;
    assert!(lost > 0, "the link dropped nothing: a test of nothing");
    assert!(tx.chunks_resent <= lost, "{tx:?}, {lost} packets lost");
    let (_, _, rx, table_b) = b.stats();
    assert_eq!(rx.messages_complete, 3);
    if scheme.name().starts_with("ec") {
        assert!(rx.chunks_rebuilt > 0, "{rx:?}");
    }
    assert!(table_b.packets_placed > 0);
    assert_eq!(table.packets_placed, 0, "nothing was sent to a");
}

#[test]
fn sr_one_shot_and_streaming_over_a_lossy_link() {
    run(Scheme::SR_RTO, false, 1);
    run(Scheme::SrNack, true, 2);
    run(Scheme::SrNack, false, 2);
}

#[test]
fn ec_over_a_lossy_link() {
    for code in [Code::Mds, Code::Xor] {
        let scheme = Scheme::Ec {
            code,
            k: 8,
            m: 2,
            beta: 1.0,
        };
        run(scheme, false, 3);
    }
}
