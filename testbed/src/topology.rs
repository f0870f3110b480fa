//! Ready-made testbeds: two hosts on one link, and two hosts joined by parallel paths.

use std::net::Ipv4Addr;

use ferroce_drivers::sim::{EcmpHash, FabricBuilder, HostId, LinkId, LinkModel, SwitchId};

use crate::{Host, Testbed};

/// Hosts `a` (10.0.0.1) and `b` (10.0.0.2), `mem_bytes` of registered memory each, on one
/// link with `model` both ways.
pub fn pair(seed: u64, model: LinkModel, mem_bytes: usize) -> Testbed {
    let mut b = FabricBuilder::new(seed);
    b.rx_ring(1 << 16);
    let ha = b.host("a", 1);
    let hb = b.host("b", 1);
    b.link((ha, 0), (hb, 0), model);
    hosts_a_and_b(b, (ha, hb), seed, mem_bytes)
}

/// [`pair`] with the link's two directions apart: `ab` from `a` to `b`, `ba` back.
pub fn pair_asym(seed: u64, ab: LinkModel, ba: LinkModel, mem_bytes: usize) -> Testbed {
    let mut b = FabricBuilder::new(seed);
    b.rx_ring(1 << 16);
    let ha = b.host("a", 1);
    let hb = b.host("b", 1);
    b.link_asym((ha, 0), (hb, 0), ab, ba);
    hosts_a_and_b(b, (ha, hb), seed, mem_bytes)
}

/// Hosts `a` and `b` joined through two switches by one parallel path per model: path `i`
/// is the `i`-th link between the switches, which pick it as `UDP source port mod n`. The
/// hosts' own links are clean and fast.
pub fn multipath(seed: u64, paths: Vec<LinkModel>, mem_bytes: usize) -> Testbed {
    let both = paths.into_iter().map(|m| (m.clone(), m)).collect();
    multipath_asym(seed, both, mem_bytes)
}

/// [`multipath`] with each path's two directions apart: `(a to b, b to a)`.
pub fn multipath_asym(seed: u64, paths: Vec<(LinkModel, LinkModel)>, mem_bytes: usize) -> Testbed {
    let mut b = FabricBuilder::new(seed);
    b.rx_ring(1 << 16);
    b.ecmp(EcmpHash::SourcePortModulo);
    let ha = b.host("a", 1);
    let hb = b.host("b", 1);
    let s0 = b.switch("s0");
    let s1 = b.switch("s1");
    let edge = |m: &LinkModel| {
        let mut e = LinkModel::new(m.bandwidth_bps, 100);
        e.queue_limit_bytes = m.queue_limit_bytes;
        e
    };
    b.link((ha, 0), s0, edge(&paths[0].0));
    b.link((hb, 0), s1, edge(&paths[0].0));
    for (ab, ba) in paths {
        b.link_asym(s0, s1, ab, ba);
    }
    hosts_a_and_b(b, (ha, hb), seed, mem_bytes)
}

/// Where the faults of a [`rails`] testbed go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rails {
    /// Host `a` and host `b` in the fabric.
    pub hosts: [HostId; 2],
    /// The ToR of each rail.
    pub tors: [SwitchId; 2],
    /// `links[h][r]`: host `h`'s link to the ToR of rail `r` (its NIC `r`).
    pub links: [[LinkId; 2]; 2],
}

/// SHIFT's testbed (seed 000), rail-optimized: hosts `a` and `b`, each with two NICs; NIC
/// `r` of both hosts on the ToR of rail `r`, and the two rails joined nowhere else, so one
/// failed NIC, host link or ToR cuts a rail and only the other rail is left. Every link has
/// `model` both ways. Faults go in through the fabric (`fail_port`, `fail_link`,
/// `fail_switch`, `blackhole_link`) at the places [`Rails`] names.
pub fn rails(seed: u64, model: LinkModel, mem_bytes: usize) -> (Testbed, Rails) {
    let m = || [model.clone(), model.clone()];
    rails_with(seed, [m(), m()], mem_bytes)
}

/// [`rails`] with each host link on its own model: `models[h][r]` for host `h`'s NIC on
/// rail `r`.
pub fn rails_with(seed: u64, models: [[LinkModel; 2]; 2], mem_bytes: usize) -> (Testbed, Rails) {
    let mut b = FabricBuilder::new(seed);
    b.rx_ring(1 << 16);
    let ha = b.host("a", 2);
    let hb = b.host("b", 2);
    let tors = [b.switch("tor0"), b.switch("tor1")];
    let mut links = [[LinkId(0); 2]; 2];
    for (h, host) in [ha, hb].into_iter().enumerate() {
        for (r, &tor) in tors.iter().enumerate() {
            links[h][r] = b.link((host, r), tor, models[h][r].clone());
        }
    }
    let fabric = b.build().expect("a valid topology");
    let ports = |h| (0..2).map(|i| fabric.port(h, i)).collect::<Vec<_>>();
    let hosts = vec![
        Host::with_ports(ports(ha), mem_bytes, Ipv4Addr::new(10, 0, 0, 1), seed ^ 0xa),
        Host::with_ports(ports(hb), mem_bytes, Ipv4Addr::new(10, 0, 0, 2), seed ^ 0xb),
    ];
    (
        Testbed::new(fabric, hosts),
        Rails {
            hosts: [ha, hb],
            tors,
            links,
        },
    )
}

/// Where the faults of a [`rails_n`] testbed go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RailsN {
    /// The hosts in the fabric, in testbed order.
    pub hosts: Vec<HostId>,
    /// The ToR of each rail.
    pub tors: [SwitchId; 2],
    /// `links[h][r]`: host `h`'s link to the ToR of rail `r`.
    pub links: Vec<[LinkId; 2]>,
}

/// [`rails`] with `n` hosts (10.0.0.1 ..): every host's NIC `r` on the ToR of rail `r` — the
/// smallest fabric where a third node can tell which end of a failed connection is at
/// fault (R2CCL's probe triangulation, seed 003).
pub fn rails_n(seed: u64, n: usize, model: LinkModel, mem_bytes: usize) -> (Testbed, RailsN) {
    let mut b = FabricBuilder::new(seed);
    b.rx_ring(1 << 16);
    let ids: Vec<HostId> = (0..n).map(|h| b.host(&format!("h{h}"), 2)).collect();
    let tors = [b.switch("tor0"), b.switch("tor1")];
    let links: Vec<[LinkId; 2]> = ids
        .iter()
        .map(|&host| {
            let mut l = [LinkId(0); 2];
            for (r, &tor) in tors.iter().enumerate() {
                l[r] = b.link((host, r), tor, model.clone());
            }
            l
        })
        .collect();
    let fabric = b.build().expect("a valid topology");
    let hosts = ids
        .iter()
        .enumerate()
        .map(|(h, &id)| {
            let ports = (0..2).map(|i| fabric.port(id, i)).collect::<Vec<_>>();
            let ip = Ipv4Addr::new(10, 0, 0, h as u8 + 1);
            Host::with_ports(ports, mem_bytes, ip, seed ^ (0xa + h as u64))
        })
        .collect();
    (
        Testbed::new(fabric, hosts),
        RailsN {
            hosts: ids,
            tors,
            links,
        },
    )
}

/// Builds the fabric and puts hosts 10.0.0.1 and 10.0.0.2 with `mem_bytes` of registered
/// memory on port 0 of `ha` and `hb`.
fn hosts_a_and_b(
    b: FabricBuilder,
    (ha, hb): (HostId, HostId),
    seed: u64,
    mem_bytes: usize,
) -> Testbed {
    let fabric = b.build().expect("a valid topology");
    let pa = fabric.port(ha, 0);
    let pb = fabric.port(hb, 0);
    let hosts = vec![
        Host::new(pa, mem_bytes, Ipv4Addr::new(10, 0, 0, 1), seed ^ 0xa),
        Host::new(pb, mem_bytes, Ipv4Addr::new(10, 0, 0, 2), seed ^ 0xb),
    ];
    Testbed::new(fabric, hosts)
}

/// `n` hosts (10.0.0.1 ..) on one switch, each by a link with `model` both ways: an incast
/// fabric, where what the hosts send to one of them meets at the switch's port towards it.
/// Returns the switch too (for its hooks and stats).
pub fn star(seed: u64, n: usize, model: LinkModel, mem_bytes: usize) -> (Testbed, SwitchId) {
    let mut b = FabricBuilder::new(seed);
    b.rx_ring(1 << 16);
    let ids: Vec<HostId> = (0..n).map(|h| b.host(&format!("h{h}"), 1)).collect();
    let sw = b.switch("tor");
    for &h in &ids {
        b.link((h, 0), sw, model.clone());
    }
    let fabric = b.build().expect("a valid topology");
    let hosts = ids
        .iter()
        .enumerate()
        .map(|(h, &id)| {
            let ip = Ipv4Addr::new(10, 0, 0, h as u8 + 1);
            Host::new(fabric.port(id, 0), mem_bytes, ip, seed ^ (0xa + h as u64))
        })
        .collect();
    (Testbed::new(fabric, hosts), sw)
}
