//! Two QPs wired back to back in memory: every frame one emits is parsed (ICRC included)
//! and handed to the other at once. No driver, no fabric, no loss: the transport alone, as
//! the benchmarks measure it and as a researcher trying a policy can drive it in a few lines.

use core::net::{IpAddr, Ipv4Addr};

use super::mr::MrTable;
use super::qp::{AddressVector, Qp, QpAttr};
use super::state::ModifyError;
use crate::wire::{Checks, MacAddr, RoceRepr};

/// Brings `a` and `b` (in RESET) to RTS connected to each other, as two hosts 10.0.0.1 and
/// 10.0.0.2 would be after a perftest-style exchange. `attr` supplies everything but the
/// addresses and QP numbers: MTU, PSNs (`sq_psn` of `a` is `b`'s `rq_psn` and the other way
/// round with `rq_psn`), timeouts, retry counts, access flags, READ/atomic depths.
pub fn connect(a: &mut Qp, b: &mut Qp, attr: &QpAttr) -> Result<(), ModifyError> {
    let ends = [
        (MacAddr([2, 0, 0, 0, 0, 1]), Ipv4Addr::new(10, 0, 0, 1)),
        (MacAddr([2, 0, 0, 0, 0, 2]), Ipv4Addr::new(10, 0, 0, 2)),
    ];
    let (qa, qb) = (a.qpn(), b.qpn());
    for (i, qp, peer) in [(0, a, qb), (1, b, qa)] {
        let (me, them) = (ends[i], ends[1 - i]);
        let mut x = *attr;
        if i == 1 {
            core::mem::swap(&mut x.sq_psn, &mut x.rq_psn);
        }
        x.ah_attr = AddressVector {
            smac: me.0,
            dmac: them.0,
            src: IpAddr::V4(me.1),
            dst: IpAddr::V4(them.1),
            ..attr.ah_attr
        };
        x.dest_qp_num = peer;
        qp.bring_up(&x)?;
    }
    Ok(())
}

/// Every frame `qp` wants to send now, each in its own vector: for tests that stand between
/// two QPs and decide what reaches whom.
pub fn drain_frames(qp: &mut Qp, mem: &MrTable, now: u64) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut buf = vec![0u8; 16 * 1024];
    while let Some(n) = qp.poll_transmit(now, &mut buf, mem) {
        out.push(buf[..n].to_vec());
    }
    out
}

/// Two connected QPs, each with the memory table of its side.
pub struct Loopback {
    /// One end.
    pub a: Qp,
    /// The other end.
    pub b: Qp,
    /// `a`'s registered memory.
    pub mem_a: MrTable,
    /// `b`'s registered memory.
    pub mem_b: MrTable,
    /// The clock both ends see, advanced by the caller.
    pub now: u64,
    /// Frames moved so far.
    pub frames: u64,
    /// Bytes moved so far (whole frames).
    pub bytes: u64,
    /// Frames that failed to parse (never expected here).
    pub malformed: u64,
    buf: Box<[u8]>,
}

impl Loopback {
    /// Wires `a` and `b`, which must already be connected to each other (RTS).
    pub fn new(a: Qp, b: Qp, mem_a: MrTable, mem_b: MrTable) -> Self {
        Self {
            a,
            b,
            mem_a,
            mem_b,
            now: 0,
            frames: 0,
            bytes: 0,
            malformed: 0,
            buf: vec![0; 16 * 1024].into_boxed_slice(),
        }
    }

    /// Moves frames both ways until neither end has anything to send, and fires timers that
    /// are due. Returns the frames moved. Each direction sends a burst before the other
    /// answers, so ACK coalescing works as it does behind a real port's burst.
    pub fn run(&mut self) -> u64 {
        let start = self.frames;
        loop {
            let moved = Self::pump(
                &mut self.a,
                &self.mem_a,
                &mut self.b,
                &mut self.mem_b,
                self.now,
                &mut self.buf,
                &mut self.bytes,
                &mut self.malformed,
            ) + Self::pump(
                &mut self.b,
                &self.mem_b,
                &mut self.a,
                &mut self.mem_a,
                self.now,
                &mut self.buf,
                &mut self.bytes,
                &mut self.malformed,
            );
            self.frames += moved;
            if moved == 0 {
                for qp in [&mut self.a, &mut self.b] {
                    if qp.poll_timeout().is_some_and(|t| t <= self.now) {
                        qp.handle_timeout(self.now);
                    }
                }
                return self.frames - start;
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn pump(
        from: &mut Qp,
        from_mem: &MrTable,
        to: &mut Qp,
        to_mem: &mut MrTable,
        now: u64,
        buf: &mut [u8],
        bytes: &mut u64,
        malformed: &mut u64,
    ) -> u64 {
        let mut n = 0;
        while let Some(len) = from.poll_transmit(now, buf, from_mem) {
            n += 1;
            *bytes += len as u64;
            match &RoceRepr::parse(&buf[..len], Checks::ALL) {
                Ok(pkt) => to.handle_packet(now, pkt, to_mem),
                Err(_) => *malformed += 1,
            }
        }
        n
    }
}
