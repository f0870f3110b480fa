//! The Themis ToR hook sees every frame a switch forwards, so whatever arrives must not make
//! it panic or misroute: any bytes, any switch context. What it originates is only ever a NACK
//! it was given, unchanged but for the path-avoidance bit.

use ferroce_reliability::policy::themis::{ThemisConfig, ThemisTor, AVOID_SIGNAL};
use ferroce_stack::switch::{HookCtx, SwitchHook, Verdict};
use ferroce_stack::wire::sample::{sample_frame, sample_repr, SampleAddr};
use ferroce_stack::wire::{Checks, IpRepr, Opcode, Psn, RoceRepr};
use proptest::prelude::*;

/// A frame of kind `kind`: data of either opcode family, a NACK, an ACK, or noise.
fn frame(kind: u8, psn: u32, v6: bool, noise: &[u8]) -> Vec<u8> {
    let addr = SampleAddr {
        ip_version: if v6 { 6 } else { 4 },
        ..SampleAddr::default()
    };
    let op = match kind % 6 {
        0 => Opcode::SR_RDMA_WRITE_MIDDLE,
        1 => Opcode::RC_RDMA_WRITE_ONLY,
        2 | 3 => Opcode::RC_ACKNOWLEDGE,
        4 => Opcode::RC_SEND_ONLY,
        _ => return noise.to_vec(),
    };
    let mut r = sample_repr(op, addr, 64);
    r.bth.psn = Psn::new(psn);
    if kind % 6 == 2 {
        // NAK, PSN sequence error, from the data's receiver back to its sender.
        r.ext.aeth.as_mut().expect("ACK has an AETH").syndrome = 0x60;
        match &mut r.ip {
            IpRepr::V4(ip) => std::mem::swap(&mut ip.src, &mut ip.dst),
            IpRepr::V6(ip) => std::mem::swap(&mut ip.src, &mut ip.dst),
        }
    }
    let mut f = sample_frame(&r);
    if kind >= 6 && !noise.is_empty() {
        // Corrupt one byte somewhere.
        let i = usize::from(noise[0]) % f.len();
        f[i] ^= noise.get(1).copied().unwrap_or(0xff) | 1;
    }
    f
}

/// The frame with the path-avoidance bit cleared, wherever its BTH is.
fn without_signal(mut f: Vec<u8>) -> Vec<u8> {
    let at = if f[12..14] == [0x86, 0xdd] {
        14 + 40 + 8
    } else {
        14 + 20 + 8
    };
    f[at + 4] &= !AVOID_SIGNAL;
    f
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn any_frames_in_any_context_never_panic_or_misroute(
        frames in prop::collection::vec(
            (any::<u8>(), 0u32..2048, any::<bool>(), prop::collection::vec(any::<u8>(), 0..96),
             0usize..5, 1usize..5, any::<u8>(), any::<u8>()),
            1..200),
        paths in 1u16..5,
        threshold in 0u32..64,
    ) {
        let mut tor = ThemisTor::new(ThemisConfig {
            paths,
            window: 16,
            ooo_threshold: threshold,
            avoidance_window: 8,
            seed: 1,
        });
        let mut naks: Vec<Vec<u8>> = Vec::new();
        for (kind, psn, v6, noise, ingress, ports, hosts, pick) in frames {
            let mut f = frame(kind, psn, v6, &noise);
            let host_ports: Vec<bool> = (0..ports).map(|p| hosts >> p & 1 == 1).collect();
            let candidates: Vec<usize> =
                (0..ports).filter(|p| pick >> p & 1 == 1).collect();
            let ctx = HookCtx {
                now: 0,
                switch: 0,
                ingress: ingress % (ports + 1), // sometimes out of range
                candidates: &candidates,
                ecmp_choice: candidates.first().copied(),
                host_ports: &host_ports,
            };
            if RoceRepr::parse(&f, Checks::NONE)
                .is_ok_and(|p| p.repr.bth.opcode == Opcode::RC_ACKNOWLEDGE)
            {
                naks.push(f.clone());
            }
            match tor.on_frame(&ctx, &mut f) {
                Verdict::ForwardVia(p) => prop_assert!(candidates.contains(&p)),
                Verdict::Forward | Verdict::Drop => {}
            }
            while let Some(out) = tor.poll_emit() {
                // Equal to a NACK it was given, but for the avoidance bit.
                let plain = without_signal(out);
                prop_assert!(
                    naks.iter().any(|n| without_signal(n.clone()) == plain),
                    "emitted a frame it was never given"
                );
            }
        }
    }
}

/// Where Themis-D sits: port 0 faces the host, ports 1 and 2 are uplinks.
const HOSTS: [bool; 3] = [true, false, false];

/// Hands the ToR a data packet coming down to the host, or a NACK going up from it.
fn at_tor(tor: &mut ThemisTor, is_nak: bool, psn: u32) -> (Verdict, Vec<u8>) {
    let mut f = frame(if is_nak { 2 } else { 0 }, psn, false, &[]);
    let (ingress, candidates) = if is_nak {
        (0, vec![1, 2])
    } else {
        (1, vec![0])
    };
    let ctx = HookCtx {
        now: 0,
        switch: 0,
        ingress,
        candidates: &candidates,
        ecmp_choice: Some(candidates[0]),
        host_ports: &HOSTS,
    };
    let v = tor.on_frame(&ctx, &mut f);
    (v, f)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Data coming down to the host and NACKs going up, in any order and with any PSNs near
    /// each other: a NACK is passed, dropped or stashed; what comes out later is a stashed
    /// NACK, byte for byte, possibly with the avoidance bit; and a NACK whose PSN the host
    /// already has never passes.
    #[test]
    fn stashed_nacks_come_back_verbatim(
        events in prop::collection::vec((any::<bool>(), 0u32..40), 1..300),
        threshold in 1u32..16,
    ) {
        let mut tor = ThemisTor::new(ThemisConfig {
            paths: 2,
            window: 32,
            ooo_threshold: threshold,
            avoidance_window: 8,
            seed: 1,
        });
        let (mut delivered, mut stashed) = (Vec::new(), Vec::new());
        for (is_nak, psn) in events {
            let (verdict, f) = at_tor(&mut tor, is_nak, psn);
            if is_nak {
                if verdict == Verdict::Forward {
                    prop_assert!(!delivered.contains(&psn), "passed a NACK for a PSN delivered");
                } else if !delivered.contains(&psn) {
                    stashed.push(f.clone());
                }
            } else {
                delivered.push(psn);
            }
            while let Some(mut out) = tor.poll_emit() {
                out[14 + 20 + 8 + 4] &= !AVOID_SIGNAL;
                prop_assert!(stashed.contains(&out), "emitted a NACK never stashed");
            }
        }
    }
}

#[test]
fn a_stashed_nack_is_released_by_a_later_psn_on_its_path() {
    let mut tor = ThemisTor::new(ThemisConfig::default());
    let stats = tor.stats();
    let mut pass = |is_nak: bool, psn: u32| {
        let (v, f) = at_tor(&mut tor, is_nak, psn);
        (v, f, tor.poll_emit())
    };
    // The paper's Figure 7: PSN 1 arrives, the host NACKs 0: undetermined, stashed.
    assert_eq!(pass(false, 1).0, Verdict::Forward);
    let (v, nak0, _) = pass(true, 0);
    assert_eq!(v, Verdict::Drop);
    // PSN 3 (path 1) says nothing about 0; PSN 2 (path 0, later) proves 0 lost.
    assert_eq!(pass(false, 3).2, None);
    assert_eq!(pass(false, 2).2, Some(nak0));
    // Figure 6: 0 and 1 delivered, NACK for 1 is invalid.
    let (v, _, _) = pass(true, 1);
    assert_eq!(v, Verdict::Drop);
    let s = stats.snapshot();
    assert_eq!(
        (s.nacks_stashed, s.stash_released, s.nacks_invalid),
        (1, 1, 1)
    );
    // A NACK for 4 after 6 arrived on path 0 is valid at once.
    pass(false, 6);
    assert_eq!(pass(true, 4).0, Verdict::Forward);
    assert_eq!(stats.snapshot().nacks_valid, 1);
}
