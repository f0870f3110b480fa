//! QP1, the general services interface, as far as the communication manager needs it: MADs
//! that arrive for QP1 go to the device's [`CmAgent`], and the MADs it sends leave as UD
//! SEND_ONLYs from QP1 with the GSI Q_Key, from the port's own address. A device's first
//! engine holds it, once something asked for a connection manager; until then QP1 frames
//! are unknown-QP drops, as before.

use std::collections::VecDeque;
use std::net::IpAddr;
use std::sync::Arc;

use ferroce_stack::cm::{CmAgent, Peer};

use crate::cm::queue::CmShared;

use crate::verbs::Gid;
use ferroce_stack::wire::mad::{mad_repr, MAD_LEN};
use ferroce_stack::wire::{
    Ecn, EthernetRepr, IpRepr, Ipv4Repr, Ipv6Repr, MacAddr, Psn, RocePacket, ETHERTYPE_IPV4,
};

/// The GSI of an engine: the agent, what arrived for it, how its MADs leave.
pub(crate) struct Gsi {
    pub(crate) agent: CmAgent,
    pub(crate) shared: Arc<CmShared>,
    /// MADs received (or looped from this port to itself), with their sender.
    inbox: VecDeque<(Peer, [u8; MAD_LEN])>,
    mac: MacAddr,
    ip: IpAddr,
    psn: u32,
    /// MADs that were not CM MADs this agent reads.
    pub(crate) refused: u64,
}

impl std::fmt::Debug for Gsi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gsi")
            .field("ip", &self.ip)
            .field("inbox", &self.inbox.len())
            .finish_non_exhaustive()
    }
}

impl Gsi {
    pub(crate) fn new(mac: MacAddr, ip: IpAddr, seed: u64) -> Self {
        // The CA GUID: the port's MAC as an EUI-64, as Linux derives RoCE node GUIDs.
        let m = mac.0;
        let guid = u64::from_be_bytes([m[0] ^ 2, m[1], m[2], 0xff, 0xfe, m[3], m[4], m[5]]);
        Self {
            agent: CmAgent::new(guid, seed),
            shared: Arc::new(CmShared::default()),
            inbox: VecDeque::new(),
            mac,
            ip,
            psn: (seed as u32) & 0xff_ffff,
            refused: 0,
        }
    }

    /// A packet for QP1: its MAD goes to the agent on the engine's next turn.
    pub(crate) fn receive(&mut self, pkt: &RocePacket<'_>) {
        // Another process on the same network namespace may hand over a MAD for its own
        // port's address, which need not be this one.
        if pkt.repr.eth.dst != self.mac {
            self.refused += 1;
            return;
        }
        let Some(mad) = pkt.payload.get(..MAD_LEN) else {
            self.refused += 1;
            return;
        };
        let src = match pkt.repr.ip {
            IpRepr::V4(v) => IpAddr::V4(v.src),
            IpRepr::V6(v) => IpAddr::V6(v.src),
        };
        let peer = Peer {
            gid: Gid::from_ip(src).0,
            mac: pkt.repr.eth.src,
        };
        let mut b = [0u8; MAD_LEN];
        b.copy_from_slice(mad);
        self.inbox.push_back((peer, b));
    }

    /// True when MADs wait to go in or out, or events to be handed on.
    pub(crate) fn pending(&self) -> bool {
        !self.inbox.is_empty() || self.agent.pending()
    }

    /// True when a turn has something to do.
    pub(crate) fn busy(&self, now: u64) -> bool {
        self.pending() || self.agent.poll_timeout().is_some_and(|t| t <= now)
    }

    /// Runs the agent: what arrived, its deadlines, then hands each MAD it sends to `tx` as
    /// a whole frame (one to this port's own address comes back to the inbox instead), and
    /// each event to the consumer. The work done.
    pub(crate) fn turn(&mut self, now: u64, buf: &mut [u8], mut tx: impl FnMut(&[u8])) -> usize {
        let mut work = 0;
        for _ in 0..4 {
            while let Some((peer, mad)) = self.inbox.pop_front() {
                work += 1;
                if self.agent.handle(now, peer, &mad).is_err() {
                    self.refused += 1;
                }
            }
            if self.agent.poll_timeout().is_some_and(|t| t <= now) {
                self.agent.handle_timeout(now);
                work += 1;
            }
            let mut looped = false;
            while let Some(o) = self.agent.poll_transmit() {
                work += 1;
                if o.peer.gid == Gid::from_ip(self.ip).0 {
                    let me = Peer {
                        gid: Gid::from_ip(self.ip).0,
                        mac: self.mac,
                    };
                    self.inbox.push_back((me, o.mad));
                    // The other processes on the port run QP1 too: the MAD may be for one
                    // of their listeners or connections.
                    if let Some(n) = self.frame(me, &o.mad, buf) {
                        super::looped::deliver_to_other_processes(&buf[..n]);
                    }
                    looped = true;
                    continue;
                }
                if let Some(n) = self.frame(o.peer, &o.mad, buf) {
                    tx(&buf[..n]);
                }
            }
            while let Some(e) = self.agent.poll_event() {
                self.shared.post(e);
            }
            if !looped {
                break;
            }
        }
        work
    }

    fn frame(&mut self, peer: Peer, mad: &[u8; MAD_LEN], buf: &mut [u8]) -> Option<usize> {
        let dst = Gid(peer.gid).ip();
        let ip = match (self.ip, dst) {
            (IpAddr::V4(src), IpAddr::V4(dst)) => IpRepr::V4(Ipv4Repr {
                src,
                dst,
                dscp: 0,
                ecn: Ecn::NotEct,
                ident: 0,
                dont_frag: true,
                ttl: 64,
            }),
            (src, dst) => IpRepr::V6(Ipv6Repr {
                src: match src {
                    IpAddr::V4(a) => a.to_ipv6_mapped(),
                    IpAddr::V6(a) => a,
                },
                dst: match dst {
                    IpAddr::V4(a) => a.to_ipv6_mapped(),
                    IpAddr::V6(a) => a,
                },
                dscp: 0,
                ecn: Ecn::NotEct,
                flow_label: 0,
                hop_limit: 64,
            }),
        };
        let eth = EthernetRepr {
            dst: peer.mac,
            src: self.mac,
            vlan: None,
            ethertype: ETHERTYPE_IPV4,
        };
        self.psn = (self.psn + 1) & 0xff_ffff;
        // UDP source port: the GSI's own, in the dynamic range, as the kernel's varies it.
        let sport = 0xc000 | (self.psn as u16 & 0x3fff);
        let repr = mad_repr(eth, ip, sport, Psn::new(self.psn));
        repr.emit_with_payload(buf, mad).ok()
    }
}
