//! What a hostile program sends `ferroce serve` (issue 37 item 4), decoded as the service
//! decodes it: any bytes as a control message (a request; a response too, for the client's
//! side), and any words as work request and completion slots. No decode may panic; a
//! request that decodes encodes back to bytes that decode to the same request; a send or
//! receive request never takes more than its slots hold.
#![no_main]

use ferroce_verbs::service::proto::{self, Request, Response};
use ferroce_verbs::service::slots::{self, Slot, MAX_EXTRA, MAX_INLINE, MAX_SGE, W};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some(req) = proto::decode::<Request>(data) {
        let again = proto::encode(&req);
        assert_eq!(proto::decode::<Request>(&again), Some(req));
    }
    let _ = proto::decode::<Response>(data);
    let words: Vec<u64> = data
        .chunks(8)
        .map(|c| {
            let mut w = [0u8; 8];
            w[..c.len()].copy_from_slice(c);
            u64::from_le_bytes(w)
        })
        .collect();
    let slots: Vec<Slot> = words
        .chunks(W)
        .map(|c| {
            let mut s = [0u64; W];
            s[..c.len()].copy_from_slice(c);
            s
        })
        .collect();
    let Some((h, rest)) = slots.split_first() else {
        return;
    };
    let _ = slots::decode_wc(h);
    // The header's claim, bounded; then exactly the slots it claims, as the service takes
    // them from the ring.
    if let Ok(n) = slots::extra_slots(h) {
        assert!(n <= MAX_EXTRA);
        let extra = &rest[..n.min(rest.len())];
        if let Ok(wr) = slots::decode_send(h, extra) {
            let wr = wr.as_wr();
            match wr.payload {
                ferroce_stack::transport::Payload::Sges(s) => assert!(s.len() <= MAX_SGE),
                ferroce_stack::transport::Payload::Inline(b) => assert!(b.len() <= MAX_INLINE),
            }
            // What decodes encodes again into as many slots.
            let mut out = Vec::new();
            if slots::encode_send(&wr, &mut out).is_ok() {
                assert_eq!(out.len(), 1 + extra.len());
            }
        }
        if let Ok((_, sges)) = slots::decode_recv(h, extra) {
            assert!(sges.len() <= MAX_EXTRA * W / 2);
        }
    }
});
