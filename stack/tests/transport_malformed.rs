//! Requests and responses IBTA forbids, sent to a live RC connection: each must be NAKed,
//! dropped or failed as docs/transport.md's table ("Malformed and forbidden packets") says,
//! with nothing written to registered memory, and the connection must survive exactly where
//! the table says it does.
//!
//! Frames are built from the connection's own: the requester emits a real request (or the
//! responder a real response), and the case edits it, either as a header value
//! (re-emitted, so the frame is well formed and only the QP's context can refuse it) or as
//! raw bytes after the BTH (resealed with a good ICRC, so the parser refuses it and the QP
//! learns of it through `RoceRepr::attribute`).

use ferroce_stack::transport::loopback::{connect, drain_frames as frames, Loopback};
use ferroce_stack::transport::{
    Access, MrKeys, MrTable, Mtu, Payload, PdId, Qp, QpAttr, QpConfig, QpState, QpType, RecvWr,
    SendWr, Sge, WcStatus, WrOpcode,
};
use ferroce_stack::wire::sample::reseal;
use ferroce_stack::wire::{
    AethRepr, Checks, Opcode, Psn, Qpn, RethRepr, RoceRepr, Syndrome, BTH_LEN, ETHERNET_LEN,
    IPV4_LEN, UDP_LEN,
};
use proptest::prelude::*;

const PD: PdId = PdId(1);
const MTU: u32 = 1024;
const BUF: usize = 64 * 1024;
const ALL: Access = Access::LOCAL_WRITE
    .with(Access::REMOTE_WRITE)
    .with(Access::REMOTE_READ)
    .with(Access::REMOTE_ATOMIC);

struct Rig {
    lo: Loopback,
    ka: MrKeys,
    kb: MrKeys,
    // The registered memory; the tables point into these boxes, which never move.
    a_buf: Box<[u8]>,
    b_buf: Box<[u8]>,
}

fn rig() -> Rig {
    let mut a_buf = vec![0x11u8; BUF].into_boxed_slice();
    let mut b_buf = vec![0x22u8; BUF].into_boxed_slice();
    let (mut ma, mut mb) = (MrTable::new(1), MrTable::new(2));
    // SAFETY: the boxes live in the rig beside the tables and are never moved or freed
    // while the tables exist.
    let ka = unsafe { ma.register(PD, a_buf.as_mut_ptr(), BUF, 0, ALL) }.unwrap();
    // SAFETY: as above.
    let kb = unsafe { mb.register(PD, b_buf.as_mut_ptr(), BUF, 0, ALL) }.unwrap();
    let mut a = Qp::new(QpConfig::new(Qpn::new(0x11), QpType::Rc, PD));
    let mut b = Qp::new(QpConfig::new(Qpn::new(0x22), QpType::Rc, PD));
    let attr = QpAttr {
        qp_access_flags: ALL,
        path_mtu: Mtu::Mtu1024,
        sq_psn: Psn::new(100),
        rq_psn: Psn::new(900),
        timeout: 14,
        retry_cnt: 7,
        min_rnr_timer: 1,
        max_rd_atomic: 4,
        max_dest_rd_atomic: 4,
        ..QpAttr::default()
    };
    connect(&mut a, &mut b, &attr).unwrap();
    Rig {
        lo: Loopback::new(a, b, ma, mb),
        ka,
        kb,
        a_buf,
        b_buf,
    }
}

fn from_a(r: &mut Rig) -> Vec<Vec<u8>> {
    frames(&mut r.lo.a, &r.lo.mem_a, r.lo.now)
}

fn from_b(r: &mut Rig) -> Vec<Vec<u8>> {
    frames(&mut r.lo.b, &r.lo.mem_b, r.lo.now)
}

/// Hands `f` to `b` as the engine would: parsed, or attributed when the parser refuses it.
fn to_b(r: &mut Rig, f: &[u8]) {
    let _ = r.lo.b.handle_frame(r.lo.now, f, &mut r.lo.mem_b);
}

fn to_a(r: &mut Rig, f: &[u8]) {
    let _ = r.lo.a.handle_frame(r.lo.now, f, &mut r.lo.mem_a);
}

fn sges(lkey: u32, addr: u64, len: u32) -> &'static [Sge] {
    Box::leak(Box::new([Sge {
        addr,
        length: len,
        lkey,
    }]))
}

fn write_wr(r: &Rig, id: u64, remote: u64, len: u32) -> SendWr<'static> {
    SendWr::new(id, WrOpcode::Write, Payload::Sges(sges(r.ka.lkey, 0, len)))
        .remote(remote, r.kb.rkey)
}

fn parsed(f: &[u8]) -> ferroce_stack::wire::RocePacket<'_> {
    RoceRepr::parse(f, Checks::ALL).expect("the rig's own frames parse")
}

/// `repr` emitted with `payload`, lengths and ICRC computed.
fn emit(repr: &RoceRepr, payload: &[u8]) -> Vec<u8> {
    let mut repr = *repr;
    repr.payload_len = payload.len();
    let mut out = vec![0u8; repr.buffer_len()];
    repr.emit_with_payload(&mut out, payload).unwrap();
    out
}

/// An untagged IPv4 frame whose transport bytes (BTH through pad) are replaced by
/// `transport`, lengths fixed and IPv4 checksum and ICRC recomputed: malformed only where
/// the case made it so.
fn with_transport(frame: &[u8], transport: &[u8]) -> Vec<u8> {
    let head = ETHERNET_LEN + IPV4_LEN + UDP_LEN;
    let mut f = frame[..head].to_vec();
    f.extend_from_slice(transport);
    f.extend_from_slice(&[0; 4]);
    let udp_len = (UDP_LEN + transport.len() + 4) as u16;
    let ip_len = IPV4_LEN as u16 + udp_len;
    f[ETHERNET_LEN + 2..ETHERNET_LEN + 4].copy_from_slice(&ip_len.to_be_bytes());
    f[ETHERNET_LEN + IPV4_LEN + 4..ETHERNET_LEN + IPV4_LEN + 6]
        .copy_from_slice(&udp_len.to_be_bytes());
    reseal(&mut f);
    f
}

/// The transport bytes (BTH through pad) of a well-formed untagged IPv4 frame.
fn transport_of(frame: &[u8]) -> Vec<u8> {
    frame[ETHERNET_LEN + IPV4_LEN + UDP_LEN..frame.len() - 4].to_vec()
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(13) ^ seed)
        .collect()
}

/// A request fault, in its turn: what the frames are and whether only the QP's context (a
/// well-formed frame) or already the parser (bytes after the BTH) refuses it.
#[derive(Clone, Debug)]
enum ReqFault {
    /// An RC opcode IBTA reserves or ferroce does not implement (0x15, 0x18..=0x1c,
    /// 0x1e, 0x1f; 0x1d is RDMA ATOMIC WRITE).
    Opcode(u8),
    /// A READ request followed by payload bytes (4·n of them), which its opcode forbids.
    ReadWithPayload(usize),
    /// An atomic request followed by payload bytes.
    AtomicWithPayload(usize),
    /// A WRITE_ONLY whose payload is not its RETH's DMA length.
    WriteOnlyLength { dma_len: u32, payload: u32 },
    /// A SEND_ONLY longer than the path MTU.
    SendOnlyOverMtu(u32),
    /// A WRITE_FIRST or SEND_FIRST that is not exactly one path MTU.
    FirstNotPmtu { send: bool, payload: u32 },
    /// A valid FIRST, then a MIDDLE that is not one path MTU.
    MiddleNotPmtu { send: bool, payload: u32 },
    /// A valid WRITE_FIRST of a longer message, then a LAST with no payload.
    LastEmpty,
    /// A WRITE_ONLY cut off inside its RETH.
    TruncatedReth(usize),
    /// A SEND_FIRST with a pad count, which only a message's last packet may carry.
    PadOnFirst(u8),
}

impl ReqFault {
    fn parser_refuses(&self) -> bool {
        matches!(
            self,
            Self::Opcode(_)
                | Self::ReadWithPayload(_)
                | Self::AtomicWithPayload(_)
                | Self::TruncatedReth(_)
                | Self::PadOnFirst(_)
        )
    }

    /// The receive the fault leaves completed with an error, if a SEND was in progress.
    fn recv_status(&self) -> Option<WcStatus> {
        match self {
            Self::MiddleNotPmtu { send: true, .. } => Some(WcStatus::LocLenErr),
            _ => None,
        }
    }
}

fn req_fault() -> impl Strategy<Value = ReqFault> {
    prop_oneof![
        prop_oneof![Just(0x15u8), 0x18u8..=0x1c, 0x1eu8..=0x1f].prop_map(ReqFault::Opcode),
        (1usize..64).prop_map(|n| ReqFault::ReadWithPayload(4 * n)),
        (1usize..16).prop_map(|n| ReqFault::AtomicWithPayload(4 * n)),
        (1u32..MTU, 0u32..=MTU)
            .prop_filter("lengths differ", |(d, p)| d != p)
            .prop_map(|(dma_len, payload)| ReqFault::WriteOnlyLength { dma_len, payload }),
        (MTU + 1..MTU + 256).prop_map(ReqFault::SendOnlyOverMtu),
        (any::<bool>(), (1u32..MTU / 4).prop_map(|n| 4 * n))
            .prop_map(|(send, payload)| ReqFault::FirstNotPmtu { send, payload }),
        (any::<bool>(), (1u32..MTU / 4).prop_map(|n| 4 * n))
            .prop_map(|(send, payload)| ReqFault::MiddleNotPmtu { send, payload }),
        Just(ReqFault::LastEmpty),
        (0usize..16).prop_map(ReqFault::TruncatedReth),
        (1u8..=3).prop_map(ReqFault::PadOnFirst),
    ]
}

/// Where the faulty packet's PSN sits against the responder's expected PSN.
#[derive(Clone, Copy, Debug)]
enum Turn {
    Due,
    Early(u32),
    Duplicate,
}

fn turn() -> impl Strategy<Value = Turn> {
    prop_oneof![
        3 => Just(Turn::Due),
        1 => (1u32..8).prop_map(Turn::Early),
        1 => Just(Turn::Duplicate),
    ]
}

/// A template request of the connection (addresses, QPNs, P_Key) to build cases from.
fn template(r: &mut Rig) -> RoceRepr {
    r.lo.a.post_send(&write_wr(r, 1, 0, 8)).unwrap();
    let f = from_a(r).remove(0);
    // Delivered: the responder's expected PSN moves to 101, so 100 is a duplicate.
    to_b(r, &f);
    let acks = from_b(r);
    assert_eq!(acks.len(), 1);
    to_a(r, &acks[0]);
    assert_eq!(r.lo.a.poll_completion().unwrap().status, WcStatus::Success);
    parsed(&f).repr
}

/// The frames of `fault` with its faulty packet at `psn` (a valid FIRST before it at
/// `psn - 1` when the fault is in a later packet).
fn fault_frames(r: &Rig, t: &RoceRepr, fault: &ReqFault, psn: Psn) -> (Vec<Vec<u8>>, Vec<u8>) {
    let rkey = r.kb.rkey;
    let reth = |va: u64, dma_len: u32| RethRepr { va, rkey, dma_len };
    let mut req = *t;
    req.ext = Default::default();
    req.bth.psn = psn;
    req.bth.ack_req = true;
    let with = |op: Opcode, psn: Psn| {
        let mut x = req;
        x.bth.opcode = op;
        x.bth.psn = psn;
        x
    };
    match *fault {
        ReqFault::Opcode(op) => {
            // Shaped like a SEND_ONLY: BTH and 32 bytes.
            let send = emit(&with(Opcode::RC_SEND_ONLY, psn), &pattern(32, 1));
            let mut tr = transport_of(&send);
            tr[0] = op;
            (vec![], with_transport(&send, &tr))
        }
        ReqFault::ReadWithPayload(n) | ReqFault::AtomicWithPayload(n) => {
            let mut x = with(
                if matches!(fault, ReqFault::ReadWithPayload(_)) {
                    Opcode::RC_RDMA_READ_REQUEST
                } else {
                    Opcode::RC_FETCH_ADD
                },
                psn,
            );
            x.ext.reth = Some(reth(0x100, 64));
            x.ext.atomic_eth = Some(ferroce_stack::wire::AtomicEthRepr {
                va: 0x100,
                rkey,
                swap_add: 1,
                compare: 0,
            });
            let mut tr = transport_of(&emit(&x, &[]));
            tr.extend_from_slice(&pattern(n, 2));
            (vec![], with_transport(&emit(&x, &[]), &tr))
        }
        ReqFault::WriteOnlyLength { dma_len, payload } => {
            let mut x = with(Opcode::RC_RDMA_WRITE_ONLY, psn);
            x.ext.reth = Some(reth(0x1000, dma_len));
            (vec![], emit(&x, &pattern(payload as usize, 3)))
        }
        ReqFault::SendOnlyOverMtu(len) => (
            vec![],
            emit(&with(Opcode::RC_SEND_ONLY, psn), &pattern(len as usize, 4)),
        ),
        ReqFault::FirstNotPmtu { send, payload } => {
            let mut x = with(
                if send {
                    Opcode::RC_SEND_FIRST
                } else {
                    Opcode::RC_RDMA_WRITE_FIRST
                },
                psn,
            );
            if !send {
                x.ext.reth = Some(reth(0x1000, 3 * MTU));
            }
            (vec![], emit(&x, &pattern(payload as usize, 5)))
        }
        ReqFault::MiddleNotPmtu { send, payload } => {
            let (first, middle) = if send {
                (Opcode::RC_SEND_FIRST, Opcode::RC_SEND_MIDDLE)
            } else {
                (Opcode::RC_RDMA_WRITE_FIRST, Opcode::RC_RDMA_WRITE_MIDDLE)
            };
            let mut f = with(first, psn.sub(1));
            if !send {
                f.ext.reth = Some(reth(0x1000, 3 * MTU));
            }
            let f = emit(&f, &pattern(MTU as usize, 6));
            (
                vec![f],
                emit(&with(middle, psn), &pattern(payload as usize, 7)),
            )
        }
        ReqFault::LastEmpty => {
            let mut f = with(Opcode::RC_RDMA_WRITE_FIRST, psn.sub(1));
            f.ext.reth = Some(reth(0x1000, MTU + 64));
            let f = emit(&f, &pattern(MTU as usize, 8));
            (vec![f], emit(&with(Opcode::RC_RDMA_WRITE_LAST, psn), &[]))
        }
        ReqFault::TruncatedReth(keep) => {
            let mut x = with(Opcode::RC_RDMA_WRITE_ONLY, psn);
            x.ext.reth = Some(reth(0x1000, 0));
            let mut tr = transport_of(&emit(&x, &[]));
            tr.truncate(BTH_LEN + keep);
            (vec![], with_transport(&emit(&x, &[]), &tr))
        }
        ReqFault::PadOnFirst(pad) => {
            let x = with(Opcode::RC_SEND_FIRST, psn);
            let mut tr = transport_of(&emit(&x, &pattern(MTU as usize, 9)));
            tr[1] = (tr[1] & !0x30) | (pad << 4);
            (vec![], with_transport(&emit(&x, &[]), &tr))
        }
    }
}

fn aeths(frames: &[Vec<u8>]) -> Vec<(Psn, Syndrome)> {
    frames
        .iter()
        .map(|f| {
            let p = parsed(f);
            (
                p.repr.bth.psn,
                Syndrome::from_byte(p.repr.ext.aeth.unwrap().syndrome),
            )
        })
        .collect()
}

/// After a silent drop or a sequence NAK: the connection still carries a WRITE, which lands.
fn survives(r: &mut Rig) {
    r.lo.a.post_send(&write_wr(r, 50, 0x8000, 64)).unwrap();
    r.lo.run();
    assert_eq!(r.lo.b.state(), QpState::Rts);
    let wc =
        r.lo.a
            .poll_completion()
            .expect("the WRITE after the fault completes");
    assert_eq!((wc.wr_id, wc.status), (50, WcStatus::Success));
    assert_eq!(r.b_buf[0x8000..0x8040], r.a_buf[..64]);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Every forbidden request to a live responder, at the expected PSN, ahead of it, or
    /// behind it.
    #[test]
    fn forbidden_requests_are_naked_or_dropped_and_write_nothing(
        fault in req_fault(),
        turn in turn(),
    ) {
        let mut r = rig();
        let t = template(&mut r);
        // Two receives, in case the fault is a SEND.
        for id in [7u64, 8] {
            let sg = sges(r.kb.lkey, 0x4000 + (id - 7) * 0x1000, 0x1000);
            r.lo.b.post_recv(&RecvWr { wr_id: id, sg_list: sg }).unwrap();
        }
        let epsn = Psn::new(101);
        let psn = match turn {
            Turn::Due => epsn.add(u32::from(matches!(
                fault,
                ReqFault::MiddleNotPmtu { .. } | ReqFault::LastEmpty
            ))),
            Turn::Early(k) => epsn.add(k),
            Turn::Duplicate => epsn.sub(1),
        };
        let (before, bad) = fault_frames(&r, &t, &fault, psn);
        let parser_refuses = RoceRepr::parse(&bad, Checks::ALL).is_err();
        prop_assert_eq!(parser_refuses, fault.parser_refuses(), "{:?}", fault);
        let mut out = Vec::new();
        if matches!(turn, Turn::Due) {
            for f in &before {
                to_b(&mut r, f);
            }
            out.extend(from_b(&mut r));
        }
        let memory = r.b_buf.to_vec();
        to_b(&mut r, &bad);
        out.extend(from_b(&mut r));
        prop_assert!(r.b_buf[..] == memory[..], "{:?} {:?} wrote to the responder's memory", fault, turn);
        let got = aeths(&out);
        match turn {
            Turn::Due => {
                // NAK invalid request naming the faulty PSN; the responder in ERR.
                prop_assert_eq!(
                    got.last().copied(),
                    Some((psn, Syndrome::Nak(ferroce_stack::wire::NakCode::InvalidRequest))),
                    "{:?}", fault
                );
                prop_assert_eq!(r.lo.b.state(), QpState::Err);
                let mut wcs = Vec::new();
                while let Some(wc) = r.lo.b.poll_completion() {
                    wcs.push((wc.wr_id, wc.status));
                }
                let first = fault.recv_status().unwrap_or(WcStatus::WrFlushErr);
                prop_assert_eq!(wcs, vec![(7, first), (8, WcStatus::WrFlushErr)]);
                prop_assert_eq!(r.lo.b.counters().malformed_requests, u64::from(parser_refuses));
            }
            Turn::Early(_) => {
                // An early packet: one sequence NAK for the expected PSN, nothing executed.
                prop_assert_eq!(got, vec![(epsn, Syndrome::Nak(ferroce_stack::wire::NakCode::PsnSequenceError))]);
                prop_assert_eq!(r.lo.b.state(), QpState::Rts);
                survives(&mut r);
            }
            Turn::Duplicate => {
                // A duplicate: a well-formed one is acknowledged again, a malformed one
                // dropped; nothing executes either way.
                if parser_refuses {
                    prop_assert!(got.is_empty(), "{:?}", got);
                } else {
                    prop_assert!(got.iter().all(|(_, s)| matches!(s, Syndrome::Ack { .. })), "{:?}", got);
                }
                prop_assert_eq!(r.lo.b.state(), QpState::Rts);
                survives(&mut r);
            }
        }
    }
}

/// A response fault: the requester has a READ, a WRITE and a FETCH_ADD outstanding.
#[derive(Clone, Debug)]
enum RespFault {
    /// The READ's MIDDLE response shorter or longer than one path MTU.
    ReadMiddleLength(u32),
    /// The READ's FIRST (or LAST) response with a NAK syndrome in its AETH.
    ReadResponseNak { last: bool, code: u8 },
    /// An ACKNOWLEDGE with a reserved syndrome type (0b10).
    ReservedSyndrome(u8),
    /// A NAK with a reserved code (5..=31), or Invalid RD Request (4), which is RD's.
    ReservedNakCode(u8),
    /// An ACKNOWLEDGE followed by payload bytes.
    AckWithPayload(usize),
    /// A READ response for the PSN of the WRITE.
    ReadResponseForWrite,
    /// The FETCH_ADD's atomic ACK with a NAK syndrome.
    AtomicAckNak,
    /// A READ response MIDDLE with a pad count.
    PadOnMiddle(u8),
}

fn resp_fault() -> impl Strategy<Value = RespFault> {
    prop_oneof![
        (1u32..MTU / 2)
            .prop_filter("not one MTU", |n| 4 * n != MTU)
            .prop_map(|n| RespFault::ReadMiddleLength(4 * n)),
        (any::<bool>(), 0u8..5).prop_map(|(last, code)| RespFault::ReadResponseNak { last, code }),
        (0u8..32).prop_map(RespFault::ReservedSyndrome),
        (4u8..32).prop_map(RespFault::ReservedNakCode),
        (1usize..32).prop_map(|n| RespFault::AckWithPayload(4 * n)),
        Just(RespFault::ReadResponseForWrite),
        Just(RespFault::AtomicAckNak),
        (1u8..=3).prop_map(RespFault::PadOnMiddle),
    ]
}

/// The requester's outstanding work: READ 3·MTU into a_buf[0x2000..], WRITE, FETCH_ADD into
/// a_buf[0x6000..]. Returns the responder's real responses, in order, for the cases to edit
/// (the READ's FIRST, MIDDLE, LAST, then the WRITE's ACK... as the responder sent them).
fn outstanding(r: &mut Rig) -> Vec<Vec<u8>> {
    let read = SendWr::new(
        1,
        WrOpcode::Read,
        Payload::Sges(sges(r.ka.lkey, 0x2000, 3 * MTU)),
    )
    .remote(0x100, r.kb.rkey);
    let write = write_wr(r, 2, 0x3000, 16);
    let mut fadd = SendWr::new(
        3,
        WrOpcode::FetchAdd,
        Payload::Sges(sges(r.ka.lkey, 0x6000, 8)),
    )
    .remote(0x7000, r.kb.rkey);
    fadd.compare_add = 5;
    for wr in [&read, &write, &fadd] {
        r.lo.a.post_send(wr).unwrap();
    }
    let reqs = from_a(r);
    assert_eq!(reqs.len(), 3);
    for f in &reqs {
        to_b(r, f);
    }
    from_b(r)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Every forbidden response to a requester with work outstanding: the request it names
    /// fails with BAD_RESP_ERR, the rest flush, the QP is in ERR, and nothing lands in the
    /// requester's buffers.
    #[test]
    fn forbidden_responses_fail_the_request_with_bad_resp_err(fault in resp_fault()) {
        let mut r = rig();
        let _ = template(&mut r);
        let resp = outstanding(&mut r);
        // READ FIRST, MIDDLE, LAST (PSNs 101..=103), ACK of the WRITE (104) coalesced into
        // the atomic ACK (105).
        let ops: Vec<Opcode> = resp.iter().map(|f| parsed(f).repr.bth.opcode).collect();
        prop_assert_eq!(&ops[..4], &[
            Opcode::RC_RDMA_READ_RESPONSE_FIRST,
            Opcode::RC_RDMA_READ_RESPONSE_MIDDLE,
            Opcode::RC_RDMA_READ_RESPONSE_LAST,
            Opcode::RC_ATOMIC_ACKNOWLEDGE,
        ]);
        let first = &resp[0];
        let middle = &resp[1];
        let atomic = &resp[3];
        let mut feed: Vec<Vec<u8>> = Vec::new();
        let ack_like = |psn: Psn, syndrome: u8| {
            let mut x = parsed(first).repr;
            x.bth.opcode = Opcode::RC_ACKNOWLEDGE;
            x.bth.psn = psn;
            x.ext = Default::default();
            x.ext.aeth = Some(AethRepr { syndrome, msn: ferroce_stack::wire::Msn::new(1) });
            emit(&x, &[])
        };
        let bad = match fault {
            RespFault::ReadMiddleLength(len) => {
                feed.push(first.clone());
                let p = parsed(middle);
                emit(&p.repr, &pattern(len as usize, 0x31))
            }
            RespFault::ReadResponseNak { last, code } => {
                let src = if last { feed.extend([first.clone(), middle.clone()]); &resp[2] } else { first };
                let p = parsed(src);
                let mut x = p.repr;
                x.ext.aeth = Some(AethRepr { syndrome: 0x60 | code, ..x.ext.aeth.unwrap() });
                emit(&x, p.payload)
            }
            RespFault::ReservedSyndrome(v) => ack_like(Psn::new(101), 0x40 | v),
            RespFault::ReservedNakCode(code) => ack_like(Psn::new(101), 0x60 | code),
            RespFault::AckWithPayload(n) => {
                let ack = ack_like(Psn::new(101), 0);
                let mut tr = transport_of(&ack);
                tr.extend_from_slice(&pattern(n, 0x32));
                with_transport(&ack, &tr)
            }
            RespFault::ReadResponseForWrite => {
                feed.extend([first.clone(), middle.clone(), resp[2].clone()]);
                let mut x = parsed(first).repr;
                x.bth.opcode = Opcode::RC_RDMA_READ_RESPONSE_ONLY;
                x.bth.psn = Psn::new(104);
                emit(&x, &pattern(16, 0x33))
            }
            RespFault::AtomicAckNak => {
                feed.extend([first.clone(), middle.clone(), resp[2].clone()]);
                let p = parsed(atomic);
                let mut x = p.repr;
                x.ext.aeth = Some(AethRepr { syndrome: 0x61, ..x.ext.aeth.unwrap() });
                emit(&x, &[])
            }
            RespFault::PadOnMiddle(pad) => {
                feed.push(first.clone());
                let mut tr = transport_of(middle);
                tr[1] = (tr[1] & !0x30) | (pad << 4);
                with_transport(middle, &tr)
            }
        };
        for f in &feed {
            to_a(&mut r, f);
        }
        // What a good response of the fault's packet would have completed before it.
        let mut wcs = Vec::new();
        while let Some(wc) = r.lo.a.poll_completion() {
            wcs.push((wc.wr_id, wc.status));
        }
        let memory = r.a_buf.to_vec();
        to_a(&mut r, &bad);
        prop_assert!(r.a_buf[..] == memory[..], "{:?} wrote to the requester's memory", fault);
        prop_assert_eq!(r.lo.a.state(), QpState::Err, "{:?}", fault);
        prop_assert_eq!(r.lo.a.counters().bad_responses, 1);
        while let Some(wc) = r.lo.a.poll_completion() {
            wcs.push((wc.wr_id, wc.status));
        }
        // The READ completes once all its responses landed; the WRITE is answered by the
        // atomic ACK only. The request the bad response names fails, later ones flush.
        let failed = match fault {
            RespFault::ReadResponseForWrite => 2,
            RespFault::AtomicAckNak => 3,
            _ => 1,
        };
        let expected: Vec<(u64, WcStatus)> = (1..=3u64)
            .map(|id| {
                let s = match id.cmp(&failed) {
                    std::cmp::Ordering::Less => WcStatus::Success,
                    std::cmp::Ordering::Equal => WcStatus::BadRespErr,
                    std::cmp::Ordering::Greater => WcStatus::WrFlushErr,
                };
                (id, s)
            })
            .collect();
        prop_assert_eq!(wcs, expected, "{:?}", fault);
    }
}

/// A response that names nothing outstanding is a ghost, whatever is wrong with it: dropped,
/// and the requester carries on.
#[test]
fn a_malformed_ghost_response_is_dropped() {
    let mut r = rig();
    let t = template(&mut r);
    let mut x = t;
    x.bth.opcode = Opcode::RC_ACKNOWLEDGE;
    x.bth.dest_qpn = r.lo.a.qpn();
    x.bth.psn = Psn::new(5000);
    x.ext.aeth = Some(AethRepr {
        syndrome: 0x7f,
        msn: ferroce_stack::wire::Msn::new(0),
    });
    to_a(&mut r, &emit(&x, &[]));
    let ack = emit(&x, &[]);
    let mut tr = transport_of(&ack);
    tr.extend_from_slice(&[1, 2, 3, 4]);
    to_a(&mut r, &with_transport(&ack, &tr));
    assert_eq!(r.lo.a.state(), QpState::Rts);
    assert_eq!(r.lo.a.counters().ghost_responses, 2);
    survives(&mut r);
}

/// A CNP's 16 reserved bytes are ignored on receipt (IBTA A17.9.2); the QP, which runs no
/// congestion control yet, drops the CNP and the connection carries on.
#[test]
fn a_cnp_with_reserved_bytes_set_is_ignored() {
    let mut r = rig();
    let t = template(&mut r);
    let mut x = t;
    x.bth.opcode = Opcode::CNP;
    x.bth.psn = Psn::new(0);
    x.ext = Default::default();
    let cnp = emit(&x, &[]);
    let mut tr = transport_of(&cnp);
    for b in &mut tr[BTH_LEN..] {
        *b = 0xa5;
    }
    let to_b_cnp = with_transport(&cnp, &tr);
    let p =
        RoceRepr::parse(&to_b_cnp, Checks::ALL).expect("reserved bytes do not make a CNP invalid");
    assert_eq!(p.repr.bth.opcode, Opcode::CNP);
    tr[4..8].copy_from_slice(&r.lo.a.qpn().value().to_be_bytes());
    let to_a_cnp = with_transport(&cnp, &tr);
    to_a(&mut r, &to_a_cnp);
    to_b(&mut r, &to_b_cnp);
    assert_eq!(r.lo.a.state(), QpState::Rts);
    assert_eq!(r.lo.b.state(), QpState::Rts);
    survives(&mut r);
}

/// A UD datagram to the GSI QP (QP1) without the GSI Q_Key (0x80010000) is dropped and
/// counted, its receive kept for the next (IBTA §10.2.4: the Q_Key must match).
#[test]
fn a_ud_datagram_to_qp1_without_the_gsi_qkey_is_dropped() {
    let mut buf = vec![0u8; 4096].into_boxed_slice();
    let mut mem = MrTable::new(3);
    // SAFETY: `buf` outlives `mem` and does not move.
    let k = unsafe { mem.register(PD, buf.as_mut_ptr(), 4096, 0, ALL) }.unwrap();
    let mut qp1 = Qp::new(QpConfig::new(Qpn::new(1), QpType::Ud, PD));
    let attr = QpAttr {
        qkey: 0x8001_0000,
        ..QpAttr::default()
    };
    for (to, mask) in [
        (
            QpState::Init,
            ferroce_stack::transport::required_mask(QpType::Ud, QpState::Reset, QpState::Init),
        ),
        (
            QpState::Rtr,
            ferroce_stack::transport::required_mask(QpType::Ud, QpState::Init, QpState::Rtr),
        ),
    ] {
        let a = QpAttr {
            qp_state: to,
            ..attr
        };
        qp1.modify(&a, mask.unwrap()).unwrap();
    }
    qp1.post_recv(&RecvWr {
        wr_id: 9,
        sg_list: sges(k.lkey, 0, 4096),
    })
    .unwrap();
    let send = |qkey: u32| {
        let mut x =
            ferroce_stack::wire::sample::sample_repr(Opcode::UD_SEND_ONLY, Default::default(), 64);
        x.bth.dest_qpn = Qpn::new(1);
        x.ext.deth = Some(ferroce_stack::wire::DethRepr {
            qkey,
            src_qp: Qpn::new(0x55),
        });
        emit(&x, &pattern(64, 0x41))
    };
    qp1.handle_frame(0, &send(0x1111_1111), &mut mem).unwrap();
    assert!(qp1.poll_completion().is_none());
    assert_eq!(qp1.counters().qkey_violations, 1);
    assert!(buf.iter().all(|&b| b == 0), "nothing written");
    qp1.handle_frame(0, &send(0x8001_0000), &mut mem).unwrap();
    let wc = qp1.poll_completion().expect("the GSI Q_Key is accepted");
    assert_eq!((wc.wr_id, wc.status), (9, WcStatus::Success));
}
