//! The fabric, its hosts, and the loop that drives them.

use ferroce_drivers::sim::{Fabric, Idle, SimPort};
use ferroce_drivers::Port;
use ferroce_stack::transport::{bring_up, Policies, Qp, QpAttr, QpConfig, QpState, QpType};
use ferroce_stack::wire::{Psn, Qpn};

use crate::conn::ConnOpts;
use crate::host::Host;

/// Hosts on a fabric.
pub struct Testbed<P = SimPort> {
    /// The fabric (cheap to clone: a handle).
    pub fabric: Fabric,
    /// The hosts, in the order they were given.
    pub hosts: Vec<Host<P>>,
    scratch: Vec<u8>,
}

/// What one [`Testbed::step`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Some host sent frames; time stayed (they may be due at once on a zero-delay link).
    Worked,
    /// Nobody sent: time moved to the next arrival or timer.
    Advanced,
    /// Nothing is in flight and no timer is armed.
    Idle,
    /// The next arrival or timer is past the horizon; time stayed.
    Beyond,
}

impl<P: Port> Testbed<P> {
    /// A testbed of `hosts` on `fabric`.
    pub fn new(fabric: Fabric, hosts: Vec<Host<P>>) -> Self {
        Self {
            fabric,
            hosts,
            scratch: vec![0; 16 * 1024],
        }
    }

    /// Virtual time now.
    pub fn now(&self) -> u64 {
        self.fabric.now()
    }

    /// Every host takes one turn; if none sent a frame, time moves to the next arrival or
    /// timer, unless that is past `until`.
    pub fn step(&mut self, until: u64) -> Step {
        if self.turn() > 0 {
            return Step::Worked;
        }
        self.advance(until)
    }

    /// Every host takes one turn (receives, timers, sends, completions); returns the frames
    /// sent. With [`advance`](Self::advance), [`step`](Self::step) in two halves, for a
    /// driver that acts on the turn's completions before time moves (a layer above the
    /// transport, such as SHIFT mode, posting on them).
    pub fn turn(&mut self) -> usize {
        let now = self.fabric.now();
        let mut sent = 0;
        for h in &mut self.hosts {
            sent += h.turn(now, &mut self.scratch);
        }
        sent
    }

    /// Time moves to the next arrival or timer, unless that is past `until`.
    pub fn advance(&mut self, until: u64) -> Step {
        let timer = self.hosts.iter().filter_map(Host::next_timeout).min();
        match self.fabric.advance_idle(timer, until) {
            Idle::Advanced => Step::Advanced,
            Idle::Done => Step::Idle,
            Idle::Beyond => Step::Beyond,
        }
    }

    /// Steps until nothing is left to happen (true) or the next thing happens after
    /// `until` (false).
    pub fn drive_until(&mut self, until: u64) -> bool {
        loop {
            match self.step(until) {
                Step::Idle => return true,
                Step::Beyond => return false,
                Step::Worked | Step::Advanced => {}
            }
        }
    }

    /// Steps until nothing is left to happen.
    pub fn drive(&mut self) -> bool {
        self.drive_until(u64::MAX)
    }

    /// Brings QP `qpn` of host `h` (in RESET) to RTS towards QP `peer_qpn` of host `ph`,
    /// sending from PSN `sq_psn` and expecting `rq_psn`, with `o`: from the port the QP sends
    /// on to the port its peer sends on (the peer's first port while it has no such QP yet).
    pub fn bring_up(
        &mut self,
        ends: (usize, u32),
        peer: (usize, u32),
        psns: (u32, u32),
        o: &ConnOpts,
    ) {
        self.bring_up_to(ends, peer, psns, o, QpState::Rts);
    }

    /// [`bring_up`](Self::bring_up), stopping at `to` (RTR: a QP that only answers, as
    /// perftest leaves its SEND server's).
    pub fn bring_up_to(
        &mut self,
        (h, qpn): (usize, u32),
        (ph, peer_qpn): (usize, u32),
        (sq_psn, rq_psn): (u32, u32),
        o: &ConnOpts,
        to: QpState,
    ) {
        let peer = &self.hosts[ph];
        let peer_mac = peer.port(peer.port_of(peer_qpn).unwrap_or(0)).mac();
        let port = self.hosts[h]
            .port_of(qpn)
            .expect("bring up a QP the host has");
        let mut av = self.hosts[h].av_from(port, peer_mac, peer.ip);
        av.udp_src_port = o.udp_src_port;
        let attr = QpAttr {
            qp_access_flags: o.access,
            qkey: o.qkey,
            ah_attr: av,
            path_mtu: o.mtu,
            dest_qp_num: Qpn::new(peer_qpn),
            rq_psn: Psn::new(rq_psn),
            max_dest_rd_atomic: o.max_rd_atomic,
            min_rnr_timer: o.min_rnr_timer,
            sq_psn: Psn::new(sq_psn),
            timeout: o.timeout,
            retry_cnt: o.retry_cnt,
            rnr_retry: o.rnr_retry,
            max_rd_atomic: o.max_rd_atomic,
            port_num: port as u8 + 1,
            ..QpAttr::default()
        };
        let qp = self.hosts[h].qp(qpn);
        let t = qp.qp_type();
        bring_up(t, &attr, |a, m| {
            if to == QpState::Rtr && a.qp_state == QpState::Rts {
                return Ok(());
            }
            qp.modify(a, m)
        })
        .expect("a valid bring-up");
        if qp.qp_type() == QpType::Ud {
            // UD has no path; its MTU is the port's.
            qp.set_port_mtu(o.mtu);
        }
    }

    /// Gives QP `qpn` of host `h` (at RTS) an alternate path from its port `alt_port` to
    /// port `peer_alt_port` of host `ph`: where native failover moves it.
    pub fn set_alternate(
        &mut self,
        (h, qpn): (usize, u32),
        ph: usize,
        (alt_port, peer_alt_port): (usize, usize),
    ) {
        let peer = &self.hosts[ph];
        let peer_mac = peer.port(peer_alt_port).mac();
        let av = self.hosts[h].av_from(alt_port, peer_mac, peer.ip);
        // The testbed's QPs all keep the same atomic depth both ways.
        let depth = self.hosts[h].qp(qpn).query().max_dest_rd_atomic;
        self.hosts[h]
            .qp(qpn)
            .set_alternate_path(av, alt_port as u8 + 1, depth)
            .expect("an alternate path at RTS");
    }

    /// An RC connection on port `port` of both hosts: QP `qpn_a` on host `ha` and `qpn_b` on
    /// host `hb`, added there and brought to RTS towards each other (the rails' second
    /// port, a probe QP, a backup QP).
    pub fn connect_rc_on(
        &mut self,
        port: usize,
        ((ha, qpn_a), (hb, qpn_b)): ((usize, u32), (usize, u32)),
        (psn_a, psn_b): (u32, u32),
        o: &ConnOpts,
    ) {
        let qp = |n| Qp::new(QpConfig::new(Qpn::new(n), QpType::Rc, crate::PD));
        self.hosts[ha].insert_qp(qp(qpn_a), port);
        self.hosts[hb].insert_qp(qp(qpn_b), port);
        self.bring_up((ha, qpn_a), (hb, qpn_b), (psn_a, psn_b), o);
        self.bring_up((hb, qpn_b), (ha, qpn_a), (psn_b, psn_a), o);
    }

    /// A connection: QP `qpn_a` on host `ha` and `qpn_b` on host `hb`, both of type `t`,
    /// added and brought to RTS towards each other, each running the policies `policies`
    /// makes (the defaults when `None`).
    pub fn connect(
        &mut self,
        t: QpType,
        ((ha, qpn_a), (hb, qpn_b)): ((usize, u32), (usize, u32)),
        (psn_a, psn_b): (u32, u32),
        o: &ConnOpts,
        policies: Option<fn() -> Policies>,
    ) {
        self.hosts[ha].add_qp(qpn_a, t);
        self.hosts[hb].add_qp(qpn_b, t);
        if let Some(make) = policies {
            self.hosts[ha].qp(qpn_a).set_policies(make());
            self.hosts[hb].qp(qpn_b).set_policies(make());
        }
        self.bring_up((ha, qpn_a), (hb, qpn_b), (psn_a, psn_b), o);
        self.bring_up((hb, qpn_b), (ha, qpn_a), (psn_b, psn_a), o);
    }
}
