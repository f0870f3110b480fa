//! Path selection: which UDP source port (and so which path through an ECMP fabric) each
//! request packet takes. [`Spray`] is a [`PathSelector`].
//!
//! A path is a UDP source port: path `i` of `n` is the port congruent to `i` modulo `n` next
//! to the QP's own port, so a switch hashing `port mod n` (the simulated fabric's
//! `SourcePortModulo`) maps path `i` to its `i`-th equal-cost link, and any other hash still
//! sees `n` distinct flows. The receiver reads a packet's path back as `port mod n`.

use ferroce_stack::transport::path::{Path, PathSelector};
use ferroce_stack::wire::Psn;

/// Packets a path is avoided for after the receiver signals it, unless
/// [`Spray::avoiding`] says otherwise.
pub const AVOID_PACKETS: u32 = 1024;

/// How packets are spread over paths.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SprayMode {
    /// One port per QP: ECMP keeps the whole connection on one path (what RNICs do by
    /// default, and what a peer that did not negotiate anything gets).
    Ecmp,
    /// Each packet on a path drawn at random.
    Random,
    /// Themis' PSN-based spraying: `path = (PSN mod n + base) mod n`, so the receiver knows
    /// the path of a PSN it never saw.
    Psn,
}

/// A path selection policy with its per-path avoidance state.
#[derive(Clone, Debug)]
pub struct Spray {
    mode: SprayMode,
    paths: u16,
    base: u16,
    /// Per path: packets still to steer elsewhere.
    avoid: Vec<u32>,
    /// Packets a path is avoided for when the receiver asks.
    avoid_packets: u32,
    rng: u64,
}

impl Spray {
    /// ECMP: one path.
    pub fn ecmp() -> Self {
        Self::new(SprayMode::Ecmp, 1, 0, 0)
    }

    /// Random packet spraying over `paths` paths, seeded.
    pub fn random(paths: u16, seed: u64) -> Self {
        Self::new(SprayMode::Random, paths, 0, seed)
    }

    /// PSN-based spraying over `paths` paths with base path 0.
    pub fn psn(paths: u16) -> Self {
        Self::new(SprayMode::Psn, paths, 0, 0x5eed)
    }

    /// Any mode, with the base path of the PSN formula and the seed of the random choices
    /// (random spraying, and the alternative path a retransmission takes).
    pub fn new(mode: SprayMode, paths: u16, base: u16, seed: u64) -> Self {
        let paths = paths.max(1);
        Self {
            mode,
            paths,
            base: base % paths,
            avoid: vec![0; usize::from(paths)],
            avoid_packets: AVOID_PACKETS,
            rng: seed ^ 0x9e37_79b9_7f4a_7c15,
        }
    }

    /// The same, avoiding a path for `packets` packets when the receiver asks.
    pub fn avoiding(self, packets: u32) -> Self {
        Self {
            avoid_packets: packets,
            ..self
        }
    }

    /// The mode.
    pub fn mode(&self) -> SprayMode {
        self.mode
    }

    /// Paths in use.
    pub fn paths(&self) -> u16 {
        self.paths
    }

    /// The path PSN-based spraying assigns to `psn`.
    pub fn psn_path(&self, psn: Psn) -> u16 {
        ((psn.value() % u32::from(self.paths)) as u16 + self.base) % self.paths
    }

    /// The path a packet that came from UDP source port `port` took.
    pub fn path_of_port(&self, port: u16) -> u16 {
        port % self.paths
    }

    fn next_random(&mut self) -> u64 {
        // SplitMix64: cheap, and reproducible from the seed.
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// The UDP source port for `psn`, from the QP's own port `qp_port`. A retransmission
    /// takes a different path from its designated one (the path that lost it, most likely),
    /// and a path under avoidance hands its packets to the next healthy one.
    pub fn port(&mut self, qp_port: u16, psn: Psn, retransmission: bool) -> u16 {
        let n = self.paths;
        if self.mode == SprayMode::Ecmp || n == 1 {
            return qp_port;
        }
        let mut path = match self.mode {
            SprayMode::Random => (self.next_random() % u64::from(n)) as u16,
            _ => self.psn_path(psn),
        };
        if retransmission {
            let step = 1 + (self.next_random() % u64::from(n - 1)) as u16;
            path = (path + step) % n;
        }
        if self.avoid[usize::from(path)] > 0 {
            self.avoid[usize::from(path)] -= 1;
            if let Some(other) = (1..n)
                .map(|k| (path + k) % n)
                .find(|&p| self.avoid[usize::from(p)] == 0)
            {
                path = other;
            }
        }
        port_for(qp_port, path, n)
    }

    /// Steers the next `packets` packets meant for `path` to other paths.
    pub fn avoid_for(&mut self, path: u16, packets: u32) {
        if let Some(a) = self.avoid.get_mut(usize::from(path)) {
            *a = packets;
        }
    }

    /// True while `path` is avoided.
    pub fn avoided(&self, path: u16) -> bool {
        self.avoid.get(usize::from(path)).is_some_and(|&a| a > 0)
    }
}

impl PathSelector for Spray {
    fn name(&self) -> &'static str {
        match self.mode {
            SprayMode::Ecmp => "ecmp",
            SprayMode::Random => "spray-random",
            SprayMode::Psn => "spray-psn",
        }
    }

    fn select(&mut self, base: Path, psn: Psn, retransmission: bool) -> Path {
        Path {
            udp_src_port: self.port(base.udp_src_port, psn, retransmission),
            ..base
        }
    }

    fn paths(&self) -> u16 {
        self.paths
    }

    fn path_of(&self, udp_src_port: u16) -> u16 {
        self.path_of_port(udp_src_port)
    }

    fn designated(&self, psn: Psn) -> Option<u16> {
        (self.mode == SprayMode::Psn && self.paths > 1).then(|| self.psn_path(psn))
    }

    fn avoid(&mut self, path: u16) {
        self.avoid_for(path, self.avoid_packets);
    }
}

/// The port congruent to `path` modulo `n` next to `qp_port`, inside 16 bits.
fn port_for(qp_port: u16, path: u16, n: u16) -> u16 {
    let base = u32::from(qp_port) - u32::from(qp_port % n);
    let mut p = base + u32::from(path);
    if p > u32::from(u16::MAX) {
        p -= u32::from(n);
    }
    p as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn psn_spraying_maps_psns_round_robin_and_ports_back_to_paths() {
        let mut s = Spray::psn(4);
        let ports: Vec<u16> = (0..8)
            .map(|i| s.port(0xc123, Psn::new(100 + i), false))
            .collect();
        let paths: Vec<u16> = ports.iter().map(|&p| s.path_of_port(p)).collect();
        assert_eq!(paths, [0, 1, 2, 3, 0, 1, 2, 3]);
        assert!(ports.iter().all(|&p| p & 0xfffc == 0xc120));
        // A retransmission never takes the designated path.
        for i in 0..64 {
            let psn = Psn::new(i);
            let p = s.port(0xc123, psn, true);
            assert_ne!(s.path_of_port(p), s.psn_path(psn));
        }
        // The top of the port space stays inside 16 bits and on the right path.
        assert_eq!(port_for(0xffff, 3, 5) % 5, 3);
    }

    #[test]
    fn an_avoided_path_hands_its_packets_to_others_for_a_window() {
        let mut s = Spray::psn(4);
        s.avoid_for(2, 3);
        let on_2 = (0..40)
            .filter(|&i| s.path_of_port(s.clone().port(0xc000, Psn::new(i), false)) == 2)
            .count();
        assert_eq!(on_2, 0, "a clone sees the avoidance too");
        let mut used = [0; 4];
        for i in 0..40 {
            let port = s.port(0xc000, Psn::new(i), false);
            used[usize::from(s.path_of_port(port))] += 1;
        }
        // Three packets of path 2 went elsewhere, then path 2 came back.
        assert_eq!(used[2], 10 - 3);
        assert!(!s.avoided(2));
        assert_eq!(Spray::ecmp().port(0xc001, Psn::new(7), true), 0xc001);
    }
}
