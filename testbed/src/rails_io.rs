//! The failover layers' views of the testbed: SHIFT mode's [`ShiftIo`] and Varuna mode's
//! [`VarunaIo`] over a host's QPs on the rails, written once for every experiment and test
//! that runs those layers in virtual time. (The verbs API has its own, over verbs QPs:
//! `ferroce_verbs::shift`.)

use ferroce_reliability::failover::shift::{Rail, ShiftConfig, ShiftIo, ShiftSide};
use ferroce_reliability::failover::varuna::pool::{BackupPool, Channel};
use ferroce_reliability::failover::varuna::vqp::VarunaIo;
use ferroce_stack::transport::{
    AttrMask, PostError, QpAttr, QpState, RecvWr, SendWr, WorkCompletion,
};

use crate::{ConnOpts, Testbed};

/// The QP numbers and first PSNs of one QP pair per rail (default, backup, control): index
/// 0 is host 0's, index 1 host 1's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RailQps {
    /// Each rail's QP numbers.
    pub qpns: [[u32; 2]; 3],
    /// Each rail's first PSNs (each host's send side).
    pub psns: [[u32; 2]; 3],
}

/// Host `h`'s three QPs as SHIFT mode sees them; a reconnect brings the QP back up towards
/// its twin on the other host with the PSNs and options it was first set up with.
pub struct ShiftRails<'a> {
    /// The testbed.
    pub w: &'a mut Testbed,
    /// The host (0 or 1).
    pub h: usize,
    /// The rails' QPs.
    pub qps: RailQps,
    /// How the QPs were set up.
    pub opts: &'a ConnOpts,
}

impl ShiftIo for ShiftRails<'_> {
    fn post_send(&mut self, rail: Rail, wr: &SendWr<'_>) -> Result<(), PostError> {
        let q = self.qps.qpns[rail as usize][self.h];
        self.w.hosts[self.h].qp(q).post_send(wr)
    }

    fn post_recv(&mut self, rail: Rail, wr: &RecvWr<'_>) -> Result<(), PostError> {
        let q = self.qps.qpns[rail as usize][self.h];
        self.w.hosts[self.h].qp(q).post_recv(wr)
    }

    fn reconnect(&mut self, rail: Rail) {
        let (h, q, p) = (
            self.h,
            self.qps.qpns[rail as usize],
            self.qps.psns[rail as usize],
        );
        let reset = QpAttr {
            qp_state: QpState::Reset,
            ..QpAttr::default()
        };
        let _ = self.w.hosts[h].qp(q[h]).modify(&reset, AttrMask::STATE);
        self.w
            .bring_up((h, q[h]), (1 - h, q[1 - h]), (p[h], p[1 - h]), self.opts);
    }

    fn now(&self) -> u64 {
        self.w.now()
    }
}

/// SHIFT mode on both hosts of a two-host rails testbed: each host's [`ShiftSide`] over its
/// three QPs, handed the host's completions as the testbed takes them — the driving loop
/// every experiment and test of SHIFT on the testbed shares.
pub struct ShiftPair {
    /// Host 0's and host 1's side.
    pub sides: [ShiftSide; 2],
    /// What each side gave its application, with the time each completion was taken.
    pub shown: [Vec<(WorkCompletion, u64)>; 2],
    /// When each side first fell back (its first completion that started a fallback).
    pub fell_back_at: [Option<u64>; 2],
    qps: RailQps,
    opts: ConnOpts,
    /// Each host's completions handed over so far.
    seen: [usize; 2],
}

impl ShiftPair {
    /// Sides for hosts 0 and 1 with `configs`, over the QPs `qps` (at RTS, set up with
    /// `opts`); each posts its control QP's receives now.
    pub fn new(w: &mut Testbed, qps: RailQps, opts: ConnOpts, configs: [ShiftConfig; 2]) -> Self {
        let mut side = |h: usize| {
            ShiftSide::new(
                configs[h],
                &mut ShiftRails {
                    w,
                    h,
                    qps,
                    opts: &opts,
                },
            )
        };
        let sides = [side(0), side(1)];
        Self {
            sides,
            shown: [Vec::new(), Vec::new()],
            fell_back_at: [None; 2],
            qps,
            opts,
            seen: [w.hosts[0].completions.len(), w.hosts[1].completions.len()],
        }
    }

    /// Runs `f` on host `h`'s side with its IO.
    pub fn with_side<T>(
        &mut self,
        w: &mut Testbed,
        h: usize,
        f: impl FnOnce(&mut ShiftSide, &mut ShiftRails<'_>) -> T,
    ) -> T {
        let mut io = ShiftRails {
            w,
            h,
            qps: self.qps,
            opts: &self.opts,
        };
        f(&mut self.sides[h], &mut io)
    }

    /// Posts a send WR through host `h`'s side.
    pub fn post_send(
        &mut self,
        w: &mut Testbed,
        h: usize,
        wr: &SendWr<'_>,
    ) -> Result<(), PostError> {
        self.with_side(w, h, |side, io| side.post_send(io, wr))
    }

    /// Posts a receive WR through host `h`'s side.
    pub fn post_recv(
        &mut self,
        w: &mut Testbed,
        h: usize,
        wr: &RecvWr<'_>,
    ) -> Result<(), PostError> {
        self.with_side(w, h, |side, io| side.post_recv(io, wr))
    }

    /// Each host's completions since the last call go to its side, which may post (what it
    /// gives the application lands in `shown`), then each side takes its turn (probes, the
    /// switch-back); host 0 first. True when a completion was handed over.
    pub fn turn(&mut self, w: &mut Testbed) -> bool {
        let mut acted = false;
        for h in 0..2 {
            let host = &w.hosts[h];
            let fresh: Vec<(WorkCompletion, u64)> = host.completions[self.seen[h]..]
                .iter()
                .copied()
                .zip(host.completed_at[self.seen[h]..].iter().copied())
                .collect();
            self.seen[h] += fresh.len();
            acted |= !fresh.is_empty();
            let qpns = self.qps.qpns;
            let mut io = ShiftRails {
                w,
                h,
                qps: self.qps,
                opts: &self.opts,
            };
            let side = &mut self.sides[h];
            for (wc, at) in fresh {
                let rail = match wc.qp_num.value() {
                    q if q == qpns[Rail::Default as usize][h] => Rail::Default,
                    q if q == qpns[Rail::Backup as usize][h] => Rail::Backup,
                    _ => Rail::Control,
                };
                let before = side.stats().fallbacks;
                let shown = side.on_completion(&mut io, rail, &wc);
                if self.fell_back_at[h].is_none() && side.stats().fallbacks > before {
                    self.fell_back_at[h] = Some(at);
                }
                self.shown[h].extend(shown.into_iter().map(|c| (c, at)));
            }
            side.poll(&mut io);
        }
        acted
    }

    /// The earliest time a side wants a turn (its next probe).
    pub fn next_timeout(&self) -> Option<u64> {
        self.sides.iter().filter_map(ShiftSide::next_timeout).min()
    }
}

/// A vQP's seat in a shared backup pool: the pool, the vQP's index in it, and the QP
/// number of the pool's shared channel `k` on this host.
pub struct PoolSeat<'a> {
    /// The pool.
    pub pool: &'a mut BackupPool,
    /// The vQP's index in the pool.
    pub vqp: usize,
    /// Shared channel `k`'s QP number.
    pub shared_qpn: fn(usize) -> u32,
}

/// Host `h`'s vQP as Varuna mode sees it: its default and backup QPs (numbers
/// `[default, backup]`) and the host's memory. With a pool seat, the backup is the pool's
/// shared channel until the vQP has one of its own, each WR tagged for the pool.
pub struct VarunaRails<'a> {
    /// The testbed.
    pub w: &'a mut Testbed,
    /// The host.
    pub h: usize,
    /// The default and the backup QP's numbers.
    pub qpns: [u32; 2],
    /// Its seat in a shared backup pool, if it has one.
    pub pool: Option<PoolSeat<'a>>,
}

impl VarunaIo for VarunaRails<'_> {
    fn post_send(&mut self, rail: Rail, wr: &SendWr<'_>) -> Result<(), PostError> {
        if let (Rail::Backup, Some(seat)) = (rail, self.pool.as_mut()) {
            let now = self.w.now();
            match seat.pool.fail_over(seat.vqp, now) {
                Channel::Shared(k) => {
                    let tag = seat.pool.tag(k, seat.vqp, wr.wr_id);
                    let tagged = SendWr { wr_id: tag, ..*wr };
                    return self.w.hosts[self.h]
                        .qp((seat.shared_qpn)(k))
                        .post_send(&tagged);
                }
                Channel::Dedicated | Channel::None => {}
            }
        }
        let q = if rail == Rail::Default {
            self.qpns[0]
        } else {
            self.qpns[1]
        };
        self.w.hosts[self.h].qp(q).post_send(wr)
    }

    fn read_local(&self, addr: u64, out: &mut [u8]) {
        out.copy_from_slice(&self.w.hosts[self.h].read(addr as usize, out.len()));
    }

    fn write_local(&mut self, addr: u64, data: &[u8]) {
        self.w.hosts[self.h].write(addr as usize, data);
    }
}
