//! A QP under attack, for the tests and fuzz targets that throw arbitrary frames at one: a
//! connected QP whose registered region sits between two guard areas that nothing may write,
//! and the placing policy that provokes the most feedback ([`EagerPlacing`]) with a sprayer
//! to go with it ([`XorPaths`]). The property suites and the fuzz targets stand on the same
//! rig, so what one finds the other can replay.

use super::mr::{Access, MrKeys, MrTable, PdId};
use super::path::{Path, PathSelector};
use super::qp::{Policies, Qp, QpAttr, QpConfig};
use super::recovery::{Arrivals, Delivery, Feedback, LossReport, Recovery, Retransmit, SendWindow};
use super::state::{ModifyError, QpType};
use crate::wire::{Psn, Qpn};

/// The protection domain of the rig.
pub const PD: PdId = PdId(1);

/// Every right a region can have.
const ALL: Access = Access::LOCAL_WRITE
    .with(Access::REMOTE_WRITE)
    .with(Access::REMOTE_READ)
    .with(Access::REMOTE_ATOMIC);

/// A placing recovery policy that reports every missing PSN below an arrival (up to eight)
/// lost at once and asks to avoid the path the arrival names: the most feedback a hostile
/// stream can provoke.
#[derive(Debug, Clone, Copy)]
pub struct EagerPlacing {
    /// What the responder tells the requester.
    pub feedback: Feedback,
    /// The send window, in packets.
    pub window: u32,
    /// Paths to name in avoid requests: an arrival's PSN modulo this.
    pub paths: u32,
}

impl Recovery for EagerPlacing {
    fn name(&self) -> &'static str {
        "eager"
    }
    fn window(&self) -> u32 {
        self.window
    }
    fn delivery(&self) -> Delivery {
        Delivery::Placement(self.feedback)
    }
    fn on_sequence_error(&mut self, missing: Psn, w: SendWindow) -> Retransmit {
        Retransmit::Only(missing, Some(w.nxt.sub(1)))
    }
    fn on_timeout(&mut self, _w: SendWindow) -> Retransmit {
        Retransmit::Holes
    }
    fn on_arrival(
        &mut self,
        psn: Psn,
        _port: u16,
        _paths: &dyn PathSelector,
        rx: &dyn Arrivals,
        report: &mut LossReport,
    ) {
        let epsn = rx.epsn();
        for i in 0..psn.distance(epsn).clamp(0, 8) as u32 {
            let m = epsn.add(i);
            if !rx.arrived(m) && !rx.reported(m) {
                report.lost.push(m);
            }
        }
        report.avoid = Some((psn.value() % self.paths.max(1)) as u8);
    }
    fn on_response_arrival(
        &mut self,
        psn: Psn,
        port: u16,
        paths: &dyn PathSelector,
        rx: &dyn Arrivals,
        report: &mut LossReport,
    ) {
        self.on_arrival(psn, port, paths, rx, report);
    }
}

/// Sprays over `n` UDP source ports: the base port XOR the PSN modulo `n`.
#[derive(Debug, Clone, Copy)]
pub struct XorPaths(pub u16);

impl PathSelector for XorPaths {
    fn name(&self) -> &'static str {
        "xor"
    }
    fn select(&mut self, base: Path, psn: Psn, _retransmission: bool) -> Path {
        Path {
            udp_src_port: base.udp_src_port ^ (psn.value() % u32::from(self.0.max(1))) as u16,
            ..base
        }
    }
}

/// QP 7, connected to a QP 8 that is never driven, with `region` bytes registered between
/// two guard areas of `guard` bytes.
pub struct Target {
    /// The QP under attack.
    pub qp: Qp,
    /// Its memory table.
    pub mem: MrTable,
    /// The region's keys (iova 0, every right, in [`PD`]).
    pub keys: MrKeys,
    whole: MrKeys,
    guard: usize,
    region: usize,
}

impl Target {
    /// A target of type `t` brought up with `attr` (addresses and QP numbers are the
    /// rig's), running `placing` and `spray` when given, its memory keys from `seed`.
    pub fn new(
        t: QpType,
        (placing, spray): (Option<EagerPlacing>, Option<XorPaths>),
        attr: &QpAttr,
        (guard, region): (usize, usize),
        seed: u64,
    ) -> Result<Self, ModifyError> {
        let mut mem = MrTable::new(seed);
        let whole = mem
            .register_owned_at(PD, guard + region + guard, 0, Access::LOCAL_WRITE)
            .expect("a fresh table registers");
        let keys = mem
            .register_within(whole, guard, region, (PD, 0, ALL))
            .expect("inside the allocation")
            .expect("a fresh table registers");
        let mut qp = Qp::new(QpConfig::new(Qpn::new(7), t, PD));
        let mut peer = Qp::new(QpConfig::new(Qpn::new(8), t, PD));
        if let Some(p) = placing {
            for q in [&mut qp, &mut peer] {
                let mut policies = Policies::recovery(Box::new(p));
                if let Some(s) = spray {
                    policies = policies.with_path(Box::new(s));
                }
                q.set_policies(policies);
            }
        }
        super::loopback::connect(&mut qp, &mut peer, attr)?;
        if t == QpType::Ud {
            // UD has no path; its MTU is the port's.
            qp.set_port_mtu(attr.path_mtu);
        }
        Ok(Self {
            qp,
            mem,
            keys,
            whole,
            guard,
            region,
        })
    }

    /// Whether the guard area below the region and the one above are still all zero.
    pub fn guards_untouched(&self) -> (bool, bool) {
        let zero = |at: usize| {
            let mut b = vec![0u8; self.guard];
            self.mem
                .read(self.whole.lkey, PD, at as u64, &mut b, Access::NONE)
                .is_ok_and(|()| b.iter().all(|&x| x == 0))
        };
        (zero(0), zero(self.guard + self.region))
    }
}
