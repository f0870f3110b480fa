//! BTH opcodes and what each one carries (IBTA Vol 1 §9.2.1, table 38; Annex A17.9.3 for CNP).
//!
//! The top three bits name the transport, the low five the operation. The table here is the
//! single place that says which extension headers an opcode has (in wire order: DETH, RETH,
//! AtomicETH, AETH, AtomicAckETH, ImmDt, IETH) and whether a payload follows them.

use super::error::Error;
use super::ext::{
    AethRepr, AtomicAckEthRepr, AtomicEthRepr, DethRepr, IethRepr, ImmDtRepr, RethRepr,
    SackEthRepr, CNP_RESERVED_LEN,
};

/// An opcode byte. Any value can be held; [`Opcode::info`] says whether ferroce speaks it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Opcode(pub u8);

/// The transport an opcode belongs to (its top three bits).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Transport {
    /// Reliable Connection, 0x00-0x1f.
    Rc,
    /// Unreliable Connection, 0x20-0x3f.
    Uc,
    /// Reliable Datagram, 0x40-0x5f (not implemented by any RoCE NIC).
    Rd,
    /// Unreliable Datagram, 0x60-0x7f.
    Ud,
    /// 0x80-0x9f: the RoCEv2 congestion notification packet lives here.
    Cnp,
    /// Extended Reliable Connection, 0xa0-0xbf.
    Xrc,
    /// Manufacturer-specific, 0xc0-0xff.
    Manufacturer,
}

/// Where a packet sits in its message; the pad rule depends on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Position {
    /// First packet of a multi-packet message: full path-MTU payload, no pad.
    First,
    /// Middle packet: full path-MTU payload, no pad.
    Middle,
    /// Last packet of a multi-packet message.
    Last,
    /// The only packet of a message.
    Only,
}

/// What a packet asks for or answers, whatever its transport and its place in the message:
/// the operation column of IBTA's opcode table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// SEND (with or without immediate or invalidate).
    Send,
    /// RDMA WRITE (with or without immediate).
    Write,
    /// RDMA READ request.
    ReadRequest,
    /// RDMA READ response.
    ReadResponse,
    /// ACKNOWLEDGE: an ACK, NAK or RNR NAK by its AETH syndrome.
    Acknowledge,
    /// ATOMIC ACKNOWLEDGE.
    AtomicAcknowledge,
    /// CMP_SWP.
    CompareSwap,
    /// FETCH_ADD.
    FetchAdd,
    /// RDMA ATOMIC WRITE (IBTA 1.5): 8 bytes written in one store, acknowledged as a WRITE.
    AtomicWrite,
    /// Congestion notification.
    Cnp,
    /// ferroce's path control message (failover): addresses and moves, outside PSN space.
    Control,
}

impl Kind {
    /// True for what a requester receives: READ responses and (atomic) acknowledgements.
    pub const fn is_response(self) -> bool {
        matches!(
            self,
            Self::ReadResponse | Self::Acknowledge | Self::AtomicAcknowledge
        )
    }

    /// True for CMP_SWP and FETCH_ADD.
    pub const fn is_atomic(self) -> bool {
        matches!(self, Self::CompareSwap | Self::FetchAdd)
    }
}

/// What the last packet of a message carries beside its payload (the `_WITH_IMMEDIATE` and
/// `_WITH_INVALIDATE` opcodes); follows from the headers, ImmDt or IETH.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Suffix {
    /// Neither.
    Plain,
    /// Immediate data (ImmDt).
    Immediate,
    /// An rkey to invalidate (IETH).
    Invalidate,
}

/// A set of extension headers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Headers(u16);

impl Headers {
    /// No extension header.
    pub const NONE: Self = Self(0);
    /// DETH (UD).
    pub const DETH: Self = Self(1 << 0);
    /// RETH (WRITE first/only, READ request).
    pub const RETH: Self = Self(1 << 1);
    /// AtomicETH (CMP_SWP, FETCH_ADD).
    pub const ATOMIC_ETH: Self = Self(1 << 2);
    /// AETH (acknowledgements, READ responses).
    pub const AETH: Self = Self(1 << 3);
    /// AtomicAckETH (atomic acknowledge).
    pub const ATOMIC_ACK_ETH: Self = Self(1 << 4);
    /// ImmDt (the *_WITH_IMMEDIATE opcodes).
    pub const IMM_DT: Self = Self(1 << 5);
    /// IETH (SEND_WITH_INVALIDATE).
    pub const IETH: Self = Self(1 << 6);
    /// The 16 reserved bytes of a CNP.
    pub const CNP_RESERVED: Self = Self(1 << 7);
    /// SackETH (ferroce's selective acknowledgement, after the AETH).
    pub const SACK_ETH: Self = Self(1 << 8);

    /// Both sets together.
    pub const fn with(self, other: Self) -> Self {
        Self(self.0 | other.0)
    }

    /// True when every header of `other` is in `self`.
    pub const fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }

    /// Bytes the headers take on the wire.
    pub const fn len(self) -> usize {
        let mut n = 0;
        if self.contains(Self::DETH) {
            n += DethRepr::LEN;
        }
        if self.contains(Self::RETH) {
            n += RethRepr::LEN;
        }
        if self.contains(Self::ATOMIC_ETH) {
            n += AtomicEthRepr::LEN;
        }
        if self.contains(Self::AETH) {
            n += AethRepr::LEN;
        }
        if self.contains(Self::ATOMIC_ACK_ETH) {
            n += AtomicAckEthRepr::LEN;
        }
        if self.contains(Self::IMM_DT) {
            n += ImmDtRepr::LEN;
        }
        if self.contains(Self::IETH) {
            n += IethRepr::LEN;
        }
        if self.contains(Self::CNP_RESERVED) {
            n += CNP_RESERVED_LEN;
        }
        if self.contains(Self::SACK_ETH) {
            n += SackEthRepr::LEN;
        }
        n
    }

    /// True for the empty set.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }
}

/// What an opcode carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct OpcodeInfo {
    /// The name rdma-core gives it, without the `IB_OPCODE_` prefix (e.g. `RC_RDMA_WRITE_FIRST`).
    pub name: &'static str,
    /// Its transport.
    pub transport: Transport,
    /// Extension headers between the BTH and the payload.
    pub headers: Headers,
    /// Their bytes ([`Headers::len`], worked out once here: every frame built or parsed
    /// asks, several times).
    pub header_len: u8,
    /// Whether a payload (possibly empty) may follow the headers.
    pub payload: bool,
    /// Where the packet sits in its message.
    pub position: Position,
    /// What it asks for or answers.
    pub kind: Kind,
    /// Immediate data or an invalidation, from the headers.
    pub suffix: Suffix,
}

macro_rules! opcodes {
    ($( $(#[$m:meta])* $konst:ident = $val:literal, $kind:ident, $pos:ident, $payload:literal, [$($h:ident),*] );+ $(;)?) => {
        impl Opcode {
            $(
                $(#[$m])*
                pub const $konst: Self = Self($val);
            )+
        }

        const fn defined(op: u8) -> Option<OpcodeInfo> {
            match op {
                $(
                    $val => Some(OpcodeInfo {
                        name: stringify!($konst),
                        transport: transport_of(op),
                        headers: Headers::NONE $(.with(Headers::$h))*,
                        header_len: (Headers::NONE $(.with(Headers::$h))*).len() as u8,
                        payload: $payload,
                        position: Position::$pos,
                        kind: Kind::$kind,
                        suffix: suffix_of(Headers::NONE $(.with(Headers::$h))*),
                    }),
                )+
                _ => None,
            }
        }
    };
}

opcodes! {
    /// RC SEND, first packet.
    RC_SEND_FIRST = 0x00, Send, First, true, [];
    /// RC SEND, middle packet.
    RC_SEND_MIDDLE = 0x01, Send, Middle, true, [];
    /// RC SEND, last packet.
    RC_SEND_LAST = 0x02, Send, Last, true, [];
    /// RC SEND with immediate, last packet.
    RC_SEND_LAST_WITH_IMMEDIATE = 0x03, Send, Last, true, [IMM_DT];
    /// RC SEND in one packet.
    RC_SEND_ONLY = 0x04, Send, Only, true, [];
    /// RC SEND with immediate in one packet.
    RC_SEND_ONLY_WITH_IMMEDIATE = 0x05, Send, Only, true, [IMM_DT];
    /// RC WRITE, first packet.
    RC_RDMA_WRITE_FIRST = 0x06, Write, First, true, [RETH];
    /// RC WRITE, middle packet.
    RC_RDMA_WRITE_MIDDLE = 0x07, Write, Middle, true, [];
    /// RC WRITE, last packet.
    RC_RDMA_WRITE_LAST = 0x08, Write, Last, true, [];
    /// RC WRITE with immediate, last packet.
    RC_RDMA_WRITE_LAST_WITH_IMMEDIATE = 0x09, Write, Last, true, [IMM_DT];
    /// RC WRITE in one packet.
    RC_RDMA_WRITE_ONLY = 0x0a, Write, Only, true, [RETH];
    /// RC WRITE with immediate in one packet.
    RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE = 0x0b, Write, Only, true, [RETH, IMM_DT];
    /// RC READ request.
    RC_RDMA_READ_REQUEST = 0x0c, ReadRequest, Only, false, [RETH];
    /// RC READ response, first packet.
    RC_RDMA_READ_RESPONSE_FIRST = 0x0d, ReadResponse, First, true, [AETH];
    /// RC READ response, middle packet (no AETH).
    RC_RDMA_READ_RESPONSE_MIDDLE = 0x0e, ReadResponse, Middle, true, [];
    /// RC READ response, last packet.
    RC_RDMA_READ_RESPONSE_LAST = 0x0f, ReadResponse, Last, true, [AETH];
    /// RC READ response in one packet.
    RC_RDMA_READ_RESPONSE_ONLY = 0x10, ReadResponse, Only, true, [AETH];
    /// RC acknowledgement (ACK, NAK or RNR NAK by syndrome).
    RC_ACKNOWLEDGE = 0x11, Acknowledge, Only, false, [AETH];
    /// RC atomic acknowledgement, carrying the original data.
    RC_ATOMIC_ACKNOWLEDGE = 0x12, AtomicAcknowledge, Only, false, [AETH, ATOMIC_ACK_ETH];
    /// RC compare-and-swap.
    RC_COMPARE_SWAP = 0x13, CompareSwap, Only, false, [ATOMIC_ETH];
    /// RC fetch-and-add.
    RC_FETCH_ADD = 0x14, FetchAdd, Only, false, [ATOMIC_ETH];
    /// RC SEND with invalidate, last packet.
    RC_SEND_LAST_WITH_INVALIDATE = 0x16, Send, Last, true, [IETH];
    /// RC RDMA ATOMIC WRITE (IBTA 1.5): a RETH and exactly 8 bytes of payload.
    RC_ATOMIC_WRITE = 0x1d, AtomicWrite, Only, true, [RETH];
    /// RC SEND with invalidate in one packet.
    RC_SEND_ONLY_WITH_INVALIDATE = 0x17, Send, Only, true, [IETH];
    /// UC SEND, first packet.
    UC_SEND_FIRST = 0x20, Send, First, true, [];
    /// UC SEND, middle packet.
    UC_SEND_MIDDLE = 0x21, Send, Middle, true, [];
    /// UC SEND, last packet.
    UC_SEND_LAST = 0x22, Send, Last, true, [];
    /// UC SEND with immediate, last packet.
    UC_SEND_LAST_WITH_IMMEDIATE = 0x23, Send, Last, true, [IMM_DT];
    /// UC SEND in one packet.
    UC_SEND_ONLY = 0x24, Send, Only, true, [];
    /// UC SEND with immediate in one packet.
    UC_SEND_ONLY_WITH_IMMEDIATE = 0x25, Send, Only, true, [IMM_DT];
    /// UC WRITE, first packet.
    UC_RDMA_WRITE_FIRST = 0x26, Write, First, true, [RETH];
    /// UC WRITE, middle packet.
    UC_RDMA_WRITE_MIDDLE = 0x27, Write, Middle, true, [];
    /// UC WRITE, last packet.
    UC_RDMA_WRITE_LAST = 0x28, Write, Last, true, [];
    /// UC WRITE with immediate, last packet.
    UC_RDMA_WRITE_LAST_WITH_IMMEDIATE = 0x29, Write, Last, true, [IMM_DT];
    /// UC WRITE in one packet.
    UC_RDMA_WRITE_ONLY = 0x2a, Write, Only, true, [RETH];
    /// UC WRITE with immediate in one packet.
    UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE = 0x2b, Write, Only, true, [RETH, IMM_DT];
    /// UD SEND (always one packet).
    UD_SEND_ONLY = 0x64, Send, Only, true, [DETH];
    /// UD SEND with immediate.
    UD_SEND_ONLY_WITH_IMMEDIATE = 0x65, Send, Only, true, [DETH, IMM_DT];
    /// RoCEv2 congestion notification packet (Annex A17.9.3).
    CNP = 0x81, Cnp, Only, false, [CNP_RESERVED];
    /// ferroce selective repeat: RC WRITE first packet, with its own placement (RETH: this
    /// packet's address, the rkey, the whole message's length), so it can land out of order.
    SR_RDMA_WRITE_FIRST = 0xc6, Write, First, true, [RETH];
    /// ferroce selective repeat: RC WRITE middle packet with its placement.
    SR_RDMA_WRITE_MIDDLE = 0xc7, Write, Middle, true, [RETH];
    /// ferroce selective repeat: RC WRITE last packet with its placement.
    SR_RDMA_WRITE_LAST = 0xc8, Write, Last, true, [RETH];
    /// ferroce selective repeat: RC WRITE with immediate, last packet, with its placement.
    SR_RDMA_WRITE_LAST_WITH_IMMEDIATE = 0xc9, Write, Last, true, [RETH, IMM_DT];
    /// ferroce selective repeat: RC WRITE in one packet.
    SR_RDMA_WRITE_ONLY = 0xca, Write, Only, true, [RETH];
    /// ferroce selective repeat: RC WRITE with immediate in one packet.
    SR_RDMA_WRITE_ONLY_WITH_IMMEDIATE = 0xcb, Write, Only, true, [RETH, IMM_DT];
    /// ferroce selective repeat: cumulative acknowledgement (BTH PSN, AETH) plus the
    /// arrival map and loss report of a SackETH.
    SR_ACKNOWLEDGE = 0xd1, Acknowledge, Only, false, [AETH, SACK_ETH];
    /// ferroce path control (native failover): a [`PathControl`](super::PathControl) payload
    /// that announces a QP's other port or says it moved. No PSN, no acknowledgement.
    PATH_CONTROL = 0xd8, Control, Only, true, [];
}

const fn transport_of(op: u8) -> Transport {
    match op >> 5 {
        0 => Transport::Rc,
        1 => Transport::Uc,
        2 => Transport::Rd,
        3 => Transport::Ud,
        4 => Transport::Cnp,
        5 => Transport::Xrc,
        _ => Transport::Manufacturer,
    }
}

const fn suffix_of(h: Headers) -> Suffix {
    if h.contains(Headers::IMM_DT) {
        Suffix::Immediate
    } else if h.contains(Headers::IETH) {
        Suffix::Invalidate
    } else {
        Suffix::Plain
    }
}

/// Opcodes defined by IBTA for transports ferroce does not speak: RD (0x40-0x56) and XRC
/// (0xa0-0xb7), plus RC FLUSH (0x1c, IBTA 1.5). They are rejected as unsupported rather than
/// reserved, so counters tell a foreign feature from garbage.
const fn defined_elsewhere(op: u8) -> bool {
    matches!(op, 0x1c | 0x40..=0x56 | 0xa0..=0xb7 | 0xc0..=0xff)
}

impl Opcode {
    /// True for ferroce's own selective-repeat opcodes (manufacturer-specific range): only a
    /// peer that negotiated selective repeat sends or accepts them.
    pub const fn is_selective_repeat(self) -> bool {
        matches!(self.0, 0xc6..=0xcb | 0xd1)
    }
}

static TABLE: [Option<OpcodeInfo>; 256] = {
    let mut t = [None; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = defined(i as u8);
        i += 1;
    }
    t
};

const KINDS: usize = Kind::Control as usize + 1;

/// Where [`COMPOSED`] keeps the opcode of a (transport, kind, position, suffix).
const fn composed_index(t: Transport, k: Kind, p: Position, s: Suffix) -> usize {
    ((t as usize * KINDS + k as usize) * 4 + p as usize) * 3 + s as usize
}

/// The table read backwards: every opcode ferroce speaks, found by what it means.
static COMPOSED: [Option<Opcode>; 8 * KINDS * 4 * 3] = {
    let mut c = [None; 8 * KINDS * 4 * 3];
    let mut i = 0;
    while i < 256 {
        if let Some(info) = &TABLE[i] {
            c[composed_index(info.transport, info.kind, info.position, info.suffix)] =
                Some(Opcode(i as u8));
        }
        i += 1;
    }
    c
};

impl Opcode {
    /// The opcode of a `kind` packet at `position` of a message on `transport`, with
    /// `suffix`; `None` where IBTA (or ferroce's selective-repeat range, transport
    /// [`Transport::Manufacturer`]) defines none, e.g. a UD WRITE or a WRITE FIRST with
    /// immediate data.
    #[inline]
    pub fn compose(
        transport: Transport,
        kind: Kind,
        position: Position,
        suffix: Suffix,
    ) -> Option<Self> {
        COMPOSED[composed_index(transport, kind, position, suffix)]
    }

    /// What the packet asks for or answers; `None` for an opcode ferroce does not speak.
    #[inline]
    pub fn kind(self) -> Option<Kind> {
        TABLE[self.0 as usize].map(|i| i.kind)
    }

    /// Where the packet sits in its message; `None` for an opcode ferroce does not speak.
    #[inline]
    pub fn position(self) -> Option<Position> {
        TABLE[self.0 as usize].map(|i| i.position)
    }

    /// True for what a requester receives: READ responses and (atomic) acknowledgements,
    /// selective repeat's included.
    #[inline]
    pub fn is_response(self) -> bool {
        self.kind().is_some_and(Kind::is_response)
    }

    /// What this opcode carries, or why ferroce rejects it.
    #[inline]
    pub fn info(self) -> Result<&'static OpcodeInfo, Error> {
        match &TABLE[self.0 as usize] {
            Some(info) => Ok(info),
            None if defined_elsewhere(self.0) => Err(Error::UnsupportedOpcode(self.0)),
            None => Err(Error::ReservedOpcode(self.0)),
        }
    }

    /// The transport (top three bits).
    pub const fn transport(self) -> Transport {
        transport_of(self.0)
    }

    /// The opcode's name, or `RESERVED` / `UNSUPPORTED` for values ferroce does not speak.
    pub fn name(self) -> &'static str {
        match self.info() {
            Ok(i) => i.name,
            Err(Error::UnsupportedOpcode(_)) => "UNSUPPORTED",
            Err(_) => "RESERVED",
        }
    }

    /// Every opcode ferroce speaks, in numeric order.
    pub fn all() -> impl Iterator<Item = Self> {
        (0..=255u8).map(Self).filter(|o| o.info().is_ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_matches_ibta() {
        let w = Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE.info().unwrap();
        assert_eq!(w.headers, Headers::RETH.with(Headers::IMM_DT));
        assert_eq!(w.headers.len(), 20);
        assert_eq!(
            Opcode::RC_ATOMIC_ACKNOWLEDGE.info().unwrap().headers.len(),
            12
        );
        assert_eq!(Opcode::RC_COMPARE_SWAP.info().unwrap().headers.len(), 28);
        assert_eq!(
            Opcode::UD_SEND_ONLY_WITH_IMMEDIATE
                .info()
                .unwrap()
                .headers
                .len(),
            12
        );
        assert_eq!(Opcode::CNP.info().unwrap().headers.len(), 16);
        assert!(!Opcode::RC_RDMA_READ_REQUEST.info().unwrap().payload);
        assert_eq!(Opcode::all().count(), 47);
        let aw = Opcode::RC_ATOMIC_WRITE.info().unwrap();
        assert_eq!(
            (aw.kind, aw.headers, aw.payload),
            (Kind::AtomicWrite, Headers::RETH, true)
        );
        assert_eq!(Opcode(0x1c).info(), Err(Error::UnsupportedOpcode(0x1c)));
        let ctl = Opcode::PATH_CONTROL.info().unwrap();
        assert!(ctl.payload && ctl.headers.is_empty() && ctl.kind == Kind::Control);
        assert!(!Opcode::PATH_CONTROL.is_selective_repeat());
        assert_eq!(Opcode::SR_ACKNOWLEDGE.info().unwrap().headers.len(), 44);
        assert!(Opcode::SR_RDMA_WRITE_MIDDLE.is_selective_repeat());
        assert!(!Opcode(0xc5).is_selective_repeat());
        assert_eq!(
            Opcode::SR_RDMA_WRITE_MIDDLE.transport(),
            Transport::Manufacturer
        );
        assert_eq!(Opcode(0x15).info(), Err(Error::ReservedOpcode(0x15)));
        assert_eq!(Opcode(0x2c).info(), Err(Error::ReservedOpcode(0x2c)));
        assert_eq!(Opcode(0x60).info(), Err(Error::ReservedOpcode(0x60)));
        assert_eq!(Opcode(0x4a).info(), Err(Error::UnsupportedOpcode(0x4a)));
        assert_eq!(Opcode(0xa0).info(), Err(Error::UnsupportedOpcode(0xa0)));
        assert_eq!(Opcode(0xc5).info(), Err(Error::UnsupportedOpcode(0xc5)));
        assert_eq!(Opcode::UC_RDMA_WRITE_ONLY.transport(), Transport::Uc);
    }

    #[test]
    fn compose_reads_the_table_backwards() {
        for op in Opcode::all() {
            let i = op.info().unwrap();
            assert_eq!(
                Opcode::compose(i.transport, i.kind, i.position, i.suffix),
                Some(op),
                "{}",
                i.name
            );
        }
        use {Kind::*, Position::*, Suffix::*, Transport::*};
        assert_eq!(
            Opcode::compose(Rc, Send, Last, Invalidate),
            Some(Opcode::RC_SEND_LAST_WITH_INVALIDATE)
        );
        assert_eq!(
            Opcode::compose(Uc, Write, Only, Immediate),
            Some(Opcode::UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE)
        );
        assert_eq!(
            Opcode::compose(Manufacturer, Write, Middle, Plain),
            Some(Opcode::SR_RDMA_WRITE_MIDDLE)
        );
        assert_eq!(Opcode::compose(Ud, Write, Only, Plain), None);
        assert_eq!(Opcode::compose(Rc, Write, First, Immediate), None);
        assert_eq!(Opcode::compose(Uc, ReadRequest, Only, Plain), None);
        assert_eq!(Opcode::RC_FETCH_ADD.kind(), Some(FetchAdd));
        assert_eq!(
            Opcode::RC_RDMA_READ_RESPONSE_MIDDLE.position(),
            Some(Middle)
        );
        assert_eq!(Opcode(0x15).kind(), None);
        let responses: Vec<_> = Opcode::all().filter(|o| o.is_response()).collect();
        assert_eq!(
            responses,
            [0x0d, 0x0e, 0x0f, 0x10, 0x11, 0x12, 0xd1].map(Opcode),
            "READ responses, ACKNOWLEDGE, ATOMIC ACKNOWLEDGE, SR_ACKNOWLEDGE"
        );
    }

    /// The header length kept in the table is what the headers add up to, for every opcode.
    #[test]
    fn every_opcodes_header_len_is_its_headers_bytes() {
        for op in 0..=255u8 {
            if let Ok(info) = Opcode(op).info() {
                assert_eq!(
                    usize::from(info.header_len),
                    info.headers.len(),
                    "{op:#04x}"
                );
            }
        }
    }
}
