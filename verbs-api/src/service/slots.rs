//! Work requests and completions as ring slots: what a program writes into a QP's send and
//! receive rings and what the service writes into a CQ's ring, 8 words (one cache line) per
//! slot. A request takes a header slot and, after it, the slots of its gather list (4
//! elements each) or of its inline bytes (64 each); the producer publishes them together.
//! Decoding takes words from an untrusted program: any words give a request or a
//! [`SlotError`], never a panic, and a request never claims more slots than
//! [`MAX_EXTRA`].

use ferroce_stack::transport::{AddressVector, UdDest};
use ferroce_stack::transport::{
    OwnedSendWr, Payload, SendFlags, SendWr, Sge, WcFlags, WcOpcode, WcStatus, WorkCompletion,
    WrOpcode,
};
use ferroce_stack::wire::{MacAddr, Qpn, VlanTag};

/// Words per slot.
pub const W: usize = 8;

/// A slot.
pub type Slot = [u64; W];

/// Gather elements per slot.
pub const SGES_PER_SLOT: usize = W / 2;

/// Slots of payload (gather list or inline bytes) a request may take: 16 gather elements,
/// or 256 inline bytes.
const PAYLOAD_SLOTS: usize = 4;

/// Slots after the header a request may take: a UD destination's, then the payload's.
pub const MAX_EXTRA: usize = 1 + PAYLOAD_SLOTS;

/// Most gather elements per request through a service.
pub const MAX_SGE: usize = PAYLOAD_SLOTS * SGES_PER_SLOT;

/// Most inline bytes per request through a service.
pub const MAX_INLINE: usize = PAYLOAD_SLOTS * W * 8;

/// Why slots do not make a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SlotError {
    /// An opcode no request has.
    #[error("no send opcode {0}")]
    Opcode(u32),
    /// More extra slots than a request may take, or fewer than its contents need.
    #[error("a request claims {0} extra slots")]
    Extra(usize),
    /// More gather elements or inline bytes than the slots hold.
    #[error("a request's contents ({0}) do not fit its slots")]
    Contents(usize),
    /// A request the service refuses through its rings (binds and local invalidates go
    /// through the control socket).
    #[error("opcode {0:?} is not accepted through a ring")]
    NotThroughRing(WrOpcode),
}

fn opcode(code: u32) -> Result<WrOpcode, SlotError> {
    Ok(match code {
        0 => WrOpcode::Write,
        1 => WrOpcode::WriteWithImm,
        2 => WrOpcode::Send,
        3 => WrOpcode::SendWithImm,
        4 => WrOpcode::Read,
        5 => WrOpcode::CmpSwp,
        6 => WrOpcode::FetchAdd,
        9 => WrOpcode::SendWithInv,
        15 => WrOpcode::AtomicWrite,
        7 => return Err(SlotError::NotThroughRing(WrOpcode::LocalInv)),
        8 => return Err(SlotError::NotThroughRing(WrOpcode::BindMw)),
        c => return Err(SlotError::Opcode(c)),
    })
}

/// Header flag: the payload is inline bytes (length in word 7's high half).
const HDR_INLINE: u64 = 1 << 24;

/// Header bit: a UD destination follows in the first extra slot.
const HDR_UD: u64 = 1 << 63;

fn mac_word(m: &MacAddr) -> u64 {
    let mut b = [0u8; 8];
    b[..6].copy_from_slice(&m.0);
    u64::from_le_bytes(b)
}

fn word_mac(w: u64) -> MacAddr {
    let b = w.to_le_bytes();
    MacAddr([b[0], b[1], b[2], b[3], b[4], b[5]])
}

fn gid_words(ip: core::net::IpAddr) -> [u64; 2] {
    let g = super::proto::ip_gid(ip);
    [
        u64::from_le_bytes(g[..8].try_into().expect("8 bytes")),
        u64::from_le_bytes(g[8..].try_into().expect("8 bytes")),
    ]
}

fn words_gid(a: u64, b: u64) -> core::net::IpAddr {
    let mut g = [0u8; 16];
    g[..8].copy_from_slice(&a.to_le_bytes());
    g[8..].copy_from_slice(&b.to_le_bytes());
    super::proto::gid_ip(g)
}

/// A UD destination's address vector as one slot.
fn encode_av(av: &AddressVector) -> Slot {
    let mut s = [0u64; W];
    s[0] = mac_word(&av.smac);
    s[1] = mac_word(&av.dmac);
    [s[2], s[3]] = gid_words(av.src);
    [s[4], s[5]] = gid_words(av.dst);
    if let Some(v) = av.vlan {
        s[6] =
            1 | u64::from(v.pcp & 7) << 1 | u64::from(v.dei) << 4 | u64::from(v.vid & 0xfff) << 8;
    }
    s[6] |= u64::from(av.traffic_class) << 24 | u64::from(av.hop_limit) << 32;
    if let Some(p) = av.udp_src_port {
        s[6] |= 1 << 40 | u64::from(p) << 48;
    }
    s[7] = u64::from(av.flow_label & 0xf_ffff);
    s
}

fn decode_av(s: &Slot) -> AddressVector {
    AddressVector {
        smac: word_mac(s[0]),
        dmac: word_mac(s[1]),
        vlan: (s[6] & 1 == 1).then(|| VlanTag {
            pcp: ((s[6] >> 1) & 7) as u8,
            dei: (s[6] >> 4) & 1 == 1,
            vid: ((s[6] >> 8) & 0xfff) as u16,
        }),
        src: words_gid(s[2], s[3]),
        dst: words_gid(s[4], s[5]),
        traffic_class: (s[6] >> 24) as u8,
        hop_limit: (s[6] >> 32) as u8,
        flow_label: (s[7] & 0xf_ffff) as u32,
        udp_src_port: ((s[6] >> 40) & 1 == 1).then_some((s[6] >> 48) as u16),
    }
}

/// Appends the slots of send request `wr` (and its UD destination, if any) to `out`.
/// `Err` for a request the ring cannot carry.
pub fn encode_send(wr: &SendWr<'_>, out: &mut Vec<Slot>) -> Result<(), SlotError> {
    let start = out.len();
    let mut h = [0u64; W];
    let (extra, inline_len) = match wr.payload {
        Payload::Sges(s) => {
            if s.len() > MAX_SGE {
                return Err(SlotError::Contents(s.len()));
            }
            (s.len().div_ceil(SGES_PER_SLOT), 0)
        }
        Payload::Inline(b) => {
            if b.len() > MAX_INLINE {
                return Err(SlotError::Contents(b.len()));
            }
            (b.len().div_ceil(W * 8), b.len())
        }
    };
    if wr.opcode.is_local() {
        return Err(SlotError::NotThroughRing(wr.opcode));
    }
    let n_sge = match wr.payload {
        Payload::Sges(s) => s.len() as u64,
        Payload::Inline(_) => 0,
    };
    let extra = extra + usize::from(wr.ud.is_some());
    h[0] = wr.opcode as u64
        | (extra as u64) << 8
        | n_sge << 16
        | if matches!(wr.payload, Payload::Inline(_)) {
            HDR_INLINE
        } else {
            0
        }
        | u64::from(wr.flags.0) << 32;
    h[1] = wr.wr_id;
    h[2] = wr.remote_addr;
    h[3] = u64::from(wr.rkey) | u64::from(wr.imm_data) << 32;
    h[4] = wr.compare_add;
    h[5] = wr.swap;
    if let Some(u) = &wr.ud {
        h[6] = u64::from(u.remote_qpn.value()) | HDR_UD;
        h[7] = u64::from(u.remote_qkey);
    }
    h[7] |= (inline_len as u64) << 32;
    out.push(h);
    if let Some(u) = &wr.ud {
        out.push(encode_av(&u.av));
    }
    match wr.payload {
        Payload::Sges(s) => push_sges(s, out),
        Payload::Inline(b) => {
            for chunk in b.chunks(W * 8) {
                let mut slot = [0u64; W];
                for (i, c) in chunk.chunks(8).enumerate() {
                    let mut w = [0u8; 8];
                    w[..c.len()].copy_from_slice(c);
                    slot[i] = u64::from_le_bytes(w);
                }
                out.push(slot);
            }
        }
    }
    debug_assert_eq!(out.len() - start, 1 + extra);
    Ok(())
}

fn push_sges(s: &[Sge], out: &mut Vec<Slot>) {
    for chunk in s.chunks(SGES_PER_SLOT) {
        let mut slot = [0u64; W];
        for (i, g) in chunk.iter().enumerate() {
            slot[2 * i] = g.addr;
            slot[2 * i + 1] = u64::from(g.length) | u64::from(g.lkey) << 32;
        }
        out.push(slot);
    }
}

fn read_sges(n: usize, extra: &[Slot], out: &mut smallvec::SmallVec<[Sge; 2]>) {
    for i in 0..n {
        let slot = &extra[i / SGES_PER_SLOT];
        let j = i % SGES_PER_SLOT;
        out.push(Sge {
            addr: slot[2 * j],
            length: slot[2 * j + 1] as u32,
            lkey: (slot[2 * j + 1] >> 32) as u32,
        });
    }
}

/// How many slots follow header `h` (checked against [`MAX_EXTRA`]).
pub fn extra_slots(h: &Slot) -> Result<usize, SlotError> {
    let extra = ((h[0] >> 8) & 0xff) as usize;
    if extra > MAX_EXTRA {
        return Err(SlotError::Extra(extra));
    }
    Ok(extra)
}

/// A send request decoded from its header and extra slots (its UD destination included).
pub fn decode_send(h: &Slot, extra: &[Slot]) -> Result<OwnedSendWr, SlotError> {
    let op = opcode((h[0] & 0xff) as u32)?;
    if extra_slots(h)? != extra.len() {
        return Err(SlotError::Extra(extra.len()));
    }
    let (ud, extra) = match (h[6] & HDR_UD != 0, extra) {
        (true, [av, rest @ ..]) => (
            Some(UdDest {
                av: decode_av(av),
                remote_qpn: Qpn::new((h[6] as u32) & 0x00ff_ffff),
                remote_qkey: h[7] as u32,
            }),
            rest,
        ),
        (true, []) => return Err(SlotError::Extra(0)),
        (false, rest) => (None, rest),
    };
    let n_extra = extra.len();
    if n_extra > PAYLOAD_SLOTS {
        return Err(SlotError::Extra(n_extra));
    }
    // Flags a program may set: the transport's internal bits are the QP's own.
    let flags = SendFlags((h[0] >> 32) as u32 & 0xff);
    let mut wr = SendWr::new(h[1], op, Payload::Sges(&[]));
    wr.flags = flags;
    wr.remote_addr = h[2];
    wr.rkey = h[3] as u32;
    wr.imm_data = (h[3] >> 32) as u32;
    wr.compare_add = h[4];
    wr.swap = h[5];
    wr.ud = ud;
    if h[0] & HDR_INLINE != 0 {
        let len = (h[7] >> 32) as usize;
        if len > n_extra * W * 8 || len.div_ceil(W * 8) != n_extra {
            return Err(SlotError::Contents(len));
        }
        let mut bytes = smallvec::SmallVec::<[u8; 256]>::new();
        for slot in extra {
            for w in slot {
                bytes.extend_from_slice(&w.to_le_bytes());
            }
        }
        bytes.truncate(len);
        wr.payload = Payload::Inline(&bytes);
        return Ok(OwnedSendWr::from_wr(&wr));
    }
    let n = ((h[0] >> 16) & 0xff) as usize;
    if n > n_extra * SGES_PER_SLOT || n.div_ceil(SGES_PER_SLOT) != n_extra {
        return Err(SlotError::Contents(n));
    }
    let mut sges = smallvec::SmallVec::new();
    read_sges(n, extra, &mut sges);
    wr.payload = Payload::Sges(&sges);
    Ok(OwnedSendWr::from_wr(&wr))
}

/// Appends the slots of a receive request.
pub fn encode_recv(wr_id: u64, sges: &[Sge], out: &mut Vec<Slot>) -> Result<(), SlotError> {
    if sges.len() > MAX_SGE {
        return Err(SlotError::Contents(sges.len()));
    }
    let extra = sges.len().div_ceil(SGES_PER_SLOT);
    let mut h = [0u64; W];
    h[0] = (extra as u64) << 8 | (sges.len() as u64) << 16;
    h[1] = wr_id;
    out.push(h);
    push_sges(sges, out);
    Ok(())
}

/// A receive request decoded: its id and scatter list.
pub fn decode_recv(
    h: &Slot,
    extra: &[Slot],
) -> Result<(u64, smallvec::SmallVec<[Sge; 2]>), SlotError> {
    let n_extra = extra_slots(h)?;
    if n_extra != extra.len() {
        return Err(SlotError::Extra(extra.len()));
    }
    let n = ((h[0] >> 16) & 0xff) as usize;
    if n > n_extra * SGES_PER_SLOT || n.div_ceil(SGES_PER_SLOT) != n_extra {
        return Err(SlotError::Contents(n));
    }
    let mut sges = smallvec::SmallVec::new();
    read_sges(n, extra, &mut sges);
    Ok((h[1], sges))
}

/// A completion as one slot.
pub fn encode_wc(wc: &WorkCompletion) -> Slot {
    let mut s = [0u64; W];
    s[0] = wc.wr_id;
    s[1] = u64::from(wc.status as u32)
        | u64::from(wc.opcode as u32) << 8
        | u64::from(wc.wc_flags.0 & 0xffff) << 16
        | u64::from(wc.solicited) << 32
        | u64::from(wc.qp_num.value()) << 40;
    s[2] = u64::from(wc.byte_len) | u64::from(wc.imm_data) << 32;
    s[3] = u64::from(wc.src_qp.value());
    let mut mac = [0u8; 8];
    mac[..6].copy_from_slice(&wc.smac.0);
    s[4] = u64::from_le_bytes(mac);
    s[5] = wc.tag;
    s
}

fn status(code: u32) -> WcStatus {
    use WcStatus::*;
    [
        Success,
        LocLenErr,
        LocQpOpErr,
        LocProtErr,
        WrFlushErr,
        RemInvReqErr,
        RemAccessErr,
        RemOpErr,
        RetryExcErr,
        RnrRetryExcErr,
        BadRespErr,
        MwBindErr,
        TmErr,
        TmRndvIncomplete,
    ]
    .into_iter()
    .find(|s| *s as u32 == code)
    .unwrap_or(LocQpOpErr)
}

fn wc_opcode(code: u32) -> WcOpcode {
    use WcOpcode::*;
    [
        Send,
        RdmaWrite,
        RdmaRead,
        CompSwap,
        FetchAdd,
        BindMw,
        LocalInv,
        AtomicWrite,
        Recv,
        RecvRdmaWithImm,
        TmAdd,
        TmDel,
        TmSync,
        TmRecv,
        TmNoTag,
    ]
    .into_iter()
    .find(|o| *o as u32 == code)
    .unwrap_or(Send)
}

/// A completion decoded from its slot (the program's side: the service wrote it).
pub fn decode_wc(s: &Slot) -> WorkCompletion {
    let mut wc = WorkCompletion::of_request(
        s[0],
        status((s[1] & 0xff) as u32),
        wc_opcode(((s[1] >> 8) & 0xff) as u32),
        s[2] as u32,
    );
    wc.wc_flags = WcFlags(((s[1] >> 16) & 0xffff) as u32);
    wc.solicited = (s[1] >> 32) & 1 == 1;
    wc.qp_num = Qpn::new((s[1] >> 40) as u32);
    wc.imm_data = (s[2] >> 32) as u32;
    wc.src_qp = Qpn::new(s[3] as u32);
    let mac = s[4].to_le_bytes();
    wc.smac = MacAddr([mac[0], mac[1], mac[2], mac[3], mac[4], mac[5]]);
    wc.tag = s[5];
    wc
}
