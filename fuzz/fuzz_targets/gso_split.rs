//! Segmentation-offload datagram splitter fuzz target: any bytes as the datagram, any
//! segment size from the virtio-net header (the peer chooses both). Splitting must not panic,
//! every segment lies inside the datagram, and each is handed to the frame parser, as the
//! port does.
#![no_main]

use ferroce_drivers::afpacket::split_datagram;
use ferroce_stack::wire::{Checks, RoceRepr};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((size, rest)) = data.split_first_chunk::<2>() else {
        return;
    };
    let gso_size = usize::from(u16::from_le_bytes(*size));
    let mut frame = rest.to_vec();
    let len = frame.len();
    let mut seen = 0;
    let n = split_datagram(&mut frame, gso_size, |seg| {
        assert!(seg.len() <= len);
        seen += 1;
        let _ = RoceRepr::parse(seg, Checks::ALL);
    });
    assert_eq!(n, seen);
    assert!(n >= 1);
});
