//! Invariant 3 at the accessor: whatever key, PD, address and length a request carries, bytes
//! change only inside a registered region that the request was entitled to, and a refused
//! request changes nothing.

use ferroce_stack::transport::{Access, AccessError, MrTable, PdId};
use proptest::prelude::*;

const GUARD: usize = 64;
const REGION: usize = 256;
const IOVA: u64 = 0x7f00_0000_0000;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    #[test]
    fn writes_never_escape_the_region(
        access in 0u32..16,
        ops in proptest::collection::vec(
            (any::<bool>(), any::<bool>(), -80i64..(REGION as i64 + 80), 0usize..100, any::<u8>()),
            1..20,
        ),
    ) {
        let mut mem = vec![0u8; GUARD + REGION + GUARD];
        let mut model = mem.clone();
        let mut t = MrTable::new(3);
        let access = Access(access);
        // SAFETY: `mem` outlives `t` (t is dropped at the end of this block).
        let reg = unsafe { t.register(PdId(1), mem.as_mut_ptr().add(GUARD), REGION, IOVA, access) };
        let Ok(keys) = reg else {
            // Remote write/atomic without local write is refused at registration.
            prop_assert!(!access.contains(Access::LOCAL_WRITE));
            return Ok(());
        };
        for (good_key, good_pd, off, len, byte) in ops {
            let key = if good_key { keys.rkey } else { keys.rkey ^ 0x10 };
            let pd = PdId(if good_pd { 1 } else { 2 });
            let va = IOVA.wrapping_add_signed(off);
            let data = vec![byte; len];
            let r = t.write(key, pd, va, &data, Access::REMOTE_WRITE);
            let entitled = len == 0
                || (good_key && good_pd && access.contains(Access::REMOTE_WRITE)
                    && off >= 0 && off as usize + len <= REGION);
            prop_assert_eq!(r.is_ok(), entitled, "{:?}", r);
            if let Err(e) = r {
                prop_assert!(!matches!(e, AccessError::Misaligned(_)));
            }
            if r.is_ok() && len > 0 {
                let at = GUARD + off as usize;
                model[at..at + len].fill(byte);
            }
        }
        drop(t);
        prop_assert_eq!(mem, model);
    }
}
