//! The DPDK port on a net_ring vdev (a loopback ring pair inside this process, no NIC, no
//! hugepages): frames sent come back whole, in order, and every mbuf is returned to the pool.
#![cfg(feature = "dpdk")]

use ferroce_drivers::dpdk::{eal_init, port_count, DpdkPort};
use ferroce_drivers::{LinkState, Port};

#[test]
fn frames_loop_back_through_a_net_ring_port() {
    let args = format!(
        "-l 0 --no-pci --no-huge -m 256 --file-prefix=ferroce-test-{} --log-level=error --vdev=net_ring0",
        std::process::id()
    );
    eal_init(&args).unwrap();
    assert_eq!(port_count(), 1);
    let mut p = DpdkPort::open(0, 512, 512).unwrap();
    assert_eq!(p.link_state(), LinkState::Up);
    let mut got = Vec::new();
    for round in 0..200u32 {
        for i in 0..32u32 {
            let n = 60 + (round * 32 + i) as usize % 1400;
            p.tx(n, |b| {
                b.fill(i as u8);
                b[..4].copy_from_slice(&(round * 32 + i).to_be_bytes());
            })
            .unwrap();
        }
        assert_eq!(p.flush(), 32);
        while p.rx_burst(64, |f| got.push(f.to_vec())) > 0 {}
    }
    assert_eq!(got.len(), 200 * 32);
    for (k, f) in got.iter().enumerate() {
        assert_eq!(u32::from_be_bytes(f[..4].try_into().unwrap()), k as u32);
        assert_eq!(f.len(), 60 + k % 1400);
    }
    assert_eq!(p.tx_dropped, 0);
    // Asking for a port that did not probe is a clear error.
    assert!(DpdkPort::open(5, 64, 64).is_err());
}
