//! CM MAD parser fuzz target: any bytes (the payload of a UD SEND to QP1). What parses emits
//! back to bytes that parse to a message emitting the same bytes again (reserved bits and
//! lengths normalized once), and the rdma_cm IP header parser and ferroce's offer reader
//! take any private data (an offer found is zeroed where it was, and never found twice).
#![no_main]

use ferroce_stack::wire::mad::{CmMad, CmaHeader, MAD_LEN};
use ferroce_verbs::cm::{Offer, OFFER_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = CmaHeader::parse(data);
    let mut private = data.to_vec();
    if Offer::take_from(&mut private).is_some() {
        let at = private.len() - OFFER_LEN;
        assert!(private[at..].iter().all(|&b| b == 0));
        assert_eq!(Offer::take_from(&mut private), None);
    }
    let Ok(m) = CmMad::parse(data) else {
        return;
    };
    let mut out = [0u8; MAD_LEN];
    m.emit(&mut out).expect("a parsed MAD re-emits");
    let again = CmMad::parse(&out).expect("a re-emitted MAD parses");
    let mut out2 = [0u8; MAD_LEN];
    again.emit(&mut out2).expect("and re-emits");
    assert_eq!(out, out2);
});
