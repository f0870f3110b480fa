//! Each experiment called as a library, on small setups: it finishes, its bytes check out,
//! and the same seed gives the same figures. (`ferroce scenario`'s tests run the same
//! experiments through the command line; the paper-figure sizes live in docs/.)

use ferroce_scenarios::{failover, sdr, spray, varuna_steady};
use ferroce_stack::transport::Mtu;

#[test]
fn spray_completes_every_flow_intact_and_replays_from_its_seed() {
    let setup = |scheme| spray::Setup {
        size: 256 << 10,
        bps: 100_000_000_000,
        delay_ns: 1_000,
        scheme,
        loss: 0.01,
        seed: 3,
    };
    for scheme in [spray::Scheme::EcmpGbn, spray::Scheme::SprayThemis] {
        let a = spray::run(&setup(scheme));
        assert!(a.verified, "{scheme:?}: bytes differ");
        assert_eq!(a.fct_ns.len(), spray::FLOWS);
        assert!(a.tail_ns().is_some(), "{scheme:?}: a flow failed");
        assert!(
            a.link_drops > 0,
            "{scheme:?}: the lossy link dropped nothing"
        );
        let b = spray::run(&setup(scheme));
        assert_eq!(
            a.fct_ns, b.fct_ns,
            "{scheme:?}: seed 3 replayed differently"
        );
        assert_eq!(a.wire_bytes, b.wire_bytes);
    }
}

#[test]
fn sdr_delivers_every_write_with_sr_and_with_ec() {
    for choice in [sdr::Choice::SrNack, sdr::Choice::EcMds] {
        let s = sdr::Setup {
            size: 1 << 20,
            chunk: 64 << 10,
            mtu: Mtu::Mtu4096,
            gbps: 100.0,
            rtt_ns: 100_000,
            loss: sdr::LossModel::Bernoulli,
            drop: 1e-3,
            scheme: choice.scheme(4, 2),
            auto: false,
            runs: 3,
            seed: 4,
        };
        let o = sdr::run(&s).unwrap();
        assert!(o.verified, "{choice:?}: bytes differ");
        assert_eq!(o.times_ns.len(), 3);
        assert!(
            o.times_ns.iter().all(|&t| t >= s.rtt_ns),
            "{:?}",
            o.times_ns
        );
        assert_eq!(
            sdr::run(&s).unwrap().times_ns,
            o.times_ns,
            "{choice:?}: replay"
        );
    }
}

#[test]
fn failover_native_moves_through_a_tor_fault_where_none_fails() {
    let setup = |scheme| failover::Setup {
        scheme,
        fault: failover::Fault::Tor,
        gbps: 100.0,
        delay_ns: 2_000,
        size: 64 << 10,
        depth: 32,
        timeout: 5,
        fault_at: 5_000_000,
        heal_at: 10_000_000,
        end: 15_000_000,
        bin_ns: 100_000,
        seed: 1,
        atomic_every: 16,
    };
    let native = failover::run(&setup(failover::Scheme::Native));
    assert!(native.verified && native.atomics_ok, "{native:?}");
    assert_eq!(native.errors, 0);
    assert!(native.migrations >= 1);
    assert!(native.failover_ns.is_some());
    assert_eq!(native.duplicates_executed, 0, "exactly once");
    let none = failover::run(&setup(failover::Scheme::None));
    assert!(
        none.errors > 0,
        "without failover the stream fails: {none:?}"
    );
    assert!(none.completed < native.completed);
}

#[test]
fn varuna_steady_runs_every_scheme_to_completion() {
    for scheme in varuna_steady::Scheme::ALL {
        for (workload, size) in [
            (varuna_steady::Workload::SyncWrite, 4096),
            (varuna_steady::Workload::CasReads, 8),
        ] {
            let o = varuna_steady::run(&varuna_steady::Setup {
                scheme,
                workload,
                size,
                clients: 2,
                ops: 4,
            });
            assert!(o.ok, "{scheme:?} {workload:?}");
            assert!(o.latency_ns > 0.0 && o.gbps > 0.0, "{o:?}");
        }
    }
}
