//! Several queue pairs on one DPDK port: a net_ring vdev in this process (each of its queue
//! pairs is a ring that loops transmitted frames back to the same queue's receive side),
//! opened with four queue pairs. Frames sent on every queue, interleaved, must come back
//! whole, in order, on their own queue and only there. Asking for no queues, or more than the
//! port has, is a clear error. No hugepages, no root.
#![cfg(feature = "dpdk")]

use ferroce_drivers::dpdk::{eal_init, port_count, DpdkError, DpdkPort, PortConfig};
use ferroce_drivers::{LinkState, Port};

const QUEUES: u16 = 4;

#[test]
fn each_queue_pair_carries_its_own_frames() {
    let pid = std::process::id();
    let args = format!(
        "-l 0 --no-pci --no-huge -m 512 --file-prefix=ferroce-queues-{pid} --log-level=error --vdev=net_ring0"
    );
    eal_init(&args).unwrap();
    assert_eq!(port_count(), 1);
    assert!(matches!(
        DpdkPort::open_queues(0, 0, 256, 256, None),
        Err(DpdkError::Queues { asked: 0, .. })
    ));
    let Err(e) = DpdkPort::open_queues(0, 1000, 256, 256, None) else {
        panic!("1000 queues accepted")
    };
    assert!(e.to_string().contains("1000 asked for"), "{e}");
    // net_ring has no rte_flow: flow isolation is refused with the PMD's reason, before
    // anything is allocated, so the port opens without it afterwards.
    let isolated = PortConfig {
        queues: QUEUES,
        rx_desc: 256,
        tx_desc: 256,
        zero_copy_min: None,
        isolate: true,
    };
    let Err(e) = DpdkPort::open_config(0, &isolated) else {
        panic!("net_ring isolated its flows")
    };
    assert!(
        matches!(&e, DpdkError::Flow { what: "flow isolation", code, .. } if *code < 0),
        "{e:?}"
    );
    let text = e.to_string();
    assert!(text.contains("without isolate"), "{text}");
    eprintln!("{text}");
    let mut q = DpdkPort::open_queues(0, QUEUES, 256, 256, None).unwrap();
    assert_eq!(
        q.iter().map(DpdkPort::queue_id).collect::<Vec<_>>(),
        (0..QUEUES).collect::<Vec<_>>()
    );
    assert!(q.iter().all(|p| p.link_state() == LinkState::Up));
    let mut got: Vec<Vec<Vec<u8>>> = vec![Vec::new(); usize::from(QUEUES)];
    for round in 0..100u32 {
        // Every queue sends a burst before any receives, so the rings hold frames of all
        // queues at once.
        for (k, port) in q.iter_mut().enumerate() {
            for i in 0..16u32 {
                let seq = round * 16 + i;
                let n = 64 + (seq as usize * 37 + k * 101) % 1400;
                port.tx(n, |f| {
                    f.fill(0xa0 + k as u8);
                    f[..4].copy_from_slice(&seq.to_be_bytes());
                    f[4] = k as u8;
                })
                .unwrap();
            }
            assert_eq!(port.flush(), 16, "round {round} queue {k}");
        }
        for (k, port) in q.iter_mut().enumerate() {
            while port.rx_burst(32, |f| got[k].push(f.to_vec())) > 0 {}
        }
    }
    for (k, frames) in got.iter().enumerate() {
        assert_eq!(frames.len(), 100 * 16, "queue {k}");
        for (s, f) in frames.iter().enumerate() {
            assert_eq!(u32::from_be_bytes(f[..4].try_into().unwrap()), s as u32);
            assert_eq!(f[4], k as u8, "a frame of queue {} arrived on {k}", f[4]);
            assert_eq!(f.len(), 64 + (s * 37 + k * 101) % 1400);
            assert!(f[5..].iter().all(|&x| x == 0xa0 + k as u8));
        }
    }
    assert!(q.iter().all(|p| p.tx_dropped == 0));
    let _ = std::fs::remove_dir_all(format!("/var/run/dpdk/ferroce-queues-{pid}"));
}
