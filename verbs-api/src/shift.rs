//! SHIFT mode on the verbs API ([`ferroce_reliability::failover::shift`]): a [`ShiftQp`] is three RC
//! QPs of a two-port device — the default one on port 1, a backup and a control QP on port
//! 2 — each connected to the peer's twin, with the transport's own failover off; work
//! requests go through the mode, which moves them to the backup QP when the default one
//! fails and brings them home when a probe finds the default path back. For a peer whose
//! transport is in hardware (a ConnectX running SHIFT's library), or to compare with native
//! failover between two ferroce devices.
//!
//! The application's clock is the mode's: [`ShiftQp::poll`] polls the three QPs' completion
//! queue, runs the handshake and the probes, and returns the application's completions, as
//! `ibv_poll_cq` would.

use std::sync::{Mutex, MutexGuard};

use ferroce_reliability::failover::shift::{Rail, ShiftConfig, ShiftIo, ShiftSide, ShiftStats};
use ferroce_stack::transport::{
    AttrMask, PostError, QpAttr, QpCaps, QpState, QpType, RecvWr, SendWr, WorkCompletion,
};

use crate::connect::{connect_qp_on, ConnectOpts, Endpoint};
use crate::verbs::{
    CompletionQueue, Context, MemoryRegion, ProtectionDomain, QueuePair, VerbsError,
};

/// The three QPs and how each was connected (to reconnect it after a reset).
struct Qps {
    ctx: Context,
    qps: [QueuePair; 3],
    links: [Option<(u32, Endpoint)>; 3],
    opts: ConnectOpts,
}

impl Qps {
    fn port(rail: Rail) -> u8 {
        if rail == Rail::Default {
            1
        } else {
            2
        }
    }
}

impl ShiftIo for Qps {
    fn post_send(&mut self, rail: Rail, wr: &SendWr<'_>) -> Result<(), PostError> {
        self.qps[rail as usize]
            .post_send(std::slice::from_ref(wr))
            .map_err(|f| f.error)
    }

    fn post_recv(&mut self, rail: Rail, wr: &RecvWr<'_>) -> Result<(), PostError> {
        self.qps[rail as usize]
            .post_recv(std::slice::from_ref(wr))
            .map_err(|f| f.error)
    }

    fn reconnect(&mut self, rail: Rail) {
        let qp = &self.qps[rail as usize];
        let reset = QpAttr {
            qp_state: QpState::Reset,
            ..QpAttr::default()
        };
        let _ = qp.modify(&reset, AttrMask::STATE);
        if let Some((psn, peer)) = &self.links[rail as usize] {
            let _ = connect_qp_on(&self.ctx, qp, Self::port(rail), *psn, peer, &self.opts);
        }
    }

    fn now(&self) -> u64 {
        self.ctx.now()
    }
}

/// One end of a SHIFT connection on a two-port device (see the module documentation).
pub struct ShiftQp {
    cq: CompletionQueue,
    state: Mutex<(Qps, ShiftSide)>,
}

impl std::fmt::Debug for ShiftQp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShiftQp").finish_non_exhaustive()
    }
}

impl ShiftQp {
    /// Three RC QPs on `pd`'s device (which needs two ports) and one CQ for them; `leader`:
    /// this end probes and leads the switch-back (exactly one end of a connection).
    pub fn new(
        pd: &ProtectionDomain,
        caps: QpCaps,
        config: ShiftConfig,
    ) -> Result<Self, VerbsError> {
        let ctx = pd.context().clone();
        let ports = ctx.query_device().phys_port_cnt;
        if ports < 2 {
            return Err(VerbsError::NoSuchPort { port: 2, ports });
        }
        let depth = (caps.max_send_wr + caps.max_recv_wr) as usize * 3 + 64;
        let cq = ctx.create_cq(depth, None);
        let mk = || pd.create_qp(QpType::Rc, caps, &cq, &cq);
        let qps = [mk()?, mk()?, mk()?];
        let qps = Qps {
            ctx,
            qps,
            links: [None, None, None],
            opts: ConnectOpts::default(),
        };
        let side = ShiftSide::new_unposted(config);
        Ok(Self {
            cq,
            state: Mutex::new((qps, side)),
        })
    }

    fn lock(&self) -> MutexGuard<'_, (Qps, ShiftSide)> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What the peer connects to: the default, backup and control QPs (the last two at
    /// the device's second port), each starting at `psn + rail`, offering `mr`.
    pub fn endpoints(&self, mr: &MemoryRegion, psn: u32) -> [Endpoint; 3] {
        let s = self.lock();
        let ctx = &s.0.ctx;
        let alt = (
            ctx.query_gid_on(2, 0).unwrap_or(crate::verbs::Gid([0; 16])),
            ctx.port_mac(2)
                .unwrap_or(ferroce_stack::wire::MacAddr([0; 6])),
        );
        std::array::from_fn(|i| {
            let mut e = Endpoint::of(ctx, &s.0.qps[i], mr, psn.wrapping_add(i as u32) & 0xff_ffff);
            if i > 0 {
                (e.gid, e.mac) = alt;
            }
            e.alt = None;
            e
        })
    }

    /// Connects the three QPs to the peer's `endpoints` (from its [`endpoints`](Self::endpoints)),
    /// this end starting at `psn` as it told the peer, and posts the handshake's receives.
    pub fn connect(
        &self,
        psn: u32,
        peer: &[Endpoint; 3],
        opts: &ConnectOpts,
    ) -> Result<(), VerbsError> {
        let mut s = self.lock();
        let (qps, side) = &mut *s;
        qps.opts = *opts;
        for rail in [Rail::Default, Rail::Backup, Rail::Control] {
            let i = rail as usize;
            let my = psn.wrapping_add(i as u32) & 0xff_ffff;
            connect_qp_on(&qps.ctx, &qps.qps[i], Qps::port(rail), my, &peer[i], opts)?;
            qps.links[i] = Some((my, peer[i]));
        }
        side.arm(qps);
        Ok(())
    }

    /// `ibv_post_send` through the mode.
    pub fn post_send(&self, wr: &SendWr<'_>) -> Result<(), PostError> {
        let mut s = self.lock();
        let (qps, side) = &mut *s;
        side.post_send(qps, wr)
    }

    /// `ibv_post_recv` through the mode.
    pub fn post_recv(&self, wr: &RecvWr<'_>) -> Result<(), PostError> {
        let mut s = self.lock();
        let (qps, side) = &mut *s;
        side.post_recv(qps, wr)
    }

    /// Polls the three QPs, runs the mode, and appends the application's completions to
    /// `out`; returns how many it appended.
    pub fn poll(&self, out: &mut Vec<WorkCompletion>) -> usize {
        let mut wcs = Vec::new();
        self.cq.poll(&mut wcs, 256);
        let mut s = self.lock();
        let (qps, side) = &mut *s;
        let before = out.len();
        for wc in &wcs {
            let rail = match qps.qps.iter().position(|q| q.qpn() == wc.qp_num) {
                Some(0) => Rail::Default,
                Some(1) => Rail::Backup,
                _ => Rail::Control,
            };
            out.extend(side.on_completion(qps, rail, wc));
        }
        side.poll(qps);
        out.len() - before
    }

    /// When [`poll`](Self::poll) has a probe to send next, on the device's clock (a
    /// simulated fabric's caller advances virtual time to it when nothing else happens).
    pub fn next_timeout(&self) -> Option<u64> {
        self.lock().1.next_timeout()
    }

    /// What the mode did so far.
    pub fn stats(&self) -> ShiftStats {
        self.lock().1.stats()
    }

    /// Where the sends go now, and whether the safety rule ended the connection.
    pub fn state(&self) -> (ferroce_reliability::failover::shift::SendState, bool) {
        let s = self.lock();
        (s.1.send_state(), s.1.failed())
    }
}
