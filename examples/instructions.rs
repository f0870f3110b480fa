//! The per-packet paths, for counting their instructions under callgrind
//! (`scripts/instructions.sh`): a figure that does not drift with the machine's load, as
//! timings here do. Two RC QPs in one process hand each other their frames in memory, every
//! frame emitted with its ICRC, then parsed and checked again, as in `benches/transport.rs`.
//!
//! ```text
//! instructions CASE N     CASE: write64 | send64 | read64 | write1m
//! ```
//!
//! Runs N messages of the case (in batches of 64, the last of each signaled) and prints one
//! JSON line: the messages, the frames each way, the ACKs the requester took. The script runs
//! two N and takes the difference, so the set-up's instructions fall out; what the requester
//! spends on the ACKs it receives is the inclusive cost of [`requester_receives`] (never
//! inlined, so callgrind sees it) over the same difference.
//!
//! It uses only the transport's public API of long standing, so the script can build it at an
//! older commit to compare (it copies this file into that commit's tree).

use ferroce::stack::transport::loopback::connect;
use ferroce::stack::transport::{
    Access, MrKeys, MrTable, Mtu, Payload, PdId, Qp, QpAttr, QpConfig, QpType, RecvWr, SendFlags,
    SendWr, Sge, WcStatus, WrOpcode,
};
use ferroce::stack::wire::{Psn, Qpn};
use std::sync::atomic::{AtomicU64, Ordering};

const PD: PdId = PdId(1);
const BATCH: u64 = 64;

struct Ends {
    a: Qp,
    b: Qp,
    mem_a: MrTable,
    mem_b: MrTable,
    src: MrKeys,
    dst: MrKeys,
    buf: Vec<u8>,
    /// Frames each way, and the requester's frames received (its ACKs and READ responses).
    a_to_b: u64,
    b_to_a: u64,
    _bufs: (Vec<u8>, Vec<u8>),
}

fn ends(mtu: Mtu, len: usize) -> Ends {
    let mut src = vec![0x5au8; len];
    let mut dst = vec![0u8; len];
    let (mut mem_a, mut mem_b) = (MrTable::new(1), MrTable::new(2));
    let all = Access::LOCAL_WRITE
        .with(Access::REMOTE_WRITE)
        .with(Access::REMOTE_READ);
    // SAFETY: the buffers move into `Ends` beside the tables and outlive them (a Vec's heap
    // allocation does not move when the Vec does).
    let src_keys = unsafe { mem_a.register(PD, src.as_mut_ptr(), len, 0, all) }.expect("register");
    // SAFETY: as above.
    let dst_keys = unsafe { mem_b.register(PD, dst.as_mut_ptr(), len, 0, all) }.expect("register");
    let mut a = Qp::new(QpConfig::new(Qpn::new(0x10), QpType::Rc, PD));
    let mut b = Qp::new(QpConfig::new(Qpn::new(0x20), QpType::Rc, PD));
    let attr = QpAttr {
        path_mtu: mtu,
        qp_access_flags: Access::REMOTE_WRITE.with(Access::REMOTE_READ),
        max_rd_atomic: 16,
        max_dest_rd_atomic: 16,
        sq_psn: Psn::new(0xff_ff00),
        rq_psn: Psn::new(7),
        ..QpAttr::default()
    };
    connect(&mut a, &mut b, &attr).expect("connect");
    Ends {
        a,
        b,
        mem_a,
        mem_b,
        src: src_keys,
        dst: dst_keys,
        buf: vec![0; 16 * 1024],
        a_to_b: 0,
        b_to_a: 0,
        _bufs: (src, dst),
    }
}

// The four steps, each never inlined so callgrind names it. Each counts its own calls, which
// also keeps their bodies apart: two identical functions would be folded into one symbol.
static REQUESTER_SENT: AtomicU64 = AtomicU64::new(0);
static RESPONDER_RECEIVED: AtomicU64 = AtomicU64::new(0);
static RESPONDER_SENT: AtomicU64 = AtomicU64::new(0);
static REQUESTER_RECEIVED: AtomicU64 = AtomicU64::new(0);

/// The requester builds its next frame (headers, payload, ICRC), if it has one.
#[inline(never)]
fn requester_sends(a: &mut Qp, mem: &MrTable, buf: &mut [u8]) -> Option<usize> {
    REQUESTER_SENT.fetch_add(1, Ordering::Relaxed);
    a.poll_transmit(0, buf, mem)
}

/// The responder takes one frame from the wire (`Qp::handle_frame`: parse, ICRC check,
/// execution), as an engine hands it one.
#[inline(never)]
fn responder_receives(b: &mut Qp, mem: &mut MrTable, frame: &[u8]) {
    RESPONDER_RECEIVED.fetch_add(1, Ordering::Relaxed);
    let _ = b.handle_frame(0, frame, mem);
}

/// The responder builds its next frame (an ACK, a READ response), if it has one.
#[inline(never)]
fn responder_sends(b: &mut Qp, mem: &MrTable, buf: &mut [u8]) -> Option<usize> {
    RESPONDER_SENT.fetch_add(2, Ordering::Relaxed);
    b.poll_transmit(0, buf, mem)
}

/// The requester takes one frame from the wire (an ACK, or a READ response): parse, ICRC
/// check, what it completes.
#[inline(never)]
fn requester_receives(a: &mut Qp, mem: &mut MrTable, frame: &[u8]) {
    REQUESTER_RECEIVED.fetch_add(3, Ordering::Relaxed);
    let _ = a.handle_frame(0, frame, mem);
}

impl Ends {
    /// Moves frames both ways until neither end has one to send.
    fn run(&mut self) {
        loop {
            let mut moved = 0;
            while let Some(n) = requester_sends(&mut self.a, &self.mem_a, &mut self.buf) {
                responder_receives(&mut self.b, &mut self.mem_b, &self.buf[..n]);
                moved += 1;
                self.a_to_b += 1;
            }
            while let Some(n) = responder_sends(&mut self.b, &self.mem_b, &mut self.buf) {
                requester_receives(&mut self.a, &mut self.mem_a, &self.buf[..n]);
                moved += 1;
                self.b_to_a += 1;
            }
            if moved == 0 {
                return;
            }
        }
    }

    /// Posts `n` requests of `op` with `len` bytes (the last signaled), receives first for
    /// SENDs, runs both ends until idle, and checks the completion(s).
    fn batch(&mut self, op: WrOpcode, n: u64, len: u32) {
        let s = [Sge {
            addr: 0,
            length: len,
            lkey: self.src.lkey,
        }];
        if op == WrOpcode::Send {
            let r = [Sge {
                addr: 0,
                length: len,
                lkey: self.dst.lkey,
            }];
            for i in 0..n {
                self.b
                    .post_recv(&RecvWr {
                        wr_id: i,
                        sg_list: &r,
                    })
                    .expect("post_recv");
            }
        }
        for i in 0..n {
            let flags = if i + 1 == n {
                SendFlags::SIGNALED
            } else {
                SendFlags(0)
            };
            let mut wr = SendWr::new(i, op, Payload::Sges(&s)).flags(flags);
            if op != WrOpcode::Send {
                wr = wr.remote(0, self.dst.rkey);
            }
            self.a.post_send(&wr).expect("post_send");
        }
        while self.a.completions_pending() == 0 {
            self.run();
        }
        let c = self.a.poll_completion().expect("a completion");
        assert_eq!((c.wr_id, c.status), (n - 1, WcStatus::Success));
        if op == WrOpcode::Send {
            for i in 0..n {
                let c = self.b.poll_completion().expect("a receive completion");
                assert_eq!((c.wr_id, c.status), (i, WcStatus::Success));
            }
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (case, n) = match (args.get(1), args.get(2).and_then(|n| n.parse::<u64>().ok())) {
        (Some(c), Some(n)) if n > 0 && n % BATCH == 0 => (c.as_str(), n),
        _ => {
            eprintln!(
                "usage: instructions write64|send64|read64|write1m N (N a multiple of {BATCH})"
            );
            std::process::exit(2);
        }
    };
    let (op, len, mtu) = match case {
        "write64" => (WrOpcode::Write, 64, Mtu::Mtu1024),
        "send64" => (WrOpcode::Send, 64, Mtu::Mtu1024),
        "read64" => (WrOpcode::Read, 64, Mtu::Mtu1024),
        "write1m" => (WrOpcode::Write, 1 << 20, Mtu::Mtu4096),
        other => {
            eprintln!("instructions: no case {other} (write64, send64, read64, write1m)");
            std::process::exit(2);
        }
    };
    let mut e = ends(mtu, len as usize);
    // A 1 MiB message is 256 packets: batches of 4 keep the queues at the bench's depth.
    let per = if len > 4096 { 4 } else { BATCH };
    for _ in 0..n / per {
        e.batch(op, per, len);
    }
    println!(
        "{{\"case\":\"{case}\",\"messages\":{n},\"bytes\":{},\"frames_a_to_b\":{},\"frames_b_to_a\":{}}}",
        n * u64::from(len),
        e.a_to_b,
        e.b_to_a
    );
}
