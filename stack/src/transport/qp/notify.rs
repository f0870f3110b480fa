//! DCQCN's notification point (Annex A17.9.3, as a ConnectX runs it): a packet for this QP
//! that arrived with ECN Congestion Experienced makes the QP send its peer a CNP — at most
//! one per `min_time_between_cnps`, so a marked burst costs the sender one rate cut per
//! interval, not one per packet. The CNP leaves with its own DSCP (`cnp_dscp`), Not-ECT so
//! no switch marks it, and names the peer's QP; the peer's congestion control (the reaction
//! point) hears it as [`CongestionControl::on_cnp`](crate::transport::CongestionControl::on_cnp).

use crate::wire::{Ecn, Opcode, Psn, RoceRepr, CNP_PKEY};

/// The notification point's parameters, by their mlx5 names (`np_*` in mlx5's `cc_params`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NpConfig {
    /// Whether CE-marked packets make CNPs at all.
    pub enabled: bool,
    /// At most one CNP per QP per this interval, ns. Firmware dumps of current ConnectX
    /// adapters show 4 µs (some 2; the DCQCN paper's era, 50).
    pub min_time_between_cnps_ns: u64,
    /// The CNP's DSCP (mlx5's `cnp_dscp`, 48).
    pub cnp_dscp: u8,
    /// Its 802.1p priority on a VLAN-tagged port (`cnp_802p_prio`, 6); ferroce's frames
    /// are untagged unless the address vector says otherwise, so it is kept for a tagged
    /// path.
    pub cnp_802p_prio: u8,
}

impl Default for NpConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            min_time_between_cnps_ns: 4_000,
            cnp_dscp: 48,
            cnp_802p_prio: 6,
        }
    }
}

/// A QP's notification point: its parameters, when it last sent a CNP, and one to send.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Np {
    pub(crate) cfg: NpConfig,
    last: Option<u64>,
    pub(crate) out: bool,
}

impl Np {
    pub(crate) fn new(cfg: NpConfig) -> Self {
        Self {
            cfg,
            last: None,
            out: false,
        }
    }

    /// A CE-marked packet at `now`: a CNP is due unless one went within the interval.
    pub(crate) fn on_ce(&mut self, now: u64) {
        if !self.cfg.enabled {
            return;
        }
        let due = self
            .last
            .is_none_or(|t| now.saturating_sub(t) >= self.cfg.min_time_between_cnps_ns);
        if due {
            self.last = Some(now);
            self.out = true;
        }
    }

    /// The CNP to send, from the QP's header template (`repr`: addresses, UDP source port,
    /// the peer's QP).
    pub(crate) fn cnp(&self, mut repr: RoceRepr) -> RoceRepr {
        repr.bth.opcode = Opcode::CNP;
        repr.bth.psn = Psn::new(0);
        repr.bth.pkey = CNP_PKEY;
        repr.bth.becn = true;
        repr.bth.fecn = false;
        repr.bth.ack_req = false;
        repr.bth.solicited = false;
        repr.bth.pad_count = 0;
        repr.payload_len = 0;
        repr.ip.set_dscp(self.cfg.cnp_dscp);
        repr.ip.set_ecn(Ecn::NotEct);
        repr
    }
}

/// The notification point's half of `impl Qp`: a CE-marked packet owes the peer a CNP, which
/// leaves before the QP's other frames.
mod behaviour {
    use super::super::*;

    impl Qp {
        /// A packet marked Congestion Experienced: counted, and a CNP owed to the peer (the
        /// notification point), unless it was a CNP or the QP cannot answer.
        #[cold]
        pub(in crate::transport::qp) fn on_ce(&mut self, now: u64, op: Opcode) {
            self.cx.counters.np_ecn_marked_roce_packets += 1;
            if op == Opcode::CNP
                || self.cx.qp_type == QpType::Ud
                || !matches!(self.cx.state, QpState::Rtr | QpState::Rts | QpState::Sqd)
            {
                return;
            }
            let e = self.cx.ext.get_or_insert_with(Box::default);
            e.np.get_or_insert_with(|| notify::Np::new(notify::NpConfig::default()))
                .on_ce(now);
        }
        /// Sets this QP's notification point (the default: enabled, 4 µs between CNPs, DSCP 48).
        pub fn set_notification_point(&mut self, cfg: notify::NpConfig) {
            let e = self.cx.ext.get_or_insert_with(Box::default);
            match e.np.as_mut() {
                Some(np) => np.cfg = cfg,
                None => e.np = Some(notify::Np::new(cfg)),
            }
        }
        /// The CNP owed, if any, into `buf`.
        #[cold]
        pub(in crate::transport::qp) fn transmit_cnp(&mut self, buf: &mut [u8]) -> Option<usize> {
            let e = self.cx.ext.as_mut()?;
            let np = e.np.as_mut()?;
            np.out = false;
            let repr = np.cnp(self.cx.template.repr());
            let n = repr.emit(buf, |_| {}).ok()?;
            self.cx.counters.np_cnp_sent += 1;
            Some(n)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::loopback::{connect, drain_frames};
    use crate::transport::{
        Access, MrTable, Payload, PdId, Qp, QpAttr, QpConfig, QpType, SendFlags, SendWr, Sge,
        WrOpcode,
    };
    use crate::wire::{internet_checksum, Checks, Qpn, ETHERNET_LEN};

    const PD: PdId = PdId(1);

    /// Marks a frame's IPv4 header Congestion Experienced, as a switch does: the TOS byte
    /// and the header checksum (the ICRC masks the TOS byte, so it stays valid).
    fn mark_ce(frame: &mut [u8]) {
        let ip = &mut frame[ETHERNET_LEN..ETHERNET_LEN + 20];
        ip[1] |= 0b11;
        ip[10] = 0;
        ip[11] = 0;
        let c = internet_checksum(ip);
        ip[10..12].copy_from_slice(&c.to_be_bytes());
    }

    /// A WRITE's packets arrive CE-marked at the responder: the first makes a CNP at once —
    /// opcode 0x81, BECN, P_Key 0xFFFF, PSN 0, the requester's QP, DSCP 48, Not-ECT, UDP
    /// checksum 0, 16 zero bytes — the next ones within 4 µs make none, one after 4 µs makes
    /// another; counters say so; the requester hears each CNP (`rp_cnp_handled`).
    #[test]
    fn ce_marked_packets_make_rate_limited_cnps() {
        let attr = QpAttr {
            qp_access_flags: Access::REMOTE_WRITE,
            ..QpAttr::default()
        };
        let mut a = Qp::new(QpConfig::new(Qpn::new(0x11), QpType::Rc, PD));
        let mut b = Qp::new(QpConfig::new(Qpn::new(0x22), QpType::Rc, PD));
        connect(&mut a, &mut b, &attr).unwrap();
        let (mut ma, mut mb) = (MrTable::new(1), MrTable::new(2));
        let all = Access::LOCAL_WRITE.with(Access::REMOTE_WRITE);
        let src = ma.register_owned_at(PD, 1 << 16, 0, all).unwrap();
        let dst = mb.register_owned_at(PD, 1 << 16, 0, all).unwrap();
        let sge = [Sge {
            addr: 0,
            length: 4096,
            lkey: src.lkey,
        }];
        let mut frames = Vec::new();
        for i in 0..3u64 {
            let wr = SendWr::new(i, WrOpcode::Write, Payload::Sges(&sge))
                .remote(4096 * i, dst.rkey)
                .flags(SendFlags::SIGNALED);
            a.post_send(&wr).unwrap();
            frames.extend(drain_frames(&mut a, &ma, 0));
        }
        assert!(frames.len() >= 3);
        let mut cnps = Vec::new();
        for (f, now) in frames.iter_mut().zip([10_000, 11_000, 14_500]) {
            mark_ce(f);
            let p = crate::wire::RoceRepr::parse(f, Checks::ALL).unwrap();
            b.handle_packet(now, &p, &mut mb);
            for out in drain_frames(&mut b, &mb, now) {
                let q = crate::wire::RoceRepr::parse(&out, Checks::ALL).unwrap();
                if q.repr.bth.opcode == Opcode::CNP {
                    cnps.push(out.clone());
                }
            }
        }
        assert_eq!(cnps.len(), 2, "at 10 µs and at 14.5 µs, not at 11 µs");
        let c = b.counters();
        assert_eq!((c.np_ecn_marked_roce_packets, c.np_cnp_sent), (3, 2));
        let cnp = &cnps[0];
        let ip = &cnp[ETHERNET_LEN..];
        assert_eq!(ip[1], 48 << 2, "DSCP 48, Not-ECT");
        let udp = &ip[20..];
        assert_eq!(&udp[2..4], &4791u16.to_be_bytes());
        assert_eq!(&udp[6..8], &[0, 0], "UDP checksum 0");
        let bth = &udp[8..];
        assert_eq!(bth[0], 0x81);
        assert_eq!(&bth[2..4], &[0xff, 0xff]);
        assert_eq!(bth[4], 0x40, "BECN");
        assert_eq!(&bth[5..8], &[0, 0, 0x11], "the requester's QP");
        assert_eq!(&bth[8..12], &[0, 0, 0, 0], "PSN 0");
        assert_eq!(&bth[12..28], &[0; 16]);
        assert_eq!(cnp.len(), ETHERNET_LEN + 20 + 8 + 12 + 16 + 4);
        for c in &cnps {
            let p = crate::wire::RoceRepr::parse(c, Checks::ALL).unwrap();
            a.handle_packet(20_000, &p, &mut ma);
        }
        assert_eq!(a.counters().rp_cnp_handled, 2);
    }

    /// Disabled: never a CNP; enabled: one, then none within `min_time_between_cnps`.
    #[test]
    fn a_disabled_notification_point_only_counts() {
        let mut np = Np::new(NpConfig {
            enabled: false,
            ..NpConfig::default()
        });
        np.on_ce(0);
        assert!(!np.out);
        let mut np = Np::new(NpConfig::default());
        np.on_ce(0);
        assert!(np.out);
        np.out = false;
        np.on_ce(3_999);
        assert!(!np.out, "within min_time_between_cnps");
        np.on_ce(4_000);
        assert!(np.out);
    }
}
