//! Whole-frame parser fuzz target: any bytes, every check combination. Under `cfg(fuzzing)`
//! the ICRC and IPv4 checksum always pass, so the fuzzer reaches the BTH and extension-header
//! code instead of stopping at the CRC. A frame that parses must re-emit to a frame that
//! parses back to the same headers and payload.
#![no_main]

use ferroce_stack::wire::{Checks, PathControl, RoceRepr};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = RoceRepr::parse(data, Checks::NONE);
    // ferroce's path control payload: what parses emits back to the same bytes.
    if let Ok(c) = PathControl::parse(data) {
        let mut out = [0u8; PathControl::LEN];
        c.emit(&mut out);
        assert_eq!(&out[..], &data[..PathControl::LEN]);
    }
    if let Ok(p) = RoceRepr::parse(data, Checks::ALL) {
        let _ = p.icrc_check();
        let mut buf = vec![0u8; p.repr.buffer_len()];
        let n = p
            .repr
            .emit_with_payload(&mut buf, p.payload)
            .expect("a parsed frame re-emits");
        let again = RoceRepr::parse(&buf[..n], Checks::ALL).expect("a re-emitted frame parses");
        assert_eq!(again.repr, p.repr);
        assert_eq!(again.payload, p.payload);
    }
});
