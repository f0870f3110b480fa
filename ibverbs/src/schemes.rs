//! What the drop-in runs beyond IBTA, and with whom: native failover (`FERROCE_FAILOVER`),
//! the recovery, path and congestion schemes (`FERROCE_SCHEME`), and what rdma_cm's
//! offers said of each QP's peer. Both variables are read once, when first needed; a value
//! that names nothing is one line on stderr and the default.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex, OnceLock, PoisonError};

use ferroce_reliability::schemes::{Params, RecoveryScheme, Schemes};
use ferroce_verbs::cm::Offer;
use ferroce_verbs::connect::{capability, Capabilities};
use ferroce_verbs::{QueuePair, VerbsError};

use crate::ffi;

/// The environment variable that picks how a QP on a device with two ports survives one
/// failing: `native` (the default: ferroce's own failover, in band with a ferroce peer) or
/// `none`.
pub const FAILOVER_ENV: &str = "FERROCE_FAILOVER";

/// The environment variable naming the schemes a QP runs (docs/ibverbs.md): a
/// comma-separated list such as `sr,spray=4,dcqcn`, as
/// [`Schemes::parse`](ferroce_reliability::schemes::Schemes::parse) reads it. Selective
/// repeat (and spraying with it) needs the peer's agreement, which rdma_cm's offers carry;
/// congestion control is this end's own.
pub const SCHEME_ENV: &str = "FERROCE_SCHEME";

/// The line rate the congestion schemes are set for: what the drop-in's ports report
/// (`ibv_query_port`: 4 lanes at HDR speed would be more; a veth or AF_PACKET port has no
/// rate of its own).
const LINE_BPS: u64 = 100_000_000_000;

/// True unless `FERROCE_FAILOVER` turns native failover off: the drop-in then speaks and
/// offers ferroce's in-band path control.
pub(crate) fn failover_wanted() -> bool {
    static WANTED: OnceLock<bool> = OnceLock::new();
    *WANTED.get_or_init(|| match std::env::var(FAILOVER_ENV).as_deref() {
        Ok("none") => false,
        Ok("native") | Err(_) => true,
        Ok(other) => {
            eprintln!(
                "ferroce: {FAILOVER_ENV}={other} is not a scheme (native or none); using native"
            );
            true
        }
    })
}

/// The schemes `FERROCE_SCHEME` names (IBTA's when it is unset or names nothing).
pub(crate) fn wanted() -> Schemes {
    static WANTED: OnceLock<Schemes> = OnceLock::new();
    *WANTED.get_or_init(|| match std::env::var(SCHEME_ENV) {
        Err(_) => Schemes::IBTA,
        Ok(v) => Schemes::parse(&v).unwrap_or_else(|e| {
            eprintln!("ferroce: {SCHEME_ENV}={v}: {e}; running IBTA's schemes");
            Schemes::IBTA
        }),
    })
}

/// What this process offers a peer beyond IBTA in the private data of its REQs and REPs:
/// ferroce's in-band path control unless `FERROCE_FAILOVER=none`, and selective repeat
/// when `FERROCE_SCHEME` asks for it and `can_switch` (the QP is not past INIT yet, so
/// the agreement can still reach it).
pub(crate) fn my_offer(can_switch: bool) -> Offer {
    let sr = can_switch && wanted().recovery == Some(RecoveryScheme::SelectiveRepeat);
    Offer {
        path_control: failover_wanted(),
        offers: if sr {
            Capabilities::NONE.with(capability::SELECTIVE_REPEAT, 0)
        } else {
            Capabilities::NONE
        },
    }
}

/// What the connection manager learnt of a QP's peer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Peer {
    /// It speaks ferroce's in-band path control.
    pub(crate) path_control: bool,
    /// Both ends offered selective repeat.
    pub(crate) selective_repeat: bool,
}

impl Peer {
    /// What this end's and the peer's offers agree on (`None`: the peer offered nothing, a
    /// kernel CM).
    pub(crate) fn agreed(mine: &Offer, peer: Option<&Offer>) -> Self {
        let Some(peer) = peer else {
            return Self::default();
        };
        let a = mine.agree(peer);
        Self {
            path_control: a.path_control,
            selective_repeat: a.offers.has(capability::SELECTIVE_REPEAT),
        }
    }
}

/// What the connection manager learnt of each QP's peer, by device context and QPN. A QP
/// not here was connected by the program's own exchange, which says nothing of the peer.
static PEERS: LazyLock<Mutex<HashMap<(usize, u32), Peer>>> = LazyLock::new(Default::default);

/// Records what the connection exchange found of the peer of QP `qpn` of `ctx`; read when
/// the QP enters RTR.
pub(crate) fn set_peer(ctx: *mut ffi::ibv_context, qpn: u32, peer: Peer) {
    let mut m = PEERS.lock().unwrap_or_else(PoisonError::into_inner);
    m.insert((ctx as usize, qpn), peer);
}

/// What the connection manager found of the peer of QP `qpn`, if it made the connection.
pub(crate) fn peer(ctx: *mut ffi::ibv_context, qpn: u32) -> Option<Peer> {
    let m = PEERS.lock().unwrap_or_else(PoisonError::into_inner);
    m.get(&(ctx as usize, qpn)).copied()
}

/// Forgets QP `qpn`'s peer (the QP is gone).
pub(crate) fn forget_peer(ctx: *mut ffi::ibv_context, qpn: u32) {
    let mut m = PEERS.lock().unwrap_or_else(PoisonError::into_inner);
    m.remove(&(ctx as usize, qpn));
}

/// Puts QP `rdma` (of type `qp_type`, on its way from INIT to RTR) on the schemes
/// `FERROCE_SCHEME` asks for, as far as its peer agreed: selective repeat and spraying
/// only on an RC QP whose peer offered selective repeat through rdma_cm, congestion control
/// on any connected QP.
pub(crate) fn apply(rdma: &QueuePair, qp_type: u32, peer: Option<Peer>) {
    let wanted = wanted();
    if wanted == Schemes::IBTA || qp_type == ffi::IBV_QPT_UD {
        return;
    }
    let sr = qp_type == ffi::IBV_QPT_RC && peer.is_some_and(|p| p.selective_repeat);
    let schemes = wanted.agreed(sr);
    if schemes == Schemes::IBTA {
        return;
    }
    let params = Params {
        line_bps: LINE_BPS,
        ..Params::default()
    };
    match rdma.set_reliability(schemes.policies(&params)) {
        Ok(()) | Err(VerbsError::PolicyAfterRtr(_)) => {}
        Err(e) => eprintln!("ferroce: {SCHEME_ENV}: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offer(sr: bool) -> Offer {
        Offer {
            path_control: true,
            offers: if sr {
                Capabilities::NONE.with(capability::SELECTIVE_REPEAT, 0)
            } else {
                Capabilities::NONE
            },
        }
    }

    /// Selective repeat only when both offered it; a peer that offered nothing (a kernel
    /// CM) agrees on nothing, path control included.
    #[test]
    fn selective_repeat_runs_only_when_both_ends_offered_it() {
        let both = Peer::agreed(&offer(true), Some(&offer(true)));
        assert!(both.selective_repeat && both.path_control);
        assert!(!Peer::agreed(&offer(true), Some(&offer(false))).selective_repeat);
        assert!(!Peer::agreed(&offer(false), Some(&offer(true))).selective_repeat);
        assert_eq!(Peer::agreed(&offer(true), None), Peer::default());
    }
}
