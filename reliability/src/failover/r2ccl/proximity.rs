//! Which NIC a failed connection moves to (seed 003, mechanism 2): the backup "ordered by
//! PCIe proximity" to the one that failed. Data a GPU (or a CPU socket) sends through a NIC
//! behind the same PCIe switch crosses nothing new; one on the same NUMA node crosses the
//! root complex; one on the other socket crosses the inter-socket link, which is slower than
//! a NIC and shared. So: same switch first, then same NUMA node, then the rest; among
//! equals, the nearest index (servers number NICs in slot order) and then the lower.

/// Where a NIC sits in its server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NicPlace {
    /// The PCIe switch it hangs off.
    pub pcie_switch: u16,
    /// The NUMA node (socket) of that switch.
    pub numa: u8,
}

impl NicPlace {
    /// How far data moves from a buffer near `self` to a NIC at `other`: 0 behind the same
    /// PCIe switch, 1 on the same NUMA node, 2 across sockets.
    pub fn distance(self, other: Self) -> u8 {
        if self.pcie_switch == other.pcie_switch && self.numa == other.numa {
            0
        } else if self.numa == other.numa {
            1
        } else {
            2
        }
    }
}

/// A DGX-style layout of `n` NICs: two per PCIe switch, half of the switches on each of two
/// NUMA nodes (one NUMA node, one switch, when `n` ≤ 2).
pub fn paired_layout(n: usize) -> Vec<NicPlace> {
    let switches = n.div_ceil(2).max(1);
    (0..n)
        .map(|i| {
            let sw = i / 2;
            NicPlace {
                pcie_switch: sw as u16,
                numa: if switches <= 1 {
                    0
                } else {
                    (sw * 2 / switches) as u8
                },
            }
        })
        .collect()
}

/// The NICs to try for a connection that failed on NIC `failed`, best first: every NIC that
/// `usable` allows except `failed`, by [`NicPlace::distance`] from it, then by how far its
/// index is, then by index.
pub fn backup_order(
    places: &[NicPlace],
    failed: usize,
    usable: impl Fn(usize) -> bool,
) -> Vec<usize> {
    let Some(&home) = places.get(failed) else {
        return (0..places.len()).filter(|&i| usable(i)).collect();
    };
    let mut order: Vec<usize> = (0..places.len())
        .filter(|&i| i != failed && usable(i))
        .collect();
    order.sort_by_key(|&i| (home.distance(places[i]), i.abs_diff(failed), i));
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Eight NICs as on an 8-GPU server: NIC 3 fails; its switch mate 2 first, then the
    /// other NICs of its socket (1, 0), then the other socket's nearest first.
    #[test]
    fn the_switch_mate_then_the_socket_then_the_rest() {
        let p = paired_layout(8);
        assert_eq!(p[2], p[3]);
        assert_eq!(p[3].numa, 0);
        assert_eq!(p[4].numa, 1);
        assert_eq!(backup_order(&p, 3, |_| true), [2, 1, 0, 4, 5, 6, 7]);
        assert_eq!(backup_order(&p, 4, |_| true), [5, 6, 7, 3, 2, 1, 0]);
        // A NIC that is down (or whose peer side is) is skipped.
        assert_eq!(backup_order(&p, 3, |i| i != 2), [1, 0, 4, 5, 6, 7]);
    }

    /// Two NICs (the scenarios' servers): the other one, if usable.
    #[test]
    fn two_nics_the_other_one() {
        let p = paired_layout(2);
        assert_eq!(backup_order(&p, 0, |_| true), [1]);
        assert_eq!(backup_order(&p, 1, |_| true), [0]);
        assert!(backup_order(&p, 1, |i| i != 0).is_empty());
        assert_eq!(
            backup_order(&p, 9, |_| true),
            [0, 1],
            "an unknown NIC: all, in order"
        );
    }
}
