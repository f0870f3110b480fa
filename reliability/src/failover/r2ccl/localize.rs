//! R2CCL's fault localization (seed 003, mechanism 1), sans-IO: once an endpoint sees a
//! connection error and has told its peer out of band, both ends probe — a zero-byte RDMA
//! WRITE to each other on the failed rail and to a third node's NIC on the same rail — and
//! swap their results over the out-of-band channel. The third node splits the blame: if
//! one end cannot reach it, that end's NIC (or cable) is at fault; if neither can, the rail
//! itself (the ToR they share); if both can and still not each other, the path between them.
//!
//! A probe's result is `Some(true)` (its WRITE completed), `Some(false)` (it failed: retries
//! exhausted, or no completion by the deadline) or `None` (not known: the peer's results
//! never came because the out-of-band channel is down too). With only its own results an
//! end can still tell its own NIC from the rest.

/// What a localization blames, in the words of `ferroce scenario failover --fault`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Blame {
    /// The NIC (or host link) of the end that localizes.
    LocalNic,
    /// The peer's NIC (or host link).
    RemoteNic,
    /// Something on the path between the two that the third node's paths avoid.
    Link,
    /// The rail's switch: neither end reaches the third node.
    Tor,
    /// The peer's side or the path, not told apart (the peer's results are missing).
    RemoteOrLink,
}

impl Blame {
    /// The name used in reports.
    pub fn name(self) -> &'static str {
        match self {
            Self::LocalNic => "local-nic",
            Self::RemoteNic => "remote-nic",
            Self::Link => "link",
            Self::Tor => "tor",
            Self::RemoteOrLink => "remote-or-link",
        }
    }

    /// The same blame as the peer states it (its local is this end's remote).
    pub fn from_peer(self) -> Self {
        match self {
            Self::LocalNic => Self::RemoteNic,
            Self::RemoteNic => Self::LocalNic,
            other => other,
        }
    }
}

/// One end's probes on the failed rail.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Probes {
    /// To the peer's NIC.
    pub to_peer: Option<bool>,
    /// To the third node's NIC.
    pub to_third: Option<bool>,
}

/// The verdict from this end's probes and the peer's (`None` when they never came). `None`
/// when nothing is at fault by the probes (every one got through) or nothing is known.
pub fn triangulate(ours: Probes, theirs: Option<Probes>) -> Option<Blame> {
    let us_third = ours.to_third?;
    let them_third = theirs.and_then(|t| t.to_third);
    let between = match (ours.to_peer, theirs.and_then(|t| t.to_peer)) {
        (Some(true), _) | (_, Some(true)) => Some(true),
        (Some(false), _) | (_, Some(false)) => Some(false),
        (None, None) => None,
    };
    Some(match (us_third, them_third) {
        (false, Some(false)) => Blame::Tor,
        (false, _) => Blame::LocalNic,
        (true, Some(false)) => Blame::RemoteNic,
        (true, Some(true)) => {
            if between == Some(true) {
                return None;
            }
            Blame::Link
        }
        (true, None) => {
            if between == Some(true) {
                return None;
            }
            Blame::RemoteOrLink
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(to_peer: bool, to_third: bool) -> Probes {
        Probes {
            to_peer: Some(to_peer),
            to_third: Some(to_third),
        }
    }

    /// Every single fault on a rail of three nodes, as the probes see it from both ends:
    /// the blame is the fault, and the two ends agree (each in its own words).
    #[test]
    fn each_single_fault_is_blamed_on_what_failed() {
        // (fault, what A's probes see, what B's see)
        let cases = [
            (Some(Blame::LocalNic), p(false, false), p(false, true)),
            (Some(Blame::RemoteNic), p(false, true), p(false, false)),
            (Some(Blame::Tor), p(false, false), p(false, false)),
            (Some(Blame::Link), p(false, true), p(false, true)),
            (None, p(true, true), p(true, true)),
        ];
        for (want, a, b) in cases {
            assert_eq!(triangulate(a, Some(b)), want, "{a:?} {b:?}");
            assert_eq!(
                triangulate(b, Some(a)),
                want.map(Blame::from_peer),
                "the peer's view"
            );
        }
    }

    /// The out-of-band channel down too: an end still knows its own NIC, and otherwise can
    /// only say the fault is on the far side.
    #[test]
    fn without_the_peers_results_an_end_tells_only_its_own_nic() {
        assert_eq!(triangulate(p(false, false), None), Some(Blame::LocalNic));
        assert_eq!(triangulate(p(false, true), None), Some(Blame::RemoteOrLink));
        assert_eq!(triangulate(p(true, true), None), None);
        assert_eq!(triangulate(Probes::default(), None), None, "no probe ran");
    }

    /// A probe one way that got through clears the path even if the other way's failed (a
    /// late completion, a lost ACK): no blame.
    #[test]
    fn one_probe_through_clears_the_path() {
        assert_eq!(triangulate(p(false, true), Some(p(true, true))), None);
    }
}
