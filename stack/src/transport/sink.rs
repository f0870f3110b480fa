//! A seam for a protocol above UC that takes WRITE-with-immediates packet by packet.
//!
//! SDR (issue 21) sends every packet as its own UC RDMA WRITE_ONLY_WITH_IMMEDIATE whose
//! immediate names the message and the packet. Through the ordinary responder each would
//! take a receive WQE and make a completion — and an empty receive queue would drop it
//! unseen, which looks like loss. A QP with a [`WriteImmSink`] hands such packets to the
//! sink instead, after the transport's own checks (header, opcode, QP state): the sink
//! decides whether and where the payload lands, places it through the [`MrTable`], and
//! records it in its own tables, which its owner polls. PSNs do not matter to it: every
//! packet is a whole message, so a gap loses nothing the next packet needs.

use core::fmt;

use super::mr::{MrTable, PdId};
use crate::wire::RethRepr;

/// What a sink did with one packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sunk {
    /// The payload was placed.
    Placed,
    /// The packet was refused or was not needed (a duplicate, a late packet, an offset past
    /// the message): nothing was written.
    Dropped,
}

/// Takes a UC QP's WRITE_ONLY_WITH_IMMEDIATE packets in place of the receive queue.
pub trait WriteImmSink: Send + fmt::Debug {
    /// One packet: its RETH, its immediate and its payload, on a QP of protection domain
    /// `pd`. The sink writes only through `mem`, with `pd`, so the table's checks hold.
    fn on_write_imm(
        &mut self,
        reth: RethRepr,
        imm: u32,
        payload: &[u8],
        pd: PdId,
        mem: &MrTable,
    ) -> Sunk;
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::transport::loopback::{connect, Loopback};
    use crate::transport::{
        Access, Payload, Qp, QpAttr, QpConfig, QpType, RecvWr, SendWr, Sge, WrOpcode,
    };
    use crate::wire::Qpn;

    const PD: PdId = PdId(1);

    /// Records what it was given and writes the payload at the RETH's address.
    #[derive(Debug, Default, Clone)]
    struct Recorder(Arc<Mutex<Vec<(u64, u32, usize)>>>);

    impl WriteImmSink for Recorder {
        fn on_write_imm(
            &mut self,
            reth: RethRepr,
            imm: u32,
            payload: &[u8],
            pd: PdId,
            mem: &MrTable,
        ) -> Sunk {
            self.0.lock().unwrap().push((reth.va, imm, payload.len()));
            match mem.write(reth.rkey, pd, reth.va, payload, Access::REMOTE_WRITE) {
                Ok(()) => Sunk::Placed,
                Err(_) => Sunk::Dropped,
            }
        }
    }

    fn pair(t: QpType) -> (Qp, Qp) {
        let mut a = Qp::new(QpConfig::new(Qpn::new(1), t, PD));
        let mut b = Qp::new(QpConfig::new(Qpn::new(2), t, PD));
        let attr = QpAttr {
            qp_access_flags: Access::REMOTE_WRITE,
            ..QpAttr::default()
        };
        connect(&mut a, &mut b, &attr).unwrap();
        (a, b)
    }

    /// With a sink, a UC WRITE-with-immediate takes no receive WQE and makes no
    /// completion: the sink gets it and places it. Without one, the same packet with no
    /// receive posted is dropped (UC). Other opcodes still go the ordinary way, and an RC
    /// QP refuses a sink.
    #[test]
    fn a_uc_sink_takes_write_with_immediates_instead_of_the_receive_queue() {
        let (a, mut b) = pair(QpType::Uc);
        let rec = Recorder::default();
        b.set_write_imm_sink(Some(Box::new(rec.clone()))).unwrap();
        let (mut ma, mut mb) = (MrTable::new(1), MrTable::new(2));
        let rw = Access::LOCAL_WRITE.with(Access::REMOTE_WRITE);
        let src = ma.register_owned_at(PD, 4096, 0, rw).unwrap();
        let dst = mb.register_owned_at(PD, 4096, 0, rw).unwrap();
        ma.write(src.lkey, PD, 0, &[9; 100], Access::NONE).unwrap();
        let mut l = Loopback::new(a, b, ma, mb);
        let sge = [Sge {
            addr: 0,
            length: 100,
            lkey: src.lkey,
        }];
        for (i, at) in [(0u32, 200u64), (1, 1000)] {
            let wr = SendWr::new(u64::from(i), WrOpcode::WriteWithImm, Payload::Sges(&sge))
                .remote(at, dst.rkey)
                .imm(0xabc0 + i);
            l.a.post_send(&wr).unwrap();
        }
        l.run();
        assert_eq!(
            *rec.0.lock().unwrap(),
            [(200, 0xabc0, 100), (1000, 0xabc1, 100)]
        );
        assert_eq!(l.b.poll_completion(), None, "no receive completion");
        assert_eq!(l.b.counters().rx_write_requests, 2);
        let mut got = [0u8; 100];
        l.mem_b
            .read(dst.lkey, PD, 1000, &mut got, Access::NONE)
            .unwrap();
        assert_eq!(got, [9; 100]);
        // A SEND still needs a receive, and fills it.
        let rsge = [Sge {
            addr: 2000,
            length: 100,
            lkey: dst.lkey,
        }];
        l.b.post_recv(&RecvWr {
            wr_id: 5,
            sg_list: &rsge,
        })
        .unwrap();
        l.a.post_send(&SendWr::new(9, WrOpcode::Send, Payload::Sges(&sge)))
            .unwrap();
        l.run();
        assert_eq!(l.b.poll_completion().map(|w| w.wr_id), Some(5));
        // Taking the sink back: the same WRITE with no receive posted is dropped.
        assert!(l.b.set_write_imm_sink(None).unwrap().is_some());
        let wr = SendWr::new(3, WrOpcode::WriteWithImm, Payload::Sges(&sge))
            .remote(3000, dst.rkey)
            .imm(1);
        l.a.post_send(&wr).unwrap();
        l.run();
        assert_eq!(rec.0.lock().unwrap().len(), 2);
        l.mem_b
            .read(dst.lkey, PD, 3000, &mut got, Access::NONE)
            .unwrap();
        assert_eq!(got, [0; 100], "UC with no receive drops the message");

        let (_, mut rc) = pair(QpType::Rc);
        assert!(rc
            .set_write_imm_sink(Some(Box::new(Recorder::default())))
            .is_err());
    }
}
